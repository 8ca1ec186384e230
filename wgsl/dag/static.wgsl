// One static pass: workgroup g runs pass `params.pass_index` for tile g (its scratch slot is
// g). Dispatch boundaries order the passes; nothing here waits on another workgroup.

@compute @workgroup_size(LANES)
fn static_pass(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tile = wid.x + wid.y * nwg.x;
    if tile >= params.tiles {
        return;
    }
    run_pass(params.pass_index, tile, tile, lid);
}
