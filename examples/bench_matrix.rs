//! The benchmark matrix: every registered comparison on every adapter, under the ABBA
//! protocol, written as raw JSON per adapter plus a Markdown table and an SVG chart.
//!
//! `cargo run --release --example bench_matrix -- --help` lists the options; see
//! docs/benchmarks/README.md for how to read the output.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use moeflow::bench::record::{GitState, RUNTIME_CHECKS, SCHEMA_VERSION, WGPU_VERSION};
use moeflow::bench::{
    RunRecord, Settings, SizeSet, calibrate::calibrate, comparisons, report, run_comparison,
};
use moeflow::{AdapterSelector, Context, Error};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Sizes {
    /// GPU sizes on real GPUs, the smaller CPU set on CPU adapters.
    Auto,
    /// Force the GPU sizes.
    Gpu,
    /// Force the CPU sizes.
    Cpu,
}

#[derive(Parser, Debug)]
#[command(about = "Run every registered A/B comparison on every adapter and write the results")]
struct Args {
    /// Only adapters matching this selector (`vulkan`, `gl`, `vulkan:llvmpipe`, a name substring).
    #[arg(long)]
    adapter: Option<String>,
    /// Only comparisons whose name contains this text; repeat the flag for several, which
    /// then run in the order given (each comparison once).
    #[arg(long)]
    comparison: Vec<String>,
    /// Size set.
    #[arg(long, value_enum, default_value_t = Sizes::Auto)]
    sizes: Sizes,
    /// Held-out confirmation run: the other sizes and another seed.
    #[arg(long)]
    held_out: bool,
    /// Recorded ABBA blocks per size.
    #[arg(long, default_value_t = Settings::default().blocks)]
    blocks: u32,
    /// Warm-up ABBA blocks per size (not recorded).
    #[arg(long, default_value_t = Settings::default().warmup)]
    warmup: u32,
    /// Data seed (held-out runs use their own).
    #[arg(long, default_value_t = Settings::default().seed)]
    seed: u64,
    /// Each sample repeats the work until variant A takes at least this long (milliseconds).
    #[arg(long, default_value_t = Settings::default().min_sample_s * 1e3)]
    min_sample_ms: f64,
    /// Read outputs back after every timed sample (shows what readback does to timings).
    #[arg(long)]
    readback_each_run: bool,
    /// Output folder.
    #[arg(long, default_value = "docs/benchmarks")]
    out: PathBuf,
    /// Run nothing: rebuild the Markdown table and SVG chart from these JSON records (for
    /// example to put records from several machines in one table), written as
    /// `<out>/<report-name>.md` and `.svg`.
    #[arg(long, num_args = 1..)]
    report: Vec<PathBuf>,
    /// File stem of `--report`'s outputs.
    #[arg(long, default_value = "matrix")]
    report_name: String,
}

fn write(path: &Path, text: &str) -> moeflow::Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io { path: path.display().to_string(), source })
}

fn write_record(path: &Path, record: &RunRecord) -> moeflow::Result<()> {
    let json = serde_json::to_string_pretty(record).map_err(|e| Error::invalid(e.to_string()))?;
    write(path, &json)
}

