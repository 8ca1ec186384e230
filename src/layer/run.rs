//! One-off use of a layer: building its pipelines up front ([`MoeLayer::prepare`]) and a
//! forward on host data read back ([`MoeLayer::forward_host`]).

use super::moe_layer::MoeLayer;
use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::tensor::word_bytes;

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

impl ForwardOutput {
    /// The results of an empty batch.
    pub(super) fn empty() -> Self {
        ForwardOutput { y: Vec::new(), indices: Vec::new(), weights: Vec::new() }
    }
}

impl MoeLayer {
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
    #[cfg(not(target_arch = "wasm32"))]
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
        self.prepare_with(ctx, max_tokens, Driver::Await).await
    }

    async fn prepare_with(&self, ctx: &Context, max_tokens: u32, driver: Driver) -> Result<PrepareReport> {
        if max_tokens == 0 {
            return Err(Error::invalid("prepare needs a maximum token count of at least 1"));
        }
        let before = ctx.pipeline_count();
        let start = web_time::Instant::now();
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

    /// Runs one forward on host data and reads the results back (for tests, examples and one-off
    /// use; an application records a [`ForwardPlan`](super::ForwardPlan) instead). An empty `x` (no
    /// tokens) gives empty results without touching the device.
    ///
    /// # Errors
    /// [`Error::Shape`] when `x` is not whole rows of H; [`Self::plan`]'s errors; device
    /// errors while running or reading back.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn forward_host(&self, ctx: &Context, x: &[f32]) -> Result<ForwardOutput> {
        pollster::block_on(self.forward_host_with(ctx, x, Driver::Inline))
    }

    /// [`Self::forward_host`] without blocking the awaiting thread: the submission and the
    /// read-backs are awaited ([`Context::submit_async`]).
    ///
    /// # Errors
    /// As [`Self::forward_host`].
    pub async fn forward_host_async(&self, ctx: &Context, x: &[f32]) -> Result<ForwardOutput> {
        self.forward_host_with(ctx, x, Driver::Await).await
    }

    /// The tokens of host rows `x` (whole rows of H, at most `u32::MAX`).
    ///
    /// # Errors
    /// [`Error::Shape`] when `x` is not whole rows of H; [`Error::LimitExceeded`] past u32 rows.
    pub(super) fn host_tokens(&self, x: &[f32]) -> Result<u32> {
        let h = self.cfg.route.hidden as usize;
        if !x.len().is_multiple_of(h) {
            return Err(Error::shape("x", format!("rows of hidden = {h}"), x.len()));
        }
        u32::try_from(x.len() / h)
            .map_err(|_| Error::limit("tokens", (x.len() / h) as u64, u32::MAX.into(), "u32"))
    }

    async fn forward_host_with(&self, ctx: &Context, x: &[f32], driver: Driver) -> Result<ForwardOutput> {
        let tokens = self.host_tokens(x)?;
        if tokens == 0 {
            return Ok(ForwardOutput::empty());
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
