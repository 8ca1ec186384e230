//! The host experts' strict-order kernels in x86-64's vector registers (AVX-512, and AVX2 for
//! the tile), called by `kernel.rs` where the CPU has the features: the tile kernels
//! ([`strict_avx512`], [`strict_avx2`]) and the rows kernels, which interleave four rows'
//! values in registers ([`strict_rows_avx512`]: f32 or f16 rows) or decode four rows'
//! quantised blocks there ([`strict_blocks_avx512`]: Q8_0, Q4_0, MXFP4). Same order and bits
//! as the portable code: lane `j` of a column's four takes `k = 4g + j`, one fused
//! multiply-add per value, each value decoded as `moeflow::quant` decodes it.

use std::arch::x86_64::*;

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

/// Tokens [`strict_rows_avx512`] takes at most.
pub(super) const ROW_TOKENS: usize = 2;

/// How far ahead of its reads each row is prefetched, in bytes: the rows stream from memory
/// or the last-level cache, [`ROW_COLS`] at a time.
const PREFETCH: usize = 1024;

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
/// every token's accumulator of the quad.
#[target_feature(enable = "avx512f,f16c")]
pub(super) fn strict_rows_avx512<S: Steps, const T: usize>(
    rows: &[&[u8]; ROW_COLS],
    quad: usize,
    xs: [&[[f32; 4]]; T],
    acc: [&mut Quads; T],
) {
    const Q: usize = ROW_COLS / 4;
    let steps = rows[0].len() / S::BYTES;
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
            let quad_rows = [
                &rows[4 * q][at.clone()],
                &rows[4 * q + 1][at.clone()],
                &rows[4 * q + 2][at.clone()],
                &rows[4 * q + 3][at.clone()],
            ];
            for row in quad_rows {
                // A prefetch reads nothing, so any address is allowed.
                _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(PREFETCH).cast());
            }
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

/// How far ahead of a quad's blocks their rows are prefetched, in bytes: the rows stream
/// from memory or the last-level cache eight at a time, each a few blocks per chunk of K,
/// too short for the hardware's prefetcher to follow, and the decoding between the loads
/// keeps few of them in flight.
const BLOCK_PREFETCH: usize = 512;

/// Prefetches each of four rows' bytes [`BLOCK_PREFETCH`] past `blocks` (the same rows' next
/// blocks: a row's chunks lie one after another).
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch_ahead(blocks: &[&[u8]; 4]) {
    for block in blocks {
        // A prefetch reads nothing, so any address is allowed.
        _mm_prefetch::<_MM_HINT_T0>(block.as_ptr().wrapping_add(BLOCK_PREFETCH).cast());
    }
}

/// Four rows' f16 block scales (the first two bytes of each block) as f32 (F16C: exactly
/// `half`'s conversion), each repeated across its row's 128-bit lane.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
fn half_scales(blocks: [&[u8]; 4]) -> __m512 {
    let h = [0, 1, 2, 3].map(|i| i16::from_le_bytes([blocks[i][0], blocks[i][1]]));
    lanes_to_rows(_mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, h[3], h[2], h[1], h[0])))
}

/// Four rows' E8M0 scale bytes as `2^(e − 127)` (`quant::e8m0`: 2^-127 for 0, NaN for 255),
/// each repeated across its row's 128-bit lane.
#[inline]
#[target_feature(enable = "avx512f")]
fn e8m0_scales(bytes: [u8; 4]) -> __m512 {
    let [s0, s1, s2, s3] = bytes.map(|e| match e {
        0 => 0x40_0000,
        255 => f32::NAN.to_bits() as i32,
        e => i32::from(e) << 23,
    });
    lanes_to_rows(_mm_castsi128_ps(_mm_setr_epi32(s0, s1, s2, s3)))
}

/// Four values, value `i` repeated across 128-bit lane `i`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lanes_to_rows(v: __m128) -> __m512 {
    _mm512_permutexvar_ps(
        _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
        _mm512_castps128_ps512(v),
    )
}

