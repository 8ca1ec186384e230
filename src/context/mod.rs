//! Adapter choice, enabled features and limits, and the [`Context`] that owns a device.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};

mod pipelines;
mod resources;
pub(crate) mod wait;

use serde::{Deserialize, Serialize};

use crate::error::{Error, GpuErrorKind, Result};
use crate::pipeline::PipelineCache;
use crate::sync::lock;

/// The wgpu version moeflow is built against (checked against Cargo.toml by a unit test).
pub const WGPU_VERSION: &str = "30.0.2";

/// Environment variable read by [`Context::new`]: an [`AdapterSelector`] string.
pub const ADAPTER_ENV: &str = "MOEFLOW_ADAPTER";

/// Environment variable read when a context is made (see [`BoundsChecks`]): `everywhere`
/// builds every module with runtime bounds checks; unset or `where-unproven`, only the modules
/// whose indices are not proven in range. Any other value is logged and taken as `everywhere`.
pub const BOUNDS_CHECKS_ENV: &str = "MOEFLOW_BOUNDS_CHECKS";

/// Set to `1` (or `on`, `true`) to have [`Context::from_adapter`] (and the constructors that
/// go through it) enable wgpu's experimental cooperative matrices where the adapter offers
/// them: the opt-in to the cooperative-matrix GEMM kernels (`GemmVariant::CoopF16`), which
/// the tuner then times beside the exact ones. Off by default: wgpu marks the feature experimental, and on Vulkan enabling
/// it builds every module under the Vulkan memory model.
pub const COOPERATIVE_MATRIX_ENV: &str = "MOEFLOW_COOPERATIVE_MATRIX";

/// Whether [`COOPERATIVE_MATRIX_ENV`] asks for cooperative matrices.
fn cooperative_matrix_requested() -> bool {
    std::env::var(COOPERATIVE_MATRIX_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "on" | "true"))
}

/// Which shader modules a context builds with wgpu's runtime bounds checks.
///
/// The checks clamp every dynamic index into a fixed-size array (workgroup tiles, vector
/// lanes; on Vulkan even with robust buffer access) and, on back ends without robust buffer
/// access, every buffer index. The GEMM kernels, whose indices their contract proves in range
/// ([`Indexing::Proven`](crate::shader::Indexing::Proven)), need none. The choice applies to
/// modules built after it is made; both builds give the same bits (tests/gemm.rs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BoundsChecks {
    /// Modules proven in range without checks, the others with (the default).
    #[default]
    WhereUnproven,
    /// Every module with checks: tests, validation-layer runs, work on a kernel.
    Everywhere,
}

impl FromStr for BoundsChecks {
    type Err = Error;

    /// `where-unproven` or `everywhere`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "where-unproven" => Ok(BoundsChecks::WhereUnproven),
            "everywhere" => Ok(BoundsChecks::Everywhere),
            _ => {
                Err(Error::invalid(format!("bounds checks `{s}`: expected `where-unproven` or `everywhere`")))
            }
        }
    }
}

impl BoundsChecks {
    /// The choice named by [`BOUNDS_CHECKS_ENV`]; the checked one, with a log line, for a
    /// value that names neither.
    fn from_env() -> Self {
        match std::env::var(BOUNDS_CHECKS_ENV) {
            Err(_) => BoundsChecks::default(),
            Ok(v) => v.parse().unwrap_or_else(|e| {
                log::warn!("moeflow: {BOUNDS_CHECKS_ENV}: {e}; building every module with bounds checks");
                BoundsChecks::Everywhere
            }),
        }
    }
}

/// Optional features moeflow enables when the adapter has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Capabilities {
    /// Timestamp queries around passes (`TIMESTAMP_QUERY`).
    pub timestamps: bool,
    /// Timestamp writes inside passes and encoders.
    pub timestamps_inside_passes: bool,
    /// Subgroup operations in shaders (`SUBGROUP`).
    pub subgroups: bool,
    /// `f16` in shaders (`SHADER_F16`).
    pub shader_f16: bool,
    /// A driver pipeline cache that can be saved and loaded (`PIPELINE_CACHE`, Vulkan only;
    /// see [`Context::save_pipeline_cache`]).
    #[serde(default)]
    pub pipeline_cache: bool,
    /// wgpu's experimental cooperative matrices (`EXPERIMENTAL_COOPERATIVE_MATRIX`), enabled
    /// only on request ([`COOPERATIVE_MATRIX_ENV`]).
    #[serde(default)]
    pub cooperative_matrix: bool,
}

