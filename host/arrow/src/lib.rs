//! Packed rows of Arrow data: the one assembly of packed rows (planned by [`stowplan::rows`])
//! from a table's list columns, which the CLI's `pack-dataset` (on a memory-mapped IPC file)
//! and the Python SDK's `stowplan.arrow`/`stowplan.hf`/`stowplan.ray`/`stowplan.compat.trl`
//! (on pyarrow's buffers, through the Arrow C Data Interface) use.
//!
//! - [`select`] checks a schema and picks the list columns to pack; [`ListColumns`] takes the
//!   record batches (every row checked: no null, the same lengths in every picked column) and
//!   gives the rows' lengths and the columns' flat values ([`Values`]), without a copy.
//! - [`assemble`] turns [`Values`] and a [`stowplan::rows::PackedRows`] into
//!   [`PackedBatches`], record batches of packed rows cut by
//!   [`stowplan::rows::packed_batches`], each built when it is read. A column's runs are
//!   copied once each (contiguous runs as one; a batch that is one run of one chunk is a slice,
//!   no copy: `wrapped`), fixed-width values by `memcpy` over every core for large batches,
//!   other values (booleans, strings, nested lists, values with nulls) by arrow-data's
//!   `MutableArrayData`.
//!
//! Value types: fixed-width (numbers, booleans, fixed-size binary), strings and binaries, and
//! lists of those; a batch whose gathered strings or inner lists would pass their `int32`
//! offsets is refused before any output, naming the column (the `large_` types take any size).
//! Dictionaries, views, structs, maps and unions are refused naming the column.
//!
//! A crate of its own rather than a feature of the host library (as `stowplan-zmq`): the host
//! library stays one build for every consumer, and the quick start's CLI compiles no Arrow.

use std::mem::MaybeUninit;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, GenericListArray, Int32Array, OffsetSizeTrait, RecordBatch, RecordBatchReader, cast::AsArray,
    make_array, new_empty_array,
};
use arrow_buffer::{MutableBuffer, OffsetBuffer, ScalarBuffer};
use arrow_data::{ArrayData, transform::MutableArrayData};
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Schema, SchemaRef};

use stowplan::Error;
use stowplan::rows::{
    MAX_ROW_LENGTH, PACKED_BATCH_TOKENS, POSITION_IDS, PackedRows, SEQ_LENGTHS, check_row_lengths, packed_batches,
};

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// `['a', 'b']`: names as the errors show them.
fn listed<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<String> = names.into_iter().map(|n| format!("'{n}'")).collect();
    format!("[{}]", names.join(", "))
}

/// The list columns of `schema` to pack, by index in the order wanted: `columns` (default:
/// every column, which must then all be lists). `option` is how the caller's users name that
/// option in a hint (`columns=[...]`, `--columns`). Refused (`InvalidArgument`, naming the
/// column): duplicate column names in the schema, no or a repeated name, a missing column, a
/// column that is not a list (or `large_list`) or holds values [`assemble`] does not take, an
/// output column of packing (`seq_lengths`, and `position_ids` when it is written).
pub fn select(
    schema: &Schema,
    columns: Option<&[String]>,
    position_ids: bool,
    option: &str,
) -> Result<Vec<usize>, Error> {
    let all: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    if all.iter().collect::<std::collections::BTreeSet<_>>().len() != all.len() {
        return Err(invalid(format!("the table has duplicate column names: {}", listed(all))));
    }
    let wanted: Vec<&str> = match columns {
        Some(c) => c.iter().map(String::as_str).collect(),
        None => all.clone(),
    };
    if wanted.is_empty() || wanted.iter().any(|n| n.is_empty()) {
        return Err(invalid(format!("{option} must name at least one list column (and no empty name)")));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut picked = Vec::with_capacity(wanted.len());
    for &name in &wanted {
        if !seen.insert(name) {
            return Err(invalid(format!("{option} must not repeat a name: '{name}' is named twice")));
        }
        if name == SEQ_LENGTHS || (position_ids && name == POSITION_IDS) {
            return Err(invalid(format!(
                "column '{name}' is an output column of packing; drop it or leave it out of {option}"
            )));
        }
        let i = schema.index_of(name).map_err(|_| {
            invalid(format!("column '{name}' is not in the table (its columns: {})", listed(all.clone())))
        })?;
        let t = schema.field(i).data_type();
        let values = match t {
            DataType::List(f) | DataType::LargeList(f) => f.data_type(),
            _ => {
                let hint = if columns.is_none() {
                    format!("; name the list columns to pack with {option}")
                } else {
                    String::new()
                };
                return Err(invalid(format!("column '{name}' is not a list column (its type is {t}){hint}")));
            }
        };
        if let Some(why) = refused(values) {
            return Err(invalid(format!("column '{name}' holds {values} values, which packing does not take ({why})")));
        }
        picked.push(i);
    }
    Ok(picked)
}

/// Why values of type `t` cannot be packed (`None`: they can).
fn refused(t: &DataType) -> Option<&'static str> {
    match t {
        DataType::Boolean | DataType::FixedSizeBinary(_) | DataType::Null => None,
        t if t.is_primitive() => None,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary => None,
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => refused(f.data_type()),
        DataType::Dictionary(..) => Some("decode the dictionary first, e.g. cast to its value type"),
        DataType::Utf8View | DataType::BinaryView | DataType::ListView(_) | DataType::LargeListView(_) => {
            Some("cast the views to their plain or large_ type")
        }
        _ => Some("pack lists of numbers, booleans, strings, binaries or lists of those"),
    }
}

