//! `MoeLayer`: routing, dispatch, expert projections and combine recorded into one encoder,
//! with no host readback inside a forward pass.
//!
//! Stages of a forward (see `docs/layer.md`):
//! `route` (gate matvec + top-k) -> `dispatch` (stable padded grouping; skipped on the decode
//! path) -> `experts` (SwiGLU expert FFN) -> `shared` (shared expert over all tokens, if any)
//! -> `combine` (weighted sum in slot order, plus the shared row).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::kernels::combine::{CombineBuffers, CombineMode, Shared, plan_combine, plan_fill_zero_per_token};
use crate::kernels::dispatch::{
    BucketConfig, BucketLayout, DispatchConfig, DispatchLayout, LoadStats, OverflowPolicy,
};
use crate::kernels::gemm::{
    Activation, AdapterKind, DenseKernel, ExpertBias, ExpertFfn, ExpertWeights, FfnBuffers, FfnKernels,
    FfnRouting, GemmOrder, GemmVariant, TuneOptions, WeightDtype, check_on_device, plan_dense_ffn_with,
    plan_dense_with, plan_ffn_with, tune_with,
};
use crate::kernels::routing::{RouteBuffers, RouteConfig, RouteMode, plan_route};
use crate::kernels::sizing::plan_sizing;
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::{BufferView, Dispatch};
use crate::tensor::word_bytes;
use crate::tensor::{DType, Tensor};
use crate::workspace::{Region, Scratch, ScratchKey, Workspace, WorkspaceLayout};

mod io;
mod workspace;

pub(crate) use io::CallerOutputs;
pub use io::ForwardIo;

/// How expert capacity is handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Capacity {
    /// Every routed entry is computed (padded-tile grouped GEMM; row-wise for decode sizes).
    #[default]
    Dropless,
    /// At most `bound` entries per expert in the grouped matmuls; the rest overflow to a
    /// second pass or are dropped (their contribution is zero).
    Bounded {
        /// Entries per expert.
        bound: u32,
        /// Overflow or drop.
        policy: OverflowPolicy,
    },
}

/// Which block-GEMM kernels a layer's expert projections run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum KernelChoice {
    /// The adapter's fixed default ([`FfnKernels::default_for`]).
    #[default]
    Default,
    /// Chosen by timing the candidates on the device when the layer is made
    /// ([`crate::kernels::gemm::tune`], cached on disk), on 32 rows per expert.
    Tuned,
    /// As [`KernelChoice::Tuned`], for prefills of about `tokens` tokens: timed on the rows an
    /// expert gets then (`tokens · k / E`, at least 1), so a layer that sees long prefills gets
    /// the tile that suits many rows per expert (the GPU candidates hold 32- to 128-row tiles)
    /// and one that sees short ones the tile that suits few.
    TunedFor {
        /// Tokens of the prefills the layer is tuned for (at least 1).
        tokens: u32,
    },
    /// These variants for the gate/up and the down projections.
    Fixed {
        /// Gate/up (SwiGLU) projection.
        up: GemmVariant,
        /// Down projection.
        down: GemmVariant,
    },
}

/// Everything that shapes a MoE layer: its routing (a [`RouteConfig`]: H, E, k and how
/// experts are chosen and weighted) and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// The routing: hidden size H, experts E, experts per token k, gating, renormalisation,
    /// scale, selection bias and group limits (flattened into the same JSON object).
    #[serde(flatten)]
    pub route: RouteConfig,
    /// Routed expert FFN size F.
    pub ffn: u32,
    /// FFN size of the shared expert(s), all shared experts concatenated; None without.
    pub shared_ffn: Option<u32>,
    /// The shared expert's output is scaled by sigmoid(x . g) (Qwen2-MoE).
    pub shared_gate: bool,
    /// Capacity policy.
    pub capacity: Capacity,
    /// Storage dtype of expert weights (the router stays f32).
    pub weight_dtype: WeightDtype,
    /// Fused or unfused routing (bit-identical).
    pub route_mode: RouteMode,
    /// One-launch or sequential combine (bit-identical).
    pub combine: CombineMode,
    /// Accumulation order of every expert projection (routed and shared).
    pub gemm_order: GemmOrder,
    /// Block-GEMM kernels of the expert projections (every choice gives the same bits in one
    /// order).
    pub kernels: KernelChoice,
    /// The activation between the experts' gate/up and down projections (routed and shared).
    #[serde(default)]
    pub activation: Activation,
    /// The routed experts' projections add biases (gpt-oss): [`MoeWeights::expert_bias`].
    #[serde(default)]
    pub expert_bias: bool,
}

impl MoeConfig {
    /// Softmax top-k routing over `experts` experts, renormalised, no shared expert; the
    /// unfused route (gate matvec, then top-k), the one-launch combine, strict GEMM order and
    /// the adapter's default kernels.
    pub fn new(hidden: u32, ffn: u32, experts: u32, k: u32) -> Self {
        MoeConfig {
            route: RouteConfig { renormalize: true, ..RouteConfig::new(hidden, experts, k) },
            ffn,
            shared_ffn: None,
            shared_gate: false,
            capacity: Capacity::Dropless,
            weight_dtype: WeightDtype::F32,
            // Unfused: measured at least as fast on every adapter (docs/routing.md); the fused
            // route is 3.4x slower at decode with E=256 on a GPU.
            route_mode: RouteMode::Unfused,
            combine: CombineMode::OneLaunch,
            gemm_order: GemmOrder::Strict,
            kernels: KernelChoice::Default,
            activation: Activation::Swiglu,
            expert_bias: false,
        }
    }

    /// The expert projections' kernels on a kind of adapter before tuning: the fixed choice,
    /// else the kind's default.
    pub fn ffn_kernels(&self, kind: AdapterKind) -> FfnKernels {
        match self.kernels {
            KernelChoice::Default | KernelChoice::Tuned | KernelChoice::TunedFor { .. } => {
                FfnKernels::default_for(kind, self.gemm_order)
            }
            KernelChoice::Fixed { up, down } => FfnKernels { order: self.gemm_order, up, down },
        }
    }

