//! The persistent queue's settings and the state words it leaves for the host.

use serde::Serialize;

use crate::context::Context;
use crate::error::{Error, Result};

use super::plan::Fusion;

/// Lanes of the persistent workers, on every adapter: llvmpipe caps the loop iterations of
/// each 8-lane vector over its whole life (65535), and a worker lives for many tasks, so its
/// column loops must be spread over 64 lanes (8 vectors) to stay within the cap.
pub const QUEUE_LANES: u32 = 64;
/// State word: the next ticket (`TICKET` in wgsl/dag/program.wgsl, as are the words below).
pub(crate) const TICKET: u32 = 0;
/// State word: why the run stopped (0, [`STATUS_TIMEOUT`] or [`STATUS_LOOP_LIMIT`]).
pub(crate) const STATUS: u32 = 1;
/// State word: tasks completed.
pub(crate) const DONE: u32 = 2;
/// State word: the most polls one successful wait took.
pub(crate) const MAX_SPINS: u32 = 3;
/// State word: earlier runs that stopped early.
pub(crate) const FAULTS: u32 = 4;
/// Words before the per-task counters in the queue's state buffer (`COUNTERS`).
pub(crate) const STATE_HEADER: u32 = 5;
/// Status: a dependency wait timed out.
pub(crate) const STATUS_TIMEOUT: u32 = 1;
/// Status: the driver cut a shader loop short.
pub(crate) const STATUS_LOOP_LIMIT: u32 = 2;
/// Default bound on one dependency wait, in polls of the leader invocation.
pub(crate) const DEFAULT_SPIN_LIMIT: u32 = 1 << 24;

/// Task size of a row graph's persistent queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Granularity {
    /// One task per stage and tile.
    Fine,
    /// One task per pass of the plan with this fusion and tile (macro tasks).
    Coarse(Fusion),
}

/// Settings of the persistent queue (of a row graph or a MoE layer; the task size is the
/// executor's: [`super::Executor::Queue`], [`super::MoeExecutor::Queue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct QueueOptions {
    /// Worker workgroups (at least 1, at most the probe's bound).
    pub workers: u32,
    /// Diagnostic: run the scheduling (tickets, waits, signals) without the arithmetic. Not
    /// equivalent work; its outputs are not valid.
    pub coordination_only: bool,
    /// Polls one dependency wait may take before the queue gives up.
    pub spin_limit: u32,
    /// Diagnostic: make this task wait for one dependency more than it has, so the run times
    /// out (to exercise the fallback).
    pub stall_task: Option<u32>,
}

impl QueueOptions {
    /// `workers` workers, real work, the default spin bound.
    pub fn new(workers: u32) -> Self {
        QueueOptions { workers, coordination_only: false, spin_limit: DEFAULT_SPIN_LIMIT, stall_task: None }
    }

    /// Checks the worker count against `ctx`: one workgroup per worker in one dispatch.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no workers; [`Error::LimitExceeded`] for more than
    /// `max_compute_workgroups_per_dimension`.
    pub(crate) fn check_workers(&self, ctx: &Context) -> Result<()> {
        if self.workers == 0 {
            return Err(Error::invalid("the queue needs at least one worker"));
        }
        let max_groups = ctx.limits().max_compute_workgroups_per_dimension;
        if self.workers > max_groups {
            return Err(Error::limit(
                "queue workers",
                self.workers.into(),
                max_groups.into(),
                "max_compute_workgroups_per_dimension",
            ));
        }
        Ok(())
    }
}

/// The queue's state words after a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct QueueStatus {
    /// Tickets handed out (claims past the end included).
    pub tickets: u32,
    /// 0 when the run was clean; 1 after a dependency wait timed out; 2 when the driver cut
    /// a loop short (llvmpipe caps the loop iterations of one invocation).
    pub status: u32,
    /// Tasks completed.
    pub done: u32,
    /// Most polls one successful wait took.
    pub max_spins: u32,
    /// Earlier runs on this state buffer that stopped early (counted by the next run's
    /// reset), so one readback after many runs checks them all.
    pub earlier_faults: u32,
    /// Tasks in the run.
    pub tasks: u32,
}

impl QueueStatus {
    /// Reads the state words at the start of `state` after a run of `tasks` tasks.
    ///
    /// # Errors
    /// A device error while reading the state back.
    pub(crate) fn read(ctx: &Context, state: &wgpu::Buffer, tasks: u32) -> Result<Self> {
        let w: Vec<u32> = ctx.read_back(state, STATE_HEADER as usize)?;
        let word = |i: u32| w.get(i as usize).copied().unwrap_or(0);
        Ok(QueueStatus {
            tickets: word(TICKET),
            status: word(STATUS),
            done: word(DONE),
            max_spins: word(MAX_SPINS),
            earlier_faults: word(FAULTS),
            tasks,
        })
    }

    /// The status of a run without a queue: no tickets, no tasks.
    pub(crate) fn idle() -> Self {
        QueueStatus { tickets: 0, status: 0, done: 0, max_spins: 0, earlier_faults: 0, tasks: 0 }
    }

    /// Whether the last run completed every task without stopping early.
    pub fn complete(&self) -> bool {
        self.status == 0 && self.done == self.tasks
    }

    /// Why the last run stopped early, in words (from its status).
    pub fn why_stopped(&self) -> &'static str {
        match self.status {
            0 if self.done == self.tasks => "it did not stop early",
            0 => "tasks missing",
            STATUS_TIMEOUT => "a dependency wait timed out",
            STATUS_LOOP_LIMIT => "the driver cut a shader loop short",
            _ => "an unknown status",
        }
    }

    /// Whether the last run completed and no earlier run on this state buffer stopped early.
    pub fn all_clean(&self) -> bool {
        self.complete() && self.earlier_faults == 0
    }
}
