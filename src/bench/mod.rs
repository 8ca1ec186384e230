//! Measurement: the A/B protocol (ABBA blocks, two clocks, verdicts), per-adapter
//! calibration, the registry of comparisons, and the benchmark matrix's records and reports.
//!
//! Every speed claim in moeflow is a ratio measured in one run under this protocol; see
//! `docs/benchmarks/README.md` for how to read and reproduce the committed results.

pub mod calibrate;
pub mod comparison;
pub mod dag;
pub mod dispatch;
mod gemm;
mod layer;
pub mod record;
mod registry;
pub mod report;
pub mod routing;
pub mod runner;
pub mod verdict;

/// The two clocks of a sample (`src/timer.rs`, where the tuner uses them too).
pub use crate::timer::{MAX_TIMED_SAMPLES, Sample, Sampler};

pub use comparison::{Case, Comparison, Registered, Size, SizeSet};
pub use record::{Calibration, RunRecord, Settings};
pub use registry::comparisons;
pub use runner::{run_case, run_comparison};
pub use verdict::{Block, Rules, Summary, Verdict};