    /// An expert's mean share of rows in a forward of `tokens` tokens: `tokens · k / E`, at
    /// least 1 (what [`KernelChoice::TunedFor`] tunes on).
    pub fn expected_rows_per_expert(&self, tokens: u32) -> u32 {
        let rows = u64::from(tokens) * u64::from(self.route.k) / u64::from(self.route.experts.max(1));
        u32::try_from(rows).unwrap_or(u32::MAX).max(1)
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`RouteConfig::validate`]'s errors; [`Error::InvalidArgument`] for zero FFN sizes, a
    /// shared gate without a shared expert, a zero capacity bound or `TunedFor` zero tokens.
    pub fn validate(&self) -> Result<()> {
        self.route.validate()?;
        if self.ffn == 0 || self.shared_ffn == Some(0) {
            return Err(Error::invalid("FFN sizes must be at least 1"));
        }
        if self.shared_gate && self.shared_ffn.is_none() {
            return Err(Error::invalid("shared_gate needs a shared expert (shared_ffn)"));
        }
        if let Capacity::Bounded { bound: 0, .. } = self.capacity {
            return Err(Error::invalid("capacity bound must be at least 1"));
        }
        if self.kernels == (KernelChoice::TunedFor { tokens: 0 }) {
            return Err(Error::invalid("KernelChoice::TunedFor needs at least 1 token"));
        }
        self.activation.validate()?;
        self.ffn_kernels(AdapterKind::Gpu).validate()
    }
}

/// The layer in words: shapes, the complete routing, shared expert, capacity and dtype.
impl fmt::Display for MoeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "H={} F={}; {}", self.route.hidden, self.ffn, self.route)?;
        match (self.shared_ffn, self.shared_gate) {
            (Some(fs), true) => write!(f, "; shared expert F={fs} scaled by sigmoid(x . g)")?,
            (Some(fs), false) => write!(f, "; shared expert F={fs}")?,
            (None, _) => write!(f, "; no shared expert")?,
        }
        if let Capacity::Bounded { bound, policy } = self.capacity {
            write!(f, "; at most {bound} entries per expert, {policy:?} past it")?;
        }
        if let Activation::ClampedSwiglu { alpha, limit } = self.activation {
            write!(f, "; clamped SwiGLU (alpha {alpha}, limit {limit})")?;
        }
        if self.expert_bias {
            write!(f, "; expert biases")?;
        }
        write!(f, "; {:?} expert weights, {:?} GEMM order", self.weight_dtype, self.gemm_order)
    }
}

/// Host weights of a MoE layer (f32; rounded to `weight_dtype` on upload).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeWeights {
    /// Router `[E, H]`.
    pub router: Vec<f32>,
    /// Selection bias `[E]`.
    pub bias: Option<Vec<f32>>,
    /// Expert gate projections `[E, F, H]`.
    pub gate: Vec<f32>,
    /// Expert up projections `[E, F, H]`.
    pub up: Vec<f32>,
    /// Expert down projections `[E, H, F]`.
    pub down: Vec<f32>,
    /// Shared expert `(gate [Fs, H], up [Fs, H], down [H, Fs])`.
    pub shared: Option<(Vec<f32>, Vec<f32>, Vec<f32>)>,
    /// Shared expert gate `[H]`.
    pub shared_gate: Option<Vec<f32>>,
    /// Router bias `[E]`, added to the logits (`RouteConfig::router_bias`).
    pub router_bias: Option<Vec<f32>>,
    /// Expert projection biases (`MoeConfig::expert_bias`).
    pub expert_bias: Option<ExpertBiasValues>,
}

/// The routed experts' projection biases on the host (gpt-oss's `gate_up_proj_bias`, split
/// into gate and up, and `down_proj_bias`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertBiasValues {
    /// Gate biases `[E, F]`.
    pub gate: Vec<f32>,
    /// Up biases `[E, F]`.
    pub up: Vec<f32>,
    /// Down biases `[E, H]`.
    pub down: Vec<f32>,
}

impl ExpertBiasValues {
    fn check(&self, [e, f, h]: [u32; 3]) -> Result<()> {
        expect_len("experts gate bias", self.gate.len(), &[e, f])?;
        expect_len("experts up bias", self.up.len(), &[e, f])?;
        expect_len("experts down bias", self.down.len(), &[e, h])
    }
}

fn expect_len(what: &str, got: usize, dims: &[u32]) -> Result<()> {
    let want: u64 = dims.iter().map(|&d| u64::from(d)).product();
    if got as u64 != want {
        return Err(Error::shape(what, format!("{dims:?} = {want} elements"), got));
    }
    Ok(())
}

impl MoeWeights {
    /// Checks every tensor against `cfg`.
    ///
    /// # Errors
    /// [`Error::Shape`] for a tensor whose length does not fit `cfg`;
    /// [`Error::InvalidArgument`] when the shared expert's tensors and `cfg.shared_ffn` disagree.
    pub fn check(&self, cfg: &MoeConfig) -> Result<()> {
        let (h, f, e) = (cfg.route.hidden, cfg.ffn, cfg.route.experts);
        check_router(
            cfg,
            &self.router,
            self.bias.as_deref(),
            self.shared_gate.as_deref(),
            self.router_bias.as_deref(),
        )?;
        match (&self.expert_bias, cfg.expert_bias) {
            (Some(b), true) => b.check([e, f, h])?,
            (None, false) => {}
            _ => return Err(Error::invalid("expert bias weights and config.expert_bias disagree")),
        }
        expect_len("experts gate", self.gate.len(), &[e, f, h])?;
        expect_len("experts up", self.up.len(), &[e, f, h])?;
        expect_len("experts down", self.down.len(), &[e, h, f])?;
        match (&self.shared, cfg.shared_ffn) {
            (Some((g, u, d)), Some(fs)) => {
                expect_len("shared gate_proj", g.len(), &[fs, h])?;
                expect_len("shared up_proj", u.len(), &[fs, h])?;
                expect_len("shared down_proj", d.len(), &[h, fs])?;
            }
            (None, None) => {}
            _ => return Err(Error::invalid("shared expert weights and config.shared_ffn disagree")),
        }
        Ok(())
    }
}

/// The small f32 tensors of a layer besides its experts: the router, its selection bias
/// and the shared expert's gate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RouterWeights {
    /// Router `[E, H]`.
    pub router: Vec<f32>,
    /// Selection bias `[E]`.
    pub bias: Option<Vec<f32>>,
    /// Shared expert gate `[H]`.
    pub shared_gate: Option<Vec<f32>>,
    /// Router bias `[E]`, added to the logits (`RouteConfig::router_bias`).
    pub router_bias: Option<Vec<f32>>,
}

