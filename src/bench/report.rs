//! Human-readable views of run records: a Markdown table and an SVG chart, with adapters as
//! columns (series) and comparison sizes as rows.

use std::fmt::Write as _;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::record::{CaseRecord, RunRecord};
use super::verdict::Verdict;
use crate::error::{Error, Result};

fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "pass",
        Verdict::Fail => "fail",
        Verdict::Inconclusive => "inconclusive",
    }
}

fn cell(c: &CaseRecord) -> String {
    let mut s = format!("{:.3}× {}", c.ratio, verdict_word(c.verdict));
    if c.verdict == Verdict::Pass && c.gpu.as_ref().map_or(c.wall.faster, |g| g.faster) {
        s.push_str(" (faster)");
    }
    if let Some(f) = c.b.fraction_of_fma {
        let _ = write!(s, "; B {:.1}% FMA", 100.0 * f);
    }
    if let Some(f) = c.b.fraction_of_bandwidth {
        let _ = write!(s, ", {:.1}% BW", 100.0 * f);
    }
    if let Some(t) = c.b.tokens_per_s {
        let _ = write!(s, ", {t:.0} tok/s");
    }
    if c.a.dispatches != c.b.dispatches {
        let _ = write!(s, "; {}→{} dispatches", c.a.dispatches, c.b.dispatches);
    }
    if c.a.readbacks != c.b.readbacks {
        let _ = write!(s, "; {}→{} readbacks", c.a.readbacks, c.b.readbacks);
    }
    s
}

/// Rows in first-seen order: (comparison, size).
fn rows(records: &[RunRecord]) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = Vec::new();
    for r in records {
        for c in &r.comparisons {
            for case in &c.cases {
                let key = (c.name.clone(), case.size.clone());
                if !rows.contains(&key) {
                    rows.push(key);
                }
            }
        }
    }
    rows
}

fn find<'a>(r: &'a RunRecord, name: &str, size: &str) -> Option<&'a CaseRecord> {
    r.comparisons.iter().find(|c| c.name == name)?.cases.iter().find(|c| c.size == size)
}

/// The Markdown table: one column per record (adapter), one row per comparison size.
/// Cells: B/A ratio on the verdict clock, verdict, and B as a fraction of the calibrated limits.
pub fn markdown(records: &[RunRecord]) -> String {
    let mut out = String::from("# moeflow benchmark matrix\n\n");
    out.push_str(
        "Cells: B/A time ratio (below 1: B is faster) on the GPU clock where the adapter has timestamps, ",
    );
    out.push_str("the protocol's verdict, and B's throughput as a share of the adapter's calibrated FMA rate and copy bandwidth.\n\n");
    out.push_str("| adapter | size set | held-out | copy GB/s | FMA GFLOP/s | clock | git |\n|---|---|---|---|---|---|---|\n");
    for r in records {
        let _ = writeln!(
            out,
            "| {} | {:?} | {} | {:.2} | {:.2} | {} | {}{} |",
            r.adapter.slug(),
            r.size_set,
            r.settings.held_out,
            r.calibration.copy_gbps,
            r.calibration.fma_gflops,
            r.calibration.clock,
            &r.git.revision[..r.git.revision.len().min(10)],
            if r.git.dirty { " (dirty)" } else { "" }
        );
    }
    for r in records {
        if let Some(p) = &r.queue_probe {
            let verdict = match p.max_workers() {
                Ok(w) => format!("allowed, up to {w} workers (the `W=0` sizes)"),
                Err(reason) => format!("refused: {reason}"),
            };
            let _ = writeln!(out, "\nQueue probe on {}: {verdict}.", r.adapter.slug());
        }
    }
    out.push_str("\n| comparison (A → B) | size |");
    for r in records {
        let _ = write!(out, " {} |", r.adapter.slug());
    }
    out.push_str("\n|---|---|");
    out.push_str(&"---|".repeat(records.len()));
    out.push('\n');
    for (name, size) in rows(records) {
        let ab = records
            .iter()
            .flat_map(|r| r.comparisons.iter())
            .find(|c| c.name == name)
            .map(|c| format!("{} → {}", c.a, c.b))
            .unwrap_or_default();
        let _ = write!(out, "| {name} ({ab}) | {size} |");
        for r in records {
            let _ = write!(out, " {} |", find(r, &name, &size).map(cell).unwrap_or_else(|| "–".into()));
        }
        out.push('\n');
    }
    out.push_str("\n| comparison | adapter | geomean change | wall-clock geomean | verdicts (pass/fail/inconclusive) | error |\n|---|---|---|---|---|---|\n");
    for r in records {
        for c in &r.comparisons {
            let _ = writeln!(
                out,
                "| {} | {} | {:+.1}% | {:+.1}% | {}/{}/{} | {} |",
                c.name,
                r.adapter.slug(),
                100.0 * c.geomean_change,
                100.0 * c.geomean_change_wall,
                c.verdicts.pass,
                c.verdicts.fail,
                c.verdicts.inconclusive,
                c.error.as_deref().unwrap_or("")
            );
        }
    }
    out
}

