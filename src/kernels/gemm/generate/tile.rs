//! The workgroup-memory tiles' WGSL ([`GemmVariant::Tile`](super::super::GemmVariant::Tile),
//! and `TileF16` staging in f16).

use std::fmt::Write as _;

use super::super::variant::{GemmOrder, TileBlock, tile_stride};
use super::{WEIGHT_GROUPS, block_prologue, result, step, zero};

pub(super) fn tiled(t: TileBlock, f16: bool, order: GemmOrder) -> String {
    let TileBlock { rows, cols, tm, tn, bk4 } = t;
    // A staged group of four: a vec4 of f32, or four f16 packed in two words (rounded to nearest
    // even by stage_f16, widened back exactly by unstage_f16).
    let (group, staged) = if f16 {
        ("vec2<u32>", "rounded to f16 as they are staged (stage_f16.wgsl)")
    } else {
        ("vec4<f32>", "in f32")
    };
    let stage = |v: &str| if f16 { format!("stage_f16({v})") } else { v.to_string() };
    let load = |p: &str| if f16 { format!("unstage_f16({p})") } else { p.to_string() };
    let (ty_n, tx_n) = (rows / tm, cols / tn);
    let threads = ty_n * tx_n;
    let stride = tile_stride(bk4);
    let mut s = String::new();
    let _ = write!(
        s,
        "// Tiled GEMM (generated): a workgroup of {ty_n} x {tx_n} invocations computes a {rows} x {cols} block,
// each invocation {tm} rows x {tn} columns (rows ty * {tm} + i, columns tx + {tx_n} j), streaming K
// through workgroup memory in chunks of {} ({bk4} groups of four; past K zeros), {staged}, each
// staged row {stride} groups apart. Order: {order:?} (see variant.rs).

const BK4: u32 = {bk4}u;
const STRIDE: u32 = {stride}u;

var<workgroup> xs: array<{group}, {nx}>;
var<workgroup> ws: array<{group}, {nw}>;
var<workgroup> us: array<{group}, {nw}>;
var<workgroup> block_entry: array<u32, {rows}>;
var<workgroup> block_expert: u32;

{prologue}    workgroupBarrier();
    let ty = lid / {tx_n}u;
    let tx = lid % {tx_n}u;
    let kdim = params.kdim;
    let cend = params.col_base + params.cols;
",
        4 * bk4,
        nx = rows * stride,
        nw = cols * stride,
        prologue = block_prologue(rows, cols, threads),
    );
    for i in 0..tm {
        for j in 0..tn {
            let _ = writeln!(s, "    var a{i}_{j} = {z};\n    var u{i}_{j} = {z};", z = zero(order));
        }
    }
    let _ = writeln!(
        s,
        "    for (var k0 = 0u; k0 < kdim; k0 += 4u * BK4) {{
        for (var t = lid; t < {rows}u * BK4; t += {threads}u) {{
            let r = t / BK4;
            let k = k0 + 4u * (t % BK4);
            var xv = vec4<f32>(0.0);
            let e = block_entry[r];
            if e != NONE {{
                xv = x_tail(input_row(row0 + r, e) * kdim, k, kdim);
            }}
            xs[r * STRIDE + t % BK4] = {xs_store};
        }}
        for (var t = lid; t < {cols}u * BK4; t += {threads}u) {{
            let k = k0 + 4u * (t % BK4);
            let c = col0 + t / BK4;
{WEIGHT_GROUPS}            ws[(t / BK4) * STRIDE + t % BK4] = {ws_store};
            us[(t / BK4) * STRIDE + t % BK4] = {us_store};
        }}
        workgroupBarrier();
        for (var g = 0u; g < BK4; g++) {{
            if k0 + 4u * g < kdim {{",
        xs_store = stage("xv"),
        ws_store = stage("wv"),
        us_store = stage("uv"),
    );
    for i in 0..tm {
        let _ = writeln!(
            s,
            "                let x{i} = {};",
            load(&format!("xs[(ty * {tm}u + {i}u) * STRIDE + g]"))
        );
    }
    for j in 0..tn {
        let _ = writeln!(
            s,
            "                let w{j} = {};",
            load(&format!("ws[(tx + {}u) * STRIDE + g]", tx_n * j))
        );
    }
    for i in 0..tm {
        for j in 0..tn {
            step(&mut s, order, &format!("a{i}_{j}"), &format!("x{i}"), &format!("w{j}"), "                ");
        }
    }
    let _ = writeln!(s, "                if SWIGLU {{");
    for j in 0..tn {
        let _ = writeln!(
            s,
            "                    let v{j} = {};",
            load(&format!("us[(tx + {}u) * STRIDE + g]", tx_n * j))
        );
    }
    for i in 0..tm {
        for j in 0..tn {
            step(
                &mut s,
                order,
                &format!("u{i}_{j}"),
                &format!("x{i}"),
                &format!("v{j}"),
                "                    ",
            );
        }
    }
    let _ =
        writeln!(s, "                }}\n            }}\n        }}\n        workgroupBarrier();\n    }}");
    for i in 0..tm {
        let _ = writeln!(s, "    let e{i} = block_entry[ty * {tm}u + {i}u];");
        for j in 0..tn {
            let _ = writeln!(
                s,
                "    if row0 + ty * {tm}u + {i}u < params.rows && col0 + tx + {jj}u < cend {{
        var v = epilogue(expert, col0 + tx + {jj}u, {}, {});
        if e{i} == NONE {{
            v = 0.0;
        }}
        store(row0 + ty * {tm}u + {i}u, e{i}, col0 + tx + {jj}u, v);
    }}",
                result(order, &format!("a{i}_{j}")),
                result(order, &format!("u{i}_{j}")),
                jj = tx_n * j
            );
        }
    }
    s.push_str("}\n");
    s
}
