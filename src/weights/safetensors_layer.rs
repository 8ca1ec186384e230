//! One MoE layer from a safetensors checkpoint (beside `gguf_layer.rs` for GGUF): planned from
//! the headers, then read to the host ([`load_checkpoint_layer`]) or streamed to the device in
//! its stored dtype ([`upload_checkpoint_layer`]).

use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use super::checkpoint::{Checkpoint, InMemory, TensorSource};
use super::family::{self, Routing, SharedNames, TensorFacts};
use super::gpt_oss;
use super::loaded::{LoadOptions, LoadedLayer, UploadedLayer, adjusted, layer_config};
#[cfg(not(target_arch = "wasm32"))]
use super::loaded::{PlacedLayer, placement_for};
use super::naming::{Scheme, detect_prefix, expert_indices, layer_prefix};
use super::tensors::{File, fp8_block_size, st_err, stored_dtype};
use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use crate::host_experts::{HostExperts, HostProjection};
use crate::kernels::gemm::WeightDtype;
use crate::kernels::gemm::{ExpertFfn, ExpertPlacement, ExpertWeights, STREAM_CHUNK};
use crate::layer::{MoeConfig, MoeLayer, MoeWeights, RouterWeights};

/// Loads one MoE layer from safetensors bytes: its family, configuration and weights.
///
/// # Errors
/// A file that is not safetensors; a missing tensor, or one whose rank, shape or dtype is
/// wrong (every tensor is checked, zero dimensions included); expert tensors past the
/// router's expert count; expert tensors of mixed dtypes without an explicit `dtype`; a
/// config.json that names an unsupported family or a routing key this family would run
/// differently; no config and routing that depends on values no flag gave; flags that
/// contradict the config.
pub fn load_layer(bytes: &[u8], source: &str, opts: &LoadOptions) -> Result<LoadedLayer> {
    let st = SafeTensors::deserialize(bytes).map_err(st_err(source))?;
    load_from(&InMemory { st, source: source.to_string() }, opts)
}

/// Loads one MoE layer from a checkpoint on disk ([`Checkpoint::open`]: a file, an index of
/// shards, or a directory); otherwise as [`load_layer`].
///
/// # Errors
/// As [`load_layer`], and a layer index that is not a MoE layer of the checkpoint.
pub fn load_checkpoint_layer(ckpt: &Checkpoint, opts: &LoadOptions) -> Result<LoadedLayer> {
    load_from(ckpt, opts)
}

/// One layer as found in a source's headers: its names, shapes, dtypes and routing, and the
/// router's small tensors read as f32. The expert tensors are not read yet.
pub(super) struct LayerPlan<'a> {
    pub(super) f: File<'a>,
    pub(super) scheme: Scheme,
    /// `mlp.shared_expert.` or `mlp.shared_experts.` when the layer has a shared expert.
    pub(super) shared_base: Option<&'static str>,
    pub(super) cfg: MoeConfig,
    pub(super) routing: Routing,
    pub(super) router: RouterWeights,
}

impl LayerPlan<'_> {
    /// Names and shapes of each projection: routed (gate, up, down of every expert) or shared.
    pub(super) fn projections(&self, shared: bool) -> [(Vec<String>, [usize; 2]); 3] {
        let (h, f, e) =
            (self.cfg.route.hidden as usize, self.cfg.ffn as usize, self.cfg.route.experts as usize);
        if shared {
            let fs = self.cfg.shared_ffn.unwrap_or(0) as usize;
            let b = self.shared_base.unwrap_or_default();
            return [
                (vec![format!("{b}gate_proj.weight")], [fs, h]),
                (vec![format!("{b}up_proj.weight")], [fs, h]),
                (vec![format!("{b}down_proj.weight")], [h, fs]),
            ];
        }
        let names: Vec<[String; 3]> = (0..e).map(|i| self.scheme.expert(i)).collect();
        [0, 1, 2].map(|p| {
            let shape = if p == 2 { [h, f] } else { [f, h] };
            (names.iter().map(|n| n[p].clone()).collect(), shape)
        })
    }
}

