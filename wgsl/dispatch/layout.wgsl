// Dispatch: from top-k expert indices to a grouped, padded row layout, deterministically.
//
// 1. block_hist: per block b of DISPATCH_WG entries, hist[b, e] = entries of b routed to e.
// 2. expert_base: per expert, hist[b, e] becomes the exclusive prefix over blocks and
//    counts[e] the total.
// 3. scan: one workgroup; offsets, tile-padded offsets, overflow offsets, the tile -> expert
//    map, padding sentinels in perm, and the meta words.
// 4. scatter: entry i of block b with expert e goes to row
//    padded[e] + hist[b, e] + (entries of b before i with expert e),
//    so rows inside an expert are in ascending entry order: a stable sort's result.
// Counting uses atomicAdd on per-block counters (order-free); placement never does.

@group(0) @binding(1) var<storage, read_write> indices: array<u32>;
@group(0) @binding(2) var<storage, read_write> hist: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read_write> counts: array<u32>;
@group(0) @binding(4) var<storage, read_write> offsets: array<u32>;
@group(0) @binding(5) var<storage, read_write> padded: array<u32>;
@group(0) @binding(6) var<storage, read_write> perm: array<u32>;
@group(0) @binding(7) var<storage, read_write> inverse: array<u32>;
@group(0) @binding(8) var<storage, read_write> tile_expert: array<u32>;
@group(0) @binding(9) var<storage, read_write> meta_words: array<u32>;
@group(0) @binding(10) var<storage, read_write> overflow_offsets: array<u32>;

var<workgroup> block_expert: array<vec4<u32>, DISPATCH_WG / 4u>;
var<workgroup> part_rows: array<u32, DISPATCH_WG>;
var<workgroup> part_padded: array<u32, DISPATCH_WG>;
var<workgroup> part_over: array<u32, DISPATCH_WG>;
var<workgroup> part_max: array<u32, DISPATCH_WG>;
var<workgroup> part_nonempty: array<u32, DISPATCH_WG>;
var<workgroup> padded_total: u32;

@compute @workgroup_size(DISPATCH_WG)
fn block_hist(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let b = flat_group(wid, nwg);
    if b >= params.blocks {
        return;
    }
    let row = b * params.experts;
    for (var e = lid; e < params.experts; e += DISPATCH_WG) {
        atomicStore(&hist[row + e], 0u);
    }
    storageBarrier();
    workgroupBarrier();
    let i = b * DISPATCH_WG + lid;
    if i < params.entries {
        let e = indices[i];
        if e < params.experts {
            atomicAdd(&hist[row + e], 1u);
        }
    }
}

@compute @workgroup_size(64)
fn expert_base(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = gid.x + gid.y * nwg.x * 64u;
    if e >= params.experts {
        return;
    }
    var running = 0u;
    for (var b = 0u; b < params.blocks; b++) {
        let at = b * params.experts + e;
        let h = atomicLoad(&hist[at]);
        atomicStore(&hist[at], running);
        running += h;
    }
    counts[e] = running;
}

fn padded_count(c: u32) -> u32 {
    return (c + params.tile - 1u) / params.tile * params.tile;
}

fn over_count(c: u32) -> u32 {
    if params.bound == 0u || c <= params.bound {
        return 0u;
    }
    return c - params.bound;
}

// One workgroup. Thread t owns experts [t * chunk, (t + 1) * chunk); thread 0 scans the 256
// chunk totals in order; every thread then writes its experts' offsets.
@compute @workgroup_size(DISPATCH_WG)
fn scan(@builtin(local_invocation_index) lid: u32) {
    let n = params.experts;
    let chunk = (n + DISPATCH_WG - 1u) / DISPATCH_WG;
    let lo = min(lid * chunk, n);
    let hi = min(lo + chunk, n);
    var rows = 0u;
    var pad = 0u;
    var over = 0u;
    var mx = 0u;
    var nonempty = 0u;
    for (var e = lo; e < hi; e++) {
        let c = counts[e];
        rows += c;
        pad += padded_count(c);
        over += over_count(c);
        mx = max(mx, c);
        nonempty += select(0u, 1u, c > 0u);
    }
    part_rows[lid] = rows;
    part_padded[lid] = pad;
    part_over[lid] = over;
    part_max[lid] = mx;
    part_nonempty[lid] = nonempty;
    workgroupBarrier();
    if lid == 0u {
        var r = 0u;
        var p = 0u;
        var o = 0u;
        var m = 0u;
        var ne = 0u;
        for (var t = 0u; t < DISPATCH_WG; t++) {
            let rt = part_rows[t];
            let pt = part_padded[t];
            let ot = part_over[t];
            part_rows[t] = r;
            part_padded[t] = p;
            part_over[t] = o;
            r += rt;
            p += pt;
            o += ot;
            m = max(m, part_max[t]);
            ne += part_nonempty[t];
        }
        offsets[n] = r;
        padded[n] = p;
        overflow_offsets[n] = o;
        meta_words[META_ROWS] = r;
        meta_words[META_PADDED_ROWS] = p;
        meta_words[META_TILES] = p / params.tile;
        meta_words[META_MAX_COUNT] = m;
        meta_words[META_NONEMPTY] = ne;
        meta_words[META_OVERFLOW] = o;
        meta_words[META_INVALID] = params.entries - r;
        padded_total = p;
    }
    workgroupBarrier();
    var r = part_rows[lid];
    var p = part_padded[lid];
    var o = part_over[lid];
    for (var e = lo; e < hi; e++) {
        let c = counts[e];
        offsets[e] = r;
        padded[e] = p;
        overflow_offsets[e] = o;
        let pc = padded_count(c);
        for (var row = p + c; row < p + pc; row++) {
            perm[row] = NONE;
        }
        for (var t = p / params.tile; t < (p + pc) / params.tile; t++) {
            tile_expert[t] = e;
        }
        r += c;
        p += pc;
        o += over_count(c);
    }
    for (var t = padded_total / params.tile + lid; t < params.max_tiles; t += DISPATCH_WG) {
        tile_expert[t] = NONE;
    }
}

@compute @workgroup_size(DISPATCH_WG)
fn scatter(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let b = flat_group(wid, nwg);
    if b >= params.blocks {
        return;
    }
    let i = b * DISPATCH_WG + lid;
    var e = NONE;
    if i < params.entries {
        e = indices[i];
        if e >= params.experts {
            e = NONE;
        }
    }
    block_expert[lid / 4u][lid % 4u] = e;
    workgroupBarrier();
    if i >= params.entries {
        return;
    }
    if e == NONE {
        inverse[i] = NONE;
        return;
    }
    // rank = entries before this one in the block with the same expert, four at a time.
    let ev = vec4<u32>(e);
    let one = vec4<u32>(1u);
    var acc = vec4<u32>(0u);
    let full = lid / 4u;
    for (var j = 0u; j < full; j++) {
        acc += select(vec4<u32>(0u), one, block_expert[j] == ev);
    }
    let lanes = vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(lid % 4u);
    acc += select(vec4<u32>(0u), one, (block_expert[full] == ev) & lanes);
    let rank = (acc.x + acc.y) + (acc.z + acc.w);
    let row = padded[e] + atomicLoad(&hist[b * params.experts + e]) + rank;
    perm[row] = i;
    inverse[i] = row;
}
