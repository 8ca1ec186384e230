//! Per-adapter practical limits from two tiny kernels: streaming copy bandwidth and FMA
//! throughput (`wgsl/probe/`). Every benchmark figure can then be shown as a fraction of
//! what the adapter can do.

use bytemuck::{Pod, Zeroable};

use super::comparison::SizeSet;
use super::record::Calibration;
use super::verdict::median;
use crate::context::Context;
use crate::error::Result;
use crate::pipeline::{Access, Binding, KernelSpec, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};
use crate::tensor::word_bytes;
use crate::timer::Sampler;

static COPY_SHADER: ShaderSource = ShaderSource {
    name: "probe/copy",
    parts: &[wgsl!("probe/copy.wgsl")],
    entry_points: &["copy"],
    indexing: Indexing::Checked,
};
static FMA_SHADER: ShaderSource = ShaderSource {
    name: "probe/fma",
    parts: &[wgsl!("probe/fma.wgsl")],
    entry_points: &["fma_probe"],
    indexing: Indexing::Checked,
};

/// The probe family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&COPY_SHADER, &FMA_SHADER];

static COPY: KernelSpec = KernelSpec {
    shader: &COPY_SHADER,
    entry: "copy",
    bindings: &[(0, Access::Uniform), (1, Access::Read), (2, Access::ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(256),
};
static FMA: KernelSpec = KernelSpec {
    shader: &FMA_SHADER,
    entry: "fma_probe",
    bindings: &[(0, Access::Uniform), (1, Access::ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(256),
};
/// Both probes (for the contract test, `src/contract.rs`).
#[cfg(test)]
pub(crate) static SPECS: &[&KernelSpec] = &[&COPY, &FMA];
/// Bytes of both probes' parameters.
const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Params {
    a: u32,
    b: u32,
    pad: [u32; 2],
}

const SAMPLES: usize = 7;

/// Median seconds of `SAMPLES` timed runs after one warm-up, on the GPU clock when the
/// adapter has timestamps, else on the wall clock.
fn time(ctx: &Context, d: &crate::pipeline::Dispatch) -> Result<(f64, &'static str)> {
    let mut sampler = Sampler::new(ctx, SAMPLES as u32)?;
    sampler.untimed(&[d], 1)?;
    let samples = (0..SAMPLES).map(|_| sampler.sample(&[d], 1)).collect::<Result<Vec<_>>>()?;
    let gpu: Option<Vec<f64>> = sampler.gpu_seconds(&samples)?.into_iter().collect();
    let (mut v, clock) = match gpu {
        Some(g) => (g, "gpu"),
        None => (samples.iter().map(|s| s.wall_s).collect(), "wall"),
    };
    Ok((median(&mut v), clock))
}

/// Measures the adapter's copy bandwidth and FMA rate with sizes fit for `set`.
///
/// # Errors
/// A size past the adapter's limits, or a device error while the probes run.
pub fn calibrate(ctx: &Context, set: SizeSet) -> Result<Calibration> {
    // vec4 elements copied; invocations and rounds of the FMA probe.
    let (n, invocations, iters) = match set {
        SizeSet::Gpu => (4u32 << 20, 1u32 << 20, 2048u32),
        SizeSet::Cpu => (1u32 << 20, 1u32 << 14, 512u32),
    };
    let bytes = u64::from(n) * 16;
    let src = ctx.zeroed("calibration src", bytes)?;
    let dst = ctx.zeroed("calibration dst", bytes)?;
    let copy_params = ctx.uniform("copy params", &Params { a: n, b: 0, pad: [0; 2] })?;
    let copy = ctx.kernel(&COPY, &[])?;
    let d = ctx.dispatch(
        &copy,
        &[
            Binding::new(0, &copy_params, PARAMS_BYTES),
            Binding::new(1, &src, bytes),
            Binding::new(2, &dst, bytes),
        ],
        ctx.grid(COPY.groups(n.into())?, "copy probe")?,
    )?;
    let (copy_s, clock) = time(ctx, &d)?;

    let sink = ctx.zeroed("fma sink", word_bytes(u64::from(invocations)))?;
    let fma_params = ctx.uniform("fma params", &Params { a: invocations, b: iters, pad: [0; 2] })?;
    let fma = ctx.kernel(&FMA, &[])?;
    let d = ctx.dispatch(
        &fma,
        &[
            Binding::new(0, &fma_params, PARAMS_BYTES),
            Binding::new(1, &sink, word_bytes(u64::from(invocations))),
        ],
        ctx.grid(FMA.groups(invocations.into())?, "fma probe")?,
    )?;
    let (fma_s, _) = time(ctx, &d)?;
    let flops = 64.0 * f64::from(iters) * f64::from(invocations);
    Ok(Calibration {
        copy_gbps: 2.0 * bytes as f64 / copy_s / 1e9,
        fma_gflops: flops / fma_s / 1e9,
        clock: clock.into(),
        method: format!(
            "median of {SAMPLES}: vec4 copy of {} MiB; {invocations} invocations x {iters} rounds of 8 vec4 FMA chains",
            bytes >> 20
        ),
    })
}
