//! gpt-oss MoE layers (`model_type: gpt_oss`) from safetensors, with the names and layouts of
//! the published checkpoints and of transformers' `GptOssExperts`:
//!
//! | tensor | shape | as |
//! |---|---|---|
//! | `mlp.router.weight`, `mlp.router.bias` | `[E, H]`, `[E]` | the affine router |
//! | `mlp.experts.gate_up_proj_blocks`, `_scales` | `[E, 2F, H/32, 16]`, `[E, 2F, H/32]` u8 | MXFP4 (as shipped): output row `2j` is gate column `j`, row `2j + 1` up column `j` |
//! | `mlp.experts.down_proj_blocks`, `_scales` | `[E, H, F/32, 16]`, `[E, H, F/32]` u8 | MXFP4 |
//! | `mlp.experts.gate_up_proj` | `[E, H, 2F]` | dense (in × out; gate `[..., 2j]`, up `[..., 2j + 1]`) |
//! | `mlp.experts.down_proj` | `[E, F, H]` | dense (in × out) |
//! | `mlp.experts.gate_up_proj_bias`, `down_proj_bias` | `[E, 2F]`, `[E, H]` | biases (interleaved like the rows) |
//!
//! MXFP4 experts are uploaded as stored (`ExpertWeights::from_quantised`, no requantisation);
//! dense ones in their stored dtype. The host load ([`super::load_checkpoint_layer`]) gives the
//! decoded values as f32. Experts placed on the host ([`Plan::placed`]) are read in place,
//! MXFP4 as shipped.

use safetensors::Dtype;

use super::family::{self, Routing, TensorFacts};
use super::loaded::LoadOptions;
use super::naming::GPT_OSS_ROUTER;
use super::tensors::{File, stored_dtype, to_f32};
use crate::context::Context;
use crate::error::{Error, Result};
#[cfg(not(target_arch = "wasm32"))]
use crate::host_experts::{HostBias, HostExperts, HostProjection};
use crate::kernels::gemm::{ExpertBias, ExpertFfn, ExpertWeights, QuantisedValues, WeightDtype};
#[cfg(not(target_arch = "wasm32"))]
use crate::kernels::gemm::{ExpertPlacement, StoredValues};
use crate::kernels::routing::RouteConfig;
use crate::layer::{ExpertBiasValues, MoeConfig, RouterWeights};
use crate::quant;

/// The router's name, which marks a gpt-oss layer.
pub(super) const ROUTER: &str = GPT_OSS_ROUTER;
const ROUTER_BIAS: &str = "mlp.router.bias";
const GATE_UP_BLOCKS: &str = "mlp.experts.gate_up_proj_blocks";
const GATE_UP_SCALES: &str = "mlp.experts.gate_up_proj_scales";
const DOWN_BLOCKS: &str = "mlp.experts.down_proj_blocks";
const DOWN_SCALES: &str = "mlp.experts.down_proj_scales";
const GATE_UP: &str = "mlp.experts.gate_up_proj";
const DOWN: &str = "mlp.experts.down_proj";
const GATE_UP_BIAS: &str = "mlp.experts.gate_up_proj_bias";
const DOWN_BIAS: &str = "mlp.experts.down_proj_bias";

/// How the layer's experts are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stored {
    /// `*_blocks` and `*_scales` (u8).
    Mxfp4,
    /// `gate_up_proj` and `down_proj` in this float dtype.
    Dense(WeightDtype),
}

/// A gpt-oss layer as found in the headers, with its small tensors read.
pub(super) struct Plan<'a> {
    pub f: File<'a>,
    pub cfg: MoeConfig,
    pub routing: Routing,
    pub router: RouterWeights,
    pub bias: ExpertBiasValues,
    stored: Stored,
}

/// A u8 tensor `prefix + rest` of exactly `shape`.
fn bytes<'a>(f: &File<'a>, rest: &str, shape: &[usize]) -> Result<&'a [u8]> {
    let name = f.name(rest);
    let t = f.view(rest, &format!("{shape:?} u8"))?;
    if t.shape() != shape {
        return Err(Error::shape(format!("tensor {name}"), format!("{shape:?}"), format!("{:?}", t.shape())));
    }
    if t.dtype() != Dtype::U8 {
        return Err(Error::invalid(format!(
            "tensor `{name}` is {:?}; MXFP4 blocks and scales are u8",
            t.dtype()
        )));
    }
    Ok(t.data())
}

