//! Host buffers for the CPU's own work (the host experts' and the hybrid forward's), each an
//! [`Error::HostMemory`] naming it where the host cannot allocate it, never an abort.

use crate::error::{Error, Result};

/// An empty host buffer with room for `len` values, or [`Error::HostMemory`] naming `what`.
pub(crate) fn reserved<T>(what: &str, len: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| Error::HostMemory {
        what: what.to_string(),
        bytes: (len as u64).saturating_mul(std::mem::size_of::<T>() as u64),
    })?;
    Ok(v)
}

/// A host buffer of `len` copies of `value` (as [`reserved`]).
pub(crate) fn filled<T: Clone>(what: &str, len: usize, value: T) -> Result<Vec<T>> {
    let mut v = reserved(what, len)?;
    v.resize(len, value);
    Ok(v)
}
