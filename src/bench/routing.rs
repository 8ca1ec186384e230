//! Routing comparisons: fused vs unfused route, and the gate matvec's share of the unfused
//! route (how much a fused route could save at most).

use super::comparison::{Case, Registered, Size, SizeSet, Work};
use crate::bits::bit_identical;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::routing::{RouteBuffers, RouteConfig, RouteMode, plan_route};
use crate::pipeline::Dispatch;
use crate::reference::{routing as reference, within};
use crate::synth::Synth;
use crate::tensor::word_bytes;

/// The route sizes at E=256, k=8 (both route comparisons).
fn route_sizes(set: SizeSet, held_out: bool) -> Vec<Size> {
    let (hidden, tokens): (u32, &[u32]) = match (set, held_out) {
        (SizeSet::Gpu, false) => (2048, &[1, 8, 512]),
        (SizeSet::Gpu, true) => (2048, &[2, 64, 1024]),
        (SizeSet::Cpu, false) => (512, &[1, 8, 128]),
        (SizeSet::Cpu, true) => (512, &[2, 32, 256]),
    };
    tokens.iter().map(|&m| Size::of(&[("M", m), ("H", hidden), ("E", 256), ("k", 8)])).collect()
}

/// One route size on the device: its config, the token rows and gate weights (also uploaded),
/// and the CPU reference's logits.
struct RouteInputs {
    cfg: RouteConfig,
    tokens: u32,
    x: wgpu::Buffer,
    gate: wgpu::Buffer,
    ref_logits: Vec<f32>,
}

impl RouteInputs {
    /// `size` (M, H, E, k; softmax, renormalised) with inputs drawn from `seed`.
    fn new(ctx: &Context, size: &Size, seed: u64) -> Result<Self> {
        let (m, h, e, k) = (size.get("M")?, size.get("H")?, size.get("E")?, size.get("k")?);
        let (x, gate) = Synth::new(seed).routing(m as usize, h as usize, e as usize);
        Ok(RouteInputs {
            cfg: RouteConfig { renormalize: true, ..RouteConfig::new(h, e, k) },
            tokens: m,
            x: ctx.upload("x", &x)?,
            gate: ctx.upload("gate", &gate)?,
            ref_logits: reference::gate_logits(&x, &gate, h as usize),
        })
    }

    /// Routing outputs' element counts: `(logits, selections)`, selections being the length
    /// of both the indices and the weights.
    fn counts(&self) -> (u64, u64) {
        let m = u64::from(self.tokens);
        (m * u64::from(self.cfg.experts), m * u64::from(self.cfg.k))
    }

    /// A plan of the route in `mode` writing to fresh buffers tagged `tag`: the dispatches and
    /// the (logits, indices, weights) buffers (no logits buffer where `mode` writes none).
    fn plan(&self, ctx: &Context, tag: &str, mode: RouteMode) -> Result<(Vec<Dispatch>, RouteOutputs)> {
        let (nl, ns) = self.counts();
        let logits = if mode.writes_logits() {
            Some(ctx.zeroed(&format!("{tag} logits"), word_bytes(nl))?)
        } else {
            None
        };
        let out = RouteOutputs {
            logits,
            indices: ctx.zeroed(&format!("{tag} indices"), word_bytes(ns))?,
            weights: ctx.zeroed(&format!("{tag} weights"), word_bytes(ns))?,
        };
        let bufs = RouteBuffers {
            x: (&self.x).into(),
            gate: &self.gate,
            bias: None,
            logits: out.logits.as_ref().map(Into::into),
            indices: (&out.indices).into(),
            weights: (&out.weights).into(),
        };
        Ok((plan_route(ctx, &self.cfg, self.tokens, &bufs, mode)?.into_dispatches(), out))
    }

    /// Reads `logits` back and checks them against the reference (within the float bound).
    fn checked_logits(&self, ctx: &Context, logits: &wgpu::Buffer) -> Result<Vec<f32>> {
        let got: Vec<f32> = ctx.read_back(logits, self.ref_logits.len())?;
        if let Some(i) = (0..got.len()).find(|&i| !within(got[i], self.ref_logits[i])) {
            return Err(Error::Validation(format!(
                "unfused logit {i}: {} vs reference {}",
                got[i], self.ref_logits[i]
            )));
        }
        Ok(got)
    }

    /// FLOPs of the gate matvec.
    fn flops(&self) -> f64 {
        2.0 * f64::from(self.tokens) * f64::from(self.cfg.experts) * f64::from(self.cfg.hidden)
    }

    /// Bytes of x and the gate weights.
    fn input_bytes(&self) -> f64 {
        4.0 * f64::from(self.cfg.hidden) * (f64::from(self.tokens) + f64::from(self.cfg.experts))
    }
}

