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

/// The two clocks of a sample (moved to the crate root, where the tuner uses them too).
pub use crate::timer;

pub use comparison::{Case, Comparison, Size, SizeSet};
pub use record::{Calibration, RunRecord, Settings};
pub use runner::{run_case, run_comparison};
pub use timer::Sampler;
pub use verdict::{Block, Rules, Summary, Verdict};

/// Every registered comparison, in matrix order.
pub fn comparisons() -> Vec<Box<dyn Comparison>> {
    let mut all: Vec<Box<dyn Comparison>> = vec![
        Box::new(routing::FusedRoute),
        Box::new(routing::GateShare),
        Box::new(dispatch::DeviceDispatch),
        Box::new(gemm::GroupedVsDense),
        Box::new(gemm::GroupedVsBucketed),
        Box::new(gemm::DecodeVsGrouped),
        Box::new(gemm::TiledVsRowwise),
        Box::new(gemm::FastVsStrict),
        Box::new(gemm::UncheckedVsChecked),
        Box::new(gemm::DirectVsTiled),
        Box::new(gemm::WindowVsDirect),
        Box::new(gemm::DenseWideVsDefault),
        Box::new(gemm::TextureVsWindow),
        Box::new(gemm::DenseTextureVsWindow),
        Box::new(gemm::TunedVsDefault),
        Box::new(layer::OneLaunchCombine),
        Box::new(layer::LayerRoute),
        Box::new(layer::LayerLive),
    ];
    all.extend(gemm::TileVsTile::all().into_iter().map(|c| Box::new(c) as Box<dyn Comparison>));
    all.extend(gemm::QuantVsF16::all().into_iter().map(|c| Box::new(c) as Box<dyn Comparison>));
    all.extend(dag::comparisons().into_iter().map(|c| Box::new(c) as Box<dyn Comparison>));
    all.extend(dag::moe_comparisons().into_iter().map(|c| Box::new(c) as Box<dyn Comparison>));
    all
}
