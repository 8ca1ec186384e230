//! Combine and whole-layer comparisons.

use super::comparison::{Case, Registered, Size, SizeSet, Validate, Work};
use crate::bits::bit_identical;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::combine::{CombineBuffers, CombineMode, plan_combine};
use crate::kernels::routing::RouteMode;
use crate::layer::{MoeConfig, MoeLayer, MoeWeights};
use crate::reference::layer as reference;
use crate::synth::Synth;
use crate::tensor::word_bytes;

/// One-launch combine (B) against one dispatch per token and slot (A).
pub(crate) fn one_launch_combine() -> Registered {
    Registered::new(
        "combine/one-launch-vs-sequential",
        "weighted scatter-reduce of k expert rows per token in one dispatch (B) against a clear, one \
                      dispatch per token and slot, as a host loop issues them (A); bit-identical",
        ("sequential", "one-launch"),
        one_launch_combine_sizes,
        build_one_launch_combine,
    )
}

fn one_launch_combine_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let (tokens, hidden): (&[u32], &[u32]) = match (set, held_out) {
        (SizeSet::Gpu, false) => (&[64, 4096], &[1024, 2048]),
        (SizeSet::Gpu, true) => (&[256, 2048], &[1536]),
        (SizeSet::Cpu, false) => (&[16, 256], &[256, 1024]),
        (SizeSet::Cpu, true) => (&[32, 128], &[512]),
    };
    tokens
        .iter()
        .flat_map(|&m| hidden.iter().map(move |&h| Size::of(&[("M", m), ("H", h), ("k", 8)])))
        .collect()
}

fn build_one_launch_combine(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let (m, h, k) = (size.get("M")?, size.get("H")?, size.get("k")?);
    let mut s = Synth::new(seed);
    let weights = s.uniform((m * k) as usize, 1.0);
    let partial = s.uniform((m * k * h) as usize, 1.0);
    let (wb, pb) = (ctx.upload("weights", &weights)?, ctx.upload("partial", &partial)?);
    let (ya, yb) = (
        ctx.zeroed("y sequential", word_bytes(u64::from(m * h)))?,
        ctx.zeroed("y one launch", word_bytes(u64::from(m * h)))?,
    );
    let bufs = |y| CombineBuffers { weights: (&wb).into(), partial: (&pb).into(), shared: None, y };
    let a = plan_combine(ctx, m, h, k, &bufs((&ya).into()), CombineMode::Sequential)?;
    let b = plan_combine(ctx, m, h, k, &bufs((&yb).into()), CombineMode::OneLaunch)?;
    let (hu, ku) = (h as usize, k as usize);
    let validate = move |ctx: &Context| -> Result<()> {
        let n = m as usize * hu;
        let (got_a, got_b): (Vec<f32>, Vec<f32>) = (ctx.read_back(&ya, n)?, ctx.read_back(&yb, n)?);
        for (i, g) in got_a.iter().enumerate() {
            let (t, c) = (i / hu, i % hu);
            let mut want = 0.0f32;
            for j in 0..ku {
                want = weights[t * ku + j].mul_add(partial[(t * ku + j) * hu + c], want);
            }
            if (g - want).abs() > 2e-5 + 2e-5 * want.abs() {
                return Err(Error::Validation(format!("sequential combine y[{i}] = {g}, reference {want}")));
            }
        }
        if !bit_identical(&got_a, &got_b) {
            return Err(Error::Validation(
                "one-launch combine is not bit-identical to the sequential one".into(),
            ));
        }
        Ok(())
    };
    Ok(Case {
        a: Work::Gpu(a),
        b: Work::Gpu(b),
        flops: 2.0 * f64::from(m * k * h),
        bytes: 4.0 * f64::from(m * k * h + m * k + m * h),
        tokens: m,
        validate: Box::new(validate),
        note: None,
    })
}

