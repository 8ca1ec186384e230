//! The [`Context`] itself: a device and queue, what they can do, moeflow's pipeline cache, and
//! the state kernel families keep per device.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use super::adapter::{AdapterDescription, Capabilities, KeyLimits};
use super::allocations::AllocationCounter;
use super::allocations::Allocations;
use super::bounds::BoundsChecks;
use super::health::DeviceHealth;
use crate::error::Result;
use crate::pipeline::PipelineCache;
use crate::sync::lock;

/// A wgpu device and queue, what they can do, and moeflow's pipeline cache.
///
/// Cheap to share by reference; kernels borrow it to build pipelines and bind groups.
pub struct Context {
    pub(super) device: wgpu::Device,
    pub(super) queue: wgpu::Queue,
    pub(super) description: AdapterDescription,
    pub(super) pipelines: PipelineCache,
    pub(super) bounds_checks: Mutex<BoundsChecks>,
    pub(super) health: Arc<DeviceHealth>,
    pub(super) allocated: AllocationCounter,
    /// State the kernel families keep per device, one value per type ([`Self::kept`]).
    pub(super) kept: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("adapter", &self.description).finish_non_exhaustive()
    }
}

impl Context {
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

    /// What moeflow has allocated on the device through this context so far.
    pub fn allocations(&self) -> Allocations {
        self.allocated.read()
    }

    /// Counts an allocation of `bytes` (see [`Allocations`]).
    pub(crate) fn note_allocation(&self, bytes: u64) {
        self.allocated.note(bytes);
    }

    /// Which modules get runtime bounds checks: [`BOUNDS_CHECKS_ENV`](crate::BOUNDS_CHECKS_ENV)'s choice when the
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
        self.health.on_lost(Box::new(callback));
    }

    /// `Err(DeviceLost)` once the device is lost or destroyed. Until wgpu has reported a loss,
    /// this polls the device without waiting (which runs a pending device-lost callback: right
    /// after `device.destroy()` none has run yet) and checks again.
    ///
    /// # Errors
    /// [`crate::Error::DeviceLost`] with wgpu's reason.
    pub fn check_alive(&self) -> Result<()> {
        self.health.check_alive(&self.device)
    }

    /// [`Self::check_alive`] as a closure that owns what it needs, for the end of a future
    /// that does not borrow the context.
    pub(crate) fn alive_check(&self) -> impl Fn() -> Result<()> + use<> {
        let (health, device) = (self.health.clone(), self.device.clone());
        move || health.check_alive(&device)
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes and turns the first
    /// captured error into `Err`; a device lost meanwhile is `Err(DeviceLost)`. An error kept
    /// from outside every scope since the last call (on a device moeflow made) is returned
    /// first, before `f` runs.
    pub(crate) fn checked<T>(&self, context: &str, f: impl FnOnce() -> T) -> Result<T> {
        self.health.checked(&self.device, context, f)
    }
}
