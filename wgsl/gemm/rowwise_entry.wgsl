// The row-wise kernel's entry point where each invocation reads its own x (rowwise.wgsl):
// rows packed without padding, and a block of x as eight loads of x_vec.

const ROW_ALIGN: u32 = 1u;

@compute @workgroup_size(64)
fn rowwise(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    rowwise_at(gid.x + gid.y * nwg.x * 64u);
}

fn x_block(xr: u32, k0: u32) -> XBlock {
    return XBlock(
        x_vec(xr, k0),
        x_vec(xr, k0 + 4u),
        x_vec(xr, k0 + 8u),
        x_vec(xr, k0 + 12u),
        x_vec(xr, k0 + 16u),
        x_vec(xr, k0 + 20u),
        x_vec(xr, k0 + 24u),
        x_vec(xr, k0 + 28u),
    );
}
