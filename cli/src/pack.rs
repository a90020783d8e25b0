//! `stowplan pack`: pack lengths into bins of at most CAPACITY tokens.

use std::fmt;

use serde::Serialize;
use stowplan::json::Bins;
use stowplan::kernel::stream::{DEFAULT_MAX_BUFFERED, DEFAULT_MAX_OPEN_BINS, MAX_BUFFERED, MAX_OPEN_BINS};
use stowplan::kernel::{MultiMethod, MultiOptions, MultiPacking, Named, OversizePolicy, PackOptions, Packing};

use crate::common::{Common, KernelRun, ReadyKernel, name, named, print_report};
use crate::failure::Failure;
use crate::limits::{Limits, parse_limit, read_rows};

/// The options of `stowplan pack`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tokens per bin (≥ 1).
    #[arg(long, short = 'c', default_value_t = 16_384)]
    capacity: u64,
    /// Round every length up to a multiple of ALIGN (≥ 1) before packing.
    #[arg(long, default_value_t = PackOptions::new(1).align)]
    align: u64,
    /// Algorithm: best-fit decreasing, first-fit decreasing, order-preserving next-fit, or
    /// (with --limit or --max-segments, where it is the default) balanced fill, which fills
    /// packs so that their limits run out together; without limits, balanced is bfd, the
    /// default.
    #[arg(long, value_parser = named::<MultiMethod>(), conflicts_with = "stream")]
    method: Option<MultiMethod>,
    /// What to do with a length above the capacity: fail, give it its own bin, or drop it.
    #[arg(long, value_parser = named::<OversizePolicy>(), default_value_t = OversizePolicy::default())]
    oversize: OversizePolicy,
    /// Another limit per bin besides --capacity tokens, NAME=CAP: the input is then a table
    /// whose header names its columns, tokens first (tab-, comma- or space-separated, as
    /// `vlm-mix-100k.tsv`), and NAME is a column (e.g. --limit image_tokens=8192 --limit
    /// images=32). Up to 7 limits; every bin stays within every one. With --stream the table
    /// is read row by row.
    #[arg(long = "limit", value_name = "NAME=CAP", value_parser = parse_limit)]
    limits: Vec<(String, u64)>,
    /// At most this many sequences (segments) per bin; 0 means no limit.
    #[arg(long, default_value_t = 0)]
    max_segments: u64,
    /// Pack the lengths as they arrive (one per line; any amount, memory stays bounded):
    /// each bin is written when it closes, one line of input indices (a JSON array with
    /// --json), and a summary goes to stderr. Best fit with at most --max-open-bins bins open
    /// and --max-buffered lengths waiting (see `wit/kernel.wit`, `streaming`).
    #[arg(long)]
    stream: bool,
    /// With --stream: bins open at most (1 ..= 65536).
    #[arg(long, requires = "stream", default_value_t = DEFAULT_MAX_OPEN_BINS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_OPEN_BINS)))]
    max_open_bins: u32,
    /// With --stream: lengths waiting to be placed at most (0 ..= 1048576; 0 places each on
    /// arrival).
    #[arg(long, requires = "stream", default_value_t = DEFAULT_MAX_BUFFERED,
          value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_BUFFERED)))]
    max_buffered: u32,
    /// Input, backend and output format.
    #[command(flatten)]
    common: Common,
}

/// The limits of a packing under several limits, in a report: every limit and the bins'
/// loads.
#[derive(Debug, Serialize)]
struct MultiLimits {
    /// The limits.
    #[serde(flatten)]
    limits: Limits,
    /// Each bin's load in every resource, in the order of `resources`.
    resource_loads: Vec<Vec<u64>>,
}

impl MultiLimits {
    fn new(names: Vec<String>, caps: &[u64], max_segments: u64, p: &MultiPacking) -> Self {
        let resource_loads: Vec<Vec<u64>> = p.resource_loads.chunks(caps.len()).map(<[u64]>::to_vec).collect();
        let regular = resource_loads
            .iter()
            .enumerate()
            .filter(|&(b, _)| p.packing.single.binary_search(&p.packing.bin(b)[0]).is_err())
            .map(|(_, l)| l.as_slice());
        let limits = Limits::new(names, caps, max_segments, &p.lower_bounds, regular);
        MultiLimits { limits, resource_loads }
    }
}

/// What `stowplan pack` reports.
#[derive(Debug, Serialize)]
struct Report {
    /// The packing.
    #[serde(flatten)]
    result: Bins,
    /// Always `pack`.
    operation: &'static str,
    /// Where the lengths came from.
    source: String,
    /// The algorithm (`pack`'s name without limits, `pack_multi`'s with them).
    method: &'static str,
    /// Tokens per bin.
    capacity: u64,
    /// Lengths were rounded up to a multiple of this.
    align: u64,
    /// The oversize policy.
    #[serde(serialize_with = "name")]
    oversize: OversizePolicy,
    /// Number of lengths.
    n: usize,
    /// Real tokens / (regular bins × capacity).
    efficiency: f64,
    /// With `--limit` or `--max-segments`: every limit and the bins' loads.
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    limits: Option<MultiLimits>,
    /// Kernel and timings.
    #[serde(flatten)]
    run: KernelRun,
}

