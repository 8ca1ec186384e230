//! Kernel specifications: how a kernel binds its resources and sizes its workgroups, the
//! pipeline constants it is specialised with, and what naga reads off its WGSL.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::live::{LiveCount, LiveValue};
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

/// Pipeline-constant values by their typed keys (each one declared by the kernel's module:
/// [`ShaderSource::overrides`]).
pub type Constants = [(Override, f64)];
