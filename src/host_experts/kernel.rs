//! The host experts' dot products in the layer's accumulation orders, compiled for each SIMD
//! target and chosen at run time for the CPU it runs on (`multiversion`: AVX-512, AVX2 with
//! FMA, NEON, else the build's baseline).
//!
//! Every column keeps the order of `reference::gemm::dot_in_order` exactly:
//! - strict: four accumulators per column, lane `j` taking `k = 4g + j` (`acc = fma(x, w,
//!   acc)` from 0.0); the column's dot is `(a0 + a1) + (a2 + a3)`. The four lanes are a
//!   quarter of a vector: a tile holds [`COLS`] columns' weights group by group, four columns'
//!   groups side by side in one vector ([`Quads`]), and each token's group of four x values,
//!   repeated across the vector, is multiplied into [`QUADS`] vectors ([`strict_quads`]). One
//!   or two tokens skip the tile ([`RowsKernel`]; on x86-64 where the CPU has AVX-512 or
//!   AVX2): eight rows read as they lie, four interleaved in registers (in portable code,
//!   NEON's, each row a register of its own), quantised blocks decoded there too.
//! - fast: one accumulator per column, `acc = fma(x[k], w[k], acc)` for k ascending: the SIMD
//!   lanes run across columns, so a tile holds [`R`] columns' weights transposed, `[k][r]`,
//!   and each x value is multiplied into the `R` columns at once ([`fast_chunk`]).
//!
//! K is padded with zeros to a multiple of [`PAD`] in x and in the tiles (the references
//! read values past K as zeros). `f32::mul_add` is one fused multiply-add on every target (a
//! libm call where the CPU has no FMA), so every target gives the same bits.

use multiversion::multiversion;

use super::rows;
#[cfg(doc)]
use super::tile::{COLS, PAD, QUADS, R};
use super::tile::{Lanes, Quads, Rows};
#[cfg(target_arch = "x86_64")]
use super::tile::{ROW_COLS, RowBlock};
#[cfg(target_arch = "x86_64")]
use super::{avx2, x86};
use crate::kernels::gemm::WeightDtype;

/// `acc[r] = fma(x, w[r], acc[r])` for every column.
#[inline(always)]
fn fma_lanes(acc: &mut Lanes, x: f32, w: &Lanes) {
    for (a, &w) in acc.iter_mut().zip(w) {
        *a = x.mul_add(w, *a);
    }
}

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
                avx2::strict_avx2(tile, xs(m), a)
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

/// The strict order read from [`ROW_COLS`] rows as they lie (f32 or f16 values in place, or
/// decoded rows), four rows interleaved in registers rather than through a tile: worth it for
/// an expert of a few tokens ([`RowsIsa::max_tokens`]), where a tile's decoded weights would
/// serve too few, and the rows stream through K eight at a time, two tokens at a time. Q8_0,
/// Q4_0 and MXFP4 blocks are decoded in registers too (AVX-512: four rows a register; AVX2:
/// two; the portable kernel of other CPUs decodes them a span at a time onto the stack); bf16
/// and FP8 reach it decoded to f32 a chunk at a time. Not on x86-64 CPUs with neither AVX-512
/// nor AVX2 ([`RowsKernel::new`]).
pub(super) struct RowsKernel(RowsIsa);

/// The instructions a [`RowsKernel`] runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RowsIsa {
    /// AVX-512F and AVX-512BW, with F16C.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2 and FMA, with F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Portable code (`rows.rs`), compiled for NEON on aarch64: the rows kernel of every CPU
    /// that is not x86-64. It runs on x86-64 too (for AVX2 with FMA where the CPU has them),
    /// where the two above serve instead (and, on a CPU with neither, the tile: there it is
    /// chosen by tests only).
    #[cfg_attr(
        all(target_arch = "x86_64", not(test)),
        expect(dead_code, reason = "x86-64's rows kernels are AVX-512's and AVX2's; tests run this one")
    )]
    Portable,
}

impl RowsIsa {
    /// The widest this CPU runs: on x86-64 AVX-512 or AVX2, None where it has neither (the tile
    /// serves); on every other CPU the portable kernel.
    pub(super) fn detect() -> Option<RowsIsa> {
        #[cfg(target_arch = "x86_64")]
        return [RowsIsa::Avx512, RowsIsa::Avx2].into_iter().find(|isa| isa.supported());
        #[cfg(not(target_arch = "x86_64"))]
        return Some(RowsIsa::Portable);
    }