impl Report {
    /// The report of packing `tokens` (the real lengths) from `source` into `p`.
    fn new(a: &Args, source: String, p: &Packing, tokens: &[u64], limits: Option<MultiLimits>, run: KernelRun) -> Self {
        let method = match (&limits, a.method.unwrap_or_default()) {
            (Some(_), m) => m.as_str(),
            (None, m) => m.single().as_str(),
        };
        Report {
            efficiency: p.efficiency(tokens, a.capacity),
            result: Bins::from(p),
            operation: "pack",
            source,
            method,
            capacity: a.capacity,
            align: a.align,
            oversize: a.oversize,
            n: tokens.len(),
            limits,
            run,
        }
    }
}

/// Runs `stowplan pack`.
pub fn run(a: Args) -> Result<(), Failure> {
    if a.stream {
        let settings = crate::stream::Settings {
            capacity: a.capacity,
            align: a.align,
            max_open_bins: a.max_open_bins,
            max_buffered: a.max_buffered,
            oversize: a.oversize,
            limits: a.limits,
            max_segments: a.max_segments,
        };
        return crate::stream::run(settings, &a.common);
    }
    let text = a.common.input.read()?;
    if !a.limits.is_empty() || a.max_segments > 0 {
        return run_multi(a, text);
    }
    let lengths = text.lengths()?;
    let method = a.method.unwrap_or_default().single();
    let options = PackOptions { align: a.align, method, oversize: a.oversize, ..PackOptions::new(a.capacity) };
    let kernel = ReadyKernel::new(a.common.backend)?;
    let (p, run) = kernel.timed(|k| k.pack(&lengths, &options))?;
    print_report(&Report::new(&a, text.source, &p, &lengths, None, run), a.common.json)
}

/// `stowplan pack` with `--limit` or `--max-segments`: a table in, the kernel's packing
/// under several limits out.
fn run_multi(a: Args, text: crate::input::Text) -> Result<(), Failure> {
    let (first, sizes) = read_rows(&text, &a.limits)?;
    let mut caps = vec![a.capacity];
    caps.extend(a.limits.iter().map(|&(_, c)| c));
    let mut all_names = vec![first];
    all_names.extend(a.limits.iter().map(|(n, _)| n.clone()));
    let options = MultiOptions {
        capacities: &caps,
        names: &all_names,
        max_segments: a.max_segments,
        align: a.align,
        method: a.method.unwrap_or_default(),
        oversize: a.oversize,
    };
    let kernel = ReadyKernel::new(a.common.backend)?;
    let (p, run) = kernel.timed(|k| k.pack_multi(&sizes, &options))?;
    let tokens: Vec<u64> = sizes.iter().step_by(caps.len()).copied().collect();
    let limits = MultiLimits::new(all_names, &caps, a.max_segments, &p);
    print_report(&Report::new(&a, text.source, &p.packing, &tokens, Some(limits), run), a.common.json)
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = &self.result;
        let bins = r.bins.len() as u64;
        let over = bins.saturating_sub(r.single.len() as u64).saturating_sub(r.lower_bound);
        writeln!(f, "packing of {} lengths from {} into bins of {} tokens", self.n, self.source, self.capacity)?;
        writeln!(
            f,
            "  method {}, align {}, oversize {}, backend {}",
            self.method, self.align, self.oversize, self.run.backend
        )?;
        let singles = if r.single.is_empty() { String::new() } else { format!(", + {} single bins", r.single.len()) };
        writeln!(f, "  bins         {bins:>12}  (lower bound {} for the items that fit{singles})", r.lower_bound)?;
        writeln!(f, "  over bound   {over:>12}  ({:.3}%)", 100.0 * over as f64 / r.lower_bound.max(1) as f64)?;
        writeln!(f, "  real tokens  {:>12}", r.real_tokens)?;
        writeln!(f, "  align pad    {:>12}  tokens", r.padding_tokens)?;
        writeln!(f, "  efficiency   {:>11.3}%  (real tokens / (regular bins × capacity))", 100.0 * self.efficiency)?;
        writeln!(f, "  oversized    {:>12}  single, {} dropped", r.single.len(), r.dropped.len())?;
        if let Some(l) = &self.limits {
            l.limits.write(f, "bin", "bins")?;
        }
        self.run.time_line(f, 13, 12)
    }
}
