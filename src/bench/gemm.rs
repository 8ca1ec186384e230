//! Expert-projection comparisons: grouped GEMM against a dense GEMM of equal FLOPs, against
//! the bucketed path with overflow, and the row-wise decode path against the grouped one.

use super::comparison::{Case, Registered, Size, SizeSet, Work};
use super::dispatch::skewed_indices;
use crate::bits::bit_identical;
use crate::context::{BoundsChecks, Context};
use crate::error::{Error, Result};
use crate::kernels::dispatch::{BucketConfig, BucketLayout, DispatchConfig, DispatchLayout, OverflowPolicy};
use crate::kernels::gemm::{
    AdapterKind, CoopBlock, DenseKernel, ExpertFfn, ExpertWeights, FfnBuffers, FfnKernels, FfnRouting,
    GemmOrder, GemmVariant, LaneBlock, TileBlock, TuneOptions, WeightDtype, check_on_device, plan_dense,
    plan_ffn, tune,
};
use crate::pipeline::Dispatch;
use crate::reference::gemm as reference;
use crate::synth::Synth;
use crate::tensor::word_bytes;

/// Entries checked against the CPU reference at each validation (first and last ones).
const CHECKED_ENTRIES: usize = 8;

struct Problem {
    tokens: u32,
    k: u32,
    h: u32,
    f: u32,
    e: u32,
    x: Vec<f32>,
    idx: Vec<u32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

impl Problem {
    fn new(size: &Size, seed: u64) -> Result<Self> {
        let (tokens, h, f, e, k) =
            (size.get("M")?, size.get("H")?, size.get("F")?, size.get("E")?, size.get("k")?);
        let mut s = Synth::new(seed);
        let n = (e * f * h) as usize;
        let (sh, sf) = (1.0 / (h as f32).sqrt(), 1.0 / (f as f32).sqrt());
        Ok(Problem {
            tokens,
            k,
            h,
            f,
            e,
            x: s.uniform((tokens * h) as usize, 1.0),
            idx: skewed_indices(seed, tokens, e, k),
            gate: s.uniform(n, sh),
            up: s.uniform(n, sh),
            down: s.uniform(n, sf),
        })
    }

    /// The problem for `size`, its weights on the device, and `x` and `indices` uploaded.
    fn setup(ctx: &Context, size: &Size, seed: u64) -> Result<(Self, ExpertFfn, wgpu::Buffer, wgpu::Buffer)> {
        let p = Problem::new(size, seed)?;
        let ffn = p.ffn(ctx)?;
        let (x, idx) = (ctx.upload("x", &p.x)?, ctx.upload("indices", &p.idx)?);
        Ok((p, ffn, x, idx))
    }

    /// Checks `checked` against the reference and `other` bitwise against it.
    fn check_pair(
        &self,
        ctx: &Context,
        checked: (&wgpu::Buffer, &str),
        other: (&wgpu::Buffer, &str),
    ) -> Result<()> {
        let got = self.check(ctx, checked.0, checked.1)?;
        let got_other: Vec<f32> = ctx.read_back(other.0, got.len())?;
        if !bit_identical(&got, &got_other) {
            return Err(Error::Validation(format!(
                "{} output is not bitwise equal to {}",
                other.1, checked.1
            )));
        }
        Ok(())
    }

    fn entries(&self) -> u32 {
        self.tokens * self.k
    }

    /// This problem with other weights (`[gate, up, down]`).
    fn with_weights(&self, [gate, up, down]: [Vec<f32>; 3]) -> Problem {
        Problem { x: self.x.clone(), idx: self.idx.clone(), gate, up, down, ..*self }
    }

    /// The FFN with explicit kernels (order and variants).
    fn ffn_with(&self, ctx: &Context, kernels: FfnKernels) -> Result<ExpertFfn> {
        self.ffn(ctx)?.with_kernels(kernels)
    }

    fn ffn(&self, ctx: &Context) -> Result<ExpertFfn> {
        let w = |d: &[f32], n, k| ExpertWeights::from_f32(ctx, d, WeightDtype::F32, self.e, n, k);
        ExpertFfn::new(
            w(&self.gate, self.f, self.h)?,
            w(&self.up, self.f, self.h)?,
            w(&self.down, self.h, self.f)?,
        )
    }

    /// FLOPs of the expert FFN: three projections of 2 * H * F per entry.
    fn flops(&self) -> f64 {
        6.0 * f64::from(self.entries()) * f64::from(self.h) * f64::from(self.f)
    }

    /// Checks the first and last entries of `partial` against the CPU reference (strict order).
    fn check(&self, ctx: &Context, partial: &wgpu::Buffer, what: &str) -> Result<Vec<f32>> {
        self.check_with(ctx, partial, what, GemmOrder::Strict, false, 2e-5)
    }

