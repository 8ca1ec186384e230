// Shared by the expert-projection kernels: parameters, bindings (the weights, bindings 2 and 3,
// come from weights_packed.wgsl or weights_f16.wgsl, which define weight_from), and the
// K-accumulation order that makes every path batch-invariant.
//
// Accumulation order (mirrored by reference::gemm::dot): K is taken in groups of four,
// k = 4g .. 4g + 3 for every g with 4g < K (entries at k >= K read as 0.0). Lane j of a
// vec4 accumulator takes k = 4g + j: acc = fma(x4, w4, acc), from vec4(0.0). The result is
// (acc.x + acc.y) + (acc.z + acc.w). No kernel splits K, so a token's outputs never depend
// on the batch, the tile, or the path.

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
}

@group(0) @binding(0) var<uniform> params: GemmParams;
// Input rows [*, K] (f32).
@group(0) @binding(1) var<storage, read> x: array<f32>;
// Row -> entry (token * k + slot), NONE for padding.
@group(0) @binding(4) var<storage, read> row_entry: array<u32>;
// Tile -> expert (EXPERT_SOURCE == 0).
@group(0) @binding(5) var<storage, read> tile_expert: array<u32>;
// Output [*, N] (f32).
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const NONE: u32 = 0xffffffffu;

// 0: f32 (one per word); 1: f16 (two per word, low half first); 2: bf16 (two per word).
override DTYPE: u32 = 0u;
// Input row of a gathered row is x[entry / k_route]; otherwise x[row_offset + row].
override GATHER: bool = true;
// Write out[entry] instead of out[row_offset + row].
override OUT_ENTRY: bool = false;
// silu(x . w) * (x . w_up) instead of x . w.
override SWIGLU: bool = false;
// Rows are entries directly (row_entry unused).
override IDENTITY_ROWS: bool = false;

fn silu_mul(g: f32, u: f32) -> f32 {
    return g / (1.0 + exp(-g)) * u;
}

fn lanes_sum(acc: vec4<f32>) -> f32 {
    return (acc.x + acc.y) + (acc.z + acc.w);
}

fn entry_of(row: u32) -> u32 {
    if IDENTITY_ROWS {
        return row;
    }
    return row_entry[params.row_offset + row];
}

fn input_row(row: u32, entry: u32) -> u32 {
    if GATHER {
        return entry / params.k_route;
    }
    return params.row_offset + row;
}

fn store(row: u32, entry: u32, col: u32, value: f32) {
    if OUT_ENTRY {
        if entry != NONE {
            out[entry * params.n + col] = value;
        }
    } else {
        out[(params.row_offset + row) * params.n + col] = value;
    }
}
