// Shared by the expert-projection kernels: parameters, bindings, weight unpacking, and the
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
// Weights [E, N, K], packed in u32 words as DTYPE says.
@group(0) @binding(2) var<storage, read> w: array<u32>;
// Second weights (up projection) for SWIGLU, same shape and dtype.
@group(0) @binding(3) var<storage, read> w_up: array<u32>;
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

fn weight_from(buf_is_up: bool, idx: u32) -> f32 {
    var word: u32;
    if DTYPE == 0u {
        if buf_is_up {
            return bitcast<f32>(w_up[idx]);
        }
        return bitcast<f32>(w[idx]);
    }
    if buf_is_up {
        word = w_up[idx >> 1u];
    } else {
        word = w[idx >> 1u];
    }
    let bits16 = (word >> ((idx & 1u) * 16u)) & 0xffffu;
    if DTYPE == 1u {
        return f16_bits_to_f32(bits16);
    }
    return bitcast<f32>(bits16 << 16u);
}

// Exact IEEE half -> f32 with integer operations only (no f16 capability needed).
fn f16_bits_to_f32(h: u32) -> f32 {
    let sign = (h & 0x8000u) << 16u;
    let exponent = (h >> 10u) & 0x1fu;
    let mantissa = h & 0x3ffu;
    if exponent == 0u {
        // Zero or subnormal: mantissa * 2^-24, exact in f32.
        let magnitude = f32(mantissa) * 5.9604644775390625e-8;
        return bitcast<f32>(bitcast<u32>(magnitude) | sign);
    }
    if exponent == 31u {
        return bitcast<f32>(sign | 0x7f800000u | (mantissa << 13u));
    }
    return bitcast<f32>(sign | ((exponent + 112u) << 23u) | (mantissa << 13u));
}

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
