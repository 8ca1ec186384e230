//! Token dispatch on the device: from `indices[tokens, k]` to a stable, tile-padded grouping
//! of rows by expert (counts, offsets, permutation and inverse, tile -> expert map), and
//! bucket routing with a capacity bound and an overflow list. No readback, no atomic
//! placement cursors, no look-back scans: see `docs/dispatch.md`.

use std::mem::offset_of;

use bytemuck::{Pod, Zeroable};
use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::live::{LiveCount, LiveGrid, Sizing};
use crate::pipeline::{Access, Binding, BufferView, Dispatch, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};
use crate::size;
use crate::workspace::{DispatchPart, Region, RegionSize, Scratch, ScratchKey};
use host::{Layout, Meta};

pub mod host;
mod meta;

pub use meta::{
    META_INVALID, META_MAX_COUNT, META_NONEMPTY, META_OVERFLOW, META_PADDED_ROWS, META_ROWS, META_TILES,
    META_WORDS,
};

/// Entries per placement block (and workgroup size of the block kernels).
pub const DISPATCH_WG: u32 = 256;
/// Largest supported expert (or bucket) count.
pub const MAX_EXPERTS: u32 = 65536;
/// Largest supported tile (tiles are powers of two).
pub const MAX_TILE: u32 = 256;
static LAYOUT_SHADER: ShaderSource = ShaderSource {
    name: "dispatch/layout",
    parts: &[wgsl!("dispatch/params.wgsl"), wgsl!("dispatch/layout.wgsl")],
    entry_points: &["block_hist", "expert_base", "scan", "scatter"],
    indexing: Indexing::Checked,
};
static BUCKET_SHADER: ShaderSource = ShaderSource {
    name: "dispatch/bucket",
    parts: &[wgsl!("dispatch/params.wgsl"), wgsl!("dispatch/bucket.wgsl")],
    entry_points: &["bucket_slots", "bucket_overflow"],
    indexing: Indexing::Checked,
};

/// The dispatch family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&LAYOUT_SHADER, &BUCKET_SHADER];