/// The layer's tensors: by prefix, by index, or the source's only MoE layer.
pub(super) fn layer_file<'a>(src: &'a dyn TensorSource, opts: &LoadOptions) -> Result<File<'a>> {
    let names = src.names();
    let prefix = match (&opts.prefix, opts.layer) {
        (Some(_), Some(_)) => return Err(Error::invalid("give the layer by prefix or by index, not both")),
        (Some(p), None) => layer_prefix(p),
        (None, Some(l)) => {
            let layers = super::checkpoint::moe_layers(names.iter().copied());
            match layers.get(&l) {
                Some(p) => p.clone(),
                None => {
                    let have: Vec<String> = layers.keys().map(|k| k.to_string()).collect();
                    return Err(Error::invalid(format!(
                        "layer {l} is not a MoE layer of {}; its MoE layers are: {}",
                        src.describe(),
                        if have.is_empty() { "none".to_string() } else { have.join(", ") }
                    )));
                }
            }
        }
        (None, None) => detect_prefix(&names)?,
    };
    Ok(File { src, prefix, fp8_block: fp8_block_size(opts.config.as_ref())? })
}

pub(super) fn plan_layer<'a>(f: File<'a>, opts: &LoadOptions) -> Result<LayerPlan<'a>> {
    let names = f.src.names();
    let scheme = if f.has(Scheme::Mixtral.router()) { Scheme::Mixtral } else { Scheme::Mlp };
    let [e, h] = f.matrix_shape(scheme.router(), "[experts, hidden], both at least 1")?;
    let router = f.get(scheme.router(), &[e, h])?;

    let extra: Vec<usize> =
        expert_indices(&names, &f.name(scheme.experts())).into_iter().filter(|&i| i >= e).collect();
    if let Some(&i) = extra.first() {
        return Err(Error::invalid(format!(
            "the weights have tensors for expert {i} under `{}` but the router has {e} experts (0..{e})",
            f.name(scheme.experts())
        )));
    }
    let [g0, _, _] = scheme.expert(0);
    let [ffn, gh] = f.matrix_shape(&g0, &format!("[ffn, {h}]"))?;
    if gh != h {
        return Err(Error::shape(
            format!("tensor {}", f.name(&g0)),
            format!("[ffn, {h}]"),
            format!("[{ffn}, {gh}]"),
        ));
    }
    // Every expert tensor's shape and dtype, from the headers.
    let mut expert_dtypes: Vec<(Dtype, String)> = Vec::new();
    let mut note_dtype = |t: &TensorView<'_>, name: String| {
        if !expert_dtypes.iter().any(|(d, _)| *d == t.dtype()) {
            expert_dtypes.push((t.dtype(), name));
        }
    };
    for i in 0..e {
        let [g, u, d] = scheme.expert(i);
        for (name, shape) in [(g, [ffn, h]), (u, [ffn, h]), (d, [h, ffn])] {
            let (name, t) = f.checked(&name, &shape)?;
            note_dtype(&t, name);
        }
    }
    let bias = if f.has("mlp.gate.e_score_correction_bias") {
        Some(f.get("mlp.gate.e_score_correction_bias", &[e])?)
    } else {
        None
    };
    let shared_names =
        [("mlp.shared_expert.", SharedNames::Qwen), ("mlp.shared_experts.", SharedNames::DeepSeek)]
            .into_iter()
            .find(|(b, _)| f.has(&format!("{b}gate_proj.weight")));
    let shared_ffn = match shared_names {
        Some((b, _)) => {
            let gate_name = format!("{b}gate_proj.weight");
            let [fs, gh] = f.matrix_shape(&gate_name, &format!("[shared ffn, {h}]"))?;
            if gh != h {
                return Err(Error::shape(
                    format!("tensor {}", f.name(&gate_name)),
                    format!("[shared ffn, {h}]"),
                    format!("[{fs}, {gh}]"),
                ));
            }
            for (name, shape) in [
                (gate_name, [fs, h]),
                (format!("{b}up_proj.weight"), [fs, h]),
                (format!("{b}down_proj.weight"), [h, fs]),
            ] {
                let (name, t) = f.checked(&name, &shape)?;
                note_dtype(&t, name);
            }
            Some(fs)
        }
        None => None,
    };
    let shared_gate = if f.has("mlp.shared_expert_gate.weight") {
        Some(f.get("mlp.shared_expert_gate.weight", &[1, h])?)
    } else {
        None
    };

    let weight_dtype = match (opts.dtype, expert_dtypes.as_slice()) {
        (Some(d), _) => d,
        (None, [(d, n)]) => stored_dtype(n, *d)?,
        (None, [(d0, n0), (d1, n1), ..]) => {
            return Err(Error::invalid(format!(
                "expert tensors mix dtypes (`{n0}` is {d0:?}, `{n1}` is {d1:?}): pass a dtype (--dtype) to convert them all"
            )));
        }
        (None, []) => WeightDtype::F32,
    };
    let dim = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| Error::limit(what, v as u64, u32::MAX.into(), "u32 dimensions"))
    };
    let facts = TensorFacts {
        mixtral_names: scheme == Scheme::Mixtral,
        gpt_oss_names: false,
        experts: dim(e, "experts")?,
        ffn: dim(ffn, "expert FFN size")?,
        bias: bias.is_some(),
        shared: match (shared_names, shared_ffn) {
            (Some((_, names)), Some(fs)) => Some((names, dim(fs, "shared FFN size")?)),
            _ => None,
        },
        shared_gate: shared_gate.is_some(),
    };
    let routing = family::resolve(opts.config.as_ref(), &opts.routing, &facts)?;
    let cfg = layer_config(dim(h, "hidden size")?, &facts, &routing, weight_dtype)?;
    let router = RouterWeights { router, bias, shared_gate, router_bias: None };
    router.check(&cfg)?;
    Ok(LayerPlan { f, scheme, shared_base: shared_names.map(|(b, _)| b), cfg, routing, router })
}

