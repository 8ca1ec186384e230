//! Expert projections: SwiGLU expert FFNs over dispatched rows in one grouped GEMM per
//! projection, plus the comparison paths (bucketed with overflow, dense, all experts) and the
//! row-wise decode path. Weights are f32, f16 or bf16, packed in u32 words and unpacked in the
//! shader; accumulation is f32 in one fixed K order (see `wgsl/gemm/common.wgsl`), so a
//! token's outputs are bitwise the same whatever the batch, tile or path.
//!
//! Shapes: `x[tokens, H]`; `gate`, `up` `[E, F, H]`; `down` `[E, H, F]`;
//! `indices[tokens, k]`; output `partial[tokens * k, H]` indexed by entry `token * k + slot`.

use std::mem::offset_of;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use crate::context::Context;
use crate::context::wait::Driver;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{BucketLayout, DispatchLayout, META_OVERFLOW};
use crate::kernels::sizing::{LiveCount, LiveGrid, Sizing};
use crate::pipeline::{Access, Binding, BufferView, Dispatch, KernelSpec, TextureBinding, Workgroup};
use crate::shader::{Indexing, ShaderSource, wgsl};
use crate::sync::lock;
use crate::workspace::{Region, Scratch, ScratchKey};

mod quantised;
mod texture;
mod tune;
mod variant;

use quantised::NarrowScales;
pub use quantised::QuantisedValues;
use texture::TextureWeights;

pub(crate) use tune::tune_with;
pub use tune::{TUNE_DEFAULT_MARGIN, TuneOptions, Tuned, default_cache_path, tune, tune_async};
pub use variant::{AdapterKind, FfnKernels, GemmOrder, GemmVariant, candidates};
pub(crate) use variant::{WINDOW_BYTES, WeightLoads};

/// Token counts past this never use the row-wise decode path when the path is chosen
/// automatically (see [`uses_decode_path`]).
pub const DECODE_MAX_TOKENS: u32 = 8;

/// The row-wise kernel's module: x from storage or from uniform windows, each invocation
/// loading its own (`gemm/rowwise_entry.wgsl`) or a subgroup sharing its loads of a window
/// (`gemm/rowwise_x_subgroup.wgsl`); packed float, native f16 or quantised weights from their
/// buffers, or their texture copies.
macro_rules! rowwise_shader {
    // How x is read (RowX): from storage, from a window, from a window shared by a subgroup.
    ($name:literal, storage, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x.wgsl", "gemm/rowwise_entry.wgsl", $weights)
    };
    ($name:literal, window, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x_window.wgsl", "gemm/rowwise_entry.wgsl", $weights)
    };
    ($name:literal, subgroup, $weights:ident) => {
        rowwise_shader!($name, "gemm/rowwise_x_window.wgsl", "gemm/rowwise_x_subgroup.wgsl", $weights)
    };
    ($name:literal, $x:literal, $entry:literal, $($weights:literal),+) => {
        ShaderSource {
            name: concat!("gemm/", $name),
            parts: &[$(wgsl!($weights),)+ wgsl!($x), wgsl!("gemm/rowwise.wgsl"), wgsl!($entry)],
            entry_points: &["rowwise"],
            // Rows below the live count and the dispatch's window rows, columns clamped to the
            // chunk's, entries as the caller's or the layout's row map holds them (below the
            // bound views' rows), the expert read back only through in_chunk, K below kdim in
            // every loop, x windows within the WINDOW_BYTES the host sized them to.
            indexing: Indexing::Proven,
        }
    };
    ($name:literal, $x:literal, $entry:literal, packed) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_packed.wgsl",
            "gemm/half.wgsl",
            "gemm/quant.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, quant) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_quant.wgsl",
            "gemm/half.wgsl",
            "gemm/quant.wgsl",
            "gemm/quant_blocks.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots_quant.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, f16) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/enable_f16.wgsl",
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/weights_f16.wgsl",
            "gemm/rowwise_w_packed.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
    ($name:literal, $x:literal, $entry:literal, texture) => {
        rowwise_shader!(
            $name,
            $x,
            $entry,
            "gemm/common.wgsl",
            "gemm/order.wgsl",
            "gemm/half.wgsl",
            "gemm/weights_texture.wgsl",
            "gemm/rowwise_w_texture.wgsl",
            "gemm/rowwise_dots.wgsl",
            "gemm/epilogue.wgsl"
        )
    };
}
static ROWWISE_SHADER: ShaderSource = rowwise_shader!("rowwise", storage, packed);
static ROWWISE_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_f16", storage, f16);
static ROWWISE_QUANT_SHADER: ShaderSource = rowwise_shader!("rowwise_quant", storage, quant);
static ROWWISE_TEXTURE_SHADER: ShaderSource = rowwise_shader!("rowwise_texture", storage, texture);
static ROWWISE_WINDOW_SHADER: ShaderSource = rowwise_shader!("rowwise_window", window, packed);
static ROWWISE_WINDOW_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_window_f16", window, f16);
static ROWWISE_WINDOW_QUANT_SHADER: ShaderSource = rowwise_shader!("rowwise_window_quant", window, quant);
static ROWWISE_WINDOW_TEXTURE_SHADER: ShaderSource =
    rowwise_shader!("rowwise_window_texture", window, texture);
static ROWWISE_SUBGROUP_SHADER: ShaderSource = rowwise_shader!("rowwise_subgroup", subgroup, packed);
static ROWWISE_SUBGROUP_F16_SHADER: ShaderSource = rowwise_shader!("rowwise_subgroup_f16", subgroup, f16);
static ROWWISE_SUBGROUP_QUANT_SHADER: ShaderSource =
    rowwise_shader!("rowwise_subgroup_quant", subgroup, quant);
static ROWWISE_SUBGROUP_TEXTURE_SHADER: ShaderSource =
    rowwise_shader!("rowwise_subgroup_texture", subgroup, texture);

/// The gemm family's shader modules (the `_f16` ones need the shader-f16 feature): the
/// row-wise kernel and the generated block kernels of every [`contract_variants`] variant in
/// both orders (the contract test checks them; the tuner's cache keys hash them).
pub(crate) fn shaders() -> Vec<&'static ShaderSource> {
    let mut all = vec![
        &ROWWISE_SHADER,
        &ROWWISE_F16_SHADER,
        &ROWWISE_QUANT_SHADER,
        &ROWWISE_WINDOW_SHADER,
        &ROWWISE_WINDOW_F16_SHADER,
        &ROWWISE_WINDOW_QUANT_SHADER,
        &ROWWISE_TEXTURE_SHADER,
        &ROWWISE_WINDOW_TEXTURE_SHADER,
        &ROWWISE_SUBGROUP_SHADER,
        &ROWWISE_SUBGROUP_F16_SHADER,
        &ROWWISE_SUBGROUP_QUANT_SHADER,
        &ROWWISE_SUBGROUP_TEXTURE_SHADER,
        &STAGE_SHADER,
        &UNPACK_SHADER,
        &texture::PACK_SHADER,
    ];
    for v in contract_variants() {
        for order in [GemmOrder::Strict, GemmOrder::Fast] {
            for loads in WeightLoads::ALL {
                all.push(variant::spec(v, order, loads).shader);
            }
        }
    }
    all
}

/// The kernels an FFN with `variants` as its block kernels can run, in `order`, reading the
/// weights with `loads`: the blocks, their window and direct fallbacks, the staging, packing
/// and row-wise kernels (for the requirements of a configuration).
pub(crate) fn specs_for(
    variants: &[GemmVariant],
    order: GemmOrder,
    loads: WeightLoads,
) -> Vec<&'static KernelSpec> {
    let mut all: Vec<&'static KernelSpec> = vec![
        &STAGE,
        &texture::PACK,
        &ROWWISE,
        &ROWWISE_F16,
        &ROWWISE_QUANT,
        &ROWWISE_TEXTURE,
        &ROWWISE_WINDOW,
        &ROWWISE_WINDOW_F16,
        &ROWWISE_WINDOW_QUANT,
        &ROWWISE_WINDOW_TEXTURE,
        &ROWWISE_SUBGROUP,
        &ROWWISE_SUBGROUP_F16,
        &ROWWISE_SUBGROUP_QUANT,
        &ROWWISE_SUBGROUP_TEXTURE,
    ];
    for &v in variants {
        for v in [v, v.without_texture(), v.without_window()] {
            all.push(variant::spec(v, order, loads));
        }
    }
    all
}

/// Every candidate variant of every kind of adapter, and f16-staged tiles (which are never
/// candidates), once each: the variants the contract tests build.
fn contract_variants() -> Vec<GemmVariant> {
    let mut variants: Vec<GemmVariant> = AdapterKind::ALL.into_iter().flat_map(candidates).collect();
    variants.push(GemmVariant::TileF16 { rows: 64, cols: 64, tm: 4, tn: 4, bk4: 4 });
    variants.push(GemmVariant::TileF16 { rows: 128, cols: 128, tm: 8, tn: 8, bk4: 2 });
    variants.sort_by_key(|v| v.name());
    variants.dedup();
    variants
}

/// Every gemm kernel (for the contract test, `src/contract.rs`): the unpack kernel and
/// [`specs_for`] every [`contract_variants`] variant in both orders, with every way of loading
/// weights.
#[cfg(test)]
pub(crate) fn specs() -> Vec<&'static KernelSpec> {
    let variants = contract_variants();
    let mut all: Vec<&'static KernelSpec> = vec![&UNPACK];
    for order in [GemmOrder::Strict, GemmOrder::Fast] {
        for loads in WeightLoads::ALL {
            for spec in specs_for(&variants, order, loads) {
                if !all.iter().any(|s| std::ptr::eq(*s, spec)) {
                    all.push(spec);
                }
            }
        }
    }
    all
}

static STAGE_SHADER: ShaderSource = ShaderSource {
    name: "gemm/stage",
    parts: &[wgsl!("gemm/common.wgsl"), wgsl!("gemm/stage.wgsl")],
    entry_points: &["stage"],
    indexing: Indexing::Checked,
};

/// The weights' values as the kernels load them (`ExpertWeights::unpack`).
static UNPACK_SHADER: ShaderSource = ShaderSource {
    name: "gemm/unpack",
    parts: &[
        wgsl!("gemm/common.wgsl"),
        wgsl!("gemm/weights_packed.wgsl"),
        wgsl!("gemm/half.wgsl"),
        wgsl!("gemm/quant.wgsl"),
        wgsl!("gemm/unpack.wgsl"),
    ],
    entry_points: &["unpack"],
    indexing: Indexing::Checked,
};