use Access::{ReadWrite, Uniform};
/// Bytes of `DispatchParams` (wgsl/dispatch/params.wgsl).
const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;
static BLOCK_HIST: KernelSpec = KernelSpec {
    shader: &LAYOUT_SHADER,
    entry: "block_hist",
    bindings: &[(0, Uniform), (1, ReadWrite), (2, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(DISPATCH_WG),
};
static EXPERT_BASE: KernelSpec = KernelSpec {
    shader: &LAYOUT_SHADER,
    entry: "expert_base",
    bindings: &[(0, Uniform), (2, ReadWrite), (3, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};
static SCAN: KernelSpec = KernelSpec {
    shader: &LAYOUT_SHADER,
    entry: "scan",
    bindings: &[
        (0, Uniform),
        (3, ReadWrite),
        (4, ReadWrite),
        (5, ReadWrite),
        (6, ReadWrite),
        (8, ReadWrite),
        (9, ReadWrite),
        (10, ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(DISPATCH_WG),
};
static SCATTER: KernelSpec = KernelSpec {
    shader: &LAYOUT_SHADER,
    entry: "scatter",
    bindings: &[(0, Uniform), (1, ReadWrite), (2, ReadWrite), (5, ReadWrite), (6, ReadWrite), (7, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(DISPATCH_WG),
};
static BUCKET_SLOTS: KernelSpec = KernelSpec {
    shader: &BUCKET_SHADER,
    entry: "bucket_slots",
    bindings: &[(0, Uniform), (3, ReadWrite), (4, ReadWrite), (6, ReadWrite), (11, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};
static BUCKET_OVERFLOW: KernelSpec = KernelSpec {
    shader: &BUCKET_SHADER,
    entry: "bucket_overflow",
    bindings: &[
        (0, Uniform),
        (1, ReadWrite),
        (4, ReadWrite),
        (7, ReadWrite),
        (10, ReadWrite),
        (12, ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};

/// Every dispatch kernel (for the requirements and the contract test).
pub(crate) static SPECS: &[&KernelSpec] =
    &[&BLOCK_HIST, &EXPERT_BASE, &SCAN, &SCATTER, &BUCKET_SLOTS, &BUCKET_OVERFLOW];

/// What to group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DispatchConfig {
    /// Number of experts `E`, `1..=MAX_EXPERTS`.
    pub experts: u32,
    /// Experts per token.
    pub k: u32,
    /// Row tile of the grouped GEMM: a power of two in `1..=MAX_TILE`. Each expert's rows are
    /// padded to a multiple of it so no tile straddles two experts.
    pub tile: u32,
}

impl DispatchConfig {
    /// Checks the ranges.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero experts, zero k, k above the experts or a tile
    /// that is not a power of two in range; [`Error::LimitExceeded`] for too many experts.
    pub fn validate(&self) -> Result<()> {
        if self.experts == 0 {
            return Err(Error::invalid("experts must be at least 1"));
        }
        if self.experts > MAX_EXPERTS {
            return Err(Error::limit("experts", self.experts.into(), MAX_EXPERTS.into(), "dispatch kernels"));
        }
        if self.k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        if !self.tile.is_power_of_two() || self.tile > MAX_TILE {
            return Err(Error::invalid(format!(
                "tile = {} is not supported: use a power of two from 1 to {MAX_TILE}",
                self.tile
            )));
        }
        Ok(())
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct Params {
    entries: u32,
    k: u32,
    experts: u32,
    tile: u32,
    blocks: u32,
    bound: u32,
    max_tiles: u32,
    pad0: u32,
}

/// Expert load, from a layout's counts and meta words.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct LoadStats {
    /// Entries per expert.
    pub per_expert: Vec<u32>,
    /// Entries placed.
    pub rows: u32,
    /// Largest count.
    pub max: u32,
    /// Mean count over all experts.
    pub mean: f64,
    /// `max / mean` (1.0 is perfectly balanced; 0 when nothing was routed).
    pub imbalance: f64,
    /// Experts with at least one entry.
    pub nonempty: u32,
    /// Entries past a bucket bound: sent to the overflow list, or dropped under
    /// [`OverflowPolicy::Drop`].
    pub over_bound: u32,
    /// Entries whose expert index was out of range.
    pub invalid: u32,
}

impl LoadStats {
    /// Statistics from per-expert counts and a layout's meta words.
    pub(crate) fn new(per_expert: Vec<u32>, meta: Meta) -> Self {
        let mean = f64::from(meta.rows) / per_expert.len().max(1) as f64;
        LoadStats {
            rows: meta.rows,
            max: meta.max_count,
            mean,
            imbalance: if meta.rows == 0 { 0.0 } else { f64::from(meta.max_count) / mean },
            nonempty: meta.nonempty,
            over_bound: meta.overflow,
            invalid: meta.invalid,
            per_expert,
        }
    }
}

/// Device buffers of one grouped layout for `tokens` tokens, and the dispatches that fill
/// them from an indices buffer. Built once per shape; every forward re-records the same plan,
/// and every consumer (expert projections, combine) reads the same buffers.
#[derive(Debug)]
pub struct DispatchLayout {
    cfg: DispatchConfig,
    tokens: u32,
    entries: u32,
    blocks: u32,
    max_rows: u32,
    max_tiles: u32,
    params: wgpu::Buffer,
    hist: Region,
    counts: Region,
    offsets: Region,
    padded: Region,
    perm: Region,
    inverse: Region,
    tile_expert: Region,
    meta: Region,
    overflow_offsets: Region,
}

const U32: u64 = 4;

/// The sizes of a layout for a token count.
struct Shape {
    entries: u32,
    blocks: u32,
    max_rows: u32,
    max_tiles: u32,
}

impl Shape {
    /// Of a layout of `cfg` for `tokens` tokens.
    fn of(cfg: DispatchConfig, tokens: u32) -> Result<Self> {
        cfg.validate()?;
        let entries = u64::from(tokens) * u64::from(cfg.k);
        let max_rows = entries + u64::from(cfg.experts) * u64::from(cfg.tile - 1);
        if max_rows > u64::from(u32::MAX) {
            return Err(Error::limit(
                "tokens * k + experts * (tile - 1)",
                max_rows,
                u32::MAX.into(),
                "u32 row indices",
            ));
        }
        // entries <= max_rows, so both fit u32.
        let (entries, max_rows) = (entries as u32, max_rows as u32);
        Ok(Shape {
            entries,
            blocks: entries.div_ceil(DISPATCH_WG),
            max_rows,
            max_tiles: max_rows.div_ceil(cfg.tile),
        })
    }
}

impl DispatchLayout {
    /// Allocates a layout for `tokens` tokens; `bound` (0: none) sets the capacity used for
    /// overflow accounting.
    ///
    /// # Errors
    /// [`DispatchConfig::validate`]'s errors on `cfg`; [`Error::LimitExceeded`] for buffers past
    /// the adapter's binding or buffer limits or u32 indices.
    pub fn new(ctx: &Context, cfg: DispatchConfig, tokens: u32, bound: u32) -> Result<Self> {
        Self::with_scratch(Scratch::Own(ctx), cfg, tokens, bound)
    }

    /// The bytes of each of the buffers of a layout for `tokens` tokens (the regions
    /// [`Self::new`] takes).
    ///
    /// # Errors
    /// [`DispatchConfig::validate`]'s errors; [`Error::LimitExceeded`] for rows past u32.
    pub(crate) fn scratch_bytes(cfg: DispatchConfig, tokens: u32) -> Result<[(ScratchKey, u64); 9]> {
        let s = Shape::of(cfg, tokens)?;
        let (e, e1) = (u64::from(cfg.experts) * U32, (u64::from(cfg.experts) + 1) * U32);
        let part = ScratchKey::Dispatch;
        Ok([
            (
                part(DispatchPart::Hist),
                size::product(
                    "the dispatch histogram",
                    &[u64::from(s.blocks.max(1)), u64::from(cfg.experts), U32],
                )?,
            ),
            (part(DispatchPart::Counts), e),
            (part(DispatchPart::Offsets), e1),
            (part(DispatchPart::Padded), e1),
            (part(DispatchPart::Perm), u64::from(s.max_rows) * U32),
            (part(DispatchPart::Inverse), u64::from(s.entries) * U32),
            (part(DispatchPart::TileExpert), u64::from(s.max_tiles) * U32),
            (part(DispatchPart::Meta), u64::from(META_WORDS) * U32),
            (part(DispatchPart::OverflowOffsets), e1),
        ])
    }

    /// The bound on padded rows ([`Self::max_rows`]) of a layout for `tokens` tokens.
    ///
    /// # Errors
    /// As [`Self::scratch_bytes`].
    pub(crate) fn max_rows_for(cfg: DispatchConfig, tokens: u32) -> Result<u32> {
        Ok(Shape::of(cfg, tokens)?.max_rows)
    }

    /// [`Self::new`] with its buffers taken from `scratch`.
    pub(crate) fn with_scratch(
        scratch: Scratch<'_>,
        cfg: DispatchConfig,
        tokens: u32,
        bound: u32,
    ) -> Result<Self> {
        let ctx = scratch.ctx();
        let Shape { entries, blocks, max_rows, max_tiles } = Shape::of(cfg, tokens)?;
        let bytes = Self::scratch_bytes(cfg, tokens)?;
        let limit = ctx.limits().max_storage_buffer_binding_size;
        for (key, bytes) in bytes {
            if bytes > limit {
                return Err(Error::limit(key.label(), bytes, limit, "max_storage_buffer_binding_size"));
            }
        }
        let [hist, counts, offsets, padded, perm, inverse, tile_expert, meta, overflow_offsets] =
            bytes.map(|(key, bytes)| scratch.take(RegionSize { key, bytes }));
        let params = ctx.uniform(
            "dispatch params",
            &Params {
                entries,
                k: cfg.k,
                experts: cfg.experts,
                tile: cfg.tile,
                blocks,
                bound,
                max_tiles,
                pad0: 0,
            },
        )?;
        Ok(DispatchLayout {
            cfg,
            tokens,
            entries,
            blocks,
            max_rows,
            max_tiles,
            params,
            hist: hist?,
            counts: counts?,
            offsets: offsets?,
            padded: padded?,
            perm: perm?,
            inverse: inverse?,
            tile_expert: tile_expert?,
            meta: meta?,
            overflow_offsets: overflow_offsets?,
        })
    }

    /// The layout's buffer at `binding` of the layout and bucket kernels (see
    /// wgsl/dispatch/layout.wgsl).
    fn bind<'a>(&'a self, binding: u32, indices: BufferView<'a>) -> Result<Binding<'a>> {
        let e1 = u64::from(self.cfg.experts) + 1;
        let (region, elems) = match binding {
            0 => return Ok(Binding::new(binding, &self.params, PARAMS_BYTES)),
            1 => return Ok(indices.bind(binding, u64::from(self.entries) * U32)),
            2 => (&self.hist, u64::from(self.blocks.max(1)) * u64::from(self.cfg.experts)),
            3 => (&self.counts, e1 - 1),
            4 => (&self.offsets, e1),
            5 => (&self.padded, e1),
            6 => (&self.perm, u64::from(self.max_rows)),
            7 => (&self.inverse, u64::from(self.entries)),
            8 => (&self.tile_expert, u64::from(self.max_tiles)),
            9 => (&self.meta, u64::from(META_WORDS)),
            10 => (&self.overflow_offsets, e1),
            other => {
                return Err(Error::invalid(format!("the dispatch layout has no buffer for binding {other}")));
            }
        };
        Ok(region.bind(binding, elems * U32))
    }

    fn dispatch(
        &self,
        ctx: &Context,
        spec: &'static KernelSpec,
        indices: BufferView<'_>,
        grid: [u32; 3],
    ) -> Result<Dispatch> {
        let kernel = ctx.kernel(spec, &[])?;
        let bindings =
            spec.bindings.iter().map(|&(b, _)| self.bind(b, indices)).collect::<Result<Vec<_>>>()?;
        ctx.dispatch(&kernel, &bindings, grid)
    }

    /// The four dispatches that fill the layout from `indices[tokens, k]` (u32).
    ///
    /// # Errors
    /// [`Error::Shape`] for an `indices` buffer smaller than the layout's entries;
    /// [`Error::LimitExceeded`] for grids past the adapter's limits.
    pub fn plan<'b>(&self, ctx: &Context, indices: impl Into<BufferView<'b>>) -> Result<Vec<Dispatch>> {
        self.plan_for(ctx, indices.into(), LiveCount::tokens())
    }

    /// [`Self::plan`] for a layout whose token count is `tokens` of a plan's live count.
    fn plan_for(&self, ctx: &Context, indices: BufferView<'_>, tokens: LiveCount) -> Result<Vec<Dispatch>> {
        ctx.check_view("indices", &indices, u64::from(self.entries) * U32, Access::Read)?;
        let blocks = ctx.grid(u64::from(self.blocks), "dispatch blocks")?;
        let experts = ctx.grid(EXPERT_BASE.groups(self.cfg.experts.into())?, "dispatch experts")?;
        let live_blocks = self.live_entries(tokens).div_ceil(DISPATCH_WG);
        let sized = |grid| self.sizing(grid, tokens);
        Ok(vec![
            self.dispatch(ctx, &BLOCK_HIST, indices, blocks)?.sized(sized(LiveGrid::Spilled(live_blocks))),
            self.dispatch(ctx, &EXPERT_BASE, indices, experts)?.sized(sized(LiveGrid::Fixed)),
            self.dispatch(ctx, &SCAN, indices, [1, 1, 1])?.sized(sized(LiveGrid::Fixed)),
            self.dispatch(ctx, &SCATTER, indices, blocks)?.sized(sized(LiveGrid::Spilled(live_blocks))),
        ])
    }

    /// The entries (`tokens * k`) at a live count, where the layout's tokens are `tokens`.
    fn live_entries(&self, tokens: LiveCount) -> LiveCount {
        tokens.times(self.cfg.k)
    }

    /// How a dispatch of the layout's (or bucket) kernels with `grid` follows the live count:
    /// `DispatchParams`' entries, blocks and max_tiles do.
    fn sizing(&self, grid: LiveGrid, tokens: LiveCount) -> Sizing {
        let entries = self.live_entries(tokens);
        Sizing::new(grid)
            .field(offset_of!(Params, entries), entries.value())
            .field(offset_of!(Params, blocks), entries.div_ceil(DISPATCH_WG))
            .field(offset_of!(Params, max_tiles), self.live_padded_rows(entries).div_ceil(self.cfg.tile))
    }

    /// The bound on padded rows (`entries + experts * (tile - 1)`) at a live count.
    pub(crate) fn live_padded_rows(&self, entries: LiveCount) -> LiveCount {
        entries.plus(self.cfg.experts * (self.cfg.tile - 1))
    }

    /// The configuration.
    pub fn config(&self) -> DispatchConfig {
        self.cfg
    }
    /// Tokens the layout was built for.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }
    /// Upper bound on padded rows (`tokens * k + experts * (tile - 1)`); `perm` has this many.
    pub fn max_rows(&self) -> u32 {
        self.max_rows
    }
    /// Upper bound on tiles; `tile_expert` has this many, NONE past the tiles in use.
    pub fn max_tiles(&self) -> u32 {
        self.max_tiles
    }
    /// `counts[E]`.
    pub fn counts(&self) -> BufferView<'_> {
        self.counts.view()
    }
    /// `offsets[E + 1]` (unpadded).
    pub fn offsets(&self) -> BufferView<'_> {
        self.offsets.view()
    }
    /// `padded[E + 1]` (tile-padded offsets).
    pub fn padded_offsets(&self) -> BufferView<'_> {
        self.padded.view()
    }
    /// `perm[max_rows]`: grouped row -> entry `token * k + slot`, NONE for padding.
    pub fn perm(&self) -> BufferView<'_> {
        self.perm.view()
    }
    /// `inverse[tokens * k]`: entry -> grouped row.
    pub fn inverse(&self) -> BufferView<'_> {
        self.inverse.view()
    }
    /// `tile_expert[max_tiles]`: tile -> expert, NONE for unused tiles.
    pub fn tile_expert(&self) -> BufferView<'_> {
        self.tile_expert.view()
    }
    /// `meta[8]`: rows, padded rows, tiles, max count, non-empty experts, over-bound rows,
    /// invalid entries, 0.
    pub fn meta(&self) -> BufferView<'_> {
        self.meta.view()
    }

    /// Reads the layout back (trimmed to the rows and tiles in use).
    ///
    /// # Errors
    /// A device error while reading back.
    pub fn read(&self, ctx: &Context) -> Result<Layout> {
        let e = self.cfg.experts as usize;
        let meta = Meta::from_words(&ctx.read_back::<u32>(self.meta.view(), META_WORDS as usize)?);
        Ok(Layout {
            counts: ctx.read_back(self.counts.view(), e)?,
            offsets: ctx.read_back(self.offsets.view(), e + 1)?,
            padded: ctx.read_back(self.padded.view(), e + 1)?,
            perm: ctx.read_back(self.perm.view(), meta.padded_rows as usize)?,
            inverse: ctx.read_back(self.inverse.view(), self.entries as usize)?,
            tile_expert: ctx.read_back(self.tile_expert.view(), meta.tiles as usize)?,
            overflow_offsets: ctx.read_back(self.overflow_offsets.view(), e + 1)?,
            meta,
        })
    }

    /// The whole tile map, including the NONE entries past the tiles in use.
    ///
    /// # Errors
    /// A device error while reading back.
    pub fn read_tile_map(&self, ctx: &Context) -> Result<Vec<u32>> {
        ctx.read_back(self.tile_expert.view(), self.max_tiles as usize)
    }

    /// Expert load statistics (reads counts and meta).
    ///
    /// # Errors
    /// A device error while reading back.
    pub fn stats(&self, ctx: &Context) -> Result<LoadStats> {
        let meta = Meta::from_words(&ctx.read_back::<u32>(self.meta.view(), META_WORDS as usize)?);
        Ok(LoadStats::new(ctx.read_back(self.counts.view(), self.cfg.experts as usize)?, meta))
    }

    /// Writes a host-built layout into the device buffers (the host-dispatch path).
    ///
    /// # Errors
    /// [`Error::Shape`] when the layout is not for this one's experts and entries.
    pub fn upload(&self, ctx: &Context, l: &Layout) -> Result<()> {
        let e = self.cfg.experts as usize;
        let mut tiles = l.tile_expert.clone();
        tiles.resize(self.max_tiles as usize, host::NONE);
        let fits = l.counts.len() == e
            && l.inverse.len() == self.entries as usize
            && l.perm.len() <= self.max_rows as usize;
        if !fits {
            return Err(Error::shape(
                "host layout",
                format!("E = {e}, {} entries", self.entries),
                format!("E = {}, {} entries", l.counts.len(), l.inverse.len()),
            ));
        }
        let q = ctx.queue();
        q.write_buffer(self.counts.buffer(), self.counts.offset(), bytemuck::cast_slice(&l.counts));
        q.write_buffer(self.offsets.buffer(), self.offsets.offset(), bytemuck::cast_slice(&l.offsets));
        q.write_buffer(self.padded.buffer(), self.padded.offset(), bytemuck::cast_slice(&l.padded));
        q.write_buffer(self.perm.buffer(), self.perm.offset(), bytemuck::cast_slice(&l.perm));
        q.write_buffer(self.inverse.buffer(), self.inverse.offset(), bytemuck::cast_slice(&l.inverse));
        q.write_buffer(self.tile_expert.buffer(), self.tile_expert.offset(), bytemuck::cast_slice(&tiles));
        q.write_buffer(
            self.overflow_offsets.buffer(),
            self.overflow_offsets.offset(),
            bytemuck::cast_slice(&l.overflow_offsets),
        );
        q.write_buffer(self.meta.buffer(), self.meta.offset(), bytemuck::cast_slice(&l.meta.to_words()));
        Ok(())
    }
}

/// Host baseline: reads `indices` back, stable-sorts on the CPU, and uploads the layout.
/// One readback and eight uploads per call; kept as the A side of the dispatch A/B.
///
/// # Errors
/// As [`DispatchLayout::upload`], and device errors while reading `indices` back.
pub fn host_dispatch<'b>(
    ctx: &Context,
    layout: &DispatchLayout,
    indices: impl Into<BufferView<'b>>,
    bound: u32,
) -> Result<Layout> {
    let host: Vec<u32> = ctx.read_back(indices, layout.entries as usize)?;
    let l = host::layout(&host, layout.cfg.experts, layout.cfg.tile, bound);
    layout.upload(ctx, &l)?;
    Ok(l)
}

/// What happens to tokens past a bucket's bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum OverflowPolicy {
    /// Listed for a second pass; nothing is lost.
    Overflow,
    /// Dropped and counted.
    Drop,
}

/// Bucket ("caps") routing: top-1 winners grouped per bucket with at most `bound` rows each.
/// The winners come from [`crate::kernels::routing::plan_argmax`] (same tie rule as top-k).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketConfig {
    /// Number of buckets.
    pub n_caps: u32,
    /// Rows per bucket, at least 1.
    pub bound: u32,
    /// Overflow or drop past the bound.
    pub policy: OverflowPolicy,
}

/// A bucket layout: the k = 1 grouping plus `pad_perm[n_caps * bound]` and the overflow list.
#[derive(Debug)]
pub struct BucketLayout {
    cfg: BucketConfig,
    /// Winners per token of a plan's live count (1 unless set).
    winners_per_token: u32,
    layout: DispatchLayout,
    pad_perm: Region,
    overflow: Region,
}

/// Bucket lists read back to the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostBuckets {
    /// Token of rank r in bucket c at `c * bound + r`, NONE past the bucket's count.
    pub pad_perm: Vec<u32>,
    /// Tokens past the bound in (bucket, rank) order (empty under the drop policy).
    pub overflow: Vec<u32>,
    /// Tokens past the bound (overflowed or dropped).
    pub over_bound: u32,
}

