//! Quantised expert weights on the device: the row layout `wgsl/gemm/quant.wgsl` reads, and
//! the words of weight rows, quantised from f32 with [`crate::quant`]'s quantisers.
//!
//! A weight row (one output column of one expert, K values along the input) holds
//! `groups = ceil(K / G)` groups of `G` values: first the groups' header words in order, zero
//! words up to a multiple of four, then the groups' code words in order (block `b` of the row,
//! values `32b .. 32b + 31`, at code word `b * B`). Rows are whole 16-byte units, so the
//! row-wise kernel reads a block's code words as one or two `vec4<u32>` loads.
//!
//! | format | G | header | codes per group | B | bits per value |
//! |---|---|---|---|---|---|
//! | Q8_0 | 64 | the two blocks' f16 `d`, block 0 in the low half | 16 words: 64 × i8 | 8 | 8.5 (as GGUF) |
//! | Q4_0 | 64 | the two blocks' f16 `d` | 8 words: two blocks of 16 bytes in ggml's nibble order | 4 | 4.5 (as GGUF) |
//! | MXFP4 | 128 | the four blocks' E8M0 bytes, block 0 in the low byte | 16 words: four blocks of 16 bytes, gpt-oss nibble order | 4 | 4.25 (as gpt-oss) |
//! | FP8 e4m3 | 128 | the group's f32 `scale_inv` | 32 words: 128 bytes | 8 | 8.25 |
//!
//! (Bits per value as listed where `groups` is a multiple of four; else up to three padding
//! words more per row.) Bytes are little-endian within words, so a block's code bytes are the
//! checkpoint's bytes in order. Values past K (the last group of a row whose K is not a
//! multiple of `G`) are zero codes; blocks wholly past K have a zero scale in their header.
//!
//! Rows quantised here use ggml's and the OCP spec's rules per block of 32 along K (padded with
//! zeros to a whole block), and FP8 one `scale_inv` per group of 128 along K (a `[1, 128]`
//! tile: a checkpoint's `[128, 128]` tiles give each of their rows the tile's scale).

use super::dtype::WeightDtype;
use crate::error::{Error, Result};
use crate::quant;
use crate::size;

/// Values per 32-value block (Q8_0, Q4_0, MXFP4).
const BLOCK: usize = quant::BLOCK_VALUES;

/// The E8M0 scale bytes under which every MXFP4 value is one exact product of normal f32
/// numbers, twice the code's magnitude (0 ..= 12) times 2^(s - 128): from 2 (the smallest
/// product 2^-126) to 252 (the largest 12 x 2^124 = 1.5 x 2^127). [`quant::mxfp4_quantize`]
/// gives such a scale to every block whose largest magnitude is 2^-123 or more, and to
/// all-zero blocks (2^0).
pub(crate) const MXFP4_NARROW_SCALES: std::ops::RangeInclusive<u8> = 2..=252;

/// Whether every scale byte of the blocks below K in these whole MXFP4 rows of `k` values
/// (device words, [`row_words`] per row) is in [`MXFP4_NARROW_SCALES`]; the zero scales of
/// blocks wholly past K are not read by any kernel and do not count.
pub(crate) fn mxfp4_narrow_scales(k: u64, words: &[u32]) -> bool {
    let row = WeightDtype::Mxfp4.row_words(k) as usize;
    let blocks = k.div_ceil(BLOCK as u64) as usize;
    words
        .chunks_exact(row.max(1))
        .all(|r| (0..blocks).all(|b| MXFP4_NARROW_SCALES.contains(&r[b / 4].to_le_bytes()[b % 4])))
}

/// Whether an upload is MXFP4 with every block scale narrow, over its device words as they
/// are made (whole rows of `k` values).
pub(crate) struct NarrowScales {
    k: u64,
    mxfp4: bool,
    all: bool,
}

impl NarrowScales {
    pub(crate) fn new(dtype: WeightDtype, k: u32) -> Self {
        NarrowScales { k: u64::from(k), mxfp4: dtype == WeightDtype::Mxfp4, all: true }
    }

