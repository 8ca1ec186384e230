//! MoE layers from GGUF files (llama.cpp's format), with llama.cpp's tensor names and its
//! per-architecture routing:
//!
//! | tensor (`blk.N.` + ) | ggml dims (innermost first) | as |
//! |---|---|---|
//! | `ffn_gate_inp.weight` | `[H, E]` | router `[E, H]` |
//! | `ffn_gate_exps.weight`, `ffn_up_exps.weight` | `[H, F, E]` | gate, up `[E, F, H]` |
//! | `ffn_down_exps.weight` | `[F, H, E]` | down `[E, H, F]` |
//! | `exp_probs_b.bias` | `[E]` | DeepSeek-V3's selection bias |
//! | `ffn_gate_shexp.weight`, `ffn_up_shexp.weight`, `ffn_down_shexp.weight` | `[H, Fs]`, `[H, Fs]`, `[Fs, H]` | shared expert |
//! | `ffn_gate_inp_shexp.weight` | `[H]` | Qwen2-MoE's shared-expert gate |
//! | `ffn_gate_inp.bias` | `[E]` | gpt-oss's router bias |
//! | `ffn_gate_exps.bias`, `ffn_up_exps.bias`, `ffn_down_exps.bias` | `[F, E]`, `[F, E]`, `[H, E]` | gpt-oss's expert biases |
//!
//! The architecture decides the family and its routing (`gguf_config.rs`); the keys read
//! become the family's config.json keys and go through the same resolution
//! ([`super::family`]), so the checks and flags of a safetensors checkpoint apply.
//!
//! Expert tensors may be F32, F16, BF16, Q8_0, Q4_0 or MXFP4, one type for every expert tensor
//! of the layer (routed and shared) unless a dtype is asked for. The quantised ones are
//! uploaded as stored, one expert at a time ([`ExpertWeights::stream`]; ggml's MXFP4 blocks
//! regrouped by [`quant::mxfp4_from_ggml`]); the host load gives their exact decoded values.
//! Other ggml types (k-quants, i-quants) are refused by name.

use std::collections::BTreeMap;

use super::family::{self, Family, SharedNames, TensorFacts};
use super::gguf_config::config_of;
use super::loaded::{LoadOptions, LoadedLayer, UploadedLayer, adjusted, layer_config};
#[cfg(not(target_arch = "wasm32"))]
use super::loaded::{PlacedLayer, placement_for};
use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use crate::host_experts::{HostBias, HostExperts, HostProjection};
use crate::kernels::gemm::{
    ExpertBias, ExpertFfn, ExpertPlacement, ExpertWeights, QuantisedValues, STREAM_CHUNK, StoredValues,
    WeightDtype,
};
use crate::kernels::routing::RouteConfig;
use crate::layer::{ExpertBiasValues, MoeConfig, MoeLayer, MoeWeights, RouterWeights};
use crate::quant;
use crate::weights::gguf::{GgmlType, Gguf};

const ROUTER: &str = "ffn_gate_inp.weight";
const EXPERTS: [&str; 3] = ["ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"];
const SHARED: [&str; 3] = ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"];
const SHARED_GATE: &str = "ffn_gate_inp_shexp.weight";
const SELECTION_BIAS: &str = "exp_probs_b.bias";
/// gpt-oss's router bias and expert biases (gate, up `[F, E]`, down `[H, E]` in ggml dims).
const ROUTER_BIAS: &str = "ffn_gate_inp.bias";
const EXPERT_BIASES: [&str; 3] = ["ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias"];

/// The MoE layers of a GGUF file: block index to tensor prefix (`blk.3.`), for every block
/// with a router (`blk.N.ffn_gate_inp.weight`).
pub fn gguf_moe_layers(g: &Gguf<'_>) -> BTreeMap<usize, String> {
    g.tensors
        .iter()
        .filter_map(|t| t.name.strip_suffix(ROUTER))
        .filter_map(|p| Some((p.strip_prefix("blk.")?.strip_suffix('.')?.parse().ok()?, p.to_string())))
        .collect()
}

