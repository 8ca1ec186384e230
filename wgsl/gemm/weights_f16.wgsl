// Expert weights as native f16 (adapters with shader-f16): the same buffer bytes and the same
// values as the packed half path, converted to f32 before any arithmetic, so results are
// bit-identical to it. Composed after enable_f16.wgsl. Same functions as weights_packed.wgsl
// (weight_groups.wgsl, composed after this file, reads groups of four from them).

// Weights [E, N, K].
@group(0) @binding(2) var<storage, read> w: array<f16>;
// Second weights (up projection) for SWIGLU, same shape.
@group(0) @binding(3) var<storage, read> w_up: array<f16>;

// Index of the first element of the weight row of output column `col` of `expert`.
fn weight_row(expert: u32, col: u32) -> u32 {
    return weight_row_index(expert, col) * params.kdim;
}

fn weight_from(buf_is_up: bool, idx: u32) -> f32 {
    if buf_is_up {
        return f32(w_up[idx]);
    }
    return f32(w[idx]);
}

fn weight4(buf_is_up: bool, idx: u32) -> vec4<f32> {
    return vec4<f32>(
        weight_from(buf_is_up, idx),
        weight_from(buf_is_up, idx + 1u),
        weight_from(buf_is_up, idx + 2u),
        weight_from(buf_is_up, idx + 3u),
    );
}