/// The whole layer with fused routing (B) against unfused routing (A).
pub(crate) fn layer_route() -> Registered {
    Registered::new(
        "layer/fused-vs-unfused-route",
        "the whole MoE layer (route, dispatch, SwiGLU experts, shared expert, combine) with the fused \
                      route (B) against the unfused route (A); bit-identical; decode figures are bandwidth, prefill FLOPs",
        ("unfused route", "fused route"),
        layer_route_sizes,
        build_layer_route,
    )
}

fn layer_route_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let (tokens, h, f, e, k): (&[u32], u32, u32, u32, u32) = match (set, held_out) {
        (SizeSet::Gpu, false) => (&[1, 512, 4096], 1024, 512, 64, 8),
        (SizeSet::Gpu, true) => (&[4, 1024], 1024, 512, 64, 8),
        (SizeSet::Cpu, false) => (&[1, 64, 256], 256, 128, 16, 4),
        (SizeSet::Cpu, true) => (&[4, 128], 256, 128, 16, 4),
    };
    tokens.iter().map(|&m| Size::of(&[("M", m), ("H", h), ("F", f), ("E", e), ("k", k)])).collect()
}

fn build_layer_route(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let (m, h, f, e, k) = (size.get("M")?, size.get("H")?, size.get("F")?, size.get("E")?, size.get("k")?);
    let cfg = MoeConfig { shared_ffn: Some(f), ..MoeConfig::new(h, f, e, k) };
    let mut s = Synth::new(seed);
    let w = s.moe_weights(&cfg);
    let x = s.uniform((m * h) as usize, 1.0);
    let xb = ctx.upload("x", &x)?;
    let (ya, yb) = (
        ctx.zeroed("y unfused", word_bytes(u64::from(m * h)))?,
        ctx.zeroed("y fused", word_bytes(u64::from(m * h)))?,
    );
    let unfused = MoeLayer::new(ctx, MoeConfig { route_mode: RouteMode::Unfused, ..cfg }, &w)?;
    let fused =
        MoeLayer::new(ctx, MoeConfig { route_mode: RouteMode::Fused { write_logits: false }, ..cfg }, &w)?;
    let pa = unfused.plan(ctx, unfused.io(&xb, &ya, m)?)?;
    let pb = fused.plan(ctx, fused.io(&xb, &yb, m)?)?;
    let (flops, bytes) = layer_work(&cfg, m);
    let validate = layer_check(cfg, w, x, m, [ya, yb], "fused-route layer", "unfused");
    let decode = m <= 8;
    Ok(Case {
        a: Work::Gpu(pa.dispatches_at(m)?),
        b: Work::Gpu(pb.dispatches_at(m)?),
        flops: if decode { 0.0 } else { flops },
        bytes: if decode { bytes } else { 0.0 },
        tokens: m,
        validate,
        note: None,
    })
}

/// Floating-point operations of a forward of `m` tokens of `cfg` with a shared expert of FFN
/// size F (SwiGLU: three projections), and the weight bytes a decode step must read at least
/// (at most min(E, M·k) experts, the shared expert and the router, f32).
fn layer_work(cfg: &MoeConfig, m: u32) -> (f64, f64) {
    let (h, f, e, k) = (cfg.route.hidden, cfg.ffn, cfg.route.experts, cfg.route.k);
    let (mf, hf, ff) = (f64::from(m), f64::from(h), f64::from(f));
    let flops = 6.0 * mf * f64::from(k) * hf * ff + 6.0 * mf * hf * ff + 2.0 * mf * f64::from(e) * hf;
    let experts_read = f64::from(e.min(m.saturating_mul(k)));
    (flops, 4.0 * (3.0 * (experts_read + 1.0) * hf * ff + f64::from(e) * hf))
}

