//! DAG executor comparisons on the eight-stage chain of the scheduler experiment: eight
//! dispatches, three fused passes, one pass with halo recomputation, and the persistent
//! queue with fine (stage x tile) and coarse (pass x tile) tasks; and the MoE layer's task
//! program (route, layout, expert and combine tiles) in static passes and on the persistent
//! queue against its staged forward.

use super::comparison::{Case, Registered, Size, SizeSet, Work};
use crate::bits::bit_identical;
use crate::context::Context;
use crate::dag::{
    CombineRule, Executor, Fusion, Granularity, MoeProgram, QueueOptions, QueueStatus, RowGraph, RowInputs,
    RowRun, TaskShape, TaskSize, probe,
};
use crate::error::{Error, Result};
use crate::layer::{MoeConfig, MoeLayer};
use crate::reference::dag as reference;
use crate::synth::Synth;
use crate::tensor::word_bytes;

/// Rows of the chain: 32 one-row tiles, as in the experiment.
const ROWS: u32 = 32;
/// Worker counts of queue comparisons; 0 stands for the adapter probe's bound.
const WORKERS: &[u32] = &[0, 1, 4, 8, 20];

fn columns(held_out: bool) -> &'static [u32] {
    if held_out { &[512, 1024, 4096] } else { &[256, 2048, 5120] }
}

/// What a side of a DAG comparison runs.
#[derive(Clone, Copy)]
enum Side {
    Staged,
    Fused,
    Halo,
    Queue(Granularity),
    Coordination,
}

impl Side {
    fn executor(self, workers: u32) -> Executor {
        match self {
            Side::Staged => Executor::Staged,
            Side::Fused => Executor::Fused(Fusion::Neighbours),
            Side::Halo => Executor::Fused(Fusion::Full),
            Side::Queue(g) => Executor::Queue(g, QueueOptions::new(workers)),
            Side::Coordination => Executor::Queue(
                Granularity::Fine,
                QueueOptions { coordination_only: true, ..QueueOptions::new(workers) },
            ),
        }
    }

    fn is_queue(self) -> bool {
        matches!(self, Side::Queue(_) | Side::Coordination)
    }
}

/// One DAG comparison: two executors on the chain.
struct DagComparison {
    a: Side,
    b: Side,
}

const FINE: Side = Side::Queue(Granularity::Fine);
const COARSE: Side = Side::Queue(Granularity::Coarse(Fusion::Neighbours));

/// The registered DAG comparisons.
pub fn comparisons() -> Vec<Registered> {
    vec![
        Registered::configured(
            "dag/fused-vs-staged",
            "the eight-stage chain as three fused static passes (B) against one dispatch per \
             stage (A); bit-identical, every intermediate kept",
            ("8 dispatches", "3 fused passes"),
            DagComparison { a: Side::Staged, b: Side::Fused },
            DagComparison::sizes,
            DagComparison::build,
        ),
        Registered::configured(
            "dag/halo-vs-fused",
            "one pass recomputing a three-row halo (B) against three fused passes (A); \
             bit-identical",
            ("3 fused passes", "1 pass + halo"),
            DagComparison { a: Side::Fused, b: Side::Halo },
            DagComparison::sizes,
            DagComparison::build,
        ),
        Registered::configured(
            "dag/fine-queue-vs-staged",
            "persistent queue, one task per stage and tile (B, 256 tasks), against one \
             dispatch per stage (A); W=0 is the probe's worker bound",
            ("8 dispatches", "fine queue"),
            DagComparison { a: Side::Staged, b: FINE },
            DagComparison::sizes,
            DagComparison::build,
        ),
        Registered::configured(
            "dag/coarse-vs-fine-queue",
            "persistent queue with one task per fused pass and tile (B, 96 tasks) against \
             one per stage and tile (A, 256 tasks), same workers",
            ("fine queue", "coarse queue"),
            DagComparison { a: FINE, b: COARSE },
            DagComparison::sizes,
            DagComparison::build,
        ),
        Registered::configured(
            "dag/coarse-queue-vs-fused",
            "coarse persistent queue (B) against the same three passes as static \
             dispatches (A): the price of dynamic scheduling",
            ("3 fused passes", "coarse queue"),
            DagComparison { a: Side::Fused, b: COARSE },
            DagComparison::sizes,
            DagComparison::build,
        ),
        Registered::configured(
            "dag/coordination-vs-fine-queue",
            "diagnostic, not equivalent work: the fine queue's tickets, waits and signals \
             without arithmetic (B) against the fine queue (A)",
            ("fine queue", "coordination only"),
            DagComparison { a: FINE, b: Side::Coordination },
            DagComparison::sizes,
            DagComparison::build,
        ),
    ]
}

