//! Bindings of the trainer layout: pad factors, CP layouts, materialized micro-batches as
//! numpy arrays (owned by numpy without copying the Rust vectors), CP views, unpacking and
//! the byte encoding.

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use stowplan::{AlignOptions, CpRuns, Factor, MaterializeOptions, MicroBatch, Padding, Sample};

use crate::str_options;
use crate::{
    Lengths, cost_arg, float_vec, int, int_vec, invalid, kernel, mask_vec, number, opt_parse, opt_u32, to_py, u64_arg,
};

/// No context or tensor parallelism: the `cp`/`tp` of an omitted argument.
const NO_PARALLELISM: u32 = 1;

/// `align`: `None` (omitted), `"cp_tp"`, `"roll"` or a multiple `>= 1`.
fn factor(align: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Factor>> {
    let Some(a) = align else { return Ok(None) };
    if let Ok(s) = a.cast::<PyString>() {
        return match &*s.to_cow()? {
            "cp_tp" => Ok(Some(Factor::CpTp)),
            "roll" => Ok(Some(Factor::Roll)),
            other => Err(invalid(
                a.py(),
                format!("align must be None, 'cp_tp', 'roll' or a positive integer (got {other:?})"),
            )),
        };
    }
    Ok(Some(Factor::Multiple(u64_arg(a, "align", 1)?)))
}

/// Alignment options from the arguments (`None`: no CP, no TP, seed 001's factor).
fn align_options(
    cp: Option<&Bound<'_, PyAny>>,
    tp: Option<&Bound<'_, PyAny>>,
    align: Option<&Bound<'_, PyAny>>,
    power_of_two: Option<bool>,
) -> PyResult<AlignOptions> {
    let d = AlignOptions::new(
        opt_u32(cp, "cp", 1)?.unwrap_or(NO_PARALLELISM),
        opt_u32(tp, "tp", 1)?.unwrap_or(NO_PARALLELISM),
    );
    Ok(AlignOptions {
        factor: factor(align)?.unwrap_or(d.factor),
        power_of_two: power_of_two.unwrap_or(d.power_of_two),
        ..d
    })
}

/// The multiple every sequence length is padded to.
///
/// Options (omitted or ``None``: the default): ``cp``, ``tp`` — context- and
/// tensor-parallel sizes (default 1); ``align`` — ``None`` or ``"cp_tp"``: the zigzag
/// split's ``2·cp·tp`` (``tp`` when ``cp == 1``); ``"roll"``: ROLL's ``lcm(16, 2·cp·tp)``
/// (``lcm(16, tp)`` when ``cp == 1``); an integer: that multiple, which must be a multiple of
/// ``2·cp`` (when ``cp > 1``) and of ``tp``; ``power_of_two`` — reject ``cp``/``tp`` that are
/// not powers of two (default False); ``backend``.
///
/// >>> pad_factor(cp=2, tp=2), pad_factor(cp=3, align="roll"), pad_factor(tp=3)
/// (8, 48, 3)
#[pyfunction]
#[pyo3(signature = (*, cp=None, tp=None, align=None, power_of_two=None, backend=None))]
pub fn pad_factor(
    py: Python<'_>,
    cp: Option<&Bound<'_, PyAny>>,
    tp: Option<&Bound<'_, PyAny>>,
    align: Option<&Bound<'_, PyAny>>,
    power_of_two: Option<bool>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<u64> {
    str_options!(backend);
    let o = align_options(cp, tp, align, power_of_two)?;
    let k = kernel(py, backend)?;
    py.detach(|| k.pad_factor(&o)).map_err(|e| to_py(py, e))
}

/// One packed row of sequences split over context-parallel ranks (Megatron's zigzag): the
/// result of :func:`cp_layout`.
#[pyclass(frozen, module = "stowplan._stowplan", name = "CpLayout")]
#[derive(Debug)]
pub struct PyCpLayout {
    /// The pad factor; every sequence is padded to a multiple of it.
    #[pyo3(get)]
    factor: u64,
    /// The CP size.
    #[pyo3(get)]
    cp: u32,
    /// ``uint64`` array of ``n + 1`` cumulative real lengths.
    #[pyo3(get)]
    cu_seqlens: Py<PyArray1<u64>>,
    /// ``uint64`` array of ``n + 1`` cumulative padded lengths (sequence ``i`` occupies
    /// ``cu_seqlens_padded[i]:cu_seqlens_padded[i+1]``).
    #[pyo3(get)]
    cu_seqlens_padded: Py<PyArray1<u64>>,
    /// The longest real length.
    #[pyo3(get)]
    max_seqlen: u64,
    /// The longest padded length.
    #[pyo3(get)]
    max_seqlen_padded: u64,
    /// One ``uint64`` array per CP rank, the positions of the padded row it receives (chunks
    /// ``r`` and ``2·cp−1−r`` of every sequence), in its order.
    #[pyo3(get)]
    gather: Py<PyList>,
    /// ``uint64`` array, every rank's sequence boundaries (``cu_seqlens_padded // cp``).
    #[pyo3(get)]
    local_bounds: Py<PyArray1<u64>>,
    /// ``uint64`` array, real tokens per CP rank.
    #[pyo3(get)]
    rank_real_tokens: Py<PyArray1<u64>>,
    /// Tokens of the padded row.
    #[pyo3(get)]
    padded_tokens: u64,
}

#[pymethods]
impl PyCpLayout {
    /// Every CP rank's part of ``row`` (an array of the padded row's length).
    fn split<'py>(&self, py: Python<'py>, row: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyList>> {
        let arr = numpy(py)?.call_method1("asarray", (row,))?;
        let ndim: usize = arr.getattr("ndim")?.extract()?;
        if ndim != 1 || arr.len()? as u64 != self.padded_tokens {
            return Err(invalid(
                py,
                format!(
                    "row must be one-dimensional with {} elements (got shape {})",
                    self.padded_tokens,
                    arr.getattr("shape")?.str()?
                ),
            ));
        }
        PyList::new(py, self.gather.bind(py).iter().map(|g| arr.get_item(g)).collect::<PyResult<Vec<_>>>()?)
    }

    /// The inverse of :meth:`split`: CP ranks' rows (e.g. per-token outputs) back into one
    /// padded row. ``rows`` are float32/float64/int64/int32/bool arrays.
    fn unpack<'py>(&self, py: Python<'py>, rows: Vec<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
        let positions =
            self.gather.bind(py).iter().map(|g| g.extract::<PyReadonlyArray1<'py, u64>>()).collect::<PyResult<_>>()?;
        scatter(py, positions, rows, self.padded_tokens as usize)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "CpLayout(cp={}, factor={}, sequences={}, padded_tokens={})",
            self.cp,
            self.factor,
            self.cu_seqlens.bind(py).len().saturating_sub(1),
            self.padded_tokens
        )
    }
}

/// The `numpy` module (imported once).
fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    NUMPY.get_or_try_init(py, || Ok::<_, PyErr>(py.import("numpy")?.unbind())).map(|m| m.bind(py))
}

