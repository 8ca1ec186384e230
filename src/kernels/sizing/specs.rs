//! The sizing kernel's shader module and spec, and its uniform rules (`Rule` and `Rules` in
//! `wgsl/sizing/sizing.wgsl`).

use bytemuck::{Pod, Zeroable};

use crate::pipeline::{Access, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};

static SIZING_SHADER: ShaderSource = ShaderSource {
    name: "sizing/sizing",
    parts: &[wgsl!("sizing/sizing.wgsl")],
    entry_points: &["size_plan"],
    indexing: Indexing::Checked,
};

/// The sizing family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&SIZING_SHADER];

/// Parameter buffers one sizing dispatch rewrites (`TARGETS` in the WGSL).
pub(super) const TARGETS: usize = 5;
/// Rules one sizing dispatch carries (`MAX_RULES` in the WGSL).
pub(super) const MAX_RULES: usize = 64;
/// `Rule.kind`: one word.
pub(super) const KIND_VALUE: u32 = 0;
/// `Rule.kind`: a 1-D grid spilled into y, two words.
pub(super) const KIND_SPILL: u32 = 1;

use Access::{Read, ReadWrite, Uniform};
pub(super) static SIZE_PLAN: KernelSpec = KernelSpec {
    shader: &SIZING_SHADER,
    entry: "size_plan",
    bindings: &[
        (0, Uniform),
        (1, Read),
        (2, ReadWrite),
        (3, ReadWrite),
        (4, ReadWrite),
        (5, ReadWrite),
        (6, ReadWrite),
        (7, ReadWrite),
    ],
    params_bytes: std::mem::size_of::<Rules>() as u64,
    workgroup: Workgroup::Fixed(64),
};
/// Every sizing kernel (for the requirements and the contract test).
pub(crate) static SPECS: &[&KernelSpec] = &[&SIZE_PLAN];

/// One rule of `size_plan` (`Rule` in the WGSL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub(super) struct Rule {
    pub(super) target: u32,
    pub(super) word: u32,
    pub(super) kind: u32,
    pub(super) per_token: u32,
    pub(super) base: u32,
    pub(super) floor: u32,
    pub(super) divisor: u32,
    pub(super) cap: u32,
    pub(super) from_tokens: u32,
    pub(super) to_tokens: u32,
    pub(super) pad: [u32; 2],
}

/// The uniform rules of one `size_plan` dispatch (`Rules` in the WGSL).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub(super) struct Rules {
    pub(super) count: u32,
    pub(super) max_groups: u32,
    pub(super) max_tokens: u32,
    pub(super) pad: u32,
    pub(super) list: [Rule; MAX_RULES],
}

/// Target of the grid rules (`TARGETS` in the WGSL: past the parameter buffers).
pub(super) const GRIDS: u32 = TARGETS as u32;
