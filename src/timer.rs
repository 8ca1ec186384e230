//! Two clocks for one sample of GPU work: timestamp queries around the compute pass
//! (resolved once, after the whole timed sequence) and host wall time from submit to
//! completion.

use web_time::Instant;

use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::pipeline::Dispatch;

/// Most samples one sampler times with timestamps (two queries each, within wgpu's 4096).
pub const MAX_TIMED_SAMPLES: u32 = 2048;

/// Records samples of dispatch sequences and, where the adapter has timestamp queries,
/// their GPU durations.
pub struct Sampler<'c> {
    ctx: &'c Context,
    queries: Option<wgpu::QuerySet>,
    capacity: u32,
    used: u32,
}

/// One timed sample.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Host wall time from submit to completion, seconds.
    pub wall_s: f64,
    query: Option<u32>,
}

impl Sample {
    /// A sample timed on the wall clock only (the bench harness's host-side runs).
    #[cfg(feature = "bench")]
    pub(crate) fn wall_only(wall_s: f64) -> Self {
        Sample { wall_s, query: None }
    }
}

impl<'c> Sampler<'c> {
    /// A sampler for up to `samples` timed samples.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] past [`MAX_TIMED_SAMPLES`].
    pub fn new(ctx: &'c Context, samples: u32) -> Result<Self> {
        if samples > MAX_TIMED_SAMPLES {
            return Err(Error::limit(
                "timed samples",
                samples.into(),
                MAX_TIMED_SAMPLES.into(),
                "two timestamp queries per sample",
            ));
        }
        let queries = ctx.capabilities().timestamps.then(|| {
            ctx.device().create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("moeflow timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * samples.max(1),
            })
        });
        Ok(Sampler { ctx, queries, capacity: samples, used: 0 })
    }

    /// Whether GPU times will be available.
    pub fn has_gpu_clock(&self) -> bool {
        self.queries.is_some()
    }

    /// Timestamp writes at the beginning and end of a pass for sample `query`.
    fn timestamp_writes(&self, query: Option<u32>) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        match (&self.queries, query) {
            (Some(qs), Some(q)) => Some(wgpu::ComputePassTimestampWrites {
                query_set: qs,
                beginning_of_pass_write_index: Some(2 * q),
                end_of_pass_write_index: Some(2 * q + 1),
            }),
            _ => None,
        }
    }

    async fn run(
        &mut self,
        dispatches: &[&Dispatch],
        reps: u32,
        timed: bool,
        driver: Driver,
    ) -> Result<Sample> {
        let query = match (&self.queries, timed) {
            (Some(_), true) if self.used < self.capacity => {
                self.used += 1;
                Some(self.used - 1)
            }
            (Some(_), true) => {
                return Err(Error::invalid(format!("sampler holds {} timed samples", self.capacity)));
            }
            _ => None,
        };
        let mut encoder = self.ctx.encoder("moeflow sample");
        {
            let timestamp_writes = self.timestamp_writes(query);
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("moeflow sample"),
                timestamp_writes,
            });
            for _ in 0..reps {
                for d in dispatches {
                    d.record(&mut pass);
                }
            }
        }
        let start = Instant::now();
        self.ctx.submitted("timed sample", encoder, driver).await?;
        Ok(Sample { wall_s: start.elapsed().as_secs_f64(), query })
    }

    /// Runs each stage in its own timestamped pass, all in one submission. Every returned
    /// sample carries the wall time of the whole submission.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the stages need more samples than remain; device
    /// errors.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn sample_stages(&mut self, stages: &[Vec<&Dispatch>]) -> Result<Vec<Sample>> {
        pollster::block_on(self.sample_stages_with(stages, Driver::Inline))
    }

    /// [`Self::sample_stages`], awaiting the submission instead of blocking on it.
    ///
    /// # Errors
    /// As [`Self::sample_stages`].
    pub async fn sample_stages_async(&mut self, stages: &[Vec<&Dispatch>]) -> Result<Vec<Sample>> {
        self.sample_stages_with(stages, Driver::Await).await
    }

    /// [`Self::sample_stages`], waiting as `driver` says.
    async fn sample_stages_with(&mut self, stages: &[Vec<&Dispatch>], driver: Driver) -> Result<Vec<Sample>> {
        let n = stages.len() as u32;
        if self.queries.is_some() && self.used + n > self.capacity {
            return Err(Error::invalid(format!("sampler holds {} timed samples", self.capacity)));
        }
        let mut encoder = self.ctx.encoder("moeflow stages");
        let mut queries = Vec::with_capacity(stages.len());
        for stage in stages {
            let query = self.queries.as_ref().map(|_| {
                self.used += 1;
                self.used - 1
            });
            queries.push(query);
            let timestamp_writes = self.timestamp_writes(query);
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("moeflow stage"),
                timestamp_writes,
            });
            for d in stage {
                d.record(&mut pass);
            }
        }
        let start = Instant::now();
        self.ctx.submitted("timed stages", encoder, driver).await?;
        let wall_s = start.elapsed().as_secs_f64();
        Ok(queries.into_iter().map(|query| Sample { wall_s, query }).collect())
    }

    /// Runs `dispatches` `reps` times in one pass and times it on both clocks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the sampler is full; device errors.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn sample(&mut self, dispatches: &[&Dispatch], reps: u32) -> Result<Sample> {
        pollster::block_on(self.run(dispatches, reps, true, Driver::Inline))
    }

    /// [`Self::sample`], awaiting the submission instead of blocking on it.
    ///
    /// # Errors
    /// As [`Self::sample`].
    pub async fn sample_async(&mut self, dispatches: &[&Dispatch], reps: u32) -> Result<Sample> {
        self.run(dispatches, reps, true, Driver::Await).await
    }

    /// [`Self::sample`], waiting as `driver` says.
    pub(crate) async fn sample_with(
        &mut self,
        dispatches: &[&Dispatch],
        reps: u32,
        driver: Driver,
    ) -> Result<Sample> {
        self.run(dispatches, reps, true, driver).await
    }

    /// Runs `dispatches` `reps` times in one pass without a timestamp (warm-up).
    ///
    /// # Errors
    /// Device errors.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn untimed(&mut self, dispatches: &[&Dispatch], reps: u32) -> Result<Sample> {
        pollster::block_on(self.run(dispatches, reps, false, Driver::Inline))
    }

    /// [`Self::untimed`], waiting as `driver` says.
    pub(crate) async fn untimed_with(
        &mut self,
        dispatches: &[&Dispatch],
        reps: u32,
        driver: Driver,
    ) -> Result<Sample> {
        self.run(dispatches, reps, false, driver).await
    }

    /// GPU seconds of each timed sample, in the order given (None without timestamps, or
    /// where the adapter returned an end before the beginning).
    ///
    /// # Errors
    /// Device errors while resolving or reading the timestamps.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn gpu_seconds(&self, samples: &[Sample]) -> Result<Vec<Option<f64>>> {
        pollster::block_on(self.gpu_seconds_with(samples, Driver::Inline))
    }

    /// [`Self::gpu_seconds`], awaiting the read-back instead of blocking on it.
    ///
    /// # Errors
    /// As [`Self::gpu_seconds`].
    pub async fn gpu_seconds_async(&self, samples: &[Sample]) -> Result<Vec<Option<f64>>> {
        self.gpu_seconds_with(samples, Driver::Await).await
    }

    /// [`Self::gpu_seconds`], waiting as `driver` says.
    pub(crate) async fn gpu_seconds_with(
        &self,
        samples: &[Sample],
        driver: Driver,
    ) -> Result<Vec<Option<f64>>> {
        let Some(qs) = &self.queries else {
            return Ok(vec![None; samples.len()]);
        };
        if self.used == 0 {
            return Ok(vec![None; samples.len()]);
        }
        let count = 2 * self.used;
        let resolve = self.ctx.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some("moeflow timestamp resolve"),
            size: u64::from(count) * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut encoder = self.ctx.encoder("moeflow resolve timestamps");
        encoder.resolve_query_set(qs, 0..count, &resolve, 0);
        self.ctx.submitted("timestamp resolve", encoder, driver).await?;
        let ticks: Vec<u64> = self.ctx.read_back_with(&resolve, count as usize, driver).await?;
        let period_ns = f64::from(self.ctx.queue().get_timestamp_period());
        Ok(samples
            .iter()
            .map(|s| {
                s.query.and_then(|q| {
                    let (begin, end) = (ticks[2 * q as usize], ticks[2 * q as usize + 1]);
                    (end > begin).then(|| (end - begin) as f64 * period_ns * 1e-9)
                })
            })
            .collect())
    }
}
