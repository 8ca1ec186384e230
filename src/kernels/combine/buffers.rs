//! What a combine is asked for: its buffers (the experts' weighted rows and the shared
//! expert's) and its mode (one launch or sequential).

use crate::pipeline::BufferView;

/// The shared expert's contribution.
#[derive(Clone, Copy, Debug)]
pub struct Shared<'a> {
    /// `shared[tokens, hidden]`: the shared expert FFN's output.
    pub rows: BufferView<'a>,
    /// `shared_logit[tokens]`: gate logits (Qwen2-MoE's `shared_expert_gate`), scaled by
    /// their sigmoid; None adds the rows as they are.
    pub gate_logits: Option<BufferView<'a>>,
}

/// Buffers of the combine.
#[derive(Clone, Copy, Debug)]
pub struct CombineBuffers<'a> {
    /// `weights[tokens, k]`.
    pub weights: BufferView<'a>,
    /// `partial[tokens * k, hidden]`.
    pub partial: BufferView<'a>,
    /// Shared expert, if any.
    pub shared: Option<Shared<'a>>,
    /// `y[tokens, hidden]`, written.
    pub y: BufferView<'a>,
}

/// One-launch or sequential.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum CombineMode {
    /// One dispatch over `tokens x hidden`.
    #[default]
    OneLaunch,
    /// `tokens * (k + 1 + shared)` dispatches, as a host loop would issue them.
    Sequential,
}
