//! Quantised weight formats as checkpoints ship them, decoded exactly on the CPU.
//!
//! Four block formats, each with its byte layout as stored, an exact dequantisation (every
//! value is one table lookup or one f32 product, so it has a single right answer, which the
//! device's unpacking must reproduce bit for bit) and a quantiser for synthetic layers:
//!
//! | format | block | bytes per block | value |
//! |---|---|---|---|
//! | MXFP4 (OCP Microscaling, as gpt-oss stores it) | 32 values | 16 code bytes + 1 scale byte (separate tensors) | `FP4_E2M1[code] × 2^(scale − 127)` |
//! | FP8 e4m3 with block scales (DeepSeek-V3, Qwen3-FP8) | a `block[0] × block[1]` tile of the matrix | 1 per value + one f32 per tile | `e4m3(byte) × scale_inv[tile]` |
//! | Q8_0 (ggml) | 32 values | 34: f16 `d`, 32 × i8 | `q × d` |
//! | Q4_0 (ggml) | 32 values | 18: f16 `d`, 16 bytes of nibbles | `(nibble − 8) × d` |
//!
//! Where the layouts differ in detail:
//! - MXFP4 (gpt-oss safetensors `*_blocks` `[.., G, 16]` uint8 and `*_scales` `[.., G]` uint8):
//!   byte `j` of a block holds value `2j` in its low nibble and `2j + 1` in its high nibble
//!   (transformers' `convert_moe_packed_tensors`). The scale is E8M0: `2^(byte − 127)`, with
//!   byte 0 the subnormal `2^-127` and byte 255 NaN as the OCP spec says, so that block is NaN
//!   everywhere (transformers' `ldexp` gives ±inf and NaN there instead; no shipped checkpoint
//!   holds that byte). Products past f32's range overflow to ±inf (`6 × 2^127`).
//! - Q4_0: byte `j` holds value `j` in its low nibble and `j + 16` in its high nibble (ggml's
//!   `dequantize_row_q4_0`), unlike MXFP4's interleave.
//! - ggml's MXFP4 (GGUF type 39, `block_mxfp4`: the E8M0 byte, then 16 code bytes in Q4_0's
//!   nibble order, code 8 read as +0) converts exactly to gpt-oss's layout
//!   ([`mxfp4_from_ggml`]), except scale byte 255 (ggml `2^127`, E8M0 NaN), refused.
//! - FP8 e4m3 ("fn": no infinities): bias 7, subnormals `m × 2^-9`, 448 the largest finite
//!   value, `0x7f` and `0xff` NaN. `scale_inv` multiplies (DeepSeek-V3's `weight_dequant`).

use half::f16;

use crate::error::{Error, Result};

/// Values per MXFP4, Q8_0 and Q4_0 block.
pub const BLOCK_VALUES: usize = 32;
/// Code bytes per MXFP4 block (two FP4 codes each).
pub const MXFP4_BLOCK_BYTES: usize = 16;
/// Bytes per Q8_0 block: an f16 scale, then 32 signed bytes.
pub const Q8_0_BLOCK_BYTES: usize = 34;
/// Bytes per Q4_0 block: an f16 scale, then 16 bytes of two nibbles each.
pub const Q4_0_BLOCK_BYTES: usize = 18;
/// The FP8 block-scale tile of DeepSeek-V3 and Qwen3-FP8 checkpoints (`weight_block_size`).
pub const FP8_BLOCK: [usize; 2] = [128, 128];
/// The largest finite FP8 e4m3 value.
pub const FP8_E4M3_MAX: f32 = 448.0;

/// The 16 FP4 e2m1 codes as values: sign in bit 3, then exponent (2 bits, bias 1) and
/// mantissa (1 bit); codes 0 and 8 are +0 and -0.
pub const FP4_E2M1: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// `2^e` for `e` in `-149..=127` (exact: subnormal below -126).
#[inline]
fn pow2(e: i32) -> f32 {
    debug_assert!((-149..=127).contains(&e));
    if e >= -126 { f32::from_bits(((e + 127) as u32) << 23) } else { f32::from_bits(1 << (e + 149)) }
}

