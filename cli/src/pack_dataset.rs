//! `stowplan pack-dataset IN OUT`: the rows of a tokenized table (an Arrow IPC file or stream,
//! such as a `datasets` cache file) packed into rows of at most `--capacity` tokens and
//! written to OUT as an Arrow IPC stream (what `datasets.Dataset.from_file` and
//! `pyarrow.ipc.open_stream` read), with no Python involved.
//!
//! The packed rows are the host's [`stowplan::pack_rows`] (the strategies and overflow
//! policies of `stowplan.arrow.pack_table`), assembled by the host's
//! [`stowplan_arrow`], the code `stowplan.arrow.pack_table` runs too, so the output
//! equals it row for row: the values are copied run by run from the memory-mapped input,
//! batch by batch (a thread gathers the next batch while the last one is written), into an
//! [`stowplan::runtime::AtomicFile`]: OUT appears whole or not at all. Lists of numbers,
//! booleans, strings, binaries and lists of those are packed; other value types
//! (dictionaries, structs, views) are refused, naming the column.
//! A progress bar counts the rows written on a terminal. SIGINT or SIGTERM while writing
//! stops at the next batch or before the output is finished, removes the temporary file and
//! exits 130, OUT left as it was (one arriving during the final fsync and rename lets it
//! finish, exit 0). A second one ends the process at once (exit 130), leaving the temporary
//! `.OUT.tmp.*` behind, as SIGKILL does.

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use stowplan::{Backend, rows::RowPacking};

use crate::common::{named, print_report};
use crate::failure::Failure;

/// The options of `stowplan pack-dataset`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The tokenized table: an Arrow IPC file or stream (e.g. a `datasets` cache file
    /// `cache-*.arrow`, or `pyarrow.ipc` output), memory-mapped.
    input: PathBuf,
    /// Where the packed table goes: an Arrow IPC stream, written atomically (replaced whole,
    /// never half-written).
    output: PathBuf,
    /// Tokens per packed row, at most (1..=2^31-1).
    #[arg(long, allow_negative_numbers = true, value_parser = capacity_arg, required_unless_present = "seq_length")]
    capacity: Option<u64>,
    /// The former name of --capacity, accepted with a warning for one release.
    #[arg(long, hide = true, allow_negative_numbers = true, value_parser = capacity_arg, conflicts_with = "capacity")]
    seq_length: Option<u64>,
    /// How rows are packed: best-fit decreasing, first-fit decreasing, next-fit in row order
    /// (`bfd`, `ffd`, `next-fit`: whole sequences by the kernel's plan), TRL's `bfd_split`
    /// (long rows cut into fragments of CAPACITY) or `wrapped` (every token in row order cut
    /// into rows of exactly CAPACITY).
    #[arg(long, default_value = "bfd")]
    strategy: String,
    /// A row longer than CAPACITY under bfd, ffd and next-fit: `truncate` (keep its first
    /// CAPACITY tokens, the default), `split` into fragments, `drop` it, or `error` (exit 1
    /// naming it).
    #[arg(long)]
    overflow: Option<String>,
    /// The list columns to pack, comma-separated (default: every column, which must then all
    /// be lists). The first one's list lengths are the sequence lengths; every other one must
    /// have the same length in every row. Other columns are not carried over. Spaces around a
    /// name are ignored.
    #[arg(long, value_delimiter = ',', value_parser = column_arg)]
    columns: Option<Vec<String>>,
    /// Also write `position_ids` (list<int32>, restarting at 0 at every sequence).
    #[arg(long)]
    position_ids: bool,
    /// Which kernel plans: the WASM component (default) or the same code natively.
    #[arg(long, value_parser = named::<Backend>(), default_value_t = Backend::default())]
    backend: Backend,
    /// Print the summary as JSON on stdout instead of for people.
    #[arg(long)]
    json: bool,
}