    /// Checks the first and last entries of `partial` against the CPU reference in `order`, on
    /// f16-rounded operands where `f16_operands` (the kernels that stage in f16).
    fn check_with(
        &self,
        ctx: &Context,
        partial: &wgpu::Buffer,
        what: &str,
        order: GemmOrder,
        f16_operands: bool,
        relative: f32,
    ) -> Result<Vec<f32>> {
        let h = self.h as usize;
        let n = self.entries() as usize;
        let got: Vec<f32> = ctx.read_back(partial, n * h)?;
        let w = reference::FfnWeights {
            gate: &self.gate,
            up: &self.up,
            down: &self.down,
            hidden: h,
            ffn: self.f as usize,
            order,
            activation: crate::kernels::gemm::Activation::Swiglu,
            bias: None,
            f16_operands,
        };
        let picks: Vec<usize> =
            (0..n.min(CHECKED_ENTRIES)).chain(n.saturating_sub(CHECKED_ENTRIES)..n).collect();
        for i in picks {
            let t = i / self.k as usize;
            let want = reference::ffn_row(&self.x[t * h..(t + 1) * h], self.idx[i] as usize, &w);
            let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            if let Some(c) = (0..h).find(|&c| (got[i * h + c] - want[c]).abs() > 2e-5 + relative * scale) {
                return Err(Error::Validation(format!(
                    "{what}: entry {i} column {c}: {} vs reference {}",
                    got[i * h + c],
                    want[c]
                )));
            }
        }
        Ok(got)
    }
}

/// Plans the grouped path (dispatch layout with the layer's tile + FFN) into `partial`.
fn grouped(
    ctx: &Context,
    p: &Problem,
    ffn: &ExpertFfn,
    x: &wgpu::Buffer,
    idx: &wgpu::Buffer,
    partial: &wgpu::Buffer,
) -> Result<Vec<Dispatch>> {
    // The layer's tile: the kernels' block rows (no more padding than the kernels need).
    let tile = ffn.kernels(ctx).block_rows();
    let layout = DispatchLayout::new(ctx, DispatchConfig { experts: p.e, k: p.k, tile }, p.tokens, 0)?;
    let mut ds = layout.plan(ctx, idx)?;
    let bufs = FfnBuffers { x: x.into(), indices: idx.into(), partial: partial.into() };
    ds.extend(plan_ffn(ctx, ffn, p.tokens, p.k, &bufs, FfnRouting::Grouped(&layout))?.into_dispatches());
    Ok(ds)
}

fn gemm_sizes(set: SizeSet, held_out: bool, decode: bool) -> Vec<Size> {
    let shapes: &[(u32, u32, u32, u32, u32)] = match (set, held_out, decode) {
        (SizeSet::Gpu, false, false) => {
            &[(512, 1024, 512, 64, 8), (4096, 1024, 512, 64, 8), (512, 1024, 2048, 8, 2)]
        }
        (SizeSet::Gpu, true, false) => &[(1024, 1024, 512, 64, 8), (2048, 1024, 2048, 8, 2)],
        (SizeSet::Cpu, false, false) => {
            &[(64, 256, 128, 16, 4), (256, 256, 128, 16, 4), (64, 256, 512, 8, 2), (256, 512, 1024, 16, 2)]
        }
        (SizeSet::Cpu, true, false) => &[(128, 256, 128, 16, 4), (128, 256, 512, 8, 2)],
        (SizeSet::Gpu, false, true) => &[(1, 1024, 512, 64, 8), (4, 1024, 512, 64, 8)],
        (SizeSet::Gpu, true, true) => &[(2, 1024, 512, 64, 8), (8, 1024, 2048, 8, 2)],
        (SizeSet::Cpu, false, true) => &[(1, 256, 128, 16, 4), (4, 256, 128, 16, 4)],
        (SizeSet::Cpu, true, true) => &[(2, 256, 128, 16, 4), (8, 256, 512, 8, 2)],
    };
    shapes
        .iter()
        .map(|&(m, h, f, e, k)| Size::of(&[("M", m), ("H", h), ("F", f), ("E", e), ("k", k)]))
        .collect()
}

/// Grouped GEMM (B) against three dense GEMMs of the same FLOPs (A).
pub fn grouped_vs_dense() -> Registered {
    Registered {
        name: "gemm/grouped-vs-dense",
        description: "SwiGLU expert FFN as padded-tile grouped GEMMs with the dispatch (B) against dense GEMMs of \
                      the same FLOPs on one weight matrix (A): the throughput yardstick",
        variants: ("dense", "grouped"),
        sizes: Box::new(|set, held_out| gemm_sizes(set, held_out, false)),
        build: Box::new(build_grouped_vs_dense),
    }
}

fn build_grouped_vs_dense(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let (p, ffn, x, idx) = Problem::setup(ctx, size, seed)?;
    let partial = ctx.zeroed("partial", word_bytes(u64::from(p.entries() * p.h)))?;
    let b = grouped(ctx, &p, &ffn, &x, &idx, &partial)?;
    // Dense: [entries, H] x [F, H]^T twice, then [entries, F] x [H, F]^T.
    let rows = p.entries();
    let xd = ctx.upload("dense x", &Synth::new(seed + 1).uniform((rows * p.f.max(p.h)) as usize, 1.0))?;
    let one =
        |d: &[f32], n, k| ExpertWeights::from_f32(ctx, &d[..(n * k) as usize], WeightDtype::F32, 1, n, k);
    let (wg, wu, wd) = (one(&p.gate, p.f, p.h)?, one(&p.up, p.f, p.h)?, one(&p.down, p.h, p.f)?);
    let (yg, yu, yd) = (
        ctx.zeroed("dense gate", word_bytes(u64::from(rows * p.f)))?,
        ctx.zeroed("dense up", word_bytes(u64::from(rows * p.f)))?,
        ctx.zeroed("dense down", word_bytes(u64::from(rows * p.h)))?,
    );
    let kernels = ffn.kernels(ctx);
    let dense = DenseKernel::Block(kernels.down);
    let order = kernels.order;
    let mut a = plan_dense(ctx, &wg, rows, &xd, &yg, dense, order)?.into_dispatches();
    a.extend(plan_dense(ctx, &wu, rows, &xd, &yu, dense, order)?.into_dispatches());
    a.extend(plan_dense(ctx, &wd, rows, &xd, &yd, dense, order)?.into_dispatches());
    let (flops, tokens) = (p.flops(), p.tokens);
    let validate = move |ctx: &Context| p.check(ctx, &partial, "grouped").map(|_| ());
    Ok(Case {
        a: Work::Gpu(a),
        b: Work::Gpu(b),
        flops,
        bytes: 0.0,
        tokens,
        validate: Box::new(validate),
        note: None,
    })
}

/// Grouped GEMM (B) against seed 000's path (A): one grouped matmul per bucket with a bound of
/// the mean load, plus a row-wise overflow pass. Outputs are bitwise equal.
pub fn grouped_vs_bucketed() -> Registered {
    Registered {
        name: "gemm/grouped-vs-bucketed",
        description: "padded-tile grouped GEMM (B) against per-bucket grouped matmuls bounded at the mean load \
                      with an overflow pass (A); both include their dispatch, outputs bitwise equal",
        variants: ("bucketed", "grouped"),
        sizes: Box::new(|set, held_out| gemm_sizes(set, held_out, false)),
        build: Box::new(build_grouped_vs_bucketed),
    }
}

fn build_grouped_vs_bucketed(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let (p, ffn, x, idx) = Problem::setup(ctx, size, seed)?;
    let bytes = word_bytes(u64::from(p.entries() * p.h));
    let (pa, pb) = (ctx.zeroed("bucketed partial", bytes)?, ctx.zeroed("grouped partial", bytes)?);
    let b = grouped(ctx, &p, &ffn, &x, &idx, &pb)?;
    let bound = p.entries().div_ceil(p.e).max(1);
    let buckets = BucketLayout::new(
        ctx,
        BucketConfig { n_caps: p.e, bound, policy: OverflowPolicy::Overflow },
        p.entries(),
    )?;
    let mut a = buckets.plan(ctx, &idx)?;
    let bufs = FfnBuffers { x: (&x).into(), indices: (&idx).into(), partial: (&pa).into() };
    a.extend(plan_ffn(ctx, &ffn, p.tokens, p.k, &bufs, FfnRouting::Bucketed(&buckets))?.into_dispatches());
    let (flops, tokens) = (p.flops(), p.tokens);
    let validate = move |ctx: &Context| p.check_pair(ctx, (&pa, "bucketed"), (&pb, "grouped"));
    Ok(Case {
        a: Work::Gpu(a),
        b: Work::Gpu(b),
        flops,
        bytes: 0.0,
        tokens,
        validate: Box::new(validate),
        note: None,
    })
}

/// Row-wise decode path (B) against the grouped path with its dispatch (A) at decode sizes.
pub fn decode_vs_grouped() -> Registered {
    Registered {
        name: "gemm/decode-vs-grouped",
        description: "row-wise expert FFN over the routed entries (B) against dispatch + grouped GEMM (A) for a \
                      few tokens; bandwidth counts the selected experts' weights; outputs bitwise equal",
        variants: ("grouped", "decode"),
        sizes: Box::new(|set, held_out| gemm_sizes(set, held_out, true)),
        build: Box::new(build_decode_vs_grouped),
    }
}

fn build_decode_vs_grouped(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let (p, ffn, x, idx) = Problem::setup(ctx, size, seed)?;
    let bytes = word_bytes(u64::from(p.entries() * p.h));
    let (pa, pb) = (ctx.zeroed("grouped partial", bytes)?, ctx.zeroed("decode partial", bytes)?);
    let a = grouped(ctx, &p, &ffn, &x, &idx, &pa)?;
    let bufs = FfnBuffers { x: (&x).into(), indices: (&idx).into(), partial: (&pb).into() };
    let b = plan_ffn(ctx, &ffn, p.tokens, p.k, &bufs, FfnRouting::Decode)?.into_dispatches();
    let mut distinct = p.idx.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let weight_bytes = 3.0 * 4.0 * distinct.len() as f64 * f64::from(p.h) * f64::from(p.f);
    let (flops, tokens) = (p.flops(), p.tokens);
    let validate = move |ctx: &Context| p.check_pair(ctx, (&pb, "decode"), (&pa, "grouped"));
    Ok(Case {
        a: Work::Gpu(a),
        b: Work::Gpu(b),
        flops,
        bytes: weight_bytes,
        tokens,
        validate: Box::new(validate),
        note: None,
    })
}

/// The dense GEMM through the adapter's default block kernel (B) against one output per
/// invocation read straight from memory (A). Bit-identical outputs.
pub fn tiled_vs_rowwise() -> Registered {
    Registered {
        name: "gemm/block-vs-rowwise-dense",
        description: "dense GEMM with the adapter's default block kernel (B: 16x8 register blocks reading x from \
                      uniform windows on CPU adapters, 32x32 workgroup-memory tiles elsewhere) against one output \
                      per invocation (A); bit-identical",
        variants: ("rowwise", "block"),
        sizes: Box::new(tiled_vs_rowwise_sizes),
        build: Box::new(build_tiled_vs_rowwise),
    }
}

fn tiled_vs_rowwise_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let shapes: &[(u32, u32, u32)] = match (set, held_out) {
        (SizeSet::Gpu, false) => &[(4096, 512, 1024), (4096, 1024, 512)],
        (SizeSet::Gpu, true) => &[(2048, 2048, 1024)],
        (SizeSet::Cpu, false) => &[(256, 128, 256), (256, 256, 128)],
        (SizeSet::Cpu, true) => &[(512, 128, 256)],
    };
    shapes.iter().map(|&(r, n, k)| Size::of(&[("rows", r), ("N", n), ("K", k)])).collect()
}