/// Pads every sequence of ``lengths`` to the pad factor (see :func:`pad_factor`), packs them
/// in order and splits the row over ``cp`` ranks. Zero lengths are allowed. ``tp``,
/// ``align``, ``power_of_two``, ``backend``: as for :func:`pad_factor`.
///
/// >>> lay = cp_layout([2, 4, 6, 1], cp=2)          # padded to multiples of 2·cp = 4
/// >>> lay.factor, lay.cu_seqlens.tolist(), lay.cu_seqlens_padded.tolist()
/// (4, [0, 2, 6, 12, 13], [0, 4, 8, 16, 20])
/// >>> lay.gather[0].tolist()                         # positions CP rank 0 receives
/// [0, 3, 4, 7, 8, 9, 14, 15, 16, 19]
/// >>> lay.local_bounds.tolist()
/// [0, 2, 4, 8, 10]
#[pyfunction]
#[pyo3(signature = (lengths, *, cp, tp=None, align=None, power_of_two=None, backend=None))]
pub fn cp_layout(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    cp: &Bound<'_, PyAny>,
    tp: Option<&Bound<'_, PyAny>>,
    align: Option<&Bound<'_, PyAny>>,
    power_of_two: Option<bool>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyCpLayout> {
    str_options!(backend);
    let o = align_options(Some(cp), tp, align, power_of_two)?;
    let lengths = Lengths::extract(lengths, "lengths")?;
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
    Ok(PyCpLayout {
        factor: layout.factor,
        cp: o.cp,
        padded_tokens: layout.cu_seqlens_padded.last().copied().unwrap_or(0),
        max_seqlen: layout.max_seqlen,
        max_seqlen_padded: layout.max_seqlen_padded,
        cu_seqlens: layout.cu_seqlens.into_pyarray(py).unbind(),
        cu_seqlens_padded: layout.cu_seqlens_padded.into_pyarray(py).unbind(),
        gather: PyList::new(py, maps.into_iter().map(|m| m.into_pyarray(py)))?.unbind(),
        local_bounds: layout.local_bounds.into_pyarray(py).unbind(),
        rank_real_tokens: layout.rank_real_tokens.into_pyarray(py).unbind(),
    })
}

/// `out[positions[r]] = rows[r]` for every rank, for float32/float64/int64/int32/bool rows
/// (the inverse of the CP split). Rows that are not numpy arrays go through `numpy.asarray`.
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
    let rows = rows.into_iter().map(|r| numpy(py)?.call_method1("asarray", (r,))).collect::<PyResult<Vec<_>>>()?;
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
                    let a = a.as_array();
                    if a.len() != p.len() {
                        return Err(invalid(
                            py,
                            format!("rows[{r}] has {} elements; CP rank {r} holds {}", a.len(), p.len()),
                        ));
                    }
                    for (&i, &v) in p.iter().zip(a.iter()) {
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
    Err(invalid(py, "rows must be one-dimensional numpy arrays of float32, float64, int64, int32 or bool".into()))
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
    loss_weights: Py<PyArray1<f32>>,
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
        loss_weights: m.loss_weights.into_pyarray(py).unbind(),
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
            loss_weights: vec_of(py, &self.loss_weights),
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
    /// Pickles as its framed, checksummed bytes (:meth:`to_bytes`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        crate::reduce_by(slf, "from_bytes", (slf.get().to_bytes(slf.py())?,))
    }

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
    /// `position_ids`, `loss_mask`, `loss_weights`, `advantages`, `inference_logprobs`, `temperatures`,
    /// `teacher_logprobs` or None, `local_bounds`).
    fn cp_view<'py>(&self, py: Python<'py>, rank: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let Some(runs) = &self.cp_runs else {
            return Err(invalid(
                py,
                "this micro-batch has no CP split: materialize with cp > 1 and padding='sequence'".into(),
            ));
        };
        let r: usize = int(rank, "rank", 0, i128::from(runs.cp) - 1)?;
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
        field!("loss_weights", self.loss_weights);
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

    /// The versioned binary encoding (`SPMB` header, format version, postcard body, CRC-32).
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

/// Token ids: exact integers of the arrays' `int64` (see `crate::int_vec`). The host
/// refuses negative ones, per sample (the packer rejects the sample and goes on).
fn token_ids(i: usize, name: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    int_vec(v, &format!("samples[{i}].{name}"), i64::MIN.into(), i64::MAX.into())
}

pub(crate) fn extract_sample(i: usize, obj: &Bound<'_, PyAny>) -> PyResult<OwnedSample> {
    let py = obj.py();
    let at = |name: &str| format!("samples[{i}].{name}");
    let need = |name: &str| -> PyResult<Bound<'_, PyAny>> {
        get(obj, name)?
            .ok_or_else(|| crate::invalid(py, format!("samples[{i}] has no {name} (a mapping key or an attribute)")))
    };
    let opt_f =
        |name: &str| -> PyResult<Option<Vec<f32>>> { get(obj, name)?.map(|v| float_vec(&v, &at(name))).transpose() };
    let opt_b =
        |name: &str| -> PyResult<Option<Vec<bool>>> { get(obj, name)?.map(|v| mask_vec(&v, &at(name))).transpose() };
    let scalar = |name: &str, default: Option<f64>| -> PyResult<f64> {
        match get(obj, name)? {
            Some(v) => number(&v, &at(name), "a number"),
            None => default.ok_or_else(|| {
                crate::invalid(py, format!("samples[{i}] has no {name} (a mapping key or an attribute)"))
            }),
        }
    };
    let run = match (get(obj, "run")?, get(obj, "lora")?) {
        (Some(v), _) => int(&v, &at("run"), 0, u32::MAX.into())?,
        (None, Some(v)) => int(&v, &at("lora"), 0, u32::MAX.into())?,
        (None, None) => 0,
    };
    Ok(OwnedSample {
        sample: stowplan::TrainingSample {
            prompt_ids: token_ids(i, "prompt_ids", &need("prompt_ids")?)?,
            completion_ids: token_ids(i, "completion_ids", &need("completion_ids")?)?,
            prompt_mask: opt_b("prompt_mask")?,
            completion_mask: opt_b("completion_mask")?,
            completion_logprobs: opt_f("completion_logprobs")?,
            completion_temperatures: opt_f("completion_temperatures")?,
            teacher_logprobs: opt_f("teacher_logprobs")?,
            advantage: scalar("advantage", None)? as f32,
            extra_cost: get(obj, "extra_cost")?
                .map(|v| int(&v, &at("extra_cost"), 0, u64::MAX.into()))
                .transpose()?
                .unwrap_or(0),
        },
        temperature: scalar("temperature", Some(1.0))? as f32,
        run,
    })
}

