//! What loading a layer gives, from safetensors or GGUF alike: the options ([`LoadOptions`]),
//! the layer on the host ([`LoadedLayer`]) or on the device ([`UploadedLayer`]), and the
//! configuration both formats build from what a checkpoint fixes.

use serde_json::Value;

use super::family::{Routing, RoutingFlags, TensorFacts};
use crate::error::{Error, Result};
use crate::kernels::gemm::WeightDtype;
use crate::kernels::routing::RouteConfig;
use crate::layer::{MoeConfig, MoeLayer, MoeWeights};

/// What the caller knows beyond the weights file.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Tensor-name prefix of the layer (`model.layers.3.`, or the MoE module's
    /// `model.layers.3.mlp.` / `model.layers.3.block_sparse_moe.`); found automatically when
    /// the file holds one MoE layer.
    pub prefix: Option<String>,
    /// The layer by index (`model.layers.N.`), instead of a prefix.
    pub layer: Option<usize>,
    /// A Hugging Face `config.json`, parsed.
    pub config: Option<Value>,
    /// Routing values given outside the config (flags); they must agree with it.
    pub routing: RoutingFlags,
    /// Storage dtype on the device. Default: the expert tensors' dtype, which must then be
    /// the same for every expert tensor; an explicit dtype converts them all.
    pub dtype: Option<WeightDtype>,
}

/// One MoE layer read from a file.
#[derive(Clone, Debug)]
pub struct LoadedLayer {
    /// Shapes, routing and dtypes; `weight_dtype` is the checkpoint's (or the one asked for).
    pub config: MoeConfig,
    /// Host weights (f32): quantised experts as their exact decoded values. To run exactly these
    /// values, give [`MoeLayer::new`] or the CPU reference `MoeConfig { weight_dtype: F32, .. }`:
    /// with a quantised `weight_dtype` they quantise them again by moeflow's own rules, which is
    /// not guaranteed to give the checkpoint's values back (FP8 tiles share one scale per 128 × 128
    /// tile, where moeflow's FP8 quantiser takes one per row and 128 values).
    /// [`upload_checkpoint_layer`](super::upload_checkpoint_layer) uploads the stored blocks
    /// themselves.
    pub weights: MoeWeights,
    /// The routing as the family runs it.
    pub routing: Routing,
    /// The tensor-name prefix of the layer.
    pub prefix: String,
}

/// One MoE layer whose routed experts a placement splits, loaded by
/// [`upload_gguf_layer_placed`](super::upload_gguf_layer_placed): the device's experts
/// uploaded (with the router, grouping, shared expert and combine), the host's read in place
/// from the file `'a` borrows. Run it with
/// [`MoeLayer::plan_hybrid`]`(ctx, io, &placed.host)`.
#[cfg(not(target_arch = "wasm32"))]
#[derive(Debug)]
pub struct PlacedLayer<'a> {
    /// The layer on the device, holding the experts the placement keeps there.
    pub uploaded: UploadedLayer,
    /// The experts the placement puts on the host.
    pub host: crate::host_experts::HostExperts<'a>,
}

/// The placement `place` gives for `cfg`'s expert count, checked to be of that count.
///
/// # Errors
/// `place`'s errors; [`Error::InvalidArgument`] for a placement of another expert count.
#[cfg(not(target_arch = "wasm32"))]
pub(super) fn placement_for(
    cfg: &MoeConfig,
    place: impl FnOnce(u32) -> Result<crate::kernels::gemm::ExpertPlacement>,
) -> Result<crate::kernels::gemm::ExpertPlacement> {
    let placement = place(cfg.route.experts)?;
    if placement.experts() != cfg.route.experts {
        return Err(Error::invalid(format!(
            "a placement of {} experts for a layer of {}",
            placement.experts(),
            cfg.route.experts
        )));
    }
    Ok(placement)
}

/// One MoE layer on the device, loaded by
/// [`upload_checkpoint_layer`](super::upload_checkpoint_layer).
#[derive(Debug)]
pub struct UploadedLayer {
    /// The layer, its expert weights in `layer.config().weight_dtype`.
    pub layer: MoeLayer,
    /// The routing as the family runs it.
    pub routing: Routing,
    /// The tensor-name prefix of the layer.
    pub prefix: String,
}

/// A per-expert layer's configuration: its hidden size, what its tensors hold (sizes,
/// selection bias, shared expert and gate) and the routing resolved for its family.
pub(super) fn layer_config(
    hidden: u32,
    facts: &TensorFacts,
    routing: &Routing,
    weight_dtype: WeightDtype,
) -> Result<MoeConfig> {
    let base = MoeConfig::new(hidden, facts.ffn, facts.experts, routing.k);
    let cfg = MoeConfig {
        route: RouteConfig {
            gating: routing.gating,
            renormalize: routing.renormalize,
            scale: routing.scale,
            bias: facts.bias,
            groups: routing.groups,
            ..base.route
        },
        shared_ffn: facts.shared.map(|(_, fs)| fs),
        shared_gate: facts.shared_gate,
        weight_dtype,
        ..base
    };
    cfg.validate()?;
    Ok(cfg)
}

/// `adjust(loaded)`, which may change the modes (route, combine, kernels, GEMM order) but not
/// what the checkpoint fixed.
pub(super) fn adjusted(loaded: &MoeConfig, adjust: impl FnOnce(MoeConfig) -> MoeConfig) -> Result<MoeConfig> {
    let cfg = adjust(*loaded);
    let fixed = |c: &MoeConfig| {
        (c.ffn, c.shared_ffn, c.shared_gate, c.weight_dtype, c.route, c.activation, c.expert_bias)
    };
    if fixed(&cfg) != fixed(loaded) {
        return Err(Error::invalid(format!(
            "the adjusted configuration ({cfg}) changes what the checkpoint fixed ({loaded})"
        )));
    }
    Ok(cfg)
}
