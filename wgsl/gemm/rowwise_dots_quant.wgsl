// The row-wise kernel's dot products for quantised weights (quant.wgsl, read through
// weights_quant.wgsl): block by block (quant_blocks.wgsl), the same steps of four K values in
// the same order as the float weights' row_dots (rowwise_dots.wgsl), so the same bits, with less work per value: a block's
// header word, scale and code words once per 32 values, where weight_vec reads a header and a
// code word and decodes the scale for every step. The blocks wholly inside K run their eight
// steps written out (block_step with constant steps: constant word choice and shifts, no test
// against K; llvmpipe runs a loop of them as a loop, up to 1.2x slower); a last block cut by K
// runs them in a loop that stops at K. x of a whole block comes from one x_block.
fn row_dots(xr: u32, wr: u32) -> RowDots {
    let kdim = params.kdim;
    let whole = kdim / 32u * 32u;
    var dots = RowDots(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < whole; k0 += 32u) {
        let b = row_block(wr, k0);
        let xb = x_block(xr, k0);
        dots = block_step(dots, xb.s0, k0, 0u, b, false);
        dots = block_step(dots, xb.s1, k0, 1u, b, false);
        dots = block_step(dots, xb.s2, k0, 2u, b, false);
        dots = block_step(dots, xb.s3, k0, 3u, b, false);
        dots = block_step(dots, xb.s4, k0, 4u, b, false);
        dots = block_step(dots, xb.s5, k0, 5u, b, false);
        dots = block_step(dots, xb.s6, k0, 6u, b, false);
        dots = block_step(dots, xb.s7, k0, 7u, b, false);
    }
    if whole < kdim {
        let b = row_block(wr, whole);
        for (var s = 0u; s < 8u; s++) {
            if whole + 4u * s >= kdim {
                break;
            }
            dots = block_step(dots, x_vec(xr, whole + 4u * s), whole, s, b, true);
        }
    }
    return dots;
}

// Step s (0 .. 7: values k = k0 + 4s .. k + 3, k below K, x values xv) of block b; with `cut`,
// the values at K and past it are 0.0 (quant_vec4), else all four are below K.
fn block_step(dots: RowDots, xv: vec4<f32>, k0: u32, s: u32, b: RowBlock, cut: bool) -> RowDots {
    let k = k0 + 4u * s;
    var out = dots;
    let g = block_word(b, false, s);
    out.gate = order_step(dots.gate, xv, block_values(g.x, g.y, b.scale, k, cut));
    if SWIGLU {
        let u = block_word(b, true, s);
        out.up = order_step(dots.up, xv, block_values(u.x, u.y, b.scale_up, k, cut));
    }
    return out;
}

fn block_values(word: u32, shift: u32, scale: u32, k: u32, cut: bool) -> vec4<f32> {
    if cut {
        return quant_vec4(word, shift, scale, k, params.kdim);
    }
    return quant_full4(word, shift, scale);
}
