//! Bindings of the trainer layout: pad factors, CP layouts, materialized micro-batches as
//! numpy arrays (owned by numpy without copying the Rust vectors), CP views, unpacking and
//! the byte encoding.

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use stowplan::{AlignOptions, Cost, CpRuns, Factor, MaterializeOptions, MicroBatch, Padding, Sample};

use crate::{Lengths, invalid, kernel, to_py};

fn factor(py: Python<'_>, align: Option<&Bound<'_, PyAny>>) -> PyResult<Factor> {
    let Some(a) = align else { return Ok(Factor::CpTp) };
    if let Ok(s) = a.extract::<String>() {
        return match s.as_str() {
            "cp_tp" => Ok(Factor::CpTp),
            "roll" => Ok(Factor::Roll),
            other => {
                Err(invalid(py, format!("align must be None, 'cp_tp', 'roll' or a positive integer (got {other:?})")))
            }
        };
    }
    match a.extract::<i128>() {
        Ok(m) if (1..=i128::from(u64::MAX)).contains(&m) => Ok(Factor::Multiple(m as u64)),
        Ok(m) => Err(invalid(py, format!("align must be an integer in 1..=2**64-1 (got {m})"))),
        Err(_) => Err(PyTypeError::new_err("align must be None, 'cp_tp', 'roll' or a positive integer")),
    }
}

fn u32_arg(py: Python<'_>, name: &str, v: i64) -> PyResult<u32> {
    u32::try_from(v)
        .ok()
        .filter(|&v| v >= 1)
        .ok_or_else(|| invalid(py, format!("{name} must be in 1..=2**32-1 (got {v})")))
}

fn align_options(
    py: Python<'_>,
    cp: i64,
    tp: i64,
    align: Option<&Bound<'_, PyAny>>,
    power_of_two: bool,
) -> PyResult<AlignOptions> {
    Ok(AlignOptions {
        cp: u32_arg(py, "cp", cp)?,
        tp: u32_arg(py, "tp", tp)?,
        factor: factor(py, align)?,
        power_of_two,
    })
}

/// pad_factor(cp, tp, align, power_of_two, backend) -> int
#[pyfunction]
#[pyo3(signature = (cp, tp, align, power_of_two, backend))]
pub fn pad_factor(
    py: Python<'_>,
    cp: i64,
    tp: i64,
    align: Option<&Bound<'_, PyAny>>,
    power_of_two: bool,
    backend: &str,
) -> PyResult<u64> {
    let o = align_options(py, cp, tp, align, power_of_two)?;
    let k = kernel(py, backend)?;
    py.detach(|| k.pad_factor(&o)).map_err(|e| to_py(py, e))
}

/// The pieces of a CP layout handed to Python.
type LayoutTuple<'py> = (
    u64,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
    u64,
    u64,
    Vec<Bound<'py, PyArray1<u64>>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
);

/// cp_layout(lengths, cp, tp, align, power_of_two, backend)
/// -> (factor, cu_seqlens, cu_seqlens_padded, max_seqlen, max_seqlen_padded,
///     [gather map per rank], local_bounds, rank_real_tokens)
#[pyfunction]
#[pyo3(signature = (lengths, cp, tp, align, power_of_two, backend))]
pub fn cp_layout<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    cp: i64,
    tp: i64,
    align: Option<&Bound<'py, PyAny>>,
    power_of_two: bool,
    backend: &str,
) -> PyResult<LayoutTuple<'py>> {
    let o = align_options(py, cp, tp, align, power_of_two)?;
    let lengths = Lengths::extract(py, lengths, "lengths")?;
    let k = kernel(py, backend)?;
    let l = lengths.slice();
    let (layout, maps) = py
        .detach(|| -> Result<_, stowplan::Error> {
            let layout = k.cp_layout(l, &o)?;
            let runs = CpRuns::of(&layout)?;
            let maps = (0..o.cp as usize).map(|r| runs.positions(r)).collect::<Result<Vec<_>, _>>()?;
            Ok((layout, maps))
        })
        .map_err(|e| to_py(py, e))?;
    Ok((
        layout.factor,
        layout.cu_seqlens.into_pyarray(py),
        layout.cu_seqlens_padded.into_pyarray(py),
        layout.max_seqlen,
        layout.max_seqlen_padded,
        maps.into_iter().map(|m| m.into_pyarray(py)).collect(),
        layout.local_bounds.into_pyarray(py),
        layout.rank_real_tokens.into_pyarray(py),
    ))
}

