//! Which MoE family a checkpoint is, and the routing it runs, decided the way Hugging Face
//! `transformers`' modeling code decides it: by `model_type` (or the architecture name), with
//! each family's own keys and defaults, never by the mere presence of optional keys.
//!
//! | family | scoring | selection | weights | keys read |
//! |---|---|---|---|---|
//! | `mixtral` | softmax | top-k | always renormalised | `num_local_experts`, `num_experts_per_tok`, `intermediate_size` |
//! | `qwen2_moe` | softmax | top-k | renormalised if `norm_topk_prob` (default false); shared expert × sigmoid gate | `num_experts`, `num_experts_per_tok`, `norm_topk_prob`, `moe_intermediate_size`, `shared_expert_intermediate_size` |
//! | `qwen3_moe`, `olmoe` | softmax | top-k | renormalised if `norm_topk_prob` (default false) | `num_experts`, `num_experts_per_tok`, `norm_topk_prob`, `moe_intermediate_size` / `intermediate_size` |
//! | `deepseek_v2` | softmax | top-k (`topk_method: greedy`) | × `routed_scaling_factor` (default 1.0) | `n_routed_experts`, `num_experts_per_tok`, `topk_method`, `routed_scaling_factor`, `n_shared_experts`, `moe_intermediate_size` |
//! | `deepseek_v3` | sigmoid | on score + `e_score_correction_bias`, within the `topk_group` best of `n_group` groups | renormalised if `norm_topk_prob` (default true), × `routed_scaling_factor` (default 2.5) | as `deepseek_v2` plus `n_group`, `topk_group`, `norm_topk_prob`, `scoring_func`, `topk_method` |
//! | `gpt_oss` | softmax over the top-k logits of an affine router (`x · w + b`) | top-k | always renormalised (the same weights) | `num_local_experts`, `num_experts_per_tok`, `intermediate_size`, `swiglu_limit`, `swiglu_alpha` |
//!
//! Every family's experts are SwiGLU: `hidden_act` must be `silu` (or its alias `swish`).
//! gpt-oss's are its clamped SwiGLU with expert biases (`swiglu_limit`, default 7.0, and
//! `swiglu_alpha`, default 1.702, as transformers' `GptOssConfig`).
//!
//! Every other key of a config.json (attention, vocabulary, layer layout) is ignored. A routing
//! key whose value this family would run differently from what the key says (a
//! `scoring_func` other than the family's, `topk_method: group_limited_greedy`, an `n_group`
//! without `topk_group`, groups on a family without them) is an error naming the key.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::kernels::gemm::Activation;
use crate::kernels::routing::{Gating, GroupLimit};

/// A MoE family moeflow runs, named by its Hugging Face `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Family {
    /// `mixtral`: softmax top-k, always renormalised.
    Mixtral,
    /// `qwen2_moe`: softmax top-k, optional renormalisation, gated shared expert.
    Qwen2Moe,
    /// `qwen3_moe`: softmax top-k, optional renormalisation.
    Qwen3Moe,
    /// `olmoe`: softmax top-k, optional renormalisation.
    Olmoe,
    /// `deepseek_v2` with `topk_method: greedy`: softmax top-k, scaled, shared experts.
    DeepseekV2,
    /// `deepseek_v3`: sigmoid, bias-corrected group-limited selection, scaled, shared experts.
    DeepseekV3,
    /// `gpt_oss`: an affine router, softmax over the top-k logits, clamped SwiGLU experts with
    /// biases, fused `gate_up_proj` tensors (MXFP4 as shipped, or dense).
    GptOss,
}

impl Family {
    /// Every family, in the order the docs list them.
    pub const ALL: [Family; 7] = [
        Family::Mixtral,
        Family::Qwen2Moe,
        Family::Qwen3Moe,
        Family::Olmoe,
        Family::DeepseekV2,
        Family::DeepseekV3,
        Family::GptOss,
    ];

