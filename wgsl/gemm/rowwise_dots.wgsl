// The row-wise kernel's dot products for float weights (packed, native f16 or texture copies):
// one group of four K values at a time in K order (order_step), x through x_block and x_vec and
// the weights through weight_vec. The blocks of 32 wholly inside K run their eight groups
// written out with x from one x_block; the groups past the last whole block run in a loop.
fn row_dots(xr: u32, wr: WeightAt) -> RowDots {
    let kdim = params.kdim;
    let whole = kdim / 32u * 32u;
    var dots = RowDots(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k0 = 0u; k0 < whole; k0 += 32u) {
        let xb = x_block(xr, k0);
        dots = group_step(dots, xb.s0, wr, k0);
        dots = group_step(dots, xb.s1, wr, k0 + 4u);
        dots = group_step(dots, xb.s2, wr, k0 + 8u);
        dots = group_step(dots, xb.s3, wr, k0 + 12u);
        dots = group_step(dots, xb.s4, wr, k0 + 16u);
        dots = group_step(dots, xb.s5, wr, k0 + 20u);
        dots = group_step(dots, xb.s6, wr, k0 + 24u);
        dots = group_step(dots, xb.s7, wr, k0 + 28u);
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
