// Static passes of the MoE task program (moe.wgsl): workgroup i of a pass runs task
// pass_first + i, with the task bodies the persistent queue runs. A pass holds a contiguous
// range of tickets whose tasks do not depend on each other (route tasks; the layout; gate/up
// tiles with the shared expert's; down tiles with the shared expert's; combine tiles), so the
// passes in order give every task its inputs.

@compute @workgroup_size(LANES)
fn moe_pass(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = wid.x + wid.y * nwg.x;
    if i >= program[H_PASS_COUNT] {
        return;
    }
    let tw = program[H_TASK_OFF] + 5u * (program[H_PASS_FIRST] + i);
    run_pass(program[tw], i, program[tw + 1u], lid);
}
