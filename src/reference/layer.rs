//! Reference MoE layer: the routing, expert FFN and combine references composed in the
//! layer's order.

use crate::error::Result;
use crate::kernels::dispatch::OverflowPolicy;
use crate::layer::{Capacity, MoeConfig, MoeWeights};
use crate::reference::{dispatch, gemm, routing};

/// `(y[tokens, H], indices[tokens, k], weights[tokens, k])` for `x[tokens, H]`, with the
/// expert weights as the layer's kernels see them ([`crate::kernels::gemm::WeightDtype::round`]).
///
/// # Errors
/// Weights the layer's dtype cannot hold (a value that is not finite, for a quantised dtype).
pub fn forward(cfg: &MoeConfig, w: &MoeWeights, x: &[f32]) -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
    let (h, k) = (cfg.route.hidden as usize, cfg.route.k as usize);
    let mut logits = routing::gate_logits(x, &w.router, h);
    if let Some(b) = &w.router_bias {
        // The kernels' order: the dot, then one add.
        for row in logits.chunks_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(l, b)| *l += b);
        }
    }
    let (indices, weights) = routing::topk(&cfg.route, &logits, w.bias.as_deref());
    let f = cfg.ffn as usize;
    let round = |v: &[f32], k: usize| cfg.weight_dtype.round(v, k);
    let (gate, up, down) = (round(&w.gate, h)?, round(&w.up, h)?, round(&w.down, f)?);
    let order = cfg.gemm_order;
    let experts = gemm::FfnWeights {
        gate: &gate,
        up: &up,
        down: &down,
        hidden: h,
        ffn: cfg.ffn as usize,
        order,
        activation: cfg.activation,
        bias: w.expert_bias.as_ref().map(|b| gemm::FfnBias { gate: &b.gate, up: &b.up, down: &b.down }),
        f16_operands: false,
    };
    let mut partial = gemm::expert_ffn(x, &indices, k, &experts);
    if let Capacity::Bounded { bound, policy: OverflowPolicy::Drop } = cfg.capacity {
        let l = dispatch::layout(&indices, cfg.route.experts, 1, bound);
        for (i, &row) in l.inverse.iter().enumerate() {
            if row - l.offsets[indices[i] as usize] >= bound {
                partial[i * h..(i + 1) * h].fill(0.0);
            }
        }
    }
    let shared_f = cfg.shared_ffn.unwrap_or(0) as usize;
    let shared = match &w.shared {
        Some((g, u, d)) => Some((round(g, h)?, round(u, h)?, round(d, shared_f)?)),
        None => None,
    };
    let mut y = vec![0.0f32; x.len()];
    for (t, row) in y.chunks_mut(h).enumerate() {
        let xt = &x[t * h..(t + 1) * h];
        let shared_row = shared.as_ref().map(|(g, u, d)| {
            let sw = gemm::FfnWeights {
                gate: g,
                up: u,
                down: d,
                hidden: h,
                ffn: shared_f,
                order,
                activation: cfg.activation,
                bias: None,
                f16_operands: false,
            };
            gemm::ffn_row(xt, 0, &sw)
        });
        let s =
            w.shared_gate.as_ref().map_or(1.0, |g| 1.0 / (1.0 + (-gemm::dot_in_order(order, xt, g)).exp()));
        for (c, out) in row.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for j in 0..k {
                let e = t * k + j;
                acc = weights[e].mul_add(partial[e * h + c], acc);
            }
            if let Some(sr) = &shared_row {
                acc = s.mul_add(sr[c], acc);
            }
            *out = acc;
        }
    }
    Ok((y, indices, weights))
}
