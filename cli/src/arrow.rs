//! Lengths from an Arrow IPC file (`stowplan plan --lengths FILE --column NAME`), the format
//! of `datasets`' cache files and of `pyarrow.ipc` (file or stream): a list column's row
//! lengths (read from its offsets, no value touched), or an integer column's values. Read
//! record batch by record batch, only the named column (the `arrow` feature; a build without
//! it recognizes the file and says how to get one).

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::failure::Failure;

/// The two Arrow IPC layouts.
#[derive(Clone, Copy, Debug)]
pub enum Format {
    /// The random-access file (`ARROW1` magic, a footer).
    File,
    /// The stream (what `datasets` writes for its cache files).
    Stream,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::File => "file",
            Format::Stream => "stream",
        })
    }
}

/// The Arrow IPC format of `path` by its first bytes, or `None` for anything else (text).
pub fn sniff(path: &Path) -> Result<Option<Format>, Failure> {
    // Only a regular file: a pipe or a device (`-`, /dev/stdin) would lose what is read here.
    if path.as_os_str() == "-" || !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return Ok(None);
    }
    let mut head = Vec::with_capacity(8);
    File::open(path)
        .and_then(|f| f.take(8).read_to_end(&mut head))
        .map_err(|e| Failure::bad(format!("reading {}: {e}", path.display())))?;
    Ok(if head.starts_with(b"ARROW1") {
        Some(Format::File)
    } else if head.len() == 8 && head.starts_with(&[0xff; 4]) {
        Some(Format::Stream) // the continuation marker before the schema message
    } else {
        None
    })
}

/// The lengths of `column` in the Arrow IPC file at `path`.
#[cfg(not(feature = "arrow"))]
pub fn lengths(path: &Path, format: Format, _column: &str) -> Result<Vec<u64>, Failure> {
    Err(without_arrow(path, format))
}

/// The refusal of an Arrow IPC file by a build without the `arrow` feature: says how to get
/// one.
#[cfg(not(feature = "arrow"))]
pub fn without_arrow(path: &Path, format: Format) -> Failure {
    Failure::bad(format!(
        "{} is an Arrow IPC {format}: this stowplan was built without Arrow support; build it with \
         `cargo build --release -p stowplan-cli --features arrow`",
        path.display()
    ))
}

/// The lengths of `column` in the Arrow IPC file at `path`: per row, a list's length (list,
/// large list or fixed-size list of anything) or an integer's value. Errors name the file,
/// the column and, for a null or negative value, the row.
///
/// Only the column is decoded ([`read_batches`]): the pages read are its offsets (a list) or
/// values (integers), not the token ids nor the other columns.
#[cfg(feature = "arrow")]
pub fn lengths(path: &Path, format: Format, column: &str) -> Result<Vec<u64>, Failure> {
    let index = |schema: &arrow_schema::Schema| {
        let i = column_index(schema, column)?;
        let t = schema.field(i).data_type();
        if !readable(t) {
            return Err(format!(
                "column {column:?} has type {t}: give a list column (e.g. token ids) or an integer column of lengths"
            ));
        }
        Ok(vec![i])
    };
    let mut out = Vec::new();
    read_batches(path, format, index, |batch| {
        let row0 = out.len();
        column_lengths(batch.column(0).as_ref(), &mut out)
            .map_err(|(row, what)| format!("column {column:?}, row {} (from 0): {what}", row0 + row))
    })?;
    tracing::debug!(n = out.len(), source = %path.display(), column, "read lengths from Arrow");
    Ok(out)
}

/// The index of `column` in `schema`, or the refusal listing the columns there are.
#[cfg(feature = "arrow")]
pub fn column_index(schema: &arrow_schema::Schema, column: &str) -> Result<usize, String> {
    schema.index_of(column).map_err(|_| {
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        format!("no column {column:?} (columns: {names:?})")
    })
}

