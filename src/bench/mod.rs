//! Measurement: the A/B protocol (ABBA blocks, two clocks, verdicts), per-adapter
//! calibration, the registry of comparisons, and the benchmark matrix's records and reports.
//!
//! Every speed claim in moeflow is a ratio measured in one run under this protocol; see
//! `docs/benchmarks/README.md` for how to read and reproduce the committed results.

pub mod calibrate;
pub mod comparison;
pub mod dag;
pub mod dispatch;
pub mod gemm;
pub mod layer;
pub mod record;
pub mod report;
pub mod routing;
pub mod runner;
pub mod verdict;

/// The two clocks of a sample (`src/timer.rs`, where the tuner uses them too).
pub use crate::timer::{MAX_TIMED_SAMPLES, Sample, Sampler};

pub use comparison::{Case, Comparison, Registered, Size, SizeSet};
pub use record::{Calibration, RunRecord, Settings};
pub use runner::{run_case, run_comparison};
pub use verdict::{Block, Rules, Summary, Verdict};

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