/// The block's prefix: by `opts.prefix` (`blk.3.`), by `opts.layer`, or the file's only MoE
/// layer.
fn block_prefix(g: &Gguf<'_>, opts: &LoadOptions) -> Result<String> {
    let source = g.source();
    let layers = gguf_moe_layers(g);
    let have = || {
        let l: Vec<String> = layers.keys().map(usize::to_string).collect();
        if l.is_empty() { "none".to_string() } else { l.join(", ") }
    };
    let prefix = match (&opts.prefix, opts.layer) {
        (Some(_), Some(_)) => return Err(Error::invalid("give the layer by prefix or by index, not both")),
        (Some(p), None) => {
            let p = if p.ends_with('.') { p.clone() } else { format!("{p}.") };
            if !layers.values().any(|l| *l == p) {
                return Err(Error::invalid(format!(
                    "`{p}` is not a MoE block of {source} (blocks are `blk.N.`); its MoE blocks are: {}",
                    have()
                )));
            }
            p
        }
        (None, Some(l)) => match layers.get(&l) {
            Some(p) => p.clone(),
            None => {
                return Err(Error::invalid(format!(
                    "layer {l} is not a MoE layer of {source}; its MoE layers are: {}",
                    have()
                )));
            }
        },
        (None, None) => match layers.len() {
            1 => layers.values().next().cloned().unwrap_or_default(),
            0 => {
                let per_expert = g.tensors.iter().any(|t| t.name.contains(".ffn_gate.0."));
                return Err(Error::invalid(format!(
                    "{source} has no MoE layer (no `blk.N.{ROUTER}`){}",
                    if per_expert {
                        "; it stores experts one tensor each (`ffn_gate.0.weight`), an old layout: convert it again with a current llama.cpp"
                    } else {
                        ""
                    }
                )));
            }
            _ => {
                return Err(Error::invalid(format!(
                    "{source} holds several MoE layers; pick one by index (--layer): {}",
                    have()
                )));
            }
        },
    };
    for name in EXPERTS {
        if g.tensor(&format!("{prefix}{name}")).is_none() {
            let per_expert = g.tensors.iter().any(|t| t.name.starts_with(&format!("{prefix}ffn_gate.0.")));
            return Err(Error::invalid(format!(
                "missing tensor `{prefix}{name}` in {source}{}",
                if per_expert {
                    " (its experts are one tensor each, `ffn_gate.N.weight`, an old layout: convert it again with a current llama.cpp)"
                } else {
                    ""
                }
            )));
        }
    }
    Ok(prefix)
}

/// The device dtype that holds a ggml type exactly.
fn stored_dtype(name: &str, ty: GgmlType) -> Result<WeightDtype> {
    match ty {
        GgmlType::F32 => Ok(WeightDtype::F32),
        GgmlType::F16 => Ok(WeightDtype::F16),
        GgmlType::Bf16 => Ok(WeightDtype::Bf16),
        GgmlType::Q8_0 => Ok(WeightDtype::Q8_0),
        GgmlType::Q4_0 => Ok(WeightDtype::Q4_0),
        GgmlType::Mxfp4 => Ok(WeightDtype::Mxfp4),
        GgmlType::Other(id) => Err(Error::invalid(format!(
            "tensor `{name}` is ggml type {id}; expert tensors of F32, F16, BF16, Q8_0, Q4_0 and MXFP4 are read"
        ))),
    }
}

/// A GGUF layer as found in its tensor table, with its small tensors read.
struct Plan<'g, 'a> {
    g: &'g Gguf<'a>,
    prefix: String,
    cfg: MoeConfig,
    routing: super::family::Routing,
    router: RouterWeights,
    /// gpt-oss's expert biases.
    expert_bias: Option<ExpertBiasValues>,
}

impl<'a> Plan<'_, 'a> {
    fn name(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// Names and `[n, k]` shapes of the routed (or shared) gate, up and down projections.
    fn projections(&self, shared: bool) -> [(String, [usize; 2]); 3] {
        let (h, f) = (self.cfg.route.hidden as usize, self.cfg.ffn as usize);
        let f = if shared { self.cfg.shared_ffn.unwrap_or(0) as usize } else { f };
        let names = if shared { SHARED } else { EXPERTS };
        [0, 1, 2].map(|p| (self.name(names[p]), if p == 2 { [h, f] } else { [f, h] }))
    }

    /// The stored bytes and type of a projection tensor.
    fn stored(&self, name: &str) -> Result<(&'a [u8], GgmlType)> {
        let t = self.g.tensor(name).ok_or_else(|| Error::invalid(format!("missing tensor `{name}`")))?;
        Ok((self.g.tensor_data(name)?, t.ty))
    }
}

/// `[dims..]` of tensor `name` (innermost first), which must equal `want`.
fn check_dims(g: &Gguf<'_>, name: &str, want: &[u64]) -> Result<GgmlType> {
    let t = g
        .tensor(name)
        .ok_or_else(|| Error::invalid(format!("missing tensor `{name}` (expected ggml dims {want:?})")))?;
    if t.dims != want {
        return Err(Error::shape(
            format!("tensor {name}"),
            format!("ggml dims {want:?} (innermost first)"),
            format!("{:?}", t.dims),
        ));
    }
    Ok(t.ty)
}

