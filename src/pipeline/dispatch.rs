//! Encodable dispatches: pipeline, bind group and grid, recorded into a compute pass, and what
//! each one binds.

use std::sync::Arc;

use super::cache::Kernel;
use super::spec::Access;
use crate::live::Sizing;
use crate::shader::{Override, ShaderSource};

/// One texture a [`Dispatch`] binds.
#[derive(Clone, Debug)]
pub struct BoundTexture {
    /// Binding index in group 0.
    pub binding: u32,
    /// The texture (a handle to the one bound, not a copy).
    pub texture: wgpu::Texture,
}

/// One buffer range a [`Dispatch`] binds, with the access its kernel declares for it.
#[derive(Clone, Debug)]
pub struct BoundBuffer {
    /// Binding index in group 0.
    pub binding: u32,
    /// How the kernel binds it.
    pub access: Access,
    /// The buffer (a handle to the one bound, not a copy).
    pub buffer: wgpu::Buffer,
    /// First byte bound.
    pub offset: u64,
    /// Bytes bound.
    pub size: u64,
}

/// A recorded-to-be dispatch: pipeline, bind group and grid. Recording it into a compute
/// pass is all that is left; submission belongs to the caller.
///
/// A dispatch also describes itself (module, entry point, constants, bound ranges, grid), so
/// the same work can be replayed through another WebGPU implementation (`tools/tint/`).
#[derive(Clone, Debug)]
pub struct Dispatch {
    pub(crate) kernel: Arc<Kernel>,
    pub(crate) bind_group: wgpu::BindGroup,
    pub(crate) bindings: Vec<BoundBuffer>,
    pub(crate) textures: Vec<BoundTexture>,
    pub(crate) workgroups: [u32; 3],
    /// How it follows a plan's live token count (see [`crate::live`]).
    pub(crate) sizing: Option<Sizing>,
    /// Where its grid is read from when it follows the live count: three u32 that a sizing
    /// dispatch before it writes (`workgroups` is the grid at the plan's maximum).
    pub(crate) indirect: Option<Indirect>,
}

/// An indirect grid: three u32 (x, y, z) at `offset` in `buffer`, spilled into y past
/// `max_groups` per dimension.
#[derive(Clone, Debug)]
pub(crate) struct Indirect {
    pub(crate) buffer: wgpu::Buffer,
    pub(crate) offset: u64,
    pub(crate) max_groups: u32,
}

impl Dispatch {
    /// Records the dispatch into `pass` (with its grid read from the device where it follows
    /// a plan's live count, see [`Self::grid_is_sized`]).
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        match &self.indirect {
            Some(grid) => {
                pass.set_pipeline(&self.kernel.pipeline);
                pass.set_bind_group(0, &self.bind_group, &[]);
                pass.dispatch_workgroups_indirect(&grid.buffer, grid.offset);
            }
            None => self.record_grid(pass, self.workgroups),
        }
    }

    /// Records the dispatch into `pass` with `grid` (set on the host).
    pub(crate) fn record_grid(&self, pass: &mut wgpu::ComputePass<'_>, [x, y, z]: [u32; 3]) {
        pass.set_pipeline(&self.kernel.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        pass.dispatch_workgroups(x, y, z);
    }

    /// The grid it runs at a plan's live count `tokens`, or None where it does not run then.
    pub(crate) fn grid_at(&self, tokens: u32) -> Option<[u32; 3]> {
        match (&self.sizing, &self.indirect) {
            (Some(s), Some(i)) => s.grid_at(tokens, self.workgroups, i.max_groups),
            (Some(s), None) => s.runs_at(tokens).then_some(self.workgroups),
            (None, _) => Some(self.workgroups),
        }
    }

    /// The dispatch as it runs at a plan's live count `tokens` (its grid set on the host), or
    /// None where it does not run then.
    pub(crate) fn at_count(&self, tokens: u32) -> Option<Dispatch> {
        let workgroups = self.grid_at(tokens)?;
        Some(Dispatch { workgroups, indirect: None, ..self.clone() })
    }

    /// The dispatch, saying how it follows a plan's live token count.
    pub(crate) fn sized(mut self, sizing: Sizing) -> Self {
        self.sizing = Some(sizing);
        self
    }

    /// Runs only at live counts in `counts` (and where it ran before).
    pub(crate) fn run_only_for(&mut self, counts: std::ops::RangeInclusive<u32>) {
        self.sizing = self.sizing.take().map(|s| s.only_for(counts));
    }

    /// Whether the dispatch reads its grid from the device, where a sizing dispatch before it
    /// wrote the grid of the plan's live token count.
    pub fn grid_is_sized(&self) -> bool {
        self.indirect.is_some()
    }

    /// The kernel's entry point name.
    pub fn entry(&self) -> &'static str {
        self.kernel.spec.entry
    }

    /// Workgroups in x, y and z: the grid at the plan's maximum token count (a dispatch that
    /// follows a live count reads its grid from the device, see [`Self::grid_is_sized`]).
    pub fn workgroups(&self) -> [u32; 3] {
        self.workgroups
    }

    /// The WGSL module holding the entry point (its [`ShaderSource::compose`] is the text
    /// the pipeline was built from).
    pub fn shader(&self) -> &'static ShaderSource {
        self.kernel.spec.shader
    }

    /// The override constants the pipeline was specialised with, in the order given.
    pub fn constants(&self) -> &[(Override, f64)] {
        &self.kernel.constants
    }

    /// The buffer ranges bound, in binding order as planned.
    pub fn bindings(&self) -> &[BoundBuffer] {
        &self.bindings
    }

    /// The textures bound (none but for kernels that read their weights from textures).
    pub fn textures(&self) -> &[BoundTexture] {
        &self.textures
    }

    /// Whether the kernel's module was built with runtime bounds checks (see
    /// [`BoundsChecks`](crate::BoundsChecks)).
    pub fn bounds_checked(&self) -> bool {
        self.kernel.bounds_checked
    }
}
