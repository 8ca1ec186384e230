//! moeflow: mixture-of-experts kernels written once in WGSL and run through wgpu on Vulkan,
//! Metal, DX12 and GL.
//!
//! Start with a [`Context`] (an adapter chosen by backend or name, or your own device via
//! [`Context::from_wgpu`]), then plan kernels from [`kernels`]; plans hold
//! [`Dispatch`]es that you record into your own encoder. [`reference`] holds the CPU
//! oracles that mirror every kernel's accumulation order. [`dag`] runs a graph of stages one
//! dispatch per stage, as fused static passes, or as a persistent task queue.

pub mod bench;
pub mod context;
pub mod dag;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod layer;
pub mod pipeline;
pub mod reference;
pub mod shader;
pub mod synth;
pub mod weights;

pub use context::{
    AdapterDescription, AdapterSelector, Capabilities, Context, KeyLimits, adapters, instance, wgpu_adapters,
};
pub use error::{Error, Result};
pub use pipeline::Dispatch;

/// `docs/layer.md`, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../docs/layer.md")]
pub struct LayerGuide;

/// `docs/dag.md`, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../docs/dag.md")]
pub struct DagGuide;
