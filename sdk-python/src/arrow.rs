//! Native help for `stowplan.arrow`: the host's packed rows of a table (which runs of the flat
//! values make each packed row: `stowplan::pack_rows`, the strategies and overflow policies
//! the CLI's `pack-dataset` applies too), and their assembly (`stowplan-arrow`, the
//! CLI's code) on pyarrow's own buffers through the Arrow C Data Interface (the PyCapsule
//! protocol: `__arrow_c_stream__`, `__arrow_c_array__`, `__arrow_c_schema__`): a table in, a
//! stream of packed record batches out, no copy but the packed values'.

use arrow_array::ffi::{FFI_ArrowArray, FFI_ArrowSchema, from_ffi};
use arrow_array::ffi_stream::{ArrowArrayStreamReader, FFI_ArrowArrayStream};
use arrow_data::ArrayData;
use arrow_schema::DataType;
use numpy::PyArray1;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyList};
use stowplan::rows::{Overflow, PackedRows, RowPacking};
use stowplan_arrow::{ListColumns, PackedBatches, Values, assemble, select};

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

/// What `obj`'s Arrow PyCapsule `method` returns (the object keeps the capsules alive while
/// they are read); an object without it is refused as not `expected`, naming `what`.
fn exported<'py>(obj: &Bound<'py, PyAny>, method: &str, what: &str, expected: &str) -> PyResult<Bound<'py, PyAny>> {
    if !obj.hasattr(method)? {
        let got = obj.get_type().name()?;
        return Err(invalid(obj.py(), format!("{what} must be {expected} (got {got})")));
    }
    obj.call_method0(method)
}