/// Every rank's micro-batches (the result of :func:`materialize`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "Materialized")]
#[derive(Debug)]
pub struct PyMaterialized {
    /// ``ranks[r]`` is rank ``r``'s list of :class:`MicroBatch` (the same count on every rank).
    #[pyo3(get)]
    ranks: Py<PyList>,
    /// Micro-batches per rank.
    #[pyo3(get)]
    per_rank: usize,
    /// Real tokens over all micro-batches.
    #[pyo3(get)]
    real_tokens: u64,
    /// Padding tokens over all micro-batches (dummies' padding included).
    #[pyo3(get)]
    padding_tokens: u64,
    /// Micro-batches best-fit decreasing made (``None`` for a caller's ``plan``).
    #[pyo3(get)]
    packed: Option<u32>,
    /// Heaviest micro-batches split to reach a multiple of ``dp`` (``None`` for a ``plan``).
    #[pyo3(get)]
    splits: Option<u32>,
    /// Empty micro-batches (zero loss mask and advantages) added because there were fewer
    /// samples than slots.
    #[pyo3(get)]
    dummies: u32,
    /// No packing under the capacity has fewer micro-batches (``None`` for a ``plan``).
    #[pyo3(get)]
    lower_bound: Option<u32>,
    /// ``uint64`` array, cost per rank (``None`` for a caller's ``plan``).
    #[pyo3(get)]
    rank_costs: Option<Py<PyArray1<u64>>>,
}