/// An E8M0 scale byte as a value: `2^(byte − 127)`; 255 is NaN.
#[inline]
pub fn e8m0(byte: u8) -> f32 {
    if byte == 255 { f32::NAN } else { pow2(i32::from(byte) - 127) }
}

/// An FP8 e4m3 ("fn") byte as a value (exact in f32).
pub fn fp8_e4m3(byte: u8) -> f32 {
    let sign = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((byte >> 3) & 0xf);
    let mantissa = f32::from(byte & 0x7);
    if exponent == 0xf && byte & 0x7 == 0x7 {
        return f32::NAN;
    }
    if exponent == 0 {
        return sign * mantissa * pow2(-9);
    }
    sign * (1.0 + mantissa / 8.0) * pow2(exponent - 7)
}

/// `v` as the nearest FP8 e4m3 byte (ties to the even code); magnitudes past
/// [`FP8_E4M3_MAX`] saturate to it, NaN gives `0x7f`.
pub fn fp8_e4m3_from_f32(v: f32) -> u8 {
    if v.is_nan() {
        return 0x7f;
    }
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    // Codes 0x00 ..= 0x7e are the non-negative finite values in increasing order.
    let (mut lo, mut hi) = (0u8, 0x7eu8);
    if a >= FP8_E4M3_MAX {
        return sign | hi;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fp8_e4m3(mid) <= a { lo = mid } else { hi = mid }
    }
    let (below, above) = (a - fp8_e4m3(lo), fp8_e4m3(hi) - a);
    let code = if below < above || (below == above && lo % 2 == 0) { lo } else { hi };
    sign | code
}

/// Checks that `len` bytes are whole blocks of `block_bytes`; the block count.
fn blocks_of(what: &str, len: usize, block_bytes: usize) -> Result<usize> {
    if !len.is_multiple_of(block_bytes) {
        return Err(Error::shape(
            what,
            format!("whole blocks of {block_bytes} bytes"),
            format!("{len} bytes"),
        ));
    }
    Ok(len / block_bytes)
}

/// Checks that `len` values are whole blocks of [`BLOCK_VALUES`].
fn whole_blocks(what: &str, len: usize) -> Result<()> {
    if !len.is_multiple_of(BLOCK_VALUES) {
        return Err(Error::shape(what, format!("a multiple of {BLOCK_VALUES} values"), len));
    }
    Ok(())
}

/// Checks that `codes` holds [`MXFP4_BLOCK_BYTES`] bytes per scale.
fn mxfp4_blocks(codes: &[u8], scales: &[u8]) -> Result<()> {
    if codes.len() != scales.len() * MXFP4_BLOCK_BYTES {
        return Err(Error::shape(
            "MXFP4 blocks",
            format!("{MXFP4_BLOCK_BYTES} code bytes per scale ({} scales)", scales.len()),
            format!("{} bytes", codes.len()),
        ));
    }
    Ok(())
}

/// MXFP4 blocks as values: `codes` holds [`MXFP4_BLOCK_BYTES`] bytes per block, `scales` one
/// E8M0 byte per block; value `32b + 2j` is block `b`'s byte `j` low nibble, `32b + 2j + 1`
/// its high nibble, each `FP4_E2M1[code] × e8m0(scale)`.
///
/// # Errors
/// [`Error::Shape`] when `codes` is not 16 bytes per scale.
pub fn mxfp4_dequantize(codes: &[u8], scales: &[u8]) -> Result<Vec<f32>> {
    mxfp4_blocks(codes, scales)?;
    let mut out = Vec::with_capacity(codes.len() * 2);
    for (block, &scale) in codes.chunks_exact(MXFP4_BLOCK_BYTES).zip(scales) {
        let s = e8m0(scale);
        for &byte in block {
            out.push(FP4_E2M1[usize::from(byte & 0xf)] * s);
            out.push(FP4_E2M1[usize::from(byte >> 4)] * s);
        }
    }
    Ok(out)
}

/// Bytes per ggml MXFP4 block (`block_mxfp4`, GGUF type 39): the E8M0 scale byte, then 16
/// code bytes.
pub const GGML_MXFP4_BLOCK_BYTES: usize = 17;

