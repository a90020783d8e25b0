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
    /// more than asked); the buffer is left untouched. [`FilterError`] tells which.
    #[error("buffer filter: {0}")]
    Filter(FilterError),
}

/// How a buffer filter failed. Every message names the plugin (or the filter) and the bound
/// or rule involved.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FilterError {
    /// A plugin call ran past its deadline (`timeout`).
    #[error("timeout: {0}")]
    Timeout(String),
    /// A plugin call used up its fuel budget (`fuel`).
    #[error("out of fuel: {0}")]
    OutOfFuel(String),
    /// A plugin tried to grow its memory past `memory_limit`.
    #[error("memory limit: {0}")]
    MemoryLimit(String),
    /// A plugin trapped (panic, `unreachable`, exit, …); the message is the trap's.
    #[error("trap: {0}")]
    Trap(String),
    /// A selection broke a rule: an index out of range, an index twice, more than asked.
    #[error("invalid result: {0}")]
    InvalidResult(String),
    /// The plugin file's sha256 is not the pinned one.
    #[error("hash mismatch: {0}")]
    HashMismatch(String),
    /// The filter returned an error of its own (the plugin's `err(text)`).
    #[error("filter error: {0}")]
    Guest(String),
    /// The file is not a buffer-filter component this host can run (not a component, wrong
    /// world, imports other than WASI).
    #[error("cannot load: {0}")]
    Load(String),
}

impl FilterError {
    /// A short machine-readable kind: `timeout`, `out-of-fuel`, `memory-limit`, `trap`,
    /// `invalid-result`, `hash-mismatch`, `guest` or `load`.
    pub fn kind(&self) -> &'static str {
        match self {
            FilterError::Timeout(_) => "timeout",
            FilterError::OutOfFuel(_) => "out-of-fuel",
            FilterError::MemoryLimit(_) => "memory-limit",
            FilterError::Trap(_) => "trap",
            FilterError::InvalidResult(_) => "invalid-result",
            FilterError::HashMismatch(_) => "hash-mismatch",
            FilterError::Guest(_) => "guest",
            FilterError::Load(_) => "load",
        }
    }
}

impl From<FilterError> for Error {
    fn from(e: FilterError) -> Self {
        Error::Filter(e)
    }
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

impl Error {
    /// An [`Error::Io`] naming `what` was done to `path` (`reading /a/b: No such file …`).
    pub fn io(what: &str, path: &std::path::Path, e: std::io::Error) -> Error {
        Error::Io(format!("{what} {}: {e}", path.display()))
    }
}

/// Formats a wasmtime error with its whole cause chain.
pub(crate) fn runtime(context: &str, e: impl std::fmt::Debug) -> Error {
    Error::Runtime(format!("{context}: {e:?}"))
}

/// At most `limit` bytes of `text` (cut at a character boundary), saying how long it was:
/// how errors quote input or a plugin's text without echoing megabytes.
pub(crate) fn excerpt(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes, the first {end} shown)", &text[..end], text.len())
}
