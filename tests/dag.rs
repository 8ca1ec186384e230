//! The DAG layer on every adapter: the planner's passes and tasks, every executor bit-identical
//! to the staged one (and the staged one against the CPU oracle) on adversarial inputs, the
//! probe, a forced queue timeout falling back instead of hanging, the MoE layer as a graph
//! and on the MoE task queue (adversarial routing, a forced stall), and bad input.

mod common;

use std::sync::{Mutex, MutexGuard};

use common::{assert_close, bits, contexts};
use moeflow::Context;
use moeflow::dag::{
    CombineRule, Executor, Fusion, Granularity, Graph, LayerRun, MoeExecutor, MoeProgram, ProbeVerdict,
    QueueOptions, Reach, Read, RowGraph, RowInputs, RowOp, RowRun, Source, TaskShape, TaskSize, plan, probe,
};
use moeflow::kernels::dispatch::OverflowPolicy;
use moeflow::kernels::gemm::{GemmOrder, WeightDtype};
use moeflow::kernels::routing::{Gating, GroupLimit, RouteConfig};
use moeflow::layer::{Capacity, MoeConfig, MoeLayer, MoeWeights};
use moeflow::reference::dag as reference;
use moeflow::synth::Synth;

/// Input with exact ties, 1-ulp neighbours, signed zeros, and one row each of NaN and inf.
fn adversarial(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut x = Synth::new(seed).uniform(rows * cols, 2.0);
    for c in 0..cols {
        x[c] = if c % 2 == 0 { 0.0 } else { -0.0 };
        if rows > 3 {
            x[cols + c] = 0.75;
            x[2 * cols + c] = f32::from_bits(0.75f32.to_bits() + (c as u32 % 2));
        }
    }
    if rows > 6 {
        x[5 * cols + 3] = f32::NAN;
        x[6 * cols + 1] = f32::INFINITY;
        x[6 * cols + 2] = f32::NEG_INFINITY;
    }
    x
}

/// Asserts every stage bit-identical, naming the first differing stage, row and column.
fn assert_bitwise(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], cols: usize) {
    assert_eq!(got.len(), want.len(), "{what}: stages");
    for (s, (g, w)) in got.iter().zip(want).enumerate() {
        if let Some(i) = moeflow::bits::first_difference(g, w) {
            let n = moeflow::bits::differences(g, w);
            panic!(
                "{what}: stage {s} row {} col {}: {:e} vs staged {:e} ({n} differ)",
                i / cols,
                i % cols,
                g[i],
                w[i]
            );
        }
    }
}

/// Serialises the tests that run the queue: on CPU adapters, workers of two tests at once
/// compete for the same cores, and a descheduled producer makes waits run long.
fn exclusive() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether a queue run with `workers` workers that stopped early for `why` may be a scheduling
/// stop rather than a failure: only on a CPU adapter (lavapipe, llvmpipe GL, SwiftShader), and
/// only with more than one worker.
///
/// On a CPU adapter the workers are host threads. A worker waiting for a task whose worker's
/// thread the OS has descheduled polls until that thread runs again, which on a busy machine
/// can take milliseconds, and llvmpipe caps the loop iterations of one invocation (65535 over
/// all its loops, polls included), so any multi-worker run may stop at the cap (or, more
/// rarely, at the spin limit) when the machine is loaded. The run then falls back to static
/// passes, whose bits every test still checks. One worker never waits (each task's
/// dependencies have lower tickets, which that worker has finished), so a one-worker queue must
/// run cleanly everywhere, busy or not: every test that tolerates these stops also runs one.
/// On other adapters every stop is a failure.
fn scheduling_stop(ctx: &Context, workers: u32, why: &str) -> bool {
    ctx.adapter().is_cpu()
        && workers > 1
        && (why.contains("cut a shader loop short") || why.contains("timed out"))
}

/// The clean-run requirement of a queue with `workers` workers after runs that all stopped
/// early, for the reasons in `stops`: a failure unless every stop is a [`scheduling_stop`],
/// which is printed instead.
fn no_clean_run(ctx: &Context, what: &str, workers: u32, stops: &[String]) {
    if stops.iter().all(|why| scheduling_stop(ctx, workers, why)) {
        eprintln!(
            "{what}: no clean run in {} on a CPU adapter ({stops:?}): the machine is busy; the \
             one-worker queue carries the clean-run proof",
            stops.len()
        );
    } else {
        panic!("{what}: the queue never completed cleanly in {} runs: {stops:?}", stops.len());
    }
}

/// The workers of a queue executor.
fn workers_of(e: Executor) -> Option<u32> {
    match e {
        Executor::Queue(_, q) => Some(q.workers),
        _ => None,
    }
}

