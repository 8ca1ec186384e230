//! [`DispatchLayout`]: the tile-padded grouping of entries by expert, planned on the device
//! (block histograms, scan, stable scatter) or uploaded from the host layout.

use std::mem::offset_of;

#[cfg(not(target_arch = "wasm32"))]
use super::config::check_indices;
use super::config::{DISPATCH_WG, DispatchConfig, LoadStats};
use super::host::{Layout, Meta};
use super::meta::META_WORDS;
use super::specs::{BLOCK_HIST, EXPERT_BASE, PARAMS_BYTES, Params, SCAN, SCATTER};
use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::live::{LiveCount, LiveGrid, Sizing};
use crate::pipeline::{Access, Binding, BufferView, Dispatch, KernelSpec};
use crate::size;
use crate::workspace::{Region, RegionSize, Scratch, ScratchKey};

impl ScratchKey {
    /// Per-block expert histogram `[blocks, experts]` of a dispatch layout
    /// (`wgsl/dispatch/layout.wgsl`, as the regions below).
    pub const DISPATCH_HIST: ScratchKey = ScratchKey::new("dispatch hist");
    /// Rows per expert `[experts]`.
    pub const DISPATCH_COUNTS: ScratchKey = ScratchKey::new("expert counts");
    /// Exclusive scan of the counts `[experts + 1]`.
    pub const DISPATCH_OFFSETS: ScratchKey = ScratchKey::new("expert offsets");
    /// The scan of the tile-padded counts `[experts + 1]`.
    pub const DISPATCH_PADDED: ScratchKey = ScratchKey::new("padded offsets");
    /// Row -> entry `[max rows]`.
    pub const DISPATCH_PERM: ScratchKey = ScratchKey::new("perm");
    /// Entry -> row `[entries]`.
    pub const DISPATCH_INVERSE: ScratchKey = ScratchKey::new("inverse perm");
    /// Tile -> expert `[max tiles]`.
    pub const DISPATCH_TILE_EXPERT: ScratchKey = ScratchKey::new("tile expert");
    /// Totals (rows, tiles, overflow).
    pub const DISPATCH_META: ScratchKey = ScratchKey::new("dispatch meta");
    /// Scan of the overflow counts `[experts + 1]`.
    pub const DISPATCH_OVERFLOW_OFFSETS: ScratchKey = ScratchKey::new("overflow offsets");
}

/// Device buffers of one grouped layout for `tokens` tokens, and the dispatches that fill
/// them from an indices buffer. Built once per shape; every forward re-records the same plan,
/// and every consumer (expert projections, combine) reads the same buffers.
#[derive(Debug)]
pub struct DispatchLayout {
    pub(super) cfg: DispatchConfig,
    pub(super) tokens: u32,
    pub(super) entries: u32,
    pub(super) blocks: u32,
    pub(super) max_rows: u32,
    pub(super) max_tiles: u32,
    pub(super) params: wgpu::Buffer,
    pub(super) hist: Region,
    pub(super) counts: Region,
    pub(super) offsets: Region,
    pub(super) padded: Region,
    pub(super) perm: Region,
    pub(super) inverse: Region,
    pub(super) tile_expert: Region,
    pub(super) meta: Region,
    pub(super) overflow_offsets: Region,
}

pub(super) const U32: u64 = 4;

/// The sizes of a layout for a token count.
pub(super) struct Shape {
    pub(super) entries: u32,
    pub(super) blocks: u32,
    pub(super) max_rows: u32,
    pub(super) max_tiles: u32,
}

