//! `stowplan`: the command-line face of the kernel.
//!
//! Exit codes: 0 ok, 1 infeasible, 2 bad input or any other error. Logs go to stderr,
//! filtered by `STOWPLAN_LOG` (e.g. `STOWPLAN_LOG=debug`).

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::json;
use stowplan::input::{DEFAULT_WORKLOAD, DEFAULT_WORKLOAD_NAME, parse_lengths};
use stowplan::{
    Backend, Cost, DpOptions, Error, Kernel, MicroOptions, Order, OversizePolicy, PackMethod, PackOptions,
    PartitionMethod, PartitionOptions,
};

#[derive(Parser, Debug)]
#[command(
    name = "stowplan",
    version,
    about = "Plan how variable-length sequences are packed into micro-batches and spread over ranks."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Split lengths (weights) into K groups with balanced sums, e.g. a global batch over DP ranks.
    Partition(PartitionArgs),
    /// Pack lengths into bins of at most CAPACITY tokens, e.g. sequences into packed micro-batches.
    Pack(PackArgs),
    /// Balance a global batch over DP ranks and/or split it into micro-batches of at most
    /// MAX_TOKEN_LEN tokens (a hard cap), balancing a cost model.
    Balance(BalanceArgs),
    /// Build a static pack plan of a whole SFT dataset (seed 002): packs of at most
    /// PACKING_LENGTH tokens, aligned so that WORLD_SIZE ranks get the same number of packs.
    Plan(PlanArgs),
    /// Inspect buffer-filter plugins (WebAssembly components of stowplan:filter/buffer-filter).
    #[command(subcommand)]
    Filter(FilterCommand),
    /// Run the packer: training batches from an orchestrator in, balanced micro-batches out to
    /// every trainer rank, checkpointed with every step (restart resumes with nothing lost).
    Serve(ServeArgs),
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TransportArg {
    /// Files under --root: ROOT/inbox/ in, ROOT/rollouts/step_N/rank_R.bin out.
    Fs,
    /// ZeroMQ over TCP (or ipc://): batches PUSHed to --zmq-batches, receipts published on
    /// --zmq-receipts, ranks connect DEALER sockets to --zmq-ranks.
    Zmq,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per event (structured logs for collectors).
    Json,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// How batches arrive and micro-batches leave.
    #[arg(long, value_enum, default_value_t = TransportArg::Fs)]
    transport: TransportArg,
    /// Directory shared with the orchestrator and the ranks (filesystem transport).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Checkpoint and spool directory; default ROOT/packer (required with --transport zmq
    /// unless --root is given).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// ZeroMQ: where the PULL socket for training batches and run changes binds.
    #[arg(long, default_value = stowplan::serve::ZmqEndpoints::DEFAULT_BATCHES)]
    zmq_batches: String,
    /// ZeroMQ: where the PUB socket for receipts (messages made durable) binds.
    #[arg(long, default_value = stowplan::serve::ZmqEndpoints::DEFAULT_RECEIPTS)]
    zmq_receipts: String,
    /// ZeroMQ: where the ROUTER socket the trainer ranks connect to binds.
    #[arg(long, default_value = stowplan::serve::ZmqEndpoints::DEFAULT_RANKS)]
    zmq_ranks: String,
    /// Tokens of a micro-batch after padding (longer samples are rejected).
    #[arg(long)]
    seq_len: u64,
    /// Data-parallel ranks (every rank gets the same number of micro-batches per step).
    #[arg(long)]
    dp: u32,
    /// Samples of one optimizer step of a run (a run's step advances when this many of its
    /// samples were delivered).
    #[arg(long)]
    batch_size: u64,
    /// Runs (LoRA adapters): run indices are below it and `lora_num_tokens` has this length.
    #[arg(long, default_value_t = 1)]
    num_runs: u32,
    /// Only runs added by a control message are served (default: a run below --num-runs is
    /// added with --batch-size on its first batch).
    #[arg(long)]
    no_auto_add_runs: bool,
    /// Pad every micro-batch to a multiple of this.
    #[arg(long, default_value_t = 1)]
    pad_to_multiple_of: u64,
    /// Token id of padding.
    #[arg(long, default_value_t = 1)]
    pad_token_id: i64,
    /// Cost balanced across ranks: tokens, attention or LINEAR,QUADRATIC.
    #[arg(long, default_value = "tokens", value_parser = parse_cost)]
    cost: Cost,
    /// Pack once this many tokens are pending (default SEQ_LEN × DP).
    #[arg(long)]
    threshold: Option<u64>,
    /// At most this many tokens per step (default: everything pending).
    #[arg(long)]
    step_tokens: Option<u64>,
    /// Pack what is pending once the oldest sample waited this many seconds.
    #[arg(long, default_value_t = 10.0)]
    wait_timeout: f64,
    /// Samples carry teacher logprobs.
    #[arg(long)]
    teacher_logprobs: bool,
    /// Accept samples with an empty completion.
    #[arg(long)]
    allow_empty_completion: bool,
    /// Stop after this many steps (default: run until SIGINT/SIGTERM).
    #[arg(long)]
    max_steps: Option<u64>,
    /// How often the inbox is polled, in milliseconds.
    #[arg(long, default_value_t = 5)]
    poll_ms: u64,
    /// Log format (logs go to stderr; per-step metrics are `step delivered` events).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Print the final summary as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum FilterCommand {
    /// Print a plugin's sha256: the pin to load it with.
    Hash {
        /// Plugin files (.wasm components).
        #[arg(required = true)]
        plugins: Vec<PathBuf>,
    },
    /// Load a plugin into the sandbox (checks its world and imports), then run it on a
    /// synthetic buffer and report its selections and timings.
    Check(FilterCheckArgs),
}

