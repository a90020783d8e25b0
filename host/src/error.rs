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
}

impl Error {
    /// A short machine-readable kind: `invalid-argument`, `infeasible` or `runtime`.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidArgument(_) => "invalid-argument",
            Error::Infeasible(_) => "infeasible",
            Error::Runtime(_) => "runtime",
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
