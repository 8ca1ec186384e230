//! Reading safetensors data: tensors to f32, stored dtypes, one layer's tensors by name with
//! their shapes checked ([`File`]) and FP8 tiles with their block scales, and input files.

use std::path::Path;

use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde_json::Value;

use super::checkpoint::TensorSource;
use super::naming::closest;
use crate::error::{Error, Result};
use crate::kernels::gemm::WeightDtype;
use crate::kernels::gemm::{QuantisedValues, StoredValues};
use crate::quant;

/// Reads a whole file.
///
/// # Errors
/// [`Error::Io`] naming the file.
pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io { path: path.display().to_string(), source })
}

pub(super) fn st_err(path: &str) -> impl Fn(safetensors::SafeTensorError) -> Error + '_ {
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
pub(super) fn stored_dtype(name: &str, d: Dtype) -> Result<WeightDtype> {
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

pub(super) struct File<'a> {
    pub(super) src: &'a dyn TensorSource,
    pub(super) prefix: String,
    /// The FP8 scale tile `config.json` gives (`quantization_config.weight_block_size`);
    /// None: inferred from each scale tensor's shape ([`File::fp8_scales`]).
    pub(super) fp8_block: Option<[usize; 2]>,
}

impl<'a> File<'a> {
    pub(super) fn name(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    pub(super) fn has(&self, rest: &str) -> bool {
        self.src.tensor(&self.name(rest)).is_some()
    }

    pub(super) fn view(&self, rest: &str, expected: &str) -> Result<TensorView<'a>> {
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
    pub(super) fn matrix_shape(&self, rest: &str, expected: &str) -> Result<[usize; 2]> {
        let t = self.view(rest, expected)?;
        match *t.shape() {
            [r, c] if r > 0 && c > 0 => Ok([r, c]),
            ref s => Err(Error::shape(format!("tensor {}", self.name(rest)), expected, format!("{s:?}"))),
        }
    }

    /// The tensor `prefix + rest`, checked against `shape` exactly and for a dtype moeflow
    /// reads (f32, f16, bf16, or FP8 e4m3 with its scale tensor, [`File::fp8_scales`]); its
    /// bytes are not read.
    pub(super) fn checked(&self, rest: &str, shape: &[usize]) -> Result<(String, TensorView<'a>)> {
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
    pub(super) fn get(&self, rest: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (name, t) = self.checked(rest, shape)?;
        to_f32(&name, &t)
    }

    /// The weight matrix `prefix + rest` (`[n, k]`) as f32: float values widened, FP8 e4m3
    /// decoded with its scales ([`quant::fp8_block_dequantize`], what the kernels read).
    pub(super) fn matrix(&self, rest: &str, [n, k]: [usize; 2]) -> Result<Vec<f32>> {
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
    pub(super) fn stored<'s>(
        &self,
        rest: &str,
        [n, k]: [usize; 2],
        scales: Option<&'s (Vec<f32>, [usize; 2])>,
    ) -> Result<StoredValues<'s>>
    where
        'a: 's,
    {
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

    /// The FP8 e4m3 weight `prefix + rest` (`[n, k]`) with its scales as they lie in the file,
    /// for the host to read in place: f32 scales aligned for f32 (DeepSeek-V3's and
    /// Qwen3-FP8's layout).
    ///
    /// # Errors
    /// As [`File::fp8_scales`]; [`Error::InvalidArgument`] for scales stored in another dtype
    /// (converted on load) or not aligned for f32 in the file.
    #[cfg(not(target_arch = "wasm32"))]
    pub(super) fn fp8_in_place(&self, rest: &str, [n, k]: [usize; 2]) -> Result<StoredValues<'a>> {
        let (_, t) = self.checked(rest, &[n, k])?;
        let (scale_name, scales, block) = self.fp8_tile(rest, [n, k])?;
        if scales.dtype() != Dtype::F32 {
            return Err(Error::invalid(format!(
                "FP8 scales `{scale_name}` are {:?}, converted to f32 on load: the host reads FP8 experts \
                 in place with f32 scales only",
                scales.dtype()
            )));
        }
        let scale_inv: &'a [f32] = bytemuck::try_cast_slice(scales.data()).map_err(|_| {
            Error::invalid(format!(
                "FP8 scales `{scale_name}` are not aligned for f32 in the file: the host cannot read them in place"
            ))
        })?;
        Ok(StoredValues::Quantised(QuantisedValues::Fp8 { weight: t.data(), scale_inv, block }))
    }

    /// The scales of the FP8 e4m3 weight `prefix + rest` (`[n, k]`, its name ending in
    /// `weight`): the `weight_scale_inv` tensor beside it (f32, f16 or bf16), one value per
    /// tile of the weight, `[ceil(n / t0), ceil(k / t1)]` for the tile `[t0, t1]`, with the
    /// tile. The tile is config.json's `quantization_config.weight_block_size`; without one,
    /// 128 × 128 (DeepSeek-V3's and Qwen3-FP8's) when the shape fits it, or the whole matrix
    /// for a single scale (shape `[]`, `[1]` or `[1, 1]`). Values are `e4m3(byte) ×
    /// scale_inv` (DeepSeek-V3's `weight_dequant`).
    pub(super) fn fp8_scales(&self, rest: &str, [n, k]: [usize; 2]) -> Result<(Vec<f32>, [usize; 2])> {
        let (scale_name, t, block) = self.fp8_tile(rest, [n, k])?;
        Ok((to_f32(&scale_name, &t)?, block))
    }

    /// [`File::fp8_scales`]' checks on the headers alone: the scale tensor's name, view and
    /// tile, its shape and dtype checked, its values not read.
    pub(super) fn fp8_tile(
        &self,
        rest: &str,
        [n, k]: [usize; 2],
    ) -> Result<(String, TensorView<'a>, [usize; 2])> {
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
pub(super) fn fp8_block_size(config: Option<&Value>) -> Result<Option<[usize; 2]>> {
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
