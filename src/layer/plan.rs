//! Planning a forward of a [`MoeLayer`]: its scratch layout, the tensors it reads and writes,
//! and each stage's dispatches (no submission).

use super::config::Capacity;
use super::forward::{ForwardPlan, ForwardStage};
use super::io::{CallerOutputs, ForwardIo};
use super::moe_layer::MoeLayer;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::kernels::combine::{CombineBuffers, Shared, plan_combine, plan_fill_zero_per_token};
use crate::kernels::dispatch::{BucketConfig, BucketLayout, DispatchConfig, DispatchLayout, OverflowPolicy};
use crate::kernels::gemm::{
    DenseKernel, FfnBuffers, FfnRouting, plan_dense_ffn_in, plan_dense_in, plan_ffn_in,
};
use crate::kernels::routing::{RouteBuffers, plan_route};
use crate::kernels::sizing::plan_sizing;
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::{BufferView, Dispatch};
use crate::size;
use crate::tensor::{DType, Tensor};
use crate::workspace::{Region, Scratch, Workspace, WorkspaceLayout};

impl MoeLayer {
    /// The [`ForwardIo`] of `x[tokens, H]` and `y[tokens, H]` (f32) at the start of `x` and `y`
    /// (whole buffers or views), the routing results and logits in the workspace.
    ///
    /// # Errors
    /// As [`Tensor::new`].
    pub fn io<'b>(
        &self,
        x: impl Into<BufferView<'b>>,
        y: impl Into<BufferView<'b>>,
        tokens: u32,
    ) -> Result<ForwardIo<'b>> {
        let shape = [tokens, self.cfg.route.hidden];
        Ok(ForwardIo::new(
            Tensor::named("x", x.into(), shape, DType::F32)?,
            Tensor::named("y", y.into(), shape, DType::F32)?,
        ))
    }

    /// Plans forwards of up to `T` tokens from `x[T, H]` into `y[T, H]` (and the routing
    /// results or logits into the caller's tensors where `io` gives them; see [`ForwardIo`]).
    /// The tensors are views of whole buffers or of an activation arena (x and y may swap roles
    /// between layers; a view gives the bits of a buffer of its own). Each forward runs the
    /// live count of [`ForwardPlan::set_live_tokens`] (T until set) on the first rows, with the
    /// bits of a plan made for exactly that count. The plan's scratch is its own, a buffer per
    /// region of [`Self::workspace_for`]; [`Self::plan_in`] takes it from the caller's buffer
    /// instead.
    ///
    /// # Errors
    /// [`Error::Shape`] naming a tensor whose shape or element type is not the layer's
    /// ([`ForwardIo`]); [`Error::InvalidArgument`] for x without rows, logits asked of a route
    /// mode that does not write them, or a tensor at an offset the device cannot bind;
    /// [`Error::LimitExceeded`] for sizes past u32 indices or the adapter's limits; the stages'
    /// planning errors.
    pub fn plan(&self, ctx: &Context, io: ForwardIo<'_>) -> Result<ForwardPlan> {
        let workspace = Workspace::own(ctx, &self.workspace_for(ctx, &io)?)?;
        // `workspace_for` checked `io`.
        self.plan_checked(ctx, &io, &workspace)
    }

    /// [`Self::plan`] with its scratch in `workspace`: a [`Workspace`] made from the caller's
    /// buffer ([`Workspace::new`]) with [`Self::workspace`]'s layout for at least the plan's
    /// maximum token count (or [`Self::workspace_for`]'s, or a layout merged with one). Layers
    /// that run one after another can share one workspace, and x and y can lie in its buffer
    /// beside it: a forward reads nothing in the workspace that it did not write. What it holds
    /// after a forward ([`ForwardPlan::indices`], [`ForwardPlan::load`]) is that forward's until
    /// the next forward that shares it.
    ///
    /// # Errors
    /// As [`Self::plan`]; [`Error::InvalidArgument`] for a workspace without a region this plan
    /// takes, or one too small.
    pub fn plan_in(&self, ctx: &Context, io: ForwardIo<'_>, workspace: &Workspace) -> Result<ForwardPlan> {
        io.check(&self.cfg)?;
        self.plan_checked(ctx, &io, workspace)
    }

    /// The scratch a plan for up to `max_tokens` tokens takes on `ctx`: its regions, the bytes
    /// of a buffer holding them all and their alignment (see [`Self::plan_in`]). Only what
    /// this configuration runs: no logits unless the route mode writes them, no shared-expert
    /// regions without one, the dispatch layout only where counts take the grouped path.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero tokens; [`Error::LimitExceeded`] for sizes past u32
    /// indices.
    pub fn workspace(&self, ctx: &Context, max_tokens: u32) -> Result<WorkspaceLayout> {
        check_max_tokens(max_tokens)?;
        self.layout(ctx, max_tokens, CallerOutputs::default())
    }

    /// [`Self::workspace`] for a plan of `io`: for its maximum token count, without the regions
    /// of the results it writes to the caller's tensors.
    ///
    /// # Errors
    /// As [`Self::plan`] for `io`'s tensors; as [`Self::workspace`].
    pub fn workspace_for(&self, ctx: &Context, io: &ForwardIo<'_>) -> Result<WorkspaceLayout> {
        io.check(&self.cfg)?;
        self.layout(ctx, io.max_tokens(), io.caller_outputs())
    }

    fn layout(&self, ctx: &Context, max_tokens: u32, caller: CallerOutputs) -> Result<WorkspaceLayout> {
        let kernels = self.experts.kernels(ctx);
        self.cfg.workspace_layout(
            max_tokens,
            &[kernels.up, kernels.down],
            self.dispatch_tile(ctx),
            &ctx.device().limits(),
            caller,
        )
    }

    /// Plans a forward of `io` (checked against the layer by the caller) with its scratch taken
    /// from `workspace`.
    fn plan_checked(&self, ctx: &Context, io: &ForwardIo<'_>, workspace: &Workspace) -> Result<ForwardPlan> {
        let c = &self.cfg;
        let (max_tokens, x, y) = (io.max_tokens(), io.x.view(), io.y.view());
        let entries = size::u32_product("max_tokens * k", max_tokens, c.route.k, "u32 entries")?;
        // x is read; y, the caller's routing tensors and every workspace region are written:
        // none of them may share a byte with another.
        let mut views = vec![("x", x, Use::Read), ("y", y, Use::Write)];
        if let Some((i, w)) = io.routing {
            views.extend([("indices", i.view(), Use::Write), ("weights", w.view(), Use::Write)]);
        }
        views.extend(io.logits.map(|l| ("logits", l.view(), Use::Write)));
        views.extend(workspace.views().map(|(key, view)| (key.label(), view, Use::Write)));
        check_disjoint(&views)?;
        // Every region was sized and checked against the binding limit before any was made, and
        // the layout holds nothing this configuration does not use.
        let scratch = Scratch::Laid(ctx, workspace);
        let (indices, weights) = match io.routing {
            Some((i, w)) => (Region::of(i.view()), Region::of(w.view())),
            None => {
                let [indices, weights] = c.routing_regions(max_tokens)?;
                (scratch.take(indices)?, scratch.take(weights)?)
            }
        };
        let logits = match (c.route_mode.writes_logits(), io.logits) {
            (true, Some(l)) => Some(Region::of(l.view())),
            (true, None) => Some(scratch.take(c.logits_region(max_tokens)?)?),
            (false, _) => None,
        };
        let partial = scratch.take(c.outputs_region(max_tokens)?)?;
        let mut stages = Vec::new();
        let route_bufs = RouteBuffers {
            x,
            gate: &self.router,
            bias: self.bias.as_ref(),
            logits: logits.as_ref().map(Region::view),
            indices: indices.view(),
            weights: weights.view(),
        };
        stages.push((
            ForwardStage::Route,
            plan_route(ctx, &c.route, max_tokens, &route_bufs, c.route_mode)?.into_dispatches(),
        ));
        let ffn_bufs = FfnBuffers { x, indices: indices.view(), partial: partial.view() };
        let (mut layout, mut buckets) = (None, None);
        // The decode path for the counts that take it, the grouped path past them.
        let decode_until = c.decode_until(max_tokens);
        let decode = |counts| -> Result<Vec<Dispatch>> {
            let ds =
                plan_ffn_in(scratch, &self.experts, decode_until, c.route.k, &ffn_bufs, FfnRouting::Decode)?;
            Ok(only_for(ds.into_dispatches(), counts))
        };
        match c.capacity {
            Capacity::Dropless if decode_until == max_tokens => {
                stages.push((ForwardStage::Experts, decode(0..=u32::MAX)?));
            }
            Capacity::Dropless => {
                let l = DispatchLayout::with_scratch(
                    scratch,
                    DispatchConfig { experts: c.route.experts, k: c.route.k, tile: self.dispatch_tile(ctx) },
                    max_tokens,
                    0,
                )?;
                let grouped = decode_until + 1..=u32::MAX;
                stages
                    .push((ForwardStage::Dispatch, only_for(l.plan(ctx, indices.view())?, grouped.clone())));
                let mut ds = decode(0..=decode_until)?;
                let ffn = plan_ffn_in(
                    scratch,
                    &self.experts,
                    max_tokens,
                    c.route.k,
                    &ffn_bufs,
                    FfnRouting::Grouped(&l),
                )?;
                ds.extend(only_for(ffn.into_dispatches(), grouped));
                stages.push((ForwardStage::Experts, ds));
                layout = Some(l);
            }
            Capacity::Bounded { bound, policy } => {
                let cfg = BucketConfig { n_caps: c.route.experts, bound, policy };
                let b = BucketLayout::with_scratch(scratch, cfg, entries)?.with_winners_per_token(c.route.k);
                let mut ds = b.plan(ctx, indices.view())?;
                if policy == OverflowPolicy::Drop {
                    let row = c.route.k * c.route.hidden;
                    ds.push(plan_fill_zero_per_token(ctx, partial.view(), entries * c.route.hidden, row)?);
                }
                stages.push((ForwardStage::Dispatch, ds));
                let routing = FfnRouting::Bucketed(&b);
                stages.push((
                    ForwardStage::Experts,
                    plan_ffn_in(scratch, &self.experts, max_tokens, c.route.k, &ffn_bufs, routing)?
                        .into_dispatches(),
                ));
                buckets = Some(b);
            }
        }
        let mut shared = None;
        if let Some(s) = &self.shared {
            let rows = scratch.take(c.shared_output_region(max_tokens)?)?;
            let mut ds = plan_dense_ffn_in(scratch, s, max_tokens, x, rows.view())?.into_dispatches();
            let gate_logits = match &self.shared_gate {
                Some(g) => {
                    let gl = scratch.take(c.shared_gate_logits_region(max_tokens)?)?;
                    let (kernel, order) = (DenseKernel::Rowwise, c.gemm_order);
                    ds.extend(
                        plan_dense_in(scratch, g, max_tokens, x, gl.view(), kernel, order)?.into_dispatches(),
                    );
                    Some(gl)
                }
                None => None,
            };
            stages.push((ForwardStage::Shared, ds));
            shared = Some((rows, gate_logits));
        }
        let shared = shared.as_ref().map(|(rows, gate_logits)| Shared {
            rows: rows.view(),
            gate_logits: gate_logits.as_ref().map(Region::view),
        });
        let combine = CombineBuffers { weights: weights.view(), partial: partial.view(), shared, y };
        stages.push((
            ForwardStage::Combine,
            plan_combine(ctx, max_tokens, c.route.hidden, c.route.k, &combine, c.combine)?,
        ));
        let live = ctx.upload("live tokens", &[max_tokens])?;
        let counts = ctx.upload("token counts", &(0..=max_tokens).collect::<Vec<u32>>())?;
        let mut all: Vec<&mut Dispatch> = stages.iter_mut().flat_map(|(_, ds)| ds.iter_mut()).collect();
        let sizing = plan_sizing(ctx, &live, max_tokens, &mut all)?;
        if !sizing.is_empty() {
            stages.insert(0, (ForwardStage::Size, sizing));
        }
        Ok(ForwardPlan {
            max_tokens,
            live,
            counts,
            decode_until,
            k: c.route.k,
            experts: c.route.experts,
            stages,
            indices,
            weights,
            #[cfg(not(target_arch = "wasm32"))]
            partial,
            logits,
            layout,
            buckets,
        })
    }
}

/// A plan's maximum token count: at least 1.
fn check_max_tokens(max_tokens: u32) -> Result<()> {
    match max_tokens {
        0 => Err(Error::invalid("a plan needs a maximum token count of at least 1")),
        _ => Ok(()),
    }
}

/// `dispatches`, each run only at live counts in `counts` (and where it ran before).
fn only_for(mut dispatches: Vec<Dispatch>, counts: std::ops::RangeInclusive<u32>) -> Vec<Dispatch> {
    for d in &mut dispatches {
        d.run_only_for(counts.clone());
    }
    dispatches
}