use Access::{Read, ReadWrite, TextureU32, Uniform};
/// Bytes of `GemmParams` (wgsl/gemm/common.wgsl).
pub(crate) const PARAMS_BYTES: u64 = std::mem::size_of::<Params>() as u64;
static STAGE: KernelSpec = KernelSpec {
    shader: &STAGE_SHADER,
    entry: "stage",
    bindings: &[(0, Uniform), (1, ReadWrite), (4, ReadWrite), (7, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};
static UNPACK: KernelSpec = KernelSpec {
    shader: &UNPACK_SHADER,
    entry: "unpack",
    bindings: &[(0, Uniform), (2, Read), (3, Read), (6, ReadWrite)],
    params_bytes: PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};
/// Bindings of the row-wise kernel reading x from a window (9) instead of storage (1).
const ROWWISE_WINDOW_BINDINGS: &[(u32, Access)] = &[
    (0, Uniform),
    (2, Read),
    (3, Read),
    (4, ReadWrite),
    (6, ReadWrite),
    (7, ReadWrite),
    (8, ReadWrite),
    (9, Uniform),
    (10, ReadWrite),
];
/// Bindings of the row-wise kernel reading x from storage.
const ROWWISE_BINDINGS: &[(u32, Access)] = &[
    (0, Uniform),
    (1, ReadWrite),
    (2, Read),
    (3, Read),
    (4, ReadWrite),
    (6, ReadWrite),
    (7, ReadWrite),
    (8, ReadWrite),
    (10, ReadWrite),
];
/// [`ROWWISE_WINDOW_BINDINGS`] with the weights (2, 3) as textures.
const ROWWISE_WINDOW_TEXTURE_BINDINGS: &[(u32, Access)] = &[
    (0, Uniform),
    (2, TextureU32),
    (3, TextureU32),
    (4, ReadWrite),
    (6, ReadWrite),
    (7, ReadWrite),
    (8, ReadWrite),
    (9, Uniform),
    (10, ReadWrite),
];
/// [`ROWWISE_BINDINGS`] with the weights (2, 3) as textures.
const ROWWISE_TEXTURE_BINDINGS: &[(u32, Access)] = &[
    (0, Uniform),
    (1, ReadWrite),
    (2, TextureU32),
    (3, TextureU32),
    (4, ReadWrite),
    (6, ReadWrite),
    (7, ReadWrite),
    (8, ReadWrite),
    (10, ReadWrite),
];
/// A row-wise kernel: 64 invocations per workgroup, one per (row, column) output.
const fn rowwise(shader: &'static ShaderSource, bindings: &'static [(u32, Access)]) -> KernelSpec {
    KernelSpec {
        shader,
        entry: "rowwise",
        bindings,
        params_bytes: PARAMS_BYTES,
        workgroup: Workgroup::Fixed(64),
    }
}
static ROWWISE: KernelSpec = rowwise(&ROWWISE_SHADER, ROWWISE_BINDINGS);
static ROWWISE_F16: KernelSpec = rowwise(&ROWWISE_F16_SHADER, ROWWISE_BINDINGS);
static ROWWISE_QUANT: KernelSpec = rowwise(&ROWWISE_QUANT_SHADER, ROWWISE_BINDINGS);
static ROWWISE_TEXTURE: KernelSpec = rowwise(&ROWWISE_TEXTURE_SHADER, ROWWISE_TEXTURE_BINDINGS);
static ROWWISE_WINDOW: KernelSpec = rowwise(&ROWWISE_WINDOW_SHADER, ROWWISE_WINDOW_BINDINGS);
static ROWWISE_WINDOW_F16: KernelSpec = rowwise(&ROWWISE_WINDOW_F16_SHADER, ROWWISE_WINDOW_BINDINGS);
static ROWWISE_WINDOW_QUANT: KernelSpec = rowwise(&ROWWISE_WINDOW_QUANT_SHADER, ROWWISE_WINDOW_BINDINGS);
static ROWWISE_WINDOW_TEXTURE: KernelSpec =
    rowwise(&ROWWISE_WINDOW_TEXTURE_SHADER, ROWWISE_WINDOW_TEXTURE_BINDINGS);
static ROWWISE_SUBGROUP: KernelSpec = rowwise(&ROWWISE_SUBGROUP_SHADER, ROWWISE_WINDOW_BINDINGS);
static ROWWISE_SUBGROUP_F16: KernelSpec = rowwise(&ROWWISE_SUBGROUP_F16_SHADER, ROWWISE_WINDOW_BINDINGS);
static ROWWISE_SUBGROUP_QUANT: KernelSpec = rowwise(&ROWWISE_SUBGROUP_QUANT_SHADER, ROWWISE_WINDOW_BINDINGS);
static ROWWISE_SUBGROUP_TEXTURE: KernelSpec =
    rowwise(&ROWWISE_SUBGROUP_TEXTURE_SHADER, ROWWISE_WINDOW_TEXTURE_BINDINGS);

/// Storage type of expert weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum WeightDtype {
    /// 32-bit floats.
    #[default]
    F32,
    /// IEEE half precision, two per u32 word (low half first).
    F16,
    /// bfloat16, two per u32 word (low half first).
    Bf16,
    /// ggml's Q8_0: blocks of 32 signed bytes with one f16 scale (8.5 bits a value).
    #[serde(rename = "q8_0")]
    Q8_0,
    /// ggml's Q4_0: blocks of 32 nibbles (value − 8) with one f16 scale (4.5 bits a value).
    #[serde(rename = "q4_0")]
    Q4_0,
    /// MXFP4 (OCP Microscaling): blocks of 32 FP4 e2m1 codes with one E8M0 scale (4.25 bits a
    /// value), as gpt-oss ships its experts.
    Mxfp4,
    /// FP8 e4m3 with one f32 `scale_inv` per 128 values along K (8.25 bits a value on the
    /// device); DeepSeek-V3's and Qwen3-FP8's 128 × 128 tiles give each row its tile's scale.
    Fp8,
}

impl WeightDtype {
    /// The `DTYPE` pipeline constant of kernels reading these weights as packed words.
    pub(crate) fn code(self) -> f64 {
        match self {
            WeightDtype::F32 => 0.0,
            WeightDtype::F16 => 1.0,
            WeightDtype::Bf16 => 2.0,
            WeightDtype::Q8_0 => 3.0,
            WeightDtype::Q4_0 => 4.0,
            WeightDtype::Mxfp4 => 5.0,
            WeightDtype::Fp8 => 6.0,
        }
    }

    /// Whether this is a block-quantised format (Q8_0, Q4_0, MXFP4, FP8).
    pub fn is_quantised(self) -> bool {
        quantised::group(self).is_some()
    }

    /// The values the shader sees for weight rows of `k` values (`data.len() / k` rows)
    /// uploaded as this dtype: each value rounded to nearest even for f16 and bf16; for the
    /// quantised formats, the rows quantised block by block along K and decoded exactly
    /// ([`crate::quant`]'s decoders; see docs/quant.md for the rules).
    ///
    /// # Errors
    /// For a quantised dtype: `k == 0`, a length that is not whole rows, or a value that is not
    /// finite ([`Error::InvalidArgument`]). Float dtypes never fail.
    pub fn round(self, data: &[f32], k: usize) -> Result<Vec<f32>> {
        Ok(match self {
            WeightDtype::F32 => data.to_vec(),
            WeightDtype::F16 => data.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
            WeightDtype::Bf16 => data.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => {
                quantised::quantise_rows(self, data, k)?.1
            }
        })
    }

    /// Packs weight rows of `k` values into the u32 words the kernels read (the f32 words,
    /// halves low half first, or the quantised groups of docs/quant.md).
    ///
    /// # Errors
    /// As [`WeightDtype::round`].
    pub fn pack(self, data: &[f32], k: usize) -> Result<Vec<u32>> {
        let halves: Vec<u16> = match self {
            WeightDtype::F32 => return Ok(data.iter().map(|v| v.to_bits()).collect()),
            WeightDtype::F16 => data.iter().map(|&v| f16::from_f32(v).to_bits()).collect(),
            WeightDtype::Bf16 => data.iter().map(|&v| bf16::from_f32(v).to_bits()).collect(),
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => {
                return Ok(quantised::quantise_rows(self, data, k)?.0);
            }
        };
        Ok(halves.chunks(2).map(|p| u32::from(p[0]) | (u32::from(*p.get(1).unwrap_or(&0)) << 16)).collect())
    }

    /// Bytes of one element for the float dtypes; None for the quantised formats, whose
    /// values share their blocks' scales.
    pub fn element_bytes(self) -> Option<usize> {
        match self {
            WeightDtype::F32 => Some(4),
            WeightDtype::F16 | WeightDtype::Bf16 => Some(2),
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => None,
        }
    }

    /// Bytes on the device of `rows` weight rows of `k` values.
    pub fn packed_bytes(self, rows: u64, k: u64) -> u64 {
        match self {
            WeightDtype::F32 => 4 * rows * k,
            WeightDtype::F16 | WeightDtype::Bf16 => 4 * (rows * k).div_ceil(2),
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => {
                4 * rows * quantised::row_words(self, k)
            }
        }
    }
}

/// Weights of `E` experts, each `[n, k]` (out x in), packed on the device: in one buffer, or
/// in chunks of whole experts (or of output columns within an expert) where the tensor is past
/// the device's storage-binding limit ([`ExpertWeights::chunk_count`]).
#[derive(Debug)]
pub struct ExpertWeights {
    chunks: Vec<WeightChunk>,
    dtype: WeightDtype,
    experts: u32,
    n: u32,
    k: u32,
    native_f16: bool,
    /// MXFP4 weights whose every block scale below K is in [`quantised::MXFP4_NARROW_SCALES`]:
    /// the kernels decode them with one product per value (`NARROW_SCALES` in
    /// wgsl/gemm/common.wgsl). False for every other dtype.
    narrow_scales: bool,
    /// The texture copy texture variants read, made on first use: None until then, then
    /// Some(None) where the weights are past the device's texture limits.
    texture: Mutex<Option<Option<Arc<TextureWeights>>>>,
}

/// One expert's `[n, k]` values as a file stores them.
#[derive(Clone, Copy, Debug)]
pub enum StoredValues<'a> {
    /// Little-endian elements of a float dtype (f32, f16 or bf16), `n * k` of them.
    Float {
        /// The element type of `bytes`.
        dtype: WeightDtype,
        /// `n * k` elements, little-endian.
        bytes: &'a [u8],
    },
    /// Quantised blocks of one expert (`[1, n, k]` in [`QuantisedValues`]' terms).
    Quantised(QuantisedValues<'a>),
}

impl StoredValues<'_> {
    /// The dtype the values are stored in.
    pub fn dtype(&self) -> WeightDtype {
        match self {
            StoredValues::Float { dtype, .. } => *dtype,
            StoredValues::Quantised(q) => q.dtype(),
        }
    }

    /// Checks that these are the `n * k` values of expert `e` of `[experts, n, k]`.
    fn check(&self, e: u32, [experts, n, k]: [u32; 3]) -> Result<()> {
        let StoredValues::Float { dtype, bytes } = *self else {
            return Ok(()); // `QuantisedValues` checks its own lengths when it is read.
        };
        let per_expert = u64::from(n) * u64::from(k);
        let want = per_expert * stored_element_bytes(dtype)? as u64;
        if bytes.len() as u64 != want {
            return Err(Error::shape(
                format!("expert {e} of [{experts}, {n}, {k}]"),
                format!("{per_expert} {dtype:?} elements ({want} bytes)"),
                format!("{} bytes", bytes.len()),
            ));
        }
        Ok(())
    }

    /// Appends rows `rows` of these `[n, k]` values to `out` as `to` lays them out on the
    /// device (f32 words, halves low half first, or quantised groups): as stored when `to` is
    /// their dtype, else rounded to nearest even for a narrower float and quantised for a
    /// quantised `to`, exactly as [`WeightDtype::pack`] does from f32 (quantised values are
    /// decoded to f32 first, by [`QuantisedValues::dequantise`]).
    fn append_as(
        &self,
        to: WeightDtype,
        [n, k]: [usize; 2],
        rows: Range<usize>,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let values: Vec<f32> = match *self {
            StoredValues::Float { dtype, bytes } => {
                let eb = stored_element_bytes(dtype)?;
                let bytes = &bytes[rows.start * k * eb..rows.end * k * eb];
                if dtype == to {
                    out.extend_from_slice(bytes);
                    return Ok(());
                }
                bytes
                    .chunks_exact(eb)
                    .map(|b| match dtype {
                        WeightDtype::F16 => f16::from_le_bytes([b[0], b[1]]).to_f32(),
                        WeightDtype::Bf16 => bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                        _ => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                    })
                    .collect()
            }
            StoredValues::Quantised(q) if q.dtype() == to => {
                let words = q.device_words([1, n, k])?;
                let row = quantised::row_words(to, k as u64) as usize;
                out.extend_from_slice(bytemuck::cast_slice(&words[rows.start * row..rows.end * row]));
                return Ok(());
            }
            StoredValues::Quantised(q) => q.dequantise([1, n, k])?[rows.start * k..rows.end * k].to_vec(),
        };
        match to {
            // Element by element: a row of odd length leaves half a word for the next.
            WeightDtype::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            WeightDtype::F16 => {
                values.iter().for_each(|&v| out.extend_from_slice(&f16::from_f32(v).to_le_bytes()))
            }
            WeightDtype::Bf16 => {
                values.iter().for_each(|&v| out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()))
            }
            WeightDtype::Q8_0 | WeightDtype::Q4_0 | WeightDtype::Mxfp4 | WeightDtype::Fp8 => {
                out.extend_from_slice(bytemuck::cast_slice(&to.pack(&values, k)?));
            }
        }
        Ok(())
    }
}

/// Bytes of one stored element of `dtype`, which must be a float dtype.
fn stored_element_bytes(dtype: WeightDtype) -> Result<usize> {
    dtype.element_bytes().ok_or_else(|| {
        Error::invalid(format!(
            "expert values stored as {dtype:?} cannot be streamed as elements; stored values are f32, f16 or bf16"
        ))
    })
}

/// Host bytes [`ExpertWeights::stream`] gathers before each write to the device.
pub(crate) const STREAM_CHUNK: usize = 16 << 20;

/// Writes the whole u32 words of `pending` to `buffer` at `offset` (all of it, padded to a
/// word, when `last`; an odd half-word otherwise waits for the next expert), moves `offset` past
/// them, and waits (as `driver` says) until the device has taken them, so that the queue's
/// staging memory stays one chunk.
async fn flush_staged(
    ctx: &Context,
    buffer: &wgpu::Buffer,
    pending: &mut Vec<u8>,
    offset: &mut u64,
    last: bool,
    driver: Driver,
) -> Result<()> {
    if last {
        pending.resize(pending.len().next_multiple_of(4), 0);
    }
    let whole = pending.len() / 4 * 4;
    ctx.checked("writing expert weights", || ctx.queue().write_buffer(buffer, *offset, &pending[..whole]))?;
    *offset += whole as u64;
    pending.drain(..whole);
    ctx.submitted(ctx.encoder("expert weights upload"), driver).await
}

/// One buffer of a projection's weights: experts `experts`, and of each the output columns
/// `cols`, as `[experts.len(), cols.len(), k]` packed words from word 0.
#[derive(Debug)]
struct WeightChunk {
    buffer: wgpu::Buffer,
    experts: Range<u32>,
    cols: Range<u32>,
    bytes: u64,
}

