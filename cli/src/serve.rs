//! `stowplan serve`: the packer between an orchestrator and the trainer ranks.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde::Serialize;
use stowplan::serve::{
    FsTransport, MAX_MESSAGE_BYTES, RejectedLimits, ServeOptions, ServeSummary, Server, Transport, ZmqEndpoints,
};
use stowplan::{
    Backend, PackerOptions,
    kernel::Cost,
    materialize::{DistributionMode, LossAggMode, SampleLimits},
    packer::{LossNormalization, RunConfig, RunProgress},
};
#[cfg(feature = "zmq")]
use stowplan_zmq::{CurveServer, ZmqTransport, curve};

use crate::common::{ReadyKernel, named, print_report};
use crate::failure::Failure;

/// How batches arrive and micro-batches leave.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    /// Files under --root: ROOT/inbox/ in, ROOT/rollouts/step_N/rank_R.bin out.
    Fs,
    /// ZeroMQ over TCP (or ipc://): batches PUSHed to --zmq-batches, receipts published on
    /// --zmq-receipts, ranks connect DEALER sockets to --zmq-ranks. Needs a build with the
    /// `zmq` feature (README, `stowplan serve`, ZeroMQ).
    Zmq,
}

/// The format of the logs on stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per event (structured logs for collectors).
    Json,
}

