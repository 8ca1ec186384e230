//! The parameters every GEMM kernel of the family reads (`GemmParams` in
//! wgsl/gemm/common.wgsl): the struct, its size and the shared constants.

use bytemuck::{Pod, Zeroable};

/// Bytes of `GemmParams` (wgsl/gemm/common.wgsl).
pub(crate) const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;

/// `GemmParams` (wgsl/gemm/common.wgsl), one per dispatch.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(super) struct Params {
    pub(super) rows: u32,
    pub(super) n: u32,
    pub(super) kdim: u32,
    pub(super) k_route: u32,
    pub(super) row_offset: u32,
    pub(super) fixed_expert: u32,
    pub(super) tile_rows: u32,
    pub(super) count_word: u32,
    pub(super) flags: u32,
    pub(super) expert_base: u32,
    pub(super) expert_count: u32,
    pub(super) col_base: u32,
    pub(super) cols: u32,
    pub(super) win_rows: u32,
    pub(super) win_stride4: u32,
    pub(super) win_row0: u32,
}

/// Marks padding rows (`NONE` in wgsl/gemm/common.wgsl).
pub(crate) const NONE: u32 = u32::MAX;
// FLAG_* bits of `Params::flags`, as in wgsl/gemm/common.wgsl.
pub(crate) const FLAG_GATHER: u32 = 1;
pub(crate) const FLAG_OUT_ENTRY: u32 = 2;
pub(crate) const FLAG_IDENTITY_ROWS: u32 = 4;
pub(crate) const FLAG_EXPERT_FROM_TILES: u32 = 8;
pub(crate) const FLAG_EXPERT_FROM_INDICES: u32 = 16;