/// How `[experts, n, k]` weights of `dtype` split into chunks of at most `limit` bytes: whole
/// experts, as many per chunk as fit; or, where one expert alone is past the limit, each
/// expert in runs of whole output columns (rows of the weight matrix). K is never split.
fn chunking(
    dtype: WeightDtype,
    [experts, n, k]: [u32; 3],
    limit: u64,
) -> Result<Vec<(Range<u32>, Range<u32>)>> {
    // Word indices inside a chunk are u32; keep every element index below 2^32 too.
    let limit = limit.min(u64::from(u32::MAX) + 1);
    let (n64, k64) = (u64::from(n), u64::from(k));
    let fits = |rows: u64| dtype.packed_bytes(rows, k64) <= limit && rows * k64 <= u64::from(u32::MAX) + 1;
    if fits(n64) {
        let mut per_chunk = (limit / dtype.packed_bytes(n64, k64).max(1)).max(1);
        while per_chunk > 1 && !fits(per_chunk * n64) {
            per_chunk -= 1;
        }
        let per_chunk = u32::try_from(per_chunk).unwrap_or(u32::MAX);
        return Ok((0..experts)
            .step_by(per_chunk as usize)
            .map(|e0| (e0..e0.saturating_add(per_chunk).min(experts), 0..n))
            .collect());
    }
    let mut per_chunk = limit / dtype.packed_bytes(1, k64).max(1);
    while per_chunk > 0 && !fits(per_chunk) {
        per_chunk -= 1;
    }
    if per_chunk == 0 {
        return Err(Error::limit(
            format!("one output column of the expert weights [{experts}, {n}, {k}] as {dtype:?}"),
            dtype.packed_bytes(1, k64),
            limit,
            "max_storage_buffer_binding_size (weights split by expert and by output column, never along K)",
        ));
    }
    let per_chunk = u32::try_from(per_chunk).unwrap_or(u32::MAX);
    Ok((0..experts)
        .flat_map(|e| {
            (0..n)
                .step_by(per_chunk as usize)
                .map(move |c0| (e..e + 1, c0..c0.saturating_add(per_chunk).min(n)))
        })
        .collect())
}

impl ExpertWeights {
    /// Checks `[experts, n, k]` as `dtype`; returns its chunks for this device's limits.
    fn chunks_for(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
    ) -> Result<Vec<(Range<u32>, Range<u32>)>> {
        let [experts, n, k] = shape;
        if experts == 0 || n == 0 || k == 0 {
            return Err(Error::invalid(format!(
                "expert weights [{experts}, {n}, {k}] have an empty dimension"
            )));
        }
        let limits = ctx.limits();
        chunking(dtype, shape, limits.max_storage_buffer_binding_size.min(limits.max_buffer_size) / 4 * 4)
    }

    /// `narrow_scales`: whether every MXFP4 block scale of the uploaded words is narrow.
    fn on_device(
        ctx: &Context,
        chunks: Vec<WeightChunk>,
        dtype: WeightDtype,
        shape: [u32; 3],
        narrow_scales: NarrowScales,
    ) -> Self {
        let [experts, n, k] = shape;
        ExpertWeights {
            chunks,
            dtype,
            experts,
            n,
            k,
            native_f16: dtype == WeightDtype::F16 && ctx.capabilities().shader_f16,
            narrow_scales: narrow_scales.hold(),
            texture: Mutex::new(None),
        }
    }

    /// The texture copy of these weights ([`texture`]), made on the device the first time it
    /// is asked for; None where it would be past the device's texture limits.
    fn texture(&self, ctx: &Context) -> Result<Option<Arc<TextureWeights>>> {
        let mut slot = lock(&self.texture);
        if let Some(made) = &*slot {
            return Ok(made.clone());
        }
        let made = TextureWeights::new(ctx, self)?;
        *slot = Some(made.clone());
        Ok(made)
    }

    /// Whether a texture copy of these weights is on the device (texture variants make it the
    /// first time they are planned with these weights; it takes as many bytes again as the
    /// packed weights, rows padded to whole texels).
    pub fn has_texture(&self) -> bool {
        matches!(*lock(&self.texture), Some(Some(_)))
    }

    /// Uploads `data[experts, n, k]`, rounding to `dtype`, split into as many buffers as the
    /// device's binding limit needs (see [`ExpertWeights::chunk_count`]).
    ///
    /// # Errors
    /// [`Error::Shape`] when `data` is not `experts * n * k` values; [`Error::LimitExceeded`]
    /// when a single expert matrix is past the binding limit; device errors while uploading.
    pub fn from_f32(
        ctx: &Context,
        data: &[f32],
        dtype: WeightDtype,
        experts: u32,
        n: u32,
        k: u32,
    ) -> Result<Self> {
        let elems = u64::from(experts) * u64::from(n) * u64::from(k);
        if data.len() as u64 != elems {
            return Err(Error::shape(
                "expert weights",
                format!("[{experts}, {n}, {k}] = {elems} elements"),
                data.len(),
            ));
        }
        let plan = Self::chunks_for(ctx, dtype, [experts, n, k])?;
        let (n64, k64) = (n as usize, k as usize);
        Self::upload_chunks(ctx, dtype, [experts, n, k], plan, |es, cs| {
            let mut values = Vec::new();
            for e in es {
                let row0 = (e as usize * n64 + cs.start as usize) * k64;
                values.extend_from_slice(&data[row0..row0 + cs.len() * k64]);
            }
            dtype.pack(&values, k64)
        })
    }

    /// Uploads `[experts, n, k]` weights of `dtype` in the chunks of `plan` ([`Self::chunks_for`]),
    /// each chunk's device words from `words(experts, cols)`.
    fn upload_chunks(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        plan: Vec<(Range<u32>, Range<u32>)>,
        mut words: impl FnMut(Range<u32>, Range<u32>) -> Result<Vec<u32>>,
    ) -> Result<Self> {
        let mut narrow = NarrowScales::new(dtype, shape[2]);
        let mut chunks = Vec::with_capacity(plan.len());
        for (es, cs) in plan {
            let chunk = words(es.clone(), cs.clone())?;
            narrow.see(&chunk);
            chunks.push(WeightChunk {
                buffer: ctx.upload("expert weights", &chunk)?,
                experts: es,
                cols: cs,
                bytes: chunk.len() as u64 * 4,
            });
        }
        Ok(Self::on_device(ctx, chunks, dtype, shape, narrow))
    }

    /// Uploads `[experts, n, k]` weights a checkpoint stores quantised, as they are (no
    /// requantisation): the kernels read exactly [`QuantisedValues::dequantise`]'s values. Split
    /// across buffers as [`ExpertWeights::from_f32`] splits them.
    ///
    /// # Errors
    /// [`Error::Shape`] when a length does not match the shape; [`Error::InvalidArgument`] for
    /// Q8_0, Q4_0 or MXFP4 with K not a multiple of 32, or FP8 scale tiles that split a group
    /// of 128 along K; as [`ExpertWeights::from_f32`] for sizes and device errors.
    pub fn from_quantised(
        ctx: &Context,
        values: QuantisedValues<'_>,
        experts: u32,
        n: u32,
        k: u32,
    ) -> Result<Self> {
        let dtype = values.dtype();
        let plan = Self::chunks_for(ctx, dtype, [experts, n, k])?;
        let words = values.device_words([experts as usize, n as usize, k as usize])?;
        let row = quantised::row_words(dtype, u64::from(k)) as usize;
        Self::upload_chunks(ctx, dtype, [experts, n, k], plan, |es, cs| {
            let mut chunk = Vec::with_capacity(es.len() * cs.len() * row);
            for e in es {
                let first = e as usize * n as usize + cs.start as usize;
                chunk.extend_from_slice(&words[first * row..(first + cs.len()) * row]);
            }
            Ok(chunk)
        })
    }

    /// Uploads `[experts, n, k]` expert by expert without a host copy of the whole tensor:
    /// `values(e)` gives expert `e`'s `[n, k]` values as stored (float elements or quantised
    /// blocks, for example from a memory-mapped checkpoint tensor), converted to `dtype` one
    /// expert at a time; values already in `dtype` reach the device as they are (quantised
    /// blocks regrouped into the device layout, bit for bit as
    /// [`ExpertWeights::from_quantised`] lays them out). Values converted to another dtype are
    /// decoded to f32 first. Host memory beyond the caller's is one expert's converted values
    /// plus a 16 MiB staging chunk, which is flushed to the device (and waited for, on the
    /// calling thread: [`Self::stream_async`] awaits it instead) as it fills. `released(e)` is
    /// called once expert `e` is on its way, so a caller can drop its pages. The weights are split across buffers as [`ExpertWeights::from_f32`] splits
    /// them, and are bit-identical to its on the same values.
    ///
    /// # Errors
    /// An empty dimension, a size past the device's limits, an expert whose byte length is
    /// not `n * k` elements of its dtype (or whose blocks do not match `[1, n, k]`), an error
    /// from `values`, or a device error.
    pub fn stream<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        released: impl FnMut(u32),
    ) -> Result<Self> {
        Self::stream_in_chunks(ctx, dtype, shape, values, released, STREAM_CHUNK)
    }

    /// [`Self::stream`] without blocking the awaiting thread: each flush of the staging chunk
    /// is awaited (a thread of moeflow's polls the device and wakes the task).
    ///
    /// # Errors
    /// As [`Self::stream`].
    pub async fn stream_async<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        released: impl FnMut(u32),
    ) -> Result<Self> {
        Self::stream_with(ctx, dtype, shape, values, released, STREAM_CHUNK, Driver::Thread).await
    }

    /// [`ExpertWeights::stream`] with `staging` bytes of staging.
    fn stream_in_chunks<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        released: impl FnMut(u32),
        staging: usize,
    ) -> Result<Self> {
        pollster::block_on(Self::stream_with(ctx, dtype, shape, values, released, staging, Driver::Inline))
    }

    /// [`ExpertWeights::stream`] with `staging` bytes of staging, its flushes waited for as
    /// `driver` says.
    pub(crate) async fn stream_with<'a>(
        ctx: &Context,
        dtype: WeightDtype,
        shape: [u32; 3],
        mut values: impl FnMut(u32) -> Result<StoredValues<'a>>,
        mut released: impl FnMut(u32),
        staging: usize,
        driver: Driver,
    ) -> Result<Self> {
        let [_, n, k] = shape;
        let plan = Self::chunks_for(ctx, dtype, shape)?;
        let mut pending: Vec<u8> = Vec::with_capacity(staging + 4);
        let mut narrow = NarrowScales::new(dtype, k);
        let mut chunks = Vec::with_capacity(plan.len());
        for (es, cs) in plan {
            let rows = u64::from(es.end - es.start) * cs.len() as u64;
            let bytes = dtype.packed_bytes(rows, u64::from(k));
            let buffer = ctx.zeroed("expert weights", bytes)?;
            let mut offset = 0u64;
            for e in es.clone() {
                let v = values(e)?;
                v.check(e, shape)?;
                let from = pending.len();
                v.append_as(
                    dtype,
                    [n as usize, k as usize],
                    cs.start as usize..cs.end as usize,
                    &mut pending,
                )?;
                // Quantised rows are whole words: `pending` holds no half word before them.
                narrow.see_bytes(&pending[from..]);
                if cs.end == n {
                    released(e);
                }
                if pending.len() >= staging {
                    flush_staged(ctx, &buffer, &mut pending, &mut offset, false, driver).await?;
                }
            }
            flush_staged(ctx, &buffer, &mut pending, &mut offset, true, driver).await?;
            chunks.push(WeightChunk { buffer, experts: es, cols: cs, bytes });
        }
        Ok(Self::on_device(ctx, chunks, dtype, shape, narrow))
    }

    /// Whether these are MXFP4 weights whose every block scale (below K) is 2^-125 ..= 2^125
    /// (E8M0 bytes 2 ..= 252; what [`crate::quant::mxfp4_quantize`] gives every block whose
    /// largest magnitude is 2^-123 or more), which the kernels decode with one exact f32 product
    /// per value: twice the FP4 magnitude, an integer up to 12, times 2^(s - 128). Other MXFP4
    /// weights take the bit-by-bit decoding that is exact under every scale. Both give
    /// [`crate::quant::mxfp4_dequantize`]'s values bit for bit. False for other dtypes.
    pub fn narrow_scales(&self) -> bool {
        self.narrow_scales
    }

    /// How many buffers (storage bindings) hold these weights: 1 unless they are past the
    /// device's `max_storage_buffer_binding_size` (or `max_buffer_size`). Split weights run
    /// one dispatch per chunk in every path, with the same results bit for bit.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Chooses native f16 loads (the default for f16 weights where the device has
    /// shader-f16) or the packed integer unpacking; both see the same values. Asking for
    /// native loads without shader-f16, or for non-f16 weights, is an error.
    ///
    /// # Errors
    /// [`Error::MissingFeature`] without shader-f16; [`Error::InvalidArgument`] for weights
    /// that are not f16.
    pub fn with_native_f16(mut self, ctx: &Context, on: bool) -> Result<Self> {
        if on && !ctx.capabilities().shader_f16 {
            return Err(Error::MissingFeature("native f16 weights need the shader-f16 feature".into()));
        }
        if on && self.dtype != WeightDtype::F16 {
            return Err(Error::invalid(format!(
                "native f16 loads need f16 weights, these are {:?}",
                self.dtype
            )));
        }
        self.native_f16 = on;
        Ok(self)
    }

    /// Whether the kernels load these weights as native f16.
    pub fn native_f16(&self) -> bool {
        self.native_f16
    }

    /// The one buffer holding every weight, as packed words; None when the weights are split
    /// into chunks ([`Self::chunk_count`] above 1).
    #[cfg(feature = "dag")]
    pub(crate) fn whole_buffer(&self) -> Option<&wgpu::Buffer> {
        match self.chunks.as_slice() {
            [only] => Some(&only.buffer),
            _ => None,
        }
    }

    /// The values the kernels read from these weights, `[experts, n, k]` row-major, decoded on
    /// the device by the kernels' own packed-word loads (native f16 loads see the same values)
    /// and read back: for a quantised dtype exactly [`crate::quant`]'s decoding of the stored
    /// blocks, for f16 and bf16 the widened halves. For checking an upload or a converted
    /// checkpoint; not part of a forward.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when `experts · n · k` f32 values are past one storage binding;
    /// device errors.
    pub fn unpack(&self, ctx: &Context) -> Result<Vec<f32>> {
        let len = u64::from(self.experts) * u64::from(self.n) * u64::from(self.k);
        let bytes = 4 * len;
        let limits = ctx.limits();
        let max = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        if bytes > max {
            return Err(Error::limit(
                "unpacked expert weights",
                bytes,
                max,
                "max_storage_buffer_binding_size",
            ));
        }
        let out = ctx.zeroed("unpacked expert weights", bytes)?;
        let kernel = ctx.kernel(
            &UNPACK,
            &[("DTYPE", self.dtype.code()), ("NARROW_SCALES", f64::from(u8::from(self.narrow_scales)))],
        )?;
        let mut params = Vec::with_capacity(self.chunks.len());
        for chunk in &self.chunks {
            let p = Params {
                n: self.n,
                kdim: self.k,
                expert_base: chunk.experts.start,
                expert_count: chunk.experts.len() as u32,
                col_base: chunk.cols.start,
                cols: chunk.cols.len() as u32,
                ..Params::zeroed()
            };
            params.push(ctx.uniform("unpack params", &p)?);
        }
        let mut dispatches = Vec::with_capacity(self.chunks.len());
        for (chunk, p) in self.chunks.iter().zip(&params) {
            let rows = chunk.experts.len() as u64 * chunk.cols.len() as u64;
            let groups = UNPACK.groups(rows * u64::from(self.k.div_ceil(4)))?;
            let bindings = [
                Binding::new(0, p, PARAMS_BYTES),
                Binding::new(2, &chunk.buffer, chunk.bytes),
                Binding::new(3, &chunk.buffer, chunk.bytes),
                Binding::new(6, &out, bytes),
            ];
            dispatches.push(ctx.dispatch(&kernel, &bindings, ctx.grid(groups, "unpack weights")?)?);
        }
        ctx.run(&dispatches.iter().collect::<Vec<_>>())?;
        ctx.read_back(&out, len as usize)
    }

    /// Storage dtype.
    pub fn dtype(&self) -> WeightDtype {
        self.dtype
    }
    /// `[experts, n, k]`.
    pub fn shape(&self) -> [u32; 3] {
        [self.experts, self.n, self.k]
    }
}