/// Four rows' 16 bytes from `at` of each, row `i` in 128-bit lane `i`.
#[inline]
#[target_feature(enable = "avx512f")]
fn lanes_of(blocks: [&[u8]; 4], at: usize) -> __m512i {
    // SAFETY: 16 bytes in bounds of each block (the callers' blocks are whole).
    let [l0, l1, l2, l3] = unsafe {
        [
            _mm_loadu_si128(blocks[0][at..at + 16].as_ptr().cast()),
            _mm_loadu_si128(blocks[1][at..at + 16].as_ptr().cast()),
            _mm_loadu_si128(blocks[2][at..at + 16].as_ptr().cast()),
            _mm_loadu_si128(blocks[3][at..at + 16].as_ptr().cast()),
        ]
    };
    let v = _mm512_castsi128_si512(l0);
    let v = _mm512_inserti32x4::<1>(v, l1);
    let v = _mm512_inserti32x4::<2>(v, l2);
    _mm512_inserti32x4::<3>(v, l3)
}

/// `vpshufb` controls, the same in every 128-bit lane, for each group `g` of four values:
/// bytes `4 g .. 4 g + 4` of the lane into the sign bytes of its four elements (the other
/// bytes zero: shifted down, they are sign-extended).
const SIGN_BYTES: [[i8; 16]; 4] = [spread(0, 3), spread(1, 3), spread(2, 3), spread(3, 3)];

/// As [`SIGN_BYTES`], into the low bytes (zero-extended).
const LOW_BYTES: [[i8; 16]; 4] = [spread(0, 0), spread(1, 0), spread(2, 0), spread(3, 0)];

/// Controls moving bytes `2 g`, `2 g`, `2 g + 1`, `2 g + 1` of the lane into the low bytes
/// of its four elements, for each group `g` of eight (MXFP4's two values a byte).
const PAIR_BYTES: [[i8; 16]; 8] = {
    let mut controls = [[-128i8; 16]; 8];
    let mut g = 0;
    while g < 8 {
        let mut j = 0;
        while j < 4 {
            controls[g][4 * j] = (2 * g + j / 2) as i8;
            j += 1;
        }
        g += 1;
    }
    controls
};

/// The control moving bytes `4 g .. 4 g + 4` of a lane into byte `top` of its four
/// elements, zeros elsewhere.
const fn spread(g: usize, top: usize) -> [i8; 16] {
    let mut control = [-128i8; 16];
    let mut j = 0;
    while j < 4 {
        control[4 * j + top] = (4 * g + j) as i8;
        j += 1;
    }
    control
}

/// A control in every 128-bit lane of a register.
#[inline]
#[target_feature(enable = "avx512f")]
fn control(bytes: &[i8; 16]) -> __m512i {
    // SAFETY: 16 bytes in bounds.
    _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) })
}

/// The accumulator steps shared by the block kernels: token `t`'s x groups of block `b`
/// repeated across registers.
#[inline]
#[target_feature(enable = "avx512f")]
fn block_x<const T: usize>(xs: &[&[[f32; 4]]; T], b: usize) -> [[__m512; 8]; T] {
    let mut xb = [[_mm512_setzero_ps(); 8]; T];
    for t in 0..T {
        for g in 0..8 {
            // SAFETY: 4 floats in bounds.
            xb[t][g] = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(xs[t][8 * b + g].as_ptr()) });
        }
    }
    xb
}

/// A block format of 32 values that [`strict_blocks_avx512`] decodes in registers, one
/// quad (four rows' blocks) at a time, group by group: each value as `moeflow::quant`
/// decodes it (one table value or one exact product).
pub(super) trait Blocks {
    /// Bytes of one block.
    const BYTES: usize;
    /// A quad's blocks ready to give their groups.
    type Quad: Copy;
    /// Four rows' blocks, with each row's side byte of the block (MXFP4's scale; unused
    /// by formats whose blocks hold their scales).
    ///
    /// # Safety
    /// The CPU has AVX-512F, AVX-512BW and F16C; each block is `BYTES` long.
    unsafe fn quad(blocks: [&[u8]; 4], side: [u8; 4]) -> Self::Quad;
    /// Group `g` (values `4 g .. 4 g + 4`) of the four rows, row `i` in 128-bit lane `i`.
    ///
    /// # Safety
    /// As [`Blocks::quad`].
    unsafe fn group(quad: Self::Quad, g: usize) -> __m512;
}

