//! Runs a comparison under the protocol: validate, warm up, ABBA blocks, validate again.

use web_time::Instant;

use super::comparison::{Case, Comparison, Size, SizeSet, Work};
use super::record::{Calibration, CaseRecord, ComparisonRecord, Settings, VariantFigures};
use super::verdict::{Block, Counts, Summary, geomean_change, median, summarize};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline::Dispatch;
use crate::timer::{Sample, Sampler};

/// Seed of held-out runs (different data as well as different sizes).
pub(crate) const HELD_OUT_SEED: u64 = 7919;

fn validation(stage: &str, e: Error) -> Error {
    match e {
        Error::Validation(msg) => Error::Validation(format!("{stage}: {msg}")),
        other => Error::Validation(format!("{stage}: {other}")),
    }
}

fn blocks(samples: &[f64], reps: u32) -> Vec<Block> {
    samples
        .chunks_exact(4)
        .map(|s| {
            let r = f64::from(reps);
            Block { a: [s[0] / r, s[3] / r], b: [s[1] / r, s[2] / r] }
        })
        .collect()
}

fn figures(seconds: f64, case: &Case, cal: &Calibration, work: &Work) -> VariantFigures {
    let gflops = (case.flops > 0.0).then(|| case.flops / seconds / 1e9);
    let gbps = (case.bytes > 0.0).then(|| case.bytes / seconds / 1e9);
    VariantFigures {
        seconds,
        gflops,
        gbps,
        fraction_of_fma: gflops.map(|g| g / cal.fma_gflops),
        fraction_of_bandwidth: gbps.map(|g| g / cal.copy_gbps),
        dispatches: work.dispatches(),
        readbacks: work.readbacks(),
        tokens_per_s: (case.tokens > 0).then(|| f64::from(case.tokens) / seconds),
    }
}

struct Runner<'c> {
    sampler: Sampler<'c>,
    ctx: &'c Context,
}

impl Runner<'_> {
    /// One sample of `work` repeated `reps` times; timed samples get a GPU timestamp pair
    /// when the work is GPU-only.
    fn run(&mut self, work: &Work, reps: u32, timed: bool) -> Result<Sample> {
        match work {
            Work::Gpu(ds) => {
                let ds: Vec<&Dispatch> = ds.iter().collect();
                if timed { self.sampler.sample(&ds, reps) } else { self.sampler.untimed(&ds, reps) }
            }
            Work::Host { run, .. } => {
                let start = Instant::now();
                for _ in 0..reps {
                    run(self.ctx)?;
                }
                Ok(Sample::wall_only(start.elapsed().as_secs_f64()))
            }
        }
    }
}

