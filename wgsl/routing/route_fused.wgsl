// Fused route: gate matvec and top-k in one dispatch, one workgroup per token. The token's
// logits stay in workgroup memory; with WRITE_LOGITS they are also stored for telemetry.
// Indices and weights are bit-identical to gate_matvec followed by topk on the same adapter:
// both use gate_logit for the logits and route_select for everything after.

@group(0) @binding(3) var<storage, read_write> logits: array<f32>;

override WRITE_LOGITS: bool = false;

@compute @workgroup_size(ROUTE_WG)
fn route_fused(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = flat_group(wid, nwg);
    if t >= params.tokens {
        return;
    }
    let row = t * params.experts;
    for (var e = lid; e < params.experts; e += ROUTE_WG) {
        let l = gate_logit(t, e);
        score[e] = l;
        if WRITE_LOGITS {
            logits[row + e] = l;
        }
    }
    workgroupBarrier();
    route_select(t, lid);
}