/// Q8_0: a block's f16 scale `d`, then 32 signed bytes; value `q · d`.
pub(super) struct Q8_0;

impl Blocks for Q8_0 {
    const BYTES: usize = Q8_0_BLOCK_BYTES;
    /// The scales; codes 0-15 and 16-31 of the four rows.
    type Quad = (__m512, [__m512i; 2]);

    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn quad(blocks: [&[u8]; 4], _: [u8; 4]) -> Self::Quad {
        (half_scales(blocks), [lanes_of(blocks, 2), lanes_of(blocks, 18)])
    }

    /// Each row's four codes moved into the sign bytes of four elements and shifted down
    /// (sign-extended), converted, times the row's scale.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn group((d, halves): Self::Quad, g: usize) -> __m512 {
        let codes = _mm512_srai_epi32::<24>(_mm512_shuffle_epi8(halves[g / 4], control(&SIGN_BYTES[g % 4])));
        _mm512_mul_ps(_mm512_cvtepi32_ps(codes), d)
    }
}

/// Q4_0: a block's f16 scale `d`, then 16 bytes whose low nibbles are values 0-15 and
/// high nibbles 16-31; value `(nibble − 8) · d`.
pub(super) struct Q4_0;

impl Blocks for Q4_0 {
    const BYTES: usize = Q4_0_BLOCK_BYTES;
    /// The scales; the codes, and the codes shifted down four bits.
    type Quad = (__m512, [__m512i; 2]);

    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn quad(blocks: [&[u8]; 4], _: [u8; 4]) -> Self::Quad {
        (half_scales(blocks), nibble_halves(blocks, 2))
    }

    /// Each row's four nibbles moved into four elements (the table reads their low four
    /// bits), looked up as `nibble − 8`, times the row's scale.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn group((d, halves): Self::Quad, g: usize) -> __m512 {
        let values = _mm512_setr_ps(-8., -7., -6., -5., -4., -3., -2., -1., 0., 1., 2., 3., 4., 5., 6., 7.);
        nibble_group(halves, g, values, d)
    }
}

/// MXFP4: 16 bytes, value `2 j` the low nibble of byte `j` and `2 j + 1` its high one,
/// each an FP4 e2m1 code; the block's scale byte `e` (beside the codes) gives
/// `2^(e − 127)` (`quant::e8m0`); value `FP4_E2M1[code] · 2^(e − 127)`.
pub(super) struct Mxfp4;

impl Blocks for Mxfp4 {
    const BYTES: usize = MXFP4_BLOCK_BYTES;
    /// The scales; the codes.
    type Quad = (__m512, __m512i);

    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn quad(blocks: [&[u8]; 4], side: [u8; 4]) -> Self::Quad {
        (e8m0_scales(side), lanes_of(blocks, 0))
    }

    /// Bytes `2 g` and `2 g + 1` of each row, each into two elements, the second of each
    /// pair shifted down four bits (the table reads the low four), looked up in FP4's
    /// table, times the row's scale.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn group((s, codes): Self::Quad, g: usize) -> __m512 {
        // SAFETY: the table's 16 floats.
        let table = unsafe { _mm512_loadu_ps(FP4_E2M1.as_ptr()) };
        let pairs = _mm512_shuffle_epi8(codes, control(&PAIR_BYTES[g]));
        let nibbles = _mm512_srlv_epi32(pairs, _mm512_set4_epi32(4, 0, 4, 0));
        _mm512_mul_ps(_mm512_permutexvar_ps(nibbles, table), s)
    }
}

/// ggml's MXFP4 (llama.cpp's `block_mxfp4`): the block's E8M0 scale byte, then 16 bytes whose
/// low nibbles are values 0-15 and high nibbles 16-31, each an FP4 e2m1 code; value
/// `FP4_E2M1[code] · 2^(e − 127)`.
pub(super) struct GgmlMxfp4;

