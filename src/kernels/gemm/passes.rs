//! Passes: one projection of a set of rows through one weight tensor (two for the fused
//! gate/up), by a block GEMM variant or the row-wise kernel: what a pass computes, its rows,
//! its parameters and constants, and how its dispatches follow a plan's live token count. The
//! dispatches themselves (per weight chunk and per x window) are made in `passes/dispatches.rs`.

use std::mem::offset_of;

use super::windows::Span;

use super::ffn::{Activation, ExpertFfn};
use super::params::{FLAG_GATHER, FLAG_IDENTITY_ROWS, FLAG_OUT_ENTRY, Params};
use super::variant::GemmOrder;
use super::weights::ExpertWeights;
use crate::error::Result;
use crate::kernels::dispatch::DispatchLayout;
use crate::live::{LiveCount, LiveGrid, Sizing};
use crate::pipeline::{BufferView, KernelSpec};
use crate::shader::Override;

mod dispatches;

/// What a pass computes (the kernels' `SWIGLU`, `FLAG_GATHER` and `FLAG_OUT_ENTRY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PassKind {
    /// The fused gate/up projection into activation rows, each row's x gathered from its
    /// entry's token: `act[row] = activation(x . gate, x . up)`.
    GateUp,
    /// The down projection of activation rows into their entries' rows: `partial[entry]`.
    DownToEntries,
    /// One projection, row to row, no activation (dense GEMMs, the all-experts oracle's down).
    Plain,
}

/// How a pass numbers its rows (`FLAG_IDENTITY_ROWS`).
#[derive(Clone, Copy, Debug)]
pub(super) enum RowMap<'a> {
    /// Row r is entry `rows[r]`: a dispatch layout's permutation, a bucket's slots or the
    /// overflow list.
    Listed(BufferView<'a>),
    /// Row r is entry r; the kernels' rows binding takes this placeholder, which they do not
    /// read.
    Identity(BufferView<'a>),
}

impl<'a> RowMap<'a> {
    /// What the rows binding takes.
    fn view(&self) -> BufferView<'a> {
        match *self {
            RowMap::Listed(v) | RowMap::Identity(v) => v,
        }
    }
}

/// One projection of a set of rows through one weight tensor (two for gate/up), as one or more
/// dispatches (per weight chunk, per x window). Made by its constructors only, so its flags
/// follow from its kind.
#[derive(Clone, Copy)]
pub(super) struct Pass<'a> {
    order: GemmOrder,
    kind: PassKind,
    rows: RowMap<'a>,
    x: BufferView<'a>,
    w: &'a ExpertWeights,
    w_up: &'a ExpertWeights,
    out: BufferView<'a>,
    pub(super) params: Params,
    /// `params.rows` and `params.row_offset` as functions of a plan's live token count.
    live: LiveRows,
    /// The activation of a SwiGLU pass.
    activation: Activation,
    /// Biases: `[E, N, 2]` (gate, up) pairs in a SwiGLU pass, else `[E, N]`.
    bias: Option<&'a wgpu::Buffer>,
}

impl<'a> Pass<'a> {
    /// The fused gate/up projection of `ffn` over `rows` (`params` with its N and K set from
    /// the FFN's shape): `act[row] = activation(x . gate, x . up)`, x gathered from each row's
    /// entry's token.
    pub(super) fn gate_up(
        ffn: &'a ExpertFfn,
        order: GemmOrder,
        params: Params,
        x: BufferView<'a>,
        rows: RowMap<'a>,
        act: BufferView<'a>,
        live: LiveRows,
    ) -> Self {
        Pass {
            order,
            kind: PassKind::GateUp,
            rows,
            x,
            w: &ffn.gate,
            w_up: &ffn.up,
            out: act,
            params: Params { n: ffn.ffn(), kdim: ffn.hidden(), ..params },
            live,
            activation: ffn.activation,
            bias: ffn.bias.as_ref().map(|b| &b.gate_up),
        }
    }

    /// [`Self::gate_up`] over the padded rows of a dispatch layout (its tiles name their
    /// experts).
    pub(super) fn grouped_gate_up(
        ffn: &'a ExpertFfn,
        order: GemmOrder,
        params: Params,
        x: BufferView<'a>,
        layout: &'a DispatchLayout,
        act: BufferView<'a>,
    ) -> Self {
        let entries = LiveCount::tokens().times(layout.config().k);
        let live = LiveRows::new(layout.live_padded_rows(entries));
        let mut p = Self::gate_up(ffn, order, params, x, RowMap::Listed(layout.perm()), act, live);
        p.params.rows = layout.max_rows();
        p.params.tile_rows = layout.config().tile;
        p
    }

    /// The down projection of `ffn` over the rows of `up`: reads `act[row]`, writes
    /// `partial[entry]`.
    pub(super) fn down(
        up: &Pass<'a>,
        ffn: &'a ExpertFfn,
        act: BufferView<'a>,
        partial: BufferView<'a>,
    ) -> Self {
        Pass {
            kind: PassKind::DownToEntries,
            x: act,
            w: &ffn.down,
            w_up: &ffn.down,
            out: partial,
            params: Params { n: ffn.hidden(), kdim: ffn.ffn(), ..up.params },
            bias: ffn.bias.as_ref().map(|b| &b.down),
            ..*up
        }
    }

