//! MoE layer weights from safetensors files, with the tensor names of Mixtral
//! (`block_sparse_moe.gate`, `experts.N.w1/w2/w3`), Qwen2-MoE / Qwen3-MoE / OLMoE
//! (`mlp.gate`, `mlp.experts.N.gate_proj/up_proj/down_proj`, `shared_expert(s)`,
//! `shared_expert_gate`) and DeepSeek-V3 (`mlp.gate.e_score_correction_bias`). Tensors may be
//! f32, f16 or bf16; a Hugging Face `config.json` fills in what the tensors do not say.

use std::path::Path;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::kernels::gemm::WeightDtype;
use crate::kernels::routing::{Gating, GroupLimit};
use crate::layer::{MoeConfig, MoeWeights};

/// The naming scheme found in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.N.w1 / w3 / w2`.
    Mixtral,
    /// `mlp.gate`, `mlp.experts.N.gate_proj / up_proj / down_proj` (Qwen-MoE, OLMoE, DeepSeek).
    Mlp,
}

/// Reads a whole file.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })
}

fn st_err(path: &str) -> impl Fn(safetensors::SafeTensorError) -> Error + '_ {
    move |e| Error::invalid(format!("{path} is not a readable safetensors file: {e}"))
}

/// A tensor's values as f32 (from f32, f16 or bf16).
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

struct File<'a> {
    st: SafeTensors<'a>,
    prefix: String,
}

impl File<'_> {
    fn name(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    fn has(&self, rest: &str) -> bool {
        self.st.tensor(&self.name(rest)).is_ok()
    }

    /// The tensor `prefix + rest`, checked against `shape` (None: any 2-D shape).
    fn get(&self, rest: &str, shape: &[usize]) -> Result<(Vec<f32>, Dtype, Vec<usize>)> {
        let name = self.name(rest);
        let t = self
            .st
            .tensor(&name)
            .map_err(|_| Error::invalid(format!("missing tensor `{name}` (expected shape {shape:?})")))?;
        if !shape.is_empty() && t.shape() != shape {
            return Err(Error::shape(
                format!("tensor {name}"),
                format!("{shape:?}"),
                format!("{:?}", t.shape()),
            ));
        }
        Ok((to_f32(&name, &t)?, t.dtype(), t.shape().to_vec()))
    }
}

fn detect_prefix(names: &[&str]) -> Result<String> {
    let mut found: Vec<String> = names
        .iter()
        .filter_map(|n| {
            n.strip_suffix("block_sparse_moe.gate.weight")
                .or_else(|| n.strip_suffix("mlp.gate.weight"))
                .map(str::to_string)
        })
        .collect();
    found.sort();
    found.dedup();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::invalid(
            "no router tensor (`block_sparse_moe.gate.weight` or `mlp.gate.weight`) in the weights file",
        )),
        _ => Err(Error::invalid(format!(
            "the weights hold several MoE layers; pick one with --prefix: {found:?}"
        ))),
    }
}

fn cfg_u32(cfg: Option<&Value>, keys: &[&str]) -> Option<u32> {
    let c = cfg?;
    keys.iter().find_map(|k| c.get(*k).and_then(Value::as_u64)).and_then(|v| u32::try_from(v).ok())
}

/// What the caller knows beyond the weights file.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Tensor-name prefix of the layer (e.g. `model.layers.3.`); found automatically when the
    /// file holds one MoE layer.
    pub prefix: Option<String>,
    /// A Hugging Face `config.json`, parsed.
    pub config: Option<Value>,
    /// Experts per token, when the config does not say.
    pub k: Option<u32>,
    /// Storage dtype on the device (default: the expert tensors' dtype).
    pub dtype: Option<WeightDtype>,
}