impl Blocks for GgmlMxfp4 {
    const BYTES: usize = GGML_MXFP4_BLOCK_BYTES;
    /// The scales; the codes, and the codes shifted down four bits.
    type Quad = (__m512, [__m512i; 2]);

    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn quad(blocks: [&[u8]; 4], _: [u8; 4]) -> Self::Quad {
        let scales = e8m0_scales([blocks[0][0], blocks[1][0], blocks[2][0], blocks[3][0]]);
        (scales, nibble_halves(blocks, 1))
    }

    /// Each row's four nibbles moved into four elements (the table reads their low four
    /// bits), looked up in FP4's table, times the row's scale.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    unsafe fn group((s, halves): Self::Quad, g: usize) -> __m512 {
        // SAFETY: the table's 16 floats.
        let table = unsafe { _mm512_loadu_ps(FP4_E2M1.as_ptr()) };
        nibble_group(halves, g, table, s)
    }
}

/// Four rows' 16 code bytes from `at` of each block, as they are and shifted down four bits:
/// the low four bits of each byte are then its low nibble, or its high one (Q4_0's order:
/// values 0-15 and 16-31 of the block).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn nibble_halves(blocks: [&[u8]; 4], at: usize) -> [__m512i; 2] {
    let codes = lanes_of(blocks, at);
    [codes, _mm512_srli_epi16::<4>(codes)]
}

/// Group `g` of four rows' blocks in Q4_0's nibble order ([`nibble_halves`]): each row's four
/// nibbles moved into four elements (a table reads their low four bits), looked up in
/// `table`, times the row's `scale`: one exact product, as `quant` decodes it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn nibble_group(halves: [__m512i; 2], g: usize, table: __m512, scale: __m512) -> __m512 {
    let nibbles = _mm512_shuffle_epi8(halves[g / 4], control(&LOW_BYTES[g % 4]));
    _mm512_mul_ps(_mm512_permutexvar_ps(nibbles, table), scale)
}

/// `T` tokens over [`ROW_COLS`] rows of whole blocks of format `B` (each row's blocks of
/// the chunk as stored; `sides` each row's side byte per block, for MXFP4), into
/// accumulator quads `quad .. quad + 2`: per block and quad, the four rows' blocks
/// decoded group by group in registers ([`Blocks`]), each group multiplied into every
/// token's accumulator of the quad, the rows prefetched ahead.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
#[allow(clippy::needless_range_loop, reason = "block `b` of eight rows and of x at once")]
pub(super) fn strict_blocks_avx512<B: Blocks, const T: usize>(
    rows: &[&[u8]; ROW_COLS],
    sides: Option<&[&[u8]; ROW_COLS]>,
    quad: usize,
    xs: [&[[f32; 4]]; T],
    acc: [&mut Quads; T],
) {
    const Q: usize = ROW_COLS / 4;
    let blocks = rows[0].len() / B::BYTES;
    let mut a = load(&acc, quad);
    let xs = xs.map(|x| &x[..blocks * 8]);
    for b in 0..blocks {
        let xb = block_x(&xs, b);
        for q in 0..Q {
            let at = b * B::BYTES..(b + 1) * B::BYTES;
            let quad_blocks: [&[u8]; 4] = [
                &rows[4 * q][at.clone()],
                &rows[4 * q + 1][at.clone()],
                &rows[4 * q + 2][at.clone()],
                &rows[4 * q + 3][at],
            ];
            prefetch_ahead(&quad_blocks);
            let side = match sides {
                Some(sides) => {
                    [sides[4 * q][b], sides[4 * q + 1][b], sides[4 * q + 2][b], sides[4 * q + 3][b]]
                }
                None => [0; 4],
            };
            // SAFETY: this function has the features; each block is B::BYTES long.
            let decoded = unsafe { B::quad(quad_blocks, side) };
            for g in 0..8 {
                // SAFETY: as above.
                let w = unsafe { B::group(decoded, g) };
                for t in 0..T {
                    a[t][q] = _mm512_fmadd_ps(xb[t][g], w, a[t][q]);
                }
            }
        }
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
