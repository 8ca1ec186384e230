//! Planning a routing on the device: the fused or unfused route, top-k alone and argmax,
//! each checked and sized for the live count.

use super::config::{Gating, RouteConfig, RouteMode};
use super::specs::{GATE_MATVEC, MATVEC_WG, PARAMS_BYTES, Params, ROUTE_FUSED, TOPK, route_params};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::live::{LiveCount, LiveGrid, LiveValue, Sizing};
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::{Access, Binding, BufferView, Dispatch};
use crate::shader::Override;
use crate::tensor::word_bytes;

/// Device buffers a routing plan reads and writes.
#[derive(Clone, Copy, Debug)]
pub struct RouteBuffers<'a> {
    /// `x[tokens, hidden]`.
    pub x: BufferView<'a>,
    /// `gate[experts, hidden]`, then the router bias `[experts]` where the config has
    /// `router_bias`.
    pub gate: &'a wgpu::Buffer,
    /// `bias[experts]`; required exactly when the config has `bias`.
    pub bias: Option<&'a wgpu::Buffer>,
    /// `logits[tokens, experts]`; required when the mode writes logits.
    pub logits: Option<BufferView<'a>>,
    /// `indices[tokens, k]` (u32), written.
    pub indices: BufferView<'a>,
    /// `weights[tokens, k]`, written.
    pub weights: BufferView<'a>,
}

/// Dispatches that route `tokens` tokens, ready to record. Built once per shape and reused
/// every forward: recording it reads nothing back.
#[derive(Debug)]
pub struct RoutePlan {
    pub(super) dispatches: Vec<Dispatch>,
}

impl RoutePlan {
    /// The dispatches in order (empty for zero tokens).
    pub fn dispatches(&self) -> Vec<&Dispatch> {
        self.dispatches.iter().collect()
    }

    /// The dispatches, owned.
    pub fn into_dispatches(self) -> Vec<Dispatch> {
        self.dispatches
    }

    /// Records the plan into `pass`.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        for d in &self.dispatches {
            d.record(pass);
        }
    }
}

pub(super) struct Checked {
    pub(super) params: wgpu::Buffer,
    /// Bound in place of an absent bias (read-only binding).
    pub(super) no_bias: wgpu::Buffer,
    /// Bound in place of absent logits (read-write binding; never written).
    pub(super) no_logits: wgpu::Buffer,
}

pub(super) fn prepare(
    ctx: &Context,
    cfg: &RouteConfig,
    tokens: u32,
    bias: Option<&wgpu::Buffer>,
) -> Result<Checked> {
    cfg.validate()?;
    if cfg.bias != bias.is_some() {
        return Err(Error::invalid(if cfg.bias {
            "the config selects with a bias but no bias buffer was given"
        } else {
            "a bias buffer was given but the config has bias = false"
        }));
    }
    for (what, n) in
        [("tokens * experts", u64::from(cfg.experts)), ("tokens * hidden", u64::from(cfg.hidden))]
    {
        let elems = u64::from(tokens) * n;
        if elems > u64::from(u32::MAX) {
            return Err(Error::limit(what, elems, u32::MAX.into(), "shader indices are u32"));
        }
    }
    if let Some(b) = bias {
        ctx.check_binding("bias", b, word_bytes(u64::from(cfg.experts)), Access::Read)?;
    }
    Ok(Checked {
        params: route_params(ctx, cfg, tokens)?,
        no_bias: ctx.storage_scratch("moeflow absent bias", 4)?,
        no_logits: ctx.storage_scratch("moeflow absent logits", 4)?,
    })
}

