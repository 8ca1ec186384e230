//! What the expert-projection comparisons share: a synthetic problem ([`Problem`]) on the
//! device and checked against the CPU reference, their size sets, and the builders of a
//! grouped or dense pair of kernel choices.

use super::super::comparison::{Case, Size, SizeSet, Work};
use super::super::dispatch::skewed_indices;
use crate::bits::bit_identical;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{DispatchConfig, DispatchLayout};
use crate::kernels::gemm::{
    AdapterKind, DenseKernel, ExpertFfn, ExpertWeights, FfnBuffers, FfnKernels, FfnRouting, GemmOrder,
    GemmVariant, WeightDtype, plan_dense, plan_ffn,
};
use crate::pipeline::Dispatch;
use crate::reference::gemm as reference;
use crate::synth::Synth;
use crate::tensor::word_bytes;

/// Entries checked against the CPU reference at each validation (first and last ones).
pub(super) const CHECKED_ENTRIES: usize = 8;

pub(super) struct Problem {
    pub(super) tokens: u32,
    pub(super) k: u32,
    pub(super) h: u32,
    pub(super) f: u32,
    pub(super) e: u32,
    pub(super) x: Vec<f32>,
    pub(super) idx: Vec<u32>,
    pub(super) gate: Vec<f32>,
    pub(super) up: Vec<f32>,
    pub(super) down: Vec<f32>,
}

