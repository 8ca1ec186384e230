//! The combine family's shader module, its kernels and their uniform parameters
//! (`CombineParams` in `wgsl/combine/combine.wgsl`).

use bytemuck::{Pod, Zeroable};

use crate::pipeline::{Access, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};

static COMBINE_SHADER: ShaderSource = ShaderSource {
    name: "combine/combine",
    parts: &[wgsl!("combine/combine.wgsl")],
    entry_points: &["combine", "clear_row", "add_scaled", "add_shared", "fill_zero"],
    indexing: Indexing::Checked,
};

/// The combine family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&COMBINE_SHADER];

use Access::{ReadWrite, Uniform};
/// Bytes of `CombineParams` (wgsl/combine/combine.wgsl).
pub(super) const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;
/// A combine kernel: 64 invocations per workgroup, [`Params`] at binding 0.
const fn spec(entry: &'static str, bindings: &'static [(u32, Access)]) -> KernelSpec {
    KernelSpec {
        shader: &COMBINE_SHADER,
        entry,
        bindings,
        params_bytes: PARAMS_BYTES,
        workgroup: Workgroup::Fixed(64),
    }
}
pub(super) static COMBINE: KernelSpec = spec(
    "combine",
    &[(0, Uniform), (1, ReadWrite), (2, ReadWrite), (3, ReadWrite), (4, ReadWrite), (5, ReadWrite)],
);
pub(super) static CLEAR_ROW: KernelSpec = spec("clear_row", &[(0, Uniform), (5, ReadWrite)]);
pub(super) static ADD_SCALED: KernelSpec =
    spec("add_scaled", &[(0, Uniform), (1, ReadWrite), (2, ReadWrite), (5, ReadWrite)]);
pub(super) static ADD_SHARED: KernelSpec =
    spec("add_shared", &[(0, Uniform), (3, ReadWrite), (4, ReadWrite), (5, ReadWrite)]);
pub(super) static FILL_ZERO: KernelSpec = spec("fill_zero", &[(0, Uniform), (5, ReadWrite)]);
/// Every combine kernel (for the requirements and the contract test).
pub(crate) static SPECS: &[&KernelSpec] = &[&COMBINE, &CLEAR_ROW, &ADD_SCALED, &ADD_SHARED, &FILL_ZERO];

/// `CombineParams` in the WGSL.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(super) struct Params {
    pub(super) tokens: u32,
    pub(super) hidden: u32,
    pub(super) k: u32,
    pub(super) token: u32,
    pub(super) slot: u32,
    pub(super) pad: [u32; 3],
}
