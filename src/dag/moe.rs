//! The MoE layer as a program of tasks: one route task per token, a layout task, expert tiles
//! of the gate/up and down projections over fixed upper-bound slots of padded bins, the
//! shared expert's tiles, and combine tiles (`wgsl/dag/moe.wgsl`), run as one dispatch of
//! persistent workers (driven by `wgsl/dag/queue.wgsl`) or as static passes
//! (`wgsl/dag/moe_static.wgsl`). The task bodies call the staged kernels' WGSL functions, so
//! the outputs are the bits of [`MoeLayer`]'s forward on the same adapter.
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

use bytemuck::{Pod, Zeroable};

use super::program::to_u32;
use super::queue::{
    DONE, FAULTS, MAX_SPINS, QUEUE_LANES, QueueOptions, QueueStatus, STATE_HEADER, STATUS, TICKET,
};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::gemm::{Activation, ExpertWeights};
use crate::kernels::routing::{PARAMS_BYTES as ROUTE_PARAMS_BYTES, route_params};
use crate::layer::{CallerOutputs, Capacity, ForwardIo, MoeConfig, MoeLayer};
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::{Access, Binding, Constants, Dispatch, KernelSpec, Workgroup};
use crate::shader::{Indexing, Override, ShaderSource, wgsl};
use crate::tensor::word_bytes;

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
struct TaskEntry {
    kind: TaskKind,
    /// Its index among the tasks of its kind.
    index: u32,
    /// The signals it waits for before it runs.
    need: u32,
    /// The tasks (by ticket) it signals when done.
    consumers: Vec<u32>,
}

impl TaskEntry {
    fn new(kind: TaskKind, index: u32, need: u32, consumers: Vec<u32>) -> Self {
        TaskEntry { kind, index, need, consumers }
    }
}

/// The part of a combine tile's dependency count that [`CombineRule::OwnEntries`] fills at
/// run time (`RUN_TIME_NEED` in wgsl/dag/moe.wgsl).
pub(crate) const RUN_TIME_NEED: u32 = 1 << 24;

/// Bytes of a static pass's ticket range (`pass_range` in wgsl/dag/moe_static.wgsl).
pub(crate) const PASS_RANGE_BYTES: u64 = 16;

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

static MOE_SHADER: ShaderSource = ShaderSource {
    name: "dag/moe",
    parts: &[
        wgsl!("routing/params.wgsl"),
        wgsl!("routing/gate.wgsl"),
        wgsl!("routing/select.wgsl"),
        wgsl!("gemm/half.wgsl"),
        wgsl!("gemm/order.wgsl"),
        wgsl!("dag/moe.wgsl"),
        wgsl!("dag/queue.wgsl"),
        wgsl!("dag/moe_static.wgsl"),
    ],
    entry_points: &["reset_queue", "persistent", "moe_pass"],
    indexing: Indexing::Checked,
};

/// The MoE queue's shader module.
#[cfg(test)]
pub(crate) static SHADERS: &[&ShaderSource] = &[&MOE_SHADER];

