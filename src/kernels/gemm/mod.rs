//! Expert projections: SwiGLU expert FFNs over dispatched rows in one grouped GEMM per
//! projection, plus the comparison paths (bucketed with overflow, dense, all experts) and the
//! row-wise decode path. Weights (`weights.rs`: float or quantised, packed in u32 words and
//! unpacked in the shader, `quantised.rs`; texture copies, `texture.rs`) are read by the block
//! kernels of `variant.rs`'s types (their WGSL generated per shape in `generate/`) or by the
//! row-wise kernels; `policy.rs` picks each adapter's defaults and candidates, `tune.rs` times
//! the candidates, `coop.rs` and `device_check.rs` hold the cooperative-matrix precision mode
//! and its check on a device. Accumulation is f32 in one fixed K order (see
//! `wgsl/gemm/common.wgsl`), so a token's outputs are bitwise the same whatever the batch, tile
//! or path. A plan is made of passes (`passes.rs`: one projection over a set of rows, per
//! weight chunk and x window) of kernels whose modules and specs `specs.rs` holds, bound
//! through the slots of `slots.rs`, with the parameters of `params.rs`; `plan.rs` holds the
//! planners. This file is the family's face: its modules and what it exports.
//!
//! Shapes: `x[tokens, H]`; `gate`, `up` `[E, F, H]`; `down` `[E, H, F]`;
//! `indices[tokens, k]`; output `partial[tokens * k, H]` indexed by entry `token * k + slot`.

mod chunk;
mod coop;
mod device_check;
mod dtype;
mod ffn;
mod generate;
mod pack;
mod params;
mod passes;
mod placement;
mod plan;
mod policy;
mod quantised;
mod slots;
mod specs;
mod texture;
mod tune;
mod tune_cache;
#[cfg(not(target_arch = "wasm32"))]
mod unpack;
mod variant;
mod weights;
mod windows;

pub use coop::CoopBlock;
#[cfg(not(target_arch = "wasm32"))]
pub use device_check::check_on_device;
pub use device_check::check_on_device_async;
pub(crate) use device_check::check_on_device_with;
pub use dtype::WeightDtype;
pub use ffn::{Activation, ExpertBias, ExpertFfn};
pub use placement::ExpertPlacement;
pub use plan::{
    DECODE_MAX_TOKENS, DenseKernel, FfnBuffers, FfnPlan, FfnRouting, plan_dense, plan_dense_ffn, plan_ffn,
    plan_ffn_all_experts, uses_decode_path,
};
pub(crate) use plan::{
    activations, bucket_activations, overflow_activations, plan_dense_ffn_in, plan_dense_in, plan_ffn_in,
    shared_activations,
};
pub use policy::{AdapterKind, candidates};
pub use quantised::QuantisedValues;
#[cfg(not(target_arch = "wasm32"))]
pub use tune::tune;
pub use tune::{TUNE_DEFAULT_MARGIN, TuneOptions, Tuned, tune_async};
pub use tune_cache::TuneKey;
pub use variant::{FfnKernels, GemmOrder, GemmVariant, LaneBlock, TileBlock};
pub use weights::{ExpertWeights, StoredValues};

#[cfg(test)]
pub(crate) use params::{
    FLAG_EXPERT_FROM_INDICES, FLAG_EXPERT_FROM_TILES, FLAG_GATHER, FLAG_IDENTITY_ROWS, FLAG_OUT_ENTRY, NONE,
};
pub(crate) use plan::decode_tokens;
#[cfg(test)]
pub(crate) use specs::ROWWISE_SUBGROUP_ROW_ALIGN;
#[cfg(test)]
pub(crate) use specs::shaders;
#[cfg(test)]
pub(crate) use specs::specs;
pub(crate) use specs::{WINDOW_BYTES, WeightLoads, specs_for};
pub(crate) use tune::tune_with;
#[cfg(feature = "checkpoint")]
pub(crate) use weights::STREAM_CHUNK;
pub(crate) use windows::window_bytes_bound;