impl Capabilities {
    fn from_features(f: wgpu::Features) -> Self {
        Capabilities {
            timestamps: f.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_inside_passes: f.contains(
                wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
                    | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS,
            ),
            subgroups: f.contains(wgpu::Features::SUBGROUP),
            shader_f16: f.contains(wgpu::Features::SHADER_F16),
            pipeline_cache: f.contains(wgpu::Features::PIPELINE_CACHE),
            cooperative_matrix: f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
        }
    }

    /// The wgpu features that moeflow asks for, as far as `available` has them.
    pub(crate) fn wanted(available: wgpu::Features) -> wgpu::Features {
        let wanted = wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::SUBGROUP
            | wgpu::Features::SHADER_F16
            | wgpu::Features::PIPELINE_CACHE;
        available & wanted
    }
}

/// The limits that bound moeflow's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KeyLimits {
    /// Largest storage-buffer binding, in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// Largest buffer, in bytes.
    pub max_buffer_size: u64,
    /// Workgroup memory per workgroup, in bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations per workgroup.
    pub max_compute_invocations_per_workgroup: u32,
    /// Workgroups per dispatch dimension.
    pub max_compute_workgroups_per_dimension: u32,
    /// Storage buffers visible to one compute shader.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Largest uniform-buffer binding, in bytes (0 in records older than this field).
    #[serde(default)]
    pub max_uniform_buffer_binding_size: u64,
    /// Alignment of a uniform binding's offset, in bytes (0 in records older than this field).
    #[serde(default)]
    pub min_uniform_buffer_offset_alignment: u32,
    /// Sampled textures visible to one compute shader (0 in records older than this field).
    #[serde(default)]
    pub max_sampled_textures_per_shader_stage: u32,
    /// Largest width and height of a 2-D texture, in texels (0 in older records).
    #[serde(default)]
    pub max_texture_dimension_2d: u32,
    /// Most layers of a 2-D texture array (0 in older records).
    #[serde(default)]
    pub max_texture_array_layers: u32,
}

impl From<&wgpu::Limits> for KeyLimits {
    fn from(l: &wgpu::Limits) -> Self {
        KeyLimits {
            max_storage_buffer_binding_size: l.max_storage_buffer_binding_size,
            max_buffer_size: l.max_buffer_size,
            max_compute_workgroup_storage_size: l.max_compute_workgroup_storage_size,
            max_compute_invocations_per_workgroup: l.max_compute_invocations_per_workgroup,
            max_compute_workgroups_per_dimension: l.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_shader_stage: l.max_storage_buffers_per_shader_stage,
            max_uniform_buffer_binding_size: l.max_uniform_buffer_binding_size,
            min_uniform_buffer_offset_alignment: l.min_uniform_buffer_offset_alignment,
            max_sampled_textures_per_shader_stage: l.max_sampled_textures_per_shader_stage,
            max_texture_dimension_2d: l.max_texture_dimension_2d,
            max_texture_array_layers: l.max_texture_array_layers,
        }
    }
}

/// One adapter as `moeflow::adapters()` and the benchmark records describe it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AdapterDescription {
    /// Backend name: `vulkan`, `metal`, `dx12` or `gl`.
    pub backend: String,
    /// Adapter name as the driver reports it.
    pub name: String,
    /// Driver name.
    pub driver: String,
    /// Driver version or build details.
    pub driver_info: String,
    /// PCI vendor id (0 where the backend has none).
    pub vendor: u32,
    /// PCI device id (0 where the backend has none).
    pub device: u32,
    /// `DiscreteGpu`, `IntegratedGpu`, `VirtualGpu`, `Cpu` or `Other`.
    pub device_type: String,
    /// Features moeflow would enable (or, for a [`Context`], did enable).
    pub capabilities: Capabilities,
    /// Limits moeflow checks against.
    pub limits: KeyLimits,
    /// The smallest and largest subgroup the adapter may run (`[0, 0]` in older records).
    #[serde(default)]
    pub subgroup_sizes: [u32; 2],
    /// The sizes `n` of the square `n × n × n` cooperative-matrix multiply-adds with f16
    /// inputs and f32 accumulators the adapter reports (subgroup scope), ascending; empty
    /// where cooperative matrices are not enabled (see [`Context::set_cooperative_matrix`]).
    #[serde(default)]
    pub cooperative_f16_sizes: Vec<u32>,
}

