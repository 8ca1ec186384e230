//! The host experts' strict-order kernels in AVX-512's registers, called by `kernel.rs` where
//! the CPU has the features, and what they share with AVX2's (`avx2.rs`: the block layouts'
//! shuffle controls, the prefetches): the tile kernel ([`strict_avx512`]) and the rows
//! kernels, which interleave four rows' values in registers ([`strict_rows_avx512`]: f32 or
//! f16 rows) or decode their quantised blocks there ([`strict_blocks_avx512`]: Q8_0, Q4_0,
//! MXFP4, four rows a register). Same order and bits
//! as the portable code: lane `j` of a column's four takes `k = 4g + j`, one fused
//! multiply-add per value, each value decoded as `moeflow::quant` decodes it.

use std::arch::x86_64::*;
use std::ops::Range;

use super::tile::{GGML_MXFP4_BLOCK_BYTES, QUADS, Quads, ROW_COLS};
use crate::quant::{FP4_E2M1, MXFP4_BLOCK_BYTES, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// Tokens whose accumulators one pass of [`strict_avx512`] keeps in registers (three
/// tokens' [`QUADS`] vectors: 24 of the 32), so each weight vector read serves three.
pub(super) const TOKENS: usize = 3;

/// `T` tokens over a tile: each token's [`QUADS`] accumulators one 16-lane register each,
/// its group of x repeated across a register, one fused multiply-add per quad.
#[target_feature(enable = "avx512f")]
pub(super) fn strict_avx512<const T: usize>(tile: &[Quads], xs: [&[[f32; 4]]; T], acc: [&mut Quads; T]) {
    let mut a = [[_mm512_setzero_ps(); QUADS]; T];
    for t in 0..T {
        for q in 0..QUADS {
            // SAFETY: 16 floats in bounds.
            a[t][q] = unsafe { _mm512_loadu_ps(acc[t][q].as_ptr()) };
        }
    }
    let xs = xs.map(|x| &x[..tile.len()]);
    for (g, w) in tile.iter().enumerate() {
        for t in 0..T {
            // SAFETY: 4 floats in bounds.
            let xv = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(xs[t][g].as_ptr()) });
            for q in 0..QUADS {
                // SAFETY: 16 floats in bounds.
                let wv = unsafe { _mm512_loadu_ps(w[q].as_ptr()) };
                a[t][q] = _mm512_fmadd_ps(xv, wv, a[t][q]);
            }
        }
    }
    for (dst, src) in acc.into_iter().zip(a) {
        for q in 0..QUADS {
            // SAFETY: 16 floats in bounds.
            unsafe { _mm512_storeu_ps(dst[q].as_mut_ptr(), src[q]) };
        }
    }
}

/// How far ahead of its reads each row is prefetched, in bytes: the rows stream from memory
/// or the last-level cache, [`ROW_COLS`] at a time. Measured on this project's machine
/// (docs/benchmarks/host, table 9): 512 bytes read f16 rows 7-15% faster than 1024, f32
/// rows alike.
pub(super) const PREFETCH: usize = 512;

/// Values a rows kernel reads 16 at a time, as they lie, without a table or a scale: f32, or
/// f16 converted by F16C (exactly `half`'s conversion).
pub(super) trait Steps {
    /// Bytes of 16 values.
    const BYTES: usize;
    /// 16 values from `bytes` (at least [`Steps::BYTES`] long) as f32.
    ///
    /// # Safety
    /// The CPU has AVX-512F and F16C.
    unsafe fn load(bytes: &[u8]) -> __m512;
}

/// f32 values, little-endian.
pub(super) struct F32;

impl Steps for F32 {
    const BYTES: usize = 64;

    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn load(bytes: &[u8]) -> __m512 {
        // SAFETY: 64 bytes in bounds (unaligned load).
        unsafe { _mm512_loadu_ps(bytes[..64].as_ptr().cast()) }
    }
}

/// f16 values, little-endian.
pub(super) struct F16;

impl Steps for F16 {
    const BYTES: usize = 32;

    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn load(bytes: &[u8]) -> __m512 {
        // SAFETY: 32 bytes in bounds (unaligned load).
        _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(bytes[..32].as_ptr().cast()) })
    }
}

