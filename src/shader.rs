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
    all
}