/// Reads `y[m, H]` of both sides: A's first rows (up to 4) against the CPU reference layer on
/// the same rows, B bitwise against A.
fn layer_check(
    cfg: MoeConfig,
    w: MoeWeights,
    x: Vec<f32>,
    m: u32,
    [ya, yb]: [wgpu::Buffer; 2],
    b_name: &'static str,
    a_name: &'static str,
) -> Validate {
    let picks: Vec<usize> = (0..(m as usize).min(4)).collect();
    let hu = cfg.route.hidden as usize;
    Box::new(move |ctx: &Context| -> Result<()> {
        let n = m as usize * hu;
        let (got_a, got_b): (Vec<f32>, Vec<f32>) = (ctx.read_back(&ya, n)?, ctx.read_back(&yb, n)?);
        let xs: Vec<f32> = picks.iter().flat_map(|&t| x[t * hu..(t + 1) * hu].to_vec()).collect();
        let (want, _, _) = reference::forward(&cfg, &w, &xs)?;
        for (r, &t) in picks.iter().enumerate() {
            let row = &want[r * hu..(r + 1) * hu];
            let scale = row.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            if let Some(c) = (0..hu).find(|&c| (got_a[t * hu + c] - row[c]).abs() > 2e-5 + 2e-5 * scale) {
                return Err(Error::Validation(format!(
                    "layer token {t} column {c}: {} vs reference {}",
                    got_a[t * hu + c],
                    row[c]
                )));
            }
        }
        if !bit_identical(&got_a, &got_b) {
            return Err(Error::Validation(format!("{b_name} is not bit-identical to the {a_name} one")));
        }
        Ok(())
    })
}

/// The whole layer planned for a maximum and run at a live count (B) against a plan made for
/// exactly that count (A).
pub(crate) fn layer_live() -> Registered {
    Registered::new(
        "layer/live-vs-exact",
        "the whole MoE layer planned once for a maximum of MAX tokens and run at a live count of M (B) \
                      against a plan made for exactly M tokens (A): the cost of one plan for every count (buffers \
                      for the maximum, grids read from the device); bit-identical",
        ("exact plan", "plan for the maximum"),
        layer_live_sizes,
        build_layer_live,
    )
}

fn layer_live_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let (tokens, max, h, f, e, k): (&[u32], u32, u32, u32, u32, u32) = match (set, held_out) {
        (SizeSet::Gpu, false) => (&[1, 512], 4096, 1024, 512, 64, 8),
        (SizeSet::Gpu, true) => (&[8, 2048], 4096, 1024, 512, 64, 8),
        (SizeSet::Cpu, false) => (&[1, 64], 256, 256, 128, 16, 4),
        (SizeSet::Cpu, true) => (&[4, 128], 256, 256, 128, 16, 4),
    };
    tokens
        .iter()
        .map(|&m| Size::of(&[("M", m), ("MAX", max), ("H", h), ("F", f), ("E", e), ("k", k)]))
        .collect()
}

fn build_layer_live(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let (m, max) = (size.get("M")?, size.get("MAX")?);
    let (h, f, e, k) = (size.get("H")?, size.get("F")?, size.get("E")?, size.get("k")?);
    let cfg = MoeConfig { shared_ffn: Some(f), ..MoeConfig::new(h, f, e, k) };
    let mut s = Synth::new(seed);
    let w = s.moe_weights(&cfg);
    let x = s.uniform((max * h) as usize, 1.0);
    let xb = ctx.upload("x", &x)?;
    let (ya, yb) = (
        ctx.zeroed("y exact", word_bytes(u64::from(m * h)))?,
        ctx.zeroed("y live", word_bytes(u64::from(max * h)))?,
    );
    let layer = MoeLayer::new(ctx, cfg, &w)?;
    let exact = layer.plan(ctx, layer.io(&xb, &ya, m)?)?;
    let live = layer.plan(ctx, layer.io(&xb, &yb, max)?)?;
    live.set_live_tokens(ctx, m)?;
    let (flops, bytes) = layer_work(&cfg, m);
    let decode = m <= 8;
    let note = format!("B planned for {max} tokens, run at {m}");
    Ok(Case {
        a: Work::Gpu(exact.dispatches_at(m)?),
        b: Work::Gpu(live.dispatches_at(m)?),
        flops: if decode { 0.0 } else { flops },
        bytes: if decode { bytes } else { 0.0 },
        tokens: m,
        validate: layer_check(cfg, w, x, m, [ya, yb], "a plan for the maximum", "exact"),
        note: Some(note),
    })
}