/// Runs `e` with `lanes` lanes once, or a multi-worker queue up to three times: such a run can
/// stop early (see [`scheduling_stop`]) and is then rerun with fused passes. Every run's outputs must
/// match `want` bit for bit, and a queue must complete cleanly at least once (where
/// [`no_clean_run`] does not excuse it). Returns the label and the last outputs.
fn run_checked(
    ctx: &Context,
    g: &RowGraph,
    inputs: &RowInputs,
    e: Executor,
    lanes: u32,
    want: Option<&[Vec<f32>]>,
) -> (String, Vec<Vec<f32>>) {
    let r = RowRun::prepare_with_lanes(ctx, g, inputs, e, lanes).expect("prepare");
    let tries = if r.tasks() > 0 && workers_of(e).is_some_and(|w| w > 1) { 3 } else { 1 };
    let mut stops = Vec::new();
    let mut last = Vec::new();
    for attempt in 0..tries {
        let report = r.run(ctx).expect("run");
        last = r.read_all(ctx).expect("read");
        if let Some(want) = want {
            assert_bitwise(
                &format!("{} (run {attempt}, fallback {:?})", r.label(), report.fallback),
                &last,
                want,
                g.cols() as usize,
            );
        }
        match report.fallback {
            None => {
                if r.tasks() > 0 {
                    assert!(r.queue_status(ctx).expect("status").complete());
                }
                return (r.label().to_string(), last);
            }
            Some(reason) => {
                assert!(
                    reason.contains("cut a shader loop short") || reason.contains("timed out"),
                    "{reason}"
                );
                eprintln!("{}: {reason}", r.label());
                stops.push(reason);
            }
        }
    }
    no_clean_run(ctx, r.label(), workers_of(e).unwrap_or(0), &stops);
    (r.label().to_string(), last)
}

#[test]
fn planner_cuts_the_seed_chain_into_eight_three_and_one_pass() {
    let g = RowGraph::seed_chain(32, 256, 0).unwrap();
    let none = plan(g.graph(), Fusion::None);
    let neighbours = plan(g.graph(), Fusion::Neighbours);
    let full = plan(g.graph(), Fusion::Full);
    assert_eq!((none.passes.len(), neighbours.passes.len(), full.passes.len()), (8, 3, 1));
    let steps: Vec<Vec<(usize, u32)>> =
        neighbours.passes.iter().map(|p| p.steps.iter().map(|s| (s.stage, s.extra)).collect()).collect();
    assert_eq!(steps, vec![vec![(0, 1), (1, 0), (2, 0), (3, 0)], vec![(4, 0), (5, 0), (6, 0)], vec![(7, 0)]]);
    let extras: Vec<u32> = full.passes[0].steps.iter().map(|s| s.extra).collect();
    assert_eq!(extras, vec![3, 2, 2, 2, 1, 1, 1, 0]);
    assert_eq!(neighbours.cuts.len(), 2, "{:?}", neighbours.cuts);

    let fine = none.tasks(g.graph());
    let coarse = neighbours.tasks(g.graph());
    assert_eq!((fine.len(), coarse.len()), (256, 96));
    // silu0 on tile 0 needs affine0 tiles 0 and 1; on tile 5, tiles 4..=6.
    assert_eq!(fine[32].deps, vec![0, 1]);
    assert_eq!(fine[37].deps, vec![4, 5, 6]);
    // Coarse pass 1 (silu1, rms1, affine2) reads affine1 (pass 0) with a halo of one tile.
    assert_eq!(coarse[32 + 10].deps, vec![9, 10, 11]);
    for (i, t) in fine.iter().chain(&coarse).enumerate() {
        assert!(t.deps.iter().all(|&d| d < i % 256 || d < i), "task {i} waits on a later task");
    }
}

#[test]
fn planner_refuses_to_fuse_whole_reads_and_graph_reads_only_earlier_stages() {
    let mut g: Graph<()> = Graph::new(8, 2).unwrap();
    let a = g.add("a", (), vec![Read { source: Source::Input, reach: Reach::RowLocal }]).unwrap();
    g.add("b", (), vec![Read { source: Source::Stage(a), reach: Reach::Whole }]).unwrap();
    let p = plan(&g, Fusion::Full);
    assert_eq!(p.passes.len(), 2);
    assert!(p.cuts[0].contains("reads all rows"), "{:?}", p.cuts);
    let tasks = p.tasks(&g);
    assert_eq!(tasks[4].deps, vec![0, 1, 2, 3]);
    let err = g.add("c", (), vec![Read { source: Source::Stage(7), reach: Reach::RowLocal }]).unwrap_err();
    assert!(err.to_string().contains("not an earlier stage"), "{err}");
    assert!(Graph::<()>::new(0, 1).is_err());
}

