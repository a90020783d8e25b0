//! Errors: the host's errors as the exception classes `stowplan.errors` gives its error kinds,
//! and the peers' builtin exceptions.

use pyo3::exceptions::{
    PyAssertionError, PyIndexError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError, PyZeroDivisionError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyType};
use stowplan::{Error, peers::verl::PyError};

/// The key of `e`'s class in `stowplan.errors._BY_KIND`: the host's [`Error::kind`], and for
/// a buffer filter `filter-` and its [`FilterError::kind`](stowplan::FilterError::kind).
fn kind(e: &Error) -> String {
    match e {
        Error::Filter(f) => format!("filter-{}", f.kind()),
        e => e.kind().to_string(),
    }
}

/// `message` raised as the `stowplan.errors` class of the host's error kind `kind` (the
/// module's `_BY_KIND`, imported on first use and kept for the life of the process).
fn raise(py: Python<'_>, kind: &str, message: String) -> PyErr {
    static BY_KIND: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
    let class = BY_KIND.import(py, "stowplan.errors", "_BY_KIND").and_then(|by_kind| {
        by_kind
            .get_item(kind)?
            .ok_or_else(|| {
                PyRuntimeError::new_err(format!("stowplan.errors._BY_KIND has no class for the error kind {kind:?}"))
            })?
            .cast_into::<PyType>()
            .map_err(PyErr::from)
    });
    match class {
        Ok(class) => PyErr::from_type(class, message),
        Err(e) => e,
    }
}

/// The host's error as the matching `stowplan.errors` class.
pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    raise(py, &kind(&e), e.to_string())
}

/// `InvalidArgumentError(message)`.
pub(crate) fn invalid(py: Python<'_>, message: String) -> PyErr {
    raise(py, "invalid-argument", message)
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