/// The gated activation between an FFN's gate/up and down projections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Activation {
    /// SwiGLU: `silu(g) · u`, computed as `g / (1 + exp(-g)) · u`.
    #[default]
    Swiglu,
    /// gpt-oss's clamped SwiGLU: `g' = min(g, limit)`, `u' = clamp(u, -limit, limit)`, then
    /// `(u' + 1) · g' · sigmoid(alpha · g')`, computed as
    /// `(u' + 1) · (g' / (1 + exp(-(alpha · g'))))`. gpt-oss uses alpha 1.702 and limit 7.0
    /// (`swiglu_limit`).
    ClampedSwiglu {
        /// The sigmoid's slope.
        alpha: f32,
        /// The clamp on gate (above) and up (both sides); positive.
        limit: f32,
    },
}

impl Activation {
    /// gpt-oss's clamped SwiGLU with its published constants (alpha 1.702, limit 7.0).
    pub const GPT_OSS: Activation = Activation::ClampedSwiglu { alpha: 1.702, limit: 7.0 };

    /// Checks the constants.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an alpha that is not finite or a limit that is not
    /// finite and positive.
    pub fn validate(self) -> Result<()> {
        if let Activation::ClampedSwiglu { alpha, limit } = self
            && (!alpha.is_finite() || !limit.is_finite() || limit <= 0.0)
        {
            return Err(Error::invalid(format!(
                "clamped SwiGLU needs a finite alpha and a finite, positive limit (alpha {alpha}, limit {limit})"
            )));
        }
        Ok(())
    }

    /// The epilogue's pipeline constants (`ACTIVATION`, `GLU_ALPHA`, `GLU_LIMIT`).
    fn constants(self) -> [(&'static str, f64); 3] {
        match self {
            Activation::Swiglu => [("ACTIVATION", 0.0), ("GLU_ALPHA", 1.0), ("GLU_LIMIT", 1.0)],
            Activation::ClampedSwiglu { alpha, limit } => {
                [("ACTIVATION", 1.0), ("GLU_ALPHA", f64::from(alpha)), ("GLU_LIMIT", f64::from(limit))]
            }
        }
    }
}

/// Biases of an expert FFN's projections on the device (gpt-oss): added to each projection's
/// dot product before the activation (gate, up) or as the last step (down).
#[derive(Debug)]
pub struct ExpertBias {
    /// `[E, F, 2]`: each column's (gate, up) pair.
    gate_up: wgpu::Buffer,
    /// `[E, H]`.
    down: wgpu::Buffer,
}

impl ExpertBias {
    /// Uploads gate and up biases `[experts, ffn]` and down biases `[experts, hidden]`.
    ///
    /// # Errors
    /// [`Error::Shape`] for a length that does not match; device errors.
    pub fn new(
        ctx: &Context,
        gate: &[f32],
        up: &[f32],
        down: &[f32],
        [experts, ffn, hidden]: [u32; 3],
    ) -> Result<Self> {
        let (ef, eh) = (experts as usize * ffn as usize, experts as usize * hidden as usize);
        for (what, v, cols, want) in
            [("gate bias", gate, ffn, ef), ("up bias", up, ffn, ef), ("down bias", down, hidden, eh)]
        {
            if v.len() != want {
                return Err(Error::shape(what, format!("[{experts}, {cols}] = {want} values"), v.len()));
            }
        }
        let pairs: Vec<f32> = gate.iter().zip(up).flat_map(|(&g, &u)| [g, u]).collect();
        Ok(ExpertBias {
            gate_up: ctx.upload("expert gate/up biases", &pairs)?,
            down: ctx.upload("expert down biases", down)?,
        })
    }
}

/// A gated expert FFN: `down(act(gate(x), up(x)))` per expert, `act` SwiGLU unless chosen
/// otherwise ([`Activation`]), with optional biases ([`ExpertBias`]).
#[derive(Debug)]
pub struct ExpertFfn {
    /// `[E, F, H]`.
    pub gate: ExpertWeights,
    /// `[E, F, H]`.
    pub up: ExpertWeights,
    /// `[E, H, F]`.
    pub down: ExpertWeights,
    /// The kernels and order; `None` runs the adapter's default ([`FfnKernels::default_for`])
    /// in [`GemmOrder::Strict`].
    kernels: Option<FfnKernels>,
    /// The activation between gate/up and down.
    activation: Activation,
    /// Projection biases, where the model has them.
    bias: Option<ExpertBias>,
}

impl ExpertFfn {
    /// Checks that the three projections fit together; returns it.
    ///
    /// # Errors
    /// [`Error::Shape`] when up or down does not match gate's experts, rows and columns;
    /// [`Error::InvalidArgument`] when the three mix dtypes or load paths.
    pub fn new(gate: ExpertWeights, up: ExpertWeights, down: ExpertWeights) -> Result<Self> {
        let [e, f, h] = gate.shape();
        if up.shape() != [e, f, h] {
            return Err(Error::shape(
                "up projection",
                format!("{:?}", [e, f, h]),
                format!("{:?}", up.shape()),
            ));
        }
        if down.shape() != [e, h, f] {
            return Err(Error::shape(
                "down projection",
                format!("{:?}", [e, h, f]),
                format!("{:?}", down.shape()),
            ));
        }
        if gate.dtype != up.dtype || gate.dtype != down.dtype {
            return Err(Error::invalid(format!(
                "expert weights mix dtypes: gate {:?}, up {:?}, down {:?}",
                gate.dtype, up.dtype, down.dtype
            )));
        }
        if gate.native_f16 != up.native_f16 || gate.native_f16 != down.native_f16 {
            return Err(Error::invalid("expert weights mix native f16 and packed loads"));
        }
        Ok(ExpertFfn { gate, up, down, kernels: None, activation: Activation::Swiglu, bias: None })
    }

    /// Runs `activation` between the projections instead of SwiGLU.
    ///
    /// # Errors
    /// [`Activation::validate`]'s.
    pub fn with_activation(mut self, activation: Activation) -> Result<Self> {
        activation.validate()?;
        self.activation = activation;
        Ok(self)
    }

    /// Adds `bias` to the projections.
    ///
    /// # Errors
    /// [`Error::Shape`] when the biases were made for other sizes than these weights'.
    pub fn with_bias(mut self, bias: ExpertBias) -> Result<Self> {
        let [e, f, h] = self.gate.shape();
        let (want_gate_up, want_down) = (u64::from(e) * u64::from(f) * 8, u64::from(e) * u64::from(h) * 4);
        if bias.gate_up.size() != want_gate_up || bias.down.size() != want_down {
            return Err(Error::shape(
                "expert biases",
                format!(
                    "gate/up [{e}, {f}, 2] and down [{e}, {h}] f32 ({want_gate_up} and {want_down} bytes)"
                ),
                format!("{} and {} bytes", bias.gate_up.size(), bias.down.size()),
            ));
        }
        self.bias = Some(bias);
        Ok(self)
    }

    /// The activation between the projections.
    pub fn activation(&self) -> Activation {
        self.activation
    }

    /// Whether the projections add biases.
    pub fn has_bias(&self) -> bool {
        self.bias.is_some()
    }

    /// Runs these kernels (order and variants) instead of the adapter's default.
    ///
    /// # Errors
    /// A variant out of its documented ranges.
    pub fn with_kernels(mut self, kernels: FfnKernels) -> Result<Self> {
        kernels.validate()?;
        self.kernels = Some(kernels);
        Ok(self)
    }

