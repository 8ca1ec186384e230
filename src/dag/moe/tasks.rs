//! The MoE program's task vocabulary ([`TaskKind`], [`TaskSize`], [`CombineRule`],
//! [`TaskShape`]) and its task list ([`MoeTasks`]): every task, its needs and its passes.

use super::super::program::to_u32;
use super::super::queue::QUEUE_LANES;
use crate::error::Result;

/// Rows per expert tile of the queue (`MOE_TILE` in wgsl/dag/moe.wgsl).
pub const MOE_TILE: u32 = 8;

/// "No entry", "no expert" and "no shared gate" in the program and layout words (`MOE_NONE`).
pub(crate) const MOE_NONE: u32 = u32::MAX;

/// A task's kind, as the program's task table stores it (`MOE_ROUTE` ... in
/// wgsl/dag/moe.wgsl; the contract test checks every code).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskKind {
    /// Routes one token.
    Route = 0,
    /// Builds the expert layout once every token is routed.
    Layout = 1,
    /// One gate/up tile of a routed expert (fine tasks).
    Up = 2,
    /// One down tile of a routed expert (fine tasks).
    Down = 3,
    /// Combines one tile of tokens.
    Combine = 4,
    /// One gate/up tile of the shared expert (fine tasks).
    SharedUp = 5,
    /// One down tile of the shared expert (fine tasks).
    SharedDown = 6,
    /// One tile of the shared expert, gate/up and down (coarse tasks).
    Shared = 7,
    /// One routed expert tile, gate/up and down (coarse tasks).
    Expert = 8,
}

/// One task of the program's table.
#[derive(Debug)]
pub(super) struct TaskEntry {
    pub(super) kind: TaskKind,
    /// Its index among the tasks of its kind.
    pub(super) index: u32,
    /// The signals it waits for before it runs.
    pub(super) need: u32,
    /// The tasks (by ticket) it signals when done.
    pub(super) consumers: Vec<u32>,
}

impl TaskEntry {
    pub(super) fn new(kind: TaskKind, index: u32, need: u32, consumers: Vec<u32>) -> Self {
        TaskEntry { kind, index, need, consumers }
    }
}

/// The part of a combine tile's dependency count that [`CombineRule::OwnEntries`] fills at
/// run time (`RUN_TIME_NEED` in wgsl/dag/moe.wgsl).
pub(crate) const RUN_TIME_NEED: u32 = 1 << 24;

/// The size of the MoE program's projection tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum TaskSize {
    /// One task per 64-column tile of one projection (gate/up or down) of an 8-row tile: many
    /// small tasks, and a down tile waits for its rows' gate/up tiles.
    Fine,
    /// One task per 8-row tile (a bin tile, or a tile of tokens for the shared expert): the
    /// gate/up projection over every column, then the down projection over every column, in
    /// one workgroup, with no wait between the halves.
    Coarse,
}

/// Which routed expert tasks a combine tile waits for on the queue (the static passes run
/// every expert task before any combine tile either way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum CombineRule {
    /// Every routed expert task (down or coarse expert tile): a static dependency list.
    AllExperts,
    /// Only the expert tasks that hold its tokens' entries: the layout writes how many signals
    /// each combine tile will get, and each expert task signals the combine tiles of the
    /// entries it holds.
    OwnEntries,
}

/// The shape of a MoE task program: its projection task size and its combine rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct TaskShape {
    /// The size of the projection tasks.
    pub size: TaskSize,
    /// What a combine tile waits for on the queue.
    pub combine: CombineRule,
}

impl TaskShape {
    /// Tasks of `size` with the default combine rule, [`CombineRule::OwnEntries`].
    pub fn new(size: TaskSize) -> Self {
        TaskShape { size, combine: CombineRule::OwnEntries }
    }

    /// Tasks of `size` with the combine rule `combine`.
    pub fn with_combine(size: TaskSize, combine: CombineRule) -> Self {
        TaskShape { size, combine }
    }
}

impl TaskSize {
    /// `fine` or `coarse`.
    pub fn name(self) -> &'static str {
        match self {
            TaskSize::Fine => "fine",
            TaskSize::Coarse => "coarse",
        }
    }
}

/// The static passes of the task program with fine tasks, in order: what each runs and why
/// the next one starts a new pass (the dependency that a pass cannot hold).
pub const FINE_PASSES: [(&str, &str); 5] = [
    ("route", "the layout needs every token's experts"),
    ("layout", "an expert tile needs its bin's rows"),
    ("gate/up + shared gate/up", "a down tile needs every column of its rows' activations"),
    ("down + shared down", "a combine tile needs every expert output of its tokens"),
    ("combine", "the end of the layer"),
];

