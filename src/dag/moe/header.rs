//! The program header's Rust mirror ([`Header`]): the words `wgsl/dag/moe.wgsl` reads first,
//! field by field.

use bytemuck::{Pod, Zeroable};

use super::super::program::to_u32;
use super::super::queue::{QUEUE_LANES, QueueOptions};
use super::bindings::SharedMatrices;
use super::layout::ProgramLayout;
use super::tasks::{CombineRule, MOE_NONE, MOE_TILE, MoeTasks, RUN_TIME_NEED, TaskShape, TaskSize};
use crate::error::{Error, Result};
use crate::layer::MoeConfig;

/// Header words of the program buffer (`H_*` in wgsl/dag/moe.wgsl), in this order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct Header {
    pub(crate) tasks: u32,
    pub(crate) task_off: u32,
    pub(crate) spin_limit: u32,
    pub(crate) work: u32,
    pub(crate) canary: u32,
    pub(crate) ffn: u32,
    pub(crate) up_tiles: u32,
    pub(crate) down_tiles: u32,
    pub(crate) slots: u32,
    pub(crate) counts: u32,
    pub(crate) bases: u32,
    pub(crate) row_entry: u32,
    pub(crate) tile_expert: u32,
    pub(crate) chunks: u32,
    pub(crate) indices: u32,
    pub(crate) rows_h: u32,
    pub(crate) partial: u32,
    pub(crate) weights: u32,
    pub(crate) bias: u32,
    pub(crate) shared_ffn: u32,
    pub(crate) shared_up_tiles: u32,
    pub(crate) shared_gate: u32,
    pub(crate) shared_up_off: u32,
    pub(crate) shared_down_off: u32,
    pub(crate) shared_h: u32,
    pub(crate) shared_out: u32,
    pub(crate) combine_rule: u32,
    pub(crate) combine_first: u32,
    pub(crate) entry_signals: u32,
}

/// Words of [`Header`].
pub(crate) const HEADER_WORDS: u32 = (std::mem::size_of::<Header>() / 4) as u32;

impl Header {
    /// The header of a program of `tasks` laid out as `at` (the bias and shared-gate words,
    /// the combine's first task and the task table's offset are filled in by [`encode`]).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for more tasks than u32 counts, or (with
    /// [`CombineRule::OwnEntries`]) more expert signals per combine tile than its counter holds.
    pub(super) fn new(
        tasks: &MoeTasks,
        at: &ProgramLayout,
        cfg: &MoeConfig,
        shape: TaskShape,
        q: &QueueOptions,
        shared: &SharedMatrices,
    ) -> Result<Self> {
        let (h, f, k) = (cfg.route.hidden, cfg.ffn, cfg.route.k);
        let shared_ffn = cfg.shared_ffn.unwrap_or(0);
        let header = Header {
            tasks: to_u32("tasks", usize::try_from(tasks.total()).unwrap_or(usize::MAX))?,
            task_off: 0,
            spin_limit: q.spin_limit,
            work: u32::from(!q.coordination_only),
            canary: 2,
            ffn: f,
            up_tiles: f.div_ceil(QUEUE_LANES),
            down_tiles: h.div_ceil(QUEUE_LANES),
            slots: tasks.slots,
            counts: at.counts,
            bases: at.bases,
            row_entry: at.row_entry,
            tile_expert: at.tile_expert,
            chunks: at.chunks,
            indices: at.indices,
            rows_h: at.rows_h,
            partial: at.partial,
            weights: at.weights,
            bias: MOE_NONE,
            shared_ffn,
            shared_up_tiles: shared_ffn.div_ceil(QUEUE_LANES),
            shared_gate: MOE_NONE,
            shared_up_off: shared.up_off,
            shared_down_off: shared.down_off,
            shared_h: at.shared_h,
            shared_out: at.shared_out,
            combine_rule: u32::from(shape.combine == CombineRule::OwnEntries),
            combine_first: 0,
            entry_signals: match shape.size {
                TaskSize::Fine => h.div_ceil(QUEUE_LANES),
                TaskSize::Coarse => 1,
            },
        };
        // Rule 1 counts a combine tile's expert signals below RUN_TIME_NEED.
        let signals = u64::from(MOE_TILE) * u64::from(k) * u64::from(header.entry_signals);
        if shape.combine == CombineRule::OwnEntries && signals >= u64::from(RUN_TIME_NEED) {
            return Err(Error::limit(
                "expert signals one combine tile waits for",
                signals,
                u64::from(RUN_TIME_NEED) - 1,
                "RUN_TIME_NEED in the MoE program",
            ));
        }
        Ok(header)
    }
}