fn main() -> ExitCode {
    env_logger::init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench_matrix: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the Markdown table and SVG chart of `records` as `<out>/<stem>.md` and `.svg`.
fn write_reports(out: &Path, stem: &str, records: &[RunRecord]) -> moeflow::Result<()> {
    std::fs::create_dir_all(out).map_err(|source| Error::Io { path: out.display().to_string(), source })?;
    let md = report::markdown(records);
    let md_path = out.join(format!("{stem}.md"));
    write(&md_path, &md)?;
    let svg_path = out.join(format!("{stem}.svg"));
    write(&svg_path, &report::svg(records)?)?;
    println!("{md}");
    println!("wrote {} and {}", md_path.display(), svg_path.display());
    Ok(())
}

fn report_only(args: &Args) -> moeflow::Result<()> {
    let records = args
        .report
        .iter()
        .map(|p| {
            let bytes =
                std::fs::read(p).map_err(|source| Error::Io { path: p.display().to_string(), source })?;
            serde_json::from_slice::<RunRecord>(&bytes)
                .map_err(|e| Error::invalid(format!("{} is not a benchmark record: {e}", p.display())))
        })
        .collect::<moeflow::Result<Vec<_>>>()?;
    write_reports(&args.out, &args.report_name, &records)
}

fn run(args: &Args) -> moeflow::Result<()> {
    if !args.report.is_empty() {
        return report_only(args);
    }
    let selector: AdapterSelector = args.adapter.as_deref().unwrap_or("").parse()?;
    let ctxs = Context::matching(&selector)?;
    if ctxs.is_empty() {
        return Err(Error::NoAdapter(format!(
            "none matches {:?}; `apt-get install mesa-vulkan-drivers` provides lavapipe",
            args.adapter
        )));
    }
    let settings = Settings {
        warmup: args.warmup,
        blocks: args.blocks,
        seed: args.seed,
        held_out: args.held_out,
        readback_each_run: args.readback_each_run,
        min_sample_s: args.min_sample_ms / 1e3,
        ..Settings::default()
    };
    let mut pool: Vec<Option<Box<dyn moeflow::bench::Comparison>>> =
        comparisons().into_iter().map(Some).collect();
    let chosen: Vec<Box<dyn moeflow::bench::Comparison>> = if args.comparison.is_empty() {
        pool.into_iter().flatten().collect()
    } else {
        let mut chosen = Vec::new();
        for filter in &args.comparison {
            for slot in &mut pool {
                if slot.as_ref().is_some_and(|c| c.name().contains(filter.as_str())) {
                    chosen.extend(slot.take());
                }
            }
        }
        chosen
    };
    let set_for = |ctx: &Context| match args.sizes {
        Sizes::Auto => SizeSet::for_adapter(ctx.adapter()),
        Sizes::Gpu => SizeSet::Gpu,
        Sizes::Cpu => SizeSet::Cpu,
    };
    let total: usize = ctxs
        .iter()
        .map(|c| chosen.iter().map(|cmp| cmp.sizes(set_for(c), args.held_out).len()).sum::<usize>())
        .sum();
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| Error::invalid(e.to_string()))?
            .progress_chars("=> "),
    );
    std::fs::create_dir_all(&args.out)
        .map_err(|source| Error::Io { path: args.out.display().to_string(), source })?;
    let date = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let tag = if args.held_out { "-held-out" } else { "" };
    let git = GitState::current();
    let mut records = Vec::new();
    for ctx in &ctxs {
        let set = set_for(ctx);
        bar.set_message(format!("{}: calibrating", ctx.adapter().slug()));
        let calibration = calibrate(ctx, set)?;
        let mut record = RunRecord {
            schema_version: SCHEMA_VERSION,
            moeflow_version: env!("CARGO_PKG_VERSION").into(),
            created_utc: chrono::Utc::now().to_rfc3339(),
            adapter: ctx.adapter().clone(),
            wgpu_version: WGPU_VERSION.into(),
            runtime_checks: RUNTIME_CHECKS.into(),
            git: git.clone(),
            settings: settings.clone(),
            size_set: set,
            calibration,
            comparisons: Vec::new(),
            queue_probe: None,
        };
        let path = args.out.join(format!("{date}-{}{tag}.json", ctx.adapter().slug()));
        for cmp in &chosen {
            let rec = run_comparison(ctx, cmp.as_ref(), set, &settings, &record.calibration, |what| {
                bar.set_message(format!("{}: {what}", ctx.adapter().slug()));
                bar.inc(1);
            });
            if let Some(e) = &rec.error {
                bar.println(format!("{} {}: {e}", ctx.adapter().slug(), rec.name));
            }
            record.comparisons.push(rec);
            // Written after every comparison, so a run stopped part-way keeps what it measured.
            write_record(&path, &record)?;
        }
        if record.comparisons.iter().any(|c| c.name.starts_with("dag/")) {
            // Cached by the first queue comparison: the verdict its `W=0` sizes used.
            record.queue_probe = moeflow::dag::probe(ctx).ok().map(|p| (*p).clone());
        }
        write_record(&path, &record)?;
        bar.println(format!("wrote {}", path.display()));
        records.push(record);
    }
    bar.finish_and_clear();
    write_reports(&args.out, &format!("{date}-matrix{tag}"), &records)?;
    Ok(())
}
