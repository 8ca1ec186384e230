//! The MoE layer as a graph: route → dispatch → expert projections → combine, with the
//! shared expert beside them. As whole-stage dispatches (a scan needs every count, a grouped
//! GEMM every placement) every read is [`Reach::Whole`], so the planner can only put
//! independent stages into one pass; fused passes and the queue run the layer as a program of
//! finer tasks instead ([`super::moe`]). [`LayerRun`] runs a layer on any executor.

use serde::Serialize;

use super::executor::RunReport;
use super::graph::{Graph, Reach, Read, Source};
use super::moe::{self, MoeProgram, TaskShape};
use super::plan::{Fusion, Plan, plan};
use super::probe::probe;
use super::queue::QueueOptions;
use crate::context::Context;
use crate::error::Result;
use crate::layer::{ForwardIo, ForwardPlan, ForwardStage, MoeLayer};
use crate::pipeline::Dispatch;

/// A graph whose stages are lists of dispatches that run whole.
pub(crate) type DispatchGraph = Graph<Vec<Dispatch>>;

/// The layer's forward plan as a graph over its tokens (one tile): each stage reads the
/// earlier stages [`ForwardStage::reads`] names, whole.
///
/// # Errors
/// [`Graph::add`]'s errors.
pub fn layer_graph(forward: ForwardPlan) -> Result<DispatchGraph> {
    let tokens = forward.max_tokens().max(1);
    let mut graph = Graph::new(tokens, tokens)?;
    let mut added: Vec<ForwardStage> = Vec::new();
    for (stage, dispatches) in forward.stages_at(forward.max_tokens())? {
        let mut reads: Vec<Read> = stage
            .reads()
            .iter()
            .filter_map(|r| added.iter().position(|a| a == r))
            .map(|s| Read { source: Source::Stage(s), reach: Reach::Whole })
            .collect();
        if reads.is_empty() {
            reads.push(Read { source: Source::Input, reach: Reach::Whole });
        }
        graph.add(stage.name(), dispatches, reads)?;
        added.push(stage);
    }
    Ok(graph)
}

/// How a MoE layer's forward runs ([`LayerRun`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum MoeExecutor {
    /// The layer's own kernels, one dispatch per stage, as the stages of [`layer_graph`].
    Staged,
    /// The layer's task program ([`MoeProgram`]) of this shape as static passes
    /// ([`moe::passes`]).
    Passes(TaskShape),
    /// The task program of this shape on the persistent queue with these options (where the
    /// adapter's probe allows it), and its static passes as the fallback.
    Queue(TaskShape, QueueOptions),
}

impl MoeExecutor {
    /// The task program's shape, for the executors that run it.
    pub fn shape(self) -> Option<TaskShape> {
        match self {
            MoeExecutor::Staged => None,
            MoeExecutor::Passes(shape) | MoeExecutor::Queue(shape, _) => Some(shape),
        }
    }
}

/// The passes of a layer's dispatch graph for an executor: one stage per pass for
/// [`MoeExecutor::Staged`]; [`Fusion::Neighbours`]'s passes for the others, which run them
/// where the layer has no task program.
pub(crate) fn dispatch_plan(graph: &DispatchGraph, executor: MoeExecutor) -> Plan {
    match executor {
        MoeExecutor::Staged => plan(graph, Fusion::None),
        MoeExecutor::Passes(_) | MoeExecutor::Queue(..) => plan(graph, Fusion::Neighbours),
    }
}

/// Records `plan` of `graph`: one compute pass per pass, its stages' dispatches in order.
pub(crate) fn record_dispatch_graph(encoder: &mut wgpu::CommandEncoder, graph: &DispatchGraph, plan: &Plan) {
    for pass in &plan.passes {
        let dispatches: Vec<&Dispatch> =
            pass.steps.iter().flat_map(|s| graph.stages()[s.stage].kernel.iter()).collect();
        crate::gpu::record(encoder, &dispatches);
    }
}

/// A MoE layer's forward of a fixed token count prepared for one [`MoeExecutor`]: `Staged`
/// runs the layer's own kernels as the graph's stages; `Passes(shape)` runs the layer's task
/// program ([`MoeProgram`]) of that shape as its static passes ([`moe::passes`]);
/// `Queue(shape, q)` runs that program on the persistent queue, and the same program's static
/// passes as its fallback. Every executor writes the bits of the layer's own forward. A layer
/// without a task form ([`moe::unsupported`]) runs the graph's whole-stage dispatches in passes
/// instead, and [`Self::refused`] says why.
#[derive(Debug)]
pub struct LayerRun {
    executor: MoeExecutor,
    runs: Runs,
    refused: Option<String>,
}

/// What a [`LayerRun`] records.
#[derive(Debug)]
enum Runs {
    /// The layer's own forward as a graph, and its passes.
    Staged(DispatchGraph, Plan),
    /// The task program (its queue where one was asked for and allowed, else its passes).
    Program(MoeProgram),
}