fn plot_err(e: impl std::fmt::Display) -> Error {
    Error::invalid(format!("drawing the chart: {e}"))
}

/// An SVG bar chart of the B/A ratios on a log scale: one group per comparison size, one bar
/// per adapter drawn from 1.0 (up: B slower, down: B faster).
///
/// # Errors
/// The plotting back end's error, as [`Error::InvalidArgument`].
pub fn svg(records: &[RunRecord]) -> Result<String> {
    let rows = rows(records);
    let n = rows.len().max(1);
    let finite: Vec<f64> = records
        .iter()
        .flat_map(|r| r.comparisons.iter().flat_map(|c| c.cases.iter().map(|c| c.ratio)))
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    let max_ratio = finite.iter().copied().fold(1.0f64, f64::max) * 1.5;
    let min_ratio = finite.iter().copied().fold(1.0f64, f64::min) / 1.5;
    let mut text = String::new();
    {
        let width = (120 + 170 * n as u32).max(640);
        let root = SVGBackend::with_string(&mut text, (width, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "moeflow: B/A time ratio per comparison size (log scale; below 1: B faster)",
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(70)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..n as f64, (min_ratio..max_ratio).log_scale())
            .map_err(plot_err)?;
        chart.configure_mesh().disable_x_mesh().x_labels(0).y_desc("B/A").draw().map_err(plot_err)?;
        let label_style = ("sans-serif", 12).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, (name, size)) in rows.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(i as f64 + 0.5, min_ratio));
            root.draw(&Text::new(name.clone(), (px, py + 6), label_style.clone())).map_err(plot_err)?;
            root.draw(&Text::new(size.clone(), (px, py + 22), label_style.clone())).map_err(plot_err)?;
        }
        chart
            .draw_series(LineSeries::new([(0.0, 1.0), (n as f64, 1.0)], BLACK.stroke_width(1)))
            .map_err(plot_err)?;
        let bar_w = 0.8 / records.len().max(1) as f64;
        for (j, r) in records.iter().enumerate() {
            let color = Palette99::pick(j).to_rgba();
            let bars: Vec<Rectangle<(f64, f64)>> = rows
                .iter()
                .enumerate()
                .filter_map(|(i, (name, size))| {
                    let c = find(r, name, size)?;
                    let x0 = i as f64 + 0.1 + j as f64 * bar_w;
                    let ratio = c.ratio.clamp(min_ratio, max_ratio);
                    Some(Rectangle::new([(x0, 1.0), (x0 + bar_w, ratio)], color.filled()))
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(plot_err)?
                .label(r.adapter.slug())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(plot_err)?;
        root.present().map_err(plot_err)?;
    }
    Ok(text)
}
