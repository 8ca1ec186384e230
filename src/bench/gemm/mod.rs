//! Expert-projection comparisons: the paths (`paths.rs`: grouped against dense, bucketed and
//! decode), the kernels on one path (`kernels.rs`), quantised weights (`quant.rs`), and what
//! they share (`problem.rs`). This file is the face.

mod kernels;
mod paths;
mod problem;
mod quant;

pub(crate) use kernels::tile_comparisons;
pub(crate) use kernels::{
    dense_texture_vs_window, dense_wide_vs_default, direct_vs_tiled, fast_vs_strict, texture_vs_window,
    tiled_vs_rowwise, tuned_vs_default, unchecked_vs_checked, window_vs_direct,
};
pub(crate) use paths::grouped_vs_dense;
pub(crate) use paths::{decode_vs_grouped, grouped_vs_bucketed};
pub(crate) use quant::quant_comparisons;
