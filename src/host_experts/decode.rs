//! Stored expert values decoded to f32 tiles for the kernels: four columns' groups of four
//! side by side (the strict order's [`quads`]) or transposed, `[k][r]` (the fast order's
//! [`transposed`]); or handed to the rows kernels as they lie where those read them
//! ([`row_block`], [`in_place`]). Every value is decoded as [`crate::quant`] decodes it (one
//! table lookup, or one f32 product of exact operands), so it has the bits of
//! [`WeightDtype::round`]'s and [`QuantisedValues::dequantise`]'s; a projection's row `n` is
//! its stored row `map.at(n)` (gpt-oss's fused gate/up rows).

use std::ops::Range;
use std::sync::LazyLock;

use half::f16;
use multiversion::multiversion;

#[cfg(target_arch = "x86_64")]
use super::decode_x86;
use super::projection::{RowMap, Values};
use super::tile::GGML_MXFP4_BLOCK_BYTES;
use super::tile::{COLS, Lanes, PAD, Quads, R, ROW_COLS, RowBlock, Rows};
use crate::kernels::gemm::{QuantisedValues, StoredValues, WeightDtype};
use crate::quant::{self, BLOCK_VALUES, MXFP4_BLOCK_BYTES, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// Every FP8 e4m3 byte as its value ([`quant::fp8_e4m3`]).
static FP8: LazyLock<[f32; 256]> = LazyLock::new(|| std::array::from_fn(|b| quant::fp8_e4m3(b as u8)));

/// Rows `rows` (at most [`COLS`]; row `n` stored row `map.at(n)`) and columns `ks` of one
/// expert's `[n, k]` values `v` into the strict order's `tile` (`tile[g][r / 4][r % 4 * 4 + j]` = value `(rows.start + r,
/// ks.start + 4g + j)`), zeros past `ks` in the last group and in the columns past `rows`;
/// `tile` holds `ks.len().div_ceil(4)` groups and `scratch` four rows of at least that many
/// groups. Four rows at a time: decoded into `scratch` (f32 rows read in place), then
/// interleaved group by group, one whole vector of the tile per group. For block formats
/// `ks.start` is a multiple of 32 (and of 128 for FP8 tiles of 128 columns) and `ks.end` a
/// multiple of 32 or K. The values were checked against `[n, k]`.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma+f16c", "x86_64+avx2+fma+f16c", "aarch64+neon"))]
pub(super) fn quads(
    v: &Values<'_>,
    map: RowMap,
    k: usize,
    rows: Range<usize>,
    ks: Range<usize>,
    tile: &mut [Quads],
    scratch: &mut [f32],
) {
    let (len, padded) = (ks.len(), tile.len() * 4);
    let (scratch, _) = scratch.as_chunks_mut::<4>();
    let width = scratch.len() / 4;
    for (q, first) in (0..COLS).step_by(4).enumerate() {
        let mut in_place: [Option<&[f32]>; 4] = [None; 4];
        for (i, (place, rows_scratch)) in in_place.iter_mut().zip(scratch.chunks_exact_mut(width)).enumerate()
        {
            let values = rows_scratch.as_flattened_mut();
            let n = rows.start + first + i;
            let stored = map.at(n);
            if n >= rows.end {
                values[..padded].fill(0.0);
            } else if let Some(values) = stored_f32s(v, k, stored, &ks).filter(|_| len == padded) {
                prefetch_next(bytemuck::cast_slice(values));
                *place = Some(values);
            } else {
                row(v, k, stored, &ks, &mut values[..len]);
                values[len..padded].fill(0.0);
            }
        }
        let mut src = scratch.chunks_exact(width).zip(in_place).map(|(own, stored)| match stored {
            Some(stored) => stored.as_chunks::<4>().0,
            None => own,
        });
        let (Some(s0), Some(s1), Some(s2), Some(s3)) = (src.next(), src.next(), src.next(), src.next())
        else {
            return;
        };
        for ((((group, w0), w1), w2), w3) in tile.iter_mut().zip(s0).zip(s1).zip(s2).zip(s3) {
            let quad = &mut group[q];
            quad[..4].copy_from_slice(w0);
            quad[4..8].copy_from_slice(w1);
            quad[8..12].copy_from_slice(w2);
            quad[12..].copy_from_slice(w3);
        }
    }
}

/// Whether [`row_block`] reads `rows` rows (at most [`ROW_COLS`]) of `v` where they lie for any
/// chunk of K that ends at K ([`ROW_COLS`] rows of Q8_0, Q4_0 or MXFP4 blocks, of f16 values
/// with K a multiple of [`PAD`], or of f32 values aligned with K a multiple of [`PAD`]), so
/// that one chunk can be all of K; else it decodes them into its scratch, a chunk at a time
/// (chunks its scratch holds).
pub(super) fn in_place(v: &Values<'_>, k: usize, rows: usize) -> bool {
    let Values::Stored(v) = v else {
        // ggml's MXFP4 blocks.
        return rows == ROW_COLS;
    };
    match *v {
        StoredValues::Quantised(
            QuantisedValues::Q8_0(_) | QuantisedValues::Q4_0(_) | QuantisedValues::Mxfp4 { .. },
        ) => rows == ROW_COLS,
        StoredValues::Float { dtype: WeightDtype::F16, .. } => rows == ROW_COLS && k.is_multiple_of(PAD),
        StoredValues::Float { dtype: WeightDtype::F32, bytes } => {
            rows == ROW_COLS && k.is_multiple_of(PAD) && bytemuck::try_cast_slice::<u8, f32>(bytes).is_ok()
        }
        _ => false,
    }
}

/// Rows `rows` (at most [`ROW_COLS`]; row `n` stored row `map.at(n)`) and columns `ks` of one
/// expert's `[n, k]` values `v` for a [`super::kernel::RowsKernel`]: Q8_0, Q4_0 and MXFP4
/// blocks and f16 values (whole steps) as they lie, where all [`ROW_COLS`] rows exist; else
/// f32 values, row `r` being row `rows.start + r`'s values of `ks`, zeros
/// after them up to a multiple of [`PAD`] values and in rows past `rows`; f32 rows read as
/// they lie where they are aligned and whole, others decoded into `scratch` (at least
/// [`ROW_COLS`] rows of `ks.len()` rounded up to [`PAD`]). Block formats as [`quads`]. Rows
/// read where they lie over all of K name the stored rows the next block reads
/// ([`Rows::next`]).
pub(super) fn row_block<'a>(
    v: &Values<'a>,
    map: RowMap,
    k: usize,
    rows: Range<usize>,
    ks: Range<usize>,
    scratch: &'a mut [f32],
) -> Rows<'a> {
    // Rows read where they lie over all of K: the next block's rows lie ROW_COLS rows on.
    let next = (ks.len() == k).then(|| map.at(rows.start + ROW_COLS) - map.at(rows.start));
    let whole = |block: RowBlock<'a>| Rows { block, next };
    let bytes = |stored: &'a [u8], size: usize| -> [&'a [u8]; ROW_COLS] {
        std::array::from_fn(|r| {
            let b = block_range(k, map.at(rows.start + r), &ks);
            &stored[b.start * size..b.end * size]
        })
    };
    if let (Values::GgmlMxfp4(stored), ROW_COLS) = (v, rows.len()) {
        return whole(RowBlock::GgmlMxfp4(bytes(stored, GGML_MXFP4_BLOCK_BYTES)));
    }
    if let (Values::Stored(StoredValues::Quantised(q)), ROW_COLS) = (v, rows.len()) {
        match *q {
            QuantisedValues::Q8_0(stored) => return whole(RowBlock::Q8_0(bytes(stored, Q8_0_BLOCK_BYTES))),
            QuantisedValues::Q4_0(stored) => return whole(RowBlock::Q4_0(bytes(stored, Q4_0_BLOCK_BYTES))),
            QuantisedValues::Mxfp4 { codes, scales } => {
                return whole(RowBlock::Mxfp4 {
                    codes: bytes(codes, MXFP4_BLOCK_BYTES),
                    scales: bytes(scales, 1),
                });
            }
            QuantisedValues::Fp8 { .. } => {}
        }
    }
    if let (Values::Stored(StoredValues::Float { dtype: WeightDtype::F16, bytes }), ROW_COLS) =
        (v, rows.len())
        && ks.len().is_multiple_of(PAD)
    {
        let block = RowBlock::F16(std::array::from_fn(|r| {
            let n = map.at(rows.start + r);
            &bytes[(n * k + ks.start) * 2..(n * k + ks.end) * 2]
        }));
        return whole(block);
    }
    let padded = ks.len().next_multiple_of(PAD);
    let mut out: [&[f32]; ROW_COLS] = [&[]; ROW_COLS];
    let mut own = scratch.chunks_exact_mut(padded);
    let mut in_place = true;
    for (c, slot) in out.iter_mut().enumerate() {
        let n = rows.start + c;
        let stored = if n < rows.end { stored_f32s(v, k, map.at(n), &ks) } else { None };
        if let Some(stored) = stored.filter(|s| s.len() == padded) {
            *slot = stored;
            continue;
        }
        in_place = false;
        // The caller's chunk fits the scratch where rows are decoded (`in_place`).
        let Some(own) = own.next() else { break };
        if n < rows.end {
            row(v, k, map.at(n), &ks, &mut own[..ks.len()]);
            own[ks.len()..].fill(0.0);
        } else {
            own.fill(0.0);
        }
        *slot = own;
    }
    Rows { block: RowBlock::F32(out), next: next.filter(|_| in_place) }
}

