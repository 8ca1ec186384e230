//! [`Context`]'s pipelines and dispatches: building kernels (once per specialisation, with
//! the driver's pipeline cache where one is loaded), checking bindings and views against the
//! device's limits, and making dispatches.

use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;

use super::bounds::BoundsChecks;
use super::device::Context;
use crate::error::{Error, Result};
use crate::live::spill;
use crate::overlap::{Use, check_disjoint};
use crate::pipeline::{
    Access, Binding, BoundBuffer, BoundTexture, BufferView, Constants, DUMP_PIPELINES, Dispatch, Kernel,
    KernelSpec, PipelineKey, TextureBinding, dump_pipeline,
};
use crate::shader::{Indexing, Override};
use crate::sync::lock;

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
        let mut sorted: Vec<(Override, u64)> = constants.iter().map(|&(k, v)| (k, v.to_bits())).collect();
        sorted.sort_unstable();
        let bounds_checked =
            spec.shader.indexing == Indexing::Checked || self.bounds_checks() == BoundsChecks::Everywhere;
        let key =
            PipelineKey { shader: spec.shader.key(), entry: spec.entry, constants: sorted, bounds_checked };
        if let Some(k) = lock(&self.pipelines().pipelines).get(&key) {
            return Ok(k.clone());
        }
        // Checked once per pipeline: a cached one was checked when it was built.
        spec.check_constants(constants)?;
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
            match modules.get(&(spec.shader.key(), bounds_checked)) {
                Some(m) => m.clone(),
                None => {
                    let desc = wgpu::ShaderModuleDescriptor {
                        label: Some(spec.shader.name),
                        source: wgpu::ShaderSource::Wgsl(spec.shader.compose().into()),
                    };
                    let m = self.checked(spec.shader.name, || {
                        if bounds_checked {
                            device.create_shader_module(desc)
                        } else {
                            let checks = wgpu::ShaderRuntimeChecks {
                                bounds_checks: false,
                                ..wgpu::ShaderRuntimeChecks::checked()
                            };
                            // SAFETY: only bounds checks are left out (loops stay bounded,
                            // divisions guarded), and only for a module marked
                            // Indexing::Proven: its contract keeps every index in range (see
                            // Indexing and the module's declaration), and the views it is
                            // bound to were checked against the sizes its indices assume.
                            unsafe { device.create_shader_module_trusted(desc, checks) }
                        }
                    })?;
                    modules.insert((spec.shader.key(), bounds_checked), m.clone());
                    m
                }
            }
        };
        let driver_cache = lock(&self.pipelines().driver).clone();
        let named: Vec<(&str, f64)> = constants.iter().map(|&(k, v)| (k.name(), v)).collect();
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
                    constants: &named,
                    zero_initialize_workgroup_memory: true,
                },
                cache: driver_cache.as_ref(),
            });
            Kernel { spec, constants: constants.to_vec(), pipeline, layout, bounds_checked }
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
        let max = self.limits().max_compute_workgroups_per_dimension;
        spill(groups, max).ok_or_else(|| {
            Error::limit(
                format!("workgroups for {what}"),
                groups,
                u64::from(max) * u64::from(max),
                "max_compute_workgroups_per_dimension squared",
            )
        })
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
        self.check_binding_limit(what, bytes, access)
    }

    /// Checks that `bytes` bound as `access` fit the device's storage-binding limit.
    fn check_binding_limit(&self, what: &str, bytes: u64, access: Access) -> Result<()> {
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
        view.check_in_buffer(&format!("view of `{what}`"))?;
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
        self.check_binding_limit(what, bytes, access)
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
        // No binding the kernel writes shares a byte with another binding (a caller's views
        // are checked by name where a plan takes them; this holds every dispatch to it).
        let names: Vec<String> =
            bound.iter().map(|b| format!("{} binding {}", kernel.spec.entry, b.binding)).collect();
        let bound_views: Vec<(&str, BufferView<'_>, Use)> = bindings
            .iter()
            .zip(&bound)
            .zip(&names)
            .map(|((b, bb), name)| {
                let used = if bb.access == Access::ReadWrite { Use::Write } else { Use::Read };
                (name.as_str(), BufferView::new(b.buffer, b.offset, b.size.max(4)), used)
            })
            .collect();
        check_disjoint(&bound_views)?;
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
            sizing: None,
            indirect: None,
        })
    }
}
