//! What moeflow has allocated on a context's device: a count and bytes, kept by every
//! allocation moeflow makes.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

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

/// The counters behind [`Allocations`], bumped by every allocation moeflow makes.
#[derive(Debug, Default)]
pub(super) struct AllocationCounter {
    count: AtomicU64,
    bytes: AtomicU64,
}

impl AllocationCounter {
    /// Counts an allocation of `bytes`.
    pub(super) fn note(&self, bytes: u64) {
        self.count.fetch_add(1, Relaxed);
        self.bytes.fetch_add(bytes, Relaxed);
    }

    /// The allocations counted so far.
    pub(super) fn read(&self) -> Allocations {
        Allocations { count: self.count.load(Relaxed), bytes: self.bytes.load(Relaxed) }
    }
}