impl Shape {
    /// Of a layout of `cfg` for `tokens` tokens.
    pub(super) fn of(cfg: DispatchConfig, tokens: u32) -> Result<Self> {
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
        Ok([
            (
                ScratchKey::DISPATCH_HIST,
                size::product(
                    "the dispatch histogram",
                    &[u64::from(s.blocks.max(1)), u64::from(cfg.experts), U32],
                )?,
            ),
            (ScratchKey::DISPATCH_COUNTS, e),
            (ScratchKey::DISPATCH_OFFSETS, e1),
            (ScratchKey::DISPATCH_PADDED, e1),
            (ScratchKey::DISPATCH_PERM, u64::from(s.max_rows) * U32),
            (ScratchKey::DISPATCH_INVERSE, u64::from(s.entries) * U32),
            (ScratchKey::DISPATCH_TILE_EXPERT, u64::from(s.max_tiles) * U32),
            (ScratchKey::DISPATCH_META, u64::from(META_WORDS) * U32),
            (ScratchKey::DISPATCH_OVERFLOW_OFFSETS, e1),
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
    pub(super) fn bind<'a>(&'a self, binding: u32, indices: BufferView<'a>) -> Result<Binding<'a>> {
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

    pub(super) fn dispatch(
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
    pub(super) fn plan_for(
        &self,
        ctx: &Context,
        indices: BufferView<'_>,
        tokens: LiveCount,
    ) -> Result<Vec<Dispatch>> {
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
    pub(super) fn live_entries(&self, tokens: LiveCount) -> LiveCount {
        tokens.times(self.cfg.k)
    }

    /// How a dispatch of the layout's (or bucket) kernels with `grid` follows the live count:
    /// `DispatchParams`' entries, blocks and max_tiles do.
    pub(super) fn sizing(&self, grid: LiveGrid, tokens: LiveCount) -> Sizing {
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
    #[cfg(not(target_arch = "wasm32"))]
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
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_tile_map(&self, ctx: &Context) -> Result<Vec<u32>> {
        ctx.read_back(self.tile_expert.view(), self.max_tiles as usize)
    }

    /// Expert load statistics (reads counts and meta).
    ///
    /// # Errors
    /// A device error while reading back.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn stats(&self, ctx: &Context) -> Result<LoadStats> {
        pollster::block_on(self.stats_with(ctx, Driver::Inline))
    }

    /// [`Self::stats`], awaiting the read-back instead of blocking on it.
    ///
    /// # Errors
    /// As [`Self::stats`].
    pub async fn stats_async(&self, ctx: &Context) -> Result<LoadStats> {
        self.stats_with(ctx, Driver::Await).await
    }

    /// [`Self::stats`], its read-backs waited for as `driver` says.
    pub(crate) async fn stats_with(&self, ctx: &Context, driver: Driver) -> Result<LoadStats> {
        let meta = Meta::from_words(
            &ctx.read_back_with::<u32>(self.meta.view(), META_WORDS as usize, driver).await?,
        );
        let counts = ctx.read_back_with(self.counts.view(), self.cfg.experts as usize, driver).await?;
        Ok(LoadStats::new(counts, meta))
    }

    /// Writes a host-built layout into the device buffers (the host-dispatch path).
    ///
    /// # Errors
    /// [`Error::Shape`] when the layout is not for this one's experts and entries.
    pub fn upload(&self, ctx: &Context, l: &Layout) -> Result<()> {
        let e = self.cfg.experts as usize;
        let mut tiles = l.tile_expert.clone();
        tiles.resize(self.max_tiles as usize, super::host::NONE);
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
#[cfg(not(target_arch = "wasm32"))]
pub fn host_dispatch<'b>(
    ctx: &Context,
    layout: &DispatchLayout,
    indices: impl Into<BufferView<'b>>,
    bound: u32,
) -> Result<Layout> {
    let host: Vec<u32> = ctx.read_back(indices, layout.entries as usize)?;
    let l = super::host::layout(&host, layout.cfg.experts, layout.cfg.tile, bound);
    layout.upload(ctx, &l)?;
    Ok(l)
}

/// Groups host `indices[tokens * k]` on the device and reads the layout back.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first index at or past `experts`;
/// [`DispatchConfig::validate`]'s errors; [`Error::Shape`] when
/// the length is not a multiple of k; device errors while running or reading back.
#[cfg(not(target_arch = "wasm32"))]
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
