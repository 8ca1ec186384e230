//! The registry: every comparison of the benchmark matrix, in matrix order.

use super::comparison::Comparison;
use super::{dag, dispatch, gemm, layer, routing};

/// Every registered comparison, in matrix order.
pub fn comparisons() -> Vec<Box<dyn Comparison>> {
    let registered = [
        routing::fused_route(),
        routing::gate_share(),
        dispatch::device_dispatch(),
        gemm::grouped_vs_dense(),
        gemm::grouped_vs_bucketed(),
        gemm::decode_vs_grouped(),
        gemm::tiled_vs_rowwise(),
        gemm::fast_vs_strict(),
        gemm::unchecked_vs_checked(),
        gemm::direct_vs_tiled(),
        gemm::window_vs_direct(),
        gemm::dense_wide_vs_default(),
        gemm::texture_vs_window(),
        gemm::dense_texture_vs_window(),
        gemm::tuned_vs_default(),
        layer::one_launch_combine(),
        layer::layer_route(),
        layer::layer_live(),
    ];
    registered
        .into_iter()
        .chain(gemm::tile_comparisons())
        .chain(gemm::quant_comparisons())
        .chain(dag::comparisons())
        .chain(dag::moe_comparisons())
        .map(|c| Box::new(c) as Box<dyn Comparison>)
        .collect()
}
