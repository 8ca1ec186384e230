// Expert weights read from textures (GemmVariant::Texture): the same u32 words as the packed
// buffers (weights_packed.wgsl), laid out one texture row per weight row, so each group of four
// K values is one texel fetch. Texel g of weight row r holds k = 4g .. 4g + 3, zeros past K:
// for DTYPE 0 an Rgba32Uint texel of four f32 words, for DTYPE 1 and 2 an Rg32Uint texel of two
// words of two halves each, low half first. Weight row r lies at y = r % height in layer
// r / height. The texture holds every expert of the projection (see TextureWeights in
// kernels/gemm/texture.rs); a dispatch's parameters describe it unsplit (expert_base 0, cols N).

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

// Weights k = 4g .. 4g + 3 of the weight row at `at` (from weight_texel_row), as f32.
fn weight_texel(buf_is_up: bool, at: vec2<u32>, g: u32) -> vec4<f32> {
    var t: vec4<u32>;
    if buf_is_up {
        t = textureLoad(w_up_tex, vec2<u32>(g, at.x), at.y, 0);
    } else {
        t = textureLoad(w_tex, vec2<u32>(g, at.x), at.y, 0);
    }
    if DTYPE == 0u {
        return bitcast<vec4<f32>>(t);
    }
    return vec4<f32>(half_to_f32(t.x & 0xffffu), half_to_f32(t.x >> 16u), half_to_f32(t.y & 0xffffu), half_to_f32(t.y >> 16u));
}
