//! Native help for `stowplan.arrow`: gathering runs of a column's flat values into the packed
//! order, one copy per run without a Python object per run.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::invalid;

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

/// Copies the runs, checked by [`check_runs`], one after the other into `out`.
fn fill<T: Copy>(out: &mut [T], chunks: &[&[T]], which: &[i64], starts: &[i64], lengths: &[i64]) {
    let mut at = 0;
    for ((&c, &s), &l) in which.iter().zip(starts).zip(lengths) {
        let (s, l) = (s as usize, l as usize);
        out[at..at + l].copy_from_slice(&chunks[c as usize][s..s + l]);
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
                        let mut rw = out.readwrite();
                        let dst = rw.as_slice_mut()?;
                        py.detach(|| fill(dst, &slices, which, starts, lengths));
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
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_runs, fill};

    fn gather(chunks: &[&[i32]], which: &[i64], starts: &[i64], lengths: &[i64]) -> Result<Vec<i32>, String> {
        let mut out = vec![0; check_runs(chunks, which, starts, lengths)?];
        fill(&mut out, chunks, which, starts, lengths);
        Ok(out)
    }

    #[test]
    fn runs_are_copied_in_order_and_bad_runs_are_named() {
        let (a, b) = ([1, 2, 3, 4], [10, 20]);
        assert_eq!(gather(&[&a[..], &b[..]], &[1, 0, 0], &[0, 2, 0], &[2, 2, 1]).unwrap(), [10, 20, 3, 4, 1]);
        assert!(gather(&[&a[..]], &[0], &[3], &[2]).unwrap_err().contains("run 0 (chunk 0, start 3, length 2)"));
        assert!(gather(&[&a[..]], &[1], &[0], &[1]).unwrap_err().contains("outside its chunk"));
        assert!(gather(&[&a[..]], &[0], &[-1], &[1]).unwrap_err().contains("outside"));
        assert!(gather(&[&a[..]], &[0], &[0], &[-1]).unwrap_err().contains("outside"));
        assert!(gather(&[&a[..]], &[0, 0], &[0], &[1]).unwrap_err().contains("one entry per run"));
    }
}