    /// The Hugging Face `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Mixtral => "mixtral",
            Family::Qwen2Moe => "qwen2_moe",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Olmoe => "olmoe",
            Family::DeepseekV2 => "deepseek_v2",
            Family::DeepseekV3 => "deepseek_v3",
            Family::GptOss => "gpt_oss",
        }
    }

    fn architecture(self) -> &'static str {
        match self {
            Family::Mixtral => "MixtralForCausalLM",
            Family::Qwen2Moe => "Qwen2MoeForCausalLM",
            Family::Qwen3Moe => "Qwen3MoeForCausalLM",
            Family::Olmoe => "OlmoeForCausalLM",
            Family::DeepseekV2 => "DeepseekV2ForCausalLM",
            Family::DeepseekV3 => "DeepseekV3ForCausalLM",
            Family::GptOss => "GptOssForCausalLM",
        }
    }

    /// Keys that hold the routed expert count, the routed FFN size and the shared FFN size.
    pub(super) fn experts_key(self) -> &'static str {
        match self {
            Family::Mixtral | Family::GptOss => "num_local_experts",
            Family::Qwen2Moe | Family::Qwen3Moe | Family::Olmoe => "num_experts",
            Family::DeepseekV2 | Family::DeepseekV3 => "n_routed_experts",
        }
    }

    pub(super) fn ffn_key(self) -> &'static str {
        match self {
            Family::Mixtral | Family::Olmoe | Family::GptOss => "intermediate_size",
            _ => "moe_intermediate_size",
        }
    }

    fn is_deepseek(self) -> bool {
        matches!(self, Family::DeepseekV2 | Family::DeepseekV3)
    }
}

/// The families' `model_type`s, comma-separated, for messages.
fn family_list(families: &[Family]) -> String {
    families.iter().map(|f| f.model_type()).collect::<Vec<_>>().join(", ")
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.model_type())
    }
}

impl FromStr for Family {
    type Err = Error;

    /// A `model_type` (`qwen3_moe`), also with hyphens (`qwen3-moe`), or an architecture name.
    fn from_str(s: &str) -> Result<Self> {
        let norm = s.trim().to_ascii_lowercase().replace('-', "_");
        Family::ALL
            .into_iter()
            .find(|f| f.model_type() == norm || f.architecture().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "`{s}` is not a MoE family moeflow runs ({})",
                    family_list(&Family::ALL)
                ))
            })
    }
}

/// Routing values given outside config.json (the example's flags). Each must agree with the
/// config where both say something; without a config they supply what the family needs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoutingFlags {
    /// The family (otherwise from config.json, or from the tensor names where they decide it).
    pub family: Option<Family>,
    /// Experts per token.
    pub k: Option<u32>,
    /// `norm_topk_prob`.
    pub norm_topk_prob: Option<bool>,
    /// `n_group` and `topk_group` (DeepSeek-V3); `n_group = 1` means no group limit.
    pub groups: Option<GroupLimit>,
    /// `routed_scaling_factor` (DeepSeek).
    pub routed_scaling_factor: Option<f32>,
}

/// What the tensors of a layer say about it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TensorFacts {
    /// The router and experts use Mixtral's `block_sparse_moe` names.
    pub mixtral_names: bool,
    /// The router and experts use gpt-oss's names (`mlp.router`, fused `mlp.experts.*_proj`).
    pub gpt_oss_names: bool,
    /// Routed experts (router rows).
    pub experts: u32,
    /// Routed FFN size.
    pub ffn: u32,
    /// `mlp.gate.e_score_correction_bias` is present.
    pub bias: bool,
    /// FFN size of `mlp.shared_expert.` (Qwen2) or `mlp.shared_experts.` (DeepSeek).
    pub shared: Option<(SharedNames, u32)>,
    /// `mlp.shared_expert_gate.weight` is present.
    pub shared_gate: bool,
}

/// Which shared-expert names a layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SharedNames {
    /// `mlp.shared_expert.` (Qwen2-MoE).
    Qwen,
    /// `mlp.shared_experts.` (DeepSeek).
    DeepSeek,
}

/// The routing of one layer, as the family runs it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    /// The family whose semantics apply.
    pub family: Family,
    /// Experts per token.
    pub k: u32,
    /// Softmax or sigmoid scores.
    pub gating: Gating,
    /// Divide the selected weights by their sum.
    pub renormalize: bool,
    /// Factor applied to every weight.
    pub scale: f32,
    /// Group-limited selection.
    pub groups: Option<GroupLimit>,
    /// The experts' activation (gpt-oss: its clamped SwiGLU, constants from config.json).
    pub activation: Activation,
}

/// The config.json, with typed lookups whose errors name the key.
struct Config<'a>(Option<&'a Value>);

