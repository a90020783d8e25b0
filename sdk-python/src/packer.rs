//! The packer runtime in process for Python (`Packer`): training batches in, every rank's
//! batch of a step out.

use std::sync::{Arc, Mutex};

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stowplan::{Packer, PackerOptions, PackerState, RunConfig, RunProgress, TrainingBatch};

use crate::convert::{opt_i64, opt_number, with_bytes};
use crate::protocol::{duration, rank_list, training_batch};
use crate::{cost_arg, kernel, number, opt_parse, opt_u32, opt_u64, str_options, to_py, u32_arg, u64_arg};

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
        loss_agg_mode=None, loss_scale_factor=None, loss_normalization=None, limits=None, max_segments=None,
        backend=None, state=None, batches=None))]
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
        limits: Option<&Bound<'_, PyAny>>,
        max_segments: Option<&Bound<'_, PyAny>>,
        backend: Option<&Bound<'_, PyAny>>,
        state: Option<&[u8]>,
        batches: Option<Vec<Vec<u8>>>,
    ) -> PyResult<Self> {
        str_options!(loss_agg_mode, loss_normalization, backend);
        // `None` (or an omitted option) is the host's default: `PackerOptions::new`.
        let d = PackerOptions::new(u64_arg(seq_len, "seq_len", 1)?, u32_arg(dp, "dp", 1)?);
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
                stowplan::SampleLimits { caps, names, max_segments }
            },
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

    /// ingest_bytes(data, name): ingest an encoded training batch (``bytes`` or any contiguous
    /// buffer, read in place); errors name the argument ``name``.
    #[allow(clippy::type_complexity)]
    fn ingest_bytes(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        name: &str,
    ) -> PyResult<(u32, Vec<(u32, &'static str, String)>, bool)> {
        let b = Arc::new(with_bytes(data, name, |data| {
            py.detach(|| TrainingBatch::decode(data)).map_err(|e| to_py(py, e))
        })?);
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
    m.add_class::<PyPacker>()?;
    Ok(())
}