/// `[E, 2F, ...]` rows interleaved gate/up split into gate rows and up rows, each `[E, F, ...]`
/// (`row` elements per row).
fn deinterleave<T: Copy>(v: &[T], row: usize) -> (Vec<T>, Vec<T>) {
    let (mut gate, mut up) = (Vec::with_capacity(v.len() / 2), Vec::with_capacity(v.len() / 2));
    for (i, r) in v.chunks(row).enumerate() {
        if i % 2 == 0 { gate.extend_from_slice(r) } else { up.extend_from_slice(r) }
    }
    (gate, up)
}

/// `[E, A, B]` as `[E, B, A]`.
fn transpose(v: &[f32], [e, a, b]: [usize; 3]) -> Vec<f32> {
    let mut out = vec![0.0f32; v.len()];
    for x in 0..e {
        for i in 0..a {
            for j in 0..b {
                out[(x * b + j) * a + i] = v[(x * a + i) * b + j];
            }
        }
    }
    out
}

pub(super) fn plan<'a>(f: File<'a>, opts: &LoadOptions) -> Result<Plan<'a>> {
    let [e, h] = f.matrix_shape(ROUTER, "[experts, hidden], both at least 1")?;
    let router = f.get(ROUTER, &[e, h])?;
    let router_bias = f.get(ROUTER_BIAS, &[e])?;
    let (stored, ffn) = if f.has(GATE_UP_BLOCKS) {
        let t = f.view(GATE_UP_BLOCKS, "[experts, 2 * ffn, hidden / 32, 16]")?;
        let [te, f2, g, b] = *t.shape() else {
            return Err(Error::shape(
                format!("tensor {}", f.name(GATE_UP_BLOCKS)),
                "[experts, 2 * ffn, hidden / 32, 16]",
                format!("{:?}", t.shape()),
            ));
        };
        if te != e || f2 == 0 || f2 % 2 != 0 || !h.is_multiple_of(32) || g != h / 32 || b != 16 {
            return Err(Error::shape(
                format!("tensor {}", f.name(GATE_UP_BLOCKS)),
                format!("[{e}, 2 * ffn, {}, 16] (hidden {h} a multiple of 32)", h / 32),
                format!("{:?}", t.shape()),
            ));
        }
        let ffn = f2 / 2;
        if !ffn.is_multiple_of(32) {
            return Err(Error::invalid(format!(
                "gpt-oss MXFP4 down_proj needs ffn a multiple of 32; ffn is {ffn}"
            )));
        }
        bytes(&f, GATE_UP_SCALES, &[e, f2, h / 32])?;
        bytes(&f, DOWN_BLOCKS, &[e, h, ffn / 32, 16])?;
        bytes(&f, DOWN_SCALES, &[e, h, ffn / 32])?;
        (Stored::Mxfp4, ffn)
    } else {
        let t = f.view(GATE_UP, &format!("[{e}, {h}, 2 * ffn] (or MXFP4 `{GATE_UP_BLOCKS}`)"))?;
        let f2 = match *t.shape() {
            [te, th, f2] if te == e && th == h && f2 > 0 && f2 % 2 == 0 => f2,
            ref s => {
                return Err(Error::shape(
                    format!("tensor {}", f.name(GATE_UP)),
                    format!("[{e}, {h}, 2 * ffn]"),
                    format!("{s:?}"),
                ));
            }
        };
        let (name, gate_up) = f.checked(GATE_UP, &[e, h, f2])?;
        let dtype = stored_dtype(&name, gate_up.dtype())?;
        let (down_name, down) = f.checked(DOWN, &[e, f2 / 2, h])?;
        if down.dtype() != gate_up.dtype() {
            return Err(Error::invalid(format!(
                "`{name}` is {:?} but `{down_name}` is {:?}: pass a dtype (--dtype) to convert both",
                gate_up.dtype(),
                down.dtype()
            )));
        }
        (Stored::Dense(dtype), f2 / 2)
    };
    let gate_up_bias = f.get(GATE_UP_BIAS, &[e, 2 * ffn])?;
    let down_bias = f.get(DOWN_BIAS, &[e, h])?;
    let (gate_b, up_b) = deinterleave(&gate_up_bias, 1);

    let dim = |v: usize, what: &str| {
        u32::try_from(v).map_err(|_| Error::limit(what, v as u64, u32::MAX.into(), "u32 dimensions"))
    };
    let facts = TensorFacts {
        mixtral_names: false,
        gpt_oss_names: true,
        experts: dim(e, "experts")?,
        ffn: dim(ffn, "expert FFN size")?,
        bias: false,
        shared: None,
        shared_gate: false,
    };
    let routing = family::resolve(opts.config.as_ref(), &opts.routing, &facts)?;
    let base = MoeConfig::new(dim(h, "hidden size")?, facts.ffn, facts.experts, routing.k);
    let weight_dtype = match (opts.dtype, stored) {
        (Some(d), _) => d,
        (None, Stored::Mxfp4) => WeightDtype::Mxfp4,
        (None, Stored::Dense(d)) => d,
    };
    let cfg = MoeConfig {
        route: RouteConfig {
            gating: routing.gating,
            renormalize: routing.renormalize,
            scale: routing.scale,
            router_bias: true,
            ..base.route
        },
        activation: routing.activation,
        expert_bias: true,
        weight_dtype,
        ..base
    };
    cfg.validate()?;
    let router = RouterWeights { router, bias: None, shared_gate: None, router_bias: Some(router_bias) };
    router.check(&cfg)?;
    let bias = ExpertBiasValues { gate: gate_b, up: up_b, down: down_bias };
    Ok(Plan { f, cfg, routing, router, bias, stored })
}

