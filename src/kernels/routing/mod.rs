//! Routing: gate matvec and top-k selection, unfused (two dispatches) or fused (one).
//!
//! Shapes (row-major, f32 unless noted): `x[tokens, hidden]`, `gate[experts, hidden]`,
//! `bias[experts]`, `logits[tokens, experts]`, `indices[tokens, k]` (u32),
//! `weights[tokens, k]`.
//!
//! # Tie-break contract
//!
//! Part of the API, tested with hand-written expectations on every adapter:
//! - slots are in descending selection value (the score, or `score + bias[e]` with a bias);
//! - equal values go to the lower expert index;
//! - `-0.0` equals `+0.0`;
//! - NaN never outranks a number (it ranks below `-inf`);
//! - an expert chosen once is excluded by its index, never by rewriting its value to `-inf`,
//!   so a row of all `-inf` still yields `k` distinct experts.
//!
//! The accumulation orders are stated in `docs/routing.md` and in the WGSL
//! (`wgsl/routing/`); [`crate::reference::routing`] mirrors them on the CPU. Fused and
//! unfused plans give bit-identical indices and weights on the same adapter.
//!
//! Files: `config.rs` (configurations, modes, limits), `specs.rs` (modules, kernels,
//! parameters), `plan.rs` (planning on the device), `host.rs` (host data routed on the device
//! and read back). This file is the face.

mod config;
#[cfg(not(target_arch = "wasm32"))]
mod host;
mod plan;
mod specs;

pub use config::{Gating, GroupLimit, MAX_EXPERTS, MAX_GROUPS, MAX_K, RouteConfig, RouteMode};
#[cfg(not(target_arch = "wasm32"))]
pub use host::{RouteOutput, route_host, topk_host};
pub use plan::{RouteBuffers, RoutePlan, plan_argmax, plan_route, plan_topk};
pub use specs::ROUTE_WG;
#[cfg(test)]
pub(crate) use specs::SHADERS;
pub(crate) use specs::SPECS;
#[cfg(feature = "dag")]
pub(crate) use specs::{PARAMS_BYTES, route_params};
