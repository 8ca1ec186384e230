//! The planners of the expert projections: the grouped FFN over a dispatch layout, bucketed
//! with overflow, row-wise decode, every expert on every token, the dense FFN and the dense
//! GEMM, and the automatic choice of the decode path. Each checks its buffers, then lists its
//! passes; none submits.

use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{BucketLayout, DispatchLayout, META_OVERFLOW};
use crate::live::LiveCount;
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::{Access, BufferView, Dispatch};
use crate::tensor::word_bytes;
use crate::workspace::{RegionSize, Scratch, ScratchKey};

use super::ffn::ExpertFfn;
use super::params::{NONE, Params};
use super::passes::{LiveRows, Pass, RowMap};
use super::variant::{GemmOrder, GemmVariant, OperandSource};
use super::weights::ExpertWeights;

impl ScratchKey {
    /// The routed experts' activations `[rows, ffn]` (f32): the grouped rows, the decode
    /// entries or the bucket slots (the grouped and decode paths of one plan share it: a
    /// forward runs one of them).
    pub const ACTIVATIONS: ScratchKey = ScratchKey::new("ffn activations");
    /// The activations of a bucket layout's overflow entries `[tokens * k, ffn]` (f32).
    pub const OVERFLOW_ACTIVATIONS: ScratchKey = ScratchKey::new("overflow activations");
    /// The shared expert's activations `[tokens, shared ffn]` (f32).
    pub const SHARED_ACTIVATIONS: ScratchKey = ScratchKey::new("shared expert activations");
}

/// Token counts past this never use the row-wise decode path when the path is chosen
/// automatically (see [`uses_decode_path`]).
pub const DECODE_MAX_TOKENS: u32 = 8;

/// How rows reach the expert projections.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum FfnRouting<'a> {
    /// (a) Padded-tile grouped GEMM over a dispatch layout (tile a multiple of 32).
    Grouped(&'a DispatchLayout),
    /// (b) One grouped matmul per bucket over `pad_perm` and a row-wise overflow pass. The
    /// bucket layout groups the flattened entries (`tokens * k` of them, k = 1).
    Bucketed(&'a BucketLayout),
    /// Row-wise over entries directly (decode: a handful of tokens, no layout needed).
    Decode,
}

/// Dispatches of an expert FFN.
#[derive(Debug)]
pub struct FfnPlan {
    dispatches: Vec<Dispatch>,
}

impl FfnPlan {
    /// The dispatches in order.
    pub fn dispatches(&self) -> Vec<&Dispatch> {
        self.dispatches.iter().collect()
    }
    /// The dispatches, owned.
    pub fn into_dispatches(self) -> Vec<Dispatch> {
        self.dispatches
    }
}

/// The path chosen automatically for `tokens` tokens routed `k` ways over `experts` experts:
/// the row-wise decode path for one token, or for up to [`DECODE_MAX_TOKENS`] tokens whose
/// entries (`tokens * k`) are fewer than the experts; else the grouped GEMM. With fewer entries
/// than experts each expert's weights serve about one entry, and the row-wise pass reads them
/// once per entry without the grouped path's padded tiles; from about one entry per expert on,
/// a grouped block reads an expert's weights once for all its rows (measured in docs/gemm.md).
/// Either path gives the same bits.
pub fn uses_decode_path(tokens: u32, k: u32, experts: u32) -> bool {
    tokens == 1 || (tokens <= DECODE_MAX_TOKENS && u64::from(tokens) * u64::from(k) < u64::from(experts))
}

/// The largest token count that takes the decode path ([`uses_decode_path`]): the counts that
/// take it are 1 up to this one.
pub(crate) fn decode_tokens(k: u32, experts: u32) -> u32 {
    (1..=DECODE_MAX_TOKENS).rev().find(|&t| uses_decode_path(t, k, experts)).unwrap_or(1)
}

/// Device buffers of an expert FFN.
#[derive(Clone, Copy, Debug)]
pub struct FfnBuffers<'a> {
    /// `x[tokens, H]`.
    pub x: BufferView<'a>,
    /// `indices[tokens, k]` (u32).
    pub indices: BufferView<'a>,
    /// `partial[tokens * k, H]`, written, indexed by entry `token * k + slot`.
    pub partial: BufferView<'a>,
}

