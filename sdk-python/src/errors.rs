//! Errors: the exception classes of `stowplan.errors`, imported once, and the host's errors
//! (and the peers' builtin exceptions) as Python exceptions.

use pyo3::exceptions::{PyAssertionError, PyIndexError, PyMemoryError, PyTypeError, PyValueError, PyZeroDivisionError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use stowplan::{Error, FilterError, PyError};

/// An exception class of `stowplan.errors` (`Class::NAMES` in the same order).
#[derive(Clone, Copy, Debug)]
enum Class {
    InvalidArgument,
    Infeasible,
    KernelRuntime,
    Config,
    Io,
    CacheMismatch,
    Timeout,
    FilterTimeout,
    FilterOutOfFuel,
    FilterMemoryLimit,
    FilterTrap,
    FilterInvalidResult,
    FilterHashMismatch,
    FilterGuest,
    FilterLoad,
}

impl Class {
    const COUNT: usize = 15;
    const NAMES: [&'static str; Self::COUNT] = [
        "InvalidArgumentError",
        "InfeasibleError",
        "KernelRuntimeError",
        "ConfigError",
        "StowplanIOError",
        "CacheMismatchError",
        "StowplanTimeoutError",
        "FilterTimeoutError",
        "FilterOutOfFuelError",
        "FilterMemoryLimitError",
        "FilterTrapError",
        "FilterInvalidResultError",
        "FilterHashMismatchError",
        "FilterGuestError",
        "FilterLoadError",
    ];

    fn of(e: &Error) -> Self {
        match e {
            Error::InvalidArgument(_) => Class::InvalidArgument,
            Error::Infeasible(_) => Class::Infeasible,
            Error::Runtime(_) => Class::KernelRuntime,
            Error::Config(_) => Class::Config,
            Error::Io(_) => Class::Io,
            Error::CacheMismatch(_) => Class::CacheMismatch,
            Error::Timeout(_) => Class::Timeout,
            Error::Filter(f) => match f {
                FilterError::Timeout(_) => Class::FilterTimeout,
                FilterError::OutOfFuel(_) => Class::FilterOutOfFuel,
                FilterError::MemoryLimit(_) => Class::FilterMemoryLimit,
                FilterError::Trap(_) => Class::FilterTrap,
                FilterError::InvalidResult(_) => Class::FilterInvalidResult,
                FilterError::HashMismatch(_) => Class::FilterHashMismatch,
                FilterError::Guest(_) => Class::FilterGuest,
                FilterError::Load(_) => Class::FilterLoad,
            },
        }
    }

    /// The exception raising `message` as this class (the class is imported on first use
    /// and kept for the life of the process).
    fn err(self, py: Python<'_>, message: String) -> PyErr {
        static CLASSES: [PyOnceLock<Py<PyType>>; Class::COUNT] = [const { PyOnceLock::new() }; Class::COUNT];
        match CLASSES[self as usize].import(py, "stowplan.errors", Self::NAMES[self as usize]) {
            Ok(class) => PyErr::from_type(class.clone(), message),
            Err(e) => e,
        }
    }
}

/// The host's error as the matching `stowplan.errors` class.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    Class::of(&e).err(py, e.to_string())
}

/// `InvalidArgumentError(message)`.
pub(crate) fn invalid(py: Python<'_>, message: String) -> PyErr {
    Class::InvalidArgument.err(py, message)
}

/// A peer's exception (verl, ROLL) as the builtin class the peer raises.
pub(crate) fn peer_error(e: &PyError) -> PyErr {
    let m = e.message().to_string();
    match e {
        PyError::AssertionError(_) => PyAssertionError::new_err(m),
        PyError::IndexError(_) => PyIndexError::new_err(m),
        PyError::TypeError(_) => PyTypeError::new_err(m),
        PyError::ZeroDivisionError(_) => PyZeroDivisionError::new_err(m),
        PyError::MemoryError(_) => PyMemoryError::new_err(m),
        PyError::ValueError(_) => PyValueError::new_err(m),
    }
}
