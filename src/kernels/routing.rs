//! Routing: gate matvec and top-k selection, unfused (two dispatches) or fused (one).
//!
//! Shapes (row-major, f32 unless noted): `x[tokens, hidden]`, `gate[experts, hidden]`,
//! `bias[experts]`, `logits[tokens, experts]`, `indices[tokens, k]` (u32),
//! `weights[tokens, k]`.
//!
//! # Tie-break contract
//!
//! Part of the API, tested with hand-written expectations on every adapter:
//! - slots are in descending selection value (the score, or `score + bias[e]` with a bias);
//! - equal values go to the lower expert index;
//! - `-0.0` equals `+0.0`;
//! - NaN never outranks a number (it ranks below `-inf`);
//! - an expert chosen once is excluded by its index, never by rewriting its value to `-inf`,
//!   so a row of all `-inf` still yields `k` distinct experts.
//!
//! The accumulation orders are stated in `docs/routing.md` and in the WGSL
//! (`wgsl/routing/`); [`crate::reference::routing`] mirrors them on the CPU. Fused and
//! unfused plans give bit-identical indices and weights on the same adapter.

use std::fmt;

use bytemuck::{Pod, Zeroable};
use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::error::{Error, Result};
use crate::live::{LiveCount, LiveGrid, LiveValue, Sizing};
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::{Access, Binding, BufferView, Dispatch, KernelSpec, Workgroup};
use crate::shader::{Indexing, Override, ShaderSource, wgsl};
use crate::tensor::word_bytes;

/// Invocations per top-k workgroup. The softmax sum's reduction tree depends on it, so it is
/// part of the numeric contract.
pub const ROUTE_WG: u32 = 64;
/// Largest expert count a routing kernel takes (workgroup memory holds one row of scores).
pub const MAX_EXPERTS: u32 = 1024;
/// Largest `k`.
pub const MAX_K: u32 = 32;
/// Largest `n_group` for group-limited selection.
pub const MAX_GROUPS: u32 = 64;
/// Invocations per gate-matvec workgroup.
const MATVEC_WG: u32 = 64;

static GATE_MATVEC_SHADER: ShaderSource = ShaderSource {
    name: "routing/gate_matvec",
    parts: &[wgsl!("routing/params.wgsl"), wgsl!("routing/gate.wgsl"), wgsl!("routing/gate_matvec.wgsl")],
    entry_points: &["gate_matvec"],
    indexing: Indexing::Checked,
};
static TOPK_SHADER: ShaderSource = ShaderSource {
    name: "routing/topk",
    parts: &[
        wgsl!("routing/params.wgsl"),
        wgsl!("routing/select.wgsl"),
        wgsl!("routing/select_io.wgsl"),
        wgsl!("routing/topk.wgsl"),
    ],
    entry_points: &["topk"],
    indexing: Indexing::Checked,
};
static FUSED_SHADER: ShaderSource = ShaderSource {
    name: "routing/route_fused",
    parts: &[
        wgsl!("routing/params.wgsl"),
        wgsl!("routing/gate.wgsl"),
        wgsl!("routing/select.wgsl"),
        wgsl!("routing/select_io.wgsl"),
        wgsl!("routing/route_fused.wgsl"),
    ],
    entry_points: &["route_fused"],
    indexing: Indexing::Checked,
};

/// The routing family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&GATE_MATVEC_SHADER, &TOPK_SHADER, &FUSED_SHADER];