/// scatter(positions, rows, total) -> array: `out[positions[r]] = rows[r]` for every rank,
/// for float32/float64/int64/int32/bool rows (the inverse of the CP split).
#[pyfunction]
pub fn scatter<'py>(
    py: Python<'py>,
    positions: Vec<PyReadonlyArray1<'py, u64>>,
    rows: Vec<Bound<'py, PyAny>>,
    total: usize,
) -> PyResult<Bound<'py, PyAny>> {
    if positions.len() != rows.len() {
        return Err(invalid(
            py,
            format!("rows has {} entries; give one per CP rank ({})", rows.len(), positions.len()),
        ));
    }
    let pos: Vec<&[u64]> = positions
        .iter()
        .map(|p| p.as_slice().map_err(|e| invalid(py, format!("positions: {e}"))))
        .collect::<PyResult<_>>()?;
    macro_rules! typed {
        ($t:ty) => {
            if let Ok(arrs) =
                rows.iter().map(|r| r.extract::<PyReadonlyArray1<'py, $t>>()).collect::<PyResult<Vec<_>>>()
            {
                let mut out = vec![<$t>::default(); total];
                for (r, (p, a)) in pos.iter().zip(&arrs).enumerate() {
                    let a = a.as_slice().map_err(|e| invalid(py, format!("rows[{r}]: {e}")))?;
                    if a.len() != p.len() {
                        return Err(invalid(
                            py,
                            format!("rows[{r}] has {} elements; CP rank {r} holds {}", a.len(), p.len()),
                        ));
                    }
                    for (&i, &v) in p.iter().zip(a) {
                        match out.get_mut(i as usize) {
                            Some(o) => *o = v,
                            None => return Err(invalid(py, format!("position {i} is outside the row of {total}"))),
                        }
                    }
                }
                return Ok(out.into_pyarray(py).into_any());
            }
        };
    }
    typed!(f32);
    typed!(f64);
    typed!(i64);
    typed!(i32);
    typed!(bool);
    Err(PyTypeError::new_err(
        "rows must be one-dimensional contiguous numpy arrays of float32, float64, int64, int32 or bool",
    ))
}

/// One materialized micro-batch; every per-token field is a numpy array of the row's length.
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "MicroBatch")]
pub struct PyMicroBatch {
    #[pyo3(get)]
    samples: Py<PyArray1<u32>>,
    #[pyo3(get)]
    input_ids: Py<PyArray1<i64>>,
    #[pyo3(get)]
    position_ids: Py<PyArray1<i64>>,
    #[pyo3(get)]
    loss_mask: Py<PyArray1<bool>>,
    #[pyo3(get)]
    advantages: Py<PyArray1<f32>>,
    #[pyo3(get)]
    inference_logprobs: Py<PyArray1<f32>>,
    #[pyo3(get)]
    temperatures: Py<PyArray1<f32>>,
    #[pyo3(get)]
    teacher_logprobs: Option<Py<PyArray1<f32>>>,
    #[pyo3(get)]
    cu_seqlens: Py<PyArray1<i32>>,
    #[pyo3(get)]
    cu_seqlens_padded: Py<PyArray1<i32>>,
    #[pyo3(get)]
    max_seqlen: i32,
    #[pyo3(get)]
    lora_num_tokens: Py<PyArray1<i32>>,
    #[pyo3(get)]
    real_tokens: u64,
    #[pyo3(get)]
    padding_tokens: u64,
    #[pyo3(get)]
    dummy: bool,
    cp_runs: Option<CpRuns>,
}

