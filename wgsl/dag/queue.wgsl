// Persistent queue: W worker workgroups claim tasks with one atomic ticket. Tasks are listed
// in topological order, so a task waits only on tasks with lower tickets, which running
// workers have already claimed: progress needs only that a worker that claimed a task keeps
// running, never that an unstarted workgroup gets scheduled.
//
// Per task: the leader invocation polls the task's dependency counter (bounded by
// `spin_limit` polls; a timeout sets STATUS and every worker stops), the workgroup syncs
// through `workgroupUniformLoad` and `storageBarrier`, runs the task's pass (unless
// `work == 0`: the coordination-only diagnostic), checks that no loop was cut short, then
// `storageBarrier` and, unless STATUS is set, the leader adds one to each consumer's counter
// and to DONE. The host reads STATUS and DONE afterwards and reruns the work with static
// passes unless STATUS is 0 and DONE equals the task count.
//
// The module that includes this file provides the task table and the work: `program`
// (read-only u32 words; task i at queue_params().task_off + 5i: pass or kind, tile,
// dependencies to wait for, first consumer word, consumer count), `state` (the atomic state
// words below, then one dependency counter per task), `queue_params()`,
// `run_pass(pass, slot, tile, lid)`, `signal_more(pass, tile)` (the leader's signals that only
// the run knows, after the listed consumers'; it adds to counters with atomicAdd), and the
// override LANES (the workgroup size).

// State words.
const TICKET: u32 = 0u;
const STATUS: u32 = 1u;
const DONE: u32 = 2u;
const MAX_SPINS: u32 = 3u;
const FAULTS: u32 = 4u;
const COUNTERS: u32 = 5u;
const STATUS_TIMEOUT: u32 = 1u;
const STATUS_LOOP_LIMIT: u32 = 2u;

// What the queue reads of its includer's parameters.
struct QueueParams {
    // Tasks in the run.
    tasks: u32,
    // Word of the task table in `program`.
    task_off: u32,
    // Polls one dependency wait may take.
    spin_limit: u32,
    // 0: coordination only (the tasks' work is skipped).
    work: u32,
    // 2, the trip count of the loop that detects cut-short loops.
    canary: u32,
}

var<workgroup> claimed: u32;
var<workgroup> ready: u32;

// Clears the queue before a run. FAULTS is sticky: it counts the earlier runs (since the
// state buffer was last zeroed) that stopped early, so a benchmark can check every timed run
// with one readback at the end. Invocation 0 owns the header words; the rest clear counters.
@compute @workgroup_size(64)
fn reset_queue(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if i == 0u {
        let ran = atomicLoad(&state[TICKET]) != 0u;
        let clean = atomicLoad(&state[STATUS]) == 0u && atomicLoad(&state[DONE]) == queue_params().tasks;
        if ran && !clean {
            atomicAdd(&state[FAULTS], 1u);
        }
        atomicStore(&state[TICKET], 0u);
        atomicStore(&state[STATUS], 0u);
        atomicStore(&state[DONE], 0u);
        atomicStore(&state[MAX_SPINS], 0u);
    } else if i >= COUNTERS && i < COUNTERS + queue_params().tasks {
        atomicStore(&state[i], 0u);
    }
}

fn deps_done(task: u32, need: u32) -> bool {
    return atomicLoad(&state[COUNTERS + task]) >= need;
}

// Eight polls, stopping at the first that finds the task ready.
fn deps_done8(task: u32, need: u32) -> bool {
    return deps_done(task, need) || deps_done(task, need) || deps_done(task, need) || deps_done(task, need)
        || deps_done(task, need) || deps_done(task, need) || deps_done(task, need) || deps_done(task, need);
}

// A loop whose trip count (`canary`, 2) the compiler cannot know: it runs fewer times
// only where the driver cuts loops short. Mesa's llvmpipe caps the loop iterations one
// invocation may run in total (65535, over all its loops), after which every loop exits
// after one iteration; results computed past that point cannot be trusted.
fn loops_intact() -> bool {
    let canary = queue_params().canary;
    var n = 0u;
    for (var i = 0u; i < canary; i++) {
        n += 1u;
    }
    return n == canary;
}

// 64 polls, stopping at the first that finds the task ready.
fn deps_done64(task: u32, need: u32) -> bool {
    return deps_done8(task, need) || deps_done8(task, need) || deps_done8(task, need) || deps_done8(task, need)
        || deps_done8(task, need) || deps_done8(task, need) || deps_done8(task, need) || deps_done8(task, need);
}

// Leader only: waits until `task`'s dependencies are done; 1 when ready, 0 on stop. Polls
// 256 times per loop iteration (fewer iterations against a driver's loop cap), and checks
// readiness again after the loop: leaving the loop proves nothing where loops are cut short.
fn wait_ready(task: u32, need: u32) -> u32 {
    var spins = 0u;
    loop {
        if deps_done64(task, need) || deps_done64(task, need) || deps_done64(task, need) || deps_done64(task, need) {
            break;
        }
        if atomicLoad(&state[STATUS]) != 0u {
            return 0u;
        }
        spins += 256u;
        if spins > queue_params().spin_limit {
            atomicMax(&state[STATUS], STATUS_TIMEOUT);
            return 0u;
        }
    }
    if !deps_done(task, need) {
        atomicMax(&state[STATUS], STATUS_LOOP_LIMIT);
        return 0u;
    }
    atomicMax(&state[MAX_SPINS], spins);
    return 1u;
}

@compute @workgroup_size(LANES)
fn persistent(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let slot = wid.x;
    let q = queue_params();
    // Each round consumes one ticket, so `tasks` rounds always suffice.
    for (var round = 0u; round <= q.tasks; round++) {
        if lid == 0u {
            var t = q.tasks;
            if atomicLoad(&state[STATUS]) == 0u {
                t = min(atomicAdd(&state[TICKET], 1u), q.tasks);
            }
            claimed = t;
        }
        let task = workgroupUniformLoad(&claimed);
        if task >= q.tasks {
            break;
        }
        let tw = q.task_off + 5u * task;
        if lid == 0u {
            ready = wait_ready(task, program[tw + 2u]);
        }
        let go = workgroupUniformLoad(&ready);
        storageBarrier();
        if go == 0u {
            break;
        }
        if q.work != 0u {
            run_pass(program[tw], slot, program[tw + 1u], lid);
        }
        if !loops_intact() {
            atomicMax(&state[STATUS], STATUS_LOOP_LIMIT);
        }
        storageBarrier();
        if lid == 0u && atomicLoad(&state[STATUS]) == 0u {
            let first = program[tw + 3u];
            let count = program[tw + 4u];
            for (var i = 0u; i < count; i++) {
                atomicAdd(&state[COUNTERS + program[first + i]], 1u);
            }
            signal_more(program[tw], program[tw + 1u]);
            atomicAdd(&state[DONE], 1u);
        }
    }
}