/// A planned route's output buffers.
struct RouteOutputs {
    logits: Option<wgpu::Buffer>,
    indices: wgpu::Buffer,
    weights: wgpu::Buffer,
}

/// The buffer a route wrote its logits to, or an error where it wrote none.
fn logits_of(out: &RouteOutputs) -> Result<&wgpu::Buffer> {
    out.logits.as_ref().ok_or_else(|| Error::invalid("the unfused route wrote no logits buffer"))
}

/// Fused route (one dispatch, logits in workgroup memory) against gate matvec + top-k.
pub fn fused_route() -> Registered {
    Registered::new(
        "route/fused-vs-unfused",
        "gate matvec + top-k in one dispatch (B) against two dispatches through a logits buffer (A); \
                      softmax, renormalised, bit-identical outputs",
        ("unfused", "fused"),
        route_sizes,
        build_fused_route,
    )
}

fn build_fused_route(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let inputs = RouteInputs::new(ctx, size, seed)?;
    let (a, a_out) = inputs.plan(ctx, "A", RouteMode::Unfused)?;
    let (b, b_out) = inputs.plan(ctx, "B", RouteMode::Fused { write_logits: false })?;
    let (flops, input_bytes) = (inputs.flops(), inputs.input_bytes());
    let (_, n) = inputs.counts();
    let tokens = inputs.tokens;
    let validate = move |ctx: &Context| -> Result<()> {
        let n = n as usize;
        let logits = inputs.checked_logits(ctx, logits_of(&a_out)?)?;
        let (ref_idx, ref_w) = reference::topk(&inputs.cfg, &logits, None);
        let (ai, aw): (Vec<u32>, Vec<f32>) =
            (ctx.read_back(&a_out.indices, n)?, ctx.read_back(&a_out.weights, n)?);
        if ai != ref_idx || aw.iter().zip(&ref_w).any(|(g, w)| !within(*g, *w)) {
            return Err(Error::Validation("unfused top-k disagrees with the CPU reference".into()));
        }
        let (bi, bw): (Vec<u32>, Vec<f32>) =
            (ctx.read_back(&b_out.indices, n)?, ctx.read_back(&b_out.weights, n)?);
        if bi != ai || !bit_identical(&bw, &aw) {
            return Err(Error::Validation("fused route is not bit-identical to unfused".into()));
        }
        Ok(())
    };
    Ok(Case {
        a: Work::Gpu(a),
        b: Work::Gpu(b),
        flops,
        bytes: input_bytes + 4.0 * 2.0 * n as f64,
        tokens,
        validate: Box::new(validate),
        note: None,
    })
}

/// The unfused route (gate matvec + top-k) against its gate matvec alone: B/A is the matvec's
/// share of the route, and 1 - B/A what the top-k dispatch adds (its launch, the logits it
/// reads back and the selection), the most a fused route can save unless its own matvec is
/// faster. At E=256, k=8: why the fused route does or does not reach 1.3x.
pub fn gate_share() -> Registered {
    Registered::new(
        "route/gate-share",
        "the unfused route's gate matvec alone (B) against the whole unfused route, matvec + top-k \
                      (A): B/A is the matvec's share, 1 - B/A the most a fused route can save; logits bit-identical",
        ("unfused route", "gate matvec"),
        route_sizes,
        build_gate_share,
    )
}

fn build_gate_share(ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
    let inputs = RouteInputs::new(ctx, size, seed)?;
    let (a, a_out) = inputs.plan(ctx, "A", RouteMode::Unfused)?;
    let (mut b, b_out) = inputs.plan(ctx, "B", RouteMode::Unfused)?;
    // The unfused route is the gate matvec, then top-k; B keeps the matvec.
    if b.len() != 2 {
        return Err(Error::invalid(format!("the unfused route has {} dispatches, not 2", b.len())));
    }
    b.truncate(1);
    let (flops, input_bytes) = (inputs.flops(), inputs.input_bytes());
    let (nl, _) = inputs.counts();
    let tokens = inputs.tokens;
    let validate = move |ctx: &Context| -> Result<()> {
        let al = inputs.checked_logits(ctx, logits_of(&a_out)?)?;
        let bl: Vec<f32> = ctx.read_back(logits_of(&b_out)?, al.len())?;
        if !bit_identical(&al, &bl) {
            return Err(Error::Validation(
                "the gate matvec alone is not bit-identical to the route's".into(),
            ));
        }
        Ok(())
    };
    Ok(Case {
        a: Work::Gpu(a),
        b: Work::Gpu(b),
        flops,
        bytes: input_bytes + 4.0 * nl as f64,
        tokens,
        validate: Box::new(validate),
        note: None,
    })
}
