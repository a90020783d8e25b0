//! Native help for `stowplan.arrow`: the host's packed rows of a table (which runs of the flat
//! values make each packed row: `stowplan::pack_rows`, the strategies and overflow policies
//! the CLI's `pack-dataset` applies too), and gathering runs of a column's flat values into
//! the packed order, one copy per run without a Python object per run.

use std::mem::MaybeUninit;

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyList;
use stowplan::rows::{Overflow, RowPacking};

use crate::{BackendArg, Lengths, int_vec, invalid, kernel, opt_str, to_py, u64_arg};

/// Two `int64` arrays (items' starts and lengths).
type Int64Pair<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>);
/// Three `int64` arrays (items' starts and lengths, rows' offsets).
type Int64Triple<'py> = (Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>, Bound<'py, PyArray1<i64>>);

/// The items of packed rows as numpy `int64` arrays (what `stowplan.arrow`'s numpy code
/// indexes with; every value is below 2**63, checked by the host).
fn int64s<'py, T: Into<u64>>(py: Python<'py>, values: Vec<T>) -> Bound<'py, PyArray1<i64>> {
    PyArray1::from_vec(py, values.into_iter().map(|v| v.into() as i64).collect())
}

/// The `(strategy, overflow)` pair given to :func:`stowplan.arrow.pack_table`, a strategy
/// that is not a string named in the error like an unknown one.
fn row_packing_of(strategy: &Bound<'_, PyAny>, overflow: Option<&Bound<'_, PyAny>>) -> PyResult<RowPacking> {
    let py = strategy.py();
    let Ok(name) = strategy.extract::<String>() else {
        let choices = stowplan::rows::RowStrategy::choices();
        return Err(invalid(py, format!("strategy must be {choices} (got {})", strategy.repr()?)));
    };
    let overflow = match overflow.filter(|o| !o.is_none()) {
        Some(o) if o.extract::<String>().is_err() => {
            let choices = Overflow::choices();
            return Err(invalid(py, format!("overflow must be {choices} (got {})", o.repr()?)));
        }
        o => opt_str(o, "overflow")?,
    };
    RowPacking::parse(&name, overflow.as_deref()).map_err(|e| to_py(py, e))
}

/// row_packing(strategy, overflow) -> (str, str | None): the strategy's name (``next_fit``
/// read as ``next-fit``) and its overflow policy (``None`` for ``wrapped``), checked together
/// by the host (`stowplan::rows::RowPacking::parse`). Errors: `InvalidArgumentError` naming the
/// argument and what it may be.
#[pyfunction]
#[pyo3(signature = (strategy, overflow=None))]
fn row_packing(strategy: &Bound<'_, PyAny>, overflow: Option<&Bound<'_, PyAny>>) -> PyResult<(String, Option<String>)> {
    let p = row_packing_of(strategy, overflow)?;
    Ok((p.strategy().to_string(), p.overflow().map(|o| o.to_string())))
}

/// pack_rows(lengths, capacity, strategy, overflow=None, column="", backend=None)
/// -> (starts, lengths, offsets): rows of ``lengths`` tokens (their values one after the
/// other) packed into rows of at most ``capacity`` tokens by the host's
/// `stowplan::pack_rows`: packed row ``r`` is the items ``offsets[r]:offsets[r+1]``, item
/// ``i`` the ``lengths[i]`` values from ``starts[i]`` (``int64`` arrays). Errors name
/// ``column`` and the row: ``InfeasibleError`` for a long row under ``overflow="error"``,
/// ``InvalidArgumentError`` otherwise.
#[pyfunction]
#[pyo3(signature = (lengths, capacity, strategy, overflow=None, column="", backend=None))]
fn pack_rows<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    capacity: &Bound<'py, PyAny>,
    strategy: &Bound<'py, PyAny>,
    overflow: Option<&Bound<'py, PyAny>>,
    column: &str,
    backend: Option<BackendArg>,
) -> PyResult<Int64Triple<'py>> {
    let packing = row_packing_of(strategy, overflow)?;
    let capacity = u64_arg(capacity, "capacity", 1)?;
    let backend = BackendArg::or_default(backend);
    let lengths = Lengths::extract(lengths, "lengths")?;
    let l = lengths.slice();
    let rows = py.detach(|| stowplan::pack_rows(backend, l, capacity, packing, column)).map_err(|e| to_py(py, e))?;
    Ok((int64s(py, rows.starts), int64s(py, rows.lengths), int64s(py, rows.offsets)))
}

