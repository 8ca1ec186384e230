//! The layer's scratch: one function lays out every region a forward of up to a maximum token
//! count takes, for [`MoeLayer::plan`](super::MoeLayer::plan) (which takes its regions from it)
//! and [`MoeConfig::requirements`] (which sizes the device's limits by it).

use super::config::{Capacity, MoeConfig};
use super::io::CallerOutputs;
use crate::error::{Error, Result};
use crate::kernels::dispatch::{BucketConfig, BucketLayout, DispatchConfig, DispatchLayout};
use crate::kernels::gemm::{GemmVariant, decode_tokens, window_bytes_bound};
use crate::workspace::{ScratchKey, WorkspaceLayout};

impl MoeConfig {
    /// The largest token count of a dropless layer's decode path at a maximum of `max_tokens`
    /// (0 for a bounded capacity, which has none); counts past it take the grouped path.
    pub(crate) fn decode_until(&self, max_tokens: u32) -> u32 {
        match self.capacity {
            Capacity::Dropless => decode_tokens(self.route.k, self.route.experts).min(max_tokens),
            Capacity::Bounded { .. } => 0,
        }
    }

    /// The scratch regions of a forward of up to `max_tokens` tokens whose expert kernels are
    /// among `variants` with a dispatch tile of `tile` rows, on a device with `limits`: routing
    /// results (and logits where the route mode writes them), the experts' outputs, the dispatch
    /// or bucket layout, the activations of the paths the counts take, the shared expert's where
    /// there is one, and one region of x windows where a kernel reads them. Nothing else: no
    /// region for the results `caller` writes to tensors of the caller's.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for sizes past u32 indices; [`DispatchConfig::validate`]'s
    /// errors for the tile.
    pub(crate) fn workspace_layout(
        &self,
        max_tokens: u32,
        variants: &[GemmVariant],
        tile: u32,
        limits: &wgpu::Limits,
        caller: CallerOutputs,
    ) -> Result<WorkspaceLayout> {
        let (e, k) = (self.route.experts, self.route.k);
        let entries = max_tokens.checked_mul(k).ok_or_else(|| {
            Error::limit(
                "max_tokens * k",
                u64::from(max_tokens) * u64::from(k),
                u32::MAX.into(),
                "u32 entries",
            )
        })?;
        let (t, h, f) = (u64::from(max_tokens), u64::from(self.route.hidden), u64::from(self.ffn));
        let mut l = WorkspaceLayout::new(limits);
        if !caller.routing {
            l.push_words(ScratchKey::TopkIndices, &[u64::from(entries)])?;
            l.push_words(ScratchKey::TopkWeights, &[u64::from(entries)])?;
        }
        if self.route_mode.writes_logits() && !caller.logits {
            l.push_words(ScratchKey::RouterLogits, &[t, u64::from(e)])?;
        }
        l.push_words(ScratchKey::ExpertOutputs, &[u64::from(entries), h])?;
        // The (rows, K) of every pass that may stage x windows.
        let mut passes: Vec<(u32, u32)> = Vec::new();
        // Passes over `rows` rows: K = hidden (gate/up) and K = ffn (down).
        let ffn_passes = |rows: u32| [(rows, self.route.hidden), (rows, self.ffn)];
        match self.capacity {
            Capacity::Dropless => {
                let decode_rows = self.decode_until(max_tokens) * k;
                l.push_words(ScratchKey::Activations, &[u64::from(decode_rows), f])?;
                passes.extend(ffn_passes(decode_rows));
                if decode_rows < entries {
                    let cfg = DispatchConfig { experts: e, k, tile };
                    for (key, bytes) in DispatchLayout::scratch_bytes(cfg, max_tokens)? {
                        l.push(key, bytes)?;
                    }
                    // The grouped rows: entries plus each expert's padding to the tile.
                    let max_rows = DispatchLayout::max_rows_for(cfg, max_tokens)?;
                    l.push_words(ScratchKey::Activations, &[u64::from(max_rows), f])?;
                    passes.extend(ffn_passes(max_rows));
                }
            }
            Capacity::Bounded { bound, policy } => {
                let cfg = BucketConfig { n_caps: e, bound, policy };
                for (key, bytes) in BucketLayout::scratch_bytes(cfg, entries)? {
                    l.push(key, bytes)?;
                }
                // Each bucket's slots (`bound` rows per pass), then the overflow entries.
                l.push_words(ScratchKey::Activations, &[u64::from(e), u64::from(bound), f])?;
                l.push_words(ScratchKey::OverflowActivations, &[u64::from(entries), f])?;
                passes.extend(ffn_passes(bound));
                passes.extend(ffn_passes(entries));
            }
        }
        if let Some(fs) = self.shared_ffn {
            l.push_words(ScratchKey::SharedOutput, &[t, h])?;
            if self.shared_gate {
                l.push_words(ScratchKey::SharedGateLogits, &[t])?;
            }
            l.push_words(ScratchKey::SharedActivations, &[t, u64::from(fs)])?;
            passes.extend([(max_tokens, self.route.hidden), (max_tokens, fs)]);
        }
        if let Some(bytes) = window_bytes_bound(variants, &passes, limits) {
            l.push(ScratchKey::XWindows, bytes)?;
        }
        Ok(l)
    }
}