fn build_tiled_vs_rowwise(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let block = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict).down;
    dense_pair(ctx, size, seed, DenseKernel::Rowwise, DenseKernel::Block(block))
}

/// Dense GEMMs `y = x . w^T` of one f32 weight matrix (`rows`, `N`, `K` from `size`) with
/// kernel `a` (A) and `b` (B) in the strict order: both checked against the reference dot on
/// the first and last row, and bitwise equal.
fn dense_pair(ctx: &Context, size: &Size, seed: u64, a: DenseKernel, b: DenseKernel) -> Result<Case> {
    let (rows, n, k) = (size.get("rows")?, size.get("N")?, size.get("K")?);
    let mut s = Synth::new(seed);
    let (x, w) = (s.uniform((rows * k) as usize, 1.0), s.uniform((n * k) as usize, 1.0 / (k as f32).sqrt()));
    let weights = ExpertWeights::from_f32(ctx, &w, WeightDtype::F32, 1, n, k)?;
    let xb = ctx.upload("x", &x)?;
    let bytes = word_bytes(u64::from(rows * n));
    let (ya, yb) = (ctx.zeroed("y A", bytes)?, ctx.zeroed("y B", bytes)?);
    let plan = |kernel, y| plan_dense(ctx, &weights, rows, &xb, y, kernel, GemmOrder::Strict);
    let (wa, wb) = (plan(a, &ya)?.into_dispatches(), plan(b, &yb)?.into_dispatches());
    let name = |kernel: DenseKernel| match kernel {
        DenseKernel::Block(v) => v.name(),
        DenseKernel::Rowwise => "row-wise".to_string(),
    };
    let note = Some(format!("A: {}; B: {}", name(a), name(b)));
    let (nu, ku) = (n as usize, k as usize);
    let validate = move |ctx: &Context| -> Result<()> {
        let total = rows as usize * nu;
        let (got_a, got_b): (Vec<f32>, Vec<f32>) = (ctx.read_back(&ya, total)?, ctx.read_back(&yb, total)?);
        for r in [0, rows as usize - 1] {
            for c in 0..nu {
                let want = reference::dot(&x[r * ku..(r + 1) * ku], &w[c * ku..(c + 1) * ku]);
                let got = got_a[r * nu + c];
                if (got - want).abs() > 2e-5 + 2e-5 * want.abs().max(1.0) {
                    return Err(Error::Validation(format!("dense y[{r}, {c}] = {got}, reference {want}")));
                }
            }
        }
        if !bit_identical(&got_a, &got_b) {
            return Err(Error::Validation("the two dense GEMMs are not bit-identical".into()));
        }
        Ok(())
    };
    Ok(Case {
        a: Work::Gpu(wa),
        b: Work::Gpu(wb),
        flops: 2.0 * f64::from(rows) * f64::from(n) * f64::from(k),
        bytes: 0.0,
        tokens: 0,
        validate: Box::new(validate),
        note,
    })
}