    /// MXFP4 weights whose every scale seen is narrow (false for other dtypes).
    pub(crate) fn hold(&self) -> bool {
        self.mxfp4 && self.all
    }

    /// Takes whole rows of device words.
    pub(crate) fn see(&mut self, words: &[u32]) {
        if self.mxfp4 && self.all {
            self.all = mxfp4_narrow_scales(self.k, words);
        }
    }

    /// Takes whole rows of device words as little-endian bytes.
    pub(crate) fn see_bytes(&mut self, bytes: &[u8]) {
        if self.mxfp4 && self.all {
            let words: Vec<u32> =
                bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            self.see(&words);
        }
    }
}

/// Rows of `k` values (`values.len() / k` of them) quantised to `dtype`: the device words
/// ([`row_words`] per row) and the values the shader reads from them (exactly what
/// [`crate::quant`]'s decoders give for the quantised blocks).
///
/// # Errors
/// [`Error::InvalidArgument`] for a float `dtype`, `k == 0`, a length that is not whole rows,
/// or a value that is not finite (the quantisers have no code for it).
pub(crate) fn quantise_rows(dtype: WeightDtype, values: &[f32], k: usize) -> Result<(Vec<u32>, Vec<f32>)> {
    let Some((group_values, group_words)) = dtype.group() else {
        return Err(not_quantised(dtype));
    };
    if k == 0 || !values.len().is_multiple_of(k) {
        return Err(Error::invalid(format!(
            "{} values are not whole rows of {k} for {dtype:?} quantisation",
            values.len()
        )));
    }
    let rows = values.len() / k;
    let row_len = dtype.row_words(k as u64) as usize;
    let mut out = Vec::with_capacity(rows * row_len);
    let mut seen = Vec::with_capacity(values.len());
    let padded = k.next_multiple_of(BLOCK);
    let mut row_buf = vec![0.0f32; padded];
    let mut words = RowWords::default();
    for row in values.chunks_exact(k) {
        row_buf[..k].copy_from_slice(row);
        match dtype {
            WeightDtype::Q8_0 => {
                let blocks = quant::q8_0_quantize(&row_buf)?;
                seen.extend_from_slice(&quant::q8_0_dequantize(&blocks)?[..k]);
                encode_ggml(&blocks, quant::Q8_0_BLOCK_BYTES, &mut words);
            }
            WeightDtype::Q4_0 => {
                let blocks = quant::q4_0_quantize(&row_buf)?;
                seen.extend_from_slice(&quant::q4_0_dequantize(&blocks)?[..k]);
                encode_ggml(&blocks, quant::Q4_0_BLOCK_BYTES, &mut words);
            }
            WeightDtype::Mxfp4 => {
                let (codes, scales) = quant::mxfp4_quantize(&row_buf)?;
                seen.extend_from_slice(&quant::mxfp4_dequantize(&codes, &scales)?[..k]);
                encode_mxfp4(&codes, &scales, &mut words);
            }
            WeightDtype::Fp8 => {
                let (bytes, scales) = quant::fp8_block_quantize(row, [1, k], [1, 128])?;
                seen.extend(quant::fp8_block_dequantize(&bytes, &scales, [1, k], [1, 128])?);
                encode_fp8(&bytes, &scales, &mut words);
            }
            WeightDtype::F32 | WeightDtype::F16 | WeightDtype::Bf16 => return Err(not_quantised(dtype)),
        }
        // Every encoder writes whole groups of this format.
        debug_assert_eq!(words.heads.len(), k.div_ceil(group_values));
        debug_assert_eq!(words.codes.len(), k.div_ceil(group_values) * (group_words - 1));
        words.finish(&mut out);
        debug_assert_eq!(out.len() % row_len, 0);
    }
    Ok((out, seen))
}

