//! `stowplan._stowplan`: the native layer of the Python SDK.
//!
//! Thin by design: it converts numpy arrays to slices (without copying for contiguous
//! `uint64`/`int64` input), calls the Rust host with the GIL released, and hands results back
//! as numpy arrays that own the Rust vectors (no copy). Validation of values happens in the
//! kernel; errors become the exception classes of `stowplan.errors`.

mod filter;
mod layout;
mod packer;
mod plan;
mod source;

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use stowplan::{
    Backend, Cost, DpOptions, DpPlan, Error, FilterError, Kernel, MicroOptions, MicroPlan, Order, OversizePolicy,
    PackMethod, PackOptions, PartitionMethod, PartitionOptions, PyError, RollLoadBalanceOptions, UnbalanceError,
    VerlFunction, VerlMicroOptions,
};

/// Raises the `stowplan.errors` class named `class` with `message`.
fn raise(py: Python<'_>, class: &str, message: String) -> PyErr {
    match py.import("stowplan.errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => match cls.cast_into() {
            Ok(t) => PyErr::from_type(t, message),
            Err(e) => PyTypeError::new_err(format!("stowplan.errors.{class} is not a type ({e}): {message}")),
        },
        Err(e) => e,
    }
}

pub(crate) fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let class = match &e {
        Error::Filter(f) => match f {
            FilterError::Timeout(_) => "FilterTimeoutError",
            FilterError::OutOfFuel(_) => "FilterOutOfFuelError",
            FilterError::MemoryLimit(_) => "FilterMemoryLimitError",
            FilterError::Trap(_) => "FilterTrapError",
            FilterError::InvalidResult(_) => "FilterInvalidResultError",
            FilterError::HashMismatch(_) => "FilterHashMismatchError",
            FilterError::Guest(_) => "FilterGuestError",
            FilterError::Load(_) => "FilterLoadError",
        },
        Error::InvalidArgument(_) => "InvalidArgumentError",
        Error::Infeasible(_) => "InfeasibleError",
        Error::Runtime(_) => "KernelRuntimeError",
        Error::Config(_) => "ConfigError",
        Error::Io(_) => "StowplanIOError",
        Error::CacheMismatch(_) => "CacheMismatchError",
        Error::Timeout(_) => "StowplanTimeoutError",
    };
    raise(py, class, e.to_string())
}

pub(crate) fn invalid(py: Python<'_>, message: String) -> PyErr {
    raise(py, "InvalidArgumentError", message)
}

pub(crate) fn kernel(py: Python<'_>, backend: &str) -> PyResult<Kernel> {
    let backend = match backend {
        "wasm" => Backend::Wasm,
        "native" => Backend::Native,
        other => return Err(invalid(py, format!("backend must be 'wasm' or 'native' (got {other:?})"))),
    };
    // Compiling the component (first call in a process) happens without the GIL.
    py.detach(|| Kernel::new(backend)).map_err(|e| to_py(py, e))
}

/// Lengths/weights as a borrowed numpy array: `uint64`, or `int64` checked non-negative and
/// read as `uint64` (same size and alignment), both without copying.
pub(crate) enum Lengths<'py> {
    U64(PyReadonlyArray1<'py, u64>),
    I64(PyReadonlyArray1<'py, i64>),
}

impl<'py> Lengths<'py> {
    pub(crate) fn extract(py: Python<'py>, obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
        if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, u64>>() {
            return Self::contiguous(py, Lengths::U64(a), name);
        }
        if let Ok(a) = obj.extract::<PyReadonlyArray1<'py, i64>>() {
            let l = Self::contiguous(py, Lengths::I64(a), name)?;
            if let Lengths::I64(a) = &l {
                let s = a.as_slice().map_err(|e| invalid(py, format!("{name}: {e}")))?;
                if let Some((i, v)) = s.iter().enumerate().find(|(_, v)| **v < 0) {
                    return Err(invalid(py, format!("{name}[{i}] = {v} is negative; values must be in 0..=2**64-1")));
                }
            }
            return Ok(l);
        }
        Err(PyTypeError::new_err(format!("{name} must be a one-dimensional uint64 or int64 numpy array")))
    }

    fn contiguous(py: Python<'py>, l: Self, name: &str) -> PyResult<Self> {
        let ok = match &l {
            Lengths::U64(a) => a.is_c_contiguous(),
            Lengths::I64(a) => a.is_c_contiguous(),
        };
        if ok { Ok(l) } else { Err(invalid(py, format!("{name} must be C-contiguous"))) }
    }

    pub(crate) fn slice(&self) -> &[u64] {
        match self {
            Lengths::U64(a) => a.as_slice().unwrap_or(&[]),
            Lengths::I64(a) => {
                let s = a.as_slice().unwrap_or(&[]);
                // SAFETY: i64 and u64 have the same size and alignment, and every value was
                // checked non-negative in `extract`, so each reads as the same number.
                unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u64>(), s.len()) }
            }
        }
    }
}

