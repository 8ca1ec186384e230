//! Dispatch comparisons: device dispatch against the host round trip.

use super::comparison::{Case, Registered, Size, SizeSet, Work};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{DispatchConfig, DispatchLayout, host_dispatch};
use crate::reference::dispatch as reference;
use crate::synth::Synth;

/// `tokens * k` indices with k distinct experts per token, skewed towards low expert ids.
pub fn skewed_indices(seed: u64, tokens: u32, experts: u32, k: u32) -> Vec<u32> {
    let mut synth = Synth::new(seed);
    let mut out = Vec::with_capacity((tokens * k) as usize);
    for _ in 0..tokens {
        let start = out.len();
        while out.len() - start < k as usize {
            let u = (synth.uniform(1, 1.0)[0] + 1.0) / 2.0;
            let e = ((u * u * experts as f32) as u32).min(experts - 1);
            if !out[start..].contains(&e) {
                out.push(e);
            }
        }
    }
    out
}

/// Stable padded grouping on the device (B) against readback, CPU stable sort and upload (A).
pub(crate) fn device_dispatch() -> Registered {
    Registered::new(
        "dispatch/device-vs-host",
        "stable tile-padded grouping by expert on the device (B) against reading indices back, \
                      sorting on the CPU and uploading the layout (A); identical layouts",
        ("host", "device"),
        device_dispatch_sizes,
        build_device_dispatch,
    )
}

fn device_dispatch_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let (tokens, experts): (&[u32], &[u32]) = match (set, held_out) {
        (SizeSet::Gpu, false) => (&[1, 64, 4096], &[64, 128, 330]),
        (SizeSet::Gpu, true) => (&[8, 512, 8192], &[60, 256]),
        (SizeSet::Cpu, false) => (&[1, 64, 4096], &[64, 330]),
        (SizeSet::Cpu, true) => (&[8, 512, 2048], &[60, 256]),
    };
    tokens
        .iter()
        .flat_map(|&m| experts.iter().map(move |&e| Size::of(&[("M", m), ("E", e), ("k", 8), ("tile", 64)])))
        .collect()
}

fn build_device_dispatch(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let (m, e, k, tile) = (size.get("M")?, size.get("E")?, size.get("k")?, size.get("tile")?);
    let cfg = DispatchConfig { experts: e, k, tile };
    let idx = skewed_indices(seed, m, e, k);
    let want = reference::layout(&idx, e, tile, 0);
    let indices = ctx.upload("indices", &idx)?;
    let host = DispatchLayout::new(ctx, cfg, m, 0)?;
    let device = DispatchLayout::new(ctx, cfg, m, 0)?;
    let b = Work::Gpu(device.plan(ctx, &indices)?);
    let (host_v, device_v) = (std::rc::Rc::new(host), std::rc::Rc::new(device));
    let host_run = host_v.clone();
    let a = Work::Host {
        run: Box::new(move |ctx: &Context| {
            host_dispatch(ctx, &host_run, &indices, 0)?;
            // Flush the uploads so their cost is part of the sample.
            ctx.submit_and_wait(ctx.encoder("flush host dispatch uploads"))
        }),
        dispatches: 0,
        readbacks: 1,
    };
    let validate = move |ctx: &Context| -> Result<()> {
        let (h, d) = (host_v.read(ctx)?, device_v.read(ctx)?);
        if h != want {
            return Err(Error::Validation("host layout differs from the CPU stable sort".into()));
        }
        if d != h {
            return Err(Error::Validation("device layout differs from the host layout".into()));
        }
        Ok(())
    };
    Ok(Case { a, b, flops: 0.0, bytes: 0.0, tokens: m, validate: Box::new(validate), note: None })
}