use Access::{Read, ReadWrite, Uniform};
static MOE_RESET: KernelSpec = KernelSpec {
    shader: &MOE_SHADER,
    entry: "reset_queue",
    bindings: &[(7, Read), (14, ReadWrite)],
    params_bytes: ROUTE_PARAMS_BYTES,
    workgroup: Workgroup::Fixed(64),
};
/// What the persistent workers bind (see wgsl/dag/moe.wgsl).
static MOE_PERSISTENT: KernelSpec = KernelSpec {
    shader: &MOE_SHADER,
    entry: "persistent",
    bindings: &[
        (0, Uniform),
        (1, ReadWrite),
        (2, Read),
        (7, Read),
        (8, Read),
        (9, Read),
        (10, Read),
        (12, ReadWrite),
        (13, ReadWrite),
        (14, ReadWrite),
        (15, Read),
    ],
    params_bytes: ROUTE_PARAMS_BYTES,
    workgroup: Workgroup::Override(Override::Lanes),
};
/// What a static pass binds: the workers' bindings and its ticket range (3).
static MOE_PASS: KernelSpec = KernelSpec {
    shader: &MOE_SHADER,
    entry: "moe_pass",
    bindings: &[
        (0, Uniform),
        (1, ReadWrite),
        (2, Read),
        (3, Uniform),
        (7, Read),
        (8, Read),
        (9, Read),
        (10, Read),
        (12, ReadWrite),
        (13, ReadWrite),
        (14, ReadWrite),
        (15, Read),
    ],
    params_bytes: ROUTE_PARAMS_BYTES,
    workgroup: Workgroup::Override(Override::Lanes),
};
/// The MoE task program's kernels (for the contract test, `src/contract.rs`).
#[cfg(test)]
pub(crate) static SPECS: &[&KernelSpec] = &[&MOE_RESET, &MOE_PERSISTENT, &MOE_PASS];

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

/// Where the task program keeps its values: offsets in u32 words of the `state` buffer (the
/// queue's words and counters, the expert layout, the top-k indices) and in f32 values of the
/// `work` buffer (routing weights, SwiGLU rows, expert outputs, the shared expert's rows), each
/// region right after the one before, and each buffer's length. The header names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProgramLayout {
    /// Rows per expert `[E]`, after the queue's header and one done-word per task.
    counts: u32,
    /// Each expert's first row `[E]`.
    bases: u32,
    /// Row -> entry `[slots * MOE_TILE]`.
    row_entry: u32,
    /// Slot -> expert `[slots]`.
    tile_expert: u32,
    /// Per-lane expert chunks `[QUEUE_LANES * E]`.
    chunks: u32,
    /// `indices[tokens, k]`.
    indices: u32,
    /// Words of `state`.
    state_len: u32,
    /// `weights[tokens, k]`.
    weights: u32,
    /// SwiGLU rows `[slots * MOE_TILE, F]`.
    rows_h: u32,
    /// Expert outputs `[tokens * k, H]`.
    partial: u32,
    /// The shared expert's SwiGLU rows `[tokens rounded up to MOE_TILE, Fs]`.
    shared_h: u32,
    /// The shared expert's outputs `[tokens, H]` (none without one).
    shared_out: u32,
    /// Values of `work`.
    work_len: u32,
}

