//! The MoE layer as a graph: route → dispatch → expert projections → combine, with the
//! shared expert beside them. As whole-stage dispatches (a scan needs every count, a grouped
//! GEMM every placement) every read is [`Reach::Whole`], so the planner can only put
//! independent stages into one pass; the queue runs the layer as finer tasks of its own
//! ([`super::moe`]). [`LayerRun`] runs a layer on any executor.

use super::executor::{Executor, RunReport};
use super::graph::{Graph, Reach, Read, Source};
use super::moe::{self, MoeQueue};
use super::plan::{Fusion, Plan, plan};
use super::probe::probe;
use super::queue::Granularity;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::layer::{ForwardPlan, ForwardStage, MoeLayer};
use crate::pipeline::{BufferView, Dispatch};

/// A graph whose stages are lists of dispatches that run whole.
pub type DispatchGraph = Graph<Vec<Dispatch>>;

/// The layer's forward plan as a graph over its tokens (one tile): each stage reads the
/// earlier stages [`ForwardStage::reads`] names, whole.
///
/// # Errors
/// [`Graph::add`]'s errors.
pub fn layer_graph(forward: ForwardPlan) -> Result<DispatchGraph> {
    let tokens = forward.tokens().max(1);
    let mut graph = Graph::new(tokens, tokens)?;
    let mut added: Vec<ForwardStage> = Vec::new();
    for (stage, dispatches) in forward.into_stages() {
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

/// The passes of a dispatch graph for a static executor; a queue's fallback (and the passes
/// a refused queue runs) are those of [`Fusion::Neighbours`].
pub fn dispatch_plan(graph: &DispatchGraph, executor: Executor) -> Plan {
    match executor {
        Executor::Staged => plan(graph, Fusion::None),
        Executor::Fused(f) => plan(graph, f),
        Executor::Queue(_) => plan(graph, Fusion::Neighbours),
    }
}

/// Records `plan` of `graph`: one compute pass per pass, its stages' dispatches in order.
pub fn record_dispatch_graph(encoder: &mut wgpu::CommandEncoder, graph: &DispatchGraph, plan: &Plan) {
    for pass in &plan.passes {
        let dispatches: Vec<&Dispatch> =
            pass.steps.iter().flat_map(|s| graph.stages()[s.stage].kernel.iter()).collect();
        crate::gpu::record(encoder, &dispatches);
    }
}

/// A MoE layer's forward of a fixed token count prepared for one executor: the layer's graph
/// of whole-stage dispatches in static passes, or the MoE task queue ([`MoeQueue`]) with
/// those passes as its fallback. Every executor writes the bits of the layer's own forward.
#[derive(Debug)]
pub struct LayerRun {
    executor: Executor,
    graph: DispatchGraph,
    plan: Plan,
    queue: Option<MoeQueue>,
    refused: Option<String>,
}

impl LayerRun {
    /// Prepares a forward of `tokens` tokens of `layer` from `x` into `y` for `executor`. A
    /// queue runs where the adapter's probe allows it and the layer has a queue form
    /// ([`moe::unsupported`]); otherwise its fallback passes run and [`Self::refused`] says
    /// why.
    ///
    /// # Errors
    /// [`MoeLayer::plan`]'s and [`MoeQueue::new`]'s errors; [`Error::LimitExceeded`] for more
    /// workers than the probe allows; device errors while probing.
    pub fn prepare<'b>(
        ctx: &Context,
        layer: &MoeLayer,
        tokens: u32,
        x: impl Into<BufferView<'b>>,
        y: impl Into<BufferView<'b>>,
        executor: Executor,
    ) -> Result<Self> {
        let (x, y) = (x.into(), y.into());
        let graph = layer_graph(layer.plan(ctx, tokens, x, y)?)?;
        let plan = dispatch_plan(&graph, executor);
        let (queue, refused) = match executor {
            Executor::Queue(q) => match (probe(ctx)?.max_workers(), moe::unsupported(ctx, layer)) {
                (Err(reason), _) => (None, Some(format!("the adapter's probe refused the queue: {reason}"))),
                (Ok(max), _) if q.workers > max => {
                    return Err(Error::limit(
                        "queue workers",
                        q.workers.into(),
                        max.into(),
                        "the adapter probe's worker bound",
                    ));
                }
                (Ok(_), Some(why)) => (None, Some(why)),
                (Ok(_), None) if q.granularity != Granularity::Fine => {
                    (None, Some("the MoE queue has fine tasks only".to_string()))
                }
                (Ok(_), None) => (Some(MoeQueue::new(ctx, layer, tokens, x, y, &q)?), None),
            },
            Executor::Staged | Executor::Fused(_) => (None, None),
        };
        Ok(LayerRun { executor, graph, plan, queue, refused })
    }

    /// The executor asked for.
    pub fn executor(&self) -> Executor {
        self.executor
    }

    /// The layer's stage graph.
    pub fn graph(&self) -> &DispatchGraph {
        &self.graph
    }

    /// The static passes: the executor's, or a queue's fallback.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The task queue, where one runs.
    pub fn queue(&self) -> Option<&MoeQueue> {
        self.queue.as_ref()
    }

    /// Why an asked-for queue runs static passes instead.
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// What [`Self::record`] records, e.g. `queue (MoE tasks, 8 workers)` or `3 passes of
    /// whole-stage dispatches`.
    pub fn label(&self) -> String {
        match &self.queue {
            Some(q) => q.label().to_string(),
            None => format!("{} passes of whole-stage dispatches", self.plan.passes.len()),
        }
    }

    /// Records one forward: the queue's dispatches, else the static passes.
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder) {
        match &self.queue {
            Some(q) => crate::gpu::record(encoder, &q.dispatches().iter().collect::<Vec<_>>()),
            None => record_dispatch_graph(encoder, &self.graph, &self.plan),
        }
    }

    /// Runs one forward in one submission and waits. A queue run whose status shows a
    /// timeout, a cut-short loop or missing tasks is rerun as the fallback passes, and the
    /// report says so.
    ///
    /// # Errors
    /// A device error while running or reading the queue's status.
    pub fn run(&self, ctx: &Context) -> Result<RunReport> {
        let mut encoder = ctx.encoder("moeflow moe layer run");
        self.record(&mut encoder);
        ctx.submit_and_wait(encoder)?;
        let Some(queue) = &self.queue else {
            return Ok(RunReport { ran: self.label(), fallback: self.refused.clone() });
        };
        let s = queue.status(ctx)?;
        if s.complete() {
            return Ok(RunReport { ran: self.label(), fallback: None });
        }
        let mut encoder = ctx.encoder("moeflow moe layer fallback");
        record_dispatch_graph(&mut encoder, &self.graph, &self.plan);
        ctx.submit_and_wait(encoder)?;
        let ran = format!("{} passes of whole-stage dispatches", self.plan.passes.len());
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