/// The flat values of a table's packed columns, as the chunks they came in (no copy).
#[derive(Clone, Debug)]
pub struct Values {
    names: Vec<String>,
    /// Each column's list type.
    types: Vec<DataType>,
    /// Per column: its flat values, chunk by chunk.
    chunks: Vec<Vec<ArrayData>>,
    /// Per column: each chunk's first value in the column's flat values, and the total.
    bases: Vec<Vec<u64>>,
}

impl Values {
    /// The columns `names` of list types `types`, each the flat values `chunks[c]` (one after
    /// the other). Refused (`InvalidArgument`): entries that do not pair up, a type that is not
    /// a list of values [`assemble`] takes, a chunk whose type is not its list's value type.
    /// Columns of different lengths are taken: [`assemble`] bounds items by the shortest.
    pub fn new(names: Vec<String>, types: Vec<DataType>, chunks: Vec<Vec<ArrayData>>) -> Result<Self, Error> {
        if names.is_empty() || names.len() != types.len() || types.len() != chunks.len() {
            return Err(invalid(format!(
                "names, types and chunks must have one entry per column, at least one (got {}, {} and {})",
                names.len(),
                types.len(),
                chunks.len()
            )));
        }
        let mut bases = Vec::with_capacity(chunks.len());
        for ((name, t), column) in names.iter().zip(&types).zip(&chunks) {
            let value = match t {
                DataType::List(f) | DataType::LargeList(f) => f.data_type(),
                other => return Err(invalid(format!("column '{name}': {other} is not a list type"))),
            };
            if let Some(why) = refused(value) {
                return Err(invalid(format!(
                    "column '{name}' holds {value} values, which packing does not take ({why})"
                )));
            }
            let mut b = Vec::with_capacity(column.len() + 1);
            let mut at = 0u64;
            b.push(0);
            for (k, chunk) in column.iter().enumerate() {
                if chunk.data_type() != value {
                    return Err(invalid(format!(
                        "column '{name}': chunk {k} holds {} values, not {value}",
                        chunk.data_type()
                    )));
                }
                at += chunk.len() as u64;
                b.push(at);
            }
            bases.push(b);
        }
        Ok(Values { names, types, chunks, bases })
    }

    /// The columns' names.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The number of flat values of the shortest column.
    pub fn len(&self) -> u64 {
        self.bases.iter().map(|b| b.last().copied().unwrap_or(0)).min().unwrap_or(0)
    }

