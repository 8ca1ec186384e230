//! The host experts' strict-order kernels in AVX2's registers, for x86-64 CPUs without
//! AVX-512 (`kernel.rs` chooses): the tile kernel ([`strict_avx2`]) and the rows kernels, two
//! rows a register: f32 or f16 rows interleaved ([`strict_rows_avx2`]), Q8_0, Q4_0 and MXFP4
//! blocks decoded there ([`strict_blocks_avx2`]).
//! Same order and bits as `x86.rs`'s and the portable code: lane `j` of a column's four takes
//! `k = 4g + j`, one fused multiply-add per value, each value decoded as `moeflow::quant`
//! decodes it.

use std::arch::x86_64::*;

use super::tile::{GGML_MXFP4_BLOCK_BYTES, QUADS, Quads, ROW_COLS};
#[cfg(doc)]
use super::x86;
use super::x86::{
    BLOCK_PREFETCH, F16, F32, GgmlMxfp4, Mxfp4, PAIRED, PREFETCH, Q4_0, Q8_0, SIGN_BYTES, TRANSPOSED,
    first_bytes, half_values, next_rows, nibble_shift, prefetch_ahead, quad_step, special_scales,
};
use crate::quant::{FP4_E2M1, MXFP4_BLOCK_BYTES, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// Values [`strict_rows_avx2`] reads 8 at a time, as they lie: f32, or f16 converted by F16C.
pub(super) trait Steps8 {
    /// Bytes of 8 values.
    const BYTES: usize;
    /// 8 values from `bytes` (at least [`Steps8::BYTES`] long) as f32.
    ///
    /// # Safety
    /// The CPU has AVX and F16C.
    unsafe fn load(bytes: &[u8]) -> __m256;
}

impl Steps8 for F32 {
    const BYTES: usize = 32;

    #[inline(always)]
    unsafe fn load(bytes: &[u8]) -> __m256 {
        // SAFETY: 32 bytes in bounds (unaligned load); the caller's CPU has AVX.
        unsafe { _mm256_loadu_ps(bytes[..32].as_ptr().cast()) }
    }
}

impl Steps8 for F16 {
    const BYTES: usize = 16;

    #[inline(always)]
    unsafe fn load(bytes: &[u8]) -> __m256 {
        // SAFETY: 16 bytes in bounds (unaligned load); the caller's CPU has F16C.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(bytes[..16].as_ptr().cast())) }
    }
}

/// [`x86::strict_rows_avx512`] in AVX2's 8-lane registers: a quad's accumulator is two registers
/// (its columns 0-1 and 2-3), and per step of 8 values (two groups) four rows' values are
/// paired by four 128-bit permutes into the quad's two groups, each multiplied into every
/// token's accumulators of the quad in group order. Prefetched as [`x86::strict_rows_avx512`].
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop, reason = "quad `q` of the rows and of every token's accumulators")]
pub(super) fn strict_rows_avx2<S: Steps8, const T: usize>(
    rows: &[&[u8]; ROW_COLS],
    next: Option<usize>,
    quad: usize,
    xs: [&[[f32; 4]]; T],
    acc: [&mut Quads; T],
) {
    const Q: usize = ROW_COLS / 4;
    let steps = rows[0].len() / S::BYTES;
    let ahead = next_rows(rows, next);
    // SAFETY: the features are this function's.
    let mut a = unsafe { load_halves(&acc, quad) };
    let xs = xs.map(|x| &x[..steps * 2]);
    for s in 0..steps {
        let mut xb = [[_mm256_setzero_ps(); 2]; T];
        for t in 0..T {
            for g in 0..2 {
                // SAFETY: 4 floats in bounds.
                let x4 = unsafe { _mm_loadu_ps(xs[t][2 * s + g].as_ptr()) };
                xb[t][g] = _mm256_set_m128(x4, x4);
            }
        }
        let at = s * S::BYTES..(s + 1) * S::BYTES;
        for q in 0..Q {
            let quad_rows = quad_step(rows, q, &at);
            prefetch_ahead(&quad_rows, PREFETCH, ahead);
            // SAFETY: this function has the features; each row's step is S::BYTES long.
            let [r0, r1, r2, r3] = unsafe {
                [S::load(quad_rows[0]), S::load(quad_rows[1]), S::load(quad_rows[2]), S::load(quad_rows[3])]
            };
            // Group g of the step: rows 0-1's values g in one register, rows 2-3's in another.
            let w = [
                [_mm256_permute2f128_ps::<0x20>(r0, r1), _mm256_permute2f128_ps::<0x20>(r2, r3)],
                [_mm256_permute2f128_ps::<0x31>(r0, r1), _mm256_permute2f128_ps::<0x31>(r2, r3)],
            ];
            for t in 0..T {
                for g in 0..2 {
                    for h in 0..2 {
                        a[t][q][h] = _mm256_fmadd_ps(xb[t][g], w[g][h], a[t][q][h]);
                    }
                }
            }
        }
    }
    // SAFETY: the features are this function's.
    unsafe { store_halves(a, acc, quad) };
}

