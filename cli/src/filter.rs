//! `stowplan filter`: inspect buffer-filter plugins (WebAssembly components of
//! `stowplan:filter/buffer-filter`).

use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use stowplan::filter::{MAX_PLUGIN_BYTES, hash_plugin, read_plugin};
use stowplan::{
    Error, Filter,
    filter::FilterOptions,
    source::{BufferColumns, FilterContext},
};

use crate::common::{print_human, print_json};
use crate::failure::Failure;

/// The world every plugin exports.
const WORLD: &str = "stowplan:filter/buffer-filter@0.1.0";

/// The subcommands of `stowplan filter`.
#[derive(clap::Subcommand, Debug)]
pub enum Command {
    /// Print a plugin's sha256: the pin to load it with.
    Hash {
        /// Plugin files (.wasm components).
        #[arg(required = true)]
        plugins: Vec<PathBuf>,
        /// MiB of a plugin file at most (1 ..= 65536); a larger file is refused.
        #[arg(long, default_value_t = MAX_PLUGIN_BYTES >> 20, value_parser = clap::value_parser!(u64).range(1..=65_536))]
        max_plugin_mib: u64,
    },
    /// Load a plugin into the sandbox (checks its world and imports), then run it on a
    /// synthetic buffer and report its selections and timings.
    Check(CheckArgs),
}

/// The options of `stowplan filter check`.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// The plugin (.wasm component).
    plugin: PathBuf,
    /// The sha256 pin to check (64 hex digits); without it the file's own hash is used and
    /// printed.
    #[arg(long)]
    sha256: Option<String>,
    /// The plugin's configuration, JSON text.
    #[arg(long, default_value = "{}")]
    config: String,
    /// Buffered groups in the synthetic buffer (1 ..= 1048576; groups × samples per group
    /// at most 1048576).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=MAX_SAMPLES as i64))]
    groups: u32,
    /// Samples per group (1 ..= 65536).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    samples_per_group: u32,
    /// Groups each call asks for (≥ 1).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    wanted: u32,
    /// Timed calls after the first (1 ..= 1000000), on the same instance.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    calls: u32,
    /// Seed of the synthetic buffer.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Deadline per call, in milliseconds (1 ..= 600000).
    #[arg(long, default_value_t = FilterOptions::new("").timeout.as_millis() as u64)]
    timeout_ms: u64,
    /// Fuel per call (≥ 10000); 0 for no fuel bound.
    #[arg(long, default_value_t = FilterOptions::new("").fuel.unwrap_or(0))]
    fuel: u64,
    /// Memory limit in MiB (1 ..= 4096).
    #[arg(long, default_value_t = FilterOptions::new("").memory_limit >> 20)]
    memory_mib: usize,
    /// MiB of the plugin file at most (1 ..= 65536); a larger file is refused.
    #[arg(long, default_value_t = MAX_PLUGIN_BYTES >> 20, value_parser = clap::value_parser!(u64).range(1..=65_536))]
    max_plugin_mib: u64,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// Runs `stowplan filter …`.
pub fn run(command: Command) -> Result<(), Failure> {
    match command {
        Command::Hash { plugins, max_plugin_mib } => hash(&plugins, max_plugin_mib << 20),
        Command::Check(a) => check(a),
    }
}

/// One plugin's pin (`filter hash`), printed as a `sha256sum` line.
#[derive(Debug)]
struct Pin {
    /// The file's sha256.
    sha256: String,
    /// The file.
    path: PathBuf,
}

impl fmt::Display for Pin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}  {}", self.sha256, self.path.display())
    }
}

/// Runs `stowplan filter hash`: one `SHA256  PATH` line per plugin (the `sha256sum` format).
fn hash(plugins: &[PathBuf], max_bytes: u64) -> Result<(), Failure> {
    for path in plugins {
        print_human(&Pin { sha256: hash_plugin(path, max_bytes)?, path: path.clone() })?;
    }
    Ok(())
}

/// The synthetic buffer a check runs on.
#[derive(Debug, Serialize)]
struct Buffer {
    /// Buffered groups.
    groups: usize,
    /// Samples per group.
    samples_per_group: u32,
    /// Seed of the buffer.
    seed: u64,
}

