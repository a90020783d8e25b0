//! The packer runtime and its transports for Python: training batches encoded and sent by
//! the orchestrator, rank batches received (micro-batches as numpy arrays), the ZeroMQ
//! transport's small messages (hello, ack, receipts; the sockets are pyzmq's), and the
//! in-process `Packer`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stowplan::serve::{Control, RankMessage, Receipt, Receipts, Refusal, batch_file_name, receive_fs, send_fs};
use stowplan::{Cost, Packer, PackerOptions, PackerState, RankBatch, RunConfig, RunProgress, TrainingBatch};

use crate::layout::{extract_sample, wrap};
use crate::{invalid, kernel, to_py};

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

fn u32_of(py: Python<'_>, name: &str, v: i128, min: u32) -> PyResult<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&x| x >= min)
        .ok_or_else(|| invalid(py, format!("{name} must be in {min}..=2**32-1 (got {v})")))
}

fn u64_of(py: Python<'_>, name: &str, v: i128, min: u64) -> PyResult<u64> {
    u64::try_from(v)
        .ok()
        .filter(|&x| x >= min)
        .ok_or_else(|| invalid(py, format!("{name} must be in {min}..=2**64-1 (got {v})")))
}

fn training_batch(
    py: Python<'_>,
    run: i128,
    step: i128,
    temperature: f64,
    samples: &Bound<'_, PyAny>,
) -> PyResult<TrainingBatch> {
    if !(temperature > 0.0 && temperature.is_finite()) {
        return Err(invalid(py, format!("temperature must be > 0 and finite (got {temperature})")));
    }
    let samples = samples
        .try_iter()
        .map_err(|_| pyo3::exceptions::PyTypeError::new_err("samples must be an iterable of mappings or objects"))?
        .enumerate()
        .map(|(i, s)| extract_sample(i, &s?).map(|o| o.sample))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(TrainingBatch {
        run: u32_of(py, "run", run, 0)?,
        step: u64_of(py, "step", step, 0)?,
        temperature: temperature as f32,
        samples,
    })
}

/// encode_training_batch(run, step, temperature, samples) -> bytes
#[pyfunction]
fn encode_training_batch<'py>(
    py: Python<'py>,
    run: i128,
    step: i128,
    temperature: f64,
    samples: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyBytes>> {
    let b = training_batch(py, run, step, temperature, samples)?;
    let bytes = py.detach(|| b.encode()).map_err(|e| to_py(py, e))?;
    Ok(PyBytes::new(py, &bytes))
}

/// encode_control(kind, run, batch_size) -> bytes; kind "add_run" or "remove_run".
#[pyfunction]
fn encode_control<'py>(py: Python<'py>, kind: &str, run: i128, batch_size: i128) -> PyResult<Bound<'py, PyBytes>> {
    let run = u32_of(py, "run", run, 0)?;
    let c = match kind {
        "add_run" => {
            Control::AddRun { run, config: RunConfig { batch_size: u64_of(py, "batch_size", batch_size, 1)? } }
        }
        "remove_run" => Control::RemoveRun { run },
        other => return Err(invalid(py, format!("kind must be 'add_run' or 'remove_run' (got {other:?})"))),
    };
    Ok(PyBytes::new(py, &c.encode().map_err(|e| to_py(py, e))?))
}

/// batch_file_name(run, step) -> the inbox/spool file name of a batch.
#[pyfunction(name = "batch_file_name")]
fn py_batch_file_name(py: Python<'_>, run: i128, step: i128) -> PyResult<String> {
    Ok(batch_file_name(stowplan::BatchKey { run: u32_of(py, "run", run, 0)?, step: u64_of(py, "step", step, 0)? }))
}

/// fs_send(root, name, data) -> path: writes an encoded message into ROOT/inbox atomically.
#[pyfunction]
fn fs_send(py: Python<'_>, root: PathBuf, name: &str, data: &[u8]) -> PyResult<PathBuf> {
    py.detach(|| send_fs(&root, name, data)).map_err(|e| to_py(py, e))
}

fn duration(py: Python<'_>, name: &str, seconds: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(seconds)
        .map_err(|_| invalid(py, format!("{name} must be a number of seconds ≥ 0 (got {seconds})")))
}

/// fs_receive(root, step, rank, timeout, poll) -> RankBatch
#[pyfunction]
fn fs_receive(py: Python<'_>, root: PathBuf, step: i128, rank: i128, timeout: f64, poll: f64) -> PyResult<PyRankBatch> {
    let (step, rank) = (u64_of(py, "step", step, 0)?, u32_of(py, "rank", rank, 0)?);
    let (timeout, poll) = (duration(py, "timeout", timeout)?, duration(py, "poll", poll)?);
    let b = py.detach(|| receive_fs(&root, step, rank, timeout, poll)).map_err(|e| to_py(py, e))?;
    wrap_rank(py, b)
}

/// decode_rank_batch(data) -> RankBatch; a packer's refusal (ZeroMQ transport) raises
/// InvalidArgumentError with its message.
#[pyfunction]
fn decode_rank_batch(py: Python<'_>, data: &[u8]) -> PyResult<PyRankBatch> {
    if stowplan::wire::REFUSAL.matches(data) {
        let r = Refusal::decode(data).map_err(|e| to_py(py, e))?;
        return Err(invalid(py, format!("the packer refused this rank: {}", r.message)));
    }
    let b = py.detach(|| RankBatch::decode(data)).map_err(|e| to_py(py, e))?;
    wrap_rank(py, b)
}

