//! `stowplan plan`: a static pack plan of a whole SFT dataset (the static pack plan contract).

use std::fmt;
use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use stowplan::input::WORKLOADS;
use stowplan::{
    Backend, StaticPackPlan,
    kernel::{MicroLimits, MultiMethod, Named, PlanLimits, PlanOptions},
    plan::length_cache::LengthCache,
};

use crate::common::{ReadyKernel, name, named, print_report};
use crate::failure::Failure;
use crate::input::{InputLimit, Text, read_path};
use crate::limits::{Limits, parse_limit, read_rows, split_rows};

/// The options of `stowplan plan`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The dataset's sample lengths: one integer per line or a JSON array (or, with
    /// --column, a column of a tab/comma/space separated file, or of an Arrow IPC file such as
    /// a `datasets` cache file); `-` reads standard input. Without it the built-in workload
    /// (4,096 RL rollout lengths) is used.
    #[arg(long)]
    lengths: Option<PathBuf>,
    /// The most input read.
    #[command(flatten)]
    limit: InputLimit,
    /// Read lengths from this column: of a delimited text file, its 1-based number (a
    /// non-numeric first line is a header); of an Arrow IPC file (file or stream, recognized by
    /// its first bytes), its name: a list column gives each row's length (e.g. input_ids), an
    /// integer column the lengths themselves (a build with the `arrow` feature; the file is
    /// memory-mapped, so --max-input-mib does not apply).
    #[arg(long)]
    column: Option<String>,
    /// The hard cap of a multi-sample pack, tokens (≥ 1).
    #[arg(long, required_unless_present = "packing_length")]
    capacity: Option<u64>,
    /// The former name of --capacity, accepted with a warning for one release.
    #[arg(long, hide = true, conflicts_with = "capacity")]
    packing_length: Option<u64>,
    /// Learner ranks the plan is aligned for (≥ 1).
    #[arg(long, default_value_t = 1)]
    world_size: u32,
    /// Drop the last N_raw_packs mod WORLD_SIZE packs instead of repeating the first ones.
    #[arg(long)]
    drop_last: bool,
    /// Emit samples with length ≥ CAPACITY as single-sample packs (default: drop them,
    /// listed in the summary).
    #[arg(long)]
    allow_single_long: bool,
    /// Round every length up to a multiple of ALIGN (≥ 1) before packing.
    #[arg(long, default_value_t = PlanOptions::new(1).align)]
    align: u64,
    /// Keep the lengths in a run-scoped cache directory (fingerprinted by the file's sha256
    /// and the column); a later run with the same inputs reads them from there.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Another limit per multi-sample pack, NAME=CAP: the input is then a table whose header
    /// names its columns, tokens first (as `vlm-mix-100k.tsv`), and NAME is a column (e.g.
    /// --limit image_tokens=8192 --limit images=32). Up to 7 limits; a sample over one is long
    /// (see --allow-single-long). The plan file records every limit and checks it on load.
    #[arg(long = "limit", value_name = "NAME=CAP", value_parser = parse_limit,
          conflicts_with_all = ["column", "cache_dir"])]
    limits: Vec<(String, u64)>,
    /// At most this many samples (segments) per multi-sample pack; 0 means no limit.
    #[arg(long, default_value_t = 0, conflicts_with = "cache_dir")]
    max_segments: u64,
    /// With --limit or --max-segments: how the samples are packed (balanced fill by default,
    /// or best-fit / first-fit decreasing, next-fit). Without them the plan is best-fit
    /// decreasing on tokens, as the static pack plan contract fixes.
    #[arg(long, value_parser = named::<MultiMethod>())]
    method: Option<MultiMethod>,
    /// Write the plan here (format stowplan.static-pack-plan/2, or /3 with limits; every field
    /// checksummed and verified on load).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Which kernel builds the plan: the WASM component (default) or the same code natively.
    #[arg(long, value_parser = named::<Backend>(), default_value_t = Backend::default())]
    backend: Backend,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// The length cache used (`--cache-dir`).
#[derive(Debug, Serialize)]
struct CacheNote {
    /// The cache file.
    path: String,
    /// Its fingerprint (dataset identity and reader configuration).
    fingerprint: String,
    /// Lengths read from the cache instead of the input.
    reused: u64,
}

