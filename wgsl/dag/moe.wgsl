// The MoE layer as tasks of the persistent queue (queue.wgsl) or of static passes
// (moe_static.wgsl): one route task per token, one layout task, expert tiles of the gate/up
// and down projections in padded bins, the shared expert's tiles, and combine tiles. The
// task bodies call the staged kernels' functions: gate_logit and route_select (routing/),
// order_step, order_value and silu_mul (gemm/order.wgsl), f16_bits_to_f32 (gemm/half.wgsl);
// the combine sum is combine.wgsl's order. Every value is therefore the bits `MoeLayer`'s
// forward computes on the same adapter (the expert projections are batch-invariant in both
// orders: a row's outputs do not depend on the tile, bin or path that computes them).
//
// Bindings (group 0), 10 storage buffers: 0 RouteParams, 1 x [tokens, H] and 2 the router
// [E, H] as the routing kernels bind them; 7 the program (header words, the selection bias, the
// shared gate's values, the task table); 8, 9, 10 the routed experts' gate [E, F, H], up
// [E, F, H] and down [E, H, F] weights as packed words (DTYPE); 12 `work` (f32: the SwiGLU rows
// h [slots * MOE_TILE, F], the expert outputs [tokens * k, H], the shared expert's rows, the
// routing weights [tokens, k]); 13 y [tokens, H]; 14 `state` (atomic words: the queue's state
// words and counters, then the layout: counts, bin bases, row -> entry, bin tile -> expert,
// per-lane chunk counts, then the top-k indices [tokens, k]; plain loads and stores of the
// layout are relaxed atomics); 15 the shared expert's gate [Fs, H], up [Fs, H] and down
// [H, Fs] packed into one buffer (a 4-byte placeholder without one).

// Tasks (kind, index), in ticket order, each waiting only on earlier tickets (in the static
// passes, moe_static.wgsl, the pass's range of tickets comes in its own uniform). Fine tasks:
//   ROUTE        t: token t's logits with gate_logit, then route_select (the fused route)
//   LAYOUT       0: after every ROUTE; entries grouped by expert into bins of whole tiles of
//                MOE_TILE rows (ascending entries within an expert), tile -> expert, MOE_NONE
//                for the empty task slots past the live tiles
//   SHARED_UP    i * shared_up_tiles + c: no dependencies; tokens 8i .., columns 64c .. of Fs
//   UP           s * up_tiles + c: after LAYOUT; bin tile s, columns 64c .. of F: h rows
//   SHARED_DOWN  i * down_tiles + c: after every SHARED_UP of token tile i; columns 64c .. of H
//   DOWN         s * down_tiles + c: after every UP of tile s; columns 64c .. of H: the
//                entries' expert outputs
//   COMBINE      i: after the shared expert's tasks of token tile i (SHARED_DOWN or SHARED)
//                and, by the header's COMBINE_RULE, either every routed expert task (DOWN or
//                EXPERT; rule 0, the coarse rule) or only those that hold its tokens' entries
//                (rule 1, on the queue: signal_more below); tokens 8i ..: y
// Coarse tasks replace the four projection kinds with two, each one workgroup's whole tile:
//   SHARED       i: no dependencies; every SHARED_UP tile of token tile i, then every
//                SHARED_DOWN tile of it
//   EXPERT       s: after LAYOUT; every UP tile of bin tile s, then every DOWN tile of it
// The activation rows between the two halves stay in `work` (8 rows x F floats are 32 KiB at
// F = 1024, twice the 16 KiB of workgroup memory a portable device guarantees); the workgroup
// that wrote them reads them back after a storageBarrier, from its cache on CPU adapters.

@group(0) @binding(7) var<storage, read> program: array<u32>;
@group(0) @binding(8) var<storage, read> w_gate_e: array<u32>;
@group(0) @binding(9) var<storage, read> w_up_e: array<u32>;
@group(0) @binding(10) var<storage, read> w_down_e: array<u32>;
@group(0) @binding(12) var<storage, read_write> work: array<f32>;
@group(0) @binding(13) var<storage, read_write> y: array<f32>;
@group(0) @binding(14) var<storage, read_write> state: array<atomic<u32>>;
@group(0) @binding(15) var<storage, read> w_shared: array<u32>;

