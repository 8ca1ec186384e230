//! A pass's dispatches: per weight chunk and per x window, by a block GEMM variant or the
//! row-wise kernel, with the staging of x rows into the windows (`windows.rs`) and the texture
//! copies of the weights bound where a variant reads them.

use std::sync::Arc;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::gemm::params::{FLAG_EXPERT_FROM_INDICES, FLAG_EXPERT_FROM_TILES, PARAMS_BYTES, Params};
use crate::kernels::gemm::slots;
use crate::kernels::gemm::specs::{RowWeights, RowX, STAGE, WINDOW_BYTES, WeightLoads, rowwise_spec, spec};
use crate::kernels::gemm::texture::TextureWeights;
use crate::kernels::gemm::variant::{GemmOrder, GemmVariant, OperandSource};
use crate::kernels::gemm::windows::{Span, Windows};
use crate::live::LiveGrid;
use crate::pipeline::{Binding, BufferView, Dispatch, KernelSpec, TextureBinding};
use crate::shader::Override;
use crate::workspace::{Region, RegionSize, Scratch, ScratchKey};

use super::{Pass, PerRow};

impl<'a> Pass<'a> {
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
    /// check ([`crate::kernels::gemm::check_on_device`]); its verdict is looked up, never run,
    /// here.
    pub(in crate::kernels::gemm) fn gemm(
        &self,
        scratch: Scratch<'_>,
        variant: GemmVariant,
        tiles: Option<BufferView<'_>>,
    ) -> Result<Vec<Dispatch>> {
        if let GemmVariant::CoopF16(b) = variant {
            crate::kernels::gemm::coop::passed(scratch.ctx(), b)?;
        }
        self.gemm_unchecked(scratch, variant, tiles)
    }

    /// [`Self::gemm`] without the cooperative-matrix verdict: for the device check's own plan.
    pub(in crate::kernels::gemm) fn gemm_unchecked(
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
    pub(in crate::kernels::gemm) fn rowwise(
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

/// A pass's x rows staged into uniform windows: the windows and their buffer.
struct Staged {
    windows: Windows,
    buffer: Region,
}

impl Staged {
    /// With `windows`, the windows' buffer, and the dispatch that fills it with `pass`'s input
    /// rows (found as the GEMM finds them), pushed onto `out`; None without.
    fn new(
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
