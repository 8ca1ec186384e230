//! A checkpoint file's bytes: memory-mapped natively (nothing is read until it is used), read
//! into memory where there is nothing to map (wasm32: a file a browser page was given).

use std::ops::Deref;
use std::path::Path;

use crate::error::{Error, Result};

/// A file's bytes, mapped or owned.
pub(crate) enum FileBytes {
    /// A read-only map of the file.
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(memmap2::Mmap),
    /// The bytes in memory.
    Owned(Vec<u8>),
}

impl FileBytes {
    /// The file at `path`: mapped natively; read in a browser, where `std::fs` has no files
    /// and the read is an [`Error::Io`] naming the path.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io { path: path.display().to_string(), source };
        #[cfg(not(target_arch = "wasm32"))]
        {
            let file = std::fs::File::open(path).map_err(io)?;
            // SAFETY: the map is read-only; a file changed by another process while mapped is
            // outside what any reader can guard against (headers are validated against the
            // map's length, and every view is bounds-checked by slicing).
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
            Ok(FileBytes::Mapped(map))
        }
        #[cfg(target_arch = "wasm32")]
        {
            std::fs::read(path).map(FileBytes::Owned).map_err(io)
        }
    }

    /// Lets the operating system drop the resident pages of bytes `[start, start + len)` of a
    /// mapped file (they are read again if used again); nothing for bytes in memory.
    pub(crate) fn release(&self, start: usize, len: usize) {
        match self {
            #[cfg(unix)]
            FileBytes::Mapped(map) => {
                // SAFETY: the map is a shared, read-only mapping of a file: after
                // MADV_DONTNEED the next access reads the same bytes back from the file, so no
                // view of the map sees different data. Advice is only a hint: its failure
                // changes nothing.
                let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
            }
            _ => {
                let _ = (start, len);
            }
        }
    }
}

impl std::fmt::Debug for FileBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileBytes::Mapped(_) => "mapped",
            FileBytes::Owned(_) => "in memory",
        };
        write!(f, "{} bytes, {kind}", self.len())
    }
}

impl Deref for FileBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            FileBytes::Mapped(map) => map,
            FileBytes::Owned(bytes) => bytes,
        }
    }
}