fn plan<'g, 'a>(g: &'g Gguf<'a>, opts: &LoadOptions) -> Result<Plan<'g, 'a>> {
    let source = g.source();
    if opts.config.is_some() {
        return Err(Error::invalid(
            "a GGUF file carries its own configuration in its metadata; --config applies to safetensors checkpoints",
        ));
    }
    let prefix = block_prefix(g, opts)?;
    let (family, config) = config_of(g)?;
    let name = |rest: &str| format!("{prefix}{rest}");
    let router_t =
        g.tensor(&name(ROUTER)).ok_or_else(|| Error::invalid(format!("missing `{prefix}{ROUTER}`")))?;
    let (h, e) = match *router_t.dims {
        [h, e] if h > 0 && e > 0 => (h, e),
        ref d => {
            return Err(Error::shape(
                format!("tensor {}", name(ROUTER)),
                "ggml dims [hidden, experts]",
                format!("{d:?}"),
            ));
        }
    };
    let gate_t = g
        .tensor(&name(EXPERTS[0]))
        .ok_or_else(|| Error::invalid(format!("missing `{prefix}{}`", EXPERTS[0])))?;
    let f = match *gate_t.dims {
        [gh, f, ge] if gh == h && ge == e && f > 0 => f,
        ref d => {
            return Err(Error::shape(
                format!("tensor {}", name(EXPERTS[0])),
                format!("ggml dims [{h}, ffn, {e}]"),
                format!("{d:?}"),
            ));
        }
    };
    let mut types: Vec<(GgmlType, String)> = Vec::new();
    let mut note = |ty: GgmlType, n: String| -> Result<()> {
        stored_dtype(&n, ty)?;
        if !types.iter().any(|(t, _)| *t == ty) {
            types.push((ty, n));
        }
        Ok(())
    };
    for (rest, dims) in [(EXPERTS[0], [h, f, e]), (EXPERTS[1], [h, f, e]), (EXPERTS[2], [f, h, e])] {
        note(check_dims(g, &name(rest), &dims)?, name(rest))?;
    }
    let shared_ffn = match g.tensor(&name(SHARED[0])) {
        Some(t) => {
            let fs = match *t.dims {
                [gh, fs] if gh == h && fs > 0 => fs,
                ref d => {
                    return Err(Error::shape(
                        format!("tensor {}", name(SHARED[0])),
                        format!("ggml dims [{h}, shared ffn]"),
                        format!("{d:?}"),
                    ));
                }
            };
            for (rest, dims) in [(SHARED[0], [h, fs]), (SHARED[1], [h, fs]), (SHARED[2], [fs, h])] {
                note(check_dims(g, &name(rest), &dims)?, name(rest))?;
            }
            Some(fs)
        }
        None => None,
    };
    let shared_gate = match g.tensor(&name(SHARED_GATE)) {
        Some(_) => {
            check_dims(g, &name(SHARED_GATE), &[h])?;
            Some(g.tensor_f32(&name(SHARED_GATE))?)
        }
        None => None,
    };
    let bias = match g.tensor(&name(SELECTION_BIAS)) {
        Some(_) => {
            check_dims(g, &name(SELECTION_BIAS), &[e])?;
            Some(g.tensor_f32(&name(SELECTION_BIAS))?)
        }
        None => None,
    };
    let weight_dtype = match (opts.dtype, types.as_slice()) {
        (Some(d), _) => d,
        (None, [(t, n)]) => stored_dtype(n, *t)?,
        (None, [(t0, n0), (t1, n1), ..]) => {
            return Err(Error::invalid(format!(
                "expert tensors mix ggml types (`{n0}` is {t0:?}, `{n1}` is {t1:?}): pass a dtype (--dtype) to convert them all"
            )));
        }
        (None, []) => WeightDtype::F32,
    };
    let dim = |v: u64, what: &str| {
        u32::try_from(v).map_err(|_| Error::limit(what, v, u32::MAX.into(), "u32 dimensions"))
    };
    let facts = TensorFacts {
        mixtral_names: family == Family::Mixtral,
        gpt_oss_names: family == Family::GptOss,
        experts: dim(e, "experts")?,
        ffn: dim(f, "expert FFN size")?,
        bias: bias.is_some(),
        shared: match shared_ffn {
            Some(fs) => Some((
                if family == Family::Qwen2Moe { SharedNames::Qwen } else { SharedNames::DeepSeek },
                dim(fs, "shared FFN size")?,
            )),
            None => None,
        },
        shared_gate: shared_gate.is_some(),
    };
    if family == Family::DeepseekV3 && config.get("n_group").is_none() && opts.routing.groups.is_none() {
        return Err(Error::invalid(format!(
            "{source} has no `deepseek2.expert_group_count` / `expert_group_used_count`, and DeepSeek-V3 routes within groups: pass --n-group and --topk-group (1 and 1 for none)"
        )));
    }
    let routing = family::resolve(Some(&config), &opts.routing, &facts)
        .map_err(|e| Error::invalid(format!("{source} (routing from its metadata): {e}")))?;
    let cfg = layer_config(dim(h, "hidden size")?, &facts, &routing, weight_dtype)?;
    // gpt-oss: the affine router, biases on every expert projection, the clamped SwiGLU.
    let (cfg, router_bias, expert_bias) = if family == Family::GptOss {
        let read = |rest: &str, dims: &[u64]| -> Result<Vec<f32>> {
            check_dims(g, &name(rest), dims)?;
            g.tensor_f32(&name(rest))
        };
        let router_bias = read(ROUTER_BIAS, &[e])?;
        let bias = ExpertBiasValues {
            gate: read(EXPERT_BIASES[0], &[f, e])?,
            up: read(EXPERT_BIASES[1], &[f, e])?,
            down: read(EXPERT_BIASES[2], &[h, e])?,
        };
        let cfg = MoeConfig {
            route: RouteConfig { router_bias: true, ..cfg.route },
            activation: routing.activation,
            expert_bias: true,
            ..cfg
        };
        cfg.validate()?;
        (cfg, Some(router_bias), Some(bias))
    } else {
        (cfg, None, None)
    };
    let router = RouterWeights { router: g.tensor_f32(&name(ROUTER))?, bias, shared_gate, router_bias };
    router.check(&cfg)?;
    Ok(Plan { g, prefix, cfg, routing, router, expert_bias })
}