// Workgroup size: 64 (route_select's ROUTE_WG; the queue's lanes).
override LANES: u32 = 64u;
// Expert weight storage: 0 f32, 1 IEEE half, 2 bfloat16 (two per word, low half first).
override DTYPE: u32 = 0u;

// Rows per expert tile (a bin is whole tiles), written out as eight accumulators below.
const MOE_TILE: u32 = 8u;
const MOE_NONE: u32 = 0xffffffffu;

// Header words of `program` (the shared-expert words are 0 / MOE_NONE without one): COUNTS
// .. INDICES are words of `state`; ROWS_H, PARTIAL, WEIGHTS, SHARED_H (the shared expert's
// SwiGLU rows [tokens rounded up to MOE_TILE, Fs]) and SHARED_OUT (its rows [tokens, H]) of
// `work`; BIAS (MOE_NONE: no bias) and SHARED_GATE (MOE_NONE: ungated) of `program`;
// SHARED_UP_OFF and SHARED_DOWN_OFF of w_shared.
const H_TASKS: u32 = 0u;
const H_TASK_OFF: u32 = 1u;
const H_SPIN_LIMIT: u32 = 2u;
const H_WORK: u32 = 3u;
const H_CANARY: u32 = 4u;
const H_FFN: u32 = 5u;
const H_UP_TILES: u32 = 6u;
const H_DOWN_TILES: u32 = 7u;
const H_SLOTS: u32 = 8u;
const H_COUNTS: u32 = 9u;
const H_BASES: u32 = 10u;
const H_ROW_ENTRY: u32 = 11u;
const H_TILE_EXPERT: u32 = 12u;
const H_CHUNKS: u32 = 13u;
const H_INDICES: u32 = 14u;
const H_ROWS_H: u32 = 15u;
const H_PARTIAL: u32 = 16u;
const H_WEIGHTS: u32 = 17u;
const H_BIAS: u32 = 18u;
const H_SHARED_FFN: u32 = 19u;
const H_SHARED_UP_TILES: u32 = 20u;
const H_SHARED_GATE: u32 = 21u;
const H_SHARED_UP_OFF: u32 = 22u;
const H_SHARED_DOWN_OFF: u32 = 23u;
const H_SHARED_H: u32 = 24u;
const H_SHARED_OUT: u32 = 25u;
const H_COMBINE_RULE: u32 = 26u;
const H_COMBINE_FIRST: u32 = 27u;
const H_ENTRY_SIGNALS: u32 = 28u;

// Rule 1's part of a combine tile's dependency count that the layout and the expert tasks
// fill at run time (see signal_more).
const RUN_TIME_NEED: u32 = 0x1000000u;

// Task kinds.
const MOE_ROUTE: u32 = 0u;
const MOE_LAYOUT: u32 = 1u;
const MOE_UP: u32 = 2u;
const MOE_DOWN: u32 = 3u;
const MOE_COMBINE: u32 = 4u;
const MOE_SHARED_UP: u32 = 5u;
const MOE_SHARED_DOWN: u32 = 6u;
const MOE_SHARED: u32 = 7u;
const MOE_EXPERT: u32 = 8u;

// Weight sources of expert_word.
const W_GATE: u32 = 0u;
const W_UP: u32 = 1u;
const W_DOWN: u32 = 2u;
const W_SHARED_GATE: u32 = 3u;
const W_SHARED_UP: u32 = 4u;
const W_SHARED_DOWN: u32 = 5u;

// A layout word of `state`.
fn word(i: u32) -> u32 {
    return atomicLoad(&state[i]);
}

fn set_word(i: u32, v: u32) {
    atomicStore(&state[i], v);
}

// select.wgsl's inputs and outputs: the bias from the program, the indices into `state`, the
// weights into `work`.
fn bias_value(e: u32) -> f32 {
    return bitcast<f32>(program[program[H_BIAS] + e]);
}

fn store_choice(i: u32, expert: u32, weight: f32) {
    set_word(program[H_INDICES] + i, expert);
    work[program[H_WEIGHTS] + i] = weight;
}

