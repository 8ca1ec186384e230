// The row-wise kernel's dot products for packed weights: f32, f16 and bf16 group by group;
// the quantised formats (quant.wgsl) block by block, the same steps of four K values in the
// same order, so the same bits as row_dots_by_group, with fewer loads: a block of 32 values
// reads its group's header word once and each of its code words once (8 words for Q8_0 and
// FP8, 4 for Q4_0, whose word s holds steps s and s + 4, and for MXFP4, whose word b holds
// steps 2b and 2b + 1), where weight_vec reads a header and a code word for every step.
fn row_dots(xr: u32, wr: u32) -> RowDots {
    if DTYPE < DTYPE_Q8_0 {
        return row_dots_by_group(xr, wr);
    }
    let kdim = params.kdim;
    let g = quant_group_values();
    let nibbles = DTYPE == DTYPE_Q4_0 || DTYPE == DTYPE_MXFP4;
    var dots = RowDots(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < kdim; k0 += 32u) {
        // The group's header word, then this block's code words (a group is whole in the
        // row, so every word of a block that starts before K is there).
        let at = wr + k0 / g * quant_group_words();
        let block = (k0 % g) / 32u;
        let codes = at + 1u + select(block * 8u, block * 4u, nibbles);
        let head = weight_word(false, at);
        let lo = quant_words4(false, codes);
        var hi = vec4<u32>(0u);
        var head_up = 0u;
        var lo_up = vec4<u32>(0u);
        var hi_up = vec4<u32>(0u);
        if !nibbles {
            hi = quant_words4(false, codes + 4u);
        }
        if SWIGLU {
            head_up = weight_word(true, at);
            lo_up = quant_words4(true, codes);
            if !nibbles {
                hi_up = quant_words4(true, codes + 4u);
            }
        }
        for (var s = 0u; s < 8u; s++) {
            let k = k0 + 4u * s;
            if k >= kdim {
                break;
            }
            // Step s's word and nibble shift (quant_group4's word_index and shift at i = 4s).
            var i = s % 4u;
            var shift = 0u;
            if DTYPE == DTYPE_Q4_0 {
                shift = select(0u, 4u, s >= 4u);
            } else if DTYPE == DTYPE_MXFP4 {
                i = s / 2u;
                shift = 16u * (s % 2u);
            }
            let high = !nibbles && s >= 4u;
            let xv = x_vec(xr, k);
            let word = select(lo[i], hi[i], high);
            dots.gate = order_step(dots.gate, xv, quant_vec4(word, shift, head, block, k, kdim));
            if SWIGLU {
                let word_up = select(lo_up[i], hi_up[i], high);
                dots.up = order_step(dots.up, xv, quant_vec4(word_up, shift, head_up, block, k, kdim));
            }
        }
    }
    return dots;
}
