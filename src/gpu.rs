//! Recording dispatches into an encoder, and the usages of moeflow's data buffers. The
//! context's buffer, upload, readback and submission methods live with the rest of
//! [`Context`](crate::Context)'s methods in `src/context/`.

use crate::pipeline::Dispatch;

/// Usages every moeflow data buffer gets: bindable as storage, copyable both ways.
pub(crate) const DATA_USAGE: wgpu::BufferUsages =
    wgpu::BufferUsages::STORAGE.union(wgpu::BufferUsages::COPY_SRC).union(wgpu::BufferUsages::COPY_DST);

/// Records `dispatches` in order into one compute pass of `encoder`. wgpu orders each
/// dispatch's storage writes before the next dispatch's reads.
pub(crate) fn record(encoder: &mut wgpu::CommandEncoder, dispatches: &[&Dispatch]) {
    let mut pass = encoder
        .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("moeflow"), timestamp_writes: None });
    for d in dispatches {
        d.record(&mut pass);
    }
}