/// What `stowplan plan` reports.
#[derive(Debug, Serialize)]
struct Report<'a> {
    /// Always `plan`.
    operation: &'static str,
    /// Where the lengths came from.
    source: String,
    /// The kernel that built the plan.
    #[serde(serialize_with = "name")]
    backend: Backend,
    /// Number of samples.
    samples: usize,
    /// The hard cap of a multi-sample pack.
    capacity: u64,
    /// Lengths were rounded up to a multiple of this.
    align: u64,
    /// Whether long samples got packs of their own.
    allow_single_long: bool,
    /// Ranks the plan is aligned for.
    world_size: u32,
    /// Whether the last packs were dropped instead of repeating the first ones.
    drop_last: bool,
    /// Packs of the raw plan.
    n_raw_packs: u64,
    /// Packs of the aligned plan.
    n_aligned_packs: usize,
    /// Packs per rank.
    packs_per_rank: usize,
    /// No raw plan has fewer packs.
    lower_bound: u64,
    /// Tokens in multi-sample packs / (multi-sample packs × capacity).
    efficiency: f64,
    /// Real tokens packed, every pack.
    real_tokens: u64,
    /// Real tokens of the single-long packs (each may be over `capacity`).
    single_long_tokens: u64,
    /// Samples alone in a pack (length ≥ capacity, `--allow-single-long`).
    single_long: usize,
    /// Samples dropped for their length.
    dropped_long: usize,
    /// Packs repeated to align the plan.
    pad_needed: u32,
    /// The repeated packs (indices into the raw plan).
    repeated_packs: &'a [u32],
    /// Packs dropped at the end (`--drop-last`).
    dropped_packs: u32,
    /// Samples of the dropped packs.
    dropped_pack_samples: u64,
    /// sha256 of the raw plan.
    raw_checksum: String,
    /// sha256 of the aligned plan.
    aligned_checksum: String,
    /// With `--limit` or `--max-segments`: the packing method.
    #[serde(skip_serializing_if = "Option::is_none")]
    method: Option<&'static str>,
    /// With `--limit` or `--max-segments`: every limit, the tokens first.
    #[serde(skip_serializing_if = "Option::is_none")]
    limits: Option<Limits>,
    /// Where the plan was written (`--out`).
    out: Option<String>,
    /// The length cache (`--cache-dir`).
    cache: Option<CacheNote>,
    /// Milliseconds reading (and parsing) the lengths.
    read_ms: f64,
    /// Milliseconds to get the kernel ready.
    init_ms: f64,
    /// Milliseconds building the plan.
    plan_ms: f64,
}