impl ProgramLayout {
    /// The layout of `tasks` over `tokens` tokens of a layer of `[hidden, ffn, experts, k]`
    /// with a shared expert of `shared_ffn` columns (0: none).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for a buffer past u32 indices.
    fn new(tasks: &MoeTasks, tokens: u32, [h, f, e, k]: [u32; 4], shared_ffn: u32) -> Result<Self> {
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

impl MoeTasks {
    fn new(
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
    pub fn pass_counts(&self) -> Vec<u32> {
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

/// Why `layer` has no task form on `ctx`, if it has none: the program runs dropless layers
/// (no capacity bound) from unsplit weights, and binds 10 storage buffers.
pub fn unsupported(ctx: &Context, layer: &MoeLayer) -> Option<String> {
    layer_unsupported(layer).or_else(|| storage_limit(ctx).err().map(|e| e.to_string()))
}

/// Why `layer` has no task form on any device, if it has none.
fn layer_unsupported(layer: &MoeLayer) -> Option<String> {
    let cfg = layer.config();
    if cfg.capacity != Capacity::Dropless {
        return Some("the MoE task program runs dropless layers only (no capacity bound)".into());
    }
    if cfg.route.router_bias || cfg.expert_bias || cfg.activation != Activation::Swiglu {
        return Some(
            "the MoE task program runs SwiGLU experts without biases and routers without a bias; \
             this layer runs on the staged forward"
                .into(),
        );
    }
    if cfg.weight_dtype.is_quantised() {
        return Some(format!(
            "the MoE task program reads f32, f16 and bf16 weights; {:?} weights run on the staged forward",
            cfg.weight_dtype
        ));
    }
    let ffn = layer.routed_experts();
    let shared = layer.shared_expert().map(|(s, _)| [&s.gate, &s.up, &s.down]);
    let mut all = vec![&ffn.gate, &ffn.up, &ffn.down];
    all.extend(shared.into_iter().flatten());
    if all.iter().any(|w| w.whole_buffer().is_none()) {
        return Some("the expert weights are split into chunks past one storage binding".into());
    }
    None
}

/// The program's storage bindings against the device's limit.
fn storage_limit(ctx: &Context) -> Result<()> {
    let (storage, _, _) = MOE_PERSISTENT.binding_counts();
    let max = ctx.limits().max_storage_buffers_per_shader_stage;
    if storage > max {
        return Err(Error::limit(
            "the MoE task program's storage buffers",
            storage.into(),
            max.into(),
            "max_storage_buffers_per_shader_stage",
        ));
    }
    Ok(())
}

/// The MoE layer's forward of a fixed token count as a program of tasks, run either as one
/// persistent-queue dispatch (with a state reset) or as the static passes [`passes`], both
/// with the same task bodies on the same buffers: each writes `y` and the program's own top-k
/// indices and weights.
#[derive(Debug)]
pub struct MoeProgram {
    queue: Option<Vec<Dispatch>>,
    passes: Vec<Dispatch>,
    state: wgpu::Buffer,
    work: wgpu::Buffer,
    indices: u32,
    entries: usize,
    tasks: MoeTasks,
    queue_label: Option<String>,
}

impl MoeProgram {
    /// Builds the program for a forward of `layer` from `io`'s `x[tokens, H]` into its
    /// `y[tokens, H]` with tasks of `shape`: its static passes, and the queue with
    /// `queue`'s options where given. The probe
    /// is not consulted here (see [`super::layer::LayerRun`]).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] on a device with fewer than 10 storage buffers per stage;
    /// [`Error::InvalidArgument`] where [`unsupported`] gives another reason, for routing results
    /// or logits asked of `io` (the program keeps them in its own state: [`Self::read_routing`]),
    /// for zero tokens or
    /// workers, or a stall task past the tasks; [`Error::LimitExceeded`]
    /// for more workers than a dispatch can have, sizes past u32 indices and binding
    /// limits, or (with [`CombineRule::OwnEntries`]) more expert signals per combine tile than
    /// its counter leaves room for (8·k·ceil(H/64) of 2^24); [`Error::Shape`] for x or y not
    /// of the layer's shape; device errors.
    pub fn new(
        ctx: &Context,
        layer: &MoeLayer,
        io: ForwardIo<'_>,
        shape: TaskShape,
        queue: Option<&QueueOptions>,
    ) -> Result<Self> {
        let q = queue.copied().unwrap_or(QueueOptions::new(1));
        let tasks = Self::tasks_for(ctx, layer, &io, shape, &q)?;
        let cfg = layer.config();
        let (h, f, e, k) = (cfg.route.hidden, cfg.ffn, cfg.route.experts, cfg.route.k);
        let tokens = io.max_tokens();
        let (x, y) = (io.x().view(), io.y().view());
        let (t64, h64, k64) = (u64::from(tokens), u64::from(h), u64::from(k));

        let at = ProgramLayout::new(&tasks, tokens, [h, f, e, k], cfg.shared_ffn.unwrap_or(0))?;
        let state = ctx.storage_scratch("moe program state", word_bytes(u64::from(at.state_len)))?;
        let work = ctx.storage_scratch("moe program work", word_bytes(u64::from(at.work_len)))?;
        // The selection bias and the shared gate travel in the program words, the shared
        // expert's three matrices in one buffer: 10 storage buffers in all.
        let (router, bias) = layer.router_buffers();
        let bias_values: Vec<u32> = match bias {
            Some(b) => ctx.read_back(b, e as usize)?,
            None => Vec::new(),
        };
        let gate_values: Vec<u32> = match layer.shared_expert().and_then(|(_, g)| g) {
            Some(g) => ctx.read_back(whole(g)?, h as usize)?,
            None => Vec::new(),
        };
        let shared = SharedMatrices::pack(ctx, layer)?;
        let mut header = Header::new(&tasks, &at, cfg, shape, &q, &shared)?;
        let program_words = encode(&mut header, &tasks, &bias_values, &gate_values, q.stall_task)?;
        let program = ctx.upload("moe program", &program_words)?;
        let params = route_params(ctx, &cfg.route, tokens)?;
        let ffn = layer.routed_experts();
        let bindings = [
            Binding::new(0, &params, ROUTE_PARAMS_BYTES),
            x.bind(1, word_bytes(t64 * h64)),
            Binding::new(2, router, word_bytes(u64::from(e) * h64)),
            whole_binding(7, &program),
            whole_binding(8, whole(&ffn.gate)?),
            whole_binding(9, whole(&ffn.up)?),
            whole_binding(10, whole(&ffn.down)?),
            whole_binding(12, &work),
            y.bind(13, word_bytes(t64 * h64)),
            whole_binding(14, &state),
            whole_binding(15, &shared.buffer),
        ];
        let mut constants = cfg.route.constants().to_vec();
        let order = ffn.kernels(ctx).order;
        constants.extend([
            (Override::Lanes, f64::from(QUEUE_LANES)),
            (Override::Dtype, cfg.weight_dtype.code()),
            (Override::FastOrder, f64::from(u8::from(order == crate::kernels::gemm::GemmOrder::Fast))),
        ]);
        let persistent = ctx.kernel(&MOE_PERSISTENT, &constants)?;
        let queue = match queue {
            Some(q) => {
                let persistent = ctx.dispatch(&persistent, &bindings, [q.workers, 1, 1])?;
                let reset = ctx.dispatch(
                    &ctx.kernel(&MOE_RESET, &[])?,
                    &[whole_binding(7, &program), whole_binding(14, &state)],
                    ctx.grid(MOE_RESET.groups((STATE_HEADER + header.tasks).into())?, "queue reset")?,
                )?;
                Some(vec![reset, persistent])
            }
            None => None,
        };
        let passes = pass_dispatches(ctx, &tasks, &constants, &bindings)?;
        let diag = if q.coordination_only { ", coordination only" } else { "" };
        let queue_label = queue
            .as_ref()
            .map(|_| format!("queue ({} MoE tasks, {} workers{diag})", shape.size.name(), q.workers));
        let entries = usize::try_from(t64 * k64)
            .map_err(|_| Error::limit("entries", t64 * k64, u32::MAX.into(), "usize"))?;
        Ok(MoeProgram { queue, passes, state, work, indices: header.indices, entries, tasks, queue_label })
    }

    /// Checks a program's request against the device, the layer and `io` (see [`Self::new`]'s
    /// errors) and returns its tasks.
    fn tasks_for(
        ctx: &Context,
        layer: &MoeLayer,
        io: &ForwardIo<'_>,
        shape: TaskShape,
        q: &QueueOptions,
    ) -> Result<MoeTasks> {
        let tokens = io.max_tokens();
        storage_limit(ctx)?;
        if let Some(why) = layer_unsupported(layer) {
            return Err(Error::invalid(format!("this layer has no task form: {why}")));
        }
        if tokens == 0 {
            return Err(Error::invalid("the MoE queue needs at least one token"));
        }
        q.check_workers(ctx)?;
        let cfg = layer.config();
        let (h, f, e, k) = (cfg.route.hidden, cfg.ffn, cfg.route.experts, cfg.route.k);
        io.check(cfg)?;
        if io.caller_outputs() != CallerOutputs::default() {
            return Err(Error::invalid(
                "the MoE task program keeps its routing results in its own state (read them with \
                 `read_routing`); it writes no routing tensors or logits of the caller's",
            ));
        }
        let tasks = MoeTasks::new(shape.size, tokens, h, f, e, k, cfg.shared_ffn)?;
        if let Some(s) = q.stall_task
            && u64::from(s) >= tasks.total()
        {
            return Err(Error::invalid(format!("stall task {s} is not one of the {} tasks", tasks.total())));
        }
        let words = word_bytes(u64::from(tokens) * u64::from(h));
        ctx.check_view("x", &io.x().view(), words, Read)?;
        ctx.check_view("y", &io.y().view(), words, ReadWrite)?;
        check_disjoint(&[("x", io.x().view(), Use::Read), ("y", io.y().view(), Use::Write)])?;
        Ok(tasks)
    }

    /// The queue's dispatches (a state reset and the persistent workers), where it was asked
    /// for; record them in one compute pass.
    pub fn queue_dispatches(&self) -> Option<&[Dispatch]> {
        self.queue.as_deref()
    }

    /// The static passes' dispatches, one per non-empty pass of [`passes`], in order (record
    /// them in one compute pass: each dispatch sees the writes of the ones before it).
    pub fn pass_dispatches(&self) -> &[Dispatch] {
        &self.passes
    }

    /// The tasks of one run, by kind.
    pub fn tasks(&self) -> MoeTasks {
        self.tasks
    }

    /// What the program runs: the queue where it was asked for (e.g. `queue (fine MoE tasks, 8
    /// workers)`), else [`Self::passes_label`].
    pub fn label(&self) -> String {
        self.queue_label.clone().unwrap_or_else(|| self.passes_label())
    }

    /// What the static passes run, e.g. `5 static passes of fine MoE tasks`.
    pub fn passes_label(&self) -> String {
        format!("{} static passes of {} MoE tasks", self.passes.len(), self.tasks.size.name())
    }

    /// Reads back the last run's top-k `indices[tokens, k]` and `weights[tokens, k]` (the
    /// route tasks write them into the program's own buffers).
    ///
    /// # Errors
    /// A device error while reading back.
    pub fn read_routing(&self, ctx: &Context) -> Result<(Vec<u32>, Vec<f32>)> {
        let at = self.indices as usize;
        let state: Vec<u32> = ctx.read_back(&self.state, at + self.entries)?;
        let weights: Vec<f32> = ctx.read_back(&self.work, self.entries)?;
        Ok((state[at..].to_vec(), weights))
    }

    /// Zeroes the queue's state words, including the count of earlier runs that stopped early.
    pub fn clear_status(&self, ctx: &Context) {
        let zeros = vec![0u8; STATE_HEADER as usize * 4];
        ctx.queue().write_buffer(&self.state, 0, &zeros);
    }

    /// Reads the queue's state words.
    ///
    /// # Errors
    /// A device error while reading the state back.
    pub fn status(&self, ctx: &Context) -> Result<QueueStatus> {
        let w: Vec<u32> = ctx.read_back(&self.state, STATE_HEADER as usize)?;
        let word = |i: u32| w.get(i as usize).copied().unwrap_or(0);
        let tasks = u32::try_from(self.tasks.total()).unwrap_or(u32::MAX);
        Ok(QueueStatus {
            tickets: word(TICKET),
            status: word(STATUS),
            done: word(DONE),
            max_spins: word(MAX_SPINS),
            earlier_faults: word(FAULTS),
            tasks,
        })
    }
}

/// The one buffer of unsplit weights.
fn whole(w: &ExpertWeights) -> Result<&wgpu::Buffer> {
    w.whole_buffer().ok_or_else(|| Error::invalid("split expert weights have no task form"))
}

/// `buffer` bound whole at `binding`.
fn whole_binding(binding: u32, buffer: &wgpu::Buffer) -> Binding<'_> {
    Binding::new(binding, buffer, buffer.size())
}

/// The shared expert's gate, up and down matrices copied into one buffer (a 4-byte
/// placeholder without one), and the words where the up and down matrices start.
struct SharedMatrices {
    buffer: wgpu::Buffer,
    up_off: u32,
    down_off: u32,
}

impl SharedMatrices {
    fn pack(ctx: &Context, layer: &MoeLayer) -> Result<Self> {
        let Some((s, _)) = layer.shared_expert() else {
            let buffer = ctx.storage_scratch("moe program absent shared expert", 4)?;
            return Ok(SharedMatrices { buffer, up_off: 0, down_off: 0 });
        };
        let parts = [whole(&s.gate)?, whole(&s.up)?, whole(&s.down)?];
        let total: u64 = parts.iter().map(|b| b.size()).sum();
        let buffer = ctx.storage_scratch("moe program shared expert", total)?;
        let mut encoder = ctx.encoder("moe program shared expert copy");
        let mut at = 0;
        for part in parts {
            encoder.copy_buffer_to_buffer(part, 0, &buffer, at, part.size());
            at += part.size();
        }
        ctx.submit_and_wait(encoder)?;
        let word = |n: u64| to_u32("shared expert words", usize::try_from(n).unwrap_or(usize::MAX));
        let (gate_words, up_words) = (parts[0].size() / 4, parts[1].size() / 4);
        let (up_off, down_off) = (word(gate_words)?, word(gate_words + up_words)?);
        Ok(SharedMatrices { buffer, up_off, down_off })
    }
}

impl Header {
    /// The header of a program of `tasks` laid out as `at` (the bias and shared-gate words,
    /// the combine's first task and the task table's offset are filled in by [`encode`]).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for more tasks than u32 counts, or (with
    /// [`CombineRule::OwnEntries`]) more expert signals per combine tile than its counter holds.
    fn new(
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

/// The static passes: one dispatch of `MOE_PASS` per pass with tasks, each binding its ticket
/// range (one per uniform-offset step of one buffer) beside the program's `bindings`.
fn pass_dispatches(
    ctx: &Context,
    tasks: &MoeTasks,
    constants: &Constants,
    bindings: &[Binding<'_>],
) -> Result<Vec<Dispatch>> {
    let step = u64::from(ctx.limits().min_uniform_buffer_offset_alignment).max(PASS_RANGE_BYTES);
    let mut at = 0u32;
    let ranges: Vec<(u32, u32)> = tasks
        .pass_counts()
        .into_iter()
        .map(|count| {
            at += count;
            (at - count, count)
        })
        .filter(|&(_, count)| count > 0)
        .collect();
    let words = (step / 4) as usize;
    let mut range_words = vec![0u32; words * ranges.len()];
    for (i, &(first, count)) in ranges.iter().enumerate() {
        range_words[i * words..][..2].copy_from_slice(&[first, count]);
    }
    let range_buffer = ctx.uniform_bytes("moe pass ranges", bytemuck::cast_slice(&range_words))?;
    let pass_kernel = ctx.kernel(&MOE_PASS, constants)?;
    let mut passes = Vec::new();
    for (i, &(_, count)) in ranges.iter().enumerate() {
        let range =
            Binding { binding: 3, buffer: &range_buffer, size: PASS_RANGE_BYTES, offset: i as u64 * step };
        let b: Vec<Binding> = bindings.iter().cloned().chain([range]).collect();
        passes.push(ctx.dispatch(&pass_kernel, &b, ctx.grid(count.into(), "MoE task pass")?)?);
    }
    Ok(passes)
}

/// The program words: `header`, the selection bias and the shared gate's values (`bias`,
/// `gate`: f32 bits, each may be empty), then the task table (kind, index, dependencies, first consumer word, consumer count) in
/// ticket order, then the consumer lists.
fn encode(
    header: &mut Header,
    t: &MoeTasks,
    bias: &[u32],
    gate: &[u32],
    stall: Option<u32>,
) -> Result<Vec<u32>> {
    let (up_tiles, down_tiles, shared_tiles) = (header.up_tiles, header.down_tiles, header.shared_up_tiles);
    // A routed expert task's listed consumers, and what a combine tile waits for from the
    // `n` routed expert tasks: all of them by the list (rule 0), or RUN_TIME_NEED (rule 1:
    // signal_more in wgsl/dag/moe.wgsl).
    let own_entries = header.combine_rule == 1;
    let combiners =
        |combine0: u32| if own_entries { Vec::new() } else { (combine0..combine0 + t.combine).collect() };
    let routed_need = |n: u32| if own_entries { RUN_TIME_NEED } else { n };
    let mut table: Vec<TaskEntry> = Vec::new();
    let mut push = |kind, index, need, consumers| table.push(TaskEntry::new(kind, index, need, consumers));
    let layout0 = t.route;
    for r in 0..t.route {
        push(TaskKind::Route, r, 0, vec![layout0]);
    }
    match t.size {
        // Ticket order: route, layout, shared gate/up, gate/up, shared down, down, combine.
        TaskSize::Fine => {
            let shared_up0 = layout0 + t.layout;
            let up0 = shared_up0 + t.shared_up;
            let shared_down0 = up0 + t.up;
            let down0 = shared_down0 + t.shared_down;
            let combine0 = down0 + t.down;
            push(TaskKind::Layout, 0, t.route, (up0..up0 + t.up).collect());
            for i in 0..t.shared_up {
                let first = shared_down0 + i / shared_tiles * down_tiles;
                push(TaskKind::SharedUp, i, 0, (first..first + down_tiles).collect());
            }
            for i in 0..t.up {
                let first = down0 + i / up_tiles * down_tiles;
                push(TaskKind::Up, i, 1, (first..first + down_tiles).collect());
            }
            for i in 0..t.shared_down {
                push(TaskKind::SharedDown, i, shared_tiles, vec![combine0 + i / down_tiles]);
            }
            for i in 0..t.down {
                push(TaskKind::Down, i, up_tiles, combiners(combine0));
            }
            header.combine_first = combine0;
            let shared_need = if t.shared_down > 0 { down_tiles } else { 0 };
            for c in 0..t.combine {
                push(TaskKind::Combine, c, routed_need(t.down) + shared_need, Vec::new());
            }
        }
        // Ticket order: route, layout, shared tiles, expert tiles, combine.
        TaskSize::Coarse => {
            let shared0 = layout0 + t.layout;
            let expert0 = shared0 + t.shared;
            let combine0 = expert0 + t.expert;
            push(TaskKind::Layout, 0, t.route, (expert0..expert0 + t.expert).collect());
            for i in 0..t.shared {
                push(TaskKind::Shared, i, 0, vec![combine0 + i]);
            }
            for s in 0..t.expert {
                push(TaskKind::Expert, s, 1, combiners(combine0));
            }
            header.combine_first = combine0;
            for c in 0..t.combine {
                push(TaskKind::Combine, c, routed_need(t.expert) + u32::from(t.shared > 0), Vec::new());
            }
        }
    }
    // Every task waits for exactly the tasks that name it as a consumer.
    // (Rule 1's combine tiles: the listed signals are their shared tasks', past RUN_TIME_NEED.)
    let mut producers = vec![0u32; table.len()];
    for task in &table {
        for &c in &task.consumers {
            producers[c as usize] += 1;
        }
    }
    let listed = |task: &TaskEntry| match task.kind {
        TaskKind::Combine if own_entries => task.need - RUN_TIME_NEED,
        _ => task.need,
    };
    if let Some(i) = (0..table.len()).find(|&i| producers[i] != listed(&table[i])) {
        return Err(Error::invalid(format!(
            "MoE program task {i} waits for {} listed tasks but {} signal it (a moeflow bug)",
            listed(&table[i]),
            producers[i]
        )));
    }
    header.tasks = to_u32("tasks", table.len())?;
    let bias_len = to_u32("bias values", bias.len())?;
    if !bias.is_empty() {
        header.bias = HEADER_WORDS;
    }
    if !gate.is_empty() {
        header.shared_gate = HEADER_WORDS + bias_len;
    }
    header.task_off = HEADER_WORDS + bias_len + to_u32("shared gate values", gate.len())?;
    let mut words: Vec<u32> = bytemuck::cast_slice(&[*header]).to_vec();
    words.extend(bias);
    words.extend(gate);
    let cons_start = u64::from(header.task_off) + 5 * table.len() as u64;
    let mut cons: Vec<u32> = Vec::new();
    for (i, task) in table.iter().enumerate() {
        let stalled = stall.is_some_and(|s| s as usize == i);
        let first = cons_start + cons.len() as u64;
        words.extend([
            task.kind as u32,
            task.index,
            task.need + u32::from(stalled),
            to_u32("program words", usize::try_from(first).unwrap_or(usize::MAX))?,
            to_u32("consumers", task.consumers.len())?,
        ]);
        cons.extend(&task.consumers);
    }
    words.extend(cons);
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each region starts where the one before ends, with the lengths the kernel indexes by;
    /// the shared expert's regions are empty without one; past u32 words is an error naming
    /// the buffer.
    #[test]
    fn program_layout_regions_follow_one_another() {
        let (h, f, e, k) = (48u32, 40u32, 8u32, 2u32);
        for size in [TaskSize::Fine, TaskSize::Coarse] {
            for (tokens, fs) in [(1u32, 0u32), (37, 0), (37, 24), (9, 64)] {
                let shared = (fs > 0).then_some(fs);
                let tasks = MoeTasks::new(size, tokens, h, f, e, k, shared).unwrap();
                let l = ProgramLayout::new(&tasks, tokens, [h, f, e, k], fs).unwrap();
                let (slots, tile) = (tasks.slots, MOE_TILE);
                let what = format!("{size:?}, {tokens} tokens, Fs = {fs}");
                let total = u32::try_from(tasks.total()).unwrap();
                assert_eq!(l.counts, STATE_HEADER + total, "{what}: after the header and done-words");
                assert_eq!(
                    [l.bases - l.counts, l.row_entry - l.bases, l.tile_expert - l.row_entry],
                    [e, e, slots * tile],
                    "{what}"
                );
                assert_eq!(
                    [l.chunks - l.tile_expert, l.indices - l.chunks, l.state_len - l.indices],
                    [slots, QUEUE_LANES * e, tokens * k],
                    "{what}"
                );
                assert_eq!(
                    [l.weights, l.rows_h - l.weights, l.partial - l.rows_h, l.shared_h - l.partial],
                    [0, tokens * k, slots * tile * f, tokens * k * h],
                    "{what}"
                );
                let shared_rows = tokens.next_multiple_of(tile) * fs;
                let shared_out = if fs > 0 { tokens * h } else { 0 };
                assert_eq!(
                    [l.shared_out - l.shared_h, l.work_len - l.shared_out],
                    [shared_rows, shared_out],
                    "{what}"
                );
            }
        }
        let tokens = 1 << 24;
        let tasks = MoeTasks::new(TaskSize::Fine, tokens, 4096, 64, 8, 8, None).unwrap();
        let err = ProgramLayout::new(&tasks, tokens, [4096, 64, 8, 8], 0).unwrap_err().to_string();
        assert!(err.contains("MoE program work values"), "{err}");
    }
}
