//! Expert projections: SwiGLU expert FFNs over dispatched rows in one grouped GEMM per
//! projection, plus the comparison paths (bucketed with overflow, dense, all experts) and the
//! row-wise decode path. Weights (`weights.rs`: float or quantised, packed in u32 words and
//! unpacked in the shader, `quantised.rs`; texture copies, `texture.rs`) are read by the block
//! kernels `variant.rs` generates or by the row-wise kernels; `tune.rs` times the candidates.
//! Accumulation is f32 in one fixed K order (see `wgsl/gemm/common.wgsl`), so a token's
//! outputs are bitwise the same whatever the batch, tile or path. A plan is made of passes
//! (`passes.rs`: one projection over a set of rows, per weight chunk and x window); this file
//! holds the kernel specs and the planners.
//!
//! Shapes: `x[tokens, H]`; `gate`, `up` `[E, F, H]`; `down` `[E, H, F]`;
//! `indices[tokens, k]`; output `partial[tokens * k, H]` indexed by entry `token * k + slot`.

use bytemuck::{Pod, Zeroable};
use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{BucketLayout, DispatchLayout, META_OVERFLOW};
use crate::live::LiveCount;
use crate::pipeline::{Access, BufferView, Dispatch, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};
use crate::tensor::word_bytes;
use crate::workspace::{Scratch, ScratchKey};

mod passes;
mod quantised;
mod slots;
mod texture;
mod tune;
mod variant;
mod weights;

pub use quantised::QuantisedValues;

#[cfg(test)]
pub(crate) use passes::ROWWISE_SUBGROUP_ROW_ALIGN;
pub(crate) use passes::window_bytes_bound;
use passes::{LiveRows, Pass, RowMap};
pub(crate) use tune::tune_with;
pub use tune::{TUNE_DEFAULT_MARGIN, TuneOptions, Tuned, default_cache_path, tune, tune_async};
pub use variant::{AdapterKind, FfnKernels, GemmOrder, GemmVariant, LaneBlock, TileBlock, candidates};
pub(crate) use variant::{OperandSource, WINDOW_BYTES, WeightLoads};
#[cfg(feature = "checkpoint")]
pub(crate) use weights::STREAM_CHUNK;
pub use weights::{Activation, ExpertBias, ExpertFfn, ExpertWeights, StoredValues, WeightDtype};

/// Token counts past this never use the row-wise decode path when the path is chosen
/// automatically (see [`uses_decode_path`]).
pub const DECODE_MAX_TOKENS: u32 = 8;

/// The row-wise kernel's module: x from storage or from uniform windows, each invocation
/// loading its own (`gemm/rowwise_entry.wgsl`) or a subgroup sharing its loads of a window
/// (`gemm/rowwise_x_subgroup.wgsl`); packed float, native f16 or quantised weights from their
/// buffers, or their texture copies.
macro_rules! rowwise_shader {
    // How x is read (RowX): from storage, from a window, from a window shared by a subgroup.
    ($name:literal, storage, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x.wgsl", "gemm/rowwise_entry.wgsl", $weights)
    };
    ($name:literal, window, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x_window.wgsl", "gemm/rowwise_entry.wgsl", $weights)
    };
    ($name:literal, subgroup, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x_window.wgsl", "gemm/rowwise_x_subgroup.wgsl", $weights)
    };
    ($name:literal, $x:literal, $entry:literal, $($weights:literal),+) => {
        ShaderSource {
            name: concat!("gemm/", $name),
            parts: &[$(wgsl!($weights),)+ wgsl!($x), wgsl!("gemm/rowwise.wgsl"), wgsl!($entry)],
            entry_points: &["rowwise"],
            // Rows below the live count and the dispatch's window rows, columns clamped to the
            // chunk's, entries as the caller's or the layout's row map holds them (below the
            // bound views' rows), the expert read back only through in_chunk, K below kdim in
            // every loop, x windows within the WINDOW_BYTES the host sized them to.
            indexing: Indexing::Proven,
        }
    };
    ($name:literal, $x:literal, $entry:literal, packed) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_packed.wgsl",
            "gemm/weight_groups.wgsl",
            "gemm/half.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, quant) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_quant.wgsl",
            "gemm/half.wgsl",
            "gemm/quant.wgsl",
            "gemm/quant_blocks.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots_quant.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, f16) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/enable_f16.wgsl",
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_f16.wgsl",
            "gemm/weight_groups.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, texture) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/half.wgsl",
            "gemm/weights_texture.wgsl",
            "gemm/rowwise_w_texture.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
}
static ROWWISE_SHADER: ShaderSource = rowwise_shader!("rowwise", storage, packed);
static ROWWISE_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_f16", storage, f16);
static ROWWISE_QUANT_SHADER: ShaderSource = rowwise_shader!("rowwise_quant", storage, quant);
static ROWWISE_TEXTURE_SHADER: ShaderSource = rowwise_shader!("rowwise_texture", storage, texture);
static ROWWISE_WINDOW_SHADER: ShaderSource = rowwise_shader!("rowwise_window", window, packed);
static ROWWISE_WINDOW_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_window_f16", window, f16);
static ROWWISE_WINDOW_QUANT_SHADER: ShaderSource = rowwise_shader!("rowwise_window_quant", window, quant);
static ROWWISE_WINDOW_TEXTURE_SHADER: ShaderSource =
    rowwise_shader!("rowwise_window_texture", window, texture);
