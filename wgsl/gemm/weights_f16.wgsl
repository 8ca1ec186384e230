// Expert weights as native f16 (adapters with shader-f16): the same buffer bytes and the same
// values as the packed half path, converted to f32 before any arithmetic, so results are
// bit-identical to it. Composed after enable_f16.wgsl.

// Weights [E, N, K].
@group(0) @binding(2) var<storage, read> w: array<f16>;
// Second weights (up projection) for SWIGLU, same shape.
@group(0) @binding(3) var<storage, read> w_up: array<f16>;

fn weight_from(buf_is_up: bool, idx: u32) -> f32 {
    if buf_is_up {
        return f32(w_up[idx]);
    }
    return f32(w[idx]);
}