/// Row `n`, columns `ks`, of f32 values `v` as they lie, where their bytes are aligned for f32;
/// None for other dtypes (the caller decodes them).
#[inline(always)]
fn stored_f32s<'v>(v: &Values<'v>, k: usize, n: usize, ks: &Range<usize>) -> Option<&'v [f32]> {
    let Values::Stored(StoredValues::Float { dtype: WeightDtype::F32, bytes }) = *v else {
        return None;
    };
    bytemuck::try_cast_slice(&bytes[(n * k + ks.start) * 4..(n * k + ks.end) * 4]).ok()
}

/// As [`quads`], transposed into `tile[kk][r]` for at most [`R`] rows (zeros in the lanes past
/// `rows` and in the tile's rows past `ks`); `scratch` holds at least `ks.len()` values.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma+f16c", "x86_64+avx2+fma+f16c", "aarch64+neon"))]
pub(super) fn transposed(
    v: &Values<'_>,
    map: RowMap,
    k: usize,
    rows: Range<usize>,
    ks: Range<usize>,
    tile: &mut [Lanes],
    scratch: &mut [f32],
) {
    let live = rows.len();
    let values = &mut scratch[..ks.len()];
    for (r, n) in rows.enumerate() {
        row(v, k, map.at(n), &ks, values);
        for (lanes, &value) in tile.iter_mut().zip(values.iter()) {
            lanes[r] = value;
        }
    }
    for lanes in tile.iter_mut() {
        lanes[live..].fill(0.0);
    }
    for lanes in &mut tile[ks.len()..] {
        *lanes = [0.0; R];
    }
}

