// The routing kernels' side of select.wgsl: the selection bias and the top-k outputs in
// buffers of their own.

// bias[experts] (a 4-byte placeholder without a bias).
@group(0) @binding(4) var<storage, read> bias: array<f32>;
// topk_indices[tokens, k], topk_weights[tokens, k].
@group(0) @binding(5) var<storage, read_write> topk_indices: array<u32>;
@group(0) @binding(6) var<storage, read_write> topk_weights: array<f32>;

fn bias_value(e: u32) -> f32 {
    return bias[e];
}

fn store_choice(i: u32, expert: u32, weight: f32) {
    topk_indices[i] = expert;
    topk_weights[i] = weight;
}
