//! Kernel specifications, the pipeline cache, and encodable dispatches.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::live::{LiveCount, LiveValue, Sizing};
use crate::shader::{ModuleKey, Override, ShaderSource};
use crate::sync::lock;

/// How a kernel binds one resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// `var<uniform>`.
    Uniform,
    /// `var<storage, read>`.
    Read,
    /// `var<storage, read_write>`.
    ReadWrite,
    /// `texture_2d_array<u32>`, read with `textureLoad` (a sampled texture; no sampler).
    TextureU32,
}

impl Access {
    /// Whether the binding is a buffer (every access but [`Access::TextureU32`]).
    pub(crate) fn is_buffer(self) -> bool {
        self != Access::TextureU32
    }
}

/// How a kernel's workgroup size is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Workgroup {
    /// `@workgroup_size(n)` (a literal or a constant): `n` invocations in x, one in y and z.
    Fixed(u32),
    /// `@workgroup_size(NAME)` with the pipeline-overridable constant `NAME`, which the
    /// planner sets (one in y and z).
    Override(Override),
}

/// A compute entry point, its explicit bind-group layout (group 0), and the rest of its
/// contract with the WGSL: the size of its parameters and of its workgroups. A unit test
/// (`src/contract.rs`) reflects every spec's module with naga and fails where the two sides
/// disagree.
#[derive(Debug)]
pub struct KernelSpec {
    /// Module holding the entry point.
    pub shader: &'static ShaderSource,
    /// Entry point name.
    pub entry: &'static str,
    /// `(binding, access)` for every binding the entry point uses, and no other.
    pub bindings: &'static [(u32, Access)],
    /// Bytes of the uniform parameters at binding 0 (the Rust struct written there, the WGSL
    /// struct read there). Every dispatch binds exactly this many.
    pub params_bytes: u64,
    /// Invocations per workgroup.
    pub workgroup: Workgroup,
}

impl KernelSpec {
    /// Checks that the kernel's module declares every constant of `constants`
    /// ([`ShaderSource::overrides`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the first constant the module does not declare (a
    /// moeflow bug, which the tests would catch).
    pub(crate) fn check_constants(&self, constants: &Constants) -> Result<()> {
        let declared = self.shader.overrides();
        match constants.iter().find(|(k, _)| !declared.contains(k)) {
            None => Ok(()),
            Some((k, _)) => Err(Error::invalid(format!(
                "`{}` has no override constant {k} (its module `{}` declares {declared:?})",
                self.entry, self.shader.name
            ))),
        }
    }

    /// Workgroups of a fixed size that cover `invocations`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a kernel whose size is a pipeline constant.
    pub(crate) fn groups(&self, invocations: u64) -> Result<u64> {
        match self.workgroup {
            Workgroup::Fixed(n) => Ok(invocations.div_ceil(u64::from(n.max(1)))),
            Workgroup::Override(name) => Err(Error::invalid(format!(
                "`{}` has no fixed workgroup size (the constant `{name}` sets it)",
                self.entry
            ))),
        }
    }

    /// Workgroups of a fixed size that cover `invocations` at a plan's live token count.
    ///
    /// # Errors
    /// As [`Self::groups`].
    pub(crate) fn live_groups(&self, invocations: LiveCount) -> Result<LiveValue> {
        self.live_groups_beyond(invocations, 0)
    }

    /// Workgroups of a fixed size that cover the invocations past the first `floor` at a
    /// plan's live token count.
    ///
    /// # Errors
    /// As [`Self::groups`].
    pub(crate) fn live_groups_beyond(&self, invocations: LiveCount, floor: u32) -> Result<LiveValue> {
        match self.workgroup {
            Workgroup::Fixed(n) => Ok(invocations.beyond(floor, n.max(1))),
            Workgroup::Override(_) => self.groups(0).map(|_| invocations.value()),
        }
    }

    /// Storage buffers, uniform buffers and sampled textures the entry point binds.
    pub(crate) fn binding_counts(&self) -> (u32, u32, u32) {
        let count = |f: fn(Access) -> bool| self.bindings.iter().filter(|(_, a)| f(*a)).count() as u32;
        (
            count(|a| matches!(a, Access::Read | Access::ReadWrite)),
            count(|a| a == Access::Uniform),
            count(|a| a == Access::TextureU32),
        )
    }

