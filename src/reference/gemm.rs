//! Reference expert projections in the kernels' K orders (`wgsl/gemm/common.wgsl`).

use crate::kernels::gemm::{Activation, GemmOrder};
use std::borrow::Cow;

/// `sum_k x[k] * w[k]`: K in groups of four (entries past K read as 0.0), lane j of the
/// group accumulating with `mul_add` from 0.0, result `(l0 + l1) + (l2 + l3)`.
pub fn dot(x: &[f32], w: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 4];
    for (xg, wg) in x.chunks(4).zip(w.chunks(4)) {
        for (j, lane) in lanes.iter_mut().enumerate() {
            let xv = xg.get(j).copied().unwrap_or(0.0);
            let wv = wg.get(j).copied().unwrap_or(0.0);
            *lane = xv.mul_add(wv, *lane);
        }
    }
    (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
}

/// `sum_k x[k] * w[k]` in [`GemmOrder::Fast`]: one accumulator, `mul_add` from 0.0 for k
/// ascending over K rounded up to a multiple of four (entries past K read as 0.0).
pub fn dot_fast(x: &[f32], w: &[f32]) -> f32 {
    let padded = x.len().next_multiple_of(4);
    (0..padded).fold(0.0f32, |acc, k| {
        let xv = x.get(k).copied().unwrap_or(0.0);
        let wv = w.get(k).copied().unwrap_or(0.0);
        xv.mul_add(wv, acc)
    })
}

/// `sum_k x[k] * w[k]` in `order` ([`dot`] for strict, [`dot_fast`] for fast).
pub fn dot_in_order(order: GemmOrder, x: &[f32], w: &[f32]) -> f32 {
    match order {
        GemmOrder::Strict => dot(x, w),
        GemmOrder::Fast => dot_fast(x, w),
    }
}

/// `silu(g) * u` as the kernels compute it: `g / (1 + exp(-g)) * u`.
pub fn silu_mul(g: f32, u: f32) -> f32 {
    g / (1.0 + (-g).exp()) * u
}

/// The kernels' epilogue (`wgsl/gemm/epilogue.wgsl`) for a SwiGLU pass: `g` and `u` are the
/// gate and up dot products with their biases added; `activation` gives the output.
pub fn epilogue(activation: Activation, g: f32, u: f32) -> f32 {
    match activation {
        Activation::ClampedSwiglu { alpha, limit } => {
            // WGSL's min and clamp; for a NaN input the adapter decides (the contract covers
            // finite values).
            let gc = g.min(limit);
            let uc = u.clamp(-limit, limit);
            (uc + 1.0) * (gc / (1.0 + (-(alpha * gc)).exp()))
        }
        Activation::Swiglu => silu_mul(g, u),
    }
}

/// Per-expert biases on the host: `gate`, `up` `[E, F]`, `down` `[E, H]`.
#[derive(Clone, Copy, Debug)]
pub struct FfnBias<'a> {
    /// `[E, F]`.
    pub gate: &'a [f32],
    /// `[E, F]`.
    pub up: &'a [f32],
    /// `[E, H]`.
    pub down: &'a [f32],
}

/// Expert FFN weights on the host, rounded to the weight dtype: `gate`, `up` `[E, F, H]`,
/// `down` `[E, H, F]`.
#[derive(Clone, Copy, Debug)]
pub struct FfnWeights<'a> {
    /// `[E, F, H]`.
    pub gate: &'a [f32],
    /// `[E, F, H]`.
    pub up: &'a [f32],
    /// `[E, H, F]`.
    pub down: &'a [f32],
    /// H.
    pub hidden: usize,
    /// F.
    pub ffn: usize,
    /// The kernels' accumulation order.
    pub order: GemmOrder,
    /// The activation between the projections.
    pub activation: Activation,
    /// Projection biases, added after each dot product.
    pub bias: Option<FfnBias<'a>>,
    /// Each dot's operands rounded to f16 first (to nearest, ties to even), x and the
    /// weights for gate and up, the activations and the weights for down: what
    /// [`GemmVariant::TileF16`](crate::kernels::gemm::GemmVariant::TileF16) kernels stage.
    pub f16_operands: bool,
}

/// `v` as the kernels multiply it: rounded to f16 where `f16_operands` (copied only then).
fn multiplied(v: &[f32], f16_operands: bool) -> Cow<'_, [f32]> {
    if f16_operands { Cow::Owned(round_f16(v)) } else { Cow::Borrowed(v) }
}

/// `v` rounded to f16 (to nearest, ties to even; past ±65504 infinity) and widened back: the
/// values an f16-staged kernel multiplies.
pub fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect()
}

/// The gated FFN of `expert` on one input row: `down(act(gate x + b_g, up x + b_u)) + b_d`,
/// each dot in the kernels' order and each bias one add after it.
pub fn ffn_row(x: &[f32], expert: usize, w: &FfnWeights<'_>) -> Vec<f32> {
    let (hidden, ffn) = (w.hidden, w.ffn);
    let add = |v: f32, b: Option<&[f32]>, i: usize| b.map_or(v, |b| v + b[i]);
    let dot = |x: &[f32], row: &[f32]| dot_in_order(w.order, x, &multiplied(row, w.f16_operands));
    let x = multiplied(x, w.f16_operands);
    let act: Vec<f32> = (0..ffn)
        .map(|n| {
            let at = (expert * ffn + n) * hidden;
            let i = expert * ffn + n;
            let g = add(dot(&x, &w.gate[at..at + hidden]), w.bias.map(|b| b.gate), i);
            let u = add(dot(&x, &w.up[at..at + hidden]), w.bias.map(|b| b.up), i);
            epilogue(w.activation, g, u)
        })
        .collect();
    let act = if w.f16_operands { round_f16(&act) } else { act };
    (0..hidden)
        .map(|n| {
            let at = (expert * hidden + n) * ffn;
            add(dot(&act, &w.down[at..at + ffn]), w.bias.map(|b| b.down), expert * hidden + n)
        })
        .collect()
}

/// `partial[tokens * k, H]`: entry `t * k + j` is expert `indices[t * k + j]` applied to `x[t]`.
pub fn expert_ffn(x: &[f32], indices: &[u32], k: usize, w: &FfnWeights<'_>) -> Vec<f32> {
    indices
        .iter()
        .enumerate()
        .flat_map(|(i, &e)| {
            let t = i / k;
            ffn_row(&x[t * w.hidden..(t + 1) * w.hidden], e as usize, w)
        })
        .collect()
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_groups_by_four_and_pads_with_zero() {
        // k = 0 and k = 4 share lane 0 and cancel; the 1.0 in lane 1 survives.
        assert_eq!(dot(&[1e8, 1.0, 0.0, 0.0, -1e8], &[1.0; 5]), 1.0);
        // K = 5: lanes 1..3 of the second group read zeros.
        assert_eq!(dot(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.0, 1.0, 1.0, 1.0, 2.0]), 20.0);
    }

    #[test]
    fn fast_dot_is_one_accumulator_in_k_order() {
        // One accumulator absorbs the 1.0 into 1e8 before -1e8 cancels it: 0, where the four
        // lanes keep it.
        assert_eq!(dot_fast(&[1e8, 1.0, 0.0, 0.0, -1e8], &[1.0; 5]), 0.0);
        assert_eq!(dot_fast(&[1.0, 2.0, 3.0, 4.0, 5.0], &[1.0, 1.0, 1.0, 1.0, 2.0]), 20.0);
    }
}
