//! Texture copies of expert weights, read by the texture variants of the block kernels
//! ([`GemmVariant::Texture`](super::GemmVariant::Texture), `wgsl/gemm/weights_texture.wgsl`).
//!
//! Layout: one texture row per weight row (row `r = expert * N + column` of `[E, N, K]`), its K
//! elements in `Rgba32Uint` texels of four words, zeros past K: `ceil(K / 4)` texels of four f32
//! words, or for f16 and bf16 `ceil(K / 8)` texels of eight halves (two per word, low half
//! first), so a 16-bit row takes half the texel loads of an f32 one. Rows
//! fill `layers = max(2, ceil(E * N / max_texture_dimension_2d))` layers of
//! `height = ceil(E * N / layers)` rows, row `r` at `y = r % height` in layer `r / height`. The words are the packed buffers' words, copied on
//! the device (`wgsl/gemm/pack_texture.wgsl`, then a buffer-to-texture copy), so a kernel sees
//! the same values from either. The copy is made once per `ExpertWeights`, the first time a
//! texture variant is planned with them, and kept beside the buffers (it doubles the device
//! memory the weights take).

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};

use super::chunk::WeightChunk;
use super::dtype::WeightDtype;
use crate::context::{Context, KeyLimits};
use crate::error::Result;
use crate::gpu::record;
use crate::pipeline::{Access, Binding, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};
use crate::tensor::word_bytes;

pub(super) static PACK_SHADER: ShaderSource = ShaderSource {
    name: "gemm/pack_texture",
    parts: &[wgsl!("gemm/pack_texture.wgsl")],
    entry_points: &["pack"],
    indexing: Indexing::Checked,
};

pub(super) static PACK: KernelSpec = KernelSpec {
    shader: &PACK_SHADER,
    entry: "pack",
    bindings: &[(0, Access::Uniform), (1, Access::Read), (2, Access::ReadWrite)],
    params_bytes: std::mem::size_of::<PackParams>() as u64,
    workgroup: Workgroup::Fixed(64),
};

/// `PackParams` of pack_texture.wgsl.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct PackParams {
    rows: u32,
    src_row0: u32,
    kdim: u32,
    row_words: u32,
    pitch_words: u32,
    halves: u32,
}

/// Bytes between rows of a buffer-to-texture copy must be a multiple of this.
const COPY_ROW_ALIGN: u64 = wgpu::COPY_BYTES_PER_ROW_ALIGNMENT as u64;

/// The extent of the texture copy of `[experts, n, k]` weights of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TextureLayout {
    /// Texels per row: `ceil(K / 4)` (f32) or `ceil(K / 8)` (16-bit).
    pub width: u32,
    /// Rows per layer.
    pub height: u32,
    /// Array layers.
    pub layers: u32,
}

impl TextureLayout {
    /// The layout of `[experts, n, k]` weights of `dtype` within `limits`, or None where a row
    /// is wider than a texture, the rows need more layers than a texture array has, or the
    /// weights are quantised.
    pub fn of(dtype: WeightDtype, [experts, n, k]: [u32; 3], limits: &KeyLimits) -> Option<Self> {
        let width = match dtype {
            WeightDtype::F32 => k.div_ceil(4),
            WeightDtype::F16 | WeightDtype::Bf16 => k.div_ceil(8),
            // Quantised groups have no texel layout yet: texture variants run as window blocks.
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => return None,
        };
        let max = limits.max_texture_dimension_2d;
        let rows = u64::from(experts) * u64::from(n);
        if width == 0 || width > max || rows == 0 {
            return None;
        }
        // At least two layers: wgpu's GL back end makes a one-layer texture a plain 2-D one,
        // which cannot be bound as an array. Rows are spread evenly over the layers.
        let layers = rows.div_ceil(u64::from(max)).max(2);
        let height = rows.div_ceil(layers);
        if layers > u64::from(limits.max_texture_array_layers) {
            return None;
        }
        // Both fit in u32: height <= max, layers <= max_texture_array_layers.
        Some(TextureLayout { width, height: height as u32, layers: layers as u32 })
    }
}