pub(super) fn load_from(src: &dyn TensorSource, opts: &LoadOptions) -> Result<LoadedLayer> {
    let f = layer_file(src, opts)?;
    if f.has(gpt_oss::ROUTER) {
        let p = gpt_oss::plan(f, opts)?;
        let [gate, up, down] = p.host_experts()?;
        let RouterWeights { router, router_bias, .. } = p.router;
        let weights = MoeWeights {
            router,
            bias: None,
            gate,
            up,
            down,
            shared: None,
            shared_gate: None,
            router_bias,
            expert_bias: Some(p.bias),
        };
        weights.check(&p.cfg)?;
        return Ok(LoadedLayer { config: p.cfg, weights, routing: p.routing, prefix: p.f.prefix });
    }
    let plan = plan_layer(f, opts)?;
    let host = |shared: bool| -> Result<[Vec<f32>; 3]> {
        let parts = plan.projections(shared).map(|(names, shape)| -> Result<Vec<f32>> {
            let mut out = Vec::new();
            for n in names {
                out.extend(plan.f.matrix(&n, shape)?);
            }
            Ok(out)
        });
        let [g, u, d] = parts;
        Ok([g?, u?, d?])
    };
    let [gate, up, down] = host(false)?;
    let shared = match plan.cfg.shared_ffn {
        Some(_) => Some(host(true)?.into()),
        None => None,
    };
    let RouterWeights { router, bias, shared_gate, router_bias } = plan.router;
    let weights =
        MoeWeights { router, bias, gate, up, down, shared, shared_gate, router_bias, expert_bias: None };
    weights.check(&plan.cfg)?;
    Ok(LoadedLayer { config: plan.cfg, weights, routing: plan.routing, prefix: plan.f.prefix })
}

