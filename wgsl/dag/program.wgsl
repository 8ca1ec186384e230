// Row-tiled stage programs shared by every DAG executor (static passes and the persistent
// queue), so all executors run the same code for the same value and agree bit for bit.
//
// Data: `vals[stage * rows * cols + row * cols + col]` holds every stage's output (every
// intermediate is kept); scratch rows for halo recomputation follow at `scratch_base`, one
// block per slot (workgroup of a static pass, worker of the queue). The graph input is
// `inputs[row * cols + col]`; per-column stage parameters live in `inputs` too.
//
// Program words (read-only storage, uniform for the whole dispatch):
//   stage s at stage_off + 3s: kind, source stage (NONE = graph input), parameter offset
//   pass p at pass_off + 2p:   first step word, step count
//   step at its word + 3j:     stage, extra rows computed on each side of the tile, step of
//                              this pass that computes the source (NONE = read it from vals)
//   task i at task_off + 5i:   pass, tile, dependencies to wait for, first consumer word,
//                              consumer count (consumers are task indices)
//
// Workgroup size: the pipeline constant LANES (a power of two up to 64). Static passes use 8
// on CPU adapters, where a workgroup of 64 runs as eight coroutines whose bookkeeping costs
// more than the work, and 64 elsewhere; the queue always uses 64 (see docs/dag.md). No result
// depends on LANES: elementwise ops are per column, and the RMS sum has one fixed order over
// 64 virtual lanes.
//
// Column ownership: invocation `lid` handles columns lid, lid + LANES, ... of every row in
// every stage (the RMS sum reads the same columns: LANES divides 64), so a workgroup reads
// back its own writes without a barrier; only the RMS reduction crosses invocations (through
// workgroup memory).
//
// Operations, in this exact order (the CPU oracle mirrors them):
//   affine: fma(x, w[c], b[c])
//   silu:   h = fma(0.25, x[r-1], fma(0.5, x[r], 0.25 * x[r+1])) with rows clamped to
//           [0, rows), then h / (1 + exp(-h))
//   rms:    p[v] = fma(x, x, acc) over columns v, v + 64, ... ascending, for 64 virtual lanes
//           v; pairwise tree over them (stride 32, 16, ..., 1); inv = inverseSqrt(sum / cols +
//           1e-6); out = (x * inv) * gamma[c]

override LANES: u32 = 64u;
const SUM_LANES: u32 = 64u;
const NONE: u32 = 0xffffffffu;
const KIND_AFFINE: u32 = 0u;
const KIND_SILU: u32 = 1u;
const KIND_RMS: u32 = 2u;
const RMS_EPS: f32 = 1e-6;