/// Row `n`, columns `ks`, of `v` into `out` (`ks.len()` values); inlined into its callers,
/// each compiled per SIMD target (the block formats' and halves' loops are functions of their
/// own per target). The row's next chunk of K, which lies right after this one, is
/// prefetched ([`prefetch_next`]).
#[inline(always)]
fn row(v: &Values<'_>, k: usize, n: usize, ks: &Range<usize>, out: &mut [f32]) {
    let at = n * k + ks.start..n * k + ks.end;
    let v = match *v {
        Values::Stored(v) => v,
        Values::GgmlMxfp4(blocks) => {
            let b = block_range(k, n, ks);
            let chunk = &blocks[b.start * GGML_MXFP4_BLOCK_BYTES..b.end * GGML_MXFP4_BLOCK_BYTES];
            prefetch_next(chunk);
            return ggml_mxfp4(chunk, out);
        }
    };
    match v {
        StoredValues::Float { dtype: WeightDtype::F16, bytes } => {
            let chunk = &bytes[at.start * 2..at.end * 2];
            prefetch_next(chunk);
            f16s(chunk, out)
        }
        StoredValues::Float { dtype: WeightDtype::Bf16, bytes } => {
            let chunk = &bytes[at.start * 2..at.end * 2];
            prefetch_next(chunk);
            bf16s(chunk, out)
        }
        // f32: the only other float dtype a checked `StoredValues` holds.
        StoredValues::Float { bytes, .. } => {
            let bytes = &bytes[at.start * 4..at.end * 4];
            prefetch_next(bytes);
            match bytemuck::try_cast_slice::<u8, f32>(bytes) {
                Ok(values) => out.copy_from_slice(values),
                Err(_) => {
                    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    }
                }
            }
        }
        StoredValues::Quantised(q) => quantised_row(&q, k, n, ks, out),
    }
}

