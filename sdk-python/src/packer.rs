//! The packer runtime in process for Python (`Packer`): training batches in, every rank's
//! batch of a step out.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use stowplan::{
    Packer, PackerOptions, TrainingBatch,
    packer::{PackerState, RunConfig, RunProgress},
};

use crate::convert::{opt_i64, opt_number, pythonized, renamed, with_bytes};
use crate::protocol::{duration, rank_list, training_batch};
use crate::{
    BackendArg, cost_arg, invalid, kernel, number, opt_parse, opt_u32, opt_u64, str_options, to_py, u32_arg, u64_arg,
};

/// A run's entry as :meth:`Packer.progress` gives it: the run, its configuration and its
/// progress (`RunProgress`'s fields).
#[derive(serde::Serialize)]
struct RunEntry<'a> {
    run: u32,
    batch_size: u64,
    #[serde(flatten)]
    progress: &'a RunProgress,
}

fn progress_dict<'py>(
    py: Python<'py>,
    run: u32,
    batch_size: u64,
    progress: &RunProgress,
) -> PyResult<Bound<'py, PyAny>> {
    pythonized(py, &RunEntry { run, batch_size, progress })
}

/// The packer runtime in process: per-run buffers, a token threshold with a wait timeout,
/// round-robin selection across runs, per-run progress, packing, balancing and
/// materialization. ``stowplan serve`` runs the same code as a process.
///
/// Options (keyword-only) as in ``stowplan serve``: ``capacity`` (the tokens of a micro-batch
/// after padding, the token cap; longer samples are rejected; ``seq_len=``, its former name,
/// is deprecated), ``dp`` (ranks), ``pad_to_multiple_of``, ``pad_token_id``, ``cost``
/// (``"tokens"``, ``"attention"`` or ``(linear, quadratic)``), ``num_runs`` (length of
/// ``lora_num_tokens``), ``threshold`` (default ``capacity × dp``), ``step_tokens`` (default:
/// all pending), ``wait_timeout`` (seconds), ``teacher_logprobs``,
/// ``allow_empty_completion``, ``loss_agg_mode`` (each micro-batch's ``loss_weights``:
/// ``"token-mean"`` by default, as :func:`stowplan.materialize`), ``loss_scale_factor`` and
/// ``loss_normalization``: the samples the weights count over, ``"step"`` (a run's samples in
/// the packer step, the default) or ``"update"`` (a run's optimizer update of ``batch_size``
/// samples, however many packer steps it spans, so that Σ weight × loss over all of them is
/// the update's unpacked loss; a run's samples are then packed once the rest of their update
/// has arrived), and ``limits``: further caps per micro-batch by name (``{"image_tokens":
/// 8192, "images": 32}``, ``stowplan serve --limit``), which every micro-batch keeps, a
/// sample's sizes being its ``resources``; a sample over a cap is rejected as ``over_limit``,
/// one naming a resource without a limit as ``unknown_resource``; ``max_segments``: at most
/// this many samples per micro-batch (``stowplan serve --max-segments``; 0 or ``None``: no
/// limit; one more cap beside ``limits``, of which there may then be 6; no limit may be named
/// ``"segments"``); ``distribution``: ``"balanced"`` (the default) or ``"round-robin"``,
/// prime-rl's classic trainer (``stowplan serve --distribution``; see
/// :func:`stowplan.materialize`; no ``limits``). ``backend``: the kernel's, as every function's (``"wasm"``, the default,
/// or ``"native"``). An omitted option (or ``None``) is the host's default
/// (``stowplan::PackerOptions::new``, the one ``stowplan serve`` uses); an unknown one is a
/// ``TypeError`` naming it. A checkpoint is restored with :meth:`restore`.
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "Packer")]
pub struct PyPacker {
    inner: Arc<Mutex<Packer>>,
    kernel: stowplan::Kernel,
}

/// What :meth:`Packer.ingest` did: samples buffered (``accepted``), samples rejected as
/// ``(index, reason, message)`` (``rejected``), and whether the batch was a duplicate
/// (``duplicate``). Frozen, compared by value, picklable.
#[derive(Clone, Debug, PartialEq)]
#[pyclass(frozen, eq, get_all, module = "stowplan._stowplan", name = "IngestReport")]
pub struct PyIngestReport {
    accepted: u32,
    rejected: Vec<(u32, String, String)>,
    duplicate: bool,
}