#[pymethods]
impl PyMaterialized {
    /// Pickles as its fields (each micro-batch as its framed bytes).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        let (py, m) = (slf.py(), slf.get());
        let figures = (m.per_rank, m.real_tokens, m.padding_tokens, m.packed, m.splits, m.dummies, m.lower_bound);
        let costs = m.rank_costs.as_ref().map(|c| c.clone_ref(py));
        crate::reduce(slf, (m.ranks.clone_ref(py), figures, costs))
    }

    /// The result pickled by ``__reduce__``.
    #[staticmethod]
    #[allow(clippy::type_complexity)]
    fn _from_state(
        ranks: Py<PyList>,
        figures: (usize, u64, u64, Option<u32>, Option<u32>, u32, Option<u32>),
        rank_costs: Option<Py<PyArray1<u64>>>,
    ) -> Self {
        let (per_rank, real_tokens, padding_tokens, packed, splits, dummies, lower_bound) = figures;
        PyMaterialized {
            ranks,
            per_rank,
            real_tokens,
            padding_tokens,
            packed,
            splits,
            dummies,
            lower_bound,
            rank_costs,
        }
    }

    /// Padding tokens over real tokens.
    #[getter]
    fn padding_overhead(&self) -> f64 {
        if self.real_tokens == 0 { 0.0 } else { self.padding_tokens as f64 / self.real_tokens as f64 }
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Materialized(dp={}, per_rank={}, real_tokens={}, padding_tokens={}, dummies={})",
            self.ranks.bind(py).len(),
            self.per_rank,
            self.real_tokens,
            self.padding_tokens,
            self.dummies
        )
    }
}

