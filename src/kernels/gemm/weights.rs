//! Expert weights on the device ([`ExpertWeights`]): upload from host values or stored
//! checkpoint bytes (whole, or streamed one expert at a time through a staging chunk), in
//! chunks past the device's binding limits (`chunk.rs`), their texture copies made on first use
//! (`texture.rs`), and reading them back. Their dtypes are `dtype.rs`'s; the FFN they form,
//! `ffn.rs`'s.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use half::{bf16, f16};

use super::chunk::{WeightChunk, chunking};
use super::dtype::WeightDtype;
use super::placement::ExpertPlacement;
use super::quantised::{NarrowScales, QuantisedValues};
use super::texture::TextureWeights;
use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::size;
use crate::sync::lock;
use crate::tensor::word_bytes;

/// Weights of `E` experts, each `[n, k]` (out x in), packed on the device: in one buffer, or
/// in chunks of whole experts (or of output columns within an expert) where the tensor is past
/// the device's storage-binding limit ([`ExpertWeights::chunk_count`]).
#[derive(Debug)]
pub struct ExpertWeights {
    pub(super) chunks: Vec<WeightChunk>,
    pub(super) dtype: WeightDtype,
    pub(super) experts: u32,
    pub(super) n: u32,
    pub(super) k: u32,
    pub(super) native_f16: bool,
    /// MXFP4 weights whose every block scale below K is in [`super::quantised::MXFP4_NARROW_SCALES`]:
    /// the kernels decode them with one product per value (`NARROW_SCALES` in
    /// wgsl/gemm/common.wgsl). False for every other dtype.
    pub(super) narrow_scales: bool,
    /// The texture copy texture variants read, made on first use: None until then, then
    /// Some(None) where the weights are past the device's texture limits.
    pub(super) texture: Mutex<Option<Option<Arc<TextureWeights>>>>,
}

/// One expert's `[n, k]` values as a file stores them.
#[derive(Clone, Copy, Debug)]
pub enum StoredValues<'a> {
    /// Little-endian elements of a float dtype (f32, f16 or bf16), `n * k` of them.
    Float {
        /// The element type of `bytes`.
        dtype: WeightDtype,
        /// `n * k` elements, little-endian.
        bytes: &'a [u8],
    },
    /// Quantised blocks of one expert (`[1, n, k]` in [`QuantisedValues`]' terms).
    Quantised(QuantisedValues<'a>),
}

impl StoredValues<'_> {
    /// The dtype the values are stored in.
    pub fn dtype(&self) -> WeightDtype {
        match self {
            StoredValues::Float { dtype, .. } => *dtype,
            StoredValues::Quantised(q) => q.dtype(),
        }
    }

    /// Checks that these are the `n * k` values of expert `e` of `[experts, n, k]`.
    pub(crate) fn check(&self, e: u32, [experts, n, k]: [u32; 3]) -> Result<()> {
        let StoredValues::Float { dtype, bytes } = *self else {
            return match self {
                StoredValues::Quantised(q) => q.check([1, n as usize, k as usize]),
                StoredValues::Float { .. } => Ok(()),
            };
        };
        let per_expert = u64::from(n) * u64::from(k);
        let want = per_expert * stored_element_bytes(dtype)? as u64;
        if bytes.len() as u64 != want {
            return Err(Error::shape(
                format!("expert {e} of [{experts}, {n}, {k}]"),
                format!("{per_expert} {dtype:?} elements ({want} bytes)"),
                format!("{} bytes", bytes.len()),
            ));
        }
        Ok(())
    }

    /// Appends rows `rows` of these `[n, k]` values to `out` as `to` lays them out on the
    /// device (f32 words, halves low half first, or quantised groups): as stored when `to` is
    /// their dtype, else rounded to nearest even for a narrower float and quantised for a
    /// quantised `to`, exactly as [`WeightDtype::pack`] does from f32 (quantised values are
    /// decoded to f32 first, by [`QuantisedValues::dequantise`]).
    fn append_as(
        &self,
        to: WeightDtype,
        [n, k]: [usize; 2],
        rows: Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let values: Vec<f32> = match *self {
            StoredValues::Float { dtype, bytes } => {
                let eb = stored_element_bytes(dtype)?;
                let bytes = &bytes[rows.start * k * eb..rows.end * k * eb];
                if dtype == to {
                    out.extend_from_slice(bytes);
                    return Ok(());
                }
                bytes
                    .chunks_exact(eb)
                    .map(|b| match dtype {
                        WeightDtype::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
                        WeightDtype::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    })
                    .collect()
            }
            StoredValues::Quantised(q) if q.dtype() == to => {
                let words = q.device_words([1, n, k])?;
                let row = to.row_words(k as u64) as usize;
                out.extend_from_slice(bytemuck::cast_slice(&words[rows.start * row..rows.end * row]));
                return Ok(());
            }
            StoredValues::Quantised(q) => q.dequantise([1, n, k])?[rows.start * k..rows.end * k].to_vec(),
        };
        match to {
            // Element by element: a row of odd length leaves half a word for the next.
            WeightDtype::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            WeightDtype::F16 => {
                values.iter().for_each(|&v| out.extend_from_slice(&f16::from_f32(v).to_le_bytes()))
            }
            WeightDtype::Bf16 => {
                values.iter().for_each(|&v| out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()))
            }
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => {
                out.extend_from_slice(bytemuck::cast_slice(&to.pack(&values, k)?));
            }
        }
        Ok(())
    }
}

