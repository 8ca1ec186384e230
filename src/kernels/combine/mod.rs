//! Combine: `y[t] = sum_j w[t, j] * partial[t * k + j] (+ shared[t])`, in one launch over
//! `tokens x hidden`, or sequentially (a clear, one dispatch per token and slot, one for the
//! shared row) as the A side of the A/B and the oracle of the bit-identity test. Both use the
//! same operations in the same order (see `wgsl/combine/combine.wgsl`), so they are
//! bit-identical.

mod buffers;
mod plan;
mod specs;

pub use buffers::{CombineBuffers, CombineMode, Shared};
pub(crate) use plan::plan_fill_zero_per_token;
pub use plan::{plan_combine, plan_fill_zero};
#[cfg(test)]
pub(crate) use specs::SHADERS;
pub(crate) use specs::SPECS;