/// Reads the Arrow IPC file at `path`: `pick` chooses the columns to decode from the schema
/// (their indices, in the order wanted), and every record batch, those columns only, goes to
/// `each` in file order. An error of `pick` or `each` is refused as it is, prefixed by the
/// file's name.
///
/// The file is memory-mapped and the batches decoded without copies (as `pyarrow.memory_map`
/// reads it): they point into the map, which lives as long as they do, and only the pages
/// of the chosen columns are read. A stream must end with its end-of-stream marker (a stream
/// cut between two messages would otherwise read as fewer rows). A file that is not
/// well-formed is refused, also where the reader would panic on it; compressed buffers (lz4,
/// zstd) are refused as unsupported.
#[cfg(feature = "arrow")]
pub fn read_batches(
    path: &Path,
    format: Format,
    pick: impl FnOnce(&arrow_schema::Schema) -> Result<Vec<usize>, String>,
    mut each: impl FnMut(arrow_array::RecordBatch) -> Result<(), String>,
) -> Result<(), Failure> {
    let shown = path.display();
    let file = File::open(path).map_err(|e| Failure::bad(format!("reading {shown}: {e}")))?;
    // SAFETY: the map is read only; as with any memory-mapped reader (pyarrow's too), the
    // file must not be truncated while stowplan reads it.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Failure::bad(format!("reading {shown}: {e}")))?;
    let buffer = arrow_buffer::Buffer::from(bytes::Bytes::from_owner(map));
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let pick = |schema: &arrow_schema::Schema| pick(schema).map_err(Refusal::Other);
    let each = |batch| each(batch).map_err(Refusal::Other);
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| decode(&buffer, format, pick, each)));
    std::panic::set_hook(quiet);
    match read {
        Ok(Ok(())) => Ok(()),
        // arrow-ipc built without its codecs says "lz4 IPC decompression requires the lz4
        // feature": compression is refused by design, not for want of a build option.
        Ok(Err(Refusal::Arrow(e))) if e.to_string().contains("decompression requires") => Err(Failure::bad(format!(
            "{shown}: its record batches are compressed ({}); stowplan reads uncompressed Arrow IPC only (write it \
             without compression, e.g. pyarrow's IpcWriteOptions(compression=None), as datasets does)",
            e.to_string()
                .split_whitespace()
                .find(|w| ["lz4", "zstd", "LZ4", "ZSTD"].iter().any(|c| w.contains(c)))
                .unwrap_or("a codec")
        ))),
        Ok(Err(Refusal::Arrow(e))) => Err(Failure::bad(format!("{shown}: not a readable Arrow IPC {format}: {e}"))),
        Ok(Err(Refusal::Other(what))) => Err(Failure::bad(format!("{shown}: {what}"))),
        Err(panic) => {
            let why =
                panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            Err(Failure::bad(format!(
                "{shown}: not a readable Arrow IPC {format} (its reader failed on it: {})",
                why.unwrap_or_else(|| "no message".into())
            )))
        }
    }
}

/// Why [`decode`] refused a file.
#[cfg(feature = "arrow")]
enum Refusal {
    /// The Arrow reader's error.
    Arrow(arrow_schema::ArrowError),
    /// Ours, already worded.
    Other(String),
}

#[cfg(feature = "arrow")]
impl From<arrow_schema::ArrowError> for Refusal {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Refusal::Arrow(e)
    }
}

