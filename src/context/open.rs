//! Opening a [`Context`]: on the adapter a selector or `MOEFLOW_ADAPTER` names, on every
//! adapter, on a given adapter (with every optional feature moeflow uses), or around a device
//! and queue the application owns.

use std::sync::Mutex;

use super::adapter::{AdapterDescription, Capabilities};
use super::adapter::{backend_name, square_f16_f32_sizes};
use super::allocations::AllocationCounter;
use super::bounds::BoundsChecks;
use super::device::Context;
use super::health::DeviceHealth;
#[cfg(not(target_arch = "wasm32"))]
use super::selection::wgpu_adapters;
use super::selection::{ADAPTER_ENV, AdapterSelector, preference, runs_compute, wgpu_adapters_async};
use crate::error::{Error, Result};
use crate::pipeline::PipelineCache;

/// The wgpu version moeflow is built against (checked against Cargo.toml by a unit test).
pub const WGPU_VERSION: &str = "30.0.2";

/// Set to `1` (or `on`, `true`) to have [`Context::from_adapter`] (and the constructors that go
/// through it) enable wgpu's experimental cooperative matrices where the adapter offers them: the
/// opt-in to the cooperative-matrix GEMM kernels (`GemmVariant::CoopF16`), which the tuner then
/// times beside the exact ones. Off by default: wgpu marks the feature experimental, and on Vulkan
/// enabling it builds every module under the Vulkan memory model.
pub const COOPERATIVE_MATRIX_ENV: &str = "MOEFLOW_COOPERATIVE_MATRIX";

/// Whether [`COOPERATIVE_MATRIX_ENV`] asks for cooperative matrices.
fn cooperative_matrix_requested() -> bool {
    std::env::var(COOPERATIVE_MATRIX_ENV).is_ok_and(|v| matches!(v.trim(), "1" | "on" | "true"))
}

impl Context {
    /// Opens the adapter named by `MOEFLOW_ADAPTER` (see [`AdapterSelector`]), or the best
    /// one found: discrete, integrated, virtual, then CPU; Vulkan, Metal, DX12, then GL.
    ///
    /// # Errors
    /// An unparsable `MOEFLOW_ADAPTER`, as [`Self::with_selector`].
    #[cfg(not(target_arch = "wasm32"))]
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
    #[cfg(not(target_arch = "wasm32"))]
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
    #[cfg(not(target_arch = "wasm32"))]
    pub fn all() -> Result<Vec<Self>> {
        Context::matching(&AdapterSelector::default())
    }

    /// Opens one context per adapter that `selector` matches (in enumeration order). Adapters
    /// it does not match get no device, so a driver that fails at device creation (an EGL
    /// context on a headless GPU, say) does not stop work on the adapters asked for.
    ///
    /// # Errors
    /// The first adapter whose device request fails ([`Self::from_adapter`]).
    #[cfg(not(target_arch = "wasm32"))]
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
    #[cfg(not(target_arch = "wasm32"))]
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
        ctx.health.keep_stray_errors(&ctx.device);
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
    /// [`Context::on_device_lost`]. See [`instance`](crate::instance) for where the device should come from.
    ///
    /// In a browser (wasm32) moeflow also takes the device's uncaptured-error handler: WebGPU
    /// answers an error scope only through a promise, so moeflow pushes none there, and a GPU
    /// error of its work reaches that handler, which logs it and keeps it for the next call
    /// that checks its work to return as its `Err` (one call later than natively, where the
    /// scopes answer at once). An app that wants its own handler sets it after this.
    pub fn from_wgpu(device: wgpu::Device, queue: wgpu::Queue) -> Self {
        let description =
            AdapterDescription::new(&device.adapter_info(), device.features(), &device.limits());
        let health = DeviceHealth::watch(&device);
        #[cfg(target_arch = "wasm32")]
        health.keep_stray_errors(&device);
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
