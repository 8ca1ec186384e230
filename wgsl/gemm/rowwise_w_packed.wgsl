// Weights for the row-wise kernel, read from the weight buffers (weights_packed.wgsl or
// weights_f16.wgsl): a row is found by its first element's index, and each group of four is
// read element by element, 0.0 past K.
alias WeightAt = u32;

fn weight_at(expert: u32, col: u32) -> WeightAt {
    return weight_row(expert, col);
}

// Weights k .. k + 3 of the row at `at`, 0.0 at k >= K.
fn weight_vec(buf_is_up: bool, at: WeightAt, k: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < params.kdim {
            v[j] = weight_from(buf_is_up, at + k + j);
        }
    }
    return v;
}
