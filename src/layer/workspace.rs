//! The layer's scratch: one function lays out every region a forward of up to a maximum token
//! count takes, for [`MoeLayer::plan`](super::MoeLayer::plan) (which takes its regions from it)
//! and [`MoeConfig::requirements`] (which sizes the device's limits by it).

use super::config::{Capacity, MoeConfig};
use super::io::CallerOutputs;
use crate::error::Result;
use crate::kernels::dispatch::{BucketConfig, BucketLayout, DispatchConfig, DispatchLayout};
use crate::kernels::gemm::{
    GemmVariant, activations, bucket_activations, decode_tokens, overflow_activations, shared_activations,
    window_bytes_bound,
};
use crate::size;
use crate::workspace::{RegionSize, ScratchKey, WorkspaceLayout};

impl ScratchKey {
    /// `indices[tokens, k]` (u32) written by routing.
    pub const TOPK_INDICES: ScratchKey = ScratchKey::new("topk indices");
    /// `weights[tokens, k]` (f32) written by routing.
    pub const TOPK_WEIGHTS: ScratchKey = ScratchKey::new("topk weights");
    /// `logits[tokens, experts]` (f32), where the route mode writes them.
    pub const ROUTER_LOGITS: ScratchKey = ScratchKey::new("router logits");
    /// `partial[tokens * k, hidden]` (f32): each routed expert's output per entry.
    pub const EXPERT_OUTPUTS: ScratchKey = ScratchKey::new("expert outputs");
    /// The shared expert's output `[tokens, hidden]` (f32).
    pub const SHARED_OUTPUT: ScratchKey = ScratchKey::new("shared expert output");
    /// The shared expert's gate logits `[tokens]` (f32).
    pub const SHARED_GATE_LOGITS: ScratchKey = ScratchKey::new("shared gate logits");
}

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
        let entries = size::u32_product("max_tokens * k", max_tokens, k, "u32 entries")?;
        let mut l = WorkspaceLayout::new(limits);
        if !caller.routing {
            for r in self.routing_regions(max_tokens)? {
                l.push(r)?;
            }
        }
        if self.route_mode.writes_logits() && !caller.logits {
            l.push(self.logits_region(max_tokens)?)?;
        }
        l.push(self.outputs_region(max_tokens)?)?;
        // The (rows, K) of every pass that may stage x windows.
        let mut passes: Vec<(u32, u32)> = Vec::new();
        // Passes over `rows` rows: K = hidden (gate/up) and K = ffn (down).
        let ffn_passes = |rows: u32| [(rows, self.route.hidden), (rows, self.ffn)];
        match self.capacity {
            Capacity::Dropless => {
                let decode_rows = self.decode_until(max_tokens) * k;
                l.push(activations(u64::from(decode_rows), self.ffn)?)?;
                passes.extend(ffn_passes(decode_rows));
                if decode_rows < entries {
                    let cfg = DispatchConfig { experts: e, k, tile };
                    for (key, bytes) in DispatchLayout::scratch_bytes(cfg, max_tokens)? {
                        l.push(RegionSize { key, bytes })?;
                    }
                    // The grouped rows: entries plus each expert's padding to the tile.
                    let max_rows = DispatchLayout::max_rows_for(cfg, max_tokens)?;
                    l.push(activations(u64::from(max_rows), self.ffn)?)?;
                    passes.extend(ffn_passes(max_rows));
                }
            }
            Capacity::Bounded { bound, policy } => {
                let cfg = BucketConfig { n_caps: e, bound, policy };
                for (key, bytes) in BucketLayout::scratch_bytes(cfg, entries)? {
                    l.push(RegionSize { key, bytes })?;
                }
                // Each bucket's slots (`bound` rows per pass), then the overflow entries.
                l.push(bucket_activations(e, bound, self.ffn)?)?;
                l.push(overflow_activations(u64::from(entries), self.ffn)?)?;
                passes.extend(ffn_passes(bound));
                passes.extend(ffn_passes(entries));
            }
        }
        if let Some(fs) = self.shared_ffn {
            l.push(self.shared_output_region(max_tokens)?)?;
            if self.shared_gate {
                l.push(self.shared_gate_logits_region(max_tokens)?)?;
            }
            l.push(shared_activations(max_tokens, fs)?)?;
            passes.extend([(max_tokens, self.route.hidden), (max_tokens, fs)]);
        }
        if let Some(bytes) = window_bytes_bound(variants, &passes, limits) {
            l.push(RegionSize { key: ScratchKey::X_WINDOWS, bytes })?;
        }
        Ok(l)
    }

    /// The routing results' regions, `indices[T, k]` (u32) and `weights[T, k]` (f32), at a
    /// maximum of `max_tokens` tokens: sized here for the layout and the plan alike (as the
    /// layer's other regions below).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] where the bytes overflow 64 bits.
    pub(crate) fn routing_regions(&self, max_tokens: u32) -> Result<[RegionSize; 2]> {
        let dims = [u64::from(max_tokens), u64::from(self.route.k)];
        Ok([
            RegionSize::words(ScratchKey::TOPK_INDICES, &dims)?,
            RegionSize::words(ScratchKey::TOPK_WEIGHTS, &dims)?,
        ])
    }

    /// The router logits' region `[T, experts]` (f32).
    ///
    /// # Errors
    /// As [`Self::routing_regions`].
    pub(crate) fn logits_region(&self, max_tokens: u32) -> Result<RegionSize> {
        RegionSize::words(ScratchKey::ROUTER_LOGITS, &[u64::from(max_tokens), u64::from(self.route.experts)])
    }

    /// The routed experts' outputs `[T * k, hidden]` (f32).
    ///
    /// # Errors
    /// As [`Self::routing_regions`].
    pub(crate) fn outputs_region(&self, max_tokens: u32) -> Result<RegionSize> {
        let dims = [u64::from(max_tokens), u64::from(self.route.k), u64::from(self.route.hidden)];
        RegionSize::words(ScratchKey::EXPERT_OUTPUTS, &dims)
    }

    /// The shared expert's output `[T, hidden]` (f32).
    ///
    /// # Errors
    /// As [`Self::routing_regions`].
    pub(crate) fn shared_output_region(&self, max_tokens: u32) -> Result<RegionSize> {
        RegionSize::words(ScratchKey::SHARED_OUTPUT, &[u64::from(max_tokens), u64::from(self.route.hidden)])
    }

    /// The shared expert's gate logits `[T]` (f32).
    ///
    /// # Errors
    /// As [`Self::routing_regions`].
    pub(crate) fn shared_gate_logits_region(&self, max_tokens: u32) -> Result<RegionSize> {
        RegionSize::words(ScratchKey::SHARED_GATE_LOGITS, &[u64::from(max_tokens)])
    }
}