    /// No values at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The picked list columns of a table read batch by batch: the rows' lengths (the first
/// column's) and every column's flat values.
#[derive(Debug)]
pub struct ListColumns {
    /// The picked columns' indices in a batch.
    picked: Vec<usize>,
    /// The first row's number in errors (a stream's batch numbers its rows in the stream).
    row0: u64,
    values: Values,
    lengths: Vec<u64>,
}

impl ListColumns {
    /// Packs columns `picked` (from [`select`]) of batches with `schema`; errors number the
    /// rows from `row0`.
    pub fn new(schema: &Schema, picked: Vec<usize>, row0: u64) -> Result<Self, Error> {
        let names: Vec<String> = picked.iter().map(|&i| schema.field(i).name().clone()).collect();
        let types: Vec<DataType> = picked.iter().map(|&i| schema.field(i).data_type().clone()).collect();
        let chunks = vec![Vec::new(); picked.len()];
        Ok(ListColumns { picked, row0, values: Values::new(names, types, chunks)?, lengths: Vec::new() })
    }

    /// Takes one record batch (of the schema given to [`ListColumns::new`]; its rows numbered
    /// after the rows taken before). Refused (`InvalidArgument`, naming the column and row): a
    /// batch of another schema, a null row, a row whose length differs from the first
    /// column's, a row longer than [`stowplan::rows::MAX_ROW_LENGTH`], more than 2**32-1 rows in all.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<(), Error> {
        let row0 = self.row0 + self.lengths.len() as u64;
        let names = &self.values.names;
        let mut first: Option<Vec<u64>> = None;
        let mut flats = Vec::with_capacity(self.picked.len());
        for (c, &i) in self.picked.iter().enumerate() {
            let name = &names[c];
            let column =
                batch.columns().get(i).filter(|col| col.data_type() == &self.values.types[c]).ok_or_else(|| {
                    invalid(format!(
                        "column '{name}' is missing from a batch or has another type than in the first batch"
                    ))
                })?;
            if column.null_count() > 0
                && let Some(row) = (0..column.len()).find(|&r| column.is_null(r))
            {
                return Err(invalid(format!(
                    "column '{name}' has a null at row {}; fill or filter nulls before packing",
                    row0 + row as u64
                )));
            }
            let (lens, flat) = match column.data_type() {
                DataType::List(_) => flat_values(column.as_list::<i32>()),
                _ => flat_values(column.as_list::<i64>()),
            };
            match &first {
                None => first = Some(lens),
                Some(f) => {
                    if let Some(row) = (0..f.len()).find(|&r| f[r] != lens[r]) {
                        return Err(invalid(format!(
                            "column '{name}' does not have the offsets of column '{}': row {} has {} values, not {}",
                            names[0],
                            row0 + row as u64,
                            lens[row],
                            f[row]
                        )));
                    }
                }
            }
            flats.push(flat);
        }
        let lens = first.unwrap_or_default();
        check_row_lengths(&lens, &names[0], row0)?;
        let rows = (self.lengths.len() + lens.len()) as u64;
        if rows > MAX_ROW_LENGTH {
            return Err(invalid(format!("the table has {rows} rows or more; at most 2**32-1 can be packed at once")));
        }
        for (c, flat) in flats.into_iter().enumerate() {
            let total = self.values.bases[c].last().copied().unwrap_or(0) + flat.len() as u64;
            if !flat.is_empty() {
                self.values.chunks[c].push(flat);
                self.values.bases[c].push(total);
            }
        }
        self.lengths.extend(lens);
        Ok(())
    }

    /// The picked columns' indices in a batch.
    pub fn picked(&self) -> &[usize] {
        &self.picked
    }

    /// The rows' lengths so far.
    pub fn lengths(&self) -> &[u64] {
        &self.lengths
    }

    /// The columns' names.
    pub fn names(&self) -> &[String] {
        &self.values.names
    }

    /// The rows' lengths and the flat values; refused (`InvalidArgument`) when no row was
    /// taken.
    pub fn finish(self) -> Result<(Vec<u64>, Values), Error> {
        if self.lengths.is_empty() {
            return Err(invalid("the table is empty: there are no rows to pack".into()));
        }
        Ok((self.lengths, self.values))
    }
}