pub(crate) fn wrap(py: Python<'_>, m: MicroBatch) -> PyMicroBatch {
    PyMicroBatch {
        samples: m.samples.into_pyarray(py).unbind(),
        input_ids: m.input_ids.into_pyarray(py).unbind(),
        position_ids: m.position_ids.into_pyarray(py).unbind(),
        loss_mask: m.loss_mask.into_pyarray(py).unbind(),
        advantages: m.advantages.into_pyarray(py).unbind(),
        inference_logprobs: m.inference_logprobs.into_pyarray(py).unbind(),
        temperatures: m.temperatures.into_pyarray(py).unbind(),
        teacher_logprobs: m.teacher_logprobs.map(|t| t.into_pyarray(py).unbind()),
        cu_seqlens: m.cu_seqlens.into_pyarray(py).unbind(),
        cu_seqlens_padded: m.cu_seqlens_padded.into_pyarray(py).unbind(),
        max_seqlen: m.max_seqlen,
        lora_num_tokens: m.lora_num_tokens.into_pyarray(py).unbind(),
        real_tokens: m.real_tokens,
        padding_tokens: m.padding_tokens,
        dummy: m.dummy,
        cp_runs: m.cp_runs,
    }
}

fn vec_of<T: numpy::Element + Copy>(py: Python<'_>, a: &Py<PyArray1<T>>) -> Vec<T> {
    a.bind(py).to_vec().unwrap_or_else(|_| a.bind(py).readonly().as_array().iter().copied().collect())
}

impl PyMicroBatch {
    fn to_rust(&self, py: Python<'_>) -> MicroBatch {
        MicroBatch {
            samples: vec_of(py, &self.samples),
            input_ids: vec_of(py, &self.input_ids),
            position_ids: vec_of(py, &self.position_ids),
            loss_mask: vec_of(py, &self.loss_mask),
            advantages: vec_of(py, &self.advantages),
            inference_logprobs: vec_of(py, &self.inference_logprobs),
            temperatures: vec_of(py, &self.temperatures),
            teacher_logprobs: self.teacher_logprobs.as_ref().map(|t| vec_of(py, t)),
            cu_seqlens: vec_of(py, &self.cu_seqlens),
            cu_seqlens_padded: vec_of(py, &self.cu_seqlens_padded),
            max_seqlen: self.max_seqlen,
            lora_num_tokens: vec_of(py, &self.lora_num_tokens),
            real_tokens: self.real_tokens,
            padding_tokens: self.padding_tokens,
            dummy: self.dummy,
            cp_runs: self.cp_runs.clone(),
        }
    }
}