#[test]
fn every_executor_is_bit_identical_to_staged_and_staged_matches_the_oracle() {
    let _queue = exclusive();
    for ctx in contexts() {
        let name = ctx.adapter().slug();
        let report = probe(&ctx).unwrap();
        eprintln!("{name}: probe {:?}", report.verdict);
        // 13 rows in tiles of 2 (the last tile short), 200 columns (not a multiple of the
        // workgroup). Static passes also run with 1, 8 and 64 lanes: no result depends on it.
        let own = moeflow::dag::lanes_for(&ctx);
        for (rows, cols, tile_rows) in [(13u32, 200u32, 2u32), (9, 64, 1)] {
            let mut g = RowGraph::new(rows, cols, tile_rows).unwrap();
            let seed = RowGraph::seed_chain(rows, cols, 3).unwrap();
            let mut source = Source::Input;
            for st in seed.graph().stages() {
                source = Source::Stage(g.add(st.name.clone(), st.kernel.clone(), source).unwrap());
            }
            let x = adversarial(rows as usize, cols as usize, 11);
            let inputs = RowInputs::upload(&ctx, &g, &x).unwrap();
            let (_, staged) = run_checked(&ctx, &g, &inputs, Executor::Staged, own, None);
            let want = reference::row_graph(&g, &x);
            for (s, (got, w)) in staged.iter().zip(&want).enumerate() {
                assert_close(&format!("{name} staged stage {s}"), got, w);
            }
            assert!(staged[7].iter().any(|v| v.is_nan()), "the NaN row reaches the last stage");
            let mut executors = vec![Executor::Fused(Fusion::Neighbours), Executor::Fused(Fusion::Full)];
            if let Ok(max) = report.max_workers() {
                // Worker counts within the probe's bound (a busy machine can lower it to 1).
                let mut counts = vec![1, 3.min(max), max.min(20)];
                counts.dedup();
                for w in counts {
                    executors.push(Executor::Queue(Granularity::Fine, QueueOptions::new(w)));
                    executors
                        .push(Executor::Queue(Granularity::Coarse(Fusion::Neighbours), QueueOptions::new(w)));
                }
                executors
                    .push(Executor::Queue(Granularity::Coarse(Fusion::Full), QueueOptions::new(4.min(max))));
            }
            for e in executors {
                run_checked(&ctx, &g, &inputs, e, own, Some(&staged));
            }
            for lanes in [1, 8, 64] {
                for e in
                    [Executor::Staged, Executor::Fused(Fusion::Neighbours), Executor::Fused(Fusion::Full)]
                {
                    run_checked(&ctx, &g, &inputs, e, lanes, Some(&staged));
                }
            }
        }
    }
}

#[test]
fn probe_verdicts_are_consistent_and_cached() {
    let _queue = exclusive();
    for ctx in contexts() {
        let r = probe(&ctx).unwrap();
        assert!(std::sync::Arc::ptr_eq(&r, &probe(&ctx).unwrap()), "the verdict is cached");
        let mp = &r.message_passing;
        eprintln!("{}: {mp:?} progress {:?} -> {:?}", ctx.adapter().slug(), r.progress, r.verdict);
        match &r.verdict {
            ProbeVerdict::Allowed { max_workers } => {
                assert_eq!((mp.violations, mp.timeouts), (0, 0));
                assert!(mp.observed > 0);
                assert!(r.progress.iter().all(|p| !p.complete || p.bitwise), "no silent corruption");
                for w in r.progress.iter().map(|p| p.workers).filter(|w| w <= max_workers) {
                    assert!(r.progress.iter().any(|p| p.workers == w && p.complete), "{w} workers passed");
                }
            }
            ProbeVerdict::Refused { reason } => {
                assert!(!reason.is_empty());
                let g = RowGraph::seed_chain(4, 64, 0).unwrap();
                let inputs = RowInputs::upload(&ctx, &g, &vec![0.5; 256]).unwrap();
                let q = Executor::Queue(Granularity::Fine, QueueOptions::new(1));
                let run = RowRun::prepare(&ctx, &g, &inputs, q).unwrap();
                assert!(run.refused().is_some());
                assert!(run.run(&ctx).unwrap().fallback.is_some(), "a refused queue reports its fallback");
            }
        }
    }
}

#[test]
fn a_forced_timeout_falls_back_to_fused_passes_instead_of_hanging() {
    let _queue = exclusive();
    for ctx in contexts() {
        let max = match probe(&ctx).unwrap().max_workers() {
            Ok(max) => max,
            Err(reason) => {
                eprintln!("skipped on {}: queue refused by the probe: {reason}", ctx.adapter().slug());
                continue;
            }
        };
        let g = RowGraph::seed_chain(8, 96, 5).unwrap();
        let x = adversarial(8, 96, 2);
        let inputs = RowInputs::upload(&ctx, &g, &x).unwrap();
        let (_, staged) =
            run_checked(&ctx, &g, &inputs, Executor::Staged, moeflow::dag::lanes_for(&ctx), None);
        for granularity in [Granularity::Fine, Granularity::Coarse(Fusion::Neighbours)] {
            let opts =
                QueueOptions { spin_limit: 1 << 12, stall_task: Some(9), ..QueueOptions::new(4.min(max)) };
            let r = RowRun::prepare(&ctx, &g, &inputs, Executor::Queue(granularity, opts)).unwrap();
            let started = std::time::Instant::now();
            let report = r.run(&ctx).unwrap();
            let status = r.queue_status(&ctx).unwrap();
            assert_eq!(status.status, 1, "the stalled wait timed out: {status:?}");
            assert!(status.done < status.tasks, "{status:?}");
            let reason = report.fallback.expect("fallback reported");
            assert!(
                reason.contains("timed out") && report.ran.starts_with("fused"),
                "{reason} / {}",
                report.ran
            );
            assert!(started.elapsed().as_secs() < 60, "the timeout is bounded");
            let got = r.read_all(&ctx).unwrap();
            assert_bitwise("fallback output", &got, &staged, 96);
        }
    }
}