/// Prefetches into the second-level cache the bytes after `chunk`, as many as it holds: a
/// row's next chunk of K, which its decoder reads after the other rows of the tile (past a
/// row's end, the next row's first: any address may be prefetched). The decoders read their
/// chunks of 32 rows at a time, too many streams for the hardware's prefetcher to follow
/// (their loads waited on memory, a profile showed). x86-64 only (stable Rust has no
/// prefetch for other targets).
#[inline(always)]
fn prefetch_next(chunk: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        let end = chunk.as_ptr_range().end;
        for line in (0..chunk.len()).step_by(64) {
            // SAFETY: every x86-64 CPU has SSE; a prefetch reads nothing, so any address is
            // allowed.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(
                    end.wrapping_add(line).cast(),
                )
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = chunk;
}

/// The 32-value blocks of stored row `n` (`k / 32` blocks a row) that hold its columns `ks`.
#[inline(always)]
fn block_range(k: usize, n: usize, ks: &Range<usize>) -> Range<usize> {
    let per_row = k / BLOCK_VALUES;
    n * per_row + ks.start / BLOCK_VALUES..n * per_row + ks.end.div_ceil(BLOCK_VALUES)
}

/// Row `n`, columns `ks`, of quantised values into `out`.
#[inline(always)]
fn quantised_row(q: &QuantisedValues<'_>, k: usize, n: usize, ks: &Range<usize>, out: &mut [f32]) {
    let blocks = block_range(k, n, ks);
    match *q {
        QuantisedValues::Q8_0(bytes) => {
            let chunk = &bytes[blocks.start * Q8_0_BLOCK_BYTES..blocks.end * Q8_0_BLOCK_BYTES];
            prefetch_next(chunk);
            q8_0(chunk, out)
        }
        QuantisedValues::Q4_0(bytes) => {
            let chunk = &bytes[blocks.start * Q4_0_BLOCK_BYTES..blocks.end * Q4_0_BLOCK_BYTES];
            prefetch_next(chunk);
            q4_0(chunk, out)
        }
        QuantisedValues::Mxfp4 { codes, scales } => {
            let chunk = &codes[blocks.start * MXFP4_BLOCK_BYTES..blocks.end * MXFP4_BLOCK_BYTES];
            prefetch_next(chunk);
            mxfp4(chunk, &scales[blocks], out)
        }
        QuantisedValues::Fp8 { weight, scale_inv, block } => {
            let per_row = k.div_ceil(block[1]);
            let scales = &scale_inv[n / block[0] * per_row..(n / block[0] + 1) * per_row];
            let fp8 = &*FP8;
            for (kk, (o, &byte)) in out.iter_mut().zip(&weight[n * k + ks.start..n * k + ks.end]).enumerate()
            {
                *o = fp8[usize::from(byte)] * scales[(ks.start + kk) / block[1]];
            }
        }
    }
}

/// Q8_0 blocks as values (`q · d`), one block of `out` each; a function of its own per SIMD
/// target, so that its loops vectorise.
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma+f16c", "x86_64+avx2+fma+f16c", "aarch64+neon"))]
pub(super) fn q8_0(blocks: &[u8], out: &mut [f32]) {
    for (block, o) in blocks.chunks_exact(Q8_0_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        // Whole blocks: the chunks above are exactly these lengths.
        let (Some(q), Some(o)) =
            (block[2..].first_chunk::<BLOCK_VALUES>(), o.first_chunk_mut::<BLOCK_VALUES>())
        else {
            continue;
        };
        for j in 0..BLOCK_VALUES {
            o[j] = f32::from(q[j] as i8) * d;
        }
    }
}

