//! `stowplan pack --stream`: pack lengths as they arrive, writing each bin when it closes.
//!
//! Input is read in whatever pieces the source delivers (a pipe that trickles gives its bins
//! as soon as they close; a file is read a MiB at a time) and fed to the kernel's streaming
//! packer; memory stays bounded by `--max-open-bins` and `--max-buffered` however long the
//! input. Each closed bin is one line of input indices (0-based): space-separated, or a JSON
//! array with `--json`. A summary goes to stderr.

use std::io::{BufRead, BufReader, Read, Write};
use std::time::Instant;

use stowplan::input::{LengthLines, MAX_TABLE_LINE, TableRows};
use stowplan::{
    StreamPacker,
    kernel::{ClosedBins, LimitedClosedBins, LimitedStreamPacker, Named, OversizePolicy, StreamLimits, StreamOptions},
};

use crate::common::{Common, ReadyKernel};
use crate::failure::Failure;

/// The streaming options of `stowplan pack`.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Tokens per bin.
    pub capacity: u64,
    /// Lengths rounded up to a multiple of this.
    pub align: u64,
    /// Open bins at most.
    pub max_open_bins: u32,
    /// Buffered items at most.
    pub max_buffered: u32,
    /// Items above the capacity (or a limit).
    pub oversize: OversizePolicy,
    /// `--limit NAME=CAP`: further limits per bin (the input is then a table, header first).
    pub limits: Vec<(String, u64)>,
    /// `--max-segments`: items per bin at most (0: no limit).
    pub max_segments: u64,
}

/// The kernel's packer: plain, or under limits.
enum Packer {
    Plain(StreamPacker),
    Limited(LimitedStreamPacker),
}

impl Packer {
    /// Adds rows; the closed bins, and (under limits) their loads in each limit.
    fn add(&mut self, rows: &[u64]) -> Result<LimitedClosedBins, stowplan::Error> {
        match self {
            Packer::Plain(p) => p.add(rows).map(|closed| LimitedClosedBins { closed, resource_loads: Vec::new() }),
            Packer::Limited(p) => p.add(rows),
        }
    }

    fn finish(&mut self) -> Result<LimitedClosedBins, stowplan::Error> {
        match self {
            Packer::Plain(p) => p.finish().map(|closed| LimitedClosedBins { closed, resource_loads: Vec::new() }),
            Packer::Limited(p) => p.finish(),
        }
    }
}

/// What a run did, for the summary.
#[derive(Debug, Default)]
struct Tally {
    lengths: u64,
    bins: u64,
    single: u64,
    dropped: u64,
    /// The first dropped stream indices (at most [`DROPPED_SHOWN`]).
    dropped_first: Vec<u64>,
    /// Aligned tokens of the lengths that fit: the regular bins' loads (u128: lengths near
    /// 2^64 cannot wrap it).
    fit_tokens: u128,
    /// The regular bins' loads in each limit.
    fit_loads: Vec<u128>,
    /// Items in regular bins (for the segment limit's bound).
    fit_items: u64,
}

/// How many dropped indices the summary names.
const DROPPED_SHOWN: usize = 10;

