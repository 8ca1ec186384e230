//! Stored expert values decoded to f32 tiles: `R` rows (output columns) by a chunk of K, laid
//! out `[k][r]` so that the kernels multiply one x value into `R` rows at once. Every value is
//! decoded as [`crate::quant`] decodes it (one table lookup, or one f32 product of exact
//! operands), so it has the bits of [`WeightDtype::round`]'s and
//! [`QuantisedValues::dequantise`]'s.

use std::ops::Range;
use std::sync::LazyLock;

use half::{bf16, f16};

use super::kernel::{Lanes, R};
use crate::kernels::gemm::{QuantisedValues, StoredValues, WeightDtype};
use crate::quant::{self, BLOCK_VALUES, FP4_E2M1, MXFP4_BLOCK_BYTES, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// Every FP8 e4m3 byte as its value ([`quant::fp8_e4m3`]).
static FP8: LazyLock<[f32; 256]> = LazyLock::new(|| std::array::from_fn(|b| quant::fp8_e4m3(b as u8)));

/// Fills `tile[..ks.len()]` with rows `rows` (at most [`R`]) and columns `ks` of one expert's
/// `[n, k]` values `v` (`tile[kk][r]` = value `(rows.start + r, ks.start + kk)`), zeros in the
/// lanes past the rows and in the tile's rows past `ks` (K padded to the kernels' groups).
/// For block formats `ks.start` is a multiple of 32 (and of 128 for FP8 tiles of 128
/// columns) and `ks.end` a multiple of 32 or K. The values were checked against `[n, k]`.
pub(super) fn tile(v: &StoredValues<'_>, k: usize, rows: Range<usize>, ks: Range<usize>, tile: &mut [Lanes]) {
    let live = rows.len();
    for (r, n) in rows.enumerate() {
        match *v {
            StoredValues::Float { dtype: WeightDtype::F16, bytes } => {
                let row = &bytes[(n * k + ks.start) * 2..(n * k + ks.end) * 2];
                for (kk, b) in row.chunks_exact(2).enumerate() {
                    tile[kk][r] = f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            StoredValues::Float { dtype: WeightDtype::Bf16, bytes } => {
                let row = &bytes[(n * k + ks.start) * 2..(n * k + ks.end) * 2];
                for (kk, b) in row.chunks_exact(2).enumerate() {
                    tile[kk][r] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            // f32: the only other float dtype a checked `StoredValues` holds.
            StoredValues::Float { bytes, .. } => {
                let row = &bytes[(n * k + ks.start) * 4..(n * k + ks.end) * 4];
                for (kk, b) in row.chunks_exact(4).enumerate() {
                    tile[kk][r] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            StoredValues::Quantised(q) => quantised_row(&q, k, n, &ks, r, tile),
        }
    }
    for lanes in tile.iter_mut() {
        lanes[live..].fill(0.0);
    }
    for lanes in &mut tile[ks.len()..] {
        *lanes = [0.0; R];
    }
}

/// Row `n`, columns `ks`, of quantised values into lane `r` of `tile`.
fn quantised_row(
    q: &QuantisedValues<'_>,
    k: usize,
    n: usize,
    ks: &Range<usize>,
    r: usize,
    tile: &mut [Lanes],
) {
    let per_row = k / BLOCK_VALUES;
    let blocks = n * per_row + ks.start / BLOCK_VALUES..n * per_row + ks.end.div_ceil(BLOCK_VALUES);
    match *q {
        QuantisedValues::Q8_0(bytes) => {
            let row = &bytes[blocks.start * Q8_0_BLOCK_BYTES..blocks.end * Q8_0_BLOCK_BYTES];
            for (b, block) in row.chunks_exact(Q8_0_BLOCK_BYTES).enumerate() {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let at = b * BLOCK_VALUES;
                for (j, &q) in block[2..].iter().enumerate() {
                    tile[at + j][r] = f32::from(q as i8) * d;
                }
            }
        }
        QuantisedValues::Q4_0(bytes) => {
            let row = &bytes[blocks.start * Q4_0_BLOCK_BYTES..blocks.end * Q4_0_BLOCK_BYTES];
            for (b, block) in row.chunks_exact(Q4_0_BLOCK_BYTES).enumerate() {
                let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
                let at = b * BLOCK_VALUES;
                for (j, &byte) in block[2..].iter().enumerate() {
                    tile[at + j][r] = f32::from(i16::from(byte & 0xf) - 8) * d;
                    tile[at + j + 16][r] = f32::from(i16::from(byte >> 4) - 8) * d;
                }
            }
        }
        QuantisedValues::Mxfp4 { codes, scales } => {
            let row = &codes[blocks.start * MXFP4_BLOCK_BYTES..blocks.end * MXFP4_BLOCK_BYTES];
            for ((b, block), &scale) in row.chunks_exact(MXFP4_BLOCK_BYTES).enumerate().zip(&scales[blocks]) {
                let s = quant::e8m0(scale);
                let at = b * BLOCK_VALUES;
                for (j, &byte) in block.iter().enumerate() {
                    tile[at + 2 * j][r] = FP4_E2M1[usize::from(byte & 0xf)] * s;
                    tile[at + 2 * j + 1][r] = FP4_E2M1[usize::from(byte >> 4)] * s;
                }
            }
        }
        QuantisedValues::Fp8 { weight, scale_inv, block } => {
            let per_row = k.div_ceil(block[1]);
            let scales = &scale_inv[n / block[0] * per_row..(n / block[0] + 1) * per_row];
            let fp8 = &*FP8;
            for (kk, &byte) in weight[n * k + ks.start..n * k + ks.end].iter().enumerate() {
                tile[kk][r] = fp8[usize::from(byte)] * scales[(ks.start + kk) / block[1]];
            }
        }
    }
}