/// Loads one MoE layer of a checkpoint straight to the device: every check of
/// [`load_checkpoint_layer`] is made on the tensors' headers first, then the expert tensors
/// are uploaded one at a time from the mapped file in their stored dtype (converted one
/// expert at a time when `opts.dtype` asks for another), with no host f32 copy; each
/// tensor's pages are released once it is uploaded. Host memory during the load is about one
/// expert tensor plus a 16 MiB staging chunk, besides the router's small f32 tensors.
/// `adjust` may change the configuration's modes (route, combine, kernels, GEMM order) before
/// the layer is made; shapes, routing and dtype must stay as loaded.
///
/// # Errors
/// As [`load_checkpoint_layer`]; an `adjust` that changes what the checkpoint fixed; device
/// errors (sizes past the device's limits among them).
#[cfg(not(target_arch = "wasm32"))]
pub fn upload_checkpoint_layer(
    ctx: &Context,
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    adjust: impl FnOnce(MoeConfig) -> MoeConfig,
) -> Result<UploadedLayer> {
    pollster::block_on(upload_from(ctx, ckpt, opts, adjust, Driver::Inline))
}

/// [`upload_checkpoint_layer`] without blocking the awaiting thread: the uploads' flushes (and
/// the tuner's runs, where the configuration tunes) are awaited, a thread of moeflow's polling
/// the device. Reading the mapped file stays on the calling thread.
///
/// # Errors
/// As [`upload_checkpoint_layer`].
pub async fn upload_checkpoint_layer_async(
    ctx: &Context,
    ckpt: &Checkpoint,
    opts: &LoadOptions,
    adjust: impl FnOnce(MoeConfig) -> MoeConfig,
) -> Result<UploadedLayer> {
    upload_from(ctx, ckpt, opts, adjust, Driver::Await).await
}

/// [`upload_checkpoint_layer`] with the routed experts that `place` (given the layer's expert
/// count) puts on the host left in the mapped checkpoint (read in place, in their stored dtype,
/// never converted or uploaded) as the returned [`PlacedLayer::host`], the others streamed to
/// the device. The layer keeps the checkpoint's dtype (`opts.dtype` must be None or the same).
///
/// # Errors
/// As [`upload_checkpoint_layer`]; `place`'s errors; [`Error::InvalidArgument`] for a
/// placement of another expert count, a dtype other than the stored one, or experts the host
/// does not read in place (FP8 whose scales are not f32, aligned; gpt-oss's dense experts,
/// stored in x out; gpt-oss's MXFP4 experts are read as shipped).
#[cfg(not(target_arch = "wasm32"))]
pub fn upload_checkpoint_layer_placed<'c>(
    ctx: &Context,
    ckpt: &'c Checkpoint,
    opts: &LoadOptions,
    place: impl FnOnce(u32) -> Result<ExpertPlacement>,
    adjust: impl FnOnce(MoeConfig) -> MoeConfig,
) -> Result<PlacedLayer<'c>> {
    let f = layer_file(ckpt, opts)?;
    if f.has(gpt_oss::ROUTER) {
        let p = gpt_oss::plan(f, opts)?;
        let cfg = adjusted(&p.cfg, adjust)?;
        let placement = &placement_for(&cfg, place)?;
        let (experts, host) = p.placed(ctx, &cfg, placement)?;
        let layer = pollster::block_on(MoeLayer::with_experts_with(
            ctx,
            cfg,
            &p.router,
            experts,
            None,
            Driver::Inline,
        ))?;
        return Ok(PlacedLayer {
            uploaded: UploadedLayer { layer, routing: p.routing, prefix: p.f.prefix },
            host,
        });
    }
    let plan = plan_layer(f, opts)?;
    let cfg = adjusted(&plan.cfg, adjust)?;
    let placement = &placement_for(&cfg, place)?;
    let project = |(names, [n, k]): (Vec<String>, [usize; 2])| -> Result<HostProjection<'c>> {
        let mut projection = HostProjection::new([names.len() as u32, n as u32, k as u32])?;
        for x in placement.host_experts() {
            let name = &names[x as usize];
            let (full, t) = plan.f.checked(name, &[n, k])?;
            let values = match t.dtype() {
                Dtype::F8_E4M3 => plan.f.fp8_in_place(name, [n, k])?,
                _ => plan.f.stored(name, [n, k], None)?,
            };
            if values.dtype() != cfg.weight_dtype {
                return Err(Error::invalid(format!(
                    "tensor `{full}` is {:?}; with experts on the host the layer keeps the stored dtype, not {:?}",
                    values.dtype(),
                    cfg.weight_dtype
                )));
            }
            projection.hold(x, values)?;
        }
        Ok(projection)
    };
    let [g, u, d] = plan.projections(false);
    let host = HostExperts::new(project(g)?, project(u)?, project(d)?, cfg.gemm_order, cfg.activation)?;
    pollster::block_on(async {
        let driver = Driver::Inline;
        let experts = stream_ffn(ctx, ckpt, &plan, cfg.weight_dtype, false, Some(placement), driver).await?;
        let shared = match cfg.shared_ffn {
            Some(_) => Some(stream_ffn(ctx, ckpt, &plan, cfg.weight_dtype, true, None, driver).await?),
            None => None,
        };
        let layer = MoeLayer::with_experts_with(ctx, cfg, &plan.router, experts, shared, driver).await?;
        Ok(PlacedLayer {
            uploaded: UploadedLayer { layer, routing: plan.routing, prefix: plan.f.prefix.clone() },
            host,
        })
    })
}