    /// What naga reads off the entry point's WGSL: workgroup memory in bytes and invocations
    /// per workgroup (an overridable size at its default). Parsed once per module.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the module does not parse or has no such entry point
    /// (a moeflow bug: `src/contract.rs` checks every kernel).
    pub(crate) fn reflect(&self) -> Result<Reflected> {
        type Modules = HashMap<ModuleKey, (naga::Module, naga::valid::ModuleInfo)>;
        static MODULES: std::sync::OnceLock<Mutex<Modules>> = std::sync::OnceLock::new();
        let mut modules = lock(MODULES.get_or_init(Default::default));
        let (module, info) = match modules.entry(self.shader.key()) {
            std::collections::hash_map::Entry::Occupied(m) => m.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let text = self.shader.compose();
                let bad = |e: String| Error::invalid(format!("{}: {e}", self.shader.name));
                let m = naga::front::wgsl::parse_str(&text).map_err(|e| bad(e.emit_to_string(&text)))?;
                // Every capability: this reads the module, the device decides what it runs.
                let info = naga::valid::Validator::new(
                    naga::valid::ValidationFlags::all(),
                    naga::valid::Capabilities::all(),
                )
                .validate(&m)
                .map_err(|e| bad(e.emit_to_string(&text)))?;
                v.insert((m, info))
            }
        };
        let (index, _) =
            module.entry_points.iter().enumerate().find(|(_, ep)| ep.name == self.entry).ok_or_else(
                || Error::invalid(format!("{} has no entry point `{}`", self.shader.name, self.entry)),
            )?;
        let uses = info.get_entry_point(index);
        let workgroup_bytes = module
            .global_variables
            .iter()
            .filter(|&(handle, var)| var.space == naga::AddressSpace::WorkGroup && !uses[handle].is_empty())
            .map(|(_, var)| module.types[var.ty].inner.size(module.to_ctx()))
            .sum();
        let invocations = match self.workgroup {
            Workgroup::Fixed(n) => n,
            Workgroup::Override(name) => override_default(module, name.name()).ok_or_else(|| {
                Error::invalid(format!("{}: no default for the override `{name}`", self.shader.name))
            })?,
        };
        Ok(Reflected { workgroup_bytes, invocations })
    }

    pub(crate) fn layout_entries(&self) -> Vec<wgpu::BindGroupLayoutEntry> {
        self.bindings
            .iter()
            .map(|&(binding, access)| {
                // wgpu checks the WGSL struct against this size when it builds the pipeline.
                let min_binding_size = match (binding, access) {
                    (0, Access::Uniform) => NonZeroU64::new(self.params_bytes),
                    _ => None,
                };
                let buffer =
                    |ty| wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size };
                let ty = match access {
                    Access::Uniform => buffer(wgpu::BufferBindingType::Uniform),
                    Access::Read => buffer(wgpu::BufferBindingType::Storage { read_only: true }),
                    Access::ReadWrite => buffer(wgpu::BufferBindingType::Storage { read_only: false }),
                    Access::TextureU32 => wgpu::BindingType::Texture {
                        sample_type: wgpu::TextureSampleType::Uint,
                        view_dimension: wgpu::TextureViewDimension::D2Array,
                        multisampled: false,
                    },
                };
                wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty,
                    count: None,
                }
            })
            .collect()
    }
}

/// What [`KernelSpec::reflect`] reads off a kernel's WGSL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reflected {
    /// Bytes of workgroup memory the entry point uses.
    pub(crate) workgroup_bytes: u32,
    /// Invocations per workgroup.
    pub(crate) invocations: u32,
}

/// The default value of the u32 override `name`.
fn override_default(module: &naga::Module, name: &str) -> Option<u32> {
    let (_, o) = module.overrides.iter().find(|(_, o)| o.name.as_deref() == Some(name))?;
    match module.global_expressions[o.init?] {
        naga::Expression::Literal(naga::Literal::U32(v)) => Some(v),
        _ => None,
    }
}

/// A built pipeline, the constants it was specialised with, and its bind-group layout.
#[derive(Debug)]
pub struct Kernel {
    pub(crate) spec: &'static KernelSpec,
    pub(crate) constants: Vec<(Override, f64)>,
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) layout: wgpu::BindGroupLayout,
    /// Whether its module was built with runtime bounds checks.
    pub(crate) bounds_checked: bool,
}

/// Pipeline-constant values by their typed keys (each one declared by the kernel's module:
/// [`ShaderSource::overrides`]).
pub type Constants = [(Override, f64)];

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PipelineKey {
    pub(crate) shader: ModuleKey,
    pub(crate) entry: &'static str,
    pub(crate) constants: Vec<(Override, u64)>,
    pub(crate) bounds_checked: bool,
}

/// Shader modules and pipelines built so far, keyed by module, entry point and constants, and
/// the driver's pipeline cache where one was loaded ([`Context::load_pipeline_cache`](crate::Context::load_pipeline_cache)).
#[derive(Debug, Default)]
pub(crate) struct PipelineCache {
    /// Modules by name and whether they were built with bounds checks.
    pub(crate) modules: Mutex<HashMap<(ModuleKey, bool), wgpu::ShaderModule>>,
    pub(crate) pipelines: Mutex<HashMap<PipelineKey, Arc<Kernel>>>,
    pub(crate) driver: Mutex<Option<wgpu::PipelineCache>>,
}