/// ggml's MXFP4 blocks ([`GGML_MXFP4_BLOCK_BYTES`] each) as gpt-oss's (codes, scales) of
/// [`mxfp4_dequantize`], holding the values ggml decodes (`dequantize_row_mxfp4`): ggml's byte
/// `j` holds value `j` in its low nibble and `j + 16` in its high nibble (Q4_0's order), and
/// its code 8 is +0 (`kvalues_mxfp4[8]` is 0), so it becomes code 0; the scale byte is kept.
///
/// # Errors
/// [`Error::Shape`] for bytes that are not whole blocks; [`Error::InvalidArgument`] for a
/// scale byte 255, which ggml decodes as `2^127` where E8M0 (and [`e8m0`]) has NaN.
pub fn mxfp4_from_ggml(blocks: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    let n = blocks_of("ggml MXFP4", blocks.len(), GGML_MXFP4_BLOCK_BYTES)?;
    let (mut codes, mut scales) = (Vec::with_capacity(n * MXFP4_BLOCK_BYTES), Vec::with_capacity(n));
    for (b, block) in blocks.chunks_exact(GGML_MXFP4_BLOCK_BYTES).enumerate() {
        if block[0] == 255 {
            return Err(Error::invalid(format!(
                "ggml MXFP4 block {b} has scale byte 255, which ggml reads as 2^127 and E8M0 as NaN"
            )));
        }
        scales.push(block[0]);
        let qs = &block[1..];
        let code = |v: usize| {
            let c = if v < 16 { qs[v] & 0xf } else { qs[v - 16] >> 4 };
            if c == 8 { 0 } else { c }
        };
        codes.extend((0..16).map(|j| code(2 * j) | (code(2 * j + 1) << 4)));
    }
    Ok((codes, scales))
}

/// gpt-oss's MXFP4 (codes, scales) as ggml's blocks (for writing GGUF files): the inverse
/// of [`mxfp4_from_ggml`] where no code is 8 (-0, which ggml cannot hold; it is written as
/// +0).
///
/// # Errors
/// [`Error::Shape`] when `codes` is not 16 bytes per scale.
pub fn mxfp4_to_ggml(codes: &[u8], scales: &[u8]) -> Result<Vec<u8>> {
    mxfp4_blocks(codes, scales)?;
    let mut out = Vec::with_capacity(scales.len() * GGML_MXFP4_BLOCK_BYTES);
    for (block, &scale) in codes.chunks_exact(MXFP4_BLOCK_BYTES).zip(scales) {
        let code = |v: usize| {
            let c = if v.is_multiple_of(2) { block[v / 2] & 0xf } else { block[v / 2] >> 4 };
            if c == 8 { 0 } else { c }
        };
        out.push(scale);
        out.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
    }
    Ok(out)
}

/// The nearest FP4 e2m1 code to `v` (ties to the even code; magnitudes past 6 saturate).
fn fp4_code(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 8 } else { 0 };
    let a = v.abs();
    let mut best = 0u8;
    for code in 1..8u8 {
        let (d, db) = ((FP4_E2M1[usize::from(code)] - a).abs(), (FP4_E2M1[usize::from(best)] - a).abs());
        if d < db || (d == db && code % 2 == 0) {
            best = code;
        }
    }
    sign | best
}

/// Quantises `values` to MXFP4 (for synthetic layers): per block of 32 the scale `2^e` with
/// `e = floor(log2(amax)) − 2` (so the largest magnitude lands in `[4, 8)`; clamped to the
/// E8M0 range, `2^0` for an all-zero block), each value the nearest code of `value / 2^e`.
/// Returns (codes, scales) in [`mxfp4_dequantize`]'s layout.
///
/// # Errors
/// [`Error::Shape`] for a length that is not whole blocks; [`Error::InvalidArgument`] for a
/// value that is not finite.
pub fn mxfp4_quantize(values: &[f32]) -> Result<(Vec<u8>, Vec<u8>)> {
    whole_blocks("MXFP4 values", values.len())?;
    finite("MXFP4", values)?;
    let mut codes = Vec::with_capacity(values.len() / 2);
    let mut scales = Vec::with_capacity(values.len() / BLOCK_VALUES);
    for block in values.chunks_exact(BLOCK_VALUES) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let e = if amax == 0.0 { 0 } else { (log2_floor(amax) - 2).clamp(-127, 127) };
        scales.push((e + 127) as u8);
        let inv = pow2(-e);
        for pair in block.chunks_exact(2) {
            codes.push(fp4_code(pair[0] * inv) | (fp4_code(pair[1] * inv) << 4));
        }
    }
    Ok((codes, scales))
}