fn not_quantised(dtype: WeightDtype) -> Error {
    Error::invalid(format!("{dtype:?} is not a quantised weight format"))
}

/// One weight row as it is written: its groups' header words and code words, appended to the
/// device words in the row layout (module docs) by [`RowWords::finish`].
#[derive(Default)]
struct RowWords {
    heads: Vec<u32>,
    codes: Vec<u32>,
}

impl RowWords {
    /// A group: its header word and its code `bytes` as little-endian u32 words, zero-padded
    /// to `words` words.
    fn group(&mut self, head: u32, bytes: &[u8], words: usize) {
        let mut padded = [0u8; 128];
        padded[..bytes.len()].copy_from_slice(bytes);
        self.heads.push(head);
        self.codes.extend(
            padded[..words * 4].chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        );
    }

    /// Appends the row to `out` (headers, zero words to a multiple of four, codes) and empties
    /// it for the next.
    fn finish(&mut self, out: &mut Vec<u32>) {
        out.extend_from_slice(&self.heads);
        out.resize(out.len() + self.heads.len().next_multiple_of(4) - self.heads.len(), 0);
        out.extend_from_slice(&self.codes);
        self.heads.clear();
        self.codes.clear();
    }
}

/// A row of ggml Q8_0 or Q4_0 blocks (`block_bytes` each: f16 `d`, then codes) as groups of
/// two blocks: the two `d` in a header word, and both blocks' codes.
fn encode_ggml(blocks: &[u8], block_bytes: usize, out: &mut RowWords) {
    let code_bytes = block_bytes - 2;
    for pair in blocks.chunks(2 * block_bytes) {
        let d = |b: usize| {
            pair.get(b * block_bytes..b * block_bytes + 2).map_or(0, |s| u16::from_le_bytes([s[0], s[1]]))
        };
        let mut codes = Vec::with_capacity(2 * code_bytes);
        for block in pair.chunks(block_bytes) {
            codes.extend_from_slice(&block[2..]);
        }
        out.group(u32::from(d(0)) | (u32::from(d(1)) << 16), &codes, 2 * code_bytes / 4);
    }
}

/// A row of MXFP4 blocks (16 code bytes and one E8M0 byte each) as groups of four blocks.
fn encode_mxfp4(codes: &[u8], scales: &[u8], out: &mut RowWords) {
    for (group_codes, group_scales) in codes.chunks(4 * quant::MXFP4_BLOCK_BYTES).zip(scales.chunks(4)) {
        let mut head = [0u8; 4];
        head[..group_scales.len()].copy_from_slice(group_scales);
        out.group(u32::from_le_bytes(head), group_codes, 16);
    }
}

/// A row of FP8 bytes with one `scale_inv` per 128 values as groups of 128.
fn encode_fp8(bytes: &[u8], scales: &[f32], out: &mut RowWords) {
    for (group_bytes, scale) in bytes.chunks(128).zip(scales) {
        out.group(scale.to_bits(), group_bytes, 32);
    }
}