#[pymethods]
impl PyMicroBatch {
    fn __len__(&self, py: Python<'_>) -> usize {
        self.input_ids.bind(py).len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "MicroBatch(tokens={}, samples={}, real_tokens={}, padding_tokens={}, dummy={}, cp={})",
            self.input_ids.bind(py).len(),
            self.samples.bind(py).len(),
            self.real_tokens,
            self.padding_tokens,
            if self.dummy { "True" } else { "False" },
            self.cp_runs.as_ref().map_or(1, |r| r.cp)
        )
    }

    /// Length of every sequence in the row, padding included (prime-rl's `sequence_lengths`).
    #[getter]
    fn sequence_lengths<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<i32>> {
        let cu = vec_of(py, &self.cu_seqlens_padded);
        cu.windows(2).map(|w| w[1] - w[0]).collect::<Vec<_>>().into_pyarray(py)
    }

    /// The CP size of the row's split (1 without a split).
    #[getter]
    fn cp(&self) -> u32 {
        self.cp_runs.as_ref().map_or(1, |r| r.cp)
    }

    /// CP rank `rank`'s share: a dict of numpy arrays (`positions`, `input_ids`,
    /// `position_ids`, `loss_mask`, `advantages`, `inference_logprobs`, `temperatures`,
    /// `teacher_logprobs` or None, `local_bounds`).
    fn cp_view<'py>(&self, py: Python<'py>, rank: i64) -> PyResult<Bound<'py, PyDict>> {
        let Some(runs) = &self.cp_runs else {
            return Err(invalid(
                py,
                "this micro-batch has no CP split: materialize with cp > 1 and padding='sequence'".into(),
            ));
        };
        let r = usize::try_from(rank)
            .ok()
            .filter(|&r| r < runs.cp as usize)
            .ok_or_else(|| invalid(py, format!("rank must be in 0..{} (cp = {}), got {rank}", runs.cp, runs.cp)))?;
        let d = PyDict::new(py);
        let e = |e| to_py(py, e);
        d.set_item("positions", runs.positions(r).map_err(e)?.into_pyarray(py))?;
        macro_rules! field {
            ($name:literal, $arr:expr) => {
                d.set_item($name, runs.gather(r, $arr.bind(py).readonly().as_slice()?).map_err(e)?.into_pyarray(py))?;
            };
        }
        field!("input_ids", self.input_ids);
        field!("position_ids", self.position_ids);
        field!("loss_mask", self.loss_mask);
        field!("advantages", self.advantages);
        field!("inference_logprobs", self.inference_logprobs);
        field!("temperatures", self.temperatures);
        match &self.teacher_logprobs {
            Some(t) => {
                field!("teacher_logprobs", t);
            }
            None => d.set_item("teacher_logprobs", py.None())?,
        }
        d.set_item("local_bounds", runs.local_bounds.clone().into_pyarray(py))?;
        Ok(d)
    }

    /// `rows[r]` (one numpy array per CP rank, e.g. per-token outputs) put back into the
    /// padded row's order.
    fn cp_unpack<'py>(&self, py: Python<'py>, rows: Vec<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let Some(runs) = &self.cp_runs else {
            return Err(invalid(py, "this micro-batch has no CP split".into()));
        };
        let positions = (0..runs.cp as usize)
            .map(|r| runs.positions(r).map(|p| p.into_pyarray(py).readonly()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| to_py(py, e))?;
        scatter(py, positions, rows, self.input_ids.bind(py).len())
    }

    /// The versioned binary encoding (`SPMB` header, format version, postcard body).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let m = self.to_rust(py);
        let bytes = py.detach(|| m.encode()).map_err(|e| to_py(py, e))?;
        Ok(PyBytes::new(py, &bytes))
    }

    /// Decodes what `to_bytes` wrote; a clear error for anything else.
    #[staticmethod]
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<PyMicroBatch> {
        let m = MicroBatch::decode(data).map_err(|e| to_py(py, e))?;
        Ok(wrap(py, m))
    }
}

/// Owned sample data extracted from Python: the packer's wire sample plus the run and the
/// scalar temperature, which a `TrainingBatch` carries once for all its samples.
pub(crate) struct OwnedSample {
    pub(crate) sample: stowplan::TrainingSample,
    temperature: f32,
    run: u32,
}

impl OwnedSample {
    fn borrow(&self) -> Sample<'_> {
        self.sample.as_sample(self.temperature, self.run)
    }
}

/// Field `name` of a sample given as a mapping or an object; `None` when absent or None.
fn get<'py>(obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    let v = if let Ok(d) = obj.cast::<PyDict>() {
        d.get_item(name)?
    } else if obj.hasattr(name)? {
        Some(obj.getattr(name)?)
    } else {
        None
    };
    Ok(v.filter(|v| !v.is_none()))
}

fn type_error(i: usize, name: &str, what: &str) -> PyErr {
    PyTypeError::new_err(format!("samples[{i}].{name} must be {what}"))
}

fn ints(i: usize, name: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, i64>>() {
        return Ok(a.as_array().to_vec());
    }
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, i32>>() {
        return Ok(a.as_array().iter().map(|&x| i64::from(x)).collect());
    }
    v.extract::<Vec<i64>>().map_err(|_| type_error(i, name, "a sequence of integers (list or int64/int32 array)"))
}