/// What `pack-dataset` did.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The input file.
    input: PathBuf,
    /// The packed table's file.
    output: PathBuf,
    /// The strategy.
    strategy: &'static str,
    /// The overflow policy (`null` for `wrapped`).
    overflow: Option<&'static str>,
    /// Tokens per packed row, at most.
    capacity: u64,
    /// The packed columns.
    columns: Vec<String>,
    /// Rows read.
    rows: u64,
    /// Tokens read (the first column's values).
    tokens: u64,
    /// Packed rows written.
    packed_rows: u64,
    /// Tokens written (fewer than read when long rows were truncated or dropped).
    packed_tokens: u64,
    /// ⌈packed tokens / capacity⌉: no packing of these tokens has fewer rows.
    lower_bound: u64,
    /// Packed tokens / (packed rows × capacity).
    fill: f64,
    /// The output file's size.
    bytes: u64,
    /// Seconds reading and planning, and writing.
    plan_s: f64,
    /// Seconds copying the values and writing the file.
    write_s: f64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let over =
            if self.lower_bound == 0 { 0.0 } else { (self.packed_rows as f64 / self.lower_bound as f64 - 1.0) * 100.0 };
        writeln!(f, "{} → {}", self.input.display(), self.output.display())?;
        writeln!(
            f,
            "strategy {}{}, capacity {}, columns {}",
            self.strategy,
            self.overflow.map(|o| format!(" (overflow {o})")).unwrap_or_default(),
            self.capacity,
            self.columns.join(", ")
        )?;
        writeln!(f, "rows          {} → {} packed rows", self.rows, self.packed_rows)?;
        writeln!(f, "tokens        {} → {}", self.tokens, self.packed_tokens)?;
        writeln!(f, "lower bound   {} rows ({over:+.3} %)", self.lower_bound)?;
        writeln!(f, "fill          {:.4}", self.fill)?;
        writeln!(f, "written       {} bytes", self.bytes)?;
        writeln!(f, "time          plan {:.2} s, write {:.2} s", self.plan_s, self.write_s)
    }
}

/// Runs `stowplan pack-dataset`.
pub fn run(args: Args) -> Result<(), Failure> {
    // clap requires one of the two (`required_unless_present`).
    let capacity = crate::common::capacity("pack-dataset", args.capacity, ("seq-length", args.seq_length)).unwrap_or(0);
    let packing = RowPacking::parse(&args.strategy, args.overflow.as_deref())?;
    check_paths(&args.input, &args.output)?;
    let format = crate::arrow::sniff(&args.input)?.ok_or_else(|| {
        Failure::bad(format!(
            "{}: not an Arrow IPC file or stream (pack-dataset reads a regular file such as a `datasets` cache \
             file, not standard input)",
            args.input.display()
        ))
    })?;
    keep_freed_memory();
    let t = Instant::now();
    let table = table::read(&args.input, format, args.columns.as_deref(), args.position_ids)?;
    let rows = stowplan::pack_rows(args.backend, &table.lengths, capacity, packing, &table.names[0])
        .map_err(|e| Failure { message: format!("{}: {e}", args.input.display()), ..Failure::from(e) })?;
    let plan_s = t.elapsed().as_secs_f64();
    let packed_tokens: u64 = rows.lengths.iter().sum();
    let packed_rows = rows.rows() as u64;
    let (names, rows_read, tokens) = (table.names.clone(), table.lengths.len() as u64, table.lengths.iter().sum());
    let t = Instant::now();
    let bytes = table::write(table, rows, args.position_ids, &args.output)?;
    let report = Report {
        strategy: packing.strategy().name(),
        overflow: packing.overflow().map(|o| o.name()),
        capacity,
        columns: names,
        rows: rows_read,
        tokens,
        packed_rows,
        packed_tokens,
        lower_bound: packed_tokens.div_ceil(capacity),
        fill: if packed_rows == 0 { 0.0 } else { packed_tokens as f64 / (packed_rows as f64 * capacity as f64) },
        bytes,
        plan_s,
        write_s: t.elapsed().as_secs_f64(),
        input: args.input,
        output: args.output,
    };
    print_report(&report, args.json)
}