impl RouterWeights {
    /// Checks every tensor against `cfg`.
    ///
    /// # Errors
    /// [`Error::Shape`] for a tensor whose shape does not fit `cfg`;
    /// [`Error::InvalidArgument`] when the shared expert's tensors and `cfg.shared_ffn` disagree.
    pub fn check(&self, cfg: &MoeConfig) -> Result<()> {
        check_router(
            cfg,
            &self.router,
            self.bias.as_deref(),
            self.shared_gate.as_deref(),
            self.router_bias.as_deref(),
        )
    }

    /// The router as the gate buffer holds it: `[E, H]`, then the router bias `[E]` if any.
    fn gate_buffer(&self) -> Vec<f32> {
        let mut gate = self.router.clone();
        gate.extend(self.router_bias.iter().flatten());
        gate
    }
}

fn check_router(
    cfg: &MoeConfig,
    router: &[f32],
    bias: Option<&[f32]>,
    shared_gate: Option<&[f32]>,
    router_bias: Option<&[f32]>,
) -> Result<()> {
    let (h, e) = (cfg.route.hidden, cfg.route.experts);
    expect_len("router", router.len(), &[e, h])?;
    match (router_bias, cfg.route.router_bias) {
        (Some(b), true) => expect_len("router bias", b.len(), &[e])?,
        (None, false) => {}
        _ => return Err(Error::invalid("router bias weights and config.route.router_bias disagree")),
    }
    match (bias, cfg.route.bias) {
        (Some(b), true) => expect_len("bias", b.len(), &[e])?,
        (None, false) => {}
        (Some(_), false) => return Err(Error::invalid("weights have a bias but the config does not")),
        (None, true) => {
            return Err(Error::invalid("the config selects with a bias but the weights have none"));
        }
    }
    match (shared_gate, cfg.shared_gate) {
        (Some(g), true) => expect_len("shared expert gate", g.len(), &[h]),
        (None, false) => Ok(()),
        _ => Err(Error::invalid("shared expert gate weights and config.shared_gate disagree")),
    }
}

/// A MoE layer with its weights on the device.
#[derive(Debug)]
pub struct MoeLayer {
    cfg: MoeConfig,
    router: wgpu::Buffer,
    bias: Option<wgpu::Buffer>,
    experts: ExpertFfn,
    shared: Option<ExpertFfn>,
    shared_gate: Option<ExpertWeights>,
}

/// A stage of the layer's forward, in the order a forward runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ForwardStage {
    /// The parameter words and grids of the dispatches after it that depend on the forward's
    /// token count (see [`ForwardPlan::record`]).
    Size,
    /// Gate matvec and top-k (or the fused route).
    Route,
    /// The dispatch layout (count, scan, stable placement) or the bucket layout.
    Dispatch,
    /// The routed experts' projections.
    Experts,
    /// The shared expert (and its gate), independent of the routing.
    Shared,
    /// The weighted sum of the experts' outputs and the shared expert's.
    Combine,
}

impl ForwardStage {
    /// The stages whose outputs this one reads.
    pub fn reads(self) -> &'static [ForwardStage] {
        use ForwardStage::{Combine, Dispatch, Experts, Route, Shared, Size};
        match self {
            Size => &[],
            Route | Shared => &[Size],
            Dispatch => &[Size, Route],
            Experts => &[Size, Route, Dispatch],
            Combine => &[Size, Route, Experts, Shared],
        }
    }

    /// Its name in reports: `size`, `route`, `dispatch`, `experts`, `shared` or `combine`.
    pub fn name(self) -> &'static str {
        match self {
            ForwardStage::Size => "size",
            ForwardStage::Route => "route",
            ForwardStage::Dispatch => "dispatch",
            ForwardStage::Experts => "experts",
            ForwardStage::Shared => "shared",
            ForwardStage::Combine => "combine",
        }
    }
}

impl std::fmt::Display for ForwardStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Intermediate buffers and dispatches of a forward of up to a maximum token count. Build it
/// once with [`MoeLayer::plan`] and record each forward at its count ([`Self::record`], or
/// [`Self::record_device_count`] for a count written on the device): no re-planning, no
/// allocation.
#[derive(Debug)]
pub struct ForwardPlan {
    max_tokens: u32,
    /// The live token count (one u32), read by the sizing stage.
    live: wgpu::Buffer,
    /// `counts[n] = n` for n up to the maximum: [`Self::record`] copies its count from here.
    counts: wgpu::Buffer,
    /// The largest count that takes the decode path (0: none).
    decode_until: u32,
    /// Experts per token.
    k: u32,
    /// Experts.
    experts: u32,
    stages: Vec<(ForwardStage, Vec<Dispatch>)>,
    indices: Region,
    weights: Region,
    logits: Option<Region>,
    layout: Option<DispatchLayout>,
    buckets: Option<BucketLayout>,
}

/// A plan's maximum token count: at least 1.
fn check_max_tokens(max_tokens: u32) -> Result<()> {
    match max_tokens {
        0 => Err(Error::invalid("a plan needs a maximum token count of at least 1")),
        _ => Ok(()),
    }
}

/// `dispatches`, each run only at live counts in `counts` (and where it ran before).
fn only_for(mut dispatches: Vec<Dispatch>, counts: std::ops::RangeInclusive<u32>) -> Vec<Dispatch> {
    for d in &mut dispatches {
        d.run_only_for(counts.clone());
    }
    dispatches
}

