//! The packer runtime and its transports for Python: training batches encoded and sent by
//! the orchestrator, rank batches received (micro-batches as numpy arrays), the protocol
//! cores the Python transports drive (`RankReceiver` and `BatchSender` for ZeroMQ, whose
//! sockets are pyzmq's; `FileRankClient` for files), the ZeroMQ transport's small messages
//! (hello, ack, receipts), and the in-process `Packer`.
//!
//! Every protocol decision is the host's (`stowplan::serve::protocol`): Python keeps the
//! sockets, the background thread and the waiting. The cores sit behind a `Mutex` (frozen
//! classes), so a receiver's thread and the trainer's thread can call them at once; a lock is
//! never held while waiting for the GIL or running Python code (decoding runs with the GIL
//! released before the lock is taken), so the two locks cannot deadlock.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use numpy::IntoPyArray;
use pyo3::exceptions::PyBaseException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stowplan::serve::protocol::files::{control_file_name, missing_file_error};
use stowplan::serve::{
    Arrival, BatchSender, Control, ControlMessage, FileRankClient, FileRankOptions, HEARTBEAT, MessageKey, RankMessage,
    RankReceiver, Receipt, Receipts, ToRank, batch_file_name, send_fs,
};
use stowplan::{BatchKey, Packer, PackerOptions, PackerState, RankBatch, RunConfig, RunProgress, TrainingBatch};

use crate::layout::{extract_sample, wrap};
use crate::str_options;
use crate::{cost_arg, int, invalid, kernel, number, opt_parse, opt_u32, opt_u64, to_py, u32_arg, u64_arg};

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