impl BucketLayout {
    /// Allocates the bucket layout for `tokens` tokens.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero bound; [`Error::LimitExceeded`] for slots past
    /// u32 indices or the adapter's limits; [`DispatchLayout::new`]'s errors.
    pub fn new(ctx: &Context, cfg: BucketConfig, tokens: u32) -> Result<Self> {
        Self::with_scratch(Scratch::Own(ctx), cfg, tokens)
    }

    /// The grouping underneath a bucket layout of `cfg`.
    fn grouping(cfg: BucketConfig) -> DispatchConfig {
        DispatchConfig { experts: cfg.n_caps, k: 1, tile: 1 }
    }

    /// The bytes of each of the buffers of a bucket layout for `tokens` tokens (the regions
    /// [`Self::new`] takes, its grouping's first).
    ///
    /// # Errors
    /// As [`DispatchLayout::scratch_bytes`].
    pub(crate) fn scratch_bytes(cfg: BucketConfig, tokens: u32) -> Result<Vec<(ScratchKey, u64)>> {
        let mut bytes = DispatchLayout::scratch_bytes(Self::grouping(cfg), tokens)?.to_vec();
        let slots = Self::slots_region(cfg)?;
        bytes.push((slots.key, slots.bytes));
        let overflow = Self::overflow_region(tokens);
        bytes.push((overflow.key, overflow.bytes));
        Ok(bytes)
    }

