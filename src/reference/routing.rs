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

/// `exp(x)` as `exp_fixed` in `select.wgsl`: range reduction `x = n ln2 + r` with
/// `n = round(x log2 e)` (ties to even) and ln 2 in two parts, Cephes' polynomial for `e^r`
/// (`mul_add` where the shader writes `fma`), then `e^r * 2^n` in two exact power-of-two
/// steps. NaN stays NaN, `x > 88.72283` gives `+inf`, results below the smallest normal f32
/// are 0.0. About 1 ULP from the true value; independent of any platform `exp`.
#[allow(clippy::excessive_precision)] // the shader's literals, digit for digit
pub fn exp_fixed(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    // The same literals as the shader, so both round them to the same f32.
    if order_key(x) > order_key(88.72283172607421875) {
        return f32::INFINITY;
    }
    if order_key(x) < order_key(-87.3365478515625) {
        return 0.0;
    }
    let n = (x * 1.44269502162933349609375).round_ties_even();
    let r = n.mul_add(2.12194440e-4, n.mul_add(-0.693359375, x));
    let mut p = 1.9875691500e-4_f32;
    for c in [1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    let ni = n as i32;
    let half = ni / 2;
    let pow2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    let v = (y * pow2(half)) * pow2(ni - half);
    if v.to_bits() & 0x7fff_ffff < 0x0080_0000 { 0.0 } else { v }
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
                    _ => exp_fixed(l - m),
                })
                .collect();
            let summed: Vec<f32> = e.iter().map(|&v| if v.is_nan() { 0.0 } else { v }).collect();
            let total = workgroup_sum(&summed);
            e.iter().map(|v| v / total).collect()
        }
        Gating::Raw => logits.to_vec(),
        Gating::Sigmoid => {
            logits.iter().map(|&l| if l.is_nan() { f32::NAN } else { 1.0 / (1.0 + exp_fixed(-l)) }).collect()
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

/// The `k` experts ranked first by `sel` (restricted to `groups` when given), as
/// `choose_experts` in `select.wgsl`.
fn choose(cfg: &RouteConfig, sel: &[f32], groups: &[bool]) -> Vec<u32> {
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
    chosen
}

/// Zero for a subnormal (or zero) `v`, `v` otherwise, as `flush_subnormal` in
/// `wgsl/routing/select.wgsl`: the renormalising sum flushes explicitly, because WGSL lets an
/// adapter flush f32 subnormals (SwiftShader does) and a sum of subnormals divided into
/// itself would give 1 on one adapter and NaN on another.
pub fn flush_subnormal(v: f32) -> f32 {
    if v.abs() < f32::MIN_POSITIVE { 0.0 } else { v }
}

/// Top-k for one token: `(indices, weights)` from its logits row, as `route_select`. Without
/// bias and groups the experts are chosen on the logits; else on the scores (plus bias).
pub fn select(cfg: &RouteConfig, logits: &[f32], bias: Option<&[f32]>) -> (Vec<u32>, Vec<f32>) {
    let score = scores(cfg.gating, logits);
    let chosen = if bias.is_none() && cfg.groups.is_none() {
        choose(cfg, logits, &[])
    } else {
        let sel: Vec<f32> = match bias {
            Some(b) => score.iter().zip(b).map(|(s, b)| s + b).collect(),
            None => score.clone(),
        };
        choose(cfg, &sel, &kept_groups(cfg, &sel))
    };
    let mut sum = 0.0f32;
    if cfg.renormalize {
        for &e in &chosen {
            sum = flush_subnormal(sum + flush_subnormal(score[e as usize]));
        }
    }
    let weights = chosen
        .iter()
        .map(|&e| {
            let w = score[e as usize];
            let w = if cfg.renormalize { flush_subnormal(w) / sum } else { w };
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
    fn exp_fixed_is_within_two_ulp_of_exp_and_monotone() {
        let ulp = |v: f32| f32::from_bits(v.to_bits() + 1) - v;
        let mut prev = 0.0f32;
        let mut x = -87.0f32;
        while x < 88.7 {
            let got = exp_fixed(x);
            let want = f64::from(x).exp();
            assert!(
                (f64::from(got) - want).abs() <= 2.0 * f64::from(ulp(want as f32)),
                "exp({x}) = {got}, want {want}"
            );
            assert!(got >= prev, "not monotone at {x}");
            prev = got;
            x += 0.013;
        }
        for tiny in [1e-30f32, -1e-30, 1e-40, -1e-40, 0.0, -0.0, 1e-8, -1e-8] {
            assert_eq!(exp_fixed(tiny), 1.0, "exp({tiny})");
        }
        assert_eq!(exp_fixed(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_fixed(-100.0), 0.0);
        assert_eq!(exp_fixed(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_fixed(89.0), f32::INFINITY);
        assert!(exp_fixed(88.72).is_finite());
        assert!(exp_fixed(f32::NAN).is_nan());
    }

    #[test]
    fn unbiased_selection_follows_the_logits_not_the_rounded_scores() {
        // Subnormal logits one ULP apart: their softmax scores round to the same value, the
        // logits still order them, so expert 1 (the larger logit) comes first.
        let cfg = RouteConfig::new(1, 2, 2);
        let (idx, w) = select(&cfg, &[f32::from_bits(1), f32::from_bits(2)], None);
        assert_eq!(idx, vec![1, 0]);
        assert_eq!(w[0], w[1]);
        let sig = RouteConfig { gating: Gating::Sigmoid, ..cfg };
        assert_eq!(select(&sig, &[f32::from_bits(1), f32::from_bits(2)], None).0, vec![1, 0]);
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
