// Staging pass of the window GEMM kernels (GemmVariant::Window): copies the input row of every
// row of a pass (found as the GEMM finds it: entry_of, then input_row) into uniform-buffer
// windows of win_rows rows each, window w at vec4 w * win_stride4, row r of it at
// r * ceil(K / 4). Values past K and rows without an entry are written as 0.0, so the window
// kernels read every group of four unbounded. Copies only: the values are the bits of x.

// The windows, bound whole (the GEMM binds one window at a time as a uniform buffer).
@group(0) @binding(7) var<storage, read_write> windows: array<vec4<f32>>;

@compute @workgroup_size(64)
fn stage(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let kp4 = (params.kdim + 3u) / 4u;
    let i = gid.x + gid.y * groups.x * 64u;
    let row = i / kp4;
    let g = i % kp4;
    if row >= params.rows {
        return;
    }
    var v = vec4<f32>(0.0);
    let e = entry_of(row);
    if e != NONE {
        v = x_tail(input_row(row, e) * params.kdim, 4u * g, params.kdim);
    }
    windows[(row / params.win_rows) * params.win_stride4 + (row % params.win_rows) * kp4 + g] = v;
}
