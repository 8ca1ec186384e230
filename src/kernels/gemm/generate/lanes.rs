//! The lane blocks' WGSL ([`GemmVariant::Direct`](super::super::GemmVariant::Direct),
//! `Window`, `Texture`): `lanes` invocations sharing a block of rows, no workgroup memory, the
//! K loop written out once per live-row count.

use std::fmt::Write as _;

use super::super::variant::{GemmOrder, OperandSource};
use super::{result, step, zero};

/// The block's expert, or an early return (shared by both shapes).
const EXPERT: &str = "    var expert = params.fixed_expert;
    if flag(FLAG_EXPERT_FROM_TILES) {
        expert = tile_expert[(params.row_offset + row0) / params.tile_rows];
    }
    if !in_chunk(expert) {
        return;
    }
";

/// The direct block, reading its operands from `source` (quantised weights block by block
/// with `quantised`).
pub(super) fn direct(
    rows: u32,
    cols: u32,
    lanes: u32,
    order: GemmOrder,
    source: OperandSource,
    quantised: bool,
) -> String {
    let mut s = String::new();
    let window = source != OperandSource::Storage;
    let (what, from, first_row) = match source {
        OperandSource::Storage => ("Direct", "reading x and the weights straight from memory", ""),
        OperandSource::Window => (
            "Window",
            "reading x from the dispatch's uniform window and the weights from memory",
            "params.win_row0 + ",
        ),
        OperandSource::Texture => (
            "Texture",
            "reading x from the dispatch's uniform window and the weights from their texture",
            "params.win_row0 + ",
        ),
    };
    if window {
        s.push_str(
            "// The x rows of this dispatch: row win_row0 + r at r * ceil(K / 4) (see stage.wgsl).\n\
             @group(0) @binding(7) var<uniform> xw: array<vec4<f32>, 4096>;\n\n",
        );
    }
    let _ = write!(
        s,
        "// {what} GEMM (generated): {lanes} invocations share {rows} rows; each computes {cols} columns
// spaced {lanes} apart, {from} (no workgroup memory, no barriers). Order: {order:?} (see
// variant.rs). Rows past the row count or without an entry read row 0 (or zeros) and are
// discarded; columns past the chunk's last read its last column and are discarded.

@compute @workgroup_size({lanes})
fn gemm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {{
    let row0 = {first_row}wid.x * {rows}u;
    if row0 >= params.rows {{
        return;
    }}
{EXPERT}    let kdim = params.kdim;
    let cend = params.col_base + params.cols;
    let col0 = params.col_base + wid.y * {}u + lid;
",
        cols * lanes
    );
    if window {
        s.push_str("    let kp4 = (kdim + 3u) / 4u;\n");
    }
    for i in 0..rows {
        let _ = writeln!(
            s,
            "    let r{i} = row0 + {i}u;
    var e{i} = NONE;
    if r{i} < params.rows {{
        e{i} = entry_of(r{i});
    }}"
        );
        if window {
            let _ = writeln!(s, "    let x{i}b = (r{i} - params.win_row0) * kp4;");
        } else {
            let _ = writeln!(
                s,
                "    var x{i}b = 0u;
    if e{i} != NONE {{
        x{i}b = input_row(r{i}, e{i}) * kdim;
    }}"
            );
        }
    }
    for j in 0..cols {
        let (name, at) = match source {
            OperandSource::Texture => ("t", "weight_texel_row"),
            OperandSource::Storage | OperandSource::Window => ("b", "weight_row"),
        };
        let _ = writeln!(
            s,
            "    let c{j} = col0 + {}u;\n    let w{j}{name} = {at}(expert, min(c{j}, cend - 1u));",
            j * lanes
        );
    }
    for i in 0..rows {
        for j in 0..cols {
            let _ = writeln!(s, "    var a{i}_{j} = {z};\n    var u{i}_{j} = {z};", z = zero(order));
        }
    }
    // The block's live rows: up to the last row with an entry (padding rows of a grouped
    // tile come last). A block with no entry past row `n` runs a copy of the K loop over
    // its first `n` rows only (the same operations for those rows; the other rows'
    // accumulators stay zero and their outputs are discarded as before), so the padding of a
    // tile costs a fraction of its FMAs. The branch is the same for every invocation.
    let copies = live_copies(rows);
    if copies.len() > 1 {
        s.push_str("    var live = 0u;\n");
        for i in 0..rows {
            let _ = writeln!(s, "    if e{i} != NONE {{\n        live = {}u;\n    }}", i + 1);
        }
    }
    for (c, &n) in copies.iter().enumerate() {
        let open = if c == 0 { "    if" } else { "    } else if" };
        match copies.get(c + 1) {
            Some(next) => {
                let _ = writeln!(s, "{open} live > {next}u {{");
            }
            None if c > 0 => s.push_str("    } else {\n"),
            None => {}
        }
        if quantised {
            k_loop_quantised(&mut s, n, cols, order, source);
        } else {
            k_loop(&mut s, n, cols, order, source);
        }
    }
    if copies.len() > 1 {
        s.push_str("    }\n");
    }
    for i in 0..rows {
        for j in 0..cols {
            let _ = writeln!(
                s,
                "    if r{i} < params.rows && c{j} < cend {{
        var v = epilogue(expert, c{j}, {}, {});
        if e{i} == NONE {{
            v = 0.0;
        }}
        store(r{i}, e{i}, c{j}, v);
    }}",
                result(order, &format!("a{i}_{j}")),
                result(order, &format!("u{i}_{j}"))
            );
        }
    }
    s.push_str("}\n");
    s
}