    /// [`Self::down`] writing row to row (`out[row]`) instead of to the entries.
    pub(super) fn down_to_rows(
        up: &Pass<'a>,
        ffn: &'a ExpertFfn,
        act: BufferView<'a>,
        out: BufferView<'a>,
    ) -> Self {
        Pass { kind: PassKind::Plain, ..Self::down(up, ffn, act, out) }
    }

    /// A dense GEMM `y[rows, N] = x[rows, K] . w^T` of the one matrix `w` (expert 0),
    /// `placeholder` bound as the unread rows list.
    pub(super) fn dense(
        order: GemmOrder,
        w: &'a ExpertWeights,
        x: BufferView<'a>,
        y: BufferView<'a>,
        params: Params,
        placeholder: BufferView<'a>,
    ) -> Self {
        Pass {
            order,
            kind: PassKind::Plain,
            rows: RowMap::Identity(placeholder),
            x,
            w,
            w_up: w,
            out: y,
            params,
            live: LiveRows::new(LiveCount::tokens()),
            activation: Activation::Swiglu,
            bias: None,
        }
    }

    /// Whether this is the fused gate/up (SwiGLU) projection.
    fn swiglu(&self) -> bool {
        self.kind == PassKind::GateUp
    }

    fn constants(&self) -> Vec<(Override, f64)> {
        let bias = match (self.bias, self.swiglu()) {
            (None, _) => 0.0,
            (Some(_), false) => 1.0,
            (Some(_), true) => 2.0,
        };
        // One constant for both bound weights (w_up is w outside SwiGLU): narrow when both are.
        let narrow = self.w.narrow_scales && self.w_up.narrow_scales;
        let mut c = vec![
            (Override::Dtype, self.w.dtype.code()),
            (Override::NarrowScales, f64::from(u8::from(narrow))),
            (Override::Swiglu, f64::from(u8::from(self.swiglu()))),
            (Override::Bias, bias),
        ];
        c.extend(self.activation.constants());
        c
    }

    /// How a dispatch of this pass with `grid` follows the live count: its rows and first row
    /// do.
    fn sizing(&self, grid: LiveGrid) -> Sizing {
        Sizing::new(grid)
            .field(offset_of!(Params, rows), self.live.rows.value())
            .field(offset_of!(Params, row_offset), self.live.row_offset.value())
    }

    /// How a dispatch of this pass over `span` (one x window, or the whole pass) follows the
    /// live count: as [`Self::sizing`], its grid over the span's rows up to the count (`per_row`
    /// says how the kernel covers rows); a window's dispatch runs once the count reaches it.
    fn span_sizing(&self, spec: &KernelSpec, span: Span, windowed: bool, per_row: PerRow) -> Result<Sizing> {
        let rows = self.live.rows;
        let grid = match per_row {
            PerRow::Block(block_rows) => {
                LiveGrid::X(rows.beyond(span.row0, block_rows).at_most(span.rows.div_ceil(block_rows)))
            }
            PerRow::Invocations(lanes) => {
                let cap = spec.groups(u64::from(span.rows) * u64::from(lanes))?;
                let groups = spec.live_groups_beyond(rows.times(lanes), span.row0.saturating_mul(lanes))?;
                LiveGrid::Spilled(groups.at_most(u32::try_from(cap).unwrap_or(u32::MAX)))
            }
        };
        let s = self.sizing(grid);
        Ok(match windowed {
            true => s.once_above(rows, span.row0),
            false => s,
        })
    }

    /// The uniform parameters with the FLAG_* bits of this pass and `extra`.
    fn params_flagged(&self, extra: u32) -> Params {
        let bit = |on: bool, f: u32| if on { f } else { 0 };
        let flags = bit(self.kind == PassKind::GateUp, FLAG_GATHER)
            | bit(self.kind == PassKind::DownToEntries, FLAG_OUT_ENTRY)
            | bit(matches!(self.rows, RowMap::Identity(_)), FLAG_IDENTITY_ROWS)
            | extra;
        Params { flags, ..self.params }
    }
}

/// A pass's rows and first row (`Params::rows`, `Params::row_offset`) as functions of a plan's
/// live token count.
#[derive(Clone, Copy, Debug)]
pub(super) struct LiveRows {
    rows: LiveCount,
    row_offset: LiveCount,
}

impl LiveRows {
    /// `rows` rows from row 0.
    pub(super) fn new(rows: LiveCount) -> Self {
        LiveRows { rows, row_offset: LiveCount::constant(0) }
    }

    /// The same rows from `row_offset` on.
    pub(super) fn offset(self, row_offset: LiveCount) -> Self {
        LiveRows { row_offset, ..self }
    }
}

/// How a pass's kernel covers its rows.
#[derive(Clone, Copy, Debug)]
pub(super) enum PerRow {
    /// One x workgroup per block of this many rows.
    Block(u32),
    /// This many invocations per row, in 1-D workgroups.
    Invocations(u32),
}
