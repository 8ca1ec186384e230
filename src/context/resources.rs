//! [`Context`]'s buffers, uploads, readback and submissions (for tests, examples and
//! benchmarks at the edges of a forward pass, and for the library's own scratch; nothing inside
//! a forward pass reads back to the host).

use std::sync::{Arc, Mutex};

use bytemuck::Pod;

use super::device::Context;
use super::wait::{Driver, Signal, Until};
use crate::error::{Error, Result};
use crate::gpu::{DATA_USAGE, record};
use crate::pipeline::{BufferView, Dispatch};
use crate::size;
use crate::sync::lock;

/// Bytes for a buffer `label` holding `bytes` of data: at least 4, a multiple of 4.
///
/// # Errors
/// [`Error::InvalidArgument`] where rounding up does not fit in a u64.
fn padded(label: &str, bytes: u64) -> Result<u64> {
    size::round_up(&format!("buffer `{label}`"), bytes.max(4), 4)
}

/// Writes `bytes` at the start of a buffer created with `mapped_at_creation`, then unmaps it.
/// Run inside [`Context::checked`]: unmapping a buffer that is invalid (made on a device lost
/// meanwhile) is a validation error, which outside an error scope panics in wgpu.
fn fill_mapped(buffer: &wgpu::Buffer, bytes: &[u8]) {
    // A buffer mapped at creation is mapped over its whole size, so this range is valid.
    if let Ok(mut view) = buffer.slice(..).get_mapped_range_mut() {
        view.slice(..bytes.len()).copy_from_slice(bytes);
    }
    buffer.unmap();
}

