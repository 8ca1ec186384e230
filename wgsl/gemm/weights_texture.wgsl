// Expert weights read from textures (GemmVariant::Texture): the same u32 words as the packed
// buffers (weights_packed.wgsl), laid out one texture row per weight row in Rgba32Uint texels
// of four words. For DTYPE 0 texel t of weight row r holds the f32 values k = 4t .. 4t + 3; for
// DTYPE 1 and 2 it holds the eight halves k = 8t .. 8t + 7, two per word, low half first (a
// group of four K values is one half of a texel). Zeros past K. Weight row r lies at
// y = r % height in layer r / height. The texture holds every expert of the projection (see
// TextureWeights in kernels/gemm/texture.rs); a dispatch's parameters describe it unsplit
// (expert_base 0, cols N).

// Weights [E * N rows of ceil(K / 4) texels] over array layers.
@group(0) @binding(2) var w_tex: texture_2d_array<u32>;
// Second weights (up projection) for SWIGLU, same shape and dtype.
@group(0) @binding(3) var w_up_tex: texture_2d_array<u32>;

// (y, layer) of output column `col` of `expert`'s weight row.
fn weight_texel_row(expert: u32, col: u32) -> vec2<u32> {
    let row = (expert - params.expert_base) * params.cols + (col - params.col_base);
    let height = textureDimensions(w_tex).y;
    return vec2<u32>(row % height, row / height);
}

// Weights k = 4g .. 4g + 3 of the weight row at `at` (from weight_texel_row), as f32: texel g
// (DTYPE 0), or half of texel g / 2 (16-bit).
fn weight_texel(buf_is_up: bool, at: vec2<u32>, g: u32) -> vec4<f32> {
    if DTYPE == 0u {
        return bitcast<vec4<f32>>(texel_words(buf_is_up, at, g));
    }
    let t = texel_words(buf_is_up, at, g / 2u);
    return halves4(select(t.xy, t.zw, (g & 1u) == 1u));
}

// Texel t of the weight row at `at`.
fn texel_words(buf_is_up: bool, at: vec2<u32>, t: u32) -> vec4<u32> {
    if buf_is_up {
        return textureLoad(w_up_tex, vec2<u32>(t, at.x), at.y, 0);
    }
    return textureLoad(w_tex, vec2<u32>(t, at.x), at.y, 0);
}

// The four halves of two words (low half first) as f32.
fn halves4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(half_to_f32(w.x & 0xffffu), half_to_f32(w.x >> 16u), half_to_f32(w.y & 0xffffu), half_to_f32(w.y >> 16u));
}
