//! Building and running a [`RowGraph`] on one executor: one dispatch per stage, fused static
//! passes, or the persistent queue, all running the same WGSL code (`wgsl/dag/`), so they
//! agree bit for bit on one adapter. This module knows nothing of the probe: the probe runs
//! its progress tests through it, and [`RowRun::prepare`] asks the probe before a queue.

use super::chain::RowGraph;
use super::executor::{Executor, RunReport, lanes_for};
use super::plan::{Fusion, Plan, plan};
use super::program::{Params, RowInputs, encode, to_u32};
use super::queue::{Granularity, QUEUE_LANES, QueueOptions, QueueStatus, STATE_HEADER};
use super::shaders::{PARAMS_BYTES, PERSISTENT, RESET_QUEUE, STATIC_PASS};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline::{Access, Binding, Dispatch};
use crate::shader::Override;
use crate::tensor::word_bytes;

/// Scratch sizing shared by a run and its fallback.
#[derive(Clone, Copy, Debug)]
struct Layout {
    stage_elems: u64,
    steps: u32,
    extra: u32,
    slots: u32,
}

impl Layout {
    fn elems(&self, cols: u32) -> u64 {
        self.stage_elems
            + u64::from(self.slots) * u64::from(self.steps) * 2 * u64::from(self.extra) * u64::from(cols)
    }
}

/// One prepared program: the encoded plan and its dispatches.
#[derive(Debug)]
struct Prepared {
    label: String,
    plan: Plan,
    dispatches: Vec<Dispatch>,
    tasks: u32,
}

/// A graph prepared for one executor on its own output buffers. [`Self::dispatches`] can
/// be recorded into any encoder; [`Self::run`] submits them and, for the queue, checks its
/// status and falls back to fused passes after a timeout.
#[derive(Debug)]
pub struct RowRun {
    executor: Executor,
    main: Prepared,
    fallback: Option<Prepared>,
    refused: Option<String>,
    vals: wgpu::Buffer,
    state: wgpu::Buffer,
    rows: u32,
    cols: u32,
    stages: usize,
}

impl RowRun {
    /// `executor` with the adapter's lanes, without consulting the probe (the probe's own
    /// progress test: a staged run and the queue it checks).
    pub(super) fn prepare_unprobed(
        ctx: &Context,
        graph: &RowGraph,
        inputs: &RowInputs,
        executor: Executor,
    ) -> Result<Self> {
        Self::build(ctx, graph, inputs, executor, None, lanes_for(ctx))
    }

    /// Builds `graph` for `executor`; `refused` says why a queue runs fused passes instead.
    pub(super) fn build(
        ctx: &Context,
        graph: &RowGraph,
        inputs: &RowInputs,
        executor: Executor,
        refused: Option<String>,
        lanes: u32,
    ) -> Result<Self> {
        let g = graph.graph();
        if inputs.param_off.len() != g.stages().len() {
            return Err(Error::shape(
                "row graph inputs",
                format!("{} stages", g.stages().len()),
                inputs.param_off.len(),
            ));
        }
        if g.stages().is_empty() {
            return Err(Error::invalid("the row graph has no stages"));
        }
        let max_groups = ctx.limits().max_compute_workgroups_per_dimension;
        if g.tiles() > max_groups {
            return Err(Error::limit(
                "row tiles",
                g.tiles().into(),
                max_groups.into(),
                "max_compute_workgroups_per_dimension",
            ));
        }
        let fallback_plan = plan(g, Fusion::Neighbours);
        let (main_plan, queue) = match executor {
            Executor::Staged => (plan(g, Fusion::None), None),
            Executor::Fused(f) => (plan(g, f), None),
            Executor::Queue(granularity, q) => {
                let tasks_plan = match granularity {
                    Granularity::Fine => plan(g, Fusion::None),
                    Granularity::Coarse(f) => plan(g, f),
                };
                let total = tasks_plan.passes.len() as u64 * u64::from(g.tiles());
                q.check_workers(ctx)?;
                if let Some(s) = q.stall_task
                    && u64::from(s) >= total
                {
                    return Err(Error::invalid(format!("stall task {s} is not one of the {total} tasks")));
                }
                (tasks_plan, Some((granularity, q)))
            }
        };
        let slots = queue.map_or(0, |(_, q)| q.workers).max(g.tiles());
        let stage_elems = g.stages().len() as u64 * u64::from(g.rows()) * u64::from(graph.cols());
        let layout = Layout {
            stage_elems,
            steps: to_u32("steps", main_plan.max_steps().max(fallback_plan.max_steps()))?,
            extra: main_plan.max_extra().max(fallback_plan.max_extra()),
            slots,
        };
        let elems = layout.elems(graph.cols());
        if elems > u64::from(u32::MAX) {
            return Err(Error::limit(
                "row graph values",
                elems,
                u32::MAX.into(),
                "u32 indices in the DAG shaders",
            ));
        }
        let vals = ctx.zeroed("row graph values", word_bytes(elems))?;
        ctx.check_binding("row graph values", &vals, word_bytes(elems), Access::ReadWrite)?;
        let state_words = match queue {
            Some(_) => u64::from(STATE_HEADER) + main_plan.passes.len() as u64 * u64::from(g.tiles()),
            None => 1,
        };
        let state = ctx.zeroed("queue state", word_bytes(state_words))?;
        let b = Buffers { graph, inputs, vals: &vals, state: &state, layout, lanes };
        let (main, fallback) = match (queue, &refused) {
            (Some((granularity, q)), None) => (
                b.queue(ctx, main_plan, granularity, &q)?,
                Some(b.fused(ctx, fallback_plan, "fused (fallback)".into())?),
            ),
            (Some(_), Some(_)) => (b.fused(ctx, fallback_plan, "fused (queue refused)".into())?, None),
            (None, _) => {
                let label = match executor {
                    Executor::Staged => "staged".to_string(),
                    _ => match main_plan.passes.len() {
                        1 => "fused (1 pass)".to_string(),
                        n => format!("fused ({n} passes)"),
                    },
                };
                (b.fused(ctx, main_plan, label)?, None)
            }
        };
        Ok(RowRun {
            executor,
            main,
            fallback,
            refused,
            vals,
            state,
            rows: g.rows(),
            cols: graph.cols(),
            stages: g.stages().len(),
        })
    }
}