/// `floor(log2(a))` for a finite `a > 0`, exactly.
fn log2_floor(a: f32) -> i32 {
    let bits = a.to_bits();
    let exponent = ((bits >> 23) & 0xff) as i32;
    if exponent != 0 {
        return exponent - 127;
    }
    // Subnormal: the highest set mantissa bit.
    -127 - (bits.leading_zeros() as i32 - 9)
}

/// [`Error::InvalidArgument`] naming the first value of `values` that is not finite.
fn finite(format: &str, values: &[f32]) -> Result<()> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(Error::invalid(format!("{format} quantisation: value {i} is {}", values[i]))),
        None => Ok(()),
    }
}

/// Number of `block`-long tiles over `n`.
fn tiles(n: usize, block: usize) -> usize {
    n.div_ceil(block)
}

/// FP8 e4m3 weights `[rows, cols]` (row-major bytes) with one f32 `scale_inv` per
/// `block[0] × block[1]` tile (row-major `[ceil(rows / block[0]), ceil(cols / block[1])]`,
/// the last tiles partial) as values: `fp8_e4m3(w[r, c]) × scale_inv[r / block[0], c / block[1]]`,
/// one f32 product each.
///
/// # Errors
/// [`Error::Shape`] when the byte or scale counts do not match the shape, or a block side is 0.
pub fn fp8_block_dequantize(
    weight: &[u8],
    scale_inv: &[f32],
    [rows, cols]: [usize; 2],
    block: [usize; 2],
) -> Result<Vec<f32>> {
    check_fp8(weight.len(), scale_inv.len(), [rows, cols], block)?;
    let per_row = tiles(cols, block[1]);
    Ok(weight
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let (r, c) = (i / cols, i % cols);
            fp8_e4m3(b) * scale_inv[r / block[0] * per_row + c / block[1]]
        })
        .collect())
}

fn check_fp8(bytes: usize, scales: usize, [rows, cols]: [usize; 2], block: [usize; 2]) -> Result<()> {
    if block.contains(&0) {
        return Err(Error::shape("FP8 block", "two sides of at least 1", format!("{block:?}")));
    }
    if bytes != rows * cols {
        return Err(Error::shape("FP8 weight", format!("[{rows}, {cols}] bytes"), format!("{bytes} bytes")));
    }
    let want = tiles(rows, block[0]) * tiles(cols, block[1]);
    if scales != want {
        return Err(Error::shape(
            "FP8 weight_scale_inv",
            format!("{want} scales ({block:?} tiles over [{rows}, {cols}])"),
            format!("{scales} scales"),
        ));
    }
    Ok(())
}

/// Quantises `values` `[rows, cols]` to FP8 e4m3 with block scales (for synthetic layers):
/// per tile `scale_inv = amax / 448` (1 for an all-zero tile), each byte the nearest code of
/// `value / scale_inv`. Returns (weight bytes, scale_inv) in [`fp8_block_dequantize`]'s
/// layout.
///
/// # Errors
/// As [`fp8_block_dequantize`]; [`Error::InvalidArgument`] for a value that is not finite.
pub fn fp8_block_quantize(
    values: &[f32],
    [rows, cols]: [usize; 2],
    block: [usize; 2],
) -> Result<(Vec<u8>, Vec<f32>)> {
    let per_row = tiles(cols, block[1]);
    check_fp8(values.len(), tiles(rows, block[0]) * per_row, [rows, cols], block)?;
    finite("FP8", values)?;
    let mut amax = vec![0.0f32; tiles(rows, block[0]) * per_row];
    for (i, v) in values.iter().enumerate() {
        let t = i / cols / block[0] * per_row + i % cols / block[1];
        amax[t] = amax[t].max(v.abs());
    }
    let scale_inv: Vec<f32> = amax.iter().map(|&a| if a == 0.0 { 1.0 } else { a / FP8_E4M3_MAX }).collect();
    let weight = values
        .iter()
        .enumerate()
        .map(|(i, &v)| fp8_e4m3_from_f32(v / scale_inv[i / cols / block[0] * per_row + i % cols / block[1]]))
        .collect();
    Ok((weight, scale_inv))
}