/// Runs `stowplan pack --stream`.
pub fn run(s: Settings, common: &Common) -> Result<(), Failure> {
    let (reader, source) = common.input.open()?;
    let options = StreamOptions {
        capacity: s.capacity,
        align: s.align,
        max_open_bins: s.max_open_bins,
        max_buffered: s.max_buffered,
        oversize: s.oversize,
    };
    let ready = ReadyKernel::new(common.backend)?;
    let limited = !s.limits.is_empty() || s.max_segments > 0;
    let mut packer = if limited {
        let limits = StreamLimits {
            caps: s.limits.iter().map(|&(_, c)| c).collect(),
            names: s.limits.iter().map(|(n, _)| n.clone()).collect(),
            max_segments: s.max_segments,
        };
        Packer::Limited(ready.kernel.limited_stream_packer(&options, &limits)?)
    } else {
        Packer::Plain(ready.kernel.stream_packer(&options)?)
    };
    let caps: Vec<u64> = s.limits.iter().map(|&(_, c)| c).collect();
    let start = Instant::now();
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let write_err = |e: std::io::Error| Failure::bad(format!("writing the bins: {e}"));
    let mut tally = Tally::default();
    let mut emit = |packer: &mut Packer, rows: &[u64], tally: &mut Tally| -> Result<(), Failure> {
        let closed = packer.add(rows)?;
        tally.lengths += (rows.len() / (caps.len() + 1)) as u64;
        tally.count(&closed, s.capacity, &caps);
        write_bins(&mut out, &closed.closed, common.json).map_err(write_err)?;
        out.flush().map_err(write_err)
    };
    if s.limits.is_empty() {
        let mut lines = LengthLines::new();
        let mut lengths: Vec<u64> = Vec::new();
        let mut seen_text = false;
        loop {
            let piece = reader.fill_buf().map_err(|e| Failure::bad(format!("reading {source}: {e}")))?;
            if piece.is_empty() {
                break;
            }
            if !seen_text && let Some(&first) = piece.iter().find(|b| !b.is_ascii_whitespace()) {
                seen_text = true;
                if first == b'[' {
                    return Err(Failure::bad(format!(
                        "{source}: --stream reads one length per line, not a JSON array"
                    )));
                }
            }
            let n = piece.len();
            lines.feed(piece, &mut lengths).map_err(|e| Failure::bad(format!("{source}: {e}")))?;
            reader.consume(n);
            if !lengths.is_empty() {
                emit(&mut packer, &lengths, &mut tally)?;
                lengths.clear();
            }
        }
        lines.finish(&mut lengths).map_err(|e| Failure::bad(format!("{source}: {e}")))?;
        if tally.lengths == 0 && lengths.is_empty() {
            return Err(Failure::bad(format!("{source}: no lengths (one integer per line expected)")));
        }
        emit(&mut packer, &lengths, &mut tally)?;
    } else {
        // A table: the header names the columns (tokens first), then a row per line, fed in
        // batches of rows; each line at most MAX_TABLE_LINE bytes.
        let names: Vec<&str> = s.limits.iter().map(|(n, _)| n.as_str()).collect();
        let mut table: Option<TableRows> = None;
        let mut rows: Vec<u64> = Vec::new();
        let mut line: Vec<u8> = Vec::new();
        let mut no = 0u64;
        loop {
            line.clear();
            // At most MAX_TABLE_LINE bytes and the newline are read: a longer line is refused.
            let limit = (MAX_TABLE_LINE + 1) as u64;
            let read = (&mut reader)
                .take(limit)
                .read_until(b'\n', &mut line)
                .map_err(|e| Failure::bad(format!("reading {source}: {e}")))?;
            if read == 0 {
                break;
            }
            no += 1;
            if line.len() > MAX_TABLE_LINE && line.last() != Some(&b'\n') {
                return Err(Failure::bad(format!("{source}: table, line {no}: longer than {MAX_TABLE_LINE} bytes")));
            }
            let Ok(text) = std::str::from_utf8(&line) else {
                return Err(Failure::bad(format!("{source}: table, line {no}: not UTF-8 text")));
            };
            if TableRows::skipped(text) {
                continue;
            }
            match &table {
                None => table = Some(TableRows::new(text, &names).map_err(|e| Failure::bad(format!("{source}: {e}")))?),
                Some(t) => t.row(no, text, &mut rows).map_err(|e| Failure::bad(format!("{source}: {e}")))?,
            }
            if rows.len() >= ROWS_PER_CALL * (names.len() + 1) {
                emit(&mut packer, &rows, &mut tally)?;
                rows.clear();
            }
        }
        if table.is_none() {
            return Err(Failure::bad(format!(
                "{source}: the table is empty: it needs a header line naming its columns"
            )));
        }
        if tally.lengths == 0 && rows.is_empty() {
            return Err(Failure::bad(format!("{source}: the table has a header and no rows")));
        }
        emit(&mut packer, &rows, &mut tally)?;
    }
    let closed = packer.finish()?;
    tally.count(&closed, s.capacity, &caps);
    write_bins(&mut out, &closed.closed, common.json).map_err(write_err)?;
    out.flush().map_err(write_err)?;
    let seconds = start.elapsed().as_secs_f64();
    // The largest bound over the tokens, each limit and the segments.
    let mut lower = tally.fit_tokens.div_ceil(u128::from(s.capacity));
    for (sum, &cap) in tally.fit_loads.iter().zip(&caps) {
        lower = lower.max(sum.div_ceil(u128::from(cap)));
    }
    if s.max_segments > 0 {
        lower = lower.max(u128::from(tally.fit_items.div_ceil(s.max_segments)));
    }
    let regular = u128::from(tally.bins - tally.single);
    let dropped = match tally.dropped {
        0 => "0 dropped".to_string(),
        n => {
            let shown: Vec<String> = tally.dropped_first.iter().map(u64::to_string).collect();
            let more = if n as usize > shown.len() { ", …" } else { "" };
            format!("{n} dropped (stream indices {}{more})", shown.join(", "))
        }
    };
    eprintln!(
        "stream of {} lengths from {source} into bins of {} tokens{}: {} bins{} (lower bound {lower} for the items \
         that fit, +{:.3}%), {dropped}; max open bins {}, max buffered {}, oversize {}, backend {}; \
         {:.3} s, {:.1} M lengths/s{}",
        tally.lengths,
        s.capacity,
        limits_text(&s),
        tally.bins,
        if tally.single > 0 { format!(" ({} single)", tally.single) } else { String::new() },
        100.0 * regular.saturating_sub(lower) as f64 / lower.max(1) as f64,
        s.max_open_bins,
        s.max_buffered,
        s.oversize.as_str(),
        common.backend,
        seconds,
        tally.lengths as f64 / seconds.max(1e-9) / 1e6,
        peak_memory().map(|kib| format!(", peak memory {:.1} MiB", kib as f64 / 1024.0)).unwrap_or_default(),
    );
    Ok(())
}