/// The dense GEMM with the widest block candidate (B: window 32 x 4 blocks on CPU adapters,
/// tiles with a 64-deep K chunk elsewhere) against the adapter's default block (A), strict
/// order; bitwise equal. The dense target of the kernel work is read from B.
pub fn dense_wide_vs_default() -> Registered {
    Registered {
        name: "gemm/dense-wide-vs-default",
        description: "dense GEMM y = x . w^T on one f32 weight matrix with the widest block candidate (B: window \
                      32x4 register blocks on CPU adapters, 32x32 tiles with a 64-deep K chunk elsewhere) against \
                      the adapter's default block (A), strict order; bitwise equal",
        variants: ("default", "wide"),
        sizes: Box::new(dense_wide_vs_default_sizes),
        build: Box::new(build_dense_wide_vs_default),
    }
}

fn dense_wide_vs_default_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let shapes: &[(u32, u32, u32)] = match (set, held_out) {
        (SizeSet::Gpu, false) => &[(4096, 1024, 512), (4096, 4096, 1024)],
        (SizeSet::Gpu, true) => &[(2048, 2048, 2048)],
        (SizeSet::Cpu, false) => &[(256, 1024, 512)],
        (SizeSet::Cpu, true) => &[(384, 768, 512)],
    };
    shapes.iter().map(|&(r, n, k)| Size::of(&[("rows", r), ("N", n), ("K", k)])).collect()
}

fn build_dense_wide_vs_default(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let kind = AdapterKind::of(ctx.adapter());
    let default = FfnKernels::default_for(kind, GemmOrder::Strict).down;
    let wide = if ctx.adapter().is_cpu() {
        GemmVariant::Window(LaneBlock::new(32, 4, 8))
    } else {
        GemmVariant::Tiled { bk4: 16 }
    };
    dense_pair(ctx, size, seed, DenseKernel::Block(default), DenseKernel::Block(wide))
}

/// The layer-shape sizes of the GEMM mode and variant comparisons: the peers' layer
/// (N=256, H=512, F=1024, E=16, k=2) on CPU adapters, larger prefills on GPUs.
fn layer_shape_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let shapes: &[(u32, u32, u32, u32, u32)] = match (set, held_out) {
        (SizeSet::Gpu, false) => &[(4096, 1024, 512, 64, 8), (2048, 2048, 768, 128, 8)],
        (SizeSet::Gpu, true) => &[(1024, 2048, 1024, 32, 4)],
        (SizeSet::Cpu, false) => &[(256, 512, 1024, 16, 2)],
        (SizeSet::Cpu, true) => &[(128, 512, 768, 16, 4)],
    };
    shapes
        .iter()
        .map(|&(m, h, f, e, k)| Size::of(&[("M", m), ("H", h), ("F", f), ("E", e), ("k", k)]))
        .collect()
}

/// `p`'s x and indices on the device, and A's and B's zeroed `partial` outputs.
struct PairBuffers {
    x: wgpu::Buffer,
    idx: wgpu::Buffer,
    a: wgpu::Buffer,
    b: wgpu::Buffer,
}

impl PairBuffers {
    fn new(ctx: &Context, p: &Problem) -> Result<Self> {
        let bytes = word_bytes(u64::from(p.entries() * p.h));
        Ok(PairBuffers {
            x: ctx.upload("x", &p.x)?,
            idx: ctx.upload("indices", &p.idx)?,
            a: ctx.zeroed("partial A", bytes)?,
            b: ctx.zeroed("partial B", bytes)?,
        })
    }

