// The values the kernels read from expert weights (ExpertWeights::unpack): every group of four
// of every weight row of the bound chunk, read by weight4_tail (the loads of the block and
// row-wise kernels) and written to out[(expert * N + col) * K + k] with no arithmetic of its
// own, so out holds the loads' bits. One invocation per group of four.

@compute @workgroup_size(64)
fn unpack(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let kp4 = (params.kdim + 3u) / 4u;
    let i = gid.x + gid.y * groups.x * 64u;
    let row = i / kp4;
    let k = 4u * (i % kp4);
    if row >= params.expert_count * params.cols {
        return;
    }
    let expert = params.expert_base + row / params.cols;
    let col = params.col_base + row % params.cols;
    let v = weight4_tail(false, weight_row(expert, col), k, params.kdim);
    let at = (expert * params.n + col) * params.kdim + k;
    for (var j = 0u; j < 4u; j++) {
        if k + j < params.kdim {
            out[at + j] = v[j];
        }
    }
}
