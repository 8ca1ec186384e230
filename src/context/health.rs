//! Whether the device still works: the device-lost callback moeflow installs, the errors wgpu
//! raises outside every error scope, and the error scopes around moeflow's own calls. The
//! context's methods of the same names (`device.rs`) call these with its device.

use std::sync::{Arc, Mutex};

use crate::error::{Error, GpuErrorKind, Result};
use crate::sync::lock;

/// A callback run when the device is lost: the reason and wgpu's message.
type LostCallback = Box<dyn Fn(wgpu::DeviceLostReason, &str) + Send>;

/// Whether the device is gone, recorded by the device-lost callback moeflow installs.
#[derive(Default)]
pub(super) struct DeviceHealth {
    lost: Mutex<Option<String>>,
    app_callback: Mutex<Option<LostCallback>>,
    /// The first error wgpu raised outside every error scope since the last
    /// [`Self::checked`] call (on a device moeflow made: see [`Self::keep_stray_errors`]),
    /// which that call reports.
    stray: Mutex<Option<(GpuErrorKind, String)>>,
}

impl DeviceHealth {
    /// The health of `device`, whose device-lost callback (wgpu keeps one per device) it
    /// installs: the loss is recorded, then the app's callback ([`Self::on_lost`]) runs.
    pub(super) fn watch(device: &wgpu::Device) -> Arc<Self> {
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
        health
    }

    /// Replaces wgpu's default uncaptured-error handler (a panic) on `device`: an error outside
    /// every error scope (work on this device's encoder finished by another context's call,
    /// say) is logged and kept, and the next [`Self::checked`] returns it as its `Err` before
    /// doing anything. Only for a device moeflow made: an app's device keeps the app's handler.
    pub(super) fn keep_stray_errors(self: &Arc<Self>, device: &wgpu::Device) {
        let health = Arc::downgrade(self);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            log::error!("moeflow: a GPU error outside moeflow's error scopes: {e}");
            if let Some(h) = health.upgrade() {
                lock(&h.stray).get_or_insert_with(|| (GpuErrorKind::of(&e), e.to_string()));
            }
        }));
    }

    /// Runs `callback` after the loss is recorded.
    pub(super) fn on_lost(&self, callback: LostCallback) {
        *lock(&self.app_callback) = Some(callback);
    }

    /// `Err(DeviceLost)` where the device-lost callback has run.
    pub(super) fn check(&self) -> Result<()> {
        match lock(&self.lost).as_ref() {
            Some(why) => Err(Error::DeviceLost(why.clone())),
            None => Ok(()),
        }
    }

    /// `Err(DeviceLost)` once `device` is lost or destroyed.
    ///
    /// wgpu reports a loss through the device-lost callback, which runs only when the device
    /// is polled: right after `device.destroy()` nothing has run it yet, and a buffer made
    /// then is silently invalid (mapping or unmapping it would panic inside wgpu). So until
    /// the loss is recorded, this polls the device without waiting, which runs a pending
    /// callback, and checks again.
    pub(super) fn check_alive(&self, device: &wgpu::Device) -> Result<()> {
        self.check()?;
        // A failed non-blocking poll says nothing about the device that the callback will
        // not say; only the recorded loss counts.
        let _ = device.poll(wgpu::PollType::Poll);
        self.check()
    }

    /// Runs `f` inside validation, out-of-memory and internal error scopes of `device` and
    /// turns the first captured error into `Err`, naming `context`; a device lost meanwhile
    /// is `Err(DeviceLost)`. A kept stray error ([`Self::keep_stray_errors`]) is returned
    /// first, before `f` runs.
    pub(super) fn checked<T>(
        &self,
        device: &wgpu::Device,
        context: &str,
        f: impl FnOnce() -> T,
    ) -> Result<T> {
        self.check_alive(device)?;
        if let Some((kind, message)) = lock(&self.stray).take() {
            let earlier = if cfg!(target_arch = "wasm32") {
                "earlier work on this device (a browser reports GPU errors after the call)"
            } else {
                "earlier work outside moeflow's error scopes"
            };
            return Err(Error::Gpu {
                context: format!("{earlier} (reported at `{context}`)"),
                kind,
                message,
            });
        }
        // In a browser a scope answers only through a promise, which this cannot wait for: no
        // scope is pushed there, so an error reaches the uncaptured-error handler, which keeps it
        // for the next call (`Context::from_wgpu`).
        #[cfg(target_arch = "wasm32")]
        {
            let value = f();
            self.check_alive(device)?;
            Ok(value)
        }
        #[cfg(not(target_arch = "wasm32"))]
        {
            let internal = device.push_error_scope(wgpu::ErrorFilter::Internal);
            let memory = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let validation = device.push_error_scope(wgpu::ErrorFilter::Validation);
            let value = f();
            let errors = [validation.pop(), memory.pop(), internal.pop()].map(|pop| ready_now(pop).flatten());
            self.check_alive(device)?;
            match errors.into_iter().flatten().next() {
                None => Ok(value),
                Some(e) => Err(Error::Gpu {
                    context: context.to_string(),
                    kind: GpuErrorKind::of(&e),
                    message: e.to_string(),
                }),
            }
        }
    }
}

/// The value of a future that is ready when first polled, else None (without waiting): native
/// wgpu resolves an error scope when it is popped, so no wait for the device ever blocks on one.
#[cfg(not(target_arch = "wasm32"))]
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
