//! The dispatch layout's and the bucket layout's configurations and limits, the load
//! statistics read from a layout, and the check of host indices.

use serde::{Deserialize, Serialize};

use super::host::Meta;
use crate::error::{Error, Result};

/// Entries per placement block (and workgroup size of the block kernels).
pub(crate) const DISPATCH_WG: u32 = 256;

/// Largest supported expert (or bucket) count.
pub const MAX_EXPERTS: u32 = 65536;

/// Largest supported tile (tiles are powers of two).
pub const MAX_TILE: u32 = 256;

/// What to group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchConfig {
    /// Number of experts `E`, `1..=MAX_EXPERTS`.
    pub experts: u32,
    /// Experts per token.
    pub k: u32,
    /// Row tile of the grouped GEMM: a power of two in `1..=MAX_TILE`. Each expert's rows are
    /// padded to a multiple of it so no tile straddles two experts.
    pub tile: u32,
}

impl DispatchConfig {
    /// Checks the ranges.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero experts, zero k, k above the experts or a tile
    /// that is not a power of two in range; [`Error::LimitExceeded`] for too many experts.
    pub fn validate(&self) -> Result<()> {
        if self.experts == 0 {
            return Err(Error::invalid("experts must be at least 1"));
        }
        if self.experts > MAX_EXPERTS {
            return Err(Error::limit("experts", self.experts.into(), MAX_EXPERTS.into(), "dispatch kernels"));
        }
        if self.k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        if !self.tile.is_power_of_two() || self.tile > MAX_TILE {
            return Err(Error::invalid(format!(
                "tile = {} is not supported: use a power of two from 1 to {MAX_TILE}",
                self.tile
            )));
        }
        Ok(())
    }
}

/// What happens to tokens past a bucket's bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum OverflowPolicy {
    /// Listed for a second pass; nothing is lost.
    Overflow,
    /// Dropped and counted.
    Drop,
}

/// Bucket ("caps") routing: top-1 winners grouped per bucket with at most `bound` rows each.
/// The winners come from [`crate::kernels::routing::plan_argmax`] (same tie rule as top-k).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketConfig {
    /// Number of buckets.
    pub n_caps: u32,
    /// Rows per bucket, at least 1.
    pub bound: u32,
    /// Overflow or drop past the bound.
    pub policy: OverflowPolicy,
}

/// Expert load, from a layout's counts and meta words.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LoadStats {
    /// Entries per expert.
    pub per_expert: Vec<u32>,
    /// Entries placed.
    pub rows: u32,
    /// Largest count.
    pub max: u32,
    /// Mean count over all experts.
    pub mean: f64,
    /// `max / mean` (1.0 is perfectly balanced; 0 when nothing was routed).
    pub imbalance: f64,
    /// Experts with at least one entry.
    pub nonempty: u32,
    /// Entries past a bucket bound: sent to the overflow list, or dropped under
    /// [`OverflowPolicy::Drop`].
    pub over_bound: u32,
    /// Entries whose expert index was out of range.
    pub invalid: u32,
}

impl LoadStats {
    /// Statistics from per-expert counts and a layout's meta words.
    pub(crate) fn new(per_expert: Vec<u32>, meta: Meta) -> Self {
        let mean = f64::from(meta.rows) / per_expert.len().max(1) as f64;
        LoadStats {
            rows: meta.rows,
            max: meta.max_count,
            mean,
            imbalance: if meta.rows == 0 { 0.0 } else { f64::from(meta.max_count) / mean },
            nonempty: meta.nonempty,
            over_bound: meta.overflow,
            invalid: meta.invalid,
            per_expert,
        }
    }
}

/// Checks host-side indices before upload: every index must be below `experts`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first index at or past `experts`.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn check_indices(indices: &[u32], experts: u32) -> Result<()> {
    match indices.iter().position(|&i| i >= experts) {
        None => Ok(()),
        Some(p) => Err(Error::invalid(format!(
            "indices[{p}] = {} is not below the expert count {experts}",
            indices[p]
        ))),
    }
}