/// Loads one MoE layer of a parsed GGUF file to host f32: its
/// family and routing from the metadata, its weights decoded exactly. The layer is chosen by
/// `opts.layer` or `opts.prefix` (`blk.N.`), or is the file's only MoE layer; `opts.config`
/// must be None (the metadata is the configuration), `opts.routing` flags must agree with it.
///
/// # Errors
/// An architecture that is not a MoE family moeflow runs; a missing or misshapen tensor
/// (every one checked against the router's and the metadata's sizes); expert tensors of a
/// type not read or of mixed types without `opts.dtype`; routing keys this family would run
/// differently; a layer index that is not a MoE layer.
pub fn load_gguf_layer(g: &Gguf<'_>, opts: &LoadOptions) -> Result<LoadedLayer> {
    let p = plan(g, opts)?;
    let host = |shared: bool| -> Result<[Vec<f32>; 3]> {
        let [a, b, c] = p.projections(shared).map(|(n, _)| g.tensor_f32(&n));
        Ok([a?, b?, c?])
    };
    let [gate, up, down] = host(false)?;
    let shared = match p.cfg.shared_ffn {
        Some(_) => Some(host(true)?.into()),
        None => None,
    };
    let RouterWeights { router, bias, shared_gate, router_bias } = p.router;
    let weights = MoeWeights {
        router,
        bias,
        gate,
        up,
        down,
        shared,
        shared_gate,
        router_bias,
        expert_bias: p.expert_bias,
    };
    weights.check(&p.cfg)?;
    Ok(LoadedLayer { config: p.cfg, weights, routing: p.routing, prefix: p.prefix })
}

/// Loads one MoE layer of a parsed GGUF file straight to the device: the checks of
/// [`load_gguf_layer`] first, then each projection tensor from the file's bytes, one expert at
/// a time ([`ExpertWeights::stream`]): as stored when the layer keeps its type (Q8_0 and Q4_0
/// blocks regrouped into the device layout), else converted (quantised blocks decoded to f32
/// first). `adjust` may change the configuration's modes as in
/// [`super::upload_checkpoint_layer`].
///
/// # Errors
/// As [`load_gguf_layer`]; an `adjust` that changes what the file fixed; device errors.
#[cfg(not(target_arch = "wasm32"))]
pub fn upload_gguf_layer(
    ctx: &Context,
    g: &Gguf<'_>,
    opts: &LoadOptions,
    adjust: impl FnOnce(MoeConfig) -> MoeConfig,
) -> Result<UploadedLayer> {
    pollster::block_on(upload_with(ctx, g, opts, adjust, Driver::Inline))
}

/// [`upload_gguf_layer`] without blocking the awaiting thread: the uploads' flushes (and the
/// tuner's runs, where the configuration tunes) are awaited, a thread of moeflow's polling the
/// device.
///
/// # Errors
/// As [`upload_gguf_layer`].
pub async fn upload_gguf_layer_async(
    ctx: &Context,
    g: &Gguf<'_>,
    opts: &LoadOptions,
    adjust: impl FnOnce(MoeConfig) -> MoeConfig,
) -> Result<UploadedLayer> {
    upload_with(ctx, g, opts, adjust, Driver::Await).await
}

/// [`upload_gguf_layer`] with the routed experts that `place` (given the layer's expert count)
/// puts on the host left in the file (read in place, in their stored type, never converted or
/// uploaded) as the returned [`PlacedLayer::host`], the others streamed to the device. The
/// layer keeps the file's type (`opts.dtype` must be None or the same).
///
/// # Errors
/// As [`upload_gguf_layer`]; `place`'s errors; [`Error::InvalidArgument`] for a placement of
/// another expert count, or a dtype other than the file's. The host reads F32, F16, BF16,
/// Q8_0, Q4_0 and ggml's MXFP4 tensors in place, gpt-oss's expert biases copied.
#[cfg(not(target_arch = "wasm32"))]
pub fn upload_gguf_layer_placed<'a>(
    ctx: &Context,
    g: &Gguf<'a>,
    opts: &LoadOptions,
    place: impl FnOnce(u32) -> Result<ExpertPlacement>,
    adjust: impl FnOnce(MoeConfig) -> MoeConfig,
) -> Result<PlacedLayer<'a>> {
    pollster::block_on(async {
        let p = plan(g, opts)?;
        let cfg = adjusted(&p.cfg, adjust)?;
        let placement = &placement_for(&cfg, place)?;
        let host = host_experts(&p, &cfg, placement)?;
        let experts = stream_ffn(ctx, &p, &cfg, false, Some(placement), Driver::Inline).await?;
        let shared = match cfg.shared_ffn {
            Some(_) => Some(stream_ffn(ctx, &p, &cfg, true, None, Driver::Inline).await?),
            None => None,
        };
        let layer = MoeLayer::with_experts_with(ctx, cfg, &p.router, experts, shared, Driver::Inline).await?;
        Ok(PlacedLayer { uploaded: UploadedLayer { layer, routing: p.routing, prefix: p.prefix }, host })
    })
}