#[pymethods]
impl PyIngestReport {
    #[new]
    #[pyo3(signature = (accepted, rejected=Vec::new(), duplicate=false))]
    fn new(accepted: u32, rejected: Vec<(u32, String, String)>, duplicate: bool) -> Self {
        Self { accepted, rejected, duplicate }
    }

    /// Pickles as its fields.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let r = slf.get();
        let args = (r.accepted, r.rejected.clone(), r.duplicate).into_pyobject(slf.py())?;
        PyTuple::new(slf.py(), [slf.get_type().into_any(), args.into_any()])
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let rejected = self.rejected.clone().into_pyobject(py)?.repr()?;
        let duplicate = if self.duplicate { "True" } else { "False" };
        Ok(format!("IngestReport(accepted={}, rejected={rejected}, duplicate={duplicate})", self.accepted))
    }
}

impl From<stowplan::packer::IngestReport> for PyIngestReport {
    fn from(r: stowplan::packer::IngestReport) -> Self {
        let rejected = r.rejected.into_iter().map(|(i, reason, m)| (i, reason.name().to_string(), m)).collect();
        Self { accepted: r.accepted, rejected, duplicate: r.duplicate }
    }
}

/// A training batch argument: a `TrainingBatch` (anything with `run`, `step`, `temperature`
/// and `samples`) or its encoded bytes (any contiguous buffer, read in place); errors name
/// `name`.
fn batch_arg(py: Python<'_>, batch: &Bound<'_, PyAny>, name: &str) -> PyResult<TrainingBatch> {
    if batch.hasattr("samples")? {
        let get = |attr: &str| batch.getattr(attr);
        training_batch(py, &get("run")?, &get("step")?, &get("temperature")?, &get("samples")?)
    } else {
        with_bytes(batch, name, |data| py.detach(|| TrainingBatch::decode(data)).map_err(|e| to_py(py, e)))
    }
}

impl PyPacker {
    /// The kernel and options the constructor makes of `options` (keywords), checked as it
    /// checks them.
    fn parsed(py: Python<'_>, options: Option<&Bound<'_, PyDict>>) -> PyResult<(stowplan::Kernel, PackerOptions)> {
        let fresh = py.get_type::<Self>().call((), options)?;
        let fresh = fresh.cast::<Self>()?.get();
        let options = fresh.lock(py)?.options().clone();
        Ok((fresh.kernel, options))
    }

    fn lock(&self, py: Python<'_>) -> PyResult<std::sync::MutexGuard<'_, Packer>> {
        // Never waited for with the GIL held; no exception is built while it is held (each
        // call's result is taken first, then converted).
        crate::lock_or_poisoned(py, &self.inner).map_err(|poisoned| {
            drop(poisoned); // its guard: released before the exception is built
            to_py(py, stowplan::Error::Runtime("the packer lock is poisoned".into()))
        })
    }
}

#[pymethods]
impl PyPacker {
    #[new]
    #[pyo3(signature = (*, capacity=None, dp, pad_to_multiple_of=None, pad_token_id=None, cost=None, num_runs=None,
        threshold=None, step_tokens=None, wait_timeout=None, teacher_logprobs=None, allow_empty_completion=None,
        loss_agg_mode=None, loss_scale_factor=None, loss_normalization=None, limits=None, max_segments=None,
        distribution=None, backend=None, seq_len=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity: Option<&Bound<'_, PyAny>>,
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
        limits: Option<&Bound<'_, PyAny>>,
        max_segments: Option<&Bound<'_, PyAny>>,
        distribution: Option<&Bound<'_, PyAny>>,
        backend: Option<BackendArg>,
        seq_len: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        str_options!(loss_agg_mode, loss_normalization, distribution);
        let capacity = renamed(py, "Packer", ("capacity", capacity), ("seq_len", seq_len))?.ok_or_else(|| {
            invalid(py, "Packer: capacity= is required (the tokens of a micro-batch after padding)".into())
        })?;
        // `None` (or an omitted option) is the host's default: `PackerOptions::new`.
        let d = PackerOptions::new(u64_arg(capacity, "capacity", 1)?, u32_arg(dp, "dp", 1)?);
        let o = PackerOptions {
            pad_to_multiple_of: opt_u64(pad_to_multiple_of, "pad_to_multiple_of", 1)?.unwrap_or(d.pad_to_multiple_of),
            pad_token_id: opt_i64(pad_token_id, "pad_token_id")?.unwrap_or(d.pad_token_id),
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
            loss_scale_factor: opt_number(loss_scale_factor, "loss_scale_factor", "a number of tokens")?
                .or(d.loss_scale_factor),
            loss_normalization: opt_parse(py, loss_normalization)?.unwrap_or(d.loss_normalization),
            limits: {
                let (caps, names) = crate::multi::caps_arg(py, limits)?;
                let max_segments = opt_u64(max_segments, "max_segments", 0)?.unwrap_or(0);
                stowplan::materialize::SampleLimits { caps, names, max_segments }
            },
            distribution: opt_parse(py, distribution)?.unwrap_or(d.distribution),
            ..d
        };
        let kernel = kernel(py, backend)?;
        let packer = Packer::new(kernel, o).map_err(|e| to_py(py, e))?;
        Ok(Self { inner: Arc::new(Mutex::new(packer)), kernel })
    }