/// Plans the full route (gate matvec and top-k) for `tokens` tokens.
///
/// # Errors
/// Any config field out of range, a missing or unexpected bias buffer, a missing logits
/// buffer when `mode` writes logits, a buffer smaller than its shape, or a size past the
/// adapter's limits.
pub fn plan_route(
    ctx: &Context,
    cfg: &RouteConfig,
    tokens: u32,
    bufs: &RouteBuffers<'_>,
    mode: RouteMode,
) -> Result<RoutePlan> {
    let c = prepare(ctx, cfg, tokens, bufs.bias)?;
    if tokens == 0 {
        return Ok(RoutePlan { dispatches: Vec::new() });
    }
    let (t, h, e, k) = (u64::from(tokens), u64::from(cfg.hidden), u64::from(cfg.experts), u64::from(cfg.k));
    ctx.check_view("x", &bufs.x, word_bytes(t * h), Access::Read)?;
    let gate_len = word_bytes(e * h + if cfg.router_bias { e } else { 0 });
    ctx.check_binding("gate", bufs.gate, gate_len, Access::Read)?;
    ctx.check_view("indices", &bufs.indices, word_bytes(t * k), Access::ReadWrite)?;
    ctx.check_view("weights", &bufs.weights, word_bytes(t * k), Access::ReadWrite)?;
    let logits = match (bufs.logits, mode.writes_logits()) {
        (Some(l), true) => {
            ctx.check_view("logits", &l, word_bytes(t * e), Access::ReadWrite)?;
            l.bind(3, word_bytes(t * e))
        }
        (None, true) => {
            return Err(Error::invalid(format!("{mode:?} writes logits but no logits buffer was given")));
        }
        (_, false) => Binding::new(3, &c.no_logits, 4),
    };
    let mut views = vec![
        ("x", bufs.x, Use::Read),
        ("indices", bufs.indices, Use::Write),
        ("weights", bufs.weights, Use::Write),
    ];
    views.extend(bufs.logits.filter(|_| mode.writes_logits()).map(|l| ("logits", l, Use::Write)));
    check_disjoint(&views)?;
    let params = Binding::new(0, &c.params, PARAMS_BYTES);
    let x = bufs.x.bind(1, word_bytes(t * h));
    let gate = Binding::new(2, bufs.gate, gate_len);
    let bias = bias_binding(cfg, bufs.bias, &c.no_bias);
    let indices = bufs.indices.bind(5, word_bytes(t * k));
    let weights = bufs.weights.bind(6, word_bytes(t * k));
    let per_token = ctx.grid(t, "routing (one workgroup per token)")?;
    let dispatches = match mode {
        RouteMode::Unfused => {
            let matvec = ctx.kernel(&GATE_MATVEC, &[(Override::MatvecWg, f64::from(MATVEC_WG))])?;
            let topk = ctx.kernel(&TOPK, &cfg.constants())?;
            let groups = ctx.grid((t * e).div_ceil(u64::from(MATVEC_WG)), "gate matvec")?;
            let matvec_groups = LiveCount::tokens().times(cfg.experts).div_ceil(MATVEC_WG);
            vec![
                ctx.dispatch(&matvec, &[params, x, gate, logits], groups)?.sized(sizing(matvec_groups)),
                ctx.dispatch(&topk, &[params, logits, bias, indices, weights], per_token)?
                    .sized(sizing(LiveCount::tokens().value())),
            ]
        }
        RouteMode::Fused { write_logits } => {
            let mut constants = cfg.constants().to_vec();
            constants.push((Override::WriteLogits, f64::from(u8::from(write_logits))));
            let fused = ctx.kernel(&ROUTE_FUSED, &constants)?;
            vec![
                ctx.dispatch(&fused, &[params, x, gate, logits, bias, indices, weights], per_token)?
                    .sized(sizing(LiveCount::tokens().value())),
            ]
        }
    };
    Ok(RoutePlan { dispatches })
}

/// Plans top-k alone over given `logits[tokens, experts]` (the unfused second stage).
///
/// # Errors
/// [`RouteConfig::validate`]'s errors; [`Error::Shape`] for a buffer smaller than its
/// shape; [`Error::LimitExceeded`] past the adapter's limits.
pub fn plan_topk(
    ctx: &Context,
    cfg: &RouteConfig,
    tokens: u32,
    logits: &wgpu::Buffer,
    bias: Option<&wgpu::Buffer>,
    indices: &wgpu::Buffer,
    weights: &wgpu::Buffer,
) -> Result<RoutePlan> {
    let c = prepare(ctx, cfg, tokens, bias)?;
    if tokens == 0 {
        return Ok(RoutePlan { dispatches: Vec::new() });
    }
    let (t, e, k) = (u64::from(tokens), u64::from(cfg.experts), u64::from(cfg.k));
    ctx.check_binding("logits", logits, word_bytes(t * e), Access::Read)?;
    ctx.check_binding("indices", indices, word_bytes(t * k), Access::ReadWrite)?;
    ctx.check_binding("weights", weights, word_bytes(t * k), Access::ReadWrite)?;
    let topk = ctx.kernel(&TOPK, &cfg.constants())?;
    let bindings = [
        Binding::new(0, &c.params, PARAMS_BYTES),
        Binding::new(3, logits, word_bytes(t * e)),
        bias_binding(cfg, bias, &c.no_bias),
        Binding::new(5, indices, word_bytes(t * k)),
        Binding::new(6, weights, word_bytes(t * k)),
    ];
    let grid = ctx.grid(t, "top-k (one workgroup per token)")?;
    Ok(RoutePlan {
        dispatches: vec![ctx.dispatch(&topk, &bindings, grid)?.sized(sizing(LiveCount::tokens().value()))],
    })
}

/// Plans `winners[t] = argmax_e scores[t, e]` over `scores[tokens, n_caps]` with the routing
/// tie rule (equal scores: lower index; NaN last); `values[t]` receives the winning score.
/// This is the top-k kernel with `k = 1` on raw scores, the winner list bucket routing takes.
///
/// # Errors
/// As [`plan_topk`].
pub fn plan_argmax(
    ctx: &Context,
    scores: &wgpu::Buffer,
    tokens: u32,
    n_caps: u32,
    winners: &wgpu::Buffer,
    values: &wgpu::Buffer,
) -> Result<RoutePlan> {
    let cfg = RouteConfig { gating: Gating::Raw, ..RouteConfig::new(1, n_caps, 1) };
    plan_topk(ctx, &cfg, tokens, scores, None, winners, values)
}

/// How a routing dispatch of `groups` workgroups (one dimension) follows the live count:
/// `RouteParams.tokens` is the count.
pub(super) fn sizing(groups: LiveValue) -> Sizing {
    Sizing::new(LiveGrid::Spilled(groups))
        .field(std::mem::offset_of!(Params, tokens), LiveCount::tokens().value())
}

pub(super) fn bias_binding<'a>(
    cfg: &RouteConfig,
    bias: Option<&'a wgpu::Buffer>,
    placeholder: &'a wgpu::Buffer,
) -> Binding<'a> {
    match bias {
        Some(b) => Binding::new(4, b, word_bytes(u64::from(cfg.experts))),
        None => Binding::new(4, placeholder, 4),
    }
}
