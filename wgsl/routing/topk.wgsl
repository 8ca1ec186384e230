// Unfused top-k: one workgroup per token reads that token's logits row and runs
// `route_select`, exactly as the fused kernel does after its matvec.

@group(0) @binding(3) var<storage, read_write> logits: array<f32>;

@compute @workgroup_size(ROUTE_WG)
fn topk(
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
        score[e] = logits[row + e];
    }
    workgroupBarrier();
    route_select(t, lid);
}
