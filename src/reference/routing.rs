//! Reference routing: the gate matvec and top-k selection of `wgsl/routing/`, on the CPU.

use crate::kernels::routing::{Gating, ROUTE_WG, RouteConfig};

/// `logit = sum_h x[h] * w[h]` in the gate kernel's order: four lanes, lane j takes every
/// h with h % 4 == j in ascending h via `mul_add` from 0.0; result (l0 + l1) + (l2 + l3).
pub fn gate_logit(x: &[f32], w: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 4];
    for (i, (a, b)) in x.iter().zip(w).enumerate() {
        lanes[i % 4] = a.mul_add(*b, lanes[i % 4]);
    }
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

/// `logits[tokens, experts]` from `x[tokens, hidden]` and `gate[experts, hidden]`.
pub fn gate_logits(x: &[f32], gate: &[f32], hidden: usize) -> Vec<f32> {
    x.chunks_exact(hidden)
        .flat_map(|row| gate.chunks_exact(hidden).map(move |w| gate_logit(row, w)))
        .collect()
}

/// The shaders' total order on f32: NaN maps to 0 (below everything), -0.0 to the key of
/// +0.0, every other value monotonically.
pub fn order_key(v: f32) -> u32 {
    let mut b = v.to_bits();
    if b & 0x7fff_ffff > 0x7f80_0000 {
        return 0;
    }
    if b == 0x8000_0000 {
        b = 0;
    }
    if b & 0x8000_0000 != 0 { !b } else { b | 0x8000_0000 }
}

fn key_value(k: u32) -> f32 {
    if k == 0 {
        f32::NAN
    } else if k & 0x8000_0000 != 0 {
        f32::from_bits(k & 0x7fff_ffff)
    } else {
        f32::from_bits(!k)
    }
}

/// True when (ka, ia) ranks before (kb, ib): higher key first, then lower index.
pub fn outranks(ka: u32, ia: u32, kb: u32, ib: u32) -> bool {
    ka > kb || (ka == kb && ia < ib)
}

/// Per-invocation partial sums over experts `lid, lid + WG, ...`, then the tree
/// `part[i] = part[i] + part[i + s]` for s = WG/2, ..., 1.
fn workgroup_sum(values: &[f32]) -> f32 {
    super::workgroup_sum(values, ROUTE_WG as usize, |acc, v| acc + v)
}

/// Scores from one token's logits, as `scores_from_logits` in `select.wgsl`.
pub fn scores(gating: Gating, logits: &[f32]) -> Vec<f32> {
    match gating {
        Gating::Softmax => {
            let mk = logits.iter().map(|&l| order_key(l)).max().unwrap_or(0);
            let m = key_value(mk);
            let e: Vec<f32> = logits
                .iter()
                .map(|&l| match order_key(l) {
                    0 => f32::NAN,
                    k if k == mk => 1.0,
                    _ => (l - m).exp(),
                })
                .collect();
            let summed: Vec<f32> = e.iter().map(|&v| if v.is_nan() { 0.0 } else { v }).collect();
            let total = workgroup_sum(&summed);
            e.iter().map(|v| v / total).collect()
        }
        Gating::Raw => logits.to_vec(),
        Gating::Sigmoid => {
            logits.iter().map(|&l| if l.is_nan() { f32::NAN } else { 1.0 / (1.0 + (-l).exp()) }).collect()
        }
    }
}

/// Groups kept by group-limited selection, as `choose_groups` in `select.wgsl`.
fn kept_groups(cfg: &RouteConfig, sel: &[f32]) -> Vec<bool> {
    let Some(g) = cfg.groups else {
        return Vec::new();
    };
    let gs = (cfg.experts / g.n_group) as usize;
    let values: Vec<f32> = sel
        .chunks_exact(gs)
        .enumerate()
        .map(|(gi, group)| {
            let mut best = [(0u32, u32::MAX); 2];
            for (j, &v) in group.iter().enumerate() {
                let e = (gi * gs + j) as u32;
                let key = order_key(v);
                if outranks(key, e, best[0].0, best[0].1) {
                    best[1] = best[0];
                    best[0] = (key, e);
                } else if outranks(key, e, best[1].0, best[1].1) {
                    best[1] = (key, e);
                }
            }
            sel[best[0].1 as usize] + sel[best[1].1 as usize]
        })
        .collect();
    let mut on = vec![false; g.n_group as usize];
    for _ in 0..g.topk_group {
        let mut best = (0u32, u32::MAX);
        for (gi, &v) in values.iter().enumerate() {
            let key = order_key(v);
            if !on[gi] && outranks(key, gi as u32, best.0, best.1) {
                best = (key, gi as u32);
            }
        }
        on[best.1 as usize] = true;
    }
    on
}