/// Every stage bit-identical.
fn bitwise(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| bit_identical(x, y))
}

/// Checks a queue run's state: the last run complete, no earlier run stopped early.
fn check_queue(ctx: &Context, what: &str, run: &RowRun) -> Result<()> {
    check_status(what, &run.queue_status(ctx)?)
}

fn check_status(what: &str, s: &QueueStatus) -> Result<()> {
    if !s.all_clean() {
        return Err(Error::Validation(format!(
            "{what}: queue stopped early (last run: {} of {} tasks, status {}; {} earlier runs stopped \
             early)",
            s.done, s.tasks, s.status, s.earlier_faults
        )));
    }
    Ok(())
}

/// Runs a queue (`run_clean`: one run, and whether it completed cleanly) until one run
/// completes cleanly (at most `PRIMING_RUNS`), then clears its status (`clear`) so that
/// validation covers exactly the runs the protocol makes. On llvmpipe the first runs of a
/// fresh queue are the likeliest to stop early (see `docs/dag.md`).
fn prime(label: &str, mut run_clean: impl FnMut() -> Result<bool>, clear: impl FnOnce()) -> Result<()> {
    for _ in 0..PRIMING_RUNS {
        if run_clean()? {
            clear();
            return Ok(());
        }
    }
    Err(Error::Validation(format!("{label}: no clean run in {PRIMING_RUNS} priming runs")))
}

/// Most untimed runs a queue gets to complete once cleanly before it is measured.
const PRIMING_RUNS: usize = 3;

impl DagComparison {
    fn sizes(&self, _set: SizeSet, held_out: bool) -> Vec<Size> {
        let workers: &[u32] = if self.a.is_queue() || self.b.is_queue() { WORKERS } else { &[0] };
        workers
            .iter()
            .flat_map(|&w| {
                columns(held_out).iter().map(move |&c| {
                    if self.a.is_queue() || self.b.is_queue() {
                        Size::of(&[("cols", c), ("rows", ROWS), ("W", w)])
                    } else {
                        Size::of(&[("cols", c), ("rows", ROWS)])
                    }
                })
            })
            .collect()
    }

    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let (cols, rows) = (size.get("cols")?, size.get("rows")?);
        let mut workers = size.optional("W").unwrap_or(0);
        if workers == 0 && (self.a.is_queue() || self.b.is_queue()) {
            workers = probe(ctx)?.max_workers().map_err(|r| Error::MissingFeature(format!("queue: {r}")))?;
        }
        let graph = RowGraph::seed_chain(rows, cols, seed)?;
        let x = Synth::new(seed ^ 0x5eed).uniform(rows as usize * cols as usize, 2.0);
        let inputs = RowInputs::upload(ctx, &graph, &x)?;
        let staged = RowRun::prepare(ctx, &graph, &inputs, Executor::Staged)?;
        staged.run(ctx)?;
        let want = staged.read_all(ctx)?;
        let oracle = reference::row_graph(&graph, &x);
        if let Some((s, i)) = reference::first_outside_bound(&want, &oracle) {
            return Err(Error::Validation(format!(
                "staged stage {s} element {i}: {} vs CPU oracle {}",
                want[s][i], oracle[s][i]
            )));
        }
        let mut runs = Vec::new();
        for side in [self.a, self.b] {
            let run = RowRun::prepare(ctx, &graph, &inputs, side.executor(workers))?;
            if let Some(reason) = run.refused() {
                return Err(Error::MissingFeature(reason.to_string()));
            }
            if side.is_queue() {
                prime(run.label(), || Ok(run.run(ctx)?.fallback.is_none()), || run.clear_status(ctx))?;
            }
            runs.push((side, run));
        }
        let work = |run: &RowRun| Work::Gpu(run.dispatches().to_vec());
        let (a, b) = (work(&runs[0].1), work(&runs[1].1));
        let validate = move |ctx: &Context| -> Result<()> {
            for (side, run) in &runs {
                if side.is_queue() {
                    check_queue(ctx, run.label(), run)?;
                }
                if !matches!(side, Side::Coordination) && !bitwise(&run.read_all(ctx)?, &want) {
                    return Err(Error::Validation(format!(
                        "{} differs from the staged executor",
                        run.label()
                    )));
                }
            }
            Ok(())
        };
        Ok(Case {
            a,
            b,
            flops: 0.0,
            // The input read once and eight stage outputs written once; not meaningful for the
            // coordination-only diagnostic, which moves none of it.
            bytes: if matches!(self.b, Side::Coordination) {
                0.0
            } else {
                9.0 * f64::from(rows) * f64::from(cols) * 4.0
            },
            tokens: 0,
            validate: Box::new(validate),
            note: None,
        })
    }
}

