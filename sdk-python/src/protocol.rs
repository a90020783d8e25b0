//! The protocol's codecs for Python: training batches and control messages encoded by the
//! orchestrator, rank batches decoded (micro-batches as numpy arrays), the files of the
//! filesystem transport, and the ZeroMQ transport's small messages (hello, ack, receipts).
//! Every protocol decision is the host's (`stowplan::serve::protocol`).

use std::path::PathBuf;
use std::time::Duration;

use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stowplan::serve::protocol::files::control_file_name;
use stowplan::serve::{Control, ControlMessage, RankMessage, Receipt, Receipts, ToRank, batch_file_name, send_fs};
use stowplan::{
    TrainingBatch,
    packer::{RankBatch, RunConfig},
};

use crate::convert::with_bytes;
use crate::materialize::extract_sample;
use crate::micro_batch::wrap;
use crate::{invalid, number, to_py, u32_arg, u64_arg};

/// What one rank receives for one packer step.
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "RankBatch")]
pub struct PyRankBatch {
    #[pyo3(get)]
    step: u64,
    #[pyo3(get)]
    rank: u32,
    #[pyo3(get)]
    dp: u32,
    #[pyo3(get)]
    micro_batches: Py<PyList>,
    #[pyo3(get)]
    sample_runs: Py<numpy::PyArray1<u32>>,
    #[pyo3(get)]
    sample_steps: Py<numpy::PyArray1<u64>>,
    #[pyo3(get)]
    sample_indices: Py<numpy::PyArray1<u32>>,
    #[pyo3(get)]
    ready_to_update: Vec<u32>,
}

#[pymethods]
impl PyRankBatch {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.micro_batches.bind(py).len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "RankBatch(step={}, rank={}/{}, micro_batches={}, samples={})",
            self.step,
            self.rank,
            self.dp,
            self.micro_batches.bind(py).len(),
            self.sample_runs.bind(py).len().unwrap_or(0)
        )
    }
}

pub(crate) fn wrap_rank(py: Python<'_>, b: RankBatch) -> PyResult<PyRankBatch> {
    let list = PyList::empty(py);
    for mb in b.micro_batches {
        list.append(Py::new(py, wrap(py, mb))?)?;
    }
    let runs: Vec<u32> = b.keys.iter().map(|k| k.run).collect();
    let steps: Vec<u64> = b.keys.iter().map(|k| k.step).collect();
    let indices: Vec<u32> = b.keys.iter().map(|k| k.index).collect();
    Ok(PyRankBatch {
        step: b.step,
        rank: b.rank,
        dp: b.dp,
        micro_batches: list.unbind(),
        sample_runs: runs.into_pyarray(py).unbind(),
        sample_steps: steps.into_pyarray(py).unbind(),
        sample_indices: indices.into_pyarray(py).unbind(),
        ready_to_update: b.ready_to_update,
    })
}

pub(crate) fn rank_list(py: Python<'_>, ranks: Vec<RankBatch>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for r in ranks {
        out.append(Py::new(py, wrap_rank(py, r)?)?)?;
    }
    Ok(out)
}

pub(crate) fn training_batch(
    py: Python<'_>,
    run: &Bound<'_, PyAny>,
    step: &Bound<'_, PyAny>,
    temperature: &Bound<'_, PyAny>,
    samples: &Bound<'_, PyAny>,
) -> PyResult<TrainingBatch> {
    let temperature = number(temperature, "temperature", "a number > 0")?;
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(invalid(py, format!("temperature must be > 0 and finite (got {temperature})")));
    }
    let samples = samples
        .try_iter()
        .map_err(|_| invalid(py, "samples must be an iterable of mappings or objects".into()))?
        .enumerate()
        .map(|(i, s)| extract_sample(i, &s?, None).map(|o| o.sample))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(TrainingBatch {
        run: u32_arg(run, "run", 0)?,
        step: u64_arg(step, "step", 0)?,
        temperature: temperature as f32,
        samples,
    })
}

