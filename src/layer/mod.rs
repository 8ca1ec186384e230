//! `MoeLayer`: routing, dispatch, expert projections and combine recorded into one encoder,
//! with no host readback inside a forward pass.
//!
//! Stages of a forward (see `docs/layer.md`):
//! `route` (gate matvec + top-k) -> `dispatch` (stable padded grouping; skipped on the decode
//! path) -> `experts` (SwiGLU expert FFN) -> `shared` (shared expert over all tokens, if any)
//! -> `combine` (weighted sum in slot order, plus the shared row).
//!
//! Files: `config.rs` (the configuration), `host.rs` (host weights), `moe_layer.rs` (the layer
//! on the device), `io.rs` (a forward's tensors), `workspace.rs` (its scratch layout),
//! `plan.rs` (planning a forward), `forward.rs` (the plan and its recording), `run.rs`
//! (prepare and host forwards), `hybrid.rs` (forwards with experts on the host). This file is the face.

mod config;
mod forward;
mod host;
mod hybrid;
mod io;
mod moe_layer;
mod plan;
mod run;
mod workspace;

pub use config::{Capacity, KernelChoice, MoeConfig};
pub use forward::{ForwardPlan, ForwardStage};
pub use host::{ExpertBiasValues, MoeWeights, RouterWeights};
#[cfg(not(target_arch = "wasm32"))]
pub use hybrid::HybridForward;
pub use hybrid::HybridTimes;
pub(crate) use io::CallerOutputs;
pub use io::ForwardIo;
pub use moe_layer::MoeLayer;
pub use run::{ForwardOutput, PrepareReport};
