//! Runs the eight-stage chain of the scheduler experiment with every DAG executor on one
//! adapter: the queue probe's verdict, the planner's passes, each executor's GPU time (median
//! of `--runs` single runs) and a bit-for-bit check against the staged executor, which is
//! itself checked against the CPU oracle. With `--moe`, the MoE layer's stage graph (route,
//! dispatch, experts, shared expert, combine) instead: each executor's passes, the host wall
//! time of a run and a bit-for-bit check against `MoeLayer`'s own forward. Its stages are
//! whole-stage dispatches, so fused passes run the layer's task program instead (route,
//! layout, expert-tile and combine tasks: five static passes of fine tasks for
//! `MoeExecutor::Passes` of fine tasks, four for coarse ones) and the queue runs the same
//! tasks in one persistent dispatch (fine and coarse), where the layer has a task form
//! (dropless, unsplit weights, 10 storage bindings); otherwise the graph's passes run (the
//! report says why).
//!
//! `cargo run --release --example dag -- --help` lists the options; `docs/dag.md` explains
//! the executors.

use std::process::ExitCode;

use clap::Parser;
use moeflow::bench::Sampler;
use moeflow::bench::verdict::median;
use moeflow::dag::moe::passes as task_passes;
use moeflow::dag::{
    Executor, Fusion, Granularity, LayerRun, MoeExecutor, QueueOptions, RowGraph, RowInputs, RowRun,
    TaskShape, TaskSize, plan, probe,
};
use moeflow::layer::{MoeConfig, MoeLayer};
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
    /// Run the MoE layer's stage graph instead of the chain.
    #[arg(long)]
    moe: bool,
    /// With --moe: tokens.
    #[arg(long, default_value_t = 64)]
    tokens: u32,
    /// With --moe: hidden size H.
    #[arg(long, default_value_t = 256)]
    hidden: u32,
    /// With --moe: expert FFN size F.
    #[arg(long, default_value_t = 512)]
    ffn: u32,
    /// With --moe: experts E.
    #[arg(long, default_value_t = 16)]
    experts: u32,
    /// With --moe: experts per token.
    #[arg(long, default_value_t = 2)]
    k: u32,
    /// With --moe: shared expert FFN size (0 for none).
    #[arg(long, default_value_t = 128)]
    shared_ffn: u32,
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

