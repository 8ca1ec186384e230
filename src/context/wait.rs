//! Waiting for the device: one future per wait, resolved by a device callback
//! (`on_submitted_work_done`, `map_async`). Natively, wgpu runs callbacks only while the device
//! is polled, so someone must poll it: the blocking methods poll on the waiting thread (they
//! wrap the futures with `pollster::block_on`); the `_async` methods poll on a thread of their
//! own that wakes the awaiting task, so an async caller's thread is never blocked. On GPUs that
//! thread blocks in `device.poll` until the submission is done; on CPU adapters (lavapipe,
//! llvmpipe) it polls without blocking and sleeps 50 µs between polls, so that it is not a
//! thread the driver's own shader threads are descheduled behind. In a browser (wasm32, the
//! WebGPU back end) the browser's event loop runs the callbacks: a wait registers its task's
//! waker and the callback wakes it; there are no blocking methods and no threads.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};

use super::device::Context;
use super::health::DeviceHealth;
use crate::error::Result;
#[cfg(not(target_arch = "wasm32"))]
use crate::error::{Error, GpuErrorKind};
use crate::sync::lock;

/// Pause between polls of the device on CPU adapters.
#[cfg(not(target_arch = "wasm32"))]
const CPU_ADAPTER_POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// How a wait is driven to its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Driver {
    /// Polled on the thread that polls the future, which blocks until the wait is over (the
    /// blocking methods; natively only).
    #[cfg(not(target_arch = "wasm32"))]
    Inline,
    /// Awaited: natively, polled on a thread of its own, which wakes the task when the wait is
    /// over; in a browser, ended by the device callback, which wakes the task.
    Await,
}

/// The state a device callback and a wait share.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    fired: AtomicBool,
    /// How the driver thread's polling ended (natively, with [`Driver::Await`]).
    #[cfg(not(target_arch = "wasm32"))]
    outcome: Mutex<Option<Result<()>>>,
    waker: Mutex<Option<Waker>>,
}

impl Signal {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Signal::default())
    }

    /// Marks the awaited event as happened (called from the device callback); in a browser,
    /// wakes the task awaiting it.
    pub(crate) fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        #[cfg(target_arch = "wasm32")]
        if let Some(waker) = lock(&self.waker).take() {
            waker.wake();
        }
    }

    fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

/// What a wait polls: the device, whether it runs on the CPU, its health, and the submission
/// whose end is awaited where there is one.
#[cfg(not(target_arch = "wasm32"))]
struct Poller {
    device: wgpu::Device,
    cpu: bool,
    health: Arc<DeviceHealth>,
    submission: Option<wgpu::SubmissionIndex>,
}

#[cfg(not(target_arch = "wasm32"))]
impl Poller {
    /// Polls the device until `signal` fires, the device is lost, or a poll fails.
    fn run(&self, signal: &Signal) -> Result<()> {
        let failed = |e: wgpu::PollError| Error::Gpu {
            context: "waiting for the device".into(),
            kind: GpuErrorKind::Poll,
            message: e.to_string(),
        };
        while !signal.fired() {
            self.health.check()?;
            if self.cpu {
                self.device.poll(wgpu::PollType::Poll).map_err(failed)?;
                if !signal.fired() {
                    std::thread::sleep(CPU_ADAPTER_POLL);
                }
            } else {
                let wait = wgpu::PollType::Wait { submission_index: self.submission.clone(), timeout: None };
                self.device.poll(wait).map_err(failed)?;
            }
        }
        Ok(())
    }
}

/// A wait for `signal`, driven as `driver` says.
pub(crate) struct Until {
    signal: Arc<Signal>,
    #[cfg(not(target_arch = "wasm32"))]
    poller: Option<Poller>,
    #[cfg(target_arch = "wasm32")]
    health: Arc<DeviceHealth>,
    driver: Driver,
}

impl Until {
    /// A wait for `signal` on `ctx`'s device (for the end of `submission`, where given).
    pub(crate) fn new(
        ctx: &Context,
        signal: Arc<Signal>,
        submission: Option<wgpu::SubmissionIndex>,
        driver: Driver,
    ) -> Self {
        #[cfg(not(target_arch = "wasm32"))]
        let poller = Poller {
            device: ctx.device().clone(),
            cpu: ctx.adapter().is_cpu(),
            health: ctx.health.clone(),
            submission,
        };
        #[cfg(target_arch = "wasm32")]
        let _ = submission;
        Until {
            signal,
            #[cfg(not(target_arch = "wasm32"))]
            poller: Some(poller),
            #[cfg(target_arch = "wasm32")]
            health: ctx.health.clone(),
            driver,
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
impl Future for Until {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if let Some(outcome) = lock(&this.signal.outcome).take() {
            return Poll::Ready(outcome);
        }
        match (this.driver, this.poller.take()) {
            (Driver::Inline, Some(poller)) => Poll::Ready(poller.run(&this.signal)),
            (Driver::Await, Some(poller)) => {
                *lock(&this.signal.waker) = Some(cx.waker().clone());
                let signal = this.signal.clone();
                std::thread::spawn(move || {
                    let outcome = poller.run(&signal);
                    *lock(&signal.outcome) = Some(outcome);
                    if let Some(waker) = lock(&signal.waker).take() {
                        waker.wake();
                    }
                });
                Poll::Pending
            }
            // Polled again before the driver thread finished: wake this task instead.
            (_, None) => {
                *lock(&this.signal.waker) = Some(cx.waker().clone());
                // The thread may have finished between the check above and now.
                match lock(&this.signal.outcome).take() {
                    Some(outcome) => Poll::Ready(outcome),
                    None => Poll::Pending,
                }
            }
        }
    }
}

/// In a browser: ready once the callback fired (or the device is lost); until then the
/// callback holds the task's waker.
#[cfg(target_arch = "wasm32")]
impl Future for Until {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let Driver::Await = this.driver;
        this.health.check()?;
        if this.signal.fired() {
            return Poll::Ready(Ok(()));
        }
        *lock(&this.signal.waker) = Some(cx.waker().clone());
        Poll::Pending
    }
}
