//! MoE layer weights from safetensors files, with the tensor names of Mixtral
//! (`block_sparse_moe.gate`, `experts.N.w1/w2/w3`), Qwen2-MoE / Qwen3-MoE / OLMoE / DeepSeek
//! (`mlp.gate`, `mlp.experts.N.gate_proj/up_proj/down_proj`, `shared_expert(s)`,
//! `shared_expert_gate`, `mlp.gate.e_score_correction_bias`). Tensors may be f32, f16 or
//! bf16; expert weights also FP8 e4m3 with `weight_scale_inv` block scales (DeepSeek-V3,
//! Qwen3-FP8; docs/quant.md). The routing comes from the family's semantics ([`family`]): a
//! Hugging Face `config.json` names the family and its keys, or flags supply what the family
//! needs.
//!
//! A [`Checkpoint`] maps one file or a sharded checkpoint; [`load_checkpoint_layer`] reads a
//! layer to host f32 ([`LoadedLayer`]), [`upload_checkpoint_layer`] streams it to the device in
//! its stored dtype ([`UploadedLayer`]), both after checking every header.

mod checkpoint;
pub mod family;
pub mod gguf;
mod gguf_layer;
mod gpt_oss;
mod output;

use std::collections::BTreeSet;
use std::path::Path;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde_json::Value;

use checkpoint::InMemory;
pub use checkpoint::{Checkpoint, TensorSource};
pub use family::{Family, Routing, RoutingFlags};
use family::{SharedNames, TensorFacts};
pub use gguf_layer::{gguf_moe_layers, load_gguf_layer, upload_gguf_layer, upload_gguf_layer_async};
pub use output::{OutTensor, check_output_path, write_atomically, write_tensors};

use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::kernels::gemm::WeightDtype;
use crate::kernels::gemm::{ExpertFfn, ExpertWeights, QuantisedValues, STREAM_CHUNK, StoredValues};
use crate::kernels::routing::RouteConfig;
use crate::layer::{MoeConfig, MoeLayer, MoeWeights, RouterWeights};
use crate::quant;

/// Reads a whole file.
///
/// # Errors
/// [`Error::Io`] naming the file.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })
}

fn st_err(path: &str) -> impl Fn(safetensors::SafeTensorError) -> Error + '_ {
    move |e| Error::invalid(format!("{path} is not a readable safetensors file: {e}"))
}

/// A tensor's values as f32 (from f32, f16 or bf16).
///
/// # Errors
/// [`Error::InvalidArgument`] for any other dtype.
pub fn to_f32(name: &str, t: &TensorView<'_>) -> Result<Vec<f32>> {
    let d = t.data();
    Ok(match t.dtype() {
        Dtype::F32 => d.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        Dtype::F16 => d.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        Dtype::BF16 => d.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        other => {
            return Err(Error::invalid(format!(
                "tensor `{name}` is {other:?}; f32, f16 and bf16 are supported"
            )));
        }
    })
}

/// The device dtype that holds a file dtype exactly: f32, f16 and bf16 are read, and FP8
/// e4m3 (a weight with block scales, checked by [`File::checked`]).
fn stored_dtype(name: &str, d: Dtype) -> Result<WeightDtype> {
    match d {
        Dtype::F32 => Ok(WeightDtype::F32),
        Dtype::F16 => Ok(WeightDtype::F16),
        Dtype::BF16 => Ok(WeightDtype::Bf16),
        Dtype::F8_E4M3 => Ok(WeightDtype::Fp8),
        other => Err(Error::invalid(format!(
            "tensor `{name}` is {other:?}; f32, f16, bf16 and FP8 e4m3 weights (with block scales) are supported"
        ))),
    }
}

/// The naming scheme of a layer's router and experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scheme {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.N.w1 / w3 / w2`.
    Mixtral,
    /// `mlp.gate`, `mlp.experts.N.gate_proj / up_proj / down_proj`.
    Mlp,
}

impl Scheme {
    fn router(self) -> &'static str {
        match self {
            Scheme::Mixtral => "block_sparse_moe.gate.weight",
            Scheme::Mlp => "mlp.gate.weight",
        }
    }

    fn experts(self) -> &'static str {
        match self {
            Scheme::Mixtral => "block_sparse_moe.experts.",
            Scheme::Mlp => "mlp.experts.",
        }
    }

    /// Gate, up and down projection names of expert `i`.
    fn expert(self, i: usize) -> [String; 3] {
        let parts = match self {
            Scheme::Mixtral => ["w1", "w3", "w2"],
            Scheme::Mlp => ["gate_proj", "up_proj", "down_proj"],
        };
        parts.map(|p| format!("{}{i}.{p}.weight", self.experts()))
    }
}