/// encode_training_batch(run, step, temperature, samples) -> bytes
#[pyfunction]
fn encode_training_batch<'py>(
    py: Python<'py>,
    run: &Bound<'_, PyAny>,
    step: &Bound<'_, PyAny>,
    temperature: &Bound<'py, PyAny>,
    samples: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let b = training_batch(py, run, step, temperature, samples)?;
    let bytes = py.detach(|| b.encode()).map_err(|e| to_py(py, e))?;
    Ok(PyBytes::new(py, &bytes))
}

/// encode_control(kind, run, batch_size) -> bytes; kind "add_run" or "remove_run".
#[pyfunction]
fn encode_control<'py>(
    py: Python<'py>,
    kind: &str,
    run: &Bound<'_, PyAny>,
    batch_size: &Bound<'_, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let run = u32_arg(run, "run", 0)?;
    let batch_size = if kind == "add_run" { u64_arg(batch_size, "batch_size", 1)? } else { 1 };
    let c = ControlMessage::new(control(py, kind, run, batch_size)?);
    Ok(PyBytes::new(py, &c.encode().map_err(|e| to_py(py, e))?))
}

/// batch_file_name(run, step) -> the inbox/spool file name of a batch.
#[pyfunction(name = "batch_file_name")]
fn py_batch_file_name(run: &Bound<'_, PyAny>, step: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(batch_file_name(stowplan::packer::BatchKey { run: u32_arg(run, "run", 0)?, step: u64_arg(step, "step", 0)? }))
}

/// fs_send(root, name, data) -> path: writes an encoded message into ROOT/inbox atomically.
#[pyfunction]
fn fs_send(py: Python<'_>, root: PathBuf, name: &str, data: &[u8]) -> PyResult<PathBuf> {
    py.detach(|| send_fs(&root, name, data)).map_err(|e| to_py(py, e))
}

/// write_atomic(path, data): replaces the file at ``path`` by ``data`` (``bytes`` or any
/// contiguous buffer, read in place) atomically (temporary file beside it, fsync, rename, fsync
/// of the directory), as the host writes its own files.
#[pyfunction]
fn write_atomic(py: Python<'_>, path: PathBuf, data: &Bound<'_, PyAny>) -> PyResult<()> {
    with_bytes(data, "data", |bytes| {
        py.detach(|| stowplan::runtime::write_atomic(&path, bytes)).map_err(|e| to_py(py, e))
    })
}

/// AtomicFile(path): a binary file written piece by piece (``write``) that replaces the file at
/// ``path`` atomically on ``commit()`` (temporary file beside it, fsync, rename, fsync of the
/// directory: the host's `stowplan::runtime::AtomicFile`, as ``write_atomic`` for content too large to
/// hold); closed without a commit — ``close()``, or leaving a ``with`` block by an exception —
/// the temporary file is removed and ``path`` left as it was. A sink for ``pyarrow`` writers.
#[pyclass(name = "AtomicFile", module = "stowplan._stowplan")]
pub(crate) struct PyAtomicFile {
    file: Option<stowplan::runtime::AtomicFile>,
    path: PathBuf,
    written: u64,
}

#[pymethods]
impl PyAtomicFile {
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let file = py.detach(|| stowplan::runtime::AtomicFile::create(&path)).map_err(|e| to_py(py, e))?;
        Ok(PyAtomicFile { file: Some(file), path, written: 0 })
    }

    /// Appends ``data`` (``bytes`` or any contiguous buffer, e.g. a ``pyarrow.Buffer``, read
    /// in place); returns its length.
    fn write(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        use std::io::Write;
        let path = self.path.display().to_string();
        let file = self.open(py)?;
        let n = with_bytes(data, "data", |bytes| {
            py.detach(|| file.write_all(bytes))
                .map_err(|e| to_py(py, stowplan::Error::Io(format!("writing (the temporary file of) {path}: {e}"))))?;
            Ok(bytes.len())
        })?;
        self.written += n as u64;
        Ok(n)
    }

    /// Bytes written so far.
    fn tell(&self) -> u64 {
        self.written
    }

    /// Nothing: the data reaches the disk on ``commit()``.
    fn flush(&self) {}

    /// Puts the file in place (flushed, fsynced, renamed over ``path``); the file is closed.
    fn commit(&mut self, py: Python<'_>) -> PyResult<()> {
        self.open(py)?;
        match self.file.take() {
            Some(file) => py.detach(|| file.commit()).map_err(|e| to_py(py, e)),
            None => Ok(()), // (open() refused it already)
        }
    }

    /// Abandons the file unless committed: the temporary file is removed.
    fn close(&mut self) {
        self.file = None;
    }

    /// Whether the file is committed or closed.
    #[getter]
    fn closed(&self) -> bool {
        self.file.is_none()
    }

    /// ``True``: the file takes writes.
    fn writable(&self) -> bool {
        true
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Leaving the ``with`` block closes the file; commit inside the block to keep it.
    fn __exit__(&mut self, _exc_type: &Bound<'_, PyAny>, _exc: &Bound<'_, PyAny>, _tb: &Bound<'_, PyAny>) -> bool {
        self.close();
        false
    }
}