/// Plans the expert FFN for `tokens` tokens routed `k` ways: reads `x` and `indices`, writes
/// `partial` (see [`FfnBuffers`]).
///
/// # Errors
/// [`Error::Shape`] for a buffer smaller than its shape; [`Error::InvalidArgument`] for
/// k = 0 or a layout made for another shape or tile; [`Error::LimitExceeded`] for sizes past
/// the adapter's limits (bindings, workgroup memory, invocations, grids).
pub fn plan_ffn(
    ctx: &Context,
    ffn: &ExpertFfn,
    tokens: u32,
    k: u32,
    bufs: &FfnBuffers<'_>,
    routing: FfnRouting<'_>,
) -> Result<FfnPlan> {
    plan_ffn_in(Scratch::Own(ctx), ffn, tokens, k, bufs, routing)
}

/// [`plan_ffn`] with its activations and x windows taken from `scratch`.
pub(crate) fn plan_ffn_in(
    scratch: Scratch<'_>,
    ffn: &ExpertFfn,
    tokens: u32,
    k: u32,
    bufs: &FfnBuffers<'_>,
    routing: FfnRouting<'_>,
) -> Result<FfnPlan> {
    let ctx = scratch.ctx();
    let (e, f, h) = (ffn.experts(), ffn.ffn(), ffn.hidden());
    let FfnBuffers { x, indices, partial } = *bufs;
    let entries = u64::from(tokens) * u64::from(k);
    ctx.check_view("x", &x, word_bytes(u64::from(tokens) * u64::from(h)), Access::Read)?;
    ctx.check_view("indices", &indices, word_bytes(entries), Access::Read)?;
    ctx.check_view("partial", &partial, word_bytes(entries * u64::from(h)), Access::ReadWrite)?;
    check_disjoint(&[
        ("x", x, Use::Read),
        ("indices", indices, Use::Read),
        ("partial", partial, Use::Write),
    ])?;
    for w in [&ffn.gate, &ffn.up, &ffn.down] {
        for c in &w.chunks {
            ctx.check_binding("expert weights", &c.buffer, c.bytes, Access::Read)?;
        }
    }
    if k == 0 {
        return Err(Error::invalid("k must be at least 1"));
    }
    if entries == 0 {
        return Ok(FfnPlan { dispatches: Vec::new() });
    }
    let entries32 = u32::try_from(entries)
        .map_err(|_| Error::limit("tokens * k", entries, u32::MAX.into(), "u32 entries"))?;
    let base = Params { k_route: k, fixed_expert: NONE, ..Params::default() };
    let kernels = ffn.kernels(ctx);
    let order = kernels.order;
    // The row-wise passes read x and the weights as the block kernels do.
    let source = kernels.up.source();
    let mut ds = Vec::new();
    match routing {
        FfnRouting::Grouped(layout) => {
            let cfg = layout.config();
            if cfg.experts != e || cfg.k != k || layout.tokens() != tokens {
                return Err(Error::invalid(format!(
                    "dispatch layout is for E={}, k={}, {} tokens; the FFN needs E={e}, k={k}, {tokens} tokens",
                    cfg.experts,
                    cfg.k,
                    layout.tokens()
                )));
            }
            let block = kernels.block_rows();
            if cfg.tile % block != 0 {
                return Err(Error::invalid(format!(
                    "the grouped GEMM ({} / {}) needs a dispatch tile that is a multiple of {block}, got {}",
                    kernels.up.name(),
                    kernels.down.name(),
                    cfg.tile
                )));
            }
            let rows = layout.max_rows();
            let act = scratch.take(activations(u64::from(rows), f)?)?;
            let p = Pass::grouped_gate_up(ffn, order, base, x, layout, act.view());
            ds.extend(p.gemm(scratch, kernels.up, Some(layout.tile_expert()))?);
            let down = Pass::down(&p, ffn, act.view(), partial);
            ds.extend(down.gemm(scratch, kernels.down, Some(layout.tile_expert()))?);
        }
        FfnRouting::Bucketed(buckets) => {
            let inner = buckets.layout();
            if inner.tokens() != entries32 || inner.config().experts != e {
                return Err(Error::invalid(format!(
                    "bucket layout is for {} entries over {} buckets; the FFN needs {entries32} entries over {e} experts",
                    inner.tokens(),
                    inner.config().experts
                )));
            }
            let bound = buckets.config().bound;
            let act = scratch.take(bucket_activations(e, bound, f)?)?;
            for expert in 0..e {
                let live =
                    LiveRows::new(LiveCount::constant(bound)).offset(LiveCount::constant(expert * bound));
                let mut p =
                    Pass::gate_up(ffn, order, base, x, RowMap::Listed(buckets.pad_perm()), act.view(), live);
                p.params.rows = bound;
                p.params.row_offset = expert * bound;
                p.params.fixed_expert = expert;
                ds.extend(p.gemm(scratch, kernels.up, None)?);
                ds.extend(Pass::down(&p, ffn, act.view(), partial).gemm(scratch, kernels.down, None)?);
            }
            let over_act = scratch.take(overflow_activations(entries, f)?)?;
            let live = LiveRows::new(LiveCount::tokens().times(k));
            let mut p =
                Pass::gate_up(ffn, order, base, x, RowMap::Listed(buckets.overflow()), over_act.view(), live);
            p.params.rows = entries32;
            p.params.count_word = META_OVERFLOW;
            ds.extend(p.rowwise(scratch, Some(indices), inner.meta(), source)?);
            let down = Pass::down(&p, ffn, over_act.view(), partial);
            ds.extend(down.rowwise(scratch, Some(indices), inner.meta(), source)?);
        }
        FfnRouting::Decode => {
            let act = scratch.take(activations(entries, f)?)?;
            let count = ctx.upload("decode rows", &[entries32])?;
            // Entries are their own rows: the rows binding is not read (and is not `count`,
            // which the kernel binds too: WebGPU refuses two writable bindings of one range).
            let unused = ctx.storage_scratch("identity rows", 4)?;
            let live = LiveRows::new(LiveCount::tokens().times(k));
            let rows = RowMap::Identity((&unused).into());
            let mut p = Pass::gate_up(ffn, order, base, x, rows, act.view(), live);
            p.params.rows = entries32;
            ds.extend(p.rowwise(scratch, Some(indices), (&count).into(), source)?);
            let down = Pass::down(&p, ffn, act.view(), partial);
            ds.extend(down.rowwise(scratch, Some(indices), (&count).into(), source)?);
        }
    }
    Ok(FfnPlan { dispatches: ds })
}