    /// A packer from :meth:`state` and the batches it names (``TrainingBatch`` es or their
    /// encoded bytes), with the same options (keywords, as the constructor's). A batch the
    /// state needs and ``batches`` lacks is a ``CacheMismatchError`` naming it.
    #[staticmethod]
    #[pyo3(signature = (state, batches, /, **options))]
    fn restore(
        py: Python<'_>,
        state: &Bound<'_, PyAny>,
        batches: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let (kernel, options) = Self::parsed(py, options)?;
        let state = with_bytes(state, "state", |b| PackerState::decode(b).map_err(|e| to_py(py, e)))?;
        let mut by_key = std::collections::HashMap::new();
        for (i, b) in batches.try_iter()?.enumerate() {
            let b = batch_arg(py, &b?, &format!("batches[{i}]"))?;
            by_key.insert(b.key(), Arc::new(b));
        }
        let packer = py
            .detach(|| {
                Packer::restore(kernel, options, state, |key| {
                    by_key.get(&key).cloned().ok_or_else(|| {
                        stowplan::Error::CacheMismatch(format!(
                            "the state needs batch run {} step {}, which batches lacks",
                            key.run, key.step
                        ))
                    })
                })
            })
            .map_err(|e| to_py(py, e))?;
        Ok(Self { inner: Arc::new(Mutex::new(packer)), kernel })
    }

    /// Adds run ``run`` (below ``num_runs``) whose step advances every ``batch_size`` samples.
    #[pyo3(signature = (run, *, batch_size))]
    fn add_run(&self, py: Python<'_>, run: &Bound<'_, PyAny>, batch_size: &Bound<'_, PyAny>) -> PyResult<()> {
        let (run, batch_size) = (u32_arg(run, "run", 0)?, u64_arg(batch_size, "batch_size", 1)?);
        let added = self.lock(py)?.add_run(run, RunConfig { batch_size });
        added.map_err(|e| to_py(py, e))
    }

    /// Removes run ``run``; returns how many of its pending samples were dropped.
    fn remove_run(&self, py: Python<'_>, run: &Bound<'_, PyAny>) -> PyResult<usize> {
        let run = u32_arg(run, "run", 0)?;
        let removed = self.lock(py)?.remove_run(run);
        removed.map(|(dropped, _)| dropped).map_err(|e| to_py(py, e))
    }

    /// Clears the run's ``ready_to_update`` after the trainer updated it.
    fn clear_ready(&self, py: Python<'_>, run: &Bound<'_, PyAny>) -> PyResult<()> {
        let run = u32_arg(run, "run", 0)?;
        let cleared = self.lock(py)?.clear_ready(run);
        cleared.map_err(|e| to_py(py, e))
    }

    /// Buffers the batch's valid samples; invalid ones are rejected with a reason. ``batch``:
    /// a :class:`TrainingBatch`, or its encoded bytes (``bytes``, ``bytearray``, a contiguous
    /// ``memoryview`` or numpy ``uint8`` array: read in place).
    fn ingest(&self, py: Python<'_>, batch: &Bound<'_, PyAny>) -> PyResult<PyIngestReport> {
        let b = Arc::new(batch_arg(py, batch, "batch")?);
        Ok(self.lock(py)?.ingest(b).into())
    }

