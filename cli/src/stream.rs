//! `stowplan pack --stream`: pack lengths as they arrive, writing each bin when it closes.
//!
//! Input is read in whatever pieces the source delivers (a pipe that trickles gives its bins
//! as soon as they close; a file is read a MiB at a time) and fed to the kernel's streaming
//! packer; memory stays bounded by `--max-open-bins` and `--max-buffered` however long the
//! input. Each closed bin is one line of input indices (0-based): space-separated, or a JSON
//! array with `--json`. A summary goes to stderr.

use std::io::{BufRead, BufReader, Write};
use std::time::Instant;

use stowplan::input::LengthLines;
use stowplan::{Closed, Named, OversizePolicy, StreamOptions};

use crate::common::{Common, ReadyKernel};
use crate::failure::Failure;

/// The streaming options of `stowplan pack`.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Tokens per bin.
    pub capacity: u64,
    /// Lengths rounded up to a multiple of this.
    pub align: u64,
    /// Open bins at most.
    pub max_open_bins: u32,
    /// Buffered items at most.
    pub max_buffered: u32,
    /// Items above the capacity.
    pub oversize: OversizePolicy,
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
    let mut packer = ready.kernel.stream_packer(&options)?;
    let start = Instant::now();
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let mut out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
    let write_err = |e: std::io::Error| Failure::bad(format!("writing the bins: {e}"));
    let mut lines = LengthLines::new();
    let mut lengths: Vec<u64> = Vec::new();
    let mut tally = Tally::default();
    let mut seen_text = false;
    loop {
        let piece = reader.fill_buf().map_err(|e| Failure::bad(format!("reading {source}: {e}")))?;
        if piece.is_empty() {
            break;
        }
        if !seen_text && let Some(&first) = piece.iter().find(|b| !b.is_ascii_whitespace()) {
            seen_text = true;
            if first == b'[' {
                return Err(Failure::bad(format!("{source}: --stream reads one length per line, not a JSON array")));
            }
        }
        let n = piece.len();
        lines.feed(piece, &mut lengths).map_err(|e| Failure::bad(format!("{source}: {e}")))?;
        reader.consume(n);
        if !lengths.is_empty() {
            let closed = add(&mut packer, &lengths, s, &mut tally)?;
            write_bins(&mut out, &closed, common.json).map_err(write_err)?;
            out.flush().map_err(write_err)?;
            lengths.clear();
        }
    }
    lines.finish(&mut lengths).map_err(|e| Failure::bad(format!("{source}: {e}")))?;
    if tally.lengths == 0 && lengths.is_empty() {
        return Err(Failure::bad(format!("{source}: no lengths (one integer per line expected)")));
    }
    let closed = add(&mut packer, &lengths, s, &mut tally)?;
    write_bins(&mut out, &closed, common.json).map_err(write_err)?;
    let closed = packer.finish()?;
    tally.count(&closed, s.capacity);
    write_bins(&mut out, &closed, common.json).map_err(write_err)?;
    out.flush().map_err(write_err)?;
    let seconds = start.elapsed().as_secs_f64();
    let lower = tally.fit_tokens.div_ceil(u128::from(s.capacity));
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
        "stream of {} lengths from {source} into bins of {} tokens: {} bins{} (lower bound {lower} for the items \
         that fit, +{:.3}%), {dropped}; max open bins {}, max buffered {}, oversize {}, backend {}; \
         {:.3} s, {:.1} M lengths/s{}",
        tally.lengths,
        s.capacity,
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

/// This process's peak resident memory in KiB (`VmHWM` of /proc/self/status: the high-water
/// mark of this program's own memory, not of the process it was forked from); `None` where
/// there is no procfs.
fn peak_memory() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Feeds `lengths` to the packer and counts what came out.
fn add(
    packer: &mut stowplan::StreamPacker,
    lengths: &[u64],
    s: Settings,
    tally: &mut Tally,
) -> Result<Closed, Failure> {
    let closed = packer.add(lengths)?;
    tally.lengths += lengths.len() as u64;
    tally.count(&closed, s.capacity);
    Ok(closed)
}

impl Tally {
    /// Counts closed bins. Every length that fits ends in a regular bin (load ≤ capacity),
    /// so their loads add up to the aligned tokens the lower bound needs; a load above the
    /// capacity is an oversized length alone.
    fn count(&mut self, closed: &Closed, capacity: u64) {
        self.bins += closed.bins() as u64;
        for &load in &closed.loads {
            if load > capacity {
                self.single += 1;
            } else {
                self.fit_tokens += u128::from(load);
            }
        }
        self.dropped += closed.dropped.len() as u64;
        let room = DROPPED_SHOWN.saturating_sub(self.dropped_first.len());
        self.dropped_first.extend(closed.dropped.iter().take(room));
    }
}

/// One line per bin: indices separated by spaces, or a JSON array.
fn write_bins(out: &mut impl Write, closed: &Closed, json: bool) -> std::io::Result<()> {
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