    /// The most tokens of one expert the rows kernel takes for weights of `dtype`, beyond which
    /// the tile is faster: the rows kernel reads and decodes each block of rows again for every
    /// two tokens (from the first- or second-level cache after the first two), the tile
    /// decodes it once for all the expert's tokens. Measured per instruction set and dtype on
    /// this project's machine (docs/benchmarks/host table 16: eight experts, each taking every
    /// token; AVX2's block formats again in table 23, after its block kernel was unrolled);
    /// FP8, decoded to f32 rows a chunk at a time as bf16 is, as bf16. The portable
    /// kernel, not timed on an ARM CPU, takes the one or two tokens table 15 measured.
    pub(super) fn max_tokens(self, dtype: WeightDtype) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            RowsIsa::Avx512 => match dtype {
                WeightDtype::F32 | WeightDtype::F16 | WeightDtype::Q8_0 | WeightDtype::Mxfp4 => 16,
                WeightDtype::Q4_0 => 12,
                WeightDtype::Bf16 | WeightDtype::Fp8 => 8,
            },
            #[cfg(target_arch = "x86_64")]
            RowsIsa::Avx2 => match dtype {
                WeightDtype::F32 | WeightDtype::Q8_0 => 16,
                WeightDtype::F16 => 12,
                WeightDtype::Mxfp4 => 8,
                WeightDtype::Bf16 | WeightDtype::Fp8 | WeightDtype::Q4_0 => 6,
            },
            RowsIsa::Portable => {
                let _ = dtype;
                2
            }
        }
    }

    /// Whether this CPU has the instructions (the portable kernel runs on every CPU).
    pub(super) fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        use std::arch::is_x86_feature_detected as has;
        match self {
            #[cfg(target_arch = "x86_64")]
            RowsIsa::Avx512 => has!("f16c") && has!("avx512f") && has!("avx512bw"),
            #[cfg(target_arch = "x86_64")]
            RowsIsa::Avx2 => has!("f16c") && has!("avx2") && has!("fma"),
            RowsIsa::Portable => true,
        }
    }
}

impl RowsKernel {
    /// The kernel in `isa` for `tokens` rows of x times weights of `dtype`, where this CPU runs
    /// it and the tokens are at most [`RowsIsa::max_tokens`]; None otherwise (the tile's
    /// [`strict_quads`] serves).
    pub(super) fn new(isa: Option<RowsIsa>, tokens: usize, dtype: WeightDtype) -> Option<RowsKernel> {
        isa.filter(|isa| tokens <= isa.max_tokens(dtype) && isa.supported()).map(RowsKernel)
    }

