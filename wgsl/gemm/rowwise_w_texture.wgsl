// Weights for the row-wise kernel, read from their texture copies (weights_texture.wgsl): a
// row is found by its texel row; a group of four is one f32 texel or half a 16-bit one, two
// groups one 16-bit texel (zeros past K).
alias WeightAt = vec2<u32>;

fn weight_at(expert: u32, col: u32) -> WeightAt {
    return weight_texel_row(expert, col);
}

// Weights k .. k + 3 of the row at `at` (k a multiple of four).
fn weight_vec(buf_is_up: bool, at: WeightAt, k: u32) -> vec4<f32> {
    return weight_texel(buf_is_up, at, k / 4u);
}

// Weights k .. k + 7 (k a multiple of eight) of the row at `at`: the values of weight_vec at k
// and k + 4, from one texel for 16-bit weights (two for f32).
fn weight_pair(buf_is_up: bool, at: WeightAt, k: u32) -> WeightPair {
    if DTYPE == 0u {
        return WeightPair(weight_texel(buf_is_up, at, k / 4u), weight_texel(buf_is_up, at, k / 4u + 1u));
    }
    let t = texel_words(buf_is_up, at, k / 8u);
    return WeightPair(halves4(t.xy), halves4(t.zw));
}
