//! Scratch memory of plans: what a forward writes and reads again within itself (routing
//! results, the dispatch layout, expert activations and outputs, staged x windows), as
//! [`Region`]s of buffers.
//!
//! A kernel planner takes each region by its [`ScratchKey`]: either a zero-filled buffer of its
//! own (for plans made one at a time) or the region a [`WorkspaceLayout`] set aside for that
//! key in a [`Workspace`]: one caller's buffer cut at aligned offsets, or one buffer per key.
//!
//! wgpu (like WebGPU) tracks usage per buffer, not per range: within one dispatch a buffer is
//! either only read (as read-only storage, or uniform) or bound only as read-write storage. So
//! every kernel declares the storage bindings that can hold a region, x or y as `read_write`
//! (weights and parameters stay read-only), and x, y and the regions can share one buffer. The x
//! windows, which the window kernels read as uniform, are a buffer of the workspace's own. A layer
//! computes its layout once (`MoeConfig::workspace_layout`), and both its plan and its device
//! requirements read it; each region's size is a `RegionSize` made by one function of its family,
//! which the layout pushes and the planner takes, so the sizes have one source. Nothing in a
//! workspace is read before a forward writes it, so layers that run one after another can share one
//! workspace whatever it held before.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::pipeline::{Binding, BufferView};
use crate::size;
use crate::tensor::WORD_BYTES;

/// A region's key and its size in bytes, made by the one sizing function of its family (the
/// layer's routing results and outputs in `layer/workspace.rs`, the dispatch layout's in
/// `kernels/dispatch`, the activations in `kernels/gemm/plan.rs`): a layout pushes it and a
/// planner takes it, so neither recomputes the other's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RegionSize {
    /// The region.
    pub(crate) key: ScratchKey,
    /// Its size in bytes.
    pub(crate) bytes: u64,
}

impl RegionSize {
    /// `key` holding the product of `counts` 32-bit words.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] where the product overflows 64 bits.
    pub(crate) fn words(key: ScratchKey, counts: &[u64]) -> Result<Self> {
        let mut factors = counts.to_vec();
        factors.push(WORD_BYTES);
        Ok(RegionSize { key, bytes: size::product(&format!("workspace region {key:?}"), &factors)? })
    }
}

/// A scratch region's identity: its name (also its buffers' label), which the family that
/// owns the region declares once, as an associated constant in its own file beside the region's
/// sizing function (`ScratchKey::TOPK_INDICES` in `layer/workspace.rs`, `ScratchKey::ACTIVATIONS`
/// in `kernels/gemm/plan.rs`, the dispatch and bucket layouts' in `kernels/dispatch/`). This
/// module names one, [`Self::X_WINDOWS`], the region it keeps in a buffer of its own. Names are
/// unique (`src/house.rs` checks).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ScratchKey(&'static str);

impl ScratchKey {
    /// x rows staged into uniform windows for the window kernels (every pass of a forward stages
    /// into the same region, one pass after another; a buffer of the workspace's own, not a
    /// region of the caller's).
    pub const X_WINDOWS: ScratchKey = ScratchKey::new("gemm x windows");

    /// The key named `label`.
    pub(crate) const fn new(label: &'static str) -> Self {
        ScratchKey(label)
    }

    /// The buffer label of this region.
    pub fn label(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Debug for ScratchKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// Bytes `[offset, offset + size)` of a buffer, held by the plan that binds them (the buffer
/// lives as long as a plan holds a region of it).
#[derive(Clone, Debug)]
pub struct Region {
    buffer: wgpu::Buffer,
    offset: u64,
    size: u64,
}

impl Region {
    /// The whole of `buffer`.
    pub(crate) fn whole(buffer: wgpu::Buffer) -> Self {
        let size = buffer.size();
        Region { buffer, offset: 0, size }
    }

    /// The bytes of `view` (a caller's tensor that a plan binds in place of a region).
    pub(crate) fn of(view: BufferView<'_>) -> Self {
        Region { buffer: view.buffer.clone(), offset: view.offset, size: view.size }
    }

    /// The region as a view (to bind, copy from or read back).
    pub fn view(&self) -> BufferView<'_> {
        BufferView::new(&self.buffer, self.offset, self.size)
    }

    /// The buffer the region lies in.
    pub fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Its first byte in [`Self::buffer`].
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Its bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The first `bytes` bytes of the region, bound at `binding`.
    pub(crate) fn bind(&self, binding: u32, bytes: u64) -> Binding<'_> {
        Binding { binding, buffer: &self.buffer, size: bytes, offset: self.offset }
    }
}