#[test]
fn coordination_only_schedules_every_task() {
    let _queue = exclusive();
    for ctx in contexts() {
        let Ok(max) = probe(&ctx).unwrap().max_workers() else { continue };
        let g = RowGraph::seed_chain(32, 256, 0).unwrap();
        let inputs = RowInputs::upload(&ctx, &g, &vec![1.0; 32 * 256]).unwrap();
        // One worker (which never waits), then up to eight.
        for workers in [1, max.min(8)] {
            let opts = QueueOptions { coordination_only: true, ..QueueOptions::new(workers) };
            let r = RowRun::prepare(&ctx, &g, &inputs, Executor::Queue(Granularity::Fine, opts)).unwrap();
            assert!(r.label().contains("coordination only"));
            // As in run_checked: a multi-worker run that stops early is tried again.
            let tries = if workers > 1 { 3 } else { 1 };
            let mut stops = Vec::new();
            for _ in 0..tries {
                match r.run(&ctx).unwrap().fallback {
                    None => break,
                    Some(why) => stops.push(why),
                }
            }
            if stops.len() == tries {
                no_clean_run(&ctx, r.label(), workers, &stops);
                continue;
            }
            let s = r.queue_status(&ctx).unwrap();
            assert_eq!((s.done, s.tasks, s.status), (256, 256, 0), "{}", r.label());
            assert!(s.tickets >= 256);
        }
    }
}

#[test]
fn bad_requests_are_errors() {
    let _queue = exclusive();
    let g = RowGraph::seed_chain(4, 8, 0).unwrap();
    let mut bad = RowGraph::new(4, 8, 1).unwrap();
    let err = bad.add("a", RowOp::Affine { w: vec![1.0; 7], b: vec![0.0; 8] }, Source::Input).unwrap_err();
    assert!(err.to_string().contains("parameters of `a`"), "{err}");
    assert!(RowGraph::new(4, 0, 1).is_err());
    for ctx in contexts() {
        let err = RowInputs::upload(&ctx, &g, &[0.0; 31]).unwrap_err();
        assert!(err.to_string().contains("row graph input"), "{err}");
        let inputs = RowInputs::upload(&ctx, &g, &[0.0; 32]).unwrap();
        let q = |o: QueueOptions| {
            RowRun::prepare(&ctx, &g, &inputs, Executor::Queue(Granularity::Fine, o)).map(|_| ())
        };
        if let Ok(max) = probe(&ctx).unwrap().max_workers() {
            let err = q(QueueOptions::new(0)).unwrap_err();
            assert!(err.to_string().contains("at least one worker"), "{err}");
            let err = q(QueueOptions::new(max + 1)).unwrap_err();
            assert!(err.to_string().contains("queue workers"), "{err}");
            let err = q(QueueOptions { stall_task: Some(32), ..QueueOptions::new(1) }).unwrap_err();
            assert!(err.to_string().contains("stall task 32"), "{err}");
        }
        let err = RowRun::prepare_with_lanes(&ctx, &g, &inputs, Executor::Staged, 48).unwrap_err();
        assert!(err.to_string().contains("power of two"), "{err}");
        let empty = RowGraph::new(4, 8, 1).unwrap();
        let inputs = RowInputs::upload(&ctx, &empty, &[0.0; 32]).unwrap();
        assert!(RowRun::prepare(&ctx, &empty, &inputs, Executor::Staged).is_err());
        // A layer's queue of no workers is refused whether or not the probe allows a queue
        // on this adapter (where it does not, the run would fall back to passes).
        let cfg = MoeConfig::new(16, 8, 4, 2);
        let layer = MoeLayer::new(&ctx, cfg, &Synth::new(1).moe_weights(&cfg)).unwrap();
        let (x, y) = (ctx.zeroed("x", 16 * 4).unwrap(), ctx.zeroed("y", 16 * 4).unwrap());
        let none = MoeExecutor::Queue(TaskShape::new(TaskSize::Fine), QueueOptions::new(0));
        let err = LayerRun::prepare(&ctx, &layer, layer.io(&x, &y, 1).unwrap(), none).unwrap_err();
        assert!(err.to_string().contains("at least one worker"), "{err}");
    }
}