/// Bytes of `RouteParams` (wgsl/routing/params.wgsl).
pub(crate) const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;
static GATE_MATVEC: KernelSpec = KernelSpec {
    shader: &GATE_MATVEC_SHADER,
    entry: "gate_matvec",
    bindings: &[(0, Access::Uniform), (1, Access::ReadWrite), (2, Access::Read), (3, Access::ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Override(Override::MatvecWg),
};
static TOPK: KernelSpec = KernelSpec {
    shader: &TOPK_SHADER,
    entry: "topk",
    bindings: &[
        (0, Access::Uniform),
        (3, Access::ReadWrite),
        (4, Access::Read),
        (5, Access::ReadWrite),
        (6, Access::ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(ROUTE_WG),
};
static ROUTE_FUSED: KernelSpec = KernelSpec {
    shader: &FUSED_SHADER,
    entry: "route_fused",
    bindings: &[
        (0, Access::Uniform),
        (1, Access::ReadWrite),
        (2, Access::Read),
        (3, Access::ReadWrite),
        (4, Access::Read),
        (5, Access::ReadWrite),
        (6, Access::ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(ROUTE_WG),
};

/// Every routing kernel (for the requirements and the contract test).
pub(crate) static SPECS: &[&KernelSpec] = &[&GATE_MATVEC, &TOPK, &ROUTE_FUSED];

/// How logits become scores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Gating {
    /// Softmax over the token's logits (Mixtral, Qwen-MoE, OLMoE).
    #[default]
    Softmax,
    /// Sigmoid per expert (DeepSeek-V3).
    Sigmoid,
    /// The logits themselves (argmax routing such as bucket winners; weights are the logits).
    Raw,
}

impl Gating {
    fn code(self) -> f64 {
        match self {
            Gating::Softmax => 0.0,
            Gating::Sigmoid => 1.0,
            Gating::Raw => 2.0,
        }
    }
}

/// Group-limited selection (DeepSeek-V3): experts are split into `n_group` equal groups, the
/// `topk_group` groups with the largest sum of their two best (biased) scores are kept, and
/// experts outside them are never selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupLimit {
    /// Number of groups; divides `experts`, each group holding at least two experts.
    pub n_group: u32,
    /// Groups kept per token, `1..=n_group`.
    pub topk_group: u32,
}

/// What a routing kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteConfig {
    /// Hidden size `H` (columns of `x` and of the gate weight).
    pub hidden: u32,
    /// Number of routed experts `E`, `1..=MAX_EXPERTS`.
    pub experts: u32,
    /// Experts per token, `1..=min(E, MAX_K)`.
    pub k: u32,
    /// Softmax or sigmoid scores.
    pub gating: Gating,
    /// Divide the selected weights by their sum.
    pub renormalize: bool,
    /// Factor applied to every weight last (DeepSeek's `routed_scaling_factor`); finite.
    pub scale: f32,
    /// Select on `score + bias[e]`, weight with the unbiased score.
    pub bias: bool,
    /// Optional group-limited selection.
    pub groups: Option<GroupLimit>,
    /// The router is affine (gpt-oss): `logit = x · w + b[e]`, the dot in its order, then one
    /// add. The gate buffer then holds `b[E]` after `w[E, H]`.
    #[serde(default)]
    pub router_bias: bool,
}

/// The complete routing in words, e.g. `sigmoid top-8 of 256 experts on score + bias within the
/// 4 best of 8 groups, renormalised, x 2.5`.
impl fmt::Display for RouteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gating = match self.gating {
            Gating::Softmax => "softmax",
            Gating::Sigmoid => "sigmoid",
            Gating::Raw => "raw-logit",
        };
        write!(f, "{gating} top-{} of {} experts", self.k, self.experts)?;
        if self.router_bias {
            write!(f, " (logits x . w + b)")?;
        }
        match (self.bias, self.groups.is_some()) {
            (false, false) => write!(f, " chosen on the logits")?,
            (true, _) => write!(f, " chosen on score + bias")?,
            (false, true) => write!(f, " chosen on the scores")?,
        }
        if let Some(g) = self.groups {
            write!(f, " within the {} best of {} groups", g.topk_group, g.n_group)?;
        }
        write!(f, ", {}", if self.renormalize { "renormalised" } else { "not renormalised" })?;
        write!(f, ", scale {}", self.scale)
    }
}

impl RouteConfig {
    /// Softmax top-`k` over `experts` with hidden size `hidden`, no renormalisation, scale 1.
    pub fn new(hidden: u32, experts: u32, k: u32) -> Self {
        RouteConfig {
            hidden,
            experts,
            k,
            gating: Gating::Softmax,
            renormalize: false,
            scale: 1.0,
            bias: false,
            groups: None,
            router_bias: false,
        }
    }

    /// Checks every field against its documented range.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the field out of range (hidden, experts, k, scale,
    /// groups); [`Error::LimitExceeded`] for more experts or a larger k than the kernels take.
    pub fn validate(&self) -> Result<()> {
        if self.hidden == 0 {
            return Err(Error::invalid("hidden size must be at least 1"));
        }
        if self.experts == 0 {
            return Err(Error::invalid("experts must be at least 1"));
        }
        if self.experts > MAX_EXPERTS {
            return Err(Error::limit(
                "experts",
                self.experts.into(),
                MAX_EXPERTS.into(),
                "one token's scores live in workgroup memory",
            ));
        }
        if self.k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        if self.k > self.experts {
            return Err(Error::invalid(format!(
                "k = {} is larger than the number of experts ({})",
                self.k, self.experts
            )));
        }
        if self.k > MAX_K {
            return Err(Error::limit(
                "k",
                self.k.into(),
                MAX_K.into(),
                "routing kernels keep k picks in workgroup memory",
            ));
        }
        if !self.scale.is_finite() {
            return Err(Error::invalid(format!("scale must be finite, got {}", self.scale)));
        }
        if let Some(g) = self.groups {
            if g.n_group == 0 || g.n_group > MAX_GROUPS {
                return Err(Error::invalid(format!("n_group = {} must be in 1..={MAX_GROUPS}", g.n_group)));
            }
            if !self.experts.is_multiple_of(g.n_group) {
                return Err(Error::invalid(format!(
                    "n_group = {} does not divide experts = {}",
                    g.n_group, self.experts
                )));
            }
            if self.experts / g.n_group < 2 {
                return Err(Error::invalid(format!(
                    "groups of {} expert(s): a group's score is the sum of its top two, so each needs at least 2",
                    self.experts / g.n_group
                )));
            }
            if g.topk_group == 0 || g.topk_group > g.n_group {
                return Err(Error::invalid(format!(
                    "topk_group = {} must be in 1..={}",
                    g.topk_group, g.n_group
                )));
            }
            let reachable = g.topk_group * (self.experts / g.n_group);
            if self.k > reachable {
                return Err(Error::invalid(format!(
                    "k = {} but only {reachable} experts are in the {} kept groups",
                    self.k, g.topk_group
                )));
            }
        }
        Ok(())
    }

    /// The pipeline constants of the top-k kernels (gating, bias, groups, renormalisation).
    pub(crate) fn constants(&self) -> [(Override, f64); 4] {
        [
            (Override::Gating, self.gating.code()),
            (Override::HasBias, f64::from(u8::from(self.bias))),
            (Override::HasGroups, f64::from(u8::from(self.groups.is_some()))),
            (Override::Renormalize, f64::from(u8::from(self.renormalize))),
        ]
    }
}

/// Unfused (gate matvec, then top-k) or fused (one dispatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RouteMode {
    /// Two dispatches; the logits buffer is written and read in between.
    Unfused,
    /// One dispatch; logits stay in workgroup memory unless `write_logits`.
    Fused {
        /// Also store the raw logits (telemetry).
        write_logits: bool,
    },
}