/// The Arrow C stream of `obj` (its `__arrow_c_stream__`: a pyarrow `Table`, a
/// `RecordBatchReader`, …), as arrow-rs reads it; `what` names the argument in the refusal of
/// anything else.
fn import_stream(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<ArrowArrayStreamReader> {
    let py = obj.py();
    let capsule = exported(obj, "__arrow_c_stream__", what, "a pyarrow.Table or RecordBatch")?;
    let capsule = capsule.cast::<PyCapsule>()?;
    let ptr = capsule.pointer_checked(Some(c"arrow_array_stream"))?;
    // SAFETY: a capsule named "arrow_array_stream" holds an `ArrowArrayStream` (the Arrow
    // PyCapsule interface); `from_raw` moves it out, leaving the capsule's released.
    let stream = unsafe { FFI_ArrowArrayStream::from_raw(ptr.as_ptr().cast()) };
    ArrowArrayStreamReader::try_new(stream).map_err(|e| invalid(py, format!("{what}: {e}")))
}

/// The Arrow data of `obj` (its `__arrow_c_array__`: a pyarrow `Array`), checked (its
/// buffers' sizes and offsets) before any value is read.
fn import_array(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<ArrayData> {
    let py = obj.py();
    let (schema, array): (Bound<'_, PyAny>, Bound<'_, PyAny>) =
        exported(obj, "__arrow_c_array__", what, "a pyarrow.Array")?.extract()?;
    let schema = schema.cast::<PyCapsule>()?.pointer_checked(Some(c"arrow_schema"))?;
    let array = array.cast::<PyCapsule>()?.pointer_checked(Some(c"arrow_array"))?;
    // SAFETY: capsules so named hold an `ArrowSchema` and an `ArrowArray` (the Arrow
    // PyCapsule interface); the array is moved out (its capsule's left released), the schema
    // read in place while its capsule lives.
    let data = unsafe {
        let array = FFI_ArrowArray::from_raw(array.as_ptr().cast());
        from_ffi(array, &*schema.as_ptr().cast::<FFI_ArrowSchema>())
    }
    .and_then(|d| d.validate_data().map(|()| d))
    .map_err(|e| invalid(py, format!("{what}: {e}")))?;
    Ok(data)
}

/// The Arrow type of `obj` (its `__arrow_c_schema__`: a pyarrow `DataType` or `Field`).
fn import_type(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<DataType> {
    let py = obj.py();
    let schema = import_schema(obj, what)?;
    DataType::try_from(&schema).map_err(|e| invalid(py, format!("{what}: {e}")))
}

/// The Arrow schema of `obj` (its `__arrow_c_schema__`: a pyarrow `Schema`, `DataType` or
/// `Field`), moved out of its capsule.
fn import_schema(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<FFI_ArrowSchema> {
    let capsule = exported(obj, "__arrow_c_schema__", what, "a pyarrow type or schema")?;
    let ptr = capsule.cast::<PyCapsule>()?.pointer_checked(Some(c"arrow_schema"))?;
    // SAFETY: a capsule named "arrow_schema" holds an `ArrowSchema`; moved out (its
    // capsule's left released, as the interface's consumers do).
    Ok(unsafe { FFI_ArrowSchema::from_raw(ptr.as_ptr().cast()) })
}

/// Packed rows as an Arrow C stream (`__arrow_c_stream__`, what
/// ``pyarrow.RecordBatchReader.from_stream`` reads): each record batch assembled by the host
/// when it is read. Read once.
#[pyclass(module = "stowplan._stowplan", name = "PackedStream")]
struct PackedStream {
    batches: Option<PackedBatches>,
}

#[pymethods]
impl PackedStream {
    /// The stream as a PyCapsule (``requested_schema`` is not honoured: the packed schema is
    /// the only one). Errors: `InvalidArgumentError` when it was read already.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_stream__<'py>(
        &mut self,
        py: Python<'py>,
        requested_schema: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = requested_schema;
        let batches = self.batches.take().ok_or_else(|| invalid(py, "the packed stream was read already".into()))?;
        PyCapsule::new_with_value(py, FFI_ArrowArrayStream::new(Box::new(batches)), c"arrow_array_stream")
    }

    /// The number of packed rows in the stream (0 once read).
    fn __len__(&self) -> usize {
        self.batches.as_ref().map_or(0, PackedBatches::rows)
    }
}

/// `columns` as the host takes them: `None` or a list of names.
fn column_names(columns: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Vec<String>>> {
    let Some(c) = columns.filter(|c| !c.is_none()) else { return Ok(None) };
    let py = c.py();
    let bad = || -> PyResult<PyErr> {
        Ok(invalid(py, format!("columns must be a list of column names (got {})", c.repr()?)))
    };
    if c.cast::<pyo3::types::PyString>().is_ok() {
        return Err(bad()?);
    }
    match c.extract::<Vec<String>>() {
        Ok(names) => Ok(Some(names)),
        Err(_) => Err(bad()?),
    }
}

/// The picked columns of the record batches of `reader`, every batch checked.
fn take_columns(
    py: Python<'_>,
    reader: ArrowArrayStreamReader,
    columns: Option<&[String]>,
    position_ids: bool,
    row0: u64,
) -> PyResult<ListColumns> {
    use arrow_array::RecordBatchReader;
    let schema = reader.schema();
    let picked = select(&schema, columns, position_ids, "columns").map_err(|e| to_py(py, e))?;
    let mut taken = ListColumns::new(&schema, picked, row0).map_err(|e| to_py(py, e))?;
    py.detach(|| {
        for batch in reader {
            let reading =
                |e: arrow_schema::ArrowError| stowplan::Error::InvalidArgument(format!("reading the table: {e}"));
            let batch = batch.map_err(reading)?;
            // The buffers came from another library: their sizes and offsets are checked
            // before any value is read through them.
            for &i in taken.picked() {
                batch.column(i).to_data().validate_data().map_err(reading)?;
            }
            taken.push(&batch)?;
        }
        Ok(())
    })
    .map_err(|e| to_py(py, e))?;
    Ok(taken)
}

/// pack_table(table, capacity, strategy, *, overflow=None, columns=None, position_ids=False,
/// backend=None) -> (PackedStream, digest): the rows of ``table`` (anything with
/// ``__arrow_c_stream__``: a ``pyarrow.Table``) packed as :func:`stowplan.arrow.pack_table`
/// packs them, in one call: the columns checked and read, the plan made (``pack_rows``) and
/// the packed rows assembled by the host (``stowplan-arrow``, the CLI's
/// ``pack-dataset`` code), without a copy of the input; ``digest`` is the sha256 of the
/// options and the plan (for fingerprints). Errors: `InvalidArgumentError` naming the
/// argument, column and row; `InfeasibleError` for a long row under ``overflow="error"``.
#[pyfunction]
#[pyo3(signature = (table, capacity, strategy, *, overflow=None, columns=None, position_ids=false, backend=None))]
#[allow(clippy::too_many_arguments)]
fn pack_table(
    py: Python<'_>,
    table: &Bound<'_, PyAny>,
    capacity: &Bound<'_, PyAny>,
    strategy: &Bound<'_, PyAny>,
    overflow: Option<&Bound<'_, PyAny>>,
    columns: Option<&Bound<'_, PyAny>>,
    position_ids: bool,
    backend: Option<BackendArg>,
) -> PyResult<(PackedStream, String)> {
    let capacity = u64_arg(capacity, "capacity", 1)?;
    stowplan::rows::check_capacity(capacity).map_err(|e| to_py(py, e))?;
    let packing = row_packing_of(strategy, overflow)?;
    let columns = column_names(columns)?;
    let backend = BackendArg::or_default(backend);
    let reader = import_stream(table, "table")?;
    let taken = take_columns(py, reader, columns.as_deref(), position_ids, 0)?;
    let (lengths, values) = taken.finish().map_err(|e| to_py(py, e))?;
    let first = values.names()[0].clone();
    let rows =
        py.detach(|| stowplan::pack_rows(backend, &lengths, capacity, packing, &first)).map_err(|e| to_py(py, e))?;
    let mut hashed = format!(
        "{capacity} {} {:?} {:?} {position_ids}\n",
        packing.strategy(),
        packing.overflow().map(|o| o.name()),
        values.names()
    )
    .into_bytes();
    for a in [&rows.starts, &rows.lengths, &rows.offsets] {
        hashed.extend(a.iter().flat_map(|v| v.to_le_bytes()));
    }
    let digest = stowplan::runtime::sha256_hex(&hashed);
    let batches = assemble(values, rows, position_ids).map_err(|e| to_py(py, e))?;
    Ok((PackedStream { batches: Some(batches) }, digest))
}

/// assemble_rows(names, types, chunks, starts, lengths, offsets, *, position_ids=False)
/// -> PackedStream: packed row ``r`` the items ``offsets[r]:offsets[r+1]``, item ``i`` the
/// ``lengths[i]`` values from ``starts[i]`` of every column's flat values (column ``c``:
/// ``names[c]``, of list type ``types[c]``, its values the pyarrow arrays ``chunks[c]`` one
/// after the other), assembled by the host as :func:`pack_table` assembles them (the items
/// of :func:`stowplan.arrow.pack_batches`, :mod:`stowplan.ray` and :mod:`stowplan.compat.trl`).
/// Errors: `InvalidArgumentError` for an item outside the values, offsets that are not
/// packed rows', chunks of another type than their list's values.
#[pyfunction]
#[pyo3(signature = (names, types, chunks, starts, lengths, offsets, *, position_ids=false))]
#[allow(clippy::too_many_arguments)]
fn assemble_rows(
    py: Python<'_>,
    names: Vec<String>,
    types: &Bound<'_, PyList>,
    chunks: &Bound<'_, PyList>,
    starts: &Bound<'_, PyAny>,
    lengths: &Bound<'_, PyAny>,
    offsets: &Bound<'_, PyAny>,
    position_ids: bool,
) -> PyResult<PackedStream> {
    let types = types.iter().map(|t| import_type(&t, "types")).collect::<PyResult<Vec<_>>>()?;
    let mut data = Vec::with_capacity(chunks.len());
    for (c, column) in chunks.iter().enumerate() {
        let column =
            column.cast::<PyList>().map_err(|_| invalid(py, format!("chunks[{c}] must be a list of arrays")))?;
        data.push(column.iter().map(|a| import_array(&a, "chunks")).collect::<PyResult<Vec<_>>>()?);
    }
    let values = Values::new(names, types, data).map_err(|e| to_py(py, e))?;
    let rows = PackedRows {
        starts: Lengths::extract(starts, "starts")?.slice().to_vec(),
        lengths: Lengths::extract(lengths, "lengths")?.slice().to_vec(),
        offsets: Lengths::extract(offsets, "offsets")?.slice().to_vec(),
    };
    let batches = py.detach(|| assemble(values, rows, position_ids)).map_err(|e| to_py(py, e))?;
    Ok(PackedStream { batches: Some(batches) })
}

/// check_columns(schema, columns=None, position_ids=False) -> list[str]: the list columns of
/// ``schema`` (a ``pyarrow.Schema``) to pack, checked by the host (``columns``: default every
/// column). Errors: `InvalidArgumentError` naming the column.
#[pyfunction]
#[pyo3(signature = (schema, columns=None, position_ids=false))]
fn check_columns(
    py: Python<'_>,
    schema: &Bound<'_, PyAny>,
    columns: Option<&Bound<'_, PyAny>>,
    position_ids: bool,
) -> PyResult<Vec<String>> {
    let ffi = import_schema(schema, "schema")?;
    let schema = arrow_schema::Schema::try_from(&ffi).map_err(|e| invalid(py, format!("schema: {e}")))?;
    let columns = column_names(columns)?;
    let picked = select(&schema, columns.as_deref(), position_ids, "columns").map_err(|e| to_py(py, e))?;
    Ok(picked.into_iter().map(|i| schema.field(i).name().clone()).collect())
}

/// column_lengths(table, columns, row0=0) -> numpy int64 array: the rows' lengths of
/// ``table``'s list ``columns`` (the first one's), every row checked as :func:`pack_table`
/// checks it (errors number rows from ``row0``), no value read.
#[pyfunction]
#[pyo3(signature = (table, columns, row0=0))]
fn column_lengths<'py>(
    py: Python<'py>,
    table: &Bound<'py, PyAny>,
    columns: &Bound<'py, PyAny>,
    row0: u64,
) -> PyResult<Bound<'py, PyArray1<i64>>> {
    let columns = column_names(Some(columns))?;
    let reader = import_stream(table, "table")?;
    let taken = take_columns(py, reader, columns.as_deref(), false, row0)?;
    Ok(int64s(py, taken.lengths().to_vec()))
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PackedStream>()?;
    m.add_function(wrap_pyfunction!(pack_table, m)?)?;
    m.add_function(wrap_pyfunction!(assemble_rows, m)?)?;
    m.add_function(wrap_pyfunction!(check_columns, m)?)?;
    m.add_function(wrap_pyfunction!(column_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(row_packing, m)?)?;
    m.add_function(wrap_pyfunction!(pack_rows, m)?)?;
    m.add_function(wrap_pyfunction!(row_items, m)?)?;
    m.add_function(wrap_pyfunction!(wrapped_rows, m)?)?;
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
