//! Preparing a [`RowGraph`] for an executor: [`RowRun::prepare`] asks the adapter's probe
//! before it builds a queue, and a queue the probe refuses runs fused passes instead.

use super::chain::RowGraph;
use super::executor::{Executor, lanes_for};
use super::probe::probe;
use super::program::RowInputs;
use super::run::RowRun;
use crate::context::Context;
use crate::error::{Error, Result};

impl RowRun {
    /// Prepares `graph` on `inputs` for `executor` with the adapter's lanes
    /// ([`lanes_for`]). A queue on an adapter whose probe refuses it runs fused passes
    /// instead; [`Self::refused`] says why.
    ///
    /// # Errors
    /// As [`Self::prepare_with_lanes`].
    pub fn prepare(ctx: &Context, graph: &RowGraph, inputs: &RowInputs, executor: Executor) -> Result<Self> {
        Self::prepare_with_lanes(ctx, graph, inputs, executor, lanes_for(ctx))
    }

    /// As [`Self::prepare`] with static passes of `lanes` lanes (a power of two from 1 to 64;
    /// the queue's workers always have [`super::QUEUE_LANES`]). Results do not depend on it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `lanes` out of range; [`Error::LimitExceeded`] for a
    /// queue wider than the adapter allows; device errors while preparing or probing.
    pub fn prepare_with_lanes(
        ctx: &Context,
        graph: &RowGraph,
        inputs: &RowInputs,
        executor: Executor,
        lanes: u32,
    ) -> Result<Self> {
        if !lanes.is_power_of_two() || lanes > 64 {
            return Err(Error::invalid(format!("lanes must be a power of two from 1 to 64, not {lanes}")));
        }
        let refused = match executor {
            Executor::Queue(_, q) => probe(ctx)?.gate(q.workers)?,
            Executor::Staged | Executor::Fused(_) => None,
        };
        Self::build(ctx, graph, inputs, executor, refused, lanes)
    }
}
