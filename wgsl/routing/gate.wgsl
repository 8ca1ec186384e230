// Gate matvec body, shared by the unfused `gate_matvec` kernel and the fused `route_fused`
// kernel so that both compute every logit with the same instructions.

@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w_gate: array<f32>;

// logit(t, e) = sum_h x[t, h] * w_gate[e, h] (+ w_gate[E * H + e] with params.router_bias).
//
// Accumulation order (the contract mirrored by reference::routing::gate_logit): four lanes,
// lane j takes every h with h % 4 == j in ascending h, each step `lane = fma(x, w, lane)`
// starting from 0.0; the result is (lane0 + lane1) + (lane2 + lane3), then the bias in one add.
fn gate_logit(t: u32, e: u32) -> f32 {
    let h = params.hidden;
    let xb = t * h;
    let wb = e * h;
    let h4 = h & ~3u;
    var l0 = 0.0;
    var l1 = 0.0;
    var l2 = 0.0;
    var l3 = 0.0;
    var i = 0u;
    loop {
        if i >= h4 {
            break;
        }
        l0 = fma(x[xb + i], w_gate[wb + i], l0);
        l1 = fma(x[xb + i + 1u], w_gate[wb + i + 1u], l1);
        l2 = fma(x[xb + i + 2u], w_gate[wb + i + 2u], l2);
        l3 = fma(x[xb + i + 3u], w_gate[wb + i + 3u], l3);
        i += 4u;
    }
    if i < h {
        l0 = fma(x[xb + i], w_gate[wb + i], l0);
    }
    if i + 1u < h {
        l1 = fma(x[xb + i + 1u], w_gate[wb + i + 1u], l1);
    }
    if i + 2u < h {
        l2 = fma(x[xb + i + 2u], w_gate[wb + i + 2u], l2);
    }
    let dot = (l0 + l1) + (l2 + l3);
    if params.router_bias != 0u {
        return dot + w_gate[params.experts * h + e];
    }
    return dot;
}
