// Weights for the row-wise kernel, read from the weight buffers (weights_packed.wgsl,
// weights_f16.wgsl or weights_quant.wgsl): a row is found by weight_row, and each group of four
// is read by weight4_tail (element by element, or a quantised block's header and code word),
// 0.0 past K.
alias WeightAt = u32;

fn weight_at(expert: u32, col: u32) -> WeightAt {
    return weight_row(expert, col);
}

// Weights k .. k + 3 of the row at `at`, 0.0 at k >= K.
fn weight_vec(buf_is_up: bool, at: WeightAt, k: u32) -> vec4<f32> {
    return weight4_tail(buf_is_up, at, k, params.kdim);
}

// Weights k .. k + 7 (k + 7 below K) of the row at `at`: weight_vec at k and k + 4.
fn weight_pair(buf_is_up: bool, at: WeightAt, k: u32) -> WeightPair {
    return WeightPair(weight_vec(buf_is_up, at, k), weight_vec(buf_is_up, at, k + 4u));
}
