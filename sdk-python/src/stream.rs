//! The streaming packer for Python (`stowplan._stowplan.StreamPacker`): a thin wrapper over
//! the host's [`stowplan::StreamPacker`] (the kernel decides every bin).

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyList, PyTuple};
use stowplan::kernel::stream::{DEFAULT_MAX_BUFFERED, DEFAULT_MAX_OPEN_BINS, MAX_BUFFERED, MAX_OPEN_BINS};
use stowplan::{
    StreamPacker,
    kernel::{ClosedBins, LimitedStreamPacker, Named, StreamLimits, StreamOptions},
};

use crate::str_options;
use crate::{BackendArg, Lengths, int, invalid, kernel, opt_parse, opt_u64, to_py, u64_arg};

/// A streaming bin packer: lengths go in a few at a time, each bin comes out when it closes,
/// and memory stays bounded however long the stream (``max_buffered`` lengths wait, at most
/// ``max_open_bins`` bins are open). Best fit; a bin that must close is first topped up with
/// the largest waiting lengths that fit. The rule is item by item, so how the stream is cut
/// into :meth:`add` calls changes nothing.
///
/// ``capacity`` — tokens per bin (≥ 1); ``max_open_bins`` — 1..=65536 (default 64);
/// ``max_buffered`` — 0..=1048576 (default 4096; 0 places each length on arrival); ``align``
/// — lengths are rounded up to a multiple of it (default 1); ``oversize`` — a length above
/// the capacity: ``"error"`` (default: :class:`InfeasibleError`, nothing applied),
/// ``"single"`` (a bin of its own at once) or ``"drop"`` (left out, see
/// :attr:`last_dropped`); ``backend`` — ``"wasm"`` (default) or ``"native"``.
///
/// Further limits per bin (vision-language streams): ``limits`` maps each resource's name
/// (not ``"tokens"``) to its cap per bin (≥ 1, up to 7), ``max_segments`` caps the items per
/// bin (default 0: none); :meth:`add` then takes ``resources``, each name → the items' sizes.
/// Every bin stays within the capacity and every limit (the rule is the kernel's
/// ``streaming`` packer under limits; without limits it is the one above).
///
/// Bins are lists of stream indices (0-based, counted over every length ever added),
/// ascending. :meth:`state` saves everything (framed, versioned, checksummed bytes) and
/// :meth:`from_state` continues exactly; the packer also pickles that way.
///
/// >>> p = StreamPacker(10, max_open_bins=1, max_buffered=0)
/// >>> p.add([4, 6, 7]), p.add([2, 5]), p.finish()
/// ([[0, 1]], [[2, 3]], [[4]])
/// >>> v = StreamPacker(10, limits={"images": 2}, max_buffered=0)
/// >>> v.add([4, 3, 2], resources={"images": [1, 1, 1]}), v.finish()
/// ([], [[0, 1], [2]])
#[pyclass(module = "stowplan._stowplan", name = "StreamPacker")]
#[derive(Debug)]
pub struct PyStreamPacker {
    inner: Mutex<Inner>,
    options: StreamOptions,
    /// The limits' names and caps, in the kernel's order (empty without limits).
    limits: StreamLimits,
    /// Indices dropped (``oversize="drop"``) by the last :meth:`add` or :meth:`finish`.
    last_dropped: Vec<u64>,
}

/// The host's packer: under limits or not.
#[derive(Debug)]
enum Inner {
    Plain(StreamPacker),
    Limited(LimitedStreamPacker),
}

impl Inner {
    fn add(&mut self, rows: &[u64]) -> Result<ClosedBins, stowplan::Error> {
        match self {
            Inner::Plain(p) => p.add(rows),
            Inner::Limited(p) => p.add(rows).map(|c| c.closed),
        }
    }

    fn finish(&mut self) -> Result<ClosedBins, stowplan::Error> {
        match self {
            Inner::Plain(p) => p.finish(),
            Inner::Limited(p) => p.finish().map(|c| c.closed),
        }
    }

    fn state(&mut self) -> Result<Vec<u8>, stowplan::Error> {
        match self {
            Inner::Plain(p) => p.state(),
            Inner::Limited(p) => p.state(),
        }
    }

    fn status(&mut self) -> Result<stowplan::kernel::StreamStatus, stowplan::Error> {
        match self {
            Inner::Plain(p) => p.status(),
            Inner::Limited(p) => p.status(),
        }
    }
}

impl PyStreamPacker {
    fn run(
        &mut self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner) -> Result<ClosedBins, stowplan::Error> + Send,
    ) -> PyResult<Py<PyList>> {
        let inner = &self.inner;
        let closed = py
            .detach(|| {
                let mut packer =
                    inner.lock().map_err(|_| stowplan::Error::Runtime("a previous call panicked".into()))?;
                f(&mut packer)
            })
            .map_err(|e| to_py(py, e))?;
        let bins = PyList::empty(py);
        for b in 0..closed.bins() {
            bins.append(PyList::new(py, closed.bin(b))?)?;
        }
        self.last_dropped = closed.dropped;
        Ok(bins.unbind())
    }

    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner) -> Result<R, stowplan::Error> + Send,
    ) -> PyResult<R> {
        let inner = &self.inner;
        py.detach(|| {
            let mut packer = inner.lock().map_err(|_| stowplan::Error::Runtime("a previous call panicked".into()))?;
            f(&mut packer)
        })
        .map_err(|e| to_py(py, e))
    }

    fn status(&self, py: Python<'_>) -> PyResult<stowplan::kernel::StreamStatus> {
        self.with(py, |p| p.status())
    }
}

