//! `stowplan._stowplan`: the native layer of the Python SDK.
//!
//! Thin by design: it converts numpy arrays to slices (without copying for contiguous
//! `uint64`/`int64` input), calls the Rust host with the GIL released, and hands results back
//! as numpy arrays that own the Rust vectors (no copy). Validation of values happens in the
//! kernel; errors become the exception classes of `stowplan.errors`.

use numpy::{IntoPyArray, PyArray1, PyReadonlyArray1, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use stowplan::{
    Backend, Error, Kernel, OversizePolicy, PackMethod, PackOptions, PartitionMethod, PartitionOptions, PyError,
    UnbalanceError, VerlFunction,
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

fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let class = match e {
        Error::InvalidArgument(_) => "InvalidArgumentError",
        Error::Infeasible(_) => "InfeasibleError",
        Error::Runtime(_) => "KernelRuntimeError",
    };
    raise(py, class, e.to_string())
}

fn invalid(py: Python<'_>, message: String) -> PyErr {
    raise(py, "InvalidArgumentError", message)
}

fn kernel(py: Python<'_>, backend: &str) -> PyResult<Kernel> {
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
enum Lengths<'py> {
    U64(PyReadonlyArray1<'py, u64>),
    I64(PyReadonlyArray1<'py, i64>),
}

impl<'py> Lengths<'py> {
    fn extract(py: Python<'py>, obj: &Bound<'py, PyAny>, name: &str) -> PyResult<Self> {
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

    fn slice(&self) -> &[u64] {
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
        Err(e) => Err(builtin_error(py, PyError::type_name(&e), e.message())),
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
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