/// What every prepared program of one run binds.
struct Buffers<'a> {
    graph: &'a RowGraph,
    inputs: &'a RowInputs,
    vals: &'a wgpu::Buffer,
    state: &'a wgpu::Buffer,
    layout: Layout,
    lanes: u32,
}

impl Buffers<'_> {
    fn constants(lanes: u32) -> [(Override, f64); 1] {
        [(Override::Lanes, f64::from(lanes))]
    }

    fn program(
        &self,
        ctx: &Context,
        plan: &Plan,
        queue: Option<&QueueOptions>,
    ) -> Result<(wgpu::Buffer, Params)> {
        let (words, mut params) = encode(self.graph, self.inputs, plan, queue)?;
        params.scratch_base = to_u32("scratch offset", self.layout.stage_elems as usize)?;
        params.scratch_steps = self.layout.steps;
        params.scratch_extra = self.layout.extra;
        Ok((ctx.upload("dag program", &words)?, params))
    }

    /// One static dispatch per pass of `plan`.
    fn fused(&self, ctx: &Context, plan: Plan, label: String) -> Result<Prepared> {
        let (program, params) = self.program(ctx, &plan, None)?;
        let kernel = ctx.kernel(&STATIC_PASS, &Self::constants(self.lanes))?;
        let mut dispatches = Vec::with_capacity(plan.passes.len());
        for p in 0..plan.passes.len() {
            let u = ctx.uniform("dag pass", &Params { pass_index: to_u32("pass index", p)?, ..params })?;
            let bindings = [
                Binding::new(0, &u, PARAMS_BYTES),
                Binding::new(1, &program, program.size()),
                Binding::new(2, &self.inputs.buffer, self.inputs.buffer.size()),
                Binding::new(3, self.vals, self.vals.size()),
            ];
            dispatches.push(ctx.dispatch(&kernel, &bindings, [self.graph.graph().tiles(), 1, 1])?);
        }
        Ok(Prepared { label, plan, dispatches, tasks: 0 })
    }

    /// A state reset and one persistent dispatch of `q.workers` workers over `plan`'s tasks
    /// (of `granularity`).
    fn queue(
        &self,
        ctx: &Context,
        plan: Plan,
        granularity: Granularity,
        q: &QueueOptions,
    ) -> Result<Prepared> {
        let (program, params) = self.program(ctx, &plan, Some(q))?;
        let u = ctx.uniform("dag queue", &params)?;
        let reset = ctx.dispatch(
            &ctx.kernel(&RESET_QUEUE, &[])?,
            &[Binding::new(0, &u, PARAMS_BYTES), Binding::new(4, self.state, self.state.size())],
            ctx.grid(RESET_QUEUE.groups((STATE_HEADER + params.tasks).into())?, "queue reset")?,
        )?;
        let bindings = [
            Binding::new(0, &u, PARAMS_BYTES),
            Binding::new(1, &program, program.size()),
            Binding::new(2, &self.inputs.buffer, self.inputs.buffer.size()),
            Binding::new(3, self.vals, self.vals.size()),
            Binding::new(4, self.state, self.state.size()),
        ];
        let kernel = ctx.kernel(&PERSISTENT, &Self::constants(QUEUE_LANES))?;
        let persistent = ctx.dispatch(&kernel, &bindings, [q.workers, 1, 1])?;
        let kind = match granularity {
            Granularity::Fine => "fine".to_string(),
            Granularity::Coarse(_) => format!("coarse, {} passes", plan.passes.len()),
        };
        let diag = if q.coordination_only { ", coordination only" } else { "" };
        Ok(Prepared {
            label: format!("queue ({kind}, {} workers{diag})", q.workers),
            plan,
            dispatches: vec![reset, persistent],
            tasks: params.tasks,
        })
    }
}