/// Loads one MoE layer from safetensors bytes: its configuration and weights.
pub fn load_layer(bytes: &[u8], source: &str, opts: &LoadOptions) -> Result<(MoeConfig, MoeWeights, Scheme)> {
    let st = SafeTensors::deserialize(bytes).map_err(st_err(source))?;
    let prefix = match &opts.prefix {
        Some(p) => p.clone(),
        None => detect_prefix(&st.names())?,
    };
    let f = File { st, prefix };
    let scheme = if f.has("block_sparse_moe.gate.weight") { Scheme::Mixtral } else { Scheme::Mlp };
    let router_name = match scheme {
        Scheme::Mixtral => "block_sparse_moe.gate.weight",
        Scheme::Mlp => "mlp.gate.weight",
    };
    let (router, _, rshape) = f.get(router_name, &[])?;
    if rshape.len() != 2 {
        return Err(Error::shape(
            format!("tensor {}", f.name(router_name)),
            "[experts, hidden]",
            format!("{rshape:?}"),
        ));
    }
    let (e, h) = (rshape[0], rshape[1]);
    let c = opts.config.as_ref();
    if let Some(ce) = cfg_u32(c, &["num_local_experts", "num_experts", "n_routed_experts"]) {
        if ce as usize != e {
            return Err(Error::invalid(format!(
                "config.json says {ce} experts but `{}` has {e} rows",
                f.name(router_name)
            )));
        }
    }
    let expert = |i: usize, part: &str| match (scheme, part) {
        (Scheme::Mixtral, "gate") => format!("block_sparse_moe.experts.{i}.w1.weight"),
        (Scheme::Mixtral, "up") => format!("block_sparse_moe.experts.{i}.w3.weight"),
        (Scheme::Mixtral, _) => format!("block_sparse_moe.experts.{i}.w2.weight"),
        (Scheme::Mlp, p) => format!("mlp.experts.{i}.{p}_proj.weight"),
    };
    let first = f.st.tensor(&f.name(&expert(0, "gate"))).map_err(|_| {
        Error::invalid(format!("missing tensor `{}` (expected shape [ffn, {h}])", f.name(&expert(0, "gate"))))
    })?;
    let ffn = *first.shape().first().unwrap_or(&0);
    let file_dtype = first.dtype();
    let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..e {
        gate.extend(f.get(&expert(i, "gate"), &[ffn, h])?.0);
        up.extend(f.get(&expert(i, "up"), &[ffn, h])?.0);
        down.extend(f.get(&expert(i, "down"), &[h, ffn])?.0);
    }
    let bias = if f.has("mlp.gate.e_score_correction_bias") {
        Some(f.get("mlp.gate.e_score_correction_bias", &[e])?.0)
    } else {
        None
    };
    let shared_base = ["mlp.shared_expert.", "mlp.shared_experts."]
        .into_iter()
        .find(|b| f.has(&format!("{b}gate_proj.weight")));
    let shared = match shared_base {
        Some(b) => {
            let (g, _, gs) = f.get(&format!("{b}gate_proj.weight"), &[])?;
            let fs = gs[0];
            Some((
                g,
                f.get(&format!("{b}up_proj.weight"), &[fs, h])?.0,
                f.get(&format!("{b}down_proj.weight"), &[h, fs])?.0,
            ))
        }
        None => None,
    };
    let shared_ffn = shared.as_ref().map(|(g, _, _)| (g.len() / h) as u32);
    let shared_gate = if f.has("mlp.shared_expert_gate.weight") {
        Some(f.get("mlp.shared_expert_gate.weight", &[1, h])?.0)
    } else {
        None
    };
    let k = cfg_u32(c, &["num_experts_per_tok"]).or(opts.k).ok_or_else(|| {
        Error::invalid("the number of experts per token is not in the weights: pass a config.json or k")
    })?;
    let sigmoid = c.and_then(|c| c.get("scoring_func")).and_then(Value::as_str) == Some("sigmoid");
    let renormalize =
        c.and_then(|c| c.get("norm_topk_prob")).and_then(Value::as_bool).unwrap_or(scheme == Scheme::Mixtral);
    let scale = c.and_then(|c| c.get("routed_scaling_factor")).and_then(Value::as_f64).unwrap_or(1.0) as f32;
    let groups = match (cfg_u32(c, &["n_group"]), cfg_u32(c, &["topk_group"])) {
        (Some(n), Some(t)) if n > 1 => Some(GroupLimit { n_group: n, topk_group: t }),
        _ => None,
    };
    let weight_dtype = opts.dtype.unwrap_or(match file_dtype {
        Dtype::F16 => WeightDtype::F16,
        Dtype::BF16 => WeightDtype::Bf16,
        _ => WeightDtype::F32,
    });
    let cfg = MoeConfig {
        gating: if sigmoid { Gating::Sigmoid } else { Gating::Softmax },
        renormalize,
        scale,
        bias: bias.is_some(),
        groups,
        shared_ffn,
        shared_gate: shared_gate.is_some(),
        weight_dtype,
        ..MoeConfig::new(h as u32, ffn as u32, e as u32, k)
    };
    let weights = MoeWeights { router, bias, gate, up, down, shared, shared_gate };
    weights.check(&cfg)?;
    cfg.validate()?;
    Ok((cfg, weights, scheme))
}

/// Reads the input tensor `x` (or the file's only tensor) as `(values, tokens, hidden)`.
pub fn load_input(bytes: &[u8], source: &str) -> Result<(Vec<f32>, usize, usize)> {
    let st = SafeTensors::deserialize(bytes).map_err(st_err(source))?;
    let names = st.names();
    let name = if names.contains(&"x") {
        "x".to_string()
    } else if names.len() == 1 {
        names[0].to_string()
    } else {
        return Err(Error::invalid(format!(
            "{source} has no tensor `x` and more than one tensor: {names:?}"
        )));
    };
    let t = st.tensor(&name).map_err(st_err(source))?;
    let (tokens, hidden) = match t.shape() {
        [m, h] => (*m, *h),
        [h] => (1, *h),
        s => return Err(Error::shape(format!("input tensor {name}"), "[tokens, hidden]", format!("{s:?}"))),
    };
    Ok((to_f32(&name, &t)?, tokens, hidden))
}

/// A tensor to write: name, shape, and its data (f32 or u32).
pub enum OutTensor<'a> {
    /// f32 values.
    F32(&'a str, Vec<usize>, &'a [f32]),
    /// u32 values.
    U32(&'a str, Vec<usize>, &'a [u32]),
}

/// Writes tensors to a safetensors file.
pub fn write_tensors(path: &Path, tensors: &[OutTensor<'_>]) -> Result<()> {
    let views = tensors
        .iter()
        .map(|t| {
            let (name, dtype, shape, bytes): (&str, Dtype, &Vec<usize>, &[u8]) = match t {
                OutTensor::F32(n, s, d) => (n, Dtype::F32, s, bytemuck::cast_slice(d)),
                OutTensor::U32(n, s, d) => (n, Dtype::U32, s, bytemuck::cast_slice(d)),
            };
            TensorView::new(dtype, shape.clone(), bytes)
                .map(|v| (name.to_string(), v))
                .map_err(|e| Error::invalid(format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes =
        safetensors::serialize(views, None).map_err(|e| Error::invalid(format!("serialising: {e}")))?;
    std::fs::write(path, bytes).map_err(|source| Error::Io { path: path.display().to_string(), source })
}