/// A list array's row lengths and its rows' values (sliced out of the child array).
fn flat_values<O: OffsetSizeTrait>(list: &GenericListArray<O>) -> (Vec<u64>, ArrayData) {
    let offsets = list.value_offsets();
    let (a, b) = (offsets[0].as_usize(), offsets[offsets.len() - 1].as_usize());
    let lens = list.offsets().lengths().map(|n| n as u64).collect();
    (lens, list.values().slice(a, b - a).to_data())
}

/// The packed table's schema: the packed columns (their list types), `seq_lengths` and, with
/// `position_ids`, `position_ids` (`list<int32>`).
pub fn packed_schema(values: &Values, position_ids: bool) -> SchemaRef {
    let seq_type = DataType::List(Arc::new(Field::new_list_field(DataType::Int32, true)));
    let mut fields: Vec<Field> =
        values.names.iter().zip(&values.types).map(|(n, t)| Field::new(n, t.clone(), true)).collect();
    fields.push(Field::new(SEQ_LENGTHS, seq_type.clone(), true));
    if position_ids {
        fields.push(Field::new(POSITION_IDS, seq_type, true));
    }
    Arc::new(Schema::new(fields))
}

/// The packed rows `rows` of `values` as record batches (see the module's documentation).
/// Refused before any batch (`InvalidArgument`): an item outside a column's values, offsets
/// that are not a packed row's, a batch whose gathered strings or inner lists pass their
/// `int32` offsets (naming the column).
pub fn assemble(values: Values, rows: PackedRows, position_ids: bool) -> Result<PackedBatches, Error> {
    assemble_cut(values, rows, position_ids, PACKED_BATCH_TOKENS)
}

/// [`assemble`] in batches of at most `batch_tokens` tokens (or one row).
fn assemble_cut(
    values: Values,
    rows: PackedRows,
    position_ids: bool,
    batch_tokens: u64,
) -> Result<PackedBatches, Error> {
    let items = rows.starts.len();
    if rows.lengths.len() != items
        || rows.offsets.first() != Some(&0)
        || rows.offsets.last() != Some(&(items as u64))
        || rows.offsets.windows(2).any(|w| w[0] > w[1])
    {
        return Err(invalid(format!(
            "offsets must rise from 0 to the number of items ({items}), one item length per start (got {} lengths)",
            rows.lengths.len()
        )));
    }
    let total = values.len();
    if let Some(i) = (0..items).find(|&i| rows.starts[i].checked_add(rows.lengths[i]).is_none_or(|e| e > total)) {
        return Err(invalid(format!(
            "item {i} (start {}, length {}) is outside the columns' {total} values",
            rows.starts[i], rows.lengths[i]
        )));
    }
    let row_tokens = rows.row_tokens();
    let ends = packed_batches(&row_tokens, batch_tokens);
    let schema = packed_schema(&values, position_ids);
    let batches = PackedBatches { values, rows, row_tokens, ends, next: 0, position_ids, schema };
    // Only values with int32 offsets (strings, binaries, lists) can pass them: the usual
    // token columns skip this pass over the runs.
    let checked: Vec<usize> = (0..batches.values.names.len())
        .filter(|&c| batches.values.chunks[c].first().is_some_and(|d| int32_offsets(d.data_type())))
        .collect();
    for w in batches.ends.windows(2).filter(|_| !checked.is_empty()) {
        let (i0, i1) = (batches.rows.offsets[w[0]] as usize, batches.rows.offsets[w[1]] as usize);
        for &c in &checked {
            let runs = batches.runs(c, i0, i1);
            let sources: Vec<&ArrayData> = batches.values.chunks[c].iter().collect();
            if let Err(what) = fits(&sources, &runs) {
                return Err(invalid(format!(
                    "column '{}': {what} in one record batch of packed rows; use large_ types (e.g. large_string) \
                     for values this large",
                    batches.values.names[c]
                )));
            }
        }
    }
    Ok(batches)
}

/// Whether values of type `t` hold `int32` offsets at some depth (what [`fits`] checks).
fn int32_offsets(t: &DataType) -> bool {
    match t {
        DataType::Utf8 | DataType::Binary | DataType::List(_) => true,
        DataType::LargeList(f) | DataType::FixedSizeList(f, _) => int32_offsets(f.data_type()),
        _ => false,
    }
}

