//! The layer's configuration ([`MoeConfig`]): shape, routing, capacity, kernels, order and
//! dtypes, checked before anything is built.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::kernels::combine::CombineMode;
use crate::kernels::dispatch::OverflowPolicy;
use crate::kernels::gemm::{Activation, AdapterKind, FfnKernels, GemmOrder, GemmVariant, WeightDtype};
use crate::kernels::routing::{RouteConfig, RouteMode};

/// How expert capacity is handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Capacity {
    /// Every routed entry is computed (padded-tile grouped GEMM; row-wise for decode sizes).
    #[default]
    Dropless,
    /// At most `bound` entries per expert in the grouped matmuls; the rest overflow to a
    /// second pass or are dropped (their contribution is zero).
    Bounded {
        /// Entries per expert.
        bound: u32,
        /// Overflow or drop.
        policy: OverflowPolicy,
    },
}

/// Which block-GEMM kernels a layer's expert projections run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum KernelChoice {
    /// The adapter's fixed default ([`FfnKernels::default_for`]).
    #[default]
    Default,
    /// Chosen by timing the candidates on the device when the layer is made
    /// ([`crate::kernels::gemm::tune`], cached on disk), on 32 rows per expert.
    Tuned,
    /// As [`KernelChoice::Tuned`], for prefills of about `tokens` tokens: timed on the rows an
    /// expert gets then (`tokens · k / E`, at least 1), so a layer that sees long prefills gets
    /// the tile that suits many rows per expert (the GPU candidates hold 32- to 128-row tiles)
    /// and one that sees short ones the tile that suits few.
    TunedFor {
        /// Tokens of the prefills the layer is tuned for (at least 1).
        tokens: u32,
    },
    /// These variants for the gate/up and the down projections.
    Fixed {
        /// Gate/up (SwiGLU) projection.
        up: GemmVariant,
        /// Down projection.
        down: GemmVariant,
    },
}

/// Everything that shapes a MoE layer: its routing (a [`RouteConfig`]: H, E, k and how
/// experts are chosen and weighted) and the rest.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct MoeConfig {
    /// The routing: hidden size H, experts E, experts per token k, gating, renormalisation,
    /// scale, selection bias and group limits (flattened into the same JSON object).
    #[serde(flatten)]
    pub route: RouteConfig,
    /// Routed expert FFN size F.
    pub ffn: u32,
    /// FFN size of the shared expert(s), all shared experts concatenated; None without.
    pub shared_ffn: Option<u32>,
    /// The shared expert's output is scaled by sigmoid(x . g) (Qwen2-MoE).
    pub shared_gate: bool,
    /// Capacity policy.
    pub capacity: Capacity,
    /// Storage dtype of expert weights (the router stays f32).
    pub weight_dtype: WeightDtype,
    /// Fused or unfused routing (bit-identical).
    pub route_mode: RouteMode,
    /// One-launch or sequential combine (bit-identical).
    pub combine: CombineMode,
    /// Accumulation order of every expert projection (routed and shared).
    pub gemm_order: GemmOrder,
    /// Block-GEMM kernels of the expert projections (every choice gives the same bits in one
    /// order).
    pub kernels: KernelChoice,
    /// The activation between the experts' gate/up and down projections (routed and shared).
    #[serde(default)]
    pub activation: Activation,
    /// The routed experts' projections add biases (gpt-oss):
    /// [`MoeWeights::expert_bias`](super::MoeWeights::expert_bias).
    #[serde(default)]
    pub expert_bias: bool,
}

impl MoeConfig {
    /// Softmax top-k routing over `experts` experts, renormalised, no shared expert; the
    /// unfused route (gate matvec, then top-k), the one-launch combine, strict GEMM order and
    /// the adapter's default kernels.
    pub fn new(hidden: u32, ffn: u32, experts: u32, k: u32) -> Self {
        MoeConfig {
            route: RouteConfig { renormalize: true, ..RouteConfig::new(hidden, experts, k) },
            ffn,
            shared_ffn: None,
            shared_gate: false,
            capacity: Capacity::Dropless,
            weight_dtype: WeightDtype::F32,
            // Unfused: measured at least as fast on every adapter (docs/routing.md); the fused
            // route is 3.4x slower at decode with E=256 on a GPU.
            route_mode: RouteMode::Unfused,
            combine: CombineMode::OneLaunch,
            gemm_order: GemmOrder::Strict,
            kernels: KernelChoice::Default,
            activation: Activation::Swiglu,
            expert_bias: false,
        }
    }

    /// The expert projections' kernels on a kind of adapter before tuning: the fixed choice,
    /// else the kind's default.
    pub(crate) fn ffn_kernels(&self, kind: AdapterKind) -> FfnKernels {
        match self.kernels {
            KernelChoice::Default | KernelChoice::Tuned | KernelChoice::TunedFor { .. } => {
                FfnKernels::default_for(kind, self.gemm_order)
            }
            KernelChoice::Fixed { up, down } => FfnKernels { order: self.gemm_order, up, down },
        }
    }

    /// An expert's mean share of rows in a forward of `tokens` tokens: `tokens · k / E`, at
    /// least 1 (what [`KernelChoice::TunedFor`] tunes on).
    pub fn expected_rows_per_expert(&self, tokens: u32) -> u32 {
        let rows = u64::from(tokens) * u64::from(self.route.k) / u64::from(self.route.experts.max(1));
        u32::try_from(rows).unwrap_or(u32::MAX).max(1)
    }

    /// Checks every field.
    ///
    /// # Errors
    /// [`RouteConfig::validate`]'s errors; [`Error::InvalidArgument`] for zero FFN sizes, a
    /// shared gate without a shared expert, a zero capacity bound or `TunedFor` zero tokens.
    pub fn validate(&self) -> Result<()> {
        self.route.validate()?;
        if self.ffn == 0 || self.shared_ffn == Some(0) {
            return Err(Error::invalid("FFN sizes must be at least 1"));
        }
        if self.shared_gate && self.shared_ffn.is_none() {
            return Err(Error::invalid("shared_gate needs a shared expert (shared_ffn)"));
        }
        if let Capacity::Bounded { bound: 0, .. } = self.capacity {
            return Err(Error::invalid("capacity bound must be at least 1"));
        }
        if self.kernels == (KernelChoice::TunedFor { tokens: 0 }) {
            return Err(Error::invalid("KernelChoice::TunedFor needs at least 1 token"));
        }
        self.activation.validate()?;
        self.ffn_kernels(AdapterKind::Gpu).validate()
    }
}

/// The layer in words: shapes, the complete routing, shared expert, capacity and dtype.
impl fmt::Display for MoeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "H={} F={}; {}", self.route.hidden, self.ffn, self.route)?;
        match (self.shared_ffn, self.shared_gate) {
            (Some(fs), true) => write!(f, "; shared expert F={fs} scaled by sigmoid(x . g)")?,
            (Some(fs), false) => write!(f, "; shared expert F={fs}")?,
            (None, _) => write!(f, "; no shared expert")?,
        }
        if let Capacity::Bounded { bound, policy } = self.capacity {
            write!(f, "; at most {bound} entries per expert, {policy:?} past it")?;
        }
        if let Activation::ClampedSwiglu { alpha, limit } = self.activation {
            write!(f, "; clamped SwiGLU (alpha {alpha}, limit {limit})")?;
        }
        if self.expert_bias {
            write!(f, "; expert biases")?;
        }
        write!(f, "; {:?} expert weights, {:?} GEMM order", self.weight_dtype, self.gemm_order)
    }
}
