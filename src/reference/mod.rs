//! CPU oracles that follow the shaders' accumulation orders step by step (f32 throughout,
//! `f32::mul_add` where a shader writes `fma`). Where the adapter's arithmetic is IEEE
//! (add, mul, fma), results match bit for bit; transcendental functions (`exp`) and division
//! may differ by a few ULP on a GPU, which the comparison bound `2e-5 + 2e-5 * |ref|` covers.

#[cfg(feature = "dag")]
pub mod dag;
/// The dispatch layout's CPU oracle: the host layout of [`crate::kernels::dispatch::host`],
/// which the host-dispatch path uploads too.
pub mod dispatch {
    pub use crate::kernels::dispatch::host::*;
}
pub mod gemm;
pub mod layer;
pub mod routing;

/// The project's float bound: `|got - want| <= 2e-5 + 2e-5 * |want|`, NaN only where NaN,
/// an infinity only where the same infinity.
pub fn within(got: f32, want: f32) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    got == want || (got - want).abs() <= 2e-5 + 2e-5 * want.abs()
}

/// A workgroup's sum in the order the shaders form it: lane `l` folds `term(acc, v)` over
/// `values[l], values[l + lanes], ...` from 0.0, then a pairwise tree over the lanes
/// (`part[i] = part[i] + part[i + s]` for s = lanes/2, ..., 1). `lanes` is a power of two.
pub(crate) fn workgroup_sum(values: &[f32], lanes: usize, term: impl Fn(f32, f32) -> f32) -> f32 {
    let mut part = vec![0.0f32; lanes];
    for (lane, p) in part.iter_mut().enumerate() {
        *p = values.iter().skip(lane).step_by(lanes).fold(0.0, |acc, &v| term(acc, v));
    }
    let mut s = lanes / 2;
    while s > 0 {
        for i in 0..s {
            part[i] += part[i + s];
        }
        s /= 2;
    }
    part[0]
}