/// Accumulator quads `quad .. quad + 2` of each token into AVX2 registers, two a quad (its
/// columns 0-1 and 2-3).
///
/// # Safety
/// The CPU has AVX.
#[inline(always)]
unsafe fn load_halves<const T: usize>(
    acc: &[&mut Quads; T],
    quad: usize,
) -> [[[__m256; 2]; ROW_COLS / 4]; T] {
    // SAFETY: the caller's CPU has AVX.
    let mut a = [[[unsafe { _mm256_setzero_ps() }; 2]; ROW_COLS / 4]; T];
    for t in 0..T {
        for q in 0..ROW_COLS / 4 {
            for h in 0..2 {
                // SAFETY: 8 floats in bounds; the caller's CPU has AVX.
                a[t][q][h] = unsafe { _mm256_loadu_ps(acc[t][quad + q][8 * h..].as_ptr()) };
            }
        }
    }
    a
}

/// [`load_halves`]' registers back into the accumulators.
///
/// # Safety
/// The CPU has AVX.
#[inline(always)]
unsafe fn store_halves<const T: usize>(
    a: [[[__m256; 2]; ROW_COLS / 4]; T],
    acc: [&mut Quads; T],
    quad: usize,
) {
    for (dst, src) in acc.into_iter().zip(a) {
        for q in 0..ROW_COLS / 4 {
            for h in 0..2 {
                // SAFETY: 8 floats in bounds; the caller's CPU has AVX.
                unsafe { _mm256_storeu_ps(dst[quad + q][8 * h..].as_mut_ptr(), src[q][h]) };
            }
        }
    }
}

/// Two rows' 16 bytes from `at` of each, row `i` in 128-bit lane `i`.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn pair_lanes(first: &[u8], second: &[u8], at: usize) -> __m256i {
    // SAFETY: 16 bytes in bounds of each (the slices are checked); the caller's CPU has AVX2.
    unsafe {
        let low = _mm_loadu_si128(first[at..at + 16].as_ptr().cast());
        let high = _mm_loadu_si128(second[at..at + 16].as_ptr().cast());
        _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(low), high)
    }
}

/// A block format of 32 values that [`strict_blocks_avx2`] decodes in registers, two rows a
/// register (row `i` of the pair in 128-bit lane `i`): Q8_0, Q4_0 and MXFP4 in both layouts.
pub(super) trait Blocks8 {
    /// Bytes of one block.
    const BYTES: usize;
    /// Block `b`'s scales of each pair of rows ([`pairs`]' layout), from their blocks
    /// `blocks` or, for MXFP4, from the rows' side bytes ([`SidePairs`]; given for it, and for
    /// it only, by the kernel's caller).
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; each block is `BYTES` long.
    unsafe fn pair_scales(
        blocks: &[&[u8]; ROW_COLS],
        sides: &mut Option<SidePairs<'_>>,
        b: usize,
    ) -> [__m256; ROW_COLS / 2];
    /// Two rows' blocks' codes, ready for [`Blocks8::index`].
    ///
    /// # Safety
    /// As [`Blocks8::pair_scales`].
    unsafe fn codes(first: &[u8], second: &[u8]) -> [__m256i; 2];
    /// Group `g`'s codes of the two rows, one an element, as [`Blocks8::value`] reads them.
    ///
    /// # Safety
    /// As [`Blocks8::pair_scales`].
    unsafe fn index(codes: [__m256i; 2], g: usize) -> __m256i;
    /// The codes' values before their scale (times [`Blocks8::pair_scales`]' the exact product
    /// `quant` computes).
    ///
    /// # Safety
    /// As [`Blocks8::pair_scales`].
    unsafe fn value(index: __m256i) -> __m256;
}