fn wrap_rank(py: Python<'_>, b: RankBatch) -> PyResult<PyRankBatch> {
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

fn rank_list(py: Python<'_>, ranks: Vec<RankBatch>) -> PyResult<Bound<'_, PyList>> {
    let out = PyList::empty(py);
    for r in ranks {
        out.append(Py::new(py, wrap_rank(py, r)?)?)?;
    }
    Ok(out)
}

fn training_batch(
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
        .map(|(i, s)| extract_sample(i, &s?).map(|o| o.sample))
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
    Ok(batch_file_name(stowplan::BatchKey { run: u32_arg(run, "run", 0)?, step: u64_arg(step, "step", 0)? }))
}

/// fs_send(root, name, data) -> path: writes an encoded message into ROOT/inbox atomically.
#[pyfunction]
fn fs_send(py: Python<'_>, root: PathBuf, name: &str, data: &[u8]) -> PyResult<PathBuf> {
    py.detach(|| send_fs(&root, name, data)).map_err(|e| to_py(py, e))
}

/// write_atomic(path, data): replaces the file at ``path`` by ``data`` atomically (temporary
/// file beside it, fsync, rename, fsync of the directory), as the host writes its own files.
#[pyfunction]
fn write_atomic(py: Python<'_>, path: PathBuf, data: &[u8]) -> PyResult<()> {
    py.detach(|| stowplan::write_atomic(&path, data)).map_err(|e| to_py(py, e))
}

fn duration(py: Python<'_>, name: &str, seconds: f64) -> PyResult<Duration> {
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

fn control(py: Python<'_>, kind: &str, run: u32, batch_size: u64) -> PyResult<Control> {
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
fn receipt_list(py: Python<'_>, receipts: Vec<Receipt>) -> PyResult<Bound<'_, PyList>> {
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

/// Locks a core; a poisoned lock (a panic elsewhere) still holds a consistent core, as no
/// core method panics halfway.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Seconds as a `Duration` for an argument `name` (a number ≥ 0; `positive`: > 0).
fn seconds(obj: &Bound<'_, PyAny>, name: &str, positive: bool) -> PyResult<Duration> {
    let what = if positive { "a number of seconds > 0" } else { "a number of seconds ≥ 0" };
    let s = number(obj, name, what)?;
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !(positive && d.is_zero()))
        .ok_or_else(|| invalid(obj.py(), format!("{name} must be {what} (got {s})")))
}

/// The host's error as the exception instance Python raises (`raise core.timeout_error(…)`).
fn exception(py: Python<'_>, e: stowplan::Error) -> Py<PyBaseException> {
    to_py(py, e).into_value(py)
}

/// What a `RankReceiver` made of one rank batch: its `step`, where it went (`arrival`:
/// "in_order" — the step expected next —, "held_back" — ahead of it —, or "duplicate" — a
/// copy, dropped) and the acknowledgement to send back (`ack`, bytes).
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "Received")]
pub struct PyReceived {
    #[pyo3(get)]
    step: u64,
    #[pyo3(get)]
    arrival: &'static str,
    #[pyo3(get)]
    ack: Py<PyBytes>,
}

#[pymethods]
impl PyReceived {
    fn __repr__(&self) -> String {
        format!("Received(step={}, arrival={:?})", self.step, self.arrival)
    }
}

/// A trainer rank's side of the ZeroMQ protocol (`stowplan::serve::RankReceiver`): the
/// driver sends `poll_hello()` when it returns bytes, reads a message while
/// `wants_message()`, passes it to `on_message(data)` and sends back its `ack`; the trainer
/// takes steps in order with `next_batch()`.
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "RankReceiver")]
pub struct PyRankReceiver {
    core: Mutex<RankReceiver>,
}

#[pymethods]
impl PyRankReceiver {
    /// RankReceiver(rank, dp, *, next_step=0, prefetch=2): rank `rank` of `dp`, expecting
    /// `next_step` first, holding at most `prefetch` steps the trainer has not taken.
    #[new]
    #[pyo3(signature = (rank, dp, *, next_step=None, prefetch=None))]
    fn new(
        rank: &Bound<'_, PyAny>,
        dp: &Bound<'_, PyAny>,
        next_step: Option<&Bound<'_, PyAny>>,
        prefetch: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let py = rank.py();
        let (rank, dp) = (u32_arg(rank, "rank", 0)?, u32_arg(dp, "dp", 1)?);
        let next_step = next_step.map(|s| u64_arg(s, "next_step", 0)).transpose()?.unwrap_or(0);
        let prefetch: usize = match prefetch {
            Some(p) => crate::int(p, "prefetch", 1, i128::from(u32::MAX))?,
            None => stowplan::serve::protocol::rank::DEFAULT_PREFETCH,
        };
        let core = RankReceiver::new(rank, dp, next_step, prefetch).map_err(|e| to_py(py, e))?;
        Ok(Self { core: Mutex::new(core) })
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u32 {
        locked(&self.core).rank()
    }

    /// The data-parallel size the rank was started with.
    #[getter]
    fn dp(&self) -> u32 {
        locked(&self.core).dp()
    }

    /// How many steps it holds at most before it stops reading.
    #[getter]
    fn prefetch(&self) -> usize {
        locked(&self.core).prefetch()
    }

    /// The step `next_batch()` returns next.
    #[getter]
    fn next_step(&self) -> u64 {
        locked(&self.core).next_step()
    }

    /// The steps held (the next one if it arrived, and those held back), ascending.
    #[getter]
    fn held_steps(&self) -> Vec<u64> {
        locked(&self.core).held_steps()
    }

    /// The hello to send now (bytes), or None: due on the first call, then every heartbeat;
    /// never after a failure.
    fn poll_hello<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        let hello = locked(&self.core).poll_hello(Instant::now());
        hello.map(|h| PyBytes::new(py, &h))
    }

    /// Seconds until the next hello is due (0: now; inf: never, the receiver failed).
    fn hello_due_in(&self) -> f64 {
        let d = locked(&self.core).hello_due_in(Instant::now());
        if d == Duration::MAX { f64::INFINITY } else { d.as_secs_f64() }
    }

    /// Whether to read the next message (fewer than `prefetch` steps held, no failure).
    fn wants_message(&self) -> bool {
        locked(&self.core).wants_message()
    }

    /// Takes one message from the packer (decoded with the GIL released) and returns a
    /// `Received`. Raises InvalidArgumentError for a refusal ("the packer refused this rank:
    /// …"), another rank's batch or undecodable bytes; the receiver then stays failed.
    fn on_message(&self, py: Python<'_>, data: &[u8]) -> PyResult<PyReceived> {
        let message = py.detach(|| ToRank::decode(data));
        // The lock is released before `to_py` (which may run Python code and switch threads).
        let taken = locked(&self.core).take(message);
        let r = taken.map_err(|e| to_py(py, e))?;
        let arrival = match r.arrival {
            Arrival::InOrder => "in_order",
            Arrival::HeldBack => "held_back",
            Arrival::Duplicate => "duplicate",
        };
        Ok(PyReceived { step: r.step, arrival, ack: PyBytes::new(py, &r.ack).unbind() })
    }

    /// Whether the step expected next is here.
    fn has_next(&self) -> bool {
        locked(&self.core).has_next()
    }

    /// The step expected next as a RankBatch, if it arrived (the one after is expected from
    /// then on); None otherwise.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<PyRankBatch>> {
        let b = locked(&self.core).next_batch();
        b.map(|b| wrap_rank(py, b)).transpose()
    }

    /// Why the receiver failed (the exception `on_message` raised), or None.
    #[getter]
    fn error(&self, py: Python<'_>) -> Option<Py<PyBaseException>> {
        let e = locked(&self.core).error().cloned();
        e.map(|e| exception(py, e))
    }

    /// The StowplanTimeoutError of a wait of `waited` seconds for the next step from
    /// `endpoint`, naming the rank, the step and the steps held back.
    fn timeout_error(
        &self,
        py: Python<'_>,
        endpoint: &str,
        waited: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyBaseException>> {
        let waited = seconds(waited, "waited", false)?;
        let e = locked(&self.core).timeout_error(endpoint, waited);
        Ok(exception(py, e))
    }
}

/// A message an orchestrator sent and the packer has not acknowledged: `kind` ("batch",
/// "add_run" or "remove_run"), `run`, a batch's `step` and a new run's `batch_size` (None
/// otherwise).
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "MessageKey")]
pub struct PyMessageKey {
    #[pyo3(get)]
    kind: &'static str,
    #[pyo3(get)]
    run: u32,
    #[pyo3(get)]
    step: Option<u64>,
    #[pyo3(get)]
    batch_size: Option<u64>,
}