/// `--capacity`: an integer in the host's range (`stowplan::rows::check_capacity`), refused
/// naming that range whatever was given (a negative number, a fraction, a word).
/// One name of `--columns`, spaces around it dropped (`--columns "input_ids, labels"`).
fn column_arg(s: &str) -> Result<String, String> {
    match s.trim() {
        "" => Err("a column name is empty (--columns takes names separated by commas)".into()),
        name => Ok(name.to_string()),
    }
}

fn capacity_arg(s: &str) -> Result<u64, String> {
    // Not a number, negative or past u64: checked as 0 (out of range like them).
    let n = s.trim().parse::<i128>().ok().and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
    stowplan::rows::check_capacity(n)
        .map(|()| n)
        .map_err(|e| e.to_string().replace(&format!("(got {n})"), &format!("(got {s:?})")))
}

/// Has the C allocator keep what this one-shot command frees, from its heap: each record batch
/// of the output (hundreds of MiB) then reuses the last one's pages instead of faulting in and
/// zeroing fresh ones (measured: most of the kernel time of a write, before).
fn keep_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's parameters; called before any thread.
    #[allow(unsafe_code)]
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Refuses, before any work, an IN that is missing or not a file (with the system's reason),
/// an OUT that is IN itself (the same file by any path: writing it would replace the table
/// being read), and an OUT that cannot be written: a directory, a file in a directory that
/// does not exist, or anything but a regular file (a device, a FIFO, a socket).
fn check_paths(input: &std::path::Path, out: &std::path::Path) -> Result<(), Failure> {
    use std::os::unix::fs::MetadataExt;

    let shown = out.display();
    if input.as_os_str() != "-" {
        let found = std::fs::metadata(input).map_err(|e| Failure::bad(format!("IN {:?}: {e}", input.display())))?;
        if found.is_dir() {
            return Err(Failure::bad(format!("IN {:?} is a directory, not an Arrow IPC file", input.display())));
        }
        if let Ok(o) = std::fs::metadata(out)
            && (o.dev(), o.ino()) == (found.dev(), found.ino())
        {
            return Err(Failure::bad(format!(
                "OUT {shown:?} is the input file {:?}: packing would replace the table it reads; write to another path",
                input.display()
            )));
        }
    }
    if out.as_os_str().is_empty() || out.is_dir() || out.file_name().is_none() {
        return Err(Failure::bad(format!("OUT {shown:?} must name a file, not a directory")));
    }
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    if !dir.is_dir() {
        return Err(Failure::bad(format!("OUT {shown:?}: its directory {} does not exist", dir.display())));
    }
    // A device, a FIFO or a socket is never replaced (the rule of every writer).
    Ok(stowplan::runtime::AtomicFile::check_target(out)?)
}

#[cfg(not(feature = "arrow"))]
mod table {
    //! Without the `arrow` feature: the refusal saying how to build it.
    use std::path::Path;

    use stowplan::rows::PackedRows;

    use crate::arrow::Format;
    use crate::failure::Failure;

    /// Never built.
    pub struct Table {
        pub names: Vec<String>,
        pub lengths: Vec<u64>,
    }

    pub fn read(path: &Path, format: Format, _: Option<&[String]>, _: bool) -> Result<Table, Failure> {
        Err(crate::arrow::without_arrow(path, format))
    }

    pub fn write(_: Table, _: PackedRows, _: bool, path: &Path) -> Result<u64, Failure> {
        Err(crate::arrow::without_arrow(path, Format::Stream))
    }
}

#[cfg(feature = "arrow")]
mod table {
    //! Reading the table's list columns and writing the packed one: the host's assembly
    //! ([`stowplan_arrow`]) on the memory-mapped file's batches.
    use std::path::Path;
    use std::sync::Arc;

    use stowplan::rows::PackedRows;
    use stowplan::runtime::AtomicFile;
    use stowplan_arrow::{ListColumns, Values, assemble, select};

    use crate::arrow::{Format, read_batches};
    use crate::failure::{Failure, INTERRUPTED};

    /// The packed columns of the input.
    pub struct Table {
        /// The packed columns' names, the first one giving the lengths.
        pub names: Vec<String>,
        /// The rows' lengths (the first column's).
        pub lengths: Vec<u64>,
        /// The columns' flat values.
        values: Values,
    }

    /// The host's message without its kind (the CLI prefixes the file).
    fn message(e: stowplan::Error) -> String {
        match e {
            stowplan::Error::InvalidArgument(m) | stowplan::Error::Infeasible(m) => m,
            other => other.to_string(),
        }
    }

    /// Reads the list columns `columns` (default: every column) of the Arrow IPC file at
    /// `path`, checked by the host ([`select`], [`ListColumns::push`]): lists, no null row, the
    /// same lengths in every row, at least one row.
    pub fn read(path: &Path, format: Format, columns: Option<&[String]>, position_ids: bool) -> Result<Table, Failure> {
        let mut taken: Option<ListColumns> = None;
        let pick = |schema: &arrow_schema::Schema| select(schema, columns, position_ids, "--columns").map_err(message);
        read_batches(path, format, pick, |batch| {
            let cols = match &mut taken {
                Some(c) => c,
                None => {
                    let picked = (0..batch.num_columns()).collect();
                    taken.insert(ListColumns::new(&batch.schema(), picked, 0).map_err(message)?)
                }
            };
            cols.push(&batch).map_err(message)
        })?;
        let shown = path.display();
        let empty = || Failure::bad(format!("{shown}: the table is empty: there are no rows to pack"));
        let cols = taken.ok_or_else(empty)?;
        let names = cols.names().to_vec();
        let (lengths, values) = cols.finish().map_err(|e| Failure::bad(format!("{shown}: {}", message(e))))?;
        Ok(Table { names, lengths, values })
    }

    /// Writes `rows` of `table` to `path` as an Arrow IPC stream, atomically, in the record
    /// batches of the host's assembly: a scoped thread gathers each batch while the one
    /// before is encoded and written. Returns the file's size.
    pub fn write(table: Table, rows: PackedRows, position_ids: bool, path: &Path) -> Result<u64, Failure> {
        use std::sync::atomic::{AtomicBool, Ordering};

        let shown = path.display();
        let arrow = |e: arrow_schema::ArrowError| Failure::bad(format!("writing {shown}: {e}"));
        let interrupted = || Failure::interrupted(format!("interrupted: {shown} not written"));
        let packed_rows = rows.rows() as u64;
        let batches =
            assemble(table.values, rows, position_ids).map_err(|e| Failure::bad(format!("{shown}: {}", message(e))))?;
        let schema = arrow_array::RecordBatchReader::schema(&batches);
        // A first SIGINT/SIGTERM stops at the next batch (the temporary file removed); a second
        // one ends the process.
        let stop = Arc::new(AtomicBool::new(false));
        for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register_conditional_shutdown(signal, INTERRUPTED.into(), Arc::clone(&stop))
                .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&stop)))
                .map_err(|e| Failure::bad(format!("installing a signal handler: {e}")))?;
        }
        let file = AtomicFile::create(path)?;
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(file, &schema).map_err(arrow)?;
        std::thread::scope(|scope| -> Result<(), Failure> {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            scope.spawn(move || {
                for batch in batches {
                    let failed = batch.is_err();
                    if tx.send(batch).is_err() || failed {
                        break; // the writer stopped, or this is the error it reports
                    }
                }
            });
            let bar = crate::input::progress(packed_rows, "writing rows", "{human_pos}/{human_len}");
            let written = rx.into_iter().try_for_each(|batch| {
                if stop.load(Ordering::Relaxed) {
                    return Err(interrupted());
                }
                let batch = batch.map_err(arrow)?;
                writer.write(&batch).map_err(arrow)?;
                bar.inc(batch.num_rows() as u64);
                Ok(())
            });
            bar.finish_and_clear(); // also before an error's message
            written
        })?;
        if stop.load(Ordering::Relaxed) {
            return Err(interrupted()); // the last batch went out, the output is not finished
        }
        writer.finish().map_err(arrow)?;
        writer.into_inner().map_err(arrow)?.commit()?;
        Ok(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
    }
}