/// Bytes of one stored element of `dtype`, which must be a float dtype.
fn stored_element_bytes(dtype: WeightDtype) -> Result<usize> {
    dtype.element_bytes().ok_or_else(|| {
        Error::invalid(format!(
            "expert values stored as {dtype:?} cannot be streamed as elements; stored values are f32, f16 or bf16"
        ))
    })
}

/// Host bytes [`ExpertWeights::stream`] gathers before each write to the device.
pub(crate) const STREAM_CHUNK: usize = 16 << 20;

/// Writes the whole u32 words of `pending` to `buffer` at `offset` (all of it, padded to a
/// word, when `last`; an odd half-word otherwise waits for the next expert), moves `offset` past
/// them, and waits (as `driver` says) until the device has taken them, so that the queue's
/// staging memory stays one chunk.
async fn flush_staged(
    ctx: &Context,
    buffer: &wgpu::Buffer,
    pending: &mut Vec<u8>,
    offset: &mut u64,
    last: bool,
    driver: Driver,
) -> Result<()> {
    if last {
        pending.resize(pending.len().next_multiple_of(4), 0);
    }
    let whole = pending.len() / 4 * 4;
    ctx.checked("writing expert weights", || ctx.queue().write_buffer(buffer, *offset, &pending[..whole]))?;
    *offset += whole as u64;
    pending.drain(..whole);
    ctx.submitted("expert weights upload", ctx.encoder("expert weights upload"), driver).await
}

/// The most buffers one weight tensor is split into, as f32 bytes ([`ExpertWeights`] refuses
/// shapes past it before planning its chunks): 8 TiB at a 128 MiB binding limit.
const MAX_WEIGHT_BUFFERS: u64 = 1 << 16;

