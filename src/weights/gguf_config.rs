//! The family and config.json keys of a GGUF file's MoE layer, read from its metadata the way
//! llama.cpp reads them per architecture:
//!
//! | `general.architecture` | family | routing as llama.cpp runs it |
//! |---|---|---|
//! | `llama` (with `llama.expert_count`) | `mixtral` | softmax top-k, renormalised |
//! | `qwen2moe` | `qwen2_moe` | softmax top-k, not renormalised; gated shared expert |
//! | `qwen3moe` | `qwen3_moe` | softmax top-k, renormalised |
//! | `olmoe` | `olmoe` | softmax top-k, not renormalised |
//! | `deepseek2` | `deepseek_v2` (`expert_gating_func` 1 or absent), `deepseek_v3` (2: sigmoid) | renormalised if `expert_weights_norm`, × `expert_weights_scale`, groups from `expert_group_count` / `expert_group_used_count` |
//! | `gpt-oss` | `gpt_oss` | softmax over the top-k logits of the biased router (`SOFTMAX_WEIGHT`); `swiglu_oai` (alpha 1.702, limit 7.0, fixed in llama.cpp as in the family) with biases |
//!
//! The keys read are `{arch}.expert_count`, `expert_used_count`, `expert_feed_forward_length`,
//! `expert_shared_feed_forward_length` (Qwen2-MoE), `expert_shared_count` (DeepSeek) and the
//! DeepSeek keys above; they become the family's config.json keys and go through the same
//! resolution ([`super::family`]), so the checks and flags of a safetensors checkpoint apply.
//! A DeepSeek-V3 file without the group keys is refused unless `--n-group` / `--topk-group`
//! say what to run (transformers would default to 8 and 4, older llama.cpp to no groups).

use serde_json::{Map, Value, json};

use super::family::Family;
use crate::error::{Error, Result};
use crate::weights::gguf::{Gguf, GgufValue};

/// The family's config.json keys from the file's metadata.
pub(super) fn config_of(g: &Gguf<'_>) -> Result<(Family, Value)> {
    let source = g.source();
    let arch = g.metadata.get("general.architecture").and_then(GgufValue::as_str).ok_or_else(|| {
        Error::invalid(format!("{source} has no `general.architecture` string: not a model GGUF file"))
    })?;
    let get = |key: &str| g.metadata.get(&format!("{arch}.{key}"));
    let uint = |key: &str| -> Result<Option<u64>> {
        match get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                Error::invalid(format!("{source}: `{arch}.{key}` must be a non-negative integer, got {v:?}"))
            }),
        }
    };
    let family = match arch {
        "llama" | "mixtral" => Family::Mixtral,
        "qwen2moe" => Family::Qwen2Moe,
        "qwen3moe" => Family::Qwen3Moe,
        "olmoe" => Family::Olmoe,
        "gpt-oss" => Family::GptOss,
        "deepseek2" => match uint("expert_gating_func")? {
            None | Some(1) => Family::DeepseekV2,
            Some(2) => Family::DeepseekV3,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "{source}: `deepseek2.expert_gating_func` = {other}; 1 (softmax) and 2 (sigmoid) are run"
                )));
            }
        },
        other => {
            return Err(Error::invalid(format!(
                "{source} is a `{other}` model; the MoE architectures read from GGUF are llama (Mixtral), qwen2moe, qwen3moe, olmoe, deepseek2 and gpt-oss"
            )));
        }
    };
    let mut c = Map::new();
    c.insert("model_type".into(), json!(family.model_type()));
    let experts = uint("expert_count")?.filter(|&n| n > 0).ok_or_else(|| {
        Error::invalid(format!("{source} has no `{arch}.expert_count`: it is not a MoE model"))
    })?;
    c.insert(family.experts_key().into(), json!(experts));
    if let Some(k) = uint("expert_used_count")? {
        c.insert("num_experts_per_tok".into(), json!(k));
    }
    if let Some(f) = uint("expert_feed_forward_length")? {
        c.insert(family.ffn_key().into(), json!(f));
    }
    match family {
        Family::Qwen2Moe => {
            c.insert("norm_topk_prob".into(), json!(false));
            if let Some(fs) = uint("expert_shared_feed_forward_length")? {
                c.insert("shared_expert_intermediate_size".into(), json!(fs));
            }
        }
        Family::Qwen3Moe => {
            c.insert("norm_topk_prob".into(), json!(true));
        }
        Family::Olmoe => {
            c.insert("norm_topk_prob".into(), json!(false));
        }
        Family::DeepseekV2 | Family::DeepseekV3 => {
            let norm = match get("expert_weights_norm") {
                None => false,
                Some(v) => v.as_bool().ok_or_else(|| {
                    Error::invalid(format!(
                        "{source}: `{arch}.expert_weights_norm` must be a bool, got {v:?}"
                    ))
                })?,
            };
            c.insert("norm_topk_prob".into(), json!(norm));
            if let Some(v) = get("expert_weights_scale") {
                let s = v.as_f64().filter(|s| s.is_finite()).ok_or_else(|| {
                    Error::invalid(format!(
                        "{source}: `{arch}.expert_weights_scale` must be a finite number, got {v:?}"
                    ))
                })?;
                c.insert("routed_scaling_factor".into(), json!(s));
            }
            if let Some(n) = uint("expert_shared_count")? {
                c.insert("n_shared_experts".into(), json!(n));
            }
            match (uint("expert_group_count")?, uint("expert_group_used_count")?) {
                (Some(n), Some(k)) => {
                    c.insert("n_group".into(), json!(n));
                    c.insert("topk_group".into(), json!(k));
                }
                (None, None) => {}
                _ => {
                    return Err(Error::invalid(format!(
                        "{source} has only one of `{arch}.expert_group_count` and `{arch}.expert_group_used_count`"
                    )));
                }
            }
        }
        Family::Mixtral | Family::GptOss => {}
    }
    Ok((family, Value::Object(c)))
}