fn queue_params() -> QueueParams {
    return QueueParams(program[H_TASKS], program[H_TASK_OFF], program[H_SPIN_LIMIT], program[H_WORK], program[H_CANARY]);
}

// Word i of weights `which` (W_GATE ... W_SHARED_DOWN).
fn expert_word(which: u32, i: u32) -> u32 {
    switch which {
        case W_GATE: {
            return w_gate_e[i];
        }
        case W_UP: {
            return w_up_e[i];
        }
        case W_DOWN: {
            return w_down_e[i];
        }
        case W_SHARED_GATE: {
            return w_shared[i];
        }
        case W_SHARED_UP: {
            return w_shared[program[H_SHARED_UP_OFF] + i];
        }
        default: {
            return w_shared[program[H_SHARED_DOWN_OFF] + i];
        }
    }
}

// program[base + k .. base + k + 3] as f32 (the shared gate's values), 0.0 at k >= kdim.
fn program_group4(base: u32, k: u32, kdim: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if k + j < kdim {
            v[j] = bitcast<f32>(program[base + k + j]);
        }
    }
    return v;
}

fn expert_value(which: u32, idx: u32) -> f32 {
    if DTYPE == 0u {
        return bitcast<f32>(expert_word(which, idx));
    }
    let bits16 = (expert_word(which, idx >> 1u) >> ((idx & 1u) * 16u)) & 0xffffu;
    return half_to_f32(bits16);
}

// The group loads below read k .. k + 3 (k < kdim) with 0.0 past kdim, without branches or
// loops (an index past the row is clamped to its last element and its value replaced by
// 0.0): one body for whole and partial groups keeps the inlined tiles small, which is what
// the drivers' compile times (minutes on llvmpipe GL otherwise) depend on.

// Weights base + k .. base + k + 3 of weights `which`.
fn expert_group(which: u32, base: u32, k: u32, kdim: u32) -> vec4<f32> {
    let last = base + kdim - 1u;
    let i = base + k;
    return vec4<f32>(
        expert_value(which, i),
        select(0.0, expert_value(which, min(i + 1u, last)), k + 1u < kdim),
        select(0.0, expert_value(which, min(i + 2u, last)), k + 2u < kdim),
        select(0.0, expert_value(which, min(i + 3u, last)), k + 3u < kdim),
    );
}

// x[base + k .. base + k + 3].
fn x_group4(base: u32, k: u32, kdim: u32) -> vec4<f32> {
    let last = base + kdim - 1u;
    let i = base + k;
    return vec4<f32>(
        x[i],
        select(0.0, x[min(i + 1u, last)], k + 1u < kdim),
        select(0.0, x[min(i + 2u, last)], k + 2u < kdim),
        select(0.0, x[min(i + 3u, last)], k + 3u < kdim),
    );
}

// work[base + k .. base + k + 3].
fn work_group4(base: u32, k: u32, kdim: u32) -> vec4<f32> {
    let last = base + kdim - 1u;
    let i = base + k;
    return vec4<f32>(
        work[i],
        select(0.0, work[min(i + 1u, last)], k + 1u < kdim),
        select(0.0, work[min(i + 2u, last)], k + 2u < kdim),
        select(0.0, work[min(i + 3u, last)], k + 3u < kdim),
    );
}

