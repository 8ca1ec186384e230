//! Routing comparisons: fused vs unfused route, and the gate matvec's share of the unfused
//! route (how much a fused route could save at most).

use super::comparison::{Case, Comparison, Size, SizeSet, Work};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::routing::{RouteBuffers, RouteConfig, RouteMode, plan_route};
use crate::pipeline::Dispatch;
use crate::reference::routing as reference;
use crate::synth::Synth;

/// Fused route (one dispatch, logits in workgroup memory) against gate matvec + top-k.
pub struct FusedRoute;

/// The unfused route (gate matvec + top-k) against its gate matvec alone: B/A is the matvec's
/// share of the route, and 1 - B/A what the top-k dispatch adds (its launch, the logits it
/// reads back and the selection), the most a fused route can save unless its own matvec is
/// faster. At E=256, k=8: why the fused route does or does not reach 1.3x.
pub struct GateShare;

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

fn within(got: f32, want: f32) -> bool {
    (got - want).abs() <= 2e-5 + 2e-5 * want.abs()
}

impl Comparison for FusedRoute {
    fn name(&self) -> &'static str {
        "route/fused-vs-unfused"
    }

    fn description(&self) -> &'static str {
        "gate matvec + top-k in one dispatch (B) against two dispatches through a logits buffer (A); \
         softmax, renormalised, bit-identical outputs"
    }

    fn variants(&self) -> (&'static str, &'static str) {
        ("unfused", "fused")
    }

    fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        route_sizes(set, held_out)
    }

    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let (m, h, e, k) = (size.get("M"), size.get("H"), size.get("E"), size.get("k"));
        let cfg = RouteConfig { renormalize: true, ..RouteConfig::new(h, e, k) };
        let (x, gate) = Synth::new(seed).routing(m as usize, h as usize, e as usize);
        let xb = ctx.upload("x", &x)?;
        let gb = ctx.upload("gate", &gate)?;
        let (mk, me) = (u64::from(m) * u64::from(k), u64::from(m) * u64::from(e));
        let a_logits = ctx.zeroed("A logits", me * 4)?;
        let a_idx = ctx.zeroed("A indices", mk * 4)?;
        let a_w = ctx.zeroed("A weights", mk * 4)?;
        let b_idx = ctx.zeroed("B indices", mk * 4)?;
        let b_w = ctx.zeroed("B weights", mk * 4)?;
        let bufs = |logits, indices, weights| RouteBuffers {
            x: &xb,
            gate: &gb,
            bias: None,
            logits,
            indices,
            weights,
        };
        let a = plan_route(ctx, &cfg, m, &bufs(Some(&a_logits), &a_idx, &a_w), RouteMode::Unfused)?;
        let b =
            plan_route(ctx, &cfg, m, &bufs(None, &b_idx, &b_w), RouteMode::Fused { write_logits: false })?;
        let ref_logits = reference::gate_logits(&x, &gate, h as usize);
        let validate = move |ctx: &Context| -> Result<()> {
            let (n, ne) = (mk as usize, me as usize);
            let logits: Vec<f32> = ctx.read_back(&a_logits, ne)?;
            if let Some(i) = (0..ne).find(|&i| !within(logits[i], ref_logits[i])) {
                return Err(Error::Validation(format!(
                    "unfused logit {i}: {} vs reference {}",
                    logits[i], ref_logits[i]
                )));
            }
            let (ref_idx, ref_w) = reference::topk(&cfg, &logits, None);
            let (ai, aw): (Vec<u32>, Vec<f32>) = (ctx.read_back(&a_idx, n)?, ctx.read_back(&a_w, n)?);
            if ai != ref_idx || aw.iter().zip(&ref_w).any(|(g, w)| !within(*g, *w)) {
                return Err(Error::Validation("unfused top-k disagrees with the CPU reference".into()));
            }
            let (bi, bw): (Vec<u32>, Vec<f32>) = (ctx.read_back(&b_idx, n)?, ctx.read_back(&b_w, n)?);
            if bi != ai || bw.iter().zip(&aw).any(|(x, y)| x.to_bits() != y.to_bits()) {
                return Err(Error::Validation("fused route is not bit-identical to unfused".into()));
            }
            Ok(())
        };
        let (mf, ef, hf) = (f64::from(m), f64::from(e), f64::from(h));
        Ok(Case {
            a: Work::Gpu(a.into_dispatches()),
            b: Work::Gpu(b.into_dispatches()),
            flops: 2.0 * mf * ef * hf,
            bytes: 4.0 * (mf * hf + ef * hf + 2.0 * mf * f64::from(k)),
            tokens: m,
            validate: Box::new(validate),
            note: None,
        })
    }
}

