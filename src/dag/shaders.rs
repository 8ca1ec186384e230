//! The row graph's kernels: a static pass (`wgsl/dag/static.wgsl`) and the persistent queue
//! with its reset (`wgsl/dag/queue.wgsl`), both over the program of `wgsl/dag/program.wgsl`.

use super::program::Params;
use crate::pipeline::{Access, KernelSpec, Workgroup};
use crate::shader::{Indexing, Override, ShaderSource, wgsl};
use Access::{Read, ReadWrite, Uniform};

static STATIC_SHADER: ShaderSource = ShaderSource {
    name: "dag/static",
    parts: &[wgsl!("dag/program.wgsl"), wgsl!("dag/static.wgsl")],
    entry_points: &["static_pass"],
    indexing: Indexing::Checked,
};
static QUEUE_SHADER: ShaderSource = ShaderSource {
    name: "dag/queue",
    parts: &[wgsl!("dag/program.wgsl"), wgsl!("dag/row_queue.wgsl"), wgsl!("dag/queue.wgsl")],
    entry_points: &["reset_queue", "persistent"],
    indexing: Indexing::Checked,
};

/// The DAG family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&STATIC_SHADER, &QUEUE_SHADER];

/// Bytes of `DagParams` (wgsl/dag/program.wgsl).
pub(super) const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;
pub(super) static STATIC_PASS: KernelSpec = KernelSpec {
    shader: &STATIC_SHADER,
    entry: "static_pass",
    bindings: &[(0, Uniform), (1, Read), (2, Read), (3, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Override(Override::Lanes),
};
pub(super) static RESET_QUEUE: KernelSpec = KernelSpec {
    shader: &QUEUE_SHADER,
    entry: "reset_queue",
    bindings: &[(0, Uniform), (4, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};
pub(super) static PERSISTENT: KernelSpec = KernelSpec {
    shader: &QUEUE_SHADER,
    entry: "persistent",
    bindings: &[(0, Uniform), (1, Read), (2, Read), (3, ReadWrite), (4, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Override(Override::Lanes),
};
/// The run's kernels (for the contract test, `src/contract.rs`).
#[cfg(test)]
pub(crate) static SPECS: &[&KernelSpec] = &[&STATIC_PASS, &RESET_QUEUE, &PERSISTENT];