impl AdapterDescription {
    pub(crate) fn new(info: &wgpu::AdapterInfo, features: wgpu::Features, limits: &wgpu::Limits) -> Self {
        AdapterDescription {
            backend: backend_name(info.backend).to_string(),
            name: info.name.clone(),
            driver: info.driver.clone(),
            driver_info: info.driver_info.clone(),
            vendor: info.vendor,
            device: info.device,
            device_type: format!("{:?}", info.device_type),
            capabilities: Capabilities::from_features(features),
            limits: KeyLimits::from(limits),
            subgroup_sizes: [info.subgroup_min_size, info.subgroup_max_size],
            cooperative_f16_sizes: Vec::new(),
        }
    }

    /// True for adapters that run shaders on the CPU (lavapipe, llvmpipe, WARP).
    pub fn is_cpu(&self) -> bool {
        self.device_type == "Cpu"
    }

    /// A short file-name-safe label such as `vulkan-llvmpipe`.
    pub fn slug(&self) -> String {
        let name: String = self
            .name
            .chars()
            .take_while(|c| *c != '(')
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .collect();
        let name = name.trim_matches('-').split('-').filter(|s| !s.is_empty()).collect::<Vec<_>>().join("-");
        format!("{}-{}", self.backend, name)
    }
}

impl fmt::Display for AdapterDescription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {} ({}, {})", self.name, self.backend, self.device_type, self.driver_info)
    }
}

fn backend_name(b: wgpu::Backend) -> &'static str {
    match b {
        wgpu::Backend::Vulkan => "vulkan",
        wgpu::Backend::Metal => "metal",
        wgpu::Backend::Dx12 => "dx12",
        wgpu::Backend::Gl => "gl",
        wgpu::Backend::BrowserWebGpu => "webgpu",
        wgpu::Backend::Noop => "noop",
    }
}

/// Which adapter to use: a backend, a name substring, or both.
///
/// Parsed from strings such as `vulkan`, `gl`, `vulkan:llvmpipe`, `metal`, `dx12`, or a bare
/// name substring such as `nvidia`. An empty string selects any adapter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterSelector {
    /// Backends to consider.
    pub backends: wgpu::Backends,
    /// Case-insensitive substring of the adapter name.
    pub name: Option<String>,
}

impl Default for AdapterSelector {
    fn default() -> Self {
        AdapterSelector { backends: wgpu::Backends::all(), name: None }
    }
}

fn parse_backend(s: &str) -> Option<wgpu::Backends> {
    match s.to_ascii_lowercase().as_str() {
        "vulkan" | "vk" => Some(wgpu::Backends::VULKAN),
        "metal" | "mtl" => Some(wgpu::Backends::METAL),
        "dx12" | "d3d12" => Some(wgpu::Backends::DX12),
        "gl" | "gles" | "opengl" => Some(wgpu::Backends::GL),
        _ => None,
    }
}

impl FromStr for AdapterSelector {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(AdapterSelector::default());
        }
        let (head, tail) = match s.split_once(':') {
            Some((h, t)) => (h, Some(t)),
            None => (s, None),
        };
        match (parse_backend(head), tail) {
            (Some(backends), tail) => Ok(AdapterSelector {
                backends,
                name: tail.map(str::trim).filter(|t| !t.is_empty()).map(str::to_string),
            }),
            (None, Some(_)) => Err(Error::invalid(format!(
                "adapter selector `{s}`: `{head}` is not a backend (vulkan, metal, dx12, gl)"
            ))),
            (None, None) => {
                Ok(AdapterSelector { backends: wgpu::Backends::all(), name: Some(head.to_string()) })
            }
        }
    }
}

impl AdapterSelector {
    fn matches(&self, info: &wgpu::AdapterInfo) -> bool {
        self.backends.contains(wgpu::Backends::from(info.backend)) && self.matches_name(&info.name)
    }

    fn matches_name(&self, name: &str) -> bool {
        self.name.as_ref().is_none_or(|n| name.to_lowercase().contains(&n.to_lowercase()))
    }
}

/// The one wgpu instance that every [`Context`] moeflow opens on Vulkan, Metal or DX12 shares
/// (every backend but GL, narrowed by wgpu's own `WGPU_BACKEND` variable if set).
///
/// wgpu tells resources of different devices apart only within one instance: a buffer made
/// through another instance can be taken for an unrelated buffer of this one, where within one
/// instance it is refused. An app that brings its own device ([`Context::from_wgpu`]) should
/// create it from an adapter of [`wgpu_adapters`] (or make sure every buffer it hands to
/// moeflow comes from the same instance as that device).
///
/// GL is the exception: wgpu 30 runs every device of one instance on a single EGL context
/// behind a lock that panics after six seconds of waiting, so GL adapters come from an
/// instance of their own each time (see [`wgpu_adapters`]), and wgpu cannot tell the buffers
/// of two GL contexts apart. Keep each GL [`Context`]'s buffers to that context.
pub fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = instance_backends().difference(wgpu::Backends::GL);
        wgpu::Instance::new(desc)
    })
}