#[pymethods]
impl PyMessageKey {
    fn __repr__(&self) -> String {
        match (self.step, self.batch_size) {
            (Some(step), _) => format!("MessageKey({:?}, run={}, step={step})", self.kind, self.run),
            (_, Some(b)) => format!("MessageKey({:?}, run={}, batch_size={b})", self.kind, self.run),
            _ => format!("MessageKey({:?}, run={})", self.kind, self.run),
        }
    }
}

fn message_key(k: &MessageKey) -> PyMessageKey {
    match k {
        MessageKey::Batch(b) => PyMessageKey { kind: "batch", run: b.run, step: Some(b.step), batch_size: None },
        MessageKey::Control { control: Control::AddRun { run, config }, .. } => {
            PyMessageKey { kind: "add_run", run: *run, step: None, batch_size: Some(config.batch_size) }
        }
        MessageKey::Control { control: Control::RemoveRun { run }, .. } => {
            PyMessageKey { kind: "remove_run", run: *run, step: None, batch_size: None }
        }
    }
}

/// An orchestrator's side of the ZeroMQ protocol (`stowplan::serve::BatchSender`): every
/// message goes through `track_batch`/`track_control` (which return the bytes to push) and
/// is kept until a receipt names it; every message of the receipts socket goes to
/// `on_receipts`; the driver then pushes what `due_resends()` returns.
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "BatchSender")]
pub struct PyBatchSender {
    core: Mutex<BatchSender<Py<PyBytes>>>,
}