/// `T` tokens over [`ROW_COLS`] rows of whole 16-value steps of `S` values, into accumulator
/// quads `quad .. quad + 2`: per step and quad, four rows' 16 values (four groups each)
/// interleaved by eight 128-bit shuffles into the quad's four groups, each multiplied into
/// every token's accumulator of the quad. Each row is prefetched [`PREFETCH`] bytes ahead,
/// and, for whole stored rows, the row `next` rows on at the same place ([`next_rows`]).
#[target_feature(enable = "avx512f,f16c")]
#[allow(clippy::needless_range_loop, reason = "quad `q` of the rows and of every token's accumulators")]
pub(super) fn strict_rows_avx512<S: Steps, const T: usize>(
    rows: &[&[u8]; ROW_COLS],
    next: Option<usize>,
    quad: usize,
    xs: [&[[f32; 4]]; T],
    acc: [&mut Quads; T],
) {
    const Q: usize = ROW_COLS / 4;
    let steps = rows[0].len() / S::BYTES;
    let ahead = next_rows(rows, next);
    let mut a = load(&acc, quad);
    let xs = xs.map(|x| &x[..steps * 4]);
    for s in 0..steps {
        let mut xb = [[_mm512_setzero_ps(); 4]; T];
        for t in 0..T {
            for g in 0..4 {
                // SAFETY: 4 floats in bounds.
                xb[t][g] = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(xs[t][4 * s + g].as_ptr()) });
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
            let p0 = _mm512_shuffle_f32x4::<0x44>(r0, r1);
            let p1 = _mm512_shuffle_f32x4::<0xee>(r0, r1);
            let p2 = _mm512_shuffle_f32x4::<0x44>(r2, r3);
            let p3 = _mm512_shuffle_f32x4::<0xee>(r2, r3);
            let w = [
                _mm512_shuffle_f32x4::<0x88>(p0, p2),
                _mm512_shuffle_f32x4::<0xdd>(p0, p2),
                _mm512_shuffle_f32x4::<0x88>(p1, p3),
                _mm512_shuffle_f32x4::<0xdd>(p1, p3),
            ];
            for t in 0..T {
                for g in 0..4 {
                    a[t][q] = _mm512_fmadd_ps(xb[t][g], w[g], a[t][q]);
                }
            }
        }
    }
    store(a, acc, quad);
}

/// Each row's side byte of block `b` (MXFP4's scale; zeros without `sides`), and, given the
/// distance to the rows the next block of rows reads, those rows' side bytes prefetched: each
/// line once, at the row's first byte and at each line's first.
#[inline(always)]
pub(super) fn side_bytes(
    sides: Option<&[&[u8]; ROW_COLS]>,
    b: usize,
    ahead: Option<usize>,
) -> [u8; ROW_COLS] {
    let mut side = [0; ROW_COLS];
    if let Some(sides) = sides {
        for (s, row) in side.iter_mut().zip(sides) {
            *s = row[b];
            if let Some(ahead) = ahead {
                let ahead = row[b..].as_ptr().wrapping_add(ahead);
                if b == 0 || (ahead as usize).is_multiple_of(64) {
                    // SAFETY: every x86-64 CPU has SSE; a prefetch reads nothing, so any
                    // address is allowed.
                    unsafe { _mm_prefetch::<_MM_HINT_T1>(ahead.cast()) };
                }
            }
        }
    }
    side
}

/// How far ahead of a quad's blocks their rows are prefetched, in bytes: the rows stream
/// from memory or the last-level cache eight at a time, each a few blocks per chunk of K,
/// too short for the hardware's prefetcher to follow, and the decoding between the loads
/// keeps few of them in flight. Measured on this project's machine (docs/benchmarks/host,
/// table 10): 256 bytes 3-8% faster than 512 at M = 8; 128 and none slower.
pub(super) const BLOCK_PREFETCH: usize = 256;

/// Quad `q`'s four rows' bytes `at`.
#[inline(always)]
pub(super) fn quad_step<'r>(rows: &[&'r [u8]; ROW_COLS], q: usize, at: &Range<usize>) -> [&'r [u8]; 4] {
    [
        &rows[4 * q][at.clone()],
        &rows[4 * q + 1][at.clone()],
        &rows[4 * q + 2][at.clone()],
        &rows[4 * q + 3][at.clone()],
    ]
}

/// Prefetches each of four rows' bytes `distance` past `blocks` (the same rows' next values:
/// a row's chunks lie one after another) into the first-level cache and, given the distance
/// to the rows the next block of rows reads ([`next_rows`]), those rows' bytes at the same
/// place into the second.
#[inline(always)]
pub(super) fn prefetch_ahead(blocks: &[&[u8]; 4], distance: usize, ahead: Option<usize>) {
    for block in blocks {
        // SAFETY: every x86-64 CPU has SSE; a prefetch reads nothing, so any address is
        // allowed.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(block.as_ptr().wrapping_add(distance).cast()) };
        if let Some(ahead) = ahead {
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(block.as_ptr().wrapping_add(ahead).cast()) };
        }
    }
}

