// Weighted scatter-reduce of the expert outputs, plus the shared expert.
//
// Order (one launch and sequential alike): acc = 0.0; for slot j = 0 .. k - 1:
// acc = fma(weights[t, j], partial[t * k + j, c], acc); then, with a shared expert,
// y = fma(s_t, shared[t, c], acc), where s_t = 1.0 / (1.0 + exp(-shared_logit[t])) when the
// shared expert is gated (Qwen2-MoE) and 1.0 otherwise (exactly acc + shared); without one,
// y = acc.

struct CombineParams {
    tokens: u32,
    hidden: u32,
    k: u32,
    // Sequential path: the token and slot of this dispatch.
    token: u32,
    slot: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: CombineParams;
@group(0) @binding(1) var<storage, read_write> weights: array<f32>;
@group(0) @binding(2) var<storage, read_write> partial: array<f32>;
@group(0) @binding(3) var<storage, read_write> shared_rows: array<f32>;
@group(0) @binding(4) var<storage, read_write> shared_logit: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

override HAS_SHARED: bool = false;
override SHARED_GATED: bool = false;

fn add_shared_term(t: u32, c: u32, acc: f32) -> f32 {
    var s = 1.0;
    if SHARED_GATED {
        s = 1.0 / (1.0 + exp(-shared_logit[t]));
    }
    return fma(s, shared_rows[t * params.hidden + c], acc);
}

// One launch over tokens x hidden.
@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if i >= params.tokens * params.hidden {
        return;
    }
    let t = i / params.hidden;
    let c = i % params.hidden;
    var acc = 0.0;
    for (var j = 0u; j < params.k; j++) {
        let entry = t * params.k + j;
        acc = fma(weights[entry], partial[entry * params.hidden + c], acc);
    }
    if HAS_SHARED {
        acc = add_shared_term(t, c, acc);
    }
    y[i] = acc;
}

// Sequential path, one dispatch per step over the hidden size of one token:
// clear (y = 0), then add_scaled per slot in slot order, then add_shared.
@compute @workgroup_size(64)
fn clear_row(@builtin(global_invocation_id) gid: vec3<u32>) {
    if gid.x < params.hidden {
        y[params.token * params.hidden + gid.x] = 0.0;
    }
}

@compute @workgroup_size(64)
fn add_scaled(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if c < params.hidden {
        let at = params.token * params.hidden + c;
        let entry = params.token * params.k + params.slot;
        y[at] = fma(weights[entry], partial[entry * params.hidden + c], y[at]);
    }
}

@compute @workgroup_size(64)
fn add_shared(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if c < params.hidden {
        let at = params.token * params.hidden + c;
        y[at] = add_shared_term(params.token, c, y[at]);
    }
}

// Zero-fills y[0 .. tokens * hidden) (partial rows of dropped entries).
@compute @workgroup_size(64)
fn fill_zero(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 64u;
    if i < params.tokens * params.hidden {
        y[i] = 0.0;
    }
}
