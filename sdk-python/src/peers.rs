//! Peers (verl 0.9.1, ROLL): their functions' outputs and their builtin exceptions.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use stowplan::{
    kernel::VerlFunction,
    peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions},
};

use crate::convert::{BackendArg, int, int_vec, kernel, opt_i64};
use crate::errors::{invalid, peer_error, to_py};
use crate::results::verl_unbalance;

/// verl(function, seqlens, k, equal_size, *, backend=None) -> list[list[int]]: verl 0.9.1's
/// ``karmarkar_karp``, ``greedy_partition`` or ``get_seqlen_balanced_partitions``; raises the
/// builtin exception verl raises (AssertionError, IndexError, TypeError, ZeroDivisionError,
/// MemoryError).
#[pyfunction]
#[pyo3(signature = (function, seqlens, k, equal_size, *, backend=None))]
pub(crate) fn verl<'py>(
    py: Python<'py>,
    function: &str,
    seqlens: &Bound<'py, PyAny>,
    k: &Bound<'py, PyAny>,
    equal_size: bool,
    backend: Option<BackendArg>,
) -> PyResult<Bound<'py, PyList>> {
    let seqlens: Vec<i64> = int_vec(seqlens, "seqlen_list", i64::MIN.into(), i64::MAX.into())?;
    let k: u32 = int(k, "k_partitions", 0, u32::MAX.into())?;
    let f = match function {
        "karmarkar_karp" => VerlFunction::KarmarkarKarp,
        "greedy_partition" => VerlFunction::GreedyPartition,
        "get_seqlen_balanced_partitions" => VerlFunction::GetSeqlenBalancedPartitions,
        other => {
            return Err(invalid(
                py,
                format!(
                    "function must be 'karmarkar_karp', 'greedy_partition' or 'get_seqlen_balanced_partitions' \
                     (got {other:?})"
                ),
            ));
        }
    };
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.verl(f, &seqlens, k, equal_size)).map_err(|e| to_py(py, e))? {
        Ok(groups) => PyList::new(py, groups),
        Err(e) => Err(peer_error(&e)),
    }
}

/// log_seqlen_unbalance(seqlens, partitions, prefix) -> dict: verl's balance metrics
/// (``{prefix}/min``, ``/max``, ``/minmax_diff``, ``/balanced_min``, ``/balanced_max``,
/// ``/mean``); raises like verl.
#[pyfunction]
pub(crate) fn log_seqlen_unbalance<'py>(
    py: Python<'py>,
    seqlens: &Bound<'py, PyAny>,
    partitions: &Bound<'py, PyAny>,
    prefix: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let (low, high) = (i64::MIN.into(), i64::MAX.into());
    let seqlens: Vec<i64> = int_vec(seqlens, "seqlen_list", low, high)?;
    let partitions = partitions
        .try_iter()
        .map_err(|_| invalid(py, "partitions must be a list of lists of indices".into()))?
        .enumerate()
        .map(|(r, p)| int_vec(&p?, &format!("partitions[{r}]"), low, high))
        .collect::<PyResult<Vec<Vec<i64>>>>()?;
    verl_unbalance(py, &seqlens, &partitions, prefix)
}