impl PyAtomicFile {
    fn open(&mut self, py: Python<'_>) -> PyResult<&mut stowplan::runtime::AtomicFile> {
        self.file.as_mut().ok_or_else(|| invalid(py, "the AtomicFile is committed or closed".into()))
    }
}

pub(crate) fn duration(py: Python<'_>, name: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| invalid(py, format!("{name} must be a number of seconds ≥ 0 (got {seconds})")))
}

/// control_file_name(kind, run, nanos, pid) -> the inbox file name of a control message
/// (`control_{nanos:020}_{pid}_{kind}_{run}.bin`: the caller passes the time and its pid).
#[pyfunction(name = "control_file_name")]
fn py_control_file_name(
    kind: &str,
    run: &Bound<'_, PyAny>,
    nanos: &Bound<'_, PyAny>,
    pid: &Bound<'_, PyAny>,
) -> PyResult<String> {
    let py = run.py();
    let control = control(py, kind, u32_arg(run, "run", 0)?, 1)?;
    let nanos: u128 = crate::int(nanos, "nanos", 0, i128::MAX)?;
    Ok(control_file_name(&control, nanos, u32_arg(pid, "pid", 0)?))
}

pub(crate) fn control(py: Python<'_>, kind: &str, run: u32, batch_size: u64) -> PyResult<Control> {
    match kind {
        "add_run" => Ok(Control::AddRun { run, config: RunConfig { batch_size } }),
        "remove_run" => Ok(Control::RemoveRun { run }),
        other => Err(invalid(py, format!("kind must be 'add_run' or 'remove_run' (got {other:?})"))),
    }
}

/// decode_rank_batch(data) -> RankBatch; a packer's refusal (ZeroMQ transport) raises
/// InvalidArgumentError with its message.
#[pyfunction]
fn decode_rank_batch(py: Python<'_>, data: &[u8]) -> PyResult<PyRankBatch> {
    match py.detach(|| ToRank::decode(data)) {
        ToRank::Batch(b) => wrap_rank(py, b),
        ToRank::Refusal(r) => Err(invalid(py, format!("the packer refused this rank: {}", r.message))),
        ToRank::Undecodable(e) => Err(to_py(py, e)),
    }
}

/// curve_timeout_hint(client_public, server_public) -> str: what a client that hears nothing
/// from a CURVE packer should check (both keys in Z85), appended to its timeout error.
#[pyfunction(name = "curve_timeout_hint")]
fn py_curve_timeout_hint(client_public: &str, server_public: &str) -> String {
    stowplan::serve::protocol::curve_timeout_hint(client_public, server_public)
}

/// secret_certificate_mode_error(path, mode) -> str or None: why a secret certificate with
/// these permission bits must not be used (None: only its owner may read it).
#[pyfunction(name = "secret_certificate_mode_error")]
fn py_secret_certificate_mode_error(path: &str, mode: u32) -> Option<String> {
    stowplan::serve::protocol::secret_certificate_mode_error(path, mode)
}

