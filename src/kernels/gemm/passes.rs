//! Passes: one projection of a set of rows through one weight tensor (two for the fused
//! gate/up), recorded as dispatches per weight chunk and per x window, by a block GEMM variant
//! or the row-wise kernel; the staging of x rows into the windows (`windows.rs`); and how each
//! dispatch follows a plan's live token count.

use std::mem::offset_of;
use std::sync::Arc;

use super::windows::{Span, Windows};

use super::ffn::{Activation, ExpertFfn};
use super::params::{
    FLAG_EXPERT_FROM_INDICES, FLAG_EXPERT_FROM_TILES, FLAG_GATHER, FLAG_IDENTITY_ROWS, FLAG_OUT_ENTRY,
    PARAMS_BYTES, Params,
};
use super::slots;
use super::specs::WeightLoads;
use super::specs::{RowWeights, RowX, STAGE, WINDOW_BYTES, rowwise_spec, spec};
use super::texture::TextureWeights;
use super::variant::GemmOrder;
use super::variant::{GemmVariant, OperandSource};
use super::weights::ExpertWeights;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::dispatch::DispatchLayout;
use crate::live::{LiveCount, LiveGrid, Sizing};
use crate::pipeline::{Binding, BufferView, Dispatch, KernelSpec, TextureBinding};
use crate::shader::Override;
use crate::workspace::{Region, RegionSize, Scratch, ScratchKey};

/// What a pass computes (the kernels' `SWIGLU`, `FLAG_GATHER` and `FLAG_OUT_ENTRY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PassKind {
    /// The fused gate/up projection into activation rows, each row's x gathered from its
    /// entry's token: `act[row] = activation(x . gate, x . up)`.
    GateUp,
    /// The down projection of activation rows into their entries' rows: `partial[entry]`.
    DownToEntries,
    /// One projection, row to row, no activation (dense GEMMs, the all-experts oracle's down).
    Plain,
}

/// How a pass numbers its rows (`FLAG_IDENTITY_ROWS`).
#[derive(Clone, Copy, Debug)]
pub(super) enum RowMap<'a> {
    /// Row r is entry `rows[r]`: a dispatch layout's permutation, a bucket's slots or the
    /// overflow list.
    Listed(BufferView<'a>),
    /// Row r is entry r; the kernels' rows binding takes this placeholder, which they do not
    /// read.
    Identity(BufferView<'a>),
}

impl<'a> RowMap<'a> {
    /// What the rows binding takes.
    fn view(&self) -> BufferView<'a> {
        match *self {
            RowMap::Listed(v) | RowMap::Identity(v) => v,
        }
    }
}

/// One projection of a set of rows through one weight tensor (two for gate/up), as one or more
/// dispatches (per weight chunk, per x window). Made by its constructors only, so its flags
/// follow from its kind.
#[derive(Clone, Copy)]
pub(super) struct Pass<'a> {
    order: GemmOrder,
    kind: PassKind,
    rows: RowMap<'a>,
    x: BufferView<'a>,
    w: &'a ExpertWeights,
    w_up: &'a ExpertWeights,
    out: BufferView<'a>,
    pub(super) params: Params,
    /// `params.rows` and `params.row_offset` as functions of a plan's live token count.
    live: LiveRows,
    /// The activation of a SwiGLU pass.
    activation: Activation,
    /// Biases: `[E, N, 2]` (gate, up) pairs in a SwiGLU pass, else `[E, N]`.
    bias: Option<&'a wgpu::Buffer>,
}

impl<'a> Pass<'a> {
    /// The fused gate/up projection of `ffn` over `rows` (`params` with its N and K set from
    /// the FFN's shape): `act[row] = activation(x . gate, x . up)`, x gathered from each row's
    /// entry's token.
    pub(super) fn gate_up(
        ffn: &'a ExpertFfn,
        order: GemmOrder,
        params: Params,
        x: BufferView<'a>,
        rows: RowMap<'a>,
        act: BufferView<'a>,
        live: LiveRows,
    ) -> Self {
        Pass {
            order,
            kind: PassKind::GateUp,
            rows,
            x,
            w: &ffn.gate,
            w_up: &ffn.up,
            out: act,
            params: Params { n: ffn.ffn(), kdim: ffn.hidden(), ..params },
            live,
            activation: ffn.activation,
            bias: ffn.bias.as_ref().map(|b| &b.gate_up),
        }
    }

