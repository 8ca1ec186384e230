//! [`MoeProgram`]: a layer's program built for a token count (its buffers, header and task
//! words uploaded once), which layers it supports, and its dispatches: one persistent queue
//! or one per static pass.

use super::super::queue::{QUEUE_LANES, QueueOptions, QueueStatus, STATE_HEADER};
use super::bindings::{SharedMatrices, whole, whole_binding};
use super::encode::encode;
use super::header::Header;
use super::layout::ProgramLayout;
use super::shaders::{MOE_PASS, MOE_PERSISTENT, MOE_RESET, PASS_RANGE_BYTES};
use super::tasks::{MoeTasks, TaskShape};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::gemm::Activation;
use crate::kernels::routing::{PARAMS_BYTES as ROUTE_PARAMS_BYTES, route_params};
use crate::layer::{CallerOutputs, Capacity, ForwardIo, MoeLayer};
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::Access::{Read, ReadWrite};
use crate::pipeline::{Binding, Constants, Dispatch};
use crate::shader::Override;
use crate::tensor::word_bytes;

/// Why `layer` has no task form on `ctx`, if it has none: the program runs dropless layers
/// (no capacity bound) from unsplit weights, and binds 10 storage buffers.
pub fn unsupported(ctx: &Context, layer: &MoeLayer) -> Option<String> {
    layer_unsupported(layer).or_else(|| storage_limit(ctx).err().map(|e| e.to_string()))
}

/// Why `layer` has no task form on any device, if it has none.
pub(super) fn layer_unsupported(layer: &MoeLayer) -> Option<String> {
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
pub(super) fn storage_limit(ctx: &Context) -> Result<()> {
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
/// persistent-queue dispatch (with a state reset) or as the static passes
/// [`passes`](super::passes), both with the same task bodies on the same buffers: each writes `y`
/// and the program's own top-k indices and weights.
#[derive(Debug)]
pub struct MoeProgram {
    pub(super) queue: Option<Vec<Dispatch>>,
    pub(super) passes: Vec<Dispatch>,
    pub(super) state: wgpu::Buffer,
    pub(super) work: wgpu::Buffer,
    pub(super) indices: u32,
    pub(super) entries: usize,
    pub(super) tasks: MoeTasks,
    pub(super) queue_label: Option<String>,
}

impl MoeProgram {
    /// Builds the program for a forward of `layer` from `io`'s `x[tokens, H]` into its
    /// `y[tokens, H]` with tasks of `shape`: its static passes, and the queue with
    /// `queue`'s options where given. The probe
    /// is not consulted here (see [`LayerRun`](super::super::layer::LayerRun)).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] on a device with fewer than 10 storage buffers per stage;
    /// [`Error::InvalidArgument`] where [`unsupported`] gives another reason, for routing results
    /// or logits asked of `io` (the program keeps them in its own state: [`Self::read_routing`]),
    /// for zero tokens or workers, or a stall task past the tasks; [`Error::LimitExceeded`] for
    /// more workers than a dispatch can have, sizes past u32 indices and binding limits, or (with
    /// [`CombineRule::OwnEntries`](super::CombineRule::OwnEntries)) more expert signals per combine
    /// tile than its counter leaves room for (8·k·ceil(H/64) of 2^24); [`Error::Shape`] for x or y
    /// not of the layer's shape; device errors.
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
    pub(super) fn tasks_for(
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

    /// The static passes' dispatches, one per non-empty pass of [`passes`](super::passes), in order (record
    /// them in one compute pass: each dispatch sees the writes of the ones before it).
    pub fn pass_dispatches(&self) -> &[Dispatch] {
        &self.passes
    }

    /// The tasks of one run, by kind.
    pub fn tasks(&self) -> MoeTasks {
        self.tasks
    }

    /// What the program runs: the queue where it was asked for (e.g. `queue (fine MoE tasks, 8
    /// workers)`), else the static passes (e.g. `5 static passes of fine MoE tasks`).
    pub fn label(&self) -> String {
        self.queue_label.clone().unwrap_or_else(|| self.passes_label())
    }

    /// What the static passes run, e.g. `5 static passes of fine MoE tasks`.
    pub(crate) fn passes_label(&self) -> String {
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
        QueueStatus::read(ctx, &self.state, u32::try_from(self.tasks.total()).unwrap_or(u32::MAX))
    }
}

/// The static passes: one dispatch of `MOE_PASS` per pass with tasks, each binding its ticket
/// range (one per uniform-offset step of one buffer) beside the program's `bindings`.
pub(super) fn pass_dispatches(
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

#[cfg(test)]
mod tests {
    use super::super::tasks::{MOE_TILE, TaskSize};
    use super::*;

    /// Each region starts where the one before ends, with the lengths the kernel indexes by;
    /// the shared expert's regions are empty without one; past u32 words is an error naming
    /// the buffer.
    #[test]
    pub(super) fn program_layout_regions_follow_one_another() {
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
