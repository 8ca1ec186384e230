//! The host experts' rows kernel in portable code ([`strict_rows`]), for CPUs that have no x86
//! one (`kernel.rs` chooses): on aarch64 it compiles to NEON, one row's group of four values a
//! register. f32 rows are read where they lie; f16 values and quantised blocks are decoded a
//! span of [`SPAN`] values at a time into a buffer on the stack, by `decode.rs`' decoders (as
//! `moeflow::quant` decodes them), rather than interleaved into a tile. Same order and bits as
//! the tile and the x86 rows kernels: lane `j` of a column's four takes `k = 4g + j`, one fused
//! multiply-add per value.

use multiversion::multiversion;

use super::decode;
use super::tile::{GGML_MXFP4_BLOCK_BYTES, Quads, ROW_COLS, RowBlock, Rows};
use crate::quant::{BLOCK_VALUES, MXFP4_BLOCK_BYTES, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// Values of each row decoded at a time: eight blocks (the buffer of [`ROW_COLS`] rows is
/// 8 KiB, within the L1 cache), so that each decoder call serves 256 values.
const SPAN: usize = 8 * BLOCK_VALUES;

/// One token's accumulators of [`ROW_COLS`] rows: row `r`'s four lanes.
type RowLanes = [[f32; 4]; ROW_COLS];

/// `T` tokens (one or two) over [`ROW_COLS`] rows of one chunk of K (`rows`, as
/// `kernel::RowsKernel::run` describes them): token `t`'s groups of x over the chunk are
/// `xs[t]` and its accumulators quads `quad .. quad + 2` of `acc[t]` (row `4q + i` of the
/// rows in lanes `4i .. 4i + 4` of quad `quad + q`). Per group of four values, each row's
/// four values are multiplied into each token's four lanes of the row, in group order.
#[multiversion(targets("aarch64+neon", "x86_64+avx2+fma+f16c"))]
pub(super) fn strict_rows<const T: usize>(
    rows: &Rows<'_>,
    quad: usize,
    xs: [&[[f32; 4]]; T],
    acc: [&mut Quads; T],
) {
    let mut a: [RowLanes; T] = [[[0.0; 4]; ROW_COLS]; T];
    for (a, acc) in a.iter_mut().zip(&acc) {
        for (r, lanes) in a.iter_mut().enumerate() {
            lanes.copy_from_slice(&acc[quad + r / 4][4 * (r % 4)..][..4]);
        }
    }
    let len = rows.block.values();
    match &rows.block {
        RowBlock::F32(r) => fma_rows(r.map(|row| row.as_chunks::<4>().0), &xs, 0, &mut a),
        RowBlock::F16(r) => by_spans(len, &xs, &mut a, |i, span, out| {
            decode::f16s(&r[i][2 * span.start..2 * span.end], out);
        }),
        RowBlock::Q8_0(r) => by_spans(len, &xs, &mut a, |i, span, out| {
            decode::q8_0(&r[i][bytes(&span, Q8_0_BLOCK_BYTES)], out);
        }),
        RowBlock::Q4_0(r) => by_spans(len, &xs, &mut a, |i, span, out| {
            decode::q4_0(&r[i][bytes(&span, Q4_0_BLOCK_BYTES)], out);
        }),
        RowBlock::GgmlMxfp4(r) => by_spans(len, &xs, &mut a, |i, span, out| {
            decode::ggml_mxfp4(&r[i][bytes(&span, GGML_MXFP4_BLOCK_BYTES)], out);
        }),
        RowBlock::Mxfp4 { codes, scales } => by_spans(len, &xs, &mut a, |i, span, out| {
            let (c, s) = (&codes[i][bytes(&span, MXFP4_BLOCK_BYTES)], &scales[i][bytes(&span, 1)]);
            decode::mxfp4(c, s, out);
        }),
    }
    for (a, acc) in a.iter().zip(acc) {
        for (r, lanes) in a.iter().enumerate() {
            acc[quad + r / 4][4 * (r % 4)..][..4].copy_from_slice(lanes);
        }
    }
}

/// The bytes of a block format's blocks holding the values `span` (whole blocks of
/// [`BLOCK_VALUES`]), `size` bytes a block.
#[inline(always)]
fn bytes(span: &std::ops::Range<usize>, size: usize) -> std::ops::Range<usize> {
    span.start / BLOCK_VALUES * size..span.end / BLOCK_VALUES * size
}

/// [`fma_rows`] over `len` values of each row (a multiple of four; of [`BLOCK_VALUES`] for the
/// block formats), [`SPAN`] at a time: `decode(i, span, out)` writes row `i`'s values `span`
/// into `out` (`span.len()` values).
#[inline(always)]
fn by_spans<const T: usize>(
    len: usize,
    xs: &[&[[f32; 4]]; T],
    a: &mut [RowLanes; T],
    mut decode: impl FnMut(usize, std::ops::Range<usize>, &mut [f32]),
) {
    let mut buffer = [[0.0f32; SPAN]; ROW_COLS];
    for start in (0..len).step_by(SPAN) {
        let span = start..len.min(start + SPAN);
        for (i, row) in buffer.iter_mut().enumerate() {
            decode(i, span.clone(), &mut row[..span.len()]);
        }
        let groups = span.len() / 4;
        let mut w: [&[[f32; 4]]; ROW_COLS] = [&[]; ROW_COLS];
        for (w, row) in w.iter_mut().zip(&buffer) {
            *w = &row.as_chunks::<4>().0[..groups];
        }
        fma_rows(w, xs, start / 4, a);
    }
}

/// Each row's groups `w[r]` (all as long) into every token's lanes of the row: for each group
/// `g`, `a[t][r][j] = fma(xs[t][first + g][j], w[r][g][j], a[t][r][j])`.
#[inline(always)]
fn fma_rows<const T: usize>(
    w: [&[[f32; 4]]; ROW_COLS],
    xs: &[&[[f32; 4]]; T],
    first: usize,
    a: &mut [RowLanes; T],
) {
    let groups = w[0].len();
    let mut x: [&[[f32; 4]]; T] = [&[]; T];
    for (x, xs) in x.iter_mut().zip(xs) {
        *x = &xs[first..first + groups];
    }
    let w = w.map(|w| &w[..groups]);
    for g in 0..groups {
        for (r, w) in w.iter().enumerate() {
            let w = w[g];
            for (a, x) in a.iter_mut().zip(&x) {
                let (lanes, x) = (&mut a[r], x[g]);
                for j in 0..4 {
                    lanes[j] = x[j].mul_add(w[j], lanes[j]);
                }
            }
        }
    }
}