/// The static passes with coarse tasks: a tile's gate/up and down run in one workgroup, so
/// the cut between them is gone.
pub const COARSE_PASSES: [(&str, &str); 4] = [
    ("route", "the layout needs every token's experts"),
    ("layout", "an expert tile needs its bin's rows"),
    (
        "expert tiles + shared tiles (gate/up, then down)",
        "a combine tile needs every expert output of its tokens",
    ),
    ("combine", "the end of the layer"),
];

/// The static passes of the task program with tasks of `size`.
pub fn passes(size: TaskSize) -> &'static [(&'static str, &'static str)] {
    match size {
        TaskSize::Fine => &FINE_PASSES,
        TaskSize::Coarse => &COARSE_PASSES,
    }
}

/// How many tasks of each kind a MoE program runs (the projection kinds of the other task
/// size are 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MoeTasks {
    /// The size of the projection tasks.
    pub size: TaskSize,
    /// Route tasks, one per token (the fused route's work for that token).
    pub route: u32,
    /// Layout tasks (1).
    pub layout: u32,
    /// Expert tile slots ([`MOE_TILE`] rows each; the empty ones finish at once).
    pub slots: u32,
    /// Fine gate/up tasks: slots times 64-column tiles of F.
    pub up: u32,
    /// Fine down tasks: slots times 64-column tiles of H.
    pub down: u32,
    /// Fine shared-expert gate/up tasks: tiles of [`MOE_TILE`] tokens times 64-column tiles of
    /// Fs (0 without a shared expert).
    pub shared_up: u32,
    /// Fine shared-expert down tasks: token tiles times 64-column tiles of H.
    pub shared_down: u32,
    /// Coarse expert tasks: one per slot.
    pub expert: u32,
    /// Coarse shared-expert tasks: one per token tile (0 without a shared expert).
    pub shared: u32,
    /// Combine tiles ([`MOE_TILE`] tokens each).
    pub combine: u32,
}

impl MoeTasks {
    pub(super) fn new(
        size: TaskSize,
        tokens: u32,
        hidden: u32,
        ffn: u32,
        experts: u32,
        k: u32,
        shared_ffn: Option<u32>,
    ) -> Result<Self> {
        let entries = u64::from(tokens) * u64::from(k);
        let slots = entries.div_ceil(u64::from(MOE_TILE)) + entries.min(u64::from(experts));
        let t = |what: &str, n: u64| to_u32(what, usize::try_from(n).unwrap_or(usize::MAX));
        let token_tiles = u64::from(tokens.div_ceil(MOE_TILE));
        let shared_tiles = if shared_ffn.is_some() { token_tiles } else { 0 };
        // Fine tasks per tile of each projection (64-column tiles), coarse: one.
        let cols = |n: u32| match size {
            TaskSize::Fine => u64::from(n.div_ceil(QUEUE_LANES)),
            TaskSize::Coarse => 0,
        };
        let coarse = u64::from(size == TaskSize::Coarse);
        Ok(MoeTasks {
            size,
            route: tokens,
            layout: 1,
            slots: t("expert tile slots", slots)?,
            up: t("gate/up tasks", slots * cols(ffn))?,
            down: t("down tasks", slots * cols(hidden))?,
            shared_up: t("shared gate/up tasks", shared_tiles * shared_ffn.map_or(0, cols))?,
            shared_down: t("shared down tasks", shared_tiles * cols(hidden))?,
            expert: t("expert tasks", slots * coarse)?,
            shared: t("shared expert tasks", shared_tiles * coarse)?,
            combine: tokens.div_ceil(MOE_TILE),
        })
    }

    /// Tasks in each of the static passes [`passes`] gives for this task size (ticket order
    /// is pass order).
    pub(crate) fn pass_counts(&self) -> Vec<u32> {
        match self.size {
            TaskSize::Fine => vec![
                self.route,
                self.layout,
                self.shared_up + self.up,
                self.shared_down + self.down,
                self.combine,
            ],
            TaskSize::Coarse => vec![self.route, self.layout, self.shared + self.expert, self.combine],
        }
    }

    /// Every task.
    pub fn total(&self) -> u64 {
        self.pass_counts().iter().map(|&n| u64::from(n)).sum()
    }
}