type PartitionTuple<'py> =
    (Bound<'py, PyArray1<u32>>, Bound<'py, PyArray1<u32>>, Bound<'py, PyArray1<u64>>, u64, u64, u64);

/// partition(weights, k, method, equal_size, refine, backend)
/// -> (offsets, indices, sums, total, spread, lower_bound)
#[pyfunction]
fn partition<'py>(
    py: Python<'py>,
    weights: &Bound<'py, PyAny>,
    k: i64,
    method: &str,
    equal_size: bool,
    refine: bool,
    backend: &str,
) -> PyResult<PartitionTuple<'py>> {
    let method = match method {
        "kk" => PartitionMethod::Kk,
        "greedy" => PartitionMethod::Greedy,
        "verl" => PartitionMethod::Verl,
        other => return Err(invalid(py, format!("method must be 'kk', 'greedy' or 'verl' (got {other:?})"))),
    };
    let k = u32::try_from(k).map_err(|_| invalid(py, format!("k must be in 1..=4294967295 (got {k})")))?;
    let weights = Lengths::extract(py, weights, "weights")?;
    let kernel = kernel(py, backend)?;
    let options = PartitionOptions { method, equal_size, refine };
    let w = weights.slice();
    let p = py.detach(|| kernel.partition(w, k, &options)).map_err(|e| to_py(py, e))?;
    Ok((
        p.offsets.into_pyarray(py),
        p.indices.into_pyarray(py),
        p.sums.into_pyarray(py),
        p.total,
        p.spread,
        p.lower_bound,
    ))
}

type PackTuple<'py> = (
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
    u64,
    u64,
    u64,
    f64,
);

/// pack(lengths, capacity, align, method, oversize, backend)
/// -> (offsets, indices, loads, dropped, single, real_tokens, aligned_tokens, lower_bound,
///     efficiency)
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn pack<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    capacity: i128,
    align: i128,
    method: &str,
    oversize: &str,
    backend: &str,
) -> PyResult<PackTuple<'py>> {
    let method = match method {
        "bfd" => PackMethod::Bfd,
        "ffd" => PackMethod::Ffd,
        "next-fit" | "next_fit" => PackMethod::NextFit,
        other => return Err(invalid(py, format!("method must be 'bfd', 'ffd' or 'next-fit' (got {other:?})"))),
    };
    let oversize = match oversize {
        "error" => OversizePolicy::Error,
        "single" => OversizePolicy::Single,
        "drop" => OversizePolicy::Drop,
        other => return Err(invalid(py, format!("oversize must be 'error', 'single' or 'drop' (got {other:?})"))),
    };
    let capacity = u64::try_from(capacity)
        .map_err(|_| invalid(py, format!("capacity must be in 1..=2**64-1 tokens (got {capacity})")))?;
    let align = u64::try_from(align).map_err(|_| invalid(py, format!("align must be in 1..=2**64-1 (got {align})")))?;
    let lengths = Lengths::extract(py, lengths, "lengths")?;
    let kernel = kernel(py, backend)?;
    let options = PackOptions { capacity, align, method, oversize };
    let l = lengths.slice();
    let p = py.detach(|| kernel.pack(l, &options)).map_err(|e| to_py(py, e))?;
    let efficiency = p.efficiency(l, capacity);
    Ok((
        p.offsets.into_pyarray(py),
        p.indices.into_pyarray(py),
        p.loads.into_pyarray(py),
        p.dropped.into_pyarray(py),
        p.single.into_pyarray(py),
        p.real_tokens,
        p.aligned_tokens,
        p.lower_bound,
        efficiency,
    ))
}

