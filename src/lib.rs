//! moeflow: mixture-of-experts kernels written once in WGSL and run through wgpu on Vulkan,
//! Metal, DX12 and GL.
//!
//! Start with a [`Context`] (an adapter chosen by backend or name, or your own device via
//! [`Context::from_wgpu`]), then plan kernels from [`kernels`]; plans hold
//! [`Dispatch`]es that you record into your own encoder. [`reference`](mod@reference) holds the
//! CPU oracles that mirror every kernel's accumulation order. [`dag`] runs a graph of stages one
//! dispatch per stage, as fused static passes, or as a persistent task queue.
//!
//! Cargo features (all on by default): `vulkan`, `metal`, `dx12`, `gles` choose wgpu's back
//! ends; `checkpoint` adds [`weights`] (safetensors checkpoints); `synth` adds seeded synthetic
//! inputs; `dag` the stage-graph executors; `bench` the benchmark harness. With
//! `default-features = false` and a back end, the crate is the kernels, the layer and the CPU
//! references, with no plotting, RNG or logger in its dependencies. `moeflow::wgpu` is the wgpu
//! it was built against.

#![warn(missing_docs, clippy::missing_errors_doc)]

#[cfg(feature = "bench")]
pub mod bench;
pub mod bits;
mod context;
#[cfg(feature = "dag")]
pub mod dag;
mod error;
mod gpu;
#[cfg(not(target_arch = "wasm32"))]
pub mod host_experts;
pub mod kernels;
pub mod layer;
mod live;
mod overlap;
pub mod pipeline;
pub mod quant;
pub mod reference;
mod requirements;
pub mod shader;
mod size;
mod sync;
#[cfg(feature = "synth")]
pub mod synth;
mod tensor;
mod timer;
pub mod workspace;

#[cfg(test)]
mod contract;
#[cfg(test)]
mod house;
#[cfg(feature = "checkpoint")]
pub mod weights;

pub use wgpu;

/// What a user of a layer needs in one import: the context, the layer, its configuration,
/// weights and output, and the choices a configuration names (gating, route and combine modes,
/// capacity, kernels, accumulation order, weight dtype). Kernel-level plans stay in
/// [`kernels`] for engines that compose their own graphs. [`Result`] is left out, so the
/// standard `Result` stays unshadowed.
pub mod prelude {
    pub use crate::context::{AdapterSelector, Context};
    pub use crate::error::Error;
    pub use crate::kernels::combine::CombineMode;
    pub use crate::kernels::gemm::{GemmOrder, WeightDtype};
    pub use crate::kernels::routing::{Gating, GroupLimit, RouteConfig, RouteMode};
    pub use crate::layer::{
        Capacity, ForwardIo, ForwardOutput, ForwardPlan, ForwardStage, KernelChoice, MoeConfig, MoeLayer,
        MoeWeights, PrepareReport, RouterWeights,
    };
    pub use crate::pipeline::BufferView;
    pub use crate::requirements::Requirements;
    pub use crate::tensor::{DType, Tensor};
}

pub use context::{
    ADAPTER_ENV, AdapterDescription, AdapterSelector, Allocations, BOUNDS_CHECKS_ENV, BoundsChecks,
    COOPERATIVE_MATRIX_ENV, Capabilities, Context, KeyLimits, WGPU_VERSION, adapters_async, instance,
    wgpu_adapters_async,
};
#[cfg(not(target_arch = "wasm32"))]
pub use context::{adapters, wgpu_adapters};
pub use error::{Error, GpuErrorKind, Result};
pub use pipeline::{BufferView, Dispatch};
pub use requirements::Requirements;
pub use tensor::{DType, Tensor};
pub use timer::{MAX_TIMED_SAMPLES, Sample, Sampler};

/// `docs/layer.md`, compiled and run as a doc test.
#[cfg(all(doctest, feature = "checkpoint", feature = "synth"))]
#[doc = include_str!("../docs/layer.md")]
pub struct LayerGuide;

/// `docs/dag.md`, compiled and run as a doc test.
#[cfg(all(doctest, feature = "dag"))]
#[doc = include_str!("../docs/dag.md")]
pub struct DagGuide;
