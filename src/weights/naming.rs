//! The tensor-name schemes of the safetensors families (Mixtral's, Qwen's and DeepSeek's, with
//! gpt-oss's in `gpt_oss.rs`): finding a layer's prefix, its router and its experts.

use std::collections::BTreeSet;

use crate::error::{Error, Result};

/// The naming scheme of a layer's router and experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Scheme {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.N.w1 / w3 / w2`.
    Mixtral,
    /// `mlp.gate`, `mlp.experts.N.gate_proj / up_proj / down_proj`.
    Mlp,
}

impl Scheme {
    pub(super) fn router(self) -> &'static str {
        match self {
            Scheme::Mixtral => "block_sparse_moe.gate.weight",
            Scheme::Mlp => "mlp.gate.weight",
        }
    }

    pub(super) fn experts(self) -> &'static str {
        match self {
            Scheme::Mixtral => "block_sparse_moe.experts.",
            Scheme::Mlp => "mlp.experts.",
        }
    }

    /// Gate, up and down projection names of expert `i`.
    pub(super) fn expert(self, i: usize) -> [String; 3] {
        let parts = match self {
            Scheme::Mixtral => ["w1", "w3", "w2"],
            Scheme::Mlp => ["gate_proj", "up_proj", "down_proj"],
        };
        parts.map(|p| format!("{}{i}.{p}.weight", self.experts()))
    }
}

/// `; the closest names it holds: a, b, c` (or nothing when the source is empty).
pub(super) fn closest(names: &[&str], wanted: &str) -> String {
    let mut scored: Vec<(f64, &str)> = names.iter().map(|n| (strsim::jaro_winkler(n, wanted), *n)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    let best: Vec<&str> = scored.iter().take(3).map(|(_, n)| *n).collect();
    if best.is_empty() { String::new() } else { format!("; the closest names it holds: {}", best.join(", ")) }
}

/// `model.layers.3.`, also when given as the MoE module's prefix (`model.layers.3.mlp.` or
/// `model.layers.3.block_sparse_moe.`).
pub(super) fn layer_prefix(prefix: &str) -> String {
    for module in ["mlp.", "block_sparse_moe."] {
        if let Some(p) = prefix.strip_suffix(module) {
            return p.to_string();
        }
    }
    prefix.to_string()
}

/// The router's name in a gpt-oss layer, which marks one (`gpt_oss.rs`).
pub(super) const GPT_OSS_ROUTER: &str = "mlp.router.weight";

/// The router names that mark a MoE layer: Mixtral's, the `mlp.gate` families', gpt-oss's.
pub(super) const ROUTER_NAMES: [&str; 3] =
    ["block_sparse_moe.gate.weight", "mlp.gate.weight", GPT_OSS_ROUTER];

/// The layer prefix of a router tensor's name (`model.layers.3.` of
/// `model.layers.3.mlp.router.weight`), None for other names.
pub(super) fn router_prefix(name: &str) -> Option<&str> {
    ROUTER_NAMES.iter().find_map(|r| name.strip_suffix(r))
}

pub(super) fn detect_prefix(names: &[&str]) -> Result<String> {
    let mut found: Vec<String> = names.iter().filter_map(|n| router_prefix(n)).map(str::to_string).collect();
    found.sort();
    found.dedup();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => Err(Error::invalid(format!(
            "no router tensor (`*block_sparse_moe.gate.weight`, `*mlp.gate.weight` or `*mlp.router.weight`) in the weights{}",
            closest(names, "model.layers.0.mlp.gate.weight")
        ))),
        _ => Err(Error::invalid(format!(
            "the weights hold several MoE layers; pick one by prefix (--prefix) or index (--layer): {found:?}"
        ))),
    }
}

/// Expert indices named under `prefix + experts` (e.g. `mlp.experts.7.up_proj.weight` -> 7).
pub(super) fn expert_indices(names: &[&str], prefix: &str) -> BTreeSet<usize> {
    names
        .iter()
        .filter_map(|n| n.strip_prefix(prefix))
        .filter_map(|rest| rest.split('.').next())
        .filter_map(|i| i.parse().ok())
        .collect()
}
