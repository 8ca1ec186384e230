//! The layouts the host experts' decoders write and their kernels read: the fast order's
//! transposed tiles ([`Lanes`]), the strict order's tiles of quads ([`Quads`]), and the rows
//! the rows kernels read as they lie ([`RowBlock`]).

use crate::quant::{BLOCK_VALUES, MXFP4_BLOCK_BYTES, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// Output columns in a tile: the SIMD lanes of one accumulator (one AVX-512 register, two
/// AVX2 registers, four NEON registers).
pub(super) const R: usize = 16;

/// One value per column of a tile.
pub(super) type Lanes = [f32; R];

/// The kernels read x and weights in whole steps of this many values along K: rows of x are
/// padded with zeros to a multiple of it, as are the tiles and rows of weights.
pub(super) const PAD: usize = 16;

/// Quads of output columns in a strict-order tile: each group of four values of [`COLS`]
/// columns is one tile row of `QUADS` vectors, vector `q` holding columns `4q .. 4q + 4`'s
/// four lanes side by side. Eight independent FMA chains per token.
pub(super) const QUADS: usize = 8;

/// Output columns in a strict-order tile.
pub(super) const COLS: usize = 4 * QUADS;

/// One group of four values of a strict-order tile's [`COLS`] columns: `[q][4 i + j]` is
/// value `j` of the group in column `4 q + i`. Also one token's accumulators over the tile
/// (the same lanes).
pub(super) type Quads = [Lanes; QUADS];

/// Columns the rows kernels (`kernel::RowsKernel`) take at a time: two quads.
pub(super) const ROW_COLS: usize = 8;

/// What the rows kernels (`kernel::RowsKernel`) read for [`ROW_COLS`] rows over one chunk
/// of K ([`RowBlock`]), and where the rows after them lie.
pub(super) struct Rows<'a> {
    /// The rows' values over the chunk.
    pub(super) block: RowBlock<'a>,
    /// Where the block's rows are whole stored rows read where they lie: how many stored rows
    /// on from each lies the row the next [`ROW_COLS`] output columns read in its place
    /// ([`ROW_COLS`] times the projection's row step). The kernels prefetch those rows as
    /// they read their own, a block of rows ahead, so that the next block streams in from
    /// memory while this one is computed (the x86 kernels; the portable one leaves it to
    /// the CPU's prefetchers). None for rows decoded a chunk at a time.
    #[cfg_attr(not(target_arch = "x86_64"), expect(dead_code, reason = "only the x86 kernels prefetch"))]
    pub(super) next: Option<usize>,
}

/// The values of [`Rows`].
pub(super) enum RowBlock<'a> {
    /// f32 values, each row a multiple of [`PAD`] values (zeros past K).
    F32([&'a [f32]; ROW_COLS]),
    /// f16 values as stored (little-endian), each row a multiple of [`PAD`] values.
    F16([&'a [u8]; ROW_COLS]),
    /// Q8_0 blocks as stored, each row the same whole blocks of the chunk.
    Q8_0([&'a [u8]; ROW_COLS]),
    /// Q4_0 blocks as stored, as `Q8_0`.
    Q4_0([&'a [u8]; ROW_COLS]),
    /// ggml's MXFP4 blocks as stored (`GGML_MXFP4_BLOCK_BYTES` each), as `Q8_0`.
    GgmlMxfp4([&'a [u8]; ROW_COLS]),
    /// MXFP4 blocks' codes and scale bytes as stored, as `Q8_0`.
    Mxfp4 {
        /// Each row's codes, 16 bytes a block.
        codes: [&'a [u8]; ROW_COLS],
        /// Each row's scale bytes, one a block.
        scales: [&'a [u8]; ROW_COLS],
    },
}

impl RowBlock<'_> {
    /// Values in each row.
    pub(super) fn values(&self) -> usize {
        match self {
            RowBlock::F32(r) => r[0].len(),
            RowBlock::F16(r) => r[0].len() / 2,
            RowBlock::Q8_0(r) => r[0].len() / Q8_0_BLOCK_BYTES * BLOCK_VALUES,
            RowBlock::Q4_0(r) => r[0].len() / Q4_0_BLOCK_BYTES * BLOCK_VALUES,
            RowBlock::GgmlMxfp4(r) => r[0].len() / GGML_MXFP4_BLOCK_BYTES * BLOCK_VALUES,
            RowBlock::Mxfp4 { codes, .. } => codes[0].len() / MXFP4_BLOCK_BYTES * BLOCK_VALUES,
        }
    }
}

/// Bytes of one of ggml's MXFP4 blocks (llama.cpp's `block_mxfp4`): an E8M0 scale byte, then
/// 16 bytes of codes, value `j` the low nibble of byte `j` and value `j + 16` its high one.
pub(super) const GGML_MXFP4_BLOCK_BYTES: usize = 17;
