//! Comparisons of quantised weights against f16 ones in the grouped FFN and the dense GEMM.

use super::super::comparison::{Case, Registered, Size, SizeSet, Work};
use super::problem::{Problem, grouped};
use crate::context::Context;
use crate::error::Result;
use crate::kernels::gemm::{ExpertFfn, ExpertWeights, FfnBuffers, FfnRouting, WeightDtype, plan_ffn};
use crate::pipeline::Dispatch;
use crate::tensor::word_bytes;

/// Quantised expert weights (B) against f16 weights (A) on one path: the row-wise decode path
/// at decode sizes, the grouped path (with its dispatch) at prefill sizes; the adapter's
/// default kernels in strict order. `bytes` are B's: the selected experts' quantised weights
/// (the note gives A's). Each side is checked against the CPU reference on its own rounded
/// weights.
pub(super) struct QuantVsF16 {
    /// B's format.
    pub(super) dtype: WeightDtype,
    /// Decode sizes and the row-wise path, else prefill sizes and the grouped path.
    pub(super) decode: bool,
}

/// One comparison of quantised against f16 weights per quantised format and path.
pub(crate) fn quant_comparisons() -> Vec<Registered> {
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
pub(super) fn quant_sizes(set: SizeSet, held_out: bool, decode: bool) -> Vec<Size> {
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
    pub(super) fn name(&self) -> &'static str {
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
    pub(super) fn description(&self) -> &'static str {
        if self.decode {
            "row-wise decode expert FFN with quantised weights (B) against f16 weights (A), the \
             adapter's default kernels; bandwidth counts B's selected experts' bytes"
        } else {
            "grouped expert FFN with its dispatch, quantised weights (B) against f16 weights (A), \
             the adapter's default kernels; bandwidth counts B's selected experts' bytes"
        }
    }
    pub(super) fn variants(&self) -> (&'static str, &'static str) {
        let b = match self.dtype {
            WeightDtype::Q8_0 => "q8_0",
            WeightDtype::Q4_0 => "q4_0",
            WeightDtype::Mxfp4 => "mxfp4",
            _ => "fp8",
        };
        ("f16", b)
    }
    pub(super) fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        quant_sizes(set, held_out, self.decode)
    }
    pub(super) fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
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
