//! The cooperative-matrix blocks' WGSL ([`CoopBlock`]; see `coop.rs` for the order and
//! bound).

use std::fmt::Write as _;

use super::super::coop::{CoopBlock, KC, SK};
use super::{WEIGHT_GROUPS, block_prologue};

/// The WGSL body of a cooperative block (after enable_coop.wgsl, common.wgsl, a weights file,
/// half.wgsl, epilogue.wgsl and stage_f16.wgsl); entry point `gemm`.
pub(super) fn generate(b: CoopBlock) -> String {
    let CoopBlock { rows, cols, size: n, lanes } = b;
    let (fr, fc) = (rows / n, cols / n);
    let mat = |scalar: &str, role: &str| format!("coop_mat{n}x{n}<{scalar}, {role}>");
    let mut s = String::new();
    let _ = write!(
        s,
        "// Cooperative-matrix GEMM (generated): one subgroup of {lanes} invocations computes a {rows} x {cols}
// block as {fr} x {fc} fragments of {n} x {n}, f16 x f16 -> f32 on the device's matrix units, K staged
// {KC} at a time, rounded to f16 as staged (stage_f16.wgsl), each staged row {SK} halves apart.
// The sums inside a multiply-add are in the device's order (see coop.rs).

var<workgroup> xs: array<f16, {nx}>;
var<workgroup> ws: array<f16, {nw}>;
var<workgroup> us: array<f16, {nw}>;
var<workgroup> cs: array<f32, {nc}>;
var<workgroup> cu: array<f32, {nc}>;
var<workgroup> block_entry: array<u32, {rows}>;
var<workgroup> block_expert: u32;

// The four staged values of `p` (stage_f16) as f16: widened exactly (unstage_f16), so each
// converts to f16 exactly.
fn halves(p: vec2<u32>) -> vec4<f16> {{
    return vec4<f16>(unstage_f16(p));
}}

{prologue}    for (var t = lid; t < {nc}u; t += {lanes}u) {{
        cs[t] = 0.0;
    }}
    workgroupBarrier();
    let kdim = params.kdim;
    let cend = params.col_base + params.cols;
",
        nx = rows * SK,
        nw = cols * SK,
        nc = rows * cols,
        prologue = block_prologue(rows, cols, lanes),
    );
    // Accumulators start as a fragment of zeros loaded from the cleared block (no zero
    // constructor of a cooperative matrix is relied on).
    for i in 0..fr {
        for j in 0..fc {
            let _ = writeln!(
                s,
                "    var a{i}_{j} = coopLoadT<{c}>(&cs[0], {cols}u);\n    var u{i}_{j} = a{i}_{j};",
                c = mat("f32", "C")
            );
        }
    }
    let g = KC / 4;
    let _ = write!(
        s,
        "    for (var k0 = 0u; k0 < kdim; k0 += {KC}u) {{
        for (var t = lid; t < {rows}u * {g}u; t += {lanes}u) {{
            let r = t / {g}u;
            let q = t % {g}u;
            var xv = vec4<f32>(0.0);
            let e = block_entry[r];
            if e != NONE {{
                xv = x_tail(input_row(row0 + r, e) * kdim, k0 + 4u * q, kdim);
            }}
            let h = halves(stage_f16(xv));
            let at = r * {SK}u + 4u * q;
            xs[at] = h.x;
            xs[at + 1u] = h.y;
            xs[at + 2u] = h.z;
            xs[at + 3u] = h.w;
        }}
        for (var t = lid; t < {cols}u * {g}u; t += {lanes}u) {{
            let c = col0 + t / {g}u;
            let k = k0 + 4u * (t % {g}u);
{WEIGHT_GROUPS}            let hw = halves(stage_f16(wv));
            let hu = halves(stage_f16(uv));
            let at = (t / {g}u) * {SK}u + 4u * (t % {g}u);
            ws[at] = hw.x;
            ws[at + 1u] = hw.y;
            ws[at + 2u] = hw.z;
            ws[at + 3u] = hw.w;
            us[at] = hu.x;
            us[at + 1u] = hu.y;
            us[at + 2u] = hu.z;
            us[at + 3u] = hu.w;
        }}
        workgroupBarrier();
"
    );
    for kk in 0..KC / n {
        for i in 0..fr {
            let _ = writeln!(
                s,
                "        let x{i}_{kk} = coopLoadT<{}>(&xs[{}u], {SK}u);",
                mat("f16", "A"),
                i * n * SK + kk * n
            );
        }
        // Each column fragment of the weights (`w` from ws) or of the up weights (`v` from
        // us), multiplied into every row fragment's accumulator (`a` or `u`).
        let products = |s: &mut String, w: &str, tile: &str, acc: &str, indent: &str| {
            for j in 0..fc {
                let _ = writeln!(
                    s,
                    "{indent}let {w}{j}_{kk} = coopLoad<{}>(&{tile}[{}u], {SK}u);",
                    mat("f16", "B"),
                    j * n * SK + kk * n
                );
                for i in 0..fr {
                    let _ = writeln!(
                        s,
                        "{indent}{acc}{i}_{j} = coopMultiplyAdd(x{i}_{kk}, {w}{j}_{kk}, {acc}{i}_{j});"
                    );
                }
            }
        };
        products(&mut s, "w", "ws", "a", "        ");
        s.push_str("        if SWIGLU {\n");
        products(&mut s, "v", "us", "u", "            ");
        s.push_str("        }\n");
    }
    s.push_str("        workgroupBarrier();\n    }\n");
    for i in 0..fr {
        for j in 0..fc {
            let at = i * n * cols + j * n;
            let _ = writeln!(
                s,
                "    coopStoreT(a{i}_{j}, &cs[{at}u], {cols}u);\n    coopStoreT(u{i}_{j}, &cu[{at}u], {cols}u);"
            );
        }
    }
    let _ = write!(
        s,
        "    workgroupBarrier();
    for (var t = lid; t < {nc}u; t += {lanes}u) {{
        let r = t / {cols}u;
        let c = col0 + t % {cols}u;
        if row0 + r < params.rows && c < cend {{
            let e = block_entry[r];
            var v = epilogue(expert, c, cs[t], cu[t]);
            if e == NONE {{
                v = 0.0;
            }}
            store(row0 + r, e, c, v);
        }}
    }}
}}
",
        nc = rows * cols
    );
    s
}
