//! The dispatch family's shader modules, kernel specs and parameter struct.

use bytemuck::{Pod, Zeroable};

use super::config::DISPATCH_WG;
use crate::pipeline::Access::{ReadWrite, Uniform};
use crate::pipeline::{KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};

pub(super) static LAYOUT_SHADER: ShaderSource = ShaderSource {
    name: "dispatch/layout",
    parts: &[wgsl!("dispatch/params.wgsl"), wgsl!("dispatch/layout.wgsl")],
    entry_points: &["block_hist", "expert_base", "scan", "scatter"],
    indexing: Indexing::Checked,
};

pub(super) static BUCKET_SHADER: ShaderSource = ShaderSource {
    name: "dispatch/bucket",
    parts: &[wgsl!("dispatch/params.wgsl"), wgsl!("dispatch/bucket.wgsl")],
    entry_points: &["bucket_slots", "bucket_overflow"],
    indexing: Indexing::Checked,
};

/// The dispatch family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&LAYOUT_SHADER, &BUCKET_SHADER];

/// Bytes of `DispatchParams` (wgsl/dispatch/params.wgsl).
pub(super) const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub(super) struct Params {
    pub(super) entries: u32,
    pub(super) k: u32,
    pub(super) experts: u32,
    pub(super) tile: u32,
    pub(super) blocks: u32,
    pub(super) bound: u32,
    pub(super) max_tiles: u32,
    pub(super) pad0: u32,
}

pub(super) static BLOCK_HIST: KernelSpec = KernelSpec {
    shader: &LAYOUT_SHADER,
    entry: "block_hist",
    bindings: &[(0, Uniform), (1, ReadWrite), (2, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(DISPATCH_WG),
};

pub(super) static EXPERT_BASE: KernelSpec = KernelSpec {
    shader: &LAYOUT_SHADER,
    entry: "expert_base",
    bindings: &[(0, Uniform), (2, ReadWrite), (3, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};

pub(super) static SCAN: KernelSpec = KernelSpec {
    shader: &LAYOUT_SHADER,
    entry: "scan",
    bindings: &[
        (0, Uniform),
        (3, ReadWrite),
        (4, ReadWrite),
        (5, ReadWrite),
        (6, ReadWrite),
        (8, ReadWrite),
        (9, ReadWrite),
        (10, ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(DISPATCH_WG),
};

pub(super) static SCATTER: KernelSpec = KernelSpec {
    shader: &LAYOUT_SHADER,
    entry: "scatter",
    bindings: &[(0, Uniform), (1, ReadWrite), (2, ReadWrite), (5, ReadWrite), (6, ReadWrite), (7, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(DISPATCH_WG),
};

pub(super) static BUCKET_SLOTS: KernelSpec = KernelSpec {
    shader: &BUCKET_SHADER,
    entry: "bucket_slots",
    bindings: &[(0, Uniform), (3, ReadWrite), (4, ReadWrite), (6, ReadWrite), (11, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};

pub(super) static BUCKET_OVERFLOW: KernelSpec = KernelSpec {
    shader: &BUCKET_SHADER,
    entry: "bucket_overflow",
    bindings: &[
        (0, Uniform),
        (1, ReadWrite),
        (4, ReadWrite),
        (7, ReadWrite),
        (10, ReadWrite),
        (12, ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};

/// Every dispatch kernel (for the requirements and the contract test).
pub(crate) static SPECS: &[&KernelSpec] =
    &[&BLOCK_HIST, &EXPERT_BASE, &SCAN, &SCATTER, &BUCKET_SLOTS, &BUCKET_OVERFLOW];