    /// [`Self::gate_up`] over the padded rows of a dispatch layout (its tiles name their
    /// experts).
    pub(super) fn grouped_gate_up(
        ffn: &'a ExpertFfn,
        order: GemmOrder,
        params: Params,
        x: BufferView<'a>,
        layout: &'a DispatchLayout,
        act: BufferView<'a>,
    ) -> Self {
        let entries = LiveCount::tokens().times(layout.config().k);
        let live = LiveRows::new(layout.live_padded_rows(entries));
        let mut p = Self::gate_up(ffn, order, params, x, RowMap::Listed(layout.perm()), act, live);
        p.params.rows = layout.max_rows();
        p.params.tile_rows = layout.config().tile;
        p
    }

    /// The down projection of `ffn` over the rows of `up`: reads `act[row]`, writes
    /// `partial[entry]`.
    pub(super) fn down(
        up: &Pass<'a>,
        ffn: &'a ExpertFfn,
        act: BufferView<'a>,
        partial: BufferView<'a>,
    ) -> Self {
        Pass {
            kind: PassKind::DownToEntries,
            x: act,
            w: &ffn.down,
            w_up: &ffn.down,
            out: partial,
            params: Params { n: ffn.hidden(), kdim: ffn.ffn(), ..up.params },
            bias: ffn.bias.as_ref().map(|b| &b.down),
            ..*up
        }
    }

    /// [`Self::down`] writing row to row (`out[row]`) instead of to the entries.
    pub(super) fn down_to_rows(
        up: &Pass<'a>,
        ffn: &'a ExpertFfn,
        act: BufferView<'a>,
        out: BufferView<'a>,
    ) -> Self {
        Pass { kind: PassKind::Plain, ..Self::down(up, ffn, act, out) }
    }

    /// A dense GEMM `y[rows, N] = x[rows, K] . w^T` of the one matrix `w` (expert 0),
    /// `placeholder` bound as the unread rows list.
    pub(super) fn dense(
        order: GemmOrder,
        w: &'a ExpertWeights,
        x: BufferView<'a>,
        y: BufferView<'a>,
        params: Params,
        placeholder: BufferView<'a>,
    ) -> Self {
        Pass {
            order,
            kind: PassKind::Plain,
            rows: RowMap::Identity(placeholder),
            x,
            w,
            w_up: w,
            out: y,
            params,
            live: LiveRows::new(LiveCount::tokens()),
            activation: Activation::Swiglu,
            bias: None,
        }
    }

    /// Whether this is the fused gate/up (SwiGLU) projection.
    fn swiglu(&self) -> bool {
        self.kind == PassKind::GateUp
    }

    fn constants(&self) -> Vec<(Override, f64)> {
        let bias = match (self.bias, self.swiglu()) {
            (None, _) => 0.0,
            (Some(_), false) => 1.0,
            (Some(_), true) => 2.0,
        };
        // One constant for both bound weights (w_up is w outside SwiGLU): narrow when both are.
        let narrow = self.w.narrow_scales && self.w_up.narrow_scales;
        let mut c = vec![
            (Override::Dtype, self.w.dtype.code()),
            (Override::NarrowScales, f64::from(u8::from(narrow))),
            (Override::Swiglu, f64::from(u8::from(self.swiglu()))),
            (Override::Bias, bias),
        ];
        c.extend(self.activation.constants());
        c
    }

    /// How a dispatch of this pass with `grid` follows the live count: its rows and first row
    /// do.
    fn sizing(&self, grid: LiveGrid) -> Sizing {
        Sizing::new(grid)
            .field(offset_of!(Params, rows), self.live.rows.value())
            .field(offset_of!(Params, row_offset), self.live.row_offset.value())
    }

    /// How a dispatch of this pass over `span` (one x window, or the whole pass) follows the
    /// live count: as [`Self::sizing`], its grid over the span's rows up to the count (`per_row`
    /// says how the kernel covers rows); a window's dispatch runs once the count reaches it.
    fn span_sizing(&self, spec: &KernelSpec, span: Span, windowed: bool, per_row: PerRow) -> Result<Sizing> {
        let rows = self.live.rows;
        let grid = match per_row {
            PerRow::Block(block_rows) => {
                LiveGrid::X(rows.beyond(span.row0, block_rows).at_most(span.rows.div_ceil(block_rows)))
            }
            PerRow::Invocations(lanes) => {
                let cap = spec.groups(u64::from(span.rows) * u64::from(lanes))?;
                let groups = spec.live_groups_beyond(rows.times(lanes), span.row0.saturating_mul(lanes))?;
                LiveGrid::Spilled(groups.at_most(u32::try_from(cap).unwrap_or(u32::MAX)))
            }
        };
        let s = self.sizing(grid);
        Ok(match windowed {
            true => s.once_above(rows, span.row0),
            false => s,
        })
    }