struct DagParams {
    rows: u32,
    cols: u32,
    tile_rows: u32,
    tiles: u32,
    stage_off: u32,
    pass_off: u32,
    task_off: u32,
    tasks: u32,
    scratch_base: u32,
    scratch_steps: u32,
    scratch_extra: u32,
    pass_index: u32,
    spin_limit: u32,
    work: u32,
    canary: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: DagParams;
@group(0) @binding(1) var<storage, read> program: array<u32>;
@group(0) @binding(2) var<storage, read> inputs: array<f32>;
@group(0) @binding(3) var<storage, read_write> vals: array<f32>;

var<workgroup> partial: array<f32, SUM_LANES>;

struct Tile {
    lo: u32,
    hi: u32,
}

fn tile_rows(tile: u32) -> Tile {
    let lo = tile * params.tile_rows;
    return Tile(lo, min(lo + params.tile_rows, params.rows));
}

// Index in `vals` of scratch row `row` (outside the tile) of `step` for `slot`.
fn scratch_index(slot: u32, step: u32, t: Tile, row: u32) -> u32 {
    var h = 0u;
    if row < t.lo {
        h = params.scratch_extra - (t.lo - row);
    } else {
        h = params.scratch_extra + (row - t.hi);
    }
    return params.scratch_base + ((slot * params.scratch_steps + step) * 2u * params.scratch_extra + h) * params.cols;
}

// Value of the source of a step at (row, col): the graph input, a row this pass recomputed
// into scratch, or a row already in `vals`.
fn load_src(src: u32, src_step: u32, slot: u32, t: Tile, row: u32, col: u32) -> f32 {
    if src == NONE {
        return inputs[row * params.cols + col];
    }
    if src_step != NONE && (row < t.lo || row >= t.hi) {
        return vals[scratch_index(slot, src_step, t, row) + col];
    }
    return vals[(src * params.rows + row) * params.cols + col];
}

fn store(stage: u32, step: u32, slot: u32, t: Tile, row: u32, col: u32, v: f32) {
    if row < t.lo || row >= t.hi {
        vals[scratch_index(slot, step, t, row) + col] = v;
    } else {
        vals[(stage * params.rows + row) * params.cols + col] = v;
    }
}

fn silu_input(src: u32, src_step: u32, slot: u32, t: Tile, row: u32, col: u32) -> f32 {
    let up = load_src(src, src_step, slot, t, select(row - 1u, 0u, row == 0u), col);
    let mid = load_src(src, src_step, slot, t, row, col);
    let down = load_src(src, src_step, slot, t, min(row + 1u, params.rows - 1u), col);
    return fma(0.25, up, fma(0.5, mid, 0.25 * down));
}

// Runs step `j` of the pass whose steps start at `steps`, for `tile`, in `slot`'s scratch.
fn run_step(steps: u32, j: u32, slot: u32, tile: u32, lid: u32) {
    let w = steps + 3u * j;
    let stage = program[w];
    let extra = program[w + 1u];
    let src_step = program[w + 2u];
    let sw = params.stage_off + 3u * stage;
    let kind = program[sw];
    let src = program[sw + 1u];
    let par = program[sw + 2u];
    let t = tile_rows(tile);
    let lo = select(0u, t.lo - extra, t.lo >= extra);
    let hi = min(t.hi + extra, params.rows);
    let cols = params.cols;
    for (var row = lo; row < hi; row++) {
        if kind == KIND_AFFINE {
            for (var c = lid; c < cols; c += LANES) {
                let x = load_src(src, src_step, slot, t, row, c);
                store(stage, j, slot, t, row, c, fma(x, inputs[par + c], inputs[par + cols + c]));
            }
        } else if kind == KIND_SILU {
            for (var c = lid; c < cols; c += LANES) {
                let h = silu_input(src, src_step, slot, t, row, c);
                store(stage, j, slot, t, row, c, h / (1.0 + exp(-h)));
            }
        } else {
            // Partial sums of the 64 virtual lanes (invocation lid owns v = lid, lid + LANES,
            // ...), then the pairwise tree over them: one order whatever LANES is.
            for (var v = lid; v < SUM_LANES; v += LANES) {
                var acc = 0.0;
                for (var c = v; c < cols; c += SUM_LANES) {
                    let x = load_src(src, src_step, slot, t, row, c);
                    acc = fma(x, x, acc);
                }
                partial[v] = acc;
            }
            workgroupBarrier();
            for (var s = SUM_LANES / 2u; s > 0u; s >>= 1u) {
                for (var i = lid; i < s; i += LANES) {
                    partial[i] = partial[i] + partial[i + s];
                }
                workgroupBarrier();
            }
            let inv = inverseSqrt(partial[0] / f32(cols) + RMS_EPS);
            workgroupBarrier();
            for (var c = lid; c < cols; c += LANES) {
                let v = load_src(src, src_step, slot, t, row, c);
                store(stage, j, slot, t, row, c, (v * inv) * inputs[par + c]);
            }
        }
    }
}

// Runs every step of pass `pass_id` for `tile`.
fn run_pass(pass_id: u32, slot: u32, tile: u32, lid: u32) {
    let pw = params.pass_off + 2u * pass_id;
    let steps = program[pw];
    let count = program[pw + 1u];
    for (var j = 0u; j < count; j++) {
        run_step(steps, j, slot, tile, lid);
    }
}
