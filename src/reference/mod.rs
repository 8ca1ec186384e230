//! CPU oracles that follow the shaders' accumulation orders step by step (f32 throughout,
//! `f32::mul_add` where a shader writes `fma`). Where the adapter's arithmetic is IEEE
//! (add, mul, fma), results match bit for bit; transcendental functions (`exp`) and division
//! may differ by a few ULP on a GPU, which the comparison bound `2e-5 + 2e-5 * |ref|` covers.

pub mod dag;
pub mod dispatch;
pub mod gemm;
pub mod layer;
pub mod routing;