/// (d) Every token through every expert: `all[E, tokens, H]`, the FFN of expert e on token t
/// at `(e * tokens + t) * H`. A correctness oracle (E times the work), not a path to use.
///
/// # Errors
/// As [`plan_ffn`].
pub fn plan_ffn_all_experts<'b>(
    ctx: &Context,
    ffn: &ExpertFfn,
    tokens: u32,
    x: impl Into<BufferView<'b>>,
    all: impl Into<BufferView<'b>>,
) -> Result<FfnPlan> {
    let act = activations(u64::from(ffn.experts()) * u64::from(tokens), ffn.ffn())?;
    every_expert_on_every_token(Scratch::Own(ctx), act, ffn, tokens, x.into(), all.into())
}

/// (e) A dense FFN: the one expert of `ffn` on every token, `y[tokens, H]` from `x[tokens, H]`
/// (the layer's shared expert), through the block kernels of `ffn`: the bits of the same
/// expert on the routed paths.
///
/// # Errors
/// [`Error::InvalidArgument`] for an FFN of more than one expert; as [`plan_ffn`].
pub fn plan_dense_ffn<'b>(
    ctx: &Context,
    ffn: &ExpertFfn,
    tokens: u32,
    x: impl Into<BufferView<'b>>,
    y: impl Into<BufferView<'b>>,
) -> Result<FfnPlan> {
    plan_dense_ffn_in(Scratch::Own(ctx), ffn, tokens, x.into(), y.into())
}

