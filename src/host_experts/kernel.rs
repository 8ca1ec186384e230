//! The host experts' dot products in the layer's accumulation orders, compiled for each SIMD
//! target and chosen at run time for the CPU it runs on (`multiversion`: AVX-512, AVX2 with
//! FMA, NEON, else the build's baseline).
//!
//! A tile holds `R` output columns' weights for a chunk of K, `[k][r]`; the kernels multiply
//! each x value into the `R` columns, so the SIMD lanes run across columns and every column
//! keeps the order of `reference::gemm::dot_in_order` exactly:
//! - strict: four accumulators per column, lane `j` taking `k = 4g + j` (`acc = fma(x, w,
//!   acc)` from 0.0); the column's dot is `(a0 + a1) + (a2 + a3)`;
//! - fast: one accumulator per column, `acc = fma(x[k], w[k], acc)` for k ascending.
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

/// The strict order over one chunk: for token `m`, its chunk of padded x is
/// `x[m * stride + at..][..tile.len()]` and its accumulators `acc[m]` (four per column).
/// `tile.len()` is a multiple of four.
#[multiversion(targets("x86_64+avx512f+avx512vl+fma", "x86_64+avx2+fma", "aarch64+neon"))]
pub(super) fn strict_chunk(tile: &[Lanes], x: &[f32], stride: usize, at: usize, acc: &mut [[Lanes; 4]]) {
    for (m, a) in acc.iter_mut().enumerate() {
        let xs = &x[m * stride + at..m * stride + at + tile.len()];
        let [mut a0, mut a1, mut a2, mut a3] = *a;
        for (w, xg) in tile.chunks_exact(4).zip(xs.chunks_exact(4)) {
            fma_lanes(&mut a0, xg[0], &w[0]);
            fma_lanes(&mut a1, xg[1], &w[1]);
            fma_lanes(&mut a2, xg[2], &w[2]);
            fma_lanes(&mut a3, xg[3], &w[3]);
        }
        *a = [a0, a1, a2, a3];
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

/// The strict order's dot of each column: `(a0 + a1) + (a2 + a3)`.
pub(super) fn strict_sums(acc: &[Lanes; 4]) -> Lanes {
    std::array::from_fn(|r| (acc[0][r] + acc[1][r]) + (acc[2][r] + acc[3][r]))
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