/// Runs `stowplan plan`.
pub fn run(a: Args) -> Result<(), Failure> {
    // clap requires one of the two (`required_unless_present`).
    let capacity = crate::common::capacity("plan", a.capacity, ("packing-length", a.packing_length)).unwrap_or(0);
    let t0 = Instant::now();
    let limited = !a.limits.is_empty() || a.max_segments > 0;
    if a.method.is_some() && !limited {
        return Err(Failure::bad(
            "--method applies with --limit or --max-segments; a plan of tokens only is best-fit decreasing",
        ));
    }
    let arrow = match &a.lengths {
        Some(path) => crate::arrow::sniff(path)?.map(|format| (path, format)),
        None => None,
    };
    let text = match (&a.lengths, arrow) {
        (Some(_), Some(_)) => Text { text: String::new(), source: String::new() },
        (Some(path), None) => read_path(path, a.limit)?,
        (None, _) => Text::builtin(&WORKLOADS[0]),
    };
    let source = match (arrow, &a.column) {
        (Some((path, _)), Some(name)) => format!("{} (column {name})", path.display()),
        _ => text.source.clone(),
    };
    let column = match (&a.column, arrow) {
        (Some(c), None) => Some(c.parse::<usize>().ok().filter(|&c| c >= 1).ok_or_else(|| {
            Failure::bad(format!(
                "--column {c:?}: a text file's column is its 1-based number (a column name needs an Arrow IPC file)"
            ))
        })?),
        _ => None,
    };
    let parse = |text: &str| {
        match column {
            Some(c) => stowplan::input::parse_column(text, c),
            None => stowplan::input::parse_lengths(text),
        }
        .map_err(|e| Failure::bad(format!("{source}: {e}")))
    };
    let mut cache = None;
    let mut extra = Vec::new();
    let lengths = match (&a.cache_dir, arrow) {
        // (--limit needs no special case: clap refuses it beside --column, which Arrow needs.)
        (_, Some((path, format))) => {
            let name = a.column.as_deref().ok_or_else(|| {
                Failure::bad(format!(
                    "{} is an Arrow IPC {format}: name the column of token ids (or of lengths) with --column, e.g. --column input_ids",
                    path.display()
                ))
            })?;
            if a.cache_dir.is_some() {
                return Err(Failure::bad(
                    "--cache-dir keeps lengths computed from text: an Arrow IPC file gives its token lengths directly, \
                     from --column",
                ));
            }
            crate::arrow::lengths(path, format, name)?
        }
        (None, None) if !a.limits.is_empty() => {
            // A table: tokens, then one column per limit.
            let (_, rows) = read_rows(&text, &a.limits)?;
            let tokens;
            (tokens, extra) = split_rows(&rows, a.limits.len() + 1);
            tokens
        }
        (None, None) => parse(&text.text)?,
        (Some(dir), None) => {
            // The dataset identity: the content hash (the same data under another path is the
            // same dataset) and how lengths are read from it.
            let identity = format!("sha256:{}", stowplan::runtime::sha256_hex(text.text.as_bytes()));
            let config = serde_json::json!({"column": column, "reader": "stowplan-cli"});
            let samples = parse(&text.text)?;
            let mut c = LengthCache::open(dir, &identity, samples.len(), &config, None)?;
            let reused = c.known();
            let lengths = c.precompute(1, |i| Ok(samples[i]))?.to_vec();
            cache = Some(CacheNote { path: c.path().display().to_string(), fingerprint: c.fingerprint(), reused });
            lengths
        }
    };
    let read_ms = t0.elapsed().as_secs_f64() * 1e3;
    let kernel = ReadyKernel::new(a.backend)?;
    let options = PlanOptions { align: a.align, allow_single_long: a.allow_single_long, ..PlanOptions::new(capacity) };
    let t = Instant::now();
    let names: Vec<String> = a.limits.iter().map(|(n, _)| n.clone()).collect();
    let caps: Vec<u64> = a.limits.iter().map(|&(_, c)| c).collect();
    let limits = PlanLimits {
        limits: MicroLimits { sizes: &extra, caps: &caps, names: &names },
        max_segments: a.max_segments,
        method: a.method.unwrap_or_default(),
    };
    let plan = StaticPackPlan::build_limited(&kernel.kernel, &lengths, &options, &limits, a.world_size, a.drop_last)?;
    let plan_ms = t.elapsed().as_secs_f64() * 1e3;
    plan.log();
    if let Some(out) = &a.out {
        plan.save(out)?;
    }
    let report = Report {
        operation: "plan",
        source,
        backend: kernel.kernel.backend(),
        samples: lengths.len(),
        capacity,
        align: a.align,
        allow_single_long: a.allow_single_long,
        world_size: a.world_size,
        drop_last: a.drop_last,
        n_raw_packs: plan.raw_len() as u64,
        n_aligned_packs: plan.len(),
        packs_per_rank: plan.per_rank(),
        lower_bound: plan.raw.lower_bound,
        efficiency: plan.efficiency(),
        real_tokens: plan.raw.real_tokens,
        single_long_tokens: plan.single_long_tokens(),
        single_long: plan.raw.single_long.len(),
        dropped_long: plan.raw.dropped.len(),
        pad_needed: plan.aligned.pad_needed,
        repeated_packs: &plan.aligned.packs[plan.raw_len().min(plan.len())..],
        dropped_packs: plan.aligned.dropped_packs,
        dropped_pack_samples: plan.aligned.dropped_samples,
        raw_checksum: plan.raw_checksum(),
        aligned_checksum: plan.aligned_checksum(),
        method: plan.limits.as_ref().map(|l| l.method.as_str()),
        limits: plan.limits.as_ref().map(|l| {
            let mut names = vec!["tokens".to_string()];
            names.extend(l.names.iter().cloned());
            let mut caps = vec![capacity];
            caps.extend(&l.caps);
            let e = l.names.len();
            // Each multi-sample pack's loads, tokens (aligned, as the cap counts them) first.
            let aligned = |p: usize| -> u64 {
                plan.raw.pack(p).iter().map(|&i| lengths[i as usize].div_ceil(a.align) * a.align).sum()
            };
            let rows: Vec<Vec<u64>> = (0..plan.raw_len())
                .filter(|&p| {
                    plan.raw.pack(p).len() > 1 || plan.raw.single_long.binary_search(&plan.raw.pack(p)[0]).is_err()
                })
                .map(|p| std::iter::once(aligned(p)).chain(l.loads[p * e..(p + 1) * e].iter().copied()).collect())
                .collect();
            Limits::new(names, &caps, l.max_segments, &l.lower_bounds, rows.iter().map(Vec::as_slice))
        }),
        out: a.out.as_ref().map(|p| p.display().to_string()),
        cache,
        read_ms,
        init_ms: kernel.init_ms,
        plan_ms,
    };
    print_report(&report, a.json)
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let single = self.single_long as u64;
        let regular_bound = self.lower_bound.saturating_sub(single);
        let over = self.n_raw_packs.saturating_sub(single).saturating_sub(regular_bound);
        if self.dropped_long > 0 {
            // First, where it cannot be missed: these samples are in no pack.
            writeln!(
                f,
                "dropped {} of {} samples: length >= capacity {}{}; --allow-single-long keeps them",
                self.dropped_long,
                self.samples,
                self.capacity,
                if self.limits.is_some() { " or over a limit" } else { "" }
            )?;
        }
        writeln!(
            f,
            "static pack plan of {} samples from {}, capacity {}, align {}, backend {}",
            self.samples, self.source, self.capacity, self.align, self.backend
        )?;
        writeln!(
            f,
            "  raw packs     {:>12}  (lower bound {}; {over} over = {:.3}%)",
            self.n_raw_packs,
            self.lower_bound,
            100.0 * over as f64 / regular_bound.max(1) as f64
        )?;
        writeln!(
            f,
            "  aligned packs {:>12}  (world_size {}, {} per rank, drop_last {})",
            self.n_aligned_packs, self.world_size, self.packs_per_rank, self.drop_last
        )?;
        if self.pad_needed > 0 {
            writeln!(f, "  repeated      {:>12}  packs from the start of the raw plan", self.pad_needed)?;
        }
        if self.dropped_packs > 0 {
            writeln!(
                f,
                "  dropped       {:>12}  packs at the end ({} samples never trained on)",
                self.dropped_packs, self.dropped_pack_samples
            )?;
        }
        writeln!(
            f,
            "  efficiency    {:>11.3}%  (tokens in multi-sample packs / (multi-sample packs × capacity))",
            100.0 * self.efficiency
        )?;
        let multi_packs = self.n_raw_packs - self.single_long as u64;
        writeln!(
            f,
            "  real tokens   {:>12}  ({} in {} multi-sample packs, {} in {} single-long packs)",
            self.real_tokens,
            self.real_tokens - self.single_long_tokens,
            multi_packs,
            self.single_long_tokens,
            self.single_long
        )?;
        writeln!(
            f,
            "  long samples  {:>12}  single-long packs, {} dropped{}",
            self.single_long,
            self.dropped_long,
            match (self.dropped_long, self.limits.is_some()) {
                (0, _) => "",
                (_, false) => " (length >= capacity; --allow-single-long keeps them)",
                (_, true) => " (length >= capacity or over a limit; --allow-single-long keeps them)",
            }
        )?;
        if let Some(l) = &self.limits {
            writeln!(f, "  method        {:>12}", self.method.unwrap_or_default())?;
            l.write(f, "pack", "packs")?;
        }
        writeln!(f, "  raw sha256    {}", self.raw_checksum)?;
        writeln!(f, "  aligned sha256 {}", self.aligned_checksum)?;
        if let Some(out) = &self.out {
            writeln!(f, "  written to    {out}")?;
        }
        if let Some(c) = &self.cache {
            writeln!(f, "  length cache  {} ({} lengths reused)", c.path, c.reused)?;
        }
        writeln!(
            f,
            "  time          {:>12.3} ms  (reading {:.1} ms, kernel ready in {:.1} ms)",
            self.plan_ms, self.read_ms, self.init_ms
        )
    }
}