// Gate logits and top-k of token t, as the fused route kernel computes them for its token.
fn route_token(t: u32, lid: u32) {
    for (var e = lid; e < params.experts; e += ROUTE_WG) {
        score[e] = gate_logit(t, e);
    }
    workgroupBarrier();
    route_select(t, lid);
    workgroupBarrier();
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
    let indices = program[H_INDICES];
    for (var e = 0u; e < experts; e++) {
        set_word(mine + e, 0u);
    }
    for (var i = c0; i < c1; i++) {
        let e = word(indices + i);
        if e < experts {
            set_word(mine + e, word(mine + e) + 1u);
        }
    }
    storageBarrier();
    for (var e = lid; e < experts; e += LANES) {
        var run = 0u;
        for (var l = 0u; l < LANES; l++) {
            let at = program[H_CHUNKS] + l * experts + e;
            let v = word(at);
            set_word(at, run);
            run += v;
        }
        set_word(program[H_COUNTS] + e, run);
    }
    let slots = program[H_SLOTS];
    for (var r = lid; r < slots * MOE_TILE; r += LANES) {
        set_word(program[H_ROW_ENTRY] + r, MOE_NONE);
    }
    storageBarrier();
    if lid == 0u {
        var base = 0u;
        var tile = 0u;
        for (var e = 0u; e < experts; e++) {
            set_word(program[H_BASES] + e, base);
            let tiles = (word(program[H_COUNTS] + e) + MOE_TILE - 1u) / MOE_TILE;
            for (var j = 0u; j < tiles; j++) {
                set_word(program[H_TILE_EXPERT] + tile + j, e);
            }
            tile += tiles;
            base += tiles * MOE_TILE;
        }
        for (; tile < slots; tile++) {
            set_word(program[H_TILE_EXPERT] + tile, MOE_NONE);
        }
    }
    storageBarrier();
    for (var i = c0; i < c1; i++) {
        let e = word(indices + i);
        if e < experts {
            let rank = word(mine + e);
            set_word(mine + e, rank + 1u);
            set_word(program[H_ROW_ENTRY] + word(program[H_BASES] + e) + rank, i);
        }
    }
}

// Entry of row j of bin tile `s` (MOE_NONE for padding).
fn tile_entry(s: u32, j: u32) -> u32 {
    return word(program[H_ROW_ENTRY] + s * MOE_TILE + j);
}

// x row base of an entry (row 0 for padding, whose results are not stored).
fn entry_x(entry: u32) -> u32 {
    return select(entry / params.k, 0u, entry == MOE_NONE) * params.hidden;
}

// Rows of bin tile s that hold entries: a bin fills its tiles from the first row, so the
// padding is at the end of its last tile.
fn live_rows(s: u32) -> u32 {
    var n = 0u;
    for (var j = 0u; j < MOE_TILE; j++) {
        n += select(0u, 1u, tile_entry(s, j) != MOE_NONE);
    }
    return n;
}

// One row of a gate/up projection: silu_mul(x . gate[col], x . up[col]), the weights `wg`
// and `wu` (expert_word) from word wb.
fn up_row(xb: u32, wg: u32, wu: u32, wb: u32, kdim: u32) -> f32 {
    var g = vec4<f32>(0.0);
    var u = vec4<f32>(0.0);
    for (var k = 0u; k < kdim; k += 4u) {
        let xv = x_group4(xb, k, kdim);
        g = order_step(g, xv, expert_group(wg, wb, k, kdim));
        u = order_step(u, xv, expert_group(wu, wb, k, kdim));
    }
    return silu_mul(order_value(g), order_value(u));
}

// The gate/up projection of one column for eight rows (x row bases xb, the first `live` of
// them real) into work[out + j * stride]. Up to four live rows (decode, an expert's last
// tile) run one by one; more share each weight load over all eight. Every row takes the
// same operations either way.
fn up_block(xb: array<u32, 8>, live: u32, wg: u32, wu: u32, wb: u32, kdim: u32, out: u32, stride: u32) {
    if live <= 4u {
        var rows = xb;
        for (var j = 0u; j < live; j++) {
            work[out + j * stride] = up_row(rows[j], wg, wu, wb, kdim);
        }
        return;
    }
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
        let wgv = expert_group(wg, wb, k, kdim);
        let wuv = expert_group(wu, wb, k, kdim);
        var xv = x_group4(xb[0], k, kdim);
        g0 = order_step(g0, xv, wgv);
        u0 = order_step(u0, xv, wuv);
        xv = x_group4(xb[1], k, kdim);
        g1 = order_step(g1, xv, wgv);
        u1 = order_step(u1, xv, wuv);
        xv = x_group4(xb[2], k, kdim);
        g2 = order_step(g2, xv, wgv);
        u2 = order_step(u2, xv, wuv);
        xv = x_group4(xb[3], k, kdim);
        g3 = order_step(g3, xv, wgv);
        u3 = order_step(u3, xv, wuv);
        xv = x_group4(xb[4], k, kdim);
        g4 = order_step(g4, xv, wgv);
        u4 = order_step(u4, xv, wuv);
        xv = x_group4(xb[5], k, kdim);
        g5 = order_step(g5, xv, wgv);
        u5 = order_step(u5, xv, wuv);
        xv = x_group4(xb[6], k, kdim);
        g6 = order_step(g6, xv, wgv);
        u6 = order_step(u6, xv, wuv);
        xv = x_group4(xb[7], k, kdim);
        g7 = order_step(g7, xv, wgv);
        u7 = order_step(u7, xv, wuv);
    }
    var v = array<f32, 8>(
        silu_mul(order_value(g0), order_value(u0)),
        silu_mul(order_value(g1), order_value(u1)),
        silu_mul(order_value(g2), order_value(u2)),
        silu_mul(order_value(g3), order_value(u3)),
        silu_mul(order_value(g4), order_value(u4)),
        silu_mul(order_value(g5), order_value(u5)),
        silu_mul(order_value(g6), order_value(u6)),
        silu_mul(order_value(g7), order_value(u7)),
    );
    for (var j = 0u; j < live; j++) {
        work[out + j * stride] = v[j];
    }
}

