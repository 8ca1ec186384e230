// The row-wise kernel's entry point on adapters with subgroups (rowwise.wgsl): each row's
// columns padded to whole workgroups (ROW_ALIGN), so the invocations of a subgroup share their
// row and x. Of a block of 32 x values, the invocations at subgroup lanes 0 .. 3 each load two
// groups of four (lane j: groups j and j + 4) and every invocation takes all eight from them by
// subgroupBroadcast: two loads of x per invocation and block instead of eight, the same values.
// Needs subgroups of at least four invocations (every wgpu adapter with SUBGROUP), each within
// one workgroup, with every invocation of the subgroup in the loop (lanes past the chunk's
// columns run it on a clamped column; rowwise_at).

const ROW_ALIGN: u32 = 64u;

// This invocation's lane in its subgroup, modulo four.
var<private> x_lane: u32;

@compute @workgroup_size(64)
fn rowwise(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    x_lane = lane % 4u;
    rowwise_at(gid.x + gid.y * nwg.x * 64u);
}

// Every invocation of a subgroup calls this together (rowwise_at exits by workgroup), which a
// compiler's uniformity analysis cannot see from row_count's loads.
@diagnostic(off, subgroup_uniformity)
fn x_block(xr: u32, k0: u32) -> XBlock {
    let low = x_vec(xr, k0 + 4u * x_lane);
    let high = x_vec(xr, k0 + 16u + 4u * x_lane);
    return XBlock(
        subgroupBroadcast(low, 0u),
        subgroupBroadcast(low, 1u),
        subgroupBroadcast(low, 2u),
        subgroupBroadcast(low, 3u),
        subgroupBroadcast(high, 0u),
        subgroupBroadcast(high, 1u),
        subgroupBroadcast(high, 2u),
        subgroupBroadcast(high, 3u),
    );
}