/// What a side of a MoE comparison runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MoeSide {
    /// The layer's own kernels, one dispatch each.
    Staged,
    /// The task program's static passes with tasks of this size.
    Passes(TaskSize),
    /// The task program on the persistent queue with tasks of this shape.
    Queue(TaskShape),
}

impl MoeSide {
    fn is_queue(self) -> bool {
        matches!(self, MoeSide::Queue(_))
    }
}

/// One MoE layer comparison between two executors (no shared expert).
struct MoeComparison {
    a: MoeSide,
    b: MoeSide,
}

/// The registered MoE layer executor comparisons.
pub(crate) fn moe_comparisons() -> Vec<Registered> {
    vec![
        Registered::configured(
            "dag/moe-passes-vs-staged",
            "the MoE layer as its task program in five static passes of fine tasks (route, \
             layout, gate/up, down, combine tiles; B) against its staged forward, one \
             dispatch per kernel (A); bit-identical",
            ("staged forward", "fine task passes"),
            MoeComparison { a: MoeSide::Staged, b: MoeSide::Passes(TaskSize::Fine) },
            MoeComparison::sizes,
            MoeComparison::build,
        ),
        Registered::configured(
            "dag/moe-coarse-vs-fine-passes",
            "the task program's static passes with coarse tasks (B: four passes, a tile's \
             gate/up and down in one workgroup) against fine tasks (A: five passes, one \
             64-column tile of one projection per task); bit-identical",
            ("fine task passes", "coarse task passes"),
            MoeComparison { a: MoeSide::Passes(TaskSize::Fine), b: MoeSide::Passes(TaskSize::Coarse) },
            MoeComparison::sizes,
            MoeComparison::build,
        ),
        Registered::configured(
            "dag/moe-queue-vs-passes",
            "the MoE task program on the persistent queue (B) against the same fine tasks in \
             five static passes (A): the price or gain of dynamic scheduling with the same \
             task bodies; W=0 is the probe's worker bound",
            ("fine task passes", "fine task queue"),
            MoeComparison {
                a: MoeSide::Passes(TaskSize::Fine),
                b: MoeSide::Queue(TaskShape::new(TaskSize::Fine)),
            },
            MoeComparison::sizes,
            MoeComparison::build,
        ),
        Registered::configured(
            "dag/moe-coarse-vs-fine-queue",
            "the MoE task program on the persistent queue with coarse tasks (B) against fine \
             tasks (A), same workers; W=0 is the probe's worker bound",
            ("fine task queue", "coarse task queue"),
            MoeComparison {
                a: MoeSide::Queue(TaskShape::new(TaskSize::Fine)),
                b: MoeSide::Queue(TaskShape::new(TaskSize::Coarse)),
            },
            MoeComparison::sizes,
            MoeComparison::build,
        ),
        Registered::configured(
            "dag/moe-own-vs-all-combine",
            "the fine task queue with combine tiles that wait only for the expert tasks \
             holding their tokens' entries (B: counts written by the layout at run time) \
             against combine tiles that wait for every expert task (A), same workers",
            ("combine after all experts", "combine after own entries"),
            MoeComparison {
                a: MoeSide::Queue(TaskShape::with_combine(TaskSize::Fine, CombineRule::AllExperts)),
                b: MoeSide::Queue(TaskShape::with_combine(TaskSize::Fine, CombineRule::OwnEntries)),
            },
            MoeComparison::sizes,
            MoeComparison::build,
        ),
    ]
}

