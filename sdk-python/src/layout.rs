//! Bindings of the trainer layout: pad factors, CP layouts and scattering a row over CP
//! ranks.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyList, PyString};
use stowplan::{
    kernel::{AlignOptions, Factor},
    materialize::CpRuns,
};

use crate::{BackendArg, Lengths, invalid, kernel, opt_u32, to_py, u64_arg};

/// `align`: `None` (omitted), `"cp_tp"`, `"roll"` or a multiple `>= 1`.
pub(crate) fn factor(align: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Factor>> {
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

/// Alignment options from the arguments (`None`: no CP, no TP, the CP layout contract's factor).
fn align_options(
    cp: Option<&Bound<'_, PyAny>>,
    tp: Option<&Bound<'_, PyAny>>,
    align: Option<&Bound<'_, PyAny>>,
    power_of_two: Option<bool>,
) -> PyResult<AlignOptions> {
    // Omitted options: the kernel's defaults (no parallelism, the seed's factor).
    let d = AlignOptions::default();
    Ok(AlignOptions {
        cp: opt_u32(cp, "cp", 1)?.unwrap_or(d.cp),
        tp: opt_u32(tp, "tp", 1)?.unwrap_or(d.tp),
        factor: factor(align)?.unwrap_or(d.factor),
        power_of_two: power_of_two.unwrap_or(d.power_of_two),
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
    backend: Option<BackendArg>,
) -> PyResult<u64> {
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
    backend: Option<BackendArg>,
) -> PyResult<PyCpLayout> {
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

/// Adds this module's functions and classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(pad_factor, m)?)?;
    m.add_function(wrap_pyfunction!(cp_layout, m)?)?;
    m.add_class::<PyCpLayout>()?;
    Ok(())
}