#[pymethods]
impl PyBatchSender {
    /// BatchSender(*, resend_after=30.0, max_message_bytes=MAX_MESSAGE_BYTES): resends a
    /// message `resend_after` seconds after it was sent without a receipt, and everything
    /// unacknowledged when the packer restarts; refuses a batch over `max_message_bytes` (the
    /// packer's `--max-message-mib`).
    #[new]
    #[pyo3(signature = (*, resend_after=None, max_message_bytes=None))]
    fn new(
        py: Python<'_>,
        resend_after: Option<&Bound<'_, PyAny>>,
        max_message_bytes: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let resend_after = resend_after.map(|r| seconds(r, "resend_after", true)).transpose()?;
        let mut core =
            BatchSender::new(resend_after.unwrap_or(stowplan::serve::protocol::sender::DEFAULT_RESEND_AFTER))
                .map_err(|e| to_py(py, e))?;
        if let Some(max) = max_message_bytes {
            core.set_max_message_bytes(u64_arg(max, "max_message_bytes", 0)?).map_err(|e| to_py(py, e))?;
        }
        Ok(Self { core: Mutex::new(core) })
    }

    /// The message cap.
    #[getter]
    fn max_message_bytes(&self) -> u64 {
        locked(&self.core).max_message_bytes()
    }

    /// Keeps `data` (an encoded training batch of run `run`, step `step`) until its receipt;
    /// returns it, to push.
    #[pyo3(signature = (data, *, run, step))]
    fn track_batch<'py>(
        &self,
        data: Bound<'py, PyBytes>,
        run: &Bound<'py, PyAny>,
        step: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let batch = BatchKey { run: u32_arg(run, "run", 0)?, step: u64_arg(step, "step", 0)? };
        let mut core = locked(&self.core);
        core.check_batch_size(batch, data.as_bytes().len() as u64).map_err(|e| to_py(data.py(), e))?;
        core.track(MessageKey::Batch(batch), data.clone().unbind(), Instant::now());
        Ok(data)
    }

    /// Encodes a run change (`kind` "add_run", which needs `batch_size`, or "remove_run")
    /// and keeps it until its receipt; returns the bytes to push.
    #[pyo3(signature = (kind, run, *, batch_size=None))]
    fn track_control<'py>(
        &self,
        py: Python<'py>,
        kind: &str,
        run: &Bound<'py, PyAny>,
        batch_size: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let run = u32_arg(run, "run", 0)?;
        let batch_size = match (kind, batch_size) {
            ("add_run", Some(b)) => u64_arg(b, "batch_size", 1)?,
            ("add_run", None) => return Err(invalid(py, "add_run needs batch_size".into())),
            _ => 1,
        };
        let (key, bytes) = MessageKey::new_control(control(py, kind, run, batch_size)?).map_err(|e| to_py(py, e))?;
        let bytes = PyBytes::new(py, &bytes);
        locked(&self.core).track(key, bytes.clone().unbind(), Instant::now());
        Ok(bytes)
    }

    /// Takes one message of the receipts socket; returns the receipts (dicts, as
    /// `decode_receipts`) of messages kept until now, which are forgotten. A new incarnation
    /// of the packer makes `due_resends()` return everything unacknowledged.
    fn on_receipts<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let receipts = Receipts::decode(data).map_err(|e| to_py(py, e))?;
        let taken = locked(&self.core).take(receipts);
        receipt_list(py, taken)
    }

    /// The messages (bytes) to push again now, oldest first.
    fn due_resends<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        let mut core = locked(&self.core);
        let due: Vec<Py<PyBytes>> = core.due_resends(Instant::now()).into_iter().map(|p| p.clone_ref(py)).collect();
        drop(core);
        PyList::new(py, due).unwrap_or_else(|_| PyList::empty(py))
    }

    /// The messages not acknowledged yet (MessageKey), oldest first.
    #[getter]
    fn unacked(&self) -> Vec<PyMessageKey> {
        locked(&self.core).unacked().into_iter().map(message_key).collect()
    }

    /// Whether every message sent was acknowledged.
    #[getter]
    fn flushed(&self) -> bool {
        locked(&self.core).is_flushed()
    }

    /// The packer process last heard from (None: no receipt yet).
    #[getter]
    fn incarnation(&self) -> Option<u64> {
        locked(&self.core).incarnation()
    }

    /// Messages sent again (after a restart of the packer or a timeout).
    #[getter]
    fn resent(&self) -> u64 {
        locked(&self.core).resent()
    }

    /// Seconds a message waits for its receipt before it is sent again.
    #[getter]
    fn resend_after(&self) -> f64 {
        locked(&self.core).resend_after().as_secs_f64()
    }

    /// The StowplanTimeoutError of a flush that waited `waited` seconds for the packer at
    /// `endpoint`, naming how many messages are unacknowledged and the first three.
    fn flush_timeout_error(
        &self,
        py: Python<'_>,
        endpoint: &str,
        waited: &Bound<'_, PyAny>,
    ) -> PyResult<Py<PyBaseException>> {
        let waited = seconds(waited, "waited", false)?;
        let e = locked(&self.core).flush_timeout_error(endpoint, waited);
        Ok(exception(py, e))
    }
}