/// row_items(lengths, capacity, overflow, column="", row0=0) -> (starts, lengths): the
/// items of rows of ``lengths`` tokens under ``overflow``, in row order (the host's
/// `stowplan::rows::row_items`), as ``int64`` arrays; errors number rows from ``row0``.
#[pyfunction]
#[pyo3(signature = (lengths, capacity, overflow, column="", row0=0))]
fn row_items<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    capacity: &Bound<'py, PyAny>,
    overflow: &str,
    column: &str,
    row0: u64,
) -> PyResult<Int64Pair<'py>> {
    let overflow: Overflow = overflow.parse().map_err(|e| to_py(py, e))?;
    let capacity = u64_arg(capacity, "capacity", 1)?;
    let lengths = Lengths::extract(lengths, "lengths")?;
    let l = lengths.slice();
    let items =
        py.detach(|| stowplan::rows::row_items(l, capacity, overflow, column, row0)).map_err(|e| to_py(py, e))?;
    Ok((int64s(py, items.starts), int64s(py, items.lengths)))
}

/// packed_batches(row_tokens, max_tokens) -> numpy int64 array: where the record batches of
/// packed rows end (``row_tokens``: the tokens before each row, and the total),
/// ``[0, r1, …, rows]``: at most ``max_tokens`` tokens each (``PACKED_BATCH_TOKENS``), or one
/// longer row (the host's `stowplan::rows::packed_batches`).
#[pyfunction]
fn packed_batches<'py>(
    py: Python<'py>,
    row_tokens: &Bound<'py, PyAny>,
    max_tokens: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let max_tokens = u64_arg(max_tokens, "max_tokens", 1)?;
    let row_tokens = Lengths::extract(row_tokens, "row_tokens")?;
    let t = row_tokens.slice();
    if t.windows(2).any(|w| w[0] > w[1]) {
        return Err(invalid(py, "row_tokens must not decrease".into()));
    }
    let ends = py.detach(|| stowplan::rows::packed_batches(t, max_tokens));
    Ok(int64s(py, ends.into_iter().map(|e| e as u64).collect()))
}

/// check_row_lengths(lengths, column="", row0=0): refuses (`InvalidArgumentError`) a row
/// longer than a plan takes (2**32-1), naming ``column`` and the row numbered from ``row0``.
#[pyfunction]
#[pyo3(signature = (lengths, column="", row0=0))]
fn check_row_lengths(py: Python<'_>, lengths: &Bound<'_, PyAny>, column: &str, row0: u64) -> PyResult<()> {
    let lengths = Lengths::extract(lengths, "lengths")?;
    stowplan::rows::check_row_lengths(lengths.slice(), column, row0).map_err(|e| to_py(py, e))
}

/// wrapped_rows(lengths, capacity) -> (starts, lengths, offsets): every token of rows of
/// ``lengths`` tokens cut into rows of ``capacity`` (the host's `stowplan::rows::wrapped_rows`).
#[pyfunction]
fn wrapped_rows<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    capacity: &Bound<'py, PyAny>,
) -> PyResult<Int64Triple<'py>> {
    let capacity = u64_arg(capacity, "capacity", 1)?;
    let lengths = Lengths::extract(lengths, "lengths")?;
    let l = lengths.slice();
    let rows = py.detach(|| stowplan::rows::wrapped_rows(l, capacity)).map_err(|e| to_py(py, e))?;
    Ok((int64s(py, rows.starts), int64s(py, rows.lengths), int64s(py, rows.offsets)))
}