impl<'a> Plan<'a> {
    /// `[E, F, H]`, `[E, F, H]` and `[E, H, F]` as `[e, f, h]` sizes.
    fn sizes(&self) -> [usize; 3] {
        [self.cfg.route.experts as usize, self.cfg.ffn as usize, self.cfg.route.hidden as usize]
    }

    /// The MXFP4 blocks and scales of gate/up (de-interleaved) and down, as stored.
    fn mxfp4(&self) -> Result<[(Vec<u8>, Vec<u8>); 3]> {
        let [e, f, h] = self.sizes();
        let gu_codes = bytes(&self.f, GATE_UP_BLOCKS, &[e, 2 * f, h / 32, 16])?;
        let gu_scales = bytes(&self.f, GATE_UP_SCALES, &[e, 2 * f, h / 32])?;
        let (gate_c, up_c) = deinterleave(gu_codes, h / 32 * 16);
        let (gate_s, up_s) = deinterleave(gu_scales, h / 32);
        let down_c = bytes(&self.f, DOWN_BLOCKS, &[e, h, f / 32, 16])?.to_vec();
        let down_s = bytes(&self.f, DOWN_SCALES, &[e, h, f / 32])?.to_vec();
        Ok([(gate_c, gate_s), (up_c, up_s), (down_c, down_s)])
    }

    /// Gate, up `[E, F, H]` and down `[E, H, F]` as f32: the MXFP4 values decoded exactly, or
    /// the dense tensors transposed to out × in.
    pub fn host_experts(&self) -> Result<[Vec<f32>; 3]> {
        let [e, f, h] = self.sizes();
        match self.stored {
            Stored::Mxfp4 => {
                let [g, u, d] = self.mxfp4()?;
                Ok([
                    quant::mxfp4_dequantize(&g.0, &g.1)?,
                    quant::mxfp4_dequantize(&u.0, &u.1)?,
                    quant::mxfp4_dequantize(&d.0, &d.1)?,
                ])
            }
            Stored::Dense(_) => {
                let (name, t) = self.f.checked(GATE_UP, &[e, h, 2 * f])?;
                let gate_up = transpose(&to_f32(&name, &t)?, [e, h, 2 * f]);
                let (gate, up) = deinterleave(&gate_up, h);
                let (name, t) = self.f.checked(DOWN, &[e, f, h])?;
                let down = transpose(&to_f32(&name, &t)?, [e, f, h]);
                Ok([gate, up, down])
            }
        }
    }

