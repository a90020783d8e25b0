//! How a plugin is loaded and bounded ([`FilterOptions`]) and what a failed call does
//! ([`OnFailure`]).

use std::time::Duration;

use super::MAX_PLUGIN_BYTES;
use crate::Error;

/// What happens when a plugin call fails (any [`FilterError`](crate::FilterError) at call time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnFailure {
    /// The request fails with the error; nothing leaves the buffer (the default).
    #[default]
    Error,
    /// The request is served first-in-first-out instead, with a warning in the log.
    Fallback,
}

impl std::str::FromStr for OnFailure {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "error" => Ok(OnFailure::Error),
            "fallback" => Ok(OnFailure::Fallback),
            other => Err(Error::InvalidArgument(format!("on_failure must be error or fallback (got {other:?})"))),
        }
    }
}

/// How a plugin is loaded and bounded. [`FilterOptions::new`] gives the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterOptions {
    /// The sha256 (64 hex digits, optionally prefixed `sha256:`) the file must have.
    pub sha256: String,
    /// The plugin's configuration, JSON text passed to every call (default `{}`).
    pub config: String,
    /// Wall-clock deadline per call, 1 ms ..= 10 min (default 1 s).
    pub timeout: Duration,
    /// Fuel per call (about one unit per WebAssembly instruction), `None` for no fuel bound
    /// (the deadline still applies); at least 10,000 (default 10^9).
    pub fuel: Option<u64>,
    /// Most bytes of linear memory (and table elements ×8) the plugin may hold, 1 MiB ..=
    /// 4 GiB (default 256 MiB).
    pub memory_limit: usize,
    /// Most bytes of stdout and of stderr kept per call; the rest is dropped and counted
    /// (default 64 KiB; at most 16 MiB).
    pub output_limit: usize,
    /// What a failed call does (default [`OnFailure::Error`]).
    pub on_failure: OnFailure,
    /// Bytes of the plugin file at most (default [`MAX_PLUGIN_BYTES`]).
    pub max_plugin_bytes: u64,
}

impl FilterOptions {
    /// Defaults (see the fields), pinned to `sha256`.
    pub fn new(sha256: &str) -> Self {
        Self {
            sha256: sha256.to_string(),
            config: "{}".to_string(),
            timeout: Duration::from_secs(1),
            fuel: Some(1_000_000_000),
            memory_limit: 256 << 20,
            output_limit: 64 << 10,
            on_failure: OnFailure::Error,
            max_plugin_bytes: MAX_PLUGIN_BYTES,
        }
    }

    pub(super) fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if !(Duration::from_millis(1)..=Duration::from_secs(600)).contains(&self.timeout) {
            return bad(format!("timeout must be in 1 ms ..= 600 s (got {:?})", self.timeout));
        }
        if self.fuel.is_some_and(|f| f < 10_000) {
            return bad(format!("fuel must be at least 10000 or none (got {:?})", self.fuel));
        }
        if !((1 << 20)..=(4usize << 30)).contains(&self.memory_limit) {
            return bad(format!("memory_limit must be in 1 MiB ..= 4 GiB (got {} bytes)", self.memory_limit));
        }
        if self.output_limit > 16 << 20 {
            return bad(format!("output_limit must be at most 16 MiB (got {} bytes)", self.output_limit));
        }
        match serde_json::from_str::<serde_json::Value>(&self.config) {
            Ok(_) => Ok(()),
            Err(e) => bad(format!("config must be JSON text (got {:?}: {e})", self.config)),
        }
    }
}