fn floats(i: usize, name: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<f32>> {
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, f32>>() {
        return Ok(a.as_array().to_vec());
    }
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, f64>>() {
        return Ok(a.as_array().iter().map(|&x| x as f32).collect());
    }
    v.extract::<Vec<f64>>()
        .map(|x| x.into_iter().map(|f| f as f32).collect())
        .map_err(|_| type_error(i, name, "a sequence of floats (list or float32/float64 array)"))
}

fn bools(i: usize, name: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<bool>> {
    if let Ok(a) = v.extract::<PyReadonlyArray1<'_, bool>>() {
        return Ok(a.as_array().to_vec());
    }
    if let Ok(b) = v.extract::<Vec<bool>>() {
        return Ok(b);
    }
    ints(i, name, v).map(|x| x.into_iter().map(|b| b != 0).collect())
}

pub(crate) fn extract_sample(i: usize, obj: &Bound<'_, PyAny>) -> PyResult<OwnedSample> {
    let need = |name: &str| -> PyResult<Bound<'_, PyAny>> {
        get(obj, name)?.ok_or_else(|| {
            crate::invalid(obj.py(), format!("samples[{i}] has no {name} (a mapping key or an attribute)"))
        })
    };
    let opt_f = |name: &str| -> PyResult<Option<Vec<f32>>> { get(obj, name)?.map(|v| floats(i, name, &v)).transpose() };
    let opt_b = |name: &str| -> PyResult<Option<Vec<bool>>> { get(obj, name)?.map(|v| bools(i, name, &v)).transpose() };
    let scalar = |name: &str, default: Option<f64>| -> PyResult<f64> {
        match get(obj, name)? {
            Some(v) => v.extract::<f64>().map_err(|_| type_error(i, name, "a number")),
            None => default.ok_or_else(|| {
                crate::invalid(obj.py(), format!("samples[{i}] has no {name} (a mapping key or an attribute)"))
            }),
        }
    };
    let run = match get(obj, "run")?.or(get(obj, "lora")?) {
        Some(v) => v.extract::<i64>().map_err(|_| type_error(i, "run", "an integer"))?,
        None => 0,
    };
    let run = u32::try_from(run)
        .map_err(|_| crate::invalid(obj.py(), format!("samples[{i}].run must be in 0..=2**32-1 (got {run})")))?;
    Ok(OwnedSample {
        sample: stowplan::TrainingSample {
            prompt_ids: ints(i, "prompt_ids", &need("prompt_ids")?)?,
            completion_ids: ints(i, "completion_ids", &need("completion_ids")?)?,
            prompt_mask: opt_b("prompt_mask")?,
            completion_mask: opt_b("completion_mask")?,
            completion_logprobs: opt_f("completion_logprobs")?,
            completion_temperatures: opt_f("completion_temperatures")?,
            teacher_logprobs: opt_f("teacher_logprobs")?,
            advantage: scalar("advantage", None)? as f32,
        },
        temperature: scalar("temperature", Some(1.0))? as f32,
        run,
    })
}

/// materialize(samples, capacity, dp, cp, padding, multiple, linear, quadratic,
/// pad_token_id, num_runs, mix_runs, allow_empty_completion, plan, backend)
/// -> (ranks: list of lists of MicroBatch, figures dict or None for a caller's plan)
#[pyfunction]
#[pyo3(signature = (samples, capacity, dp, cp, padding, multiple, linear, quadratic, pad_token_id, num_runs,
    mix_runs, allow_empty_completion, plan, backend))]