/// Refuses runs whose gathered values would pass an `int32` offset of their type (at any
/// depth): the message says which.
fn fits(sources: &[&ArrayData], runs: &[(usize, usize, usize)]) -> Result<(), String> {
    let Some(first) = sources.first() else { return Ok(()) };
    fn spans<O: OffsetSizeTrait>(
        sources: &[&ArrayData],
        runs: &[(usize, usize, usize)],
    ) -> (u64, Vec<(usize, usize, usize)>) {
        let mut total = 0u64;
        let inner = runs
            .iter()
            .map(|&(b, at, len)| {
                let off = sources[b].buffer::<O>(0);
                let (s, e) = (off[at].as_usize(), off[at + len].as_usize());
                total += (e - s) as u64;
                (b, s, e - s)
            })
            .collect();
        (total, inner)
    }
    match first.data_type() {
        DataType::Utf8 | DataType::Binary => {
            let (total, _) = spans::<i32>(sources, runs);
            if total > i32::MAX as u64 {
                return Err(format!("{total} bytes of {} pass the int32 offsets", first.data_type()));
            }
            Ok(())
        }
        DataType::List(_) => {
            let (total, inner) = spans::<i32>(sources, runs);
            if total > i32::MAX as u64 {
                return Err(format!("{total} inner values pass the int32 offsets"));
            }
            let children: Vec<&ArrayData> = sources.iter().map(|s| &s.child_data()[0]).collect();
            fits(&children, &inner)
        }
        DataType::LargeList(_) => {
            let (_, inner) = spans::<i64>(sources, runs);
            let children: Vec<&ArrayData> = sources.iter().map(|s| &s.child_data()[0]).collect();
            fits(&children, &inner)
        }
        DataType::FixedSizeList(_, n) => {
            let n = *n as usize;
            let inner: Vec<_> = runs.iter().map(|&(b, at, len)| (b, (sources[b].offset() + at) * n, len * n)).collect();
            let children: Vec<&ArrayData> = sources.iter().map(|s| &s.child_data()[0]).collect();
            fits(&children, &inner)
        }
        _ => Ok(()),
    }
}

/// Record batches of packed rows, each built when it is read (an iterator and an arrow
/// `RecordBatchReader`, which the Python SDK exports as an Arrow C stream).
#[derive(Debug)]
pub struct PackedBatches {
    values: Values,
    rows: PackedRows,
    row_tokens: Vec<u64>,
    /// Where the batches end, in packed rows (`[0, r1, …, rows]`).
    ends: Vec<usize>,
    /// The next batch.
    next: usize,
    position_ids: bool,
    schema: SchemaRef,
}

impl PackedBatches {
    /// The number of packed rows (in all batches).
    pub fn rows(&self) -> usize {
        self.rows.rows()
    }

    /// Column `c`'s runs `(chunk, start in the chunk, length)` of items `i0..i1`, an item
    /// crossing chunks cut at their edges, runs that continue one another as one.
    fn runs(&self, c: usize, i0: usize, i1: usize) -> Vec<(usize, usize, usize)> {
        let bases = &self.values.bases[c];
        let mut runs: Vec<(usize, usize, usize)> = Vec::with_capacity(i1 - i0);
        for i in i0..i1 {
            let (mut start, mut len) = (self.rows.starts[i], self.rows.lengths[i]);
            let mut b = bases.partition_point(|&base| base <= start).saturating_sub(1);
            while len > 0 {
                let at = start - bases[b];
                let n = len.min(bases[b + 1] - start);
                if n == 0 {
                    b += 1; // an empty chunk
                    continue;
                }
                match runs.last_mut() {
                    Some(last) if last.0 == b && (last.1 + last.2) as u64 == at => last.2 += n as usize,
                    _ => runs.push((b, at as usize, n as usize)),
                }
                (start, len, b) = (start + n, len - n, b + 1);
            }
        }
        runs
    }