/// The row counts of a block's copies of the K loop, widest first: `rows`, then halves
/// down to 4 rows (a 16-row block runs 16, 8 or 4 rows, whichever is the fewest that covers
/// its live rows).
fn live_copies(rows: u32) -> Vec<u32> {
    let mut copies = vec![rows];
    let mut n = rows / 2;
    while n >= 4 {
        copies.push(n);
        n /= 2;
    }
    copies
}

/// One copy of the direct block's K loop over its first `rows` rows: the loads take the
/// bounded path in the last, partial group of four (a branch that is the same for every
/// invocation), so the unrolled FMAs are emitted once per copy. Windows and textures hold
/// zeros past K: their loads need no bound.
fn k_loop(s: &mut String, rows: u32, cols: u32, order: GemmOrder, source: OperandSource) {
    let _ = writeln!(s, "    for (var k = 0u; k < kdim; k += 4u) {{");
    x_loads(s, rows, source, "        ");
    k_step(s, rows, cols, order, "        ", |j, up| match source {
        OperandSource::Texture => format!("weight_texel({up}, w{j}t, k / 4u)"),
        OperandSource::Storage | OperandSource::Window => format!("weight_group({up}, w{j}b, k, kdim)"),
    });
    s.push_str("    }\n");
}

/// [`k_loop`] for quantised weights (rows at `w{j}b`): block by block of 32 values, each
/// column's block read once (row_block: header word, scale, code words as vec4s), then its
/// steps of four in K order, each with the same values as weight_group's (block_vec4: 0.0 at
/// K and past it), so the same bits. The steps run as a loop that stops at K (a branch the
/// same for every invocation).
fn k_loop_quantised(s: &mut String, rows: u32, cols: u32, order: GemmOrder, source: OperandSource) {
    let _ = writeln!(s, "    for (var k0 = 0u; k0 < kdim; k0 += 32u) {{");
    for j in 0..cols {
        let _ = writeln!(s, "        let b{j} = row_block(w{j}b, k0);");
    }
    s.push_str(
        "        for (var s = 0u; s < 8u; s++) {
            let k = k0 + 4u * s;
            if k >= kdim {
                break;
            }
",
    );
    x_loads(s, rows, source, "            ");
    k_step(s, rows, cols, order, "            ", |j, up| format!("block_vec4(b{j}, {up}, s, k)"));
    s.push_str("        }\n    }\n");
}

/// The step's x of rows 0 .. `rows` (`x{i}`, values k .. k + 3), from storage or the window.
fn x_loads(s: &mut String, rows: u32, source: OperandSource, indent: &str) {
    for i in 0..rows {
        match source {
            OperandSource::Storage => {
                let _ = writeln!(s, "{indent}let x{i} = x_group(x{i}b, k, kdim);");
            }
            OperandSource::Window | OperandSource::Texture => {
                let _ = writeln!(s, "{indent}let x{i} = xw[x{i}b + k / 4u];");
            }
        }
    }
}

/// One step of four K values of a direct block: each column's weights (`w{j}`, the expression
/// `load(j, false)`) and the FMAs of every row into accumulators `a{i}_{j}`; under SWIGLU the
/// up projection's (`v{j}`, `load(j, true)`) into `u{i}_{j}`.
fn k_step(
    s: &mut String,
    rows: u32,
    cols: u32,
    order: GemmOrder,
    indent: &str,
    load: impl Fn(u32, bool) -> String,
) {
    let half = |s: &mut String, acc: &str, w: &str, up: bool, indent: &str| {
        for j in 0..cols {
            let _ = writeln!(s, "{indent}let {w}{j} = {};", load(j, up));
        }
        for i in 0..rows {
            for j in 0..cols {
                step(s, order, &format!("{acc}{i}_{j}"), &format!("x{i}"), &format!("{w}{j}"), indent);
            }
        }
    };
    half(s, "a", "w", false, indent);
    let _ = writeln!(s, "{indent}if SWIGLU {{");
    half(s, "u", "v", true, &format!("{indent}    "));
    let _ = writeln!(s, "{indent}}}");
}