#[test]
fn the_moe_layer_as_a_graph_matches_its_forward_plan() {
    let _queue = exclusive();
    let cfg = MoeConfig { shared_ffn: Some(24), ..MoeConfig::new(40, 24, 8, 2) };
    let weights = Synth::new(4).moe_weights(&cfg);
    let x = Synth::new(5).uniform(37 * 40, 1.0);
    for ctx in contexts() {
        let layer = MoeLayer::new(&ctx, cfg, &weights).unwrap();
        let xb = ctx.upload("x", &x).unwrap();
        let want = layer.forward_host(&ctx, &x).unwrap().y;
        // Four workers, or the probe's bound if lower (a busy machine can lower it to 1; where
        // the probe refuses the queue, the count is not checked and the run falls back).
        let workers = probe(&ctx).unwrap().max_workers().map_or(4, |max| max.min(4));
        let (fine, coarse) = (TaskShape::new(TaskSize::Fine), TaskShape::new(TaskSize::Coarse));
        for e in [
            MoeExecutor::Staged,
            MoeExecutor::Passes(fine),
            MoeExecutor::Passes(coarse),
            MoeExecutor::Queue(fine, QueueOptions::new(workers)),
            MoeExecutor::Queue(coarse, QueueOptions::new(workers)),
        ] {
            let y = ctx.zeroed("y", x.len() as u64 * 4).unwrap();
            let run = LayerRun::prepare(&ctx, &layer, layer.io(&xb, &y, 37).unwrap(), e).unwrap();
            let report = run.run(&ctx).unwrap();
            // The layer's own forward is built only where it is what runs.
            assert_eq!(run.program().is_none(), run.staged().is_some(), "{e:?}");
            if let Some((graph, plan)) = run.staged() {
                let names: Vec<&str> = graph.stages().iter().map(|s| s.name.as_str()).collect();
                assert_eq!(names, ["size", "route", "dispatch", "experts", "shared", "combine"]);
                match e {
                    MoeExecutor::Staged => assert_eq!(plan.passes.len(), 6),
                    // The shared expert reads only the input and the sizes, so it joins the
                    // experts' pass.
                    _ => assert_eq!(plan.passes.len(), 5, "{:?}", plan.cuts),
                }
            }
            let form = moeflow::dag::moe::unsupported(&ctx, &layer);
            match e {
                MoeExecutor::Staged => assert!(run.program().is_none()),
                // A device with too few storage bindings runs the graph's passes and says so.
                _ if form.is_some() => {
                    assert!(report.fallback.as_deref().unwrap_or_default().contains("no task form"));
                    assert!(report.ran.contains("whole-stage"), "{}", report.ran);
                }
                MoeExecutor::Passes(s) if s == fine => {
                    assert_eq!(report.ran, "5 static passes of fine MoE tasks");
                    assert_eq!(report.fallback, None);
                }
                MoeExecutor::Passes(_) => {
                    assert_eq!(report.ran, "4 static passes of coarse MoE tasks");
                    assert_eq!(report.fallback, None);
                }
                // The queue runs where the probe allows it (llvmpipe's loop cap may stop a run,
                // which then reruns as the static passes; the bits are the same either way).
                _ => match &report.fallback {
                    None => assert!(run.program().and_then(|p| p.queue_dispatches()).is_some()),
                    Some(why) => assert!(
                        why.contains("probe") || why.contains("loop short") || why.contains("timed out"),
                        "{why}"
                    ),
                },
            }
            assert_eq!(bits(&ctx.read_back::<f32>(&y, x.len()).unwrap()), bits(&want), "{e:?}");
        }
        // A layer without a task form (a capacity bound) runs the graph's passes and says so.
        let bounded = MoeConfig {
            capacity: Capacity::Bounded { bound: 4, policy: OverflowPolicy::Drop },
            ..MoeConfig::new(40, 24, 8, 2)
        };
        let layer = MoeLayer::new(&ctx, bounded, &Synth::new(6).moe_weights(&bounded)).unwrap();
        let want = layer.forward_host(&ctx, &x).unwrap().y;
        for e in [
            MoeExecutor::Passes(TaskShape::new(TaskSize::Coarse)),
            MoeExecutor::Queue(TaskShape::new(TaskSize::Fine), QueueOptions::new(workers.min(2))),
        ] {
            let y = ctx.zeroed("y", x.len() as u64 * 4).unwrap();
            let run = LayerRun::prepare(&ctx, &layer, layer.io(&xb, &y, 37).unwrap(), e).unwrap();
            let report = run.run(&ctx).unwrap();
            let why = report.fallback.unwrap_or_default();
            assert!(why.contains("no task form") || why.contains("probe"), "{why}");
            assert!(report.ran.contains("whole-stage"), "{}", report.ran);
            assert_eq!(bits(&ctx.read_back::<f32>(&y, x.len()).unwrap()), bits(&want), "{e:?}");
        }
    }
}

/// Runs of a multi-worker MoE queue a test makes before [`no_clean_run`] decides. On lavapipe
/// a worker's waits are bounded by llvmpipe's loop cap (65535 iterations over its life, a few
/// milliseconds of polling), so a run in which the other worker's thread is descheduled that
/// long stops early (about one run in five with two workers on two quiet cores, measured;
/// nearly every run with a background job on the other core); it is then rerun as static
/// passes with the same bits, which the tests check on every try.
const QUEUE_TRIES: usize = 4;

/// The worker counts a MoE queue test runs: one (which never waits), then `most` if larger.
fn queue_workers(most: u32) -> Vec<u32> {
    if most > 1 { vec![1, most] } else { vec![1] }
}

