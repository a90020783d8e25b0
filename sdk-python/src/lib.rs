//! `stowplan._stowplan`: the native layer of the Python SDK.
//!
//! Thin by design: it converts arguments (numpy arrays read as slices without copying, option
//! names parsed with the kernel's [`stowplan::kernel::Named`] spellings, integer ranges
//! checked and named once, here), calls the Rust host with the GIL released, and returns frozen result classes whose
//! getters hand out numpy arrays owning the Rust vectors (no copy). Options are keyword-only;
//! an omitted option (or `None`) means the host's default (`PackOptions::new`,
//! `PartitionOptions::default`, …), so no default is written twice. Errors become the
//! exception classes of `stowplan.errors`, imported once per process.
//!
//! One file per concept: `errors` (exceptions), `convert` (arguments), `options` (keyword
//! options from a kernel options struct's field list), `results` (what the
//! result classes share), `pack`, `balance` and `peers` (the functions and their result
//! classes), then one file per host area (`layout`, `micro_batch`, `materialize`,
//! `protocol`, `transport`, `packer`, `plan`, `stream`, `source`, `filter`, …), and `info`
//! (`kernel_info`, the cost presets). One registration style: each file registers its own
//! functions and classes (`register(m)`), and this file calls each file's `register` and
//! re-exports the helpers every binding module uses.

mod arrow;
mod balance;
mod config;
mod convert;
mod errors;
mod filter;
mod info;
mod layout;
mod materialize;
mod micro_batch;
mod multi;
mod options;
mod pack;
mod packer;
mod peers;
mod plan;
mod prime_rl;
mod protocol;
mod results;
mod slime;
mod source;
mod stream;
mod transport;

use pyo3::prelude::*;

pub(crate) use convert::{
    BackendArg, Lengths, Nullable, cost_arg, float_vec, int, int_vec, is_bool, kernel, mask_vec, number, opt_parse,
    opt_str, opt_u32, opt_u64, repr, str_options, u32_arg, u64_arg,
};
pub(crate) use errors::{invalid, to_py};
pub(crate) use results::{reduce, reduce_by};

/// Locks `m` without waiting for it while the GIL is held: a thread that holds the lock may
/// need the GIL before it lets go (to build an exception, or to drop a Python object), so a
/// thread waiting for the lock with the GIL held could deadlock the process. The wait runs
/// with the GIL released, then the lock is taken with it held. `Err` for a poisoned lock (a
/// panic while it was held), with its guard.
pub(crate) fn lock_or_poisoned<'a, T: Send>(
    py: Python<'_>,
    m: &'a std::sync::Mutex<T>,
) -> std::sync::LockResult<std::sync::MutexGuard<'a, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Ok(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Err(p),
            Err(std::sync::TryLockError::WouldBlock) => py.detach(|| drop(m.lock())),
        }
    }
}

/// Runs `f` (Rust work only) on `m`'s value with the GIL released, the lock waited for and
/// held without it: for a value another thread holds for long stretches (a waiting receive),
/// where [`lock`]'s GIL-held retry could lose the race every time. A poisoned lock is taken
/// as it is.
pub(crate) fn with_lock<T: Send, R: Send>(
    py: Python<'_>,
    m: &std::sync::Mutex<T>,
    f: impl FnOnce(&mut T) -> R + Send,
) -> R {
    py.detach(|| f(&mut m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)))
}

/// [`lock_or_poisoned`], a poisoned lock taken as it is (for values no holder leaves halfway
/// changed).
pub(crate) fn lock<'a, T: Send>(py: Python<'_>, m: &'a std::sync::Mutex<T>) -> std::sync::MutexGuard<'a, T> {
    lock_or_poisoned(py, m).unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The extension's allocator. glibc's malloc hands the memory a packer step frees back to the
/// system (it trims the build threads' arenas), so the next step faults every page in again:
/// ~59,000 page faults and half of `Packer.pack`'s time on a 7.4M-token step. mimalloc keeps
/// it for reuse (`local_dynamic_tls`: this library is loaded with `dlopen`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The native module.
#[pymodule]
fn _stowplan(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Each file registers its own functions and classes: one file per concept.
    info::register(m)?;
    convert::register(m)?;
    pack::register(m)?;
    balance::register(m)?;
    peers::register(m)?;
    stream::register(m)?;
    arrow::register(m)?;
    layout::register(m)?;
    micro_batch::register(m)?;
    materialize::register(m)?;
    protocol::register(m)?;
    packer::register(m)?;
    transport::register(m)?;
    plan::register(m)?;
    config::register(m)?;
    prime_rl::register(m)?;
    source::register(m)?;
    filter::register(m)?;
    slime::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