/// A trainer rank over the filesystem transport (`stowplan::serve::FileRankClient`): waits
/// for `ROOT/rollouts/step_{n}/rank_{rank}.bin`, decodes it and, with `consume`, removes it
/// (and the step's directory with the last rank's file).
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "FileRankClient")]
pub struct PyFileRankClient {
    client: Mutex<FileRankClient>,
}

/// How long one wait runs with the GIL released before Python signals are checked.
const SLICE: Duration = Duration::from_secs(1);

#[pymethods]
impl PyFileRankClient {
    /// FileRankClient(root, rank, *, start_step=0, consume=False, poll=0.005)
    #[new]
    #[pyo3(signature = (root, rank, *, start_step=None, consume=false, poll=None))]
    fn new(
        root: PathBuf,
        rank: &Bound<'_, PyAny>,
        start_step: Option<&Bound<'_, PyAny>>,
        consume: bool,
        poll: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let py = rank.py();
        let defaults = FileRankOptions::default();
        let options = FileRankOptions {
            start_step: start_step.map(|s| u64_arg(s, "start_step", 0)).transpose()?.unwrap_or(defaults.start_step),
            consume,
            poll: poll.map(|p| seconds(p, "poll", true)).transpose()?.unwrap_or(defaults.poll),
        };
        let client = FileRankClient::new(root, u32_arg(rank, "rank", 0)?, options).map_err(|e| to_py(py, e))?;
        Ok(Self { client: Mutex::new(client) })
    }

    /// The step `receive()` returns next.
    #[getter]
    fn next_step(&self) -> u64 {
        locked(&self.client).next_step()
    }

    /// This rank's file of `step`.
    fn path(&self, step: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
        Ok(locked(&self.client).path(u64_arg(step, "step", 0)?))
    }

    /// Waits up to `timeout` seconds (None: forever) for step `step` (None: the next one) and
    /// returns it; the step after it is expected next. Raises StowplanTimeoutError naming the
    /// file. Only one thread may wait on a client at a time.
    #[pyo3(signature = (*, step=None, timeout=None))]
    fn receive(
        &self,
        py: Python<'_>,
        step: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyRankBatch> {
        let step = match step {
            Some(s) => u64_arg(s, "step", 0)?,
            None => locked(&self.client).next_step(),
        };
        let timeout = timeout.map(|t| seconds(t, "timeout", false)).transpose()?;
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let slice = left.map_or(SLICE, |l| l.min(SLICE));
            // The lock is taken and released with the GIL released (never held while waiting
            // for the GIL); another thread waiting on the same client is refused.
            let got = py.detach(|| match self.client.try_lock() {
                Ok(mut c) => Ok(c.receive_step(step, slice)),
                Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner().receive_step(step, slice)),
                Err(std::sync::TryLockError::WouldBlock) => Err(()),
            });
            match got {
                Err(()) => {
                    return Err(invalid(py, "receive: another thread is receiving on this FileRankClient".into()));
                }
                Ok(Ok(b)) => return wrap_rank(py, b),
                Ok(Err(stowplan::Error::Timeout(_))) if left.is_none_or(|l| l > slice) => py.check_signals()?,
                Ok(Err(stowplan::Error::Timeout(_))) => {
                    let path = locked(&self.client).path(step);
                    return Err(to_py(py, missing_file_error(&path, timeout.unwrap_or(slice))));
                }
                Ok(Err(e)) => return Err(to_py(py, e)),
            }
        }
    }
}