#[pymethods]
impl PyStreamPacker {
    #[new]
    #[pyo3(signature = (capacity, *, max_open_bins=None, max_buffered=None, align=None, oversize=None, limits=None,
        max_segments=None, backend=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity: &Bound<'_, PyAny>,
        max_open_bins: Option<&Bound<'_, PyAny>>,
        max_buffered: Option<&Bound<'_, PyAny>>,
        align: Option<&Bound<'_, PyAny>>,
        oversize: Option<&Bound<'_, PyAny>>,
        limits: Option<&Bound<'_, PyAny>>,
        max_segments: Option<&Bound<'_, PyAny>>,
        backend: Option<BackendArg>,
    ) -> PyResult<Self> {
        str_options!(oversize);
        let d = StreamOptions::new(u64_arg(capacity, "capacity", 1)?);
        let options = StreamOptions {
            max_open_bins: bounded(max_open_bins, "max_open_bins", 1, MAX_OPEN_BINS)?.unwrap_or(d.max_open_bins),
            max_buffered: bounded(max_buffered, "max_buffered", 0, MAX_BUFFERED)?.unwrap_or(d.max_buffered),
            align: opt_u64(align, "align", 1)?.unwrap_or(d.align),
            oversize: opt_parse(py, oversize)?.unwrap_or(d.oversize),
            ..d
        };
        let kernel = kernel(py, backend)?;
        let (caps, names) = crate::multi::caps_arg(py, limits)?;
        let l = StreamLimits { caps, names, max_segments: opt_u64(max_segments, "max_segments", 0)?.unwrap_or(0) };
        let inner = if l.caps.is_empty() && l.max_segments == 0 {
            py.detach(|| kernel.stream_packer(&options)).map(Inner::Plain)
        } else {
            py.detach(|| kernel.limited_stream_packer(&options, &l)).map(Inner::Limited)
        }
        .map_err(|e| to_py(py, e))?;
        Ok(Self::wrap(inner, options))
    }

    /// A packer from :meth:`state`'s bytes, continuing exactly where that state stood.
    /// Damaged bytes, or a state of another format version, raise
    /// :class:`InvalidArgumentError` and restore nothing.
    #[staticmethod]
    #[pyo3(signature = (state, *, backend=None))]
    fn from_state(py: Python<'_>, state: &Bound<'_, PyAny>, backend: Option<BackendArg>) -> PyResult<Self> {
        let bytes = if let Ok(b) = state.cast::<PyBytes>() {
            b.as_bytes().to_vec()
        } else if let Ok(b) = state.cast::<PyByteArray>() {
            b.to_vec()
        } else {
            let got = state.get_type().name()?;
            return Err(invalid(py, format!("state must be bytes or bytearray from StreamPacker.state() (got {got})")));
        };
        let kernel = kernel(py, backend)?;
        // A limited packer's state starts with "SPSL"; the kernel checks every other byte.
        let inner = if bytes.starts_with(b"SPSL") {
            py.detach(|| kernel.limited_stream_packer_from_state(&bytes)).map(Inner::Limited)
        } else {
            py.detach(|| kernel.stream_packer_from_state(&bytes)).map(Inner::Plain)
        }
        .map_err(|e| to_py(py, e))?;
        let options = match &inner {
            Inner::Plain(p) => *p.options(),
            Inner::Limited(p) => *p.options(),
        };
        Ok(Self::wrap(inner, options))
    }

    /// Adds the next lengths of the stream (a list, tuple or integer array of non-negative
    /// integers); returns the bins that closed, each a list of stream indices. With limits,
    /// ``resources`` maps every limit's name to these items' sizes in it. An error
    /// (:class:`InfeasibleError` for a length above the capacity, or an item over a limit,
    /// under ``oversize="error"``, naming its stream index) applies nothing.
    #[pyo3(signature = (lengths, *, resources=None))]
    fn add(
        &mut self,
        py: Python<'_>,
        lengths: &Bound<'_, PyAny>,
        resources: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyList>> {
        let lengths = Lengths::extract(lengths, "lengths")?;
        let l = lengths.slice();
        let n = l.len();
        let e = self.limits.caps.len();
        let rows = match (e, resources) {
            (0, None) => l.to_vec(),
            (0, Some(_)) => return Err(invalid(py, "resources given to a packer without limits".into())),
            (_, None) => {
                return Err(invalid(
                    py,
                    format!("resources needs every limit's sizes ({})", self.limits.names.join(", ")),
                ));
            }
            (_, Some(r)) => {
                let mut cols = Vec::with_capacity(e);
                for name in &self.limits.names {
                    let Some(v) = r.get_item(name)? else {
                        return Err(invalid(py, format!("resources has no sizes for limits['{name}']")));
                    };
                    let col = Lengths::extract(&v, &format!("resources['{name}']"))?.slice().to_vec();
                    if col.len() != n {
                        return Err(invalid(
                            py,
                            format!("resources['{name}'] has {} sizes, lengths {n}: one per item", col.len()),
                        ));
                    }
                    cols.push(col);
                }
                if r.len() != e {
                    return Err(invalid(
                        py,
                        format!(
                            "resources names {} resources; the limits are {}",
                            r.len(),
                            self.limits.names.join(", ")
                        ),
                    ));
                }
                (0..n).flat_map(|i| std::iter::once(l[i]).chain(cols.iter().map(move |c| c[i]))).collect()
            }
        };
        self.run(py, move |p| p.add(&rows))
    }

    /// Places every waiting length and closes every open bin; returns those bins. The packer
    /// stays usable: later lengths continue the stream's indices.
    fn finish(&mut self, py: Python<'_>) -> PyResult<Py<PyList>> {
        self.run(py, |p| p.finish())
    }

    /// The whole state as bytes (``SPSK`` framing, format version, sha256), for
    /// :meth:`from_state`.
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.with(py, |p| p.state())?;
        Ok(PyBytes::new(py, &bytes))
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        crate::reduce_by(slf, "from_state", (slf.borrow().state(slf.py())?,))
    }

    /// The limits beside the tokens (name → cap per bin); empty without.
    #[getter]
    fn limits<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, cap) in self.limits.names.iter().zip(&self.limits.caps) {
            d.set_item(name, cap)?;
        }
        Ok(d)
    }

    /// At most this many items per bin (0: no limit).
    #[getter]
    fn max_segments(&self) -> u64 {
        self.limits.max_segments
    }

    /// Tokens per bin.
    #[getter]
    fn capacity(&self) -> u64 {
        self.options.capacity
    }

    /// Open bins at most.
    #[getter]
    fn max_open_bins(&self) -> u32 {
        self.options.max_open_bins
    }

    /// Lengths waiting to be placed at most.
    #[getter]
    fn max_buffered(&self) -> u32 {
        self.options.max_buffered
    }

    /// Lengths are rounded up to a multiple of this.
    #[getter]
    fn align(&self) -> u64 {
        self.options.align
    }

    /// The oversize policy's name.
    #[getter]
    fn oversize(&self) -> &'static str {
        self.options.oversize.as_str()
    }

    /// The index the next length gets (the number of lengths added so far).
    #[getter]
    fn next_index(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.status(py)?.next_index)
    }

    /// Lengths waiting, not yet in a bin.
    #[getter]
    fn buffered(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.status(py)?.buffered)
    }

    /// Bins open.
    #[getter]
    fn open_bins(&self, py: Python<'_>) -> PyResult<u32> {
        Ok(self.status(py)?.open_bins)
    }

    /// Lengths in open bins.
    #[getter]
    fn in_open_bins(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.status(py)?.in_open_bins)
    }

    /// The smallest stream index still held (waiting or in an open bin), ``None`` when
    /// nothing is; every smaller index is in a returned bin or was dropped.
    #[getter]
    fn oldest_held(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        Ok(self.status(py)?.oldest_held)
    }

    /// Stream indices dropped (``oversize="drop"``) by the last :meth:`add` or
    /// :meth:`finish`.
    #[getter]
    fn last_dropped(&self) -> Vec<u64> {
        self.last_dropped.clone()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let s = self.status(py)?;
        Ok(format!(
            "StreamPacker(capacity={}, max_open_bins={}, max_buffered={}, next_index={}, buffered={}, open_bins={})",
            self.options.capacity,
            self.options.max_open_bins,
            self.options.max_buffered,
            s.next_index,
            s.buffered,
            s.open_bins
        ))
    }
}

impl PyStreamPacker {
    fn wrap(inner: Inner, options: StreamOptions) -> Self {
        let limits = match &inner {
            Inner::Plain(_) => StreamLimits::default(),
            Inner::Limited(p) => p.limits().clone(),
        };
        Self { inner: Mutex::new(inner), options, limits, last_dropped: Vec::new() }
    }
}

/// An optional count in `low..=high` (the kernel's range, named in the error).
fn bounded(obj: Option<&Bound<'_, PyAny>>, name: &str, low: u32, high: u32) -> PyResult<Option<u32>> {
    obj.map(|o| int::<u32>(o, name, low.into(), high.into())).transpose()
}

/// Registers `StreamPacker` and the kernel's defaults as `STREAM_DEFAULTS` (for the docs and
/// ``PackedIterableDataset``): ``{"max_open_bins": 64, "max_buffered": 4096}``.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStreamPacker>()?;
    let d = pyo3::types::PyDict::new(m.py());
    d.set_item("max_open_bins", DEFAULT_MAX_OPEN_BINS)?;
    d.set_item("max_buffered", DEFAULT_MAX_BUFFERED)?;
    m.add("STREAM_DEFAULTS", d)
}