    /// Whether the threshold is reached or the oldest pending sample waited ``wait_timeout``.
    fn should_pack(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.lock(py)?.should_pack(std::time::Instant::now()))
    }

    /// Packs the next step if :meth:`should_pack` (or anything is pending and ``force``): one
    /// :class:`RankBatch` per rank and the step's figures (``None`` when nothing is packed).
    /// Call :meth:`delivered` once the ranks have it.
    #[pyo3(signature = (*, force=false))]
    fn pack<'py>(&self, py: Python<'py>, force: bool) -> PyResult<Option<(Bound<'py, PyList>, Bound<'py, PyAny>)>> {
        let inner = Arc::clone(&self.inner);
        let step = py
            .detach(move || match inner.lock() {
                Ok(mut p) => p.pack(force),
                Err(_) => Err(stowplan::Error::Runtime("the packer lock is poisoned".into())),
            })
            .map_err(|e| to_py(py, e))?;
        let Some(step) = step else { return Ok(None) };
        let ranks = rank_list(py, step.ranks)?;
        Ok(Some((ranks, pythonized(py, &step.metrics)?)))
    }

    /// Marks the step in flight delivered; returns the ``(run, step)`` batches now done.
    fn delivered(&self, py: Python<'_>, step: &Bound<'_, PyAny>) -> PyResult<Vec<(u32, u64)>> {
        let step = u64_arg(step, "step", 0)?;
        let keys = self.lock(py)?.delivered(step);
        let keys = keys.map_err(|e| to_py(py, e))?;
        Ok(keys.into_iter().map(|k| (k.run, k.step)).collect())
    }

    /// Samples and tokens pending.
    fn pending(&self, py: Python<'_>) -> PyResult<(usize, u64)> {
        Ok(self.lock(py)?.pending())
    }

    /// The next packer step (the one in flight, if any).
    #[getter]
    fn next_step(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.lock(py)?.next_step())
    }

    /// Every run's configuration and progress (dicts as :meth:`progress` gives).
    fn runs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        // Copied out first: no Python object is made while the packer is locked.
        let runs: Vec<(u32, u64, RunProgress)> =
            self.lock(py)?.runs().map(|(run, c, progress)| (run, c.batch_size, progress.clone())).collect();
        let out = PyList::empty(py);
        for (run, batch_size, progress) in &runs {
            out.append(progress_dict(py, *run, *batch_size, progress)?)?;
        }
        Ok(out)
    }

    /// Run ``run``'s configuration and progress: ``run``, ``batch_size``, ``step``,
    /// ``samples_this_step``, ``ready_to_update``, ``total_samples``, ``total_tokens``,
    /// ``received_samples``, ``rejected`` (by reason), ``duplicate_batches``.
    fn progress<'py>(&self, py: Python<'py>, run: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let run = u32_arg(run, "run", 0)?;
        let found = self.lock(py)?.runs().find(|(r, _, _)| *r == run).map(|(_, c, p)| (c.batch_size, p.clone()));
        match found {
            Some((batch_size, progress)) => progress_dict(py, run, batch_size, &progress),
            None => Err(invalid(py, format!("run {run} does not exist"))),
        }
    }

    /// The checkpoint (versioned bytes): progress, pending order, round-robin position and the
    /// step in flight, without the batches' contents (see :meth:`needed_batches`).
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let bytes = self.lock(py)?.state().encode();
        let bytes = bytes.map_err(|e| to_py(py, e))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// The ``(run, step)`` batches a restore of :meth:`state` needs.
    fn needed_batches(&self, py: Python<'_>) -> PyResult<Vec<(u32, u64)>> {
        Ok(self.lock(py)?.state().batches().into_iter().map(|k| (k.run, k.step)).collect())
    }

    /// After :meth:`restore`: the step that was in flight, byte for byte as before.
    fn rebuild_inflight<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyList>>> {
        let step = self.lock(py)?.rebuild_inflight();
        let step = step.map_err(|e| to_py(py, e))?;
        step.map(|s| rank_list(py, s.ranks)).transpose()
    }
}

/// CheckpointDir(path, *, owner, wait=0): a packer's checkpoint directory
/// (`stowplan::serve::CheckpointDir`: the state, the acknowledged ranks of its step in flight
/// and the spool of batches), owned while this object lives; a second owner (another process
/// or object) is refused with a ``StowplanIOError`` naming the first, once it held the
/// directory for ``wait`` seconds. ``owner`` names this one in the lock file.
/// :class:`stowplan.ray.PackerActor` keeps its checkpoint with it.
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "CheckpointDir")]
pub struct PyCheckpointDir {
    /// `None` once closed.
    inner: Mutex<Option<stowplan::serve::CheckpointDir>>,
}

