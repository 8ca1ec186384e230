//! A forward of a layer whose routed experts are split between the device and the host
//! ([`HybridForward`]): llama.cpp's `--cpu-moe`, in three submissions.
//!
//! 1. The sizing and route stages, then one copy of the routing indices and of x into a
//!    read-back buffer; submitted.
//! 2. The dispatch layout, the device's experts (the kernels skip rows routed to experts the
//!    device does not hold) and the shared expert; submitted at once, so the device computes
//!    them while the host works. Where the device holds none of the routed experts
//!    (`--cpu-moe`), only the shared expert: no layout or expert kernels run for nothing.
//! 3. Once the first submission is done (a wait for it alone): the read-back mapped, the rows
//!    routed to host experts computed by [`HostExperts::run`] on the CPU's threads, their
//!    outputs uploaded in one write, copied into the entries' rows of the partial outputs, and
//!    the combine, unchanged, in slot order; submitted.

#[cfg(not(target_arch = "wasm32"))]
use crate::context::Context;
#[cfg(not(target_arch = "wasm32"))]
use crate::context::wait::Driver;
#[cfg(not(target_arch = "wasm32"))]
use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use crate::host_experts::{HostEntry, HostExperts, filled};
#[cfg(not(target_arch = "wasm32"))]
use crate::tensor::word_bytes;

#[cfg(not(target_arch = "wasm32"))]
use super::config::Capacity;
#[cfg(not(target_arch = "wasm32"))]
use super::forward::{ForwardPlan, ForwardStage};
#[cfg(not(target_arch = "wasm32"))]
use super::io::ForwardIo;
#[cfg(not(target_arch = "wasm32"))]
use super::moe_layer::MoeLayer;
#[cfg(not(target_arch = "wasm32"))]
use super::run::ForwardOutput;

/// Where a hybrid forward's time went, in seconds: host wall clock from its first submission,
/// and the device's own clock for its stages beside the host's FFN.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct HybridTimes {
    /// Until the routing indices and x were on the host (the route stage and the read-back).
    pub routed: f64,
    /// The host experts' FFN (the device computes its own experts meanwhile).
    pub host: f64,
    /// Waiting, after the host's FFN, for the device's experts and shared expert: 0 when the
    /// device finished first.
    pub device_wait: f64,
    /// The device's time for its stages of the second submission (dispatch layout, its
    /// experts, the shared expert), from timestamp queries around their pass; None where
    /// the adapter has no timestamp queries. It starts once the route's submission is done,
    /// as the host's FFN does: where it exceeds [`Self::device_wait`], the device computed
    /// that long while the host did.
    pub device: Option<f64>,
    /// Rows the host computed.
    pub host_rows: usize,
}

/// A planned forward of a [`MoeLayer`] whose routed experts the device and a
/// [`HostExperts`] share (each expert on exactly one of them): made once for a maximum token
/// count ([`MoeLayer::plan_hybrid`]), run at any count up to it ([`Self::run`]). Each run
/// submits three times and waits for the route's submission; it returns once the combine is
/// submitted, so y is read as after any submission. One run at a time.
#[cfg(not(target_arch = "wasm32"))]
pub struct HybridForward<'h> {
    plan: ForwardPlan,
    host: &'h HostExperts<'h>,
    x: crate::workspace::Region,
    readback: wgpu::Buffer,
    upload: wgpu::Buffer,
    /// The device stages of the second submission: without dispatch and experts where the
    /// device holds no routed expert.
    device_stages: Vec<ForwardStage>,
    clock: Option<DeviceClock>,
    k: u32,
    hidden: u32,
}

/// Two timestamp queries around the device's pass of a hybrid forward, resolved into a
/// buffer and copied into a mappable one by the same submission.
#[cfg(not(target_arch = "wasm32"))]
struct DeviceClock {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    staging: wgpu::Buffer,
}

#[cfg(not(target_arch = "wasm32"))]
impl DeviceClock {
    /// Bytes of the two resolved timestamps.
    const BYTES: u64 = 16;