/// [`read_batches`] of the mapped file `buffer`.
#[cfg(feature = "arrow")]
fn decode(
    buffer: &arrow_buffer::Buffer,
    format: Format,
    pick: impl FnOnce(&arrow_schema::Schema) -> Result<Vec<usize>, Refusal>,
    mut each: impl FnMut(arrow_array::RecordBatch) -> Result<(), Refusal>,
) -> Result<(), Refusal> {
    use std::sync::Arc;

    use arrow_ipc::MessageHeader;
    use arrow_ipc::reader::{FileDecoder, read_footer_length};
    use arrow_schema::ArrowError;

    let mut pick = Some(pick);
    let mut decoder_for = |schema: arrow_schema::Schema, version| -> Result<Decoders, Refusal> {
        let columns = pick.take().ok_or_else(|| Refusal::Other("a second schema".into()))?(&schema)?;
        let schema = Arc::new(schema);
        let checked = FileDecoder::new(Arc::clone(&schema), version).with_projection(columns.clone());
        // SAFETY: the unchecked decoder's batches are never used: only validated, column by
        // column (`ArrayData::validate_full`, made for untrusted data), to say where a batch
        // the checked decoder refused is broken.
        #[allow(unsafe_code)]
        let unchecked =
            unsafe { FileDecoder::new(schema, version).with_projection(columns).with_skip_validation(true) };
        Ok(Decoders { checked, unchecked, rows: 0, batches: 0 })
    };
    let bad = |what: &str| Refusal::Arrow(ArrowError::ParseError(what.to_string()));
    match format {
        Format::File => {
            let n = buffer.len();
            let trailer: [u8; 10] =
                buffer.get(n.saturating_sub(10)..).and_then(|t| t.try_into().ok()).ok_or_else(|| bad("too short"))?;
            let footer_len = read_footer_length(trailer)?;
            let footer_at = n.checked_sub(10 + footer_len).ok_or_else(|| bad("the footer length is past the start"))?;
            let footer = arrow_ipc::root_as_footer(&buffer[footer_at..n - 10])
                .map_err(|e| bad(&format!("unable to read the footer: {e}")))?;
            let schema =
                arrow_ipc::convert::fb_to_schema(footer.schema().ok_or_else(|| bad("the footer has no schema"))?);
            let mut decoder = decoder_for(schema, footer.version())?;
            // Each block's bytes, within the file.
            let block = |b: &arrow_ipc::Block| {
                let (at, meta, body) =
                    (usize::try_from(b.offset()), usize::try_from(b.metaDataLength()), usize::try_from(b.bodyLength()));
                match (at, meta, body) {
                    (Ok(at), Ok(meta), Ok(body))
                        if at.checked_add(meta).and_then(|e| e.checked_add(body)).is_some_and(|e| e <= n) =>
                    {
                        Ok(buffer.slice_with_length(at, meta + body))
                    }
                    _ => Err(bad("a block lies outside the file")),
                }
            };
            for b in footer.dictionaries().iter().flatten() {
                decoder.read_dictionary(b, &block(b)?)?;
            }
            for b in footer.recordBatches().iter().flatten() {
                if let Some(batch) = decoder.read_record_batch(b, &block(b)?)? {
                    each(batch)?;
                }
            }
        }
        Format::Stream => {
            // The stream's messages walked here (each a length-prefixed flatbuffer and a body)
            // and decoded like a file's blocks, so that only the chosen columns are decoded.
            let n = buffer.len();
            let word = |at: usize| -> Option<i32> {
                Some(i32::from_le_bytes(buffer.get(at..at.checked_add(4)?)?.try_into().ok()?))
            };
            let mut decoder: Option<Decoders> = None;
            let mut at = 0;
            loop {
                let first =
                    word(at).ok_or_else(|| bad("the stream ends without its end-of-stream marker (cut short?)"))?;
                let (prefix, meta) = if first == -1 {
                    (8, word(at + 4).ok_or_else(|| bad("the stream is cut inside a message"))?)
                } else {
                    (4, first) // the format before Arrow 0.15: no continuation marker
                };
                if meta == 0 {
                    break; // the end-of-stream marker
                }
                let meta = usize::try_from(meta).map_err(|_| bad("a message has a negative length"))?;
                let head_end = (at + prefix)
                    .checked_add(meta)
                    .filter(|&e| e <= n)
                    .ok_or_else(|| bad("a message lies outside the file"))?;
                let message = arrow_ipc::root_as_message(&buffer[at + prefix..head_end])
                    .map_err(|e| bad(&format!("unable to read a message: {e}")))?;
                let body =
                    usize::try_from(message.bodyLength()).map_err(|_| bad("a message has a negative body length"))?;
                let end = head_end
                    .checked_add(body)
                    .filter(|&e| e <= n)
                    .ok_or_else(|| bad("a message's body lies outside the file"))?;
                let block = arrow_ipc::Block::new(at as i64, (prefix + meta) as i32, body as i64);
                let data = buffer.slice_with_length(at, end - at);
                match (message.header_type(), decoder.as_mut()) {
                    (MessageHeader::Schema, None) => {
                        let fb = message.header_as_schema().ok_or_else(|| bad("an empty schema"))?;
                        decoder = Some(decoder_for(arrow_ipc::convert::fb_to_schema(fb), message.version())?);
                    }
                    (MessageHeader::Schema, Some(_)) => return Err(bad("a second schema in the stream")),
                    (_, None) => return Err(bad("a message before the schema")),
                    (MessageHeader::DictionaryBatch, Some(d)) => d.read_dictionary(&block, &data)?,
                    (MessageHeader::RecordBatch, Some(d)) => {
                        if let Some(batch) = d.read_record_batch(&block, &data)? {
                            each(batch)?;
                        }
                    }
                    (other, Some(_)) => return Err(bad(&format!("an unexpected {other:?} message"))),
                }
                at = end;
            }
            if decoder.is_none() {
                return Err(bad("the stream has no schema"));
            }
        }
    }
    Ok(())
}

/// A checked decoder and its unchecked twin, which only locates what the checked one refused
/// (the column and the row a structurally invalid batch breaks the rules at).
#[cfg(feature = "arrow")]
struct Decoders {
    checked: arrow_ipc::reader::FileDecoder,
    unchecked: arrow_ipc::reader::FileDecoder,
    /// Rows of the record batches read so far, and how many batches.
    rows: usize,
    batches: usize,
}

#[cfg(feature = "arrow")]
impl Decoders {
    fn read_dictionary(&mut self, block: &arrow_ipc::Block, data: &arrow_buffer::Buffer) -> Result<(), Refusal> {
        self.checked.read_dictionary(block, data)?;
        // (A dictionary the unchecked one cannot read only makes the location unknown.)
        let _ = self.unchecked.read_dictionary(block, data);
        Ok(())
    }

