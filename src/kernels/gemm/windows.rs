//! The x windows the window kernels read: how a pass's rows split into uniform-buffer
//! windows ([`Windows`]), the spans of rows each dispatch covers, and the bound on the windows'
//! bytes over every pass of a forward.

use super::policy::AdapterKind;
use super::specs::WINDOW_BYTES;
use super::variant::{GemmVariant, LaneBlock};
use crate::context::Context;

/// Where a window pass keeps its x rows: `count` uniform windows of `rows` rows each,
/// `stride` bytes apart, row r of a window at vec4 `r * ceil(K / 4)`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Windows {
    pub(super) rows: u32,
    pub(super) count: u32,
    pub(super) stride: u64,
}

impl Windows {
    /// The windows of a pass of `rows` rows of `kdim` values with blocks of `block_rows`, or
    /// None where they cannot be had: the device's uniform bindings are smaller than a window,
    /// a window holds fewer than `block_rows` rows of K, or the windows together are past one
    /// storage binding or buffer.
    pub(super) fn fit(ctx: &Context, rows: u32, kdim: u32, block_rows: u32) -> Option<Self> {
        let limits = ctx.limits();
        if limits.max_uniform_buffer_binding_size < WINDOW_BYTES {
            return None;
        }
        let windows = Self::layout(rows, kdim, block_rows, limits.min_uniform_buffer_offset_alignment)?;
        let bytes = windows.bytes();
        (bytes <= limits.max_storage_buffer_binding_size && bytes <= limits.max_buffer_size)
            .then_some(windows)
    }

    /// The windows of a pass of `rows` rows of `kdim` values with blocks of `block_rows`,
    /// bound at multiples of `offset_alignment` bytes, whatever the device's buffer limits; None
    /// where a window holds fewer than `block_rows` rows of K.
    pub(super) fn layout(rows: u32, kdim: u32, block_rows: u32, offset_alignment: u32) -> Option<Self> {
        if rows == 0 || kdim == 0 {
            return None;
        }
        let row_bytes = u64::from(kdim.div_ceil(4)) * 16;
        let fit = WINDOW_BYTES / row_bytes;
        let block = u64::from(block_rows);
        // A window holds whole blocks, and no more rows than the pass has.
        let per_window = (fit / block * block).min(u64::from(rows).div_ceil(block) * block);
        if per_window == 0 {
            return None;
        }
        let align = u64::from(offset_alignment.max(16));
        let stride = (per_window * row_bytes).div_ceil(align) * align;
        let count = u64::from(rows).div_ceil(per_window);
        Some(Windows { rows: u32::try_from(per_window).ok()?, count: u32::try_from(count).ok()?, stride })
    }

    /// What runs `variant` on a pass of `rows` rows of `kdim` values: a window (or texture) variant with its
    /// windows where a window holds one of its blocks; else the same variant with half the rows
    /// and twice the columns per block (at most [`AdapterKind::max_block_cols`]; never fewer
    /// than it had), down to 8 rows, where a window holds that block (it still
    /// divides the dispatch tile; on lavapipe an 8-row window block is still about 1.5x the
    /// 16-row direct one, its x loads being broadcasts); else the direct variant of the
    /// original block. Other variants as they are. Every choice computes the same operations in
    /// the same order.
    pub(super) fn choose(
        ctx: &Context,
        variant: GemmVariant,
        rows: u32,
        kdim: u32,
    ) -> (GemmVariant, Option<Self>) {
        let (GemmVariant::Window(block) | GemmVariant::Texture(block)) = variant else {
            return (variant, None);
        };
        let max_cols = AdapterKind::of(ctx.adapter()).max_block_cols().max(block.cols);
        let (mut r, mut c) = (block.rows, block.cols);
        loop {
            if let Some(w) = Windows::fit(ctx, rows, kdim, r) {
                return (variant.with_block(LaneBlock { rows: r, cols: c, ..block }), Some(w));
            }
            if r / 2 < 8 {
                return (variant.without_window(), None);
            }
            (r, c) = (r / 2, (c * 2).min(max_cols));
        }
    }

    /// The window stride in vec4.
    pub(super) fn stride4(&self) -> u32 {
        // The stride is at most a window plus its alignment, far below u32.
        (self.stride / 16) as u32
    }

    /// Bytes of the windows' buffer (the last window is bound whole).
    pub(super) fn bytes(&self) -> u64 {
        u64::from(self.count - 1) * self.stride + WINDOW_BYTES
    }
}

/// The most bytes of x windows any pass of `passes` (rows, K) stages with `variants` on a
/// device with `limits`: over every block [`Windows::choose`] can pick for a window variant
/// (its block rows, halved down to 8) and the single rows of the row-wise passes beside window
/// kernels, where those windows fit the device. None where no variant reads windows or no
/// windows fit. Every pass of a forward stages into one region of this size, one pass after
/// another.
pub(crate) fn window_bytes_bound(
    variants: &[GemmVariant],
    passes: &[(u32, u32)],
    limits: &wgpu::Limits,
) -> Option<u64> {
    if limits.max_uniform_buffer_binding_size < WINDOW_BYTES {
        return None;
    }
    let fits =
        |bytes: u64| bytes <= limits.max_storage_buffer_binding_size && bytes <= limits.max_buffer_size;
    let mut blocks = vec![1];
    for v in variants.iter().filter(|v| v.reads_windows()) {
        let mut r = v.block_rows();
        while r >= 8 {
            blocks.push(r);
            r /= 2;
        }
    }
    if blocks.len() == 1 {
        return None;
    }
    let align = limits.min_uniform_buffer_offset_alignment;
    passes
        .iter()
        .flat_map(|&(rows, kdim)| blocks.iter().filter_map(move |&r| Windows::layout(rows, kdim, r, align)))
        .map(|w| w.bytes())
        .filter(|&b| fits(b))
        .max()
}

/// The rows one dispatch of a pass computes: `row0 .. row0 + rows`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    pub(super) row0: u32,
    pub(super) rows: u32,
}

impl Span {
    /// Its rows below `rows` (a pass's last window can reach past the pass's rows).
    pub(super) fn covered(self, rows: u32) -> u32 {
        self.rows.min(rows.saturating_sub(self.row0))
    }
}