/// The bytes from each of `rows` (whole stored rows, as long as each other) to the row `next`
/// rows on, which the next block of rows reads in its place (`tile::Rows::next`): `next`
/// times a row's bytes. Prefetching there, a block of rows ahead, into the second-level cache
/// (a block of f32 rows is larger than the first level) keeps the stream from memory going
/// where the short distance alone ([`PREFETCH`], [`BLOCK_PREFETCH`], into the first level)
/// leaves each block's first reads waiting (measured on this project's machine,
/// docs/benchmarks/host table 11).
#[inline(always)]
pub(super) fn next_rows(rows: &[&[u8]; ROW_COLS], next: Option<usize>) -> Option<usize> {
    next.map(|n| n * rows[0].len())
}

// The block kernels take the scales of a block's rows in one register of eight: two quads.
const _: () = assert!(ROW_COLS == 8, "a block's row scales are one register of eight");

// The helpers of the block kernels' loop are `unsafe fn`s always inlined, rather than
// `#[target_feature]` fns, which the compiler may leave as calls inside the loop: inlined
// into the kernels, their intrinsics run with the kernels' features.

/// The [`ROW_COLS`] rows' f16 block scales (the first two bytes of each block) as f32 (F16C:
/// exactly `half`'s conversion), as [`quad_scales`] gives them: gathered into one register
/// in general-purpose ones ([`half_words`]), converted at once.
///
/// # Safety
/// The CPU has AVX-512F and F16C.
#[inline(always)]
unsafe fn half_scales(blocks: &[&[u8]; ROW_COLS]) -> [__m512; ROW_COLS / 4] {
    // SAFETY: the caller's CPU has the features.
    unsafe { quad_scales(_mm512_castps256_ps512(half_values(blocks))) }
}

/// The [`ROW_COLS`] rows' f16 block scales (the first two bytes of each block) as f32, row `r`
/// in lane `r` (F16C: exactly `half`'s conversion), gathered into one register in
/// general-purpose ones ([`half_words`]) and converted at once.
///
/// # Safety
/// The CPU has AVX and F16C.
#[inline(always)]
pub(super) unsafe fn half_values(blocks: &[&[u8]; ROW_COLS]) -> __m256 {
    let [low, high] = half_words(blocks);
    // SAFETY: the caller's CPU has the features.
    unsafe { _mm256_cvtph_ps(_mm_set_epi64x(high as i64, low as i64)) }
}

/// The first byte of each of the [`ROW_COLS`] blocks (ggml MXFP4's scale).
#[inline(always)]
pub(super) fn first_bytes(blocks: &[&[u8]; ROW_COLS]) -> [u8; ROW_COLS] {
    let mut bytes = [0; ROW_COLS];
    for (byte, block) in bytes.iter_mut().zip(blocks) {
        *byte = block[0];
    }
    bytes
}

/// The first two bytes of each of the [`ROW_COLS`] blocks, four to a word (little-endian).
#[inline(always)]
pub(super) fn half_words(blocks: &[&[u8]; ROW_COLS]) -> [u64; 2] {
    let mut words = [0u64; 2];
    for (i, block) in blocks.iter().enumerate() {
        words[i / 4] |= u64::from(u16::from_le_bytes([block[0], block[1]])) << (16 * (i % 4));
    }
    words
}

/// The [`ROW_COLS`] rows' E8M0 scale bytes as `2^(e − 127)` (`quant::e8m0`: 2^-127 for 0,
/// NaN for 255), as [`quad_scales`] gives them: `e << 23`, its bits for `e` in 1..=254, with
/// 0 and 255 put right where the bytes hold one ([`special_scales`]).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn e8m0_scales(bytes: [u8; ROW_COLS]) -> [__m512; ROW_COLS / 4] {
    let word = u64::from_le_bytes(bytes);
    // SAFETY: the caller's CPU has the features.
    unsafe {
        let e = _mm512_cvtepu8_epi32(_mm_cvtsi64_si128(word as i64));
        let mut bits = _mm512_slli_epi32::<23>(e);
        if special_scales(word) {
            let zero = _mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512());
            bits = _mm512_mask_blend_epi32(zero, bits, _mm512_set1_epi32(0x40_0000));
            let all = _mm512_cmpeq_epi32_mask(e, _mm512_set1_epi32(255));
            bits = _mm512_mask_blend_epi32(all, bits, _mm512_set1_epi32(f32::NAN.to_bits() as i32));
        }
        quad_scales(_mm512_castsi512_ps(bits))
    }
}

