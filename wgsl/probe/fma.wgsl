// FMA throughput for compute calibration: each invocation runs `iters` rounds of eight
// independent vec4 fma chains (32 scalar FMAs, 64 flops per round) and stores one value so
// the work cannot be removed. Flops per run: 64 * iters * invocations.

struct FmaParams {
    invocations: u32,
    iters: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(0) var<uniform> params: FmaParams;
@group(0) @binding(1) var<storage, read_write> sink: array<f32>;

@compute @workgroup_size(256)
fn fma_probe(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if i >= params.invocations {
        return;
    }
    let s = f32(i) * 1e-7;
    let m = vec4<f32>(0.999999, 1.000001, 0.9999995, 1.0000005);
    let c = vec4<f32>(1e-7, -1e-7, 2e-7, -2e-7);
    var a0 = vec4<f32>(s); var a1 = a0 + 0.1; var a2 = a0 + 0.2; var a3 = a0 + 0.3;
    var a4 = a0 + 0.4; var a5 = a0 + 0.5; var a6 = a0 + 0.6; var a7 = a0 + 0.7;
    for (var r = 0u; r < params.iters; r++) {
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
    }
    let t = (a0 + a1) + (a2 + a3) + (a4 + a5) + (a6 + a7);
    sink[i] = t.x + t.y + t.z + t.w;
}