/// Times one case: one untimed run of each variant, validation, `warmup` untimed ABBA
/// blocks, `blocks` recorded ABBA blocks, validation again. A validation failure is an
/// [`Error::Validation`] and no timing is returned. Cases with host-driven work are judged
/// on the wall clock.
///
/// # Errors
/// [`Error::Validation`] when an output disagrees with its reference (then no timing);
/// device errors while running; a sampler past its capacity.
pub fn run_case(
    ctx: &Context,
    size: &Size,
    case: &Case,
    s: &Settings,
    cal: &Calibration,
) -> Result<CaseRecord> {
    let mut r = Runner { sampler: Sampler::new(ctx, 4 * s.blocks)?, ctx };
    // One untimed run of each produces the outputs to validate; A's wall time then sets the
    // repetitions per sample.
    r.run(&case.b, 1, false)?;
    let probe = r.run(&case.a, 1, false)?;
    (case.validate)(ctx).map_err(|e| validation("before warm-up", e))?;
    let reps = ((s.min_sample_s / probe.wall_s.max(1e-9)).ceil() as u32).clamp(1, s.max_reps);
    let (a, b) = (&case.a, &case.b);
    for _ in 0..s.warmup {
        for v in [a, b, b, a] {
            r.run(v, reps, false)?;
        }
    }
    let mut samples: Vec<Sample> = Vec::with_capacity(4 * s.blocks as usize);
    for _ in 0..s.blocks {
        for v in [a, b, b, a] {
            samples.push(r.run(v, reps, true)?);
            if s.readback_each_run {
                (case.validate)(ctx).map_err(|e| validation("during the timed sequence", e))?;
            }
        }
    }
    let sampler = r.sampler;
    (case.validate)(ctx).map_err(|e| validation("after the timed sequence", e))?;

    let wall: Vec<f64> = samples.iter().map(|x| x.wall_s).collect();
    let gpu: Option<Vec<f64>> = sampler.gpu_seconds(&samples)?.into_iter().collect();
    let gpu = gpu.filter(|_| matches!((a, b), (Work::Gpu(_), Work::Gpu(_))));
    let blocks_wall = blocks(&wall, reps);
    let blocks_gpu = gpu.as_ref().map(|g| blocks(g, reps));
    let wall_summary = summarize(&blocks_wall, &s.rules);
    let gpu_summary = blocks_gpu.as_ref().map(|b| summarize(b, &s.rules));
    let (clock, primary, per_run): (&str, &Summary, &Vec<Block>) = match (&gpu_summary, &blocks_gpu) {
        (Some(sum), Some(bl)) => ("gpu", sum, bl),
        _ => ("wall", &wall_summary, &blocks_wall),
    };
    let a_s = median(&mut per_run.iter().flat_map(|b| b.a).collect::<Vec<_>>());
    let b_s = median(&mut per_run.iter().flat_map(|b| b.b).collect::<Vec<_>>());
    Ok(CaseRecord {
        size: size.to_string(),
        note: case.note.clone(),
        params: size.0.clone(),
        reps,
        verdict: primary.verdict,
        ratio: primary.ratio,
        clock: clock.into(),
        a: figures(a_s, case, cal, &case.a),
        b: figures(b_s, case, cal, &case.b),
        gpu: gpu_summary.clone(),
        wall: wall_summary,
        blocks_gpu,
        blocks_wall,
    })
}

/// Runs every size of `cmp` in `set`, calling `progress` after each size. A size that fails
/// to build or validate is recorded in `error` (messages joined by `; `), with no timings for
/// it, and the remaining sizes still run.
pub fn run_comparison(
    ctx: &Context,
    cmp: &dyn Comparison,
    set: SizeSet,
    s: &Settings,
    cal: &Calibration,
    mut progress: impl FnMut(&str),
) -> ComparisonRecord {
    let seed = if s.held_out { HELD_OUT_SEED } else { s.seed };
    let (a, b) = cmp.variants();
    let mut rec = ComparisonRecord {
        name: cmp.name().into(),
        description: cmp.description().into(),
        a: a.into(),
        b: b.into(),
        cases: Vec::new(),
        geomean_change: f64::NAN,
        geomean_change_wall: f64::NAN,
        verdicts: Counts::default(),
        error: None,
    };
    for size in cmp.sizes(set, s.held_out) {
        progress(&format!("{} {size}", cmp.name()));
        let result = cmp.build(ctx, &size, seed).and_then(|case| run_case(ctx, &size, &case, s, cal));
        match result {
            Ok(c) => {
                rec.verdicts.add(c.verdict);
                rec.cases.push(c);
            }
            Err(e) => {
                let msg = format!("{size}: {e}");
                rec.error = Some(match rec.error.take() {
                    Some(earlier) => format!("{earlier}; {msg}"),
                    None => msg,
                });
            }
        }
    }
    rec.geomean_change = geomean_change(&rec.cases.iter().map(|c| c.ratio).collect::<Vec<_>>());
    rec.geomean_change_wall = geomean_change(&rec.cases.iter().map(|c| c.wall.ratio).collect::<Vec<_>>());
    rec
}