/// Q4_0 blocks as values (`(nibble − 8) · d`, value `j` the low nibble of byte `j`, `j + 16`
/// its high nibble), as [`q8_0`].
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma+f16c", "x86_64+avx2+fma+f16c", "aarch64+neon"))]
pub(super) fn q4_0(blocks: &[u8], out: &mut [f32]) {
    for (block, o) in blocks.chunks_exact(Q4_0_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)) {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let (Some(q), Some(o)) = (block[2..].first_chunk::<16>(), o.first_chunk_mut::<BLOCK_VALUES>()) else {
            continue;
        };
        for j in 0..16 {
            o[j] = (i32::from(q[j] & 0xf) - 8) as f32 * d;
            o[j + 16] = (i32::from(q[j] >> 4) - 8) as f32 * d;
        }
    }
}

/// MXFP4 blocks as values (`FP4_E2M1[code] · 2^(scale − 127)`, value `2j` the low nibble of
/// byte `j`, `2j + 1` its high nibble), as [`q8_0`]: in AVX-512's or AVX2's registers where
/// the CPU has them (`decode_x86.rs`), else [`mxfp4_portable`].
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma+f16c", "x86_64+avx2+fma+f16c", "aarch64+neon"))]
pub(super) fn mxfp4(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    // SAFETY (both): each branch is compiled only into the clone with its features. (`allow`:
    // a call with the caller's own features needs no `unsafe`.)
    #[cfg(target_arch = "x86_64")]
    if multiversion::target::target_cfg_f!(target_feature = "avx512f") {
        #[allow(unused_unsafe)]
        unsafe {
            decode_x86::mxfp4_avx512(codes, scales, out)
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if multiversion::target::target_cfg_f!(target_feature = "avx2") {
        #[allow(unused_unsafe)]
        unsafe {
            decode_x86::mxfp4_avx2(codes, scales, out)
        };
        return;
    }
    mxfp4_portable(codes, scales, out)
}

/// [`mxfp4`] in portable code (by [`fp4`]'s arithmetic, which vectorises).
#[inline(always)]
fn mxfp4_portable(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    for ((block, o), &scale) in
        codes.chunks_exact(MXFP4_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)).zip(scales)
    {
        let s = quant::e8m0(scale);
        let (Some(q), Some(o)) = (block.first_chunk::<16>(), o.first_chunk_mut::<BLOCK_VALUES>()) else {
            continue;
        };
        for j in 0..16 {
            o[2 * j] = fp4(q[j] & 0xf) * s;
            o[2 * j + 1] = fp4(q[j] >> 4) * s;
        }
    }
}

/// ggml's MXFP4 blocks (llama.cpp's `block_mxfp4`: an E8M0 scale byte, then 16 bytes whose
/// low nibbles are values 0-15 and high nibbles 16-31) as values, `FP4_E2M1[code] ·
/// 2^(scale − 127)`: the values [`mxfp4`] gives the same codes and scale; in SIMD registers
/// as [`mxfp4`], else [`ggml_mxfp4_portable`].
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma+f16c", "x86_64+avx2+fma+f16c", "aarch64+neon"))]
pub(super) fn ggml_mxfp4(blocks: &[u8], out: &mut [f32]) {
    // SAFETY (both): as in `mxfp4`.
    #[cfg(target_arch = "x86_64")]
    if multiversion::target::target_cfg_f!(target_feature = "avx512f") {
        #[allow(unused_unsafe)]
        unsafe {
            decode_x86::ggml_mxfp4_avx512(blocks, out)
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if multiversion::target::target_cfg_f!(target_feature = "avx2") {
        #[allow(unused_unsafe)]
        unsafe {
            decode_x86::ggml_mxfp4_avx2(blocks, out)
        };
        return;
    }
    ggml_mxfp4_portable(blocks, out)
}

/// [`ggml_mxfp4`] in portable code.
#[inline(always)]
fn ggml_mxfp4_portable(blocks: &[u8], out: &mut [f32]) {
    for (block, o) in blocks.chunks_exact(GGML_MXFP4_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)) {
        let s = quant::e8m0(block[0]);
        let (Some(q), Some(o)) = (block[1..].first_chunk::<16>(), o.first_chunk_mut::<BLOCK_VALUES>()) else {
            continue;
        };
        for j in 0..16 {
            o[j] = fp4(q[j] & 0xf) * s;
            o[j + 16] = fp4(q[j] >> 4) * s;
        }
    }
}

/// f16 values (little-endian) as f32, exactly as `half::f16::to_f32` gives them (NaNs quiet):
/// by the CPU's conversion instruction where it has one (x86-64's F16C `vcvtph2ps`, eight at a
/// time; exact for every value), else [`f16s_by_bits`].
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma+f16c", "x86_64+avx2+fma+f16c", "aarch64+neon"))]
pub(super) fn f16s(bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if multiversion::target::target_cfg_f!(target_feature = "f16c") {
        let (whole, rest) = (out.len() / 8 * 8, out.len() % 8);
        for (o, b) in out[..whole].chunks_exact_mut(8).zip(bytes.chunks_exact(16)) {
            // SAFETY: F16C is enabled in this function's clone (the branch is compiled for no
            // other); the load reads the 16 bytes of `b` and the store writes the 8 floats of
            // `o`, both unaligned accesses in bounds. (`allow`: the conversion itself is safe
            // where the target enables F16C.)
            #[allow(unused_unsafe)]
            unsafe {
                use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm256_cvtph_ps, _mm256_storeu_ps};
                let halves = _mm_loadu_si128(b.as_ptr().cast::<__m128i>());
                _mm256_storeu_ps(o.as_mut_ptr(), _mm256_cvtph_ps(halves));
            }
        }
        f16s_by_bits(&bytes[whole * 2..], &mut out[whole..][..rest]);
        return;
    }
    f16s_by_bits(bytes, out)
}

/// [`f16s`] from the halves' bits, without a table or a call, so that it vectorises.
#[inline(always)]
fn f16s_by_bits(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let h = u32::from(u16::from_le_bytes([b[0], b[1]]));
        let (sign, exp, mant) = ((h & 0x8000) << 16, (h >> 10) & 0x1f, h & 0x3ff);
        // Normal: rebias the exponent (15 -> 127); subnormal: mant · 2^-24, exact; inf/NaN.
        let normal = f32::from_bits(sign | ((exp + 112) << 23) | (mant << 13));
        let subnormal = f32::from_bits(sign | (mant as f32 * f32::from_bits(0x3380_0000)).to_bits());
        let special =
            f32::from_bits(sign | 0x7f80_0000 | (mant << 13) | if mant != 0 { 0x40_0000 } else { 0 });
        *o = match exp {
            0 => subnormal,
            0x1f => special,
            _ => normal,
        };
    }
}