/// What `stowplan filter check` reports.
#[derive(Debug, Serialize)]
struct CheckReport {
    /// The plugin file.
    plugin: String,
    /// Its sha256.
    sha256: String,
    /// Whether a pin was given (and matched).
    pinned: bool,
    /// The world it exports.
    world: &'static str,
    /// What it imports (WASI interfaces and the filter's types).
    imports: Vec<String>,
    /// Milliseconds to load it.
    load_ms: f64,
    /// Where its compiled code came from.
    compiled_from: &'static str,
    /// The synthetic buffer.
    buffer: Buffer,
    /// Groups each call asked for.
    wanted: u32,
    /// The first call's selection.
    selection: Vec<u32>,
    /// Microseconds to encode the buffer's columns once.
    columns_encode_us: f64,
    /// Microseconds of the first call.
    first_call_us: f64,
    /// Timed calls after the first.
    calls: u32,
    /// Median microseconds of a timed call.
    median_us: f64,
    /// 99th percentile.
    p99_us: f64,
    /// Fastest call.
    min_us: f64,
    /// What the first call printed, by stream (`stdout`, `stderr`): a JSON object.
    #[serde(serialize_with = "streams")]
    output: Vec<(&'static str, String)>,
}

/// Serializes a plugin's output as `{"stream": "text", …}`.
fn streams<S: serde::Serializer>(output: &[(&'static str, String)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(output.iter().map(|(stream, text)| (stream, text)))
}

/// The most samples a synthetic buffer holds (a few hundred MB of samples and columns).
const MAX_SAMPLES: u64 = 1 << 20;

/// Runs `stowplan filter check`.
fn check(a: CheckArgs) -> Result<(), Failure> {
    let samples = u64::from(a.groups) * u64::from(a.samples_per_group);
    if samples > MAX_SAMPLES {
        return Err(Failure::bad(format!(
            "--groups × --samples-per-group must be at most {MAX_SAMPLES} samples (got {} × {} = {samples})",
            a.groups, a.samples_per_group
        )));
    }
    let max_plugin_bytes = a.max_plugin_mib << 20;
    let (bytes, own) = read_plugin(&a.plugin, max_plugin_bytes)?;
    let pinned = a.sha256.is_some();
    let options = FilterOptions {
        config: a.config.clone(),
        timeout: Duration::from_millis(a.timeout_ms),
        fuel: (a.fuel > 0).then_some(a.fuel),
        memory_limit: a.memory_mib.saturating_mul(1 << 20),
        max_plugin_bytes,
        ..FilterOptions::new(a.sha256.as_deref().unwrap_or(&own))
    };
    let name = a.plugin.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let t = Instant::now();
    let mut filter = Filter::from_bytes(&name, &bytes, options)?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let groups = stowplan::filter::synthetic_buffer(a.groups as usize, a.samples_per_group as usize, a.seed);
    let t = Instant::now();
    let buffer = BufferColumns::from_groups(&groups);
    let columns_encode_us = t.elapsed().as_secs_f64() * 1e6;
    let ctx = FilterContext { rollout_id: Some(0), wanted: a.wanted, n_samples_per_prompt: a.samples_per_group };
    let t = Instant::now();
    let first = filter.try_select(&ctx, &buffer);
    let first_call_us = t.elapsed().as_secs_f64() * 1e6;
    let output = filter.last_output().to_vec();
    let selection = first.map_err(|e| Failure::bad(format!("the first call failed: {}", Error::from(e))))?;
    let mut times = Vec::with_capacity(a.calls as usize);
    for call in 0..a.calls {
        let t = Instant::now();
        let picks = filter.try_select(&ctx, &buffer);
        times.push(t.elapsed().as_secs_f64() * 1e6);
        picks.map_err(|e| Failure::bad(format!("call {} failed: {}", call + 2, Error::from(e))))?;
    }
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    let report = CheckReport {
        plugin: a.plugin.display().to_string(),
        sha256: filter.sha256().to_string(),
        pinned,
        world: WORLD,
        imports: filter.imports().to_vec(),
        load_ms,
        compiled_from: filter.origin(),
        buffer: Buffer { groups: a.groups as usize, samples_per_group: a.samples_per_group, seed: a.seed },
        wanted: a.wanted,
        selection,
        columns_encode_us,
        first_call_us,
        calls: a.calls,
        median_us: pct(0.5),
        p99_us: pct(0.99),
        min_us: times[0],
        output,
    };
    if a.json { print_json(&report, true) } else { print_human(&report) }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plugin    {}", self.plugin)?;
        if self.pinned {
            writeln!(f, "sha256    {} (matches the pin)", self.sha256)?;
        } else {
            writeln!(f, "sha256    {} (not pinned: load it with this pin)", self.sha256)?;
        }
        writeln!(f, "world     {WORLD}: exports filter.select")?;
        let imports = if self.imports.is_empty() { "none".to_string() } else { self.imports.join(", ") };
        writeln!(f, "imports   {imports}")?;
        writeln!(f, "load      {:.1} ms (code {})", self.load_ms, self.compiled_from)?;
        let b = &self.buffer;
        writeln!(
            f,
            "buffer    {} groups x {} samples (synthetic, seed {}), {} wanted",
            b.groups, b.samples_per_group, b.seed, self.wanted
        )?;
        let shown = &self.selection[..self.selection.len().min(10)];
        let more = if self.selection.len() > shown.len() { " ..." } else { "" };
        writeln!(f, "selection {} groups: {shown:?}{more}", self.selection.len())?;
        writeln!(
            f,
            "columns   {:.1} us to encode the buffer once (a data source keeps them up to date)",
            self.columns_encode_us
        )?;
        writeln!(f, "first     {:.1} us", self.first_call_us)?;
        writeln!(
            f,
            "calls     {}: median {:.1} us, p99 {:.1} us, min {:.1} us (instance reused, validated)",
            self.calls, self.median_us, self.p99_us, self.min_us
        )?;
        for (stream, text) in &self.output {
            writeln!(f, "{stream:<9} {}", text.trim_end().replace('\n', "\n          "))?;
        }
        Ok(())
    }
}