/// trl_bfd(lengths, batch_ends, seq_length, backend=None) -> (offsets, indices): TRL's best
/// fit decreasing map batch by map batch (the kernel's `trl.bfd`, which
/// :mod:`stowplan.compat.trl` packs with): batch ``j`` is the sequences from
/// ``batch_ends[j-1]`` (0 for the first) to before ``batch_ends[j]``; bin ``b`` is
/// ``indices[offsets[b]:offsets[b+1]]`` (``int64`` arrays), members in the order they went in. Errors: `InvalidArgumentError` for a length outside
/// ``1..=seq_length`` or ``batch_ends`` that are not the batches' ends.
#[pyfunction]
#[pyo3(signature = (lengths, batch_ends, seq_length, backend=None))]
fn trl_bfd<'py>(
    py: Python<'py>,
    lengths: &Bound<'py, PyAny>,
    batch_ends: &Bound<'py, PyAny>,
    seq_length: &Bound<'py, PyAny>,
    backend: Option<BackendArg>,
) -> PyResult<Int64Pair<'py>> {
    let seq_length = u64_arg(seq_length, "seq_length", 1)?;
    let lengths = Lengths::extract(lengths, "lengths")?;
    let batch_ends: Vec<u32> = int_vec(batch_ends, "batch_ends", 0, u32::MAX.into())?;
    let k = kernel(py, backend)?;
    let l = lengths.slice();
    let (offsets, indices) = py.detach(|| k.trl_bfd(l, &batch_ends, seq_length)).map_err(|e| to_py(py, e))?;
    Ok((int64s(py, offsets), int64s(py, indices)))
}

/// The number of values of the runs `(chunk, start, length)` of `chunks`, every run checked.
/// Errors (as text) name the run that points outside its chunk or has a negative start or
/// length.
fn check_runs<T>(chunks: &[&[T]], which: &[i64], starts: &[i64], lengths: &[i64]) -> Result<usize, String> {
    if which.len() != starts.len() || starts.len() != lengths.len() {
        return Err(format!(
            "run_chunks, run_starts and run_lengths must have one entry per run (got {}, {} and {})",
            which.len(),
            starts.len(),
            lengths.len()
        ));
    }
    let mut total = 0usize;
    for (i, ((&c, &s), &l)) in which.iter().zip(starts).zip(lengths).enumerate() {
        let inside = usize::try_from(c)
            .ok()
            .and_then(|c| chunks.get(c))
            .zip(usize::try_from(s).ok().zip(usize::try_from(l).ok()))
            .is_some_and(|(chunk, (s, l))| s.checked_add(l).is_some_and(|e| e <= chunk.len()));
        if !inside {
            return Err(format!(
                "run {i} (chunk {c}, start {s}, length {l}) is outside its chunk ({} chunks)",
                chunks.len()
            ));
        }
        total += l as usize;
    }
    Ok(total)
}

/// Below this many bytes [`fill`] copies on one thread.
const PARALLEL_FILL_BYTES: usize = 32 << 20;

/// Copies the runs, checked by [`check_runs`], one after the other into `out` (fresh memory:
/// every element written once): a large copy on every core (the runs split in shares of
/// about equal size, each share's part of `out` its own), since the time is page faults and
/// memory traffic, not the loop.
fn fill<T: Copy + Send + Sync>(
    out: &mut [MaybeUninit<T>],
    chunks: &[&[T]],
    which: &[i64],
    starts: &[i64],
    lengths: &[i64],
) {
    if std::mem::size_of_val(out) < PARALLEL_FILL_BYTES {
        return fill_one(out, chunks, which, starts, lengths);
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if threads < 2 {
        return fill_one(out, chunks, which, starts, lengths);
    }
    let share = out.len().div_ceil(threads);
    // The shares (each its runs and its part of `out`), taken from one queue by this thread
    // and by helpers; a helper that cannot be started (a process limit) leaves its shares to
    // the others.
    let mut shares = Vec::new();
    let (mut rest, mut run) = (out, 0);
    while run < lengths.len() {
        // Up to about `share` values (at least one run).
        let first = run;
        let mut n = 0;
        while run < lengths.len() && (n == 0 || n + (lengths[run] as usize) <= share) {
            n += lengths[run] as usize;
            run += 1;
        }
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(n);
        rest = tail;
        shares.push((mine, &which[first..run], &starts[first..run], &lengths[first..run]));
    }
    let queue = std::sync::Mutex::new(shares);
    let work = || {
        while let Some((out, w, s, l)) = queue.lock().ok().and_then(|mut q| q.pop()) {
            fill_one(out, chunks, w, s, l);
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            if std::thread::Builder::new().spawn_scoped(scope, work).is_err() {
                break;
            }
        }
        work();
    });
}

/// [`fill`] on this thread.
fn fill_one<T: Copy>(out: &mut [MaybeUninit<T>], chunks: &[&[T]], which: &[i64], starts: &[i64], lengths: &[i64]) {
    let mut at = 0;
    for ((&c, &s), &l) in which.iter().zip(starts).zip(lengths) {
        let (s, l) = (s as usize, l as usize);
        out[at..at + l].write_copy_of_slice(&chunks[c as usize][s..s + l]);
        at += l;
    }
}

