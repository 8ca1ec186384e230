//! Kernel specifications, the pipeline cache, and encodable dispatches.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::context::{Context, lock};
use crate::error::{Error, Result};
use crate::shader::ShaderSource;

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
    pub fn is_buffer(self) -> bool {
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
    Override(&'static str),
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
        type Modules = HashMap<&'static str, (naga::Module, naga::valid::ModuleInfo)>;
        static MODULES: std::sync::OnceLock<Mutex<Modules>> = std::sync::OnceLock::new();
        let mut modules = lock(MODULES.get_or_init(Default::default));
        let (module, info) = match modules.entry(self.shader.name) {
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
            Workgroup::Override(name) => override_default(module, name).ok_or_else(|| {
                Error::invalid(format!("{}: no default for the override `{name}`", self.shader.name))
            })?,
        };
        Ok(Reflected { workgroup_bytes, invocations })
    }

    fn layout_entries(&self) -> Vec<wgpu::BindGroupLayoutEntry> {
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
    spec: &'static KernelSpec,
    constants: Vec<(&'static str, f64)>,
    pipeline: wgpu::ComputePipeline,
    layout: wgpu::BindGroupLayout,
}

/// Pipeline-constant values, as wgpu takes them.
pub type Constants = [(&'static str, f64)];

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct PipelineKey {
    shader: &'static str,
    entry: &'static str,
    constants: Vec<(&'static str, u64)>,
}

/// Shader modules and pipelines built so far, keyed by module, entry point and constants, and
/// the driver's pipeline cache where one was loaded ([`Context::load_pipeline_cache`]).
#[derive(Debug, Default)]
pub(crate) struct PipelineCache {
    modules: Mutex<HashMap<&'static str, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<Kernel>>>,
    driver: Mutex<Option<wgpu::PipelineCache>>,
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
    kernel: Arc<Kernel>,
    bind_group: wgpu::BindGroup,
    bindings: Vec<BoundBuffer>,
    textures: Vec<BoundTexture>,
    workgroups: [u32; 3],
}

impl Dispatch {
    /// Records the dispatch into `pass`.
    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.kernel.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        let [x, y, z] = self.workgroups;
        pass.dispatch_workgroups(x, y, z);
    }

    /// The kernel's entry point name.
    pub fn entry(&self) -> &'static str {
        self.kernel.spec.entry
    }

    /// Workgroups in x, y and z.
    pub fn workgroups(&self) -> [u32; 3] {
        self.workgroups
    }

    /// The WGSL module holding the entry point (its [`ShaderSource::compose`] is the text
    /// the pipeline was built from).
    pub fn shader(&self) -> &'static ShaderSource {
        self.kernel.spec.shader
    }

    /// The override constants the pipeline was specialised with, in the order given.
    pub fn constants(&self) -> &[(&'static str, f64)] {
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
}

impl Context {
    /// Pipelines built on this context so far (each specialisation of an entry point once).
    pub fn pipeline_count(&self) -> usize {
        lock(&self.pipelines().pipelines).len()
    }

    /// Builds every later pipeline with the driver pipeline cache saved at `path` (by
    /// [`Self::save_pipeline_cache`]), or with an empty one where there is no file yet, so that
    /// a later run can skip the driver's shader compiles. Returns false, doing nothing, where
    /// the device has no pipeline cache (`PIPELINE_CACHE`: wgpu offers it on Vulkan only).
    /// Data from another adapter, driver or wgpu version is ignored (wgpu checks its header)
    /// and the cache starts empty. Pipelines built before the call are not affected.
    ///
    /// # Errors
    /// [`Error::Io`] when the file exists but cannot be read; a device error.
    ///
    /// # Safety
    /// The file must hold data that [`Self::save_pipeline_cache`] wrote: wgpu checks the
    /// header of the data but hands the rest to the driver, which may misbehave on corrupt
    /// data (see `wgpu::Device::create_pipeline_cache`).
    pub unsafe fn load_pipeline_cache(&self, path: &Path) -> Result<bool> {
        if !self.device().features().contains(wgpu::Features::PIPELINE_CACHE) {
            return Ok(false);
        }
        let data = match std::fs::read(path) {
            Ok(data) => Some(data),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(Error::Io { path: path.display().to_string(), source }),
        };
        let cache = self.checked("pipeline cache", || {
            // SAFETY: the caller promises the data is what save_pipeline_cache wrote; wgpu
            // validates its header and falls back to an empty cache on a mismatch.
            unsafe {
                self.device().create_pipeline_cache(&wgpu::PipelineCacheDescriptor {
                    label: Some("moeflow pipeline cache"),
                    data: data.as_deref(),
                    fallback: true,
                })
            }
        })?;
        *lock(&self.pipelines().driver) = Some(cache);
        Ok(true)
    }

    /// Writes the driver pipeline cache loaded by [`Self::load_pipeline_cache`] (now holding
    /// every pipeline built since) to `path`, atomically (a temporary file in the same folder,
    /// then a rename). Returns false, writing nothing, where no cache was loaded or the driver
    /// gives no data.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written.
    pub fn save_pipeline_cache(&self, path: &Path) -> Result<bool> {
        let Some(data) = lock(&self.pipelines().driver).as_ref().and_then(wgpu::PipelineCache::get_data)
        else {
            return Ok(false);
        };
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let mut file = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
        std::io::Write::write_all(&mut file, &data).map_err(io)?;
        file.persist(path).map_err(|e| io(e.error))?;
        Ok(true)
    }

    /// The pipeline for `spec` specialised with `constants`, built on first use.
    pub(crate) fn kernel(&self, spec: &'static KernelSpec, constants: &Constants) -> Result<Arc<Kernel>> {
        let mut sorted: Vec<(&'static str, u64)> = constants.iter().map(|&(k, v)| (k, v.to_bits())).collect();
        sorted.sort_unstable();
        let key = PipelineKey { shader: spec.shader.name, entry: spec.entry, constants: sorted };
        if let Some(k) = lock(&self.pipelines().pipelines).get(&key) {
            return Ok(k.clone());
        }
        let count =
            |access: &[Access]| spec.bindings.iter().filter(|(_, a)| access.contains(a)).count() as u64;
        let limits = self.limits();
        for (what, n, max, name) in [
            (
                "storage buffers",
                count(&[Access::Read, Access::ReadWrite]),
                limits.max_storage_buffers_per_shader_stage,
                "max_storage_buffers_per_shader_stage",
            ),
            (
                "sampled textures",
                count(&[Access::TextureU32]),
                limits.max_sampled_textures_per_shader_stage,
                "max_sampled_textures_per_shader_stage",
            ),
        ] {
            if n > u64::from(max) {
                return Err(Error::limit(format!("{what} bound by `{}`", spec.entry), n, max.into(), name));
            }
        }
        let device = self.device();
        let module = {
            let mut modules = lock(&self.pipelines().modules);
            match modules.get(spec.shader.name) {
                Some(m) => m.clone(),
                None => {
                    let source = spec.shader.compose();
                    let m = self.checked(spec.shader.name, || {
                        device.create_shader_module(wgpu::ShaderModuleDescriptor {
                            label: Some(spec.shader.name),
                            source: wgpu::ShaderSource::Wgsl(source.into()),
                        })
                    })?;
                    modules.insert(spec.shader.name, m.clone());
                    m
                }
            }
        };
        let driver_cache = lock(&self.pipelines().driver).clone();
        let kernel = self.checked(spec.entry, || {
            let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(spec.entry),
                entries: &spec.layout_entries(),
            });
            let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(spec.entry),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
            let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(spec.entry),
                layout: Some(&pipeline_layout),
                module: &module,
                entry_point: Some(spec.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants,
                    zero_initialize_workgroup_memory: true,
                },
                cache: driver_cache.as_ref(),
            });
            Kernel { spec, constants: constants.to_vec(), pipeline, layout }
        })?;
        let kernel = Arc::new(kernel);
        lock(&self.pipelines().pipelines).insert(key, kernel.clone());
        if let Some(dir) = std::env::var_os(DUMP_PIPELINES) {
            dump_pipeline(Path::new(&dir), spec, constants);
        }
        Ok(kernel)
    }

    /// A 1-D grid of `groups` workgroups, spilling into y past the per-dimension limit.
    pub(crate) fn grid(&self, groups: u64, what: &str) -> Result<[u32; 3]> {
        let max = u64::from(self.limits().max_compute_workgroups_per_dimension);
        if groups == 0 {
            return Ok([0, 1, 1]);
        }
        let x = groups.min(max);
        let y = groups.div_ceil(x);
        if y > max {
            return Err(Error::limit(
                format!("workgroups for {what}"),
                groups,
                max * max,
                "max_compute_workgroups_per_dimension squared",
            ));
        }
        // Both fit in u32: x, y <= max, which is a u32.
        Ok([x as u32, y as u32, 1])
    }

    /// Checks a binding against the buffer's size and the adapter's binding limits.
    pub(crate) fn check_binding(
        &self,
        what: &str,
        buffer: &wgpu::Buffer,
        bytes: u64,
        access: Access,
    ) -> Result<()> {
        if buffer.size() < bytes {
            return Err(Error::shape(
                what,
                format!("a buffer of at least {bytes} bytes"),
                format!("{} bytes", buffer.size()),
            ));
        }
        if access != Access::Uniform && bytes > self.limits().max_storage_buffer_binding_size {
            return Err(Error::limit(
                format!("binding `{what}`"),
                bytes,
                self.limits().max_storage_buffer_binding_size,
                "max_storage_buffer_binding_size",
            ));
        }
        Ok(())
    }

    /// Checks a view that a kernel binds `bytes` of: it lies in its buffer, holds `bytes`,
    /// starts at an offset the device can bind, and fits the binding limits.
    pub(crate) fn check_view(
        &self,
        what: &str,
        view: &BufferView<'_>,
        bytes: u64,
        access: Access,
    ) -> Result<()> {
        let end = view.offset.checked_add(view.size);
        if end.is_none_or(|end| end > view.buffer.size()) {
            return Err(Error::shape(
                format!("view of `{what}`"),
                format!("a range within the buffer's {} bytes", view.buffer.size()),
                format!("bytes {} .. {}", view.offset, view.offset.saturating_add(view.size)),
            ));
        }
        if view.size < bytes {
            return Err(Error::shape(
                what,
                format!("a view of at least {bytes} bytes"),
                format!("{} bytes", view.size),
            ));
        }
        let align = u64::from(match access {
            Access::Uniform => self.limits().min_uniform_buffer_offset_alignment,
            _ => self.device().limits().min_storage_buffer_offset_alignment,
        });
        if !view.offset.is_multiple_of(align.max(1)) {
            return Err(Error::invalid(format!(
                "the view of `{what}` starts at byte {}, not a multiple of the device's offset alignment {align}",
                view.offset
            )));
        }
        if access != Access::Uniform && bytes > self.limits().max_storage_buffer_binding_size {
            return Err(Error::limit(
                format!("binding `{what}`"),
                bytes,
                self.limits().max_storage_buffer_binding_size,
                "max_storage_buffer_binding_size",
            ));
        }
        Ok(())
    }

    /// A dispatch of `kernel` over `workgroups` with `bindings` (buffers only).
    pub(crate) fn dispatch(
        &self,
        kernel: &Arc<Kernel>,
        bindings: &[Binding<'_>],
        workgroups: [u32; 3],
    ) -> Result<Dispatch> {
        self.dispatch_with_textures(kernel, bindings, &[], workgroups)
    }

    /// A dispatch of `kernel` over `workgroups` with buffer `bindings` and `textures`.
    pub(crate) fn dispatch_with_textures(
        &self,
        kernel: &Arc<Kernel>,
        bindings: &[Binding<'_>],
        textures: &[TextureBinding<'_>],
        workgroups: [u32; 3],
    ) -> Result<Dispatch> {
        let access = |binding, buffer: bool| {
            let what = if buffer { "buffer" } else { "texture" };
            kernel
                .spec
                .bindings
                .iter()
                .find(|(b, a)| *b == binding && a.is_buffer() == buffer)
                .map(|&(_, a)| a)
                .ok_or_else(|| {
                    Error::invalid(format!("`{}` declares no {what} binding {binding}", kernel.spec.entry))
                })
        };
        // The parameters are exactly the struct the kernel reads.
        if let Some(p) = bindings.iter().find(|b| b.binding == 0)
            && p.size != kernel.spec.params_bytes
        {
            return Err(Error::invalid(format!(
                "`{}` reads {} bytes of parameters at binding 0; {} were bound",
                kernel.spec.entry, kernel.spec.params_bytes, p.size
            )));
        }
        // Every binding must be one the kernel declares before a bind group is made of them.
        let bound = bindings
            .iter()
            .map(|b| {
                Ok(BoundBuffer {
                    binding: b.binding,
                    access: access(b.binding, true)?,
                    buffer: b.buffer.clone(),
                    offset: b.offset,
                    size: b.size.max(4),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let bound_textures = textures
            .iter()
            .map(|t| {
                access(t.binding, false)?;
                Ok(BoundTexture { binding: t.binding, texture: t.texture.clone() })
            })
            .collect::<Result<Vec<_>>>()?;
        let views: Vec<wgpu::TextureView> = textures
            .iter()
            .map(|t| {
                t.texture.create_view(&wgpu::TextureViewDescriptor {
                    dimension: Some(wgpu::TextureViewDimension::D2Array),
                    ..Default::default()
                })
            })
            .collect();
        let entries: Vec<wgpu::BindGroupEntry<'_>> = bindings
            .iter()
            .map(|b| wgpu::BindGroupEntry {
                binding: b.binding,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b.buffer,
                    offset: b.offset,
                    size: NonZeroU64::new(b.size.max(4)),
                }),
            })
            .chain(textures.iter().zip(&views).map(|(t, view)| wgpu::BindGroupEntry {
                binding: t.binding,
                resource: wgpu::BindingResource::TextureView(view),
            }))
            .collect();
        let bind_group = self.checked(kernel.spec.entry, || {
            self.device().create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(kernel.spec.entry),
                layout: &kernel.layout,
                entries: &entries,
            })
        })?;
        Ok(Dispatch {
            kernel: kernel.clone(),
            bind_group,
            bindings: bound,
            textures: bound_textures,
            workgroups,
        })
    }
}

/// Environment variable naming a folder where every pipeline moeflow creates is recorded (its
/// module's WGSL and, per entry point and constant set, a JSON file), so other WGSL compilers
/// can be checked on exactly what the library builds (`tools/tint/`).
pub const DUMP_PIPELINES: &str = "MOEFLOW_DUMP_PIPELINES";

/// Writes `spec`'s module source and `{module, entry, constants}` under `dir` (files named for
/// the module, entry and constants, so concurrent writers of one pipeline write the same
/// bytes). A failure is logged and otherwise ignored: recording never changes a run.
fn dump_pipeline(dir: &Path, spec: &KernelSpec, constants: &Constants) {
    let module = spec.shader.name.replace('/', "__");
    let mut sorted: Vec<(&str, f64)> = constants.to_vec();
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