impl Config<'_> {
    fn raw(&self, key: &str) -> Option<&Value> {
        self.0.and_then(|c| c.get(key)).filter(|v| !v.is_null())
    }

    fn u32(&self, key: &str) -> Result<Option<u32>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v.as_u64().and_then(|n| u32::try_from(n).ok()).map(Some).ok_or_else(|| {
                Error::invalid(format!("config.json: `{key}` must be a non-negative integer, got {v}"))
            }),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| {
                Error::invalid(format!("config.json: `{key}` must be true or false, got {v}"))
            }),
        }
    }

    fn f32(&self, key: &str) -> Result<Option<f32>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| x as f32).filter(|x| x.is_finite()).map(Some).ok_or_else(|| {
                Error::invalid(format!("config.json: `{key}` must be a finite number, got {v}"))
            }),
        }
    }

    fn str(&self, key: &str) -> Result<Option<&str>> {
        match self.raw(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| Error::invalid(format!("config.json: `{key}` must be a string, got {v}"))),
        }
    }

    /// The family named by `model_type`, else by the first of `architectures`.
    fn family(&self) -> Result<Option<Family>> {
        let Some(c) = self.0 else {
            return Ok(None);
        };
        if let Some(t) = self.str("model_type")? {
            return t.parse().map(Some).map_err(|_| {
                Error::invalid(format!(
                    "config.json: model_type `{t}` is not a MoE family moeflow runs ({})",
                    family_list(&Family::ALL)
                ))
            });
        }
        if let Some(arch) = c.get("architectures").and_then(Value::as_array).and_then(|a| a.first()) {
            let arch = arch.as_str().unwrap_or_default();
            return arch.parse().map(Some).map_err(|_| {
                Error::invalid(format!("config.json: architecture `{arch}` is not a MoE family moeflow runs"))
            });
        }
        Err(Error::invalid(
            "config.json has neither `model_type` nor `architectures`: pass the family (--family)",
        ))
    }
}

/// Two sources for one value must agree.
fn agree<T: PartialEq + fmt::Debug>(key: &str, config: Option<T>, flag: Option<T>) -> Result<Option<T>> {
    match (config, flag) {
        (Some(c), Some(f)) if c != f => {
            Err(Error::invalid(format!("the {key} flag ({f:?}) contradicts config.json's `{key}` ({c:?})")))
        }
        (c, f) => Ok(c.or(f)),
    }
}

/// A value the family needs that neither config.json nor a flag gave.
fn needed(family: Family, what: &str) -> Error {
    Error::invalid(format!(
        "no config.json, and {family} routing depends on {what}: pass --config, or {what} as a flag"
    ))
}

