// The row program's side of the persistent queue (queue.wgsl): its state words and
// parameters.

@group(0) @binding(4) var<storage, read_write> state: array<atomic<u32>>;

fn queue_params() -> QueueParams {
    return QueueParams(params.tasks, params.task_off, params.spin_limit, params.work, params.canary);
}

// Row tasks signal only their listed consumers.
fn signal_more(pass_id: u32, tile: u32) {}