    /// The grouped FFN `ffn` into A's output (`b` false) or B's.
    fn grouped(&self, ctx: &Context, p: &Problem, ffn: &ExpertFfn, b: bool) -> Result<Vec<Dispatch>> {
        grouped(ctx, p, ffn, &self.x, &self.idx, if b { &self.b } else { &self.a })
    }

    /// The case timing `wa` against `wb` on `p`, checked by `validate` after the runs.
    fn case(
        self,
        p: Problem,
        (wa, wb): (Vec<Dispatch>, Vec<Dispatch>),
        note: String,
        validate: impl Fn(&Problem, &PairBuffers, &Context) -> Result<()> + 'static,
    ) -> Case {
        Case {
            a: Work::Gpu(wa),
            b: Work::Gpu(wb),
            flops: p.flops(),
            bytes: 0.0,
            tokens: p.tokens,
            validate: Box::new(move |ctx: &Context| validate(&p, &self, ctx)),
            note: Some(note),
        }
    }
}

/// Whether `k` rounds its operands to f16 (both projections [`GemmVariant::TileF16`] or
/// [`GemmVariant::CoopF16`]): its outputs are checked against the reference on f16-rounded
/// operands.
fn stages_f16(k: FfnKernels) -> bool {
    let f16 = |v| matches!(v, GemmVariant::TileF16(_) | GemmVariant::CoopF16(_));
    f16(k.up) && f16(k.down)
}

/// Whether `k` sums on matrix units in the device's order (both projections
/// [`GemmVariant::CoopF16`]): checked within [`COOP_TOLERANCE`] of the row's scale, not the
/// 2e-5 of the kernels with a documented order, and bitwise against nothing.
fn device_order(k: FfnKernels) -> bool {
    matches!(k.up, GemmVariant::CoopF16(_)) && matches!(k.down, GemmVariant::CoopF16(_))
}

/// Tolerance of cooperative-matrix kernels in the benchmarks' check, relative to the row's
/// largest output: their sums are within about `K·2^-22` of the rounded operands' dots, and an
/// activation a sum moves across an f16 rounding boundary moves its products by 2^-11. (The
/// device check run before their first use, `kernels::gemm::coop`, holds them to the bound
/// itself.)
const COOP_TOLERANCE: f32 = 1e-2;

/// The grouped FFN with kernels `a` (A) and `b` (B): outputs checked against the reference in
/// each one's order (on f16-rounded operands for f16-staged kernels), and bitwise equal when
/// the orders and the staging agree.
fn grouped_pair(ctx: &Context, size: &Size, seed: u64, a: FfnKernels, b: FfnKernels) -> Result<Case> {
    let p = Problem::new(size, seed)?;
    let (fa, fb) = (p.ffn_with(ctx, a)?, p.ffn_with(ctx, b)?);
    let bufs = PairBuffers::new(ctx, &p)?;
    let runs = (bufs.grouped(ctx, &p, &fa, false)?, bufs.grouped(ctx, &p, &fb, true)?);
    let note = format!(
        "A: {} / {} {:?}; B: {} / {} {:?}",
        a.up.name(),
        a.down.name(),
        a.order,
        b.up.name(),
        b.down.name(),
        b.order
    );
    Ok(bufs.case(p, runs, note, move |p, bufs, ctx| {
        let tolerance = |k| if device_order(k) { COOP_TOLERANCE } else { 2e-5 };
        let got_a = p.check_with(ctx, &bufs.a, "A", a.order, stages_f16(a), tolerance(a))?;
        let got_b = p.check_with(ctx, &bufs.b, "B", b.order, stages_f16(b), tolerance(b))?;
        let exact = !device_order(a) && !device_order(b);
        if exact && a.order == b.order && stages_f16(a) == stages_f16(b) && !bit_identical(&got_a, &got_b) {
            return Err(Error::Validation("variants of one order are not bitwise equal".into()));
        }
        Ok(())
    }))
}

/// The grouped FFN in the fast order (B) against the strict order (A), same variants: what the
/// strict order costs.
pub fn fast_vs_strict() -> Registered {
    Registered {
        name: "gemm/fast-vs-strict",
        description: "grouped expert FFN with one accumulator per output (B, GemmOrder::Fast) against four lane \
                      accumulators (A, GemmOrder::Strict), the adapter's default variants: the cost of the strict order",
        variants: ("strict", "fast"),
        sizes: Box::new(layer_shape_sizes),
        build: Box::new(build_fast_vs_strict),
    }
}

fn build_fast_vs_strict(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let a = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
    grouped_pair(ctx, size, seed, a, FfnKernels { order: GemmOrder::Fast, ..a })
}

/// The grouped FFN with the GEMM modules built without runtime bounds checks (B, the default)
/// against the same kernels built with them (A): what the checks cost.
pub fn unchecked_vs_checked() -> Registered {
    Registered {
        name: "gemm/unchecked-vs-checked",
        description: "grouped expert FFN, the adapter's default variants, strict order, built without runtime bounds \
                      checks (B, BoundsChecks::WhereUnproven) against every module built with them (A, \
                      BoundsChecks::Everywhere); bitwise equal",
        variants: ("checked", "unchecked"),
        sizes: Box::new(layer_shape_sizes),
        build: Box::new(build_unchecked_vs_checked),
    }
}

fn build_unchecked_vs_checked(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let kernels = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
    let p = Problem::new(size, seed)?;
    let ffn = p.ffn_with(ctx, kernels)?;
    let bufs = PairBuffers::new(ctx, &p)?;
    // The context's choice applies to the pipelines built while it holds.
    let before = ctx.bounds_checks();
    ctx.set_bounds_checks(BoundsChecks::Everywhere);
    let wa = bufs.grouped(ctx, &p, &ffn, false);
    ctx.set_bounds_checks(BoundsChecks::WhereUnproven);
    let wb = bufs.grouped(ctx, &p, &ffn, true);
    ctx.set_bounds_checks(before);
    let note = format!("{} / {} {:?}", kernels.up.name(), kernels.down.name(), kernels.order);
    Ok(bufs.case(p, (wa?, wb?), note, |p, bufs, ctx| {
        p.check_pair(ctx, (&bufs.a, "checked"), (&bufs.b, "unchecked"))
    }))
}