    /// A clock where `ctx`'s adapter has timestamp queries.
    fn new(ctx: &Context) -> Result<Option<Self>> {
        if !ctx.capabilities().timestamps {
            return Ok(None);
        }
        let queries = ctx.checked("hybrid forward's timestamp queries", || {
            ctx.device().create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("hybrid forward: device stages"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            })
        })?;
        let resolved = ctx.buffer(
            "hybrid timestamps",
            Self::BYTES,
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            false,
        )?;
        let staging = ctx.buffer(
            "hybrid timestamps read-back",
            Self::BYTES,
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            false,
        )?;
        Ok(Some(DeviceClock { queries, resolved, staging }))
    }

    /// The writes at the beginning and end of the timed pass.
    fn writes(&self) -> wgpu::ComputePassTimestampWrites<'_> {
        wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(0),
            end_of_pass_write_index: Some(1),
        }
    }

    /// Records, after the timed pass, the copy of its timestamps into the staging buffer.
    fn record_read(&self, encoder: &mut wgpu::CommandEncoder) {
        encoder.resolve_query_set(&self.queries, 0..2, &self.resolved, 0);
        encoder.copy_buffer_to_buffer(&self.resolved, 0, &self.staging, 0, Self::BYTES);
    }

    /// The timed pass's seconds, once `submission` (which recorded it and [`Self::record_read`])
    /// is done: a wait for it alone. None where the adapter gave an end before the beginning.
    async fn seconds(
        &self,
        ctx: &Context,
        submission: wgpu::SubmissionIndex,
        driver: Driver,
    ) -> Result<Option<f64>> {
        let ticks: Vec<u64> = ctx.mapped(&self.staging, 2, Some(submission), driver).await?;
        let period_ns = f64::from(ctx.queue().get_timestamp_period());
        Ok((ticks[1] >= ticks[0]).then(|| (ticks[1] - ticks[0]) as f64 * period_ns * 1e-9))
    }
}

/// How a hybrid forward waits for its device submission: by mapping the timestamps of its
/// pass, or by its own future.
#[cfg(not(target_arch = "wasm32"))]
enum DeviceDone<'c, F> {
    Timed(&'c DeviceClock, wgpu::SubmissionIndex),
    Untimed(F),
}

