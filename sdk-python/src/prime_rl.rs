//! prime-rl's HEAD packing (kernel interface `prime-rl`): the native functions behind
//! `stowplan.compat.prime_rl`'s `balanced_partition`, `_karmarkar_karp` and
//! `prepare_batch_plan`.

use pyo3::prelude::*;
use stowplan::kernel::prime_rl::BatchOptions;

use crate::{BackendArg, int_vec, kernel, to_py, u32_arg, u64_arg};

/// Defines a pyfunction `(weights, num_partitions, *, backend=None) -> list[list[int]]` named
/// `$py` in Python that runs `Kernel::$method`: prime-rl's two partition functions take the
/// same arguments and check them the same way.
macro_rules! partition_function {
    ($(#[doc = $doc:tt])* $name:ident, $py:tt, $method:ident) => {
        $(#[doc = $doc])*
        #[pyfunction(name = $py)]
        #[pyo3(signature = (weights, num_partitions, *, backend=None))]
        pub fn $name(
            py: Python<'_>,
            weights: &Bound<'_, PyAny>,
            num_partitions: &Bound<'_, PyAny>,
            backend: Option<BackendArg>,
        ) -> PyResult<Vec<Vec<u32>>> {
            let weights: Vec<u64> = int_vec(weights, "weights", 0, u64::MAX.into())?;
            let k = u32_arg(num_partitions, "num_partitions", 1)?;
            let kern = kernel(py, backend)?;
            py.detach(|| kern.$method(&weights, k)).map_err(|e| to_py(py, e))
        }
    };
}

partition_function!(
    /// _prime_rl_karmarkar_karp(weights, num_partitions, *, backend=None) -> list[list[int]]:
    /// prime-rl's ``_karmarkar_karp`` (equal-size Karmarkar–Karp): groups in descending
    /// (total, members) order, members ascending. ``weights`` are integers in 0..=2**64-1;
    /// ``num_partitions`` ≥ 1 must divide their count (``InvalidArgumentError`` otherwise).
    karmarkar_karp,
    "_prime_rl_karmarkar_karp",
    prime_rl_karmarkar_karp
);

partition_function!(
    /// _prime_rl_balanced_partition(weights, num_partitions, *, backend=None) ->
    /// list[list[int]]: prime-rl's ``balanced_partition``: :func:`_prime_rl_karmarkar_karp`,
    /// then its pairwise-swap refinement (members keep their positions). Same arguments.
    balanced_partition,
    "_prime_rl_balanced_partition",
    prime_rl_balanced_partition
);

/// The plan of prime-rl's ``prepare_batch`` (see :func:`_prime_rl_prepare_batch`).
#[pyclass(frozen, module = "stowplan._stowplan", name = "PrimeRlBatchPlan")]
#[derive(Debug)]
pub struct PyPrimeRlBatchPlan {
    /// The bins after splitting (creation order), sample indices in joining order.
    #[pyo3(get)]
    bins: Vec<Vec<u32>>,
    /// Per bin: it holds a multimodal sample.
    #[pyo3(get)]
    multimodal: Vec<bool>,
    /// Per bin: padding tokens, counted in its last sequence.
    #[pyo3(get)]
    padding: Vec<u64>,
    /// Per bin: its cost after padding.
    #[pyo3(get)]
    costs: Vec<u64>,
    /// Per rank: the bins it trains, in order (a dummy names the bin it copies).
    #[pyo3(get)]
    ranks: Vec<Vec<u32>>,
    /// Per rank: whether each entry is a dummy.
    #[pyo3(get)]
    dummies: Vec<Vec<bool>>,
}

#[pymethods]
impl PyPrimeRlBatchPlan {
    fn __repr__(&self) -> String {
        format!("PrimeRlBatchPlan(bins={}, ranks={})", self.bins.len(), self.ranks.len())
    }
}

/// _prime_rl_prepare_batch(lengths, runs, multimodal, labels, *, seq_len, num_train_workers,
/// linear, quadratic, pad_to_multiple_of=1, multimodal_same_run=False, backend=None) ->
/// PrimeRlBatchPlan: the plan of prime-rl's ``prepare_batch`` (559b447; with
/// ``multimodal_same_run``, de80b48's multi-LoRA rule). Per sample: its length (cut to
/// ``seq_len``), run (LoRA index), multimodal class (0: text; samples of one class ≥ 1
/// may share a bin) and label (a bin takes only its first sample's label). Every count
/// argument must be ≥ 1 (``InvalidArgumentError`` naming it otherwise).
#[pyfunction(name = "_prime_rl_prepare_batch")]
#[pyo3(signature = (lengths, runs, multimodal, labels, *, seq_len, num_train_workers, linear, quadratic,
                    pad_to_multiple_of=None, multimodal_same_run=false, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn prepare_batch(
    py: Python<'_>,
    lengths: &Bound<'_, PyAny>,
    runs: &Bound<'_, PyAny>,
    multimodal: &Bound<'_, PyAny>,
    labels: &Bound<'_, PyAny>,
    seq_len: &Bound<'_, PyAny>,
    num_train_workers: &Bound<'_, PyAny>,
    linear: &Bound<'_, PyAny>,
    quadratic: &Bound<'_, PyAny>,
    pad_to_multiple_of: Option<&Bound<'_, PyAny>>,
    multimodal_same_run: bool,
    backend: Option<BackendArg>,
) -> PyResult<PyPrimeRlBatchPlan> {
    let lengths: Vec<u64> = int_vec(lengths, "lengths", 0, u64::MAX.into())?;
    let runs: Vec<u32> = int_vec(runs, "runs", 0, u32::MAX.into())?;
    let multimodal: Vec<u32> = int_vec(multimodal, "multimodal", 0, u32::MAX.into())?;
    let labels: Vec<u32> = int_vec(labels, "labels", 0, u32::MAX.into())?;
    let options = BatchOptions {
        seq_len: u64_arg(seq_len, "seq_len", 1)?,
        num_train_workers: u32_arg(num_train_workers, "num_train_workers", 1)?,
        linear: u64_arg(linear, "linear", 0)?,
        quadratic: u64_arg(quadratic, "quadratic", 0)?,
        pad_to_multiple_of: pad_to_multiple_of.map_or(Ok(1), |m| u64_arg(m, "pad_to_multiple_of", 1))?,
        multimodal_same_run,
    };
    let kern = kernel(py, backend)?;
    let p = py
        .detach(|| kern.prime_rl_prepare_batch(&lengths, &runs, &multimodal, &labels, &options))
        .map_err(|e| to_py(py, e))?;
    Ok(PyPrimeRlBatchPlan {
        bins: p.bins,
        multimodal: p.multimodal,
        padding: p.padding,
        costs: p.costs,
        ranks: p.ranks,
        dummies: p.dummies,
    })
}

/// Adds this module's functions and classes.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(karmarkar_karp, m)?)?;
    m.add_function(wrap_pyfunction!(balanced_partition, m)?)?;
    m.add_function(wrap_pyfunction!(prepare_batch, m)?)?;
    m.add_class::<PyPrimeRlBatchPlan>()?;
    Ok(())
}
