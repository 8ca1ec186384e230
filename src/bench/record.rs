//! The raw JSON record of one benchmark run on one adapter.

use std::process::Command;

use serde::{Deserialize, Serialize};

use super::comparison::SizeSet;
use super::verdict::{Block, Counts, Rules, Summary, Verdict};
use crate::context::AdapterDescription;
use crate::dag::ProbeReport;

/// Version of the record layout.
pub const SCHEMA_VERSION: u32 = 1;
/// The wgpu release moeflow is built against (kept equal to Cargo.toml by a unit test).
pub use crate::context::WGPU_VERSION;
/// Shader runtime checks used by every pipeline: wgpu's defaults.
pub const RUNTIME_CHECKS: &str = "checked: wgpu default bounds checks and loop bounding";

/// Source revision of the measured code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitState {
    /// `git rev-parse HEAD`, or `unknown`.
    pub revision: String,
    /// Whether tracked files had uncommitted changes.
    pub dirty: bool,
}

impl GitState {
    /// Reads the state of the repository in the current directory. Where there is no
    /// repository (binaries built elsewhere and run on another machine), `MOEFLOW_GIT_REVISION`
    /// names the revision they were built from, and the tree counts as clean.
    pub fn current() -> Self {
        if let Ok(revision) = std::env::var("MOEFLOW_GIT_REVISION") {
            return GitState { revision, dirty: false };
        }
        let run = |args: &[&str]| {
            Command::new("git")
                .args(args)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        GitState {
            revision: run(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into()),
            dirty: run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty()),
        }
    }
}

/// Protocol settings of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// ABBA blocks run first and not recorded.
    pub warmup: u32,
    /// ABBA blocks recorded.
    pub blocks: u32,
    /// Verdict thresholds.
    pub rules: Rules,
    /// Read outputs back after every timed sample (reproduces the timing effect of readback;
    /// off for honest figures).
    pub readback_each_run: bool,
    /// Repetitions of the work per sample are chosen so one sample of A takes at least this
    /// long (seconds), up to `max_reps`.
    pub min_sample_s: f64,
    /// Most repetitions per sample.
    pub max_reps: u32,
    /// Data seed.
    pub seed: u64,
    /// Held-out confirmation run (other sizes, other seed).
    pub held_out: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            warmup: 2,
            blocks: 8,
            rules: Rules::default(),
            readback_each_run: false,
            min_sample_s: 0.01,
            max_reps: 256,
            seed: 2026,
            held_out: false,
        }
    }
}

/// Calibrated practical limits of the adapter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Streaming copy bandwidth, GB/s (bytes read plus bytes written).
    pub copy_gbps: f64,
    /// FMA throughput, GFLOP/s (2 flops per FMA).
    pub fma_gflops: f64,
    /// `gpu` (timestamps) or `wall`.
    pub clock: String,
    /// How it was measured.
    pub method: String,
}

/// Figures for one variant at one size (per run of the work, on the verdict's clock).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VariantFigures {
    /// Median seconds per run.
    pub seconds: f64,
    /// GFLOP/s where the work has flops.
    pub gflops: Option<f64>,
    /// GB/s where the work has a byte count.
    pub gbps: Option<f64>,
    /// `gflops` as a fraction of the calibrated FMA throughput.
    pub fraction_of_fma: Option<f64>,
    /// `gbps` as a fraction of the calibrated copy bandwidth.
    pub fraction_of_bandwidth: Option<f64>,
    /// Dispatches per run.
    pub dispatches: usize,
    /// Device-to-host readbacks per run.
    pub readbacks: u32,
    /// Tokens per second where the case processes tokens.
    pub tokens_per_s: Option<f64>,
}

/// One size of one comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseRecord {
    /// Size label.
    pub size: String,
    /// What ran, where the comparison's variant names do not say it all (kernel variants,
    /// the tuner's choice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Size parameters.
    pub params: Vec<(String, u32)>,
    /// Repetitions of the work per sample.
    pub reps: u32,
    /// Recorded blocks on the GPU clock (per run), when the adapter has timestamps.
    pub blocks_gpu: Option<Vec<Block>>,
    /// Recorded blocks on the host wall clock (per run).
    pub blocks_wall: Vec<Block>,
    /// GPU-clock summary.
    pub gpu: Option<Summary>,
    /// Wall-clock summary.
    pub wall: Summary,
    /// `gpu` when timestamps exist, else `wall`.
    pub clock: String,
    /// The verdict on that clock.
    pub verdict: Verdict,
    /// B/A on that clock.
    pub ratio: f64,
    /// Variant A's figures.
    pub a: VariantFigures,
    /// Variant B's figures.
    pub b: VariantFigures,
}

/// One comparison on one adapter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComparisonRecord {
    /// Registered name.
    pub name: String,
    /// What it compares.
    pub description: String,
    /// Variant A (baseline).
    pub a: String,
    /// Variant B.
    pub b: String,
    /// Sizes measured.
    pub cases: Vec<CaseRecord>,
    /// Geometric-mean change of B vs A across sizes on the verdict clock (-0.3: 30% less time).
    pub geomean_change: f64,
    /// The same on the host wall clock.
    pub geomean_change_wall: f64,
    /// Verdicts across sizes.
    pub verdicts: Counts,
    /// Sizes that failed to build or validate, with why (joined by `; `); those sizes have
    /// no timings, the others do.
    pub error: Option<String>,
}

/// Everything one run of the matrix measured on one adapter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Record layout version.
    pub schema_version: u32,
    /// moeflow version.
    pub moeflow_version: String,
    /// UTC time of the run (RFC 3339).
    pub created_utc: String,
    /// The adapter, its driver, and the features enabled.
    pub adapter: AdapterDescription,
    /// wgpu version.
    pub wgpu_version: String,
    /// Shader runtime-check settings.
    pub runtime_checks: String,
    /// Source revision.
    pub git: GitState,
    /// Protocol settings.
    pub settings: Settings,
    /// Which size set ran.
    pub size_set: SizeSet,
    /// The adapter's calibrated limits.
    pub calibration: Calibration,
    /// Every comparison run.
    pub comparisons: Vec<ComparisonRecord>,
    /// The DAG queue's probe verdict on this adapter, where DAG comparisons ran (their `W=0`
    /// sizes use its worker bound).
    #[serde(default)]
    pub queue_probe: Option<ProbeReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wgpu_version_matches_the_manifest() {
        let manifest = include_str!("../../Cargo.toml");
        let line = manifest.lines().find(|l| l.starts_with("wgpu =")).expect("wgpu dependency");
        assert!(line.contains(&format!("\"{WGPU_VERSION}\"")), "{line} vs {WGPU_VERSION}");
    }
}