/// verl_rearrange_micro_batches(seqlens, max_token_len, *, min_num_micro_batch=None,
/// num_batches_divided_by=None, use_dynamic_bsz_balance=None, force_group_size=None,
/// padded_width=None, dp_num_micro_batches=None, backend=None) -> list[list[int]]: verl's
/// index lists (omitted options: verl's defaults); raises verl's exception.
#[pyfunction]
#[pyo3(signature = (seqlens, max_token_len, *, min_num_micro_batch=None, num_batches_divided_by=None,
    use_dynamic_bsz_balance=None, force_group_size=None, padded_width=None, dp_num_micro_batches=None, backend=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn verl_rearrange_micro_batches<'py>(
    py: Python<'py>,
    seqlens: &Bound<'py, PyAny>,
    max_token_len: &Bound<'py, PyAny>,
    min_num_micro_batch: Option<&Bound<'py, PyAny>>,
    num_batches_divided_by: Option<&Bound<'py, PyAny>>,
    use_dynamic_bsz_balance: Option<bool>,
    force_group_size: Option<&Bound<'py, PyAny>>,
    padded_width: Option<&Bound<'py, PyAny>>,
    dp_num_micro_batches: Option<&Bound<'py, PyAny>>,
    backend: Option<BackendArg>,
) -> PyResult<Bound<'py, PyList>> {
    let seqlens: Vec<i64> = int_vec(seqlens, "seqlen_list", i64::MIN.into(), i64::MAX.into())?;
    let (
        max_token_len,
        min_num_micro_batch,
        num_batches_divided_by,
        force_group_size,
        padded_width,
        dp_num_micro_batches,
    ) = (
        int(max_token_len, "max_token_len", i64::MIN.into(), i64::MAX.into())?,
        opt_i64(min_num_micro_batch, "min_num_micro_batch")?,
        opt_i64(num_batches_divided_by, "num_batches_divided_by")?,
        opt_i64(force_group_size, "force_group_size")?,
        opt_i64(padded_width, "padded_width")?,
        opt_i64(dp_num_micro_batches, "dp_num_micro_batches")?,
    );
    let d = VerlMicroOptions::new(max_token_len);
    let o = VerlMicroOptions {
        min_num_micro_batch: min_num_micro_batch.or(d.min_num_micro_batch),
        num_batches_divided_by: num_batches_divided_by.or(d.num_batches_divided_by),
        use_dynamic_bsz_balance: use_dynamic_bsz_balance.unwrap_or(d.use_dynamic_bsz_balance),
        force_group_size: force_group_size.unwrap_or(d.force_group_size),
        padded_width: padded_width.or(d.padded_width),
        dp_num_micro_batches: dp_num_micro_batches.or(d.dp_num_micro_batches),
        ..d
    };
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.verl_rearrange_micro_batches(&seqlens, &o)).map_err(|e| to_py(py, e))? {
        Ok(groups) => PyList::new(py, groups),
        Err(e) => Err(peer_error(&e)),
    }
}

/// verl's trainer ``_balance_batch`` / ROLL's ``batch_balance`` reordering (the result of
/// :func:`balance_batch`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "DpReorder")]
#[derive(Debug)]
pub struct PyDpReorder {
    inner: DpReorder,
}

#[pymethods]
impl PyDpReorder {
    /// Per rank, the sample indices in the peer's final order.
    #[getter]
    fn partitions(&self) -> Vec<Vec<u32>> {
        self.inner.partitions.clone()
    }

    /// The raw equal-size KK result of each call (one call, or one per mini-batch).
    #[getter]
    fn kk_partitions(&self) -> Vec<Vec<Vec<u32>>> {
        self.inner.kk_partitions.clone()
    }

    /// Samples the peers leave out (the tail past the last full mini-batch), ascending.
    #[getter]
    fn dropped(&self) -> Vec<u32> {
        self.inner.dropped.clone()
    }

    fn __repr__(&self) -> String {
        format!("DpReorder(dp={}, dropped={})", self.inner.partitions.len(), self.inner.dropped.len())
    }
}

/// balance_batch(seqlens, dp, *, minibatch_size=None, backend=None) -> DpReorder; raises
/// verl's/ROLL's builtin exception.
#[pyfunction]
#[pyo3(signature = (seqlens, dp, *, minibatch_size=None, backend=None))]
pub(crate) fn balance_batch(
    py: Python<'_>,
    seqlens: &Bound<'_, PyAny>,
    dp: &Bound<'_, PyAny>,
    minibatch_size: Option<&Bound<'_, PyAny>>,
    backend: Option<BackendArg>,
) -> PyResult<PyDpReorder> {
    let seqlens: Vec<i64> = int_vec(seqlens, "seqlen_list", i64::MIN.into(), i64::MAX.into())?;
    let dp: u32 = int(dp, "dp_size", 0, u32::MAX.into())?;
    let minibatch_size = opt_i64(minibatch_size, "minibatch_size")?;
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.balance_batch(&seqlens, dp, minibatch_size)).map_err(|e| to_py(py, e))? {
        Ok(inner) => Ok(PyDpReorder { inner }),
        Err(e) => Err(peer_error(&e)),
    }
}

