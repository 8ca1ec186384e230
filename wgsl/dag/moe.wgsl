// The MoE layer as tasks of the persistent queue (queue.wgsl): route tiles, one layout task,
// expert tiles of the gate/up and down projections in padded bins, and combine tiles. The
// task bodies call the staged kernels' functions: gate_logit and route_select (routing/),
// order_step, order_value and silu_mul (gemm/order.wgsl), f16_bits_to_f32 (gemm/half.wgsl);
// the combine sum is combine.wgsl's order. Every value is therefore the bits `MoeLayer`'s
// forward computes on the same adapter (the expert projections are batch-invariant in both
// orders: a row's outputs do not depend on the tile, bin or path that computes them).
//
// Bindings (group 0): 0 to 6 as the routing kernels (RouteParams, x, router, -, bias,
// indices, weights); 7 the program (header words, then the task table); 8, 9, 10 the routed
// experts' gate [E, F, H], up [E, F, H] and down [E, H, F] weights as packed words (DTYPE);
// 11 `words` (the layout: counts, bin bases, row -> entry, bin tile -> expert, per-lane chunk
// counts); 12 `work` (f32: the SwiGLU rows h [slots * TILE, F], then the expert outputs
// [tokens * k, H]); 13 y [tokens, H]; 14 the queue's state words.
//
// Tasks (kind, index), in ticket order, each waiting only on earlier tickets:
//   ROUTE   r: tokens r * route_tile ..: logits with gate_logit, then route_select, per token
//   LAYOUT  0: after every ROUTE; entries grouped by expert into bins of whole tiles of TILE
//              rows (entries in ascending order within an expert), tile -> expert, NONE for
//              the empty task slots past the live tiles
//   UP      s * up_tiles + c: after LAYOUT; bin tile s, columns 64c .. of F: h rows
//   DOWN    s * down_tiles + c: after every UP of tile s; columns 64c .. of H: the entries'
//           expert outputs
//   COMBINE t: after every DOWN (the coarse rule); tokens t * combine_tile ..: y

@group(0) @binding(7) var<storage, read> program: array<u32>;
@group(0) @binding(8) var<storage, read> w_gate_e: array<u32>;
@group(0) @binding(9) var<storage, read> w_up_e: array<u32>;
@group(0) @binding(10) var<storage, read> w_down_e: array<u32>;
@group(0) @binding(11) var<storage, read_write> words: array<u32>;
@group(0) @binding(12) var<storage, read_write> work: array<f32>;
@group(0) @binding(13) var<storage, read_write> y: array<f32>;
@group(0) @binding(14) var<storage, read_write> state: array<atomic<u32>>;

// Workgroup size: 64 (route_select's ROUTE_WG; the queue's lanes).
override LANES: u32 = 64u;
// Expert weight storage: 0 f32, 1 IEEE half, 2 bfloat16 (two per word, low half first).
override DTYPE: u32 = 0u;

// Rows per expert tile (a bin is whole tiles), written out as eight accumulators below.
const MOE_TILE: u32 = 8u;
const MOE_NONE: u32 = 0xffffffffu;

// Header words of `program`.
const H_TASKS: u32 = 0u;
const H_TASK_OFF: u32 = 1u;
const H_SPIN_LIMIT: u32 = 2u;
const H_WORK: u32 = 3u;
const H_CANARY: u32 = 4u;
const H_FFN: u32 = 5u;
const H_ROUTE_TILE: u32 = 6u;
const H_COMBINE_TILE: u32 = 7u;
const H_UP_TILES: u32 = 8u;
const H_DOWN_TILES: u32 = 9u;
const H_SLOTS: u32 = 10u;
const H_COUNTS: u32 = 11u;
const H_BASES: u32 = 12u;
const H_ROW_ENTRY: u32 = 13u;
const H_TILE_EXPERT: u32 = 14u;
const H_CHUNKS: u32 = 15u;
const H_ROWS_H: u32 = 16u;
const H_PARTIAL: u32 = 17u;

// Task kinds.
const MOE_ROUTE: u32 = 0u;
const MOE_LAYOUT: u32 = 1u;
const MOE_UP: u32 = 2u;
const MOE_DOWN: u32 = 3u;
const MOE_COMBINE: u32 = 4u;