/// The options of `stowplan serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How batches arrive and micro-batches leave.
    #[arg(long, value_enum, default_value_t = TransportKind::Fs)]
    transport: TransportKind,
    /// Directory shared with the orchestrator and the ranks (filesystem transport).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Checkpoint and spool directory; default ROOT/packer (required with --transport zmq
    /// unless --root is given).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// ZeroMQ: where the PULL socket for training batches and run changes binds.
    #[arg(long, default_value = ZmqEndpoints::DEFAULT_BATCHES)]
    zmq_batches: String,
    /// ZeroMQ: where the PUB socket for receipts (messages made durable) binds.
    #[arg(long, default_value = ZmqEndpoints::DEFAULT_RECEIPTS)]
    zmq_receipts: String,
    /// ZeroMQ: where the ROUTER socket the trainer ranks connect to binds.
    #[arg(long, default_value = ZmqEndpoints::DEFAULT_RANKS)]
    zmq_ranks: String,
    /// ZeroMQ CURVE: the packer's secret certificate (NAME.key_secret, mode 0600; made by
    /// `stowplan keys`). Every socket is then encrypted and admits only the clients of
    /// --zmq-curve-clients. Needs a build with the system libzmq (README, "CURVE").
    #[arg(long, requires = "zmq_curve_clients")]
    zmq_curve_secret: Option<PathBuf>,
    /// ZeroMQ CURVE: a directory of the public certificates (NAME.key) of the orchestrators
    /// and ranks admitted.
    #[arg(long, requires = "zmq_curve_secret")]
    zmq_curve_clients: Option<PathBuf>,
    /// Tokens of a micro-batch after padding, the token cap (longer samples are rejected).
    #[arg(long, required_unless_present = "seq_len", value_name = "TOKENS")]
    capacity: Option<u64>,
    /// The former name of --capacity, accepted with a warning for one release.
    #[arg(long, hide = true, conflicts_with = "capacity")]
    seq_len: Option<u64>,
    /// Data-parallel ranks (every rank gets the same number of micro-batches per step).
    #[arg(long)]
    dp: u32,
    /// Samples of one optimizer step of a run (a run's step advances when this many of its
    /// samples were delivered).
    #[arg(long)]
    batch_size: u64,
    /// Runs (LoRA adapters): run indices are below it and `lora_num_tokens` has this length.
    #[arg(long, default_value_t = defaults().num_runs)]
    num_runs: u32,
    /// Only runs added by a control message are served (default: a run below --num-runs is
    /// added with --batch-size on its first batch).
    #[arg(long)]
    no_auto_add_runs: bool,
    /// Pad every micro-batch to a multiple of this.
    #[arg(long, default_value_t = defaults().pad_to_multiple_of)]
    pad_to_multiple_of: u64,
    /// Token id of padding.
    #[arg(long, default_value_t = defaults().pad_token_id)]
    pad_token_id: i64,
    /// Cost balanced across ranks: tokens, attention or LINEAR,QUADRATIC.
    #[arg(long, default_value_t = defaults().cost, value_parser = |s: &str| s.parse::<Cost>())]
    cost: Cost,
    /// Pack once this many tokens are pending (default SEQ_LEN × DP).
    #[arg(long)]
    threshold: Option<u64>,
    /// At most this many tokens per step (default: everything pending).
    #[arg(long)]
    step_tokens: Option<u64>,
    /// Pack what is pending once the oldest sample waited this many seconds.
    #[arg(long, default_value_t = defaults().wait_timeout.as_secs_f64())]
    wait_timeout: f64,
    /// Samples carry teacher logprobs.
    #[arg(long)]
    teacher_logprobs: bool,
    /// Accept samples with an empty completion.
    #[arg(long)]
    allow_empty_completion: bool,
    /// How per-token losses make a loss: every micro-batch's `loss_weights` are set so that
    /// Σ weight × loss over all ranks is the unpacked loss of the run's samples in the set
    /// `--loss-normalization` names.
    #[arg(long, value_parser = named::<LossAggMode>(), default_value_t = defaults().loss_agg_mode)]
    loss_agg_mode: LossAggMode,
    /// The set loss weights count over: `step` (the run's samples in the packer step) or
    /// `update` (the run's optimizer update, its batch size of samples, over all the packer
    /// steps it spans; its samples are packed once the rest of their update has arrived).
    #[arg(long, value_parser = named::<LossNormalization>(), default_value_t = defaults().loss_normalization)]
    loss_normalization: LossNormalization,
    /// The horizon of `--loss-agg-mode seq-mean-token-sum-norm`, in tokens (1 ..= 2^64;
    /// default: the run's longest completion in the step; verl uses its maximum response
    /// length). Refused with another mode.
    #[arg(long)]
    loss_scale_factor: Option<f64>,
    /// Another cap per micro-batch besides --capacity, NAME=CAP (vision-language rollouts:
    /// --limit image_tokens=8192 --limit images=32). A sample gives its size in each by name
    /// (`resources`; a limit it does not name is 0); one over a cap, or naming another
    /// resource, is rejected (`over_limit`, `unknown_resource`). Up to 7 limits (6 with
    /// --max-segments); none named `segments`.
    #[arg(long = "limit", value_name = "NAME=CAP", value_parser = crate::limits::parse_limit)]
    limit: Vec<(String, u64)>,
    /// How each step's micro-batches go to the ranks: `balanced` (best-fit decreasing, splits
    /// before dummies, the cost balanced by Karmarkar–Karp) or `round-robin` (prime-rl's
    /// classic trainer: first fit by run and descending length, runs sharing micro-batches,
    /// each modality group completed to a multiple of --dp with copies of its first
    /// micro-batch, loss off, micro-batch i to rank i % dp; no --limit).
    #[arg(long, value_parser = named::<DistributionMode>(), default_value_t = defaults().distribution)]
    distribution: DistributionMode,
    /// At most this many samples (segments) per micro-batch, as some attention kernels need;
    /// 0 means no limit. It is one more cap beside the --limit ones.
    #[arg(long, default_value_t = 0)]
    max_segments: u64,
    /// Undecodable messages kept in STATE/rejected/ at most (the oldest are dropped first).
    #[arg(long, default_value_t = RejectedLimits::default().max_files)]
    rejected_max_files: usize,
    /// MiB kept in STATE/rejected/ at most (each message keeps at most its first MiB).
    #[arg(long, default_value_t = RejectedLimits::default().max_bytes >> 20)]
    rejected_max_mib: u64,
    /// MiB of one incoming message (a training batch or run change) at most: a larger inbox
    /// file is set aside into STATE/rejected/ unread; over ZeroMQ its sender's connection is
    /// dropped (the ZeroMQ and file senders check the default cap first). 1 ..= 2^43 - 1.
    #[arg(long, default_value_t = MAX_MESSAGE_BYTES >> 20, value_parser = clap::value_parser!(u64).range(1..1 << 43))]
    max_message_mib: u64,
    /// Stop after this many steps (default: run until SIGINT/SIGTERM).
    #[arg(long)]
    max_steps: Option<u64>,
    /// How often the inbox is polled, in milliseconds.
    #[arg(long, default_value_t = 5)]
    poll_ms: u64,
    /// Log format (logs go to stderr; per-step metrics are `step delivered` events).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Print the final summary as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// Where the transport listens, as logged when the packer is ready.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Endpoints {
    /// The filesystem transport's shared directory.
    Fs {
        /// The directory.
        root: PathBuf,
    },
    /// The ZeroMQ endpoints bound.
    #[cfg(feature = "zmq")]
    Zmq {
        /// The batches' PULL socket.
        batches: String,
        /// The receipts' PUB socket.
        receipts: String,
        /// The ranks' ROUTER socket.
        ranks: String,
        /// This process's incarnation (ranks see a restart by it).
        incarnation: u64,
    },
}

