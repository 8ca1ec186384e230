//! A GGUF file on disk, memory-mapped.

use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::parse::Gguf;
use crate::error::{Error, Result};

/// A GGUF file on disk, memory-mapped: nothing is read until [`GgufFile::parse`] reads the
/// header and a tensor's bytes are touched.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
}

impl GgufFile {
    /// Maps `path`.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a file changed by another process while mapped is
        // outside what a reader can guard against (every tensor's extent is checked against
        // the map's length when parsed, and every read is bounds-checked by slicing).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Ok(GgufFile { path: path.to_path_buf(), map })
    }

    /// Whether `path` is a file that starts with GGUF's magic (false for a directory).
    ///
    /// # Errors
    /// [`Error::Io`] naming the file when it cannot be read.
    pub fn is_gguf(path: &Path) -> Result<bool> {
        use std::io::Read;
        if path.is_dir() {
            return Ok(false);
        }
        let io = |source| Error::Io { path: path.display().to_string(), source };
        let mut magic = [0u8; 4];
        let mut file = std::fs::File::open(path).map_err(io)?;
        let n = file.read(&mut magic).map_err(io)?;
        Ok(n == 4 && &magic == b"GGUF")
    }

    /// The mapped file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Parses the header and tensor table ([`Gguf::parse`]).
    ///
    /// # Errors
    /// As [`Gguf::parse`].
    pub fn parse(&self) -> Result<Gguf<'_>> {
        Gguf::parse(&self.map, &self.path.display().to_string())
    }
}
