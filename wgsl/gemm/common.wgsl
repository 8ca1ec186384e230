// Shared by the expert-projection kernels (with order.wgsl: silu_mul, lanes_sum and the order
// steps): parameters, bindings (the weights, bindings 2 and 3, come from a weights file:
// weights_packed.wgsl or weights_f16.wgsl with weight_groups.wgsl, weights_quant.wgsl or
// weights_texture.wgsl), and the K-accumulation orders that make every path batch-invariant.
//
// Accumulation orders (mirrored by reference::gemm::dot): K is taken in groups of four,
// k = 4g .. 4g + 3 for every g with 4g < K (entries at k >= K read as 0.0).
// Strict: lane j of a vec4 accumulator takes k = 4g + j: acc = fma(x4, w4, acc), from
// vec4(0.0); the result is (acc.x + acc.y) + (acc.z + acc.w).
// Fast: one accumulator, acc = fma(x4.w, w4.w, fma(x4.z, w4.z, fma(x4.y, w4.y,
// fma(x4.x, w4.x, acc)))) from 0.0, group after group; the result is acc.
// No kernel splits K, so a token's outputs never depend on the batch, the tile, or the path.

struct GemmParams {
    // Rows to compute (an upper bound when a row count buffer is bound).
    rows: u32,
    // Output columns N.
    n: u32,
    // Reduction length K.
    kdim: u32,
    // Entries per token: a gathered row reads x[entry / k_route].
    k_route: u32,
    // First index into row_entry.
    row_offset: u32,
    // Expert of every row when EXPERT_SOURCE == 1.
    fixed_expert: u32,
    // Rows per tile of the tile -> expert map.
    tile_rows: u32,
    // Index into row_count of the live row count (rowwise kernel).
    count_word: u32,
    // FLAG_* bits: how rows, inputs, outputs and experts are found (uniform per dispatch, so
    // they cost a branch per block, not a pipeline each).
    flags: u32,
    // The bound weight chunk (weights past one storage binding are split into chunks, see
    // ExpertWeights): it holds experts expert_base .. expert_base + expert_count, and of each
    // the output columns col_base .. col_base + cols, as [expert_count, cols, K]. Blocks and
    // rows of other experts do nothing in this dispatch. Unsplit: 0, E, 0, N.
    expert_base: u32,
    expert_count: u32,
    col_base: u32,
    cols: u32,
    // Window kernels and the staging pass (stage.wgsl): rows per uniform window, the windows'
    // stride in vec4, and the first row of the window a dispatch reads.
    win_rows: u32,
    win_stride4: u32,
    win_row0: u32,
}

@group(0) @binding(0) var<uniform> params: GemmParams;
// Input rows [*, K] (f32).
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
// Row -> entry (token * k + slot), NONE for padding.
@group(0) @binding(4) var<storage, read_write> row_entry: array<u32>;
// Tile -> expert (FLAG_EXPERT_FROM_TILES).
@group(0) @binding(5) var<storage, read_write> tile_expert: array<u32>;
// Output [*, N] (f32).
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const NONE: u32 = 0xffffffffu;

// Input row of a gathered row is x[entry / k_route]; otherwise x[row_offset + row].
const FLAG_GATHER: u32 = 1u;
// Write out[entry] instead of out[row_offset + row].
const FLAG_OUT_ENTRY: u32 = 2u;
// Rows are entries directly (row_entry unused).
const FLAG_IDENTITY_ROWS: u32 = 4u;
// The block's expert comes from the tile -> expert map (else params.fixed_expert).
const FLAG_EXPERT_FROM_TILES: u32 = 8u;
// A row's expert is indices[entry] (rowwise kernel; else params.fixed_expert).
const FLAG_EXPERT_FROM_INDICES: u32 = 16u;

fn flag(f: u32) -> bool {
    return (params.flags & f) != 0u;
}

// Whether the bound weight chunk holds `expert`.
fn in_chunk(expert: u32) -> bool {
    return expert != NONE && expert >= params.expert_base && expert - params.expert_base < params.expert_count;
}

// Index (in the bound chunk) of the weight row of output column `col` (global) of `expert`.
fn weight_row_index(expert: u32, col: u32) -> u32 {
    return (expert - params.expert_base) * params.cols + (col - params.col_base);
}

// The inner loops' choices stay pipeline constants.
// 0: f32 (one per word); 1: f16 (two per word, low half first); 2: bf16 (two per word);
// 3..6: Q8_0, Q4_0, MXFP4, FP8 in rows of group headers and code words (quant.wgsl).
override DTYPE: u32 = 0u;
// MXFP4 (DTYPE 5) only: every block scale of the bound weights below K is an E8M0 byte in
// 2 ..= 252, so quant.wgsl decodes each value as one exact product of normal f32 numbers
// (mxfp4_narrow_value); else bit by bit, exact under every scale (mxfp4_value).
override NARROW_SCALES: bool = false;
// silu(x . w) * (x . w_up) instead of x . w.
override SWIGLU: bool = false;

// x[base + k .. base + k + 3], entries at k >= kdim read as 0.0; the bounds are checked only
// in a partial last group.
fn x_group(base: u32, k: u32, kdim: u32) -> vec4<f32> {
    if k + 4u <= kdim {
        let i = base + k;
        return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
    }
    return x_tail(base, k, kdim);
}

// x[base + k .. base + k + 3], entries at k >= kdim read as 0.0.
fn x_tail(base: u32, k: u32, kdim: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < kdim {
            v[j] = x[base + k + j];
        }
    }
    return v;
}

fn entry_of(row: u32) -> u32 {
    if flag(FLAG_IDENTITY_ROWS) {
        return row;
    }
    return row_entry[params.row_offset + row];
}

fn input_row(row: u32, entry: u32) -> u32 {
    if flag(FLAG_GATHER) {
        return entry / params.k_route;
    }
    return params.row_offset + row;
}

fn store(row: u32, entry: u32, col: u32, value: f32) {
    if flag(FLAG_OUT_ENTRY) {
        if entry != NONE {
            out[entry * params.n + col] = value;
        }
    } else {
        out[(params.row_offset + row) * params.n + col] = value;
    }
}
