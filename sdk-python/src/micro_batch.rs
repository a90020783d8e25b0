//! A materialized micro-batch as numpy arrays (owned by numpy without copying the Rust
//! vectors): its CP views, unpacking and the byte encoding.

use numpy::{IntoPyArray, PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use stowplan::materialize::{CpRuns, MaterializedBatch, TokenArrays};

use crate::layout::scatter;
use crate::{int, invalid, to_py};

/// One materialized micro-batch; every per-token field is a numpy array of the row's length.
#[derive(Debug)]
#[pyclass(frozen, module = "stowplan._stowplan", name = "MaterializedBatch")]
pub struct PyMaterializedBatch {
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

pub(crate) fn wrap(py: Python<'_>, m: MaterializedBatch) -> PyMaterializedBatch {
    let a = m.arrays;
    PyMaterializedBatch {
        samples: m.samples.into_pyarray(py).unbind(),
        input_ids: a.input_ids.into_pyarray(py).unbind(),
        position_ids: a.position_ids.into_pyarray(py).unbind(),
        loss_mask: a.loss_mask.into_pyarray(py).unbind(),
        loss_weights: a.loss_weights.into_pyarray(py).unbind(),
        advantages: a.advantages.into_pyarray(py).unbind(),
        inference_logprobs: a.inference_logprobs.into_pyarray(py).unbind(),
        temperatures: a.temperatures.into_pyarray(py).unbind(),
        teacher_logprobs: a.teacher_logprobs.map(|t| t.into_pyarray(py).unbind()),
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

impl PyMaterializedBatch {
    fn to_rust(&self, py: Python<'_>) -> MaterializedBatch {
        MaterializedBatch {
            samples: vec_of(py, &self.samples),
            arrays: TokenArrays {
                input_ids: vec_of(py, &self.input_ids),
                position_ids: vec_of(py, &self.position_ids),
                loss_mask: vec_of(py, &self.loss_mask),
                loss_weights: vec_of(py, &self.loss_weights),
                advantages: vec_of(py, &self.advantages),
                inference_logprobs: vec_of(py, &self.inference_logprobs),
                temperatures: vec_of(py, &self.temperatures),
                teacher_logprobs: self.teacher_logprobs.as_ref().map(|t| vec_of(py, t)),
            },
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
impl PyMaterializedBatch {
    /// Pickles as its framed, checksummed bytes (:meth:`to_bytes`).
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyTuple>> {
        crate::reduce_by(slf, "from_bytes", (slf.get().to_bytes(slf.py())?,))
    }

    fn __len__(&self, py: Python<'_>) -> usize {
        self.input_ids.bind(py).len()
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "MaterializedBatch(tokens={}, samples={}, real_tokens={}, padding_tokens={}, dummy={}, cp={})",
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
    fn from_bytes(py: Python<'_>, data: &[u8]) -> PyResult<PyMaterializedBatch> {
        let m = MaterializedBatch::decode(data).map_err(|e| to_py(py, e))?;
        Ok(wrap(py, m))
    }
}

/// Adds this module's functions and classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyMaterializedBatch>()?;
    Ok(())
}