    /// Column `c`'s values of items `i0..i1` (`tokens` of them), one after the other.
    fn gather(&self, c: usize, i0: usize, i1: usize, tokens: usize) -> Result<ArrayRef, ArrowError> {
        let runs = self.runs(c, i0, i1);
        let chunks = &self.values.chunks[c];
        if let [(b, at, len)] = runs[..] {
            return Ok(make_array(chunks[b].slice(at, len)));
        }
        let value_type = match &self.values.types[c] {
            DataType::List(f) | DataType::LargeList(f) => f.data_type().clone(),
            other => return Err(ArrowError::InvalidArgumentError(format!("{other} is not a list type"))),
        };
        if runs.is_empty() {
            return Ok(new_empty_array(&value_type));
        }
        let sources: Vec<&ArrayData> = chunks.iter().collect();
        let nulls = sources.iter().any(|d| d.null_count() > 0);
        if let (Some(width), false) = (value_type.primitive_width(), nulls) {
            let bytes: Vec<&[u8]> = sources
                .iter()
                .map(|d| &d.buffers()[0].as_slice()[d.offset() * width..(d.offset() + d.len()) * width])
                .collect();
            let byte_runs: Vec<(usize, usize, usize)> =
                runs.iter().map(|&(b, at, n)| (b, at * width, n * width)).collect();
            let mut out = MutableBuffer::with_capacity(tokens * width);
            advise_huge_pages(&mut out, tokens * width);
            {
                // SAFETY: the buffer's own `tokens * width` fresh bytes, seen as not yet
                // initialised while `fill` writes each of them once (the runs cover them:
                // their lengths sum to `tokens`).
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<MaybeUninit<u8>>(), tokens * width)
                };
                fill(dst, &bytes, &byte_runs);
            }
            // SAFETY: every byte up to this length was written just above.
            unsafe { out.set_len(tokens * width) };
            let data = ArrayData::builder(value_type).len(tokens).add_buffer(out.into()).build()?;
            return Ok(make_array(data));
        }
        let mut gathered = MutableArrayData::new(sources, nulls, tokens);
        for &(b, at, len) in &runs {
            gathered.extend(b, at, at + len);
        }
        Ok(make_array(gathered.freeze()))
    }

    /// Packed rows `r0..r1` as one record batch.
    fn batch(&self, r0: usize, r1: usize) -> Result<RecordBatch, ArrowError> {
        let rows = &self.rows;
        let (i0, i1) = (rows.offsets[r0] as usize, rows.offsets[r1] as usize);
        let t0 = self.row_tokens[r0];
        let tokens = (self.row_tokens[r1] - t0) as usize;
        let row_off: Vec<u64> = self.row_tokens[r0..=r1].iter().map(|&t| t - t0).collect();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for (c, t) in self.values.types.iter().enumerate() {
            let values = self.gather(c, i0, i1, tokens)?;
            columns.push(match t {
                DataType::List(f) => list::<i32>(f, &row_off, values)?,
                DataType::LargeList(f) => list::<i64>(f, &row_off, values)?,
                other => return Err(ArrowError::InvalidArgumentError(format!("{other} is not a list type"))),
            });
        }
        let item = Arc::new(Field::new_list_field(DataType::Int32, true));
        let seq_off: Vec<u64> = (r0..=r1).map(|r| rows.offsets[r] - i0 as u64).collect();
        let lens = Int32Array::from_iter_values(rows.lengths[i0..i1].iter().map(|&l| l as i32));
        columns.push(list::<i32>(&item, &seq_off, Arc::new(lens))?);
        if self.position_ids {
            let pos = Int32Array::from_iter_values(rows.lengths[i0..i1].iter().flat_map(|&l| 0..l as i32));
            columns.push(list::<i32>(&item, &row_off, Arc::new(pos))?);
        }
        RecordBatch::try_new(self.schema.clone(), columns)
    }
}

impl Iterator for PackedBatches {
    type Item = Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (r0, r1) = (*self.ends.get(self.next)?, *self.ends.get(self.next + 1)?);
        self.next += 1;
        Some(self.batch(r0, r1))
    }
}

impl RecordBatchReader for PackedBatches {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}

/// A list array of `values` cut at `offsets`.
fn list<O: OffsetSizeTrait>(field: &FieldRef, offsets: &[u64], values: ArrayRef) -> Result<ArrayRef, ArrowError> {
    let offsets: Vec<O> = offsets.iter().map(|&o| O::usize_as(o as usize)).collect();
    let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
    Ok(Arc::new(GenericListArray::<O>::try_new(field.clone(), offsets, values, None)?))
}

