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
    /// Module name: its label (the caches key on [`Self::key`]), unique among the modules.
    pub name: &'static str,
    /// Fragments in composition order.
    pub parts: &'static [ShaderPart],
    /// Compute entry points the module defines.
    pub entry_points: &'static [&'static str],
    /// Whether every index the module makes is in range by its contract, so that it may be
    /// built without runtime bounds checks (see [`Indexing`]).
    pub indexing: Indexing,
}

/// A shader module's identity, which the module and pipeline caches key on: its source, by
/// address. Every source is a `static` or generated once per typed description and kept for
/// the process (a GEMM variant's `(GemmVariant, GemmOrder, WeightLoads)`), so one address is
/// one module; its name is a label (unique too: `src/contract.rs` checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModuleKey(usize);

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

/// The 64-bit FNV-1a offset basis, where [`ShaderSource::fnv1a`] hashes start.
pub(crate) const FNV1A_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

impl ShaderSource {
    /// 64-bit FNV-1a of the module's full WGSL text ([`Self::compose`]), continued from `h`:
    /// from [`FNV1A_BASIS`] the module's hash, folded over modules the hash of their texts one
    /// after another.
    pub(crate) fn fnv1a(&self, h: u64) -> u64 {
        self.compose().bytes().fold(h, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    }

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

    /// The module's identity ([`ModuleKey`]).
    pub fn key(&'static self) -> ModuleKey {
        ModuleKey(std::ptr::from_ref(self).addr())
    }

    /// The override constants the module declares: those of its parts
    /// ([`Override::of_file`]).
    pub fn overrides(&self) -> Vec<Override> {
        self.parts.iter().flat_map(|p| Override::of_file(p.path)).copied().collect()
    }
}

/// An override constant of the WGSL modules (`override NAME` in one of their files): the
/// typed key of a pipeline's specialisation ([`crate::pipeline::Constants`]). Which file
/// declares which constants is one table ([`Override::of_file`]); a module's constants are
/// those of its parts ([`ShaderSource::overrides`]), which the contract test checks against
/// naga's reflection of every module, and a pipeline is refused a constant its module does not
/// declare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Override {
    /// `ACTIVATION` (`gemm/epilogue.wgsl`): the gated activation, 0 SwiGLU, 1 clamped SwiGLU.
    Activation,
    /// `BIAS` (`gemm/epilogue.wgsl`): which bias the epilogue adds.
    Bias,
    /// `DTYPE` (`gemm/common.wgsl`, `dag/moe.wgsl`): the weights' storage code.
    Dtype,
    /// `FAST_ORDER` (`gemm/order.wgsl`): the fast accumulation order.
    FastOrder,
    /// `GATING` (`routing/select.wgsl`): the gating function's code.
    Gating,
    /// `GLU_ALPHA` (`gemm/epilogue.wgsl`): the clamped SwiGLU's alpha.
    GluAlpha,
    /// `GLU_LIMIT` (`gemm/epilogue.wgsl`): the clamped SwiGLU's limit.
    GluLimit,
    /// `HAS_BIAS` (`routing/select.wgsl`): a selection bias.
    HasBias,
    /// `HAS_GROUPS` (`routing/select.wgsl`): group-limited choice.
    HasGroups,
    /// `HAS_SHARED` (`combine/combine.wgsl`): a shared expert's rows to add.
    HasShared,
    /// `LANES` (`dag/program.wgsl`, `dag/moe.wgsl`): workgroup size of the DAG kernels.
    Lanes,
    /// `MATVEC_WG` (`routing/gate_matvec.wgsl`): workgroup size of the gate matvec.
    MatvecWg,
    /// `NARROW_SCALES` (`gemm/common.wgsl`): block scales stored narrow.
    NarrowScales,
    /// `RENORMALIZE` (`routing/select.wgsl`): renormalise the top-k weights.
    Renormalize,
    /// `SHARED_GATED` (`combine/combine.wgsl`): the shared expert has a gate.
    SharedGated,
    /// `SWIGLU` (`gemm/common.wgsl`): the pass applies the gated activation.
    Swiglu,
    /// `WRITE_LOGITS` (`routing/route_fused.wgsl`): the fused route writes its logits.
    WriteLogits,
}

impl Override {
    /// The constant's name in the WGSL.
    pub fn name(self) -> &'static str {
        match self {
            Override::Activation => "ACTIVATION",
            Override::Bias => "BIAS",
            Override::Dtype => "DTYPE",
            Override::FastOrder => "FAST_ORDER",
            Override::Gating => "GATING",
            Override::GluAlpha => "GLU_ALPHA",
            Override::GluLimit => "GLU_LIMIT",
            Override::HasBias => "HAS_BIAS",
            Override::HasGroups => "HAS_GROUPS",
            Override::HasShared => "HAS_SHARED",
            Override::Lanes => "LANES",
            Override::MatvecWg => "MATVEC_WG",
            Override::NarrowScales => "NARROW_SCALES",
            Override::Renormalize => "RENORMALIZE",
            Override::SharedGated => "SHARED_GATED",
            Override::Swiglu => "SWIGLU",
            Override::WriteLogits => "WRITE_LOGITS",
        }
    }

    /// The constants the WGSL file `path` (relative to `wgsl/`) declares, in its order.
    pub fn of_file(path: &str) -> &'static [Override] {
        use Override::*;
        match path {
            "combine/combine.wgsl" => &[HasShared, SharedGated],
            "dag/moe.wgsl" => &[Lanes, Dtype],
            "dag/program.wgsl" => &[Lanes],
            "gemm/common.wgsl" => &[Dtype, NarrowScales, Swiglu],
            "gemm/epilogue.wgsl" => &[Bias, Activation, GluAlpha, GluLimit],
            "gemm/order.wgsl" => &[FastOrder],
            "routing/gate_matvec.wgsl" => &[MatvecWg],
            "routing/route_fused.wgsl" => &[WriteLogits],
            "routing/select.wgsl" => &[Gating, HasBias, HasGroups, Renormalize],
            _ => &[],
        }
    }
}

impl std::fmt::Display for Override {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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