/// Whether one of the eight E8M0 bytes of `word` is 0 or 255, whose `2^(e − 127)` (2^-127,
/// NaN) is not `e << 23`.
#[inline(always)]
pub(super) fn special_scales(word: u64) -> bool {
    /// The high bit of each zero byte of `w` (and maybe of bytes above one): nonzero exactly
    /// where `w` has a zero byte.
    fn zero_byte(w: u64) -> u64 {
        w.wrapping_sub(0x0101_0101_0101_0101) & !w & 0x8080_8080_8080_8080
    }
    zero_byte(word) | zero_byte(!word) != 0
}

/// MXFP4's scales of the [`ROW_COLS`] rows from their side bytes, block after block, read
/// eight blocks at a time: each row's eight bytes in one load, the 64 converted to
/// `2^(e − 127)` at once as `e << 23` (its bits for `e` in 1..=254), then each block's one
/// two-register permute a quad. Where fewer than eight blocks remain, or the eight hold a 0
/// or a 255 (2^-127 and NaN, which `e << 23` does not give), block by block as
/// [`side_bytes`] and [`e8m0_scales`] give them. The side bytes of the rows the next block of
/// rows reads are prefetched as [`side_bytes`] does.
struct SideScales<'s> {
    /// Each row's side bytes, one a block.
    sides: &'s [&'s [u8]; ROW_COLS],
    /// The distance to the rows the next block of rows reads ([`next_rows`]' for the sides).
    ahead: Option<usize>,
    /// The current eight blocks' scales: quad `q`'s rows `4q`, `4q + 1` in `[q][0]` and rows
    /// `4q + 2`, `4q + 3` in `[q][1]`, each row's eight as elements `8 i .. 8 i + 8` of the
    /// pair (row `4q + i`); `None` where they go block by block.
    eight: Option<[[__m512; 2]; ROW_COLS / 4]>,
    /// The pair's element of the current block for each 128-bit lane `i`: `8 i + b % 8`.
    at: __m512i,
}

impl<'s> SideScales<'s> {
    /// The scales of `sides` (each row's side bytes, as long as each other) from block 0.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    unsafe fn new(sides: &'s [&'s [u8]; ROW_COLS], ahead: Option<usize>) -> Self {
        // SAFETY: the caller's CPU has the features.
        SideScales { sides, ahead, eight: None, at: unsafe { _mm512_setzero_si512() } }
    }

    /// Block `b`'s scales of `blocks`, as [`quad_scales`] gives them; `b` counts up from 0 by
    /// one.
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    unsafe fn block(&mut self, b: usize, blocks: usize) -> [__m512; ROW_COLS / 4] {
        // SAFETY: the caller's CPU has the features.
        unsafe {
            if b.is_multiple_of(8) {
                self.eight = if b + 8 <= blocks { self.load(b) } else { None };
                self.at = _mm512_set_epi32(24, 24, 24, 24, 16, 16, 16, 16, 8, 8, 8, 8, 0, 0, 0, 0);
            }
            match &self.eight {
                Some(eight) => {
                    let scales = eight.map(|[low, high]| _mm512_permutex2var_ps(low, self.at, high));
                    self.at = _mm512_add_epi32(self.at, _mm512_set1_epi32(1));
                    scales
                }
                None => e8m0_scales(side_bytes(Some(self.sides), b, self.ahead)),
            }
        }
    }

    /// Blocks `b .. b + 8` of every row ([`Self::eight`]), or `None` where one of their bytes
    /// is 0 or 255; the next rows' side bytes there prefetched (each line they reach).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline(always)]
    unsafe fn load(&self, b: usize) -> Option<[[__m512; 2]; ROW_COLS / 4]> {
        let mut words = [0u64; ROW_COLS];
        let mut special = false;
        for (word, row) in words.iter_mut().zip(self.sides) {
            let mut bytes = [0; 8];
            bytes.copy_from_slice(&row[b..b + 8]);
            *word = u64::from_le_bytes(bytes);
            special |= special_scales(*word);
            if let Some(ahead) = self.ahead {
                let first = row[b..].as_ptr().wrapping_add(ahead);
                let last = first.wrapping_add(7);
                // SAFETY: every x86-64 CPU has SSE; a prefetch reads nothing, so any address
                // is allowed.
                unsafe {
                    _mm_prefetch::<_MM_HINT_T1>(first.cast());
                    if (last as usize) / 64 != (first as usize) / 64 {
                        _mm_prefetch::<_MM_HINT_T1>(last.cast());
                    }
                }
            }
        }
        if special {
            return None;
        }
        // SAFETY: the caller's CPU has the features.
        unsafe {
            Some([
                [exponents(words[0], words[1]), exponents(words[2], words[3])],
                [exponents(words[4], words[5]), exponents(words[6], words[7])],
            ])
        }
    }
}

