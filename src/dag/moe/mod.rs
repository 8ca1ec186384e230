//! The MoE layer as a program of tasks: one route task per token, a layout task, expert tiles
//! of the gate/up and down projections over fixed upper-bound slots of padded bins, the
//! shared expert's tiles, and combine tiles (`wgsl/dag/moe.wgsl`), run as one dispatch of
//! persistent workers (driven by `wgsl/dag/queue.wgsl`) or as static passes
//! (`wgsl/dag/moe_static.wgsl`). The task bodies call the staged kernels' WGSL functions, so
//! the outputs are the bits of [`MoeLayer`](crate::layer::MoeLayer)'s forward on the same adapter.
//!
//! The projections come in two task sizes ([`TaskSize`]): fine tasks are one 64-column tile
//! of one projection (gate/up or down) of one 8-row tile; a coarse task is a whole 8-row
//! tile, gate/up over every column and then down over every column, in one workgroup. The
//! bits are the same either way.
//!
//! The task graph is static: routing decides how many expert tiles hold rows, so every
//! possible tile has a slot (`ceil(tokens * k / 8) + min(E, tokens * k)` slots of 8 rows
//! bound every layout) and the slots past the live tiles finish at once. The shared expert's
//! tiles depend on nothing and run beside the routing. Combine tiles wait for their own
//! tokens' shared-expert tasks and, on the queue, for the routed expert tasks that hold their
//! tokens' entries ([`CombineRule::OwnEntries`]: which tasks those are is known only after
//! routing, so the layout task writes the counts at run time) or for every routed expert task
//! ([`CombineRule::AllExperts`], a static list).
//!
//! Files: `tasks.rs` (the vocabulary and the task list), `layout.rs` (the work buffer's
//! regions), `header.rs` (the header's mirror), `encode.rs` (the program words), `bindings.rs`
//! (whole-buffer bindings), `shaders.rs` (module and kernels), `program.rs` (the program and
//! its dispatches). This file is the face.

mod bindings;
mod encode;
mod header;
mod layout;
mod program;
mod shaders;
mod tasks;

#[cfg(test)]
pub(crate) use header::{HEADER_WORDS, Header};
pub use program::{MoeProgram, unsupported};
#[cfg(test)]
pub(crate) use shaders::{PASS_RANGE_BYTES, SHADERS, SPECS};
pub use tasks::{COARSE_PASSES, CombineRule, FINE_PASSES, MOE_TILE, MoeTasks, TaskShape, TaskSize, passes};
#[cfg(test)]
pub(crate) use tasks::{MOE_NONE, RUN_TIME_NEED, TaskKind};
