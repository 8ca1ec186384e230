//! The MoE layer as a graph: route → dispatch → expert projections → combine, with the
//! shared expert beside them. Its stages are whole-stage dispatches (a scan needs every
//! count, a grouped GEMM every placement), so every read is [`Reach::Whole`]: the planner can
//! only put independent stages into one pass, and the queue has no form for them.

use super::executor::{Executor, RunReport};
use super::graph::{Graph, Reach, Read, Source};
use super::plan::{Fusion, Plan, plan};
use crate::context::Context;
use crate::error::Result;
use crate::layer::{ForwardPlan, ForwardStage};
use crate::pipeline::Dispatch;

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

/// The passes `executor` gives a dispatch graph, and why a queue, if asked for, was not used.
pub fn dispatch_plan(graph: &DispatchGraph, executor: Executor) -> (Plan, Option<String>) {
    match executor {
        Executor::Staged => (plan(graph, Fusion::None), None),
        Executor::Fused(f) => (plan(graph, f), None),
        Executor::Queue(_) => (
            plan(graph, Fusion::Neighbours),
            Some("whole-stage dispatches have no queue form; ran fused passes".to_string()),
        ),
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

/// Runs `graph` with `executor` in one encoder and one submission, and waits.
///
/// # Errors
/// A device error while running.
pub fn run_dispatch_graph(ctx: &Context, graph: &DispatchGraph, executor: Executor) -> Result<RunReport> {
    let (plan, fallback) = dispatch_plan(graph, executor);
    let mut encoder = ctx.encoder("moeflow dag");
    record_dispatch_graph(&mut encoder, graph, &plan);
    ctx.submit_and_wait(encoder)?;
    Ok(RunReport { ran: format!("{} passes of whole-stage dispatches", plan.passes.len()), fallback })
}