/// MoE layers whose routing is adversarial: (name, config, weights, x) at `tokens` tokens.
fn adversarial_layers(tokens: usize) -> Vec<(&'static str, MoeConfig, MoeWeights, Vec<f32>)> {
    let (h, f, e) = (40usize, 24usize, 8usize);
    let base = MoeConfig::new(h as u32, f as u32, e as u32, 2);
    let mut out = Vec::new();

    // Exact ties between experts 1 and 6 (identical router rows) and 1-ulp near-ties with
    // expert 2; a NaN row, an infinite row and a signed-zero row among the tokens.
    let mut w = Synth::new(11).moe_weights(&base);
    let (r1, r2) = (w.router[h..2 * h].to_vec(), w.router[2 * h..3 * h].to_vec());
    w.router[6 * h..7 * h].copy_from_slice(&r1);
    for (i, v) in r2.iter().enumerate() {
        w.router[2 * h + i] = if i == 0 { f32::from_bits(r1[0].to_bits() + 1) } else { r1[i] };
        let _ = v;
    }
    let mut x = Synth::new(12).uniform(tokens * h, 1.0);
    if tokens > 6 {
        x[3 * h..4 * h].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { 0.0 } else { -0.0 });
        x[4 * h + 5] = f32::NAN;
        x[5 * h + 1] = f32::INFINITY;
    }
    out.push(("ties, NaN, inf and zero rows", base, w, x));

    // One expert takes every token (its router row dominates), the rest of the picks tie at
    // zero logits (so they go to the lowest index), and most experts stay empty.
    let mut w = Synth::new(13).moe_weights(&base);
    w.router.iter_mut().for_each(|v| *v = 0.0);
    w.router[3 * h..4 * h].iter_mut().for_each(|v| *v = 1.0);
    let x = Synth::new(14).uniform(tokens * h, 1.0).iter().map(|v| v.abs() + 0.5).collect();
    out.push(("one expert takes every token", base, w, x));

    // Sigmoid gating with a selection bias and group-limited choice, k = 3, the fast order,
    // renormalised and scaled, f16 weights, and a gated shared expert (Qwen2-MoE) whose F is
    // not a multiple of 64 or of 4 (routed experts' F 22): every program constant that differs
    // from the base layers' in one layer, so one program of its own is compiled.
    let cfg = MoeConfig {
        route: RouteConfig {
            gating: Gating::Sigmoid,
            bias: true,
            groups: Some(GroupLimit { n_group: 4, topk_group: 2 }),
            scale: 2.5,
            ..RouteConfig::new(h as u32, e as u32, 3)
        },
        gemm_order: GemmOrder::Fast,
        weight_dtype: WeightDtype::F16,
        shared_ffn: Some(70),
        shared_gate: true,
        ..MoeConfig::new(h as u32, 22, e as u32, 3)
    };
    let w = Synth::new(15).moe_weights(&cfg);
    let x = Synth::new(16).uniform(tokens * h, 1.0);
    out.push(("sigmoid, bias, groups, fast order, gated shared expert, f16", cfg, w, x));
    // And an ungated shared expert (DeepSeek) with one expert taking every token.
    let (_, _, mut w, x) = out.swap_remove(1);
    let cfg = MoeConfig { shared_ffn: Some(24), ..base };
    w.shared = Some((
        Synth::new(19).uniform(24 * h, 0.5),
        Synth::new(20).uniform(24 * h, 0.5),
        Synth::new(21).uniform(h * 24, 0.5),
    ));
    out.push(("one expert takes every token, shared expert", cfg, w, x));
    out
}

/// Whether `cfg`'s task program is the one most layers here compile (softmax routing without
/// bias or groups, renormalised, f32 weights, the strict order): the program's override
/// constants, and so its pipelines, are those of the route flags, the dtype and the order.
fn base_program(cfg: &MoeConfig) -> bool {
    let base = MoeConfig::new(cfg.route.hidden, cfg.ffn, cfg.route.experts, cfg.route.k);
    (cfg.route.gating, cfg.route.bias, cfg.route.groups.is_some(), cfg.route.renormalize)
        == (base.route.gating, base.route.bias, base.route.groups.is_some(), base.route.renormalize)
        && (cfg.weight_dtype, cfg.gemm_order) == (base.weight_dtype, base.gemm_order)
}