/// Two rows' eight E8M0 scale bytes (`low`'s, then `high`'s) as `e << 23`, the bits of
/// `2^(e − 127)` for `e` in 1..=254: sixteen elements, `low`'s first. (No closure: one would
/// be compiled without the kernels' features, as a call.)
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn exponents(low: u64, high: u64) -> __m512 {
    // SAFETY: the caller's CPU has the features.
    unsafe {
        let e = _mm512_cvtepu8_epi32(_mm_set_epi64x(high as i64, low as i64));
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
    }
}

/// The first [`ROW_COLS`] values of `v` (one per row) spread over the quads: quad `q`'s
/// register holds its row `i`'s value repeated across 128-bit lane `i`.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn quad_scales(v: __m512) -> [__m512; ROW_COLS / 4] {
    // SAFETY: the caller's CPU has the features.
    unsafe {
        [
            _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0), v),
            _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4), v),
        ]
    }
}

/// Four rows' 16 bytes from `at` of each, row `i` in 128-bit lane `i`.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn lanes_of(blocks: [&[u8]; 4], at: usize) -> __m512i {
    // SAFETY: the caller's CPU has the features; 16 bytes in bounds of each block (the
    // slices are checked).
    unsafe {
        let v = _mm512_castsi128_si512(_mm_loadu_si128(blocks[0][at..at + 16].as_ptr().cast()));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(blocks[1][at..at + 16].as_ptr().cast()));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(blocks[2][at..at + 16].as_ptr().cast()));
        _mm512_inserti32x4::<3>(v, _mm_loadu_si128(blocks[3][at..at + 16].as_ptr().cast()))
    }
}

/// `vpshufb` controls, the same in every 128-bit lane, for each group `g` of four values:
/// bytes `4 g .. 4 g + 4` of the lane into the sign bytes of its four elements (the other
/// bytes zero: each element is then its signed byte times 2^24).
pub(super) const SIGN_BYTES: [[i8; 16]; 4] = {
    let mut controls = [[-128i8; 16]; 4];
    let mut g = 0;
    while g < 4 {
        let mut j = 0;
        while j < 4 {
            controls[g][4 * j + 3] = (4 * g + j) as i8;
            j += 1;
        }
        g += 1;
    }
    controls
};

/// The `vpshufb` control transposing each 128-bit lane's 16 bytes as a 4 x 4 matrix: byte
/// `m` of element `j` is then byte `4 m + j` of the lane. With Q4_0's nibble order (value
/// `v < 16` the low nibble of byte `v`, `v + 16` its high one), group `g`'s value `j` is
/// then the low nibble of element `j` shifted down [`nibble_shift`]`(g)` bits: one shift a
/// group, on a port the table lookups leave free, where a shuffle a group would share theirs.
pub(super) const TRANSPOSED: [i8; 16] = {
    let mut control = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        control[i] = (4 * (i % 4) + i / 4) as i8;
        i += 1;
    }
    control
};

/// Bits element `j` of a [`TRANSPOSED`] lane is shifted down so that its low nibble is value
/// `4 g + j` of a block in Q4_0's nibble order: byte `g`'s low nibble for `g < 4`, byte
/// `g − 4`'s high one after.
pub(super) const fn nibble_shift(g: usize) -> u32 {
    (8 * (g % 4) + 4 * (g / 4)) as u32
}

/// `vpshufb` controls for MXFP4's code order (value `2 i` the low nibble of byte `i`,
/// `2 i + 1` its high one): for half `h` of the block (groups `4 h .. 4 h + 4`), byte `m` of
/// element `j` is byte `8 h + 2 m + j / 2` of the lane, so group `4 h + m`'s value `j` is
/// the low nibble of element `j` shifted down `8 m + 4 (j % 2)` bits.
pub(super) const PAIRED: [[i8; 16]; 2] = {
    let mut controls = [[0i8; 16]; 2];
    let mut h = 0;
    while h < 2 {
        let mut i = 0;
        while i < 16 {
            let (j, m) = (i / 4, i % 4);
            controls[h][i] = (8 * h + 2 * m + j / 2) as i8;
            i += 1;
        }
        h += 1;
    }
    controls
};

/// A control in every 128-bit lane of a register.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn control(bytes: &[i8; 16]) -> __m512i {
    // SAFETY: the caller's CPU has the features; 16 bytes in bounds.
    unsafe { _mm512_broadcast_i32x4(_mm_loadu_si128(bytes.as_ptr().cast())) }
}

/// Token `t`'s x groups of block `b` repeated across registers.
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn block_x<const T: usize>(xs: &[&[[f32; 4]]; T], b: usize) -> [[__m512; 8]; T] {
    // SAFETY: the caller's CPU has the features; 4 floats in bounds.
    unsafe {
        let mut xb = [[_mm512_setzero_ps(); 8]; T];
        for t in 0..T {
            for g in 0..8 {
                xb[t][g] = _mm512_broadcast_f32x4(_mm_loadu_ps(xs[t][8 * b + g].as_ptr()));
            }
        }
        xb
    }
}

