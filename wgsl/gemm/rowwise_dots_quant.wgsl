// The row-wise kernel's dot products for quantised weights (quant.wgsl, read through
// weights_quant.wgsl): block by block, the same steps of four K values in the same order as
// row_dots_by_group, so the same bits, with less work per value: a block of 32 values reads
// its group's header word once and decodes its scale once (quant_scale), and reads its code
// words as one vec4 (Q4_0 and MXFP4: word s holds Q4_0's steps s and s + 4, MXFP4's steps 2s
// and 2s + 1) or two (Q8_0 and FP8: word s holds step s), where weight_vec reads a header and a
// code word and decodes the scale for every step. The blocks wholly inside K run their eight
// steps written out (block_step with constant steps: constant word choice and shifts, no test
// against K; llvmpipe runs a loop of them as a loop, up to 1.2x slower); a last block cut by K
// runs them in a loop that stops at K.
fn row_dots(xr: u32, wr: u32) -> RowDots {
    let kdim = params.kdim;
    let whole = kdim / 32u * 32u;
    var dots = RowDots(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < whole; k0 += 32u) {
        let b = row_block(wr, k0);
        dots = block_step(dots, xr, k0, 0u, b, false);
        dots = block_step(dots, xr, k0, 1u, b, false);
        dots = block_step(dots, xr, k0, 2u, b, false);
        dots = block_step(dots, xr, k0, 3u, b, false);
        dots = block_step(dots, xr, k0, 4u, b, false);
        dots = block_step(dots, xr, k0, 5u, b, false);
        dots = block_step(dots, xr, k0, 6u, b, false);
        dots = block_step(dots, xr, k0, 7u, b, false);
    }
    if whole < kdim {
        let b = row_block(wr, whole);
        for (var s = 0u; s < 8u; s++) {
            if whole + 4u * s >= kdim {
                break;
            }
            dots = block_step(dots, xr, whole, s, b, true);
        }
    }
    return dots;
}

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
    let nibbles = DTYPE == DTYPE_Q4_0 || DTYPE == DTYPE_MXFP4;
    let head = quant_head_at(wr, k0);
    let block = (k0 % quant_group_values()) / 32u;
    let codes = quant_codes_of(wr, k0, params.kdim);
    var b = RowBlock(vec4<u32>(0u), vec4<u32>(0u), 0u, vec4<u32>(0u), vec4<u32>(0u), 0u);
    b.lo = weight_words4(false, codes);
    b.scale = quant_scale(weight_word(false, head), block);
    if !nibbles {
        b.hi = weight_words4(false, codes + 4u);
    }
    if SWIGLU {
        b.lo_up = weight_words4(true, codes);
        b.scale_up = quant_scale(weight_word(true, head), block);
        if !nibbles {
            b.hi_up = weight_words4(true, codes + 4u);
        }
    }
    return b;
}

// Step s (0 .. 7: values k = k0 + 4s .. k + 3, k below K) of block b; with `cut`, the values
// at K and past it are 0.0 (quant_vec4), else all four are below K.
fn block_step(dots: RowDots, xr: u32, k0: u32, s: u32, b: RowBlock, cut: bool) -> RowDots {
    // Step s's code word (lo or hi, word i) and nibble shift.
    let at = quant_word_shift(4u * s);
    let i = at.x % 4u;
    let high = at.x >= 4u;
    let k = k0 + 4u * s;
    let xv = x_vec(xr, k);
    var out = dots;
    out.gate = order_step(dots.gate, xv, block_values(select(b.lo[i], b.hi[i], high), at.y, b.scale, k, cut));
    if SWIGLU {
        let word_up = select(b.lo_up[i], b.hi_up[i], high);
        out.up = order_step(dots.up, xv, block_values(word_up, at.y, b.scale_up, k, cut));
    }
    return out;
}

fn block_values(word: u32, shift: u32, scale: u32, k: u32, cut: bool) -> vec4<f32> {
    if cut {
        return quant_vec4(word, shift, scale, k, params.kdim);
    }
    return quant_full4(word, shift, scale);
}