/// A block's f16 scale (its first two bytes, little-endian) as f32.
fn block_scale(block: &[u8]) -> f32 {
    f16::from_le_bytes([block[0], block[1]]).to_f32()
}

/// Q8_0 blocks ([`Q8_0_BLOCK_BYTES`] each) as values: `q[j] × d`.
///
/// # Errors
/// [`Error::Shape`] when the bytes are not whole blocks.
pub fn q8_0_dequantize(blocks: &[u8]) -> Result<Vec<f32>> {
    let n = blocks_of("Q8_0 blocks", blocks.len(), Q8_0_BLOCK_BYTES)?;
    let mut out = Vec::with_capacity(n * BLOCK_VALUES);
    for block in blocks.chunks_exact(Q8_0_BLOCK_BYTES) {
        let d = block_scale(block);
        out.extend(block[2..].iter().map(|&q| f32::from(q as i8) * d));
    }
    Ok(out)
}

/// Quantises `values` to Q8_0 as ggml's `quantize_row_q8_0_ref` does: `d = amax / 127`,
/// `q = round(v / d)` (computed as `v × (1 / d)`, halves away from zero), `d` stored as f16.
///
/// # Errors
/// [`Error::Shape`] for a length that is not whole blocks; [`Error::InvalidArgument`] for a
/// value that is not finite.
pub fn q8_0_quantize(values: &[f32]) -> Result<Vec<u8>> {
    whole_blocks("Q8_0 values", values.len())?;
    finite("Q8_0", values)?;
    let mut out = Vec::with_capacity(values.len() / BLOCK_VALUES * Q8_0_BLOCK_BYTES);
    for block in values.chunks_exact(BLOCK_VALUES) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|&v| (v * id).round() as i8 as u8));
    }
    Ok(out)
}

/// Q4_0 blocks ([`Q4_0_BLOCK_BYTES`] each) as values: value `j` of a block is
/// `(low nibble of byte j − 8) × d`, value `j + 16` `(high nibble of byte j − 8) × d`.
///
/// # Errors
/// [`Error::Shape`] when the bytes are not whole blocks.
pub fn q4_0_dequantize(blocks: &[u8]) -> Result<Vec<f32>> {
    let n = blocks_of("Q4_0 blocks", blocks.len(), Q4_0_BLOCK_BYTES)?;
    let mut out = vec![0.0f32; n * BLOCK_VALUES];
    for (block, y) in blocks.chunks_exact(Q4_0_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)) {
        let d = block_scale(block);
        for (j, &byte) in block[2..].iter().enumerate() {
            y[j] = f32::from(i16::from(byte & 0xf) - 8) * d;
            y[j + 16] = f32::from(i16::from(byte >> 4) - 8) * d;
        }
    }
    Ok(out)
}