    /// The slots' region (`pad_perm`): `bound` u32 entries per bucket.
    fn slots_region(cfg: BucketConfig) -> Result<RegionSize> {
        let bytes = size::product(
            "bucket slots (n_caps × bound)",
            &[u64::from(cfg.n_caps), u64::from(cfg.bound), U32],
        )?;
        Ok(RegionSize { key: ScratchKey::BucketSlots, bytes })
    }

    /// The overflow list's region: one u32 entry per entry of the layout.
    fn overflow_region(tokens: u32) -> RegionSize {
        RegionSize { key: ScratchKey::BucketOverflow, bytes: u64::from(tokens) * U32 }
    }

    /// [`Self::new`] with its buffers taken from `scratch`.
    pub(crate) fn with_scratch(scratch: Scratch<'_>, cfg: BucketConfig, tokens: u32) -> Result<Self> {
        let ctx = scratch.ctx();
        if cfg.bound == 0 {
            return Err(Error::invalid("bucket bound must be at least 1"));
        }
        let layout = DispatchLayout::with_scratch(scratch, Self::grouping(cfg), tokens, cfg.bound)?;
        let slots_region = Self::slots_region(cfg)?;
        let slots = u64::from(cfg.n_caps) * u64::from(cfg.bound);
        if slots_region.bytes > ctx.limits().max_storage_buffer_binding_size {
            return Err(Error::limit(
                "pad_perm bytes (n_caps x bound)",
                slots_region.bytes,
                ctx.limits().max_storage_buffer_binding_size,
                "max_storage_buffer_binding_size",
            ));
        }
        if slots > u64::from(u32::MAX) {
            return Err(Error::limit("n_caps x bound", slots, u32::MAX.into(), "u32 slot indices"));
        }
        Ok(BucketLayout {
            cfg,
            winners_per_token: 1,
            pad_perm: scratch.take(slots_region)?,
            overflow: scratch.take(Self::overflow_region(tokens))?,
            layout,
        })
    }