/// The texel format of every weight texture: four u32 words.
const FORMAT: wgpu::TextureFormat = wgpu::TextureFormat::Rgba32Uint;
/// u32 words per texel of [`FORMAT`].
const TEXEL_WORDS: u32 = 4;

/// The texture copy of one projection's weights.
#[derive(Debug)]
pub(crate) struct TextureWeights {
    pub texture: wgpu::Texture,
}

impl TextureWeights {
    /// Makes the texture copy of `[experts, n, k]` weights of `dtype` held in `chunks` on the
    /// device (one submission, not waited for), or None where its layout is past the device's
    /// texture limits ([`TextureLayout::of`]).
    pub fn new(
        ctx: &Context,
        chunks: &[WeightChunk],
        dtype: WeightDtype,
        [experts, n, k]: [u32; 3],
    ) -> Result<Option<Arc<Self>>> {
        let Some(layout) = TextureLayout::of(dtype, [experts, n, k], &ctx.limits()) else {
            return Ok(None);
        };
        let texture = ctx.checked("expert weight texture", || {
            ctx.device().create_texture(&wgpu::TextureDescriptor {
                label: Some("expert weight texture"),
                size: wgpu::Extent3d {
                    width: layout.width,
                    height: layout.height,
                    depth_or_array_layers: layout.layers,
                },
                mip_level_count: 1,
                sample_count: 1,
                dimension: wgpu::TextureDimension::D2,
                format: FORMAT,
                usage: wgpu::TextureUsages::TEXTURE_BINDING
                    | wgpu::TextureUsages::COPY_DST
                    | wgpu::TextureUsages::COPY_SRC,
                view_formats: &[],
            })
        })?;
        // Four u32 per texel.
        ctx.note_allocation(
            u64::from(layout.width) * u64::from(layout.height) * u64::from(layout.layers) * 16,
        );
        let row_words = layout.width * TEXEL_WORDS;
        let pitch = word_bytes(u64::from(row_words)).next_multiple_of(COPY_ROW_ALIGN);
        // Rows packed per copy: a layer's, at most as many as one storage binding holds.
        let batch = (ctx.limits().max_storage_buffer_binding_size.min(ctx.limits().max_buffer_size) / pitch)
            .clamp(1, u64::from(layout.height));
        let scratch = ctx.storage_scratch("expert weight texture rows", batch * pitch)?;
        let kernel = ctx.kernel(&PACK, &[])?;
        let mut encoder = ctx.encoder("expert weight texture");
        let height = u64::from(layout.height);
        for chunk in chunks {
            // A chunk's rows are consecutive weight rows: whole experts, or columns of one.
            let first = u64::from(chunk.experts.start) * u64::from(n) + u64::from(chunk.cols.start);
            let rows = u64::from(chunk.experts.end - chunk.experts.start) * chunk.cols.len() as u64;
            let mut done = 0u64;
            while done < rows {
                let row = first + done;
                let count = batch.min(height - row % height).min(rows - done);
                // Every count and row index below is under the texture's u32 extent or a
                // chunk's u32 row count.
                let params = PackParams {
                    rows: count as u32,
                    src_row0: done as u32,
                    kdim: k,
                    row_words,
                    pitch_words: (pitch / 4) as u32,
                    halves: u32::from(dtype != WeightDtype::F32),
                };
                let params = ctx.uniform("pack params", &params)?;
                let bindings = [
                    Binding::new(0, &params, PACK.params_bytes),
                    Binding::new(1, &chunk.buffer, chunk.bytes),
                    Binding::new(2, &scratch, count * pitch),
                ];
                let groups = PACK.groups(count * u64::from(row_words))?;
                let pack = ctx.dispatch(&kernel, &bindings, ctx.grid(groups, "weight texture packing")?)?;
                record(&mut encoder, &[&pack]);
                encoder.copy_buffer_to_texture(
                    wgpu::TexelCopyBufferInfo {
                        buffer: &scratch,
                        layout: wgpu::TexelCopyBufferLayout {
                            offset: 0,
                            bytes_per_row: Some(pitch as u32),
                            rows_per_image: Some(count as u32),
                        },
                    },
                    wgpu::TexelCopyTextureInfo {
                        texture: &texture,
                        mip_level: 0,
                        origin: wgpu::Origin3d { x: 0, y: (row % height) as u32, z: (row / height) as u32 },
                        aspect: wgpu::TextureAspect::All,
                    },
                    wgpu::Extent3d { width: layout.width, height: count as u32, depth_or_array_layers: 1 },
                );
                done += count;
            }
        }
        // Queued, not waited for: later submissions on the queue see the copy, and wgpu keeps
        // the staging rows alive until it is done.
        ctx.checked("expert weight texture copy", || ctx.queue().submit([encoder.finish()]))?;
        Ok(Some(Arc::new(TextureWeights { texture })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(dim: u32, layers: u32) -> KeyLimits {
        KeyLimits {
            max_storage_buffer_binding_size: 1 << 27,
            max_buffer_size: 1 << 28,
            max_compute_workgroup_storage_size: 16384,
            max_compute_invocations_per_workgroup: 256,
            max_compute_workgroups_per_dimension: 65535,
            max_storage_buffers_per_shader_stage: 8,
            max_uniform_buffer_binding_size: 65536,
            min_uniform_buffer_offset_alignment: 256,
            max_sampled_textures_per_shader_stage: 16,
            max_texture_dimension_2d: dim,
            max_texture_array_layers: layers,
        }
    }

    #[test]
    fn layouts_hold_every_row_in_at_least_two_layers() {
        for (shape, dim, layers) in [
            ([1u32, 1u32, 1u32], 8192u32, 256u32),
            ([16, 1024, 512], 8192, 256),
            ([4, 71, 999], 256, 256),
            ([4, 999, 71], 256, 16),
            ([256, 2048, 7168], 8192, 256),
        ] {
            let l = TextureLayout::of(WeightDtype::Bf16, shape, &limits(dim, layers)).unwrap();
            let rows = u64::from(shape[0]) * u64::from(shape[1]);
            assert_eq!(l.width, shape[2].div_ceil(8), "{shape:?}");
            assert!(l.layers >= 2 && l.layers <= layers, "{shape:?}: {l:?}");
            assert!(l.height <= dim, "{shape:?}: {l:?}");
            assert!(u64::from(l.height) * u64::from(l.layers) >= rows, "{shape:?}: {l:?}");
            // No layer is left empty (but for one row, which still gets two layers): the rows
            // are spread evenly.
            assert!(rows == 1 || u64::from(l.height) * u64::from(l.layers - 1) < rows, "{shape:?}: {l:?}");
        }
        let f32 = TextureLayout::of(WeightDtype::F32, [2, 3, 5], &limits(8192, 256)).unwrap();
        assert_eq!(f32.width, 2);
        assert_eq!(TextureLayout::of(WeightDtype::F16, [2, 3, 17], &limits(8192, 256)).unwrap().width, 3);
        assert!(TextureLayout::of(WeightDtype::Q4_0, [2, 3, 64], &limits(8192, 256)).is_none());
    }

    #[test]
    fn layouts_past_the_limits_are_none() {
        // Rows wider than a texture.
        assert!(TextureLayout::of(WeightDtype::F32, [1, 4, 4 * 257], &limits(256, 256)).is_none());
        // More layers than an array holds (and one layer is never enough).
        assert!(TextureLayout::of(WeightDtype::F32, [16, 256, 64], &limits(256, 15)).is_none());
        assert!(TextureLayout::of(WeightDtype::F32, [1, 1, 4], &limits(256, 1)).is_none());
        assert!(TextureLayout::of(WeightDtype::F32, [16, 256, 64], &limits(256, 16)).is_some());
    }
}
