//! The GEMM family's binding slots (group 0) as `wgsl/gemm/` and the generated kernels declare
//! them, and the bind-group tables of the block and row-wise kernels built from them: the
//! planners bind by these names, and `src/contract.rs` checks every table against the WGSL.

use crate::pipeline::Access::{self, Read, ReadWrite, TextureU32, Uniform};

use super::variant::OperandSource;

/// `GemmParams` (uniform, [`super::params::PARAMS_BYTES`]).
pub(crate) const PARAMS: u32 = 0;
/// x in storage (`x`).
pub(crate) const X: u32 = 1;
/// The weights (`w`: storage words, or `w_tex`, their texture copy).
pub(crate) const W: u32 = 2;
/// The up projection's weights (`w_up` or `w_up_tex`; the weights' own where there is none).
pub(crate) const W_UP: u32 = 3;
/// Each row's entry (`row_entry`).
pub(crate) const ROW_ENTRY: u32 = 4;
/// Each block tile's expert (`tile_expert`, block kernels).
pub(crate) const TILE_EXPERT: u32 = 5;
/// The outputs (`out`).
pub(crate) const OUT: u32 = 6;
/// The x window a block kernel reads (uniform), and the windows the staging pass writes.
pub(crate) const WINDOW: u32 = 7;
/// The live row count (`row_count`, row-wise kernels; the block kernels' [`WINDOW`] slot).
pub(crate) const ROW_COUNT: u32 = 7;
/// The routing indices a row-wise kernel takes each entry's expert from (`expert_of_entry`).
pub(crate) const EXPERT_OF_ENTRY: u32 = 8;
/// The x window a row-wise kernel reads (`xw`, uniform).
pub(crate) const ROWWISE_WINDOW: u32 = 9;
/// The biases (`bias`, `wgsl/gemm/epilogue.wgsl`).
pub(crate) const BIAS: u32 = 10;

/// The weights' access from `source`: storage, or texture copies.
const fn weights(source: OperandSource) -> Access {
    match source {
        OperandSource::Storage | OperandSource::Window => Read,
        OperandSource::Texture => TextureU32,
    }
}

/// A generated block kernel's bindings with its operands read from `source`: x from storage
/// ([`X`]) or from a window ([`WINDOW`]), the weights from storage or their texture copies.
pub(crate) const fn block_bindings(source: OperandSource) -> [(u32, Access); 8] {
    let x = match source {
        OperandSource::Storage => (X, ReadWrite),
        OperandSource::Window | OperandSource::Texture => (WINDOW, Uniform),
    };
    let w = weights(source);
    [
        (PARAMS, Uniform),
        x,
        (W, w),
        (W_UP, w),
        (ROW_ENTRY, ReadWrite),
        (TILE_EXPERT, ReadWrite),
        (OUT, ReadWrite),
        (BIAS, ReadWrite),
    ]
}

/// A row-wise kernel's bindings: x from storage ([`X`]) or, with `x_window`, from a window
/// ([`ROWWISE_WINDOW`]); the weights from storage or, with `textures`, their texture copies.
pub(crate) const fn rowwise_bindings(x_window: bool, textures: bool) -> [(u32, Access); 9] {
    let x = if x_window { (ROWWISE_WINDOW, Uniform) } else { (X, ReadWrite) };
    let w = if textures { TextureU32 } else { Read };
    [
        (PARAMS, Uniform),
        x,
        (W, w),
        (W_UP, w),
        (ROW_ENTRY, ReadWrite),
        (OUT, ReadWrite),
        (ROW_COUNT, ReadWrite),
        (EXPERT_OF_ENTRY, ReadWrite),
        (BIAS, ReadWrite),
    ]
}