/// Decides the family and its routing from config.json (if any), the flags and the tensors.
pub(crate) fn resolve(config: Option<&Value>, flags: &RoutingFlags, t: &TensorFacts) -> Result<Routing> {
    let cfg = Config(config);
    let from_config = cfg.family()?;
    let family = match agree("family", from_config, flags.family)? {
        Some(f) => f,
        None if t.mixtral_names => Family::Mixtral,
        None if t.gpt_oss_names => Family::GptOss,
        None if t.bias => Family::DeepseekV3,
        None => {
            return Err(Error::invalid(format!(
                "no config.json, and the tensor names (`mlp.gate`, `mlp.experts.N`) fit several families \
                 ({}): pass --config, or --family",
                family_list(&Family::ALL[1..])
            )));
        }
    };
    check_tensors(family, t)?;
    let has_config = config.is_some();

    if let Some(e) = cfg.u32(family.experts_key())?
        && e != t.experts
    {
        return Err(Error::invalid(format!(
            "config.json says {e} experts (`{}`) but the router has {} rows",
            family.experts_key(),
            t.experts
        )));
    }
    if let Some(f) = cfg.u32(family.ffn_key())?
        && f != t.ffn
    {
        return Err(Error::invalid(format!(
            "config.json says `{}` = {f} but the expert tensors have {} rows",
            family.ffn_key(),
            t.ffn
        )));
    }
    check_shared(family, &cfg, t)?;

    let k = agree("num_experts_per_tok", cfg.u32("num_experts_per_tok")?, flags.k)?.ok_or_else(|| {
        Error::invalid("the number of experts per token is not known: pass --config or --k")
    })?;
    if k == 0 || k > t.experts {
        return Err(Error::invalid(format!(
            "num_experts_per_tok = {k} must be in 1..={} (the router's experts)",
            t.experts
        )));
    }

    if let Some(act) = cfg.str("hidden_act")?
        && act != "silu"
        && act != "swish"
    {
        return Err(Error::invalid(format!(
            "config.json: `hidden_act` = \"{act}\", but moeflow's experts are SwiGLU with SiLU (silu)"
        )));
    }
    let scoring = cfg.str("scoring_func")?;
    let method = cfg.str("topk_method")?;
    let (n_group, topk_group) = (cfg.u32("n_group")?, cfg.u32("topk_group")?);
    let family_scoring = if family == Family::DeepseekV3 { "sigmoid" } else { "softmax" };
    if let Some(s) = scoring
        && s != family_scoring
    {
        return Err(Error::invalid(format!(
            "config.json: `scoring_func` = \"{s}\", but {family} scores with {family_scoring}; moeflow does not run {s}"
        )));
    }
    match (family, method) {
        (_, None) | (Family::DeepseekV2, Some("greedy")) | (Family::DeepseekV3, Some("noaux_tc")) => {}
        (_, Some(m)) => {
            return Err(Error::invalid(format!(
                "config.json: `topk_method` = \"{m}\" is not supported for {family} (moeflow runs {})",
                match family {
                    Family::DeepseekV2 => "greedy",
                    Family::DeepseekV3 => "noaux_tc",
                    _ => "plain top-k; the key does not belong to this family",
                }
            )));
        }
    }
    let norm = agree("norm_topk_prob", cfg.bool("norm_topk_prob")?, flags.norm_topk_prob)?;
    let scale =
        agree("routed_scaling_factor", cfg.f32("routed_scaling_factor")?, flags.routed_scaling_factor)?;

    let config_groups = match (n_group, topk_group) {
        (None, None) => None,
        (Some(n), Some(k)) => Some(GroupLimit { n_group: n, topk_group: k }),
        (Some(_), None) => {
            return Err(Error::invalid(
                "config.json: `n_group` without `topk_group`: both are needed for group-limited routing",
            ));
        }
        (None, Some(_)) => {
            return Err(Error::invalid(
                "config.json: `topk_group` without `n_group`: both are needed for group-limited routing",
            ));
        }
    };

    let routing = |gating, renormalize, scale, groups| Routing {
        family,
        k,
        gating,
        renormalize,
        scale,
        groups,
        activation: Activation::Swiglu,
    };
    match family {
        Family::Mixtral => {
            no_groups(family, config_groups, flags)?;
            if norm == Some(false) {
                return Err(Error::invalid(
                    "norm_topk_prob = false, but mixtral always renormalises its top-k weights",
                ));
            }
            no_scale(family, scale)?;
            Ok(routing(Gating::Softmax, true, 1.0, None))
        }
        Family::Qwen2Moe | Family::Qwen3Moe | Family::Olmoe => {
            no_groups(family, config_groups, flags)?;
            no_scale(family, scale)?;
            let renormalize = match norm {
                Some(n) => n,
                None if has_config => false,
                None => return Err(needed(family, "norm_topk_prob (--norm-topk-prob true|false)")),
            };
            Ok(routing(Gating::Softmax, renormalize, 1.0, None))
        }
        Family::DeepseekV2 => {
            if norm == Some(true) {
                return Err(Error::invalid(
                    "norm_topk_prob = true for deepseek_v2: transformers' deepseek_v2 router ignores it while the \
                     original DeepSeek-V2 code renormalises, so moeflow refuses to guess",
                ));
            }
            if flags.groups.is_some() {
                return Err(Error::invalid(
                    "groups were given for deepseek_v2 with greedy top-k, which has none",
                ));
            }
            let scale = match scale {
                Some(s) => s,
                None if has_config => 1.0,
                None => return Err(needed(family, "routed_scaling_factor (--routed-scaling-factor)")),
            };
            Ok(routing(Gating::Softmax, false, scale, None))
        }
        Family::DeepseekV3 => {
            let groups = match agree("n_group/topk_group", config_groups, flags.groups)? {
                Some(g) => g,
                None if has_config => GroupLimit { n_group: 8, topk_group: 4 },
                None => {
                    return Err(needed(
                        family,
                        "n_group and topk_group (--n-group, --topk-group; 1 and 1 for none)",
                    ));
                }
            };
            let renormalize = match norm {
                Some(n) => n,
                None if has_config => true,
                None => return Err(needed(family, "norm_topk_prob (--norm-topk-prob true|false)")),
            };
            let scale = match scale {
                Some(s) => s,
                None if has_config => 2.5,
                None => return Err(needed(family, "routed_scaling_factor (--routed-scaling-factor)")),
            };
            let groups = (groups.n_group > 1).then_some(groups);
            Ok(routing(Gating::Sigmoid, renormalize, scale, groups))
        }
        Family::GptOss => {
            no_groups(family, config_groups, flags)?;
            no_scale(family, scale)?;
            if norm == Some(false) {
                return Err(Error::invalid(
                    "norm_topk_prob = false, but gpt_oss takes the softmax over its top-k logits (renormalised weights)",
                ));
            }
            let alpha = cfg.f32("swiglu_alpha")?.unwrap_or(1.702);
            let limit = cfg.f32("swiglu_limit")?.unwrap_or(7.0);
            let activation = Activation::ClampedSwiglu { alpha, limit };
            activation.validate().map_err(|e| Error::invalid(format!("config.json: {e}")))?;
            Ok(Routing { activation, ..routing(Gating::Softmax, true, 1.0, None) })
        }
    }
}