    /// The checked decoder's batch; its refusal names the column, the row and the record
    /// batch where the unchecked decode finds the rule broken.
    fn read_record_batch(
        &mut self,
        block: &arrow_ipc::Block,
        data: &arrow_buffer::Buffer,
    ) -> Result<Option<arrow_array::RecordBatch>, Refusal> {
        let index = self.batches;
        self.batches += 1;
        match self.checked.read_record_batch(block, data) {
            Ok(batch) => {
                self.rows += batch.as_ref().map_or(0, |b| b.num_rows());
                Ok(batch)
            }
            Err(e) => {
                // Its own panic (the outer catch is for the checked decoder) only makes the
                // location unknown.
                let rows = self.rows;
                let unchecked = &mut self.unchecked;
                let at = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    match unchecked.read_record_batch(block, data) {
                        Ok(Some(raw)) => locate(&raw, rows),
                        _ => None,
                    }
                }))
                .ok()
                .flatten();
                Err(match at {
                    Some(at) => Refusal::Arrow(arrow_schema::ArrowError::InvalidArgumentError(format!(
                        "{at} (record batch {index}): {e}"
                    ))),
                    None => Refusal::Arrow(e),
                })
            }
        }
    }
}

/// Where `batch` (decoded without validation; `first_row`: the rows before it) breaks the
/// rules: `column "NAME", row R (from 0)`, the first row whose prefix of the column does not
/// validate, the column alone when the fault is not a row's (every prefix, the empty one
/// too, fails, or none does: a list's values, a null count), or the column whose length is
/// not the batch's.
#[cfg(feature = "arrow")]
fn locate(batch: &arrow_array::RecordBatch, first_row: usize) -> Option<String> {
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let name = field.name();
        if column.len() != batch.num_rows() {
            return Some(format!("column {name:?} has {} rows, its record batch {}", column.len(), batch.num_rows()));
        }
        let data = column.to_data();
        if data.validate_full().is_ok() {
            continue;
        }
        let len = data.len();
        if data.slice(0, 0).validate_full().is_err() || data.slice(0, len).validate_full().is_ok() {
            return Some(format!("column {name:?}"));
        }
        // The shortest invalid prefix (the empty one is valid, the whole one not): its last
        // row is the first that breaks a rule.
        let (mut ok, mut bad) = (0usize, len);
        while bad - ok > 1 {
            let mid = ok + (bad - ok) / 2;
            if data.slice(0, mid).validate_full().is_ok() { ok = mid } else { bad = mid }
        }
        return Some(format!("column {name:?}, row {} (from 0)", first_row + bad - 1));
    }
    None
}

/// Whether [`column_lengths`] reads a column of type `t`.
#[cfg(feature = "arrow")]
fn readable(t: &arrow_schema::DataType) -> bool {
    use arrow_schema::DataType;
    matches!(t, DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)) || t.is_integer()
}

/// Appends each row's length of `array` (of a [`readable`] type) to `out`; an error is (row
/// in `array`, what).
#[cfg(feature = "arrow")]
fn column_lengths(array: &dyn arrow_array::Array, out: &mut Vec<u64>) -> Result<(), (usize, String)> {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{
        Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
    };
    use arrow_schema::DataType;

    if let Some(row) = (0..array.len()).find(|&r| array.is_null(r)) {
        return Err((row, "null (every row needs a length)".into()));
    }
    macro_rules! integers {
        ($t:ty) => {{
            for (row, &v) in array.as_primitive::<$t>().values().iter().enumerate() {
                out.push(u64::try_from(v).map_err(|_| (row, format!("the length {v} is negative")))?);
            }
        }};
    }
    match array.data_type() {
        DataType::List(_) => out.extend(array.as_list::<i32>().offsets().lengths().map(|n| n as u64)),
        DataType::LargeList(_) => out.extend(array.as_list::<i64>().offsets().lengths().map(|n| n as u64)),
        DataType::FixedSizeList(_, n) => out.extend(std::iter::repeat_n(*n as u64, array.len())),
        DataType::Int8 => integers!(Int8Type),
        DataType::Int16 => integers!(Int16Type),
        DataType::Int32 => integers!(Int32Type),
        DataType::Int64 => integers!(Int64Type),
        DataType::UInt8 => integers!(UInt8Type),
        DataType::UInt16 => integers!(UInt16Type),
        DataType::UInt32 => integers!(UInt32Type),
        DataType::UInt64 => integers!(UInt64Type),
        other => return Err((0, format!("its type {other} holds no lengths"))), // readable() refused it before
    }
    Ok(())
}
