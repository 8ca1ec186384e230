// Static passes of the MoE task program (moe.wgsl): workgroup i of a pass runs the task of
// ticket pass_range.first + i, with the task bodies the persistent queue runs. A pass holds a
// contiguous range of tickets whose tasks do not depend on each other (route tasks; the
// layout; the projections' first halves or whole coarse tiles; their second halves; combine
// tiles), so the passes in order give every task its inputs.

// The pass's tickets: first, count (and two words of padding).
@group(0) @binding(3) var<uniform> pass_range: vec4<u32>;

@compute @workgroup_size(LANES)
fn moe_pass(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = wid.x + wid.y * nwg.x;
    if i >= pass_range.y {
        return;
    }
    let tw = program[H_TASK_OFF] + 5u * (pass_range.x + i);
    run_pass(program[tw], i, program[tw + 1u], lid);
}