fn builtin_error(py: Python<'_>, type_name: &str, message: &str) -> PyErr {
    match py.import("builtins").and_then(|b| b.getattr(type_name)) {
        Ok(cls) => match cls.cast_into() {
            Ok(t) => PyErr::from_type(t, message.to_string()),
            Err(e) => PyTypeError::new_err(e.to_string()),
        },
        Err(e) => e,
    }
}

/// verl(function, seqlens, k, equal_size, backend) -> list[list[int]]; raises the builtin
/// exception verl raises (AssertionError, IndexError, TypeError, ZeroDivisionError, MemoryError).
#[pyfunction]
fn verl<'py>(
    py: Python<'py>,
    function: &str,
    seqlens: Vec<i64>,
    k: u32,
    equal_size: bool,
    backend: &str,
) -> PyResult<Bound<'py, PyList>> {
    let f = match function {
        "karmarkar_karp" => VerlFunction::KarmarkarKarp,
        "greedy_partition" => VerlFunction::GreedyPartition,
        "get_seqlen_balanced_partitions" => VerlFunction::GetSeqlenBalancedPartitions,
        other => return Err(PyValueError::new_err(format!("unknown verl function {other:?}"))),
    };
    let kernel = kernel(py, backend)?;
    let r = py.detach(|| kernel.verl(f, &seqlens, k, equal_size)).map_err(|e| to_py(py, e))?;
    match r {
        Ok(groups) => PyList::new(py, groups),
        Err(e) => Err(peer_error(py, &e)),
    }
}

/// log_seqlen_unbalance(seqlens, partitions) -> (min, max, balanced_min, balanced_max, total, k)
#[pyfunction]
fn log_seqlen_unbalance(
    py: Python<'_>,
    seqlens: Vec<i64>,
    partitions: Vec<Vec<i64>>,
) -> PyResult<(i128, i128, i128, i128, i128, usize)> {
    match stowplan::verl_log_seqlen_unbalance(&seqlens, &partitions) {
        Ok(u) => Ok((u.min, u.max, u.balanced_min, u.balanced_max, u.total, u.k)),
        Err(UnbalanceError::ZeroDivision(m)) => Err(builtin_error(py, "ZeroDivisionError", &m)),
        Err(UnbalanceError::Value(m)) => Err(builtin_error(py, "ValueError", &m)),
        Err(UnbalanceError::Index(m)) => Err(builtin_error(py, "IndexError", &m)),
    }
}

fn u32_arg(py: Python<'_>, name: &str, v: i64, low: u32) -> PyResult<u32> {
    match u32::try_from(v) {
        Ok(x) if x >= low => Ok(x),
        _ => Err(invalid(py, format!("{name} must be in {low}..=4294967295 (got {v})"))),
    }
}

fn u64_arg(py: Python<'_>, name: &str, v: i128, low: u64) -> PyResult<u64> {
    match u64::try_from(v) {
        Ok(x) if x >= low => Ok(x),
        _ => Err(invalid(py, format!("{name} must be in {low}..=2**64-1 (got {v})"))),
    }
}

fn cost_arg(py: Python<'_>, linear: i128, quadratic: i128) -> PyResult<Cost> {
    Ok(Cost {
        linear: u64_arg(py, "cost linear coefficient", linear, 0)?,
        quadratic: u64_arg(py, "cost quadratic coefficient", quadratic, 0)?,
    })
}

fn order_arg(py: Python<'_>, order: &str) -> PyResult<Order> {
    match order {
        "none" => Ok(Order::None),
        "cost_desc" | "cost-desc" => Ok(Order::CostDesc),
        "verl" => Ok(Order::Verl),
        "roll" => Ok(Order::Roll),
        other => Err(invalid(py, format!("order must be 'none', 'cost_desc', 'verl' or 'roll' (got {other:?})"))),
    }
}

/// Micro-batch options from the Python arguments (validated ranges, named).
#[allow(clippy::too_many_arguments)]
fn micro_arg(
    py: Python<'_>,
    max_token_len: i128,
    cost: Cost,
    min_count: i64,
    divisible_by: i64,
    count: Option<i64>,
    order: &str,
) -> PyResult<MicroOptions> {
    Ok(MicroOptions {
        max_token_len: u64_arg(py, "max_token_len", max_token_len, 1)?,
        cost,
        min_count: u32_arg(py, "min_count", min_count, 0)?,
        divisible_by: u32_arg(py, "divisible_by", divisible_by, 1)?,
        count: count.map(|c| u32_arg(py, "count", c, 1)).transpose()?,
        order: order_arg(py, order)?,
    })
}

