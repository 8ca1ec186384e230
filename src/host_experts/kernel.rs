//! The host experts' dot products in the layer's accumulation orders, compiled for each SIMD
//! target and chosen at run time for the CPU it runs on (`multiversion`: AVX-512, AVX2 with
//! FMA, NEON, else the build's baseline).
//!
//! Every column keeps the order of `reference::gemm::dot_in_order` exactly:
//! - strict: four accumulators per column, lane `j` taking `k = 4g + j` (`acc = fma(x, w,
//!   acc)` from 0.0); the column's dot is `(a0 + a1) + (a2 + a3)`. The four lanes are a
//!   quarter of a vector: a tile holds [`COLS`] columns' weights group by group, four columns'
//!   groups side by side in one vector ([`Quads`]), and each token's group of four x values,
//!   repeated across the vector, is multiplied into [`QUADS`] vectors ([`strict_quads`]).
//! - fast: one accumulator per column, `acc = fma(x[k], w[k], acc)` for k ascending: the SIMD
//!   lanes run across columns, so a tile holds [`R`] columns' weights transposed, `[k][r]`,
//!   and each x value is multiplied into the `R` columns at once ([`fast_chunk`]).
//!
//! K is padded with zeros to a multiple of [`PAD`] in x and in the tiles (the references
//! read values past K as zeros). `f32::mul_add` is one fused multiply-add on every target (a libm call where
//! the CPU has no FMA), so every target gives the same bits.

use multiversion::multiversion;