struct File<'a> {
    src: &'a dyn TensorSource,
    prefix: String,
    /// The FP8 scale tile `config.json` gives (`quantization_config.weight_block_size`);
    /// None: inferred from each scale tensor's shape ([`File::fp8_scales`]).
    fp8_block: Option<[usize; 2]>,
}

impl File<'_> {
    fn name(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    fn has(&self, rest: &str) -> bool {
        self.src.tensor(&self.name(rest)).is_some()
    }

    fn view(&self, rest: &str, expected: &str) -> Result<TensorView<'_>> {
        let name = self.name(rest);
        self.src.tensor(&name).ok_or_else(|| {
            Error::invalid(format!(
                "missing tensor `{name}` (expected shape {expected}) in {}{}",
                self.src.describe(),
                closest(&self.src.names(), &name)
            ))
        })
    }

    /// The shape of `prefix + rest`, which must be 2-D with no empty dimension.
    fn matrix_shape(&self, rest: &str, expected: &str) -> Result<[usize; 2]> {
        let t = self.view(rest, expected)?;
        match *t.shape() {
            [r, c] if r > 0 && c > 0 => Ok([r, c]),
            ref s => Err(Error::shape(format!("tensor {}", self.name(rest)), expected, format!("{s:?}"))),
        }
    }

    /// The tensor `prefix + rest`, checked against `shape` exactly and for a dtype moeflow
    /// reads (f32, f16, bf16, or FP8 e4m3 with its scale tensor, [`File::fp8_scales`]); its
    /// bytes are not read.
    fn checked(&self, rest: &str, shape: &[usize]) -> Result<(String, TensorView<'_>)> {
        let name = self.name(rest);
        let t = self.view(rest, &format!("{shape:?}"))?;
        if t.shape() != shape {
            return Err(Error::shape(
                format!("tensor {name}"),
                format!("{shape:?}"),
                format!("{:?}", t.shape()),
            ));
        }
        match (t.dtype(), shape) {
            (Dtype::F8_E4M3, &[n, k]) => {
                self.fp8_tile(rest, [n, k])?;
            }
            (d, _) => {
                stored_dtype(&name, d)?;
            }
        }
        Ok((name, t))
    }

    /// The tensor `prefix + rest`, checked against `shape` exactly, as f32.
    fn get(&self, rest: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (name, t) = self.checked(rest, shape)?;
        to_f32(&name, &t)
    }

    /// The weight matrix `prefix + rest` (`[n, k]`) as f32: float values widened, FP8 e4m3
    /// decoded with its scales ([`quant::fp8_block_dequantize`], what the kernels read).
    fn matrix(&self, rest: &str, [n, k]: [usize; 2]) -> Result<Vec<f32>> {
        let (name, t) = self.checked(rest, &[n, k])?;
        match t.dtype() {
            Dtype::F8_E4M3 => {
                let (scale_inv, block) = self.fp8_scales(rest, [n, k])?;
                quant::fp8_block_dequantize(t.data(), &scale_inv, [n, k], block)
            }
            _ => to_f32(&name, &t),
        }
    }

    /// The weight matrix `prefix + rest` (`[n, k]`) as stored, for [`ExpertWeights::stream`]:
    /// float elements, or FP8 bytes with `scales` (from [`File::fp8_scales`]).
    fn stored<'s>(
        &'s self,
        rest: &str,
        [n, k]: [usize; 2],
        scales: Option<&'s (Vec<f32>, [usize; 2])>,
    ) -> Result<StoredValues<'s>> {
        let (name, t) = self.checked(rest, &[n, k])?;
        Ok(match (t.dtype(), scales) {
            (Dtype::F8_E4M3, Some((scale_inv, block))) => {
                StoredValues::Quantised(QuantisedValues::Fp8 { weight: t.data(), scale_inv, block: *block })
            }
            (Dtype::F8_E4M3, None) => {
                return Err(Error::invalid(format!("FP8 tensor `{name}` was given no scales")));
            }
            (d, _) => StoredValues::Float { dtype: stored_dtype(&name, d)?, bytes: t.data() },
        })
    }

    /// The scales of the FP8 e4m3 weight `prefix + rest` (`[n, k]`, its name ending in
    /// `weight`): the `weight_scale_inv` tensor beside it (f32, f16 or bf16), one value per
    /// tile of the weight, `[ceil(n / t0), ceil(k / t1)]` for the tile `[t0, t1]`, with the
    /// tile. The tile is config.json's `quantization_config.weight_block_size`; without one,
    /// 128 × 128 (DeepSeek-V3's and Qwen3-FP8's) when the shape fits it, or the whole matrix
    /// for a single scale (shape `[]`, `[1]` or `[1, 1]`). Values are `e4m3(byte) ×
    /// scale_inv` (DeepSeek-V3's `weight_dequant`).
    fn fp8_scales(&self, rest: &str, [n, k]: [usize; 2]) -> Result<(Vec<f32>, [usize; 2])> {
        let (scale_name, t, block) = self.fp8_tile(rest, [n, k])?;
        Ok((to_f32(&scale_name, &t)?, block))
    }

    /// [`File::fp8_scales`]' checks on the headers alone: the scale tensor's name, view and
    /// tile, its shape and dtype checked, its values not read.
    fn fp8_tile(&self, rest: &str, [n, k]: [usize; 2]) -> Result<(String, TensorView<'_>, [usize; 2])> {
        let name = self.name(rest);
        let scale_rest = match rest.strip_suffix("weight") {
            Some(stem) => format!("{stem}weight_scale_inv"),
            None => return Err(Error::invalid(format!("FP8 tensor `{name}` is not a `weight`: no scales"))),
        };
        let scale_name = self.name(&scale_rest);
        let t = self.src.tensor(&scale_name).ok_or_else(|| {
            Error::invalid(format!(
                "FP8 tensor `{name}` has no scale tensor `{scale_name}` in {}: FP8 weights are read \
                 with their block scales (DeepSeek-V3 / Qwen3-FP8 layout)",
                self.src.describe()
            ))
        })?;
        let shape = t.shape().to_vec();
        let tiles = |[t0, t1]: [usize; 2]| vec![n.div_ceil(t0), k.div_ceil(t1)];
        let block = match (self.fp8_block, shape.as_slice()) {
            (Some(b), s) if s == tiles(b) => b,
            (Some(b), s) => {
                return Err(Error::shape(
                    format!(
                        "tensor {scale_name} (FP8 scales of [{n}, {k}] in {b:?} tiles, the config's weight_block_size)"
                    ),
                    format!("{:?}", tiles(b)),
                    format!("{s:?}"),
                ));
            }
            (None, [] | [1] | [1, 1]) => [n, k],
            (None, s) if s == tiles([128, 128]) => [128, 128],
            (None, s) => {
                return Err(Error::invalid(format!(
                    "tensor `{scale_name}` has shape {s:?}, which is no 128 x 128 tiling of [{n}, {k}] \
                     ({:?}) and no single scale: give config.json with \
                     quantization_config.weight_block_size",
                    tiles([128, 128])
                )));
            }
        };
        if !matches!(t.dtype(), Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            return Err(Error::invalid(format!(
                "tensor `{scale_name}` is {:?}; FP8 scales are f32, f16 or bf16",
                t.dtype()
            )));
        }
        Ok((scale_name, t, block))
    }
}

