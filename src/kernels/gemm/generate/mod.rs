//! The WGSL of the generated block kernels, one file per kernel shape: lane blocks
//! (`lanes.rs`: direct, window, texture), workgroup-memory tiles (`tile.rs`) and
//! cooperative-matrix blocks (`coop.rs`); here the dispatch by shape and what the shapes share
//! (the accumulation step of each order, the workgroup-memory blocks' prologue). Each register
//! block is written out as named variables (see `variant.rs`).

use std::fmt::Write as _;

use super::variant::{GemmOrder, GemmVariant, Shape};

mod coop;
mod lanes;
mod tile;

/// One accumulation step of output (i, j) with `x` and weight vectors, in `order`.
fn step(out: &mut String, order: GemmOrder, acc: &str, x: &str, w: &str, indent: &str) {
    match order {
        GemmOrder::Strict => {
            let _ = writeln!(out, "{indent}{acc} = fma({x}, {w}, {acc});");
        }
        GemmOrder::Fast => {
            let _ = writeln!(
                out,
                "{indent}{acc} = fma({x}.w, {w}.w, fma({x}.z, {w}.z, fma({x}.y, {w}.y, fma({x}.x, {w}.x, {acc}))));"
            );
        }
    }
}

/// The output value of accumulator `acc` in `order`.
fn result(order: GemmOrder, acc: &str) -> String {
    match order {
        GemmOrder::Strict => format!("lanes_sum({acc})"),
        GemmOrder::Fast => acc.to_string(),
    }
}

fn zero(order: GemmOrder) -> &'static str {
    match order {
        GemmOrder::Strict => "vec4<f32>(0.0)",
        GemmOrder::Fast => "0.0",
    }
}

/// The WGSL body (after common.wgsl and a weights file) of `variant` in `order`; entry
/// point `gemm`. With `quantised`, direct and window blocks read the weights block by block
/// (after weights_quant.wgsl, quant.wgsl and quant_blocks.wgsl).
pub(crate) fn generate(variant: GemmVariant, order: GemmOrder, quantised: bool) -> String {
    match variant.shape() {
        Shape::Lanes(b) => lanes::direct(b.rows, b.cols, b.lanes, order, variant.source(), quantised),
        Shape::Tile { tile, f16 } => tile::tiled(tile, f16, order),
        Shape::Coop(b) => coop::generate(b),
    }
}

/// The block's expert (as a lane block reads it, `lanes.rs`) for a block with barriers or cooperative operations after it: one invocation
/// reads the expert, tests it against the chunk, and the workgroup shares it (NONE outside the
/// chunk) through `workgroupUniformLoad`, so the early return stays in uniform control flow for
/// WGSL's uniformity analysis (which takes no load from a `read_write` binding, as
/// `tile_expert` is, to be uniform, and naga no result of a helper such as `in_chunk` that
/// reads its argument). The same expert, the same bits.
const EXPERT_SHARED: &str = "    if lid == 0u {
        block_expert = params.fixed_expert;
        if flag(FLAG_EXPERT_FROM_TILES) {
            block_expert = tile_expert[(params.row_offset + row0) / params.tile_rows];
        }
        if !in_chunk(block_expert) {
            block_expert = NONE;
        }
    }
    let expert = workgroupUniformLoad(&block_expert);
    if expert == NONE {
        return;
    }
";

/// The weight and up-weight groups of four (`wv`, `uv`) at column `c` and K offset `k` in the
/// staging loop of a workgroup-memory block: zeros past the chunk's columns (and, by
/// `weight4_tail`, past K); `uv` only under SWIGLU. Shared by the tiled and the cooperative
/// kernels.
const WEIGHT_GROUPS: &str = "            var wv = vec4<f32>(0.0);
            var uv = vec4<f32>(0.0);
            if c < cend {
                wv = weight4_tail(false, weight_row(expert, c), k, kdim);
                if SWIGLU {
                    uv = weight4_tail(true, weight_row(expert, c), k, kdim);
                }
            }
";

/// The entry point of a workgroup-memory block of `rows` × `cols` outputs and `threads`
/// invocations up to its first barrier: the block's first row and column (an early return past
/// the rows), its expert ([`EXPERT_SHARED`]) and its rows' entries in `block_entry` (NONE past
/// the rows). Shared by the tiled and the cooperative kernels.
fn block_prologue(rows: u32, cols: u32, threads: u32) -> String {
    format!(
        "@compute @workgroup_size({threads})
fn gemm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {{
    let row0 = wid.x * {rows}u;
    let col0 = params.col_base + wid.y * {cols}u;
    if row0 >= params.rows {{
        return;
    }}
{EXPERT_SHARED}    for (var r = lid; r < {rows}u; r += {threads}u) {{
        var e = NONE;
        if row0 + r < params.rows {{
            e = entry_of(row0 + r);
        }}
        block_entry[r] = e;
    }}
"
    )
}
