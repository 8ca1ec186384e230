//! Whole-buffer bindings of the program: expert weights in one buffer each, the shared
//! expert's matrices packed into one ([`SharedMatrices`]).

use super::super::program::to_u32;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::gemm::ExpertWeights;
use crate::layer::MoeLayer;
use crate::pipeline::Binding;

/// The one buffer of unsplit weights.
pub(super) fn whole(w: &ExpertWeights) -> Result<&wgpu::Buffer> {
    w.whole_buffer().ok_or_else(|| Error::invalid("split expert weights have no task form"))
}

/// `buffer` bound whole at `binding`.
pub(super) fn whole_binding(binding: u32, buffer: &wgpu::Buffer) -> Binding<'_> {
    Binding::new(binding, buffer, buffer.size())
}

/// The shared expert's gate, up and down matrices copied into one buffer (a 4-byte
/// placeholder without one), and the words where the up and down matrices start.
pub(super) struct SharedMatrices {
    pub(super) buffer: wgpu::Buffer,
    pub(super) up_off: u32,
    pub(super) down_off: u32,
}

impl SharedMatrices {
    pub(super) fn pack(ctx: &Context, layer: &MoeLayer) -> Result<Self> {
        let Some((s, _)) = layer.shared_expert() else {
            let buffer = ctx.storage_scratch("moe program absent shared expert", 4)?;
            return Ok(SharedMatrices { buffer, up_off: 0, down_off: 0 });
        };
        let parts = [whole(&s.gate)?, whole(&s.up)?, whole(&s.down)?];
        let total: u64 = parts.iter().map(|b| b.size()).sum();
        let buffer = ctx.storage_scratch("moe program shared expert", total)?;
        let mut encoder = ctx.encoder("moe program shared expert copy");
        let mut at = 0;
        for part in parts {
            encoder.copy_buffer_to_buffer(part, 0, &buffer, at, part.size());
            at += part.size();
        }
        ctx.submit_and_wait(encoder)?;
        let word = |n: u64| to_u32("shared expert words", usize::try_from(n).unwrap_or(usize::MAX));
        let (gate_words, up_words) = (parts[0].size() / 4, parts[1].size() / 4);
        let (up_off, down_off) = (word(gate_words)?, word(gate_words + up_words)?);
        Ok(SharedMatrices { buffer, up_off, down_off })
    }
}