type MicroTuple<'py> = (
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u32>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u64>>,
    Bound<'py, PyArray1<u32>>,
    u32,
    u32,
);

fn micro_tuple(py: Python<'_>, p: MicroPlan) -> MicroTuple<'_> {
    (
        p.offsets.into_pyarray(py),
        p.indices.into_pyarray(py),
        p.tokens.into_pyarray(py),
        p.costs.into_pyarray(py),
        p.restore.into_pyarray(py),
        p.lower_bound,
        p.required,
    )
}

type DpTuple<'py> =
    (Bound<'py, PyArray1<u32>>, Bound<'py, PyArray1<u32>>, Bound<'py, PyArray1<u64>>, Bound<'py, PyArray1<u64>>, u64);

fn dp_tuple(py: Python<'_>, p: DpPlan) -> DpTuple<'_> {
    (
        p.offsets.into_pyarray(py),
        p.order.into_pyarray(py),
        p.tokens.into_pyarray(py),
        p.costs.into_pyarray(py),
        p.cost_lower_bound,
    )
}

/// micro_batches(lengths, max_token_len, linear, quadratic, min_count, divisible_by, count,
/// order, backend) -> (offsets, indices, tokens, costs, restore, lower_bound, required)
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn micro_batches<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    max_token_len: i128,
    linear: i128,
    quadratic: i128,
    min_count: i64,
    divisible_by: i64,
    count: Option<i64>,
    order: &str,
    backend: &str,
) -> PyResult<MicroTuple<'py>> {
    let options =
        micro_arg(py, max_token_len, cost_arg(py, linear, quadratic)?, min_count, divisible_by, count, order)?;
    let lengths = Lengths::extract(py, lengths, "lengths")?;
    let kernel = kernel(py, backend)?;
    let l = lengths.slice();
    let p = py.detach(|| kernel.micro_batches(l, &options)).map_err(|e| to_py(py, e))?;
    Ok(micro_tuple(py, p))
}

/// balance(lengths, dp, linear, quadratic, groups, minibatch_size, equal_count,
/// max_token_len, min_count, divisible_by, count, order, backend)
/// -> (dp tuple, list of micro tuples per rank, or None without max_token_len)
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn balance<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    dp: i64,
    linear: i128,
    quadratic: i128,
    groups: Option<PyReadonlyArray1<'py, u32>>,
    minibatch_size: Option<i64>,
    equal_count: bool,
    max_token_len: Option<i128>,
    min_count: i64,
    divisible_by: i64,
    count: Option<i64>,
    order: &str,
    backend: &str,
) -> PyResult<(DpTuple<'py>, Option<Vec<MicroTuple<'py>>>)> {
    let cost = cost_arg(py, linear, quadratic)?;
    let dp = u32_arg(py, "dp", dp, 1)?;
    let minibatch_size = minibatch_size.map(|m| u32_arg(py, "minibatch_size", m, 1)).transpose()?;
    let micro = max_token_len.map(|t| micro_arg(py, t, cost, min_count, divisible_by, count, order)).transpose()?;
    let labels = match &groups {
        Some(g) => Some(g.as_slice().map_err(|e| invalid(py, format!("groups: {e}")))?),
        None => None,
    };
    let lengths = Lengths::extract(py, lengths, "lengths")?;
    let kernel = kernel(py, backend)?;
    let l = lengths.slice();
    let options = DpOptions { cost, groups: labels, minibatch_size, equal_count };
    match micro {
        None => {
            let p = py.detach(|| kernel.balance_dp(l, dp, &options)).map_err(|e| to_py(py, e))?;
            Ok((dp_tuple(py, p), None))
        }
        Some(m) => {
            let p = py.detach(|| kernel.plan(l, dp, &options, &m)).map_err(|e| to_py(py, e))?;
            let ranks = p.ranks.into_iter().map(|r| micro_tuple(py, r)).collect();
            Ok((dp_tuple(py, p.dp), Some(ranks)))
        }
    }
}

fn peer_error(py: Python<'_>, e: &PyError) -> PyErr {
    builtin_error(py, e.type_name(), e.message())
}