/// encode_rank_hello(rank, dp, next_step) -> bytes
#[pyfunction]
fn encode_rank_hello<'py>(
    py: Python<'py>,
    rank: &Bound<'_, PyAny>,
    dp: &Bound<'_, PyAny>,
    next_step: &Bound<'_, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let dp = u32_arg(dp, "dp", 1)?;
    let rank = u32_arg(rank, "rank", 0)?;
    if rank >= dp {
        return Err(invalid(py, format!("rank must be below dp {dp} (got {rank})")));
    }
    let m = RankMessage::Hello { rank, dp, next_step: u64_arg(next_step, "next_step", 0)? };
    Ok(PyBytes::new(py, &m.encode().map_err(|e| to_py(py, e))?))
}

/// encode_rank_ack(rank, step) -> bytes
#[pyfunction]
fn encode_rank_ack<'py>(
    py: Python<'py>,
    rank: &Bound<'_, PyAny>,
    step: &Bound<'_, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let m = RankMessage::Ack { rank: u32_arg(rank, "rank", 0)?, step: u64_arg(step, "step", 0)? };
    Ok(PyBytes::new(py, &m.encode().map_err(|e| to_py(py, e))?))
}

/// decode_receipts(data) -> (incarnation, [dict]); each dict has `kind` ("batch",
/// "add_run" or "remove_run") and `run`; a batch's also `step`, `accepted`, `rejected`,
/// `duplicate`; a control message's `error` (None when applied) and `duplicate` (it had been
/// applied before and was ignored).
#[pyfunction]
fn decode_receipts<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(u64, Bound<'py, PyList>)> {
    let r = Receipts::decode(data).map_err(|e| to_py(py, e))?;
    Ok((r.incarnation, receipt_list(py, r.receipts)?))
}

/// Receipts as the dicts `ZmqSender` returns (see `decode_receipts`).
pub(crate) fn receipt_list(py: Python<'_>, receipts: Vec<Receipt>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for receipt in receipts {
        let d = PyDict::new(py);
        match receipt {
            Receipt::Batch { run, step, accepted, rejected, duplicate } => {
                d.set_item("kind", "batch")?;
                d.set_item("run", run)?;
                d.set_item("step", step)?;
                d.set_item("accepted", accepted)?;
                d.set_item("rejected", rejected)?;
                d.set_item("duplicate", duplicate)?;
            }
            Receipt::Control { id: _, control, error, duplicate } => {
                let (kind, run) = match control {
                    Control::AddRun { run, .. } => ("add_run", run),
                    Control::RemoveRun { run } => ("remove_run", run),
                };
                d.set_item("kind", kind)?;
                d.set_item("run", run)?;
                d.set_item("error", error)?;
                d.set_item("duplicate", duplicate)?;
            }
        }
        out.append(d)?;
    }
    Ok(out)
}

/// Seconds as a `Duration` for an argument `name` (a number ≥ 0; `positive`: > 0).
pub(crate) fn seconds(obj: &Bound<'_, PyAny>, name: &str, positive: bool) -> PyResult<Duration> {
    let what = if positive { "a number of seconds > 0" } else { "a number of seconds ≥ 0" };
    let s = number(obj, name, what)?;
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !(positive && d.is_zero()))
        .ok_or_else(|| invalid(obj.py(), format!("{name} must be {what} (got {s})")))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(encode_training_batch, m)?)?;
    m.add_function(wrap_pyfunction!(encode_control, m)?)?;
    m.add_function(wrap_pyfunction!(py_batch_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(fs_send, m)?)?;
    m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
    m.add_class::<PyAtomicFile>()?;
    m.add_function(wrap_pyfunction!(py_control_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(decode_rank_batch, m)?)?;
    m.add_function(wrap_pyfunction!(encode_rank_hello, m)?)?;
    m.add_function(wrap_pyfunction!(py_curve_timeout_hint, m)?)?;
    m.add_function(wrap_pyfunction!(py_secret_certificate_mode_error, m)?)?;
    m.add_function(wrap_pyfunction!(encode_rank_ack, m)?)?;
    m.add_function(wrap_pyfunction!(decode_receipts, m)?)?;
    m.add_class::<PyRankBatch>()?;
    Ok(())
}