#[derive(Args, Debug)]
struct FilterCheckArgs {
    /// The plugin (.wasm component).
    plugin: PathBuf,
    /// The sha256 pin to check (64 hex digits); without it the file's own hash is used and
    /// printed.
    #[arg(long)]
    sha256: Option<String>,
    /// The plugin's configuration, JSON text.
    #[arg(long, default_value = "{}")]
    config: String,
    /// Buffered groups in the synthetic buffer (≥ 1).
    #[arg(long, default_value_t = 1000)]
    groups: usize,
    /// Samples per group (≥ 1).
    #[arg(long, default_value_t = 8)]
    samples_per_group: u32,
    /// Groups each call asks for (≥ 1).
    #[arg(long, default_value_t = 64)]
    wanted: u32,
    /// Timed calls after the first (≥ 1), on the same instance.
    #[arg(long, default_value_t = 200)]
    calls: u32,
    /// Seed of the synthetic buffer.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Deadline per call, in milliseconds (1 ..= 600000).
    #[arg(long, default_value_t = 1000)]
    timeout_ms: u64,
    /// Fuel per call (≥ 10000); 0 for no fuel bound.
    #[arg(long, default_value_t = 1_000_000_000)]
    fuel: u64,
    /// Memory limit in MiB (1 ..= 4096).
    #[arg(long, default_value_t = 256)]
    memory_mib: usize,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct Common {
    /// Lengths, one integer per line or a JSON array; `-` reads standard input. Without
    /// FILE the built-in workload (4,096 RL rollout lengths) is used.
    file: Option<PathBuf>,
    /// Which kernel runs the plan: the WASM component (default) or the same code natively.
    #[arg(long, value_enum, default_value_t = BackendArg::Wasm)]
    backend: BackendArg,
    /// Print the result as JSON on stdout instead of a human summary.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct PartitionArgs {
    /// Number of groups (≥ 1, ≤ number of lengths).
    #[arg(long, short = 'k', default_value_t = 8)]
    k: u32,
    /// Every group gets exactly n / k items (n must be a multiple of k).
    #[arg(long)]
    equal_size: bool,
    /// Algorithm: Karmarkar–Karp, greedy LPT, or verl 0.9.1's exact output.
    #[arg(long, value_enum, default_value_t = PartMethodArg::Kk)]
    method: PartMethodArg,
    /// Skip the pairwise move/swap refinement (kk and greedy only; verl never refines).
    #[arg(long)]
    no_refine: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct PackArgs {
    /// Tokens per bin (≥ 1).
    #[arg(long, short = 'c', default_value_t = 16_384)]
    capacity: u64,
    /// Round every length up to a multiple of ALIGN (≥ 1) before packing.
    #[arg(long, default_value_t = 1)]
    align: u64,
    /// Algorithm: best-fit decreasing, first-fit decreasing, or order-preserving next-fit.
    #[arg(long, value_enum, default_value_t = PackMethodArg::Bfd)]
    method: PackMethodArg,
    /// What to do with a length above the capacity: fail, give it its own bin, or drop it.
    #[arg(long, value_enum, default_value_t = OversizeArg::Error)]
    oversize: OversizeArg,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct BalanceArgs {
    /// Number of data-parallel ranks (≥ 1). With 1, only micro-batches are planned.
    #[arg(long, default_value_t = 1)]
    dp: u32,
    /// Hard cap on the tokens of a micro-batch. Without it, only the DP level is planned.
    #[arg(long)]
    max_token_len: Option<u64>,
    /// Cost of a sequence of L tokens: `tokens` (L), `attention` (24576·L + L², verl's and
    /// ROLL's workload) or `A,B` for A·L + B·L².
    #[arg(long, default_value = "tokens", value_parser = parse_cost)]
    cost: Cost,
    /// At least this many micro-batches per rank.
    #[arg(long, default_value_t = 0)]
    min_count: u32,
    /// Round the micro-batch count up to a multiple of this (virtual pipeline stages).
    #[arg(long, default_value_t = 1)]
    divisible_by: u32,
    /// Exactly this many micro-batches per rank (e.g. a count agreed across ranks).
    #[arg(long)]
    count: Option<u32>,
    /// Order of the micro-batches: input order, cost descending, verl's or ROLL's
    /// cheapest-at-both-ends order.
    #[arg(long, value_enum, default_value_t = OrderArg::None)]
    order: OrderArg,
    /// Balance each run of this many consecutive samples separately (verl's keep_minibatch).
    #[arg(long)]
    minibatch_size: Option<u32>,
    /// Runs of this many consecutive samples (e.g. one prompt's rollouts) stay on one rank.
    #[arg(long)]
    group_size: Option<u32>,
    /// Allow ranks to get different sample counts (needed with groups of different sizes).
    #[arg(long)]
    unequal_count: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
struct PlanArgs {
    /// The dataset's sample lengths: one integer per line or a JSON array (or, with
    /// --column, a column of a tab/comma/space separated file); `-` reads standard input.
    /// Without it the built-in workload (4,096 RL rollout lengths) is used.
    #[arg(long)]
    lengths: Option<PathBuf>,
    /// Read lengths from this 1-based column of a delimited text file (a non-numeric first
    /// line is a header).
    #[arg(long)]
    column: Option<usize>,
    /// The hard cap of a multi-sample pack, tokens (≥ 1).
    #[arg(long)]
    packing_length: u64,
    /// Learner ranks the plan is aligned for (≥ 1).
    #[arg(long, default_value_t = 1)]
    world_size: u32,
    /// Drop the last N_raw_packs mod WORLD_SIZE packs instead of repeating the first ones.
    #[arg(long)]
    drop_last: bool,
    /// Emit samples with length ≥ PACKING_LENGTH as single-sample packs (default: drop them,
    /// listed in the summary).
    #[arg(long)]
    allow_single_long: bool,
    /// Round every length up to a multiple of ALIGN (≥ 1) before packing.
    #[arg(long, default_value_t = 1)]
    align: u64,
    /// Keep the lengths in a run-scoped cache directory (fingerprinted by the file's sha256
    /// and the column); a later run with the same inputs reads them from there.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Write the plan (format stowplan.static-pack-plan/1, checksums verified on load) here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Which kernel builds the plan: the WASM component (default) or the same code natively.
    #[arg(long, value_enum, default_value_t = BackendArg::Wasm)]
    backend: BackendArg,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
}

fn parse_cost(s: &str) -> Result<Cost, String> {
    match s {
        "tokens" => Ok(Cost::TOKENS),
        "attention" => Ok(Cost::ATTENTION),
        _ => {
            let (a, b) = s.split_once(',').ok_or_else(|| {
                format!("cost must be tokens, attention or LINEAR,QUADRATIC (two integers ≥ 0), got {s:?}")
            })?;
            let int = |x: &str, what: &str| {
                x.trim().parse::<u64>().map_err(|e| format!("cost {what} coefficient {x:?}: {e} (an integer ≥ 0)"))
            };
            Ok(Cost { linear: int(a, "linear")?, quadratic: int(b, "quadratic")? })
        }
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum OrderArg {
    None,
    CostDesc,
    Verl,
    Roll,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum BackendArg {
    Wasm,
    Native,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum PartMethodArg {
    Kk,
    Greedy,
    Verl,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum PackMethodArg {
    Bfd,
    Ffd,
    NextFit,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum OversizeArg {
    Error,
    Single,
    Drop,
}

/// A failure of the CLI with its exit code.
struct Failure {
    code: u8,
    message: String,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = if matches!(e, Error::Infeasible(_)) { 1 } else { 2 };
        Failure { code, message: e.to_string() }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        // Rust ignores SIGPIPE, so `stowplan pack --json | head` would panic on the first
        // write after `head` left. The one-shot commands behave like every Unix filter
        // instead: a closed stdout ends them quietly. `serve` keeps the ignore: it owns
        // sockets whose peers may go away and reports that as an error.
        // SAFETY: called before any thread exists; SIG_DFL is a valid action for SIGPIPE.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    // `serve` is a service: its step events are logged by default.
    let (default_filter, json_logs) = match &cli.command {
        Command::Serve(a) => ("warn,stowplan::serve=info", a.log_format == LogFormat::Json),
        _ => ("warn", false),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("STOWPLAN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json_logs {
        logs.json().init();
    } else {
        logs.with_ansi(std::io::stderr().is_terminal()).init();
    }
    let result = match cli.command {
        Command::Partition(a) => run_partition(a),
        Command::Pack(a) => run_pack(a),
        Command::Balance(a) => run_balance(a),
        Command::Plan(a) => run_plan(a),
        Command::Filter(FilterCommand::Hash { plugins }) => run_filter_hash(&plugins),
        Command::Filter(FilterCommand::Check(a)) => run_filter_check(a),
        Command::Serve(a) => run_serve(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("stowplan: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Reads the lengths and names their source.
fn read_input(common: &Common) -> Result<(Vec<u64>, String), Failure> {
    let (text, source) = read_text(common.file.as_ref())?;
    let lengths = parse_lengths(&text).map_err(|e| Failure { code: 2, message: format!("{source}: {e}") })?;
    tracing::debug!(n = lengths.len(), %source, "read lengths");
    Ok((lengths, source))
}

fn kernel(common: &Common) -> Result<(Kernel, f64), Failure> {
    kernel_on(common.backend)
}

fn kernel_on(backend: BackendArg) -> Result<(Kernel, f64), Failure> {
    let t = Instant::now();
    let backend = match backend {
        BackendArg::Wasm => Backend::Wasm,
        BackendArg::Native => Backend::Native,
    };
    let k = Kernel::new(backend)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(?backend, origin = ?k.wasm_origin(), ms, "kernel ready");
    Ok((k, ms))
}

fn backend_name(k: &Kernel) -> &'static str {
    match k.backend() {
        Backend::Wasm => "wasm",
        Backend::Native => "native",
    }
}

fn run_partition(a: PartitionArgs) -> Result<(), Failure> {
    let (lengths, source) = read_input(&a.common)?;
    let method = match a.method {
        PartMethodArg::Kk => PartitionMethod::Kk,
        PartMethodArg::Greedy => PartitionMethod::Greedy,
        PartMethodArg::Verl => PartitionMethod::Verl,
    };
    let refine = !a.no_refine && method != PartitionMethod::Verl;
    let options = PartitionOptions { method, equal_size: a.equal_size, refine };
    let (kernel, init_ms) = kernel(&a.common)?;
    let t = Instant::now();
    let p = kernel.partition(&lengths, a.k, &options)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let max = p.max_sum();
    let min = p.sums.iter().copied().min().unwrap_or(0);
    if a.common.json {
        let v = stowplan::json::with(
            stowplan::json::partition(&p),
            json!({
                "operation": "partition",
                "source": source,
                "backend": backend_name(&kernel),
                "method": format!("{:?}", a.method).to_lowercase(),
                "equal_size": a.equal_size,
                "refine": refine,
                "n": lengths.len(),
                "k": a.k,
                "max": max,
                "min": min,
                "elapsed_ms": ms,
                "init_ms": init_ms,
                "kernel_origin": kernel.wasm_origin(),
            }),
        );
        println!("{v}");
        return Ok(());
    }
    let excess = max - p.lower_bound;
    println!("partition of {} lengths from {source} into {} groups", lengths.len(), a.k);
    println!(
        "  method {} ({}{}), backend {}",
        format!("{:?}", a.method).to_lowercase(),
        if a.equal_size { "equal size" } else { "unequal size" },
        if refine { ", refined" } else { "" },
        backend_name(&kernel)
    );
    println!("  total        {:>14} tokens", p.total);
    println!("  lower bound  {:>14} tokens  (max of ceil(total/k), longest item)", p.lower_bound);
    println!(
        "  largest      {:>14} tokens  (+{} over the bound, {:.4}%)",
        max,
        excess,
        100.0 * excess as f64 / p.lower_bound.max(1) as f64
    );
    println!("  smallest     {:>14} tokens", min);
    println!("  spread       {:>14} tokens  (largest − smallest)", p.spread);
    let sizes: Vec<usize> = p.offsets.windows(2).map(|w| (w[1] - w[0]) as usize).collect();
    println!(
        "  group sizes  {}..{} items",
        sizes.iter().min().copied().unwrap_or(0),
        sizes.iter().max().copied().unwrap_or(0)
    );
    println!("  time         {ms:>14.3} ms  (kernel ready in {init_ms:.1} ms)");
    Ok(())
}

fn run_pack(a: PackArgs) -> Result<(), Failure> {
    let (lengths, source) = read_input(&a.common)?;
    let options = PackOptions {
        capacity: a.capacity,
        align: a.align,
        method: match a.method {
            PackMethodArg::Bfd => PackMethod::Bfd,
            PackMethodArg::Ffd => PackMethod::Ffd,
            PackMethodArg::NextFit => PackMethod::NextFit,
        },
        oversize: match a.oversize {
            OversizeArg::Error => OversizePolicy::Error,
            OversizeArg::Single => OversizePolicy::Single,
            OversizeArg::Drop => OversizePolicy::Drop,
        },
    };
    let (kernel, init_ms) = kernel(&a.common)?;
    let t = Instant::now();
    let p = kernel.pack(&lengths, &options)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let bins = p.bins() as u64;
    let regular = bins - p.single.len() as u64;
    let efficiency = p.efficiency(&lengths, a.capacity);
    let method = format!("{:?}", a.method).to_lowercase().replace("nextfit", "next-fit");
    if a.common.json {
        let v = stowplan::json::with(
            stowplan::json::packing(&p),
            json!({
                "operation": "pack",
                "source": source,
                "backend": backend_name(&kernel),
                "method": method,
                "capacity": a.capacity,
                "align": a.align,
                "oversize": format!("{:?}", a.oversize).to_lowercase(),
                "n": lengths.len(),
                "efficiency": efficiency,
                "elapsed_ms": ms,
                "init_ms": init_ms,
                "kernel_origin": kernel.wasm_origin(),
            }),
        );
        println!("{v}");
        return Ok(());
    }
    println!("packing of {} lengths from {source} into bins of {} tokens", lengths.len(), a.capacity);
    println!(
        "  method {method}, align {}, oversize {}, backend {}",
        a.align,
        format!("{:?}", a.oversize).to_lowercase(),
        backend_name(&kernel)
    );
    println!(
        "  bins         {:>12}  (lower bound {} for the items that fit{})",
        bins,
        p.lower_bound,
        if p.single.is_empty() { String::new() } else { format!(", + {} single bins", p.single.len()) }
    );
    println!(
        "  over bound   {:>12}  ({:.3}%)",
        regular.saturating_sub(p.lower_bound),
        100.0 * regular.saturating_sub(p.lower_bound) as f64 / p.lower_bound.max(1) as f64
    );
    println!("  real tokens  {:>12}", p.real_tokens);
    println!("  align pad    {:>12}  tokens", p.padding_tokens());
    println!("  efficiency   {:>11.3}%  (real tokens / (regular bins × capacity))", 100.0 * efficiency);
    println!("  oversized    {:>12}  single, {} dropped", p.single.len(), p.dropped.len());
    println!("  time         {ms:>12.3} ms  (kernel ready in {init_ms:.1} ms)");
    Ok(())
}

fn run_balance(a: BalanceArgs) -> Result<(), Failure> {
    let (lengths, source) = read_input(&a.common)?;
    if a.dp == 1 && a.max_token_len.is_none() {
        return Err(Failure {
            code: 2,
            message: "nothing to plan: give --dp N (N > 1) for DP balancing and/or --max-token-len T for micro-batches"
                .into(),
        });
    }
    let labels: Option<Vec<u32>> = match a.group_size {
        None => None,
        Some(0) => return Err(Failure { code: 2, message: "--group-size must be at least 1 (got 0)".into() }),
        Some(g) => Some((0..lengths.len() as u64).map(|i| (i / u64::from(g)) as u32).collect()),
    };
    let dp_options = DpOptions {
        cost: a.cost,
        groups: labels.as_deref(),
        minibatch_size: a.minibatch_size,
        equal_count: !a.unequal_count,
    };
    let micro = a.max_token_len.map(|cap| MicroOptions {
        max_token_len: cap,
        cost: a.cost,
        min_count: a.min_count,
        divisible_by: a.divisible_by,
        count: a.count,
        order: match a.order {
            OrderArg::None => Order::None,
            OrderArg::CostDesc => Order::CostDesc,
            OrderArg::Verl => Order::Verl,
            OrderArg::Roll => Order::Roll,
        },
    });
    let (kernel, init_ms) = kernel(&a.common)?;
    let t = Instant::now();
    let value = match &micro {
        Some(m) if a.dp == 1 => {
            json!({"micro_batches": stowplan::json::micro_plan(&kernel.micro_batches(&lengths, m)?)})
        }
        Some(m) => stowplan::json::plan(&kernel.plan(&lengths, a.dp, &dp_options, m)?, &lengths),
        None => json!({"dp": stowplan::json::dp_plan(&kernel.balance_dp(&lengths, a.dp, &dp_options)?, &lengths)}),
    };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    if a.common.json {
        let v = stowplan::json::with(
            value,
            json!({
                "operation": "balance",
                "source": source,
                "backend": backend_name(&kernel),
                "n": lengths.len(),
                "dp_size": a.dp,
                "max_token_len": a.max_token_len,
                "cost": {"linear": a.cost.linear, "quadratic": a.cost.quadratic},
                "elapsed_ms": ms,
                "init_ms": init_ms,
                "kernel_origin": kernel.wasm_origin(),
            }),
        );
        println!("{v}");
        return Ok(());
    }
    print_balance(&a, &lengths, &source, &value, &kernel);
    println!("  time               {ms:>12.3} ms  (kernel ready in {init_ms:.1} ms)");
    Ok(())
}

/// The human summary of a balance plan, read from its JSON form.
fn print_balance(a: &BalanceArgs, lengths: &[u64], source: &str, v: &serde_json::Value, kernel: &Kernel) {
    let cost = match (a.cost.linear, a.cost.quadratic) {
        (1, 0) => "tokens".to_string(),
        (24_576, 1) => "attention (24576·L + L²)".to_string(),
        (l, q) => format!("{l}·L + {q}·L²"),
    };
    println!(
        "balance of {} lengths from {source}: dp {}{}",
        lengths.len(),
        a.dp,
        a.max_token_len.map(|c| format!(", micro-batches ≤ {c} tokens")).unwrap_or_default()
    );
    println!("  cost {cost}, backend {}", backend_name(kernel));
    let bal = |b: &serde_json::Value| {
        format!(
            "max/mean {:.5}, spread {}",
            b["max_over_mean"].as_f64().unwrap_or(f64::NAN),
            b["spread"].as_u64().unwrap_or(0)
        )
    };
    if let Some(dp) = v.get("dp") {
        let sizes: Vec<usize> = dp["ranks"]
            .as_array()
            .map(|r| r.iter().map(|x| x.as_array().map_or(0, Vec::len)).collect())
            .unwrap_or_default();
        println!(
            "  ranks              {:>12}  ({}..{} samples each)",
            sizes.len(),
            sizes.iter().min().copied().unwrap_or(0),
            sizes.iter().max().copied().unwrap_or(0)
        );
        println!("  rank cost          {}", bal(&dp["cost_balance"]));
        let lb = dp["cost_lower_bound"].as_u64().unwrap_or(0);
        let max = dp["cost_balance"]["max"].as_u64().unwrap_or(0);
        println!(
            "  costliest rank     {:>12}  (lower bound {lb}, +{:.4}%)",
            max,
            100.0 * max.saturating_sub(lb) as f64 / lb.max(1) as f64
        );
        println!("  rank tokens        {}", bal(&dp["token_balance"]));
        if let Some(u) = dp["verl_unbalance"].as_object() {
            println!(
                "  verl unbalance     before {}..{}, after {}..{} tokens",
                u["global_seqlen/min"],
                u["global_seqlen/max"],
                u["global_seqlen/balanced_min"],
                u["global_seqlen/balanced_max"]
            );
        }
    }
    let micro: Vec<&serde_json::Value> = match v.get("micro_batches") {
        Some(serde_json::Value::Array(per_rank)) => per_rank.iter().collect(),
        Some(single) => vec![single],
        None => Vec::new(),
    };
    if micro.is_empty() {
        return;
    }
    let count = micro[0]["count"].as_u64().unwrap_or(0);
    let lb = micro.iter().filter_map(|m| m["lower_bound"].as_u64()).max().unwrap_or(0);
    let required = micro.iter().filter_map(|m| m["required"].as_u64()).max().unwrap_or(0);
    println!("  micro-batches      {count:>12}  per rank (lower bound {lb}, the cap requires {required})");
    let (tb, cb) = match v.get("micro_batch_token_balance") {
        Some(tb) => (tb, &v["micro_batch_cost_balance"]),
        None => (&micro[0]["token_balance"], &micro[0]["cost_balance"]),
    };
    println!("  largest mb tokens  {:>12}  (cap {})", tb["max"].as_u64().unwrap_or(0), a.max_token_len.unwrap_or(0));
    println!("  mb cost            {}", bal(cb));
}

/// A progress bar on stderr, hidden unless stderr is a terminal.
fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(len)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let style = indicatif::ProgressStyle::with_template("{msg:>16} [{bar:40}] {bytes}/{total_bytes} {elapsed}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}

/// Reads the input text — the built-in workload, standard input or a file (with a progress
/// bar over its bytes on a terminal) — and names its source.
fn read_text(path: Option<&PathBuf>) -> Result<(String, String), Failure> {
    let fail = |m: String| Failure { code: 2, message: m };
    match path {
        None => Ok((DEFAULT_WORKLOAD.to_string(), DEFAULT_WORKLOAD_NAME.to_string())),
        Some(p) if p.as_os_str() == "-" => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| fail(format!("reading standard input: {e}")))?;
            Ok((s, "standard input".to_string()))
        }
        Some(p) => {
            let file = std::fs::File::open(p).map_err(|e| fail(format!("reading {}: {e}", p.display())))?;
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            let bar = progress(size, "reading lengths");
            let mut s = String::with_capacity(size as usize);
            bar.wrap_read(file).read_to_string(&mut s).map_err(|e| fail(format!("reading {}: {e}", p.display())))?;
            bar.finish_and_clear();
            Ok((s, p.display().to_string()))
        }
    }
}

fn run_plan(a: PlanArgs) -> Result<(), Failure> {
    let t0 = Instant::now();
    let (text, source) = read_text(a.lengths.as_ref())?;
    let parse = |text: &str| match a.column {
        Some(c) => stowplan::input::parse_column(text, c),
        None => parse_lengths(text),
    };
    let mut cache_note = None;
    let lengths = match &a.cache_dir {
        None => parse(&text).map_err(|e| Failure { code: 2, message: format!("{source}: {e}") })?,
        Some(dir) => {
            // The dataset identity: the content hash (the same data under another path is the
            // same dataset) and how lengths are read from it.
            let identity = format!("sha256:{}", stowplan::sha256_hex(text.as_bytes()));
            let config = json!({"column": a.column, "reader": "stowplan-cli"});
            let samples = parse(&text).map_err(|e| Failure { code: 2, message: format!("{source}: {e}") })?;
            let mut cache = stowplan::LengthCache::open(dir, &identity, samples.len(), &config, None)?;
            let resumed = cache.known();
            let lengths = cache.precompute(1, |i| Ok(samples[i]))?.to_vec();
            cache_note = Some(json!({
                "path": cache.path().display().to_string(),
                "fingerprint": cache.fingerprint(),
                "reused": resumed,
            }));
            lengths
        }
    };
    let read_ms = t0.elapsed().as_secs_f64() * 1e3;
    let (kernel, init_ms) = kernel_on(a.backend)?;
    let options = stowplan::PlanOptions {
        packing_length: a.packing_length,
        align: a.align,
        allow_single_long: a.allow_single_long,
    };
    let t = Instant::now();
    let plan = stowplan::StaticPackPlan::build(&kernel, &lengths, &options, a.world_size, a.drop_last)?;
    let plan_ms = t.elapsed().as_secs_f64() * 1e3;
    plan.log();
    if let Some(out) = &a.out {
        plan.save(out)?;
    }
    let raw = plan.raw_len() as u64;
    let regular = raw - plan.raw.single_long.len() as u64;
    let regular_bound = plan.raw.lower_bound - plan.raw.single_long.len() as u64;
    let over = regular.saturating_sub(regular_bound);
    if a.json {
        let v = json!({
            "operation": "plan",
            "source": source,
            "backend": backend_name(&kernel),
            "samples": lengths.len(),
            "packing_length": a.packing_length,
            "align": a.align,
            "allow_single_long": a.allow_single_long,
            "world_size": a.world_size,
            "drop_last": a.drop_last,
            "n_raw_packs": raw,
            "n_aligned_packs": plan.len(),
            "packs_per_rank": plan.per_rank(),
            "lower_bound": plan.raw.lower_bound,
            "efficiency": plan.efficiency(),
            "real_tokens": plan.raw.real_tokens,
            "single_long": plan.raw.single_long.len(),
            "dropped_long": plan.raw.dropped.len(),
            "pad_needed": plan.aligned.pad_needed,
            "repeated_packs": &plan.aligned.packs[plan.raw_len().min(plan.len())..],
            "dropped_packs": plan.aligned.dropped_packs,
            "dropped_pack_samples": plan.aligned.dropped_samples,
            "raw_checksum": plan.raw_checksum(),
            "aligned_checksum": plan.aligned_checksum(),
            "out": a.out.as_ref().map(|p| p.display().to_string()),
            "cache": cache_note,
            "read_ms": read_ms,
            "init_ms": init_ms,
            "plan_ms": plan_ms,
        });
        println!("{v}");
        return Ok(());
    }
    println!(
        "static pack plan of {} samples from {source}, packing_length {}, align {}, backend {}",
        lengths.len(),
        a.packing_length,
        a.align,
        backend_name(&kernel)
    );
    println!(
        "  raw packs     {raw:>12}  (lower bound {}; {over} over = {:.3}%)",
        plan.raw.lower_bound,
        100.0 * over as f64 / regular_bound.max(1) as f64
    );
    println!(
        "  aligned packs {:>12}  (world_size {}, {} per rank, drop_last {})",
        plan.len(),
        a.world_size,
        plan.per_rank(),
        a.drop_last
    );
    if plan.aligned.pad_needed > 0 {
        println!("  repeated      {:>12}  packs from the start of the raw plan", plan.aligned.pad_needed);
    }
    if plan.aligned.dropped_packs > 0 {
        println!(
            "  dropped       {:>12}  packs at the end ({} samples never trained on)",
            plan.aligned.dropped_packs, plan.aligned.dropped_samples
        );
    }
    println!(
        "  efficiency    {:>11.3}%  (real tokens / (multi-sample packs × packing_length))",
        100.0 * plan.efficiency()
    );
    println!("  real tokens   {:>12}", plan.raw.real_tokens);
    println!(
        "  long samples  {:>12}  single-long packs, {} dropped{}",
        plan.raw.single_long.len(),
        plan.raw.dropped.len(),
        if plan.raw.dropped.is_empty() { "" } else { " (length >= packing_length; --allow-single-long keeps them)" }
    );
    println!("  raw sha256    {}", plan.raw_checksum());
    println!("  aligned sha256 {}", plan.aligned_checksum());
    if let Some(out) = &a.out {
        println!("  written to    {}", out.display());
    }
    if let Some(c) = &cache_note {
        println!("  length cache  {} ({} lengths reused)", c["path"].as_str().unwrap_or(""), c["reused"]);
    }
    println!("  time          {plan_ms:>12.3} ms  (reading {read_ms:.1} ms, kernel ready in {init_ms:.1} ms)");
    Ok(())
}

fn run_filter_hash(plugins: &[PathBuf]) -> Result<(), Failure> {
    for path in plugins {
        let bytes = std::fs::read(path)
            .map_err(|e| Failure { code: 2, message: format!("reading {}: {e}", path.display()) })?;
        println!("{}  {}", stowplan::sha256_hex(&bytes), path.display());
    }
    Ok(())
}

fn run_filter_check(a: FilterCheckArgs) -> Result<(), Failure> {
    let bad = |m: String| Failure { code: 2, message: m };
    if a.groups == 0 || a.samples_per_group == 0 || a.wanted == 0 || a.calls == 0 {
        return Err(bad(format!(
            "--groups, --samples-per-group, --wanted and --calls must be at least 1 (got {}, {}, {}, {})",
            a.groups, a.samples_per_group, a.wanted, a.calls
        )));
    }
    let bytes = std::fs::read(&a.plugin).map_err(|e| bad(format!("reading the plugin {}: {e}", a.plugin.display())))?;
    let own = stowplan::sha256_hex(&bytes);
    let pinned = a.sha256.is_some();
    let options = stowplan::FilterOptions {
        config: a.config.clone(),
        timeout: std::time::Duration::from_millis(a.timeout_ms),
        fuel: (a.fuel > 0).then_some(a.fuel),
        memory_limit: a.memory_mib.saturating_mul(1 << 20),
        ..stowplan::FilterOptions::new(a.sha256.as_deref().unwrap_or(&own))
    };
    let name = a.plugin.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let t = Instant::now();
    let mut filter = stowplan::WasmFilter::from_bytes(&name, &bytes, options)?;
    let load_ms = t.elapsed().as_secs_f64() * 1e3;
    let groups = stowplan::plugin::synthetic_buffer(a.groups, a.samples_per_group as usize, a.seed);
    let t = Instant::now();
    let buffer = stowplan::BufferColumns::from_groups(&groups);
    let encode_us = t.elapsed().as_secs_f64() * 1e6;
    let ctx =
        stowplan::FilterContext { rollout_id: Some(0), wanted: a.wanted, n_samples_per_prompt: a.samples_per_group };
    let t = Instant::now();
    let first = filter.try_select(&ctx, &buffer);
    let first_us = t.elapsed().as_secs_f64() * 1e6;
    let first_output = filter.last_output().to_vec();
    let first =
        first.map_err(|e| Failure { code: 2, message: format!("the first call failed: {}", Error::from(e)) })?;
    let mut times = Vec::with_capacity(a.calls as usize);
    for _ in 0..a.calls {
        let t = Instant::now();
        let picks = filter.try_select(&ctx, &buffer);
        times.push(t.elapsed().as_secs_f64() * 1e6);
        if let Err(e) = picks {
            return Err(Failure { code: 2, message: format!("call {} failed: {}", times.len() + 1, Error::from(e)) });
        }
    }
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    let (median, p99, min) = (pct(0.5), pct(0.99), times[0]);
    let shown: Vec<u32> = first.iter().take(10).copied().collect();
    if a.json {
        let output: serde_json::Map<String, serde_json::Value> =
            first_output.iter().map(|(s, t)| (s.to_string(), json!(t))).collect();
        let report = json!({
            "plugin": a.plugin.display().to_string(),
            "sha256": filter.sha256(),
            "pinned": pinned,
            "world": "stowplan:filter/buffer-filter@0.1.0",
            "imports": filter.imports(),
            "load_ms": load_ms,
            "compiled_from": filter.origin(),
            "buffer": { "groups": a.groups, "samples_per_group": a.samples_per_group, "seed": a.seed },
            "wanted": a.wanted,
            "selection": first,
            "columns_encode_us": encode_us,
            "first_call_us": first_us,
            "calls": a.calls,
            "median_us": median,
            "p99_us": p99,
            "min_us": min,
            "output": output,
        });
        println!("{report:#}");
        return Ok(());
    }
    println!("plugin    {}", a.plugin.display());
    if pinned {
        println!("sha256    {} (matches the pin)", filter.sha256());
    } else {
        println!("sha256    {} (not pinned: load it with this pin)", filter.sha256());
    }
    println!("world     stowplan:filter/buffer-filter@0.1.0: exports filter.select");
    println!(
        "imports   {}",
        if filter.imports().is_empty() { "none".to_string() } else { filter.imports().join(", ") }
    );
    println!("load      {load_ms:.1} ms (code {})", filter.origin());
    println!(
        "buffer    {} groups x {} samples (synthetic, seed {}), {} wanted",
        a.groups, a.samples_per_group, a.seed, a.wanted
    );
    println!("selection {} groups: {shown:?}{}", first.len(), if first.len() > shown.len() { " ..." } else { "" });
    println!("columns   {encode_us:.1} us to encode the buffer once (a data source keeps them up to date)");
    println!("first     {first_us:.1} us");
    println!(
        "calls     {}: median {median:.1} us, p99 {p99:.1} us, min {min:.1} us (instance reused, validated)",
        a.calls
    );
    for (stream, text) in &first_output {
        println!("{stream:<9} {}", text.trim_end().replace('\n', "\n          "));
    }
    Ok(())
}

fn run_serve(a: ServeArgs) -> Result<(), Failure> {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use stowplan::serve::{FsTransport, ServeOptions, Server, Transport, ZmqEndpoints, ZmqTransport};
    use stowplan::{PackerOptions, RunConfig};

    let bad = |message: String| Failure { code: 2, message };
    if !(a.wait_timeout.is_finite() && a.wait_timeout >= 0.0) {
        return Err(bad(format!("--wait-timeout must be a number of seconds ≥ 0 (got {})", a.wait_timeout)));
    }
    if a.batch_size == 0 {
        return Err(bad("--batch-size must be at least 1 (got 0)".into()));
    }
    let packer = PackerOptions {
        pad_to_multiple_of: a.pad_to_multiple_of,
        pad_token_id: a.pad_token_id,
        cost: a.cost,
        num_runs: a.num_runs,
        threshold: a.threshold,
        step_tokens: a.step_tokens,
        wait_timeout: std::time::Duration::from_secs_f64(a.wait_timeout),
        teacher_logprobs: a.teacher_logprobs,
        allow_empty_completion: a.allow_empty_completion,
        ..PackerOptions::new(a.seq_len, a.dp)
    };
    let config = RunConfig { batch_size: a.batch_size };
    let state_dir = match (&a.state_dir, &a.root) {
        (Some(d), _) => d.clone(),
        (None, Some(root)) => root.join("packer"),
        (None, None) => {
            return Err(bad("--state-dir (or --root) is required: where the checkpoint and spool live".into()));
        }
    };
    let options = ServeOptions {
        packer,
        state_dir: state_dir.clone(),
        runs: Vec::new(),
        auto_add: (!a.no_auto_add_runs).then_some(config),
        max_steps: a.max_steps,
        poll: std::time::Duration::from_millis(50),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .map_err(|e| bad(format!("installing the signal handler: {e}")))?;
    }
    let poll = std::time::Duration::from_millis(a.poll_ms.max(1));
    let (transport, endpoints): (Box<dyn Transport>, _) = match a.transport {
        TransportArg::Fs => {
            let root = a.root.as_ref().ok_or_else(|| bad("--root is required with --transport fs".into()))?;
            (Box::new(FsTransport::new(root, poll)?), json!({"root": root}))
        }
        TransportArg::Zmq => {
            let wanted = ZmqEndpoints {
                batches: a.zmq_batches.clone(),
                receipts: a.zmq_receipts.clone(),
                ranks: a.zmq_ranks.clone(),
            };
            let t = ZmqTransport::bind(&wanted, a.dp)?;
            let e = t.endpoints();
            let endpoints =
                json!({"batches": e.batches, "receipts": e.receipts, "ranks": e.ranks, "incarnation": t.incarnation()});
            (Box::new(t), endpoints)
        }
    };
    let (kernel, _) = kernel_on(BackendArg::Wasm)?;
    let mut server = Server::open(kernel, transport, options)?;
    tracing::info!(
        target: "stowplan::serve",
        transport = %endpoints,
        state_dir = %state_dir.display(),
        seq_len = a.seq_len,
        dp = a.dp,
        threshold = packer.threshold_tokens(),
        next_step = server.packer().next_step(),
        pending_samples = server.packer().pending().0,
        "packer ready"
    );
    let summary = server.run(&stop, |r| {
        tracing::info!(
            target: "stowplan::serve",
            step = r.metrics.step,
            samples = r.metrics.samples,
            real_tokens = r.metrics.real_tokens,
            padding_tokens = r.metrics.padding_tokens,
            micro_batches_per_rank = r.metrics.micro_batches_per_rank,
            imbalance = r.metrics.imbalance,
            wait_s = r.wait_seconds,
            receive_s = r.receive_seconds,
            pack_s = r.metrics.pack_seconds,
            deliver_s = r.deliver_seconds,
            tokens_per_s = r.tokens_per_second,
            pending_samples = r.pending_samples,
            rebuilt = r.rebuilt,
            "step delivered"
        );
    })?;
    tracing::info!(target: "stowplan::serve", steps = summary.steps, pending_samples = summary.pending_samples, in_flight_step = ?summary.in_flight_step, "stopped");
    if a.json {
        let runs: Vec<_> = server
            .packer()
            .runs()
            .map(|(run, c, p)| json!({"run": run, "batch_size": c.batch_size, "progress": p}))
            .collect();
        println!("{}", json!({"summary": summary, "runs": runs}));
    } else {
        let in_flight = summary
            .in_flight_step
            .map(|s| format!("; step {s} in flight (delivered again on restart)"))
            .unwrap_or_default();
        println!(
            "stowplan serve: {} steps, {} samples, {} tokens (+{} padding); {} pending samples kept{in_flight}; {} duplicates, {} rejected",
            summary.steps,
            summary.samples,
            summary.real_tokens,
            summary.padding_tokens,
            summary.pending_samples,
            summary.duplicates,
            summary.rejected
        );
    }
    Ok(())
}