/// Each adversarial layer on every adapter where its task program is the base one
/// ([`base_program`]); a layer with a program of its own (about a minute of LLVM's time per
/// adapter on a cold shader cache, on the CPU adapters) runs on one adapter, those layers spread
/// over the adapters found (every layer on every adapter with `MOEFLOW_FULL_SWEEPS=1`).
#[test]
fn the_moe_task_program_gives_the_layers_bits_on_adversarial_routing() {
    let _queue = exclusive();
    let ctxs = contexts();
    let own_program: Vec<&str> = adversarial_layers(1)
        .into_iter()
        .filter(|(_, cfg, ..)| !base_program(cfg))
        .map(|(name, ..)| name)
        .collect();
    let runs_on = |name: &str, a: usize| {
        common::full_sweeps()
            || own_program.iter().position(|n| *n == name).is_none_or(|i| i % ctxs.len() == a)
    };
    for (a, ctx) in ctxs.iter().enumerate() {
        // Two workers: as many as CI's cores, so a worker that waits does not wait long for a
        // descheduled one (llvmpipe caps an invocation's loop iterations, spins included).
        let workers = match probe(ctx).unwrap().max_workers() {
            Ok(max) => max.min(2),
            Err(reason) => {
                eprintln!("skipped on {}: queue refused by the probe: {reason}", ctx.adapter().slug());
                continue;
            }
        };
        // 37 tokens: no multiple of the route, combine or expert tiles; 1 token: the layer
        // runs its decode path, the queue its grouped tiles.
        for tokens in [37usize, 1] {
            for (name, cfg, weights, x) in adversarial_layers(tokens) {
                if !runs_on(name, a) {
                    continue;
                }
                let layer = MoeLayer::new(ctx, cfg, &weights).unwrap();
                if let Some(why) = moeflow::dag::moe::unsupported(ctx, &layer) {
                    eprintln!("skipped on {}: {why}", ctx.adapter().slug());
                    continue;
                }
                let want = layer.forward_host(ctx, &x).unwrap();
                let xb = ctx.upload("x", &x).unwrap();
                let what = format!("{name}, {tokens} tokens, {}", ctx.adapter().slug());
                for size in [TaskSize::Fine, TaskSize::Coarse] {
                    let what = format!("{what}, {size:?}");
                    // The static passes of the task program.
                    let y = ctx.zeroed("y", x.len() as u64 * 4).unwrap();
                    let run = LayerRun::prepare(
                        ctx,
                        &layer,
                        layer.io(&xb, &y, tokens as u32).unwrap(),
                        MoeExecutor::Passes(TaskShape::new(size)),
                    )
                    .unwrap();
                    assert_eq!(run.run(ctx).unwrap().fallback, None, "{what}");
                    assert_eq!(
                        bits(&ctx.read_back::<f32>(&y, x.len()).unwrap()),
                        bits(&want.y),
                        "{what}: passes"
                    );
                    // The queue: one worker (which never waits) must run cleanly the first
                    // time; with more, a run that stops early is tried again (QUEUE_TRIES).
                    for w in queue_workers(workers) {
                        let what = format!("{what}, {w} workers");
                        let y = ctx.zeroed("y", x.len() as u64 * 4).unwrap();
                        let q = MoeExecutor::Queue(TaskShape::new(size), QueueOptions::new(w));
                        let run =
                            LayerRun::prepare(ctx, &layer, layer.io(&xb, &y, tokens as u32).unwrap(), q)
                                .unwrap();
                        let queue = run
                            .program()
                            .unwrap_or_else(|| panic!("{name}: no program: {:?}", run.refused()));
                        assert!(queue.queue_dispatches().is_some(), "{what}");
                        let tries = if w == 1 { 1 } else { QUEUE_TRIES };
                        let mut stops = Vec::new();
                        for _ in 0..tries {
                            let report = run.run(ctx).unwrap();
                            let got = ctx.read_back::<f32>(&y, x.len()).unwrap();
                            let h = cfg.route.hidden as usize;
                            let bad: Vec<(usize, usize, f32, f32)> = (0..got.len())
                                .filter(|&i| !moeflow::bits::same_bits(got[i], want.y[i]))
                                .map(|i| (i / h, i % h, got[i], want.y[i]))
                                .take(12)
                                .collect();
                            assert!(
                                bad.is_empty(),
                                "{what}: y differs at (token, col, got, want) {bad:?} ({report:?})"
                            );
                            match report.fallback {
                                None => break,
                                Some(why) => stops.push(why),
                            }
                        }
                        // The routing the program left (the fallback's passes write the same).
                        let (indices, weights) = queue.read_routing(ctx).unwrap();
                        assert_eq!(indices, want.indices, "{what}");
                        assert_eq!(bits(&weights), bits(&want.weights), "{what}: routing weights");
                        if stops.len() == tries {
                            no_clean_run(ctx, &what, w, &stops);
                            continue;
                        }
                        let s = queue.status(ctx).unwrap();
                        assert!(s.complete() && s.tasks as u64 == queue.tasks().total(), "{what}: {s:?}");
                    }
                }
            }
        }
    }
}