    /// The uniform parameters with the FLAG_* bits of this pass and `extra`.
    fn params_flagged(&self, extra: u32) -> Params {
        let bit = |on: bool, f: u32| if on { f } else { 0 };
        let flags = bit(self.kind == PassKind::GateUp, FLAG_GATHER)
            | bit(self.kind == PassKind::DownToEntries, FLAG_OUT_ENTRY)
            | bit(matches!(self.rows, RowMap::Identity(_)), FLAG_IDENTITY_ROWS)
            | extra;
        Params { flags, ..self.params }
    }

    /// The bindings every GEMM dispatch of this pass makes: parameters, x, rows, output and
    /// biases (`no_bias` where there are none: the epilogue reads nothing then; a buffer of its
    /// own, as WebGPU refuses two writable bindings of one range in a dispatch).
    fn common<'b>(&'b self, params: &'b wgpu::Buffer, no_bias: &'b wgpu::Buffer) -> Vec<Binding<'b>> {
        let bias = match self.bias {
            Some(b) => Binding::new(slots::BIAS, b, b.size()),
            None => Binding::new(slots::BIAS, no_bias, no_bias.size()),
        };
        vec![
            Binding::new(slots::PARAMS, params, PARAMS_BYTES),
            self.x.bind(slots::X, self.x.size),
            self.rows.view().bind(slots::ROW_ENTRY, self.rows.view().size),
            self.out.bind(slots::OUT, self.out.size),
            bias,
        ]
    }

    /// [`Pass::common`] and weight chunk `chunk` (2, and the up projection's at 3).
    fn with_chunk<'b>(
        &'b self,
        params: &'b wgpu::Buffer,
        no_bias: &'b wgpu::Buffer,
        chunk: usize,
    ) -> Vec<Binding<'b>> {
        let (w, u) = (&self.w.chunks[chunk], &self.w_up.chunks[chunk]);
        let mut bindings = self.common(params, no_bias);
        bindings.push(Binding::new(slots::W, &w.buffer, w.bytes));
        bindings.push(Binding::new(slots::W_UP, &u.buffer, u.bytes));
        bindings
    }

    /// The texture copies of the weights and the up projection's (the weights' own where
    /// they are one), or None where either is past the device's texture limits.
    fn textures(&self, ctx: &Context) -> Result<Option<[Arc<TextureWeights>; 2]>> {
        let Some(w) = self.w.texture(ctx)? else {
            return Ok(None);
        };
        if std::ptr::eq(self.w, self.w_up) {
            return Ok(Some([w.clone(), w]));
        }
        Ok(self.w_up.texture(ctx)?.map(|u| [w, u]))
    }

    /// The weight chunks this pass dispatches over, with the parameters of each: every chunk,
    /// or with a fixed expert (`expert_from_buffer` false) the chunks that hold it.
    fn chunks(&self, expert_from_buffer: bool, extra_flags: u32) -> Result<Vec<(usize, Params)>> {
        if self.w.chunks.len() != self.w_up.chunks.len() {
            return Err(Error::invalid("the gate and up projections are split differently"));
        }
        let fixed = self.params.fixed_expert;
        Ok(self
            .w
            .chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| expert_from_buffer || c.experts.contains(&fixed))
            .map(|(i, c)| {
                let params = Params {
                    expert_base: c.experts.start,
                    expert_count: c.experts.end - c.experts.start,
                    col_base: c.cols.start,
                    cols: c.cols.end - c.cols.start,
                    ..self.params_flagged(extra_flags)
                };
                (i, params)
            })
            .collect())
    }

    /// Block-GEMM dispatches of `variant`, one per weight chunk (a window variant: a staging
    /// dispatch, then one per weight chunk and window); `tiles` is the tile -> expert map, or
    /// None for `params.fixed_expert`. A cooperative-matrix block must have passed its device
    /// check ([`super::device_check::check_on_device`]); its verdict is looked up, never run,
    /// here.
    pub(super) fn gemm(
        &self,
        scratch: Scratch<'_>,
        variant: GemmVariant,
        tiles: Option<BufferView<'_>>,
    ) -> Result<Vec<Dispatch>> {
        if let GemmVariant::CoopF16(b) = variant {
            super::coop::passed(scratch.ctx(), b)?;
        }
        self.gemm_unchecked(scratch, variant, tiles)
    }

    /// [`Self::gemm`] without the cooperative-matrix verdict: for the device check's own plan.
    pub(super) fn gemm_unchecked(
        &self,
        scratch: Scratch<'_>,
        variant: GemmVariant,
        tiles: Option<BufferView<'_>>,
    ) -> Result<Vec<Dispatch>> {
        let ctx = scratch.ctx();
        // A texture variant without texture copies runs as the window variant of its block.
        let textures = match variant.source() {
            OperandSource::Texture => self.textures(ctx)?,
            OperandSource::Storage | OperandSource::Window => None,
        };
        let variant = if textures.is_some() { variant } else { variant.without_texture() };
        let (variant, windows) = Windows::choose(ctx, variant, self.params.rows, self.params.kdim);
        let textures = textures.filter(|_| variant.source() == OperandSource::Texture);
        let constants = self.constants();
        let bytes = variant.workgroup_bytes();
        if bytes > ctx.limits().max_compute_workgroup_storage_size {
            return Err(Error::limit(
                format!("workgroup memory of the {} GEMM", variant.name()),
                bytes.into(),
                ctx.limits().max_compute_workgroup_storage_size.into(),
                "max_compute_workgroup_storage_size",
            ));
        }
        if variant.invocations() > ctx.limits().max_compute_invocations_per_workgroup {
            return Err(Error::limit(
                format!("invocations of the {} GEMM", variant.name()),
                variant.invocations().into(),
                ctx.limits().max_compute_invocations_per_workgroup.into(),
                "max_compute_invocations_per_workgroup",
            ));
        }
        let spec = spec(variant, self.order, WeightLoads::of(self.w.dtype, self.w.native_f16));
        let kernel = ctx.kernel(spec, &constants)?;
        let from_tiles = if tiles.is_some() { FLAG_EXPERT_FROM_TILES } else { 0 };
        let placeholder = ctx.storage_scratch("no tile map", 4)?;
        let no_bias = ctx.storage_scratch("no bias", 4)?;
        let tiles = tiles.unwrap_or_else(|| (&placeholder).into());
        let max = ctx.limits().max_compute_workgroups_per_dimension;
        let mut out = Vec::new();
        let staged = Staged::new(scratch, windows, self, &mut out)?;
        let bound_textures = texture_bindings(&textures);
        for (chunk, p) in self.weight_chunks(textures.is_some(), from_tiles != 0, from_tiles)? {
            let col_groups = p.cols.div_ceil(variant.block_cols());
            for (index, span) in Staged::spans(staged.as_ref(), p.rows).into_iter().enumerate() {
                let p = Params { win_rows: span.rows, win_row0: span.row0, ..p };
                let params = ctx.uniform("gemm params", &p)?;
                let mut bindings = self.bindings(spec, &params, &no_bias, chunk);
                bindings.push(tiles.bind(slots::TILE_EXPERT, tiles.size));
                bindings.extend(staged.as_ref().map(|st| st.binding(slots::WINDOW, index)));
                let grid = [span.covered(p.rows).div_ceil(variant.block_rows()), col_groups, 1];
                let per_row = PerRow::Block(variant.block_rows());
                let sizing = self.span_sizing(spec, span, staged.is_some(), per_row)?;
                if grid[0] > max || grid[1] > max {
                    return Err(Error::limit(
                        "GEMM workgroups per dimension",
                        grid[0].max(grid[1]).into(),
                        max.into(),
                        "max_compute_workgroups_per_dimension",
                    ));
                }
                out.push(
                    ctx.dispatch_with_textures(&kernel, &bindings, &bound_textures, grid)?.sized(sizing),
                );
            }
        }
        Ok(out)
    }

    /// The weight chunks a pass dispatches over, as [`Pass::chunks`]; with texture copies
    /// (which hold every expert) one unsplit chunk, None, whose parameters describe every expert
    /// and every column.
    fn weight_chunks(
        &self,
        textures: bool,
        expert_from_buffer: bool,
        extra_flags: u32,
    ) -> Result<Vec<(Option<usize>, Params)>> {
        if textures {
            let p = Params {
                expert_base: 0,
                expert_count: self.w.experts,
                col_base: 0,
                cols: self.w.n,
                ..self.params_flagged(extra_flags)
            };
            return Ok(vec![(None, p)]);
        }
        Ok(self.chunks(expert_from_buffer, extra_flags)?.into_iter().map(|(c, p)| (Some(c), p)).collect())
    }

    /// [`Pass::common`], and chunk `chunk`'s weight buffers or (None) nothing: the textures
    /// are bound apart.
    fn bindings<'b>(
        &'b self,
        spec: &KernelSpec,
        params: &'b wgpu::Buffer,
        no_bias: &'b wgpu::Buffer,
        chunk: Option<usize>,
    ) -> Vec<Binding<'b>> {
        let mut all = match chunk {
            Some(chunk) => self.with_chunk(params, no_bias, chunk),
            None => self.common(params, no_bias),
        };
        // Only the buffers the kernel binds: window kernels read x from their window, not from
        // binding 1.
        all.retain(|b| spec.bindings.iter().any(|&(n, a)| n == b.binding && a.is_buffer()));
        all
    }

    /// Row-wise dispatches, one per weight chunk; experts from `indices` (or
    /// `params.fixed_expert`), live rows `min(params.rows, count[params.count_word])`, x and
    /// the weights read from `source`: x staged into uniform windows (where windows of single
    /// rows fit, see [`Windows::fit`]; each chunk then runs one dispatch per window), the weights
    /// from their texture copies (where the weights have them; one unsplit chunk). The same
    /// values, the same bits from every source.
    pub(super) fn rowwise(
        &self,
        scratch: Scratch<'_>,
        indices: Option<BufferView<'_>>,
        count: BufferView<'_>,
        source: OperandSource,
    ) -> Result<Vec<Dispatch>> {
        let ctx = scratch.ctx();
        let windows = match source {
            OperandSource::Storage => None,
            OperandSource::Window | OperandSource::Texture => {
                Windows::fit(ctx, self.params.rows, self.params.kdim, 1)
            }
        };
        let textures = match source {
            OperandSource::Texture => self.textures(ctx)?,
            OperandSource::Storage | OperandSource::Window => None,
        };
        let mut constants = self.constants();
        constants.push((Override::FastOrder, f64::from(u8::from(self.order == GemmOrder::Fast))));
        let x = match windows {
            None => RowX::Storage,
            Some(_) if ctx.capabilities().subgroups => RowX::WindowShared,
            Some(_) => RowX::Window,
        };
        let weights = if textures.is_some() {
            RowWeights::Texture
        } else if self.w.dtype.is_quantised() {
            RowWeights::Quantised
        } else if self.w.native_f16 {
            RowWeights::NativeF16
        } else {
            RowWeights::Packed
        };
        let spec = rowwise_spec(x, weights);
        let kernel = ctx.kernel(spec, &constants)?;
        let from_indices = if indices.is_some() { FLAG_EXPERT_FROM_INDICES } else { 0 };
        let placeholder = ctx.storage_scratch("no indices", 4)?;
        let no_bias = ctx.storage_scratch("no bias", 4)?;
        let indices = indices.unwrap_or_else(|| (&placeholder).into());
        let mut out = Vec::new();
        let staged = Staged::new(scratch, windows, self, &mut out)?;
        let bound_textures = texture_bindings(&textures);
        for (chunk, p) in self.weight_chunks(textures.is_some(), from_indices != 0, from_indices)? {
            for (index, span) in Staged::spans(staged.as_ref(), p.rows).into_iter().enumerate() {
                let p = Params { win_rows: span.rows, win_row0: span.row0, ..p };
                let params = ctx.uniform("gemm params", &p)?;
                let mut bindings = self.bindings(spec, &params, &no_bias, chunk);
                bindings.push(count.bind(slots::ROW_COUNT, count.size));
                bindings.push(indices.bind(slots::EXPERT_OF_ENTRY, indices.size));
                bindings.extend(staged.as_ref().map(|st| st.binding(slots::ROWWISE_WINDOW, index)));
                let lanes = x.row_lanes(p.cols);
                let grid =
                    ctx.grid(spec.groups(u64::from(span.covered(p.rows)) * lanes)?, "row-wise GEMM")?;
                // Lanes per row are at most the columns rounded up to a workgroup.
                let per_row = PerRow::Invocations(u32::try_from(lanes).unwrap_or(u32::MAX));
                let sizing = self.span_sizing(spec, span, staged.is_some(), per_row)?;
                out.push(
                    ctx.dispatch_with_textures(&kernel, &bindings, &bound_textures, grid)?.sized(sizing),
                );
            }
        }
        Ok(out)
    }
}