fn progress_dict<'py>(py: Python<'py>, run: u32, batch_size: u64, p: &RunProgress) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("run", run)?;
    d.set_item("batch_size", batch_size)?;
    d.set_item("step", p.step)?;
    d.set_item("samples_this_step", p.samples_this_step)?;
    d.set_item("ready_to_update", p.ready_to_update)?;
    d.set_item("total_samples", p.total_samples)?;
    d.set_item("total_tokens", p.total_tokens)?;
    d.set_item("received_samples", p.received_samples)?;
    let rejected = PyDict::new(py);
    for (reason, n) in &p.rejected {
        rejected.set_item(reason.name(), n)?;
    }
    d.set_item("rejected", rejected)?;
    d.set_item("duplicate_batches", p.duplicate_batches)?;
    Ok(d)
}

/// The packer runtime in process (see `stowplan::packer`).
#[derive(Debug)]
#[pyclass(module = "stowplan._stowplan", name = "Packer")]
pub struct PyPacker {
    inner: Arc<Mutex<Packer>>,
}

impl PyPacker {
    fn lock(&self, py: Python<'_>) -> PyResult<std::sync::MutexGuard<'_, Packer>> {
        self.inner.lock().map_err(|_| to_py(py, stowplan::Error::Runtime("the packer lock is poisoned".into())))
    }
}

#[pymethods]
impl PyPacker {
    #[new]
    #[pyo3(signature = (seq_len, dp, *, pad_to_multiple_of=None, pad_token_id=None, cost=None, num_runs=None,
        threshold=None, step_tokens=None, wait_timeout=None, teacher_logprobs=None, allow_empty_completion=None,
        loss_agg_mode=None, loss_scale_factor=None, loss_normalization=None, backend=None, state=None, batches=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        seq_len: &Bound<'_, PyAny>,
        dp: &Bound<'_, PyAny>,
        pad_to_multiple_of: Option<&Bound<'_, PyAny>>,
        pad_token_id: Option<&Bound<'_, PyAny>>,
        cost: Option<&Bound<'_, PyAny>>,
        num_runs: Option<&Bound<'_, PyAny>>,
        threshold: Option<&Bound<'_, PyAny>>,
        step_tokens: Option<&Bound<'_, PyAny>>,
        wait_timeout: Option<&Bound<'_, PyAny>>,
        teacher_logprobs: Option<bool>,
        allow_empty_completion: Option<bool>,
        loss_agg_mode: Option<&Bound<'_, PyAny>>,
        loss_scale_factor: Option<&Bound<'_, PyAny>>,
        loss_normalization: Option<&Bound<'_, PyAny>>,
        backend: Option<&Bound<'_, PyAny>>,
        state: Option<&[u8]>,
        batches: Option<Vec<Vec<u8>>>,
    ) -> PyResult<Self> {
        str_options!(loss_agg_mode, loss_normalization, backend);
        // `None` (or an omitted option) is the host's default: `PackerOptions::new`.
        let d = PackerOptions::new(u64_arg(seq_len, "seq_len", 1)?, u32_arg(dp, "dp", 1)?);
        let o = PackerOptions {
            pad_to_multiple_of: opt_u64(pad_to_multiple_of, "pad_to_multiple_of", 1)?.unwrap_or(d.pad_to_multiple_of),
            pad_token_id: pad_token_id
                .map(|t| int::<i64>(t, "pad_token_id", i64::MIN.into(), i64::MAX.into()))
                .transpose()?
                .unwrap_or(d.pad_token_id),
            cost: cost_arg(cost)?.unwrap_or(d.cost),
            num_runs: opt_u32(num_runs, "num_runs", 1)?.unwrap_or(d.num_runs),
            threshold: opt_u64(threshold, "threshold", 1)?,
            step_tokens: opt_u64(step_tokens, "step_tokens", 1)?,
            wait_timeout: match wait_timeout {
                Some(w) => duration(py, "wait_timeout", number(w, "wait_timeout", "a number of seconds")?)?,
                None => d.wait_timeout,
            },
            teacher_logprobs: teacher_logprobs.unwrap_or(d.teacher_logprobs),
            allow_empty_completion: allow_empty_completion.unwrap_or(d.allow_empty_completion),
            loss_agg_mode: opt_parse(py, loss_agg_mode)?.unwrap_or(d.loss_agg_mode),
            loss_scale_factor: loss_scale_factor
                .map(|f| number(f, "loss_scale_factor", "a number of tokens"))
                .transpose()?
                .or(d.loss_scale_factor),
            loss_normalization: opt_parse(py, loss_normalization)?.unwrap_or(d.loss_normalization),
            ..d
        };
        o.validate().map_err(|e| to_py(py, e))?;
        let k = kernel(py, backend)?;
        let packer = match state {
            None => Packer::new(k, o),
            Some(bytes) => py.detach(|| {
                let state = PackerState::decode(bytes)?;
                let mut by_key = std::collections::HashMap::new();
                for b in batches.unwrap_or_default() {
                    let b = TrainingBatch::decode(&b)?;
                    by_key.insert(b.key(), Arc::new(b));
                }
                Packer::restore(k, o, state, |key| {
                    by_key.get(&key).cloned().ok_or_else(|| {
                        stowplan::Error::CacheMismatch(format!(
                            "the state needs batch run {} step {}, which batches lacks",
                            key.run, key.step
                        ))
                    })
                })
            }),
        }
        .map_err(|e| to_py(py, e))?;
        Ok(Self { inner: Arc::new(Mutex::new(packer)) })
    }