impl ForwardPlan {
    /// Records a forward of `tokens` tokens into `encoder`: a copy of the count into
    /// [`Self::live_tokens`], then one compute pass of the dispatches that run at that count,
    /// each with its grid for it (the dispatches of a plan made for exactly `tokens`, and the
    /// sizing stage). Any number of forwards, at any counts, can be recorded into one encoder.
    /// An empty batch (`tokens` 0) is a forward with nothing to read or write: it records
    /// nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count past [`Self::max_tokens`].
    pub fn record(&self, encoder: &mut wgpu::CommandEncoder, tokens: u32) -> Result<()> {
        if tokens == 0 {
            return Ok(());
        }
        self.check_live(tokens)?;
        encoder.copy_buffer_to_buffer(&self.counts, word_bytes(u64::from(tokens)), &self.live, 0, 4);
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("moeflow"),
            timestamp_writes: None,
        });
        for d in self.stages.iter().flat_map(|(_, ds)| ds) {
            if let Some(grid) = d.grid_at(tokens) {
                d.record_grid(&mut pass, grid);
            }
        }
        Ok(())
    }

    /// Records a forward of the count in [`Self::live_tokens`] as the device holds it when the
    /// forward runs (written there by a copy or a kernel recorded before): every dispatch, each
    /// with its grid read from the device.
    pub fn record_device_count(&self, encoder: &mut wgpu::CommandEncoder) {
        crate::gpu::record(encoder, &self.dispatches());
    }

    /// Stages in order, each with every dispatch as [`Self::record_device_count`] records it.
    pub fn stages(&self) -> Vec<(ForwardStage, Vec<&Dispatch>)> {
        self.stages.iter().map(|(n, ds)| (*n, ds.iter().collect())).collect()
    }

    /// Every dispatch in order, as [`Self::record_device_count`] records it.
    pub fn dispatches(&self) -> Vec<&Dispatch> {
        self.stages.iter().flat_map(|(_, ds)| ds.iter()).collect()
    }

    /// The stages of a forward of `tokens` tokens, owned: the dispatches that run at that
    /// count, each with its grid for it, as [`Self::record`] records them (the buffers they use
    /// stay alive with them). They read the count from [`Self::live_tokens`]: set it first
    /// ([`Self::set_live_tokens`]). An empty batch (`tokens` 0) has no stages.
    ///
    /// # Errors
    /// As [`Self::record`].
    pub fn stages_at(&self, tokens: u32) -> Result<Vec<(ForwardStage, Vec<Dispatch>)>> {
        if tokens == 0 {
            return Ok(Vec::new());
        }
        self.check_live(tokens)?;
        Ok(self
            .stages
            .iter()
            .map(|(n, ds)| (*n, ds.iter().filter_map(|d| d.at_count(tokens)).collect::<Vec<_>>()))
            .filter(|(_, ds)| !ds.is_empty())
            .collect())
    }

    /// The dispatches of [`Self::stages_at`], in order.
    ///
    /// # Errors
    /// As [`Self::record`].
    pub fn dispatches_at(&self, tokens: u32) -> Result<Vec<Dispatch>> {
        Ok(self.stages_at(tokens)?.into_iter().flat_map(|(_, ds)| ds).collect())
    }

    /// The most tokens a forward of this plan can have (the count it was planned for).
    pub fn max_tokens(&self) -> u32 {
        self.max_tokens
    }

    /// Sets the token count of the forwards submitted from now on (written to
    /// [`Self::live_tokens`] by the queue, before the next submission's commands run). Rows
    /// past the count in x are not read and in y not written.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for 0 (a device-held count runs every dispatch: an empty
    /// batch is recorded by [`Self::record`], as nothing) or a count past
    /// [`Self::max_tokens`]; a lost device.
    pub fn set_live_tokens(&self, ctx: &Context, tokens: u32) -> Result<()> {
        self.check_live(tokens)?;
        ctx.check_alive()?;
        ctx.queue().write_buffer(&self.live, 0, bytemuck::bytes_of(&tokens));
        Ok(())
    }

    /// Checks a live token count for this plan (see [`Self::set_live_tokens`]).
    ///
    /// # Errors
    /// As [`Self::set_live_tokens`].
    pub fn check_live(&self, tokens: u32) -> Result<()> {
        if tokens == 0 || tokens > self.max_tokens {
            return Err(Error::invalid(format!(
                "live token count {tokens}: this plan runs 1 to {} tokens (an empty batch is \
                 recorded as nothing by `record(encoder, 0)`)",
                self.max_tokens
            )));
        }
        Ok(())
    }

    /// The buffer whose first u32 is the live token count (the maximum until set): written by
    /// [`Self::set_live_tokens`], or on the device by a copy or a kernel recorded before the
    /// forward, so that a chain of layers needs no host round trip. A count past the maximum
    /// written there runs as the maximum.
    pub fn live_tokens(&self) -> &wgpu::Buffer {
        &self.live
    }
    /// `indices[max_tokens, k]` (u32) written by the route stage: the caller's tensor where
    /// [`ForwardIo::with_routing`] gave one, else in the plan's workspace (where a layer sharing
    /// it overwrites them).
    pub fn indices(&self) -> Tensor<'_> {
        Tensor::within(self.indices.view(), [self.max_tokens, self.k], DType::U32)
    }

    /// `weights[max_tokens, k]` (f32) written by the route stage (where [`Self::indices`] are).
    pub fn weights(&self) -> Tensor<'_> {
        Tensor::within(self.weights.view(), [self.max_tokens, self.k], DType::F32)
    }

    /// `logits[max_tokens, experts]` (f32) written by the route stage, where its mode writes
    /// them: the caller's tensor where [`ForwardIo::with_logits`] gave one, else in the plan's
    /// workspace.
    pub fn logits(&self) -> Option<Tensor<'_>> {
        let shape = [self.max_tokens, self.experts];
        self.logits.as_ref().map(|l| Tensor::within(l.view(), shape, DType::F32))
    }

    /// Expert load of the last forward (reads counts back; not part of the forward).
    ///
    /// # Errors
    /// A device error while reading back.
    pub fn load(&self, ctx: &Context, experts: u32) -> Result<LoadStats> {
        let live = ctx.read_back::<u32>(&self.live, 1)?.first().copied().unwrap_or(self.max_tokens);
        let live = live.min(self.max_tokens);
        if let Some(b) = &self.buckets {
            return b.layout().stats(ctx);
        }
        if let Some(l) = &self.layout
            && live > self.decode_until
        {
            return l.stats(ctx);
        }
        // Decode path: no layout was filled; count on the host.
        let idx: Vec<u32> = ctx.read_back(self.indices.view(), live as usize * self.k as usize)?;
        let l = crate::kernels::dispatch::host::layout(&idx, experts, 1, 0);
        Ok(LoadStats::new(l.counts, l.meta))
    }
}