impl Context {
    /// A buffer of `bytes` bytes (rounded up to 4) with `usage`, checked against the device's
    /// limits before it is made and created inside an error scope.
    pub(crate) fn buffer(
        &self,
        label: &str,
        bytes: u64,
        usage: wgpu::BufferUsages,
        mapped: bool,
    ) -> Result<wgpu::Buffer> {
        self.check_alive()?;
        let size = padded(label, bytes)?;
        let max = self.limits().max_buffer_size;
        if size > max {
            return Err(Error::limit(format!("buffer `{label}`"), size, max, "max_buffer_size"));
        }
        let buffer = self.checked(label, || {
            self.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage,
                mapped_at_creation: mapped,
            })
        })?;
        self.note_allocation(size);
        Ok(buffer)
    }

    /// A buffer with `data` in it, usable as storage and as a copy source or target.
    ///
    /// # Errors
    /// A size past `max_buffer_size`, an allocation the device refuses, or a lost device.
    pub fn upload<T: Pod>(&self, label: &str, data: &[T]) -> Result<wgpu::Buffer> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buffer = self.buffer(label, bytes.len() as u64, DATA_USAGE, true)?;
        self.checked(label, || fill_mapped(&buffer, bytes))?;
        Ok(buffer)
    }

    /// A zero-filled storage buffer of `bytes` bytes (rounded up to 4).
    ///
    /// # Errors
    /// As [`Context::upload`].
    pub fn zeroed(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        self.buffer(label, bytes, DATA_USAGE, false)
    }

    /// A zero-filled buffer of `bytes` bytes that a kernel binds whole as storage: checked
    /// against `max_storage_buffer_binding_size` before it is allocated.
    pub(crate) fn storage_scratch(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        self.check_storage_bytes(label, bytes)?;
        self.zeroed(label, bytes)
    }

    /// `bytes` of buffer `label` against the storage-binding limit.
    fn check_storage_bytes(&self, label: &str, bytes: u64) -> Result<()> {
        let limit = self.limits().max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(Error::limit(
                format!("buffer `{label}`"),
                bytes,
                limit,
                "max_storage_buffer_binding_size",
            ));
        }
        Ok(())
    }

    /// A zero-filled buffer of `bytes` bytes that one kernel writes as storage and others read
    /// in windows as uniform buffers; checked against the storage-binding limit. Copyable out,
    /// like every buffer moeflow makes, so a plan can be captured whole.
    pub(crate) fn window_scratch(&self, label: &str, bytes: u64) -> Result<wgpu::Buffer> {
        self.check_storage_bytes(label, bytes)?;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_SRC;
        self.buffer(label, bytes, usage, false)
    }

    /// A buffer of indirect grids (three u32 each) holding `grids`, which a kernel rewrites as
    /// storage; copyable out.
    pub(crate) fn indirect_args(&self, label: &str, grids: &[u32]) -> Result<wgpu::Buffer> {
        let bytes: &[u8] = bytemuck::cast_slice(grids);
        let usage = DATA_USAGE | wgpu::BufferUsages::INDIRECT;
        let buffer = self.buffer(label, bytes.len() as u64, usage, true)?;
        self.checked(label, || fill_mapped(&buffer, bytes))?;
        Ok(buffer)
    }

    /// A uniform buffer holding `value` (see [`Context::uniform_bytes`]).
    pub(crate) fn uniform<T: Pod>(&self, label: &str, value: &T) -> Result<wgpu::Buffer> {
        self.uniform_bytes(label, bytemuck::bytes_of(value))
    }

    /// A uniform buffer holding `bytes` (copyable both ways: kernels' parameters are rewritten
    /// in place, and read back when a plan is captured; bindable as storage, where a sizing
    /// kernel rewrites the words that follow a live token count).
    pub(crate) fn uniform_bytes(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
        let usage = wgpu::BufferUsages::UNIFORM | DATA_USAGE;
        let buffer = self.buffer(label, bytes.len() as u64, usage, true)?;
        self.checked(label, || fill_mapped(&buffer, bytes))?;
        Ok(buffer)
    }

    /// Submits `encoder` and waits until the device has finished it (blocking this thread; see
    /// [`Self::submit_async`]).
    ///
    /// On GPUs this is a blocking wait. On CPU adapters (lavapipe, llvmpipe) the driver's
    /// blocking wait can keep this thread busy on a core the driver's own shader threads need;
    /// there the thread polls the submission and sleeps 50 µs between polls instead, so shader
    /// threads are not descheduled behind it (a persistent queue's producers most of all).
    ///
    /// # Errors
    /// [`Error::Gpu`] naming "submission" where wgpu refuses the commands as they are finished
    /// or submitted (a destroyed buffer, a resource of another device, a copy past a buffer's
    /// end: validation errors that would otherwise reach the device's uncaptured-error
    /// handler); a lost device (before or during the wait), or a failed poll.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn submit_and_wait(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        pollster::block_on(self.submitted("submission", encoder, Driver::Inline))
    }

    /// Submits `encoder` and resolves when the device has finished it, without blocking the
    /// awaiting thread: a thread of moeflow's polls the device meanwhile (as
    /// [`Self::submit_and_wait`] does on its own thread) and wakes the task.
    ///
    /// # Errors
    /// As [`Self::submit_and_wait`].
    pub async fn submit_async(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        self.submitted("submission", encoder, Driver::Await).await
    }

    /// Submits `encoder` now; the returned future resolves when the device has finished it,
    /// its polls driven as `driver` says. Finishing and submitting run inside
    /// [`Self::checked`]'s error scopes, so what wgpu refuses there (a destroyed buffer, a
    /// resource of another device, a copy past a buffer's end) is an `Err` naming `what`.
    pub(crate) fn submitted(
        &self,
        what: &str,
        encoder: wgpu::CommandEncoder,
        driver: Driver,
    ) -> impl Future<Output = Result<()>> + use<> {
        let submitted = self.checked(what, || {
            let signal = Signal::new();
            let index = self.queue().submit([encoder.finish()]);
            let fired = signal.clone();
            self.queue().on_submitted_work_done(move || fired.fire());
            Until::new(self, signal, Some(index), driver)
        });
        let alive = self.alive_check();
        async move {
            submitted?.await?;
            alive()
        }
    }

    /// A fresh command encoder.
    pub fn encoder(&self, label: &str) -> wgpu::CommandEncoder {
        self.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }

    /// Records `dispatches` in one pass, submits, and waits.
    ///
    /// # Errors
    /// A validation error while recording or submitting (a destroyed buffer, say), or a lost
    /// device.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn run(&self, dispatches: &[&Dispatch]) -> Result<()> {
        pollster::block_on(self.run_with(dispatches, Driver::Inline))
    }

    /// [`Self::run`] without blocking the awaiting thread (see [`Self::submit_async`]).
    ///
    /// # Errors
    /// As [`Self::run`].
    pub async fn run_async(&self, dispatches: &[&Dispatch]) -> Result<()> {
        self.run_with(dispatches, Driver::Await).await
    }

    /// Records `dispatches`, submits them (inside error scopes) and waits as `driver` says.
    pub(crate) async fn run_with(&self, dispatches: &[&Dispatch], driver: Driver) -> Result<()> {
        let mut encoder = self.encoder("moeflow run");
        record(&mut encoder, dispatches);
        self.submitted("run", encoder, driver).await
    }

    /// Copies the first `len` elements of `from` (a buffer, or a [`BufferView`] of one) to the
    /// host.
    ///
    /// # Errors
    /// More elements than the view holds, a buffer without `COPY_SRC`, a destroyed or
    /// mapped buffer (a validation error), a failed mapping, or a lost device.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn read_back<'b, T: Pod>(&self, from: impl Into<BufferView<'b>>, len: usize) -> Result<Vec<T>> {
        pollster::block_on(self.read_back_with(from, len, Driver::Inline))
    }

    /// [`Self::read_back`] without blocking the awaiting thread (see [`Self::submit_async`]).
    ///
    /// # Errors
    /// As [`Self::read_back`].
    pub async fn read_back_async<'b, T: Pod>(
        &self,
        from: impl Into<BufferView<'b>>,
        len: usize,
    ) -> Result<Vec<T>> {
        self.read_back_with(from, len, Driver::Await).await
    }

    /// Copies the first `len` elements of `from` out, waiting as `driver` says.
    pub(crate) async fn read_back_with<'b, T: Pod>(
        &self,
        from: impl Into<BufferView<'b>>,
        len: usize,
        driver: Driver,
    ) -> Result<Vec<T>> {
        self.check_alive()?;
        let view: BufferView<'b> = from.into();
        let buffer = view.buffer;
        let bytes = size::product("readback", &[len as u64, std::mem::size_of::<T>() as u64])?;
        let in_buffer = view.offset.checked_add(view.size).is_some_and(|end| end <= buffer.size());
        if bytes > view.size || !in_buffer {
            return Err(Error::shape(
                "readback",
                format!("{bytes} bytes"),
                format!(
                    "a view of {} bytes at byte {} of a buffer of {}",
                    view.size,
                    view.offset,
                    buffer.size()
                ),
            ));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        if !buffer.usage().contains(wgpu::BufferUsages::COPY_SRC) {
            return Err(Error::Readback(format!(
                "the buffer has usages {:?}, without COPY_SRC, so it cannot be copied out",
                buffer.usage()
            )));
        }
        let usage = wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST;
        let staging = self.buffer("moeflow readback", bytes, usage, false)?;
        let mut encoder = self.encoder("moeflow readback");
        // `bytes` fits in the view, inside the buffer, so rounding it up cannot overflow.
        let copied = bytes.max(4).next_multiple_of(4).min(buffer.size() - view.offset);
        encoder.copy_buffer_to_buffer(buffer, view.offset, &staging, 0, copied);
        self.submitted("readback copy", encoder, driver).await?;
        self.mapped(&staging, len, None, driver).await
    }

    /// Submits `encoder` now and returns its index, for waits on it alone
    /// ([`Self::mapped`]); what wgpu refuses is an `Err` naming `what`.
    #[cfg(not(target_arch = "wasm32"))]
    pub(crate) fn submit_indexed(
        &self,
        what: &str,
        encoder: wgpu::CommandEncoder,
    ) -> Result<wgpu::SubmissionIndex> {
        self.check_alive()?;
        self.checked(what, || self.queue().submit([encoder.finish()]))
    }

    /// The first `len` elements of the `MAP_READ` buffer `staging`, mapped once the device has
    /// finished what was submitted to fill it (`after`, where given: a wait for that
    /// submission alone, so later ones can go on running; else for every submission).
    pub(crate) async fn mapped<T: Pod>(
        &self,
        staging: &wgpu::Buffer,
        len: usize,
        after: Option<wgpu::SubmissionIndex>,
        driver: Driver,
    ) -> Result<Vec<T>> {
        let bytes = size::product("mapped read", &[len as u64, std::mem::size_of::<T>() as u64])?;
        if bytes > staging.size() {
            return Err(Error::shape(
                "mapped read",
                format!("{bytes} bytes"),
                format!("a buffer of {}", staging.size()),
            ));
        }
        let slice = staging.slice(..);
        let signal = Signal::new();
        let mapped: Arc<Mutex<Option<std::result::Result<(), wgpu::BufferAsyncError>>>> = Arc::default();
        let (fired, result) = (signal.clone(), mapped.clone());
        self.checked("readback mapping", || {
            slice.map_async(wgpu::MapMode::Read, move |r| {
                *lock(&result) = Some(r);
                fired.fire();
            })
        })?;
        Until::new(self, signal, after, driver).await?;
        self.check_alive()?;
        lock(&mapped)
            .take()
            .ok_or_else(|| Error::Readback("the mapping ended without a result".into()))?
            .map_err(|e| Error::Readback(e.to_string()))?;
        let out = self.checked("readback unmapping", || -> Result<Vec<T>> {
            let view = slice.get_mapped_range().map_err(|e| Error::Readback(e.to_string()))?;
            let out = bytemuck::cast_slice::<u8, T>(&view[..bytes as usize]).to_vec();
            drop(view);
            staging.unmap();
            Ok(out)
        })??;
        Ok(out)
    }
}