/// Where planners take their scratch regions from.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Scratch<'a> {
    /// A zero-filled buffer of its own for every region taken.
    Own(&'a Context),
    /// The regions of a laid-out workspace.
    Laid(&'a Context, &'a Workspace),
}

impl<'a> Scratch<'a> {
    /// The context plans are made on.
    pub(crate) fn ctx(&self) -> &'a Context {
        match *self {
            Scratch::Own(ctx) | Scratch::Laid(ctx, _) => ctx,
        }
    }

    /// The region for `key`, holding at least `bytes` bytes.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] for bytes past the device's storage-binding or buffer limits;
    /// [`Error::InvalidArgument`] where the workspace has no region of that size for `key` (one
    /// made for a smaller layer or token count).
    pub(crate) fn take(&self, size: RegionSize) -> Result<Region> {
        let RegionSize { key, bytes } = size;
        match *self {
            Scratch::Own(ctx) => Ok(Region::whole(match key {
                ScratchKey::X_WINDOWS => ctx.window_scratch(key.label(), bytes)?,
                _ => ctx.storage_scratch(key.label(), bytes)?,
            })),
            Scratch::Laid(_, ws) => match ws.regions.iter().find(|(k, _)| *k == key) {
                Some((_, r)) if r.size >= bytes => Ok(r.clone()),
                found => Err(Error::invalid(format!(
                    "the workspace holds {} for `{}`; this plan takes {bytes} bytes (make the \
                     workspace from this layer's layout for its maximum token count, or a layout \
                     merged with it)",
                    found.map_or_else(|| "no region".to_string(), |(_, r)| format!("{} bytes", r.size)),
                    key.label()
                ))),
            },
        }
    }
}

/// Offsets and sizes of a workspace's regions: each region starts at a multiple of
/// [`Self::alignment`] (the device's storage and uniform offset alignments), in the order they
/// were pushed; and the bytes of x windows, which are not a region (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceLayout {
    spans: Vec<(ScratchKey, u64, u64)>,
    bytes: u64,
    alignment: u64,
    windows: Option<u64>,
}

impl WorkspaceLayout {
    /// An empty layout whose regions start at multiples of the larger of the device's storage
    /// and uniform offset alignments.
    pub(crate) fn new(limits: &wgpu::Limits) -> Self {
        let alignment = u64::from(
            limits.min_storage_buffer_offset_alignment.max(limits.min_uniform_buffer_offset_alignment),
        )
        .max(4);
        WorkspaceLayout { spans: Vec::new(), bytes: 0, alignment, windows: None }
    }

    /// Adds `size`'s region (at least 4 bytes, rounded up to 4), or grows the one it has for its
    /// key to hold it (for [`ScratchKey::X_WINDOWS`]: the windows' bytes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] where the region or the layout's end does not fit in a u64.
    pub(crate) fn push(&mut self, size: RegionSize) -> Result<()> {
        let RegionSize { key, bytes } = size;
        let what = format!("workspace region {key:?}");
        let bytes = size::round_up(&what, bytes.max(4), 4)?;
        let aligned = size::round_up(&what, bytes, self.alignment)?;
        if key == ScratchKey::X_WINDOWS {
            self.windows = Some(self.windows.map_or(bytes, |w| w.max(bytes)));
            return Ok(());
        }
        if let Some(i) = self.spans.iter().position(|(k, _, _)| *k == key) {
            if self.spans[i].2 >= bytes {
                return Ok(());
            }
            let (_, _, old) = self.spans.remove(i);
            // `old` was pushed, so its aligned size fits and is part of `self.bytes`.
            let old = old.next_multiple_of(self.alignment);
            self.spans[i..].iter_mut().for_each(|s| s.1 -= old);
            self.bytes -= old;
        }
        let end = self.bytes.checked_add(aligned).ok_or_else(|| {
            Error::invalid(format!("{what}: {} bytes after {} do not fit in 64 bits", aligned, self.bytes))
        })?;
        self.spans.push((key, self.bytes, bytes));
        self.bytes = end;
        Ok(())
    }