/// The grouped FFN on another workgroup-memory tile (B) against the GPU default, `Tiled`'s
/// 32 × 32 tiles (A), in one order: what a tile of the GPU family does at the layer shapes
/// (the figures that decide a tile per rows per expert), or what f16 staging does against the
/// same tile in f32.
struct TileVsTile {
    order: GemmOrder,
    a: GemmVariant,
    b: GemmVariant,
}

/// The GPU tile family's comparisons.
pub fn tile_comparisons() -> Vec<Registered> {
    let tiled = GemmVariant::Tiled { bk4: 8 };
    let tile64 = GemmVariant::Tile(TileBlock::new(64, 64, 4, 4, 4));
    vec![
        Registered::configured(
            "gemm/coop-vs-f32-tile",
            "grouped expert FFN on cooperative matrices (B, the CoopF16 precision mode: 32x32 \
             blocks of 16x16 f16 fragments into f32, one subgroup each) against 64x64 f32 tiles \
             (A), strict order for A; B checked within 1% of each row's scale of the reference on \
             f16-rounded operands (after its own device check); only on devices created with \
             cooperative matrices (MOEFLOW_COOPERATIVE_MATRIX=1)",
            ("f32 tiles", "coop f16"),
            CoopVsTile { a: GemmVariant::Tile(TileBlock::new(64, 64, 4, 4, 4)) },
            CoopVsTile::sizes,
            CoopVsTile::build,
        ),
        Registered::configured(
            "gemm/tile64-vs-tiled",
            "grouped expert FFN on 64x64 tiles of 256 invocations, 4x4 outputs each, K chunks of \
             16 (B) against the default 32x32 tiles of 64 invocations (A), strict order; bitwise equal",
            ("tiled", "tile64"),
            TileVsTile { order: GemmOrder::Strict, a: tiled, b: tile64 },
            TileVsTile::sizes,
            TileVsTile::build,
        ),
        Registered::configured(
            "gemm/tile128-vs-tiled",
            "grouped expert FFN on 128x128 tiles of 256 invocations, 8x8 outputs each, K chunks of \
             8 (B) against the default 32x32 tiles (A), fast order (one accumulator per output); \
             bitwise equal",
            ("tiled", "tile128"),
            TileVsTile {
                order: GemmOrder::Fast,
                a: tiled,
                b: GemmVariant::Tile(TileBlock::new(128, 128, 8, 8, 2)),
            },
            TileVsTile::sizes,
            TileVsTile::build,
        ),
        Registered::configured(
            "gemm/f16-staged-vs-f32-tile",
            "grouped expert FFN on 64x64 tiles staging x and the weights in f16 (B, the \
             TileF16 precision mode) against the same tiles in f32 (A), strict order; B checked \
             against the reference on f16-rounded operands",
            ("f32 tiles", "f16 tiles"),
            TileVsTile {
                order: GemmOrder::Strict,
                a: tile64,
                b: GemmVariant::TileF16(TileBlock::new(64, 64, 4, 4, 4)),
            },
            TileVsTile::sizes,
            TileVsTile::build,
        ),
    ]
}

impl TileVsTile {
    fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        layer_shape_sizes(set, held_out)
    }
    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let a = FfnKernels { order: self.order, up: self.a, down: self.a };
        grouped_pair(ctx, size, seed, a, FfnKernels { up: self.b, down: self.b, ..a })
    }
}

/// The grouped FFN on cooperative-matrix blocks of the device's subgroup size (B) against
/// exact f32 tiles (A).
struct CoopVsTile {
    a: GemmVariant,
}

impl CoopVsTile {
    fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        layer_shape_sizes(set, held_out)
    }
    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let lanes = ctx.adapter().subgroup_sizes[1];
        let b = GemmVariant::CoopF16(CoopBlock::new(32, 32, 16, lanes));
        check_on_device(ctx, &[b])?;
        let a = FfnKernels { order: GemmOrder::Strict, up: self.a, down: self.a };
        grouped_pair(ctx, size, seed, a, FfnKernels { up: b, down: b, ..a })
    }
}

/// The grouped FFN with direct (CPU-shaped) blocks (B) against workgroup-memory tiles (A).
pub fn direct_vs_tiled() -> Registered {
    Registered {
        name: "gemm/direct-vs-tiled",
        description: "grouped expert FFN with direct 16x8 register blocks of 8 lanes, no workgroup memory (B), \
                      against 32x32 workgroup-memory tiles of 4x4 blocks (A), strict order; bitwise equal",
        variants: ("tiled", "direct"),
        sizes: Box::new(layer_shape_sizes),
        build: Box::new(build_direct_vs_tiled),
    }
}

fn build_direct_vs_tiled(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let tiled = GemmVariant::Tiled { bk4: 8 };
    let direct = GemmVariant::Direct(LaneBlock::new(16, 8, 8));
    let a = FfnKernels { order: GemmOrder::Strict, up: tiled, down: tiled };
    grouped_pair(ctx, size, seed, a, FfnKernels { up: direct, down: direct, ..a })
}

/// The grouped FFN with window blocks (B: x read from uniform-buffer windows a staging pass
/// fills) against the same direct blocks reading x from storage (A).
pub fn window_vs_direct() -> Registered {
    Registered {
        name: "gemm/window-vs-direct",
        description: "grouped expert FFN with 16x8 register blocks of 8 lanes reading x from uniform-buffer \
                      windows filled by a staging pass (B) against the same blocks reading x from storage (A), \
                      strict order; bitwise equal",
        variants: ("direct", "window"),
        sizes: Box::new(layer_shape_sizes),
        build: Box::new(build_window_vs_direct),
    }
}

