// Quantised expert weights (DTYPE 3..6), bound as vec4s of words (rows are whole vec4s,
// quant.wgsl), so a block's code words are one or two vec4 loads (weight_words4): the weights
// file of every kernel that reads quantised rows (the generated blocks, the row-wise kernel and
// the unpacking kernel), with weight_row, weight_word and weight4_tail.

// Weights [E, N, K] in quantised rows.
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
// Second weights (up projection) for SWIGLU, same shape and dtype.
@group(0) @binding(3) var<storage, read> w_up: array<vec4<u32>>;

// The first word of the weight row of output column `col` of `expert`.
fn weight_row(expert: u32, col: u32) -> u32 {
    return weight_row_index(expert, col) * quant_row_words(params.kdim);
}

fn weight_word(buf_is_up: bool, i: u32) -> u32 {
    if buf_is_up {
        return w_up[i >> 2u][i & 3u];
    }
    return w[i >> 2u][i & 3u];
}

// Words i .. i + 3 (i a multiple of four).
fn weight_words4(buf_is_up: bool, i: u32) -> vec4<u32> {
    if buf_is_up {
        return w_up[i >> 2u];
    }
    return w[i >> 2u];
}

// Values k .. k + 3 of the row at word `base`, 0.0 at k >= kdim.
fn weight4_tail(buf_is_up: bool, base: u32, k: u32, kdim: u32) -> vec4<f32> {
    return quant_group4(buf_is_up, base, k, kdim);
}
