// Weights for the row-wise kernel, read from their texture copies (weights_texture.wgsl): a
// row is found by its texel row, and each group of four is one texel (zeros past K).
alias WeightAt = vec2<u32>;

fn weight_at(expert: u32, col: u32) -> WeightAt {
    return weight_texel_row(expert, col);
}

// Weights k .. k + 3 of the row at `at` (k a multiple of four).
fn weight_vec(buf_is_up: bool, at: WeightAt, k: u32) -> vec4<f32> {
    return weight_texel(buf_is_up, at, k / 4u);
}