/// Expert weights `[experts, n, k]` as a checkpoint stores them quantised: the bytes and
/// scales as [`crate::quant`]'s decoders take them, rows (output columns) in order, each row's
/// blocks along K.
#[derive(Clone, Copy, Debug)]
pub enum QuantisedValues<'a> {
    /// ggml Q8_0 blocks ([`quant::Q8_0_BLOCK_BYTES`] each), `k / 32` per row.
    Q8_0(&'a [u8]),
    /// ggml Q4_0 blocks ([`quant::Q4_0_BLOCK_BYTES`] each), `k / 32` per row.
    Q4_0(&'a [u8]),
    /// MXFP4 as gpt-oss stores it: `codes` `[.., k / 32, 16]` and E8M0 `scales` `[.., k / 32]`.
    Mxfp4 {
        /// 16 code bytes per block.
        codes: &'a [u8],
        /// One E8M0 byte per block.
        scales: &'a [u8],
    },
    /// FP8 e4m3 bytes `[experts, n, k]` with one f32 `scale_inv` per `block` tile of each
    /// expert's `[n, k]` matrix (`[experts, ceil(n / block[0]), ceil(k / block[1])]`; the last
    /// tiles partial), as DeepSeek-V3's `weight_scale_inv` with `block` its
    /// `weight_block_size`. A tile must span whole groups of 128 along K: `block[1]` a multiple
    /// of 128, or at least `k` (one scale per row band).
    Fp8 {
        /// One e4m3 byte per value.
        weight: &'a [u8],
        /// One scale per tile.
        scale_inv: &'a [f32],
        /// The tile, `[rows, columns]`.
        block: [usize; 2],
    },
}

impl QuantisedValues<'_> {
    /// The device dtype of these values.
    pub fn dtype(&self) -> WeightDtype {
        match self {
            QuantisedValues::Q8_0(_) => WeightDtype::Q8_0,
            QuantisedValues::Q4_0(_) => WeightDtype::Q4_0,
            QuantisedValues::Mxfp4 { .. } => WeightDtype::Mxfp4,
            QuantisedValues::Fp8 { .. } => WeightDtype::Fp8,
        }
    }

    /// The values they stand for, `[experts, n, k]` row-major, by [`crate::quant`]'s exact
    /// decoders: what the kernels read.
    ///
    /// # Errors
    /// [`Error::Shape`] when a length does not match the shape; [`Error::InvalidArgument`] for
    /// Q8_0, Q4_0 or MXFP4 with K not a multiple of 32, or FP8 tiles that split a group of 128
    /// along K.
    pub fn dequantise(&self, [experts, n, k]: [usize; 3]) -> Result<Vec<f32>> {
        self.check([experts, n, k])?;
        match *self {
            QuantisedValues::Q8_0(blocks) => quant::q8_0_dequantize(blocks),
            QuantisedValues::Q4_0(blocks) => quant::q4_0_dequantize(blocks),
            QuantisedValues::Mxfp4 { codes, scales } => quant::mxfp4_dequantize(codes, scales),
            QuantisedValues::Fp8 { weight, scale_inv, block } => {
                let per = n * k;
                let tiles = n.div_ceil(block[0]) * k.div_ceil(block[1]);
                let mut out = Vec::with_capacity(weight.len());
                for e in 0..experts {
                    out.extend(quant::fp8_block_dequantize(
                        &weight[e * per..(e + 1) * per],
                        &scale_inv[e * tiles..(e + 1) * tiles],
                        [n, k],
                        block,
                    )?);
                }
                Ok(out)
            }
        }
    }

    /// Checks the lengths against `[experts, n, k]`.
    pub(crate) fn check(&self, [experts, n, k]: [usize; 3]) -> Result<()> {
        let what = format!("{:?} expert weights [{experts}, {n}, {k}]", self.dtype());
        let rows = size::host_product(&what, &[experts, n])?;
        let need = |what: &str, want: usize, got: usize| -> Result<()> {
            if want != got {
                return Err(Error::shape(
                    format!("{what} of {:?} expert weights [{experts}, {n}, {k}]", self.dtype()),
                    want,
                    got,
                ));
            }
            Ok(())
        };
        if !matches!(self, QuantisedValues::Fp8 { .. }) && !k.is_multiple_of(BLOCK) {
            return Err(Error::invalid(format!(
                "{:?} expert weights need K a multiple of {BLOCK} (blocks run along K); K is {k}",
                self.dtype()
            )));
        }
        let blocks = size::host_product(&what, &[rows, k / BLOCK])?;
        let bytes = |per_block| size::host_product(&what, &[blocks, per_block]);
        match *self {
            QuantisedValues::Q8_0(b) => need("Q8_0 bytes", bytes(quant::Q8_0_BLOCK_BYTES)?, b.len()),
            QuantisedValues::Q4_0(b) => need("Q4_0 bytes", bytes(quant::Q4_0_BLOCK_BYTES)?, b.len()),
            QuantisedValues::Mxfp4 { codes, scales } => {
                need("MXFP4 code bytes", bytes(quant::MXFP4_BLOCK_BYTES)?, codes.len())?;
                need("MXFP4 scales", blocks, scales.len())
            }
            QuantisedValues::Fp8 { weight, scale_inv, block } => {
                if block.contains(&0) || !(block[1].is_multiple_of(128) || block[1] >= k) {
                    return Err(Error::invalid(format!(
                        "FP8 scale tiles {block:?} must span whole groups of 128 along K \
                         (columns a multiple of 128, or at least K = {k})"
                    )));
                }
                need("FP8 bytes", size::host_product(&what, &[rows, k])?, weight.len())?;
                let tiles =
                    size::host_product(&what, &[experts, n.div_ceil(block[0]), k.div_ceil(block[1])])?;
                need("FP8 scales", tiles, scale_inv.len())
            }
        }
    }

    /// The device words of `[experts, n, k]` rows in the row layout (module docs).
    ///
    /// # Errors
    /// [`Error::Shape`] when a length does not match the shape; [`Error::InvalidArgument`] for
    /// Q8_0, Q4_0 or MXFP4 with K not a multiple of 32, or FP8 tiles that split a group.
    pub(crate) fn device_words(&self, [experts, n, k]: [usize; 3]) -> Result<Vec<u32>> {
        self.check([experts, n, k])?;
        let rows = experts * n;
        let nb = k / BLOCK;
        let mut out = Vec::with_capacity(rows * self.dtype().row_words(k as u64) as usize);
        let mut words = RowWords::default();
        for r in 0..rows {
            match *self {
                QuantisedValues::Q8_0(b) => {
                    let bb = quant::Q8_0_BLOCK_BYTES;
                    encode_ggml(&b[r * nb * bb..(r + 1) * nb * bb], bb, &mut words);
                }
                QuantisedValues::Q4_0(b) => {
                    let bb = quant::Q4_0_BLOCK_BYTES;
                    encode_ggml(&b[r * nb * bb..(r + 1) * nb * bb], bb, &mut words);
                }
                QuantisedValues::Mxfp4 { codes, scales } => {
                    let cb = quant::MXFP4_BLOCK_BYTES;
                    encode_mxfp4(
                        &codes[r * nb * cb..(r + 1) * nb * cb],
                        &scales[r * nb..(r + 1) * nb],
                        &mut words,
                    );
                }
                QuantisedValues::Fp8 { weight, scale_inv, block } => {
                    let (e, row) = (r / n, r % n);
                    let per_row = k.div_ceil(block[1]);
                    let tile0 = (e * n.div_ceil(block[0]) + row / block[0]) * per_row;
                    let scales: Vec<f32> =
                        (0..k.div_ceil(128)).map(|g| scale_inv[tile0 + g * 128 / block[1]]).collect();
                    encode_fp8(&weight[r * k..(r + 1) * k], &scales, &mut words);
                }
            }
            words.finish(&mut out);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le_words(bytes: &[u8]) -> Vec<u32> {
        bytes.chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    /// Narrow MXFP4 scales: 2 and 252 are in, 0, 1, 253 and 255 out, in either group of a row;
    /// the zero scale of a block wholly past K does not count.
    #[test]
    fn mxfp4_narrow_scales_are_2_to_252_below_k() {
        // K = 160: blocks 0 .. 3 in the first group, block 4 in the second; two rows.
        let codes = vec![0x21u8; 2 * 5 * quant::MXFP4_BLOCK_BYTES];
        let rows = |scales: &[u8]| {
            QuantisedValues::Mxfp4 { codes: &codes, scales }.device_words([1, 2, 160]).expect("words")
        };
        assert!(mxfp4_narrow_scales(160, &rows(&[2, 252, 127, 100, 3, 127, 127, 127, 127, 2])));
        for bad in [0u8, 1, 253, 255] {
            for at in [0, 3, 4, 9] {
                let mut scales = [127u8; 10];
                scales[at] = bad;
                assert!(!mxfp4_narrow_scales(160, &rows(&scales)), "scale {bad} at block {at}");
            }
        }
        // K = 70: block 3 of each row is wholly past K, under a zero scale.
        let (words, _) = quantise_rows(WeightDtype::Mxfp4, &[1.0; 140], 70).expect("quantise");
        assert_eq!(words[0] >> 24, 0);
        assert!(mxfp4_narrow_scales(70, &words));
    }

    /// Two Q4_0 rows of K = 70 (two groups of 64, the second holding 6 values): each row is
    /// the two header words, two zero words, then blocks 0 .. 3's codes at code words 4b
    /// (block 3, wholly past K, zero codes under a zero `d`): 20 words, whole vec4s.
    #[test]
    fn q4_0_rows_hold_their_headers_then_their_codes() {
        let k = 70;
        let values: Vec<f32> = (0..2 * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 16.0).collect();
        let (words, _) = quantise_rows(WeightDtype::Q4_0, &values, k).unwrap();
        assert_eq!(WeightDtype::Q4_0.row_words(k as u64), 20);
        assert_eq!(words.len(), 40);
        for (row, got) in values.chunks_exact(k).zip(words.chunks_exact(20)) {
            let mut padded = row.to_vec();
            padded.resize(96, 0.0);
            let blocks = quant::q4_0_quantize(&padded).unwrap();
            let bb = quant::Q4_0_BLOCK_BYTES;
            let d = |b: usize| {
                blocks.get(b * bb..b * bb + 2).map_or(0, |s| u32::from(u16::from_le_bytes([s[0], s[1]])))
            };
            assert_eq!(got[..4], [d(0) | d(1) << 16, d(2), 0, 0]);
            for b in 0..3 {
                assert_eq!(
                    got[4 + 4 * b..8 + 4 * b],
                    le_words(&blocks[b * bb + 2..(b + 1) * bb]),
                    "block {b}"
                );
            }
            assert_eq!(got[16..], [0; 4]);
        }
    }

    /// An FP8 row of K = 300 (three groups of 128): three scale words, one zero word, then the
    /// bytes as 96 code words (8 per block), the last group's past K zero: 100 words.
    #[test]
    fn fp8_rows_hold_their_scales_then_their_bytes() {
        let k = 300;
        let values: Vec<f32> = (0..k).map(|i| (i as f32 - 150.0) * 0.75).collect();
        let (words, _) = quantise_rows(WeightDtype::Fp8, &values, k).unwrap();
        assert_eq!(WeightDtype::Fp8.row_words(k as u64), 100);
        let (bytes, scales) = quant::fp8_block_quantize(&values, [1, k], [1, 128]).unwrap();
        let heads: Vec<u32> = scales.iter().map(|s| s.to_bits()).collect();
        assert_eq!(words[..3], heads[..]);
        assert_eq!(words[3], 0);
        let mut codes = bytes.clone();
        codes.resize(384, 0);
        assert_eq!(words[4..], le_words(&codes)[..]);
    }

    #[test]
    fn every_row_is_whole_vec4s() {
        for dtype in [WeightDtype::Q8_0, WeightDtype::Q4_0, WeightDtype::Mxfp4, WeightDtype::Fp8] {
            for k in [1u64, 31, 32, 64, 65, 200, 256, 511, 2880] {
                assert_eq!(dtype.row_words(k) % 4, 0, "{dtype:?} K = {k}");
            }
        }
        // No padding where the group count is a multiple of four.
        assert_eq!(WeightDtype::Q4_0.row_words(2048), 32 * 9);
        assert_eq!(WeightDtype::Mxfp4.row_words(2048), 16 * 17);
        // gpt-oss's K = 2880 in MXFP4: 23 groups, one padding word.
        assert_eq!(WeightDtype::Mxfp4.row_words(2880), 23 * 17 + 1);
    }
}