/// [`plan_dense_ffn`] with its activations and x windows taken from `scratch`.
pub(crate) fn plan_dense_ffn_in(
    scratch: Scratch<'_>,
    ffn: &ExpertFfn,
    tokens: u32,
    x: BufferView<'_>,
    y: BufferView<'_>,
) -> Result<FfnPlan> {
    if ffn.experts() != 1 {
        return Err(Error::invalid(format!(
            "a dense FFN has one expert; this one has {} (plan_ffn routes tokens over experts)",
            ffn.experts()
        )));
    }
    every_expert_on_every_token(scratch, shared_activations(tokens, ffn.ffn())?, ffn, tokens, x, y)
}

/// `all[E, tokens, H]`: each expert's FFN on every token, expert by expert (see
/// [`plan_ffn_all_experts`] and [`plan_dense_ffn`]).
/// Its activations `[E * tokens, F]` are the region `act` of `scratch`.
fn every_expert_on_every_token(
    scratch: Scratch<'_>,
    act: RegionSize,
    ffn: &ExpertFfn,
    tokens: u32,
    x: BufferView<'_>,
    all: BufferView<'_>,
) -> Result<FfnPlan> {
    let ctx = scratch.ctx();
    let (e, h) = (ffn.experts(), ffn.hidden());
    let rows = u64::from(e) * u64::from(tokens);
    ctx.check_view("x", &x, word_bytes(u64::from(tokens) * u64::from(h)), Access::Read)?;
    ctx.check_view("all-expert output", &all, word_bytes(rows * u64::from(h)), Access::ReadWrite)?;
    check_disjoint(&[("x", x, Use::Read), ("all-expert output", all, Use::Write)])?;
    let act = scratch.take(act)?;
    let unused = ctx.storage_scratch("identity rows", 4)?;
    let kernels = ffn.kernels(ctx);
    let mut ds = Vec::new();
    for expert in 0..e {
        let params = Params {
            rows: tokens,
            k_route: 1,
            row_offset: expert * tokens,
            fixed_expert: expert,
            tile_rows: 1,
            count_word: 0,
            ..Params::default()
        };
        let live = LiveRows::new(LiveCount::tokens()).offset(LiveCount::tokens().times(expert));
        let rows = RowMap::Identity((&unused).into());
        let up = Pass::gate_up(ffn, kernels.order, params, x, rows, act.view(), live);
        ds.extend(up.gemm(scratch, kernels.up, None)?);
        let down = Pass::down_to_rows(&up, ffn, act.view(), all);
        ds.extend(down.gemm(scratch, kernels.down, None)?);
    }
    Ok(FfnPlan { dispatches: ds })
}

/// Which kernel runs a dense GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DenseKernel {
    /// A block GEMM variant (the grouped GEMM's kernels, one expert, no gather).
    Block(GemmVariant),
    /// One output per invocation straight from memory (no workgroup memory, no barriers).
    Rowwise,
}

/// (c) Dense GEMM `y[rows, N] = x[rows, K] . w[0]^T` in `order`: the throughput yardstick for
/// the grouped GEMM (same kernels, one expert, no gather). Every kernel gives bit-identical
/// results in one order.
///
/// # Errors
/// [`Error::Shape`] for a buffer smaller than its shape; [`GemmVariant::validate`]'s
/// errors; [`Error::LimitExceeded`] past the adapter's limits.
pub fn plan_dense<'b>(
    ctx: &Context,
    w: &ExpertWeights,
    rows: u32,
    x: impl Into<BufferView<'b>>,
    y: impl Into<BufferView<'b>>,
    kernel: DenseKernel,
    order: GemmOrder,
) -> Result<FfnPlan> {
    plan_dense_in(Scratch::Own(ctx), w, rows, x.into(), y.into(), kernel, order)
}

