//! The host's error type.

use thiserror::Error;

/// Everything a [`crate::Kernel`] call can fail with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// An argument is outside its documented range (from the kernel: the message names the
    /// argument and the allowed range).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Valid arguments that cannot be satisfied (e.g. an item longer than the capacity).
    #[error("infeasible: {0}")]
    Infeasible(String),
    /// The WebAssembly runtime failed: the embedded component did not compile or
    /// instantiate, or a call trapped. Always a bug or a broken installation, never bad input.
    #[error("kernel runtime failure: {0}")]
    Runtime(String),
    /// A configuration is invalid; the message names the key, the value and what to set.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Reading or writing a file failed; the message names the path and the operation.
    #[error("I/O error: {0}")]
    Io(String),
    /// A saved artifact (length cache, plan, data source state) was made for other inputs
    /// or is corrupt; the message names the file, what differs and how to proceed.
    #[error("cache mismatch: {0}")]
    CacheMismatch(String),
    /// Waiting for an artifact another process writes took longer than allowed.
    #[error("timed out: {0}")]
    Timeout(String),
    /// A buffer filter failed or returned an invalid selection (out of range, duplicate,
    /// more than asked); the buffer is left untouched.
    #[error("buffer filter: {0}")]
    Filter(String),
}

impl Error {
    /// A short machine-readable kind: `invalid-argument`, `infeasible`, `runtime`, `config`,
    /// `io`, `cache-mismatch`, `timeout` or `filter`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidArgument(_) => "invalid-argument",
            Error::Infeasible(_) => "infeasible",
            Error::Runtime(_) => "runtime",
            Error::Config(_) => "config",
            Error::Io(_) => "io",
            Error::CacheMismatch(_) => "cache-mismatch",
            Error::Timeout(_) => "timeout",
            Error::Filter(_) => "filter",
        }
    }
}

impl From<stowplan_kernel::Error> for Error {
    fn from(e: stowplan_kernel::Error) -> Self {
        match e {
            stowplan_kernel::Error::InvalidArgument(m) => Error::InvalidArgument(m),
            stowplan_kernel::Error::Infeasible(m) => Error::Infeasible(m),
        }
    }
}

/// Formats a wasmtime error with its whole cause chain.
pub(crate) fn runtime(context: &str, e: impl std::fmt::Debug) -> Error {
    Error::Runtime(format!("{context}: {e:?}"))
}

/// An [`Error::Io`] naming `what` was done to `path`.
pub(crate) fn io(what: &str, path: &std::path::Path, e: std::io::Error) -> Error {
    Error::Io(format!("{what} {}: {e}", path.display()))
}