/// The routed experts `placement` puts on the host, read in place from `p`'s file.
#[cfg(not(target_arch = "wasm32"))]
fn host_experts<'a>(
    p: &Plan<'_, 'a>,
    cfg: &MoeConfig,
    placement: &ExpertPlacement,
) -> Result<HostExperts<'a>> {
    let e = cfg.route.experts;
    let project = |(name, [n, k]): (String, [usize; 2])| -> Result<HostProjection<'a>> {
        let (bytes, ty) = p.stored(&name)?;
        let dtype = stored_dtype(&name, ty)?;
        if dtype != cfg.weight_dtype {
            return Err(Error::invalid(format!(
                "tensor `{name}` is {dtype:?}; with experts on the host the layer keeps the file's type, \
                 not {:?}",
                cfg.weight_dtype
            )));
        }
        let per = bytes.len() / e as usize;
        let mut projection = HostProjection::new([e, n as u32, k as u32])?;
        for x in placement.host_experts() {
            let bytes = &bytes[x as usize * per..(x as usize + 1) * per];
            match dtype {
                // ggml's MXFP4 blocks, read as they lie.
                WeightDtype::Mxfp4 => projection.hold_ggml_mxfp4(x, bytes)?,
                WeightDtype::Q8_0 => {
                    projection.hold(x, StoredValues::Quantised(QuantisedValues::Q8_0(bytes)))?
                }
                WeightDtype::Q4_0 => {
                    projection.hold(x, StoredValues::Quantised(QuantisedValues::Q4_0(bytes)))?
                }
                dtype => projection.hold(x, StoredValues::Float { dtype, bytes })?,
            }
        }
        Ok(projection)
    };
    let [a, b, c] = p.projections(false);
    let host = HostExperts::new(project(a)?, project(b)?, project(c)?, cfg.gemm_order, cfg.activation)?;
    match &p.expert_bias {
        Some(b) => host.with_bias(HostBias { gate: &b.gate, up: &b.up, down: &b.down }),
        None => Ok(host),
    }
}

async fn upload_with(
    ctx: &Context,
    g: &Gguf<'_>,
    opts: &LoadOptions,
    adjust: impl FnOnce(MoeConfig) -> MoeConfig,
    driver: Driver,
) -> Result<UploadedLayer> {
    let p = plan(g, opts)?;
    let cfg = adjusted(&p.cfg, adjust)?;
    let experts = stream_ffn(ctx, &p, &cfg, false, None, driver).await?;
    let shared = match cfg.shared_ffn {
        Some(_) => Some(stream_ffn(ctx, &p, &cfg, true, None, driver).await?),
        None => None,
    };
    let layer = MoeLayer::with_experts_with(ctx, cfg, &p.router, experts, shared, driver).await?;
    Ok(UploadedLayer { layer, routing: p.routing, prefix: p.prefix })
}