/// [`plan_dense`] with its x windows taken from `scratch`.
pub(crate) fn plan_dense_in(
    scratch: Scratch<'_>,
    w: &ExpertWeights,
    rows: u32,
    x: BufferView<'_>,
    y: BufferView<'_>,
    kernel: DenseKernel,
    order: GemmOrder,
) -> Result<FfnPlan> {
    let ctx = scratch.ctx();
    let [_, n, k] = w.shape();
    ctx.check_view("x", &x, word_bytes(u64::from(rows) * u64::from(k)), Access::Read)?;
    ctx.check_view("y", &y, word_bytes(u64::from(rows) * u64::from(n)), Access::ReadWrite)?;
    check_disjoint(&[("x", x, Use::Read), ("y", y, Use::Write)])?;
    let unused = ctx.storage_scratch("identity rows", 4)?;
    let params = Params {
        rows,
        n,
        kdim: k,
        k_route: 1,
        row_offset: 0,
        fixed_expert: 0,
        tile_rows: 1,
        ..Params::default()
    };
    let pass = Pass::dense(order, w, x, y, params, (&unused).into());
    let dispatches = match kernel {
        DenseKernel::Block(variant) => {
            variant.validate()?;
            pass.gemm(scratch, variant, None)?
        }
        DenseKernel::Rowwise => {
            let count = ctx.upload("dense rows", &[rows])?;
            pass.rowwise(scratch, None, (&count).into(), OperandSource::Storage)?
        }
    };
    Ok(FfnPlan { dispatches })
}

/// The routed experts' activations `[rows, ffn]` (f32): the grouped rows, the decode entries,
/// or every expert's rows of every token. The planners and the layer's workspace layout size
/// the region here, and only here (as the activation regions below).
///
/// # Errors
/// [`Error::LimitExceeded`] where the bytes overflow 64 bits.
pub(crate) fn activations(rows: u64, ffn: u32) -> Result<RegionSize> {
    RegionSize::words(ScratchKey::ACTIVATIONS, &[rows, u64::from(ffn)])
}

/// A bucket layout's activations: `bound` rows per bucket `[experts, bound, ffn]` (f32).
///
/// # Errors
/// As [`activations`].
pub(crate) fn bucket_activations(experts: u32, bound: u32, ffn: u32) -> Result<RegionSize> {
    RegionSize::words(ScratchKey::ACTIVATIONS, &[u64::from(experts), u64::from(bound), u64::from(ffn)])
}

/// The activations of a bucket layout's overflow entries `[entries, ffn]` (f32).
///
/// # Errors
/// As [`activations`].
pub(crate) fn overflow_activations(entries: u64, ffn: u32) -> Result<RegionSize> {
    RegionSize::words(ScratchKey::OVERFLOW_ACTIVATIONS, &[entries, u64::from(ffn)])
}

/// The shared expert's activations `[tokens, shared ffn]` (f32).
///
/// # Errors
/// As [`activations`].
pub(crate) fn shared_activations(tokens: u32, ffn: u32) -> Result<RegionSize> {
    RegionSize::words(ScratchKey::SHARED_ACTIVATIONS, &[u64::from(tokens), u64::from(ffn)])
}

#[cfg(test)]
mod tests {
    use super::super::specs::{self, WeightLoads, contract_variants};
    use super::*;

    /// The workgroup memory the planner checks against the device's limit
    /// (`GemmVariant::workgroup_bytes`) is what the generated WGSL declares.
    #[test]
    fn workgroup_bytes_match_the_generated_wgsl() {
        for v in contract_variants() {
            for order in [GemmOrder::Strict, GemmOrder::Fast] {
                let reflected = specs::spec(v, order, WeightLoads::Packed).reflect().unwrap();
                assert_eq!(reflected.workgroup_bytes, v.workgroup_bytes(), "{} {order:?}", v.name());
                assert_eq!(reflected.invocations, v.invocations(), "{} {order:?}", v.name());
            }
        }
    }
}
