//! [`MoeLayer`]: a layer's weights on the device, made from host weights or from expert
//! weights already uploaded (the kernels chosen, tuned where the configuration asks, and a
//! cooperative-matrix block checked on the device here, so no plan submits).

use super::config::{KernelChoice, MoeConfig};
use super::host::{MoeWeights, RouterWeights};
use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::kernels::gemm::{
    AdapterKind, ExpertBias, ExpertFfn, ExpertWeights, TuneOptions, WeightDtype, check_on_device_with,
    tune_with,
};

/// A MoE layer with its weights on the device.
#[derive(Debug)]
pub struct MoeLayer {
    pub(super) cfg: MoeConfig,
    pub(super) router: wgpu::Buffer,
    pub(super) bias: Option<wgpu::Buffer>,
    pub(super) experts: ExpertFfn,
    pub(super) shared: Option<ExpertFfn>,
    pub(super) shared_gate: Option<ExpertWeights>,
}

impl MoeLayer {
    /// Uploads `weights` for `cfg`.
    ///
    /// # Errors
    /// [`MoeConfig::validate`] and [`MoeWeights::check`]'s errors; tuning and device errors
    /// while uploading.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn new(ctx: &Context, cfg: MoeConfig, weights: &MoeWeights) -> Result<Self> {
        pollster::block_on(Self::new_with(ctx, cfg, weights, Driver::Inline))
    }

    /// [`Self::new`] without blocking the awaiting thread where the configuration tunes its
    /// kernels (the tuner's timed runs are awaited; uploads never wait).
    ///
    /// # Errors
    /// As [`Self::new`].
    pub async fn new_async(ctx: &Context, cfg: MoeConfig, weights: &MoeWeights) -> Result<Self> {
        Self::new_with(ctx, cfg, weights, Driver::Await).await
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
    #[cfg(not(target_arch = "wasm32"))]
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
        Self::with_experts_with(ctx, cfg, router, experts, shared, Driver::Await).await
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
        check_on_device_with(ctx, &[kernels.up, kernels.down], driver).await?;
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

    /// The routed experts' weights on the device (how each projection is split across
    /// bindings: [`ExpertWeights::chunk_count`](crate::kernels::gemm::ExpertWeights::chunk_count)).
    pub fn experts(&self) -> &ExpertFfn {
        &self.experts
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
}