/// A `vpshufb` control in both 128-bit lanes of a register.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn control8(bytes: &[i8; 16]) -> __m256i {
    // SAFETY: the caller's CPU has the features; 16 bytes in bounds.
    unsafe { _mm256_broadcastsi128_si256(_mm_loadu_si128(bytes.as_ptr().cast())) }
}

/// The eight rows' E8M0 scale bytes as `2^(e − 127)` (`quant::e8m0`: 2^-127 for 0, NaN for
/// 255), row `r` in lane `r`: `e << 23`, with 0 and 255 put right where the bytes hold one
/// ([`special_scales`]), as [`x86`]'s conversion does.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn e8m0_scales8(bytes: [u8; ROW_COLS]) -> __m256 {
    let word = u64::from_le_bytes(bytes);
    // SAFETY: the caller's CPU has the features.
    unsafe {
        let e = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(word as i64));
        let mut bits = _mm256_slli_epi32::<23>(e);
        if special_scales(word) {
            let zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
            bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x40_0000), zero);
            let all = _mm256_cmpeq_epi32(e, _mm256_set1_epi32(255));
            bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(f32::NAN.to_bits() as i32), all);
        }
        _mm256_castsi256_ps(bits)
    }
}

/// FP4 e2m1's magnitudes (`FP4_E2M1`'s first eight) as bits, each xored with its code
/// shifted up 28 bits: [`fp4_values8`]'s xor with the code shifted up 28 bits then clears
/// those bits again and leaves the code's top bit (the sign) in the float's.
const FP4_MAGNITUDES_XOR_CODES: [u32; 8] = {
    let mut bits = [0u32; 8];
    let mut m = 0;
    while m < 8 {
        // The sign is the code's top bit alone: code `m + 8` is `−FP4_E2M1[m]`.
        assert!(FP4_E2M1[m + 8].to_bits() == FP4_E2M1[m].to_bits() ^ (1 << 31));
        bits[m] = FP4_E2M1[m].to_bits() ^ ((m as u32) << 28);
        m += 1;
    }
    bits
};

/// FP4 e2m1 codes (the low four bits of each element) as their values: the magnitude looked
/// up by the code's low three bits in [`FP4_MAGNITUDES_XOR_CODES`], xored with the code
/// shifted up 28 bits (its top bit the float's sign; its low three bits cancel the table's):
/// `FP4_E2M1`'s bits, −0 for 8, in three operations where a mask for the sign would take a
/// fourth.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
pub(super) unsafe fn fp4_values8(index: __m256i) -> __m256 {
    // SAFETY: the caller's CPU has the features; the table's 8 words.
    unsafe {
        let table = _mm256_loadu_si256(FP4_MAGNITUDES_XOR_CODES.as_ptr().cast());
        let magnitude = _mm256_permutevar8x32_epi32(table, index);
        _mm256_castsi256_ps(_mm256_xor_si256(magnitude, _mm256_slli_epi32::<28>(index)))
    }
}

/// Two rows' 16 code bytes from `at` of each block in Q4_0's nibble order (values 0-15 the
/// low nibbles, 16-31 the high ones), [`TRANSPOSED`] (both halves of the groups in one).
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn transposed_codes(first: &[u8], second: &[u8], at: usize) -> [__m256i; 2] {
    // SAFETY: the caller's CPU has the features.
    let codes = unsafe { _mm256_shuffle_epi8(pair_lanes(first, second, at), control8(&TRANSPOSED)) };
    [codes, codes]
}