/// What [`MoeLayer::prepare`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct PrepareReport {
    /// Pipelines built by this call (0 when every one was built before).
    pub pipelines_built: usize,
    /// Pipelines on the context afterwards (for every layer and kernel used on it).
    pub pipelines_total: usize,
    /// Wall time of the call, in seconds: pipeline builds (shader compiles, unless a driver or
    /// pipeline cache had them), the weights' texture copies where the kernels read textures,
    /// and the tuner's measurements where the configuration asks for tuning.
    pub seconds: f64,
}

/// A forward's results read back to the host.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ForwardOutput {
    /// `y[tokens, hidden]`.
    pub y: Vec<f32>,
    /// `indices[tokens, k]`.
    pub indices: Vec<u32>,
    /// `weights[tokens, k]`.
    pub weights: Vec<f32>,
}

impl MoeLayer {
    /// Uploads `weights` for `cfg`.
    ///
    /// # Errors
    /// [`MoeConfig::validate`] and [`MoeWeights::check`]'s errors; tuning and device errors
    /// while uploading.
    pub fn new(ctx: &Context, cfg: MoeConfig, weights: &MoeWeights) -> Result<Self> {
        pollster::block_on(Self::new_with(ctx, cfg, weights, Driver::Inline))
    }

    /// [`Self::new`] without blocking the awaiting thread where the configuration tunes its
    /// kernels (the tuner's timed runs are awaited; uploads never wait).
    ///
    /// # Errors
    /// As [`Self::new`].
    pub async fn new_async(ctx: &Context, cfg: MoeConfig, weights: &MoeWeights) -> Result<Self> {
        Self::new_with(ctx, cfg, weights, Driver::Thread).await
    }

    async fn new_with(ctx: &Context, cfg: MoeConfig, weights: &MoeWeights, driver: Driver) -> Result<Self> {
        cfg.validate()?;
        weights.check(&cfg)?;
        let (h, f, e, dt) = (cfg.route.hidden, cfg.ffn, cfg.route.experts, cfg.weight_dtype);
        let ew = |d: &[f32], e, n, k| ExpertWeights::from_f32(ctx, d, dt, e, n, k);
        let mut experts = ExpertFfn::new(
            ew(&weights.gate, e, f, h)?,
            ew(&weights.up, e, f, h)?,
            ew(&weights.down, e, h, f)?,
        )?;
        if let Some(b) = &weights.expert_bias {
            experts = experts.with_bias(ExpertBias::new(ctx, &b.gate, &b.up, &b.down, [e, f, h])?)?;
        }
        let shared = match (&weights.shared, cfg.shared_ffn) {
            (Some((g, u, d)), Some(fs)) => {
                Some(ExpertFfn::new(ew(g, 1, fs, h)?, ew(u, 1, fs, h)?, ew(d, 1, h, fs)?)?)
            }
            _ => None,
        };
        let router = RouterWeights {
            router: weights.router.clone(),
            bias: weights.bias.clone(),
            shared_gate: weights.shared_gate.clone(),
            router_bias: weights.router_bias.clone(),
        };
        MoeLayer::with_experts_with(ctx, cfg, &router, experts, shared, driver).await
    }

    /// A layer from expert weights already on the device (for example streamed from a
    /// checkpoint with [`ExpertWeights::stream`], with no host f32 copy) and the router's
    /// small host tensors. The experts run `cfg.activation`; their biases
    /// ([`ExpertFfn::with_bias`]) are present exactly when `cfg.expert_bias` says.
    ///
    /// # Errors
    /// A configuration that does not validate; expert weights whose shapes or dtype differ from
    /// `cfg` (`[E, F, H]`, `[E, F, H]`, `[E, H, F]` routed, `[1, Fs, H]` ... shared, in
    /// `cfg.weight_dtype`); router tensors whose lengths differ from `cfg`; a shared expert or
    /// gate present in one of `cfg` and the weights only; device errors.
    pub fn with_experts(
        ctx: &Context,
        cfg: MoeConfig,
        router: &RouterWeights,
        experts: ExpertFfn,
        shared: Option<ExpertFfn>,
    ) -> Result<Self> {
        pollster::block_on(Self::with_experts_with(ctx, cfg, router, experts, shared, Driver::Inline))
    }

    /// [`Self::with_experts`] without blocking the awaiting thread where the configuration
    /// tunes its kernels.
    ///
    /// # Errors
    /// As [`Self::with_experts`].
    pub async fn with_experts_async(
        ctx: &Context,
        cfg: MoeConfig,
        router: &RouterWeights,
        experts: ExpertFfn,
        shared: Option<ExpertFfn>,
    ) -> Result<Self> {
        Self::with_experts_with(ctx, cfg, router, experts, shared, Driver::Thread).await
    }