#[allow(clippy::too_many_arguments)]
pub fn materialize<'py>(
    py: Python<'py>,
    samples: &Bound<'py, PyAny>,
    capacity: i128,
    dp: i64,
    cp: i64,
    padding: &str,
    multiple: i128,
    linear: u64,
    quadratic: u64,
    pad_token_id: i64,
    num_runs: Option<i64>,
    mix_runs: bool,
    allow_empty_completion: bool,
    plan: Option<Vec<Vec<Vec<u32>>>>,
    backend: &str,
) -> PyResult<(Bound<'py, PyList>, Option<Bound<'py, PyDict>>)> {
    let cap = u64::try_from(capacity)
        .ok()
        .filter(|&c| c >= 1)
        .ok_or_else(|| invalid(py, format!("capacity must be in 1..=2**64-1 (got {capacity})")))?;
    let m = u64::try_from(multiple)
        .ok()
        .filter(|&c| c >= 1)
        .ok_or_else(|| invalid(py, format!("align must be in 1..=2**64-1 (got {multiple})")))?;
    let padding = match padding {
        "sequence" => Padding::PerSequence(m),
        "micro_batch" => Padding::PerMicroBatch(m),
        other => return Err(invalid(py, format!("padding must be 'sequence' or 'micro_batch' (got {other:?})"))),
    };
    let num_runs = num_runs
        .map(|n| {
            u32::try_from(n)
                .ok()
                .filter(|&n| n >= 1)
                .ok_or_else(|| invalid(py, format!("num_runs must be in 1..=2**32-1 (got {n})")))
        })
        .transpose()?;
    let options = MaterializeOptions {
        capacity: cap,
        dp: u32_arg(py, "dp", dp)?,
        cp: u32_arg(py, "cp", cp)?,
        padding,
        cost: Cost { linear, quadratic },
        pad_token_id,
        num_runs,
        mix_runs,
        allow_empty_completion,
    };
    let owned: Vec<OwnedSample> = samples
        .try_iter()
        .map_err(|_| PyTypeError::new_err("samples must be an iterable of mappings or objects"))?
        .enumerate()
        .map(|(i, s)| extract_sample(i, &s?))
        .collect::<PyResult<_>>()?;
    let k = kernel(py, backend)?;
    let (ranks, figures) = py
        .detach(|| -> Result<_, stowplan::Error> {
            let borrowed: Vec<Sample<'_>> = owned.iter().map(OwnedSample::borrow).collect();
            match &plan {
                Some(p) => {
                    let p: Vec<Vec<&[u32]>> = p.iter().map(|r| r.iter().map(Vec::as_slice).collect()).collect();
                    Ok((stowplan::materialize_plan(&k, &borrowed, &p, &options)?, None))
                }
                None => {
                    let m = stowplan::materialize(&k, &borrowed, &options)?;
                    let d = &m.distribution;
                    let figures = (
                        m.real_tokens,
                        m.padding_tokens,
                        d.per_rank,
                        d.packed,
                        d.splits,
                        d.dummies,
                        d.lower_bound,
                        d.rank_costs.clone(),
                    );
                    Ok((m.ranks, Some(figures)))
                }
            }
        })
        .map_err(|e| to_py(py, e))?;
    let out = PyList::empty(py);
    for rank in ranks {
        let row = PyList::empty(py);
        for mb in rank {
            row.append(Py::new(py, wrap(py, mb))?)?;
        }
        out.append(row)?;
    }
    let figures = match figures {
        None => None,
        Some((real, pad, per_rank, packed, splits, dummies, lower_bound, rank_costs)) => {
            let d = PyDict::new(py);
            d.set_item("real_tokens", real)?;
            d.set_item("padding_tokens", pad)?;
            d.set_item("per_rank", per_rank)?;
            d.set_item("packed", packed)?;
            d.set_item("splits", splits)?;
            d.set_item("dummies", dummies)?;
            d.set_item("lower_bound", lower_bound)?;
            d.set_item("rank_costs", rank_costs.into_pyarray(py))?;
            Some(d)
        }
    };
    Ok((out, figures))
}

/// prime_rl_ffd(lengths, runs, labels, seq_len, backend) -> (bins, dropped)
#[pyfunction]
pub fn prime_rl_ffd(
    py: Python<'_>,
    lengths: Vec<u64>,
    runs: Vec<u32>,
    labels: Vec<u32>,
    seq_len: u64,
    backend: &str,
) -> PyResult<(Vec<Vec<u32>>, Vec<u32>)> {
    let k = kernel(py, backend)?;
    py.detach(|| k.prime_rl_ffd(&lengths, &runs, &labels, seq_len)).map_err(|e| to_py(py, e))
}

/// Adds this module's functions and classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pad_factor, m)?)?;
    m.add_function(wrap_pyfunction!(cp_layout, m)?)?;
    m.add_function(wrap_pyfunction!(scatter, m)?)?;
    m.add_function(wrap_pyfunction!(materialize, m)?)?;
    m.add_function(wrap_pyfunction!(prime_rl_ffd, m)?)?;
    m.add_class::<PyMicroBatch>()?;
    Ok(())
}