impl RouteMode {
    /// Whether this mode writes the logits buffer.
    pub fn writes_logits(self) -> bool {
        match self {
            RouteMode::Unfused => true,
            RouteMode::Fused { write_logits } => write_logits,
        }
    }
}

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

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
struct Params {
    tokens: u32,
    hidden: u32,
    experts: u32,
    k: u32,
    n_group: u32,
    topk_group: u32,
    scale: f32,
    router_bias: u32,
}

/// Dispatches that route `tokens` tokens, ready to record. Built once per shape and reused
/// every forward: recording it reads nothing back.
#[derive(Debug)]
pub struct RoutePlan {
    dispatches: Vec<Dispatch>,
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

struct Checked {
    params: wgpu::Buffer,
    /// Bound in place of an absent bias (read-only binding).
    no_bias: wgpu::Buffer,
    /// Bound in place of absent logits (read-write binding; never written).
    no_logits: wgpu::Buffer,
}

/// The routing kernels' uniform parameters (`RouteParams`, wgsl/routing/params.wgsl) for
/// `tokens` tokens of `cfg`.
pub(crate) fn route_params(ctx: &Context, cfg: &RouteConfig, tokens: u32) -> Result<wgpu::Buffer> {
    let g = cfg.groups.unwrap_or(GroupLimit { n_group: 1, topk_group: 1 });
    ctx.uniform(
        "moeflow route params",
        &Params {
            tokens,
            hidden: cfg.hidden,
            experts: cfg.experts,
            k: cfg.k,
            n_group: g.n_group,
            topk_group: g.topk_group,
            scale: cfg.scale,
            router_bias: u32::from(cfg.router_bias),
        },
    )
}

fn prepare(ctx: &Context, cfg: &RouteConfig, tokens: u32, bias: Option<&wgpu::Buffer>) -> Result<Checked> {
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
fn sizing(groups: LiveValue) -> Sizing {
    Sizing::new(LiveGrid::Spilled(groups))
        .field(std::mem::offset_of!(Params, tokens), LiveCount::tokens().value())
}

fn bias_binding<'a>(
    cfg: &RouteConfig,
    bias: Option<&'a wgpu::Buffer>,
    placeholder: &'a wgpu::Buffer,
) -> Binding<'a> {
    match bias {
        Some(b) => Binding::new(4, b, word_bytes(u64::from(cfg.experts))),
        None => Binding::new(4, placeholder, 4),
    }
}

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