/// A block format of 32 values that [`strict_blocks_avx512`] decodes in registers: per block
/// of K, the [`ROW_COLS`] rows' scales at once, then one quad (four rows' blocks) at a time,
/// group by group: each value as `moeflow::quant` decodes it (one table value or one exact
/// product).
pub(super) trait Blocks {
    /// Bytes of one block.
    const BYTES: usize;
    /// A quad's codes ready to give their groups.
    type Codes: Copy;
    /// The rows' scales of their blocks `blocks`, given the scales of the block the rows'
    /// side bytes give ([`SideScales`]: MXFP4's; zeros, unused, for formats whose blocks
    /// hold their scales): quad `q`'s in register `q`, its row `i`'s repeated across 128-bit
    /// lane `i`.
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512BW and F16C; each block is `BYTES` long.
    unsafe fn scales(blocks: &[&[u8]; ROW_COLS], side: [__m512; ROW_COLS / 4]) -> [__m512; ROW_COLS / 4];
    /// Four rows' codes.
    ///
    /// # Safety
    /// As [`Blocks::scales`].
    unsafe fn codes(blocks: [&[u8]; 4]) -> Self::Codes;
    /// Group `g` (values `4 g .. 4 g + 4`) of the four rows, row `i` in 128-bit lane `i`,
    /// with their `scale` ([`Blocks::scales`]' register of the quad).
    ///
    /// # Safety
    /// As [`Blocks::scales`].
    unsafe fn group(codes: Self::Codes, scale: __m512, g: usize) -> __m512;
}

/// Q8_0: a block's f16 scale `d`, then 32 signed bytes; value `q · d`.
pub(super) struct Q8_0;

impl Blocks for Q8_0 {
    const BYTES: usize = Q8_0_BLOCK_BYTES;
    /// Codes 0-15 and 16-31 of the four rows.
    type Codes = [__m512i; 2];

    /// The scales times 2^-24 ([`Q8_0::group`] converts each code as 2^24 times it): exact,
    /// as an f16's value times 2^-24 is a normal f32 (or 0, ±inf, NaN as it was).
    #[inline(always)]
    unsafe fn scales(blocks: &[&[u8]; ROW_COLS], _: [__m512; ROW_COLS / 4]) -> [__m512; ROW_COLS / 4] {
        // SAFETY: the caller's CPU has the features.
        unsafe {
            let [a, b] = half_scales(blocks);
            let unit = _mm512_set1_ps(1.0 / 16_777_216.0);
            [_mm512_mul_ps(a, unit), _mm512_mul_ps(b, unit)]
        }
    }

    #[inline(always)]
    unsafe fn codes(blocks: [&[u8]; 4]) -> Self::Codes {
        // SAFETY: as above.
        unsafe { [lanes_of(blocks, 2), lanes_of(blocks, 18)] }
    }

    /// Each row's four codes moved into the sign bytes of four elements (the other bytes
    /// zero), so each element is the code times 2^24, converted exactly (eight significant
    /// bits), times the row's scale times 2^-24: the exact product `code · d` `quant`
    /// computes, with no shift to sign-extend the codes.
    #[inline(always)]
    unsafe fn group(halves: Self::Codes, d: __m512, g: usize) -> __m512 {
        // SAFETY: the caller's CPU has the features.
        unsafe {
            let codes = _mm512_shuffle_epi8(halves[g / 4], control(&SIGN_BYTES[g % 4]));
            _mm512_mul_ps(_mm512_cvtepi32_ps(codes), d)
        }
    }
}

/// Q4_0: a block's f16 scale `d`, then 16 bytes whose low nibbles are values 0-15 and
/// high nibbles 16-31; value `(nibble − 8) · d`.
pub(super) struct Q4_0;

impl Blocks for Q4_0 {
    const BYTES: usize = Q4_0_BLOCK_BYTES;
    /// The codes, [`TRANSPOSED`].
    type Codes = __m512i;

    #[inline(always)]
    unsafe fn scales(blocks: &[&[u8]; ROW_COLS], _: [__m512; ROW_COLS / 4]) -> [__m512; ROW_COLS / 4] {
        // SAFETY: the caller's CPU has the features.
        unsafe { half_scales(blocks) }
    }

    #[inline(always)]
    unsafe fn codes(blocks: [&[u8]; 4]) -> Self::Codes {
        // SAFETY: the caller's CPU has the features.
        unsafe { nibble_codes(blocks, 2) }
    }

