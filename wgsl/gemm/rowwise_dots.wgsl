// The row-wise kernel's dot products for float weights (packed, native f16 or texture copies):
// one group of four K values at a time in K order (order_step), x through x_block and x_vec and
// the weights through weight_pair and weight_vec. The blocks of 32 wholly inside K run their
// eight groups written out, in pairs (weight_pair: one texel of 16-bit texture weights), with x
// from one x_block; the groups past the last whole block run in a loop.
fn row_dots(xr: u32, wr: WeightAt) -> RowDots {
    let kdim = params.kdim;
    let whole = kdim / 32u * 32u;
    var dots = RowDots(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < whole; k0 += 32u) {
        let xb = x_block(xr, k0);
        dots = pair_step(dots, xb.s0, xb.s1, wr, k0);
        dots = pair_step(dots, xb.s2, xb.s3, wr, k0 + 8u);
        dots = pair_step(dots, xb.s4, xb.s5, wr, k0 + 16u);
        dots = pair_step(dots, xb.s6, xb.s7, wr, k0 + 24u);
    }
    for (var k = whole; k < kdim; k += 4u) {
        dots = group_step(dots, x_vec(xr, k), wr, k);
    }
    return dots;
}

// The group k .. k + 3 with x values xv.
fn group_step(dots: RowDots, xv: vec4<f32>, wr: WeightAt, k: u32) -> RowDots {
    var out = dots;
    out.gate = order_step(dots.gate, xv, weight_vec(false, wr, k));
    if SWIGLU {
        out.up = order_step(dots.up, xv, weight_vec(true, wr, k));
    }
    return out;
}

// The groups k .. k + 3 and k + 4 .. k + 7 (below K) with x values xa and xb, in that order.
fn pair_step(dots: RowDots, xa: vec4<f32>, xb: vec4<f32>, wr: WeightAt, k: u32) -> RowDots {
    var out = dots;
    let g = weight_pair(false, wr, k);
    out.gate = order_step(order_step(dots.gate, xa, g.a), xb, g.b);
    if SWIGLU {
        let u = weight_pair(true, wr, k);
        out.up = order_step(order_step(dots.up, xa, u.a), xb, u.b);
    }
    return out;
}