/// Every stage's values under the bit-identity contract (`moeflow::bits`).
fn bits(v: &[Vec<f32>]) -> Vec<u32> {
    v.iter().flat_map(|s| moeflow::bits::canonical(s)).collect()
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
    if args.moe {
        return run_moe(&ctx, args, workers);
    }

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
            executors.push(Executor::Queue(Granularity::Fine, QueueOptions::new(w)));
            executors.push(Executor::Queue(Granularity::Coarse(Fusion::Neighbours), QueueOptions::new(w)));
            executors.push(Executor::Queue(
                Granularity::Fine,
                QueueOptions { coordination_only: true, ..QueueOptions::new(w) },
            ));
        }
        None => println!("queue: refused on this adapter, static executors only"),
    }
    let mut all_ok = oracle_ok;
    println!("{:<40} {:>10} {:>6} {:>12}  bits vs staged", "executor", "dispatches", "tasks", "ms (median)");
    for e in executors {
        let r = RowRun::prepare(&ctx, &graph, &inputs, e)?;
        let (ms, clock, stopped) = time(&ctx, &r, args.runs)?;
        let coordination = matches!(e, Executor::Queue(_, q) if q.coordination_only);
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

/// The MoE layer's stage graph on every executor (see the module docs).
fn run_moe(ctx: &Context, args: &Args, workers: Option<u32>) -> Result<()> {
    let mut cfg = MoeConfig::new(args.hidden, args.ffn, args.experts, args.k);
    cfg.shared_ffn = (args.shared_ffn > 0).then_some(args.shared_ffn);
    println!("MoE layer: M={}, {cfg}", args.tokens);
    let mut synth = Synth::new(args.seed);
    let layer = MoeLayer::new(ctx, cfg, &synth.moe_weights(&cfg))?;
    let x = synth.uniform((args.tokens * args.hidden) as usize, 1.0);
    let want = moeflow::bits::canonical(&layer.forward_host(ctx, &x)?.y);
    let xb = ctx.upload("x", &x)?;
    let (fine, coarse) = (TaskShape::new(TaskSize::Fine), TaskShape::new(TaskSize::Coarse));
    let mut executors = vec![MoeExecutor::Staged, MoeExecutor::Passes(fine), MoeExecutor::Passes(coarse)];
    if let Some(w) = workers {
        executors.push(MoeExecutor::Queue(fine, QueueOptions::new(w)));
        executors.push(MoeExecutor::Queue(coarse, QueueOptions::new(w)));
    }
    let mut all_ok = true;
    for e in executors {
        let y = ctx.zeroed("y", want.len() as u64 * 4)?;
        let run = LayerRun::prepare(ctx, &layer, layer.io(&xb, &y, args.tokens)?, e)?;
        run.run(ctx)?; // warm-up
        let mut wall = Vec::new();
        let mut report = None;
        for _ in 0..args.runs.max(1) {
            let start = std::time::Instant::now();
            report = Some(run.run(ctx)?);
            wall.push(start.elapsed().as_secs_f64());
        }
        let got = moeflow::bits::canonical(&ctx.read_back::<f32>(&y, want.len())?);
        let same = got == want;
        all_ok &= same;
        let fallback = report.and_then(|r| r.fallback).map(|f| format!(" ({f})")).unwrap_or_default();
        let shape = match (run.program(), run.staged()) {
            (Some(p), _) => {
                let t = p.tasks();
                let projections = match t.size {
                    TaskSize::Fine => format!(
                        "{} gate/up and {} down over {} tile slots, {} shared gate/up, {} shared down",
                        t.up, t.down, t.slots, t.shared_up, t.shared_down
                    ),
                    _ => format!("{} expert tiles (tile slots), {} shared tiles", t.expert, t.shared),
                };
                let tasks = format!(
                    "{} tasks: {} route, {} layout, {projections}, {} combine",
                    t.size.name(),
                    t.route,
                    t.layout,
                    t.combine
                );
                if p.queue_dispatches().is_some() {
                    tasks
                } else {
                    let names: Vec<String> =
                        task_passes(t.size).iter().map(|(n, _)| format!("[{n}]")).collect();
                    format!("{tasks}\n    task passes: {}", names.join(" "))
                }
            }
            (None, Some((graph, plan))) => {
                let passes: Vec<String> = plan
                    .passes
                    .iter()
                    .map(|pass| {
                        let names: Vec<&str> =
                            pass.steps.iter().map(|s| graph.stages()[s.stage].name.as_str()).collect();
                        format!("[{}]", names.join(" "))
                    })
                    .collect();
                format!("passes: {}", passes.join(" "))
            }
            (None, None) => String::new(),
        };
        println!(
            "{:<28} {:>8.3} ms wall (median of {})  {}{fallback}\n    {shape}",
            match e {
                MoeExecutor::Queue(shape, q) =>
                    format!("Queue({} workers, {})", q.workers, shape.size.name()),
                MoeExecutor::Passes(shape) => format!("Passes({})", shape.size.name()),
                other => format!("{other:?}"),
            },
            median(&mut wall) * 1e3,
            args.runs.max(1),
            if same { "identical to MoeLayer" } else { "DIFFERENT from MoeLayer" },
        );
    }
    println!("result: {}", if all_ok { "PASS" } else { "FAIL" });
    if !all_ok {
        return Err(Error::Validation("an executor's outputs differ from the layer's (see above)".into()));
    }
    Ok(())
}