/// The sizes `n` of the `n × n × n` f16 × f16 → f32 configurations among `configurations`
/// with `n` 8 or 16 (the cooperative-matrix sizes WGSL has), ascending, once each.
fn square_f16_f32_sizes(configurations: &[wgpu::CooperativeMatrixProperties]) -> Vec<u32> {
    use wgpu::CooperativeScalarType::{F16, F32};
    let mut sizes: Vec<u32> = configurations
        .iter()
        .filter(|c| c.ab_type == F16 && c.cr_type == F32)
        .filter(|c| c.m_size == c.n_size && c.n_size == c.k_size && matches!(c.m_size, 8 | 16))
        .map(|c| c.m_size)
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Every adapter's context for the unit tests; none (the test passes, saying it skipped) only
/// where `MOEFLOW_REQUIRE_ADAPTER` is not 1.
#[cfg(test)]
pub(crate) fn test_contexts() -> Vec<Context> {
    let ctxs = Context::all().expect("devices");
    if ctxs.is_empty() {
        assert_ne!(std::env::var("MOEFLOW_REQUIRE_ADAPTER").as_deref(), Ok("1"), "no adapter");
        eprintln!("skipped: no adapter");
    }
    ctxs
}

/// Every adapter wgpu can see that runs compute shaders: those of [`instance`], enumerated
/// once per process and kept, then the GL adapters of a fresh GL-only instance. An adapter
/// without compute shaders (a GL context below 4.3 or ES 3.1, as EGL gives on some headless
/// GPUs) can run nothing of moeflow's; it is left out with a log line.
pub fn wgpu_adapters() -> Vec<wgpu::Adapter> {
    pollster::block_on(wgpu_adapters_async())
}

/// [`wgpu_adapters`], awaiting wgpu's enumeration instead of blocking on it.
pub async fn wgpu_adapters_async() -> Vec<wgpu::Adapter> {
    static SHARED: OnceLock<Vec<wgpu::Adapter>> = OnceLock::new();
    let mut adapters = match SHARED.get() {
        Some(shared) => shared.clone(),
        None => {
            let found =
                instance().enumerate_adapters(instance_backends().difference(wgpu::Backends::GL)).await;
            // Another caller may have enumerated meanwhile: the first list is kept.
            SHARED.get_or_init(|| found).clone()
        }
    };
    let gl = instance_backends().intersection(wgpu::Backends::GL);
    if !gl.is_empty() {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
        desc.backends = gl;
        adapters.extend(wgpu::Instance::new(desc).enumerate_adapters(gl).await);
    }
    adapters.retain(|a| a.get_info().backend != wgpu::Backend::Noop);
    adapters.retain(|a| {
        let ok = runs_compute(&a.get_downlevel_capabilities());
        if !ok {
            let i = a.get_info();
            log::warn!(
                "moeflow: leaving out {} ({}): it has no compute shaders or no indirect dispatch",
                i.name,
                backend_name(i.backend)
            );
        }
        ok
    });
    adapters
}

/// The value of a future that is ready when first polled, else None (without waiting): native
/// wgpu resolves an error scope when it is popped, so no wait for the device ever blocks on one.
/// Where one is not ready (a browser's), its error goes to the device's uncaptured-error
/// handler instead, with a log line.
fn ready_now<T>(fut: impl std::future::Future<Output = T>) -> Option<T> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match std::pin::pin!(fut).poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => {
            log::warn!("moeflow: an error scope did not resolve when popped; its error is not checked here");
            None
        }
    }
}

/// Whether an adapter with these capabilities runs compute shaders, with grids read from the
/// device (a plan for a maximum token count sizes its grids there; every compute back end has
/// both: GL from 4.3 and ES 3.1, which brought compute shaders).
fn runs_compute(caps: &wgpu::DownlevelCapabilities) -> bool {
    caps.flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS | wgpu::DownlevelFlags::INDIRECT_EXECUTION)
}

fn instance_backends() -> wgpu::Backends {
    wgpu::Backends::from_env().unwrap_or_default()
}

/// Rank for choosing a default: real GPUs first, then by backend.
fn preference(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let device = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let backend = match info.backend {
        wgpu::Backend::Vulkan => 0,
        wgpu::Backend::Metal => 1,
        wgpu::Backend::Dx12 => 2,
        wgpu::Backend::Gl => 3,
        _ => 4,
    };
    (device, backend)
}

