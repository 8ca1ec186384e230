//! Seeded synthetic inputs for examples, tests and benchmarks (ChaCha8, so the same seed
//! gives the same data on every platform and release).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};
use crate::kernels::gemm::{QuantisedValues, StoredValues, WeightDtype};
use crate::layer::{ExpertBiasValues, MoeConfig, MoeWeights};
use crate::quant;

/// A seeded generator of uniform f32 tensors.
#[derive(Clone, Debug)]
pub struct Synth {
    rng: ChaCha8Rng,
}

impl Synth {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Synth { rng: ChaCha8Rng::seed_from_u64(seed) }
    }

    /// `n` values uniform in `[-scale, scale)`.
    pub fn uniform(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.rng.random_range(-scale..scale)).collect()
    }

    /// A routing problem: `x[tokens, hidden]` in [-1, 1) and `gate[experts, hidden]` scaled
    /// by 1/sqrt(hidden) like an initialised linear layer.
    pub fn routing(&mut self, tokens: usize, hidden: usize, experts: usize) -> (Vec<f32>, Vec<f32>) {
        let x = self.uniform(tokens * hidden, 1.0);
        let gate = self.uniform(experts * hidden, 1.0 / (hidden as f32).sqrt());
        (x, gate)
    }

    /// Weights for every tensor `cfg` needs, scaled like initialised linear layers (router
    /// rows by 1/sqrt(H), down projections by 1/sqrt(F)).
    pub fn moe_weights(&mut self, cfg: &MoeConfig) -> MoeWeights {
        let (h, f, e) = (cfg.route.hidden as usize, cfg.ffn as usize, cfg.route.experts as usize);
        let (sh, sf) = (1.0 / (h as f32).sqrt(), 1.0 / (f as f32).sqrt());
        MoeWeights {
            router: self.uniform(e * h, sh),
            bias: cfg.route.bias.then(|| self.uniform(e, 0.05)),
            gate: self.uniform(e * f * h, sh),
            up: self.uniform(e * f * h, sh),
            down: self.uniform(e * h * f, sf),
            shared: cfg.shared_ffn.map(|fs| {
                let fs = fs as usize;
                (
                    self.uniform(fs * h, sh),
                    self.uniform(fs * h, sh),
                    self.uniform(h * fs, 1.0 / (fs as f32).sqrt()),
                )
            }),
            shared_gate: cfg.shared_gate.then(|| self.uniform(h, sh)),
            // Drawn last, so layers without them keep their values.
            router_bias: cfg.route.router_bias.then(|| self.uniform(e, 0.5)),
            expert_bias: cfg.expert_bias.then(|| ExpertBiasValues {
                gate: self.uniform(e * f, 0.5),
                up: self.uniform(e * f, 0.5),
                down: self.uniform(e * h, 0.1),
            }),
        }
    }
}

/// The block tile of FP8 expert weights [`StoredExperts`] makes (DeepSeek-V3's).
pub const FP8_TILE: [usize; 2] = [128, 128];

/// Expert weights `[experts, n, k]` as a checkpoint stores them in a dtype: float elements
/// (little-endian), or quantised blocks by [`crate::quant`]'s quantisers (FP8 in
/// [`FP8_TILE`] tiles per expert), with the values they decode to. For building a layer's
/// device and host experts from the very same stored values.
#[derive(Clone, Debug)]
pub struct StoredExperts {
    dtype: WeightDtype,
    shape: [usize; 3],
    bytes: Vec<u8>,
    scales: Vec<u8>,
    fp8_scales: Vec<f32>,
    decoded: Vec<f32>,
}

impl StoredExperts {
    /// `values[experts, n, k]` stored as `dtype`.
    ///
    /// # Errors
    /// The quantisers' errors (a value that is not finite; K not whole blocks).
    pub fn new(dtype: WeightDtype, values: &[f32], shape: [usize; 3]) -> Result<Self> {
        let [e, n, k] = shape;
        if values.len() != e * n * k {
            return Err(Error::shape("stored experts", format!("{shape:?}"), values.len()));
        }
        let mut s = StoredExperts {
            dtype,
            shape,
            bytes: Vec::new(),
            scales: Vec::new(),
            fp8_scales: Vec::new(),
            decoded: Vec::new(),
        };
        match dtype {
            WeightDtype::F32 => s.bytes = bytemuck::cast_slice(values).to_vec(),
            WeightDtype::F16 => {
                s.bytes = values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect()
            }
            WeightDtype::Bf16 => {
                s.bytes = values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect()
            }
            WeightDtype::Q8_0 => s.bytes = quant::q8_0_quantize(values)?,
            WeightDtype::Q4_0 => s.bytes = quant::q4_0_quantize(values)?,
            WeightDtype::Mxfp4 => (s.bytes, s.scales) = quant::mxfp4_quantize(values)?,
            WeightDtype::Fp8 => {
                for x in 0..e {
                    let (w, sc) =
                        quant::fp8_block_quantize(&values[x * n * k..(x + 1) * n * k], [n, k], FP8_TILE)?;
                    s.bytes.extend(w);
                    s.fp8_scales.extend(sc);
                }
            }
        }
        s.decode()?;
        Ok(s)
    }