fn queue_params() -> QueueParams {
    return QueueParams(program[H_TASKS], program[H_TASK_OFF], program[H_SPIN_LIMIT], program[H_WORK], program[H_CANARY]);
}

// Word i of weights 0 (gate), 1 (up) or 2 (down).
fn expert_word(which: u32, i: u32) -> u32 {
    if which == 0u {
        return w_gate_e[i];
    }
    if which == 1u {
        return w_up_e[i];
    }
    return w_down_e[i];
}

fn expert_value(which: u32, idx: u32) -> f32 {
    if DTYPE == 0u {
        return bitcast<f32>(expert_word(which, idx));
    }
    let bits16 = (expert_word(which, idx >> 1u) >> ((idx & 1u) * 16u)) & 0xffffu;
    return half_to_f32(bits16);
}

// Weights base + k .. base + k + 3 of weights `which`, 0.0 at k >= kdim.
fn expert_group(which: u32, base: u32, k: u32, kdim: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < kdim {
            v[j] = expert_value(which, base + k + j);
        }
    }
    return v;
}

// x[base + k .. base + k + 3], 0.0 at k >= kdim.
fn x_group4(base: u32, k: u32, kdim: u32) -> vec4<f32> {
    if k + 4u <= kdim {
        return vec4<f32>(x[base + k], x[base + k + 1u], x[base + k + 2u], x[base + k + 3u]);
    }
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < kdim {
            v[j] = x[base + k + j];
        }
    }
    return v;
}

// work[base + k .. base + k + 3], 0.0 at k >= kdim.
fn work_group4(base: u32, k: u32, kdim: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < kdim {
            v[j] = work[base + k + j];
        }
    }
    return v;
}

// Gate logits and top-k for the tokens of route tile `tile`, one token at a time, as the
// fused route kernel does for its token.
fn route_tile(tile: u32, lid: u32) {
    let lo = tile * program[H_ROUTE_TILE];
    let hi = min(lo + program[H_ROUTE_TILE], params.tokens);
    for (var t = lo; t < hi; t++) {
        for (var e = lid; e < params.experts; e += ROUTE_WG) {
            score[e] = gate_logit(t, e);
        }
        workgroupBarrier();
        route_select(t, lid);
        workgroupBarrier();
    }
}

// The bins: lane l counts the experts of entries l * chunk .. (its chunk, in order); each
// expert's lane counts become exclusive prefixes (lane order); lane 0 lays the bins out (in
// expert order, whole tiles each) and the tile -> expert map; every lane then places its
// chunk's entries in order, so each bin holds its expert's entries in ascending order.
// Entries whose index is not an expert stay out of every bin (their outputs stay 0.0).
fn layout_task(lid: u32) {
    let n = params.tokens * params.k;
    let experts = params.experts;
    let chunk = (n + LANES - 1u) / LANES;
    let c0 = min(lid * chunk, n);
    let c1 = min(c0 + chunk, n);
    let mine = program[H_CHUNKS] + lid * experts;
    for (var e = 0u; e < experts; e++) {
        words[mine + e] = 0u;
    }
    for (var i = c0; i < c1; i++) {
        let e = topk_indices[i];
        if e < experts {
            words[mine + e] += 1u;
        }
    }
    storageBarrier();
    for (var e = lid; e < experts; e += LANES) {
        var run = 0u;
        for (var l = 0u; l < LANES; l++) {
            let at = program[H_CHUNKS] + l * experts + e;
            let v = words[at];
            words[at] = run;
            run += v;
        }
        words[program[H_COUNTS] + e] = run;
    }
    let slots = program[H_SLOTS];
    for (var r = lid; r < slots * MOE_TILE; r += LANES) {
        words[program[H_ROW_ENTRY] + r] = MOE_NONE;
    }
    storageBarrier();
    if lid == 0u {
        var base = 0u;
        var tile = 0u;
        for (var e = 0u; e < experts; e++) {
            words[program[H_BASES] + e] = base;
            let tiles = (words[program[H_COUNTS] + e] + MOE_TILE - 1u) / MOE_TILE;
            for (var j = 0u; j < tiles; j++) {
                words[program[H_TILE_EXPERT] + tile + j] = e;
            }
            tile += tiles;
            base += tiles * MOE_TILE;
        }
        for (; tile < slots; tile++) {
            words[program[H_TILE_EXPERT] + tile] = MOE_NONE;
        }
    }
    storageBarrier();
    for (var i = c0; i < c1; i++) {
        let e = topk_indices[i];
        if e < experts {
            let rank = words[mine + e];
            words[mine + e] = rank + 1u;
            words[program[H_ROW_ENTRY] + words[program[H_BASES] + e] + rank] = i;
        }
    }
}

