// Row-wise expert projection: one invocation per (row, column of the bound chunk) output, dot
// products read straight from memory (x through x_base / x_vec / x_block: rowwise_x.wgsl reads
// storage, rowwise_x_window.wgsl a uniform window, and x_block is eight x_vec loads
// (rowwise_entry.wgsl) or one load per invocation shared through subgroup broadcasts
// (rowwise_x_subgroup.wgsl); the weights through weight_at / weight_vec:
// rowwise_w_packed.wgsl reads the weight buffers, rowwise_w_texture.wgsl their texture copies;
// the loop is row_dots: rowwise_dots.wgsl, or rowwise_dots_quant.wgsl, which reads quantised
// weights block by block). A dispatch computes rows win_row0 ..
// win_row0 + win_rows. Used for decode (few tokens: rows are entries, no dispatch needed)
// and for the overflow pass of the bucketed path. The expert of a row is indices[entry]
// (or params.fixed_expert without FLAG_EXPERT_FROM_INDICES). Same accumulation order as
// every other path of the mode (order.wgsl's order_step and order_value; FAST_ORDER picks the
// one-accumulator order).

// Live row count: rows = min(params.rows, row_count[params.count_word]).
@group(0) @binding(7) var<storage, read_write> row_count: array<u32>;
@group(0) @binding(8) var<storage, read_write> expert_of_entry: array<u32>;

// Invocation i of a dispatch (the entry points are rowwise_entry.wgsl and
// rowwise_x_subgroup.wgsl): output row i / row_lanes, column i % row_lanes of the chunk, where
// row_lanes is the chunk's column count rounded up to ROW_ALIGN. Lanes at columns past the
// chunk's compute a clamped column and store nothing; every other early exit depends on the row
// alone, so with ROW_ALIGN a multiple of the workgroup size a workgroup (and each of its
// subgroups) exits or runs the dot products as a whole.
fn rowwise_at(i: u32) {
    let rows = min(params.rows, row_count[params.count_word]);
    let row_lanes = (params.cols + ROW_ALIGN - 1u) / ROW_ALIGN * ROW_ALIGN;
    let local = i / row_lanes;
    let row = params.win_row0 + local;
    if local >= params.win_rows || row >= rows {
        return;
    }
    let lane = i % row_lanes;
    let col = params.col_base + min(lane, params.cols - 1u);
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
    if lane < params.cols {
        store(row, entry, col, epilogue(expert, col, order_value(dots.gate), order_value(dots.up)));
    }
}

// A row's accumulators (order.wgsl): the projection's, and the up projection's under SWIGLU.
struct RowDots {
    gate: vec4<f32>,
    up: vec4<f32>,
}

// x at k0 .. k0 + 31 of the row at xr (from x_base), s0 the group k0 .. k0 + 3 and so on (a
// block of 32 K values wholly below K).
struct XBlock {
    s0: vec4<f32>,
    s1: vec4<f32>,
    s2: vec4<f32>,
    s3: vec4<f32>,
    s4: vec4<f32>,
    s5: vec4<f32>,
    s6: vec4<f32>,
    s7: vec4<f32>,
}

// Weights k .. k + 3 (a) and k + 4 .. k + 7 (b) of a row (weight_pair).
struct WeightPair {
    a: vec4<f32>,
    b: vec4<f32>,
}
