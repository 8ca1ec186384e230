//! Expert weights read back as f32 through the kernels' own loads ([`ExpertWeights::unpack`]):
//! for checking an upload or a converted checkpoint, never part of a forward. A blocking
//! read-back, so natively only.

use bytemuck::Zeroable;

use super::params::{PARAMS_BYTES, Params};
use super::slots;
use super::specs::{UNPACK, UNPACK_QUANT};
use super::weights::ExpertWeights;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline::Binding;
use crate::shader::Override;
use crate::tensor::word_bytes;

impl ExpertWeights {
    /// The values the kernels read from these weights, `[experts, n, k]` row-major, decoded on
    /// the device by the kernels' own loads (packed words, or quantised rows; native f16 loads
    /// see the same values as packed ones) and read back: for a quantised dtype exactly [`crate::quant`]'s decoding of the stored
    /// blocks, for f16 and bf16 the widened halves. For checking an upload or a converted
    /// checkpoint; not part of a forward.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when `experts · n · k` f32 values are past one storage binding;
    /// device errors.
    pub fn unpack(&self, ctx: &Context) -> Result<Vec<f32>> {
        let len = u64::from(self.experts) * u64::from(self.n) * u64::from(self.k);
        let bytes = word_bytes(len);
        let limits = ctx.limits();
        let max = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        if bytes > max {
            return Err(Error::limit(
                "unpacked expert weights",
                bytes,
                max,
                "max_storage_buffer_binding_size",
            ));
        }
        let out = ctx.zeroed("unpacked expert weights", bytes)?;
        let spec = if self.dtype.is_quantised() { &UNPACK_QUANT } else { &UNPACK };
        let kernel = ctx.kernel(
            spec,
            &[
                (Override::Dtype, self.dtype.code()),
                (Override::NarrowScales, f64::from(u8::from(self.narrow_scales))),
            ],
        )?;
        let mut params = Vec::with_capacity(self.chunks.len());
        for chunk in &self.chunks {
            let p = Params {
                n: self.n,
                kdim: self.k,
                expert_base: chunk.experts.start,
                expert_count: chunk.experts.len() as u32,
                col_base: chunk.cols.start,
                cols: chunk.cols.len() as u32,
                ..Params::zeroed()
            };
            params.push(ctx.uniform("unpack params", &p)?);
        }
        let mut dispatches = Vec::with_capacity(self.chunks.len());
        for (chunk, p) in self.chunks.iter().zip(&params) {
            let rows = chunk.experts.len() as u64 * chunk.cols.len() as u64;
            let groups = spec.groups(rows * u64::from(self.k.div_ceil(4)))?;
            let bindings = [
                Binding::new(slots::PARAMS, p, PARAMS_BYTES),
                Binding::new(slots::W, &chunk.buffer, chunk.bytes),
                Binding::new(slots::W_UP, &chunk.buffer, chunk.bytes),
                Binding::new(slots::OUT, &out, bytes),
            ];
            dispatches.push(ctx.dispatch(&kernel, &bindings, ctx.grid(groups, "unpack weights")?)?);
        }
        ctx.run(&dispatches.iter().collect::<Vec<_>>())?;
        ctx.read_back(&out, len as usize)
    }
}