/// Group `g`'s codes from [`transposed_codes`] in the low four bits of each element.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn transposed_index(codes: [__m256i; 2], g: usize) -> __m256i {
    // SAFETY: the caller's CPU has the features.
    unsafe { _mm256_srlv_epi32(codes[0], _mm256_set1_epi32(nibble_shift(g) as i32)) }
}

/// The eight rows' values (row `r` in lane `r`) as four pairs of rows: pair `p`'s register
/// holds row `2 p`'s value repeated across its low 128-bit lane and row `2 p + 1`'s across
/// the high one.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn pairs(v: __m256) -> [__m256; ROW_COLS / 2] {
    // SAFETY: the caller's CPU has the features.
    unsafe {
        [
            _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1)),
            _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3)),
            _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5)),
            _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(6, 6, 6, 6, 7, 7, 7, 7)),
        ]
    }
}

/// MXFP4's scales of the [`ROW_COLS`] rows from their side bytes, block after block, read
/// four blocks at a time: for each pair of rows, the two rows' next four bytes in one
/// register (row `2 p`'s in the low 128-bit lane, one block an element), converted to
/// `2^(e − 127)` at once ([`e8m0_scales8`], 0 and 255 included); each block's scales then one
/// in-lane broadcast a pair, as [`pairs`] lays them out. The rows the next block of rows
/// reads have their side bytes prefetched as the bytes are read (each line once).
pub(super) struct SidePairs<'s> {
    /// Each row's side bytes, one a block, as long as each other.
    sides: &'s [&'s [u8]; ROW_COLS],
    /// The distance to the rows the next block of rows reads (`x86::next_rows`' for the
    /// sides).
    ahead: Option<usize>,
    /// The current four blocks' scales of each pair.
    four: [__m256; ROW_COLS / 2],
    /// The current block's element in each 128-bit lane: `b % 4`.
    at: __m256i,
}

impl<'s> SidePairs<'s> {
    /// The scales of `sides` from block 0.
    ///
    /// # Safety
    /// The CPU has AVX.
    #[inline(always)]
    unsafe fn new(sides: &'s [&'s [u8]; ROW_COLS], ahead: Option<usize>) -> Self {
        // SAFETY: the caller's CPU has the features.
        unsafe { SidePairs { sides, ahead, four: [_mm256_setzero_ps(); 4], at: _mm256_setzero_si256() } }
    }

    /// Block `b`'s scales ([`pairs`]' layout); `b` counts up from 0 by one.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn block(&mut self, b: usize) -> [__m256; ROW_COLS / 2] {
        // SAFETY: the caller's CPU has the features.
        unsafe {
            if b.is_multiple_of(4) {
                for p in 0..ROW_COLS / 2 {
                    let word = u64::from(self.word(2 * p, b)) | (u64::from(self.word(2 * p + 1, b)) << 32);
                    self.four[p] = e8m0_scales8(word.to_le_bytes());
                }
                self.at = _mm256_setzero_si256();
            }
            let [f0, f1, f2, f3] = self.four;
            let scales = [
                _mm256_permutevar_ps(f0, self.at),
                _mm256_permutevar_ps(f1, self.at),
                _mm256_permutevar_ps(f2, self.at),
                _mm256_permutevar_ps(f3, self.at),
            ];
            self.at = _mm256_add_epi32(self.at, _mm256_set1_epi32(1));
            scales
        }
    }

    /// Row `r`'s side bytes `b .. b + 4` (127, a scale of 1 no block reads, past its end),
    /// little-endian; the next rows' bytes there prefetched where they reach a line the
    /// bytes before did not.
    #[inline(always)]
    fn word(&self, r: usize, b: usize) -> u32 {
        let row = self.sides[r];
        let word = match row.get(b..b + 4) {
            Some(&[b0, b1, b2, b3]) => u32::from_le_bytes([b0, b1, b2, b3]),
            _ => {
                let mut bytes = [127; 4];
                for (byte, &side) in bytes.iter_mut().zip(row.get(b..).unwrap_or_default()) {
                    *byte = side;
                }
                u32::from_le_bytes(bytes)
            }
        };
        if let Some(ahead) = self.ahead {
            let first = row.as_ptr().wrapping_add(b + ahead);
            let last = first.wrapping_add(3);
            // SAFETY: every x86-64 CPU has SSE; a prefetch reads nothing, so any address is
            // allowed.
            unsafe {
                if b == 0 || (first as usize).is_multiple_of(64) {
                    _mm_prefetch::<_MM_HINT_T1>(first.cast());
                }
                if (last as usize) / 64 != (first as usize) / 64 {
                    _mm_prefetch::<_MM_HINT_T1>(last.cast());
                }
            }
        }
        word
    }
}

