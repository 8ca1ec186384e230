//! WGSL sources embedded in the crate and composed per kernel.
//!
//! A kernel's module is the concatenation of shared fragments (parameters, helpers) and
//! its own file, in the order listed. Every file under `wgsl/` belongs to at least one
//! module in [`all_shaders`]; a unit test validates each module with naga and translates it
//! to SPIR-V, MSL, HLSL and GLSL.

/// One WGSL file, embedded at build time.
#[derive(Debug)]
pub struct ShaderPart {
    /// Path relative to `wgsl/`.
    pub path: &'static str,
    /// File contents.
    pub text: &'static str,
}

/// A shader module built from parts, with the entry points it defines.
#[derive(Debug)]
pub struct ShaderSource {
    /// Module name (also the cache key of its `wgpu::ShaderModule`).
    pub name: &'static str,
    /// Fragments in composition order.
    pub parts: &'static [ShaderPart],
    /// Compute entry points the module defines.
    pub entry_points: &'static [&'static str],
}

impl ShaderSource {
    /// The module's full WGSL text, each part preceded by a comment naming its file.
    pub fn compose(&self) -> String {
        let mut out = String::new();
        for part in self.parts {
            out.push_str("// ---- wgsl/");
            out.push_str(part.path);
            out.push_str(" ----\n");
            out.push_str(part.text);
            out.push('\n');
        }
        out
    }
}

macro_rules! wgsl {
    ($path:literal) => {
        $crate::shader::ShaderPart {
            path: $path,
            text: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/wgsl/", $path)),
        }
    };
}
pub(crate) use wgsl;

/// Every shader module moeflow builds.
pub fn all_shaders() -> Vec<&'static ShaderSource> {
    let mut all = Vec::new();
    all.extend_from_slice(crate::kernels::routing::SHADERS);
    all.extend_from_slice(crate::kernels::dispatch::SHADERS);
    all.extend(crate::kernels::gemm::shaders());
    all.extend_from_slice(crate::kernels::combine::SHADERS);
    #[cfg(feature = "dag")]
    {
        all.extend_from_slice(crate::dag::executor::SHADERS);
        all.extend_from_slice(crate::dag::probe::SHADERS);
    }
    #[cfg(feature = "bench")]
    all.extend_from_slice(crate::bench::calibrate::SHADERS);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use naga::back::{glsl, hlsl, msl, spv};
    use naga::valid::{Capabilities, ValidationFlags, Validator};

    /// Modules that start with `enable f16;` need shader-f16 (never on GL adapters).
    fn needs_f16(source: &ShaderSource) -> bool {
        source.parts.first().is_some_and(|p| p.text.contains("enable f16;"))
    }

    fn validate(source: &ShaderSource) -> (naga::Module, naga::valid::ModuleInfo) {
        let text = source.compose();
        let module = naga::front::wgsl::parse_str(&text)
            .unwrap_or_else(|e| panic!("{}: {}", source.name, e.emit_to_string(&text)));
        let caps = if needs_f16(source) {
            Capabilities::SHADER_FLOAT16 | Capabilities::SHADER_FLOAT16_IN_FLOAT32
        } else {
            Capabilities::default()
        };
        let info = Validator::new(ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}: {}", source.name, e.emit_to_string(&text)));
        (module, info)
    }

    #[test]
    fn every_module_validates_and_translates_to_every_backend() {
        for source in all_shaders() {
            let (module, info) = validate(source);
            for &entry in source.entry_points {
                let ep = (naga::ShaderStage::Compute, entry);
                let (module, info) = naga::back::pipeline_constants::process_overrides(
                    &module,
                    &info,
                    Some(ep),
                    &Default::default(),
                )
                .unwrap_or_else(|e| panic!("{}::{entry}: overrides: {e}", source.name));
                let what = format!("{}::{entry}", source.name);
                let spv_opts = spv::PipelineOptions {
                    shader_stage: naga::ShaderStage::Compute,
                    entry_point: entry.to_string(),
                };
                let words = spv::write_vec(&module, &info, &spv::Options::default(), Some(&spv_opts))
                    .unwrap_or_else(|e| panic!("{what}: SPIR-V: {e}"));
                assert!(words.len() > 5, "{what}: empty SPIR-V");
                let msl_opts = msl::PipelineOptions {
                    entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
                    ..Default::default()
                };
                let (text, _) = msl::write_string(&module, &info, &msl::Options::default(), &msl_opts)
                    .unwrap_or_else(|e| panic!("{what}: MSL: {e}"));
                assert!(text.contains("kernel"), "{what}: MSL has no kernel");
                let mut text = String::new();
                let hlsl_opts = hlsl::PipelineOptions {
                    entry_point: Some((naga::ShaderStage::Compute, entry.to_string())),
                };
                let hlsl_options = if needs_f16(source) {
                    hlsl::Options { shader_model: hlsl::ShaderModel::V6_2, ..Default::default() }
                } else {
                    hlsl::Options::default()
                };
                hlsl::Writer::new(&mut text, &hlsl_options, &hlsl_opts)
                    .write(&module, &info, None)
                    .unwrap_or_else(|e| panic!("{what}: HLSL: {e}"));
                assert!(text.contains("numthreads"), "{what}: HLSL has no numthreads");
                // GL adapters never offer shader-f16, so f16 modules have no GLSL target.
                let glsl_versions = if needs_f16(source) {
                    vec![]
                } else {
                    vec![glsl::Version::new_gles(310), glsl::Version::Desktop(430)]
                };
                for version in glsl_versions {
                    let mut text = String::new();
                    let opts = glsl::Options { version, ..Default::default() };
                    let pipeline = glsl::PipelineOptions {
                        shader_stage: naga::ShaderStage::Compute,
                        entry_point: entry.to_string(),
                        multiview: None,
                    };
                    glsl::Writer::new(&mut text, &module, &info, &opts, &pipeline, Default::default())
                        .and_then(|mut w| w.write())
                        .unwrap_or_else(|e| panic!("{what}: GLSL {version:?}: {e}"));
                    assert!(text.contains("local_size_x"), "{what}: GLSL has no local size");
                }
            }
        }
    }

    #[test]
    #[cfg(all(feature = "dag", feature = "bench"))]
    fn every_wgsl_file_belongs_to_a_module() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("wgsl");
        let used: Vec<&str> = all_shaders().iter().flat_map(|s| s.parts.iter().map(|p| p.path)).collect();
        let mut stack = vec![root.clone()];
        let mut seen = 0;
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("wgsl/ is readable") {
                let path = entry.expect("directory entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "wgsl") {
                    let rel =
                        path.strip_prefix(&root).expect("under wgsl/").to_string_lossy().replace('\\', "/");
                    assert!(
                        used.contains(&rel.as_str()),
                        "wgsl/{rel} is in no shader module, so nothing validates it"
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen > 0, "no WGSL files found");
    }
}