    /// A layout that holds both `self`'s and `other`'s regions, each as large as the larger
    /// (for one workspace shared by layers of different shapes).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for layouts of different alignments (made on other devices).
    pub fn merged(&self, other: &WorkspaceLayout) -> Result<WorkspaceLayout> {
        if self.alignment != other.alignment {
            return Err(Error::invalid(format!(
                "workspace layouts of alignments {} and {} are for different devices",
                self.alignment, other.alignment
            )));
        }
        let mut out = self.clone();
        for (key, _, bytes) in other.regions() {
            out.push(RegionSize { key, bytes })?;
        }
        if let Some(w) = other.windows {
            out.push(RegionSize { key: ScratchKey::X_WINDOWS, bytes: w })?;
        }
        Ok(out)
    }

    /// Bytes of a buffer that holds every region (from an aligned offset).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes of the x windows, where a kernel reads them (a buffer that
    /// [`Workspace::new`] makes, apart from the caller's).
    pub fn window_bytes(&self) -> Option<u64> {
        self.windows
    }

    /// The alignment of every region's offset, and of the workspace's own offset in its buffer.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The largest region's bytes (each is bound on its own: the storage-binding limit applies
    /// to it, not to the whole).
    pub(crate) fn largest(&self) -> u64 {
        self.spans.iter().map(|s| s.2).max().unwrap_or(0)
    }

    /// The regions: key, offset from the workspace's start, bytes (the x windows are not one).
    pub fn regions(&self) -> impl Iterator<Item = (ScratchKey, u64, u64)> + '_ {
        self.spans.iter().copied()
    }
}

/// The usages a workspace buffer needs: storage and uniform bindings (x windows are read as
/// uniform), copies out (results read back) and in.
pub const WORKSPACE_USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::UNIFORM)
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// The regions of a [`WorkspaceLayout`] on the device, for plans to bind
/// (`MoeLayer::plan_in`). Plans hold what they bind: the workspace can be dropped once they are
/// made, and any number of plans that run one after another can be made in one.
#[derive(Clone, Debug)]
pub struct Workspace {
    regions: Vec<(ScratchKey, Region)>,
}