pub(super) async fn upload_from(
    ctx: &Context,
    src: &dyn TensorSource,
    opts: &LoadOptions,
    adjust: impl FnOnce(MoeConfig) -> MoeConfig,
    driver: Driver,
) -> Result<UploadedLayer> {
    let f = layer_file(src, opts)?;
    if f.has(gpt_oss::ROUTER) {
        let p = gpt_oss::plan(f, opts)?;
        let cfg = adjusted(&p.cfg, adjust)?;
        let experts = p.device_experts(ctx, &cfg)?;
        let layer = MoeLayer::with_experts_with(ctx, cfg, &p.router, experts, None, driver).await?;
        return Ok(UploadedLayer { layer, routing: p.routing, prefix: p.f.prefix });
    }
    let plan = plan_layer(f, opts)?;
    let cfg = adjusted(&plan.cfg, adjust)?;
    let experts = stream_ffn(ctx, src, &plan, cfg.weight_dtype, false, None, driver).await?;
    let shared = match cfg.shared_ffn {
        Some(_) => Some(stream_ffn(ctx, src, &plan, cfg.weight_dtype, true, None, driver).await?),
        None => None,
    };
    let layer = MoeLayer::with_experts_with(ctx, cfg, &plan.router, experts, shared, driver).await?;
    Ok(UploadedLayer { layer, routing: plan.routing, prefix: plan.f.prefix })
}

/// The routed (or `shared`) expert projections of `plan`, streamed to the device in `dtype`
/// one tensor at a time, each tensor's pages released once it is on its way: of the routed
/// experts, those `placement` keeps on the device (every one without a placement).
pub(super) async fn stream_ffn(
    ctx: &Context,
    src: &dyn TensorSource,
    plan: &LayerPlan<'_>,
    dtype: WeightDtype,
    shared: bool,
    placement: Option<&ExpertPlacement>,
    driver: Driver,
) -> Result<ExpertFfn> {
    let upload = async |(names, [n, k]): (Vec<String>, [usize; 2])| -> Result<ExpertWeights> {
        // FP8 experts' scales (1/16384 of their values for 128 x 128 tiles), read first.
        let scales = names
            .iter()
            .map(|name| match plan.f.checked(name, &[n, k])?.1.dtype() {
                Dtype::F8_E4M3 => plan.f.fp8_scales(name, [n, k]).map(Some),
                _ => Ok(None),
            })
            .collect::<Result<Vec<_>>>()?;
        ExpertWeights::stream_with(
            ctx,
            dtype,
            [names.len() as u32, n as u32, k as u32],
            placement,
            |i| plan.f.stored(&names[i as usize], [n, k], scales[i as usize].as_ref()),
            |i| src.release(&plan.f.name(&names[i as usize])),
            STREAM_CHUNK,
            driver,
        )
        .await
    };
    let [g, u, d] = plan.projections(shared);
    ExpertFfn::new(upload(g).await?, upload(u).await?, upload(d).await?)
}