#[test]
fn both_combine_rules_give_the_layers_bits_at_both_task_sizes() {
    let _queue = exclusive();
    // The layers with the base program (the MoE task program test runs the other one).
    let mut layers = adversarial_layers(37);
    layers.retain(|(name, cfg, ..)| base_program(cfg) && (name.contains("NaN") || name.contains("shared")));
    for ctx in contexts() {
        let Ok(max) = probe(&ctx).unwrap().max_workers() else { continue };
        for (name, cfg, weights, x) in &layers {
            let layer = MoeLayer::new(&ctx, *cfg, weights).unwrap();
            if let Some(why) = moeflow::dag::moe::unsupported(&ctx, &layer) {
                eprintln!("skipped on {}: {why}", ctx.adapter().slug());
                continue;
            }
            let want = layer.forward_host(&ctx, x).unwrap().y;
            let xb = ctx.upload("x", x).unwrap();
            for size in [TaskSize::Fine, TaskSize::Coarse] {
                for rule in [CombineRule::AllExperts, CombineRule::OwnEntries] {
                    // One worker (which never waits) must run cleanly the first time; with
                    // more, a run that stops early is tried again (QUEUE_TRIES).
                    for w in queue_workers(max.min(2)) {
                        let what =
                            format!("{name}, {size:?}, {rule:?}, {w} workers, {}", ctx.adapter().slug());
                        let y = ctx.zeroed("y", x.len() as u64 * 4).unwrap();
                        let q = QueueOptions::new(w);
                        let shape = TaskShape::with_combine(size, rule);
                        let program =
                            MoeProgram::new(&ctx, &layer, layer.io(&xb, &y, 37).unwrap(), shape, Some(&q))
                                .unwrap();
                        let tries = if w == 1 { 1 } else { QUEUE_TRIES };
                        let mut stops = Vec::new();
                        for _ in 0..tries {
                            ctx.run(&program.queue_dispatches().unwrap().iter().collect::<Vec<_>>()).unwrap();
                            let s = program.status(&ctx).unwrap();
                            if s.complete() {
                                break;
                            }
                            stops.push(s.why_stopped().to_string());
                        }
                        if stops.len() == tries {
                            no_clean_run(&ctx, &what, w, &stops);
                            // What the layer run would do next: the static passes.
                            ctx.run(&program.pass_dispatches().iter().collect::<Vec<_>>()).unwrap();
                        }
                        assert_eq!(bits(&ctx.read_back::<f32>(&y, x.len()).unwrap()), bits(&want), "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn a_stalled_moe_queue_falls_back_with_the_same_bits() {
    let _queue = exclusive();
    let (_, cfg, weights, x) = adversarial_layers(37).swap_remove(0);
    for ctx in contexts() {
        let Ok(max) = probe(&ctx).unwrap().max_workers() else { continue };
        let layer = MoeLayer::new(&ctx, cfg, &weights).unwrap();
        if let Some(why) = moeflow::dag::moe::unsupported(&ctx, &layer) {
            eprintln!("skipped on {}: {why}", ctx.adapter().slug());
            continue;
        }
        let want = layer.forward_host(&ctx, &x).unwrap().y;
        let xb = ctx.upload("x", &x).unwrap();
        let y = ctx.zeroed("y", x.len() as u64 * 4).unwrap();
        // Task 37 is the layout task (after one route task per token), at either task size.
        let opts =
            QueueOptions { spin_limit: 1 << 12, stall_task: Some(37), ..QueueOptions::new(max.min(2)) };
        for size in [TaskSize::Fine, TaskSize::Coarse] {
            let q = MoeExecutor::Queue(TaskShape::new(size), opts);
            let run = LayerRun::prepare(&ctx, &layer, layer.io(&xb, &y, 37).unwrap(), q).unwrap();
            // The first run also pays for the driver's shader compiles; the second is timed.
            for timed in [false, true] {
                let started = std::time::Instant::now();
                let report = run.run(&ctx).unwrap();
                assert!(!timed || started.elapsed().as_secs() < 30, "the timeout is bounded");
                let why = report.fallback.expect("fallback reported");
                assert!(why.contains("timed out") || why.contains("loop short"), "{why}");
                assert!(report.ran.contains("passes"), "{}", report.ran);
                assert_eq!(bits(&ctx.read_back::<f32>(&y, x.len()).unwrap()), bits(&want));
            }
        }
        // Bad queue requests are errors, not hangs.
        let bad = QueueOptions { stall_task: Some(1 << 20), ..opts };
        assert!(
            LayerRun::prepare(
                &ctx,
                &layer,
                layer.io(&xb, &y, 37).unwrap(),
                MoeExecutor::Queue(TaskShape::new(TaskSize::Fine), bad)
            )
            .is_err()
        );
        let none = QueueOptions::new(0);
        assert!(
            LayerRun::prepare(
                &ctx,
                &layer,
                layer.io(&xb, &y, 37).unwrap(),
                MoeExecutor::Queue(TaskShape::new(TaskSize::Fine), none)
            )
            .is_err()
        );
        // The task program keeps its routing in its own state: caller's routing tensors are
        // refused by name, not left unwritten.
        let (k, routing) = (cfg.route.k, ctx.zeroed("routing", 37 * u64::from(cfg.route.k) * 4).unwrap());
        let io = layer.io(&xb, &y, 37).unwrap().with_routing(
            moeflow::Tensor::u32(&routing, [37, k]).unwrap(),
            moeflow::Tensor::f32(&routing, [37, k]).unwrap(),
        );
        let err = LayerRun::prepare(&ctx, &layer, io, MoeExecutor::Passes(TaskShape::new(TaskSize::Fine)))
            .unwrap_err();
        assert!(err.to_string().contains("own state"), "{err}");
    }
}
