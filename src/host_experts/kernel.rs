//! The host experts' dot products in the layer's accumulation orders, compiled for each SIMD
//! target and chosen at run time for the CPU it runs on (`multiversion`: AVX-512, AVX2 with
//! FMA, NEON, else the build's baseline).
//!
//! Every column keeps the order of `reference::gemm::dot_in_order` exactly:
//! - strict: four accumulators per column, lane `j` taking `k = 4g + j` (`acc = fma(x, w,
//!   acc)` from 0.0); the column's dot is `(a0 + a1) + (a2 + a3)`. The four lanes are a
//!   four-wide vector: a tile holds [`ROWS`] columns' weights row by row, as stored, and each
//!   group of four x values is multiplied into every column's lanes ([`strict_rows`]).
//! - fast: one accumulator per column, `acc = fma(x[k], w[k], acc)` for k ascending: the SIMD
//!   lanes run across columns, so a tile holds [`R`] columns' weights transposed, `[k][r]`,
//!   and each x value is multiplied into the `R` columns at once ([`fast_chunk`]).
//!
//! K is padded with zeros to a multiple of four in x and in the tiles, as the references read
//! values past K. `f32::mul_add` is one fused multiply-add on every target (a libm call where
//! the CPU has no FMA), so every target gives the same bits.

use multiversion::multiversion;

/// Output columns in a tile: the SIMD lanes of one accumulator (one AVX-512 register, two
/// AVX2 registers, four NEON registers).
pub(super) const R: usize = 16;

/// One value per column of a tile.
pub(super) type Lanes = [f32; R];

/// `acc[r] = fma(x, w[r], acc[r])` for every column.
#[inline(always)]
fn fma_lanes(acc: &mut Lanes, x: f32, w: &Lanes) {
    for (a, &w) in acc.iter_mut().zip(w) {
        *a = x.mul_add(w, *a);
    }
}

/// Rows (output columns) of a strict-order tile: eight four-lane accumulators per x row,
/// eight independent FMA chains.
pub(super) const ROWS: usize = 8;

/// How far ahead of the groups a row reads, in groups of four values (2 KiB), each row's line
/// there is prefetched: the rows stream from memory (or the last-level cache) eight at a time.
const PREFETCH: usize = 128;

/// The strict order over one chunk of K for [`ROWS`] columns whose weights `rows` hold (each
/// `groups` groups of four values: a tile's rows, or the stored f32 rows themselves): for
/// token `m`, its chunk of padded x is `x[m * stride + at..][..4 * groups]` and its
/// accumulators `acc[m]` (four per column, lane `j` taking `k = 4g + j`).
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(super) fn strict_rows(
    rows: [&[[f32; 4]]; ROWS],
    groups: usize,
    x: &[f32],
    stride: usize,
    at: usize,
    acc: &mut [[[f32; 4]; ROWS]],
) {
    let rows = rows.map(|r| &r[..groups]);
    let [r0, r1, r2, r3, r4, r5, r6, r7] = rows;
    for (m, a) in acc.iter_mut().enumerate() {
        let xs: &[[f32; 4]] = bytemuck::cast_slice(&x[m * stride + at..m * stride + at + groups * 4]);
        let [mut l0, mut l1, mut l2, mut l3, mut l4, mut l5, mut l6, mut l7] = *a;
        // Zipped iterators: no index, so no bounds check in the loop.
        let weights = r0.iter().zip(r1).zip(r2).zip(r3).zip(r4).zip(r5).zip(r6).zip(r7);
        for (g, (xg, (((((((w0, w1), w2), w3), w4), w5), w6), w7))) in xs.iter().zip(weights).enumerate() {
            #[cfg(target_arch = "x86_64")]
            if g % 4 == 0 {
                for row in &rows {
                    // SAFETY: SSE is in every x86-64 baseline; a prefetch reads nothing, so any
                    // address is allowed (`_mm_prefetch` is safe where the target enables SSE
                    // explicitly, hence the allowance).
                    #[allow(unused_unsafe)]
                    unsafe {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            row.as_ptr().wrapping_add(g + PREFETCH).cast(),
                        )
                    };
                }
            }
            fma4(&mut l0, xg, w0);
            fma4(&mut l1, xg, w1);
            fma4(&mut l2, xg, w2);
            fma4(&mut l3, xg, w3);
            fma4(&mut l4, xg, w4);
            fma4(&mut l5, xg, w5);
            fma4(&mut l6, xg, w6);
            fma4(&mut l7, xg, w7);
        }
        *a = [l0, l1, l2, l3, l4, l5, l6, l7];
    }
}

/// `lane[j] = fma(x[j], w[j], lane[j])` for the four lanes of a column.
#[inline(always)]
fn fma4(lane: &mut [f32; 4], x: &[f32; 4], w: &[f32; 4]) {
    for j in 0..4 {
        lane[j] = x[j].mul_add(w[j], lane[j]);
    }
}

/// The fast order over one chunk (as [`strict_chunk`], one accumulator per column).
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

/// The strict order's dot of a column from its four lanes: `(a0 + a1) + (a2 + a3)`.
pub(super) fn strict_sum(a: &[f32; 4]) -> f32 {
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
