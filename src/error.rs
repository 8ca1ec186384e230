//! The library's one error type.

use thiserror::Error;

/// Everything that can go wrong in moeflow. Bad input is reported here, never by a panic.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    /// No adapter matched the request (the message says what was asked for and what exists).
    #[error("no GPU adapter: {0}")]
    NoAdapter(String),
    /// A configuration value is out of its documented range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A buffer or tensor does not have the shape or size the operation needs.
    #[error("shape mismatch for `{what}`: expected {expected}, got {got}")]
    Shape {
        /// The buffer, tensor or argument.
        what: String,
        /// What the operation needs.
        expected: String,
        /// What it was given.
        got: String,
    },
    /// A size is past what the adapter (or a kernel) supports.
    #[error("{what} is {value}, past the limit of {limit} ({why})")]
    LimitExceeded {
        /// The quantity.
        what: String,
        /// Its value.
        value: u64,
        /// The most allowed.
        limit: u64,
        /// Whose limit (a wgpu limit's name, or the kernel's reason).
        why: String,
    },
    /// The adapter lacks a feature the operation needs.
    #[error("missing adapter feature: {0}")]
    MissingFeature(String),
    /// wgpu refused to create a device.
    #[error("device request failed: {0}")]
    RequestDevice(#[from] wgpu::RequestDeviceError),
    /// wgpu reported a validation, out-of-memory or internal error, or a wait failed.
    #[error("GPU {kind} error in {context}: {message}")]
    Gpu {
        /// What moeflow was doing (a kernel, buffer or pipeline name).
        context: String,
        /// Which kind of error wgpu reported.
        kind: GpuErrorKind,
        /// wgpu's full description (its error chain, formatted; `wgpu::Error` itself is not
        /// `Sync`, so it is not kept).
        message: String,
    },
    /// The device was lost or destroyed; nothing more can run on it.
    #[error("the GPU device is lost ({0}); create a new Context")]
    DeviceLost(String),
    /// A benchmark's outputs disagreed with their reference, so it reports no timing.
    #[error("validation failed {0}")]
    Validation(String),
    /// Reading a buffer back to the host failed.
    #[error("buffer readback failed: {0}")]
    Readback(String),
    /// The host could not allocate memory for a buffer of the CPU's own work (host experts).
    #[error("out of host memory: {what} needs {bytes} bytes")]
    HostMemory {
        /// The buffer.
        what: String,
        /// Its size.
        bytes: u64,
    },
    /// A file could not be read or written.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

/// The kind of a GPU error ([`Error::Gpu`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GpuErrorKind {
    /// wgpu's validation refused a call (a moeflow bug or a resource of another device).
    Validation,
    /// The device ran out of memory.
    OutOfMemory,
    /// The driver or wgpu failed internally.
    Internal,
    /// Waiting for a submission failed.
    Poll,
}

impl std::fmt::Display for GpuErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GpuErrorKind::Validation => "validation",
            GpuErrorKind::OutOfMemory => "out-of-memory",
            GpuErrorKind::Internal => "internal",
            GpuErrorKind::Poll => "wait",
        })
    }
}

impl GpuErrorKind {
    /// The kind of a wgpu error.
    pub fn of(e: &wgpu::Error) -> Self {
        match e {
            wgpu::Error::OutOfMemory { .. } => GpuErrorKind::OutOfMemory,
            wgpu::Error::Validation { .. } => GpuErrorKind::Validation,
            wgpu::Error::Internal { .. } => GpuErrorKind::Internal,
        }
    }
}

/// Result alias used across the crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Shape`] for `what`.
    pub fn shape(what: impl Into<String>, expected: impl ToString, got: impl ToString) -> Self {
        Error::Shape { what: what.into(), expected: expected.to_string(), got: got.to_string() }
    }

    /// An [`Error::LimitExceeded`] for `what`.
    pub(crate) fn limit(what: impl Into<String>, value: u64, limit: u64, why: impl Into<String>) -> Self {
        Error::LimitExceeded { what: what.into(), value, limit, why: why.into() }
    }

    /// An [`Error::InvalidArgument`] with `msg`.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidArgument(msg.into())
    }
}