fn rows(what: &str, len: usize, cols: u32) -> Result<u32> {
    let cols = cols as usize;
    if !len.is_multiple_of(cols) {
        return Err(Error::shape(what, format!("a multiple of {cols} elements (rows of {cols})"), len));
    }
    u32::try_from(len / cols).map_err(|_| {
        Error::limit(format!("rows of {what}"), (len / cols) as u64, u32::MAX.into(), "u32 token count")
    })
}

fn check_len(what: &str, len: usize, expected: u64) -> Result<()> {
    if len as u64 != expected {
        return Err(Error::shape(what, format!("{expected} elements"), len));
    }
    Ok(())
}

/// Routes host data end to end: uploads `x[tokens, hidden]`, `gate[experts, hidden]` (then
/// the router bias `[experts]` with `router_bias`) and `bias`, runs the plan, and reads the
/// results back. For tests, examples and one-off use;
/// a forward pass records a [`RoutePlan`] instead.
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

struct Outputs {
    logits: wgpu::Buffer,
    indices: wgpu::Buffer,
    weights: wgpu::Buffer,
}

impl Outputs {
    fn new(ctx: &Context, cfg: &RouteConfig, tokens: u32) -> Result<Self> {
        let t = u64::from(tokens);
        Ok(Outputs {
            logits: ctx.storage_scratch("logits", word_bytes(t * u64::from(cfg.experts)))?,
            indices: ctx.storage_scratch("topk indices", word_bytes(t * u64::from(cfg.k)))?,
            weights: ctx.storage_scratch("topk weights", word_bytes(t * u64::from(cfg.k)))?,
        })
    }

    fn read(&self, ctx: &Context, cfg: &RouteConfig, tokens: u32, logits: bool) -> Result<RouteOutput> {
        let t = tokens as usize;
        Ok(RouteOutput {
            indices: ctx.read_back(&self.indices, t * cfg.k as usize)?,
            weights: ctx.read_back(&self.weights, t * cfg.k as usize)?,
            logits: if logits { Some(ctx.read_back(&self.logits, t * cfg.experts as usize)?) } else { None },
        })
    }
}
