//! The routing kernels' modules, specs and parameter struct.

use bytemuck::{Pod, Zeroable};

use super::config::{GroupLimit, RouteConfig};
use crate::context::Context;
use crate::error::Result;
use crate::pipeline::{Access, KernelSpec, Workgroup};
use crate::shader::{Indexing, Override, ShaderSource, wgsl};

/// Invocations per top-k workgroup. The softmax sum's reduction tree depends on it, so it is
/// part of the numeric contract.
pub const ROUTE_WG: u32 = 64;

/// Invocations per gate-matvec workgroup.
pub(super) const MATVEC_WG: u32 = 64;

pub(super) static GATE_MATVEC_SHADER: ShaderSource = ShaderSource {
    name: "routing/gate_matvec",
    parts: &[wgsl!("routing/params.wgsl"), wgsl!("routing/gate.wgsl"), wgsl!("routing/gate_matvec.wgsl")],
    entry_points: &["gate_matvec"],
    indexing: Indexing::Checked,
};

pub(super) static TOPK_SHADER: ShaderSource = ShaderSource {
    name: "routing/topk",
    parts: &[
        wgsl!("routing/params.wgsl"),
        wgsl!("routing/select.wgsl"),
        wgsl!("routing/select_io.wgsl"),
        wgsl!("routing/topk.wgsl"),
    ],
    entry_points: &["topk"],
    indexing: Indexing::Checked,
};

pub(super) static FUSED_SHADER: ShaderSource = ShaderSource {
    name: "routing/route_fused",
    parts: &[
        wgsl!("routing/params.wgsl"),
        wgsl!("routing/gate.wgsl"),
        wgsl!("routing/select.wgsl"),
        wgsl!("routing/select_io.wgsl"),
        wgsl!("routing/route_fused.wgsl"),
    ],
    entry_points: &["route_fused"],
    indexing: Indexing::Checked,
};

/// The routing family's shader modules.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&GATE_MATVEC_SHADER, &TOPK_SHADER, &FUSED_SHADER];

/// Bytes of `RouteParams` (wgsl/routing/params.wgsl).
pub(crate) const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;

pub(super) static GATE_MATVEC: KernelSpec = KernelSpec {
    shader: &GATE_MATVEC_SHADER,
    entry: "gate_matvec",
    bindings: &[(0, Access::Uniform), (1, Access::ReadWrite), (2, Access::Read), (3, Access::ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Override(Override::MatvecWg),
};

pub(super) static TOPK: KernelSpec = KernelSpec {
    shader: &TOPK_SHADER,
    entry: "topk",
    bindings: &[
        (0, Access::Uniform),
        (3, Access::ReadWrite),
        (4, Access::Read),
        (5, Access::ReadWrite),
        (6, Access::ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(ROUTE_WG),
};

pub(super) static ROUTE_FUSED: KernelSpec = KernelSpec {
    shader: &FUSED_SHADER,
    entry: "route_fused",
    bindings: &[
        (0, Access::Uniform),
        (1, Access::ReadWrite),
        (2, Access::Read),
        (3, Access::ReadWrite),
        (4, Access::Read),
        (5, Access::ReadWrite),
        (6, Access::ReadWrite),
    ],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(ROUTE_WG),
};

/// Every routing kernel (for the requirements and the contract test).
pub(crate) static SPECS: &[&KernelSpec] = &[&GATE_MATVEC, &TOPK, &ROUTE_FUSED];

#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub(super) struct Params {
    pub(super) tokens: u32,
    pub(super) hidden: u32,
    pub(super) experts: u32,
    pub(super) k: u32,
    pub(super) n_group: u32,
    pub(super) topk_group: u32,
    pub(super) scale: f32,
    pub(super) router_bias: u32,
}

/// The routing kernels' uniform parameters (`RouteParams`, wgsl/routing/params.wgsl) for
/// `tokens` tokens of `cfg`.
pub(crate) fn route_params(ctx: &Context, cfg: &RouteConfig, tokens: u32) -> Result<wgpu::Buffer> {
    let g = cfg.groups.unwrap_or(GroupLimit { n_group: 1, topk_group: 1 });
    ctx.uniform(
        "moeflow route params",
        &Params {
            tokens,
            hidden: cfg.hidden,
            experts: cfg.experts,
            k: cfg.k,
            n_group: g.n_group,
            topk_group: g.topk_group,
            scale: cfg.scale,
            router_bias: u32::from(cfg.router_bias),
        },
    )
}