/// Every adapter wgpu can see, described with the features and limits moeflow uses.
pub fn adapters() -> Vec<AdapterDescription> {
    wgpu_adapters()
        .iter()
        .map(|a| AdapterDescription::new(&a.get_info(), Capabilities::wanted(a.features()), &a.limits()))
        .collect()
}

/// A callback run when the device is lost: the reason and wgpu's message.
type LostCallback = Box<dyn Fn(wgpu::DeviceLostReason, &str) + Send>;

/// Whether the device is gone, recorded by the device-lost callback moeflow installs.
#[derive(Default)]
struct DeviceHealth {
    lost: Mutex<Option<String>>,
    app_callback: Mutex<Option<LostCallback>>,
    /// The first error wgpu raised outside every error scope since the last
    /// [`Context::checked`] call (on a device moeflow made: see
    /// [`Context::from_adapter_async`]), which that call reports.
    stray: Mutex<Option<(GpuErrorKind, String)>>,
}

impl DeviceHealth {
    /// `Err(DeviceLost)` where the device-lost callback has run.
    fn check(&self) -> Result<()> {
        match lock(&self.lost).as_ref() {
            Some(why) => Err(Error::DeviceLost(why.clone())),
            None => Ok(()),
        }
    }
}

/// What moeflow has allocated on a context's device since the context was made: every buffer
/// (weights, scratch, parameters, staging for uploads and read-backs) and texture it created,
/// however long each lived. An engine's steady state makes none: a forward of a plan
/// allocates nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Allocations {
    /// Buffers and textures created.
    pub count: u64,
    /// Their bytes.
    pub bytes: u64,
}

#[derive(Debug, Default)]
struct AllocationCounter {
    count: std::sync::atomic::AtomicU64,
    bytes: std::sync::atomic::AtomicU64,
}

/// A wgpu device and queue, what they can do, and moeflow's pipeline cache.
///
/// Cheap to share by reference; kernels borrow it to build pipelines and bind groups.
pub struct Context {
    device: wgpu::Device,
    queue: wgpu::Queue,
    description: AdapterDescription,
    pipelines: PipelineCache,
    bounds_checks: Mutex<BoundsChecks>,
    health: Arc<DeviceHealth>,
    allocated: AllocationCounter,
    /// State the kernel families keep per device, one value per type ([`Self::kept`]).
    kept: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("adapter", &self.description).finish_non_exhaustive()
    }
}

impl Context {
    /// Opens the adapter named by `MOEFLOW_ADAPTER` (see [`AdapterSelector`]), or the best
    /// one found: discrete, integrated, virtual, then CPU; Vulkan, Metal, DX12, then GL.
    ///
    /// # Errors
    /// An unparsable `MOEFLOW_ADAPTER`, as [`Self::with_selector`].
    pub fn new() -> Result<Self> {
        pollster::block_on(Context::new_async())
    }