    /// The layout for `n` winners per token of a plan's live count (a layer's k): its
    /// dispatches then follow that count.
    pub(crate) fn with_winners_per_token(self, n: u32) -> Self {
        BucketLayout { winners_per_token: n, ..self }
    }

    /// The bucket configuration.
    pub fn config(&self) -> BucketConfig {
        self.cfg
    }
    /// The grouping underneath (k = 1, tile = 1).
    pub fn layout(&self) -> &DispatchLayout {
        &self.layout
    }
    /// `pad_perm[n_caps * bound]`.
    pub fn pad_perm(&self) -> BufferView<'_> {
        self.pad_perm.view()
    }
    /// Overflow list (its length is the layout's over-bound count).
    pub fn overflow(&self) -> BufferView<'_> {
        self.overflow.view()
    }

    /// Dispatches that fill the bucket layout from `winners[tokens]` (u32).
    ///
    /// # Errors
    /// As [`DispatchLayout::plan`].
    pub fn plan<'b>(&self, ctx: &Context, winners: impl Into<BufferView<'b>>) -> Result<Vec<Dispatch>> {
        let winners = winners.into();
        let tokens = LiveCount::tokens().times(self.winners_per_token);
        let mut ds = self.layout.plan_for(ctx, winners, tokens)?;
        let slots = u64::from(self.cfg.n_caps) * u64::from(self.cfg.bound);
        let extra = |binding: u32| match binding {
            11 => Some(self.pad_perm.bind(binding, slots * U32)),
            12 => Some(self.overflow.bind(binding, u64::from(self.layout.tokens.max(1)) * U32)),
            _ => None,
        };
        let mut specs = vec![(&BUCKET_SLOTS, slots)];
        if self.cfg.policy == OverflowPolicy::Overflow {
            specs.push((&BUCKET_OVERFLOW, u64::from(self.layout.entries)));
        }
        for (spec, threads) in specs {
            let kernel = ctx.kernel(spec, &[])?;
            let bindings = spec
                .bindings
                .iter()
                .map(|&(b, _)| extra(b).map_or_else(|| self.layout.bind(b, winners), Ok))
                .collect::<Result<Vec<_>>>()?;
            let grid = match spec.entry == BUCKET_OVERFLOW.entry {
                true => LiveGrid::Spilled(spec.live_groups(self.layout.live_entries(tokens))?),
                false => LiveGrid::Fixed,
            };
            let d = ctx.dispatch(&kernel, &bindings, ctx.grid(spec.groups(threads)?, spec.entry)?)?;
            ds.push(d.sized(self.layout.sizing(grid, tokens)));
        }
        Ok(ds)
    }

    /// Reads the bucket lists back.
    ///
    /// # Errors
    /// A device error while reading back.
    pub fn read(&self, ctx: &Context) -> Result<HostBuckets> {
        let meta = Meta::from_words(&ctx.read_back::<u32>(self.layout.meta(), META_WORDS as usize)?);
        let slots = (self.cfg.n_caps * self.cfg.bound) as usize;
        Ok(HostBuckets {
            pad_perm: ctx.read_back(self.pad_perm.view(), slots)?,
            overflow: match self.cfg.policy {
                OverflowPolicy::Overflow => ctx.read_back(self.overflow.view(), meta.overflow as usize)?,
                OverflowPolicy::Drop => Vec::new(),
            },
            over_bound: meta.overflow,
        })
    }
}