/// verl_rearrange_micro_batches(seqlens, max_token_len, min_num_micro_batch,
/// num_batches_divided_by, use_dynamic_bsz_balance, force_group_size, padded_width,
/// dp_num_micro_batches, backend) -> list[list[int]]; raises verl's exception.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn verl_rearrange_micro_batches<'py>(
    py: Python<'py>,
    seqlens: Vec<i64>,
    max_token_len: i64,
    min_num_micro_batch: Option<i64>,
    num_batches_divided_by: Option<i64>,
    use_dynamic_bsz_balance: bool,
    force_group_size: i64,
    padded_width: Option<i64>,
    dp_num_micro_batches: Option<i64>,
    backend: &str,
) -> PyResult<Bound<'py, PyList>> {
    let o = VerlMicroOptions {
        max_token_len,
        min_num_micro_batch,
        num_batches_divided_by,
        use_dynamic_bsz_balance,
        force_group_size,
        padded_width,
        dp_num_micro_batches,
    };
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.verl_rearrange_micro_batches(&seqlens, &o)).map_err(|e| to_py(py, e))? {
        Ok(groups) => PyList::new(py, groups),
        Err(e) => Err(peer_error(py, &e)),
    }
}

/// balance_batch(seqlens, dp, minibatch_size, backend) -> (partitions, kk_partitions, dropped)
#[pyfunction]
fn balance_batch(
    py: Python<'_>,
    seqlens: Vec<i64>,
    dp: u32,
    minibatch_size: Option<i64>,
    backend: &str,
) -> PyResult<(Vec<Vec<u32>>, Vec<Vec<Vec<u32>>>, Vec<u32>)> {
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.balance_batch(&seqlens, dp, minibatch_size)).map_err(|e| to_py(py, e))? {
        Ok(r) => Ok((r.partitions, r.kk_partitions, r.dropped)),
        Err(e) => Err(peer_error(py, &e)),
    }
}

/// roll_load_balance(lengths, mask_width, max_packed_sequence_length, min_num_micro_batches,
/// tp, cp, vp, dp_num_micro_batches, backend)
/// -> (micro_batches, kk_partitions, pad_factor, padded_lengths)
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn roll_load_balance(
    py: Python<'_>,
    lengths: Vec<i64>,
    mask_width: i64,
    max_packed_sequence_length: i64,
    min_num_micro_batches: i64,
    tp: i64,
    cp: i64,
    vp: i64,
    dp_num_micro_batches: Option<i64>,
    backend: &str,
) -> PyResult<(Vec<Vec<u32>>, Vec<Vec<u32>>, i64, Vec<i64>)> {
    let o = RollLoadBalanceOptions {
        mask_width,
        max_packed_sequence_length,
        min_num_micro_batches,
        tp,
        cp,
        vp,
        dp_num_micro_batches,
    };
    let kernel = kernel(py, backend)?;
    match py.detach(|| kernel.roll_load_balance(&lengths, &o)).map_err(|e| to_py(py, e))? {
        Ok(r) => Ok((r.micro_batches, r.kk_partitions, r.pad_factor, r.padded_lengths)),
        Err(e) => Err(peer_error(py, &e)),
    }
}

/// kernel_info() -> dict with the component's sha256 and import list.
#[pyfunction]
fn kernel_info(py: Python<'_>) -> PyResult<(String, Vec<String>)> {
    let imports = py.detach(Kernel::wasm_imports).map_err(|e| to_py(py, e))?;
    Ok((stowplan::KERNEL_WASM_SHA256.trim().to_string(), imports))
}

/// The native module.
#[pymodule]
fn _stowplan(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(partition, m)?)?;
    m.add_function(wrap_pyfunction!(pack, m)?)?;
    m.add_function(wrap_pyfunction!(verl, m)?)?;
    m.add_function(wrap_pyfunction!(log_seqlen_unbalance, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_info, m)?)?;
    m.add_function(wrap_pyfunction!(micro_batches, m)?)?;
    m.add_function(wrap_pyfunction!(balance, m)?)?;
    m.add_function(wrap_pyfunction!(verl_rearrange_micro_batches, m)?)?;
    m.add_function(wrap_pyfunction!(balance_batch, m)?)?;
    m.add_function(wrap_pyfunction!(roll_load_balance, m)?)?;
    layout::register(m)?;
    packer::register(m)?;
    plan::register(m)?;
    source::register(m)?;
    filter::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