fn build_window_vs_direct(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let direct = GemmVariant::Direct(LaneBlock::new(16, 8, 8));
    let window = GemmVariant::Window(LaneBlock::new(16, 8, 8));
    let a = FfnKernels { order: GemmOrder::Strict, up: direct, down: direct };
    grouped_pair(ctx, size, seed, a, FfnKernels { up: window, down: window, ..a })
}

/// The texture blocks' columns on `ctx`: 8, or 4 on SwiftShader (whose compiler takes minutes
/// over blocks of 8 columns).
fn texture_cols(ctx: &Context) -> u32 {
    AdapterKind::of(ctx.adapter()).max_block_cols().min(8)
}

/// The grouped FFN with texture blocks (B: the weights read from texture copies made on the
/// device) against the same window blocks reading the weights from storage (A).
pub fn texture_vs_window() -> Registered {
    Registered {
        name: "gemm/texture-vs-window",
        description: "grouped expert FFN with 16x8 register blocks of 8 lanes (16x4 on SwiftShader) reading the \
                      weights from texture copies (B) against the same blocks reading them from storage (A), x \
                      from uniform windows in both, strict order; bitwise equal",
        variants: ("window", "texture"),
        sizes: Box::new(layer_shape_sizes),
        build: Box::new(build_texture_vs_window),
    }
}

fn build_texture_vs_window(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let cols = texture_cols(ctx);
    let window = GemmVariant::Window(LaneBlock::new(16, cols, 8));
    let texture = GemmVariant::Texture(LaneBlock::new(16, cols, 8));
    let a = FfnKernels { order: GemmOrder::Strict, up: window, down: window };
    grouped_pair(ctx, size, seed, a, FfnKernels { up: texture, down: texture, ..a })
}

/// The dense GEMM with texture blocks of 32 rows (B) against window 32 x 4 blocks (A, the
/// widest storage-weight block), strict order; bitwise equal.
pub fn dense_texture_vs_window() -> Registered {
    Registered {
        name: "gemm/dense-texture-vs-window",
        description: "dense GEMM y = x . w^T on one f32 weight matrix with 32x8 register blocks (32x4 on \
                      SwiftShader) reading the weights from a texture copy (B) against window 32x4 blocks reading \
                      them from storage (A), strict order; bitwise equal",
        variants: ("window", "texture"),
        sizes: Box::new(dense_wide_vs_default_sizes),
        build: Box::new(build_dense_texture_vs_window),
    }
}

fn build_dense_texture_vs_window(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let window = GemmVariant::Window(LaneBlock::new(32, 4, 8));
    let texture = GemmVariant::Texture(LaneBlock::new(32, texture_cols(ctx), 8));
    dense_pair(ctx, size, seed, DenseKernel::Block(window), DenseKernel::Block(texture))
}

/// The grouped FFN with the tuner's choice (B) against the adapter's fixed default (A); the
/// note says which variants the tuner chose.
pub fn tuned_vs_default() -> Registered {
    Registered {
        name: "gemm/tuned-vs-default",
        description: "grouped expert FFN with the variants the tuner picked on this adapter (B; the note names \
                      them) against the adapter's fixed default (A), strict order; bitwise equal",
        variants: ("default", "tuned"),
        sizes: Box::new(layer_shape_sizes),
        build: Box::new(build_tuned_vs_default),
    }
}

fn build_tuned_vs_default(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let a = FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict);
    let p = Problem::new(size, seed)?;
    let opts = TuneOptions { cache: None, ..TuneOptions::for_context(ctx) };
    let tuned = tune(ctx, &p.ffn(ctx)?, GemmOrder::Strict, &opts)?;
    let mut case = grouped_pair(ctx, size, seed, a, tuned.kernels)?;
    let timings: Vec<String> = tuned
        .timings
        .iter()
        .map(|(v, u, d)| format!("{} {:.1}/{:.1} ms", v.name(), u * 1e3, d * 1e3))
        .collect();
    case.note = Some(format!(
        "tuned: up {}, down {} (up/down on every expert, 3/4 and 5/4 of {} rows alternately: {})",
        tuned.kernels.up.name(),
        tuned.kernels.down.name(),
        opts.rows,
        timings.join(", ")
    ));
    Ok(case)
}

/// Quantised expert weights (B) against f16 weights (A) on one path: the row-wise decode path
/// at decode sizes, the grouped path (with its dispatch) at prefill sizes; the adapter's
/// default kernels in strict order. `bytes` are B's: the selected experts' quantised weights
/// (the note gives A's). Each side is checked against the CPU reference on its own rounded
/// weights.
struct QuantVsF16 {
    /// B's format.
    dtype: WeightDtype,
    /// Decode sizes and the row-wise path, else prefill sizes and the grouped path.
    decode: bool,
}

/// One comparison of quantised against f16 weights per quantised format and path.
pub fn quant_comparisons() -> Vec<Registered> {
    let formats = [WeightDtype::Q8_0, WeightDtype::Q4_0, WeightDtype::Mxfp4, WeightDtype::Fp8];
    [true, false]
        .into_iter()
        .flat_map(|decode| formats.map(|dtype| QuantVsF16 { dtype, decode }))
        .map(|q| {
            Registered::configured(
                q.name(),
                q.description(),
                q.variants(),
                q,
                QuantVsF16::sizes,
                QuantVsF16::build,
            )
        })
        .collect()
}

