//! Writing results: safetensors output written to a temporary file beside the target and
//! renamed into place, so a failed or interrupted write leaves the old file as it was.

use std::io::Write;
use std::path::Path;

use safetensors::{Dtype, tensor::TensorView};

use crate::error::{Error, Result};

/// A tensor to write: name, shape, and its data (f32 or u32).
#[derive(Clone, Copy, Debug)]
pub enum OutTensor<'a> {
    /// f32 values.
    F32(&'a str, &'a [usize], &'a [f32]),
    /// u32 values.
    U32(&'a str, &'a [usize], &'a [u32]),
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.display().to_string(), source }
}

/// Refuses an output path that names the same file as one of `inputs` (also through links).
///
/// # Errors
/// [`Error::InvalidArgument`] naming both paths.
pub fn check_output_path(output: &Path, inputs: &[&Path]) -> Result<()> {
    for input in inputs {
        // A file that does not exist yet cannot be one of the inputs.
        if output.exists() && same_file::is_same_file(output, input).map_err(io_err(output))? {
            return Err(Error::invalid(format!(
                "the output {} is the same file as the input {}: it would be overwritten",
                output.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// Writes through `write` into a temporary file in `path`'s directory, flushes it to disk and
/// renames it over `path`. If `write` or any step fails, `path` is untouched and the
/// temporary file is removed.
///
/// # Errors
/// [`Error::Io`] for the first step that failed.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp =
        tempfile::Builder::new().prefix(".moeflow-").suffix(".tmp").tempfile_in(dir).map_err(io_err(path))?;
    write(tmp.as_file_mut()).map_err(io_err(path))?;
    tmp.as_file_mut().flush().map_err(io_err(path))?;
    tmp.as_file().sync_all().map_err(io_err(path))?;
    tmp.persist(path).map_err(|e| io_err(path)(e.error))?;
    Ok(())
}

/// Writes tensors to a safetensors file, atomically (see [`write_atomically`]).
///
/// # Errors
/// A tensor whose data does not fill its shape, or an I/O failure.
pub fn write_tensors(path: &Path, tensors: &[OutTensor<'_>]) -> Result<()> {
    let views = tensors
        .iter()
        .map(|t| {
            let (name, dtype, shape, bytes): (&str, Dtype, &[usize], &[u8]) = match *t {
                OutTensor::F32(n, s, d) => (n, Dtype::F32, s, bytemuck::cast_slice(d)),
                OutTensor::U32(n, s, d) => (n, Dtype::U32, s, bytemuck::cast_slice(d)),
            };
            TensorView::new(dtype, shape.to_vec(), bytes)
                .map(|v| (name.to_string(), v))
                .map_err(|e| Error::invalid(format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bytes =
        safetensors::serialize(views, None).map_err(|e| Error::invalid(format!("serialising: {e}")))?;
    write_atomically(path, |w| w.write_all(&bytes))
}