/// The FP8 scale tile of a config.json whose `quantization_config` is `fp8` (the
/// DeepSeek-V3 / Qwen3-FP8 / transformers `FineGrainedFP8Config` keys): its
/// `weight_block_size`, None without one (or without an FP8 quantisation config). moeflow
/// runs the weights' exact values against f32 activations: `activation_scheme: dynamic` (the
/// model's code quantises activations per 128 values on the fly) is run without that step;
/// another scheme, or an `fmt` other than e4m3, is refused.
///
/// # Errors
/// A `weight_block_size` that is not two positive integers; `fmt` not `e4m3`;
/// `activation_scheme` not `dynamic`.
fn fp8_block_size(config: Option<&Value>) -> Result<Option<[usize; 2]>> {
    let Some(q) = config.and_then(|c| c.get("quantization_config")) else {
        return Ok(None);
    };
    if q.get("quant_method").and_then(Value::as_str) != Some("fp8") {
        return Ok(None);
    }
    if let Some(fmt) = q.get("fmt").filter(|f| f.as_str() != Some("e4m3")) {
        return Err(Error::invalid(format!(
            "config.json quantization_config.fmt is {fmt}; FP8 weights are read as e4m3"
        )));
    }
    if let Some(a) = q.get("activation_scheme").filter(|a| a.as_str() != Some("dynamic")) {
        return Err(Error::invalid(format!(
            "config.json quantization_config.activation_scheme is {a}; FP8 checkpoints with \
             dynamic activation scaling are read (moeflow runs f32 activations)"
        )));
    }
    match q.get("weight_block_size") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_array().map(|a| a.iter().map(Value::as_u64).collect::<Vec<_>>()).as_deref() {
            Some(&[Some(a), Some(b)]) if a > 0 && b > 0 => Ok(Some([a as usize, b as usize])),
            _ => Err(Error::invalid(format!(
                "config.json quantization_config.weight_block_size is {v}; expected two positive integers"
            ))),
        },
    }
}

