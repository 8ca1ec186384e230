//! The MoE program's shader module and kernels: the reset, the persistent queue and the
//! static passes.

use crate::kernels::routing::PARAMS_BYTES as ROUTE_PARAMS_BYTES;
use crate::pipeline::Access::{Read, ReadWrite, Uniform};
use crate::pipeline::{KernelSpec, Workgroup};
use crate::shader::{Indexing, Override, ShaderSource, wgsl};

/// Bytes of a static pass's ticket range (`pass_range` in wgsl/dag/moe_static.wgsl).
pub(crate) const PASS_RANGE_BYTES: u64 = 16;

pub(super) static MOE_SHADER: ShaderSource = ShaderSource {
    name: "dag/moe",
    parts: &[
        wgsl!("routing/params.wgsl"),
        wgsl!("routing/gate.wgsl"),
        wgsl!("routing/select.wgsl"),
        wgsl!("gemm/half.wgsl"),
        wgsl!("gemm/order.wgsl"),
        wgsl!("dag/moe.wgsl"),
        wgsl!("dag/queue.wgsl"),
        wgsl!("dag/moe_static.wgsl"),
    ],
    entry_points: &["reset_queue", "persistent", "moe_pass"],
    indexing: Indexing::Checked,
};

/// The MoE queue's shader module.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&MOE_SHADER];

pub(super) static MOE_RESET: KernelSpec = KernelSpec {
    shader: &MOE_SHADER,
    entry: "reset_queue",
    bindings: &[(7, Read), (14, ReadWrite)],
    params_bytes: ROUTE_PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};

/// What the persistent workers bind (see wgsl/dag/moe.wgsl).
pub(super) static MOE_PERSISTENT: KernelSpec = KernelSpec {
    shader: &MOE_SHADER,
    entry: "persistent",
    bindings: &[
        (0, Uniform),
        (1, ReadWrite),
        (2, Read),
        (7, Read),
        (8, Read),
        (9, Read),
        (10, Read),
        (12, ReadWrite),
        (13, ReadWrite),
        (14, ReadWrite),
        (15, Read),
    ],
    params_bytes: ROUTE_PARAMS_BYTES,
    workgroup: Workgroup::Override(Override::Lanes),
};

/// What a static pass binds: the workers' bindings and its ticket range (3).
pub(super) static MOE_PASS: KernelSpec = KernelSpec {
    shader: &MOE_SHADER,
    entry: "moe_pass",
    bindings: &[
        (0, Uniform),
        (1, ReadWrite),
        (2, Read),
        (3, Uniform),
        (7, Read),
        (8, Read),
        (9, Read),
        (10, Read),
        (12, ReadWrite),
        (13, ReadWrite),
        (14, ReadWrite),
        (15, Read),
    ],
    params_bytes: ROUTE_PARAMS_BYTES,
    workgroup: Workgroup::Override(Override::Lanes),
};

/// The MoE task program's kernels (for the contract test, `src/contract.rs`).
#[cfg(test)]
pub(crate) static SPECS: &[&KernelSpec] = &[&MOE_RESET, &MOE_PERSISTENT, &MOE_PASS];