static ROWWISE_SUBGROUP_SHADER: ShaderSource = rowwise_shader!("rowwise_subgroup", subgroup, packed);
static ROWWISE_SUBGROUP_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_subgroup_f16", subgroup, f16);
static ROWWISE_SUBGROUP_QUANT_SHADER: ShaderSource =
    rowwise_shader!("rowwise_subgroup_quant", subgroup, quant);
static ROWWISE_SUBGROUP_TEXTURE_SHADER: ShaderSource =
    rowwise_shader!("rowwise_subgroup_texture", subgroup, texture);

/// The gemm family's shader modules (the `_f16` ones need the shader-f16 feature): the
/// row-wise kernel and the generated block kernels of every [`contract_variants`] variant in
/// both orders (the contract test checks them; the tuner's cache keys hash them).
pub(crate) fn shaders() -> Vec<&'static ShaderSource> {
    let mut all = vec![
        &ROWWISE_SHADER,
        &ROWWISE_F16_SHADER,
        &ROWWISE_QUANT_SHADER,
        &ROWWISE_WINDOW_SHADER,
        &ROWWISE_WINDOW_F16_SHADER,
        &ROWWISE_WINDOW_QUANT_SHADER,
        &ROWWISE_TEXTURE_SHADER,
        &ROWWISE_WINDOW_TEXTURE_SHADER,
        &ROWWISE_SUBGROUP_SHADER,
        &ROWWISE_SUBGROUP_F16_SHADER,
        &ROWWISE_SUBGROUP_QUANT_SHADER,
        &ROWWISE_SUBGROUP_TEXTURE_SHADER,
        &STAGE_SHADER,
        &UNPACK_SHADER,
        &UNPACK_QUANT_SHADER,
        &texture::PACK_SHADER,
    ];
    for v in contract_variants() {
        for order in [GemmOrder::Strict, GemmOrder::Fast] {
            for loads in WeightLoads::ALL {
                all.push(variant::spec(v, order, loads).shader);
            }
        }
    }
    all
}

