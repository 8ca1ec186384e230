// Parameters of the dispatch kernels (group 0, binding 0).
//
// The routed list is `indices[entries]` with entries = tokens * k, entry i = token * k + slot.
// Blocks of DISPATCH_WG consecutive entries are the unit of the stable placement.
struct DispatchParams {
    entries: u32,
    k: u32,
    experts: u32,
    tile: u32,
    blocks: u32,
    bound: u32,
    max_tiles: u32,
    pad0: u32,
}

@group(0) @binding(0) var<uniform> params: DispatchParams;

const DISPATCH_WG: u32 = 256u;
const NONE: u32 = 0xffffffffu;

// Meta words written by `scan` (see docs/dispatch.md).
const META_ROWS: u32 = 0u;
const META_PADDED_ROWS: u32 = 1u;
const META_TILES: u32 = 2u;
const META_MAX_COUNT: u32 = 3u;
const META_NONEMPTY: u32 = 4u;
const META_OVERFLOW: u32 = 5u;
const META_INVALID: u32 = 6u;

fn flat_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}