// One row of a down projection: the row of `work` at hb . weights `wd` from word wb.
fn down_row(hb: u32, wd: u32, wb: u32, kdim: u32) -> f32 {
    var a = vec4<f32>(0.0);
    for (var k = 0u; k < kdim; k += 4u) {
        a = order_step(a, work_group4(hb, k, kdim), expert_group(wd, wb, k, kdim));
    }
    return order_value(a);
}

// The down projection of one column for eight rows of `work` (row j at hb + j * kdim, the
// first `live` real) into work[out[j]]; as up_block.
fn down_block(hb: u32, live: u32, wd: u32, wb: u32, kdim: u32, out: array<u32, 8>) {
    var to = out;
    if live <= 4u {
        for (var j = 0u; j < live; j++) {
            work[to[j]] = down_row(hb + j * kdim, wd, wb, kdim);
        }
        return;
    }
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    for (var k = 0u; k < kdim; k += 4u) {
        let wv = expert_group(wd, wb, k, kdim);
        a0 = order_step(a0, work_group4(hb, k, kdim), wv);
        a1 = order_step(a1, work_group4(hb + kdim, k, kdim), wv);
        a2 = order_step(a2, work_group4(hb + 2u * kdim, k, kdim), wv);
        a3 = order_step(a3, work_group4(hb + 3u * kdim, k, kdim), wv);
        a4 = order_step(a4, work_group4(hb + 4u * kdim, k, kdim), wv);
        a5 = order_step(a5, work_group4(hb + 5u * kdim, k, kdim), wv);
        a6 = order_step(a6, work_group4(hb + 6u * kdim, k, kdim), wv);
        a7 = order_step(a7, work_group4(hb + 7u * kdim, k, kdim), wv);
    }
    var v = array<f32, 8>(
        order_value(a0),
        order_value(a1),
        order_value(a2),
        order_value(a3),
        order_value(a4),
        order_value(a5),
        order_value(a6),
        order_value(a7),
    );
    for (var j = 0u; j < live; j++) {
        work[to[j]] = v[j];
    }
}

// h[row, col] = silu_mul(x . gate[e, col], x . up[e, col]) for the rows of bin tile s.
fn up_tile(tile: u32, lid: u32) {
    let s = tile / program[H_UP_TILES];
    let col = (tile % program[H_UP_TILES]) * LANES + lid;
    let expert = word(program[H_TILE_EXPERT] + s);
    let ffn = program[H_FFN];
    if expert == MOE_NONE || col >= ffn {
        return;
    }
    let kdim = params.hidden;
    var xb: array<u32, 8>;
    for (var j = 0u; j < MOE_TILE; j++) {
        xb[j] = entry_x(tile_entry(s, j));
    }
    let out = program[H_ROWS_H] + s * MOE_TILE * ffn + col;
    up_block(xb, live_rows(s), W_GATE, W_UP, (expert * ffn + col) * kdim, kdim, out, ffn);
}