/// `; the closest names it holds: a, b, c` (or nothing when the source is empty).
fn closest(names: &[&str], wanted: &str) -> String {
    let mut scored: Vec<(f64, &str)> = names.iter().map(|n| (strsim::jaro_winkler(n, wanted), *n)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let best: Vec<&str> = scored.iter().take(3).map(|(_, n)| *n).collect();
    if best.is_empty() { String::new() } else { format!("; the closest names it holds: {}", best.join(", ")) }
}

/// `model.layers.3.`, also when given as the MoE module's prefix (`model.layers.3.mlp.` or
/// `model.layers.3.block_sparse_moe.`).
fn layer_prefix(prefix: &str) -> String {
    for module in ["mlp.", "block_sparse_moe."] {
        if let Some(p) = prefix.strip_suffix(module) {
            return p.to_string();
        }
    }
    prefix.to_string()
}

/// The router names that mark a MoE layer: Mixtral's, the `mlp.gate` families', gpt-oss's.
const ROUTER_NAMES: [&str; 3] = ["block_sparse_moe.gate.weight", "mlp.gate.weight", gpt_oss::ROUTER];

/// The layer prefix of a router tensor's name (`model.layers.3.` of
/// `model.layers.3.mlp.router.weight`), None for other names.
fn router_prefix(name: &str) -> Option<&str> {
    ROUTER_NAMES.iter().find_map(|r| name.strip_suffix(r))
}

fn detect_prefix(names: &[&str]) -> Result<String> {
    let mut found: Vec<String> = names.iter().filter_map(|n| router_prefix(n)).map(str::to_string).collect();
    found.sort();
    found.dedup();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::invalid(format!(
            "no router tensor (`*block_sparse_moe.gate.weight`, `*mlp.gate.weight` or `*mlp.router.weight`) in the weights{}",
            closest(names, "model.layers.0.mlp.gate.weight")
        ))),
        _ => Err(Error::invalid(format!(
            "the weights hold several MoE layers; pick one by prefix (--prefix) or index (--layer): {found:?}"
        ))),
    }
}

/// Expert indices named under `prefix + experts` (e.g. `mlp.experts.7.up_proj.weight` -> 7).
fn expert_indices(names: &[&str], prefix: &str) -> BTreeSet<usize> {
    names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix))
        .filter_map(|rest| rest.split('.').next())
        .filter_map(|i| i.parse().ok())
        .collect()
}

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
    /// Host weights (f32): quantised experts as their exact decoded values. To run exactly
    /// these values, give [`MoeLayer::new`] or the CPU reference `MoeConfig { weight_dtype:
    /// F32, .. }`: with a quantised `weight_dtype` they quantise them again by moeflow's own
    /// rules, which is not guaranteed to give the checkpoint's values back (FP8 tiles share one
    /// scale per 128 × 128 tile, where moeflow's FP8 quantiser takes one per row and 128
    /// values). [`upload_checkpoint_layer`] uploads the stored blocks themselves.
    pub weights: MoeWeights,
    /// The routing as the family runs it.
    pub routing: Routing,
    /// The tensor-name prefix of the layer.
    pub prefix: String,
}

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
struct LayerPlan<'a> {
    f: File<'a>,
    scheme: Scheme,
    /// `mlp.shared_expert.` or `mlp.shared_experts.` when the layer has a shared expert.
    shared_base: Option<&'static str>,
    cfg: MoeConfig,
    routing: Routing,
    router: RouterWeights,
}

