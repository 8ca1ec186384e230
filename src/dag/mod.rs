//! The DAG layer: a graph of stages over row tiles, a planner that fuses chains into static
//! passes (recomputing halo rows where needed), and three executors for the same graph —
//! one dispatch per stage, fused static passes, and a persistent task queue gated by a
//! per-adapter probe. Every executor runs the same WGSL code for each value, so all of them
//! are bit-identical to the staged one on one adapter. See `docs/dag.md`.

pub mod chain;
pub mod executor;
pub mod graph;
pub mod layer;
pub mod moe;
pub mod plan;
mod prepare;
pub mod probe;
pub mod program;
pub mod queue;
pub mod run;
pub(crate) mod shaders;

pub use chain::{RowGraph, RowOp};
pub use executor::{Executor, RunReport, lanes_for};
pub use graph::{Graph, Reach, Read, Source, Stage};
pub use layer::{LayerRun, MoeExecutor};
pub use moe::{CombineRule, MoeProgram, MoeTasks, TaskShape, TaskSize};
pub use plan::{Fusion, Pass, Plan, Step, Task, plan};
pub use probe::{ProbeReport, ProbeVerdict, probe};
pub use program::RowInputs;
pub use queue::{Granularity, QUEUE_LANES, QueueOptions, QueueStatus};
pub use run::RowRun;