impl Blocks8 for Q8_0 {
    const BYTES: usize = Q8_0_BLOCK_BYTES;

    /// The scales times 2^-24, as [`x86::Q8_0`]'s: each code is converted as 2^24 times it.
    #[inline(always)]
    unsafe fn pair_scales(
        blocks: &[&[u8]; ROW_COLS],
        _: &mut Option<SidePairs<'_>>,
        _: usize,
    ) -> [__m256; 4] {
        // SAFETY: the caller's CPU has the features.
        unsafe { pairs(_mm256_mul_ps(half_values(blocks), _mm256_set1_ps(1.0 / 16_777_216.0))) }
    }

    /// Codes 0-15 and 16-31 of the two rows.
    #[inline(always)]
    unsafe fn codes(first: &[u8], second: &[u8]) -> [__m256i; 2] {
        // SAFETY: as above.
        unsafe { [pair_lanes(first, second, 2), pair_lanes(first, second, 18)] }
    }

    /// Each row's four codes moved into the sign bytes of four elements ([`SIGN_BYTES`]).
    #[inline(always)]
    unsafe fn index(codes: [__m256i; 2], g: usize) -> __m256i {
        // SAFETY: as above.
        unsafe { _mm256_shuffle_epi8(codes[g / 4], control8(&SIGN_BYTES[g % 4])) }
    }

    /// 2^24 times each code, exact.
    #[inline(always)]
    unsafe fn value(index: __m256i) -> __m256 {
        // SAFETY: as above.
        unsafe { _mm256_cvtepi32_ps(index) }
    }
}

impl Blocks8 for Q4_0 {
    const BYTES: usize = Q4_0_BLOCK_BYTES;

    #[inline(always)]
    unsafe fn pair_scales(
        blocks: &[&[u8]; ROW_COLS],
        _: &mut Option<SidePairs<'_>>,
        _: usize,
    ) -> [__m256; 4] {
        // SAFETY: the caller's CPU has the features.
        unsafe { pairs(half_values(blocks)) }
    }

    /// The codes [`TRANSPOSED`], each nibble's top bit flipped: a nibble `n` is then
    /// `n − 8` as a signed four-bit number.
    #[inline(always)]
    unsafe fn codes(first: &[u8], second: &[u8]) -> [__m256i; 2] {
        // SAFETY: as above.
        unsafe {
            let [codes, _] = transposed_codes(first, second, 2);
            let signed = _mm256_xor_si256(codes, _mm256_set1_epi8(0x88u8 as i8));
            [signed, signed]
        }
    }

    /// Group `g`'s signed nibbles moved to the top four bits of each element and shifted
    /// back down with their sign: `n − 8` in each element, in two shifts (where a shift, a
    /// mask and a subtraction would take three).
    #[inline(always)]
    unsafe fn index(codes: [__m256i; 2], g: usize) -> __m256i {
        let up = 28 - nibble_shift(g) as i32;
        // SAFETY: as above.
        unsafe { _mm256_srai_epi32::<28>(_mm256_sllv_epi32(codes[0], _mm256_set1_epi32(up))) }
    }

    /// `n − 8`, exact.
    #[inline(always)]
    unsafe fn value(index: __m256i) -> __m256 {
        // SAFETY: as above.
        unsafe { _mm256_cvtepi32_ps(index) }
    }
}

impl Blocks8 for GgmlMxfp4 {
    const BYTES: usize = GGML_MXFP4_BLOCK_BYTES;

