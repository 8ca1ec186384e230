//! Token dispatch on the device: from `indices[tokens, k]` to a stable, tile-padded grouping
//! of rows by expert (counts, offsets, permutation and inverse, tile -> expert map), and
//! bucket routing with a capacity bound and an overflow list. No readback, no atomic
//! placement cursors, no look-back scans: see `docs/dispatch.md`.
//!
//! Files: `config.rs` (configurations, limits, load statistics), `layout.rs` (the dispatch
//! layout), `buckets.rs` (the bucket layout), `specs.rs` (modules, kernels, parameters),
//! `meta.rs` (the meta words), `host.rs` (the same layout on the host). This file is the face.

mod buckets;
mod config;
pub mod host;
mod layout;
mod meta;
mod specs;

pub use buckets::{BucketLayout, HostBuckets};
pub use config::{BucketConfig, DispatchConfig, LoadStats, MAX_EXPERTS, MAX_TILE, OverflowPolicy};
pub use layout::DispatchLayout;
#[cfg(not(target_arch = "wasm32"))]
pub use layout::{dispatch_host_indices, host_dispatch};

#[cfg(test)]
pub(crate) use config::DISPATCH_WG;
pub(crate) use meta::META_OVERFLOW;
#[cfg(test)]
pub(crate) use meta::{META_INVALID, META_MAX_COUNT, META_NONEMPTY, META_PADDED_ROWS, META_ROWS, META_TILES};
#[cfg(test)]
pub(crate) use specs::SHADERS;
pub(crate) use specs::SPECS;
