// The two accumulation orders of the expert projections (stated in full in common.wgsl) as
// functions over one group of four K values, and the SwiGLU activation. Shared by the
// row-wise kernel, the generated block kernels (silu_mul, lanes_sum) and the MoE queue's
// expert tiles (wgsl/dag/moe.wgsl), so a value computed on any of them is the same bits.

// One accumulator chain per output in lane x (GemmOrder::Fast) instead of four lanes.
override FAST_ORDER: bool = false;

fn silu_mul(g: f32, u: f32) -> f32 {
    return g / (1.0 + exp(-g)) * u;
}

fn lanes_sum(acc: vec4<f32>) -> f32 {
    return (acc.x + acc.y) + (acc.z + acc.w);
}

// Adds the group xv . wv to `acc`. Strict: lane j takes k = 4g + j, acc = fma(xv, wv, acc).
// Fast: acc.x = fma(xv.w, wv.w, fma(xv.z, wv.z, fma(xv.y, wv.y, fma(xv.x, wv.x, acc.x)))).
fn order_step(acc: vec4<f32>, xv: vec4<f32>, wv: vec4<f32>) -> vec4<f32> {
    if FAST_ORDER {
        return vec4<f32>(fma(xv.w, wv.w, fma(xv.z, wv.z, fma(xv.y, wv.y, fma(xv.x, wv.x, acc.x)))), 0.0, 0.0, 0.0);
    }
    return fma(xv, wv, acc);
}

// The output of an accumulator that started at vec4(0.0) and took every group of K.
fn order_value(acc: vec4<f32>) -> f32 {
    if FAST_ORDER {
        return acc.x;
    }
    return lanes_sum(acc);
}