impl Comparison for GateShare {
    fn name(&self) -> &'static str {
        "route/gate-share"
    }

    fn description(&self) -> &'static str {
        "the unfused route's gate matvec alone (B) against the whole unfused route, matvec + top-k \
         (A): B/A is the matvec's share, 1 - B/A the most a fused route can save; logits bit-identical"
    }

    fn variants(&self) -> (&'static str, &'static str) {
        ("unfused route", "gate matvec")
    }

    fn sizes(&self, set: SizeSet, held_out: bool) -> Vec<Size> {
        route_sizes(set, held_out)
    }

    fn build(&self, ctx: &Context, size: &Size, seed: u64) -> Result<Case> {
        let (m, h, e, k) = (size.get("M"), size.get("H"), size.get("E"), size.get("k"));
        let cfg = RouteConfig { renormalize: true, ..RouteConfig::new(h, e, k) };
        let (x, gate) = Synth::new(seed).routing(m as usize, h as usize, e as usize);
        let xb = ctx.upload("x", &x)?;
        let gb = ctx.upload("gate", &gate)?;
        let (mk, me) = (u64::from(m) * u64::from(k), u64::from(m) * u64::from(e));
        let plan = |tag: &str| -> Result<(Vec<Dispatch>, wgpu::Buffer)> {
            let logits = ctx.zeroed(&format!("{tag} logits"), me * 4)?;
            let indices = ctx.zeroed(&format!("{tag} indices"), mk * 4)?;
            let weights = ctx.zeroed(&format!("{tag} weights"), mk * 4)?;
            let bufs = RouteBuffers {
                x: &xb,
                gate: &gb,
                bias: None,
                logits: Some(&logits),
                indices: &indices,
                weights: &weights,
            };
            let dispatches = plan_route(ctx, &cfg, m, &bufs, RouteMode::Unfused)?.into_dispatches();
            Ok((dispatches, logits))
        };
        let (a, a_logits) = plan("A")?;
        let (mut b, b_logits) = plan("B")?;
        // The unfused route is the gate matvec, then top-k; B keeps the matvec.
        if b.len() != 2 {
            return Err(Error::invalid(format!("the unfused route has {} dispatches, not 2", b.len())));
        }
        b.truncate(1);
        let ref_logits = reference::gate_logits(&x, &gate, h as usize);
        let validate = move |ctx: &Context| -> Result<()> {
            let ne = me as usize;
            let (al, bl): (Vec<f32>, Vec<f32>) =
                (ctx.read_back(&a_logits, ne)?, ctx.read_back(&b_logits, ne)?);
            if let Some(i) = (0..ne).find(|&i| !within(al[i], ref_logits[i])) {
                return Err(Error::Validation(format!(
                    "unfused logit {i}: {} vs reference {}",
                    al[i], ref_logits[i]
                )));
            }
            if al.iter().zip(&bl).any(|(a, b)| a.to_bits() != b.to_bits()) {
                return Err(Error::Validation(
                    "the gate matvec alone is not bit-identical to the route's".into(),
                ));
            }
            Ok(())
        };
        let (mf, ef, hf) = (f64::from(m), f64::from(e), f64::from(h));
        Ok(Case {
            a: Work::Gpu(a),
            b: Work::Gpu(b),
            flops: 2.0 * mf * ef * hf,
            bytes: 4.0 * (mf * hf + ef * hf + mf * ef),
            tokens: m,
            validate: Box::new(validate),
            note: None,
        })
    }
}