    /// Each row's four nibbles shifted into the low bits of four elements (the table reads
    /// them), looked up as `nibble − 8`, times the row's scale.
    #[inline(always)]
    unsafe fn group(codes: Self::Codes, d: __m512, g: usize) -> __m512 {
        // SAFETY: the caller's CPU has the features.
        unsafe {
            let values =
                _mm512_setr_ps(-8., -7., -6., -5., -4., -3., -2., -1., 0., 1., 2., 3., 4., 5., 6., 7.);
            nibble_group(codes, g, values, d)
        }
    }
}

/// MXFP4: 16 bytes, value `2 j` the low nibble of byte `j` and `2 j + 1` its high one,
/// each an FP4 e2m1 code; the block's scale byte `e` (beside the codes) gives
/// `2^(e − 127)` (`quant::e8m0`); value `FP4_E2M1[code] · 2^(e − 127)`.
pub(super) struct Mxfp4;

impl Blocks for Mxfp4 {
    const BYTES: usize = MXFP4_BLOCK_BYTES;
    /// The codes of groups 0-3 and 4-7, [`PAIRED`].
    type Codes = [__m512i; 2];

    #[inline(always)]
    unsafe fn scales(_: &[&[u8]; ROW_COLS], side: [__m512; ROW_COLS / 4]) -> [__m512; ROW_COLS / 4] {
        side
    }

    #[inline(always)]
    unsafe fn codes(blocks: [&[u8]; 4]) -> Self::Codes {
        // SAFETY: the caller's CPU has the features.
        unsafe {
            let codes = lanes_of(blocks, 0);
            [_mm512_shuffle_epi8(codes, control(&PAIRED[0])), _mm512_shuffle_epi8(codes, control(&PAIRED[1]))]
        }
    }

    /// Each row's four codes shifted into the low bits of four elements ([`PAIRED`]; the
    /// table reads them), looked up in FP4's table, times the row's scale.
    #[inline(always)]
    unsafe fn group(codes: Self::Codes, s: __m512, g: usize) -> __m512 {
        let m = 8 * (g % 4) as i32;
        // SAFETY: the caller's CPU has the features; the table's 16 floats.
        unsafe {
            let table = _mm512_loadu_ps(FP4_E2M1.as_ptr());
            let nibbles = _mm512_srlv_epi32(codes[g / 4], _mm512_set4_epi32(m + 4, m, m + 4, m));
            _mm512_mul_ps(_mm512_permutexvar_ps(nibbles, table), s)
        }
    }
}

/// ggml's MXFP4 (llama.cpp's `block_mxfp4`): the block's E8M0 scale byte, then 16 bytes whose
/// low nibbles are values 0-15 and high nibbles 16-31, each an FP4 e2m1 code; value
/// `FP4_E2M1[code] · 2^(e − 127)`.
pub(super) struct GgmlMxfp4;

impl Blocks for GgmlMxfp4 {
    const BYTES: usize = GGML_MXFP4_BLOCK_BYTES;
    /// The codes, [`TRANSPOSED`].
    type Codes = __m512i;

    #[inline(always)]
    unsafe fn scales(blocks: &[&[u8]; ROW_COLS], _: [__m512; ROW_COLS / 4]) -> [__m512; ROW_COLS / 4] {
        // SAFETY: the caller's CPU has the features.
        unsafe { e8m0_scales(first_bytes(blocks)) }
    }

    #[inline(always)]
    unsafe fn codes(blocks: [&[u8]; 4]) -> Self::Codes {
        // SAFETY: the caller's CPU has the features.
        unsafe { nibble_codes(blocks, 1) }
    }

    /// Each row's four nibbles shifted into the low bits of four elements (the table reads
    /// them), looked up in FP4's table, times the row's scale.
    #[inline(always)]
    unsafe fn group(codes: Self::Codes, s: __m512, g: usize) -> __m512 {
        // SAFETY: the caller's CPU has the features; the table's 16 floats.
        unsafe { nibble_group(codes, g, _mm512_loadu_ps(FP4_E2M1.as_ptr()), s) }
    }
}

/// Four rows' 16 code bytes from `at` of each block in Q4_0's nibble order (values 0-15 the
/// low nibbles, 16-31 the high ones), [`TRANSPOSED`].
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW.
#[inline(always)]
unsafe fn nibble_codes(blocks: [&[u8]; 4], at: usize) -> __m512i {
    // SAFETY: the caller's CPU has the features.
    unsafe { _mm512_shuffle_epi8(lanes_of(blocks, at), control(&TRANSPOSED)) }
}