/// Quantised-format comparison sizes: the bandwidth-bound decode shape (E = 32,
/// H = 2048, F = 1024, k = 4) on CPU adapters, gpt-oss-20b's expert shape on GPUs.
fn quant_sizes(set: SizeSet, held_out: bool, decode: bool) -> Vec<Size> {
    let shapes: &[(u32, u32, u32, u32, u32)] = match (set, held_out, decode) {
        (SizeSet::Cpu, false, true) => &[(1, 2048, 1024, 32, 4), (4, 2048, 1024, 32, 4)],
        (SizeSet::Cpu, true, true) => &[(2, 2048, 1024, 32, 4), (1, 1024, 512, 64, 8)],
        (SizeSet::Cpu, false, false) => &[(64, 2048, 1024, 32, 4)],
        (SizeSet::Cpu, true, false) => &[(32, 1024, 512, 64, 8)],
        (SizeSet::Gpu, false, true) => &[(1, 2880, 2880, 32, 4), (4, 2880, 2880, 32, 4)],
        (SizeSet::Gpu, true, true) => &[(2, 2880, 2880, 32, 4)],
        (SizeSet::Gpu, false, false) => &[(512, 2880, 2880, 32, 4)],
        (SizeSet::Gpu, true, false) => &[(256, 2880, 2880, 32, 4)],
    };
    shapes
        .iter()
        .map(|&(m, h, f, e, k)| Size::of(&[("M", m), ("H", h), ("F", f), ("E", e), ("k", k)]))
        .collect()
}

impl QuantVsF16 {
    fn name(&self) -> &'static str {
        match (self.dtype, self.decode) {
            (WeightDtype::Q8_0, true) => "gemm/q8_0-vs-f16-decode",
            (WeightDtype::Q4_0, true) => "gemm/q4_0-vs-f16-decode",
            (WeightDtype::Mxfp4, true) => "gemm/mxfp4-vs-f16-decode",
            (WeightDtype::Q8_0, false) => "gemm/q8_0-vs-f16-prefill",
            (WeightDtype::Q4_0, false) => "gemm/q4_0-vs-f16-prefill",
            (WeightDtype::Mxfp4, false) => "gemm/mxfp4-vs-f16-prefill",
            (_, true) => "gemm/fp8-vs-f16-decode",
            (_, false) => "gemm/fp8-vs-f16-prefill",
        }
    }
    fn description(&self) -> &'static str {
        if self.decode {
            "row-wise decode expert FFN with quantised weights (B) against f16 weights (A), the \
             adapter's default kernels; bandwidth counts B's selected experts' bytes"
        } else {
            "grouped expert FFN with its dispatch, quantised weights (B) against f16 weights (A), \
             the adapter's default kernels; bandwidth counts B's selected experts' bytes"
        }
    }
    fn variants(&self) -> (&'static str, &'static str) {
        let b = match self.dtype {
            WeightDtype::Q8_0 => "q8_0",
            WeightDtype::Q4_0 => "q4_0",
            WeightDtype::Mxfp4 => "mxfp4",
            _ => "fp8",
        };
        ("f16", b)
    }
    fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        quant_sizes(set, held_out, self.decode)
    }
    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let p = Problem::new(size, seed)?;
        let (h, f) = (p.h as usize, p.f as usize);
        let on_device = |dtype: WeightDtype| -> Result<ExpertFfn> {
            let w = |d: &[f32], n, k| ExpertWeights::from_f32(ctx, d, dtype, p.e, n, k);
            ExpertFfn::new(w(&p.gate, p.f, p.h)?, w(&p.up, p.f, p.h)?, w(&p.down, p.h, p.f)?)
        };
        let (fa, fb) = (on_device(WeightDtype::F16)?, on_device(self.dtype)?);
        let (x, idx) = (ctx.upload("x", &p.x)?, ctx.upload("indices", &p.idx)?);
        let out_bytes = word_bytes(u64::from(p.entries() * p.h));
        let (pa, pb) = (ctx.zeroed("partial A", out_bytes)?, ctx.zeroed("partial B", out_bytes)?);
        let work = |ffn: &ExpertFfn, partial: &wgpu::Buffer| -> Result<Vec<Dispatch>> {
            if self.decode {
                let bufs = FfnBuffers { x: (&x).into(), indices: (&idx).into(), partial: partial.into() };
                Ok(plan_ffn(ctx, ffn, p.tokens, p.k, &bufs, FfnRouting::Decode)?.into_dispatches())
            } else {
                grouped(ctx, &p, ffn, &x, &idx, partial)
            }
        };
        let (wa, wb) = (work(&fa, &pa)?, work(&fb, &pb)?);
        let mut distinct = p.idx.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let weight_bytes = |dtype: WeightDtype| {
            let (h64, f64_) = (u64::from(p.h), u64::from(p.f));
            distinct.len() as f64 * (2 * dtype.packed_bytes(f64_, h64) + dtype.packed_bytes(h64, f64_)) as f64
        };
        let (bytes_a, bytes) = (weight_bytes(WeightDtype::F16), weight_bytes(self.dtype));
        let note = Some(format!(
            "B reads {:.1} MB of expert weights per run, A (f16) {:.1} MB ({:.2}x); kernels {}",
            bytes / 1e6,
            bytes_a / 1e6,
            bytes_a / bytes,
            fb.kernels(ctx).up.name()
        ));
        // Each side's reference on its own rounded weights (computed once, untimed).
        let rounded = |dtype: WeightDtype| -> Result<Problem> {
            Ok(p.with_weights([dtype.round(&p.gate, h)?, dtype.round(&p.up, h)?, dtype.round(&p.down, f)?]))
        };
        let (ra, rb) = (rounded(WeightDtype::F16)?, rounded(self.dtype)?);
        let (flops, tokens) = (p.flops(), p.tokens);
        let validate = move |ctx: &Context| {
            ra.check(ctx, &pa, "f16")?;
            rb.check(ctx, &pb, "quantised").map(|_| ())
        };
        Ok(Case {
            a: Work::Gpu(wa),
            b: Work::Gpu(wb),
            flops,
            bytes,
            tokens,
            validate: Box::new(validate),
            note,
        })
    }
}