impl LayerPlan<'_> {
    /// Names and shapes of each projection: routed (gate, up, down of every expert) or shared.
    fn projections(&self, shared: bool) -> [(Vec<String>, [usize; 2]); 3] {
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
fn layer_file<'a>(src: &'a dyn TensorSource, opts: &LoadOptions) -> Result<File<'a>> {
    let names = src.names();
    let prefix = match (&opts.prefix, opts.layer) {
        (Some(_), Some(_)) => return Err(Error::invalid("give the layer by prefix or by index, not both")),
        (Some(p), None) => layer_prefix(p),
        (None, Some(l)) => {
            let layers = checkpoint::moe_layers(names.iter().copied());
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

fn plan_layer<'a>(f: File<'a>, opts: &LoadOptions) -> Result<LayerPlan<'a>> {
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

/// A per-expert layer's configuration: its hidden size, what its tensors hold (sizes,
/// selection bias, shared expert and gate) and the routing resolved for its family.
fn layer_config(
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

fn load_from(src: &dyn TensorSource, opts: &LoadOptions) -> Result<LoadedLayer> {
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

/// One MoE layer on the device, loaded by [`upload_checkpoint_layer`].
#[derive(Debug)]
pub struct UploadedLayer {
    /// The layer, its expert weights in `layer.config().weight_dtype`.
    pub layer: MoeLayer,
    /// The routing as the family runs it.
    pub routing: Routing,
    /// The tensor-name prefix of the layer.
    pub prefix: String,
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
    upload_from(ctx, ckpt, opts, adjust, Driver::Thread).await
}

async fn upload_from(
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
    let experts = stream_ffn(ctx, src, &plan, cfg.weight_dtype, false, driver).await?;
    let shared = match cfg.shared_ffn {
        Some(_) => Some(stream_ffn(ctx, src, &plan, cfg.weight_dtype, true, driver).await?),
        None => None,
    };
    let layer = MoeLayer::with_experts_with(ctx, cfg, &plan.router, experts, shared, driver).await?;
    Ok(UploadedLayer { layer, routing: plan.routing, prefix: plan.f.prefix })
}

/// The routed (or `shared`) expert projections of `plan`, streamed to the device in `dtype`
/// one tensor at a time, each tensor's pages released once it is on its way.
async fn stream_ffn(
    ctx: &Context,
    src: &dyn TensorSource,
    plan: &LayerPlan<'_>,
    dtype: WeightDtype,
    shared: bool,
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

/// `adjust(loaded)`, which may change the modes (route, combine, kernels, GEMM order) but not
/// what the checkpoint fixed.
fn adjusted(loaded: &MoeConfig, adjust: impl FnOnce(MoeConfig) -> MoeConfig) -> Result<MoeConfig> {
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

/// Reads the input tensor `x` (or the file's only tensor) as `(values, tokens, hidden)`.
///
/// # Errors
/// A file that is not safetensors, no tensor `x` among several, a tensor that is not 1-D or
/// 2-D, an empty hidden dimension, or a dtype other than f32, f16 and bf16.
pub fn load_input(bytes: &[u8], source: &str) -> Result<(Vec<f32>, usize, usize)> {
    let st = SafeTensors::deserialize(bytes).map_err(st_err(source))?;
    let names = st.names();
    let name = if names.contains(&"x") {
        "x".to_string()
    } else if names.len() == 1 {
        names[0].to_string()
    } else {
        return Err(Error::invalid(format!(
            "{source} has no tensor `x` and {} tensors: {names:?}",
            names.len()
        )));
    };
    let t = st.tensor(&name).map_err(st_err(source))?;
    let (tokens, hidden) = match t.shape() {
        [m, h] if *h > 0 => (*m, *h),
        [h] if *h > 0 => (1, *h),
        s => {
            return Err(Error::shape(
                format!("input tensor {name}"),
                "[tokens, hidden] with hidden >= 1",
                format!("{s:?}"),
            ));
        }
    };
    Ok((to_f32(&name, &t)?, tokens, hidden))
}
