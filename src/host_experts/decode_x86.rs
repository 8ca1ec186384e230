//! MXFP4 blocks decoded to f32 values in AVX-512's and AVX2's registers, for the tile
//! (`decode.rs`, which calls them where the CPU has the features): each block's 16 code bytes
//! widened to one element each, low and high nibbles looked up in FP4's table (AVX-512: all
//! sixteen codes at once; AVX2: the magnitudes' table of `avx2.rs`, the sign by an xor), times
//! the block's scale, then put in value order. The same values as `quant` gives (one table
//! value times the E8M0 scale, one f32 product), in about half the time the compiler's
//! vectorisation of the portable decoder took (docs/benchmarks/host table 24).

use std::arch::x86_64::*;

use super::avx2::fp4_values8;
use super::tile::GGML_MXFP4_BLOCK_BYTES;
use crate::quant::{BLOCK_VALUES, FP4_E2M1, MXFP4_BLOCK_BYTES, e8m0};

/// Where a block's 32 values are read from its codes: gpt-oss's order (value `2 j` the low
/// nibble of byte `j`, `2 j + 1` its high one) or ggml's `block_mxfp4` (value `j` the low
/// nibble of byte `j`, `j + 16` its high one).
#[derive(Clone, Copy)]
enum Order {
    /// gpt-oss's: value `2 j` the low nibble of byte `j`.
    Paired,
    /// ggml's: value `j` the low nibble of byte `j`, `j + 16` its high one.
    Halves,
}

/// MXFP4 blocks in gpt-oss's layout (16 code bytes each, `scales` one E8M0 byte each) as
/// values, one block of `out` each, as `decode::mxfp4`.
#[target_feature(enable = "avx512f")]
pub(super) fn mxfp4_avx512(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    for ((block, o), &scale) in
        codes.chunks_exact(MXFP4_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)).zip(scales)
    {
        // SAFETY: this function has the features.
        unsafe { block_avx512(block, e8m0(scale), o, Order::Paired) };
    }
}

/// ggml's MXFP4 blocks (`block_mxfp4`: the E8M0 scale byte, then 16 code bytes) as values,
/// one block of `out` each, as `decode::ggml_mxfp4`.
#[target_feature(enable = "avx512f")]
pub(super) fn ggml_mxfp4_avx512(blocks: &[u8], out: &mut [f32]) {
    for (block, o) in blocks.chunks_exact(GGML_MXFP4_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)) {
        // SAFETY: this function has the features.
        unsafe { block_avx512(&block[1..], e8m0(block[0]), o, Order::Halves) };
    }
}

/// One block's 16 code bytes `codes` times `scale` into `out` (32 values) in `order`. (An
/// `unsafe fn` always inlined rather than a `#[target_feature]` one, which may stay a call:
/// inlined into its callers, it runs with their features.)
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn block_avx512(codes: &[u8], scale: f32, out: &mut [f32], order: Order) {
    let (codes, out) = (&codes[..16], &mut out[..BLOCK_VALUES]);
    // SAFETY: the caller's CPU has the features; 16 floats of the table, 16 code bytes and
    // 32 floats of `out` in bounds (unaligned accesses).
    unsafe {
        let table = _mm512_loadu_ps(FP4_E2M1.as_ptr());
        let s = _mm512_set1_ps(scale);
        // Byte j in element j: its low nibble is the table's index (the lookup reads four bits).
        let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(codes.as_ptr().cast()));
        let low = _mm512_mul_ps(_mm512_permutexvar_ps(bytes, table), s);
        let high = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32::<4>(bytes), table), s);
        let [first, second] = match order {
            Order::Paired => [
                _mm512_permutex2var_ps(
                    low,
                    _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                    high,
                ),
                _mm512_permutex2var_ps(
                    low,
                    _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
                    high,
                ),
            ],
            Order::Halves => [low, high],
        };
        _mm512_storeu_ps(out.as_mut_ptr(), first);
        _mm512_storeu_ps(out[16..].as_mut_ptr(), second);
    }
}

/// [`mxfp4_avx512`] in AVX2's registers.
#[target_feature(enable = "avx2")]
pub(super) fn mxfp4_avx2(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    for ((block, o), &scale) in
        codes.chunks_exact(MXFP4_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)).zip(scales)
    {
        // SAFETY: this function has the features.
        unsafe { block_avx2(block, e8m0(scale), o, Order::Paired) };
    }
}

/// [`ggml_mxfp4_avx512`] in AVX2's registers.
#[target_feature(enable = "avx2")]
pub(super) fn ggml_mxfp4_avx2(blocks: &[u8], out: &mut [f32]) {
    for (block, o) in blocks.chunks_exact(GGML_MXFP4_BLOCK_BYTES).zip(out.chunks_exact_mut(BLOCK_VALUES)) {
        // SAFETY: this function has the features.
        unsafe { block_avx2(&block[1..], e8m0(block[0]), o, Order::Halves) };
    }
}

/// [`block_avx512`] in AVX2's registers, eight code bytes at a time.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn block_avx2(codes: &[u8], scale: f32, out: &mut [f32], order: Order) {
    let (codes, out) = (&codes[..16], &mut out[..BLOCK_VALUES]);
    // SAFETY: the caller's CPU has the features; 8 code bytes at 0 and 8 and 8 floats at 0,
    // 8, 16 and 24 of `out` in bounds (unaligned accesses).
    unsafe {
        let s = _mm256_set1_ps(scale);
        for half in 0..2 {
            let bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(codes[8 * half..].as_ptr().cast()));
            let low = _mm256_mul_ps(fp4_values8(bytes), s);
            let high = _mm256_mul_ps(fp4_values8(_mm256_srli_epi32::<4>(bytes)), s);
            match order {
                Order::Paired => {
                    // Values 16 h + 2 j and 16 h + 2 j + 1: low and high interleaved.
                    let a = _mm256_unpacklo_ps(low, high);
                    let b = _mm256_unpackhi_ps(low, high);
                    _mm256_storeu_ps(out[16 * half..].as_mut_ptr(), _mm256_permute2f128_ps::<0x20>(a, b));
                    _mm256_storeu_ps(out[16 * half + 8..].as_mut_ptr(), _mm256_permute2f128_ps::<0x31>(a, b));
                }
                Order::Halves => {
                    _mm256_storeu_ps(out[8 * half..].as_mut_ptr(), low);
                    _mm256_storeu_ps(out[16 + 8 * half..].as_mut_ptr(), high);
                }
            }
        }
    }
}