/// The texture copies of a pass's weights and up projection bound at 2 and 3 (none without).
fn texture_bindings(textures: &Option<[Arc<TextureWeights>; 2]>) -> Vec<TextureBinding<'_>> {
    textures
        .iter()
        .flat_map(|[w, u]| {
            [
                TextureBinding { binding: slots::W, texture: &w.texture },
                TextureBinding { binding: slots::W_UP, texture: &u.texture },
            ]
        })
        .collect()
}

/// A pass's rows and first row (`Params::rows`, `Params::row_offset`) as functions of a plan's
/// live token count.
#[derive(Clone, Copy, Debug)]
pub(super) struct LiveRows {
    rows: LiveCount,
    row_offset: LiveCount,
}

impl LiveRows {
    /// `rows` rows from row 0.
    pub(super) fn new(rows: LiveCount) -> Self {
        LiveRows { rows, row_offset: LiveCount::constant(0) }
    }

    /// The same rows from `row_offset` on.
    pub(super) fn offset(self, row_offset: LiveCount) -> Self {
        LiveRows { row_offset, ..self }
    }
}

/// How a pass's kernel covers its rows.
#[derive(Clone, Copy, Debug)]
pub(super) enum PerRow {
    /// One x workgroup per block of this many rows.
    Block(u32),
    /// This many invocations per row, in 1-D workgroups.
    Invocations(u32),
}

