//! Built pipelines and the cache that keys them by module, entry point, constants and bounds
//! checks; the record of every pipeline built, for other WGSL compilers (`tools/tint/`).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::spec::{Constants, KernelSpec};
use crate::shader::{ModuleKey, Override};

/// A built pipeline, the constants it was specialised with, and its bind-group layout.
#[derive(Debug)]
pub struct Kernel {
    pub(crate) spec: &'static KernelSpec,
    pub(crate) constants: Vec<(Override, f64)>,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    /// Whether its module was built with runtime bounds checks.
    pub(crate) bounds_checked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PipelineKey {
    pub(crate) shader: ModuleKey,
    pub(crate) entry: &'static str,
    pub(crate) constants: Vec<(Override, u64)>,
    pub(crate) bounds_checked: bool,
}

/// Shader modules and pipelines built so far, keyed by module, entry point and constants, and
/// the driver's pipeline cache where one was loaded ([`Context::load_pipeline_cache`](crate::Context::load_pipeline_cache)).
#[derive(Debug, Default)]
pub(crate) struct PipelineCache {
    /// Modules by name and whether they were built with bounds checks.
    pub(crate) modules: Mutex<HashMap<(ModuleKey, bool), wgpu::ShaderModule>>,
    pub(crate) pipelines: Mutex<HashMap<PipelineKey, Arc<Kernel>>>,
    pub(crate) driver: Mutex<Option<wgpu::PipelineCache>>,
}

/// Environment variable naming a folder where every pipeline moeflow creates is recorded (its
/// module's WGSL and, per entry point and constant set, a JSON file), so other WGSL compilers
/// can be checked on exactly what the library builds (`tools/tint/`).
pub(crate) const DUMP_PIPELINES: &str = "MOEFLOW_DUMP_PIPELINES";

/// Writes `spec`'s module source and `{module, entry, constants}` under `dir` (files named for
/// the module, entry and constants, so concurrent writers of one pipeline write the same
/// bytes). A failure is logged and otherwise ignored: recording never changes a run.
pub(crate) fn dump_pipeline(dir: &Path, spec: &KernelSpec, constants: &Constants) {
    let module = spec.shader.name.replace('/', "__");
    let mut sorted: Vec<(&str, f64)> = constants.iter().map(|&(k, v)| (k.name(), v)).collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let tag: String = sorted.iter().map(|(k, v)| format!("-{k}{v}")).collect();
    let record = serde_json::json!({
        "module": format!("{module}.wgsl"),
        "entry": spec.entry,
        "constants": sorted.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
    });
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(format!("{module}.wgsl")), spec.shader.compose())?;
        std::fs::write(dir.join(format!("{module}__{}{tag}.json", spec.entry)), record.to_string())
    };
    if let Err(e) = write() {
        log::warn!("moeflow: could not record pipeline {module}/{} in {}: {e}", spec.entry, dir.display());
    }
}