/// A caller's plan: ``plan[r][j]`` = the sample indices of rank ``r``'s micro-batch ``j``
/// (exact integers; errors name ``plan[r][j][i]``).
fn plan_arg(plan: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<Vec<Vec<u32>>>>> {
    let Some(plan) = plan else { return Ok(None) };
    let py = plan.py();
    let shape = || invalid(py, "plan must be a list (ranks) of lists (micro-batches) of sample indices".to_string());
    let mut out = Vec::new();
    for (r, rank) in plan.try_iter().map_err(|_| shape())?.enumerate() {
        let mut row = Vec::new();
        for (j, mb) in rank?.try_iter().map_err(|_| shape())?.enumerate() {
            row.push(int_vec(&mb?, &format!("plan[{r}][{j}]"), 0, u32::MAX.into())?);
        }
        out.push(row);
    }
    Ok(Some(out))
}

/// Packs ``samples`` into micro-batches of at most ``capacity`` tokens (after padding),
/// gives each of ``dp`` ranks the same number, and builds their arrays.
///
/// A sample is a mapping or an object with ``prompt_ids``, ``completion_ids`` (lists or
/// int64/int32 arrays) and ``advantage``; optionally ``prompt_mask`` (default all False),
/// ``completion_mask`` (all True), ``completion_logprobs`` (0), ``temperature`` (one float,
/// default 1.0) or ``completion_temperatures`` (one per completion token), ``run`` or
/// ``lora`` (default 0), ``teacher_logprobs`` (every token; all samples or none) and
/// ``extra_cost`` (default 0: a cost on top of the cost model's, in its units — a multimodal
/// sample's image or vision tokens — that balancing counts and the capacity does not).
///
/// Options (omitted or ``None``: the default): ``dp`` (default 1), ``cp``, ``tp`` (default
/// 1); ``padding`` — ``"sequence"`` pads every sample to the factor (default when
/// ``cp > 1``; rows then carry their CP split, see ``MicroBatch.cp_view``),
/// ``"micro_batch"`` pads each row's total (prime-rl's ``pad_to_multiple_of``; default when
/// ``cp == 1``); ``align`` — as for :func:`pad_factor` (an integer is used as is); ``cost``
/// — as in :func:`micro_batches`; ``pad_token_id`` (default 1, prime-rl's); ``num_runs`` —
/// the length of ``lora_num_tokens`` (default: the largest run + 1); ``mix_runs`` — samples
/// of different runs may share a micro-batch (default False); ``allow_empty_completion``
/// (default False); ``loss_agg_mode`` — how per-token losses make the step's loss:
/// ``"token-mean"`` (default), ``"seq-mean-token-mean"``, ``"seq-mean-token-sum"`` or
/// ``"seq-mean-token-sum-norm"`` (verl's names), which sets every row's ``loss_weights``
/// (float32, the layout of ``loss_mask``) so that Σ over all ranks, micro-batches and tokens
/// of ``loss_weights × per-token loss`` is the unpacked samples' loss (counts per run, over
/// the samples of the call or of ``plan``); ``loss_scale_factor`` — the horizon of
/// ``"seq-mean-token-sum-norm"`` only, in tokens (default: the run's longest completion);
/// ``multimodal_alone`` — every sample with an ``extra_cost`` gets a micro-batch of its own
/// (prime-rl's rule; needs ``mix_runs`` False); ``plan`` — materialize this plan instead (``plan[r][j]`` = the sample
/// indices of rank ``r``'s micro-batch ``j``; ``[]`` = a dummy); ``backend``.
///
/// Raises :class:`InvalidArgumentError` naming the sample and field (length mismatch, empty
/// completion unless ``allow_empty_completion``, temperature ≤ 0, …) and
/// :class:`InfeasibleError` for a sample longer than ``capacity``.
///
/// >>> samples = [
/// ...     {"prompt_ids": [11, 12], "completion_ids": [13, 14, 15], "advantage": 0.5},
/// ...     {"prompt_ids": [21], "completion_ids": [22, 23], "advantage": -1.0},
/// ... ]
/// >>> m = materialize(samples, capacity=64, cp=2)
/// >>> mb = m.ranks[0][0]
/// >>> mb.input_ids.tolist(), mb.cu_seqlens_padded.tolist()
/// ([11, 12, 13, 14, 15, 1, 1, 1, 21, 22, 23, 1], [0, 8, 12])
/// >>> mb.cp_view(1)["input_ids"].tolist()
/// [13, 14, 15, 1, 22, 23]
/// >>> MicroBatch.from_bytes(mb.to_bytes()).input_ids.tolist() == mb.input_ids.tolist()
/// True
#[pyfunction]
#[pyo3(signature = (samples, *, capacity, dp=None, cp=None, tp=None, padding=None, align=None, cost=None,
    pad_token_id=None, num_runs=None, mix_runs=None, allow_empty_completion=None, loss_agg_mode=None,
    loss_scale_factor=None, multimodal_alone=None, plan=None, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn materialize(
    py: Python<'_>,
    samples: &Bound<'_, PyAny>,
    capacity: &Bound<'_, PyAny>,
    dp: Option<&Bound<'_, PyAny>>,
    cp: Option<&Bound<'_, PyAny>>,
    tp: Option<&Bound<'_, PyAny>>,
    padding: Option<&Bound<'_, PyAny>>,
    align: Option<&Bound<'_, PyAny>>,
    cost: Option<&Bound<'_, PyAny>>,
    pad_token_id: Option<&Bound<'_, PyAny>>,
    num_runs: Option<&Bound<'_, PyAny>>,
    mix_runs: Option<bool>,
    allow_empty_completion: Option<bool>,
    loss_agg_mode: Option<&Bound<'_, PyAny>>,
    loss_scale_factor: Option<&Bound<'_, PyAny>>,
    multimodal_alone: Option<bool>,
    plan: Option<&Bound<'_, PyAny>>,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyMaterialized> {
    str_options!(padding, loss_agg_mode, backend);
    let capacity = u64_arg(capacity, "capacity", 1)?;
    let plan = plan_arg(plan)?;
    // With a plan, dp defaults to its number of ranks (the host checks a given dp against it).
    let default_dp = match plan.as_ref().map(Vec::len) {
        None | Some(0) => NO_PARALLELISM,
        Some(n) => u32::try_from(n).map_err(|_| invalid(py, format!("plan has {n} ranks, over 2^32-1")))?,
    };
    let d = MaterializeOptions::new(capacity, opt_u32(dp, "dp", 1)?.unwrap_or(default_dp));
    let cp = opt_u32(cp, "cp", 1)?.unwrap_or(d.cp);
    let tp = opt_u32(tp, "tp", 1)?.unwrap_or(NO_PARALLELISM);
    let per_sequence = match padding {
        None => cp > 1,
        Some("sequence") => true,
        Some("micro_batch") => false,
        Some(other) => {
            return Err(invalid(py, format!("padding must be 'sequence' or 'micro_batch' (got {other:?})")));
        }
    };
    let k = kernel(py, backend)?;
    let multiple = match factor(align)? {
        Some(Factor::Multiple(m)) => m,
        f => {
            let o = AlignOptions { factor: f.unwrap_or(AlignOptions::new(cp, tp).factor), ..AlignOptions::new(cp, tp) };
            py.detach(|| k.pad_factor(&o)).map_err(|e| to_py(py, e))?
        }
    };
    let options = MaterializeOptions {
        cp,
        padding: if per_sequence { Padding::PerSequence(multiple) } else { Padding::PerMicroBatch(multiple) },
        cost: cost_arg(cost)?.unwrap_or(d.cost),
        pad_token_id: pad_token_id
            .map(|p| int(p, "pad_token_id", i64::MIN.into(), i64::MAX.into()))
            .transpose()?
            .unwrap_or(d.pad_token_id),
        num_runs: opt_u32(num_runs, "num_runs", 1)?.or(d.num_runs),
        mix_runs: mix_runs.unwrap_or(d.mix_runs),
        allow_empty_completion: allow_empty_completion.unwrap_or(d.allow_empty_completion),
        loss_agg_mode: opt_parse(py, loss_agg_mode)?.unwrap_or(d.loss_agg_mode),
        loss_scale_factor: loss_scale_factor
            .map(|f| number(f, "loss_scale_factor", "a number of tokens"))
            .transpose()?
            .or(d.loss_scale_factor),
        multimodal_alone: multimodal_alone.unwrap_or(d.multimodal_alone),
        ..d
    };
    let owned: Vec<OwnedSample> = samples
        .try_iter()
        .map_err(|_| invalid(py, "samples must be an iterable of mappings or objects".into()))?
        .enumerate()
        .map(|(i, s)| extract_sample(i, &s?))
        .collect::<PyResult<_>>()?;
    let (ranks, distribution) = py
        .detach(|| -> Result<_, stowplan::Error> {
            let borrowed: Vec<Sample<'_>> = owned.iter().map(OwnedSample::borrow).collect();
            match &plan {
                Some(p) => {
                    let p: Vec<Vec<&[u32]>> = p.iter().map(|r| r.iter().map(Vec::as_slice).collect()).collect();
                    Ok((stowplan::materialize_plan(&k, &borrowed, &p, &options)?, None))
                }
                None => {
                    let m = stowplan::materialize(&k, &borrowed, &options)?;
                    Ok((m.ranks, Some(m.distribution)))
                }
            }
        })
        .map_err(|e| to_py(py, e))?;
    let all = || ranks.iter().flatten();
    let (real_tokens, padding_tokens) = (all().map(|m| m.real_tokens).sum(), all().map(|m| m.padding_tokens).sum());
    let dummies = all().filter(|m| m.dummy).count() as u32;
    let per_rank = ranks.first().map_or(0, Vec::len);
    let out = PyList::empty(py);
    for rank in ranks {
        let row = PyList::empty(py);
        for mb in rank {
            row.append(Py::new(py, wrap(py, mb))?)?;
        }
        out.append(row)?;
    }
    Ok(PyMaterialized {
        ranks: out.unbind(),
        per_rank,
        real_tokens,
        padding_tokens,
        packed: distribution.as_ref().map(|d| d.packed),
        splits: distribution.as_ref().map(|d| d.splits),
        dummies: distribution.as_ref().map_or(dummies, |d| d.dummies),
        lower_bound: distribution.as_ref().map(|d| d.lower_bound),
        rank_costs: distribution.map(|d| d.rank_costs.into_pyarray(py).unbind()),
    })
}

/// prime-rl's classic packer's bins (the result of :func:`prime_rl_ffd`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "PrimeRlBins")]
#[derive(Debug)]
pub struct PyPrimeRlBins {
    /// The bins: sample indices in prime-rl's bin order and in-bin order.
    #[pyo3(get)]
    bins: Vec<Vec<u32>>,
    /// The zero-length samples prime-rl drops without a word.
    #[pyo3(get)]
    dropped: Vec<u32>,
}

#[pymethods]
impl PyPrimeRlBins {
    fn __repr__(&self) -> String {
        format!("PrimeRlBins(bins={}, dropped={})", self.bins.len(), self.dropped.len())
    }
}

/// prime_rl_ffd(lengths, runs, labels, seq_len, *, backend=None) -> PrimeRlBins: prime-rl's
/// classic packer (first fit decreasing by (run, −length); bins share a label).
#[pyfunction]
#[pyo3(signature = (lengths, runs, labels, seq_len, *, backend=None))]
pub fn prime_rl_ffd(
    py: Python<'_>,
    lengths: Vec<u64>,
    runs: Vec<u32>,
    labels: Vec<u32>,
    seq_len: u64,
    backend: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyPrimeRlBins> {
    str_options!(backend);
    let k = kernel(py, backend)?;
    let (bins, dropped) = py.detach(|| k.prime_rl_ffd(&lengths, &runs, &labels, seq_len)).map_err(|e| to_py(py, e))?;
    Ok(PyPrimeRlBins { bins, dropped })
}

/// Adds this module's functions and classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pad_factor, m)?)?;
    m.add_function(wrap_pyfunction!(cp_layout, m)?)?;
    m.add_function(wrap_pyfunction!(materialize, m)?)?;
    m.add_function(wrap_pyfunction!(prime_rl_ffd, m)?)?;
    m.add_class::<PyCpLayout>()?;
    m.add_class::<PyMicroBatch>()?;
    m.add_class::<PyMaterialized>()?;
    m.add_class::<PyPrimeRlBins>()?;
    Ok(())
}
