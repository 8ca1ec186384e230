//! Where the program keeps its data ([`ProgramLayout`]): the work buffer's regions for a
//! token count and shape.

use super::super::queue::{QUEUE_LANES, STATE_HEADER};
use super::tasks::{MOE_TILE, MoeTasks};
use crate::error::{Error, Result};

/// Where the task program keeps its values: offsets in u32 words of the `state` buffer (the
/// queue's words and counters, the expert layout, the top-k indices) and in f32 values of the
/// `work` buffer (routing weights, SwiGLU rows, expert outputs, the shared expert's rows), each
/// region right after the one before, and each buffer's length. The header names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ProgramLayout {
    /// Rows per expert `[E]`, after the queue's header and one done-word per task.
    pub(super) counts: u32,
    /// Each expert's first row `[E]`.
    pub(super) bases: u32,
    /// Row -> entry `[slots * MOE_TILE]`.
    pub(super) row_entry: u32,
    /// Slot -> expert `[slots]`.
    pub(super) tile_expert: u32,
    /// Per-lane expert chunks `[QUEUE_LANES * E]`.
    pub(super) chunks: u32,
    /// `indices[tokens, k]`.
    pub(super) indices: u32,
    /// Words of `state`.
    pub(super) state_len: u32,
    /// `weights[tokens, k]`.
    pub(super) weights: u32,
    /// SwiGLU rows `[slots * MOE_TILE, F]`.
    pub(super) rows_h: u32,
    /// Expert outputs `[tokens * k, H]`.
    pub(super) partial: u32,
    /// The shared expert's SwiGLU rows `[tokens rounded up to MOE_TILE, Fs]`.
    pub(super) shared_h: u32,
    /// The shared expert's outputs `[tokens, H]` (none without one).
    pub(super) shared_out: u32,
    /// Values of `work`.
    pub(super) work_len: u32,
}

impl ProgramLayout {
    /// The layout of `tasks` over `tokens` tokens of a layer of `[hidden, ffn, experts, k]`
    /// with a shared expert of `shared_ffn` columns (0: none).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for a buffer past u32 indices.
    pub(super) fn new(
        tasks: &MoeTasks,
        tokens: u32,
        [h, f, e, k]: [u32; 4],
        shared_ffn: u32,
    ) -> Result<Self> {
        let (t, h, f, e, k, fs) = (
            u64::from(tokens),
            u64::from(h),
            u64::from(f),
            u64::from(e),
            u64::from(k),
            u64::from(shared_ffn),
        );
        let (slots, tile) = (u64::from(tasks.slots), u64::from(MOE_TILE));
        let counts = u64::from(STATE_HEADER) + tasks.total();
        let bases = counts + e;
        let row_entry = bases + e;
        let tile_expert = row_entry + slots * tile;
        let chunks = tile_expert + slots;
        let indices = chunks + u64::from(QUEUE_LANES) * e;
        let state_len = indices + t * k;
        let weights = 0u64;
        let rows_h = weights + t * k;
        let partial = rows_h + slots * tile * f;
        let shared_h = partial + t * k * h;
        let shared_out = shared_h + t.next_multiple_of(tile) * fs;
        let work_len = shared_out + if fs > 0 { t * h } else { 0 };
        let word = |what: &str, n: u64| {
            u32::try_from(n)
                .map_err(|_| Error::limit(what, n, u32::MAX.into(), "u32 indices in the MoE program"))
        };
        let state = |n| word("MoE program state words", n);
        let work = |n| word("MoE program work values", n);
        Ok(ProgramLayout {
            counts: state(counts)?,
            bases: state(bases)?,
            row_entry: state(row_entry)?,
            tile_expert: state(tile_expert)?,
            chunks: state(chunks)?,
            indices: state(indices)?,
            state_len: state(state_len)?,
            weights: work(weights)?,
            rows_h: work(rows_h)?,
            partial: work(partial)?,
            shared_h: work(shared_h)?,
            shared_out: work(shared_out)?,
            work_len: work(work_len)?,
        })
    }
}
