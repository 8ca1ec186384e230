//! The [`Context`] that owns a device: the context itself (`device.rs`), opening one
//! (`open.rs`), adapter choice (`selection.rs`), what an adapter is and can do (`adapter.rs`),
//! bounds checks (`bounds.rs`), device health and error scopes (`health.rs`), allocation counts
//! (`allocations.rs`), building kernels and dispatches (`pipelines.rs`), buffers and
//! submissions (`resources.rs`), waits as futures (`wait.rs`). This file is the face.

mod adapter;
mod allocations;
mod bounds;
mod device;
mod health;
mod open;
mod pipelines;
mod resources;
mod selection;
pub(crate) mod wait;

pub use adapter::{AdapterDescription, Capabilities, KeyLimits};
pub use allocations::Allocations;
pub use bounds::{BOUNDS_CHECKS_ENV, BoundsChecks};
pub use device::Context;
#[cfg(test)]
pub(crate) use open::test_contexts;
pub use open::{COOPERATIVE_MATRIX_ENV, WGPU_VERSION};
pub use selection::{ADAPTER_ENV, AdapterSelector, adapters_async, instance, wgpu_adapters_async};
#[cfg(not(target_arch = "wasm32"))]
pub use selection::{adapters, wgpu_adapters};