#[cfg(not(target_arch = "wasm32"))]
impl std::fmt::Debug for HybridForward<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridForward")
            .field("max_tokens", &self.plan.max_tokens())
            .field("host_experts", &self.host.experts())
            .finish_non_exhaustive()
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl MoeLayer {
    /// Plans hybrid forwards of `io` (as [`Self::plan`]) with the routed experts this layer's
    /// device weights do not hold computed by `host`
    /// ([`ExpertWeights::from_f32_placed`](crate::kernels::gemm::ExpertWeights::from_f32_placed),
    /// [`ExpertWeights::stream_placed`](crate::kernels::gemm::ExpertWeights::stream_placed)).
    /// Besides the plan: a read-back buffer for the routing indices and x
    /// (`max_tokens · (k + H)` words), an upload buffer for the host's rows
    /// (`max_tokens · k · H` words), and where the adapter has timestamp queries two of them
    /// for the device's stages ([`HybridTimes::device`]).
    ///
    /// # Errors
    /// [`Self::plan`]'s errors; [`Error::InvalidArgument`] for a capacity bound (hybrid
    /// forwards are dropless), host experts whose shape, order, activation or biases differ
    /// from the layer's, or an expert that both or neither of the device and the host hold.
    pub fn plan_hybrid<'h>(
        &self,
        ctx: &Context,
        io: ForwardIo<'_>,
        host: &'h HostExperts<'h>,
    ) -> Result<HybridForward<'h>> {
        let c = &self.cfg;
        if c.capacity != Capacity::Dropless {
            return Err(Error::invalid("a forward with host experts is dropless: set Capacity::Dropless"));
        }
        let (e, f, h) = (c.route.experts, c.ffn, c.route.hidden);
        if host.shape() != [e, f, h] {
            return Err(Error::shape(
                "host experts",
                format!("{:?}", [e, f, h]),
                format!("{:?}", host.shape()),
            ));
        }
        if host.order() != c.gemm_order
            || host.activation() != c.activation
            || host.has_bias() != c.expert_bias
        {
            return Err(Error::invalid(format!(
                "the host experts run {:?} order, {:?}, biases {}; the layer {:?}, {:?}, biases {}",
                host.order(),
                host.activation(),
                host.has_bias(),
                c.gemm_order,
                c.activation,
                c.expert_bias
            )));
        }
        for x in 0..e {
            match (self.experts.holds(x), host.holds(x)) {
                (true, true) => {
                    return Err(Error::invalid(format!("expert {x} is on both the device and the host")));
                }
                (false, false) => {
                    return Err(Error::invalid(format!("expert {x} is on neither the device nor the host")));
                }
                _ => {}
            }
        }
        let device_stages = if (0..e).any(|x| self.experts.holds(x)) {
            vec![ForwardStage::Dispatch, ForwardStage::Experts, ForwardStage::Shared]
        } else {
            vec![ForwardStage::Shared]
        };
        let x = crate::workspace::Region::of(io.x().view());
        let plan = self.plan(ctx, io)?;
        let t = u64::from(plan.max_tokens());
        let words = crate::size::product("hybrid read-back", &[t, u64::from(c.route.k) + u64::from(h)])?;
        let readback = ctx.buffer(
            "hybrid read-back",
            word_bytes(words),
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            false,
        )?;
        let rows = crate::size::product("hybrid upload", &[t, u64::from(c.route.k), u64::from(h)])?;
        let upload = ctx.buffer(
            "hybrid host rows",
            word_bytes(rows),
            wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            false,
        )?;
        let clock = DeviceClock::new(ctx)?;
        Ok(HybridForward { plan, host, x, readback, upload, device_stages, clock, k: c.route.k, hidden: h })
    }

    /// [`Self::forward_host`] with the experts the device does not hold computed by `host`
    /// ([`Self::plan_hybrid`]).
    ///
    /// # Errors
    /// As [`Self::forward_host`] and [`Self::plan_hybrid`]; the host experts' errors.
    pub fn forward_host_hybrid(
        &self,
        ctx: &Context,
        x: &[f32],
        host: &HostExperts<'_>,
    ) -> Result<ForwardOutput> {
        let tokens = self.host_tokens(x)?;
        if tokens == 0 {
            return Ok(ForwardOutput::empty());
        }
        let xb = ctx.upload("x", x)?;
        let yb = ctx.zeroed("y", word_bytes(x.len() as u64))?;
        let forward = self.plan_hybrid(ctx, self.io(&xb, &yb, tokens)?, host)?;
        forward.run(ctx, tokens)?;
        let n = tokens as usize * self.cfg.route.k as usize;
        Ok(ForwardOutput {
            y: ctx.read_back(&yb, x.len())?,
            indices: ctx.read_back(forward.plan().indices(), n)?,
            weights: ctx.read_back(forward.plan().weights(), n)?,
        })
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl HybridForward<'_> {
    /// Runs a forward of `tokens` tokens (the first rows of x and y), blocking the calling
    /// thread on the route's submission and the read-back; the host's FFN runs on the host
    /// experts' threads meanwhile. An empty batch (0 tokens) does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count past the plan's maximum; the host experts'
    /// errors ([`Error::HostMemory`] among them); device errors.
    pub fn run(&self, ctx: &Context, tokens: u32) -> Result<HybridTimes> {
        pollster::block_on(self.run_with(ctx, tokens, Driver::Inline))
    }

    /// [`Self::run`], its waits awaited (the host's FFN still runs on the calling task, on
    /// the host experts' threads).
    ///
    /// # Errors
    /// As [`Self::run`].
    pub async fn run_async(&self, ctx: &Context, tokens: u32) -> Result<HybridTimes> {
        self.run_with(ctx, tokens, Driver::Await).await
    }

    /// The device plan: its routing results ([`ForwardPlan::indices`], [`ForwardPlan::weights`]).
    pub fn plan(&self) -> &ForwardPlan {
        &self.plan
    }

    async fn run_with(&self, ctx: &Context, tokens: u32, driver: Driver) -> Result<HybridTimes> {
        if tokens == 0 {
            return Ok(HybridTimes::default());
        }
        self.plan.check_live(tokens)?;
        let (k, h) = (self.k as usize, self.hidden as usize);
        let entries = tokens as usize * k;
        let start = web_time::Instant::now();
        let mut route = ctx.encoder("hybrid forward: route");
        self.plan.record_stages(&mut route, tokens, &[ForwardStage::Size, ForwardStage::Route], None);
        let indices = self.plan.indices.view();
        let x = self.x.view();
        let (index_bytes, x_bytes) = (word_bytes(entries as u64), word_bytes(tokens as u64 * h as u64));
        route.copy_buffer_to_buffer(indices.buffer, indices.offset, &self.readback, 0, index_bytes);
        route.copy_buffer_to_buffer(x.buffer, x.offset, &self.readback, index_bytes, x_bytes);
        let routed = ctx.submit_indexed("hybrid forward: route", route)?;
        let mut device = ctx.encoder("hybrid forward: device experts");
        let writes = self.clock.as_ref().map(DeviceClock::writes);
        self.plan.record_stages(&mut device, tokens, &self.device_stages, writes);
        let device_done = match &self.clock {
            Some(clock) => {
                clock.record_read(&mut device);
                DeviceDone::Timed(clock, ctx.submit_indexed("hybrid forward: device experts", device)?)
            }
            None => DeviceDone::Untimed(ctx.submitted("hybrid forward: device experts", device, driver)),
        };
        let words: Vec<u32> =
            ctx.mapped(&self.readback, entries + tokens as usize * h, Some(routed), driver).await?;
        let routed_at = start.elapsed().as_secs_f64();
        let (indices, x) = words.split_at(entries);
        let (host_entries, slots): (Vec<HostEntry>, Vec<usize>) = indices
            .iter()
            .enumerate()
            .filter(|&(_, &e)| self.host.holds(e))
            .map(|(i, &e)| (HostEntry { token: (i / k) as u32, expert: e }, i))
            .unzip();
        let mut rows = filled("hybrid forward's host rows", host_entries.len() * h, 0.0f32)?;
        self.host.run(bytemuck::cast_slice(x), &host_entries, &mut rows)?;
        let hosted_at = start.elapsed().as_secs_f64();
        let mut combine = ctx.encoder("hybrid forward: combine");
        if !rows.is_empty() {
            ctx.checked("hybrid forward: host rows upload", || {
                ctx.queue().write_buffer(&self.upload, 0, bytemuck::cast_slice(&rows))
            })?;
            let partial = self.plan.partial.view();
            let row_bytes = word_bytes(h as u64);
            // Consecutive entries in one copy (every entry, with every expert on the host).
            let mut at = 0;
            while at < slots.len() {
                let mut end = at + 1;
                while end < slots.len() && slots[end] == slots[end - 1] + 1 {
                    end += 1;
                }
                combine.copy_buffer_to_buffer(
                    &self.upload,
                    at as u64 * row_bytes,
                    partial.buffer,
                    partial.offset + slots[at] as u64 * row_bytes,
                    (end - at) as u64 * row_bytes,
                );
                at = end;
            }
        }
        self.plan.record_stages(&mut combine, tokens, &[ForwardStage::Combine], None);
        // Submitted, not waited for: the caller's next submission or read-back follows it.
        drop(ctx.submitted("hybrid forward: combine", combine, driver));
        let device = match device_done {
            DeviceDone::Timed(clock, index) => clock.seconds(ctx, index, driver).await?,
            DeviceDone::Untimed(done) => {
                done.await?;
                None
            }
        };
        Ok(HybridTimes {
            routed: routed_at,
            host: hosted_at - routed_at,
            device_wait: start.elapsed().as_secs_f64() - hosted_at,
            device,
            host_rows: host_entries.len(),
        })
    }
}