    /// [`strict_quads`] over `rows`, the chunk's weights of columns `4 * quad .. + 8` of the
    /// accumulators' tile (f32 rows a multiple of 16 values, zeros past K; or whole quantised
    /// blocks, decoded in registers as `moeflow::quant` decodes them): for token `m`, its chunk
    /// of padded x is `x[m * stride + at..]`, as long as the rows, and its accumulators
    /// `acc[m][quad..quad + 2]`; two tokens at a time, each pair reading the rows again (from
    /// the cache after the first). The rows after them ([`Rows::next`]) are prefetched as the
    /// kernel goes.
    pub(super) fn run(
        &self,
        rows: &Rows<'_>,
        quad: usize,
        x: &[f32],
        stride: usize,
        at: usize,
        acc: &mut [Quads],
    ) {
        let len = rows.block.values();
        let xs = |m: usize| -> &[[f32; 4]] { bytemuck::cast_slice(&x[m * stride + at..][..len]) };
        macro_rules! tokens {
            ($kernel:expr, $($arg:expr),+) => {
                for (pair, acc) in acc.chunks_mut(2).enumerate() {
                    let m = 2 * pair;
                    match acc {
                        [a0, a1] => $kernel($($arg,)+ quad, [xs(m), xs(m + 1)], [a0, a1]),
                        [a0] => $kernel($($arg,)+ quad, [xs(m)], [a0]),
                        _ => {}
                    }
                }
            };
        }
        // An x86 ISA's kernels per row format: `$rows` for f32 and f16 rows, `$blocks` for the
        // block formats, in module `$m`.
        #[cfg(target_arch = "x86_64")]
        macro_rules! formats {
            ($m:ident, $rows:ident, $blocks:ident) => {
                match &rows.block {
                    RowBlock::F32(r) => {
                        let bytes: [&[u8]; ROW_COLS] = r.map(bytemuck::cast_slice);
                        tokens!($m::$rows::<x86::F32, _>, &bytes, rows.next)
                    }
                    RowBlock::F16(r) => tokens!($m::$rows::<x86::F16, _>, r, rows.next),
                    RowBlock::Q8_0(r) => tokens!($m::$blocks::<x86::Q8_0, _>, r, None, rows.next),
                    RowBlock::Q4_0(r) => tokens!($m::$blocks::<x86::Q4_0, _>, r, None, rows.next),
                    RowBlock::GgmlMxfp4(r) => tokens!($m::$blocks::<x86::GgmlMxfp4, _>, r, None, rows.next),
                    RowBlock::Mxfp4 { codes, scales } => {
                        tokens!($m::$blocks::<x86::Mxfp4, _>, codes, Some(scales), rows.next)
                    }
                }
            };
        }
        match self.0 {
            RowsIsa::Portable => tokens!(rows::strict_rows, rows),
            // SAFETY: a `RowsKernel` of AVX2 exists only where the CPU has AVX2, FMA and F16C
            // (`new`).
            #[cfg(target_arch = "x86_64")]
            RowsIsa::Avx2 => unsafe { formats!(avx2, strict_rows_avx2, strict_blocks_avx2) },
            // SAFETY: a `RowsKernel` of AVX-512 exists only where the CPU has AVX-512F,
            // AVX-512BW and F16C (`new`).
            #[cfg(target_arch = "x86_64")]
            RowsIsa::Avx512 => unsafe { formats!(x86, strict_rows_avx512, strict_blocks_avx512) },
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bits::canonical;
    use crate::host_experts::tile::{QUADS, R};

    /// A tile of `groups` groups of adversarial weights (exact ties, 1-ulp neighbours, ±0,
    /// subnormals, ±inf and NaN in a few places) and `tokens` rows of x, seeded.
    fn inputs(groups: usize, tokens: usize) -> (Vec<Quads>, Vec<f32>) {
        let mut state = 0x5eed_u32;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state
        };
        let mut value = |i: usize| match i % 23 {
            0 => 1.0,
            1 => 1.0f32.next_up(),
            2 => -0.0,
            3 => f32::from_bits(1 + next() % 0x7f_ffff),
            _ => (next() % 2001) as f32 / 1000.0 - 1.0,
        };
        let mut tile = vec![[[0.0; R]; QUADS]; groups];
        for (i, v) in tile.iter_mut().flatten().flatten().enumerate() {
            *v = value(i);
        }
        tile[1][2][5] = f32::INFINITY;
        tile[2][7][9] = f32::NAN;
        let mut x: Vec<f32> = (0..tokens * groups * 4).map(&mut value).collect();
        x[3] = 1e30;
        x[4 * groups + 1] = f32::NEG_INFINITY;
        (tile, x)
    }

    /// Every token's accumulators as `strict` leaves them, from the same non-zero start.
    fn run(tile: &[Quads], x: &[f32], tokens: usize, strict: impl Fn(&[[f32; 4]], &mut Quads)) -> Vec<f32> {
        let stride = tile.len() * 4;
        let mut out = Vec::new();
        for m in 0..tokens {
            let mut acc = [[0.25; R]; QUADS];
            strict(bytemuck::cast_slice(&x[m * stride..(m + 1) * stride]), &mut acc);
            out.extend(acc.iter().flatten());
        }
        out
    }

    #[test]
    fn strict_targets_give_the_portable_bits() {
        // The portable order is the reference; every x86 kernel this CPU runs must give its
        // bits, whichever `strict_quads` picks here (an AVX-512 machine never picks AVX2).
        let (groups, tokens) = (13, 5);
        let (tile, x) = inputs(groups, tokens);
        let stride = groups * 4;
        let want = run(&tile, &x, tokens, |x, acc| strict_portable(&tile, x, acc));
        let mut acc = vec![[[0.25; R]; QUADS]; tokens];
        strict_quads(&tile, &x, stride, 0, &mut acc);
        let dispatched: Vec<f32> = acc.iter().flatten().flatten().copied().collect();
        assert_eq!(canonical(&dispatched), canonical(&want), "strict_quads ({})", simd_target());
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: the CPU has AVX2 and FMA.
                let got = run(&tile, &x, tokens, |x, acc| unsafe { avx2::strict_avx2(&tile, x, acc) });
                assert_eq!(canonical(&got), canonical(&want), "avx2");
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU has AVX-512F.
                let got = run(&tile, &x, tokens, |x, acc| unsafe { x86::strict_avx512(&tile, [x], [acc]) });
                assert_eq!(canonical(&got), canonical(&want), "avx512, one token at a time");
            }
        }
        assert!(want.iter().any(|v| v.is_nan()) && want.iter().any(|v| v.is_infinite()));
    }
}
