//! Results: what the frozen result classes share (lazy lists, pickling, numpy views of
//! groups, summaries).

use numpy::{PyArray1, PyArrayMethods};
use pyo3::exceptions::{PyIndexError, PyValueError, PyZeroDivisionError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PySlice, PyTuple};
use stowplan::peers::verl::UnbalanceError;

use crate::errors::invalid;

/// A list built on first access and then kept (a frozen class's lazy attribute).
pub(crate) struct LazyList(PyOnceLock<Py<PyList>>);

/// `InvalidArgumentError` unless `offsets` are the boundaries of groups over `len` entries
/// (from 0, never decreasing, ending at `len`) and each of `parallel` has one entry per group:
/// what an unpickled result must hold before it is used.
pub(crate) fn check_state(
    py: Python<'_>,
    what: &str,
    offsets: &Py<PyArray1<u32>>,
    len: usize,
    parallel: &[usize],
) -> PyResult<()> {
    let o: Vec<u32> = offsets.bind(py).to_vec()?;
    let ok = o.first() == Some(&0)
        && o.windows(2).all(|w| w[0] <= w[1])
        && o.last().map(|&l| l as usize) == Some(len)
        && parallel.iter().all(|&p| p + 1 == o.len());
    if !ok {
        return Err(invalid(
            py,
            format!("{what}: the pickled state is inconsistent (offsets, members and per-group arrays disagree)"),
        ));
    }
    Ok(())
}

/// `(type(obj)._from_state, state)`: what `__reduce__` returns for a result class, so pickle
/// rebuilds it from its own fields.
pub(crate) fn reduce<'py, T: pyo3::PyClass>(
    obj: &Bound<'py, T>,
    state: impl IntoPyObject<'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    reduce_by(obj, "_from_state", state)
}

/// `(type(obj).<rebuild>, args)`: what `__reduce__` returns for a class that pickle rebuilds by
/// calling its static method `rebuild` with `args` (a tuple).
pub(crate) fn reduce_by<'py, T: pyo3::PyClass>(
    obj: &Bound<'py, T>,
    rebuild: &str,
    args: impl IntoPyObject<'py>,
) -> PyResult<Bound<'py, PyTuple>> {
    use pyo3::BoundObject;
    let py = obj.py();
    let method = obj.as_any().get_type().getattr(rebuild)?;
    PyTuple::new(py, [method, args.into_pyobject(py).map_err(Into::into)?.into_any().into_bound()])
}

impl Default for LazyList {
    fn default() -> Self {
        Self(PyOnceLock::new())
    }
}

impl std::fmt::Debug for LazyList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LazyList")
    }
}

impl LazyList {
    /// The list, built by `build` on the first call.
    pub(crate) fn get<'py>(
        &self,
        py: Python<'py>,
        build: impl FnOnce() -> PyResult<Bound<'py, PyList>>,
    ) -> PyResult<Py<PyList>> {
        self.0.get_or_try_init(py, || build().map(Bound::unbind)).map(|l| l.clone_ref(py))
    }
}

/// The contents of a 1-D numpy array (a copy; the arrays of results are small or read once).
pub(crate) fn vec_of<T: numpy::Element + Copy>(a: &Bound<'_, PyArray1<T>>) -> PyResult<Vec<T>> {
    Ok(a.readonly().as_array().iter().copied().collect())
}

/// Lists of `indices` between successive `offsets` (checked: the arrays are the caller's to
/// modify).
pub(crate) fn lists<'py>(
    offsets: &Bound<'py, PyArray1<u32>>,
    indices: &Bound<'py, PyArray1<u32>>,
) -> PyResult<Bound<'py, PyList>> {
    let py = offsets.py();
    let (o, i) = (vec_of(offsets)?, vec_of(indices)?);
    let parts = o
        .windows(2)
        .map(|w| i.get(w[0] as usize..w[1] as usize))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| PyValueError::new_err("offsets do not delimit indices (were the arrays modified?)"))?;
    PyList::new(py, parts)
}

/// Views (numpy slices, no copy) of `values` between successive `offsets`.
pub(crate) fn views<'py, T: numpy::Element>(
    offsets: &Bound<'py, PyArray1<u32>>,
    values: &Bound<'py, PyArray1<T>>,
) -> PyResult<Bound<'py, PyList>> {
    let py = offsets.py();
    let o = vec_of(offsets)?;
    let parts = o
        .windows(2)
        .map(|w| values.as_any().get_item(PySlice::new(py, w[0] as isize, w[1] as isize, 1)))
        .collect::<PyResult<Vec<_>>>()?;
    PyList::new(py, parts)
}

/// `{"max", "min", "mean", "max_over_mean", "spread"}` of per-group totals
/// (`stowplan::json::Figures`, the CLI's balance metrics, in its field order).
pub(crate) fn summary<'py>(values: &Bound<'py, PyArray1<u64>>) -> PyResult<Bound<'py, PyAny>> {
    crate::convert::pythonized(values.py(), &stowplan::json::Figures::of(&vec_of(values)?))
}

/// verl's `log_seqlen_unbalance` dict (`{prefix}/min`, `/max`, `/minmax_diff`,
/// `/balanced_min`, `/balanced_max`, `/mean`), or verl's exception.
pub(crate) fn verl_unbalance<'py>(
    py: Python<'py>,
    seqlens: &[i64],
    partitions: &[Vec<i64>],
    prefix: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let u = stowplan::peers::verl::log_seqlen_unbalance(seqlens, partitions).map_err(|e| match e {
        UnbalanceError::ZeroDivision(m) => PyZeroDivisionError::new_err(m),
        UnbalanceError::Value(m) => PyValueError::new_err(m),
        UnbalanceError::Index(m) => PyIndexError::new_err(m),
    })?;
    let d = PyDict::new(py);
    d.set_item(format!("{prefix}/min"), u.min)?;
    d.set_item(format!("{prefix}/max"), u.max)?;
    d.set_item(format!("{prefix}/minmax_diff"), u.max - u.min)?;
    d.set_item(format!("{prefix}/balanced_min"), u.balanced_min)?;
    d.set_item(format!("{prefix}/balanced_max"), u.balanced_max)?;
    // Python's int / int (correctly rounded), as verl computes the mean.
    d.set_item(format!("{prefix}/mean"), u.total.into_pyobject(py)?.div(u.k)?)?;
    Ok(d)
}
