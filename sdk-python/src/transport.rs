//! The protocol cores the Python transports drive: `RankReceiver` and `BatchSender` for
//! ZeroMQ (whose sockets are pyzmq's), `FileRankClient` for files.
//!
//! Every protocol decision is the host's (`stowplan::serve::protocol`): Python keeps the
//! sockets, the background thread and the waiting. The cores sit behind a `Mutex` (frozen
//! classes), so a receiver's thread and the trainer's thread can call them at once. Two rules
//! keep the core's lock and the GIL from deadlocking: a lock is never waited for while the GIL
//! is held ([`crate::lock`] waits with the GIL released; [`crate::with_lock`] does the work
//! without it, for the file client, which a waiting receive holds for a second at a time), and
//! never held while Python code runs (an exception is built once the lock is released;
//! decoding runs before it is taken).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyBaseException;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use stowplan::packer::BatchKey;
use stowplan::serve::protocol::files::missing_file_error;
use stowplan::serve::{
    Arrival, BatchSender, Control, FileRankClient, FileRankOptions, HEARTBEAT, MessageKey, RankReceiver, Receipts,
    ToRank,
};

use crate::protocol::{PyRankBatch, control, receipt_list, seconds, wrap_rank};
use crate::{invalid, lock, to_py, u32_arg, u64_arg, with_lock};

/// The host's error as the exception instance Python raises (`raise core.timeout_error(…)`).
fn exception(py: Python<'_>, e: stowplan::Error) -> Py<PyBaseException> {
    to_py(py, e).into_value(py)
}

/// The `waited` argument of the timeout errors: seconds ≥ 0.
struct Waited(Duration);