impl MoeComparison {
    fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        let (tokens, h, f, e, k): (&[u32], u32, u32, u32, u32) = match (set, held_out) {
            (SizeSet::Gpu, false) => (&[1, 4, 64, 256], 512, 1024, 16, 2),
            (SizeSet::Gpu, true) => (&[2, 128], 768, 512, 8, 2),
            (SizeSet::Cpu, false) => (&[1, 4, 32, 128], 256, 512, 16, 2),
            (SizeSet::Cpu, true) => (&[2, 64], 192, 256, 8, 2),
        };
        let queue = self.a.is_queue() || self.b.is_queue();
        let workers: &[u32] = if queue { &[0, 8] } else { &[0] };
        workers
            .iter()
            .flat_map(|&w| {
                tokens.iter().map(move |&m| {
                    let mut p = vec![("M", m), ("H", h), ("F", f), ("E", e), ("k", k)];
                    if queue {
                        p.push(("W", w));
                    }
                    Size::of(&p)
                })
            })
            .collect()
    }

    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let (m, h, f, e, k) =
            (size.get("M")?, size.get("H")?, size.get("F")?, size.get("E")?, size.get("k")?);
        let cfg = MoeConfig::new(h, f, e, k);
        let mut s = Synth::new(seed);
        let layer = MoeLayer::new(ctx, cfg, &s.moe_weights(&cfg))?;
        if let Some(why) = crate::dag::moe::unsupported(ctx, &layer) {
            return Err(Error::MissingFeature(format!("MoE task program: {why}")));
        }
        let x = s.uniform((m * h) as usize, 1.0);
        let want = layer.forward_host(ctx, &x)?.y;
        let xb = ctx.upload("x", &x)?;
        let mut sides = Vec::new();
        let mut queues = Vec::new();
        let mut notes = Vec::new();
        for side in [self.a, self.b] {
            let y = ctx.zeroed("y", word_bytes(u64::from(m * h)))?;
            let work = match side {
                MoeSide::Staged => layer.plan(ctx, layer.io(&xb, &y, m)?)?.dispatches_at(m)?,
                MoeSide::Passes(tasks) => {
                    let program =
                        MoeProgram::new(ctx, &layer, layer.io(&xb, &y, m)?, TaskShape::new(tasks), None)?;
                    notes.push(format!("{} {} tasks", program.tasks().total(), tasks.name()));
                    program.pass_dispatches().to_vec()
                }
                MoeSide::Queue(shape) => {
                    let bound = probe(ctx)?
                        .max_workers()
                        .map_err(|r| Error::MissingFeature(format!("queue: {r}")))?;
                    let workers = size.optional("W").filter(|&w| w > 0).map_or(bound, |w| w.min(bound));
                    let q = QueueOptions::new(workers);
                    let program = MoeProgram::new(ctx, &layer, layer.io(&xb, &y, m)?, shape, Some(&q))?;
                    let dispatches = program.queue_dispatches().unwrap_or_default().to_vec();
                    prime(
                        &program.label(),
                        || {
                            ctx.run(&dispatches.iter().collect::<Vec<_>>())?;
                            Ok(program.status(ctx)?.complete())
                        },
                        || program.clear_status(ctx),
                    )?;
                    notes.push(format!(
                        "{} {} tasks, {workers} workers",
                        program.tasks().total(),
                        shape.size.name()
                    ));
                    queues.push(program);
                    dispatches
                }
            };
            sides.push((work, y));
        }
        let n = (m * h) as usize;
        let outputs: Vec<wgpu::Buffer> = sides.iter().map(|(_, y)| y.clone()).collect();
        let validate = move |ctx: &Context| -> Result<()> {
            for q in &queues {
                check_status(&q.label(), &q.status(ctx)?)?;
            }
            for y in &outputs {
                if !bit_identical(&ctx.read_back::<f32>(y, n)?, &want) {
                    return Err(Error::Validation("an executor differs from the layer's forward".into()));
                }
            }
            Ok(())
        };
        let (mf, hf, ff) = (f64::from(m), f64::from(h), f64::from(f));
        let decode = m <= 8;
        let experts_read = f64::from(e.min(m * k));
        let mut works = sides.into_iter().map(|(w, _)| Work::Gpu(w));
        let (Some(a), Some(b)) = (works.next(), works.next()) else {
            return Err(Error::invalid("a comparison has two sides"));
        };
        Ok(Case {
            a,
            b,
            flops: if decode {
                0.0
            } else {
                6.0 * mf * f64::from(k) * hf * ff + 2.0 * mf * f64::from(e) * hf
            },
            bytes: if decode { 4.0 * (3.0 * experts_read * hf * ff + f64::from(e) * hf) } else { 0.0 },
            tokens: m,
            validate: Box::new(validate),
            note: (!notes.is_empty()).then(|| notes.join(" vs ")),
        })
    }
}