/// bf16 values (little-endian) as f32: the top half of the f32's bits (NaNs quiet, as
/// `half::bf16::to_f32`).
#[multiversion(targets("x86_64+avx512f+avx512bw+avx512vl+fma+f16c", "x86_64+avx2+fma+f16c", "aarch64+neon"))]
fn bf16s(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let bits = u32::from(u16::from_le_bytes([b[0], b[1]])) << 16;
        let nan = bits & 0x7fff_ffff > 0x7f80_0000;
        *o = f32::from_bits(if nan { bits | 0x40_0000 } else { bits });
    }
}

/// An FP4 e2m1 code as its value, `quant::FP4_E2M1[code]`, by arithmetic (no table and no
/// select, which the compiler would turn back into a table and gathers): with exponent `e`
/// (bits 1-2) and mantissa `m` (bit 0), the magnitude is `(2·[e > 0] + m) · 2^(max(e, 1) − 2)`
/// (0, 0.5; 1, 1.5; 2, 3; 4, 6), an exact product; the sign is bit 3.
#[inline(always)]
fn fp4(code: u8) -> f32 {
    let code = u32::from(code);
    let (e, m) = ((code >> 1) & 3, code & 1);
    let base = u32::from(e != 0) * 2 + m;
    let magnitude = base as f32 * f32::from_bits((e.max(1) + 125) << 23);
    f32::from_bits(magnitude.to_bits() | ((code & 8) << 28))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::FP4_E2M1;

    #[test]
    fn halves_convert_as_half_does() {
        let all: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let mut out = vec![0.0f32; 1 << 16];
        // The CPU's conversion where it has one (on a length that leaves a tail), and the bits'.
        for convert in [f16s as fn(&[u8], &mut [f32]), f16s_by_bits] {
            let (head, tail) = out.split_at_mut((1 << 16) - 3);
            convert(&all[..all.len() - 6], head);
            convert(&all[all.len() - 6..], tail);
            for (bits, v) in (0..=u16::MAX).zip(&out) {
                let want = half::f16::from_bits(bits).to_f32();
                assert!(
                    crate::bits::same_bits(*v, want) && (v.is_nan() || v.to_bits() == want.to_bits()),
                    "f16 {bits:#06x}"
                );
            }
        }
        bf16s(&all, &mut out);
        for (bits, v) in (0..=u16::MAX).zip(&out) {
            let want = half::bf16::from_bits(bits).to_f32();
            assert!(
                crate::bits::same_bits(*v, want) && (v.is_nan() || v.to_bits() == want.to_bits()),
                "bf16 {bits:#06x}"
            );
        }
    }

    /// Every MXFP4 decoder this CPU runs (AVX-512's, AVX2's, the portable one) gives `quant`'s
    /// values, in both layouts: every code under every scale byte (0: subnormal, 255: NaN).
    #[test]
    fn mxfp4_blocks_decode_as_quant_does() {
        let codes: Vec<u8> = (0..256 * 16).map(|i| (i * 37 % 256) as u8).collect();
        let scales: Vec<u8> = (0..=255).collect();
        let want = crate::bits::canonical(&quant::mxfp4_dequantize(&codes, &scales).unwrap());
        // The same codes as ggml's blocks (by hand: `quant::mxfp4_to_ggml` writes code 8, -0,
        // as +0, which ggml's table has).
        let ggml: Vec<u8> = codes
            .chunks_exact(16)
            .zip(&scales)
            .flat_map(|(block, &scale)| {
                let code = |v: usize| (block[v / 2] >> (4 * (v % 2))) & 0xf;
                std::iter::once(scale).chain((0..16).map(move |j| code(j) | (code(j + 16) << 4)))
            })
            .collect();
        type Decoders = (&'static str, fn(&[u8], &[u8], &mut [f32]), fn(&[u8], &mut [f32]));
        let mut decoders: Vec<Decoders> = vec![
            ("dispatched", mxfp4, ggml_mxfp4),
            ("portable", |c, s, o| mxfp4_portable(c, s, o), |b, o| ggml_mxfp4_portable(b, o)),
        ];
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY (each): called only where the CPU has the decoder's features.
            if std::arch::is_x86_feature_detected!("avx512f") {
                decoders.push((
                    "avx512",
                    |c, s, o| unsafe { decode_x86::mxfp4_avx512(c, s, o) },
                    |b, o| unsafe { decode_x86::ggml_mxfp4_avx512(b, o) },
                ));
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                decoders.push((
                    "avx2",
                    |c, s, o| unsafe { decode_x86::mxfp4_avx2(c, s, o) },
                    |b, o| unsafe { decode_x86::ggml_mxfp4_avx2(b, o) },
                ));
            } else {
                println!("skipped AVX2's MXFP4 decoder: this CPU has no AVX2");
            }
        }
        for (name, stored, ggml_blocks) in decoders {
            let mut out = vec![0.0f32; 256 * 32];
            stored(&codes, &scales, &mut out);
            assert_eq!(crate::bits::canonical(&out), want, "{name}, gpt-oss's layout");
            out.fill(0.0);
            ggml_blocks(&ggml, &mut out);
            assert_eq!(crate::bits::canonical(&out), want, "{name}, ggml's blocks");
        }
    }

    #[test]
    fn fp4_bits_are_the_table() {
        for code in 0..16u8 {
            assert_eq!(fp4(code).to_bits(), FP4_E2M1[usize::from(code)].to_bits(), "code {code}");
        }
    }
}