/// The kernels an FFN with `variants` as its block kernels can run, in `order`, reading the
/// weights with `loads`: the blocks, their window and direct fallbacks, the staging, packing
/// and row-wise kernels (for the requirements of a configuration).
pub(crate) fn specs_for(
    variants: &[GemmVariant],
    order: GemmOrder,
    loads: WeightLoads,
) -> Vec<&'static KernelSpec> {
    let mut all: Vec<&'static KernelSpec> = vec![
        &STAGE,
        &texture::PACK,
        &ROWWISE,
        &ROWWISE_F16,
        &ROWWISE_QUANT,
        &ROWWISE_TEXTURE,
        &ROWWISE_WINDOW,
        &ROWWISE_WINDOW_F16,
        &ROWWISE_WINDOW_QUANT,
        &ROWWISE_WINDOW_TEXTURE,
        &ROWWISE_SUBGROUP,
        &ROWWISE_SUBGROUP_F16,
        &ROWWISE_SUBGROUP_QUANT,
        &ROWWISE_SUBGROUP_TEXTURE,
    ];
    for &v in variants {
        for v in [v, v.without_texture(), v.without_window()] {
            all.push(variant::spec(v, order, loads));
        }
    }
    all
}

/// Every candidate variant of every kind of adapter, and f16-staged tiles (which are never
/// candidates), once each: the variants the contract tests build.
fn contract_variants() -> Vec<GemmVariant> {
    let mut variants: Vec<GemmVariant> = AdapterKind::ALL.into_iter().flat_map(candidates).collect();
    variants.push(GemmVariant::TileF16(TileBlock::new(64, 64, 4, 4, 4)));
    variants.push(GemmVariant::TileF16(TileBlock::new(128, 128, 8, 8, 2)));
    variants.sort_by_key(|v| v.name());
    variants.dedup();
    variants
}

/// Every gemm kernel (for the contract test, `src/contract.rs`): the unpack kernel and
/// [`specs_for`] every [`contract_variants`] variant in both orders, with every way of loading
/// weights.
#[cfg(test)]
pub(crate) fn specs() -> Vec<&'static KernelSpec> {
    let variants = contract_variants();
    let mut all: Vec<&'static KernelSpec> = vec![&UNPACK, &UNPACK_QUANT];
    for order in [GemmOrder::Strict, GemmOrder::Fast] {
        for loads in WeightLoads::ALL {
            for spec in specs_for(&variants, order, loads) {
                if !all.iter().any(|s| std::ptr::eq(*s, spec)) {
                    all.push(spec);
                }
            }
        }
    }
    all
}

static STAGE_SHADER: ShaderSource = ShaderSource {
    name: "gemm/stage",
    parts: &[wgsl!("gemm/common.wgsl"), wgsl!("gemm/stage.wgsl")],
    entry_points: &["stage"],
    indexing: Indexing::Checked,
};

/// The weights' values as the kernels load them (`ExpertWeights::unpack`): f32, f16 and bf16
/// through the packed loads.
static UNPACK_SHADER: ShaderSource = ShaderSource {
    name: "gemm/unpack",
    parts: &[
        wgsl!("gemm/common.wgsl"),
        wgsl!("gemm/weights_packed.wgsl"),
        wgsl!("gemm/weight_groups.wgsl"),
        wgsl!("gemm/half.wgsl"),
        wgsl!("gemm/unpack.wgsl"),
    ],
    entry_points: &["unpack"],
    indexing: Indexing::Checked,
};

/// [`UNPACK_SHADER`] for the quantised formats, through the quantised loads.
static UNPACK_QUANT_SHADER: ShaderSource = ShaderSource {
    name: "gemm/unpack-quant",
    parts: &[
        wgsl!("gemm/common.wgsl"),
        wgsl!("gemm/weights_quant.wgsl"),
        wgsl!("gemm/half.wgsl"),
        wgsl!("gemm/quant.wgsl"),
        wgsl!("gemm/unpack.wgsl"),
    ],
    entry_points: &["unpack"],
    indexing: Indexing::Checked,
};