/// JSON, as in the logs.
impl fmt::Display for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_json::to_string(self).map_err(|_| fmt::Error)?)
    }
}

/// A run's configuration and progress at exit.
#[derive(Debug, Serialize)]
struct RunReport<'a> {
    /// The run index.
    run: u32,
    /// Its samples per optimizer step.
    batch_size: u64,
    /// Its progress.
    progress: &'a RunProgress,
}

/// What `stowplan serve` reports when it stops.
#[derive(Debug, Serialize)]
struct Report<'a> {
    /// This process's totals.
    summary: ServeSummary,
    /// Every run.
    runs: Vec<RunReport<'a>>,
}

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.summary;
        let in_flight = s
            .in_flight_step
            .map(|step| format!("; step {step} in flight (delivered again on restart)"))
            .unwrap_or_default();
        writeln!(
            f,
            "stowplan serve: {} steps, {} samples, {} tokens (+{} padding); {} pending samples kept{in_flight}; {} duplicates, {} rejected",
            s.steps, s.samples, s.real_tokens, s.padding_tokens, s.pending_samples, s.duplicates, s.rejected
        )
    }
}

/// The library's packer defaults, shown by `--help` and used when an option is not given
/// (`capacity` and `dp` have no default: they are required).
fn defaults() -> PackerOptions {
    PackerOptions::new(1, 1)
}

/// The largest `--wait-timeout` (about 31 years: "never" for a training run, and far inside
/// what a `Duration` holds).
const MAX_WAIT_TIMEOUT_S: f64 = 1e9;

