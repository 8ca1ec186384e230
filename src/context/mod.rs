//! The [`Context`] that owns a device: adapter choice (`selection.rs`), what an adapter is and
//! can do (`adapter.rs`), bounds checks (`bounds.rs`), building kernels and dispatches
//! (`pipelines.rs`), buffers and submissions (`resources.rs`), waits as futures (`wait.rs`).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

mod adapter;
mod bounds;
mod pipelines;
mod resources;
mod selection;
pub(crate) mod wait;

pub use adapter::{AdapterDescription, Capabilities, KeyLimits};
pub use bounds::{BOUNDS_CHECKS_ENV, BoundsChecks};
pub use selection::{ADAPTER_ENV, AdapterSelector, adapters, instance, wgpu_adapters, wgpu_adapters_async};

use adapter::{backend_name, square_f16_f32_sizes};
use selection::{preference, ready_now, runs_compute};

use crate::error::{Error, GpuErrorKind, Result};
use crate::pipeline::PipelineCache;
use crate::sync::lock;

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