// out[entry, col] = h[row] . down[e, col] for the rows of bin tile s.
fn down_tile(tile: u32, lid: u32) {
    let s = tile / program[H_DOWN_TILES];
    let col = (tile % program[H_DOWN_TILES]) * LANES + lid;
    let expert = word(program[H_TILE_EXPERT] + s);
    let hidden = params.hidden;
    if expert == MOE_NONE || col >= hidden {
        return;
    }
    let kdim = program[H_FFN];
    var out: array<u32, 8>;
    for (var j = 0u; j < MOE_TILE; j++) {
        out[j] = program[H_PARTIAL] + tile_entry(s, j) * hidden + col;
    }
    let hb = program[H_ROWS_H] + s * MOE_TILE * kdim;
    down_block(hb, live_rows(s), W_DOWN, (expert * hidden + col) * kdim, kdim, out);
}

// Tokens t0 .. t0 + 8 of shared-expert tile `tile` and how many of them exist.
fn shared_rows(tile: u32) -> vec2<u32> {
    let t0 = tile * MOE_TILE;
    return vec2<u32>(t0, min(MOE_TILE, params.tokens - t0));
}

// hs[t, col] = silu_mul(x . gate_s[col], x . up_s[col]) for eight tokens.
fn shared_up_tile(tile: u32, lid: u32) {
    let tiles = program[H_SHARED_UP_TILES];
    let rows = shared_rows(tile / tiles);
    let col = (tile % tiles) * LANES + lid;
    let fs = program[H_SHARED_FFN];
    if col >= fs {
        return;
    }
    var xb: array<u32, 8>;
    for (var j = 0u; j < MOE_TILE; j++) {
        xb[j] = min(rows.x + j, params.tokens - 1u) * params.hidden;
    }
    let out = program[H_SHARED_H] + rows.x * fs + col;
    up_block(xb, rows.y, W_SHARED_GATE, W_SHARED_UP, col * params.hidden, params.hidden, out, fs);
}

// The shared expert's rows: sr[t, col] = hs[t] . down_s[col] for eight tokens.
fn shared_down_tile(tile: u32, lid: u32) {
    let tiles = program[H_DOWN_TILES];
    let rows = shared_rows(tile / tiles);
    let col = (tile % tiles) * LANES + lid;
    let hidden = params.hidden;
    if col >= hidden {
        return;
    }
    let fs = program[H_SHARED_FFN];
    var out: array<u32, 8>;
    for (var j = 0u; j < MOE_TILE; j++) {
        out[j] = program[H_SHARED_OUT] + (rows.x + j) * hidden + col;
    }
    down_block(program[H_SHARED_H] + rows.x * fs, rows.y, W_SHARED_DOWN, col * fs, fs, out);
}

var<workgroup> shared_scale: array<f32, MOE_TILE>;

// y[t, c] = fma(w[t, k - 1], out[t * k + k - 1, c], ... fma(w[t, 0], out[t * k, c], 0.0)),
// then with a shared expert y = fma(s_t, sr[t, c], y), s_t = 1.0 / (1.0 + exp(-(x_t . g)))
// when it is gated (x_t . g in the GEMM order, as the staged dense kernel computes it) and 1.0
// otherwise: combine.wgsl's order. Tiles are MOE_TILE tokens.
fn combine_tile(tile: u32, lid: u32) {
    let lo = tile * MOE_TILE;
    let hi = min(lo + MOE_TILE, params.tokens);
    let hidden = params.hidden;
    let partial = program[H_PARTIAL];
    let has_shared = program[H_SHARED_FFN] != 0u;
    let gate = program[H_SHARED_GATE];
    if lid < MOE_TILE {
        var scale = 1.0;
        if has_shared && gate != MOE_NONE && lo + lid < hi {
            var acc = vec4<f32>(0.0);
            let xb = (lo + lid) * hidden;
            for (var k = 0u; k < hidden; k += 4u) {
                acc = order_step(acc, x_group4(xb, k, hidden), program_group4(gate, k, hidden));
            }
            scale = 1.0 / (1.0 + exp(-order_value(acc)));
        }
        shared_scale[lid] = scale;
    }
    workgroupBarrier();
    for (var t = lo; t < hi; t++) {
        let s = shared_scale[t - lo];
        for (var c = lid; c < hidden; c += LANES) {
            var acc = 0.0;
            for (var j = 0u; j < params.k; j++) {
                let entry = t * params.k + j;
                acc = fma(work[program[H_WEIGHTS] + entry], work[partial + entry * hidden + c], acc);
            }
            if has_shared {
                acc = fma(s, work[program[H_SHARED_OUT] + t * hidden + c], acc);
            }
            y[t * hidden + c] = acc;
        }
    }
    workgroupBarrier();
}