impl<'py> FromPyObject<'_, 'py> for Waited {
    type Error = PyErr;

    fn extract(obj: Borrowed<'_, 'py, PyAny>) -> PyResult<Self> {
        seconds(&obj.to_owned(), "waited", false).map(Waited)
    }
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
    fn rank(&self, py: Python<'_>) -> u32 {
        lock(py, &self.core).rank()
    }

    /// The data-parallel size the rank was started with.
    #[getter]
    fn dp(&self, py: Python<'_>) -> u32 {
        lock(py, &self.core).dp()
    }

    /// How many steps it holds at most before it stops reading.
    #[getter]
    fn prefetch(&self, py: Python<'_>) -> usize {
        lock(py, &self.core).prefetch()
    }

    /// The step `next_batch()` returns next.
    #[getter]
    fn next_step(&self, py: Python<'_>) -> u64 {
        lock(py, &self.core).next_step()
    }

    /// The steps held (the next one if it arrived, and those held back), ascending.
    #[getter]
    fn held_steps(&self, py: Python<'_>) -> Vec<u64> {
        lock(py, &self.core).held_steps()
    }

    /// The hello to send now (bytes), or None: due on the first call, then every heartbeat;
    /// never after a failure.
    fn poll_hello<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        let hello = lock(py, &self.core).poll_hello(Instant::now());
        hello.map(|h| PyBytes::new(py, &h))
    }

    /// Seconds until the next hello is due (0: now; inf: never, the receiver failed).
    fn hello_due_in(&self, py: Python<'_>) -> f64 {
        let d = lock(py, &self.core).hello_due_in(Instant::now());
        if d == Duration::MAX { f64::INFINITY } else { d.as_secs_f64() }
    }

    /// Whether to read the next message (fewer than `prefetch` steps held, no failure).
    fn wants_message(&self, py: Python<'_>) -> bool {
        lock(py, &self.core).wants_message()
    }

    /// Takes one message from the packer (decoded with the GIL released) and returns a
    /// `Received`. Raises InvalidArgumentError for a refusal ("the packer refused this rank:
    /// …"), another rank's batch or undecodable bytes; the receiver then stays failed.
    fn on_message(&self, py: Python<'_>, data: &[u8]) -> PyResult<PyReceived> {
        let message = py.detach(|| ToRank::decode(data));
        // The lock is released before `to_py` (which may run Python code and switch threads).
        let taken = lock(py, &self.core).take(message);
        let r = taken.map_err(|e| to_py(py, e))?;
        let arrival = match r.arrival {
            Arrival::InOrder => "in_order",
            Arrival::HeldBack => "held_back",
            Arrival::Duplicate => "duplicate",
        };
        Ok(PyReceived { step: r.step, arrival, ack: PyBytes::new(py, &r.ack).unbind() })
    }

    /// Whether the step expected next is here.
    fn has_next(&self, py: Python<'_>) -> bool {
        lock(py, &self.core).has_next()
    }

    /// The step expected next as a RankBatch, if it arrived (the one after is expected from
    /// then on); None otherwise.
    fn next_batch(&self, py: Python<'_>) -> PyResult<Option<PyRankBatch>> {
        let b = lock(py, &self.core).next_batch();
        b.map(|b| wrap_rank(py, b)).transpose()
    }

    /// Why the receiver failed (the exception `on_message` raised), or None.
    #[getter]
    fn error(&self, py: Python<'_>) -> Option<Py<PyBaseException>> {
        let e = lock(py, &self.core).error().cloned();
        e.map(|e| exception(py, e))
    }

    /// The StowplanTimeoutError of a wait of `waited` seconds for the next step from
    /// `endpoint`, naming the rank, the step and the steps held back.
    fn timeout_error(&self, py: Python<'_>, endpoint: &str, waited: Waited) -> Py<PyBaseException> {
        let e = lock(py, &self.core).timeout_error(endpoint, waited.0);
        exception(py, e)
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
    fn max_message_bytes(&self, py: Python<'_>) -> u64 {
        lock(py, &self.core).max_message_bytes()
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
        let py = data.py();
        let mut core = lock(py, &self.core);
        if let Err(e) = core.check_batch_size(batch, data.as_bytes().len() as u64) {
            drop(core); // the exception is built without the lock
            return Err(to_py(py, e));
        }
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
        lock(py, &self.core).track(key, bytes.clone().unbind(), Instant::now());
        Ok(bytes)
    }

    /// Takes one message of the receipts socket; returns the receipts (dicts, as
    /// `decode_receipts`) of messages kept until now, which are forgotten. A new incarnation
    /// of the packer makes `due_resends()` return everything unacknowledged.
    fn on_receipts<'py>(&self, py: Python<'py>, data: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let receipts = Receipts::decode(data).map_err(|e| to_py(py, e))?;
        let taken = lock(py, &self.core).take(receipts);
        receipt_list(py, taken)
    }

    /// The messages (bytes) to push again now, oldest first.
    fn due_resends<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        let mut core = lock(py, &self.core);
        let due: Vec<Py<PyBytes>> = core.due_resends(Instant::now()).into_iter().map(|p| p.clone_ref(py)).collect();
        drop(core);
        PyList::new(py, due).unwrap_or_else(|_| PyList::empty(py))
    }

    /// The messages not acknowledged yet (MessageKey), oldest first.
    #[getter]
    fn unacked(&self, py: Python<'_>) -> Vec<PyMessageKey> {
        lock(py, &self.core).unacked().into_iter().map(message_key).collect()
    }

    /// Whether every message sent was acknowledged.
    #[getter]
    fn flushed(&self, py: Python<'_>) -> bool {
        lock(py, &self.core).is_flushed()
    }

    /// The packer process last heard from (None: no receipt yet).
    #[getter]
    fn incarnation(&self, py: Python<'_>) -> Option<u64> {
        lock(py, &self.core).incarnation()
    }

    /// Messages sent again (after a restart of the packer or a timeout).
    #[getter]
    fn resent(&self, py: Python<'_>) -> u64 {
        lock(py, &self.core).resent()
    }

    /// Seconds a message waits for its receipt before it is sent again.
    #[getter]
    fn resend_after(&self, py: Python<'_>) -> f64 {
        lock(py, &self.core).resend_after().as_secs_f64()
    }

    /// The StowplanTimeoutError of a flush that waited `waited` seconds for the packer at
    /// `endpoint`, naming how many messages are unacknowledged and the first three.
    fn flush_timeout_error(&self, py: Python<'_>, endpoint: &str, waited: Waited) -> Py<PyBaseException> {
        let e = lock(py, &self.core).flush_timeout_error(endpoint, waited.0);
        exception(py, e)
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
    fn next_step(&self, py: Python<'_>) -> u64 {
        with_lock(py, &self.client, |c| c.next_step())
    }

    /// This rank's file of `step`.
    fn path(&self, py: Python<'_>, step: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
        let step = u64_arg(step, "step", 0)?;
        Ok(with_lock(py, &self.client, |c| c.path(step)))
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
            None => with_lock(py, &self.client, |c| c.next_step()),
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
                    let path = with_lock(py, &self.client, |c| c.path(step));
                    return Err(to_py(py, missing_file_error(&path, timeout.unwrap_or(slice))));
                }
                Ok(Err(e)) => return Err(to_py(py, e)),
            }
        }
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRankReceiver>()?;
    m.add_class::<PyReceived>()?;
    m.add_class::<PyBatchSender>()?;
    m.add_class::<PyMessageKey>()?;
    m.add_class::<PyFileRankClient>()?;
    // Seconds between the packer's heartbeats and between a waiting rank's hellos.
    m.add("HEARTBEAT", HEARTBEAT.as_secs_f64())?;
    Ok(())
}
