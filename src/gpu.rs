//! Host-side helpers: uploads, zeroed buffers, recording dispatches, and readback.
//!
//! These are for tests, examples and benchmarks at the edges of a forward pass; nothing
//! inside a forward pass reads back to the host.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};

use bytemuck::Pod;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline::{Dispatch, checked};

/// Usages every moeflow data buffer gets: bindable as storage, copyable both ways.
pub const DATA_USAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// Pause between polls of a submission on CPU adapters (see [`Context::submit_and_wait`]).
const CPU_ADAPTER_POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// Bytes for a buffer holding `bytes` of data: at least 4, a multiple of 4.
fn padded(bytes: u64) -> u64 {
    bytes.max(4).next_multiple_of(4)
}

/// Writes `bytes` at the start of a buffer created with `mapped_at_creation`, then unmaps it.
fn fill_mapped(buffer: &wgpu::Buffer, bytes: &[u8]) {
    // A buffer mapped at creation is mapped over its whole size, so this range is valid.
    if let Ok(mut view) = buffer.slice(..).get_mapped_range_mut() {
        view.slice(..bytes.len()).copy_from_slice(bytes);
    }
    buffer.unmap();
}

/// Records `dispatches` in order into one compute pass of `encoder`. wgpu orders each
/// dispatch's storage writes before the next dispatch's reads.
pub fn record(encoder: &mut wgpu::CommandEncoder, dispatches: &[&Dispatch]) {
    let mut pass = encoder
        .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("moeflow"), timestamp_writes: None });
    for d in dispatches {
        d.record(&mut pass);
    }
}

impl Context {
    /// A buffer with `data` in it, usable as storage and as a copy source or target.
    pub fn upload<T: Pod>(&self, label: &str, data: &[T]) -> wgpu::Buffer {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let buffer = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded(bytes.len() as u64),
            usage: DATA_USAGE,
            mapped_at_creation: true,
        });
        fill_mapped(&buffer, bytes);
        buffer
    }

    /// A zero-filled storage buffer of `bytes` bytes (rounded up to 4).
    pub fn zeroed(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded(bytes),
            usage: DATA_USAGE,
            mapped_at_creation: false,
        })
    }

    /// A uniform buffer holding `value`.
    pub(crate) fn uniform<T: Pod>(&self, label: &str, value: &T) -> wgpu::Buffer {
        let bytes = bytemuck::bytes_of(value);
        let buffer = self.device().create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: padded(bytes.len() as u64),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        fill_mapped(&buffer, bytes);
        buffer
    }

    /// Submits `encoder` and waits until the device has finished it.
    ///
    /// On GPUs this is a blocking wait. On CPU adapters (lavapipe, llvmpipe) the driver's
    /// blocking wait can keep this thread busy on a core the driver's own shader threads need;
    /// there the thread polls the submission and sleeps 50 µs between polls instead, so shader
    /// threads are not descheduled behind it (a persistent queue's producers most of all).
    pub fn submit_and_wait(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        let gpu_error = |e: wgpu::PollError| Error::Gpu {
            context: "waiting for submission".into(),
            message: e.to_string(),
        };
        if !self.adapter().is_cpu() {
            let index = self.queue().submit([encoder.finish()]);
            self.device()
                .poll(wgpu::PollType::Wait { submission_index: Some(index), timeout: None })
                .map_err(gpu_error)?;
            return Ok(());
        }
        let done = Arc::new(AtomicBool::new(false));
        self.queue().submit([encoder.finish()]);
        let flag = done.clone();
        self.queue().on_submitted_work_done(move || flag.store(true, Ordering::Release));
        while !done.load(Ordering::Acquire) {
            self.device().poll(wgpu::PollType::Poll).map_err(gpu_error)?;
            if !done.load(Ordering::Acquire) {
                std::thread::sleep(CPU_ADAPTER_POLL);
            }
        }
        Ok(())
    }

    /// A fresh command encoder.
    pub fn encoder(&self, label: &str) -> wgpu::CommandEncoder {
        self.device().create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(label) })
    }

    /// Records `dispatches` in one pass, submits, and waits; GPU validation errors come back
    /// as `Err`.
    pub fn run(&self, dispatches: &[&Dispatch]) -> Result<()> {
        let scope = self.device().push_error_scope(wgpu::ErrorFilter::Validation);
        let mut encoder = self.encoder("moeflow run");
        record(&mut encoder, dispatches);
        let submitted = self.submit_and_wait(encoder);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu { context: "run".into(), message: e.to_string() });
        }
        submitted
    }

    /// Copies the first `len` elements of `buffer` to the host.
    pub fn read_back<T: Pod>(&self, buffer: &wgpu::Buffer, len: usize) -> Result<Vec<T>> {
        let bytes = (len * std::mem::size_of::<T>()) as u64;
        if bytes > buffer.size() {
            return Err(Error::shape(
                "readback",
                format!("{bytes} bytes"),
                format!("a buffer of {} bytes", buffer.size()),
            ));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let staging = checked(self.device(), "readback staging buffer", || {
            self.device().create_buffer(&wgpu::BufferDescriptor {
                label: Some("moeflow readback"),
                size: padded(bytes),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        })?;
        let mut encoder = self.encoder("moeflow readback");
        encoder.copy_buffer_to_buffer(buffer, 0, &staging, 0, padded(bytes).min(buffer.size()));
        self.submit_and_wait(encoder)?;
        let slice = staging.slice(..);
        let (tx, rx) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            // The receiver waits below; a send error only means it is gone already.
            let _ = tx.send(r);
        });
        self.device()
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Readback(e.to_string()))?;
        rx.recv().map_err(|e| Error::Readback(e.to_string()))?.map_err(|e| Error::Readback(e.to_string()))?;
        let view = slice.get_mapped_range().map_err(|e| Error::Readback(e.to_string()))?;
        let out = bytemuck::cast_slice::<u8, T>(&view[..bytes as usize]).to_vec();
        drop(view);
        staging.unmap();
        Ok(out)
    }
}