/// encode_rank_hello(rank, dp, next_step) -> bytes
#[pyfunction]
fn encode_rank_hello<'py>(py: Python<'py>, rank: i128, dp: i128, next_step: i128) -> PyResult<Bound<'py, PyBytes>> {
    let dp = u32_of(py, "dp", dp, 1)?;
    let rank = u32_of(py, "rank", rank, 0)?;
    if rank >= dp {
        return Err(invalid(py, format!("rank must be below dp {dp} (got {rank})")));
    }
    let m = RankMessage::Hello { rank, dp, next_step: u64_of(py, "next_step", next_step, 0)? };
    Ok(PyBytes::new(py, &m.encode().map_err(|e| to_py(py, e))?))
}

/// encode_rank_ack(rank, step) -> bytes
#[pyfunction]
fn encode_rank_ack<'py>(py: Python<'py>, rank: i128, step: i128) -> PyResult<Bound<'py, PyBytes>> {
    let m = RankMessage::Ack { rank: u32_of(py, "rank", rank, 0)?, step: u64_of(py, "step", step, 0)? };
    Ok(PyBytes::new(py, &m.encode().map_err(|e| to_py(py, e))?))
}

/// decode_receipts(data) -> (incarnation, [dict]); each dict has `kind` ("batch",
/// "add_run" or "remove_run") and `run`; a batch's also `step`, `accepted`, `rejected`,
/// `duplicate`; a control message's `error` (None when applied).
#[pyfunction]
fn decode_receipts<'py>(py: Python<'py>, data: &[u8]) -> PyResult<(u64, Bound<'py, PyList>)> {
    let r = Receipts::decode(data).map_err(|e| to_py(py, e))?;
    let out = PyList::empty(py);
    for receipt in r.receipts {
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
            Receipt::Control { control, error } => {
                let (kind, run) = match control {
                    Control::AddRun { run, .. } => ("add_run", run),
                    Control::RemoveRun { run } => ("remove_run", run),
                };
                d.set_item("kind", kind)?;
                d.set_item("run", run)?;
                d.set_item("error", error)?;
            }
        }
        out.append(d)?;
    }
    Ok((r.incarnation, out))
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
    #[pyo3(signature = (seq_len, dp, pad_to_multiple_of, pad_token_id, linear, quadratic, num_runs, threshold,
        step_tokens, wait_timeout, teacher_logprobs, allow_empty_completion, backend, state=None, batches=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        seq_len: i128,
        dp: i128,
        pad_to_multiple_of: i128,
        pad_token_id: i64,
        linear: u64,
        quadratic: u64,
        num_runs: i128,
        threshold: Option<i128>,
        step_tokens: Option<i128>,
        wait_timeout: f64,
        teacher_logprobs: bool,
        allow_empty_completion: bool,
        backend: &str,
        state: Option<&[u8]>,
        batches: Option<Vec<Vec<u8>>>,
    ) -> PyResult<Self> {
        let o = PackerOptions {
            pad_to_multiple_of: u64_of(py, "pad_to_multiple_of", pad_to_multiple_of, 1)?,
            pad_token_id,
            cost: Cost { linear, quadratic },
            num_runs: u32_of(py, "num_runs", num_runs, 1)?,
            threshold: threshold.map(|t| u64_of(py, "threshold", t, 1)).transpose()?,
            step_tokens: step_tokens.map(|t| u64_of(py, "step_tokens", t, 1)).transpose()?,
            wait_timeout: duration(py, "wait_timeout", wait_timeout)?,
            teacher_logprobs,
            allow_empty_completion,
            ..PackerOptions::new(u64_of(py, "seq_len", seq_len, 1)?, u32_of(py, "dp", dp, 1)?)
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

    fn add_run(&self, py: Python<'_>, run: i128, batch_size: i128) -> PyResult<()> {
        let (run, batch_size) = (u32_of(py, "run", run, 0)?, u64_of(py, "batch_size", batch_size, 1)?);
        self.lock(py)?.add_run(run, RunConfig { batch_size }).map_err(|e| to_py(py, e))
    }

    fn remove_run(&self, py: Python<'_>, run: i128) -> PyResult<usize> {
        let run = u32_of(py, "run", run, 0)?;
        self.lock(py)?.remove_run(run).map(|(dropped, _)| dropped).map_err(|e| to_py(py, e))
    }

    fn clear_ready(&self, py: Python<'_>, run: i128) -> PyResult<()> {
        let run = u32_of(py, "run", run, 0)?;
        self.lock(py)?.clear_ready(run).map_err(|e| to_py(py, e))
    }

    /// ingest(run, step, temperature, samples) -> (accepted, rejected [(index, reason, message)], duplicate)
    #[allow(clippy::type_complexity)]
    fn ingest(
        &self,
        py: Python<'_>,
        run: i128,
        step: i128,
        temperature: f64,
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

    fn delivered(&self, py: Python<'_>, step: i128) -> PyResult<Vec<(u32, u64)>> {
        let step = u64_of(py, "step", step, 0)?;
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
    m.add_function(wrap_pyfunction!(fs_receive, m)?)?;
    m.add_function(wrap_pyfunction!(decode_rank_batch, m)?)?;
    m.add_function(wrap_pyfunction!(encode_rank_hello, m)?)?;
    m.add_function(wrap_pyfunction!(encode_rank_ack, m)?)?;
    m.add_function(wrap_pyfunction!(decode_receipts, m)?)?;
    m.add_class::<PyRankBatch>()?;
    m.add_class::<PyPacker>()?;
    Ok(())
}
