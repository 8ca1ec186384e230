//! The three executors of a row graph ([`Executor`]): one dispatch per stage, fused static
//! passes, and the persistent queue, all running the same WGSL code (`wgsl/dag/`), so they
//! agree bit for bit on one adapter; the static passes' lanes per adapter ([`lanes_for`]);
//! and what a run did ([`RunReport`]). Building and running live in [`super::run`], the
//! probe-gated entry in [`RowRun::prepare`](super::RowRun::prepare).

use serde::Serialize;

use super::plan::Fusion;
use super::queue::{Granularity, QUEUE_LANES, QueueOptions};
use crate::context::Context;

/// Lanes (workgroup size) of the static passes on `ctx`'s adapter: 64 on GPUs, 8 on CPU
/// adapters, which run a workgroup as one coroutine per 8-lane SIMD vector and pay for every
/// coroutine (measured on lavapipe: 2-4x faster with 8 lanes). No result depends on it.
pub fn lanes_for(ctx: &Context) -> u32 {
    if ctx.adapter().is_cpu() { 8 } else { QUEUE_LANES }
}

/// How a graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Executor {
    /// One dispatch per stage, all in one encoder and one submission.
    Staged,
    /// One dispatch per pass of the planner's plan with this fusion.
    Fused(Fusion),
    /// One dispatch of persistent workers taking tasks of this size from a ready queue (plus
    /// one that clears the queue's state).
    Queue(Granularity, QueueOptions),
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct RunReport {
    /// The executor that produced the outputs.
    pub ran: String,
    /// Why the requested executor was replaced, if it was.
    pub fallback: Option<String>,
}