/// Families without group-limited routing refuse groups that would change their selection.
fn no_groups(family: Family, config: Option<GroupLimit>, flags: &RoutingFlags) -> Result<()> {
    match config.or(flags.groups) {
        Some(g) if g.n_group > 1 => Err(Error::invalid(format!(
            "n_group = {}: {family} has no group-limited routing, so these groups would be ignored",
            g.n_group
        ))),
        _ => Ok(()),
    }
}

/// Families without a routed scaling factor refuse one other than 1.
fn no_scale(family: Family, scale: Option<f32>) -> Result<()> {
    match scale {
        Some(s) if s != 1.0 => Err(Error::invalid(format!(
            "routed_scaling_factor = {s}: {family} does not scale its routed weights, so it would be ignored"
        ))),
        _ => Ok(()),
    }
}

/// The tensors must be the family's: its names, its bias, its shared expert.
fn check_tensors(family: Family, t: &TensorFacts) -> Result<()> {
    if t.gpt_oss_names != (family == Family::GptOss) {
        let names =
            |gpt_oss| if gpt_oss { "gpt-oss's (`mlp.router`, fused `mlp.experts.*`)" } else { "per-expert" };
        return Err(Error::invalid(format!(
            "{family} layers use {} names, but the weights use {} names",
            names(family == Family::GptOss),
            names(t.gpt_oss_names)
        )));
    }
    if t.mixtral_names != (family == Family::Mixtral) {
        return Err(Error::invalid(format!(
            "{family} layers use {} names, but the weights use {}",
            if family == Family::Mixtral { "`block_sparse_moe.*`" } else { "`mlp.*`" },
            if t.mixtral_names { "`block_sparse_moe.*`" } else { "`mlp.*`" },
        )));
    }
    if t.bias && family != Family::DeepseekV3 {
        return Err(Error::invalid(format!(
            "the weights have `mlp.gate.e_score_correction_bias`, which {family} does not use"
        )));
    }
    let shared = t.shared.map(|(names, _)| names);
    let ok = match family {
        Family::Mixtral | Family::Qwen3Moe | Family::Olmoe | Family::GptOss => shared.is_none(),
        Family::Qwen2Moe => shared != Some(SharedNames::DeepSeek),
        Family::DeepseekV2 | Family::DeepseekV3 => shared != Some(SharedNames::Qwen),
    };
    if !ok {
        return Err(Error::invalid(format!(
            "the weights have a shared expert under `{}`, which {family} does not have",
            if shared == Some(SharedNames::Qwen) { "mlp.shared_expert." } else { "mlp.shared_experts." }
        )));
    }
    if t.shared_gate && family != Family::Qwen2Moe {
        return Err(Error::invalid(format!(
            "the weights have `mlp.shared_expert_gate.weight`, which {family} does not use"
        )));
    }
    if family == Family::Qwen2Moe && shared.is_some() != t.shared_gate {
        return Err(Error::invalid(
            "qwen2_moe layers have both a shared expert and its gate (`mlp.shared_expert_gate.weight`); the weights have only one",
        ));
    }
    Ok(())
}

/// The shared expert's size in the tensors must be the config's.
fn check_shared(family: Family, cfg: &Config<'_>, t: &TensorFacts) -> Result<()> {
    let got = t.shared.map(|(_, f)| f);
    let want = match family {
        Family::Qwen2Moe => cfg.u32("shared_expert_intermediate_size")?,
        f if f.is_deepseek() => match cfg.u32("n_shared_experts")? {
            Some(0) => Some(0),
            Some(n) => cfg.u32("moe_intermediate_size")?.map(|m| n * m),
            None => None,
        },
        _ => None,
    };
    match (want, got) {
        (None, _) => Ok(()),
        (Some(0), None) => Ok(()),
        (Some(w), Some(g)) if w == g => Ok(()),
        (Some(w), g) => Err(Error::invalid(format!(
            "config.json gives the shared expert(s) an FFN size of {w}, the weights {}",
            g.map_or("have none".to_string(), |g| format!("have {g}"))
        ))),
    }
}