#[cfg(target_arch = "x86_64")]
use crate::quant::{BLOCK_VALUES, Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

/// Output columns in a tile: the SIMD lanes of one accumulator (one AVX-512 register, two
/// AVX2 registers, four NEON registers).
pub(super) const R: usize = 16;

/// One value per column of a tile.
pub(super) type Lanes = [f32; R];

/// The kernels read x and weights in whole steps of this many values along K: rows of x are
/// padded with zeros to a multiple of it, as are the tiles and rows of weights.
pub(super) const PAD: usize = 16;

/// `acc[r] = fma(x, w[r], acc[r])` for every column.
#[inline(always)]
fn fma_lanes(acc: &mut Lanes, x: f32, w: &Lanes) {
    for (a, &w) in acc.iter_mut().zip(w) {
        *a = x.mul_add(w, *a);
    }
}

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

/// The strict order over one chunk of K for the [`COLS`] columns whose weights `tile` holds
/// (one [`Quads`] per group of four values): for token `m`, its chunk of padded x is
/// `x[m * stride + at..][..4 * tile.len()]` and its accumulators `acc[m]` (four lanes per
/// column, lane `j` taking `k = 4g + j`, `acc = fma(x, w, acc)`). AVX-512 and AVX2 run it in
/// their registers (`x86`), other targets as portable code; every path gives the same bits.
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(super) fn strict_quads(tile: &[Quads], x: &[f32], stride: usize, at: usize, acc: &mut [Quads]) {
    let groups = tile.len();
    let xs = |m: usize| -> &[[f32; 4]] { bytemuck::cast_slice(&x[m * stride + at..][..groups * 4]) };
    #[cfg(target_arch = "x86_64")]
    if multiversion::target::target_cfg_f!(target_feature = "avx512f") {
        for (block, a) in acc.chunks_mut(x86::TOKENS).enumerate() {
            let m = block * x86::TOKENS;
            // SAFETY: this branch is compiled only into the clone with AVX-512F.
            #[allow(unused_unsafe)]
            unsafe {
                match a {
                    [a0, a1, a2] => x86::strict_avx512(tile, [xs(m), xs(m + 1), xs(m + 2)], [a0, a1, a2]),
                    [a0, a1] => x86::strict_avx512(tile, [xs(m), xs(m + 1)], [a0, a1]),
                    [a0] => x86::strict_avx512(tile, [xs(m)], [a0]),
                    _ => {}
                }
            }
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if multiversion::target::target_cfg_f!(all(target_feature = "avx2", target_feature = "fma")) {
        for (m, a) in acc.iter_mut().enumerate() {
            // SAFETY: this branch is compiled only into the clone with AVX2 and FMA.
            #[allow(unused_unsafe)]
            unsafe {
                x86::strict_avx2(tile, xs(m), a)
            };
        }
        return;
    }
    for (m, a) in acc.iter_mut().enumerate() {
        strict_portable(tile, xs(m), a);
    }
}

/// [`strict_quads`] for one token in portable code: per group, per quad, four columns' four
/// lanes.
#[inline(always)]
fn strict_portable(tile: &[Quads], x: &[[f32; 4]], acc: &mut Quads) {
    for (w, xg) in tile.iter().zip(x) {
        for (lanes, w) in acc.iter_mut().zip(w) {
            for (l, w) in lanes.chunks_exact_mut(4).zip(w.chunks_exact(4)) {
                for j in 0..4 {
                    l[j] = xg[j].mul_add(w[j], l[j]);
                }
            }
        }
    }
}

/// Columns [`RowsKernel`] takes at a time: two quads.
pub(super) const ROW_COLS: usize = 8;

/// What [`RowsKernel`] reads for [`ROW_COLS`] rows over one chunk of K.
pub(super) enum RowBlock<'a> {
    /// f32 values, each row a multiple of [`PAD`] values (zeros past K).
    F32([&'a [f32]; ROW_COLS]),
    /// Q8_0 blocks as stored, each row the same whole blocks of the chunk.
    Q8_0([&'a [u8]; ROW_COLS]),
    /// Q4_0 blocks as stored, as `Q8_0`.
    Q4_0([&'a [u8]; ROW_COLS]),
}

/// The strict order read from [`ROW_COLS`] rows as they lie (f32 weights in place, or decoded
/// rows), four rows interleaved in registers rather than through a tile: worth it for one or
/// two tokens, where a tile's weights would serve too few, and the rows stream through K
/// eight at a time. Q8_0 and Q4_0 blocks are decoded in registers, without a tile. Only where
/// the CPU has AVX-512 ([`RowsKernel::for_tokens`]).
pub(super) struct RowsKernel(());

impl RowsKernel {
    /// The kernel for `tokens` rows of x, where this CPU runs it (AVX-512) and `tokens` is one
    /// or two; None otherwise (the tile's [`strict_quads`] serves).
    pub(super) fn for_tokens(tokens: usize) -> Option<RowsKernel> {
        #[cfg(target_arch = "x86_64")]
        if tokens <= x86::ROW_TOKENS
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            return Some(RowsKernel(()));
        }
        let _ = tokens;
        None
    }

    /// [`strict_quads`] over `rows`, the chunk's weights of columns `4 * quad .. + 8` of the
    /// accumulators' tile (f32 rows a multiple of 16 values, zeros past K; or whole quantised
    /// blocks, decoded in registers as `moeflow::quant` decodes them): for token `m`, its chunk
    /// of padded x is `x[m * stride + at..]`, as long as the rows, and its accumulators
    /// `acc[m][quad..quad + 2]` (at most two tokens).
    pub(super) fn run(
        &self,
        rows: &RowBlock<'_>,
        quad: usize,
        x: &[f32],
        stride: usize,
        at: usize,
        acc: &mut [Quads],
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let len = match rows {
                RowBlock::F32(r) => r[0].len(),
                RowBlock::Q8_0(r) => r[0].len() / Q8_0_BLOCK_BYTES * BLOCK_VALUES,
                RowBlock::Q4_0(r) => r[0].len() / Q4_0_BLOCK_BYTES * BLOCK_VALUES,
            };
            let xs = |m: usize| -> &[[f32; 4]] { bytemuck::cast_slice(&x[m * stride + at..][..len]) };
            macro_rules! tokens {
                ($kernel:path, $rows:expr) => {
                    match acc {
                        [a0, a1] => $kernel($rows, quad, [xs(0), xs(1)], [a0, a1]),
                        [a0] => $kernel($rows, quad, [xs(0)], [a0]),
                        _ => {}
                    }
                };
            }
            // SAFETY: a `RowsKernel` exists only where the CPU has AVX-512F, AVX-512BW and
            // F16C (`for_tokens`).
            unsafe {
                match rows {
                    RowBlock::F32(r) => tokens!(x86::strict_rows_avx512, r),
                    RowBlock::Q8_0(r) => tokens!(x86::strict_q8_0_avx512, r),
                    RowBlock::Q4_0(r) => tokens!(x86::strict_q4_0_avx512, r),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rows, quad, x, stride, at, acc);
    }
}

/// [`strict_quads`] in x86-64's vector registers.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::host_experts::kernel::{QUADS, Quads, ROW_COLS};
    use crate::quant::{Q4_0_BLOCK_BYTES, Q8_0_BLOCK_BYTES};

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

    /// How far ahead of its reads each row is prefetched, in values (1 KiB): the rows stream
    /// from memory or the last-level cache, [`ROW_COLS`] at a time.
    const PREFETCH: usize = 256;

    /// `T` tokens over [`ROW_COLS`] rows of whole 16-value steps, into accumulator quads
    /// `quad .. quad + 2`: per step and quad, four rows' 16 values (four groups each)
    /// interleaved by eight 128-bit shuffles into the quad's four groups, each multiplied into
    /// every token's accumulator of the quad.
    #[target_feature(enable = "avx512f")]
    pub(super) fn strict_rows_avx512<const T: usize>(
        rows: &[&[f32]; ROW_COLS],
        quad: usize,
        xs: [&[[f32; 4]]; T],
        acc: [&mut Quads; T],
    ) {
        const Q: usize = ROW_COLS / 4;
        let rows: [&[[f32; 16]]; ROW_COLS] = std::array::from_fn(|c| rows[c].as_chunks::<16>().0);
        let steps = rows[0].len();
        let mut a = [[_mm512_setzero_ps(); Q]; T];
        for t in 0..T {
            for q in 0..Q {
                // SAFETY: 16 floats in bounds.
                a[t][q] = unsafe { _mm512_loadu_ps(acc[t][quad + q].as_ptr()) };
            }
        }
        let xs = xs.map(|x| &x[..steps * 4]);
        for s in 0..steps {
            let mut xb = [[_mm512_setzero_ps(); 4]; T];
            for t in 0..T {
                for g in 0..4 {
                    // SAFETY: 4 floats in bounds.
                    xb[t][g] = _mm512_broadcast_f32x4(unsafe { _mm_loadu_ps(xs[t][4 * s + g].as_ptr()) });
                }
            }
            for q in 0..Q {
                let quad_rows =
                    [&rows[4 * q][s], &rows[4 * q + 1][s], &rows[4 * q + 2][s], &rows[4 * q + 3][s]];
                for row in quad_rows {
                    // A prefetch reads nothing, so any address is allowed.
                    _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().wrapping_add(PREFETCH).cast());
                }
                // SAFETY: 16 floats in bounds.
                let [r0, r1, r2, r3] = unsafe {
                    [
                        _mm512_loadu_ps(quad_rows[0].as_ptr()),
                        _mm512_loadu_ps(quad_rows[1].as_ptr()),
                        _mm512_loadu_ps(quad_rows[2].as_ptr()),
                        _mm512_loadu_ps(quad_rows[3].as_ptr()),
                    ]
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
        for (dst, src) in acc.into_iter().zip(a) {
            for q in 0..Q {
                // SAFETY: 16 floats in bounds.
                unsafe { _mm512_storeu_ps(dst[quad + q].as_mut_ptr(), src[q]) };
            }
        }
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

    /// Four rows' f16 block scales (the first two bytes of each block) as f32, each repeated
    /// across its row's 128-bit lane of a register (F16C: exactly `half`'s conversion).
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    fn block_scales(blocks: [&[u8]; 4]) -> __m512 {
        let h = [0, 1, 2, 3].map(|i| i16::from_le_bytes([blocks[i][0], blocks[i][1]]));
        let d = _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, h[3], h[2], h[1], h[0]));
        _mm512_permutexvar_ps(
            _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
            _mm512_castps128_ps512(d),
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

    /// The `vpshufb` control moving bytes `4 g .. 4 g + 4` of each 128-bit lane into the bytes
    /// `top` of its four 32-bit elements (the other bytes zero): `top` 0 zero-extends them,
    /// 3 puts them in the sign byte.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn spread(g: i32, top: i32) -> __m512i {
        let byte = |j: i32, b: i32| if b == top { 4 * g + j } else { -128 };
        let dword = |j: i32| {
            (byte(j, 0) & 0xff)
                | (byte(j, 1) & 0xff) << 8
                | (byte(j, 2) & 0xff) << 16
                | (byte(j, 3) & 0xff) << 24
        };
        _mm512_broadcast_i32x4(_mm_set_epi32(dword(3), dword(2), dword(1), dword(0)))
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

    /// [`strict_rows_avx512`] on Q8_0 blocks decoded in registers: per block and quad, the
    /// four rows' 32 codes in two registers, each group's four codes of each row moved into
    /// the sign bytes of four elements and shifted down (sign-extended), converted, times the
    /// row's scale: `q · d`, one product, as `quant` decodes it.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    #[allow(clippy::needless_range_loop, reason = "block `b` of eight rows and of x at once")]
    pub(super) fn strict_q8_0_avx512<const T: usize>(
        rows: &[&[u8]; ROW_COLS],
        quad: usize,
        xs: [&[[f32; 4]]; T],
        acc: [&mut Quads; T],
    ) {
        const Q: usize = ROW_COLS / 4;
        let rows: [&[[u8; Q8_0_BLOCK_BYTES]]; ROW_COLS] = rows.map(|r| r.as_chunks().0);
        let blocks = rows[0].len();
        let mut a = load(&acc, quad);
        let xs = xs.map(|x| &x[..blocks * 8]);
        let spread = [spread(0, 3), spread(1, 3), spread(2, 3), spread(3, 3)];
        for b in 0..blocks {
            let xb = block_x(&xs, b);
            for q in 0..Q {
                let quad_blocks: [&[u8]; 4] =
                    [&rows[4 * q][b], &rows[4 * q + 1][b], &rows[4 * q + 2][b], &rows[4 * q + 3][b]];
                prefetch_ahead(&quad_blocks);
                let d = block_scales(quad_blocks);
                let halves = [lanes_of(quad_blocks, 2), lanes_of(quad_blocks, 18)];
                for g in 0..8 {
                    let codes = _mm512_srai_epi32::<24>(_mm512_shuffle_epi8(halves[g / 4], spread[g % 4]));
                    let w = _mm512_mul_ps(_mm512_cvtepi32_ps(codes), d);
                    for t in 0..T {
                        a[t][q] = _mm512_fmadd_ps(xb[t][g], w, a[t][q]);
                    }
                }
            }
        }
        store(a, acc, quad);
    }

    /// As [`strict_q8_0_avx512`] on Q4_0 blocks: the low nibbles are values 0-15, the high
    /// ones 16-31; each group's nibbles moved into four elements, looked up as `nibble − 8` in a
    /// table, times the row's scale: `(nibble − 8) · d`, one product, as `quant` decodes it.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    #[allow(clippy::needless_range_loop, reason = "block `b` of eight rows and of x at once")]
    pub(super) fn strict_q4_0_avx512<const T: usize>(
        rows: &[&[u8]; ROW_COLS],
        quad: usize,
        xs: [&[[f32; 4]]; T],
        acc: [&mut Quads; T],
    ) {
        const Q: usize = ROW_COLS / 4;
        let rows: [&[[u8; Q4_0_BLOCK_BYTES]]; ROW_COLS] = rows.map(|r| r.as_chunks().0);
        let blocks = rows[0].len();
        let mut a = load(&acc, quad);
        let xs = xs.map(|x| &x[..blocks * 8]);
        let spread = [spread(0, 0), spread(1, 0), spread(2, 0), spread(3, 0)];
        // `nibble − 8` for every nibble: a 16-entry table the nibbles index.
        let values = _mm512_setr_ps(-8., -7., -6., -5., -4., -3., -2., -1., 0., 1., 2., 3., 4., 5., 6., 7.);
        for b in 0..blocks {
            let xb = block_x(&xs, b);
            for q in 0..Q {
                let quad_blocks: [&[u8]; 4] =
                    [&rows[4 * q][b], &rows[4 * q + 1][b], &rows[4 * q + 2][b], &rows[4 * q + 3][b]];
                prefetch_ahead(&quad_blocks);
                let d = block_scales(quad_blocks);
                let codes = lanes_of(quad_blocks, 2);
                // The table reads the low four bits of each element: the byte's low nibble,
                // or, shifted, its high one.
                let halves = [codes, _mm512_srli_epi16::<4>(codes)];
                for g in 0..8 {
                    let nibbles = _mm512_shuffle_epi8(halves[g / 4], spread[g % 4]);
                    let w = _mm512_mul_ps(_mm512_permutexvar_ps(nibbles, values), d);
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
}

/// The fast order over one chunk (as [`strict_quads`], one accumulator per column).
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(super) fn fast_chunk(tile: &[Lanes], x: &[f32], stride: usize, at: usize, acc: &mut [Lanes]) {
    for (m, a) in acc.iter_mut().enumerate() {
        let xs = &x[m * stride + at..m * stride + at + tile.len()];
        let mut a0 = *a;
        for (w, &xv) in tile.iter().zip(xs) {
            fma_lanes(&mut a0, xv, w);
        }
        *a = a0;
    }
}

/// The strict order's dot of column `c` of a tile from a token's accumulators:
/// `(a0 + a1) + (a2 + a3)` over its four lanes.
pub(super) fn strict_sum(acc: &Quads, c: usize) -> f32 {
    let a = &acc[c / 4][c % 4 * 4..][..4];
    (a[0] + a[1]) + (a[2] + a[3])
}

/// The SIMD target the kernels run on this CPU: `avx512`, `avx2+fma`, `neon` or `baseline`.
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(super) fn simd_target() -> &'static str {
    multiversion::target::match_target! {
        "x86_64+avx512f+avx512vl+fma" => "avx512",
        "x86_64+avx2+fma" => "avx2+fma",
        "aarch64+neon" => "neon",
        _ => "baseline",
    }
}
