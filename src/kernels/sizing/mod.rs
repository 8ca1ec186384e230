//! Sizing: a plan made for a maximum token count runs at a live count set per forward.
//!
//! Every dispatch of such a plan says how it follows the live count t ([`Sizing`], in
//! [`crate::live`]). [`plan_sizing`] turns those rules into the plan's first dispatches: one
//! `size_plan` kernel per five parameter buffers (`wgsl/sizing/sizing.wgsl`) reads t from the
//! plan's live-count word and rewrites those words and the indirect grids of the dispatches
//! after it. The kernels themselves are unchanged: at live count t they read the parameters and
//! run the grids a plan made for exactly t would have, so their outputs are that plan's bits
//! (the layer tests prove it on every path). The host checks at plan time that each value at
//! the maximum fits in u32; values grow with t, so none wraps below it.

mod plan;
mod specs;

pub(crate) use plan::plan_sizing;
#[cfg(test)]
pub(crate) use specs::SHADERS;
pub(crate) use specs::SPECS;