use Access::{Read, ReadWrite, Uniform};
/// Bytes of `GemmParams` (wgsl/gemm/common.wgsl).
pub(crate) const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;
static STAGE: KernelSpec = KernelSpec {
    shader: &STAGE_SHADER,
    entry: "stage",
    bindings: &[
        (slots::PARAMS, Uniform),
        (slots::X, ReadWrite),
        (slots::ROW_ENTRY, ReadWrite),
        (slots::WINDOW, ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};
static UNPACK: KernelSpec = unpack(&UNPACK_SHADER);
static UNPACK_QUANT: KernelSpec = unpack(&UNPACK_QUANT_SHADER);
/// An unpacking kernel: one invocation per group of four values.
const fn unpack(shader: &'static ShaderSource) -> KernelSpec {
    KernelSpec {
        shader,
        entry: "unpack",
        bindings: &[(slots::PARAMS, Uniform), (slots::W, Read), (slots::W_UP, Read), (slots::OUT, ReadWrite)],
        params_bytes: PARAMS_BYTES,
        workgroup: Workgroup::Fixed(64),
    }
}
/// The row-wise kernels' bindings, by where they read x and the weights.
static ROWWISE_BINDINGS: [(u32, Access); 9] = slots::rowwise_bindings(false, false);
static ROWWISE_TEXTURE_BINDINGS: [(u32, Access); 9] = slots::rowwise_bindings(false, true);
static ROWWISE_WINDOW_BINDINGS: [(u32, Access); 9] = slots::rowwise_bindings(true, false);
static ROWWISE_WINDOW_TEXTURE_BINDINGS: [(u32, Access); 9] = slots::rowwise_bindings(true, true);
/// A row-wise kernel: 64 invocations per workgroup, one per (row, column) output.
const fn rowwise(shader: &'static ShaderSource, bindings: &'static [(u32, Access)]) -> KernelSpec {
    KernelSpec {
        shader,
        entry: "rowwise",
        bindings,
        params_bytes: PARAMS_BYTES,
        workgroup: Workgroup::Fixed(64),
    }
}
static ROWWISE: KernelSpec = rowwise(&ROWWISE_SHADER, &ROWWISE_BINDINGS);
static ROWWISE_F16: KernelSpec = rowwise(&ROWWISE_F16_SHADER, &ROWWISE_BINDINGS);
static ROWWISE_QUANT: KernelSpec = rowwise(&ROWWISE_QUANT_SHADER, &ROWWISE_BINDINGS);
static ROWWISE_TEXTURE: KernelSpec = rowwise(&ROWWISE_TEXTURE_SHADER, &ROWWISE_TEXTURE_BINDINGS);
static ROWWISE_WINDOW: KernelSpec = rowwise(&ROWWISE_WINDOW_SHADER, &ROWWISE_WINDOW_BINDINGS);
static ROWWISE_WINDOW_F16: KernelSpec = rowwise(&ROWWISE_WINDOW_F16_SHADER, &ROWWISE_WINDOW_BINDINGS);
static ROWWISE_WINDOW_QUANT: KernelSpec = rowwise(&ROWWISE_WINDOW_QUANT_SHADER, &ROWWISE_WINDOW_BINDINGS);
static ROWWISE_WINDOW_TEXTURE: KernelSpec =
    rowwise(&ROWWISE_WINDOW_TEXTURE_SHADER, &ROWWISE_WINDOW_TEXTURE_BINDINGS);
static ROWWISE_SUBGROUP: KernelSpec = rowwise(&ROWWISE_SUBGROUP_SHADER, &ROWWISE_WINDOW_BINDINGS);
static ROWWISE_SUBGROUP_F16: KernelSpec = rowwise(&ROWWISE_SUBGROUP_F16_SHADER, &ROWWISE_WINDOW_BINDINGS);
static ROWWISE_SUBGROUP_QUANT: KernelSpec = rowwise(&ROWWISE_SUBGROUP_QUANT_SHADER, &ROWWISE_WINDOW_BINDINGS);
static ROWWISE_SUBGROUP_TEXTURE: KernelSpec =
    rowwise(&ROWWISE_SUBGROUP_TEXTURE_SHADER, &ROWWISE_WINDOW_TEXTURE_BINDINGS);

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

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct Params {
    rows: u32,
    n: u32,
    kdim: u32,
    k_route: u32,
    row_offset: u32,
    fixed_expert: u32,
    tile_rows: u32,
    count_word: u32,
    flags: u32,
    expert_base: u32,
    expert_count: u32,
    col_base: u32,
    cols: u32,
    win_rows: u32,
    win_stride4: u32,
    win_row0: u32,
}

/// Marks padding rows (`NONE` in wgsl/gemm/common.wgsl).
pub(crate) const NONE: u32 = u32::MAX;
// FLAG_* bits of `Params::flags`, as in wgsl/gemm/common.wgsl.
pub(crate) const FLAG_GATHER: u32 = 1;
pub(crate) const FLAG_OUT_ENTRY: u32 = 2;
pub(crate) const FLAG_IDENTITY_ROWS: u32 = 4;
pub(crate) const FLAG_EXPERT_FROM_TILES: u32 = 8;
pub(crate) const FLAG_EXPERT_FROM_INDICES: u32 = 16;

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
pub fn decode_tokens(k: u32, experts: u32) -> u32 {
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
    plan_ffn_with(Scratch::Own(ctx), ffn, tokens, k, bufs, routing)
}

/// [`plan_ffn`] with its activations and x windows taken from `scratch`.
pub(crate) fn plan_ffn_with(
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
            let act = scratch.take(ScratchKey::Activations, word_bytes(u64::from(rows) * u64::from(f)))?;
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
            let act = scratch
                .take(ScratchKey::Activations, word_bytes(u64::from(e) * u64::from(bound) * u64::from(f)))?;
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
            let over_act =
                scratch.take(ScratchKey::OverflowActivations, word_bytes(entries * u64::from(f)))?;
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
            let act = scratch.take(ScratchKey::Activations, word_bytes(entries * u64::from(f)))?;
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
    every_expert_on_every_token(Scratch::Own(ctx), ScratchKey::Activations, ffn, tokens, x.into(), all.into())
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
    plan_dense_ffn_with(Scratch::Own(ctx), ffn, tokens, x.into(), y.into())
}

/// [`plan_dense_ffn`] with its activations and x windows taken from `scratch`.
pub(crate) fn plan_dense_ffn_with(
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
    every_expert_on_every_token(scratch, ScratchKey::SharedActivations, ffn, tokens, x, y)
}

/// `all[E, tokens, H]`: each expert's FFN on every token, expert by expert (see
/// [`plan_ffn_all_experts`] and [`plan_dense_ffn`]).
/// Its activations `[E * tokens, F]` are the region `act_key` of `scratch`.
fn every_expert_on_every_token(
    scratch: Scratch<'_>,
    act_key: ScratchKey,
    ffn: &ExpertFfn,
    tokens: u32,
    x: BufferView<'_>,
    all: BufferView<'_>,
) -> Result<FfnPlan> {
    let ctx = scratch.ctx();
    let (e, f, h) = (ffn.experts(), ffn.ffn(), ffn.hidden());
    let rows = u64::from(e) * u64::from(tokens);
    ctx.check_view("x", &x, word_bytes(u64::from(tokens) * u64::from(h)), Access::Read)?;
    ctx.check_view("all-expert output", &all, word_bytes(rows * u64::from(h)), Access::ReadWrite)?;
    let act = scratch.take(act_key, word_bytes(rows * u64::from(f)))?;
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
    plan_dense_with(Scratch::Own(ctx), w, rows, x.into(), y.into(), kernel, order)
}

/// [`plan_dense`] with its x windows taken from `scratch`.
pub(crate) fn plan_dense_with(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The workgroup memory the planner checks against the device's limit
    /// (`GemmVariant::workgroup_bytes`) is what the generated WGSL declares.
    #[test]
    fn workgroup_bytes_match_the_generated_wgsl() {
        for v in contract_variants() {
            for order in [GemmOrder::Strict, GemmOrder::Fast] {
                let reflected = variant::spec(v, order, WeightLoads::Packed).reflect().unwrap();
                assert_eq!(reflected.workgroup_bytes, v.workgroup_bytes(), "{} {order:?}", v.name());
                assert_eq!(reflected.invocations, v.invocations(), "{} {order:?}", v.name());
            }
        }
    }
}