    /// The kernels this FFN runs on `ctx`.
    pub fn kernels(&self, ctx: &Context) -> FfnKernels {
        self.kernels
            .unwrap_or_else(|| FfnKernels::default_for(AdapterKind::of(ctx.adapter()), GemmOrder::Strict))
    }
    /// Experts.
    pub fn experts(&self) -> u32 {
        self.gate.experts
    }
    /// Hidden size H.
    pub fn hidden(&self) -> u32 {
        self.gate.k
    }
    /// FFN size F.
    pub fn ffn(&self) -> u32 {
        self.gate.n
    }
}

/// How rows reach the expert projections.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum FfnRouting<'a> {
    /// (a) Padded-tile grouped GEMM over a dispatch layout (tile a multiple of 32).
    Grouped(&'a DispatchLayout),
    /// (b) One grouped matmul per bucket over `pad_perm` and a row-wise overflow pass. The
    /// bucket layout groups the flattened entries (`tokens * k` of them, k = 1).
    Bucketed(&'a BucketLayout),
    /// Row-wise over entries directly (decode: a handful of tokens, no layout needed).
    Decode,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
struct Params {
    rows: u32,
    n: u32,
    kdim: u32,
    k_route: u32,
    row_offset: u32,
    fixed_expert: u32,
    tile_rows: u32,
    count_word: u32,
    flags: u32,
    expert_base: u32,
    expert_count: u32,
    col_base: u32,
    cols: u32,
    win_rows: u32,
    win_stride4: u32,
    win_row0: u32,
}

/// Marks padding rows (`NONE` in wgsl/gemm/common.wgsl).
pub(crate) const NONE: u32 = u32::MAX;
// FLAG_* bits of `Params::flags`, as in wgsl/gemm/common.wgsl.
pub(crate) const FLAG_GATHER: u32 = 1;
pub(crate) const FLAG_OUT_ENTRY: u32 = 2;
pub(crate) const FLAG_IDENTITY_ROWS: u32 = 4;
pub(crate) const FLAG_EXPERT_FROM_TILES: u32 = 8;
pub(crate) const FLAG_EXPERT_FROM_INDICES: u32 = 16;

#[derive(Clone, Copy)]
struct Pass<'a> {
    order: GemmOrder,
    swiglu: bool,
    gather: bool,
    out_entry: bool,
    identity_rows: bool,
    x: BufferView<'a>,
    w: &'a ExpertWeights,
    w_up: &'a ExpertWeights,
    row_entry: BufferView<'a>,
    out: BufferView<'a>,
    params: Params,
    /// `params.rows` and `params.row_offset` as functions of a plan's live token count.
    live: LiveRows,
    /// The activation of a SwiGLU pass.
    activation: Activation,
    /// Biases: `[E, N, 2]` (gate, up) pairs in a SwiGLU pass, else `[E, N]`.
    bias: Option<&'a wgpu::Buffer>,
}

impl Pass<'_> {
    fn constants(&self) -> Vec<(&'static str, f64)> {
        let bias = match (self.bias, self.swiglu) {
            (None, _) => 0.0,
            (Some(_), false) => 1.0,
            (Some(_), true) => 2.0,
        };
        // One constant for both bound weights (w_up is w outside SwiGLU): narrow when both are.
        let narrow = self.w.narrow_scales && self.w_up.narrow_scales;
        let mut c = vec![
            ("DTYPE", self.w.dtype.code()),
            ("NARROW_SCALES", f64::from(u8::from(narrow))),
            ("SWIGLU", f64::from(u8::from(self.swiglu))),
            ("BIAS", bias),
        ];
        c.extend(self.activation.constants());
        c
    }

    /// How a dispatch of this pass with `grid` follows the live count: its rows and first row
    /// do.
    fn sizing(&self, grid: LiveGrid) -> Sizing {
        Sizing::new(grid)
            .field(offset_of!(Params, rows), self.live.rows.value())
            .field(offset_of!(Params, row_offset), self.live.row_offset.value())
    }

    /// How a dispatch of this pass over `span` (one x window, or the whole pass) follows the
    /// live count: as [`Self::sizing`], its grid over the span's rows up to the count (`per_row`
    /// says how the kernel covers rows); a window's dispatch runs once the count reaches it.
    fn span_sizing(&self, spec: &KernelSpec, span: Span, windowed: bool, per_row: PerRow) -> Result<Sizing> {
        let rows = self.live.rows;
        let grid = match per_row {
            PerRow::Block(block_rows) => {
                LiveGrid::X(rows.beyond(span.row0, block_rows).at_most(span.rows.div_ceil(block_rows)))
            }
            PerRow::Invocations(lanes) => {
                let cap = spec.groups(u64::from(span.rows) * u64::from(lanes))?;
                let groups = spec.live_groups_beyond(rows.times(lanes), span.row0.saturating_mul(lanes))?;
                LiveGrid::Spilled(groups.at_most(u32::try_from(cap).unwrap_or(u32::MAX)))
            }
        };
        let s = self.sizing(grid);
        Ok(match windowed {
            true => s.once_above(rows, span.row0),
            false => s,
        })
    }

    /// The uniform parameters with the FLAG_* bits of this pass and `extra`.
    fn params_with(&self, extra: u32) -> Params {
        let bit = |on: bool, f: u32| if on { f } else { 0 };
        let flags = bit(self.gather, FLAG_GATHER)
            | bit(self.out_entry, FLAG_OUT_ENTRY)
            | bit(self.identity_rows, FLAG_IDENTITY_ROWS)
            | extra;
        Params { flags, ..self.params }
    }

    /// The bindings every GEMM dispatch of this pass makes: parameters, x, rows, output and
    /// biases (`no_bias` where there are none: the epilogue reads nothing then; a buffer of its
    /// own, as WebGPU refuses two writable bindings of one range in a dispatch).
    fn common<'b>(&'b self, params: &'b wgpu::Buffer, no_bias: &'b wgpu::Buffer) -> Vec<Binding<'b>> {
        let bias = match self.bias {
            Some(b) => Binding::new(10, b, b.size()),
            None => Binding::new(10, no_bias, no_bias.size()),
        };
        vec![
            Binding::new(0, params, PARAMS_BYTES),
            self.x.bind(1, self.x.size),
            self.row_entry.bind(4, self.row_entry.size),
            self.out.bind(6, self.out.size),
            bias,
        ]
    }

    /// [`Pass::common`] and weight chunk `chunk` (2, and the up projection's at 3).
    fn with_chunk<'b>(
        &'b self,
        params: &'b wgpu::Buffer,
        no_bias: &'b wgpu::Buffer,
        chunk: usize,
    ) -> Vec<Binding<'b>> {
        let (w, u) = (&self.w.chunks[chunk], &self.w_up.chunks[chunk]);
        let mut bindings = self.common(params, no_bias);
        bindings.push(Binding::new(2, &w.buffer, w.bytes));
        bindings.push(Binding::new(3, &u.buffer, u.bytes));
        bindings
    }

    /// The texture copies of the weights and the up projection's (the weights' own where
    /// they are one), or None where either is past the device's texture limits.
    fn textures(&self, ctx: &Context) -> Result<Option<[Arc<TextureWeights>; 2]>> {
        let Some(w) = self.w.texture(ctx)? else {
            return Ok(None);
        };
        if std::ptr::eq(self.w, self.w_up) {
            return Ok(Some([w.clone(), w]));
        }
        Ok(self.w_up.texture(ctx)?.map(|u| [w, u]))
    }

    /// The weight chunks this pass dispatches over, with the parameters of each: every chunk,
    /// or with a fixed expert (`expert_from_buffer` false) the chunks that hold it.
    fn chunks(&self, expert_from_buffer: bool, extra_flags: u32) -> Result<Vec<(usize, Params)>> {
        if self.w.chunks.len() != self.w_up.chunks.len() {
            return Err(Error::invalid("the gate and up projections are split differently"));
        }
        let fixed = self.params.fixed_expert;
        Ok(self
            .w
            .chunks
            .iter()
            .enumerate()
            .filter(|(_, c)| expert_from_buffer || c.experts.contains(&fixed))
            .map(|(i, c)| {
                let params = Params {
                    expert_base: c.experts.start,
                    expert_count: c.experts.end - c.experts.start,
                    col_base: c.cols.start,
                    cols: c.cols.end - c.cols.start,
                    ..self.params_with(extra_flags)
                };
                (i, params)
            })
            .collect())
    }

    /// Block-GEMM dispatches of `variant`, one per weight chunk (a window variant: a staging
    /// dispatch, then one per weight chunk and window); `tiles` is the tile -> expert map, or
    /// None for `params.fixed_expert`.
    fn gemm(
        &self,
        scratch: Scratch<'_>,
        variant: GemmVariant,
        tiles: Option<BufferView<'_>>,
    ) -> Result<Vec<Dispatch>> {
        let ctx = scratch.ctx();
        // A texture variant without texture copies runs as the window variant of its block.
        let textures = match variant {
            GemmVariant::Texture { .. } => self.textures(ctx)?,
            _ => None,
        };
        let variant = if textures.is_some() { variant } else { variant.without_texture() };
        let (variant, windows) = Windows::choose(ctx, variant, self.params.rows, self.params.kdim);
        let textures = textures.filter(|_| matches!(variant, GemmVariant::Texture { .. }));
        let constants = self.constants();
        let bytes = variant.workgroup_bytes();
        if bytes > ctx.limits().max_compute_workgroup_storage_size {
            return Err(Error::limit(
                format!("workgroup memory of the {} GEMM", variant.name()),
                bytes.into(),
                ctx.limits().max_compute_workgroup_storage_size.into(),
                "max_compute_workgroup_storage_size",
            ));
        }
        if variant.invocations() > ctx.limits().max_compute_invocations_per_workgroup {
            return Err(Error::limit(
                format!("invocations of the {} GEMM", variant.name()),
                variant.invocations().into(),
                ctx.limits().max_compute_invocations_per_workgroup.into(),
                "max_compute_invocations_per_workgroup",
            ));
        }
        let spec = variant::spec(variant, self.order, WeightLoads::of(self.w.dtype, self.w.native_f16));
        let kernel = ctx.kernel(spec, &constants)?;
        let from_tiles = if tiles.is_some() { FLAG_EXPERT_FROM_TILES } else { 0 };
        let placeholder = ctx.storage_scratch("no tile map", 4)?;
        let no_bias = ctx.storage_scratch("no bias", 4)?;
        let tiles = tiles.unwrap_or_else(|| (&placeholder).into());
        let max = ctx.limits().max_compute_workgroups_per_dimension;
        let mut out = Vec::new();
        let staged = Staged::new(scratch, windows, self, &mut out)?;
        let bound_textures = texture_bindings(&textures);
        for (chunk, p) in self.weight_chunks(textures.is_some(), from_tiles != 0, from_tiles)? {
            let col_groups = p.cols.div_ceil(variant.block_cols());
            for (index, span) in Staged::spans(staged.as_ref(), p.rows).into_iter().enumerate() {
                let p = Params { win_rows: span.rows, win_row0: span.row0, ..p };
                let params = ctx.uniform("gemm params", &p)?;
                let mut bindings = self.bindings(spec, &params, &no_bias, chunk);
                bindings.push(tiles.bind(5, tiles.size));
                bindings.extend(staged.as_ref().map(|st| st.binding(7, index)));
                let grid = [span.covered(p.rows).div_ceil(variant.block_rows()), col_groups, 1];
                let per_row = PerRow::Block(variant.block_rows());
                let sizing = self.span_sizing(spec, span, staged.is_some(), per_row)?;
                if grid[0] > max || grid[1] > max {
                    return Err(Error::limit(
                        "GEMM workgroups per dimension",
                        grid[0].max(grid[1]).into(),
                        max.into(),
                        "max_compute_workgroups_per_dimension",
                    ));
                }
                out.push(
                    ctx.dispatch_with_textures(&kernel, &bindings, &bound_textures, grid)?.sized(sizing),
                );
            }
        }
        Ok(out)
    }

    /// The weight chunks a pass dispatches over, as [`Pass::chunks`]; with texture copies
    /// (which hold every expert) one unsplit chunk, None, whose parameters describe every expert
    /// and every column.
    fn weight_chunks(
        &self,
        textures: bool,
        expert_from_buffer: bool,
        extra_flags: u32,
    ) -> Result<Vec<(Option<usize>, Params)>> {
        if textures {
            let p = Params {
                expert_base: 0,
                expert_count: self.w.experts,
                col_base: 0,
                cols: self.w.n,
                ..self.params_with(extra_flags)
            };
            return Ok(vec![(None, p)]);
        }
        Ok(self.chunks(expert_from_buffer, extra_flags)?.into_iter().map(|(c, p)| (Some(c), p)).collect())
    }

    /// [`Pass::common`], and chunk `chunk`'s weight buffers or (None) nothing: the textures
    /// are bound apart.
    fn bindings<'b>(
        &'b self,
        spec: &KernelSpec,
        params: &'b wgpu::Buffer,
        no_bias: &'b wgpu::Buffer,
        chunk: Option<usize>,
    ) -> Vec<Binding<'b>> {
        let mut all = match chunk {
            Some(chunk) => self.with_chunk(params, no_bias, chunk),
            None => self.common(params, no_bias),
        };
        // Only the buffers the kernel binds: window kernels read x from their window, not from
        // binding 1.
        all.retain(|b| spec.bindings.iter().any(|&(n, a)| n == b.binding && a.is_buffer()));
        all
    }

    /// Row-wise dispatches, one per weight chunk; experts from `indices` (or
    /// `params.fixed_expert`), live rows `min(params.rows, count[params.count_word])`, x and
    /// the weights read from `source`: x staged into uniform windows (where windows of single
    /// rows fit, see [`Windows::fit`]; each chunk then runs one dispatch per window), the weights
    /// from their texture copies (where the weights have them; one unsplit chunk). The same
    /// values, the same bits from every source.
    fn rowwise(
        &self,
        scratch: Scratch<'_>,
        indices: Option<BufferView<'_>>,
        count: BufferView<'_>,
        source: RowSource,
    ) -> Result<Vec<Dispatch>> {
        let ctx = scratch.ctx();
        let windows = match source {
            RowSource::Storage => None,
            RowSource::Window | RowSource::Texture => {
                Windows::fit(ctx, self.params.rows, self.params.kdim, 1)
            }
        };
        let textures = match source {
            RowSource::Texture => self.textures(ctx)?,
            RowSource::Storage | RowSource::Window => None,
        };
        let mut constants = self.constants();
        constants.push(("FAST_ORDER", f64::from(u8::from(self.order == GemmOrder::Fast))));
        let x = match windows {
            None => RowX::Storage,
            Some(_) if ctx.capabilities().subgroups => RowX::WindowShared,
            Some(_) => RowX::Window,
        };
        let spec = rowwise_spec(x, textures.is_some(), self.w.native_f16, self.w.dtype.is_quantised());
        let kernel = ctx.kernel(spec, &constants)?;
        let from_indices = if indices.is_some() { FLAG_EXPERT_FROM_INDICES } else { 0 };
        let placeholder = ctx.storage_scratch("no indices", 4)?;
        let no_bias = ctx.storage_scratch("no bias", 4)?;
        let indices = indices.unwrap_or_else(|| (&placeholder).into());
        let mut out = Vec::new();
        let staged = Staged::new(scratch, windows, self, &mut out)?;
        let bound_textures = texture_bindings(&textures);
        for (chunk, p) in self.weight_chunks(textures.is_some(), from_indices != 0, from_indices)? {
            for (index, span) in Staged::spans(staged.as_ref(), p.rows).into_iter().enumerate() {
                let p = Params { win_rows: span.rows, win_row0: span.row0, ..p };
                let params = ctx.uniform("gemm params", &p)?;
                let mut bindings = self.bindings(spec, &params, &no_bias, chunk);
                bindings.push(count.bind(7, count.size));
                bindings.push(indices.bind(8, indices.size));
                bindings.extend(staged.as_ref().map(|st| st.binding(9, index)));
                let lanes = x.row_lanes(p.cols);
                let grid =
                    ctx.grid(spec.groups(u64::from(span.covered(p.rows)) * lanes)?, "row-wise GEMM")?;
                // Lanes per row are at most the columns rounded up to a workgroup.
                let per_row = PerRow::Invocations(u32::try_from(lanes).unwrap_or(u32::MAX));
                let sizing = self.span_sizing(spec, span, staged.is_some(), per_row)?;
                out.push(
                    ctx.dispatch_with_textures(&kernel, &bindings, &bound_textures, grid)?.sized(sizing),
                );
            }
        }
        Ok(out)
    }
}

/// How the row-wise kernel reads x.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowX {
    /// Each invocation from storage.
    Storage,
    /// Each invocation from the dispatch's uniform window.
    Window,
    /// From the uniform window, each load shared by a subgroup (`gemm/rowwise_x_subgroup.wgsl`;
    /// needs subgroups, and pads every row's columns to whole workgroups).
    WindowShared,
}