/// ROLL's ``load_balance`` micro-batches (the result of :func:`roll_load_balance`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "RollMicroBatches")]
#[derive(Debug)]
pub struct PyRollMicroBatches {
    inner: RollMicroBatches,
}

#[pymethods]
impl PyRollMicroBatches {
    /// The micro-batches in ROLL's yield order.
    #[getter]
    fn micro_batches(&self) -> Vec<Vec<u32>> {
        self.inner.micro_batches.clone()
    }

    /// The raw KK partitions before the reorder (members ascending).
    #[getter]
    fn kk_partitions(&self) -> Vec<Vec<u32>> {
        self.inner.kk_partitions.clone()
    }

    /// The pad factor applied to every length.
    #[getter]
    fn pad_factor(&self) -> i64 {
        self.inner.pad_factor
    }

    /// Every length rounded up to the pad factor.
    #[getter]
    fn padded_lengths(&self) -> Vec<i64> {
        self.inner.padded_lengths.clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "RollMicroBatches(micro_batches={}, pad_factor={})",
            self.inner.micro_batches.len(),
            self.inner.pad_factor
        )
    }
}

/// roll_load_balance(lengths, mask_width, max_packed_sequence_length, *,
/// min_num_micro_batches=None, tp=None, cp=None, vp=None, dp_num_micro_batches=None,
/// backend=None) -> RollMicroBatches (omitted options: ROLL's defaults); raises ROLL's
/// exception.
#[pyfunction]
#[pyo3(signature = (lengths, mask_width, max_packed_sequence_length, *, min_num_micro_batches=None, tp=None, cp=None,
    vp=None, dp_num_micro_batches=None, backend=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn roll_load_balance(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    mask_width: &Bound<'_, PyAny>,
    max_packed_sequence_length: &Bound<'_, PyAny>,
    min_num_micro_batches: Option<&Bound<'_, PyAny>>,
    tp: Option<&Bound<'_, PyAny>>,
    cp: Option<&Bound<'_, PyAny>>,
    vp: Option<&Bound<'_, PyAny>>,
    dp_num_micro_batches: Option<&Bound<'_, PyAny>>,
    backend: Option<BackendArg>,
) -> PyResult<PyRollMicroBatches> {
    let lengths: Vec<i64> = int_vec(lengths, "lengths", i64::MIN.into(), i64::MAX.into())?;
    let (low, high) = (i64::MIN.into(), i64::MAX.into());
    let mask_width: i64 = int(mask_width, "mask_width", low, high)?;
    let max_packed_sequence_length: i64 = int(max_packed_sequence_length, "max_packed_sequence_length", low, high)?;
    let (min_num_micro_batches, tp, cp, vp, dp_num_micro_batches) = (
        opt_i64(min_num_micro_batches, "min_num_micro_batches")?,
        opt_i64(tp, "tp")?,
        opt_i64(cp, "cp")?,
        opt_i64(vp, "vp")?,
        opt_i64(dp_num_micro_batches, "dp_num_micro_batches")?,
    );
    let d = RollLoadBalanceOptions::new(mask_width, max_packed_sequence_length);
    let o = RollLoadBalanceOptions {
        min_num_micro_batches: min_num_micro_batches.unwrap_or(d.min_num_micro_batches),
        tp: tp.unwrap_or(d.tp),
        cp: cp.unwrap_or(d.cp),
        vp: vp.unwrap_or(d.vp),
        dp_num_micro_batches: dp_num_micro_batches.or(d.dp_num_micro_batches),
        ..d
    };
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.roll_load_balance(&lengths, &o)).map_err(|e| to_py(py, e))? {
        Ok(inner) => Ok(PyRollMicroBatches { inner }),
        Err(e) => Err(peer_error(&e)),
    }
}

/// Registers verl's and ROLL's reproductions and their results.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(verl, m)?)?;
    m.add_function(wrap_pyfunction!(log_seqlen_unbalance, m)?)?;
    m.add_function(wrap_pyfunction!(verl_rearrange_micro_batches, m)?)?;
    m.add_function(wrap_pyfunction!(balance_batch, m)?)?;
    m.add_function(wrap_pyfunction!(roll_load_balance, m)?)?;
    m.add_class::<PyDpReorder>()?;
    m.add_class::<PyRollMicroBatches>()
}
