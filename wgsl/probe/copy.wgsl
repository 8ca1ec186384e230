// Streaming copy for bandwidth calibration: dst[i] = src[i] over vec4<f32>, one element per
// invocation, grid flattened over x and y. Bytes moved per run: 2 * 16 * n.

struct CopyParams {
    n: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(0) var<uniform> params: CopyParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + lid;
    if i < params.n {
        dst[i] = src[i];
    }
}