impl Problem {
    pub(super) fn new(size: &Size, seed: u64) -> Result<Self> {
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
    pub(super) fn setup(
        ctx: &Context,
        size: &Size,
        seed: u64,
    ) -> Result<(Self, ExpertFfn, wgpu::Buffer, wgpu::Buffer)> {
        let p = Problem::new(size, seed)?;
        let ffn = p.ffn(ctx)?;
        let (x, idx) = (ctx.upload("x", &p.x)?, ctx.upload("indices", &p.idx)?);
        Ok((p, ffn, x, idx))
    }

    /// Checks `checked` against the reference and `other` bitwise against it.
    pub(super) fn check_pair(
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

    pub(super) fn entries(&self) -> u32 {
        self.tokens * self.k
    }

    /// This problem with other weights (`[gate, up, down]`).
    pub(super) fn with_weights(&self, [gate, up, down]: [Vec<f32>; 3]) -> Problem {
        Problem { x: self.x.clone(), idx: self.idx.clone(), gate, up, down, ..*self }
    }

    /// The FFN with explicit kernels (order and variants).
    pub(super) fn ffn_running(&self, ctx: &Context, kernels: FfnKernels) -> Result<ExpertFfn> {
        self.ffn(ctx)?.with_kernels(kernels)
    }

    pub(super) fn ffn(&self, ctx: &Context) -> Result<ExpertFfn> {
        let w = |d: &[f32], n, k| ExpertWeights::from_f32(ctx, d, WeightDtype::F32, self.e, n, k);
        ExpertFfn::new(
            w(&self.gate, self.f, self.h)?,
            w(&self.up, self.f, self.h)?,
            w(&self.down, self.h, self.f)?,
        )
    }

    /// FLOPs of the expert FFN: three projections of 2 * H * F per entry.
    pub(super) fn flops(&self) -> f64 {
        6.0 * f64::from(self.entries()) * f64::from(self.h) * f64::from(self.f)
    }

    /// Checks the first and last entries of `partial` against the CPU reference (strict order).
    pub(super) fn check(&self, ctx: &Context, partial: &wgpu::Buffer, what: &str) -> Result<Vec<f32>> {
        self.check_in_order(ctx, partial, what, GemmOrder::Strict, false, 2e-5)
    }

    /// Checks the first and last entries of `partial` against the CPU reference in `order`, on
    /// f16-rounded operands where `f16_operands` (the kernels that stage in f16).
    pub(super) fn check_in_order(
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
pub(super) fn grouped(
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

pub(super) fn gemm_sizes(set: SizeSet, held_out: bool, decode: bool) -> Vec<Size> {
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

/// The layer-shape sizes of the GEMM mode and variant comparisons: the peers' layer
/// (N=256, H=512, F=1024, E=16, k=2) on CPU adapters, larger prefills on GPUs.
pub(super) fn layer_shape_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
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
pub(super) struct PairBuffers {
    pub(super) x: wgpu::Buffer,
    pub(super) idx: wgpu::Buffer,
    pub(super) a: wgpu::Buffer,
    pub(super) b: wgpu::Buffer,
}

impl PairBuffers {
    pub(super) fn new(ctx: &Context, p: &Problem) -> Result<Self> {
        let bytes = word_bytes(u64::from(p.entries() * p.h));
        Ok(PairBuffers {
            x: ctx.upload("x", &p.x)?,
            idx: ctx.upload("indices", &p.idx)?,
            a: ctx.zeroed("partial A", bytes)?,
            b: ctx.zeroed("partial B", bytes)?,
        })
    }

    /// The grouped FFN `ffn` into A's output (`b` false) or B's.
    pub(super) fn grouped(
        &self,
        ctx: &Context,
        p: &Problem,
        ffn: &ExpertFfn,
        b: bool,
    ) -> Result<Vec<Dispatch>> {
        grouped(ctx, p, ffn, &self.x, &self.idx, if b { &self.b } else { &self.a })
    }

    /// The case timing `wa` against `wb` on `p`, checked by `validate` after the runs.
    pub(super) fn case(
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
pub(super) fn stages_f16(k: FfnKernels) -> bool {
    let f16 = |v| matches!(v, GemmVariant::TileF16(_) | GemmVariant::CoopF16(_));
    f16(k.up) && f16(k.down)
}

/// Whether `k` sums on matrix units in the device's order (both projections
/// [`GemmVariant::CoopF16`]): checked within [`COOP_TOLERANCE`] of the row's scale, not the
/// 2e-5 of the kernels with a documented order, and bitwise against nothing.
pub(super) fn device_order(k: FfnKernels) -> bool {
    matches!(k.up, GemmVariant::CoopF16(_)) && matches!(k.down, GemmVariant::CoopF16(_))
}

/// Tolerance of cooperative-matrix kernels in the benchmarks' check, relative to the row's
/// largest output: their sums are within about `K·2^-22` of the rounded operands' dots, and an
/// activation a sum moves across an f16 rounding boundary moves its products by 2^-11. (The
/// device check run before their first use, `kernels::gemm::coop`, holds them to the bound
/// itself.)
pub(super) const COOP_TOLERANCE: f32 = 1e-2;

/// The grouped FFN with kernels `a` (A) and `b` (B): outputs checked against the reference in
/// each one's order (on f16-rounded operands for f16-staged kernels), and bitwise equal when
/// the orders and the staging agree.
pub(super) fn grouped_pair(
    ctx: &Context,
    size: &Size,
    seed: u64,
    a: FfnKernels,
    b: FfnKernels,
) -> Result<Case> {
    let p = Problem::new(size, seed)?;
    let (fa, fb) = (p.ffn_running(ctx, a)?, p.ffn_running(ctx, b)?);
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
        let got_a = p.check_in_order(ctx, &bufs.a, "A", a.order, stages_f16(a), tolerance(a))?;
        let got_b = p.check_in_order(ctx, &bufs.b, "B", b.order, stages_f16(b), tolerance(b))?;
        let exact = !device_order(a) && !device_order(b);
        if exact && a.order == b.order && stages_f16(a) == stages_f16(b) && !bit_identical(&got_a, &got_b) {
            return Err(Error::Validation("variants of one order are not bitwise equal".into()));
        }
        Ok(())
    }))
}

/// Dense GEMMs `y = x . w^T` of one f32 weight matrix (`rows`, `N`, `K` from `size`) with
/// kernel `a` (A) and `b` (B) in the strict order: both checked against the reference dot on
/// the first and last row, and bitwise equal.
pub(super) fn dense_pair(
    ctx: &Context,
    size: &Size,
    seed: u64,
    a: DenseKernel,
    b: DenseKernel,
) -> Result<Case> {
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

/// The texture blocks' columns on `ctx`: 8, or 4 on SwiftShader (whose compiler takes minutes
/// over blocks of 8 columns).
pub(super) fn texture_cols(ctx: &Context) -> u32 {
    AdapterKind::of(ctx.adapter()).max_block_cols().min(8)
}