    /// [`Self::with_experts`], its waits driven as `driver` says.
    pub(crate) async fn with_experts_with(
        ctx: &Context,
        cfg: MoeConfig,
        router: &RouterWeights,
        experts: ExpertFfn,
        shared: Option<ExpertFfn>,
        driver: Driver,
    ) -> Result<Self> {
        cfg.validate()?;
        router.check(&cfg)?;
        let (h, f, e) = (cfg.route.hidden, cfg.ffn, cfg.route.experts);
        let expect = |what: &str, ffn: &ExpertFfn, [e, f]: [u32; 2]| -> Result<()> {
            for (name, w, shape) in
                [("gate", &ffn.gate, [e, f, h]), ("up", &ffn.up, [e, f, h]), ("down", &ffn.down, [e, h, f])]
            {
                if w.shape() != shape {
                    return Err(Error::shape(
                        format!("{what} {name} weights"),
                        format!("{shape:?}"),
                        format!("{:?}", w.shape()),
                    ));
                }
                if w.dtype() != cfg.weight_dtype {
                    return Err(Error::invalid(format!(
                        "{what} {name} weights are {:?}, the config says {:?}",
                        w.dtype(),
                        cfg.weight_dtype
                    )));
                }
            }
            Ok(())
        };
        expect("expert", &experts, [e, f])?;
        if experts.has_bias() != cfg.expert_bias {
            return Err(Error::invalid(format!(
                "the routed experts {} biases but config.expert_bias is {}",
                if experts.has_bias() { "have" } else { "have no" },
                cfg.expert_bias
            )));
        }
        match (&shared, cfg.shared_ffn) {
            (Some(s), Some(fs)) => expect("shared expert", s, [1, fs])?,
            (None, None) => {}
            _ => return Err(Error::invalid("shared expert weights and config.shared_ffn disagree")),
        }
        let experts = experts.with_activation(cfg.activation)?;
        let mut kernels = cfg.ffn_kernels(AdapterKind::of(ctx.adapter()));
        let tuned_rows = match cfg.kernels {
            KernelChoice::Tuned => Some(TuneOptions::for_context(ctx).rows),
            KernelChoice::TunedFor { tokens } => Some(cfg.expected_rows_per_expert(tokens)),
            KernelChoice::Default | KernelChoice::Fixed { .. } => None,
        };
        if let Some(rows) = tuned_rows {
            let opts = TuneOptions { rows, ..TuneOptions::for_context(ctx) };
            kernels = tune_with(ctx, &experts, cfg.gemm_order, &opts, driver).await?.kernels;
        }
        // A cooperative-matrix block runs its device check here, so no plan of the layer submits.
        check_on_device(ctx, &[kernels.up, kernels.down])?;
        let experts = experts.with_kernels(kernels)?;
        let shared = shared.map(|s| s.with_kernels(kernels)?.with_activation(cfg.activation)).transpose()?;
        let shared_gate = match &router.shared_gate {
            Some(g) => Some(ExpertWeights::from_f32(ctx, g, WeightDtype::F32, 1, 1, h)?),
            None => None,
        };
        Ok(MoeLayer {
            cfg,
            router: ctx.upload("router", &router.gate_buffer())?,
            bias: router.bias.as_ref().map(|b| ctx.upload("router bias", b)).transpose()?,
            experts,
            shared,
            shared_gate,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MoeConfig {
        &self.cfg
    }

    /// The router `[E, H]` and its selection bias `[E]` on the device.
    #[cfg(feature = "dag")]
    pub(crate) fn router_buffers(&self) -> (&wgpu::Buffer, Option<&wgpu::Buffer>) {
        (&self.router, self.bias.as_ref())
    }

    /// The shared expert and its gate on the device, if the layer has one.
    #[cfg(feature = "dag")]
    pub(crate) fn shared_expert(&self) -> Option<(&ExpertFfn, Option<&ExpertWeights>)> {
        self.shared.as_ref().map(|s| (s, self.shared_gate.as_ref()))
    }

    /// The routed experts on the device.
    #[cfg(feature = "dag")]
    pub(crate) fn routed_experts(&self) -> &ExpertFfn {
        &self.experts
    }

    /// Row tile of the dispatch layout: the expert kernels' block rows (16 for the direct
    /// blocks on CPU adapters, 32 for tiles), so each expert's rows are padded no further than
    /// its kernels need.
    pub fn dispatch_tile(&self, ctx: &Context) -> u32 {
        self.experts.kernels(ctx).block_rows()
    }

    /// The [`ForwardIo`] of `x[tokens, H]` and `y[tokens, H]` (f32) at the start of `x` and `y`
    /// (whole buffers or views), the routing results and logits in the workspace.
    ///
    /// # Errors
    /// As [`Tensor::new`].
    pub fn io<'b>(
        &self,
        x: impl Into<BufferView<'b>>,
        y: impl Into<BufferView<'b>>,
        tokens: u32,
    ) -> Result<ForwardIo<'b>> {
        let shape = [tokens, self.cfg.route.hidden];
        Ok(ForwardIo::new(
            Tensor::named("x", x.into(), shape, DType::F32)?,
            Tensor::named("y", y.into(), shape, DType::F32)?,
        ))
    }

    /// Plans forwards of up to `T` tokens from `x[T, H]` into `y[T, H]` (and the routing
    /// results or logits into the caller's tensors where `io` gives them; see [`ForwardIo`]).
    /// The tensors are views of whole buffers or of an activation arena (x and y may swap roles
    /// between layers; a view gives the bits of a buffer of its own). Each forward runs the
    /// live count of [`ForwardPlan::set_live_tokens`] (T until set) on the first rows, with the
    /// bits of a plan made for exactly that count. The plan's scratch is its own, a buffer per
    /// region of [`Self::workspace_for`]; [`Self::plan_in`] takes it from the caller's buffer
    /// instead.
    ///
    /// # Errors
    /// [`Error::Shape`] naming a tensor whose shape or element type is not the layer's
    /// ([`ForwardIo`]); [`Error::InvalidArgument`] for x without rows, logits asked of a route
    /// mode that does not write them, or a tensor at an offset the device cannot bind;
    /// [`Error::LimitExceeded`] for sizes past u32 indices or the adapter's limits; the stages'
    /// planning errors.
    pub fn plan(&self, ctx: &Context, io: ForwardIo<'_>) -> Result<ForwardPlan> {
        let workspace = Workspace::own(ctx, &self.workspace_for(ctx, &io)?)?;
        // `workspace_for` checked `io`.
        self.plan_with(ctx, &io, &workspace)
    }

    /// [`Self::plan`] with its scratch in `workspace`: a [`Workspace`] made from the caller's
    /// buffer ([`Workspace::new`]) with [`Self::workspace`]'s layout for at least the plan's
    /// maximum token count (or [`Self::workspace_for`]'s, or a layout merged with one). Layers
    /// that run one after another can share one workspace, and x and y can lie in its buffer
    /// beside it: a forward reads nothing in the workspace that it did not write. What it holds
    /// after a forward ([`ForwardPlan::indices`], [`ForwardPlan::load`]) is that forward's until
    /// the next forward that shares it.
    ///
    /// # Errors
    /// As [`Self::plan`]; [`Error::InvalidArgument`] for a workspace without a region this plan
    /// takes, or one too small.
    pub fn plan_in(&self, ctx: &Context, io: ForwardIo<'_>, workspace: &Workspace) -> Result<ForwardPlan> {
        io.check(&self.cfg)?;
        self.plan_with(ctx, &io, workspace)
    }

    /// The scratch a plan for up to `max_tokens` tokens takes on `ctx`: its regions, the bytes
    /// of a buffer holding them all and their alignment (see [`Self::plan_in`]). Only what
    /// this configuration runs: no logits unless the route mode writes them, no shared-expert
    /// regions without one, the dispatch layout only where counts take the grouped path.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero tokens; [`Error::LimitExceeded`] for sizes past u32
    /// indices.
    pub fn workspace(&self, ctx: &Context, max_tokens: u32) -> Result<WorkspaceLayout> {
        check_max_tokens(max_tokens)?;
        self.layout(ctx, max_tokens, CallerOutputs::default())
    }

    /// [`Self::workspace`] for a plan of `io`: for its maximum token count, without the regions
    /// of the results it writes to the caller's tensors.
    ///
    /// # Errors
    /// As [`Self::plan`] for `io`'s tensors; as [`Self::workspace`].
    pub fn workspace_for(&self, ctx: &Context, io: &ForwardIo<'_>) -> Result<WorkspaceLayout> {
        io.check(&self.cfg)?;
        self.layout(ctx, io.max_tokens(), io.caller_outputs())
    }

    fn layout(&self, ctx: &Context, max_tokens: u32, caller: CallerOutputs) -> Result<WorkspaceLayout> {
        let kernels = self.experts.kernels(ctx);
        self.cfg.workspace_layout(
            max_tokens,
            &[kernels.up, kernels.down],
            self.dispatch_tile(ctx),
            &ctx.device().limits(),
            caller,
        )
    }

    /// Plans a forward of `io` (checked against the layer by the caller) with its scratch taken
    /// from `workspace`.
    fn plan_with(&self, ctx: &Context, io: &ForwardIo<'_>, workspace: &Workspace) -> Result<ForwardPlan> {
        let c = &self.cfg;
        let (max_tokens, x, y) = (io.max_tokens(), io.x.view(), io.y.view());
        let (t, h, k) = (u64::from(max_tokens), u64::from(c.route.hidden), u64::from(c.route.k));
        let entries = max_tokens
            .checked_mul(c.route.k)
            .ok_or_else(|| Error::limit("max_tokens * k", t * k, u32::MAX.into(), "u32 entries"))?;
        // x is read; y, the caller's routing tensors and every workspace region are written:
        // none of them may share a byte with another.
        let mut views = vec![("x", x, Use::Read), ("y", y, Use::Write)];
        if let Some((i, w)) = io.routing {
            views.extend([("indices", i.view(), Use::Write), ("weights", w.view(), Use::Write)]);
        }
        views.extend(io.logits.map(|l| ("logits", l.view(), Use::Write)));
        views.extend(workspace.views().map(|(key, view)| (key.label(), view, Use::Write)));
        check_disjoint(&views)?;
        // Every region was sized and checked against the binding limit before any was made, and
        // the layout holds nothing this configuration does not use.
        let scratch = Scratch::Laid(ctx, workspace);
        let (indices, weights) = match io.routing {
            Some((i, w)) => (Region::of(i.view()), Region::of(w.view())),
            None => (
                scratch.take(ScratchKey::TopkIndices, word_bytes(t * k))?,
                scratch.take(ScratchKey::TopkWeights, word_bytes(t * k))?,
            ),
        };
        let logits = match (c.route_mode.writes_logits(), io.logits) {
            (true, Some(l)) => Some(Region::of(l.view())),
            (true, None) => {
                Some(scratch.take(ScratchKey::RouterLogits, word_bytes(t * u64::from(c.route.experts)))?)
            }
            (false, _) => None,
        };
        let partial = scratch.take(ScratchKey::ExpertOutputs, word_bytes(t * k * h))?;
        let mut stages = Vec::new();
        let route_bufs = RouteBuffers {
            x,
            gate: &self.router,
            bias: self.bias.as_ref(),
            logits: logits.as_ref().map(Region::view),
            indices: indices.view(),
            weights: weights.view(),
        };
        stages.push((
            ForwardStage::Route,
            plan_route(ctx, &c.route, max_tokens, &route_bufs, c.route_mode)?.into_dispatches(),
        ));
        let ffn_bufs = FfnBuffers { x, indices: indices.view(), partial: partial.view() };
        let (mut layout, mut buckets) = (None, None);
        // The decode path for the counts that take it, the grouped path past them.
        let decode_until = c.decode_until(max_tokens);
        let decode = |counts| -> Result<Vec<Dispatch>> {
            let ds = plan_ffn_with(
                scratch,
                &self.experts,
                decode_until,
                c.route.k,
                &ffn_bufs,
                FfnRouting::Decode,
            )?;
            Ok(only_for(ds.into_dispatches(), counts))
        };
        match c.capacity {
            Capacity::Dropless if decode_until == max_tokens => {
                stages.push((ForwardStage::Experts, decode(0..=u32::MAX)?));
            }
            Capacity::Dropless => {
                let l = DispatchLayout::with_scratch(
                    scratch,
                    DispatchConfig { experts: c.route.experts, k: c.route.k, tile: self.dispatch_tile(ctx) },
                    max_tokens,
                    0,
                )?;
                let grouped = decode_until + 1..=u32::MAX;
                stages
                    .push((ForwardStage::Dispatch, only_for(l.plan(ctx, indices.view())?, grouped.clone())));
                let mut ds = decode(0..=decode_until)?;
                let ffn = plan_ffn_with(
                    scratch,
                    &self.experts,
                    max_tokens,
                    c.route.k,
                    &ffn_bufs,
                    FfnRouting::Grouped(&l),
                )?;
                ds.extend(only_for(ffn.into_dispatches(), grouped));
                stages.push((ForwardStage::Experts, ds));
                layout = Some(l);
            }
            Capacity::Bounded { bound, policy } => {
                let cfg = BucketConfig { n_caps: c.route.experts, bound, policy };
                let b = BucketLayout::with_scratch(scratch, cfg, entries)?.with_winners_per_token(c.route.k);
                let mut ds = b.plan(ctx, indices.view())?;
                if policy == OverflowPolicy::Drop {
                    let row = c.route.k * c.route.hidden;
                    ds.push(plan_fill_zero_per_token(ctx, partial.view(), entries * c.route.hidden, row)?);
                }
                stages.push((ForwardStage::Dispatch, ds));
                let routing = FfnRouting::Bucketed(&b);
                stages.push((
                    ForwardStage::Experts,
                    plan_ffn_with(scratch, &self.experts, max_tokens, c.route.k, &ffn_bufs, routing)?
                        .into_dispatches(),
                ));
                buckets = Some(b);
            }
        }
        let mut shared = None;
        if let Some(s) = &self.shared {
            let rows = scratch.take(ScratchKey::SharedOutput, word_bytes(t * h))?;
            let mut ds = plan_dense_ffn_with(scratch, s, max_tokens, x, rows.view())?.into_dispatches();
            let gate_logits = match &self.shared_gate {
                Some(g) => {
                    let gl = scratch.take(ScratchKey::SharedGateLogits, word_bytes(t))?;
                    let (kernel, order) = (DenseKernel::Rowwise, c.gemm_order);
                    ds.extend(
                        plan_dense_with(scratch, g, max_tokens, x, gl.view(), kernel, order)?
                            .into_dispatches(),
                    );
                    Some(gl)
                }
                None => None,
            };
            stages.push((ForwardStage::Shared, ds));
            shared = Some((rows, gate_logits));
        }
        let shared = shared.as_ref().map(|(rows, gate_logits)| Shared {
            rows: rows.view(),
            gate_logits: gate_logits.as_ref().map(Region::view),
        });
        let combine = CombineBuffers { weights: weights.view(), partial: partial.view(), shared, y };
        stages.push((
            ForwardStage::Combine,
            plan_combine(ctx, max_tokens, c.route.hidden, c.route.k, &combine, c.combine)?,
        ));
        let live = ctx.upload("live tokens", &[max_tokens])?;
        let counts = ctx.upload("token counts", &(0..=max_tokens).collect::<Vec<u32>>())?;
        let mut all: Vec<&mut Dispatch> = stages.iter_mut().flat_map(|(_, ds)| ds.iter_mut()).collect();
        let sizing = plan_sizing(ctx, &live, max_tokens, &mut all)?;
        if !sizing.is_empty() {
            stages.insert(0, (ForwardStage::Size, sizing));
        }
        Ok(ForwardPlan {
            max_tokens,
            live,
            counts,
            decode_until,
            k: c.route.k,
            experts: c.route.experts,
            stages,
            indices,
            weights,
            logits,
            layout,
            buckets,
        })
    }

    /// Builds, up front, every pipeline a forward of 1 to `max_tokens` tokens can use, so
    /// that no later [`Self::plan`] of such a forward compiles a shader (it makes the
    /// weights' texture copies too, where the kernels read them): it plans a forward of up to
    /// `max_tokens` tokens, which holds both the decode and the grouped path where the counts
    /// take both. With a driver pipeline cache loaded first
    /// ([`Context::load_pipeline_cache`]), the builds also fill it, to be saved for the next
    /// run ([`Context::save_pipeline_cache`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero tokens; [`Self::plan`]'s errors.
    pub fn prepare(&self, ctx: &Context, max_tokens: u32) -> Result<PrepareReport> {
        pollster::block_on(self.prepare_with(ctx, max_tokens, Driver::Inline))
    }

    /// [`Self::prepare`] without blocking the awaiting thread on the weights' texture copies
    /// (the pipeline builds themselves run on the calling thread: wgpu builds pipelines
    /// synchronously).
    ///
    /// # Errors
    /// As [`Self::prepare`].
    pub async fn prepare_async(&self, ctx: &Context, max_tokens: u32) -> Result<PrepareReport> {
        self.prepare_with(ctx, max_tokens, Driver::Thread).await
    }

    async fn prepare_with(&self, ctx: &Context, max_tokens: u32, driver: Driver) -> Result<PrepareReport> {
        if max_tokens == 0 {
            return Err(Error::invalid("prepare needs a maximum token count of at least 1"));
        }
        let before = ctx.pipeline_count();
        let start = std::time::Instant::now();
        let rows = word_bytes(u64::from(max_tokens) * u64::from(self.cfg.route.hidden));
        let x = ctx.storage_scratch("prepare x", rows)?;
        let y = ctx.storage_scratch("prepare y", rows)?;
        self.plan(ctx, self.io(&x, &y, max_tokens)?)?;
        // The texture copies planning queued, done.
        ctx.submitted("prepare", ctx.encoder("prepare"), driver).await?;
        let total = ctx.pipeline_count();
        Ok(PrepareReport {
            pipelines_built: total - before,
            pipelines_total: total,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Runs one forward on host data and reads the results back (for tests, examples and
    /// one-off use; an application records a [`ForwardPlan`] instead). An empty `x` (no
    /// tokens) gives empty results without touching the device.
    ///
    /// # Errors
    /// [`Error::Shape`] when `x` is not whole rows of H; [`Self::plan`]'s errors; device
    /// errors while running or reading back.
    pub fn forward_host(&self, ctx: &Context, x: &[f32]) -> Result<ForwardOutput> {
        pollster::block_on(self.forward_host_with(ctx, x, Driver::Inline))
    }

    /// [`Self::forward_host`] without blocking the awaiting thread: the submission and the
    /// read-backs are awaited ([`Context::submit_async`]).
    ///
    /// # Errors
    /// As [`Self::forward_host`].
    pub async fn forward_host_async(&self, ctx: &Context, x: &[f32]) -> Result<ForwardOutput> {
        self.forward_host_with(ctx, x, Driver::Thread).await
    }

    async fn forward_host_with(&self, ctx: &Context, x: &[f32], driver: Driver) -> Result<ForwardOutput> {
        let h = self.cfg.route.hidden as usize;
        if !x.len().is_multiple_of(h) {
            return Err(Error::shape("x", format!("rows of hidden = {h}"), x.len()));
        }
        let tokens = u32::try_from(x.len() / h)
            .map_err(|_| Error::limit("tokens", (x.len() / h) as u64, u32::MAX.into(), "u32"))?;
        if tokens == 0 {
            return Ok(ForwardOutput { y: Vec::new(), indices: Vec::new(), weights: Vec::new() });
        }
        let xb = ctx.upload("x", x)?;
        let yb = ctx.zeroed("y", word_bytes(x.len() as u64))?;
        let plan = self.plan(ctx, self.io(&xb, &yb, tokens)?)?;
        let mut encoder = ctx.device().create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        plan.record(&mut encoder, tokens)?;
        ctx.submitted("forward", encoder, driver).await?;
        let n = tokens as usize * self.cfg.route.k as usize;
        Ok(ForwardOutput {
            y: ctx.read_back_with(&yb, x.len(), driver).await?,
            indices: ctx.read_back_with(plan.indices(), n, driver).await?,
            weights: ctx.read_back_with(plan.weights(), n, driver).await?,
        })
    }
}
