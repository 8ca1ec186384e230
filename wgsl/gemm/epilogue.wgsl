// The end of every expert-projection output (ExpertFfn's bias and activation), shared by the
// generated block kernels and the row-wise kernel so that every path gives the same bits:
//   g = x . w + bias, u = x . w_up + bias_up (the dot in the mode's order, then one add);
//   SWIGLU off: g. SWIGLU on, ACTIVATION 0: silu_mul(g, u) = g / (1 + exp(-g)) * u;
//   ACTIVATION 1 (gpt-oss's clamped SwiGLU): g' = min(g, GLU_LIMIT),
//   u' = clamp(u, -GLU_LIMIT, GLU_LIMIT), (u' + 1) * (g' / (1 + exp(-(GLU_ALPHA * g')))).
// Mirrored by reference::gemm::epilogue.

// Biases, f32 by global expert and column: BIAS 1 one per output [E, N]; BIAS 2 a (gate, up)
// pair per output [E, N, 2] (the SwiGLU pass). Bound to any read-only buffer with BIAS 0.
@group(0) @binding(10) var<storage, read_write> bias: array<f32>;

// 0: no bias; 1: [E, N]; 2: [E, N, 2].
override BIAS: u32 = 0u;
// 0: SwiGLU (silu); 1: clamped SwiGLU (gpt-oss).
override ACTIVATION: u32 = 0u;
override GLU_ALPHA: f32 = 1.702;
override GLU_LIMIT: f32 = 7.0;

fn epilogue(expert: u32, col: u32, v: f32, v_up: f32) -> f32 {
    var g = v;
    var u = v_up;
    let at = expert * params.n + col;
    if BIAS == 1u {
        g = g + bias[at];
    } else if BIAS == 2u {
        g = g + bias[2u * at];
        u = u + bias[2u * at + 1u];
    }
    if !SWIGLU {
        return g;
    }
    if ACTIVATION == 1u {
        let gc = min(g, GLU_LIMIT);
        let uc = clamp(u, -GLU_LIMIT, GLU_LIMIT);
        return (uc + 1.0) * (gc / (1.0 + exp(-(GLU_ALPHA * gc))));
    }
    return silu_mul(g, u);
}
