//! Reference MoE layer: the routing, expert FFN and combine references composed in the
//! layer's order.

use crate::bits::same_bits;
use crate::error::{Error, Result};
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

/// How a device forward agrees with [`forward`] on a sample of its tokens ([`agreement`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agreement {
    /// Tokens compared.
    pub tokens: usize,
    /// Of them, those whose top-k indices equal the reference's, slot by slot.
    pub routing_equal: usize,
    /// The largest `|got - want|` as a share of the bound `2e-5 + 2e-5 * s`, `s` the token's
    /// largest `|want|` (at most 1: every output within it).
    pub worst_of_bound: f32,
    /// Outputs with the reference's bits.
    pub bit_equal: usize,
    /// Outputs compared.
    pub values: usize,
}

impl Agreement {
    /// Every compared output within the bound.
    pub fn within(&self) -> bool {
        self.worst_of_bound <= 1.0
    }

    /// Routing equal on every compared token and every output within the bound.
    pub fn passes(&self) -> bool {
        self.within() && self.routing_equal == self.tokens
    }
}

/// Compares a device forward of `x[tokens, H]` (its outputs `y[tokens, H]` and top-k
/// `indices[tokens, k]`) with [`forward`] on the first and last 16 tokens (every token where
/// there are at most 32): a token's output depends on its own row alone, so a sample is a
/// complete check of the tokens in it.
///
/// # Errors
/// `x`, `y` or `indices` shorter than `tokens` rows ([`Error::Shape`]); [`forward`]'s errors.
pub fn agreement(
    cfg: &MoeConfig,
    w: &MoeWeights,
    x: &[f32],
    y: &[f32],
    indices: &[u32],
    tokens: usize,
) -> Result<Agreement> {
    let (h, k) = (cfg.route.hidden as usize, cfg.route.k as usize);
    for (what, len, row) in [("x", x.len(), h), ("y", y.len(), h), ("indices", indices.len(), k)] {
        if len < tokens * row {
            return Err(Error::shape(what, format!("{tokens} rows of {row}"), len));
        }
    }
    let picks: Vec<usize> = (0..tokens.min(16)).chain(tokens.saturating_sub(16).max(16)..tokens).collect();
    let xs: Vec<f32> = picks.iter().flat_map(|&t| x[t * h..(t + 1) * h].to_vec()).collect();
    let (ry, ridx, _) = forward(cfg, w, &xs)?;
    let (mut worst, mut bit_equal, mut routing_equal) = (0.0f32, 0usize, 0usize);
    for (n, &t) in picks.iter().enumerate() {
        let want = &ry[n * h..(n + 1) * h];
        let got = &y[t * h..(t + 1) * h];
        let scale = want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        for (g, r) in got.iter().zip(want) {
            worst = worst.max((g - r).abs() / (2e-5 + 2e-5 * scale));
            bit_equal += usize::from(same_bits(*g, *r));
        }
        routing_equal += usize::from(indices[t * k..(t + 1) * k] == ridx[n * k..(n + 1) * k]);
    }
    Ok(Agreement {
        tokens: picks.len(),
        routing_equal,
        worst_of_bound: worst,
        bit_equal,
        values: picks.len() * h,
    })
}

#[cfg(all(test, feature = "synth"))]
mod tests {
    use super::*;

    /// The reference agrees with itself bit for bit on a sample of 40 tokens (the first and
    /// last 16); a flipped routing slot, an output past the bound and short outputs are seen.
    #[test]
    fn agreement_compares_a_sample_and_refuses_short_outputs() {
        let cfg = MoeConfig::new(8, 4, 4, 2);
        let mut synth = crate::synth::Synth::new(3);
        let w = synth.moe_weights(&cfg);
        let x = synth.uniform(40 * 8, 1.0);
        let (y, idx, _) = forward(&cfg, &w, &x).expect("reference");
        let same = agreement(&cfg, &w, &x, &y, &idx, 40).expect("agreement");
        assert_eq!((same.tokens, same.routing_equal, same.bit_equal, same.values), (32, 32, 256, 256));
        assert!(same.passes());
        let (mut y2, mut idx2) = (y.clone(), idx.clone());
        idx2.swap(39 * 2, 39 * 2 + 1);
        y2[0] += 1.0;
        let off = agreement(&cfg, &w, &x, &y2, &idx2, 40).expect("agreement");
        assert_eq!(off.routing_equal, 31);
        assert!(!off.within() && !off.passes());
        let err = agreement(&cfg, &w, &x, &y[..8], &idx, 40).expect_err("short y").to_string();
        assert!(err.contains('y'), "{err}");
    }
}