/// Quantises `values` to Q4_0 as ggml's `quantize_row_q4_0_ref` does: `d = max / -8` with
/// `max` the first value of largest magnitude, nibble `min(15, trunc(v × (1 / d) + 8.5))`,
/// `d` stored as f16.
///
/// # Errors
/// [`Error::Shape`] for a length that is not whole blocks; [`Error::InvalidArgument`] for a
/// value that is not finite.
pub fn q4_0_quantize(values: &[f32]) -> Result<Vec<u8>> {
    whole_blocks("Q4_0 values", values.len())?;
    finite("Q4_0", values)?;
    let mut out = Vec::with_capacity(values.len() / BLOCK_VALUES * Q4_0_BLOCK_BYTES);
    for block in values.chunks_exact(BLOCK_VALUES) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in block {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(f16::from_f32(d).to_le_bytes());
        let nibble = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        out.extend((0..16).map(|j| nibble(block[j]) | (nibble(block[j + 16]) << 4)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's MXFP4 blocks as its own decoder reads them (`dequantize_row_mxfp4`: the doubled
    /// table `kvalues_mxfp4` times `ggml_e8m0_to_fp32_half`) against [`mxfp4_from_ggml`] and
    /// [`mxfp4_dequantize`], bit for bit: every code in both nibbles under every scale byte
    /// but 255 (refused); and [`mxfp4_to_ggml`] inverts it.
    #[test]
    fn ggml_mxfp4_blocks_convert_to_the_values_ggml_reads() {
        const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];
        let half = |e: u8| f32::from_bits(if e < 2 { 0x0020_0000 << e } else { u32::from(e - 1) << 23 });
        for scale in 0..=254u8 {
            let blocks: Vec<u8> = (0..16u8)
                .flat_map(|b| [scale].into_iter().chain((0..16u8).map(move |j| (b * 16 + j).wrapping_mul(7))))
                .collect();
            let mut want = Vec::new();
            for block in blocks.chunks_exact(GGML_MXFP4_BLOCK_BYTES) {
                let d = half(block[0]);
                let lo = block[1..].iter().map(|q| f32::from(KVALUES[usize::from(q & 0xf)]) * d);
                let hi = block[1..].iter().map(|q| f32::from(KVALUES[usize::from(q >> 4)]) * d);
                want.extend(lo.collect::<Vec<_>>());
                want.extend(hi.collect::<Vec<_>>());
            }
            let (codes, scales) = mxfp4_from_ggml(&blocks).unwrap();
            let got = mxfp4_dequantize(&codes, &scales).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "scale {scale}");
            // Code 8 (+0 in ggml) became code 0, so writing back gives the same values.
            let again = mxfp4_to_ggml(&codes, &scales).unwrap();
            assert_eq!(mxfp4_from_ggml(&again).unwrap(), (codes, scales), "scale {scale}");
        }
        let err = mxfp4_from_ggml(&[[255u8; 1].as_slice(), &[0u8; 16]].concat()).unwrap_err().to_string();
        assert!(err.contains("255"), "{err}");
        assert!(mxfp4_from_ggml(&[0u8; 18]).is_err());
    }

    /// An FP8 e4m3 byte decoded in f64 from the format's definition, independently of
    /// [`fp8_e4m3`].
    fn e4m3_f64(b: u8) -> f64 {
        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = (((b >> 3) & 0xf) as i32, (b & 7) as f64);
        if e == 0 { s * m / 8.0 * 2f64.powi(-6) } else { s * (1.0 + m / 8.0) * 2f64.powi(e - 7) }
    }

    #[test]
    fn every_fp8_code_decodes_to_its_value_and_encodes_back() {
        for b in 0..=255u8 {
            let v = fp8_e4m3(b);
            if b & 0x7f == 0x7f {
                assert!(v.is_nan(), "{b:#x}");
                assert_eq!(fp8_e4m3_from_f32(v), 0x7f);
                continue;
            }
            assert_eq!(f64::from(v), e4m3_f64(b), "{b:#x}");
            assert_eq!(v.is_sign_negative(), b & 0x80 != 0, "{b:#x}: sign, zeros included");
            assert_eq!(fp8_e4m3_from_f32(v), b, "{b:#x} round trip");
        }
        assert_eq!(fp8_e4m3(0x7e), 448.0);
        assert_eq!(fp8_e4m3(0x01), 2f32.powi(-9), "smallest subnormal");
        assert_eq!(fp8_e4m3(0x08), 2f32.powi(-6), "smallest normal");
        // Ties go to the even code; past the largest value saturates.
        let mid = (fp8_e4m3(0x40) + fp8_e4m3(0x41)) / 2.0;
        assert_eq!(fp8_e4m3_from_f32(mid), 0x40);
        let mid = (fp8_e4m3(0x41) + fp8_e4m3(0x42)) / 2.0;
        assert_eq!(fp8_e4m3_from_f32(mid), 0x42);
        assert_eq!(fp8_e4m3_from_f32(1e9), 0x7e);
        assert_eq!(fp8_e4m3_from_f32(-1e9), 0xfe);
        assert_eq!(fp8_e4m3_from_f32(1e-9), 0x00);
    }

    #[test]
    fn e8m0_spans_two_to_the_minus_127_to_127_and_255_is_nan() {
        for b in 0..255u8 {
            assert_eq!(f64::from(e8m0(b)), 2f64.powi(i32::from(b) - 127), "{b}");
        }
        assert!(e8m0(0).is_subnormal());
        assert!(e8m0(255).is_nan());
    }

    #[test]
    fn mxfp4_takes_every_code_in_gpt_oss_nibble_order() {
        // Block 0: bytes (2j + 1) << 4 | 2j give codes 0..15 then 0..15 again, scale 2^1;
        // block 1: scale 2^-127 (subnormal), block 2: 2^127 (6 × 2^127 overflows), block 3:
        // the NaN scale.
        let block: Vec<u8> = (0..16u8).map(|j| (((2 * j + 1) % 16) << 4) | ((2 * j) % 16)).collect();
        let codes: Vec<u8> = block.iter().cycle().take(4 * 16).copied().collect();
        let y = mxfp4_dequantize(&codes, &[128, 0, 254, 255]).unwrap();
        for (i, v) in y.iter().enumerate() {
            let (b, code) = (i / 32, i % 16);
            let want = FP4_E2M1[code] as f64 * [2.0, 2f64.powi(-127), 2f64.powi(127), f64::NAN][b];
            if want.is_nan() {
                assert!(v.is_nan(), "value {i}");
            } else if want.abs() > f64::from(f32::MAX) {
                assert_eq!(*v, f32::INFINITY.copysign(want as f32), "value {i}");
            } else {
                assert_eq!(f64::from(*v), want, "value {i}");
                assert_eq!(v.is_sign_negative(), code >= 8, "value {i}: the sign of zero");
            }
        }
        let err = mxfp4_dequantize(&codes[..63], &[1, 2, 3, 4]).unwrap_err();
        assert!(err.to_string().contains("16 code bytes per scale"), "{err}");
    }

    #[test]
    fn mxfp4_quantisation_keeps_representable_values_and_bounds_the_rest() {
        // Exactly representable: every code at scale 2^-3, and a zero block.
        let exact: Vec<f32> = (0..32).map(|i| FP4_E2M1[i % 16] / 8.0).collect();
        let mut values = exact.clone();
        values.extend([0.0; 32]);
        let (codes, scales) = mxfp4_quantize(&values).unwrap();
        // amax 0.75: e = floor(log2 0.75) - 2 = -3, byte 124; the zero block 2^0.
        assert_eq!(scales, vec![124, 127]);
        let back = mxfp4_dequantize(&codes, &scales).unwrap();
        assert_eq!(crate::bits::canonical(&back[..32]), crate::bits::canonical(&exact));
        assert!(back[32..].iter().all(|v| *v == 0.0));
        // Arbitrary values: within half a step of the largest code's spacing (2^e).
        let values: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 31.5) * 0.013).collect();
        let (codes, scales) = mxfp4_quantize(&values).unwrap();
        let back = mxfp4_dequantize(&codes, &scales).unwrap();
        for (b, (v, w)) in values.chunks(32).zip(back.chunks(32)).enumerate() {
            let step = e8m0(scales[b]);
            for (x, y) in v.iter().zip(w) {
                assert!((x - y).abs() <= step, "{x} -> {y} (scale {step})");
            }
        }
        assert!(mxfp4_quantize(&[1.0; 31]).is_err());
        assert!(mxfp4_quantize(&[f32::NAN; 32]).unwrap_err().to_string().contains("value 0 is NaN"));
    }

    #[test]
    fn fp8_blocks_scale_their_own_tiles_and_partial_tiles() {
        // [3, 5] in tiles of [2, 2]: scales [2, 3] row-major.
        let scale_inv = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0];
        let weight = vec![0x38u8; 15]; // 1.0 each
        let y = fp8_block_dequantize(&weight, &scale_inv, [3, 5], [2, 2]).unwrap();
        let want = [1.0, 1.0, 2.0, 2.0, 4.0, 1.0, 1.0, 2.0, 2.0, 4.0, 8.0, 8.0, 16.0, 16.0, 32.0];
        assert_eq!(y, want);
        // A product that rounds: one f32 multiplication.
        let s = 0.1f32;
        let y = fp8_block_dequantize(&[0x3b], &[s], [1, 1], FP8_BLOCK).unwrap();
        assert_eq!(y[0].to_bits(), (1.375f32 * s).to_bits());
        // Quantisation round trip within half a code step of each tile's scale.
        let values: Vec<f32> = (0..15).map(|i| (i as f32 - 7.0) * 0.37).collect();
        let (w, s) = fp8_block_quantize(&values, [3, 5], [2, 2]).unwrap();
        let back = fp8_block_dequantize(&w, &s, [3, 5], [2, 2]).unwrap();
        for (x, y) in values.iter().zip(&back) {
            assert!((x - y).abs() <= x.abs() / 16.0 + 1e-6, "{x} -> {y}");
        }
        let err = fp8_block_dequantize(&weight, &scale_inv[..5], [3, 5], [2, 2]).unwrap_err();
        assert!(err.to_string().contains("weight_scale_inv"), "{err}");
        assert!(fp8_block_dequantize(&weight[..14], &scale_inv, [3, 5], [2, 2]).is_err());
        assert!(fp8_block_dequantize(&weight, &scale_inv, [3, 5], [0, 2]).is_err());
    }

    #[test]
    fn q8_0_follows_ggml_layout_and_rounding() {
        let mut values: Vec<f32> = (0..32).map(|i| i as f32 - 16.0).collect();
        values[31] = 127.0; // d = 1: every value exact
        let blocks = q8_0_quantize(&values).unwrap();
        assert_eq!(blocks.len(), 34);
        assert_eq!(f16::from_le_bytes([blocks[0], blocks[1]]).to_f32(), 1.0);
        assert_eq!(blocks[2] as i8, -16);
        assert_eq!(q8_0_dequantize(&blocks).unwrap(), values);
        // Halves round away from zero; a zero block has d = 0.
        let mut halves = vec![0.0f32; 32];
        halves[0] = 127.0;
        halves[1] = 2.5;
        halves[2] = -2.5;
        let q = q8_0_quantize(&halves).unwrap();
        assert_eq!((q[3] as i8, q[4] as i8), (3, -3));
        let zero = q8_0_quantize(&[0.0; 32]).unwrap();
        assert!(q8_0_dequantize(&zero).unwrap().iter().all(|v| *v == 0.0));
        assert!(q8_0_dequantize(&zero[..33]).unwrap_err().to_string().contains("34 bytes"));
    }

    #[test]
    fn q4_0_follows_ggml_layout_and_rounding() {
        // max = -8 (first of largest magnitude): d = 1, nibble = v + 8.
        let values: Vec<f32> = (0..32).map(|i| (i % 16) as f32 - 8.0).collect();
        let blocks = q4_0_quantize(&values).unwrap();
        assert_eq!(blocks.len(), 18);
        assert_eq!(f16::from_le_bytes([blocks[0], blocks[1]]).to_f32(), 1.0);
        // Byte j: value j low, value j + 16 high.
        assert_eq!(blocks[2 + 3], 3 | (3 << 4));
        assert_eq!(q4_0_dequantize(&blocks).unwrap(), values);
        // A positive maximum makes d negative; 15 is the largest nibble.
        let mut v = vec![0.0f32; 32];
        v[5] = 4.0;
        v[6] = -4.0;
        let q = q4_0_quantize(&v).unwrap();
        let d = f16::from_le_bytes([q[0], q[1]]).to_f32();
        assert_eq!(d, -0.5);
        let back = q4_0_dequantize(&q).unwrap();
        assert_eq!((back[5], back[6], back[0]), (4.0, -3.5, 0.0));
        assert!(q4_0_quantize(&[0.0; 33]).is_err());
    }
}
