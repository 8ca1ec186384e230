//! The program the DAG kernels interpret (`wgsl/dag/program.wgsl`): the stage table, a
//! plan's passes and steps, and its task table, plus the uniform parameters and the input
//! buffer (graph input and stage parameters).

use bytemuck::{Pod, Zeroable};

use super::chain::RowGraph;
use super::plan::Plan;
use super::queue::QueueOptions;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline::Access;
use crate::tensor::word_bytes;

/// "No stage" / "no step" in program words.
pub(crate) const NONE: u32 = u32::MAX;

/// Uniform parameters of every DAG kernel, laid out as `DagParams` in
/// `wgsl/dag/program.wgsl`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub(crate) struct Params {
    pub(crate) rows: u32,
    pub(crate) cols: u32,
    pub(crate) tile_rows: u32,
    pub(crate) tiles: u32,
    pub(crate) stage_off: u32,
    pub(crate) pass_off: u32,
    pub(crate) task_off: u32,
    pub(crate) tasks: u32,
    pub(crate) scratch_base: u32,
    pub(crate) scratch_steps: u32,
    pub(crate) scratch_extra: u32,
    pub(crate) pass_index: u32,
    pub(crate) spin_limit: u32,
    pub(crate) work: u32,
    pub(crate) canary: u32,
    pub(crate) pad: u32,
}

/// The graph input and every stage's parameters, in one read-only buffer.
#[derive(Debug)]
pub struct RowInputs {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) param_off: Vec<u32>,
}

impl RowInputs {
    /// Uploads `x[rows, cols]` and the stages' parameters.
    ///
    /// # Errors
    /// [`Error::Shape`] when `x` is not `rows x cols`; [`Error::LimitExceeded`] for inputs
    /// past u32 indices or the binding limit; device errors while uploading.
    pub fn upload(ctx: &Context, graph: &RowGraph, x: &[f32]) -> Result<Self> {
        let g = graph.graph();
        let n = g.rows() as usize * graph.cols() as usize;
        if x.len() != n {
            return Err(Error::shape(
                "row graph input",
                format!("{} x {} values", g.rows(), graph.cols()),
                x.len(),
            ));
        }
        let mut data = x.to_vec();
        let mut param_off = Vec::with_capacity(g.stages().len());
        for stage in g.stages() {
            param_off.push(u32::try_from(data.len()).map_err(|_| too_large("row graph inputs", data.len()))?);
            data.extend(stage.kernel.params());
        }
        let buffer = ctx.upload("row graph inputs", &data)?;
        ctx.check_binding("row graph inputs", &buffer, word_bytes(data.len() as u64), Access::Read)?;
        Ok(RowInputs { buffer, param_off })
    }
}

fn too_large(what: &str, n: usize) -> Error {
    Error::limit(what, n as u64, u32::MAX.into(), "u32 indices in the DAG shaders")
}

pub(crate) fn to_u32(what: &str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| too_large(what, n))
}

/// Program words: the stage table, the plan's passes and steps, and its task table.
pub(crate) fn encode(
    graph: &RowGraph,
    inputs: &RowInputs,
    plan: &Plan,
    queue: Option<&QueueOptions>,
) -> Result<(Vec<u32>, Params)> {
    let g = graph.graph();
    let mut words = Vec::new();
    let stage_off = 0u32;
    for (s, _) in g.stages().iter().enumerate() {
        let kind = g.stages()[s].kernel.code();
        let src = graph.source(s).map_or(Ok(NONE), |q| to_u32("stage index", q))?;
        words.extend([kind, src, inputs.param_off[s]]);
    }
    let pass_off = to_u32("program words", words.len())?;
    let steps_start = pass_off as usize + 2 * plan.passes.len();
    let mut steps = Vec::new();
    let mut pass_words = Vec::new();
    for pass in &plan.passes {
        pass_words.extend([
            to_u32("program words", steps_start + steps.len())?,
            to_u32("steps", pass.steps.len())?,
        ]);
        for step in &pass.steps {
            let src_step = graph
                .source(step.stage)
                .and_then(|q| pass.steps.iter().position(|p| p.stage == q))
                .map_or(Ok(NONE), |j| to_u32("step index", j))?;
            steps.extend([to_u32("stage index", step.stage)?, step.extra, src_step]);
        }
    }
    words.extend(pass_words);
    words.extend(steps);
    let task_off = to_u32("program words", words.len())?;
    let tasks = plan.tasks(g);
    let mut consumers: Vec<Vec<u32>> = vec![Vec::new(); tasks.len()];
    for (i, t) in tasks.iter().enumerate() {
        for &d in &t.deps {
            consumers[d].push(to_u32("task index", i)?);
        }
    }
    let cons_start = task_off as usize + 5 * tasks.len();
    let mut cons_words: Vec<u32> = Vec::new();
    for (i, t) in tasks.iter().enumerate() {
        let stall = queue.and_then(|q| q.stall_task).is_some_and(|s| s as usize == i);
        let need = to_u32("dependencies", t.deps.len())? + u32::from(stall);
        words.extend([
            to_u32("pass index", t.pass)?,
            t.tile,
            need,
            to_u32("program words", cons_start + cons_words.len())?,
            to_u32("consumers", consumers[i].len())?,
        ]);
        cons_words.extend(&consumers[i]);
    }
    words.extend(cons_words);
    let params = Params {
        rows: g.rows(),
        cols: graph.cols(),
        tile_rows: g.tile_rows(),
        tiles: g.tiles(),
        stage_off,
        pass_off,
        task_off,
        tasks: to_u32("tasks", tasks.len())?,
        spin_limit: queue.map_or(0, |q| q.spin_limit),
        work: u32::from(!queue.is_some_and(|q| q.coordination_only)),
        canary: 2,
        ..Params::default()
    };
    Ok((words, params))
}
