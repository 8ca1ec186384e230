//! Planning a combine: validating its buffers against the sizes and limits, binding them to
//! each kernel's slots, and the one-launch or sequential dispatches; the zero fill of dropped
//! entries' rows.

use std::mem::offset_of;

use super::buffers::{CombineBuffers, CombineMode};
use super::specs::{ADD_SCALED, ADD_SHARED, CLEAR_ROW, COMBINE, FILL_ZERO, PARAMS_BYTES, Params};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::live::{LiveCount, LiveGrid, Sizing};
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::Access::{Read, ReadWrite};
use crate::pipeline::{Binding, BufferView, Dispatch, KernelSpec};
use crate::shader::Override;
use crate::size;
use crate::tensor::word_bytes;

struct Bound<'a> {
    params: wgpu::Buffer,
    /// Bound in place of the shared rows and of the gate logits where there are none (two
    /// buffers: WebGPU refuses two writable bindings of one range in a dispatch).
    placeholders: [wgpu::Buffer; 2],
    bufs: CombineBuffers<'a>,
    t: u64,
    h: u64,
    k: u64,
}

impl Bound<'_> {
    /// The buffers of `spec`'s bindings (see wgsl/combine/combine.wgsl), its parameters at
    /// `offset` of the parameter buffer.
    fn bindings(&self, spec: &KernelSpec, offset: u64) -> Result<Vec<Binding<'_>>> {
        let shared = self.bufs.shared;
        spec.bindings
            .iter()
            .map(|&(b, _)| {
                Ok(match b {
                    0 => Binding { binding: 0, buffer: &self.params, size: PARAMS_BYTES, offset },
                    1 => self.bufs.weights.bind(1, word_bytes(self.t * self.k)),
                    2 => self.bufs.partial.bind(2, word_bytes(self.t * self.k * self.h)),
                    3 => match shared {
                        Some(s) => s.rows.bind(3, word_bytes(self.t * self.h)),
                        None => Binding::new(3, &self.placeholders[0], 4),
                    },
                    4 => match shared.and_then(|s| s.gate_logits) {
                        Some(g) => g.bind(4, word_bytes(self.t)),
                        None => Binding::new(4, &self.placeholders[1], 4),
                    },
                    5 => self.bufs.y.bind(5, word_bytes(self.t * self.h)),
                    other => {
                        return Err(Error::invalid(format!("the combine has no buffer for binding {other}")));
                    }
                })
            })
            .collect()
    }
}

fn constants(bufs: &CombineBuffers<'_>) -> [(Override, f64); 2] {
    let b = |v: bool| f64::from(u8::from(v));
    [
        (Override::HasShared, b(bufs.shared.is_some())),
        (Override::SharedGated, b(bufs.shared.is_some_and(|s| s.gate_logits.is_some()))),
    ]
}

/// The buffers bound in place of absent shared rows and gate logits.
fn placeholders(ctx: &Context) -> Result<[wgpu::Buffer; 2]> {
    Ok([ctx.storage_scratch("no shared rows", 4)?, ctx.storage_scratch("no shared gate", 4)?])
}

fn check(
    ctx: &Context,
    tokens: u32,
    hidden: u32,
    k: u32,
    bufs: &CombineBuffers<'_>,
) -> Result<(u64, u64, u64)> {
    if hidden == 0 || k == 0 {
        return Err(Error::invalid(format!(
            "combine needs hidden >= 1 and k >= 1, got hidden = {hidden}, k = {k}"
        )));
    }
    let (t, h, kk) = (u64::from(tokens), u64::from(hidden), u64::from(k));
    let partial = size::product("combine's partial rows (tokens * k * hidden)", &[t, kk, h])?;
    if partial > u64::from(u32::MAX) {
        return Err(Error::limit("tokens * k * hidden", partial, u32::MAX.into(), "u32 shader indices"));
    }
    ctx.check_view("weights", &bufs.weights, word_bytes(t * kk), Read)?;
    ctx.check_view("partial", &bufs.partial, word_bytes(partial), Read)?;
    ctx.check_view("y", &bufs.y, word_bytes(t * h), ReadWrite)?;
    let mut views = vec![
        ("weights", bufs.weights, Use::Read),
        ("partial", bufs.partial, Use::Read),
        ("y", bufs.y, Use::Write),
    ];
    if let Some(s) = bufs.shared {
        ctx.check_view("shared", &s.rows, word_bytes(t * h), Read)?;
        views.push(("shared", s.rows, Use::Read));
        if let Some(g) = s.gate_logits {
            ctx.check_view("shared gate logits", &g, word_bytes(t), Read)?;
            views.push(("shared gate logits", g, Use::Read));
        }
    }
    check_disjoint(&views)?;
    Ok((t, h, kk))
}