impl RowRun {
    /// The executor asked for.
    pub fn executor(&self) -> Executor {
        self.executor
    }

    /// The plan the dispatches follow (the fallback's when the probe refused the queue).
    pub fn plan(&self) -> &Plan {
        &self.main.plan
    }

    /// Why the queue was refused on this adapter (its dispatches are then fused passes).
    pub fn refused(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// What the dispatches run, e.g. `fused (3 passes)` or `queue (fine, 8 workers)`.
    pub fn label(&self) -> &str {
        &self.main.label
    }

    /// The dispatches of one run, in order (record them in one compute pass).
    pub fn dispatches(&self) -> &[Dispatch] {
        &self.main.dispatches
    }

    /// Tasks of one queue run (0 for static executors).
    pub fn tasks(&self) -> u32 {
        self.main.tasks
    }

    /// Reads the queue's state words (for a static run, an all-zero status).
    ///
    /// # Errors
    /// A device error while reading the state back.
    pub fn queue_status(&self, ctx: &Context) -> Result<QueueStatus> {
        match self.main.tasks {
            0 => Ok(QueueStatus::idle()),
            tasks => QueueStatus::read(ctx, &self.state, tasks),
        }
    }

    /// Zeroes the queue's state words, including the count of earlier runs that stopped early.
    pub fn clear_status(&self, ctx: &Context) {
        let zeros = vec![0u8; self.state.size() as usize];
        ctx.queue().write_buffer(&self.state, 0, &zeros);
    }

    /// Runs once and waits. A queue run whose status shows a timeout or missing tasks is
    /// rerun with fused passes, and the report says so.
    ///
    /// # Errors
    /// A device error while running or reading the queue's status.
    pub fn run(&self, ctx: &Context) -> Result<RunReport> {
        ctx.run(&self.dispatches().iter().collect::<Vec<_>>())?;
        let main = self.main.label.clone();
        let (ran, fallback) = match (&self.fallback, &self.refused) {
            (_, Some(reason)) => (main, Some(reason.clone())),
            (None, None) => (main, None),
            (Some(fb), None) => {
                let s = self.queue_status(ctx)?;
                if s.complete() {
                    (main, None)
                } else {
                    ctx.run(&fb.dispatches.iter().collect::<Vec<_>>())?;
                    let why = format!(
                        "queue stopped ({} of {} tasks done, status {}: {}); reran as {}",
                        s.done,
                        s.tasks,
                        s.status,
                        s.why_stopped(),
                        fb.label
                    );
                    (fb.label.clone(), Some(why))
                }
            }
        };
        Ok(RunReport { ran, fallback })
    }

    /// Stage `s`'s output, `rows x cols`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a stage past the graph; a device error while reading.
    pub fn read_stage(&self, ctx: &Context, s: usize) -> Result<Vec<f32>> {
        if s >= self.stages {
            return Err(Error::invalid(format!("stage {s} of a graph with {} stages", self.stages)));
        }
        let n = self.rows as usize * self.cols as usize;
        let all: Vec<f32> = ctx.read_back(&self.vals, (s + 1) * n)?;
        Ok(all[s * n..].to_vec())
    }

    /// Every stage's output, in stage order.
    ///
    /// # Errors
    /// A device error while reading.
    pub fn read_all(&self, ctx: &Context) -> Result<Vec<Vec<f32>>> {
        let n = self.rows as usize * self.cols as usize;
        let all: Vec<f32> = ctx.read_back(&self.vals, self.stages * n)?;
        Ok(all.chunks_exact(n).map(<[f32]>::to_vec).collect())
    }
}