    #[inline(always)]
    unsafe fn pair_scales(
        blocks: &[&[u8]; ROW_COLS],
        _: &mut Option<SidePairs<'_>>,
        _: usize,
    ) -> [__m256; 4] {
        // SAFETY: the caller's CPU has the features.
        unsafe { pairs(e8m0_scales8(first_bytes(blocks))) }
    }

    #[inline(always)]
    unsafe fn codes(first: &[u8], second: &[u8]) -> [__m256i; 2] {
        // SAFETY: as above.
        unsafe { transposed_codes(first, second, 1) }
    }

    #[inline(always)]
    unsafe fn index(codes: [__m256i; 2], g: usize) -> __m256i {
        // SAFETY: as above.
        unsafe { transposed_index(codes, g) }
    }

    #[inline(always)]
    unsafe fn value(index: __m256i) -> __m256 {
        // SAFETY: as above.
        unsafe { fp4_values8(index) }
    }
}

impl Blocks8 for Mxfp4 {
    const BYTES: usize = MXFP4_BLOCK_BYTES;

    /// From the side bytes, four blocks at a time ([`SidePairs`]); the kernel's caller gives
    /// them for MXFP4 (`RowBlock::Mxfp4`).
    #[inline(always)]
    unsafe fn pair_scales(_: &[&[u8]; ROW_COLS], sides: &mut Option<SidePairs<'_>>, b: usize) -> [__m256; 4] {
        // SAFETY: the caller's CPU has the features.
        unsafe {
            match sides {
                Some(sides) => sides.block(b),
                None => [_mm256_setzero_ps(); 4],
            }
        }
    }

    /// The codes of groups 0-3 and 4-7, [`PAIRED`].
    #[inline(always)]
    unsafe fn codes(first: &[u8], second: &[u8]) -> [__m256i; 2] {
        // SAFETY: as above.
        unsafe {
            let codes = pair_lanes(first, second, 0);
            [
                _mm256_shuffle_epi8(codes, control8(&PAIRED[0])),
                _mm256_shuffle_epi8(codes, control8(&PAIRED[1])),
            ]
        }
    }

    #[inline(always)]
    unsafe fn index(codes: [__m256i; 2], g: usize) -> __m256i {
        let m = 8 * (g % 4) as i32;
        // SAFETY: as above.
        unsafe { _mm256_srlv_epi32(codes[g / 4], _mm256_setr_epi32(m, m + 4, m, m + 4, m, m + 4, m, m + 4)) }
    }

    #[inline(always)]
    unsafe fn value(index: __m256i) -> __m256 {
        // SAFETY: as above.
        unsafe { fp4_values8(index) }
    }
}

