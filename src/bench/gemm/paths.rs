//! Comparisons of the expert projections' paths: the grouped GEMM against a dense GEMM of
//! equal FLOPs and against the bucketed path with overflow, and the row-wise decode path
//! against the grouped one.

use super::super::comparison::{Case, Registered, Size, Work};
use super::problem::{Problem, gemm_sizes, grouped};
use crate::context::Context;
use crate::error::Result;
use crate::kernels::dispatch::{BucketConfig, BucketLayout, OverflowPolicy};
use crate::kernels::gemm::{
    DenseKernel, ExpertWeights, FfnBuffers, FfnRouting, WeightDtype, plan_dense, plan_ffn,
};
use crate::synth::Synth;
use crate::tensor::word_bytes;

/// Grouped GEMM (B) against three dense GEMMs of the same FLOPs (A).
pub(crate) fn grouped_vs_dense() -> Registered {
    Registered::new(
        "gemm/grouped-vs-dense",
        "SwiGLU expert FFN as padded-tile grouped GEMMs with the dispatch (B) against dense GEMMs of \
                      the same FLOPs on one weight matrix (A): the throughput yardstick",
        ("dense", "grouped"),
        |set, held_out| gemm_sizes(set, held_out, false),
        build_grouped_vs_dense,
    )
}

pub(super) fn build_grouped_vs_dense(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
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
pub(crate) fn grouped_vs_bucketed() -> Registered {
    Registered::new(
        "gemm/grouped-vs-bucketed",
        "padded-tile grouped GEMM (B) against per-bucket grouped matmuls bounded at the mean load \
                      with an overflow pass (A); both include their dispatch, outputs bitwise equal",
        ("bucketed", "grouped"),
        |set, held_out| gemm_sizes(set, held_out, false),
        build_grouped_vs_bucketed,
    )
}

pub(super) fn build_grouped_vs_bucketed(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
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
pub(crate) fn decode_vs_grouped() -> Registered {
    Registered::new(
        "gemm/decode-vs-grouped",
        "row-wise expert FFN over the routed entries (B) against dispatch + grouped GEMM (A) for a \
                      few tokens; bandwidth counts the selected experts' weights; outputs bitwise equal",
        ("grouped", "decode"),
        |set, held_out| gemm_sizes(set, held_out, true),
        build_decode_vs_grouped,
    )
}

pub(super) fn build_decode_vs_grouped(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
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