/// One buffer bound at `binding`, covering bytes `[offset, offset + size)`.
#[derive(Clone, Copy, Debug)]
pub struct Binding<'a> {
    /// Binding index in group 0.
    pub binding: u32,
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// Bytes bound (at least 4).
    pub size: u64,
    /// First byte (a multiple of the adapter's offset alignment).
    pub offset: u64,
}

impl<'a> Binding<'a> {
    /// `size` bytes of `buffer` from its start.
    pub fn new(binding: u32, buffer: &'a wgpu::Buffer, size: u64) -> Self {
        Binding { binding, buffer, size, offset: 0 }
    }
}

/// A range of a buffer that a plan reads or writes: bytes `[offset, offset + size)`. Activations
/// can live in one arena buffer at offsets, and swap roles between layers; a whole buffer
/// converts with `From`. Kernels index from the view's start, so a view gives the bits of a
/// buffer of its own. Plans check that the view lies in its buffer, that its offset is a
/// multiple of the device's `min_storage_buffer_offset_alignment`, and that it holds what they
/// read or write.
#[derive(Clone, Copy, Debug)]
pub struct BufferView<'a> {
    /// The buffer.
    pub buffer: &'a wgpu::Buffer,
    /// First byte.
    pub offset: u64,
    /// Bytes in the view.
    pub size: u64,
}

impl<'a> BufferView<'a> {
    /// Bytes `[offset, offset + size)` of `buffer` (checked when a plan binds it).
    pub fn new(buffer: &'a wgpu::Buffer, offset: u64, size: u64) -> Self {
        BufferView { buffer, offset, size }
    }

    /// Checks that the view lies within its buffer.
    ///
    /// # Errors
    /// [`Error::Shape`] naming `what` for a range past the buffer's end.
    pub(crate) fn check_in_buffer(&self, what: &str) -> Result<()> {
        let end = self.offset.checked_add(self.size);
        if end.is_none_or(|end| end > self.buffer.size()) {
            return Err(Error::shape(
                what,
                format!("a range within the buffer's {} bytes", self.buffer.size()),
                format!("bytes {} .. {}", self.offset, self.offset.saturating_add(self.size)),
            ));
        }
        Ok(())
    }

    /// The first `bytes` bytes of the view, bound at `binding`.
    pub(crate) fn bind(&self, binding: u32, bytes: u64) -> Binding<'a> {
        Binding { binding, buffer: self.buffer, size: bytes, offset: self.offset }
    }
}

impl<'a> From<&'a wgpu::Buffer> for BufferView<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Self {
        BufferView { buffer, offset: 0, size: buffer.size() }
    }
}

/// One texture bound at `binding` (a whole `texture_2d_array<u32>` view).
#[derive(Clone, Copy, Debug)]
pub struct TextureBinding<'a> {
    /// Binding index in group 0.
    pub binding: u32,
    /// The texture (every layer and its only mip level are bound).
    pub texture: &'a wgpu::Texture,
}

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

/// Environment variable naming a folder where every pipeline moeflow creates is recorded (its
/// module's WGSL and, per entry point and constant set, a JSON file), so other WGSL compilers
/// can be checked on exactly what the library builds (`tools/tint/`).
pub(crate) const DUMP_PIPELINES: &str = "MOEFLOW_DUMP_PIPELINES";

/// Writes `spec`'s module source and `{module, entry, constants}` under `dir` (files named for
/// the module, entry and constants, so concurrent writers of one pipeline write the same
/// bytes). A failure is logged and otherwise ignored: recording never changes a run.
pub(crate) fn dump_pipeline(dir: &Path, spec: &KernelSpec, constants: &Constants) {
    let module = spec.shader.name.replace('/', "__");
    let mut sorted: Vec<(&str, f64)> = constants.iter().map(|&(k, v)| (k.name(), v)).collect();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let tag: String = sorted.iter().map(|(k, v)| format!("-{k}{v}")).collect();
    let record = serde_json::json!({
        "module": format!("{module}.wgsl"),
        "entry": spec.entry,
        "constants": sorted.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>(),
    });
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(format!("{module}.wgsl")), spec.shader.compose())?;
        std::fs::write(dir.join(format!("{module}__{}{tag}.json", spec.entry)), record.to_string())
    };
    if let Err(e) = write() {
        log::warn!("moeflow: could not record pipeline {module}/{} in {}: {e}", spec.entry, dir.display());
    }
}