    /// The experts `placement` keeps on the device (uploaded as [`Self::device_experts`] would,
    /// MXFP4 as stored) and those it puts on the host, read in place in the checkpoint: gate
    /// and up as the even and odd rows of the fused blocks ([`HostProjection::hold_rows`]),
    /// down as stored, the biases de-interleaved.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for dense experts (stored in × out, which the host does not
    /// read in place) or a layer that does not keep MXFP4; as [`HostExperts::new`] and
    /// [`ExpertWeights::stream_placed`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn placed(
        &self,
        ctx: &Context,
        cfg: &MoeConfig,
        placement: &ExpertPlacement,
    ) -> Result<(ExpertFfn, HostExperts<'a>)> {
        if self.stored != Stored::Mxfp4 || cfg.weight_dtype != WeightDtype::Mxfp4 {
            return Err(Error::invalid(format!(
                "gpt-oss experts on the host are read in place as shipped, MXFP4 blocks; this layer's are {:?} \
                 (dense gate_up_proj and down_proj are stored in x out, which the host does not read in place)",
                match self.stored {
                    Stored::Mxfp4 => cfg.weight_dtype,
                    Stored::Dense(d) => d,
                }
            )));
        }
        let [e, f, h] = self.sizes();
        let gu_codes = bytes(&self.f, GATE_UP_BLOCKS, &[e, 2 * f, h / 32, 16])?;
        let gu_scales = bytes(&self.f, GATE_UP_SCALES, &[e, 2 * f, h / 32])?;
        let down_codes = bytes(&self.f, DOWN_BLOCKS, &[e, h, f / 32, 16])?;
        let down_scales = bytes(&self.f, DOWN_SCALES, &[e, h, f / 32])?;
        // Expert x's slab of a `[E, ...]` u8 tensor.
        let slab = |t: &'a [u8], x: usize| &t[x * t.len() / e..(x + 1) * t.len() / e];
        let mxfp4 = |codes: &'a [u8], scales: &'a [u8], x: u32| {
            StoredValues::Quantised(QuantisedValues::Mxfp4 {
                codes: slab(codes, x as usize),
                scales: slab(scales, x as usize),
            })
        };
        let shape = |n: usize, k: usize| [e as u32, n as u32, k as u32];
        let (mut gate, mut up) = (HostProjection::new(shape(f, h))?, HostProjection::new(shape(f, h))?);
        let mut down = HostProjection::new(shape(h, f))?;
        for x in placement.host_experts() {
            gate.hold_rows(x, mxfp4(gu_codes, gu_scales, x), 0, 2)?;
            up.hold_rows(x, mxfp4(gu_codes, gu_scales, x), 1, 2)?;
            down.hold(x, mxfp4(down_codes, down_scales, x))?;
        }
        let host = HostExperts::new(gate, up, down, cfg.gemm_order, cfg.activation)?.with_bias(HostBias {
            gate: &self.bias.gate,
            up: &self.bias.up,
            down: &self.bias.down,
        })?;
        // The device's experts, gate and up de-interleaved expert by expert.
        let device = placement.device_experts();
        let split = |x: u32| {
            let (codes, scales) = (slab(gu_codes, x as usize), slab(gu_scales, x as usize));
            let ((gc, uc), (gs, us)) = (deinterleave(codes, h / 32 * 16), deinterleave(scales, h / 32));
            [(gc, gs), (uc, us)]
        };
        let split: Vec<[(Vec<u8>, Vec<u8>); 2]> = device.iter().map(|&x| split(x)).collect();
        let at = |x: u32| {
            device.iter().position(|&d| d == x).ok_or_else(|| {
                Error::invalid(format!("expert {x} is not one the placement keeps on the device"))
            })
        };
        let fused = |half: usize| {
            ExpertWeights::stream_placed(
                ctx,
                WeightDtype::Mxfp4,
                shape(f, h),
                placement,
                |x| {
                    let (codes, scales) = &split[at(x)?][half];
                    Ok(StoredValues::Quantised(QuantisedValues::Mxfp4 { codes, scales }))
                },
                |_| {},
            )
        };
        let down = ExpertWeights::stream_placed(
            ctx,
            WeightDtype::Mxfp4,
            shape(h, f),
            placement,
            |x| Ok(mxfp4(down_codes, down_scales, x)),
            |_| {},
        )?;
        let ffn = ExpertFfn::new(fused(0)?, fused(1)?, down)?;
        let (e32, f32_, h32) = (e as u32, f as u32, h as u32);
        let bias = ExpertBias::new(ctx, &self.bias.gate, &self.bias.up, &self.bias.down, [e32, f32_, h32])?;
        Ok((ffn.with_bias(bias)?, host))
    }

    /// The experts on the device in `cfg.weight_dtype`, with their biases: MXFP4 as stored
    /// when the layer keeps MXFP4, else from the decoded or dense values.
    pub fn device_experts(&self, ctx: &Context, cfg: &MoeConfig) -> Result<ExpertFfn> {
        let [e, f, h] = self.sizes();
        let (e32, f32_, h32) = (e as u32, f as u32, h as u32);
        let ffn = if self.stored == Stored::Mxfp4 && cfg.weight_dtype == WeightDtype::Mxfp4 {
            let [g, u, d] = self.mxfp4()?;
            let up = |(codes, scales): &(Vec<u8>, Vec<u8>), n, k| {
                ExpertWeights::from_quantised(ctx, QuantisedValues::Mxfp4 { codes, scales }, e32, n, k)
            };
            ExpertFfn::new(up(&g, f32_, h32)?, up(&u, f32_, h32)?, up(&d, h32, f32_)?)?
        } else {
            let [g, u, d] = self.host_experts()?;
            let up = |v: &[f32], n, k| ExpertWeights::from_f32(ctx, v, cfg.weight_dtype, e32, n, k);
            ExpertFfn::new(up(&g, f32_, h32)?, up(&u, f32_, h32)?, up(&d, h32, f32_)?)?
        };
        let bias = ExpertBias::new(ctx, &self.bias.gate, &self.bias.up, &self.bias.down, [e32, f32_, h32])?;
        ffn.with_bias(bias)
    }
}