/// gather_runs(chunks, run_chunks, run_starts, run_lengths) -> numpy array or None: the runs
/// (`run_lengths[i]` values from `run_starts[i]` of `chunks[run_chunks[i]]`) one after the
/// other, as one new array of the chunks' dtype; `None` when that dtype is not one of the
/// integer or float32/float64 types (the caller then gathers another way). The copying runs
/// without the GIL.
///
/// Errors: `InvalidArgumentError` naming a run outside its chunk, run arrays of different
/// lengths, chunks of different dtypes.
#[pyfunction]
fn gather_runs<'py>(
    py: Python<'py>,
    chunks: &Bound<'py, PyList>,
    run_chunks: PyReadonlyArray1<'py, i64>,
    run_starts: PyReadonlyArray1<'py, i64>,
    run_lengths: PyReadonlyArray1<'py, i64>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let (which, starts, lengths) = (run_chunks.as_slice()?, run_starts.as_slice()?, run_lengths.as_slice()?);
    macro_rules! by_dtype {
        ($($t:ty),*) => {$(
            if let Some(first) = chunks.iter().next() {
                if first.extract::<PyReadonlyArray1<'py, $t>>().is_ok() {
                    let arrays = chunks
                        .iter()
                        .map(|c| c.extract::<PyReadonlyArray1<'py, $t>>())
                        .collect::<PyResult<Vec<_>>>()
                        .map_err(|_| invalid(py, "chunks must all have the same dtype".into()))?;
                    let slices = arrays.iter().map(|a| a.as_slice()).collect::<Result<Vec<_>, _>>()?;
                    let total = check_runs(&slices, which, starts, lengths).map_err(|m| invalid(py, m))?;
                    // numpy's allocator (large arrays on huge pages) rather than a Vec: the
                    // page faults of a fresh gigabyte otherwise cost more than the copy.
                    // SAFETY: every element is written by `fill` before the array is returned
                    // (the runs cover 0..total, checked above).
                    let out = unsafe { PyArray1::<$t>::new(py, [total], false) };
                    {
                        let rw = out.readwrite(); // (the borrow flag: nothing else reads it meanwhile)
                        // SAFETY: the array's own fresh, contiguous `total` elements, seen as
                        // not yet initialised while `fill` writes each of them once.
                        let dst = unsafe { std::slice::from_raw_parts_mut(out.data().cast::<MaybeUninit<$t>>(), total) };
                        py.detach(|| fill(dst, &slices, which, starts, lengths));
                        drop(rw);
                    }
                    return Ok(Some(out.into_any()));
                }
            }
        )*};
    }
    by_dtype!(i32, i64, u32, u64, i16, u16, i8, u8, f32, f64);
    if chunks.is_empty() {
        return Err(invalid(py, "chunks must hold at least one array".into()));
    }
    Ok(None)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gather_runs, m)?)?;
    m.add_function(wrap_pyfunction!(row_packing, m)?)?;
    m.add_function(wrap_pyfunction!(pack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(row_items, m)?)?;
    m.add_function(wrap_pyfunction!(wrapped_rows, m)?)?;
    m.add_function(wrap_pyfunction!(check_row_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(packed_batches, m)?)?;
    m.add_function(wrap_pyfunction!(trl_bfd, m)?)?;
    m.add("SEQ_LENGTHS", stowplan::rows::SEQ_LENGTHS)?;
    m.add("POSITION_IDS", stowplan::rows::POSITION_IDS)?;
    let strategies: Vec<&str> = stowplan::rows::RowStrategy::ALL.iter().map(|s| s.name()).collect();
    m.add("ROW_STRATEGIES", strategies)?;
    m.add("OVERFLOWS", Overflow::ALL.iter().map(|o| o.name()).collect::<Vec<_>>())?;
    m.add("DEFAULT_OVERFLOW", Overflow::default().name())?;
    m.add("MAX_ROW_LENGTH", stowplan::rows::MAX_ROW_LENGTH)?;
    m.add("MAX_CAPACITY", stowplan::rows::MAX_CAPACITY)?;
    m.add("PACKED_BATCH_TOKENS", stowplan::rows::PACKED_BATCH_TOKENS)?;
    Ok(())
}