/// Group `g` of four rows' blocks from their [`nibble_codes`]: each row's four nibbles
/// shifted into the low bits of four elements (a table reads them), looked up in `table`,
/// times the row's `scale`: one exact product, as `quant` decodes it.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512BW.
#[inline(always)]
unsafe fn nibble_group(codes: __m512i, g: usize, table: __m512, scale: __m512) -> __m512 {
    // SAFETY: the caller's CPU has the features.
    unsafe {
        let nibbles = _mm512_srlv_epi32(codes, _mm512_set1_epi32(nibble_shift(g) as i32));
        _mm512_mul_ps(_mm512_permutexvar_ps(nibbles, table), scale)
    }
}

/// `T` tokens over [`ROW_COLS`] rows of whole blocks of format `B` (each row's blocks of
/// the chunk as stored; `sides` each row's side byte per block, for MXFP4), into
/// accumulator quads `quad .. quad + 2`: per block, the eight rows' scales at once, then
/// per quad the four rows' blocks decoded group by group in registers ([`Blocks`]), each
/// group multiplied into every token's accumulator of the quad, the rows prefetched ahead
/// ([`prefetch_ahead`]; for whole stored rows, the next rows' side bytes too).
/// Per group and quad the decoding costs a table lookup and the scale's product beside the
/// fused multiply-add; the codes reach the table by a shift ([`TRANSPOSED`], [`PAIRED`]) or,
/// for Q8_0, a shuffle.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
#[allow(clippy::needless_range_loop, reason = "block `b` of eight rows and of x at once")]
pub(super) fn strict_blocks_avx512<B: Blocks, const T: usize>(
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
    // SAFETY: this function has the features.
    let mut side_scales = sides.map(|sides| unsafe { SideScales::new(sides, side_ahead) });
    let mut a = load(&acc, quad);
    let xs = xs.map(|x| &x[..blocks * 8]);
    for b in 0..blocks {
        // SAFETY: this function has the features.
        let xb = unsafe { block_x(&xs, b) };
        let at = b * B::BYTES..(b + 1) * B::BYTES;
        let mut row_blocks: [&[u8]; ROW_COLS] = [&[]; ROW_COLS];
        for (block, row) in row_blocks.iter_mut().zip(rows) {
            *block = &row[at.clone()];
        }
        // SAFETY: as above; each block is B::BYTES long.
        let scales = unsafe {
            let side = match &mut side_scales {
                Some(side) => side.block(b, blocks),
                None => [_mm512_setzero_ps(); ROW_COLS / 4],
            };
            B::scales(&row_blocks, side)
        };
        // The quads and their eight groups unrolled, so each group's constants (controls,
        // shifts) are known where they are used and the accumulators stay in registers.
        macro_rules! groups {
            ($q:literal, $codes:ident, $($g:literal)+) => {$(
                // SAFETY: as above.
                let w = unsafe { B::group($codes, scales[$q], $g) };
                for t in 0..T {
                    a[t][$q] = _mm512_fmadd_ps(xb[t][$g], w, a[t][$q]);
                }
            )+};
        }
        macro_rules! quads {
            ($($q:literal)+) => {$({
                let quad_blocks =
                    [row_blocks[4 * $q], row_blocks[4 * $q + 1], row_blocks[4 * $q + 2], row_blocks[4 * $q + 3]];
                prefetch_ahead(&quad_blocks, BLOCK_PREFETCH, ahead);
                // SAFETY: as above.
                let codes = unsafe { B::codes(quad_blocks) };
                groups!($q, codes, 0 1 2 3 4 5 6 7);
            })+};
        }
        quads!(0 1);
    }
    store(a, acc, quad);
}

/// Accumulator quads `quad .. quad + 2` of each token into registers.
#[inline]
#[target_feature(enable = "avx512f")]
fn load<const T: usize>(acc: &[&mut Quads; T], quad: usize) -> [[__m512; ROW_COLS / 4]; T] {
    let mut a = [[_mm512_setzero_ps(); ROW_COLS / 4]; T];
    for t in 0..T {
        for q in 0..ROW_COLS / 4 {
            // SAFETY: 16 floats in bounds.
            a[t][q] = unsafe { _mm512_loadu_ps(acc[t][quad + q].as_ptr()) };
        }
    }
    a
}

/// [`load`]'s registers back into the accumulators.
#[inline]
#[target_feature(enable = "avx512f")]
fn store<const T: usize>(a: [[__m512; ROW_COLS / 4]; T], acc: [&mut Quads; T], quad: usize) {
    for (dst, src) in acc.into_iter().zip(a) {
        for q in 0..ROW_COLS / 4 {
            // SAFETY: 16 floats in bounds.
            unsafe { _mm512_storeu_ps(dst[quad + q].as_mut_ptr(), src[q]) };
        }
    }
}