// Entry of row j of bin tile `s` (MOE_NONE for padding).
fn tile_entry(s: u32, j: u32) -> u32 {
    return words[program[H_ROW_ENTRY] + s * MOE_TILE + j];
}

// x row base of an entry (row 0 for padding, whose results are not stored).
fn entry_x(entry: u32) -> u32 {
    return select(entry / params.k, 0u, entry == MOE_NONE) * params.hidden;
}

// h[row, col] = silu_mul(x . gate[e, col], x . up[e, col]) for the eight rows of bin tile s.
fn up_tile(tile: u32, lid: u32) {
    let s = tile / program[H_UP_TILES];
    let col = (tile % program[H_UP_TILES]) * LANES + lid;
    let expert = words[program[H_TILE_EXPERT] + s];
    let ffn = program[H_FFN];
    if expert == MOE_NONE || col >= ffn {
        return;
    }
    let kdim = params.hidden;
    let wb = (expert * ffn + col) * kdim;
    let e0 = tile_entry(s, 0u);
    let e1 = tile_entry(s, 1u);
    let e2 = tile_entry(s, 2u);
    let e3 = tile_entry(s, 3u);
    let e4 = tile_entry(s, 4u);
    let e5 = tile_entry(s, 5u);
    let e6 = tile_entry(s, 6u);
    let e7 = tile_entry(s, 7u);
    let x0 = entry_x(e0);
    let x1 = entry_x(e1);
    let x2 = entry_x(e2);
    let x3 = entry_x(e3);
    let x4 = entry_x(e4);
    let x5 = entry_x(e5);
    let x6 = entry_x(e6);
    let x7 = entry_x(e7);
    var g0 = vec4<f32>(0.0);
    var g1 = vec4<f32>(0.0);
    var g2 = vec4<f32>(0.0);
    var g3 = vec4<f32>(0.0);
    var g4 = vec4<f32>(0.0);
    var g5 = vec4<f32>(0.0);
    var g6 = vec4<f32>(0.0);
    var g7 = vec4<f32>(0.0);
    var u0 = vec4<f32>(0.0);
    var u1 = vec4<f32>(0.0);
    var u2 = vec4<f32>(0.0);
    var u3 = vec4<f32>(0.0);
    var u4 = vec4<f32>(0.0);
    var u5 = vec4<f32>(0.0);
    var u6 = vec4<f32>(0.0);
    var u7 = vec4<f32>(0.0);
    for (var k = 0u; k < kdim; k += 4u) {
        let wg = expert_group(0u, wb, k, kdim);
        let wu = expert_group(1u, wb, k, kdim);
        var xv = x_group4(x0, k, kdim);
        g0 = order_step(g0, xv, wg);
        u0 = order_step(u0, xv, wu);
        xv = x_group4(x1, k, kdim);
        g1 = order_step(g1, xv, wg);
        u1 = order_step(u1, xv, wu);
        xv = x_group4(x2, k, kdim);
        g2 = order_step(g2, xv, wg);
        u2 = order_step(u2, xv, wu);
        xv = x_group4(x3, k, kdim);
        g3 = order_step(g3, xv, wg);
        u3 = order_step(u3, xv, wu);
        xv = x_group4(x4, k, kdim);
        g4 = order_step(g4, xv, wg);
        u4 = order_step(u4, xv, wu);
        xv = x_group4(x5, k, kdim);
        g5 = order_step(g5, xv, wg);
        u5 = order_step(u5, xv, wu);
        xv = x_group4(x6, k, kdim);
        g6 = order_step(g6, xv, wg);
        u6 = order_step(u6, xv, wu);
        xv = x_group4(x7, k, kdim);
        g7 = order_step(g7, xv, wg);
        u7 = order_step(u7, xv, wu);
    }
    let hb = program[H_ROWS_H] + s * MOE_TILE * ffn + col;
    work[hb] = silu_mul(order_value(g0), order_value(u0));
    work[hb + ffn] = silu_mul(order_value(g1), order_value(u1));
    work[hb + 2u * ffn] = silu_mul(order_value(g2), order_value(u2));
    work[hb + 3u * ffn] = silu_mul(order_value(g3), order_value(u3));
    work[hb + 4u * ffn] = silu_mul(order_value(g4), order_value(u4));
    work[hb + 5u * ffn] = silu_mul(order_value(g5), order_value(u5));
    work[hb + 6u * ffn] = silu_mul(order_value(g6), order_value(u6));
    work[hb + 7u * ffn] = silu_mul(order_value(g7), order_value(u7));
}

