// Row-wise expert projection: one invocation per (row, column of the bound chunk) output, dot
// products read straight from memory (x through x_base / x_vec: rowwise_x.wgsl reads storage,
// rowwise_x_window.wgsl a uniform window; the weights through weight_at / weight_vec:
// rowwise_w_packed.wgsl reads the weight buffers, rowwise_w_texture.wgsl their texture copies;
// the loop is row_dots: rowwise_dots.wgsl, or rowwise_dots_quant.wgsl, which reads quantised
// weights block by block). A dispatch computes rows win_row0 ..
// win_row0 + win_rows. Used for decode (few tokens: rows are entries, no dispatch needed)
// and for the overflow pass of the bucketed path. The expert of a row is indices[entry]
// (or params.fixed_expert without FLAG_EXPERT_FROM_INDICES). Same accumulation order as
// every other path of the mode (order.wgsl's order_step and order_value; FAST_ORDER picks the
// one-accumulator order).

// Live row count: rows = min(params.rows, row_count[params.count_word]).
@group(0) @binding(7) var<storage, read> row_count: array<u32>;
@group(0) @binding(8) var<storage, read> expert_of_entry: array<u32>;

@compute @workgroup_size(64)
fn rowwise(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    let rows = min(params.rows, row_count[params.count_word]);
    let local = i / params.cols;
    let row = params.win_row0 + local;
    if local >= params.win_rows || row >= rows {
        return;
    }
    let col = params.col_base + i % params.cols;
    let entry = entry_of(row);
    if entry == NONE {
        return;
    }
    var expert = params.fixed_expert;
    if flag(FLAG_EXPERT_FROM_INDICES) {
        expert = expert_of_entry[entry];
    }
    if !in_chunk(expert) {
        return;
    }
    let dots = row_dots(x_base(row, entry), weight_at(expert, col));
    store(row, entry, col, epilogue(expert, col, order_value(dots.gate), order_value(dots.up)));
}

// A row's accumulators (order.wgsl): the projection's, and the up projection's under SWIGLU.
struct RowDots {
    gate: vec4<f32>,
    up: vec4<f32>,
}

// The row's dot products, one group of four K values at a time in K order (order_step), x
// through x_vec and the weights through weight_vec. row_dots (rowwise_dots.wgsl, or
// rowwise_dots_quant.wgsl for quantised weights) runs this or an equivalent loop.
fn row_dots_by_group(xr: u32, wr: WeightAt) -> RowDots {
    let kdim = params.kdim;
    var dots = RowDots(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var k = 0u; k < kdim; k += 4u) {
        let xv = x_vec(xr, k);
        dots.gate = order_step(dots.gate, xv, weight_vec(false, wr, k));
        if SWIGLU {
            dots.up = order_step(dots.up, xv, weight_vec(true, wr, k));
        }
    }
    return dots;
}