/// Checks host-side indices before upload: every index must be below `experts`.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first index at or past `experts`.
pub fn check_indices(indices: &[u32], experts: u32) -> Result<()> {
    match indices.iter().position(|&i| i >= experts) {
        None => Ok(()),
        Some(p) => Err(Error::invalid(format!(
            "indices[{p}] = {} is not below the expert count {experts}",
            indices[p]
        ))),
    }
}

/// Groups host `indices[tokens * k]` on the device and reads the layout back.
///
/// # Errors
/// [`check_indices`] and [`DispatchConfig::validate`]'s errors; [`Error::Shape`] when
/// the length is not a multiple of k; device errors while running or reading back.
pub fn dispatch_host_indices(ctx: &Context, cfg: DispatchConfig, indices: &[u32]) -> Result<Layout> {
    cfg.validate()?;
    check_indices(indices, cfg.experts)?;
    if !indices.len().is_multiple_of(cfg.k as usize) {
        return Err(Error::shape("indices", format!("a multiple of k = {}", cfg.k), indices.len()));
    }
    let tokens = u32::try_from(indices.len() / cfg.k as usize)
        .map_err(|_| Error::limit("tokens", indices.len() as u64, u32::MAX.into(), "u32 token count"))?;
    let layout = DispatchLayout::new(ctx, cfg, tokens, 0)?;
    let buf = ctx.upload("indices", indices)?;
    let plan = layout.plan(ctx, &buf)?;
    ctx.run(&plan.iter().collect::<Vec<_>>())?;
    layout.read(ctx)
}