/// `T` tokens over [`ROW_COLS`] rows of whole blocks of format `B` in AVX2's registers (each
/// row's blocks of the chunk as stored; `sides` each row's side byte per block, for MXFP4):
/// per block the eight rows' scales at once, then per pair of rows (half a quad's columns)
/// the two rows' codes, group by group decoded ([`Blocks8`]) and times the row's scale —
/// the single exact product `quant` computes — each group multiplied into every token's
/// accumulator of the pair in group order. Prefetched as [`x86::strict_blocks_avx512`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn strict_blocks_avx2<B: Blocks8, const T: usize>(
    rows: &[&[u8]; ROW_COLS],
    sides: Option<&[&[u8]; ROW_COLS]>,
    next: Option<usize>,
    quad: usize,
    xs: [&[[f32; 4]]; T],
    acc: [&mut Quads; T],
) {
    let blocks = rows[0].len() / B::BYTES;
    let ahead = next_rows(rows, next);
    // Each row's side bytes are as long as the others'.
    let side_ahead = sides.and_then(|sides| next.map(|n| n * sides[0].len()));
    // SAFETY (both): the features are this function's.
    let mut side_pairs = sides.map(|sides| unsafe { SidePairs::new(sides, side_ahead) });
    let mut a = unsafe { load_halves(&acc, quad) };
    let xs = xs.map(|x| &x[..blocks * 8]);
    for b in 0..blocks {
        let at = b * B::BYTES..(b + 1) * B::BYTES;
        let mut row_blocks: [&[u8]; ROW_COLS] = [&[]; ROW_COLS];
        for (block, row) in row_blocks.iter_mut().zip(rows) {
            *block = &row[at.clone()];
        }
        // SAFETY: the features are this function's; each block is B::BYTES long.
        let scales = unsafe { B::pair_scales(&row_blocks, &mut side_pairs, b) };
        // The quads, their halves and their eight groups unrolled, so each group's constants
        // (controls, shifts) are known where they are used and the accumulators stay in
        // registers. Left as loops, the compiler unrolled them only in part (for MXFP4 in
        // gpt-oss's layout at two tokens not at all, its accumulators on the stack): 5-24%
        // slower on this project's machine (docs/benchmarks/host, table 22).
        macro_rules! groups {
            ($q:literal, $h:literal, $codes:ident, $scale:ident, $($g:literal)+) => {$(
                // SAFETY: as above.
                let w = _mm256_mul_ps(unsafe { B::value(B::index($codes, $g)) }, $scale);
                for t in 0..T {
                    // SAFETY: 4 floats in bounds.
                    let x4 = unsafe { _mm_loadu_ps(xs[t][8 * b + $g].as_ptr()) };
                    a[t][$q][$h] = _mm256_fmadd_ps(_mm256_set_m128(x4, x4), w, a[t][$q][$h]);
                }
            )+};
        }
        macro_rules! halves {
            ($q:literal, $quad_blocks:ident, $($h:literal)+) => {$({
                // SAFETY: as above.
                let codes = unsafe { B::codes($quad_blocks[2 * $h], $quad_blocks[2 * $h + 1]) };
                let scale = scales[2 * $q + $h];
                groups!($q, $h, codes, scale, 0 1 2 3 4 5 6 7);
            })+};
        }
        macro_rules! quads {
            ($($q:literal)+) => {$({
                let quad_blocks = quad_step(rows, $q, &at);
                prefetch_ahead(&quad_blocks, BLOCK_PREFETCH, ahead);
                halves!($q, quad_blocks, 0 1);
            })+};
        }
        quads!(0 1);
    }
    // SAFETY: the features are this function's.
    unsafe { store_halves(a, acc, quad) };
}

/// One token over a tile in AVX2's sixteen registers: a quad is two 8-lane registers, so
/// the tile's columns run in two halves of eight registers each.
#[target_feature(enable = "avx2,fma")]
pub(super) fn strict_avx2(tile: &[Quads], x: &[[f32; 4]], acc: &mut Quads) {
    let x = &x[..tile.len()];
    for half in 0..2 {
        let quads = half * QUADS / 2..(half + 1) * QUADS / 2;
        let mut a = [_mm256_setzero_ps(); QUADS];
        for (i, q) in quads.clone().enumerate() {
            // SAFETY: 2 x 8 floats in bounds.
            a[2 * i] = unsafe { _mm256_loadu_ps(acc[q].as_ptr()) };
            a[2 * i + 1] = unsafe { _mm256_loadu_ps(acc[q][8..].as_ptr()) };
        }
        for (w, xg) in tile.iter().zip(x) {
            // SAFETY: 4 floats in bounds.
            let x4 = unsafe { _mm_loadu_ps(xg.as_ptr()) };
            let xv = _mm256_set_m128(x4, x4);
            for (i, q) in quads.clone().enumerate() {
                // SAFETY: 2 x 8 floats in bounds.
                let (w0, w1) =
                    unsafe { (_mm256_loadu_ps(w[q].as_ptr()), _mm256_loadu_ps(w[q][8..].as_ptr())) };
                a[2 * i] = _mm256_fmadd_ps(xv, w0, a[2 * i]);
                a[2 * i + 1] = _mm256_fmadd_ps(xv, w1, a[2 * i + 1]);
            }
        }
        for (i, q) in quads.enumerate() {
            // SAFETY: 2 x 8 floats in bounds.
            unsafe {
                _mm256_storeu_ps(acc[q].as_mut_ptr(), a[2 * i]);
                _mm256_storeu_ps(acc[q][8..].as_mut_ptr(), a[2 * i + 1]);
            }
        }
    }
}
