//! Routing host data on the device and reading it back ([`route_host`], [`topk_host`]):
//! for tests, examples and one-off use. Blocking read-backs, so natively only.

use super::config::{RouteConfig, RouteMode};
use super::plan::{RouteBuffers, plan_route, plan_topk};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::tensor::word_bytes;

/// Routing results copied back to the host.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteOutput {
    /// `indices[tokens, k]`.
    pub indices: Vec<u32>,
    /// `weights[tokens, k]`.
    pub weights: Vec<f32>,
    /// `logits[tokens, experts]` when the mode wrote them.
    pub logits: Option<Vec<f32>>,
}

pub(super) fn rows(what: &str, len: usize, cols: u32) -> Result<u32> {
    let cols = cols as usize;
    if !len.is_multiple_of(cols) {
        return Err(Error::shape(what, format!("a multiple of {cols} elements (rows of {cols})"), len));
    }
    u32::try_from(len / cols).map_err(|_| {
        Error::limit(format!("rows of {what}"), (len / cols) as u64, u32::MAX.into(), "u32 token count")
    })
}

pub(super) fn check_len(what: &str, len: usize, expected: u64) -> Result<()> {
    if len as u64 != expected {
        return Err(Error::shape(what, format!("{expected} elements"), len));
    }
    Ok(())
}

/// Routes host data end to end: uploads `x[tokens, hidden]`, `gate[experts, hidden]` (then
/// the router bias `[experts]` with `router_bias`) and `bias`, runs the plan, and reads the
/// results back. For tests, examples and one-off use;
/// a forward pass records a [`RoutePlan`](super::RoutePlan) instead.
///
/// # Errors
/// [`RouteConfig::validate`]'s errors; [`Error::Shape`] for inputs whose lengths do not
/// fit `cfg`; device errors while running or reading back.
pub fn route_host(
    ctx: &Context,
    cfg: &RouteConfig,
    x: &[f32],
    gate: &[f32],
    bias: Option<&[f32]>,
    mode: RouteMode,
) -> Result<RouteOutput> {
    cfg.validate()?;
    let tokens = rows("x", x.len(), cfg.hidden)?;
    let router_bias = if cfg.router_bias { u64::from(cfg.experts) } else { 0 };
    check_len("gate", gate.len(), u64::from(cfg.experts) * u64::from(cfg.hidden) + router_bias)?;
    if let Some(b) = bias {
        check_len("bias", b.len(), cfg.experts.into())?;
    }
    let xb = ctx.upload("x", x)?;
    let gb = ctx.upload("gate", gate)?;
    let bb = bias.map(|b| ctx.upload("bias", b)).transpose()?;
    let out = Outputs::new(ctx, cfg, tokens)?;
    let plan = plan_route(
        ctx,
        cfg,
        tokens,
        &RouteBuffers {
            x: (&xb).into(),
            gate: &gb,
            bias: bb.as_ref(),
            logits: Some((&out.logits).into()),
            indices: (&out.indices).into(),
            weights: (&out.weights).into(),
        },
        mode,
    )?;
    ctx.run(&plan.dispatches())?;
    out.read(ctx, cfg, tokens, mode.writes_logits())
}

/// Runs top-k alone on host `logits[tokens, experts]` and reads the results back.
///
/// # Errors
/// As [`route_host`].
pub fn topk_host(
    ctx: &Context,
    cfg: &RouteConfig,
    logits: &[f32],
    bias: Option<&[f32]>,
) -> Result<RouteOutput> {
    cfg.validate()?;
    let tokens = rows("logits", logits.len(), cfg.experts)?;
    if let Some(b) = bias {
        check_len("bias", b.len(), cfg.experts.into())?;
    }
    let lb = ctx.upload("logits", logits)?;
    let bb = bias.map(|b| ctx.upload("bias", b)).transpose()?;
    let out = Outputs::new(ctx, cfg, tokens)?;
    let plan = plan_topk(ctx, cfg, tokens, &lb, bb.as_ref(), &out.indices, &out.weights)?;
    ctx.run(&plan.dispatches())?;
    out.read(ctx, cfg, tokens, false)
}

pub(super) struct Outputs {
    pub(super) logits: wgpu::Buffer,
    pub(super) indices: wgpu::Buffer,
    pub(super) weights: wgpu::Buffer,
}

impl Outputs {
    pub(super) fn new(ctx: &Context, cfg: &RouteConfig, tokens: u32) -> Result<Self> {
        let t = u64::from(tokens);
        Ok(Outputs {
            logits: ctx.storage_scratch("logits", word_bytes(t * u64::from(cfg.experts)))?,
            indices: ctx.storage_scratch("topk indices", word_bytes(t * u64::from(cfg.k)))?,
            weights: ctx.storage_scratch("topk weights", word_bytes(t * u64::from(cfg.k)))?,
        })
    }

    pub(super) fn read(
        &self,
        ctx: &Context,
        cfg: &RouteConfig,
        tokens: u32,
        logits: bool,
    ) -> Result<RouteOutput> {
        let t = tokens as usize;
        Ok(RouteOutput {
            indices: ctx.read_back(&self.indices, t * cfg.k as usize)?,
            weights: ctx.read_back(&self.weights, t * cfg.k as usize)?,
            logits: if logits { Some(ctx.read_back(&self.logits, t * cfg.experts as usize)?) } else { None },
        })
    }
}
