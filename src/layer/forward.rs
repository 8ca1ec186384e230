//! A planned forward ([`ForwardPlan`]): its stages ([`ForwardStage`]), recorded into the
//! caller's encoder at each live token count.

use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{BucketLayout, DispatchLayout, LoadStats};
use crate::pipeline::Dispatch;
use crate::tensor::word_bytes;
use crate::tensor::{DType, Tensor};
use crate::workspace::Region;

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

/// Intermediate buffers and dispatches of a forward of up to a maximum token count. Build it once
/// with [`MoeLayer::plan`](super::MoeLayer::plan) and record each forward at its count
/// ([`Self::record`], or [`Self::record_device_count`] for a count written on the device): no
/// re-planning, no allocation.
#[derive(Debug)]
pub struct ForwardPlan {
    pub(super) max_tokens: u32,
    /// The live token count (one u32), read by the sizing stage.
    pub(super) live: wgpu::Buffer,
    /// `counts[n] = n` for n up to the maximum: [`Self::record`] copies its count from here.
    pub(super) counts: wgpu::Buffer,
    /// The largest count that takes the decode path (0: none).
    pub(super) decode_until: u32,
    /// Experts per token.
    pub(super) k: u32,
    /// Experts.
    pub(super) experts: u32,
    pub(super) stages: Vec<(ForwardStage, Vec<Dispatch>)>,
    pub(super) indices: Region,
    pub(super) weights: Region,
    /// `partial[max_tokens · k, H]`: each entry's expert output, read by the combine (a hybrid
    /// forward copies the host's rows into it).
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) partial: Region,
    pub(super) logits: Option<Region>,
    pub(super) layout: Option<DispatchLayout>,
    pub(super) buckets: Option<BucketLayout>,
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

    /// Records the dispatches of `stages` of a forward of `tokens` tokens (checked by the
    /// caller), in one compute pass, the count copied into [`Self::live_tokens`] first where
    /// `stages` holds the sizing stage: [`Self::record`] cut at stage boundaries, for a forward
    /// whose parts are submitted apart; the pass timed by `timestamp_writes` where given.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn record_stages(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        tokens: u32,
        stages: &[ForwardStage],
        timestamp_writes: Option<wgpu::ComputePassTimestampWrites<'_>>,
    ) {
        if stages.contains(&ForwardStage::Size) {
            encoder.copy_buffer_to_buffer(&self.counts, word_bytes(u64::from(tokens)), &self.live, 0, 4);
        }
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("moeflow stages"),
            timestamp_writes,
        });
        for d in self.stages.iter().filter(|(s, _)| stages.contains(s)).flat_map(|(_, ds)| ds) {
            if let Some(grid) = d.grid_at(tokens) {
                d.record_grid(&mut pass, grid);
            }
        }
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
    pub(crate) fn check_live(&self, tokens: u32) -> Result<()> {
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
    /// [`ForwardIo::with_routing`](super::ForwardIo::with_routing) gave one, else in the plan's
    /// workspace (where a layer sharing it overwrites them).
    pub fn indices(&self) -> Tensor<'_> {
        Tensor::within(self.indices.view(), [self.max_tokens, self.k], DType::U32)
    }

    /// `weights[max_tokens, k]` (f32) written by the route stage (where [`Self::indices`] are).
    pub fn weights(&self) -> Tensor<'_> {
        Tensor::within(self.weights.view(), [self.max_tokens, self.k], DType::F32)
    }

    /// `logits[max_tokens, experts]` (f32) written by the route stage, where its mode writes
    /// them: the caller's tensor where [`ForwardIo::with_logits`](super::ForwardIo::with_logits)
    /// gave one, else in the plan's workspace.
    pub fn logits(&self) -> Option<Tensor<'_>> {
        let shape = [self.max_tokens, self.experts];
        self.logits.as_ref().map(|l| Tensor::within(l.view(), shape, DType::F32))
    }

    /// Expert load of the last forward (reads counts back; not part of the forward).
    ///
    /// # Errors
    /// A device error while reading back.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(&self, ctx: &Context, experts: u32) -> Result<LoadStats> {
        pollster::block_on(self.load_with(ctx, experts, Driver::Inline))
    }

    /// [`Self::load`], awaiting the read-backs instead of blocking on them.
    ///
    /// # Errors
    /// As [`Self::load`].
    pub async fn load_async(&self, ctx: &Context, experts: u32) -> Result<LoadStats> {
        self.load_with(ctx, experts, Driver::Await).await
    }

    /// [`Self::load`], its read-backs waited for as `driver` says.
    async fn load_with(&self, ctx: &Context, experts: u32, driver: Driver) -> Result<LoadStats> {
        let live = ctx.read_back_with::<u32>(&self.live, 1, driver).await?;
        let live = live.first().copied().unwrap_or(self.max_tokens).min(self.max_tokens);
        if let Some(b) = &self.buckets {
            return b.layout().stats_with(ctx, driver).await;
        }
        if let Some(l) = &self.layout
            && live > self.decode_until
        {
            return l.stats_with(ctx, driver).await;
        }
        // Decode path: no layout was filled; count on the host.
        let idx: Vec<u32> =
            ctx.read_back_with(self.indices.view(), live as usize * self.k as usize, driver).await?;
        let l = crate::kernels::dispatch::host::layout(&idx, experts, 1, 0);
        Ok(LoadStats::new(l.counts, l.meta))
    }
}