    /// Sets block `b`'s scale (Q8_0, Q4_0: an f16 `d`; MXFP4: an E8M0 byte, given as its f16's
    /// low byte) to `bits`, for inputs with special values; other dtypes are left as they are.
    ///
    /// # Errors
    /// A block past the values.
    pub fn set_block_scale(&mut self, b: usize, bits: u16) -> Result<()> {
        self.set_block_scales(b..b + 1, bits)
    }

    /// [`Self::set_block_scale`] for every block of `blocks`, decoding the values once.
    ///
    /// # Errors
    /// A block past the values.
    pub fn set_block_scales(&mut self, blocks: std::ops::Range<usize>, bits: u16) -> Result<()> {
        for b in blocks {
            let at = |per: usize| b * per..b * per + 2;
            let out_of_range = || Error::invalid(format!("block {b} is past the stored values"));
            match self.dtype {
                WeightDtype::Q8_0 => {
                    self.bytes.get_mut(at(34)).ok_or_else(out_of_range)?.copy_from_slice(&bits.to_le_bytes())
                }
                WeightDtype::Q4_0 => {
                    self.bytes.get_mut(at(18)).ok_or_else(out_of_range)?.copy_from_slice(&bits.to_le_bytes())
                }
                WeightDtype::Mxfp4 => *self.scales.get_mut(b).ok_or_else(out_of_range)? = bits as u8,
                _ => return Ok(()),
            }
        }
        self.decode()
    }

    fn decode(&mut self) -> Result<()> {
        let [e, n, k] = self.shape;
        let mut decoded = Vec::with_capacity(e * n * k);
        for x in 0..e as u32 {
            match self.expert(x) {
                StoredValues::Quantised(q) => decoded.extend(q.dequantise([1, n, k])?),
                StoredValues::Float { dtype: WeightDtype::F16, bytes } => decoded
                    .extend(bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())),
                StoredValues::Float { dtype: WeightDtype::Bf16, bytes } => decoded
                    .extend(bytes.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())),
                StoredValues::Float { bytes, .. } => decoded
                    .extend(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
            }
        }
        self.decoded = decoded;
        Ok(())
    }

    /// Expert `x`'s stored values (`x` below the shape's experts).
    pub fn expert(&self, x: u32) -> StoredValues<'_> {
        let [_, n, k] = self.shape;
        let x = x as usize;
        let blocks = n * k / quant::BLOCK_VALUES;
        fn part(v: &[u8], x: usize, per: usize) -> &[u8] {
            &v[x * per..(x + 1) * per]
        }
        match self.dtype {
            WeightDtype::F32 => {
                StoredValues::Float { dtype: self.dtype, bytes: part(&self.bytes, x, n * k * 4) }
            }
            WeightDtype::F16 | WeightDtype::Bf16 => {
                StoredValues::Float { dtype: self.dtype, bytes: part(&self.bytes, x, n * k * 2) }
            }
            WeightDtype::Q8_0 => StoredValues::Quantised(QuantisedValues::Q8_0(part(
                &self.bytes,
                x,
                blocks * quant::Q8_0_BLOCK_BYTES,
            ))),
            WeightDtype::Q4_0 => StoredValues::Quantised(QuantisedValues::Q4_0(part(
                &self.bytes,
                x,
                blocks * quant::Q4_0_BLOCK_BYTES,
            ))),
            WeightDtype::Mxfp4 => StoredValues::Quantised(QuantisedValues::Mxfp4 {
                codes: part(&self.bytes, x, blocks * quant::MXFP4_BLOCK_BYTES),
                scales: part(&self.scales, x, blocks),
            }),
            WeightDtype::Fp8 => {
                let tiles = n.div_ceil(FP8_TILE[0]) * k.div_ceil(FP8_TILE[1]);
                StoredValues::Quantised(QuantisedValues::Fp8 {
                    weight: part(&self.bytes, x, n * k),
                    scale_inv: &self.fp8_scales[x * tiles..(x + 1) * tiles],
                    block: FP8_TILE,
                })
            }
        }
    }

    /// The values the stored ones decode to, `[experts, n, k]`.
    pub fn decoded(&self) -> &[f32] {
        &self.decoded
    }

    /// `[experts, n, k]`.
    pub fn shape(&self) -> [u32; 3] {
        self.shape.map(|d| d as u32)
    }

    /// The stored dtype.
    pub fn dtype(&self) -> WeightDtype {
        self.dtype
    }
}
