//! A GGUF file on disk, memory-mapped (in a browser, parse the file's bytes with
//! [`Gguf::parse`] instead).

use std::path::{Path, PathBuf};

use super::parse::Gguf;
use crate::error::{Error, Result};
use crate::weights::file_bytes::FileBytes;

/// A GGUF file on disk, memory-mapped: nothing is read until [`GgufFile::parse`] reads the
/// header and a tensor's bytes are touched.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    map: FileBytes,
}

impl GgufFile {
    /// Maps `path`.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub fn open(path: &Path) -> Result<Self> {
        Ok(GgufFile { path: path.to_path_buf(), map: FileBytes::open(path)? })
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
