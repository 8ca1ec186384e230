// Uniform parameters shared by every routing kernel (group 0, binding 0).
//
// Shapes: x[tokens, hidden], w_gate[experts, hidden] (then b[experts] with router_bias),
// logits[tokens, experts],
// bias[experts], topk_indices[tokens, k], topk_weights[tokens, k]; all row-major.
struct RouteParams {
    tokens: u32,
    hidden: u32,
    experts: u32,
    k: u32,
    n_group: u32,
    topk_group: u32,
    scale: f32,
    // 1: logits are x . w + b, b[experts] stored after the gate rows.
    router_bias: u32,
}

@group(0) @binding(0) var<uniform> params: RouteParams;

// Index of this workgroup in a grid that may spill into y when the count passes the
// per-dimension limit (x fastest).
fn flat_group(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}