/// The limits for the summary: ` and at most 8192 image_tokens, 32 images, 64 segments`.
fn limits_text(s: &Settings) -> String {
    let mut parts: Vec<String> = s.limits.iter().map(|(n, c)| format!("{c} {n}")).collect();
    if s.max_segments > 0 {
        parts.push(format!("{} segments", s.max_segments));
    }
    if parts.is_empty() { String::new() } else { format!(" and at most {}", parts.join(", ")) }
}

/// This process's peak resident memory in KiB (`VmHWM` of /proc/self/status: the high-water
/// mark of this program's own memory, not of the process it was forked from); `None` where
/// there is no procfs.
fn peak_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Rows of a table fed to the packer per call.
const ROWS_PER_CALL: usize = 4096;

impl Tally {
    /// Counts closed bins. Every length that fits ends in a regular bin (load ≤ capacity and
    /// each limit's `caps`), so their loads add up to the aligned tokens the lower bound
    /// needs; a load above the capacity or a cap is an oversized item alone.
    fn count(&mut self, c: &LimitedClosedBins, capacity: u64, caps: &[u64]) {
        let closed = &c.closed;
        self.bins += closed.bins() as u64;
        for (b, &load) in closed.loads.iter().enumerate() {
            let over_a_limit = (0..caps.len()).any(|q| c.resource_loads[b * caps.len() + q] > caps[q]);
            if load > capacity || over_a_limit {
                self.single += 1;
            } else {
                self.fit_tokens += u128::from(load);
                self.fit_loads.resize(caps.len(), 0);
                for q in 0..caps.len() {
                    self.fit_loads[q] += u128::from(c.resource_loads[b * caps.len() + q]);
                }
                self.fit_items += closed.bin(b).len() as u64;
            }
        }
        self.dropped += closed.dropped.len() as u64;
        let room = DROPPED_SHOWN.saturating_sub(self.dropped_first.len());
        self.dropped_first.extend(closed.dropped.iter().take(room));
    }
}

/// One line per bin: indices separated by spaces, or a JSON array.
fn write_bins(out: &mut impl Write, closed: &ClosedBins, json: bool) -> std::io::Result<()> {
    let mut digits = itoa::Buffer::new();
    for b in 0..closed.bins() {
        let members = closed.bin(b);
        if json {
            out.write_all(b"[")?;
        }
        for (k, &i) in members.iter().enumerate() {
            if k > 0 {
                out.write_all(if json { b", " } else { b" " })?;
            }
            out.write_all(digits.format(i).as_bytes())?;
        }
        out.write_all(if json { b"]\n" } else { b"\n" })?;
    }
    Ok(())
}
