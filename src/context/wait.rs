//! Waiting for the device: one future per wait, resolved by a device callback
//! (`on_submitted_work_done`, `map_async`), and driven either on the waiting thread (the
//! blocking methods, which wrap the futures with `pollster::block_on`) or on a thread of its
//! own that wakes the awaiting task (the `_async` methods: an async caller's thread is never
//! blocked). Native wgpu runs callbacks only while the device is polled, so someone must poll
//! it: on GPUs the driver thread blocks in `device.poll` until the submission is done; on CPU
//! adapters (lavapipe, llvmpipe) it polls without blocking and sleeps 50 µs between polls, so
//! that it is not a thread the driver's own shader threads are descheduled behind.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll, Waker};

use super::device::Context;
use super::health::DeviceHealth;
use crate::error::{Error, GpuErrorKind, Result};
use crate::sync::lock;

/// Pause between polls of the device on CPU adapters.
const CPU_ADAPTER_POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// Where a wait's device polls run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Driver {
    /// On the thread that polls the future, which blocks until the wait is over.
    Inline,
    /// On a thread of its own, which wakes the task when the wait is over.
    Thread,
}

/// The state a device callback and a wait share.
#[derive(Debug, Default)]
pub(crate) struct Signal {
    fired: AtomicBool,
    /// How the driver thread's polling ended (only with [`Driver::Thread`]).
    outcome: Mutex<Option<Result<()>>>,
    waker: Mutex<Option<Waker>>,
}

impl Signal {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Signal::default())
    }

    /// Marks the awaited event as happened (called from the device callback).
    pub(crate) fn fire(&self) {
        self.fired.store(true, Ordering::Release);
    }

    fn fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }
}

/// What a wait polls: the device, whether it runs on the CPU, its health, and the submission
/// whose end is awaited where there is one.
struct Poller {
    device: wgpu::Device,
    cpu: bool,
    health: Arc<DeviceHealth>,
    submission: Option<wgpu::SubmissionIndex>,
}

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
    poller: Option<Poller>,
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
        let poller = Poller {
            device: ctx.device().clone(),
            cpu: ctx.adapter().is_cpu(),
            health: ctx.health.clone(),
            submission,
        };
        Until { signal, poller: Some(poller), driver }
    }
}

impl Future for Until {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if let Some(outcome) = lock(&this.signal.outcome).take() {
            return Poll::Ready(outcome);
        }
        match (this.driver, this.poller.take()) {
            (Driver::Inline, Some(poller)) => Poll::Ready(poller.run(&this.signal)),
            (Driver::Thread, Some(poller)) => {
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