    /// [`Self::new`], awaiting the device instead of blocking on it.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub async fn new_async() -> Result<Self> {
        let selector = match std::env::var(ADAPTER_ENV) {
            Ok(s) => s.parse()?,
            Err(_) => AdapterSelector::default(),
        };
        Context::with_selector_async(&selector).await
    }

    /// Opens the best adapter that `selector` matches.
    ///
    /// # Errors
    /// [`Error::NoAdapter`] when nothing matches (the message lists what exists);
    /// [`Error::MissingFeature`] or the device request's error from [`Self::from_adapter`].
    pub fn with_selector(selector: &AdapterSelector) -> Result<Self> {
        pollster::block_on(Context::with_selector_async(selector))
    }

    /// [`Self::with_selector`], awaiting the device instead of blocking on it.
    ///
    /// # Errors
    /// As [`Self::with_selector`].
    pub async fn with_selector_async(selector: &AdapterSelector) -> Result<Self> {
        let adapters = wgpu_adapters_async().await;
        let found: Vec<String> = adapters
            .iter()
            .map(|a| {
                let i = a.get_info();
                format!("{} ({})", i.name, backend_name(i.backend))
            })
            .collect();
        let best = adapters
            .into_iter()
            .filter(|a| selector.matches(&a.get_info()))
            .min_by_key(|a| preference(&a.get_info()));
        match best {
            Some(adapter) => Context::from_adapter_async(&adapter).await,
            None if found.is_empty() => Err(Error::NoAdapter(
                "wgpu found no adapter; on Debian/Ubuntu `apt-get install mesa-vulkan-drivers` \
                 provides a software Vulkan driver (lavapipe)"
                    .into(),
            )),
            None => Err(Error::NoAdapter(format!("none matches {selector:?}; found: {}", found.join(", ")))),
        }
    }

    /// Opens one context per adapter wgpu can see (in enumeration order).
    ///
    /// # Errors
    /// As [`Self::matching`].
    pub fn all() -> Result<Vec<Self>> {
        Context::matching(&AdapterSelector::default())
    }

    /// Opens one context per adapter that `selector` matches (in enumeration order). Adapters
    /// it does not match get no device, so a driver that fails at device creation (an EGL
    /// context on a headless GPU, say) does not stop work on the adapters asked for.
    ///
    /// # Errors
    /// The first adapter whose device request fails ([`Self::from_adapter`]).
    pub fn matching(selector: &AdapterSelector) -> Result<Vec<Self>> {
        wgpu_adapters()
            .iter()
            .filter(|a| selector.matches(&a.get_info()))
            .map(Context::from_adapter)
            .collect()
    }

    /// Creates a device on `adapter` with every optional feature moeflow uses that the
    /// adapter has, and the adapter's full limits.
    ///
    /// # Errors
    /// [`Error::MissingFeature`] for an adapter without compute shaders or indirect dispatch;
    /// the device request's
    /// error.
    pub fn from_adapter(adapter: &wgpu::Adapter) -> Result<Self> {
        pollster::block_on(Context::from_adapter_async(adapter))
    }

    /// [`Self::from_adapter`], awaiting the device instead of blocking on it.
    ///
    /// # Errors
    /// As [`Self::from_adapter`].
    pub async fn from_adapter_async(adapter: &wgpu::Adapter) -> Result<Self> {
        if !runs_compute(&adapter.get_downlevel_capabilities()) {
            let i = adapter.get_info();
            return Err(Error::MissingFeature(format!(
                "{} ({}) has no compute shaders or no indirect dispatch (GL needs 4.3 or ES 3.1)",
                i.name,
                backend_name(i.backend)
            )));
        }
        let coop = cooperative_matrix_requested()
            && adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        let mut features = Capabilities::wanted(adapter.features());
        let mut experimental_features = wgpu::ExperimentalFeatures::disabled();
        if coop {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
            // SAFETY: asked for through COOPERATIVE_MATRIX_ENV, whose documentation says the
            // feature is wgpu's experimental one; moeflow uses it only in the CoopF16 kernels,
            // each checked against the CPU reference on the device before it runs.
            experimental_features = unsafe { wgpu::ExperimentalFeatures::enabled() };
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("moeflow"),
            required_features: features,
            required_limits: adapter.limits(),
            experimental_features,
            ..Default::default()
        };
        let (device, queue) = adapter.request_device(&desc).await?;
        let mut ctx = Context::from_wgpu(device, queue);
        ctx.keep_stray_errors();
        if coop {
            ctx.set_cooperative_matrix(&adapter.cooperative_matrix_properties());
        }
        Ok(ctx)
    }

    /// Tells moeflow which cooperative-matrix configurations the adapter reported
    /// (`wgpu::Adapter::cooperative_matrix_properties`), for a device the application made with
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX` ([`Context::from_wgpu`] has no adapter to ask). Only
    /// square 8 × 8 × 8 and 16 × 16 × 16 multiply-adds of f16 into f32 at subgroup scope are
    /// kept; on a device without the feature this records nothing.
    pub fn set_cooperative_matrix(&mut self, configurations: &[wgpu::CooperativeMatrixProperties]) {
        self.description.cooperative_f16_sizes = if self.description.capabilities.cooperative_matrix {
            square_f16_f32_sizes(configurations)
        } else {
            Vec::new()
        };
    }

    /// Wraps a device and queue that the application already owns. moeflow uses only the
    /// features and limits the device was created with, and says which in [`Self::capabilities`].
    ///
    /// moeflow installs the device's device-lost callback (wgpu keeps one per device) so that
    /// every later call returns [`Error::DeviceLost`] instead of working on a dead device; an
    /// app that wants to hear of the loss too passes its own callback to
    /// [`Context::on_device_lost`]. See [`instance`] for where the device should come from.
    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let description =
            AdapterDescription::new(&device.adapter_info(), device.features(), &device.limits());
        let health = Arc::new(DeviceHealth::default());
        let recorder = Arc::downgrade(&health);
        device.set_device_lost_callback(move |reason, message| {
            if let Some(h) = recorder.upgrade() {
                let text = format!("{reason:?}: {message}");
                *lock(&h.lost) = Some(text);
                if let Some(app) = lock(&h.app_callback).as_ref() {
                    app(reason, &message);
                }
            }
        });
        Context {
            device,
            queue,
            description,
            pipelines: PipelineCache::default(),
            bounds_checks: Mutex::new(BoundsChecks::from_env()),
            health,
            allocated: AllocationCounter::default(),
            kept: Mutex::default(),
        }
    }

    /// Replaces wgpu's default uncaptured-error handler (a panic) on a device moeflow made:
    /// an error outside every error scope (work on this device's encoder finished by another
    /// context's call, say) is logged and kept, and the next call that checks its work
    /// ([`Self::checked`]) returns it as its `Err` before doing anything. A device the app made
    /// ([`Self::from_wgpu`]) keeps the app's handler.
    fn keep_stray_errors(&self) {
        let health = Arc::downgrade(&self.health);
        self.device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("moeflow: a GPU error outside moeflow's error scopes: {e}");
            if let Some(h) = health.upgrade() {
                lock(&h.stray).get_or_insert_with(|| (GpuErrorKind::of(&e), e.to_string()));
            }
        }));
    }

    /// What moeflow has allocated on the device through this context so far.
    pub fn allocations(&self) -> Allocations {
        use std::sync::atomic::Ordering::Relaxed;
        Allocations { count: self.allocated.count.load(Relaxed), bytes: self.allocated.bytes.load(Relaxed) }
    }

    /// Counts an allocation of `bytes` (see [`Allocations`]).
    pub(crate) fn note_allocation(&self, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.allocated.count.fetch_add(1, Relaxed);
        self.allocated.bytes.fetch_add(bytes, Relaxed);
    }

    /// Which modules get runtime bounds checks: [`BOUNDS_CHECKS_ENV`]'s choice when the
    /// context was made, or the last [`Self::set_bounds_checks`].
    pub fn bounds_checks(&self) -> BoundsChecks {
        *lock(&self.bounds_checks)
    }

    /// Builds every later module as `checks` says (kernels built before keep their build).
    pub fn set_bounds_checks(&self, checks: BoundsChecks) {
        *lock(&self.bounds_checks) = checks;
    }

    /// Runs `callback` (after moeflow has recorded the loss) when the device is lost.
    pub fn on_device_lost(&self, callback: impl Fn(wgpu::DeviceLostReason, &str) + Send + 'static) {
        *lock(&self.health.app_callback) = Some(Box::new(callback));
    }

    /// [`Self::check_alive`] as a closure that owns what it needs, for the end of a future
    /// that does not borrow the context.
    pub(crate) fn alive_check(&self) -> impl Fn() -> Result<()> + use<> {
        let (health, device) = (self.health.clone(), self.device.clone());
        move || {
            health.check()?;
            let _ = device.poll(wgpu::PollType::Poll);
            health.check()
        }
    }

    /// `Err(DeviceLost)` once the device is lost or destroyed.
    ///
    /// wgpu reports a loss through the device-lost callback, which runs only when the device
    /// is polled: right after `device.destroy()` nothing has run it yet, and a buffer made
    /// then is silently invalid (mapping or unmapping it would panic inside wgpu). So until
    /// the loss is recorded, this polls the device without waiting, which runs a pending
    /// callback, and checks again.
    ///
    /// # Errors
    /// [`Error::DeviceLost`] with wgpu's reason.
    pub fn check_alive(&self) -> Result<()> {
        self.health.check()?;
        // A failed non-blocking poll says nothing about the device that the callback will
        // not say; only the recorded loss counts.
        let _ = self.device.poll(wgpu::PollType::Poll);
        self.health.check()
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns the first
    /// captured error into `Err`; a device lost meanwhile is `Err(DeviceLost)`.
    ///
    /// An error kept from outside every scope since the last call (see
    /// `keep_stray_errors`) is returned first, before `f` runs.
    pub(crate) fn checked<T>(&self, context: &str, f: impl FnOnce() -> T) -> Result<T> {
        self.check_alive()?;
        if let Some((kind, message)) = lock(&self.health.stray).take() {
            return Err(Error::Gpu {
                context: format!("earlier work outside moeflow's error scopes (reported at `{context}`)"),
                kind,
                message,
            });
        }
        let device = self.device();
        let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
        let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let value = f();
        let errors = [validation.pop(), memory.pop(), internal.pop()].map(|pop| ready_now(pop).flatten());
        self.check_alive()?;
        match errors.into_iter().flatten().next() {
            None => Ok(value),
            Some(e) => Err(Error::Gpu {
                context: context.to_string(),
                kind: GpuErrorKind::of(&e),
                message: e.to_string(),
            }),
        }
    }

    /// The device.
    pub fn device(&self) -> &wgpu::Device {
        &self.device
    }

    /// The queue.
    pub fn queue(&self) -> &wgpu::Queue {
        &self.queue
    }

    /// What the adapter is and what was enabled on this device.
    pub fn adapter(&self) -> &AdapterDescription {
        &self.description
    }

    /// Optional features enabled on this device.
    pub fn capabilities(&self) -> Capabilities {
        self.description.capabilities
    }

    /// The device's limits that moeflow checks.
    pub fn limits(&self) -> KeyLimits {
        self.description.limits
    }

    pub(crate) fn pipelines(&self) -> &PipelineCache {
        &self.pipelines
    }

    /// The state of type `T` kept for this device: made with `T::default()` on first use, then
    /// the same value for the context's life. A kernel family keeps what it learns about the
    /// device (the cooperative-matrix GEMM's verdicts, say) in a type of its own, so the
    /// context holds it without knowing the family.
    pub(crate) fn kept<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let any = lock(&self.kept).entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default())).clone();
        match any.downcast::<T>() {
            Ok(kept) => kept,
            // Unreachable: the map holds a `T` under `TypeId::of::<T>()` only.
            Err(_) => Arc::new(T::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only square f16 × f16 → f32 configurations of 8 or 16 count (NVIDIA also reports
    /// 16 × 8 × 16, f16 accumulators and integer ones), each size once, ascending.
    #[test]
    fn cooperative_sizes_are_the_square_f16_into_f32_ones() {
        use wgpu::CooperativeScalarType::{F16, F32, I32};
        let c = |m, n, k, ab, cr| wgpu::CooperativeMatrixProperties {
            m_size: m,
            n_size: n,
            k_size: k,
            ab_type: ab,
            cr_type: cr,
            saturating_accumulation: false,
        };
        let reported = [
            c(16, 16, 16, F16, F16),
            c(16, 8, 16, F16, F32),
            c(16, 16, 16, F16, F32),
            c(8, 8, 8, F32, F32),
            c(16, 16, 16, I32, I32),
            c(8, 8, 8, F16, F32),
            c(16, 16, 16, F16, F32),
        ];
        assert_eq!(square_f16_f32_sizes(&reported), vec![8, 16]);
        assert!(square_f16_f32_sizes(&reported[..2]).is_empty());
    }

    #[test]
    fn adapters_without_compute_shaders_are_left_out() {
        let full = wgpu::DownlevelCapabilities::default();
        assert!(runs_compute(&full));
        let gl_es3 = wgpu::DownlevelCapabilities {
            flags: full.flags.difference(wgpu::DownlevelFlags::COMPUTE_SHADERS),
            ..full.clone()
        };
        assert!(!runs_compute(&gl_es3));
        let no_indirect = wgpu::DownlevelCapabilities {
            flags: full.flags.difference(wgpu::DownlevelFlags::INDIRECT_EXECUTION),
            ..full
        };
        assert!(!runs_compute(&no_indirect));
        // Every adapter moeflow lists can run compute.
        assert!(super::wgpu_adapters().iter().all(|a| runs_compute(&a.get_downlevel_capabilities())));
    }

    #[test]
    fn bounds_checks_parse() {
        assert_eq!("everywhere".parse::<BoundsChecks>().unwrap(), BoundsChecks::Everywhere);
        assert_eq!("where-unproven".parse::<BoundsChecks>().unwrap(), BoundsChecks::WhereUnproven);
        let e = "off".parse::<BoundsChecks>().unwrap_err().to_string();
        assert!(e.contains("`off`"), "{e}");
    }

    #[test]
    fn selector_parses_backend_and_name() {
        let s: AdapterSelector = "vulkan:llvmpipe".parse().unwrap();
        assert_eq!(s.backends, wgpu::Backends::VULKAN);
        assert_eq!(s.name.as_deref(), Some("llvmpipe"));
        let s: AdapterSelector = "GL".parse().unwrap();
        assert_eq!(s.backends, wgpu::Backends::GL);
        assert_eq!(s.name, None);
        let s: AdapterSelector = "nvidia".parse().unwrap();
        assert_eq!(s.backends, wgpu::Backends::all());
        assert_eq!(s.name.as_deref(), Some("nvidia"));
        assert_eq!("".parse::<AdapterSelector>().unwrap(), AdapterSelector::default());
        assert!("vulcan:llvmpipe".parse::<AdapterSelector>().is_err());
    }
}