impl Workspace {
    /// A buffer of its own for each region of `layout` (zero-filled).
    ///
    /// # Errors
    /// A region past the device's storage-binding or buffer limits; device errors.
    pub(crate) fn own(ctx: &Context, layout: &WorkspaceLayout) -> Result<Self> {
        let windows = layout.windows.map(|w| (ScratchKey::X_WINDOWS, 0, w));
        let regions = layout
            .regions()
            .chain(windows)
            .map(|(key, _, bytes)| Ok((key, Scratch::Own(ctx).take(RegionSize { key, bytes })?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Workspace { regions })
    }

    /// Every region's key and bytes (the x windows' included).
    pub(crate) fn views(&self) -> impl Iterator<Item = (ScratchKey, BufferView<'_>)> + '_ {
        self.regions.iter().map(|(key, region)| (*key, region.view()))
    }

    /// `layout`'s regions cut from `view` (of a buffer made with [`WORKSPACE_USAGE`]), at their
    /// offsets from the view's start; the x windows, where the layout has them, in a buffer of
    /// the workspace's own. x, y and other data of the caller's may share `view`'s buffer.
    ///
    /// # Errors
    /// [`Error::Shape`] for a view smaller than the layout or past its buffer;
    /// [`Error::InvalidArgument`] for a view at an offset that is not a multiple of the layout's
    /// alignment or a buffer without [`WORKSPACE_USAGE`]; [`Error::LimitExceeded`] for a region
    /// past the device's storage-binding limit.
    pub fn new<'b>(ctx: &Context, layout: &WorkspaceLayout, view: impl Into<BufferView<'b>>) -> Result<Self> {
        let view = view.into();
        view.check_in_buffer("workspace view")?;
        if view.size < layout.bytes {
            return Err(Error::shape(
                "workspace",
                format!("at least {} bytes", layout.bytes),
                format!("{} bytes", view.size),
            ));
        }
        if !view.offset.is_multiple_of(layout.alignment) {
            return Err(Error::invalid(format!(
                "the workspace starts at byte {}, not a multiple of its alignment {}",
                view.offset, layout.alignment
            )));
        }
        if !view.buffer.usage().contains(WORKSPACE_USAGE) {
            return Err(Error::invalid(format!(
                "the workspace buffer has usages {:?}; it needs {WORKSPACE_USAGE:?}",
                view.buffer.usage()
            )));
        }
        let limit = ctx.limits().max_storage_buffer_binding_size;
        let mut regions = layout
            .regions()
            .map(|(key, offset, bytes)| {
                if bytes > limit {
                    return Err(Error::limit(
                        format!("workspace region `{}`", key.label()),
                        bytes,
                        limit,
                        "max_storage_buffer_binding_size",
                    ));
                }
                let region =
                    Region { buffer: view.buffer.clone(), offset: view.offset + offset, size: bytes };
                Ok((key, region))
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(w) = layout.windows {
            let windows = RegionSize { key: ScratchKey::X_WINDOWS, bytes: w };
            regions.push((ScratchKey::X_WINDOWS, Scratch::Own(ctx).take(windows)?));
        }
        Ok(Workspace { regions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(storage: u32, uniform: u32) -> WorkspaceLayout {
        WorkspaceLayout::new(&wgpu::Limits {
            min_storage_buffer_offset_alignment: storage,
            min_uniform_buffer_offset_alignment: uniform,
            ..wgpu::Limits::downlevel_defaults()
        })
    }

    /// Regions start at aligned offsets in push order; a key pushed again grows its region in
    /// place of a second one, and the regions after it move.
    #[test]
    fn regions_are_aligned_and_one_per_key() {
        let mut l = layout(32, 256);
        assert_eq!(l.alignment(), 256);
        l.push(RegionSize { key: ScratchKey::TOPK_INDICES, bytes: 10 }).unwrap();
        l.push(RegionSize { key: ScratchKey::ACTIVATIONS, bytes: 300 }).unwrap();
        l.push(RegionSize { key: ScratchKey::TOPK_WEIGHTS, bytes: 0 }).unwrap();
        l.push(RegionSize { key: ScratchKey::X_WINDOWS, bytes: 5000 }).unwrap();
        assert_eq!(l.window_bytes(), Some(5000), "the windows are not a region");
        assert_eq!(
            l.regions().collect::<Vec<_>>(),
            [
                (ScratchKey::TOPK_INDICES, 0, 12),
                (ScratchKey::ACTIVATIONS, 256, 300),
                (ScratchKey::TOPK_WEIGHTS, 768, 4)
            ]
        );
        assert_eq!(l.bytes(), 1024);
        l.push(RegionSize { key: ScratchKey::ACTIVATIONS, bytes: 100 }).unwrap();
        assert_eq!(l.bytes(), 1024, "a smaller request fits the region there is");
        l.push(RegionSize { key: ScratchKey::ACTIVATIONS, bytes: 600 }).unwrap();
        let err =
            l.push(RegionSize { key: ScratchKey::TOPK_WEIGHTS, bytes: u64::MAX }).unwrap_err().to_string();
        assert!(err.contains("topk weights") && err.contains("do not fit in 64 bits"), "{err}");
        let wraps = RegionSize { key: ScratchKey::TOPK_WEIGHTS, bytes: u64::MAX - 64 };
        assert!(l.push(wraps).is_err(), "the layout's end would wrap");
        assert!(RegionSize::words(ScratchKey::TOPK_WEIGHTS, &[1 << 32, 1 << 32]).is_err());
        assert_eq!(
            l.regions().collect::<Vec<_>>(),
            [
                (ScratchKey::TOPK_INDICES, 0, 12),
                (ScratchKey::TOPK_WEIGHTS, 256, 4),
                (ScratchKey::ACTIVATIONS, 512, 600)
            ]
        );
        assert_eq!((l.bytes(), l.largest()), (512 + 768, 600));
    }
}