/// A pass's x rows staged into uniform windows: the windows and their buffer.
pub(super) struct Staged {
    windows: Windows,
    buffer: Region,
}

impl Staged {
    /// With `windows`, the windows' buffer, and the dispatch that fills it with `pass`'s input
    /// rows (found as the GEMM finds them), pushed onto `out`; None without.
    pub(super) fn new(
        scratch: Scratch<'_>,
        windows: Option<Windows>,
        pass: &Pass<'_>,
        out: &mut Vec<Dispatch>,
    ) -> Result<Option<Self>> {
        let Some(windows) = windows else {
            return Ok(None);
        };
        let ctx = scratch.ctx();
        let buffer = scratch.take(RegionSize { key: ScratchKey::X_WINDOWS, bytes: windows.bytes() })?;
        let p = Params { win_rows: windows.rows, win_stride4: windows.stride4(), ..pass.params_flagged(0) };
        let params = ctx.uniform("stage params", &p)?;
        let kernel = ctx.kernel(&STAGE, &[])?;
        let groups = STAGE.groups(u64::from(p.rows) * u64::from(p.kdim.div_ceil(4)))?;
        let live_groups = STAGE.live_groups(pass.live.rows.times(p.kdim.div_ceil(4)))?;
        let bindings = [
            Binding::new(slots::PARAMS, &params, PARAMS_BYTES),
            pass.x.bind(slots::X, pass.x.size),
            pass.rows.view().bind(slots::ROW_ENTRY, pass.rows.view().size),
            buffer.bind(slots::WINDOW, windows.bytes()),
        ];
        let grid = ctx.grid(groups, "GEMM staging")?;
        out.push(ctx.dispatch(&kernel, &bindings, grid)?.sized(pass.sizing(LiveGrid::Spilled(live_groups))));
        Ok(Some(Staged { windows, buffer }))
    }

    /// The dispatches of a pass of `rows` rows: one per window, or one for the whole pass.
    fn spans(staged: Option<&Self>, rows: u32) -> Vec<Span> {
        match staged {
            Some(st) => (0..st.windows.count)
                .map(|w| Span { row0: w * st.windows.rows, rows: st.windows.rows })
                .collect(),
            None => vec![Span { row0: 0, rows }],
        }
    }

    /// Window `index` bound at `slot` as a uniform buffer.
    fn binding(&self, slot: u32, index: usize) -> Binding<'_> {
        Binding {
            binding: slot,
            buffer: self.buffer.buffer(),
            size: WINDOW_BYTES,
            offset: self.buffer.offset() + index as u64 * self.windows.stride,
        }
    }
}