/// The routed (or `shared`) expert projections of `p`, streamed to the device in
/// `cfg.weight_dtype` one expert at a time, with the routed experts' biases: of the routed
/// experts, those `placement` keeps on the device (every one without a placement).
async fn stream_ffn(
    ctx: &Context,
    p: &Plan<'_, '_>,
    cfg: &MoeConfig,
    shared: bool,
    placement: Option<&ExpertPlacement>,
    driver: Driver,
) -> Result<ExpertFfn> {
    let e = if shared { 1 } else { cfg.route.experts };
    let upload = async |(name, [n, k]): (String, [usize; 2])| -> Result<ExpertWeights> {
        let (bytes, ty) = p.stored(&name)?;
        let stored = stored_dtype(&name, ty)?;
        // ggml's MXFP4 blocks regrouped as gpt-oss's codes and scales (the same values).
        let mxfp4 = match ty {
            GgmlType::Mxfp4 => Some(
                quant::mxfp4_from_ggml(bytes)
                    .map_err(|err| Error::invalid(format!("tensor `{name}`: {err}")))?,
            ),
            _ => None,
        };
        let per = bytes.len() / e as usize;
        let values = |i: u32| {
            let i = i as usize;
            let bytes = &bytes[i * per..(i + 1) * per];
            Ok(match (stored, &mxfp4) {
                (WeightDtype::Q8_0, _) => StoredValues::Quantised(QuantisedValues::Q8_0(bytes)),
                (WeightDtype::Q4_0, _) => StoredValues::Quantised(QuantisedValues::Q4_0(bytes)),
                (_, Some((codes, scales))) => {
                    let blocks = n * k / quant::BLOCK_VALUES;
                    let codes =
                        &codes[i * blocks * quant::MXFP4_BLOCK_BYTES..][..blocks * quant::MXFP4_BLOCK_BYTES];
                    let scales = &scales[i * blocks..][..blocks];
                    StoredValues::Quantised(QuantisedValues::Mxfp4 { codes, scales })
                }
                (dtype, None) => StoredValues::Float { dtype, bytes },
            })
        };
        let shape = [e, n as u32, k as u32];
        ExpertWeights::stream_with(
            ctx,
            cfg.weight_dtype,
            shape,
            placement,
            values,
            |_| {},
            STREAM_CHUNK,
            driver,
        )
        .await
    };
    let [a, b, c] = p.projections(shared);
    let ffn = ExpertFfn::new(upload(a).await?, upload(b).await?, upload(c).await?)?;
    match (&p.expert_bias, shared) {
        (Some(b), false) => {
            let (f, h) = (cfg.ffn, cfg.route.hidden);
            ffn.with_bias(ExpertBias::new(ctx, &b.gate, &b.up, &b.down, [e, f, h])?)
        }
        _ => Ok(ffn),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm::Activation;
    use crate::kernels::routing::{Gating, GroupLimit};
    use crate::weights::RoutingFlags;
    use crate::weights::gguf::{GgufValue, GgufWriter};

    const H: u64 = 32;
    const F: u64 = 16;
    const E: u64 = 4;

    fn f32_bytes(n: u64, scale: f32) -> Vec<u8> {
        (0..n).flat_map(|i| ((i % 7) as f32 * scale - 0.3).to_le_bytes()).collect()
    }

    /// A one-block file of `arch` with F32 tensors and `meta` pairs besides the sizes.
    fn file(arch: &str, meta: &[(&str, GgufValue)]) -> GgufWriter {
        let a = |key: &str| format!("{arch}.{key}");
        let mut w = GgufWriter::default()
            .metadata("general.architecture", GgufValue::Str(arch.into()))
            .metadata(&a("expert_count"), GgufValue::U32(E as u32))
            .metadata(&a("expert_used_count"), GgufValue::U32(2))
            .metadata(&a("expert_feed_forward_length"), GgufValue::U32(F as u32));
        for (k, v) in meta {
            w = w.metadata(&a(k), v.clone());
        }
        w.tensor("blk.0.ffn_gate_inp.weight", &[H, E], GgmlType::F32, f32_bytes(H * E, 0.1))
            .tensor("blk.0.ffn_gate_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.01))
            .tensor("blk.0.ffn_up_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.02))
            .tensor("blk.0.ffn_down_exps.weight", &[F, H, E], GgmlType::F32, f32_bytes(H * F * E, 0.03))
    }

    fn load(w: &GgufWriter, opts: &LoadOptions) -> Result<LoadedLayer> {
        let bytes = w.to_bytes();
        load_gguf_layer(&Gguf::parse(&bytes, "m.gguf")?, opts)
    }

    fn err(w: &GgufWriter, opts: &LoadOptions) -> String {
        match load(w, opts) {
            Ok(l) => panic!("loaded {}", l.config),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn each_architecture_runs_llama_cpps_routing() {
        let none = LoadOptions::default();
        let l = load(&file("llama", &[]), &none).unwrap();
        assert_eq!((l.routing.family, l.config.route.renormalize), (Family::Mixtral, true));
        assert_eq!([l.config.route.hidden, l.config.ffn, l.config.route.experts], [32, 16, 4]);
        assert_eq!((l.config.weight_dtype, l.prefix.as_str()), (WeightDtype::F32, "blk.0."));
        let l = load(&file("qwen3moe", &[]), &none).unwrap();
        assert_eq!((l.routing.family, l.config.route.renormalize), (Family::Qwen3Moe, true));
        let l = load(&file("olmoe", &[]), &none).unwrap();
        assert_eq!((l.routing.family, l.config.route.renormalize), (Family::Olmoe, false));
        let v2 = file("deepseek2", &[("expert_weights_scale", GgufValue::F32(16.0))]);
        let l = load(&v2, &none).unwrap();
        assert_eq!(l.routing.family, Family::DeepseekV2);
        assert_eq!(
            (l.config.route.gating, l.config.route.renormalize, l.config.route.scale),
            (Gating::Softmax, false, 16.0)
        );
        let v3 = file(
            "deepseek2",
            &[
                ("expert_gating_func", GgufValue::U32(2)),
                ("expert_weights_norm", GgufValue::Bool(true)),
                ("expert_weights_scale", GgufValue::F32(2.5)),
                ("expert_group_count", GgufValue::U32(2)),
                ("expert_group_used_count", GgufValue::U32(1)),
            ],
        )
        .tensor("blk.0.exp_probs_b.bias", &[E], GgmlType::F32, f32_bytes(E, 0.5));
        let l = load(&v3, &none).unwrap();
        assert_eq!(l.routing.family, Family::DeepseekV3);
        let r = l.config.route;
        assert_eq!((r.gating, r.renormalize, r.scale, r.bias), (Gating::Sigmoid, true, 2.5, true));
        assert_eq!(r.groups, Some(GroupLimit { n_group: 2, topk_group: 1 }));
        // gpt-oss: the affine router, biased experts, the clamped SwiGLU; MXFP4 as stored
        // (F = 32: MXFP4 rows are whole blocks).
        const F: u64 = 32;
        let mxfp4 = |scale: u8| {
            let blocks = (H * F * E) as usize / quant::BLOCK_VALUES;
            (0..blocks)
                .flat_map(|b| [scale].into_iter().chain((0..16).map(move |j| (b * 16 + j) as u8)))
                .collect()
        };
        let oss = |scale: u8| {
            GgufWriter::default()
                .metadata("general.architecture", GgufValue::Str("gpt-oss".into()))
                .metadata("gpt-oss.expert_count", GgufValue::U32(E as u32))
                .metadata("gpt-oss.expert_used_count", GgufValue::U32(2))
                .metadata("gpt-oss.expert_feed_forward_length", GgufValue::U32(F as u32))
                .tensor("blk.0.ffn_gate_inp.weight", &[H, E], GgmlType::F32, f32_bytes(H * E, 0.1))
                .tensor("blk.0.ffn_gate_inp.bias", &[E], GgmlType::F32, f32_bytes(E, 0.2))
                .tensor("blk.0.ffn_gate_exps.weight", &[H, F, E], GgmlType::Mxfp4, mxfp4(scale))
                .tensor("blk.0.ffn_up_exps.weight", &[H, F, E], GgmlType::Mxfp4, mxfp4(127))
                .tensor("blk.0.ffn_down_exps.weight", &[F, H, E], GgmlType::Mxfp4, mxfp4(120))
                .tensor("blk.0.ffn_gate_exps.bias", &[F, E], GgmlType::F32, f32_bytes(F * E, 0.3))
                .tensor("blk.0.ffn_up_exps.bias", &[F, E], GgmlType::F32, f32_bytes(F * E, 0.4))
                .tensor("blk.0.ffn_down_exps.bias", &[H, E], GgmlType::F32, f32_bytes(H * E, 0.5))
        };
        let l = load(&oss(130), &none).unwrap();
        assert_eq!(l.routing.family, Family::GptOss);
        let (c, r) = (l.config, l.config.route);
        assert_eq!(
            (c.weight_dtype, c.activation, c.expert_bias),
            (WeightDtype::Mxfp4, Activation::GPT_OSS, true)
        );
        assert_eq!((r.gating, r.renormalize, r.router_bias), (Gating::Softmax, true, true));
        let b = l.weights.expert_bias.as_ref().unwrap();
        assert_eq!((b.gate.len(), b.down.len()), ((F * E) as usize, (H * E) as usize));
        let (codes, scales) = quant::mxfp4_from_ggml(&mxfp4(130)).unwrap();
        assert!(l.weights.gate == quant::mxfp4_dequantize(&codes, &scales).unwrap());
        let e = err(&oss(255), &none);
        assert!(e.contains("blk.0.ffn_gate_exps.weight") && e.contains("255"), "{e}");
        let e = err(
            &oss(130).tensor("blk.0.ffn_up_exps.bias", &[F, 2], GgmlType::F32, f32_bytes(F * 2, 0.4)),
            &none,
        );
        assert!(e.contains("ffn_up_exps.bias"), "{e}");
        // Quantised expert tensors keep their type; an explicit dtype converts them.
        let l =
            load(&file("qwen3moe", &[]), &LoadOptions { dtype: Some(WeightDtype::Bf16), ..none }).unwrap();
        assert_eq!(l.config.weight_dtype, WeightDtype::Bf16);
    }

    #[test]
    fn blocks_are_found_by_index_prefix_or_alone() {
        let two = file("qwen3moe", &[])
            .tensor("blk.3.ffn_gate_inp.weight", &[H, E], GgmlType::F32, f32_bytes(H * E, 0.1))
            .tensor("blk.3.ffn_gate_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.01))
            .tensor("blk.3.ffn_up_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.01))
            .tensor("blk.3.ffn_down_exps.weight", &[F, H, E], GgmlType::F32, f32_bytes(H * F * E, 0.01));
        let bytes = two.to_bytes();
        let g = Gguf::parse(&bytes, "m.gguf").unwrap();
        assert_eq!(gguf_moe_layers(&g).keys().copied().collect::<Vec<_>>(), [0, 3]);
        assert!(err(&two, &LoadOptions::default()).contains("several MoE layers"));
        let by_index = load(&two, &LoadOptions { layer: Some(3), ..LoadOptions::default() }).unwrap();
        assert_eq!(by_index.prefix, "blk.3.");
        let by_prefix =
            load(&two, &LoadOptions { prefix: Some("blk.3".into()), ..LoadOptions::default() }).unwrap();
        assert_eq!(by_prefix.prefix, "blk.3.");
        let e = err(&two, &LoadOptions { layer: Some(1), ..LoadOptions::default() });
        assert!(e.contains("layer 1 is not a MoE layer") && e.contains("0, 3"), "{e}");
        let e = err(&two, &LoadOptions { prefix: Some("model.layers.0.".into()), ..LoadOptions::default() });
        assert!(e.contains("`model.layers.0.` is not a MoE block"), "{e}");
    }

    #[test]
    fn bad_files_are_errors_naming_the_problem() {
        let none = LoadOptions::default();
        let e = err(&file("bert", &[]), &none);
        assert!(e.contains("`bert` model") && e.contains("qwen2moe"), "{e}");
        let e = err(
            &GgufWriter::default().metadata("general.architecture", GgufValue::Str("llama".into())),
            &none,
        );
        assert!(e.contains("no MoE layer"), "{e}");
        let old = GgufWriter::default()
            .metadata("general.architecture", GgufValue::Str("llama".into()))
            .tensor("blk.0.ffn_gate.0.weight", &[H, F], GgmlType::F32, f32_bytes(H * F, 0.1));
        assert!(err(&old, &none).contains("convert it again"), "{}", err(&old, &none));
        // No expert count: a dense model.
        let dense = GgufWriter::default()
            .metadata("general.architecture", GgufValue::Str("llama".into()))
            .tensor("blk.0.ffn_gate_inp.weight", &[H, E], GgmlType::F32, f32_bytes(H * E, 0.1))
            .tensor("blk.0.ffn_gate_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.01))
            .tensor("blk.0.ffn_up_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.01))
            .tensor("blk.0.ffn_down_exps.weight", &[F, H, E], GgmlType::F32, f32_bytes(H * F * E, 0.01));
        assert!(err(&dense, &none).contains("expert_count"), "{}", err(&dense, &none));
        // The metadata disagrees with the tensors.
        let e = err(&file("qwen3moe", &[]).metadata("qwen3moe.expert_count", GgufValue::U32(5)), &none);
        assert!(e.contains("5 experts"), "{e}");
        // A missing projection, a misshapen one, mixed and unread types.
        let missing = GgufWriter::default()
            .metadata("general.architecture", GgufValue::Str("qwen3moe".into()))
            .tensor("blk.0.ffn_gate_inp.weight", &[H, E], GgmlType::F32, f32_bytes(H * E, 0.1))
            .tensor("blk.0.ffn_gate_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.01));
        assert!(err(&missing, &none).contains("missing tensor `blk.0.ffn_up_exps.weight`"));
        let base = |down: (&[u64], GgmlType, Vec<u8>)| {
            GgufWriter::default()
                .metadata("general.architecture", GgufValue::Str("qwen3moe".into()))
                .metadata("qwen3moe.expert_count", GgufValue::U32(E as u32))
                .metadata("qwen3moe.expert_used_count", GgufValue::U32(2))
                .tensor("blk.0.ffn_gate_inp.weight", &[H, E], GgmlType::F32, f32_bytes(H * E, 0.1))
                .tensor("blk.0.ffn_gate_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.01))
                .tensor("blk.0.ffn_up_exps.weight", &[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.01))
                .tensor("blk.0.ffn_down_exps.weight", down.0, down.1, down.2)
        };
        let e = err(&base((&[H, F, E], GgmlType::F32, f32_bytes(H * F * E, 0.1))), &none);
        assert!(e.contains("ffn_down_exps") && e.contains("[16, 32, 4]"), "{e}");
        let f16 = vec![0u8; (H * F * E * 2) as usize];
        let e = err(&base((&[F, H, E], GgmlType::F16, f16.clone())), &none);
        assert!(e.contains("mix ggml types") && e.contains("--dtype"), "{e}");
        let mixed = load(
            &base((&[F, H, E], GgmlType::F16, f16)),
            &LoadOptions { dtype: Some(WeightDtype::F32), ..none.clone() },
        );
        assert_eq!(mixed.unwrap().config.weight_dtype, WeightDtype::F32);
        let e = err(&base((&[F, H, E], GgmlType::Other(12), vec![])), &none);
        assert!(e.contains("ggml type 12") && e.contains("Q4_0"), "{e}");
        // A config.json, contradicting flags, DeepSeek-V3 without groups.
        let e =
            err(&file("qwen3moe", &[]), &LoadOptions { config: Some(serde_json::json!({})), ..none.clone() });
        assert!(e.contains("--config"), "{e}");
        let flags = RoutingFlags { k: Some(3), ..RoutingFlags::default() };
        let e = err(&file("qwen3moe", &[]), &LoadOptions { routing: flags, ..none.clone() });
        assert!(e.contains("contradicts"), "{e}");
        let v3 = file("deepseek2", &[("expert_gating_func", GgufValue::U32(2))]).tensor(
            "blk.0.exp_probs_b.bias",
            &[E],
            GgmlType::F32,
            f32_bytes(E, 0.5),
        );
        assert!(err(&v3, &none).contains("--n-group"), "{}", err(&v3, &none));
        let groups = RoutingFlags {
            groups: Some(GroupLimit { n_group: 1, topk_group: 1 }),
            ..RoutingFlags::default()
        };
        let l = load(&v3, &LoadOptions { routing: groups, ..none.clone() }).unwrap();
        assert_eq!(l.config.route.groups, None);
        let e = err(&file("deepseek2", &[("expert_gating_func", GgufValue::U32(3))]), &none);
        assert!(e.contains("expert_gating_func` = 3"), "{e}");
    }
}