impl RowX {
    /// Invocations a row of `cols` output columns takes (`row_lanes` in `gemm/rowwise.wgsl`:
    /// `cols` rounded up to the module's `ROW_ALIGN`).
    fn row_lanes(self, cols: u32) -> u64 {
        let align = match self {
            RowX::Storage | RowX::Window => 1,
            RowX::WindowShared => u64::from(ROWWISE_SUBGROUP_ROW_ALIGN),
        };
        u64::from(cols).div_ceil(align) * align
    }
}

/// `ROW_ALIGN` of `gemm/rowwise_x_subgroup.wgsl`: a row's invocations fill whole workgroups.
pub(crate) const ROWWISE_SUBGROUP_ROW_ALIGN: u32 = 64;

/// The row-wise kernel reading x as `x` says, the weights from texture copies (`texture`) or
/// from buffers as native f16 (`native_f16`), quantised blocks (`quantised`) or packed words.
fn rowwise_spec(x: RowX, texture: bool, native_f16: bool, quantised: bool) -> &'static KernelSpec {
    match (x, texture, native_f16, quantised) {
        (RowX::Storage, true, _, _) => &ROWWISE_TEXTURE,
        (RowX::Window, true, _, _) => &ROWWISE_WINDOW_TEXTURE,
        (RowX::WindowShared, true, _, _) => &ROWWISE_SUBGROUP_TEXTURE,
        (RowX::Storage, false, _, true) => &ROWWISE_QUANT,
        (RowX::Window, false, _, true) => &ROWWISE_WINDOW_QUANT,
        (RowX::WindowShared, false, _, true) => &ROWWISE_SUBGROUP_QUANT,
        (RowX::Storage, false, false, false) => &ROWWISE,
        (RowX::Storage, false, true, false) => &ROWWISE_F16,
        (RowX::Window, false, false, false) => &ROWWISE_WINDOW,
        (RowX::Window, false, true, false) => &ROWWISE_WINDOW_F16,
        (RowX::WindowShared, false, false, false) => &ROWWISE_SUBGROUP,
        (RowX::WindowShared, false, true, false) => &ROWWISE_SUBGROUP_F16,
    }
}

/// The texture copies of a pass's weights and up projection bound at 2 and 3 (none without).
fn texture_bindings(textures: &Option<[Arc<TextureWeights>; 2]>) -> Vec<TextureBinding<'_>> {
    textures
        .iter()
        .flat_map(|[w, u]| {
            [
                TextureBinding { binding: 2, texture: &w.texture },
                TextureBinding { binding: 3, texture: &u.texture },
            ]
        })
        .collect()
}

/// Where a row-wise pass reads x and the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RowSource {
    /// Both from storage.
    Storage,
    /// x from uniform windows, the weights from storage.
    Window,
    /// x from uniform windows, the weights from their texture copies.
    Texture,
}

impl RowSource {
    /// The source of the row-wise passes beside block kernels `variant`: as they read x and
    /// the weights.
    fn like(variant: GemmVariant) -> Self {
        match variant {
            GemmVariant::Texture { .. } => RowSource::Texture,
            GemmVariant::Window { .. } => RowSource::Window,
            GemmVariant::Tiled { .. }
            | GemmVariant::TiledWide { .. }
            | GemmVariant::Tile { .. }
            | GemmVariant::TileF16 { .. }
            | GemmVariant::Direct { .. } => RowSource::Storage,
        }
    }
}

/// Where a window pass keeps its x rows: `count` uniform windows of `rows` rows each,
/// `stride` bytes apart, row r of a window at vec4 `r * ceil(K / 4)`.
#[derive(Clone, Copy, Debug)]
struct Windows {
    rows: u32,
    count: u32,
    stride: u64,
}

impl Windows {
    /// The windows of a pass of `rows` rows of `kdim` values with blocks of `block_rows`, or
    /// None where they cannot be had: the device's uniform bindings are smaller than a window,
    /// a window holds fewer than `block_rows` rows of K, or the windows together are past one
    /// storage binding or buffer.
    fn fit(ctx: &Context, rows: u32, kdim: u32, block_rows: u32) -> Option<Self> {
        let limits = ctx.limits();
        if limits.max_uniform_buffer_binding_size < variant::WINDOW_BYTES {
            return None;
        }
        let windows = Self::layout(rows, kdim, block_rows, limits.min_uniform_buffer_offset_alignment)?;
        let bytes = windows.bytes();
        (bytes <= limits.max_storage_buffer_binding_size && bytes <= limits.max_buffer_size)
            .then_some(windows)
    }

    /// The windows of a pass of `rows` rows of `kdim` values with blocks of `block_rows`,
    /// bound at multiples of `offset_alignment` bytes, whatever the device's buffer limits; None
    /// where a window holds fewer than `block_rows` rows of K.
    fn layout(rows: u32, kdim: u32, block_rows: u32, offset_alignment: u32) -> Option<Self> {
        if rows == 0 || kdim == 0 {
            return None;
        }
        let row_bytes = u64::from(kdim.div_ceil(4)) * 16;
        let fit = variant::WINDOW_BYTES / row_bytes;
        let block = u64::from(block_rows);
        // A window holds whole blocks, and no more rows than the pass has.
        let per_window = (fit / block * block).min(u64::from(rows).div_ceil(block) * block);
        if per_window == 0 {
            return None;
        }
        let align = u64::from(offset_alignment.max(16));
        let stride = (per_window * row_bytes).div_ceil(align) * align;
        let count = u64::from(rows).div_ceil(per_window);
        Some(Windows { rows: u32::try_from(per_window).ok()?, count: u32::try_from(count).ok()?, stride })
    }

    /// What runs `variant` on a pass of `rows` rows of `kdim` values: a window (or texture) variant with its
    /// windows where a window holds one of its blocks; else the same variant with half the rows
    /// and twice the columns per block (at most [`AdapterKind::max_block_cols`]; never fewer
    /// than it had), down to 8 rows, where a window holds that block (it still
    /// divides the dispatch tile; on lavapipe an 8-row window block is still about 1.5x the
    /// 16-row direct one, its x loads being broadcasts); else the direct variant of the
    /// original block. Other variants as they are. Every choice computes the same operations in
    /// the same order.
    fn choose(ctx: &Context, variant: GemmVariant, rows: u32, kdim: u32) -> (GemmVariant, Option<Self>) {
        let (GemmVariant::Window { rows: block_rows, cols, .. }
        | GemmVariant::Texture { rows: block_rows, cols, .. }) = variant
        else {
            return (variant, None);
        };
        let max_cols = AdapterKind::of(ctx.adapter()).max_block_cols().max(cols);
        let (mut r, mut c) = (block_rows, cols);
        loop {
            if let Some(w) = Windows::fit(ctx, rows, kdim, r) {
                return (variant.with_block(r, c), Some(w));
            }
            if r / 2 < 8 {
                return (variant.without_window(), None);
            }
            (r, c) = (r / 2, (c * 2).min(max_cols));
        }
    }

    /// The window stride in vec4.
    fn stride4(&self) -> u32 {
        // The stride is at most a window plus its alignment, far below u32.
        (self.stride / 16) as u32
    }

    /// Bytes of the windows' buffer (the last window is bound whole).
    fn bytes(&self) -> u64 {
        u64::from(self.count - 1) * self.stride + variant::WINDOW_BYTES
    }
}

/// The most bytes of x windows any pass of `passes` (rows, K) stages with `variants` on a
/// device with `limits`: over every block [`Windows::choose`] can pick for a window variant
/// (its block rows, halved down to 8) and the single rows of the row-wise passes beside window
/// kernels, where those windows fit the device. None where no variant reads windows or no
/// windows fit. Every pass of a forward stages into one region of this size, one pass after
/// another.
pub(crate) fn window_bytes_bound(
    variants: &[GemmVariant],
    passes: &[(u32, u32)],
    limits: &wgpu::Limits,
) -> Option<u64> {
    if limits.max_uniform_buffer_binding_size < variant::WINDOW_BYTES {
        return None;
    }
    let fits =
        |bytes: u64| bytes <= limits.max_storage_buffer_binding_size && bytes <= limits.max_buffer_size;
    let mut blocks = vec![1];
    for v in variants.iter().filter(|v| v.reads_windows()) {
        let mut r = v.block_rows();
        while r >= 8 {
            blocks.push(r);
            r /= 2;
        }
    }
    if blocks.len() == 1 {
        return None;
    }
    let align = limits.min_uniform_buffer_offset_alignment;
    passes
        .iter()
        .flat_map(|&(rows, kdim)| blocks.iter().filter_map(move |&r| Windows::layout(rows, kdim, r, align)))
        .map(|w| w.bytes())
        .filter(|&b| fits(b))
        .max()
}

/// A pass's rows and first row (`Params::rows`, `Params::row_offset`) as functions of a plan's
/// live token count.
#[derive(Clone, Copy, Debug)]
struct LiveRows {
    rows: LiveCount,
    row_offset: LiveCount,
}

impl LiveRows {
    /// `rows` rows from row 0.
    fn new(rows: LiveCount) -> Self {
        LiveRows { rows, row_offset: LiveCount::constant(0) }
    }

    /// The same rows from `row_offset` on.
    fn offset(self, row_offset: LiveCount) -> Self {
        LiveRows { row_offset, ..self }
    }
}

/// How a pass's kernel covers its rows.
#[derive(Clone, Copy, Debug)]
enum PerRow {
    /// One x workgroup per block of this many rows.
    Block(u32),
    /// This many invocations per row, in 1-D workgroups.
    Invocations(u32),
}

/// The rows one dispatch of a pass computes: `row0 .. row0 + rows`.
#[derive(Clone, Copy, Debug)]
struct Span {
    row0: u32,
    rows: u32,
}

impl Span {
    /// Its rows below `rows` (a pass's last window can reach past the pass's rows).
    fn covered(self, rows: u32) -> u32 {
        self.rows.min(rows.saturating_sub(self.row0))
    }
}

/// A pass's x rows staged into uniform windows: the windows and their buffer.
struct Staged {
    windows: Windows,
    buffer: Region,
}

impl Staged {
    /// With `windows`, the windows' buffer, and the dispatch that fills it with `pass`'s input
    /// rows (found as the GEMM finds them), pushed onto `out`; None without.
    fn new(
        scratch: Scratch<'_>,
        windows: Option<Windows>,
        pass: &Pass<'_>,
        out: &mut Vec<Dispatch>,
    ) -> Result<Option<Self>> {
        let Some(windows) = windows else {
            return Ok(None);
        };
        let ctx = scratch.ctx();
        let buffer = scratch.take(ScratchKey::XWindows, windows.bytes())?;
        let p = Params { win_rows: windows.rows, win_stride4: windows.stride4(), ..pass.params_with(0) };
        let params = ctx.uniform("stage params", &p)?;
        let kernel = ctx.kernel(&STAGE, &[])?;
        let groups = STAGE.groups(u64::from(p.rows) * u64::from(p.kdim.div_ceil(4)))?;
        let live_groups = STAGE.live_groups(pass.live.rows.times(p.kdim.div_ceil(4)))?;
        let bindings = [
            Binding::new(0, &params, PARAMS_BYTES),
            pass.x.bind(1, pass.x.size),
            pass.row_entry.bind(4, pass.row_entry.size),
            buffer.bind(7, windows.bytes()),
        ];
        let grid = ctx.grid(groups, "GEMM staging")?;
        out.push(ctx.dispatch(&kernel, &bindings, grid)?.sized(pass.sizing(LiveGrid::Spilled(live_groups))));
        Ok(Some(Staged { windows, buffer }))
    }

    /// The dispatches of a pass of `rows` rows: one per window, or one for the whole pass.
    fn spans(staged: Option<&Self>, rows: u32) -> Vec<Span> {
        match staged {
            Some(st) => (0..st.windows.count)
                .map(|w| Span { row0: w * st.windows.rows, rows: st.windows.rows })
                .collect(),
            None => vec![Span { row0: 0, rows }],
        }
    }

    /// Window `index` bound at `slot` as a uniform buffer.
    fn binding(&self, slot: u32, index: usize) -> Binding<'_> {
        Binding {
            binding: slot,
            buffer: self.buffer.buffer(),
            size: variant::WINDOW_BYTES,
            offset: self.buffer.offset() + index as u64 * self.windows.stride,
        }
    }
}

/// The fused gate/up projection over `rows`: `act[row] = silu(x . gate) * (x . up)`, with the
/// input row gathered from the entry's token.
fn up_pass<'a>(
    ffn: &'a ExpertFfn,
    order: GemmOrder,
    base: Params,
    x: BufferView<'a>,
    rows: BufferView<'a>,
    act: BufferView<'a>,
    live: LiveRows,
) -> Pass<'a> {
    Pass {
        order,
        swiglu: true,
        gather: true,
        out_entry: false,
        identity_rows: false,
        x,
        w: &ffn.gate,
        w_up: &ffn.up,
        row_entry: rows,
        out: act,
        params: Params { n: ffn.ffn(), kdim: ffn.hidden(), ..base },
        live,
        activation: ffn.activation,
        bias: ffn.bias.as_ref().map(|b| &b.gate_up),
    }
}

/// [`up_pass`] over the padded rows of a dispatch layout (its tiles name their experts).
fn grouped_up_pass<'a>(
    ffn: &'a ExpertFfn,
    order: GemmOrder,
    base: Params,
    x: BufferView<'a>,
    layout: &'a DispatchLayout,
    act: BufferView<'a>,
) -> Pass<'a> {
    let entries = LiveCount::tokens().times(layout.config().k);
    let live = LiveRows::new(layout.live_padded_rows(entries));
    let mut p = up_pass(ffn, order, base, x, layout.perm(), act, live);
    p.params.rows = layout.max_rows();
    p.params.tile_rows = layout.config().tile;
    p
}