/// Top-k for one token: `(indices, weights)` from its logits row, as `route_select`.
pub fn select(cfg: &RouteConfig, logits: &[f32], bias: Option<&[f32]>) -> (Vec<u32>, Vec<f32>) {
    let score = scores(cfg.gating, logits);
    let sel: Vec<f32> = match bias {
        Some(b) => score.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => score.clone(),
    };
    let groups = kept_groups(cfg, &sel);
    let gs = cfg.groups.map_or(1, |g| (cfg.experts / g.n_group) as usize);
    let mut chosen = Vec::with_capacity(cfg.k as usize);
    let (mut pk, mut pi) = (u32::MAX, 0u32);
    for _ in 0..cfg.k {
        let mut best = (0u32, u32::MAX);
        for (e, &v) in sel.iter().enumerate() {
            if !groups.is_empty() && !groups[e / gs] {
                continue;
            }
            let key = order_key(v);
            let e = e as u32;
            if outranks(pk, pi, key, e) && outranks(key, e, best.0, best.1) {
                best = (key, e);
            }
        }
        (pk, pi) = best;
        chosen.push(pi);
    }
    let mut sum = 0.0f32;
    if cfg.renormalize {
        for &e in &chosen {
            sum += score[e as usize];
        }
    }
    let weights = chosen
        .iter()
        .map(|&e| {
            let w = score[e as usize];
            let w = if cfg.renormalize { w / sum } else { w };
            w * cfg.scale
        })
        .collect();
    (chosen, weights)
}

/// Top-k for every token of `logits[tokens, experts]`: `(indices[tokens, k], weights[tokens, k])`.
pub fn topk(cfg: &RouteConfig, logits: &[f32], bias: Option<&[f32]>) -> (Vec<u32>, Vec<f32>) {
    let mut indices = Vec::new();
    let mut weights = Vec::new();
    for row in logits.chunks_exact(cfg.experts as usize) {
        let (i, w) = select(cfg, row, bias);
        indices.extend(i);
        weights.extend(w);
    }
    (indices, weights)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_key_is_a_total_order_with_nan_last_and_signed_zeros_equal() {
        let ordered =
            [f32::NEG_INFINITY, -1.0, -f32::MIN_POSITIVE, 0.0, f32::MIN_POSITIVE, 1.0, f32::INFINITY];
        for w in ordered.windows(2) {
            assert!(order_key(w[0]) < order_key(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert_eq!(order_key(-0.0), order_key(0.0));
        assert_eq!(order_key(f32::NAN), 0);
        assert_eq!(order_key(-f32::NAN), 0);
        assert!(order_key(f32::NEG_INFINITY) > 0);
        for v in [-3.5f32, 0.0, 2.0, f32::INFINITY, f32::NEG_INFINITY] {
            assert_eq!(key_value(order_key(v)).to_bits(), v.to_bits());
        }
    }

    #[test]
    fn gate_logit_uses_four_lanes() {
        // h = 0 and h = 4 share lane 0 and cancel; the 1.0 in lane 1 survives. A single
        // sequential accumulator would absorb it into 1e8 and return 0.
        let x = [1e8f32, 1.0, 0.0, 0.0, -1e8];
        let w = [1.0f32; 5];
        assert_eq!(gate_logit(&x, &w), 1.0);
    }

    #[test]
    fn equal_scores_go_to_the_lower_index_and_nan_never_outranks() {
        let cfg = RouteConfig::new(1, 6, 3);
        let logits = [f32::NAN, 1.0, 2.0, 2.0, -0.0, 0.0];
        let (idx, _) = select(&cfg, &logits, None);
        assert_eq!(idx, vec![2, 3, 1]);
        let cfg = RouteConfig::new(1, 4, 4);
        let (idx, _) = select(&cfg, &[f32::NEG_INFINITY; 4], None);
        assert_eq!(idx, vec![0, 1, 2, 3], "every expert exactly once even when all are -inf");
    }
}