impl LayerRun {
    /// Prepares a forward of `layer` of `io`'s maximum token count for `executor` (a
    /// queue only where the adapter's probe allows it). Only what runs is built: the layer's
    /// own plan for `Staged` or a layer without a task form, else the task program.
    ///
    /// # Errors
    /// [`MoeLayer::plan`]'s and [`MoeProgram::new`]'s errors; [`crate::Error::InvalidArgument`]
    /// for a queue of no workers and [`crate::Error::LimitExceeded`] for more than
    /// `max_compute_workgroups_per_dimension`, whatever the probe's verdict;
    /// [`crate::Error::LimitExceeded`] for more workers than the probe allows; device errors
    /// while probing.
    pub fn prepare(
        ctx: &Context,
        layer: &MoeLayer,
        io: ForwardIo<'_>,
        executor: MoeExecutor,
    ) -> Result<Self> {
        let (queue, refused) = match executor {
            MoeExecutor::Staged | MoeExecutor::Passes(_) => (None, None),
            // The worker count is checked whatever the probe's verdict, so a request is refused
            // or accepted alike on every adapter.
            MoeExecutor::Queue(_, q) => {
                match q.check_workers(ctx).and_then(|()| probe(ctx)?.gate(q.workers))? {
                    Some(why) => (None, Some(why)),
                    None => (Some(q), None),
                }
            }
        };
        // A layer without a task form runs its own forward instead, and says why.
        let (shape, refused) = match executor.shape().map(|s| (s, moe::unsupported(ctx, layer))) {
            Some((_, Some(why))) => (None, Some(refused.unwrap_or(format!("no task form: {why}")))),
            other => (other.map(|(s, _)| s), refused),
        };
        let runs = match shape {
            Some(shape) => Runs::Program(MoeProgram::new(ctx, layer, io, shape, queue.as_ref())?),
            None => {
                let graph = layer_graph(layer.plan(ctx, io)?)?;
                let plan = dispatch_plan(&graph, executor);
                Runs::Staged(graph, plan)
            }
        };
        Ok(LayerRun { executor, runs, refused })
    }

    /// The executor asked for.
    pub fn executor(&self) -> MoeExecutor {
        self.executor
    }

    /// The layer's stage graph and its static passes, where they are what runs (`Staged`, or
    /// a layer without a task form).
    pub fn staged(&self) -> Option<(&DispatchGraph, &Plan)> {
        match &self.runs {
            Runs::Staged(graph, plan) => Some((graph, plan)),
            Runs::Program(_) => None,
        }
    }

    /// The task program, where one runs.
    pub fn program(&self) -> Option<&MoeProgram> {
        match &self.runs {
            Runs::Program(program) => Some(program),
            Runs::Staged(..) => None,
        }
    }

    /// Why the executor asked for does not run as asked (a refused queue, a layer without a
    /// task form).
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// What [`Self::record`] records, e.g. `queue (fine MoE tasks, 8 workers)`, `4 static
    /// passes of coarse MoE tasks` or `5 passes of whole-stage dispatches`.
    pub fn label(&self) -> String {
        match &self.runs {
            Runs::Program(p) => p.label(),
            Runs::Staged(_, plan) => format!("{} passes of whole-stage dispatches", plan.passes.len()),
        }
    }

    /// Records one forward: the queue, the task program's static passes, or the graph's.
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        match &self.runs {
            Runs::Program(p) => {
                let dispatches = p.queue_dispatches().unwrap_or(p.pass_dispatches());
                crate::gpu::record(encoder, &dispatches.iter().collect::<Vec<_>>());
            }
            Runs::Staged(graph, plan) => record_dispatch_graph(encoder, graph, plan),
        }
    }

    /// Runs one forward in one submission and waits. A queue run whose status shows a
    /// timeout, a cut-short loop or missing tasks is rerun as the task program's static
    /// passes, and the report says so.
    ///
    /// # Errors
    /// A device error while running or reading the queue's status.
    pub fn run(&self, ctx: &Context) -> Result<RunReport> {
        let mut encoder = ctx.encoder("moeflow moe layer run");
        self.record(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        let Some(program) = self.program().filter(|p| p.queue_dispatches().is_some()) else {
            return Ok(RunReport { ran: self.label(), fallback: self.refused.clone() });
        };
        let s = program.status(ctx)?;
        if s.complete() {
            return Ok(RunReport { ran: self.label(), fallback: None });
        }
        ctx.run(&program.pass_dispatches().iter().collect::<Vec<_>>())?;
        let ran = program.passes_label();
        let why = format!(
            "queue stopped ({} of {} tasks done, status {}: {}); reran as {ran}",
            s.done,
            s.tasks,
            s.status,
            s.why_stopped()
        );
        Ok(RunReport { ran, fallback: Some(why) })
    }
}