// Expert output of an entry, column col (not for padding rows).
fn store_partial(entry: u32, col: u32, acc: vec4<f32>) {
    if entry != MOE_NONE {
        work[program[H_PARTIAL] + entry * params.hidden + col] = order_value(acc);
    }
}

// out[entry, col] = h[row] . down[e, col] for the eight rows of bin tile s.
fn down_tile(tile: u32, lid: u32) {
    let s = tile / program[H_DOWN_TILES];
    let col = (tile % program[H_DOWN_TILES]) * LANES + lid;
    let expert = words[program[H_TILE_EXPERT] + s];
    let hidden = params.hidden;
    if expert == MOE_NONE || col >= hidden {
        return;
    }
    let kdim = program[H_FFN];
    let wb = (expert * hidden + col) * kdim;
    let hb = program[H_ROWS_H] + s * MOE_TILE * kdim;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    for (var k = 0u; k < kdim; k += 4u) {
        let wv = expert_group(2u, wb, k, kdim);
        a0 = order_step(a0, work_group4(hb, k, kdim), wv);
        a1 = order_step(a1, work_group4(hb + kdim, k, kdim), wv);
        a2 = order_step(a2, work_group4(hb + 2u * kdim, k, kdim), wv);
        a3 = order_step(a3, work_group4(hb + 3u * kdim, k, kdim), wv);
        a4 = order_step(a4, work_group4(hb + 4u * kdim, k, kdim), wv);
        a5 = order_step(a5, work_group4(hb + 5u * kdim, k, kdim), wv);
        a6 = order_step(a6, work_group4(hb + 6u * kdim, k, kdim), wv);
        a7 = order_step(a7, work_group4(hb + 7u * kdim, k, kdim), wv);
    }
    store_partial(tile_entry(s, 0u), col, a0);
    store_partial(tile_entry(s, 1u), col, a1);
    store_partial(tile_entry(s, 2u), col, a2);
    store_partial(tile_entry(s, 3u), col, a3);
    store_partial(tile_entry(s, 4u), col, a4);
    store_partial(tile_entry(s, 5u), col, a5);
    store_partial(tile_entry(s, 6u), col, a6);
    store_partial(tile_entry(s, 7u), col, a7);
}

// y[t, c] = fma(w[t, k - 1], out[t * k + k - 1, c], ... fma(w[t, 0], out[t * k, c], 0.0)),
// combine.wgsl's order without a shared expert.
fn combine_tile(tile: u32, lid: u32) {
    let lo = tile * program[H_COMBINE_TILE];
    let hi = min(lo + program[H_COMBINE_TILE], params.tokens);
    let hidden = params.hidden;
    let partial = program[H_PARTIAL];
    for (var t = lo; t < hi; t++) {
        for (var c = lid; c < hidden; c += LANES) {
            var acc = 0.0;
            for (var j = 0u; j < params.k; j++) {
                let entry = t * params.k + j;
                acc = fma(topk_weights[entry], work[partial + entry * hidden + c], acc);
            }
            y[t * hidden + c] = acc;
        }
    }
}

fn run_pass(kind: u32, slot: u32, tile: u32, lid: u32) {
    if kind == MOE_ROUTE {
        route_tile(tile, lid);
    } else if kind == MOE_LAYOUT {
        layout_task(lid);
    } else if kind == MOE_UP {
        up_tile(tile, lid);
    } else if kind == MOE_DOWN {
        down_tile(tile, lid);
    } else {
        combine_tile(tile, lid);
    }
}