impl PyCheckpointDir {
    /// `f` on the open directory, without the GIL; a closed one is an `io` error.
    fn with<R: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&stowplan::serve::CheckpointDir) -> Result<R, stowplan::Error> + Send,
    ) -> PyResult<R> {
        let out = crate::with_lock(py, &self.inner, |d| match d {
            Some(d) => f(d),
            None => Err(stowplan::Error::Io("this CheckpointDir was closed".into())),
        });
        out.map_err(|e| to_py(py, e))
    }
}

#[pymethods]
impl PyCheckpointDir {
    #[new]
    #[pyo3(signature = (path, *, owner, wait=None))]
    fn new(py: Python<'_>, path: PathBuf, owner: String, wait: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let wait = wait.map(|w| crate::protocol::seconds(w, "lock_wait", false)).transpose()?.unwrap_or_default();
        let inner = py.detach(|| stowplan::serve::CheckpointDir::open(path, &owner, wait)).map_err(|e| to_py(py, e))?;
        Ok(Self { inner: Mutex::new(Some(inner)) })
    }

    /// The directory.
    #[getter]
    fn path(&self, py: Python<'_>) -> PyResult<PathBuf> {
        self.with(py, |d| Ok(d.path().to_path_buf()))
    }

    /// Where batch ``(run, step)`` is spooled.
    fn batch_path(&self, py: Python<'_>, run: &Bound<'_, PyAny>, step: &Bound<'_, PyAny>) -> PyResult<PathBuf> {
        let key = stowplan::packer::BatchKey { run: u32_arg(run, "run", 0)?, step: u64_arg(step, "step", 0)? };
        self.with(py, |d| Ok(d.batch_path(key)))
    }

    /// The packer the directory holds, restored with ``options`` (those of :class:`Packer`,
    /// which must be the saved ones), as ``(packer, acked, reingested, set_aside)``: the
    /// ranks that acknowledged its step in flight, the ``(run, step)`` batches spooled after
    /// the checkpoint and ingested again, and the spool files that did not decode (moved to
    /// ``rejected/``); ``None`` for a fresh directory. Everything is checked before anything
    /// changes: a missing state beside spooled batches, a batch the state names that is
    /// missing or damaged, a damaged state or a bad field is a ``CacheMismatchError`` naming
    /// the file and what is wrong.
    #[pyo3(signature = (**options))]
    #[allow(clippy::type_complexity)]
    fn load(
        &self,
        py: Python<'_>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Option<(PyPacker, Vec<u32>, Vec<(u32, u64)>, Vec<PathBuf>)>> {
        let (kernel, options) = PyPacker::parsed(py, options)?;
        let loaded = self.with(py, |d| d.load(kernel, options))?;
        Ok(loaded.map(|r| {
            let packer = PyPacker { inner: Arc::new(Mutex::new(r.packer)), kernel };
            let reingested = r.reingested.into_iter().map(|k| (k.run, k.step)).collect();
            (packer, r.acked, reingested, r.set_aside)
        }))
    }

    /// Writes the checkpoint of ``packer`` with the ranks ``acked`` that acknowledged its step
    /// in flight (atomically), then deletes the spool files of batches it no longer needs.
    /// ``InvalidArgumentError`` for ranks out of ``0..dp``, repeated, unsorted, all of them,
    /// or without a step in flight.
    fn save(&self, py: Python<'_>, packer: &PyPacker, acked: Vec<u32>) -> PyResult<()> {
        let inner = Arc::clone(&packer.inner);
        self.with(py, |d| match inner.lock() {
            Ok(p) => d.save(&p, &acked),
            Err(_) => Err(stowplan::Error::Runtime("the packer lock is poisoned".into())),
        })
    }

    /// Lets go of the directory (another owner may take it from then on); every later call
    /// is refused. Closing twice is harmless.
    fn close(&self, py: Python<'_>) {
        crate::with_lock(py, &self.inner, |d| drop(d.take()));
    }

    /// Whether :meth:`close` was called.
    #[getter]
    fn closed(&self, py: Python<'_>) -> bool {
        crate::with_lock(py, &self.inner, |d| d.is_none())
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyCheckpointDir>()?;
    m.add_class::<PyPacker>()?;
    m.add_class::<PyIngestReport>()?;
    Ok(())
}