impl ExpertWeights {
    /// Checks `[experts, n, k]` as `dtype`; returns its chunks for this device's limits, of the
    /// experts `placement` puts on the device (every expert without one).
    fn chunks_for(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        placement: Option<&ExpertPlacement>,
    ) -> Result<Vec<(Range<u32>, Range<u32>)>> {
        let [experts, n, k] = shape;
        if experts == 0 || n == 0 || k == 0 {
            return Err(Error::invalid(format!(
                "expert weights [{experts}, {n}, {k}] have an empty dimension"
            )));
        }
        let limits = ctx.limits();
        let limit = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size) / 4 * 4;
        // The chunk list is made before any value is read (a streamed tensor's values come
        // later): bound it, so a shape no memory holds is an error, not a list past memory.
        // f32 bytes bound every dtype's packed bytes.
        let what = format!("expert weights [{experts}, {n}, {k}]");
        let f32_bytes = size::product(&what, &[experts.into(), n.into(), k.into(), 4])?;
        let most = MAX_WEIGHT_BUFFERS.saturating_mul(limit.max(4));
        if f32_bytes > most {
            return Err(Error::limit(
                format!("{what} as f32 bytes"),
                f32_bytes,
                most,
                "65,536 buffers of max_storage_buffer_binding_size",
            ));
        }
        let plan = chunking(dtype, shape, limit)?;
        let Some(placement) = placement else {
            return Ok(plan);
        };
        if placement.experts() != experts {
            return Err(Error::invalid(format!(
                "a placement of {} experts for expert weights of {experts}",
                placement.experts()
            )));
        }
        Ok(plan
            .into_iter()
            .flat_map(|(es, cs)| placement.device_runs(es).into_iter().map(move |run| (run, cs.clone())))
            .collect())
    }

    /// `narrow_scales`: whether every MXFP4 block scale of the uploaded words is narrow.
    fn on_device(
        ctx: &Context,
        chunks: Vec<WeightChunk>,
        dtype: WeightDtype,
        shape: [u32; 3],
        narrow_scales: NarrowScales,
    ) -> Self {
        let [experts, n, k] = shape;
        ExpertWeights {
            chunks,
            dtype,
            experts,
            n,
            k,
            native_f16: dtype == WeightDtype::F16 && ctx.capabilities().shader_f16,
            narrow_scales: narrow_scales.hold(),
            texture: Mutex::new(None),
        }
    }

    /// The texture copy of these weights ([`texture`]), made on the device the first time it
    /// is asked for; None where it would be past the device's texture limits.
    pub(super) fn texture(&self, ctx: &Context) -> Result<Option<Arc<TextureWeights>>> {
        if !(0..self.experts).all(|e| self.holds(e)) {
            // Placed weights: a texture would hold rows for the host's experts too.
            return Ok(None);
        }
        let mut slot = lock(&self.texture);
        if let Some(made) = &*slot {
            return Ok(made.clone());
        }
        let made = TextureWeights::new(ctx, &self.chunks, self.dtype, self.shape())?;
        *slot = Some(made.clone());
        Ok(made)
    }

    /// Whether a texture copy of these weights is on the device (texture variants make it the
    /// first time they are planned with these weights; it takes as many bytes again as the
    /// packed weights, rows padded to whole texels).
    pub fn has_texture(&self) -> bool {
        matches!(*lock(&self.texture), Some(Some(_)))
    }

    /// Uploads `data[experts, n, k]`, rounding to `dtype`, split into as many buffers as the
    /// device's binding limit needs (see [`ExpertWeights::chunk_count`]).
    ///
    /// # Errors
    /// [`Error::Shape`] when `data` is not `experts * n * k` values; [`Error::LimitExceeded`]
    /// when a single expert matrix is past the binding limit; device errors while uploading.
    pub fn from_f32(
        ctx: &Context,
        data: &[f32],
        dtype: WeightDtype,
        experts: u32,
        n: u32,
        k: u32,
    ) -> Result<Self> {
        Self::upload_f32(ctx, data, dtype, [experts, n, k], None)
    }

    /// [`Self::from_f32`] of the experts `placement` puts on the device only (`data` holds
    /// every expert; the host's are not read): the weights keep their shape `[experts, n, k]`,
    /// the kernels skip the rows routed to experts the device does not hold
    /// ([`Self::holds`]), and no texture copy is made of them (texture kernels run as their
    /// window kernels, with the same bits).
    ///
    /// # Errors
    /// As [`Self::from_f32`]; [`Error::InvalidArgument`] for a placement of another expert
    /// count.
    pub fn from_f32_placed(
        ctx: &Context,
        data: &[f32],
        dtype: WeightDtype,
        [experts, n, k]: [u32; 3],
        placement: &ExpertPlacement,
    ) -> Result<Self> {
        Self::upload_f32(ctx, data, dtype, [experts, n, k], Some(placement))
    }

    /// [`Self::from_f32`] of the experts `placement` puts on the device (every expert without
    /// one).
    fn upload_f32(
        ctx: &Context,
        data: &[f32],
        dtype: WeightDtype,
        [experts, n, k]: [u32; 3],
        placement: Option<&ExpertPlacement>,
    ) -> Result<Self> {
        let elems = size::product(
            &format!("expert weights [{experts}, {n}, {k}]"),
            &[u64::from(experts), u64::from(n), u64::from(k)],
        )?;
        if data.len() as u64 != elems {
            return Err(Error::shape(
                "expert weights",
                format!("[{experts}, {n}, {k}] = {elems} elements"),
                data.len(),
            ));
        }
        let plan = Self::chunks_for(ctx, dtype, [experts, n, k], placement)?;
        let (n64, k64) = (n as usize, k as usize);
        Self::upload_chunks(ctx, dtype, [experts, n, k], plan, |es, cs| {
            let mut values = Vec::new();
            for e in es {
                let row0 = (e as usize * n64 + cs.start as usize) * k64;
                values.extend_from_slice(&data[row0..row0 + cs.len() * k64]);
            }
            dtype.pack(&values, k64)
        })
    }

    /// Uploads `[experts, n, k]` weights of `dtype` in the chunks of `plan` ([`Self::chunks_for`]),
    /// each chunk's device words from `words(experts, cols)`.
    fn upload_chunks(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        plan: Vec<(Range<u32>, Range<u32>)>,
        mut words: impl FnMut(Range<u32>, Range<u32>) -> Result<Vec<u32>>,
    ) -> Result<Self> {
        let mut narrow = NarrowScales::new(dtype, shape[2]);
        let mut chunks = Vec::with_capacity(plan.len());
        for (es, cs) in plan {
            let chunk = words(es.clone(), cs.clone())?;
            narrow.see(&chunk);
            chunks.push(WeightChunk {
                buffer: ctx.upload("expert weights", &chunk)?,
                experts: es,
                cols: cs,
                bytes: word_bytes(chunk.len() as u64),
            });
        }
        Ok(Self::on_device(ctx, chunks, dtype, shape, narrow))
    }

    /// Uploads `[experts, n, k]` weights a checkpoint stores quantised, as they are (no
    /// requantisation): the kernels read exactly [`QuantisedValues::dequantise`]'s values. Split
    /// across buffers as [`ExpertWeights::from_f32`] splits them.
    ///
    /// # Errors
    /// [`Error::Shape`] when a length does not match the shape; [`Error::InvalidArgument`] for
    /// Q8_0, Q4_0 or MXFP4 with K not a multiple of 32, or FP8 scale tiles that split a group
    /// of 128 along K; as [`ExpertWeights::from_f32`] for sizes and device errors.
    pub fn from_quantised(
        ctx: &Context,
        values: QuantisedValues<'_>,
        experts: u32,
        n: u32,
        k: u32,
    ) -> Result<Self> {
        let dtype = values.dtype();
        // The lengths first: the chunk plan of a shape no data holds could be past memory.
        let words = values.device_words([experts as usize, n as usize, k as usize])?;
        let plan = Self::chunks_for(ctx, dtype, [experts, n, k], None)?;
        let row = dtype.row_words(u64::from(k)) as usize;
        Self::upload_chunks(ctx, dtype, [experts, n, k], plan, |es, cs| {
            let mut chunk = Vec::with_capacity(es.len() * cs.len() * row);
            for e in es {
                let first = e as usize * n as usize + cs.start as usize;
                chunk.extend_from_slice(&words[first * row..(first + cs.len()) * row]);
            }
            Ok(chunk)
        })
    }

    /// Uploads `[experts, n, k]` expert by expert without a host copy of the whole tensor:
    /// `values(e)` gives expert `e`'s `[n, k]` values as stored (float elements or quantised
    /// blocks, for example from a memory-mapped checkpoint tensor), converted to `dtype` one
    /// expert at a time; values already in `dtype` reach the device as they are (quantised
    /// blocks regrouped into the device layout, bit for bit as
    /// [`ExpertWeights::from_quantised`] lays them out). Values converted to another dtype are
    /// decoded to f32 first. Host memory beyond the caller's is one expert's converted values
    /// plus a 16 MiB staging chunk, which is flushed to the device (and waited for, on the
    /// calling thread: [`Self::stream_async`] awaits it instead) as it fills. `released(e)` is
    /// called once expert `e` is on its way, so a caller can drop its pages. The weights are split across buffers as [`ExpertWeights::from_f32`] splits
    /// them, and are bit-identical to its on the same values.
    ///
    /// # Errors
    /// An empty dimension, a size past the device's limits (or a tensor past 65,536 buffers of
    /// the binding limit as f32, checked before any value is read), an expert whose byte length is
    /// not `n * k` elements of its dtype (or whose blocks do not match `[1, n, k]`), an error
    /// from `values`, or a device error.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn stream<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        released: impl FnMut(u32),
    ) -> Result<Self> {
        Self::stream_in_chunks(ctx, dtype, shape, values, released, STREAM_CHUNK)
    }

    /// [`Self::stream`] of the experts `placement` puts on the device only: `values` is asked
    /// for those alone, and the weights are as [`Self::from_f32_placed`] describes.
    ///
    /// # Errors
    /// As [`Self::stream`]; [`Error::InvalidArgument`] for a placement of another expert count.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn stream_placed<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        placement: &ExpertPlacement,
        values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        released: impl FnMut(u32),
    ) -> Result<Self> {
        pollster::block_on(Self::stream_with(
            ctx,
            dtype,
            shape,
            Some(placement),
            values,
            released,
            STREAM_CHUNK,
            Driver::Inline,
        ))
    }

    /// [`Self::stream`] without blocking the awaiting thread: each flush of the staging chunk
    /// is awaited (a thread of moeflow's polls the device and wakes the task).
    ///
    /// # Errors
    /// As [`Self::stream`].
    pub async fn stream_async<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        released: impl FnMut(u32),
    ) -> Result<Self> {
        Self::stream_with(ctx, dtype, shape, None, values, released, STREAM_CHUNK, Driver::Await).await
    }

    /// [`ExpertWeights::stream`] with `staging` bytes of staging.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn stream_in_chunks<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        released: impl FnMut(u32),
        staging: usize,
    ) -> Result<Self> {
        pollster::block_on(Self::stream_with(
            ctx,
            dtype,
            shape,
            None,
            values,
            released,
            staging,
            Driver::Inline,
        ))
    }

    /// [`ExpertWeights::stream`] of the experts `placement` puts on the device (every expert
    /// without one) with `staging` bytes of staging, its flushes waited for as `driver` says.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn stream_with<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        placement: Option<&ExpertPlacement>,
        mut values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        mut released: impl FnMut(u32),
        staging: usize,
        driver: Driver,
    ) -> Result<Self> {
        let [_, n, k] = shape;
        let plan = Self::chunks_for(ctx, dtype, shape, placement)?;
        let mut pending: Vec<u8> = Vec::with_capacity(staging + 4);
        let mut narrow = NarrowScales::new(dtype, k);
        let mut chunks = Vec::with_capacity(plan.len());
        for (es, cs) in plan {
            let rows = u64::from(es.end - es.start) * cs.len() as u64;
            let bytes = dtype.packed_bytes(rows, u64::from(k));
            let buffer = ctx.zeroed("expert weights", bytes)?;
            let mut offset = 0u64;
            for e in es.clone() {
                let v = values(e)?;
                v.check(e, shape)?;
                let from = pending.len();
                v.append_as(
                    dtype,
                    [n as usize, k as usize],
                    cs.start as usize..cs.end as usize,
                    &mut pending,
                )?;
                // Quantised rows are whole words: `pending` holds no half word before them.
                narrow.see_bytes(&pending[from..]);
                if cs.end == n {
                    released(e);
                }
                if pending.len() >= staging {
                    flush_staged(ctx, &buffer, &mut pending, &mut offset, false, driver).await?;
                }
            }
            flush_staged(ctx, &buffer, &mut pending, &mut offset, true, driver).await?;
            chunks.push(WeightChunk { buffer, experts: es, cols: cs, bytes });
        }
        Ok(Self::on_device(ctx, chunks, dtype, shape, narrow))
    }

    /// Whether these are MXFP4 weights whose every block scale (below K) is 2^-125 ..= 2^125
    /// (E8M0 bytes 2 ..= 252; what [`crate::quant::mxfp4_quantize`] gives every block whose
    /// largest magnitude is 2^-123 or more), which the kernels decode with one exact f32 product
    /// per value: twice the FP4 magnitude, an integer up to 12, times 2^(s - 128). Other MXFP4
    /// weights take the bit-by-bit decoding that is exact under every scale. Both give
    /// [`crate::quant::mxfp4_dequantize`]'s values bit for bit. False for other dtypes.
    pub fn narrow_scales(&self) -> bool {
        self.narrow_scales
    }

    /// How many buffers (storage bindings) hold these weights: 1 unless they are past the
    /// device's `max_storage_buffer_binding_size` (or `max_buffer_size`). Split weights run
    /// one dispatch per chunk in every path, with the same results bit for bit.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Chooses native f16 loads (the default for f16 weights where the device has
    /// shader-f16) or the packed integer unpacking; both see the same values. Asking for
    /// native loads without shader-f16, or for non-f16 weights, is an error.
    ///
    /// # Errors
    /// [`Error::MissingFeature`] without shader-f16; [`Error::InvalidArgument`] for weights
    /// that are not f16.
    pub fn with_native_f16(mut self, ctx: &Context, on: bool) -> Result<Self> {
        if on && !ctx.capabilities().shader_f16 {
            return Err(Error::MissingFeature("native f16 weights need the shader-f16 feature".into()));
        }
        if on && self.dtype != WeightDtype::F16 {
            return Err(Error::invalid(format!(
                "native f16 loads need f16 weights, these are {:?}",
                self.dtype
            )));
        }
        self.native_f16 = on;
        Ok(self)
    }

    /// Whether the kernels load these weights as native f16.
    pub fn native_f16(&self) -> bool {
        self.native_f16
    }

    /// The one buffer holding every weight, as packed words; None when the weights are split
    /// into chunks ([`Self::chunk_count`] above 1).
    #[cfg(feature = "dag")]
    pub(crate) fn whole_buffer(&self) -> Option<&wgpu::Buffer> {
        match self.chunks.as_slice() {
            [only] => Some(&only.buffer),
            _ => None,
        }
    }

    /// Storage dtype.
    pub fn dtype(&self) -> WeightDtype {
        self.dtype
    }

    /// Bytes of device memory the weights take, packed (the texture copy, where made, not
    /// counted).
    pub fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.bytes).sum()
    }

    /// Whether the device holds expert `e` (every expert, unless the weights were placed:
    /// [`Self::from_f32_placed`], [`Self::stream_placed`]).
    pub fn holds(&self, e: u32) -> bool {
        let cols: u64 =
            self.chunks.iter().filter(|c| c.experts.contains(&e)).map(|c| c.cols.len() as u64).sum();
        cols == u64::from(self.n)
    }

    /// `[experts, n, k]`.
    pub fn shape(&self) -> [u32; 3] {
        [self.experts, self.n, self.k]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;

    use crate::context::test_contexts as contexts;

    fn stored(dtype: WeightDtype, values: &[f32], k: usize) -> Vec<u8> {
        let eb = dtype.element_bytes().expect("a float dtype");
        bytemuck::cast_slice(&dtype.pack(values, k).expect("pack"))
            .iter()
            .copied()
            .take(values.len() * eb)
            .collect()
    }

    /// Quantised blocks streamed one expert at a time hold `from_quantised`'s words when kept
    /// in their format (through a staging chunk of a few bytes), and `from_f32`'s words of
    /// their decoded values when converted.
    #[test]
    fn streamed_quantised_blocks_are_the_words_of_from_quantised() {
        let ctxs = contexts();
        let (e, n, k) = (3usize, 5usize, 160usize);
        let values: Vec<f32> = (0..e * n * k).map(|i| (i as f32 * 0.391).sin() * 2.0 - 0.25).collect();
        let q8 = quant::q8_0_quantize(&values).expect("q8_0");
        let q4 = quant::q4_0_quantize(&values).expect("q4_0");
        let (codes, scales) = quant::mxfp4_quantize(&values).expect("mxfp4");
        let block = [2, 128];
        let per_expert: Vec<(Vec<u8>, Vec<f32>)> = (0..e)
            .map(|i| {
                quant::fp8_block_quantize(&values[i * n * k..(i + 1) * n * k], [n, k], block).expect("fp8")
            })
            .collect();
        let fp8_bytes: Vec<u8> = per_expert.iter().flat_map(|(w, _)| w.clone()).collect();
        let fp8_scales: Vec<f32> = per_expert.iter().flat_map(|(_, s)| s.clone()).collect();
        let whole = [
            QuantisedValues::Q8_0(&q8),
            QuantisedValues::Q4_0(&q4),
            QuantisedValues::Mxfp4 { codes: &codes, scales: &scales },
            QuantisedValues::Fp8 { weight: &fp8_bytes, scale_inv: &fp8_scales, block },
        ];
        /// Expert `i` of `q`, `[1, n, k]` (`rows` blocks of 32 values).
        fn expert<'a>(
            q: QuantisedValues<'a>,
            fp8: &'a [(Vec<u8>, Vec<f32>)],
            rows: usize,
            i: usize,
        ) -> StoredValues<'a> {
            let part = |b: &'a [u8], per: usize| &b[i * per..(i + 1) * per];
            StoredValues::Quantised(match q {
                QuantisedValues::Q8_0(b) => QuantisedValues::Q8_0(part(b, rows * quant::Q8_0_BLOCK_BYTES)),
                QuantisedValues::Q4_0(b) => QuantisedValues::Q4_0(part(b, rows * quant::Q4_0_BLOCK_BYTES)),
                QuantisedValues::Mxfp4 { codes, scales } => QuantisedValues::Mxfp4 {
                    codes: part(codes, rows * quant::MXFP4_BLOCK_BYTES),
                    scales: part(scales, rows),
                },
                QuantisedValues::Fp8 { block, .. } => {
                    QuantisedValues::Fp8 { weight: &fp8[i].0, scale_inv: &fp8[i].1, block }
                }
            })
        }
        let shape = [e as u32, n as u32, k as u32];
        for ctx in &ctxs {
            let words = |w: &ExpertWeights| -> Vec<Vec<u32>> {
                w.chunks
                    .iter()
                    .map(|c| ctx.read_back::<u32>(&c.buffer, c.bytes as usize / 4).expect("read"))
                    .collect()
            };
            for q in &whole {
                let stored: Vec<StoredValues<'_>> =
                    (0..e).map(|i| expert(*q, &per_expert, n * k / quant::BLOCK_VALUES, i)).collect();
                let want =
                    ExpertWeights::from_quantised(ctx, *q, shape[0], shape[1], shape[2]).expect("whole");
                let got = ExpertWeights::stream_in_chunks(
                    ctx,
                    q.dtype(),
                    shape,
                    |i| Ok(stored[i as usize]),
                    |_| {},
                    6,
                )
                .expect("streamed");
                assert_eq!(words(&got), words(&want), "{:?} as stored", q.dtype());
                assert_eq!(got.narrow_scales(), q.dtype() == WeightDtype::Mxfp4, "{:?}", q.dtype());
                assert_eq!(want.narrow_scales(), got.narrow_scales(), "{:?}", q.dtype());
                let decoded = q.dequantise([e, n, k]).expect("decode");
                let want =
                    ExpertWeights::from_f32(ctx, &decoded, WeightDtype::F16, shape[0], shape[1], shape[2])
                        .expect("from_f32");
                let got =
                    ExpertWeights::stream(ctx, WeightDtype::F16, shape, |i| Ok(stored[i as usize]), |_| {})
                        .expect("converted");
                assert_eq!(words(&got), words(&want), "{:?} to f16", q.dtype());
            }
            // One scale outside 2 ..= 252, in the last expert's last block: neither upload
            // decodes these weights with the narrow product.
            let mut wide = scales.clone();
            *wide.last_mut().expect("scales") = 1;
            let q = QuantisedValues::Mxfp4 { codes: &codes, scales: &wide };
            let stored: Vec<StoredValues<'_>> =
                (0..e).map(|i| expert(q, &per_expert, n * k / quant::BLOCK_VALUES, i)).collect();
            let streamed =
                ExpertWeights::stream_in_chunks(ctx, q.dtype(), shape, |i| Ok(stored[i as usize]), |_| {}, 6)
                    .expect("streamed");
            let whole = ExpertWeights::from_quantised(ctx, q, shape[0], shape[1], shape[2]).expect("whole");
            assert!(!streamed.narrow_scales() && !whole.narrow_scales());
            // Blocks that do not match one expert's [n, k] are an error.
            let err = ExpertWeights::stream(
                ctx,
                WeightDtype::Q8_0,
                shape,
                |_| Ok(StoredValues::Quantised(QuantisedValues::Q8_0(&q8))),
                |_| {},
            )
            .expect_err("three experts' blocks as one");
            assert!(err.to_string().contains("Q8_0 bytes"), "{err}");
        }
    }

    /// Streamed uploads hold the same words as `from_f32`, whatever the staging chunk (down to
    /// a few bytes, so writes split inside experts and inside words), the element count's
    /// parity, and the conversion between stored and device dtypes (quantised ones included,
    /// from finite values).
    #[test]
    fn streamed_weights_are_the_packed_words_of_from_f32() {
        let ctxs = contexts();
        let dtypes = [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16];
        let quantised = [WeightDtype::Q8_0, WeightDtype::Q4_0, WeightDtype::Mxfp4, WeightDtype::Fp8];
        for ctx in &ctxs {
            for (shape, with_inf) in [[3u32, 5, 7], [4, 6, 8], [1, 1, 1], [2, 3, 67]]
                .into_iter()
                .flat_map(|s| [(s, true), (s, false)])
            {
                let [e, n, k] = shape;
                let len = (e * n * k) as usize;
                // Values that round differently in f16 and bf16, with ±0, subnormals and inf.
                let values: Vec<f32> = (0..len)
                    .map(|i| match i % 7 {
                        0 => -0.0,
                        1 => 1.0e-40,
                        2 if with_inf => f32::INFINITY,
                        2 => 65504.0,
                        _ => (i as f32 * 0.7313).sin() * 3.0 + 1.0 / 3.0,
                    })
                    .collect();
                for from in dtypes {
                    let file = stored(from, &values, k as usize);
                    let per = (n * k) as usize * from.element_bytes().expect("a float dtype");
                    let finite = values.iter().all(|v| v.is_finite());
                    let targets = dtypes.iter().chain(if finite { &quantised[..] } else { &[] });
                    for &to in targets {
                        let rounded = from.round(&values, k as usize).expect("round");
                        let want = ExpertWeights::from_f32(ctx, &rounded, to, e, n, k).expect("from_f32");
                        let want = ctx
                            .read_back::<u32>(&want.chunks[0].buffer, want.chunks[0].bytes as usize / 4)
                            .expect("read");
                        for chunk in [2usize, 6, 1 << 20] {
                            let mut released = Vec::new();
                            let got = ExpertWeights::stream_in_chunks(
                                ctx,
                                to,
                                shape,
                                |i| {
                                    Ok(StoredValues::Float {
                                        dtype: from,
                                        bytes: &file[i as usize * per..(i as usize + 1) * per],
                                    })
                                },
                                |i| released.push(i),
                                chunk,
                            )
                            .expect("stream");
                            assert_eq!(got.shape(), shape);
                            assert_eq!(got.dtype(), to);
                            let got = ctx.read_back::<u32>(&got.chunks[0].buffer, want.len()).expect("read");
                            assert_eq!(got, want, "{shape:?} {from:?} -> {to:?}, chunk {chunk}");
                            assert_eq!(released, (0..e).collect::<Vec<_>>());
                        }
                    }
                }
                // A stored expert of the wrong length is an error naming the expert.
                let err = ExpertWeights::stream(
                    ctx,
                    WeightDtype::F16,
                    shape,
                    |_| Ok(StoredValues::Float { dtype: WeightDtype::F16, bytes: &[0u8; 2] }),
                    |_| {},
                );
                if len > 1 {
                    let err = err.expect_err("short expert").to_string();
                    assert!(err.contains("expert 0 of"), "{err}");
                }
            }
        }
    }
}
