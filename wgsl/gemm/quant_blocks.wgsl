// Quantised weight rows read block by block (after weights_quant.wgsl and quant.wgsl): a block
// of 32 values reads its group's header word once and decodes its scale once (quant_scale),
// and reads its code words as one vec4 (Q4_0 and MXFP4: word s holds Q4_0's steps s and s + 4,
// MXFP4's steps 2s and 2s + 1) or two (Q8_0 and FP8: word s holds step s). The row-wise
// kernel (rowwise_dots_quant.wgsl) and the generated direct and window blocks for quantised
// weights read through these; each step of four values gives the same values as
// quant_group4.

// One block of 32 values of a row (and of its up projection's row under SWIGLU): code words
// lo (words 0 .. 3) and hi (4 .. 7; Q8_0 and FP8 only), and the block's scale (quant_scale).
struct RowBlock {
    lo: vec4<u32>,
    hi: vec4<u32>,
    scale: u32,
    lo_up: vec4<u32>,
    hi_up: vec4<u32>,
    scale_up: u32,
}

// The block of the row at word `wr` that starts at value k0 (a multiple of 32 below K; a group
// is whole in the row, so every word of a block that starts before K is there).
fn row_block(wr: u32, k0: u32) -> RowBlock {
    // Eight code words a block (Q8_0, FP8): a second vec4.
    let two = quant_block_words() == 8u;
    let head = quant_head_at(wr, k0);
    let block = (k0 % quant_group_values()) / 32u;
    let codes = quant_codes_of(wr, k0, params.kdim);
    var b = RowBlock(vec4<u32>(0u), vec4<u32>(0u), 0u, vec4<u32>(0u), vec4<u32>(0u), 0u);
    b.lo = weight_words4(false, codes);
    b.scale = quant_scale(weight_word(false, head), block);
    if two {
        b.hi = weight_words4(false, codes + 4u);
    }
    if SWIGLU {
        b.lo_up = weight_words4(true, codes);
        b.scale_up = quant_scale(weight_word(true, head), block);
        if two {
            b.hi_up = weight_words4(true, codes + 4u);
        }
    }
    return b;
}

// Step s (0 .. 7: values 4s .. 4s + 3 of the block) of block b, of the up projection's row
// with `up`: (the code word, the shift of the step's first bits in it), for quant_full4 or
// quant_vec4 with the block's scale.
fn block_word(b: RowBlock, up: bool, s: u32) -> vec2<u32> {
    let at = quant_word_shift(4u * s);
    let i = at.x % 4u;
    let high = at.x >= 4u;
    if up {
        return vec2<u32>(select(b.lo_up[i], b.hi_up[i], high), at.y);
    }
    return vec2<u32>(select(b.lo[i], b.hi[i], high), at.y);
}

// Values k .. k + 3 (step s of block b, k = the block's first value + 4s, below K) of the
// row, of the up projection's row with `up`: quant_vec4, so 0.0 at K and past it.
fn block_vec4(b: RowBlock, up: bool, s: u32, k: u32) -> vec4<f32> {
    let at = block_word(b, up, s);
    return quant_vec4(at.x, at.y, select(b.scale, b.scale_up, up), k, params.kdim);
}
