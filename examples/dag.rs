//! Runs the eight-stage chain of the scheduler experiment with every DAG executor on one
//! adapter: the queue probe's verdict, the planner's passes, each executor's GPU time (median
//! of `--runs` single runs) and a bit-for-bit check against the staged executor, which is
//! itself checked against the CPU oracle.
//!
//! `cargo run --release --example dag -- --help` lists the options; `docs/dag.md` explains
//! the executors.

use std::process::ExitCode;

use clap::Parser;
use moeflow::bench::Sampler;
use moeflow::bench::verdict::median;
use moeflow::dag::{Executor, Fusion, Granularity, QueueOptions, RowGraph, RowInputs, RowRun, plan, probe};
use moeflow::reference::dag as reference;
use moeflow::synth::Synth;
use moeflow::{AdapterSelector, Context, Error, Result};

#[derive(Parser, Debug)]
#[command(about = "Run the eight-stage chain with every DAG executor and compare them")]
struct Args {
    /// Adapter: `vulkan`, `gl`, `vulkan:llvmpipe`, a name substring (default: MOEFLOW_ADAPTER or the best found).
    #[arg(long)]
    adapter: Option<String>,
    /// Rows (one tile each).
    #[arg(long, default_value_t = 32)]
    rows: u32,
    /// Columns.
    #[arg(long, default_value_t = 2048)]
    cols: u32,
    /// Queue workers (capped by the probe's bound).
    #[arg(long, default_value_t = 8)]
    workers: u32,
    /// Timed runs per executor.
    #[arg(long, default_value_t = 5)]
    runs: u32,
    /// Data seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn main() -> ExitCode {
    env_logger::init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn bits(v: &[Vec<f32>]) -> Vec<u32> {
    v.iter().flatten().map(|f| f.to_bits()).collect()
}

/// Median GPU (or, without timestamps, wall) milliseconds of `runs` single runs, and how many
/// of them a queue stopped early.
fn time(ctx: &Context, run: &RowRun, runs: u32) -> Result<(f64, &'static str, u32)> {
    let dispatches: Vec<_> = run.dispatches().iter().collect();
    let mut sampler = Sampler::new(ctx, runs)?;
    sampler.untimed(&dispatches, 1)?;
    run.clear_status(ctx);
    let samples = (0..runs).map(|_| sampler.sample(&dispatches, 1)).collect::<Result<Vec<_>>>()?;
    let stopped = match run.tasks() {
        0 => 0,
        _ => {
            let s = run.queue_status(ctx)?;
            s.earlier_faults + u32::from(!s.complete())
        }
    };
    let gpu: Option<Vec<f64>> = sampler.gpu_seconds(&samples)?.into_iter().collect();
    let (mut secs, clock) = match gpu {
        Some(g) => (g, "GPU"),
        None => (samples.iter().map(|s| s.wall_s).collect(), "wall"),
    };
    Ok((median(&mut secs) * 1e3, clock, stopped))
}

fn run(args: &Args) -> Result<()> {
    let ctx = match &args.adapter {
        Some(s) => Context::with_selector(&s.parse::<AdapterSelector>()?)?,
        None => Context::new()?,
    };
    println!("adapter: {} ({})", ctx.adapter().name, ctx.adapter().backend);
    let report = probe(&ctx)?;
    let mp = &report.message_passing;
    println!(
        "queue probe: {:?}; message passing: {} messages seen, {} stale words, {} reader timeouts",
        report.verdict, mp.observed, mp.violations, mp.timeouts
    );
    let workers = match report.max_workers() {
        Ok(max) => Some(args.workers.clamp(1, max)),
        Err(_) => None,
    };

    let graph = RowGraph::seed_chain(args.rows, args.cols, args.seed)?;
    for fusion in [Fusion::Neighbours, Fusion::Full] {
        let p = plan(graph.graph(), fusion);
        let passes: Vec<String> = p
            .passes
            .iter()
            .map(|pass| {
                let names: Vec<String> = pass
                    .steps
                    .iter()
                    .map(|s| match s.extra {
                        0 => graph.graph().stages()[s.stage].name.clone(),
                        e => format!("{}+{e}", graph.graph().stages()[s.stage].name),
                    })
                    .collect();
                format!("[{}]", names.join(" "))
            })
            .collect();
        println!("plan {fusion:?}: {}", passes.join(" "));
    }

    let x = Synth::new(args.seed ^ 0x5eed).uniform(args.rows as usize * args.cols as usize, 2.0);
    let inputs = RowInputs::upload(&ctx, &graph, &x)?;
    let staged = RowRun::prepare(&ctx, &graph, &inputs, Executor::Staged)?;
    staged.run(&ctx)?;
    let want = staged.read_all(&ctx)?;
    let oracle = reference::row_graph(&graph, &x);
    let oracle_ok = reference::first_outside_bound(&want, &oracle).is_none();
    println!("staged vs CPU oracle (2e-5 + 2e-5·|ref|): {}", if oracle_ok { "ok" } else { "MISMATCH" });

    let mut executors =
        vec![Executor::Staged, Executor::Fused(Fusion::Neighbours), Executor::Fused(Fusion::Full)];
    match workers {
        Some(w) => {
            executors.push(Executor::Queue(QueueOptions::new(w, Granularity::Fine)));
            executors.push(Executor::Queue(QueueOptions::new(w, Granularity::Coarse(Fusion::Neighbours))));
            executors.push(Executor::Queue(QueueOptions {
                coordination_only: true,
                ..QueueOptions::new(w, Granularity::Fine)
            }));
        }
        None => println!("queue: refused on this adapter, static executors only"),
    }
    let mut all_ok = oracle_ok;
    println!("{:<40} {:>10} {:>6} {:>12}  bits vs staged", "executor", "dispatches", "tasks", "ms (median)");
    for e in executors {
        let r = RowRun::prepare(&ctx, &graph, &inputs, e)?;
        let (ms, clock, stopped) = time(&ctx, &r, args.runs)?;
        let coordination = matches!(e, Executor::Queue(q) if q.coordination_only);
        let check = if coordination {
            "not compared (diagnostic, no arithmetic)".to_string()
        } else {
            // A last run through `run`, which falls back if the queue stops early.
            let report = r.run(&ctx)?;
            let same = bits(&r.read_all(&ctx)?) == bits(&want);
            all_ok &= same;
            let fallback = report.fallback.map(|f| format!(" ({f})")).unwrap_or_default();
            format!("{}{fallback}", if same { "identical" } else { "DIFFERENT" })
        };
        let stopped = match stopped {
            0 => String::new(),
            n => format!(", {n} of {} timed runs stopped early", args.runs),
        };
        println!(
            "{:<40} {:>10} {:>6} {:>9.3} {clock}  {check}{stopped}",
            r.label(),
            r.dispatches().len(),
            r.tasks(),
            ms
        );
    }
    println!("result: {}", if all_ok { "PASS" } else { "FAIL" });
    if !all_ok {
        return Err(Error::Validation("an executor's outputs differ (see above)".into()));
    }
    Ok(())
}