// Gate/up column tiles first .. first + count of the routed experts or the shared expert.
fn up_tiles(of_shared: bool, first: u32, count: u32, lid: u32) {
    for (var c = first; c < first + count; c++) {
        if of_shared {
            shared_up_tile(c, lid);
        } else {
            up_tile(c, lid);
        }
    }
}

// Down column tiles first .. first + count of the routed experts or the shared expert.
fn down_tiles(of_shared: bool, first: u32, count: u32, lid: u32) {
    for (var c = first; c < first + count; c++) {
        if of_shared {
            shared_down_tile(c, lid);
        } else {
            down_tile(c, lid);
        }
    }
}

// A projection task. A fine one is one column tile; a coarse one is every gate/up column tile
// of 8-row tile `tile` (a bin tile, or a token tile of the shared expert), a storageBarrier,
// then every down column tile of it. Each tile body has one call site (a smaller shader for
// the drivers to compile), and the bits are the fine tasks'.
fn projection_task(kind: u32, tile: u32, lid: u32) {
    let of_shared = kind == MOE_SHARED || kind == MOE_SHARED_UP || kind == MOE_SHARED_DOWN;
    if kind == MOE_UP || kind == MOE_SHARED_UP {
        up_tiles(of_shared, tile, 1u, lid);
    } else if kind == MOE_DOWN || kind == MOE_SHARED_DOWN {
        down_tiles(of_shared, tile, 1u, lid);
    } else {
        let ups = select(program[H_UP_TILES], program[H_SHARED_UP_TILES], of_shared);
        up_tiles(of_shared, tile * ups, ups, lid);
        storageBarrier();
        let downs = program[H_DOWN_TILES];
        down_tiles(of_shared, tile * downs, downs, lid);
    }
}

// Combine rule 1 on the queue: a combine tile waits for RUN_TIME_NEED plus its shared
// tasks. The layout adds RUN_TIME_NEED less the signals the tile will get from expert tasks
// (ENTRY_SIGNALS per routed entry of its tokens: the down column tiles of a fine entry's bin
// tile, or its one coarse expert task); each DOWN or EXPERT task adds one per entry it holds
// to that entry's combine tile. The counts are reached exactly when every expert task holding
// the tile's entries is done.
fn signal_more(kind: u32, tile: u32) {
    if program[H_COMBINE_RULE] != 1u {
        return;
    }
    let counters = COUNTERS + program[H_COMBINE_FIRST];
    if kind == MOE_LAYOUT {
        let tiles = (params.tokens + MOE_TILE - 1u) / MOE_TILE;
        for (var c = 0u; c < tiles; c++) {
            var routed = 0u;
            let e1 = min((c + 1u) * MOE_TILE, params.tokens) * params.k;
            for (var i = c * MOE_TILE * params.k; i < e1; i++) {
                routed += select(0u, 1u, word(program[H_INDICES] + i) < params.experts);
            }
            atomicAdd(&state[counters + c], RUN_TIME_NEED - routed * program[H_ENTRY_SIGNALS]);
        }
    } else if kind == MOE_DOWN || kind == MOE_EXPERT {
        let s = select(tile / program[H_DOWN_TILES], tile, kind == MOE_EXPERT);
        for (var j = 0u; j < MOE_TILE; j++) {
            let entry = tile_entry(s, j);
            if entry != MOE_NONE {
                atomicAdd(&state[counters + entry / params.k / MOE_TILE], 1u);
            }
        }
    }
}

fn run_pass(kind: u32, slot: u32, tile: u32, lid: u32) {
    if kind == MOE_ROUTE {
        route_token(tile, lid);
    } else if kind == MOE_LAYOUT {
        layout_task(lid);
    } else if kind == MOE_COMBINE {
        combine_tile(tile, lid);
    } else {
        projection_task(kind, tile, lid);
    }
}