/// Asks the kernel to back the first `len` bytes of `buffer` with huge pages where it can
/// (as numpy does for large arrays): a fresh gigabyte otherwise costs more in page faults than
/// in the copy. Only advice: nothing changes where it is not taken.
fn advise_huge_pages(buffer: &mut MutableBuffer, len: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        if len < 2 * HUGE {
            return;
        }
        let start = buffer.as_mut_ptr() as usize;
        let first = start.next_multiple_of(HUGE);
        let end = (start + len) / HUGE * HUGE;
        if end > first {
            // SAFETY: madvise only advises on pages of this buffer's own allocation (the
            // range lies inside it); MADV_HUGEPAGE changes no content.
            #[allow(unsafe_code)]
            unsafe {
                libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
            }
        }
    }
}

/// Below this many bytes [`fill`] copies on one thread.
const PARALLEL_FILL_BYTES: usize = 32 << 20;

/// Copies the runs `(chunk, start, length)` of `chunks` one after the other into `out` (fresh
/// memory: every element written once): a large copy on every core (the runs split in shares
/// of about equal size, each share's part of `out` its own), since the time is page faults and
/// memory traffic, not the loop.
fn fill(out: &mut [MaybeUninit<u8>], chunks: &[&[u8]], runs: &[(usize, usize, usize)]) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    if out.len() < PARALLEL_FILL_BYTES || threads < 2 {
        return fill_one(out, chunks, runs);
    }
    let share = out.len().div_ceil(threads);
    // The shares (each its runs and its part of `out`), taken from one queue by this thread
    // and by helpers; a helper that cannot be started (a process limit) leaves its shares to
    // the others.
    let mut shares = Vec::new();
    let (mut rest, mut run) = (out, 0);
    while run < runs.len() {
        let first = run;
        let mut n = 0;
        while run < runs.len() && (n == 0 || n + runs[run].2 <= share) {
            n += runs[run].2;
            run += 1;
        }
        let (mine, tail) = std::mem::take(&mut rest).split_at_mut(n);
        rest = tail;
        shares.push((mine, &runs[first..run]));
    }
    let queue = std::sync::Mutex::new(shares);
    let work = || {
        while let Some((out, r)) = queue.lock().ok().and_then(|mut q| q.pop()) {
            fill_one(out, chunks, r);
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
fn fill_one(out: &mut [MaybeUninit<u8>], chunks: &[&[u8]], runs: &[(usize, usize, usize)]) {
    let mut at = 0;
    for &(c, s, l) in runs {
        out[at..at + l].write_copy_of_slice(&chunks[c][s..s + l]);
        at += l;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, ListArray, StringArray};
    use stowplan::Backend;
    use stowplan::rows::RowPacking;

    fn list_of(rows: &[&[i64]]) -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<arrow_array::types::Int64Type, _, _>(
            rows.iter().map(|r| Some(r.iter().map(|&v| Some(v)))),
        ))
    }

    fn batch(cols: &[(&str, ArrayRef)]) -> RecordBatch {
        RecordBatch::try_from_iter(cols.iter().map(|(n, a)| (n.to_string(), a.clone()))).unwrap()
    }

    fn packed(batches: &[RecordBatch], capacity: u64, strategy: &str) -> Vec<RecordBatch> {
        packed_cut(batches, capacity, strategy, PACKED_BATCH_TOKENS)
    }

    fn packed_cut(batches: &[RecordBatch], capacity: u64, strategy: &str, cut: u64) -> Vec<RecordBatch> {
        let schema = batches[0].schema();
        let picked = select(&schema, None, true, "columns").unwrap();
        let mut cols = ListColumns::new(&schema, picked, 0).unwrap();
        for b in batches {
            cols.push(b).unwrap();
        }
        let (lengths, values) = cols.finish().unwrap();
        let packing = RowPacking::parse(strategy, None).unwrap();
        let rows = stowplan::pack_rows(Backend::Native, &lengths, capacity, packing, "input_ids").unwrap();
        assemble_cut(values, rows, true, cut).unwrap().collect::<Result<_, _>>().unwrap()
    }

    #[test]
    fn small_batches_hold_the_same_rows() {
        let rows: Vec<Vec<i64>> = (0..500).map(|i| (0..(i * 7919 % 49 + 1)).collect()).collect();
        let refs: Vec<&[i64]> = rows.iter().map(Vec::as_slice).collect();
        let input = [
            batch(&[("input_ids", list_of(&refs[..300])), ("labels", list_of(&refs[..300]))]),
            batch(&[("input_ids", list_of(&refs[300..])), ("labels", list_of(&refs[300..]))]),
        ];
        let whole = packed(&input, 100, "bfd");
        let small = packed_cut(&input, 100, "bfd", 300);
        assert_eq!(whole.len(), 1);
        assert!(small.len() > 10, "{} batches", small.len());
        assert_eq!(rows_of(&whole), rows_of(&small));
    }

    /// Every batch's rows as nested vectors, column by column.
    fn rows_of(batches: &[RecordBatch]) -> Vec<Vec<Vec<i64>>> {
        let mut out = Vec::new();
        for c in 0..batches[0].num_columns() {
            let mut col = Vec::new();
            for b in batches {
                let l = b.column(c).as_list::<i32>();
                for r in 0..l.len() {
                    let v = l.value(r);
                    col.push(match v.data_type() {
                        DataType::Int64 => v.as_primitive::<arrow_array::types::Int64Type>().values().to_vec(),
                        _ => v
                            .as_primitive::<arrow_array::types::Int32Type>()
                            .values()
                            .iter()
                            .map(|&x| x as i64)
                            .collect(),
                    });
                }
            }
            out.push(col);
        }
        out
    }

    #[test]
    fn rows_across_batches_and_chunks_are_packed_with_their_positions() {
        let a = batch(&[("input_ids", list_of(&[&[1, 2, 3], &[4]]))]);
        let b = batch(&[("input_ids", list_of(&[&[5, 6], &[7, 8, 9]]))]);
        let out = packed(&[a, b], 4, "wrapped");
        assert_eq!(out.len(), 1);
        let ids = out[0].column(0).as_list::<i32>();
        let flat = ids.values().as_any().downcast_ref::<Int64Array>().unwrap();
        assert_eq!(flat.values().to_vec(), vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(ids.value_offsets(), &[0, 4, 8, 9]);
        let pos = out[0]
            .column(2)
            .as_list::<i32>()
            .values()
            .as_primitive::<arrow_array::types::Int32Type>()
            .values()
            .to_vec();
        assert_eq!(pos, vec![0, 1, 2, 0, 0, 1, 0, 1, 0]); // (the last row starts a piece)
    }

    #[test]
    fn strings_are_packed_and_checked_columns_are_refused_by_name() {
        let words: ArrayRef = Arc::new(ListArray::new(
            Arc::new(Field::new_list_field(DataType::Utf8, true)),
            OffsetBuffer::from_lengths([2, 1]),
            Arc::new(StringArray::from(vec!["a", "bb", "c"])),
            None,
        ));
        let out = packed(&[batch(&[("words", words)])], 3, "bfd");
        let w = out[0].column(0).as_list::<i32>();
        assert_eq!(w.values().as_string::<i32>().iter().flatten().collect::<Vec<_>>(), vec!["a", "bb", "c"]);
        let plain = batch(&[("n", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef)]);
        let err = select(&plain.schema(), None, false, "--columns").unwrap_err().to_string();
        assert!(
            err.contains(
                "column 'n' is not a list column (its type is Int64); name the list columns to pack with --columns"
            ),
            "{err}"
        );
        let a = batch(&[("a", list_of(&[&[1, 2], &[3]])), ("b", list_of(&[&[1], &[2, 3]]))]);
        let picked = select(&a.schema(), None, false, "x").unwrap();
        let mut cols = ListColumns::new(&a.schema(), picked, 0).unwrap();
        let err = cols.push(&a).unwrap_err().to_string();
        assert!(err.contains("column 'b' does not have the offsets of column 'a': row 0 has 1 values, not 2"), "{err}");
    }
}