    fn add_run(&self, py: Python<'_>, run: &Bound<'_, PyAny>, batch_size: &Bound<'_, PyAny>) -> PyResult<()> {
        let (run, batch_size) = (u32_arg(run, "run", 0)?, u64_arg(batch_size, "batch_size", 1)?);
        self.lock(py)?.add_run(run, RunConfig { batch_size }).map_err(|e| to_py(py, e))
    }

    fn remove_run(&self, py: Python<'_>, run: &Bound<'_, PyAny>) -> PyResult<usize> {
        let run = u32_arg(run, "run", 0)?;
        self.lock(py)?.remove_run(run).map(|(dropped, _)| dropped).map_err(|e| to_py(py, e))
    }

    fn clear_ready(&self, py: Python<'_>, run: &Bound<'_, PyAny>) -> PyResult<()> {
        let run = u32_arg(run, "run", 0)?;
        self.lock(py)?.clear_ready(run).map_err(|e| to_py(py, e))
    }

    /// ingest(run, step, temperature, samples) -> (accepted, rejected [(index, reason, message)], duplicate)
    #[allow(clippy::type_complexity)]
    fn ingest(
        &self,
        py: Python<'_>,
        run: &Bound<'_, PyAny>,
        step: &Bound<'_, PyAny>,
        temperature: &Bound<'_, PyAny>,
        samples: &Bound<'_, PyAny>,
    ) -> PyResult<(u32, Vec<(u32, &'static str, String)>, bool)> {
        let b = Arc::new(training_batch(py, run, step, temperature, samples)?);
        let r = self.lock(py)?.ingest(b);
        let rejected = r.rejected.into_iter().map(|(i, reason, m)| (i, reason.name(), m)).collect();
        Ok((r.accepted, rejected, r.duplicate))
    }

    /// ingest_bytes(data): ingest an encoded training batch.
    #[allow(clippy::type_complexity)]
    fn ingest_bytes(&self, py: Python<'_>, data: &[u8]) -> PyResult<(u32, Vec<(u32, &'static str, String)>, bool)> {
        let b = Arc::new(py.detach(|| TrainingBatch::decode(data)).map_err(|e| to_py(py, e))?);
        let r = self.lock(py)?.ingest(b);
        let rejected = r.rejected.into_iter().map(|(i, reason, m)| (i, reason.name(), m)).collect();
        Ok((r.accepted, rejected, r.duplicate))
    }