/// The down projection over the same rows as `up`: reads `act[row]`, writes `partial[entry]`.
fn down_pass<'a>(
    up: &Pass<'a>,
    ffn: &'a ExpertFfn,
    act: BufferView<'a>,
    partial: BufferView<'a>,
) -> Pass<'a> {
    Pass {
        swiglu: false,
        gather: false,
        out_entry: true,
        x: act,
        w: &ffn.down,
        w_up: &ffn.down,
        out: partial,
        params: Params { n: ffn.hidden(), kdim: ffn.ffn(), ..up.params },
        bias: ffn.bias.as_ref().map(|b| &b.down),
        ..*up
    }
}

/// Dispatches of an expert FFN.
#[derive(Debug)]
pub struct FfnPlan {
    dispatches: Vec<Dispatch>,
}

impl FfnPlan {
    /// The dispatches in order.
    pub fn dispatches(&self) -> Vec<&Dispatch> {
        self.dispatches.iter().collect()
    }
    /// The dispatches, owned.
    pub fn into_dispatches(self) -> Vec<Dispatch> {
        self.dispatches
    }
}

/// The path chosen automatically for `tokens` tokens routed `k` ways over `experts` experts:
/// the row-wise decode path for one token, or for up to [`DECODE_MAX_TOKENS`] tokens whose
/// entries (`tokens * k`) are fewer than the experts; else the grouped GEMM. With fewer entries
/// than experts each expert's weights serve about one entry, and the row-wise pass reads them
/// once per entry without the grouped path's padded tiles; from about one entry per expert on,
/// a grouped block reads an expert's weights once for all its rows (measured in docs/gemm.md).
/// Either path gives the same bits.
pub fn uses_decode_path(tokens: u32, k: u32, experts: u32) -> bool {
    tokens == 1 || (tokens <= DECODE_MAX_TOKENS && u64::from(tokens) * u64::from(k) < u64::from(experts))
}

/// The largest token count that takes the decode path ([`uses_decode_path`]): the counts that
/// take it are 1 up to this one.
pub fn decode_tokens(k: u32, experts: u32) -> u32 {
    (1..=DECODE_MAX_TOKENS).rev().find(|&t| uses_decode_path(t, k, experts)).unwrap_or(1)
}

/// Device buffers of an expert FFN.
#[derive(Clone, Copy, Debug)]
pub struct FfnBuffers<'a> {
    /// `x[tokens, H]`.
    pub x: BufferView<'a>,
    /// `indices[tokens, k]` (u32).
    pub indices: BufferView<'a>,
    /// `partial[tokens * k, H]`, written, indexed by entry `token * k + slot`.
    pub partial: BufferView<'a>,
}

/// Plans the expert FFN for `tokens` tokens routed `k` ways: reads `x` and `indices`, writes
/// `partial` (see [`FfnBuffers`]).
///
/// # Errors
/// [`Error::Shape`] for a buffer smaller than its shape; [`Error::InvalidArgument`] for
/// k = 0 or a layout made for another shape or tile; [`Error::LimitExceeded`] for sizes past
/// the adapter's limits (bindings, workgroup memory, invocations, grids).
pub fn plan_ffn(
    ctx: &Context,
    ffn: &ExpertFfn,
    tokens: u32,
    k: u32,
    bufs: &FfnBuffers<'_>,
    routing: FfnRouting<'_>,
) -> Result<FfnPlan> {
    plan_ffn_with(Scratch::Own(ctx), ffn, tokens, k, bufs, routing)
}

/// [`plan_ffn`] with its activations and x windows taken from `scratch`.
pub(crate) fn plan_ffn_with(
    scratch: Scratch<'_>,
    ffn: &ExpertFfn,
    tokens: u32,
    k: u32,
    bufs: &FfnBuffers<'_>,
    routing: FfnRouting<'_>,
) -> Result<FfnPlan> {
    let ctx = scratch.ctx();
    let (e, f, h) = (ffn.experts(), ffn.ffn(), ffn.hidden());
    let FfnBuffers { x, indices, partial } = *bufs;
    let entries = u64::from(tokens) * u64::from(k);
    ctx.check_view("x", &x, u64::from(tokens) * u64::from(h) * 4, Access::Read)?;
    ctx.check_view("indices", &indices, entries * 4, Access::Read)?;
    ctx.check_view("partial", &partial, entries * u64::from(h) * 4, Access::ReadWrite)?;
    for w in [&ffn.gate, &ffn.up, &ffn.down] {
        for c in &w.chunks {
            ctx.check_binding("expert weights", &c.buffer, c.bytes, Access::Read)?;
        }
    }
    if k == 0 {
        return Err(Error::invalid("k must be at least 1"));
    }
    if entries == 0 {
        return Ok(FfnPlan { dispatches: Vec::new() });
    }
    let entries32 = u32::try_from(entries)
        .map_err(|_| Error::limit("tokens * k", entries, u32::MAX.into(), "u32 entries"))?;
    let base = Params { k_route: k, fixed_expert: NONE, ..Params::default() };
    let kernels = ffn.kernels(ctx);
    let order = kernels.order;
    // The row-wise passes read x and the weights as the block kernels do.
    let source = RowSource::like(kernels.up);
    let mut ds = Vec::new();
    match routing {
        FfnRouting::Grouped(layout) => {
            let cfg = layout.config();
            if cfg.experts != e || cfg.k != k || layout.tokens() != tokens {
                return Err(Error::invalid(format!(
                    "dispatch layout is for E={}, k={}, {} tokens; the FFN needs E={e}, k={k}, {tokens} tokens",
                    cfg.experts,
                    cfg.k,
                    layout.tokens()
                )));
            }
            let block = kernels.block_rows();
            if cfg.tile % block != 0 {
                return Err(Error::invalid(format!(
                    "the grouped GEMM ({} / {}) needs a dispatch tile that is a multiple of {block}, got {}",
                    kernels.up.name(),
                    kernels.down.name(),
                    cfg.tile
                )));
            }
            let rows = layout.max_rows();
            let act = scratch.take(ScratchKey::Activations, u64::from(rows) * u64::from(f) * 4)?;
            let p = grouped_up_pass(ffn, order, base, x, layout, act.view());
            ds.extend(p.gemm(scratch, kernels.up, Some(layout.tile_expert()))?);
            let down = down_pass(&p, ffn, act.view(), partial);
            ds.extend(down.gemm(scratch, kernels.down, Some(layout.tile_expert()))?);
        }
        FfnRouting::Bucketed(buckets) => {
            let inner = buckets.layout();
            if inner.tokens() != entries32 || inner.config().experts != e {
                return Err(Error::invalid(format!(
                    "bucket layout is for {} entries over {} buckets; the FFN needs {entries32} entries over {e} experts",
                    inner.tokens(),
                    inner.config().experts
                )));
            }
            let bound = buckets.config().bound;
            let act =
                scratch.take(ScratchKey::Activations, u64::from(e) * u64::from(bound) * u64::from(f) * 4)?;
            for expert in 0..e {
                let live =
                    LiveRows::new(LiveCount::constant(bound)).offset(LiveCount::constant(expert * bound));
                let mut p = up_pass(ffn, order, base, x, buckets.pad_perm(), act.view(), live);
                p.params.rows = bound;
                p.params.row_offset = expert * bound;
                p.params.fixed_expert = expert;
                ds.extend(p.gemm(scratch, kernels.up, None)?);
                ds.extend(down_pass(&p, ffn, act.view(), partial).gemm(scratch, kernels.down, None)?);
            }
            let over_act = scratch.take(ScratchKey::OverflowActivations, entries * u64::from(f) * 4)?;
            let live = LiveRows::new(LiveCount::tokens().times(k));
            let mut p = up_pass(ffn, order, base, x, buckets.overflow(), over_act.view(), live);
            p.params.rows = entries32;
            p.params.count_word = META_OVERFLOW;
            ds.extend(p.rowwise(scratch, Some(indices), inner.meta(), source)?);
            let down = down_pass(&p, ffn, over_act.view(), partial);
            ds.extend(down.rowwise(scratch, Some(indices), inner.meta(), source)?);
        }
        FfnRouting::Decode => {
            let act = scratch.take(ScratchKey::Activations, entries * u64::from(f) * 4)?;
            let count = ctx.upload("decode rows", &[entries32])?;
            // Entries are their own rows: the rows binding is not read (and is not `count`,
            // which the kernel binds too: WebGPU refuses two writable bindings of one range).
            let unused = ctx.storage_scratch("identity rows", 4)?;
            let live = LiveRows::new(LiveCount::tokens().times(k));
            let mut p = up_pass(ffn, order, base, x, (&unused).into(), act.view(), live);
            p.identity_rows = true;
            p.params.rows = entries32;
            ds.extend(p.rowwise(scratch, Some(indices), (&count).into(), source)?);
            let down = down_pass(&p, ffn, act.view(), partial);
            ds.extend(down.rowwise(scratch, Some(indices), (&count).into(), source)?);
        }
    }
    Ok(FfnPlan { dispatches: ds })
}

/// (d) Every token through every expert: `all[E, tokens, H]`, the FFN of expert e on token t
/// at `(e * tokens + t) * H`. A correctness oracle (E times the work), not a path to use.
///
/// # Errors
/// As [`plan_ffn`].
pub fn plan_ffn_all_experts<'b>(
    ctx: &Context,
    ffn: &ExpertFfn,
    tokens: u32,
    x: impl Into<BufferView<'b>>,
    all: impl Into<BufferView<'b>>,
) -> Result<FfnPlan> {
    every_expert_on_every_token(Scratch::Own(ctx), ScratchKey::Activations, ffn, tokens, x.into(), all.into())
}

/// (e) A dense FFN: the one expert of `ffn` on every token, `y[tokens, H]` from `x[tokens, H]`
/// (the layer's shared expert), through the block kernels of `ffn`: the bits of the same
/// expert on the routed paths.
///
/// # Errors
/// [`Error::InvalidArgument`] for an FFN of more than one expert; as [`plan_ffn`].
pub fn plan_dense_ffn<'b>(
    ctx: &Context,
    ffn: &ExpertFfn,
    tokens: u32,
    x: impl Into<BufferView<'b>>,
    y: impl Into<BufferView<'b>>,
) -> Result<FfnPlan> {
    plan_dense_ffn_with(Scratch::Own(ctx), ffn, tokens, x.into(), y.into())
}

/// [`plan_dense_ffn`] with its activations and x windows taken from `scratch`.
pub(crate) fn plan_dense_ffn_with(
    scratch: Scratch<'_>,
    ffn: &ExpertFfn,
    tokens: u32,
    x: BufferView<'_>,
    y: BufferView<'_>,
) -> Result<FfnPlan> {
    if ffn.experts() != 1 {
        return Err(Error::invalid(format!(
            "a dense FFN has one expert; this one has {} (plan_ffn routes tokens over experts)",
            ffn.experts()
        )));
    }
    every_expert_on_every_token(scratch, ScratchKey::SharedActivations, ffn, tokens, x, y)
}

/// `all[E, tokens, H]`: each expert's FFN on every token, expert by expert (see
/// [`plan_ffn_all_experts`] and [`plan_dense_ffn`]).
/// Its activations `[E * tokens, F]` are the region `act_key` of `scratch`.
fn every_expert_on_every_token(
    scratch: Scratch<'_>,
    act_key: ScratchKey,
    ffn: &ExpertFfn,
    tokens: u32,
    x: BufferView<'_>,
    all: BufferView<'_>,
) -> Result<FfnPlan> {
    let ctx = scratch.ctx();
    let (e, f, h) = (ffn.experts(), ffn.ffn(), ffn.hidden());
    let rows = u64::from(e) * u64::from(tokens);
    ctx.check_view("x", &x, u64::from(tokens) * u64::from(h) * 4, Access::Read)?;
    ctx.check_view("all-expert output", &all, rows * u64::from(h) * 4, Access::ReadWrite)?;
    let act = scratch.take(act_key, rows * u64::from(f) * 4)?;
    let unused = ctx.storage_scratch("identity rows", 4)?;
    let kernels = ffn.kernels(ctx);
    let mut ds = Vec::new();
    for expert in 0..e {
        let params = Params {
            rows: tokens,
            n: f,
            kdim: h,
            k_route: 1,
            row_offset: expert * tokens,
            fixed_expert: expert,
            tile_rows: 1,
            count_word: 0,
            ..Params::default()
        };
        let up = Pass {
            order: kernels.order,
            swiglu: true,
            gather: true,
            out_entry: false,
            identity_rows: true,
            x,
            w: &ffn.gate,
            w_up: &ffn.up,
            row_entry: (&unused).into(),
            out: act.view(),
            params,
            live: LiveRows::new(LiveCount::tokens()).offset(LiveCount::tokens().times(expert)),
            activation: ffn.activation,
            bias: ffn.bias.as_ref().map(|b| &b.gate_up),
        };
        ds.extend(up.gemm(scratch, kernels.up, None)?);
        let down = Pass {
            swiglu: false,
            gather: false,
            x: act.view(),
            w: &ffn.down,
            w_up: &ffn.down,
            out: all,
            params: Params { n: h, kdim: f, ..params },
            bias: ffn.bias.as_ref().map(|b| &b.down),
            ..up
        };
        ds.extend(down.gemm(scratch, kernels.down, None)?);
    }
    Ok(FfnPlan { dispatches: ds })
}