/// Runs `stowplan serve` until `--max-steps` or SIGINT/SIGTERM.
pub fn run(a: Args) -> Result<(), Failure> {
    // clap requires one of the two (`required_unless_present`).
    let capacity = crate::common::capacity("serve", a.capacity, ("seq-len", a.seq_len)).unwrap_or(0);
    if !(a.wait_timeout.is_finite() && (0.0..=MAX_WAIT_TIMEOUT_S).contains(&a.wait_timeout)) {
        return Err(Failure::bad(format!(
            "--wait-timeout must be a number of seconds from 0 to {MAX_WAIT_TIMEOUT_S:e} (got {:?})",
            a.wait_timeout
        )));
    }
    if a.batch_size == 0 {
        return Err(Failure::bad("--batch-size must be at least 1 (got 0)"));
    }
    crate::limits::check_limits(&a.limit)?;
    let packer = PackerOptions {
        limits: SampleLimits {
            caps: a.limit.iter().map(|(_, cap)| *cap).collect(),
            names: a.limit.iter().map(|(name, _)| name.clone()).collect(),
            max_segments: a.max_segments,
        },
        pad_to_multiple_of: a.pad_to_multiple_of,
        pad_token_id: a.pad_token_id,
        cost: a.cost,
        num_runs: a.num_runs,
        threshold: a.threshold,
        step_tokens: a.step_tokens,
        wait_timeout: Duration::from_secs_f64(a.wait_timeout),
        teacher_logprobs: a.teacher_logprobs,
        allow_empty_completion: a.allow_empty_completion,
        loss_agg_mode: a.loss_agg_mode,
        loss_scale_factor: a.loss_scale_factor,
        loss_normalization: a.loss_normalization,
        distribution: a.distribution,
        ..PackerOptions::new(capacity, a.dp)
    };
    let state_dir = match (&a.state_dir, &a.root) {
        (Some(d), _) => d.clone(),
        (None, Some(root)) => root.join("packer"),
        (None, None) => {
            return Err(Failure::bad("--state-dir (or --root) is required: where the checkpoint and spool live"));
        }
    };
    let options = ServeOptions {
        packer,
        state_dir: state_dir.clone(),
        runs: Vec::new(),
        auto_add: (!a.no_auto_add_runs).then_some(RunConfig { batch_size: a.batch_size }),
        max_steps: a.max_steps,
        poll: Duration::from_millis(50),
        rejected: RejectedLimits {
            max_files: a.rejected_max_files,
            max_bytes: a.rejected_max_mib.saturating_mul(1 << 20),
            ..RejectedLimits::default()
        },
    };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .map_err(|e| Failure::bad(format!("installing the signal handler: {e}")))?;
    }
    let poll = Duration::from_millis(a.poll_ms.max(1));
    let max_message = a.max_message_mib << 20;
    let (transport, endpoints): (Box<dyn Transport>, _) = match a.transport {
        TransportKind::Fs => {
            let root = a.root.as_ref().ok_or_else(|| Failure::bad("--root is required with --transport fs"))?;
            if a.zmq_curve_secret.is_some() {
                return Err(Failure::bad("--zmq-curve-secret/--zmq-curve-clients need --transport zmq"));
            }
            (
                Box::new(FsTransport::new(root, poll)?.with_max_message_bytes(max_message)?),
                Endpoints::Fs { root: root.clone() },
            )
        }
        #[cfg(feature = "zmq")]
        TransportKind::Zmq => {
            let wanted = ZmqEndpoints {
                batches: a.zmq_batches.clone(),
                receipts: a.zmq_receipts.clone(),
                ranks: a.zmq_ranks.clone(),
            };
            let curve = match (&a.zmq_curve_secret, &a.zmq_curve_clients) {
                (Some(secret), Some(clients)) => Some(CurveServer::load(secret, clients)?),
                _ => None,
            };
            if let Some(c) = &curve {
                tracing::info!(target: "stowplan::serve", public_key = %curve::z85(&c.public), clients = c.clients.len(), "CURVE on: every socket encrypted, clients admitted by key");
            }
            let t = ZmqTransport::bind_capped(&wanted, a.dp, curve.as_ref(), max_message)?;
            let e = t.endpoints();
            let endpoints = Endpoints::Zmq {
                batches: e.batches.clone(),
                receipts: e.receipts.clone(),
                ranks: e.ranks.clone(),
                incarnation: t.incarnation(),
            };
            (Box::new(t), endpoints)
        }
        #[cfg(not(feature = "zmq"))]
        TransportKind::Zmq => return Err(crate::failure::without_zmq("--transport zmq")),
    };
    let kernel = ReadyKernel::new(Backend::Wasm)?;
    let mut server = Server::open(kernel.kernel, transport, options)?;
    tracing::info!(
        target: "stowplan::serve",
        transport = %endpoints,
        state_dir = %state_dir.display(),
        capacity,
        dp = a.dp,
        threshold = server.packer().options().threshold_tokens(),
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
    tracing::info!(
        target: "stowplan::serve",
        steps = summary.steps,
        pending_samples = summary.pending_samples,
        in_flight_step = ?summary.in_flight_step,
        "stopped"
    );
    let runs = server
        .packer()
        .runs()
        .map(|(run, config, progress)| RunReport { run, batch_size: config.batch_size, progress })
        .collect();
    print_report(&Report { summary, runs }, a.json)
}