    fn should_pack(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.lock(py)?.should_pack(std::time::Instant::now()))
    }

    /// pack(force) -> None or (list of RankBatch, metrics dict)
    fn pack<'py>(&self, py: Python<'py>, force: bool) -> PyResult<Option<(Bound<'py, PyList>, Bound<'py, PyDict>)>> {
        let inner = Arc::clone(&self.inner);
        let step = py
            .detach(move || match inner.lock() {
                Ok(mut p) => p.pack(force),
                Err(_) => Err(stowplan::Error::Runtime("the packer lock is poisoned".into())),
            })
            .map_err(|e| to_py(py, e))?;
        let Some(step) = step else { return Ok(None) };
        let ranks = rank_list(py, step.ranks)?;
        let m = &step.metrics;
        let d = PyDict::new(py);
        d.set_item("step", m.step)?;
        d.set_item("samples", m.samples)?;
        d.set_item("real_tokens", m.real_tokens)?;
        d.set_item("padding_tokens", m.padding_tokens)?;
        d.set_item("micro_batches_per_rank", m.micro_batches_per_rank)?;
        d.set_item("imbalance", m.imbalance)?;
        d.set_item("pack_seconds", m.pack_seconds)?;
        d.set_item("run_samples", m.run_samples.clone())?;
        Ok(Some((ranks, d)))
    }

    fn delivered(&self, py: Python<'_>, step: &Bound<'_, PyAny>) -> PyResult<Vec<(u32, u64)>> {
        let step = u64_arg(step, "step", 0)?;
        let keys = self.lock(py)?.delivered(step).map_err(|e| to_py(py, e))?;
        Ok(keys.into_iter().map(|k| (k.run, k.step)).collect())
    }

    fn pending(&self, py: Python<'_>) -> PyResult<(usize, u64)> {
        Ok(self.lock(py)?.pending())
    }

    fn next_step(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.lock(py)?.next_step())
    }

    fn runs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let p = self.lock(py)?;
        for (run, c, progress) in p.runs() {
            out.append(progress_dict(py, run, c.batch_size, progress)?)?;
        }
        Ok(out)
    }

    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.lock(py)?.state().encode().map_err(|e| to_py(py, e))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Every batch the state needs for a restore, as (run, step) pairs.
    fn needed_batches(&self, py: Python<'_>) -> PyResult<Vec<(u32, u64)>> {
        Ok(self.lock(py)?.state().batches().into_iter().map(|k| (k.run, k.step)).collect())
    }

    fn rebuild_inflight<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let step = self.lock(py)?.rebuild_inflight().map_err(|e| to_py(py, e))?;
        step.map(|s| rank_list(py, s.ranks)).transpose()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(encode_training_batch, m)?)?;
    m.add_function(wrap_pyfunction!(encode_control, m)?)?;
    m.add_function(wrap_pyfunction!(py_batch_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(fs_send, m)?)?;
    m.add_function(wrap_pyfunction!(write_atomic, m)?)?;
    m.add_function(wrap_pyfunction!(py_control_file_name, m)?)?;
    m.add_function(wrap_pyfunction!(decode_rank_batch, m)?)?;
    m.add_function(wrap_pyfunction!(encode_rank_hello, m)?)?;
    m.add_function(wrap_pyfunction!(py_curve_timeout_hint, m)?)?;
    m.add_function(wrap_pyfunction!(py_secret_certificate_mode_error, m)?)?;
    m.add_function(wrap_pyfunction!(encode_rank_ack, m)?)?;
    m.add_function(wrap_pyfunction!(decode_receipts, m)?)?;
    m.add_class::<PyRankBatch>()?;
    m.add_class::<PyPacker>()?;
    m.add_class::<PyRankReceiver>()?;
    m.add_class::<PyReceived>()?;
    m.add_class::<PyBatchSender>()?;
    m.add_class::<PyMessageKey>()?;
    m.add_class::<PyFileRankClient>()?;
    // Seconds between the packer's heartbeats and between a waiting rank's hellos.
    m.add("HEARTBEAT", HEARTBEAT.as_secs_f64())?;
    Ok(())
}
