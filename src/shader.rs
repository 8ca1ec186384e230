//! WGSL sources embedded in the crate and composed per kernel.
//!
//! A kernel's module is the concatenation of shared fragments (parameters, helpers) and
//! its own file, in the order listed. This module is the bottom layer: the kernel families
//! declare their modules with it and it knows none of them. The unit tests in
//! `src/contract.rs` gather every module, check that every file under `wgsl/` belongs to one,
//! validate each with naga and translate it to SPIR-V, MSL, HLSL and GLSL.

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
    /// Whether every index the module makes is in range by its contract, so that it may be
    /// built without runtime bounds checks (see [`Indexing`]).
    pub indexing: Indexing,
}

/// Whether a module's indices are in range by its contract.
///
/// wgpu builds a module with runtime bounds checks unless told otherwise: on Vulkan every
/// dynamic index into a fixed-size array (workgroup tiles, private arrays, vector lanes) is
/// clamped, and on back ends without robust buffer access every buffer index too. A module
/// marked [`Indexing::Proven`] is built without them under
/// [`BoundsChecks::WhereUnproven`](crate::BoundsChecks::WhereUnproven) (the default); its
/// declaration states why each index is in range, which is a safety argument, not a hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Indexing {
    /// Some index is not bounded by the module itself (a value read from data no check
    /// covers): always built with bounds checks.
    Checked,
    /// Every index is in range: fixed-size arrays are indexed by invocation ids and loop
    /// counters below their length; buffers by rows, columns and K below the sizes the host
    /// checked against the bound views, by entries and rows that moeflow's own dispatch stage
    /// wrote (below the views' row counts by its contract), and by experts only after
    /// `in_chunk` (or the host-set fixed expert) bounds them.
    Proven,
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
