//! Buffer-filter plugins: WebAssembly components of the world `stowplan:filter/buffer-filter`
//! (`wit/filter/filter.wit`) run in a sandbox.
//!
//! - **Pinned**: [`Filter::load`] refuses a file whose sha256 is not the one given
//!   ([`FilterError::HashMismatch`](crate::FilterError::HashMismatch)).
//! - **Compiled once**: the component is precompiled and cached on disk by its sha256 and
//!   the engine's compatibility hash (the cache of the kernel, [`cache_dir`](crate::runtime::cache_dir)).
//! - **Bounded**: every call (and every instantiation) runs with a fuel budget and an epoch
//!   deadline (a ticker thread advances the epoch every millisecond while a call runs), and
//!   in a store whose memory cannot grow past the limit (growth past it traps).
//! - **No capabilities**: the only imports a plugin may have are WASI's, and its WASI denies
//!   everything: no preopened directories, no environment or arguments, no network, an
//!   empty stdin, wall and monotonic clocks fixed at 0 (sleeps return at once, so a plugin
//!   cannot block the host), randomness from a constant seed. stdout and stderr are captured
//!   up to [`FilterOptions::output_limit`] bytes per call and logged (target
//!   `stowplan::plugin`).
//! - **Checked**: every selection is validated ([`validate_selection`](crate::source::validate_selection)).
//! - **Contained**: an instance that trapped is discarded and the next call gets a fresh one.
//!   [`OnFailure::Fallback`] turns any failure into a FIFO selection with a warning.

mod file;
mod imports;
mod options;
mod sandbox;
mod wasm;

pub use file::{MAX_PLUGIN_BYTES, hash_plugin, read_plugin};
pub use options::{FilterOptions, OnFailure};
pub use wasm::{Filter, FilterStats};

pub use crate::source::columns::synthetic_buffer;
