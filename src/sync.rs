//! Locking the library's shared state (pipeline caches, the bounds-check choice, the probe's
//! reports). The bottom layer: it imports nothing of the crate.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data of a poisoned lock as it is (no state here is left half-made).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
