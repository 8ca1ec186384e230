//! What a routing does: its configuration ([`RouteConfig`]: gating, groups, bias, k), its
//! mode ([`RouteMode`]) and limits.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::shader::Override;

/// Largest expert count a routing kernel takes (workgroup memory holds one row of scores).
pub const MAX_EXPERTS: u32 = 1024;

/// Largest `k`.
pub const MAX_K: u32 = 32;

/// Largest `n_group` for group-limited selection.
pub const MAX_GROUPS: u32 = 64;

/// How logits become scores.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Gating {
    /// Softmax over the token's logits (Mixtral, Qwen-MoE, OLMoE).
    #[default]
    Softmax,
    /// Sigmoid per expert (DeepSeek-V3).
    Sigmoid,
    /// The logits themselves (argmax routing such as bucket winners; weights are the logits).
    Raw,
}

impl Gating {
    pub(super) fn code(self) -> f64 {
        match self {
            Gating::Softmax => 0.0,
            Gating::Sigmoid => 1.0,
            Gating::Raw => 2.0,
        }
    }
}

/// Group-limited selection (DeepSeek-V3): experts are split into `n_group` equal groups, the
/// `topk_group` groups with the largest sum of their two best (biased) scores are kept, and
/// experts outside them are never selected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupLimit {
    /// Number of groups; divides `experts`, each group holding at least two experts.
    pub n_group: u32,
    /// Groups kept per token, `1..=n_group`.
    pub topk_group: u32,
}

/// What a routing kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteConfig {
    /// Hidden size `H` (columns of `x` and of the gate weight).
    pub hidden: u32,
    /// Number of routed experts `E`, `1..=MAX_EXPERTS`.
    pub experts: u32,
    /// Experts per token, `1..=min(E, MAX_K)`.
    pub k: u32,
    /// Softmax or sigmoid scores.
    pub gating: Gating,
    /// Divide the selected weights by their sum.
    pub renormalize: bool,
    /// Factor applied to every weight last (DeepSeek's `routed_scaling_factor`); finite.
    pub scale: f32,
    /// Select on `score + bias[e]`, weight with the unbiased score.
    pub bias: bool,
    /// Optional group-limited selection.
    pub groups: Option<GroupLimit>,
    /// The router is affine (gpt-oss): `logit = x · w + b[e]`, the dot in its order, then one
    /// add. The gate buffer then holds `b[E]` after `w[E, H]`.
    #[serde(default)]
    pub router_bias: bool,
}

/// The complete routing in words, e.g. `sigmoid top-8 of 256 experts on score + bias within the
/// 4 best of 8 groups, renormalised, x 2.5`.
impl fmt::Display for RouteConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gating = match self.gating {
            Gating::Softmax => "softmax",
            Gating::Sigmoid => "sigmoid",
            Gating::Raw => "raw-logit",
        };
        write!(f, "{gating} top-{} of {} experts", self.k, self.experts)?;
        if self.router_bias {
            write!(f, " (logits x . w + b)")?;
        }
        match (self.bias, self.groups.is_some()) {
            (false, false) => write!(f, " chosen on the logits")?,
            (true, _) => write!(f, " chosen on score + bias")?,
            (false, true) => write!(f, " chosen on the scores")?,
        }
        if let Some(g) = self.groups {
            write!(f, " within the {} best of {} groups", g.topk_group, g.n_group)?;
        }
        write!(f, ", {}", if self.renormalize { "renormalised" } else { "not renormalised" })?;
        write!(f, ", scale {}", self.scale)
    }
}

impl RouteConfig {
    /// Softmax top-`k` over `experts` with hidden size `hidden`, no renormalisation, scale 1.
    pub fn new(hidden: u32, experts: u32, k: u32) -> Self {
        RouteConfig {
            hidden,
            experts,
            k,
            gating: Gating::Softmax,
            renormalize: false,
            scale: 1.0,
            bias: false,
            groups: None,
            router_bias: false,
        }
    }

    /// Checks every field against its documented range.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the field out of range (hidden, experts, k, scale,
    /// groups); [`Error::LimitExceeded`] for more experts or a larger k than the kernels take.
    pub fn validate(&self) -> Result<()> {
        if self.hidden == 0 {
            return Err(Error::invalid("hidden size must be at least 1"));
        }
        if self.experts == 0 {
            return Err(Error::invalid("experts must be at least 1"));
        }
        if self.experts > MAX_EXPERTS {
            return Err(Error::limit(
                "experts",
                self.experts.into(),
                MAX_EXPERTS.into(),
                "one token's scores live in workgroup memory",
            ));
        }
        if self.k == 0 {
            return Err(Error::invalid("k must be at least 1"));
        }
        if self.k > self.experts {
            return Err(Error::invalid(format!(
                "k = {} is larger than the number of experts ({})",
                self.k, self.experts
            )));
        }
        if self.k > MAX_K {
            return Err(Error::limit(
                "k",
                self.k.into(),
                MAX_K.into(),
                "routing kernels keep k picks in workgroup memory",
            ));
        }
        if !self.scale.is_finite() {
            return Err(Error::invalid(format!("scale must be finite, got {}", self.scale)));
        }
        if let Some(g) = self.groups {
            if g.n_group == 0 || g.n_group > MAX_GROUPS {
                return Err(Error::invalid(format!("n_group = {} must be in 1..={MAX_GROUPS}", g.n_group)));
            }
            if !self.experts.is_multiple_of(g.n_group) {
                return Err(Error::invalid(format!(
                    "n_group = {} does not divide experts = {}",
                    g.n_group, self.experts
                )));
            }
            if self.experts / g.n_group < 2 {
                return Err(Error::invalid(format!(
                    "groups of {} expert(s): a group's score is the sum of its top two, so each needs at least 2",
                    self.experts / g.n_group
                )));
            }
            if g.topk_group == 0 || g.topk_group > g.n_group {
                return Err(Error::invalid(format!(
                    "topk_group = {} must be in 1..={}",
                    g.topk_group, g.n_group
                )));
            }
            let reachable = g.topk_group * (self.experts / g.n_group);
            if self.k > reachable {
                return Err(Error::invalid(format!(
                    "k = {} but only {reachable} experts are in the {} kept groups",
                    self.k, g.topk_group
                )));
            }
        }
        Ok(())
    }

    /// The pipeline constants of the top-k kernels (gating, bias, groups, renormalisation).
    pub(crate) fn constants(&self) -> [(Override, f64); 4] {
        [
            (Override::Gating, self.gating.code()),
            (Override::HasBias, f64::from(u8::from(self.bias))),
            (Override::HasGroups, f64::from(u8::from(self.groups.is_some()))),
            (Override::Renormalize, f64::from(u8::from(self.renormalize))),
        ]
    }
}

/// Unfused (gate matvec, then top-k) or fused (one dispatch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RouteMode {
    /// Two dispatches; the logits buffer is written and read in between.
    Unfused,
    /// One dispatch; logits stay in workgroup memory unless `write_logits`.
    Fused {
        /// Also store the raw logits (telemetry).
        write_logits: bool,
    },
}

impl RouteMode {
    /// Whether this mode writes the logits buffer.
    pub(crate) fn writes_logits(self) -> bool {
        match self {
            RouteMode::Unfused => true,
            RouteMode::Fused { write_logits } => write_logits,
        }
    }
}