/// Which kernel runs a dense GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum DenseKernel {
    /// A block GEMM variant (the grouped GEMM's kernels, one expert, no gather).
    Block(GemmVariant),
    /// One output per invocation straight from memory (no workgroup memory, no barriers).
    Rowwise,
}

/// (c) Dense GEMM `y[rows, N] = x[rows, K] . w[0]^T` in `order`: the throughput yardstick for
/// the grouped GEMM (same kernels, one expert, no gather). Every kernel gives bit-identical
/// results in one order.
///
/// # Errors
/// [`Error::Shape`] for a buffer smaller than its shape; [`GemmVariant::validate`]'s
/// errors; [`Error::LimitExceeded`] past the adapter's limits.
pub fn plan_dense<'b>(
    ctx: &Context,
    w: &ExpertWeights,
    rows: u32,
    x: impl Into<BufferView<'b>>,
    y: impl Into<BufferView<'b>>,
    kernel: DenseKernel,
    order: GemmOrder,
) -> Result<FfnPlan> {
    plan_dense_with(Scratch::Own(ctx), w, rows, x.into(), y.into(), kernel, order)
}

/// [`plan_dense`] with its x windows taken from `scratch`.
pub(crate) fn plan_dense_with(
    scratch: Scratch<'_>,
    w: &ExpertWeights,
    rows: u32,
    x: BufferView<'_>,
    y: BufferView<'_>,
    kernel: DenseKernel,
    order: GemmOrder,
) -> Result<FfnPlan> {
    let ctx = scratch.ctx();
    let [_, n, k] = w.shape();
    ctx.check_view("x", &x, u64::from(rows) * u64::from(k) * 4, Access::Read)?;
    ctx.check_view("y", &y, u64::from(rows) * u64::from(n) * 4, Access::ReadWrite)?;
    let unused = ctx.storage_scratch("identity rows", 4)?;
    let params = Params {
        rows,
        n,
        kdim: k,
        k_route: 1,
        row_offset: 0,
        fixed_expert: 0,
        tile_rows: 1,
        ..Params::default()
    };
    let pass = Pass {
        order,
        swiglu: false,
        gather: false,
        out_entry: false,
        identity_rows: true,
        x,
        w,
        w_up: w,
        row_entry: (&unused).into(),
        out: y,
        params,
        live: LiveRows::new(LiveCount::tokens()),
        activation: Activation::Swiglu,
        bias: None,
    };
    let dispatches = match kernel {
        DenseKernel::Block(variant) => {
            variant.validate()?;
            pass.gemm(scratch, variant, None)?
        }
        DenseKernel::Rowwise => {
            let count = ctx.upload("dense rows", &[rows])?;
            pass.rowwise(scratch, None, (&count).into(), RowSource::Storage)?
        }
    };
    Ok(FfnPlan { dispatches })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;

    /// The workgroup memory the planner checks against the device's limit
    /// (`GemmVariant::workgroup_bytes`) is what the generated WGSL declares.
    #[test]
    fn workgroup_bytes_match_the_generated_wgsl() {
        for v in contract_variants() {
            for order in [GemmOrder::Strict, GemmOrder::Fast] {
                let reflected = variant::spec(v, order, WeightLoads::Packed).reflect().unwrap();
                assert_eq!(reflected.workgroup_bytes, v.workgroup_bytes(), "{} {order:?}", v.name());
                assert_eq!(reflected.invocations, v.invocations(), "{} {order:?}", v.name());
            }
        }
    }

    fn stored(dtype: WeightDtype, values: &[f32], k: usize) -> Vec<u8> {
        let eb = dtype.element_bytes().expect("a float dtype");
        bytemuck::cast_slice(&dtype.pack(values, k).expect("pack"))
            .iter()
            .copied()
            .take(values.len() * eb)
            .collect()
    }

    /// Quantised blocks streamed one expert at a time hold `from_quantised`'s words when kept
    /// in their format (through a staging chunk of a few bytes), and `from_f32`'s words of
    /// their decoded values when converted.
    #[test]
    fn streamed_quantised_blocks_are_the_words_of_from_quantised() {
        let ctxs = Context::all().expect("devices");
        if ctxs.is_empty() {
            assert_ne!(std::env::var("MOEFLOW_REQUIRE_ADAPTER").as_deref(), Ok("1"), "no adapter");
            eprintln!("skipped: no adapter");
            return;
        }
        let (e, n, k) = (3usize, 5usize, 160usize);
        let values: Vec<f32> = (0..e * n * k).map(|i| (i as f32 * 0.391).sin() * 2.0 - 0.25).collect();
        let q8 = quant::q8_0_quantize(&values).expect("q8_0");
        let q4 = quant::q4_0_quantize(&values).expect("q4_0");
        let (codes, scales) = quant::mxfp4_quantize(&values).expect("mxfp4");
        let block = [2, 128];
        let per_expert: Vec<(Vec<u8>, Vec<f32>)> = (0..e)
            .map(|i| {
                quant::fp8_block_quantize(&values[i * n * k..(i + 1) * n * k], [n, k], block).expect("fp8")
            })
            .collect();
        let fp8_bytes: Vec<u8> = per_expert.iter().flat_map(|(w, _)| w.clone()).collect();
        let fp8_scales: Vec<f32> = per_expert.iter().flat_map(|(_, s)| s.clone()).collect();
        let whole = [
            QuantisedValues::Q8_0(&q8),
            QuantisedValues::Q4_0(&q4),
            QuantisedValues::Mxfp4 { codes: &codes, scales: &scales },
            QuantisedValues::Fp8 { weight: &fp8_bytes, scale_inv: &fp8_scales, block },
        ];
        /// Expert `i` of `q`, `[1, n, k]` (`rows` blocks of 32 values).
        fn expert<'a>(
            q: QuantisedValues<'a>,
            fp8: &'a [(Vec<u8>, Vec<f32>)],
            rows: usize,
            i: usize,
        ) -> StoredValues<'a> {
            let part = |b: &'a [u8], per: usize| &b[i * per..(i + 1) * per];
            StoredValues::Quantised(match q {
                QuantisedValues::Q8_0(b) => QuantisedValues::Q8_0(part(b, rows * quant::Q8_0_BLOCK_BYTES)),
                QuantisedValues::Q4_0(b) => QuantisedValues::Q4_0(part(b, rows * quant::Q4_0_BLOCK_BYTES)),
                QuantisedValues::Mxfp4 { codes, scales } => QuantisedValues::Mxfp4 {
                    codes: part(codes, rows * quant::MXFP4_BLOCK_BYTES),
                    scales: part(scales, rows),
                },
                QuantisedValues::Fp8 { block, .. } => {
                    QuantisedValues::Fp8 { weight: &fp8[i].0, scale_inv: &fp8[i].1, block }
                }
            })
        }
        let shape = [e as u32, n as u32, k as u32];
        for ctx in &ctxs {
            let words = |w: &ExpertWeights| -> Vec<Vec<u32>> {
                w.chunks
                    .iter()
                    .map(|c| ctx.read_back::<u32>(&c.buffer, c.bytes as usize / 4).expect("read"))
                    .collect()
            };
            for q in &whole {
                let stored: Vec<StoredValues<'_>> =
                    (0..e).map(|i| expert(*q, &per_expert, n * k / quant::BLOCK_VALUES, i)).collect();
                let want =
                    ExpertWeights::from_quantised(ctx, *q, shape[0], shape[1], shape[2]).expect("whole");
                let got = ExpertWeights::stream_in_chunks(
                    ctx,
                    q.dtype(),
                    shape,
                    |i| Ok(stored[i as usize]),
                    |_| {},
                    6,
                )
                .expect("streamed");
                assert_eq!(words(&got), words(&want), "{:?} as stored", q.dtype());
                assert_eq!(got.narrow_scales(), q.dtype() == WeightDtype::Mxfp4, "{:?}", q.dtype());
                assert_eq!(want.narrow_scales(), got.narrow_scales(), "{:?}", q.dtype());
                let decoded = q.dequantise([e, n, k]).expect("decode");
                let want =
                    ExpertWeights::from_f32(ctx, &decoded, WeightDtype::F16, shape[0], shape[1], shape[2])
                        .expect("from_f32");
                let got =
                    ExpertWeights::stream(ctx, WeightDtype::F16, shape, |i| Ok(stored[i as usize]), |_| {})
                        .expect("converted");
                assert_eq!(words(&got), words(&want), "{:?} to f16", q.dtype());
            }
            // One scale outside 2 ..= 252, in the last expert's last block: neither upload
            // decodes these weights with the narrow product.
            let mut wide = scales.clone();
            *wide.last_mut().expect("scales") = 1;
            let q = QuantisedValues::Mxfp4 { codes: &codes, scales: &wide };
            let stored: Vec<StoredValues<'_>> =
                (0..e).map(|i| expert(q, &per_expert, n * k / quant::BLOCK_VALUES, i)).collect();
            let streamed =
                ExpertWeights::stream_in_chunks(ctx, q.dtype(), shape, |i| Ok(stored[i as usize]), |_| {}, 6)
                    .expect("streamed");
            let whole = ExpertWeights::from_quantised(ctx, q, shape[0], shape[1], shape[2]).expect("whole");
            assert!(!streamed.narrow_scales() && !whole.narrow_scales());
            // Blocks that do not match one expert's [n, k] are an error.
            let err = ExpertWeights::stream(
                ctx,
                WeightDtype::Q8_0,
                shape,
                |_| Ok(StoredValues::Quantised(QuantisedValues::Q8_0(&q8))),
                |_| {},
            )
            .expect_err("three experts' blocks as one");
            assert!(err.to_string().contains("Q8_0 bytes"), "{err}");
        }
    }

    /// Streamed uploads hold the same words as `from_f32`, whatever the staging chunk (down to
    /// a few bytes, so writes split inside experts and inside words), the element count's
    /// parity, and the conversion between stored and device dtypes (quantised ones included,
    /// from finite values).
    #[test]
    fn streamed_weights_are_the_packed_words_of_from_f32() {
        let ctxs = Context::all().expect("devices");
        if ctxs.is_empty() {
            assert_ne!(std::env::var("MOEFLOW_REQUIRE_ADAPTER").as_deref(), Ok("1"), "no adapter");
            eprintln!("skipped: no adapter");
            return;
        }
        let dtypes = [WeightDtype::F32, WeightDtype::F16, WeightDtype::Bf16];
        let quantised = [WeightDtype::Q8_0, WeightDtype::Q4_0, WeightDtype::Mxfp4, WeightDtype::Fp8];
        for ctx in &ctxs {
            for (shape, with_inf) in [[3u32, 5, 7], [4, 6, 8], [1, 1, 1], [2, 3, 67]]
                .into_iter()
                .flat_map(|s| [(s, true), (s, false)])
            {
                let [e, n, k] = shape;
                let len = (e * n * k) as usize;
                // Values that round differently in f16 and bf16, with ±0, subnormals and inf.
                let values: Vec<f32> = (0..len)
                    .map(|i| match i % 7 {
                        0 => -0.0,
                        1 => 1.0e-40,
                        2 if with_inf => f32::INFINITY,
                        2 => 65504.0,
                        _ => (i as f32 * 0.7313).sin() * 3.0 + 1.0 / 3.0,
                    })
                    .collect();
                for from in dtypes {
                    let file = stored(from, &values, k as usize);
                    let per = (n * k) as usize * from.element_bytes().expect("a float dtype");
                    let finite = values.iter().all(|v| v.is_finite());
                    let targets = dtypes.iter().chain(if finite { &quantised[..] } else { &[] });
                    for &to in targets {
                        let rounded = from.round(&values, k as usize).expect("round");
                        let want = ExpertWeights::from_f32(ctx, &rounded, to, e, n, k).expect("from_f32");
                        let want = ctx
                            .read_back::<u32>(&want.chunks[0].buffer, want.chunks[0].bytes as usize / 4)
                            .expect("read");
                        for chunk in [2usize, 6, 1 << 20] {
                            let mut released = Vec::new();
                            let got = ExpertWeights::stream_in_chunks(
                                ctx,
                                to,
                                shape,
                                |i| {
                                    Ok(StoredValues::Float {
                                        dtype: from,
                                        bytes: &file[i as usize * per..(i as usize + 1) * per],
                                    })
                                },
                                |i| released.push(i),
                                chunk,
                            )
                            .expect("stream");
                            assert_eq!(got.shape(), shape);
                            assert_eq!(got.dtype(), to);
                            let got = ctx.read_back::<u32>(&got.chunks[0].buffer, want.len()).expect("read");
                            assert_eq!(got, want, "{shape:?} {from:?} -> {to:?}, chunk {chunk}");
                            assert_eq!(released, (0..e).collect::<Vec<_>>());
                        }
                    }
                }
                // A stored expert of the wrong length is an error naming the expert.
                let err = ExpertWeights::stream(
                    ctx,
                    WeightDtype::F16,
                    shape,
                    |_| Ok(StoredValues::Float { dtype: WeightDtype::F16, bytes: &[0u8; 2] }),
                    |_| {},
                );
                if len > 1 {
                    let err = err.expect_err("short expert").to_string();
                    assert!(err.contains("expert 0 of"), "{err}");
                }
            }
        }
    }
}
