//! The expert FFN ([`ExpertFfn`]): gate, up and down projections, optional biases
//! ([`ExpertBias`]), the activation between them ([`Activation`]) and the kernels it runs.

use serde::{Deserialize, Serialize};

use super::policy::AdapterKind;
use super::variant::{FfnKernels, GemmOrder};
use super::weights::ExpertWeights;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::shader::Override;
use crate::tensor::word_bytes;

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
    pub(super) fn constants(self) -> [(Override, f64); 3] {
        match self {
            Activation::Swiglu => {
                [(Override::Activation, 0.0), (Override::GluAlpha, 1.0), (Override::GluLimit, 1.0)]
            }
            Activation::ClampedSwiglu { alpha, limit } => [
                (Override::Activation, 1.0),
                (Override::GluAlpha, f64::from(alpha)),
                (Override::GluLimit, f64::from(limit)),
            ],
        }
    }
}

/// Biases of an expert FFN's projections on the device (gpt-oss): added to each projection's
/// dot product before the activation (gate, up) or as the last step (down).
#[derive(Debug)]
pub struct ExpertBias {
    /// `[E, F, 2]`: each column's (gate, up) pair.
    pub(super) gate_up: wgpu::Buffer,
    /// `[E, H]`.
    pub(super) down: wgpu::Buffer,
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
    pub(super) kernels: Option<FfnKernels>,
    /// The activation between gate/up and down.
    pub(super) activation: Activation,
    /// Projection biases, where the model has them.
    pub(super) bias: Option<ExpertBias>,
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
        // Gate and up biases interleaved: two words per (expert, column).
        let want_gate_up = word_bytes(u64::from(e) * u64::from(f) * 2);
        let want_down = word_bytes(u64::from(e) * u64::from(h));
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

    /// Whether the device holds expert `e` in all three projections (every expert, unless
    /// the weights were placed: [`ExpertWeights::from_f32_placed`]).
    pub fn holds(&self, e: u32) -> bool {
        self.gate.holds(e) && self.up.holds(e) && self.down.holds(e)
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