/// Plans the combine for `tokens` tokens in `mode`.
///
/// # Errors
/// [`Error::Shape`] for a buffer smaller than its shape; [`Error::LimitExceeded`] for
/// sizes past u32 indices or the adapter's limits; device errors while building pipelines.
pub fn plan_combine(
    ctx: &Context,
    tokens: u32,
    hidden: u32,
    k: u32,
    bufs: &CombineBuffers<'_>,
    mode: CombineMode,
) -> Result<Vec<Dispatch>> {
    let (t, h, kk) = check(ctx, tokens, hidden, k, bufs)?;
    if tokens == 0 {
        return Ok(Vec::new());
    }
    let consts = constants(bufs);
    let base = Params { tokens, hidden, k, ..Params::default() };
    match mode {
        CombineMode::OneLaunch => {
            let bound = Bound {
                params: ctx.uniform("combine params", &base)?,
                placeholders: placeholders(ctx)?,
                bufs: *bufs,
                t,
                h,
                k: kk,
            };
            let kernel = ctx.kernel(&COMBINE, &consts)?;
            let grid = ctx.grid(COMBINE.groups(t * h)?, "combine")?;
            let live = LiveCount::tokens();
            let sizing = Sizing::new(LiveGrid::Spilled(COMBINE.live_groups(live.times(hidden))?))
                .field(offset_of!(Params, tokens), live.value());
            Ok(vec![ctx.dispatch(&kernel, &bound.bindings(&COMBINE, 0)?, grid)?.sized(sizing)])
        }
        CombineMode::Sequential => {
            // One 256-byte slot of parameters per step, each bound at its own offset.
            let stride =
                u64::from(ctx.device().limits().min_uniform_buffer_offset_alignment).max(PARAMS_BYTES);
            let mut steps: Vec<(&'static KernelSpec, Params)> = Vec::new();
            for token in 0..tokens {
                steps.push((&CLEAR_ROW, Params { token, ..base }));
                for slot in 0..k {
                    steps.push((&ADD_SCALED, Params { token, slot, ..base }));
                }
                if bufs.shared.is_some() {
                    steps.push((&ADD_SHARED, Params { token, ..base }));
                }
            }
            let mut bytes = vec![0u8; steps.len() * stride as usize];
            for (i, (_, p)) in steps.iter().enumerate() {
                let at = i * stride as usize;
                bytes[at..at + PARAMS_BYTES as usize].copy_from_slice(bytemuck::bytes_of(p));
            }
            let params = ctx.uniform_bytes("sequential combine params", &bytes)?;
            let bound = Bound { params, placeholders: placeholders(ctx)?, bufs: *bufs, t, h, k: kk };
            // One workgroup row over the hidden size (fits in u32: at most 2^32 / 64 groups).
            let groups = [CLEAR_ROW.groups(hidden.into())? as u32, 1, 1];
            steps
                .iter()
                .enumerate()
                .map(|(i, (spec, p))| {
                    let kernel = ctx.kernel(spec, &consts)?;
                    // A token's steps run once the live count holds it.
                    let sizing = Sizing::new(LiveGrid::Fixed).only_for(p.token + 1..=u32::MAX);
                    Ok(ctx
                        .dispatch(&kernel, &bound.bindings(spec, i as u64 * stride)?, groups)?
                        .sized(sizing))
                })
                .collect()
        }
    }
}

/// Zero-fills the first `elems` floats of `buf` (rows of dropped entries must read as 0).
///
/// # Errors
/// [`Error::Shape`] for a buffer smaller than `elems` floats; [`Error::LimitExceeded`]
/// past the adapter's limits.
pub fn plan_fill_zero<'b>(ctx: &Context, buf: impl Into<BufferView<'b>>, elems: u32) -> Result<Dispatch> {
    plan_fill_zero_per_token(ctx, buf.into(), elems, 0)
}

/// [`plan_fill_zero`] of `elems` floats, `per_token` floats per token of a plan's live count:
/// at a live count t it fills the first `t * per_token` (0: all `elems`, whatever the count).
///
/// # Errors
/// As [`plan_fill_zero`].
pub(crate) fn plan_fill_zero_per_token(
    ctx: &Context,
    buf: BufferView<'_>,
    elems: u32,
    per_token: u32,
) -> Result<Dispatch> {
    ctx.check_view("fill target", &buf, word_bytes(u64::from(elems)), ReadWrite)?;
    let params = ctx.uniform("fill params", &Params { tokens: elems, hidden: 1, ..Params::default() })?;
    let kernel = ctx.kernel(&FILL_ZERO, &[])?;
    let bindings = [Binding::new(0, &params, PARAMS_BYTES), buf.bind(5, word_bytes(u64::from(elems.max(1))))];
    let live = match per_token {
        0 => LiveCount::constant(elems),
        n => LiveCount::tokens().times(n),
    };
    // `CombineParams.tokens` holds the floats to fill (rows of one float).
    let sizing = Sizing::new(LiveGrid::Spilled(FILL_ZERO.live_groups(live)?))
        .field(offset_of!(Params, tokens), live.value());
    Ok(ctx.dispatch(&kernel, &bindings, ctx.grid(FILL_ZERO.groups(elems.into())?, "fill")?)?.sized(sizing))
}
