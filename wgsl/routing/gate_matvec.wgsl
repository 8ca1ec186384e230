// Unfused gate matvec: logits[t, e] = gate_logit(t, e), one invocation per (t, e),
// flattened as i = t * experts + e.

@group(0) @binding(3) var<storage, read_write> logits: array<f32>;

override MATVEC_WG: u32 = 64u;

@compute @workgroup_size(MATVEC_WG)
fn gate_matvec(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = flat_group(wid, nwg) * MATVEC_WG + lid;
    if i >= params.tokens * params.experts {
        return;
    }
    let t = i / params.experts;
    let e = i % params.experts;
    logits[i] = gate_logit(t, e);
}
