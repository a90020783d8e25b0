//! `stowplan serve`: the [`Packer`] as a long-running process between an orchestrator and
//! the trainer ranks, over a [`Transport`].
//!
//! The [`Server`] loop: receive messages (training batches and run changes), keep each
//! accepted batch in a spool file, checkpoint, and whenever the packer is ready pack a step,
//! checkpoint it as *in flight*, deliver every rank's [`RankBatch`], mark it delivered,
//! checkpoint again and drop the spool files of fully delivered batches. After a crash
//! ([`Server::open`] on the same state directory) the step in flight is rebuilt from the spool
//! and delivered again (identical bytes; receivers skip a step they already have), batches
//! spooled after the last checkpoint are ingested again, and a batch the orchestrator sends
//! again is recognised as a duplicate: nothing is lost and nothing is delivered twice.
//!
//! Two transports: [`FsTransport`] (files under a shared root) and `ZmqTransport` (ZeroMQ over
//! TCP, for orchestrators and ranks on other hosts; feature `zmq`); [`protocol`] holds the
//! messages both speak and each side's rules as state machines without I/O, [`client`] the
//! Rust clients that drive them (a rank over files, [`FileRankClient`]; a rank and an
//! orchestrator over ZeroMQ, `ZmqRankClient` and `ZmqBatchSender`, feature `zmq`).
//!
//! State directory: `state.bin` (the [`PackerState`], replaced atomically), `spool/`
//! (`run_{r}_step_{s}.bin`, the batches' encodings), `rejected/` (messages that could not be
//! decoded, kept for inspection), `lock` (held while a server runs; a second server on the
//! same directory is refused, naming the holder's pid). The filesystem transport also holds
//! `ROOT/serve.lock`: a second server on the same root is refused even with another state
//! directory.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

pub mod client;
#[cfg(feature = "zmq")]
pub mod curve;
pub mod protocol;
#[cfg(feature = "zmq")]
mod zmq;

pub use client::{FileRankClient, FileRankOptions};
#[cfg(feature = "zmq")]
pub use client::{ZmqBatchSender, ZmqRankClient, ZmqRankOptions, ZmqSenderOptions};
#[cfg(feature = "zmq")]
pub use curve::{Certificate, CurveClient, CurveServer, curve_available};
pub use protocol::{
    Arrival, BatchSender, Control, ControlMessage, Delivered, DeliveryMark, HEARTBEAT, MAX_MESSAGE_BYTES, MessageKey,
    RankMessage, RankReceiver, Receipt, Receipts, Received, Refusal, StepDelivery, ToRank, ZmqEndpoints,
    batch_file_name,
};
#[cfg(feature = "zmq")]
pub use zmq::ZmqTransport;

use crate::error::io;

/// A libzmq failure while doing `what`, as an `io` error (every ZeroMQ piece of `serve`).
#[cfg(feature = "zmq")]
pub(crate) fn zmq_error(what: &str, e: ::zmq::Error) -> Error {
    Error::Io(format!("zeromq: {what}: {e}"))
}

/// Counts an event that is logged at most once per `every` (a flood of it must not flood the
/// log): [`Throttled::note`] says when to log and how many happened since the last line.
#[cfg(feature = "zmq")]
#[derive(Debug)]
pub(crate) struct Throttled {
    every: Duration,
    total: u64,
    logged: u64,
    last: Option<Instant>,
}

#[cfg(feature = "zmq")]
impl Throttled {
    /// Logged at most once per `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self { every, total: 0, logged: 0, last: None }
    }

    /// Counts one event; `Some(n)` when a line is due now, `n` events since the last line.
    pub(crate) fn note(&mut self) -> Option<u64> {
        self.total += 1;
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        let since = self.total - self.logged;
        (self.logged, self.last) = (self.total, Some(Instant::now()));
        Some(since)
    }

    /// Events counted so far.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}
use crate::runtime::atomic;
use crate::{
    BatchKey, Error, Kernel, Packer, PackerOptions, PackerState, RankBatch, RunConfig, StepMetrics, TrainingBatch, wire,
};
use protocol::files;

/// A message that reached the packer.
#[derive(Debug)]
pub enum Message {
    /// A training batch.
    Batch(Arc<TrainingBatch>),
    /// A run change.
    Control(ControlMessage),
}

impl Message {
    /// Decodes a training batch or a control message (told apart by their headers).
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        if wire::CONTROL.matches(bytes) {
            return ControlMessage::decode(bytes).map(Message::Control);
        }
        if !wire::TRAINING_BATCH.matches(bytes) {
            return Err(Error::InvalidArgument(
                "bytes: neither a training batch (SPTB) nor a control message (SPCT)".into(),
            ));
        }
        TrainingBatch::decode(bytes).map(|b| Message::Batch(Arc::new(b)))
    }
}

/// One received message: its bytes, and the file it came in (filesystem transport), which
/// the server moves into its spool or deletes once the message is durable.
#[derive(Debug)]
pub struct Incoming {
    /// The encoded message.
    pub bytes: Vec<u8>,
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// `Some(size)`: the message is over the transport's cap ([`MAX_MESSAGE_BYTES`] by
    /// default) and was not read (`bytes` is empty); the server sets its file aside.
    pub oversized: Option<u64>,
}

/// How messages reach the packer and rank batches reach the trainer ranks.
pub trait Transport {
    /// A short name for logs ("fs", "zmq").
    fn name(&self) -> &'static str;
    /// Whether every rank is ready to receive (the barrier before the first step); does not
    /// block. The server packs nothing before this is `true`.
    fn ready(&mut self) -> Result<bool, Error>;
    /// Messages that arrived, waiting at most `timeout` for the first.
    fn receive(&mut self, timeout: Duration) -> Result<Vec<Incoming>, Error>;
    /// Tells the senders that these messages are durable (called after the checkpoint that
    /// made them so). The filesystem transport needs nothing: a message stays in the inbox
    /// until the server has moved or deleted it.
    fn acknowledge(&mut self, receipts: Vec<Receipt>) -> Result<(), Error> {
        let _ = receipts;
        Ok(())
    }
    /// Delivers one step: `ranks[r]` is rank `r`'s batch (encode with [`RankBatch::encode`]).
    /// Returns `false` when `stop` was set before every rank had it: the step then stays in
    /// flight and is delivered again after a restart.
    fn deliver(&mut self, step: u64, ranks: &[RankBatch], stop: &AtomicBool) -> Result<bool, Error>;
    /// What the receivers show of earlier deliveries, if anything (the filesystem root's
    /// step files and delivery mark; the ranks' hellos over ZeroMQ, once [`Transport::ready`]).
    /// The server refuses to serve receivers ahead of its checkpoint ([`Delivered::check`]).
    fn delivered(&mut self) -> Result<Option<Delivered>, Error> {
        Ok(None)
    }
    /// Takes no message until a receiver has shown where it stands (ZeroMQ: a rank's hello),
    /// so that a packer starting without a checkpoint learns whether the ranks are ahead of it
    /// ([`Delivered::check`]) before it acknowledges anything. The filesystem transport's
    /// evidence is on disk from the start: nothing to wait for.
    fn wait_for_receivers(&mut self) {}
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn ready(&mut self) -> Result<bool, Error> {
        (**self).ready()
    }
    fn receive(&mut self, timeout: Duration) -> Result<Vec<Incoming>, Error> {
        (**self).receive(timeout)
    }
    fn acknowledge(&mut self, receipts: Vec<Receipt>) -> Result<(), Error> {
        (**self).acknowledge(receipts)
    }
    fn deliver(&mut self, step: u64, ranks: &[RankBatch], stop: &AtomicBool) -> Result<bool, Error> {
        (**self).deliver(step, ranks, stop)
    }
    fn delivered(&mut self) -> Result<Option<Delivered>, Error> {
        (**self).delivered()
    }
    fn wait_for_receivers(&mut self) {
        (**self).wait_for_receivers()
    }
}

/// Runs `f` on every rank's batch, one thread per rank (encoding is the costly part of a
/// delivery; one rank's encoding overlaps another's write).
pub(crate) fn per_rank<T: Send>(
    ranks: &[RankBatch],
    f: impl Fn(usize, &RankBatch) -> Result<T, Error> + Sync,
) -> Result<Vec<T>, Error> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = ranks.iter().enumerate().map(|(r, b)| s.spawn(move || f(r, b))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Runtime("a rank's encoder panicked".into()))))
            .collect()
    })
}

/// The filesystem transport: the orchestrator writes messages into `ROOT/inbox/` (see
/// [`send_fs`]), the packer writes rank `r`'s batch of step `n` to
/// `ROOT/rollouts/step_{n}/rank_{r}.bin` (temporary file, fsync, rename), and ranks wait
/// for their file ([`receive_fs`]). Temporary files (names starting with `.`) are ignored.
#[derive(Debug)]
pub struct FsTransport {
    root: PathBuf,
    poll: Duration,
    max_message_bytes: u64,
    /// The root's evidence, read once: while the transport lives it is the root's only writer.
    evidence: Option<Option<Delivered>>,
    /// `ROOT/serve.lock`, held while the transport lives: two servers on one root (even with
    /// different state directories) would overwrite each other's step files.
    _lock: File,
}

impl FsTransport {
    /// A transport under `root` polling every `poll`, holding `ROOT/serve.lock` while it
    /// lives. Errors: `io` for the directories, or when another server holds the root (the
    /// message names its pid).
    pub fn new(root: impl Into<PathBuf>, poll: Duration) -> Result<Self, Error> {
        let root = root.into();
        for d in [root.join(files::INBOX), root.join(files::ROLLOUTS)] {
            std::fs::create_dir_all(&d).map_err(|e| io("creating directory", &d, e))?;
        }
        let lock = crate::runtime::lock_exclusive(&root.join("serve.lock"), "this root")?;
        Ok(Self { root, poll, max_message_bytes: MAX_MESSAGE_BYTES, evidence: None, _lock: lock })
    }

    /// Inbox files over `max` bytes are not read but set aside into `STATE/rejected/`
    /// (default [`MAX_MESSAGE_BYTES`]). Errors: `invalid-argument` for 0.
    pub fn with_max_message_bytes(mut self, max: u64) -> Result<Self, Error> {
        if max == 0 {
            return Err(Error::InvalidArgument("max_message_bytes must be at least 1 (got 0)".into()));
        }
        self.max_message_bytes = max;
        Ok(self)
    }

    fn scan(&self) -> Result<Vec<PathBuf>, Error> {
        let inbox = self.root.join(files::INBOX);
        let mut files = Vec::new();
        for e in std::fs::read_dir(&inbox).map_err(|e| io("listing", &inbox, e))? {
            let e = e.map_err(|e| io("listing", &inbox, e))?;
            let name = e.file_name();
            if !files::is_inbox_message(&name.to_string_lossy()) {
                continue;
            }
            // A symlink or a FIFO is not a message: following one could truncate the file it
            // points to when it is set aside, or block for ever.
            if e.file_type().is_ok_and(|t| !t.is_file()) {
                tracing::warn!(target: "stowplan::serve", file = %e.path().display(), "inbox entry that is not a regular file ignored");
                continue;
            }
            files.push(e.path());
        }
        files.sort();
        Ok(files)
    }
}

impl Transport for FsTransport {
    fn name(&self) -> &'static str {
        "fs"
    }

    fn ready(&mut self) -> Result<bool, Error> {
        Ok(true)
    }

    fn receive(&mut self, timeout: Duration) -> Result<Vec<Incoming>, Error> {
        let deadline = Instant::now() + timeout;
        loop {
            let files = self.scan()?;
            if !files.is_empty() {
                let mut out = Vec::with_capacity(files.len());
                // At most about two messages' worth held at once: the rest waits for the next
                // receive.
                let mut held = 0u64;
                for p in files {
                    if held >= self.max_message_bytes {
                        break;
                    }
                    match read_capped(&p, self.max_message_bytes) {
                        Ok(Ok(bytes)) => {
                            held += bytes.len() as u64;
                            out.push(Incoming { bytes, path: Some(p), oversized: None })
                        }
                        Ok(Err(size)) => out.push(Incoming { bytes: Vec::new(), path: Some(p), oversized: Some(size) }),
                        // Taken by another reader between the listing and the read.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                        // Swapped for a symlink or a FIFO after the listing: not a message.
                        Err(e) if std::fs::symlink_metadata(&p).is_ok_and(|m| !m.is_file()) => {
                            tracing::warn!(target: "stowplan::serve", file = %p.display(), error = %e, "inbox entry that is not a regular file ignored");
                        }
                        Err(e) => return Err(io("reading", &p, e)),
                    }
                }
                return Ok(out);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            std::thread::sleep(self.poll.min(deadline - now));
        }
    }

    fn deliver(&mut self, step: u64, ranks: &[RankBatch], _stop: &AtomicBool) -> Result<bool, Error> {
        let root = &self.root;
        per_rank(ranks, |r, batch| atomic::write(&files::rank_batch_path(root, step, r as u32), &batch.encode()?))?;
        let mark = DeliveryMark { next_step: step + 1 };
        atomic::write(&root.join(files::DELIVERY_MARK), &mark.encode()?)?;
        Ok(true)
    }

    fn delivered(&mut self) -> Result<Option<Delivered>, Error> {
        if let Some(e) = &self.evidence {
            return Ok(e.clone());
        }
        let e = self.read_evidence()?;
        self.evidence = Some(e.clone());
        Ok(e)
    }
}

impl FsTransport {
    /// What the root shows of earlier deliveries: `delivered.bin` and the `step_{n}`
    /// directories.
    fn read_evidence(&self) -> Result<Option<Delivered>, Error> {
        let path = self.root.join(files::DELIVERY_MARK);
        let marked = match std::fs::read(&path) {
            Ok(bytes) => {
                let mark = DeliveryMark::decode(&bytes).map_err(|e| {
                    Error::CacheMismatch(format!(
                        "{}: {e}; it records how far this root was delivered: restore it, or remove it only if \
                         no rank has taken a step from this root",
                        path.display()
                    ))
                })?;
                Some(Delivered { next_step: mark.next_step, evidence: format!("{} says so", path.display()) })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io("reading", &path, e)),
        };
        let rollouts = self.root.join(files::ROLLOUTS);
        let mut last: Option<u64> = None;
        for e in std::fs::read_dir(&rollouts).map_err(|e| io("listing", &rollouts, e))? {
            let e = e.map_err(|e| io("listing", &rollouts, e))?;
            if let Some(n) = files::step_of_dir(&e.file_name().to_string_lossy()) {
                last = last.max(Some(n));
            }
        }
        let listed = last.map(|n| Delivered {
            next_step: n.saturating_add(1),
            evidence: format!("{} exists", files::step_dir(&self.root, n).display()),
        });
        Ok(Delivered::max(marked, listed))
    }
}

/// Reads `path` whole if it holds at most `max` bytes; `Ok(Err(size))` when it is larger
/// (then at most `max + 1` bytes were read: a file that grows, or a device, cannot make the
/// read unbounded).
fn read_capped(path: &Path, max: u64) -> std::io::Result<Result<Vec<u8>, u64>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Not through a symlink swapped in after the listing, and never blocking on a FIFO.
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let size = meta.len();
    if size > max {
        return Ok(Err(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Ok(Err(bytes.len() as u64));
    }
    Ok(Ok(bytes))
}

/// Writes `bytes` (an encoded [`TrainingBatch`] or [`Control`]) into `root/inbox/` under
/// `name` atomically: what the orchestrator side of the filesystem transport does. Errors:
/// `invalid-argument` for a bad name or a message over [`MAX_MESSAGE_BYTES`] (the packer's
/// default cap; the filesystem transport has no receipts to tell the sender later); `io`.
pub fn send_fs(root: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf, Error> {
    files::check_message_name(name)?;
    // The filesystem transport has no receipts: a file the packer would set aside is refused
    // here, where the sender sees it.
    if bytes.len() as u64 > MAX_MESSAGE_BYTES {
        return Err(protocol::oversized_message(&format!("message {name}"), bytes.len() as u64, MAX_MESSAGE_BYTES));
    }
    let path = files::inbox_path(root, name);
    atomic::write(&path, bytes)?;
    Ok(path)
}

/// Waits (polling every `poll`) for rank `rank`'s batch of step `step` under `root` and
/// decodes it. Errors: `timeout` naming the file; those of [`files::decode_rank_file`].
/// [`FileRankClient`] receives steps in order this way (and can consume them).
pub fn receive_fs(root: &Path, step: u64, rank: u32, timeout: Duration, poll: Duration) -> Result<RankBatch, Error> {
    let path = files::rank_batch_path(root, step, rank);
    let bytes = wait_for_file(&path, timeout, poll)?;
    files::decode_rank_file(&path, &bytes, step, rank)
}

/// Reads `path` once it exists, polling every `poll` for at most `timeout` (a timeout too
/// long to represent waits forever). Errors: `timeout` naming the file; `io`.
pub(crate) fn wait_for_file(path: &Path, timeout: Duration, poll: Duration) -> Result<Vec<u8>, Error> {
    let deadline = Instant::now().checked_add(timeout);
    loop {
        match std::fs::read(path) {
            Ok(bytes) => return Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("reading", path, e)),
        }
        let now = Instant::now();
        let left = deadline.map(|d| d.saturating_duration_since(now));
        if left.is_some_and(|l| l.is_zero()) {
            return Err(files::missing_file_error(path, timeout));
        }
        std::thread::sleep(left.map_or(poll, |l| poll.min(l)));
    }
}

/// Refuses to start a new packer beside a spool that holds batches: the server checkpoints
/// before it spools anything, so spooled batches without `state.bin` mean the checkpoint was
/// lost, and with it which of their samples were delivered. Errors: `cache-mismatch` naming
/// the missing file, the spool and the ways out; `io`.
fn refuse_orphaned_spool(spool: &Path, state_path: &Path) -> Result<(), Error> {
    let mut orphans = 0usize;
    let mut first = None;
    for e in std::fs::read_dir(spool).map_err(|e| io("listing", spool, e))? {
        let name = e.map_err(|e| io("listing", spool, e))?.file_name().to_string_lossy().into_owned();
        if !files::is_temporary(&name) {
            orphans += 1;
            first = first.max(Some(name));
        }
    }
    match first {
        None => Ok(()),
        Some(name) => Err(Error::CacheMismatch(format!(
            "refusing to start: {} is missing but {} holds {orphans} spooled batch(es) ({name} …): the checkpoint \
             that says which of their samples were delivered is lost, and starting over would deliver them again \
             under step numbers the ranks already have. Restore state.bin from a backup, or start over on purpose \
             with an empty state directory, a new root and every rank restarted at step 0",
            state_path.display(),
            spool.display()
        ))),
    }
}

/// Options of a [`Server`].
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The packer's options.
    pub packer: PackerOptions,
    /// Where the checkpoint and the spool live.
    pub state_dir: PathBuf,
    /// Runs added at start (existing runs of a restored state are kept).
    pub runs: Vec<(u32, RunConfig)>,
    /// Runs not added explicitly are added on their first batch with this configuration;
    /// `None`: their samples are rejected as `unknown_run`.
    pub auto_add: Option<RunConfig>,
    /// Stop after this many steps were delivered by this process (`None`: run until stopped).
    pub max_steps: Option<u64>,
    /// How long one receive waits before the loop checks the wait timeout and the stop flag.
    pub poll: Duration,
    /// How much `rejected/` keeps of the messages that could not be decoded.
    pub rejected: RejectedLimits,
}

/// Bounds of `STATE/rejected/`, where messages that could not be decoded are kept for
/// inspection: a flood of garbage must not fill the disk. The oldest are dropped first
/// (counted in [`ServeSummary::rejected_dropped`] and logged); a large message keeps only its
/// first `max_file_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RejectedLimits {
    /// Messages kept at most.
    pub max_files: usize,
    /// Bytes kept at most, all messages together.
    pub max_bytes: u64,
    /// Bytes kept of one message at most (its start).
    pub max_file_bytes: u64,
}

impl Default for RejectedLimits {
    /// 256 messages, 64 MiB in all, 1 MiB of each.
    fn default() -> Self {
        Self { max_files: 256, max_bytes: 64 << 20, max_file_bytes: 1 << 20 }
    }
}

/// What happened in one step, for logs and metrics.
#[derive(Clone, Debug, Serialize)]
pub struct StepReport {
    /// The packer's figures.
    #[serde(flatten)]
    pub metrics: StepMetrics,
    /// Seconds from the previous delivery (or start) until packing began, receiving included.
    pub wait_seconds: f64,
    /// Seconds spent reading, decoding, spooling and checking messages since the last step.
    pub receive_seconds: f64,
    /// Seconds spent encoding and delivering the rank batches.
    pub deliver_seconds: f64,
    /// Real tokens over (receive + pack + deliver) seconds.
    pub tokens_per_second: f64,
    /// Whether the step was rebuilt after a restart.
    pub rebuilt: bool,
    /// Samples still pending after the step.
    pub pending_samples: usize,
    /// Tokens still pending after the step.
    pub pending_tokens: u64,
}

/// Totals of a [`Server::run`].
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServeSummary {
    /// Steps delivered by this process.
    pub steps: u64,
    /// Samples delivered.
    pub samples: u64,
    /// Real tokens delivered.
    pub real_tokens: u64,
    /// Padding tokens delivered.
    pub padding_tokens: u64,
    /// Batches received (duplicates included).
    pub batches: u64,
    /// Duplicate batches ignored.
    pub duplicates: u64,
    /// Samples rejected.
    pub rejected: u64,
    /// Messages that could not be decoded (moved to `rejected/`).
    pub undecodable: u64,
    /// Messages dropped from `rejected/` to keep it within [`RejectedLimits`].
    pub rejected_dropped: u64,
    /// Messages over the size cap, set aside unread (counted in `undecodable` too).
    pub oversized: u64,
    /// Pending samples left at exit (kept in the checkpoint).
    pub pending_samples: usize,
    /// A step packed but not taken by every rank at exit (stopped mid-delivery); it is
    /// delivered again after a restart.
    pub in_flight_step: Option<u64>,
}

/// The packer process (see the module docs).
#[derive(Debug)]
pub struct Server<T: Transport> {
    packer: Packer,
    transport: T,
    options: ServeOptions,
    _lock: File,
    summary: ServeSummary,
    receive_seconds: f64,
    last_delivery: Instant,
    /// Whether the packer was restored from `state.bin` (for [`Delivered::check`]'s message).
    restored: bool,
}

impl<T: Transport> Server<T> {
    /// Opens (or creates) the state directory, restores a saved packer if there is one and
    /// re-ingests batches spooled after its checkpoint.
    ///
    /// Errors: `io` (the directory, or another server holding its lock); `cache-mismatch` for
    /// a state saved with other options or a spool file that is missing or corrupt.
    pub fn open(kernel: Kernel, mut transport: T, options: ServeOptions) -> Result<Self, Error> {
        let dir = &options.state_dir;
        for d in [dir.join("spool"), dir.join("rejected")] {
            std::fs::create_dir_all(&d).map_err(|e| io("creating directory", &d, e))?;
        }
        let lock = crate::runtime::lock_exclusive(&dir.join("lock"), "this state directory")?;
        let spool = dir.join("spool");
        let state_path = dir.join("state.bin");
        let load = |key: BatchKey| -> Result<Arc<TrainingBatch>, Error> {
            let p = spool.join(batch_file_name(key));
            let bytes = std::fs::read(&p).map_err(|e| {
                Error::CacheMismatch(format!(
                    "{}: a spooled batch the checkpoint needs is unreadable: {e}",
                    p.display()
                ))
            })?;
            TrainingBatch::decode(&bytes)
                .map(Arc::new)
                .map_err(|e| Error::CacheMismatch(format!("{}: {e}", p.display())))
        };
        let (mut packer, restored) = match std::fs::read(&state_path) {
            Ok(bytes) => {
                let state = PackerState::decode(&bytes)
                    .map_err(|e| Error::CacheMismatch(format!("{}: {e}", state_path.display())))?;
                (Packer::restore(kernel, options.packer, state, load)?, true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                refuse_orphaned_spool(&spool, &state_path)?;
                (Packer::new(kernel, options.packer)?, false)
            }
            Err(e) => return Err(io("reading", &state_path, e)),
        };
        Delivered::check(transport.delivered()?.as_ref(), packer.issued(), &state_path, restored)?;
        if !restored {
            transport.wait_for_receivers();
        }
        for &(run, config) in &options.runs {
            if packer.progress(run).is_none() {
                packer.add_run(run, config)?;
            }
        }
        let mut server = Self {
            packer,
            transport,
            options,
            _lock: lock,
            summary: ServeSummary::default(),
            receive_seconds: 0.0,
            last_delivery: Instant::now(),
            restored,
        };
        server.recover_spool(restored)?;
        server.checkpoint()?;
        Ok(server)
    }

    /// Spool files not named by the checkpoint: batches received after it (ingested again)
    /// or fully delivered before it (deleted).
    fn recover_spool(&mut self, restored: bool) -> Result<(), Error> {
        let spool = self.options.state_dir.join("spool");
        let state = self.packer.state();
        // Live batches were read from the spool by the restore already.
        let live: HashSet<String> = state.batches().into_iter().map(batch_file_name).collect();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&spool)
            .map_err(|e| io("listing", &spool, e))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .collect();
        files.sort();
        for p in files {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if files::is_temporary(&name) {
                // A temporary file of a write the crash interrupted.
                let _ = std::fs::remove_file(&p);
                continue;
            }
            if live.contains(&name) {
                continue;
            }
            let bytes = std::fs::read(&p).map_err(|e| io("reading", &p, e))?;
            let batch = match TrainingBatch::decode(&bytes) {
                Ok(b) => Arc::new(b),
                Err(e) => {
                    tracing::warn!(target: "stowplan::serve", file = %p.display(), error = %e, "undecodable spool file set aside");
                    self.set_aside(&p)?;
                    continue;
                }
            };
            let key = batch.key();
            if state.seen(key) {
                let _ = std::fs::remove_file(&p);
                continue;
            }
            tracing::info!(target: "stowplan::serve", run = key.run, step = key.step, restored, "re-ingesting a batch spooled after the last checkpoint");
            self.ingest(batch, Some(&p))?;
        }
        Ok(())
    }

    fn set_aside(&mut self, p: &Path) -> Result<(), Error> {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let to = self.options.state_dir.join("rejected").join(name);
        self.summary.undecodable += 1;
        std::fs::rename(p, &to).map_err(|e| io("moving aside", p, e))?;
        let cut = self.options.rejected.max_file_bytes.min(self.options.rejected.max_bytes);
        if std::fs::symlink_metadata(&to).is_ok_and(|m| m.is_file() && m.len() > cut) {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&to)
                .and_then(|f| f.set_len(cut))
                .map_err(|e| io("truncating", &to, e))?;
        }
        self.prune_rejected()
    }

    /// Keeps `bytes` (a message received over the network that could not be decoded) in
    /// `rejected/`, up to the limits.
    fn keep_rejected(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.summary.undecodable += 1;
        let name = format!("message_{}_{}.bin", std::process::id(), self.summary.undecodable);
        let cut = self.options.rejected.max_file_bytes.min(self.options.rejected.max_bytes);
        let kept = &bytes[..bytes.len().min(usize::try_from(cut).unwrap_or(usize::MAX))];
        atomic::write(&self.options.state_dir.join("rejected").join(name), kept)?;
        self.prune_rejected()
    }

    /// Drops the oldest messages of `rejected/` until it is within the limits.
    fn prune_rejected(&mut self) -> Result<(), Error> {
        let dir = self.options.state_dir.join("rejected");
        let mut kept: Vec<(std::time::SystemTime, String, u64)> = std::fs::read_dir(&dir)
            .map_err(|e| io("listing", &dir, e))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let meta = e.metadata().ok().filter(|m| m.is_file())?;
                let name = e.file_name().to_string_lossy().into_owned();
                Some((meta.modified().unwrap_or(std::time::UNIX_EPOCH), name, meta.len()))
            })
            .collect();
        kept.sort();
        let limits = self.options.rejected;
        let mut total: u64 = kept.iter().map(|k| k.2).sum();
        let mut dropped = 0u64;
        for (_, name, len) in &kept {
            if kept.len() - dropped as usize <= limits.max_files && total <= limits.max_bytes {
                break;
            }
            let p = dir.join(name);
            std::fs::remove_file(&p).map_err(|e| io("removing", &p, e))?;
            total -= len;
            dropped += 1;
        }
        if dropped > 0 {
            self.summary.rejected_dropped += dropped;
            tracing::warn!(target: "stowplan::serve", dropped, total_dropped = self.summary.rejected_dropped, max_files = limits.max_files, max_bytes = limits.max_bytes, "rejected/ is full: the oldest undecodable messages were dropped");
        }
        Ok(())
    }

    fn checkpoint(&self) -> Result<(), Error> {
        atomic::write(&self.options.state_dir.join("state.bin"), &self.packer.state().encode()?)
    }

    /// The packer (progress, pending samples).
    pub fn packer(&self) -> &Packer {
        &self.packer
    }

    /// Totals so far.
    pub fn summary(&self) -> &ServeSummary {
        &self.summary
    }

    /// Ingests `batch`; `file` (its spool file, or the inbox file of a duplicate that was not
    /// spooled) is deleted when nothing of the batch was kept.
    fn ingest(&mut self, batch: Arc<TrainingBatch>, file: Option<&Path>) -> Result<Receipt, Error> {
        let key = batch.key();
        if self.packer.progress(key.run).is_none()
            && key.run < self.packer.options().num_runs
            && let Some(config) = self.options.auto_add
        {
            self.packer.add_run(key.run, config)?;
            tracing::info!(target: "stowplan::serve", run = key.run, batch_size = config.batch_size, "run added");
        }
        let report = self.packer.ingest(batch);
        self.summary.batches += 1;
        self.summary.rejected += report.rejected.len() as u64;
        if report.duplicate {
            self.summary.duplicates += 1;
            tracing::warn!(target: "stowplan::serve", run = key.run, step = key.step, "duplicate batch ignored");
        }
        for (i, reason, message) in &report.rejected {
            tracing::warn!(target: "stowplan::serve", run = key.run, step = key.step, index = i, reason = reason.name(), detail = %message, "sample rejected");
        }
        if let Some(f) = file.filter(|_| report.duplicate || report.accepted == 0) {
            let _ = std::fs::remove_file(f);
        }
        Ok(Receipt::Batch {
            run: key.run,
            step: key.step,
            accepted: report.accepted,
            rejected: report.rejected.len() as u32,
            duplicate: report.duplicate,
        })
    }

    /// Takes one message; its receipt, once the next checkpoint is written (none for a
    /// message that could not be decoded).
    fn handle(&mut self, incoming: Incoming) -> Result<Option<Receipt>, Error> {
        if let (Some(size), Some(p)) = (incoming.oversized, &incoming.path) {
            tracing::error!(target: "stowplan::serve", file = %p.display(), size, "message over the size cap set aside unread");
            self.summary.oversized += 1;
            self.set_aside(p)?;
            return Ok(None);
        }
        let message = match Message::decode(&incoming.bytes) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(target: "stowplan::serve", file = ?incoming.path, error = %e, "undecodable message set aside");
                match &incoming.path {
                    Some(p) => self.set_aside(p)?,
                    None => self.keep_rejected(&incoming.bytes)?,
                }
                return Ok(None);
            }
        };
        match message {
            Message::Batch(batch) => {
                if self.packer.seen(batch.key()) {
                    // A duplicate: leave the spooled original alone.
                    return self.ingest(batch, incoming.path.as_deref()).map(Some);
                }
                let spooled = self.options.state_dir.join("spool").join(batch_file_name(batch.key()));
                match &incoming.path {
                    Some(p) => std::fs::rename(p, &spooled).map_err(|e| io("moving into the spool", p, e))?,
                    None => atomic::write(&spooled, &incoming.bytes)?,
                }
                self.ingest(batch, Some(&spooled)).map(Some)
            }
            Message::Control(ControlMessage { id, control }) => {
                if self.packer.control_applied(id) {
                    tracing::info!(target: "stowplan::serve", id, control = ?control, "control message received again: ignored (it was applied)");
                    if let Some(p) = &incoming.path {
                        let _ = std::fs::remove_file(p);
                    }
                    return Ok(Some(Receipt::Control { id, control, error: None, duplicate: true }));
                }
                let error = self.apply(&control).err().map(|e| e.to_string());
                self.packer.note_control(id);
                if let Some(p) = &incoming.path {
                    // Durable once checkpointed (with its id); a crash before that applies it again.
                    self.checkpoint()?;
                    let _ = std::fs::remove_file(p);
                }
                Ok(Some(Receipt::Control { id, control, error, duplicate: false }))
            }
        }
    }

    fn apply(&mut self, c: &Control) -> Result<(), Error> {
        let result = match *c {
            Control::AddRun { run, config } => match self.packer.progress(run) {
                Some(_) => {
                    tracing::info!(target: "stowplan::serve", run, "run already exists");
                    Ok(())
                }
                None => self.packer.add_run(run, config).map(
                    |()| tracing::info!(target: "stowplan::serve", run, batch_size = config.batch_size, "run added"),
                ),
            },
            Control::RemoveRun { run } => self.packer.remove_run(run).map(|(dropped, released)| {
                self.drop_spooled(&released);
                tracing::warn!(target: "stowplan::serve", run, dropped_samples = dropped, "run removed");
            }),
        };
        if let Err(e) = &result {
            tracing::error!(target: "stowplan::serve", control = ?c, error = %e, "control message not applied");
        }
        result
    }

    fn drop_spooled(&self, keys: &[BatchKey]) {
        for &k in keys {
            let _ = std::fs::remove_file(self.options.state_dir.join("spool").join(batch_file_name(k)));
        }
    }

    /// Encodes and delivers a packed step, then records it delivered; `None` when `stop`
    /// interrupted the delivery (the step stays in flight).
    fn deliver(
        &mut self,
        step: crate::PackedStep,
        wait: f64,
        rebuilt: bool,
        stop: &AtomicBool,
    ) -> Result<Option<StepReport>, Error> {
        let started = Instant::now();
        if !self.transport.deliver(step.metrics.step, &step.ranks, stop)? {
            return Ok(None);
        }
        drop(step.ranks);
        let released = self.packer.delivered(step.metrics.step)?;
        self.checkpoint()?;
        self.drop_spooled(&released);
        let deliver_seconds = started.elapsed().as_secs_f64();
        let busy = self.receive_seconds + step.metrics.pack_seconds + deliver_seconds;
        let (pending_samples, pending_tokens) = self.packer.pending();
        let report = StepReport {
            tokens_per_second: if busy > 0.0 { step.metrics.real_tokens as f64 / busy } else { 0.0 },
            metrics: step.metrics,
            wait_seconds: wait,
            receive_seconds: self.receive_seconds,
            deliver_seconds,
            rebuilt,
            pending_samples,
            pending_tokens,
        };
        self.receive_seconds = 0.0;
        self.last_delivery = Instant::now();
        self.summary.steps += 1;
        self.summary.samples += report.metrics.samples;
        self.summary.real_tokens += report.metrics.real_tokens;
        self.summary.padding_tokens += report.metrics.padding_tokens;
        Ok(Some(report))
    }

    /// Runs until `stop` is set (SIGINT/SIGTERM in the CLI) or `max_steps` steps were
    /// delivered, calling `on_step` after each step. Nothing is packed before
    /// [`Transport::ready`]. A step being packed when `stop` is set is finished; a delivery
    /// still waiting for ranks (ZeroMQ) is abandoned and the step stays in flight, delivered
    /// again by the next process ([`ServeSummary::in_flight_step`]); pending samples stay in
    /// the checkpoint.
    pub fn run(&mut self, stop: &AtomicBool, mut on_step: impl FnMut(&StepReport)) -> Result<ServeSummary, Error> {
        let mut inflight = self.packer.rebuild_inflight()?;
        let mut ready = false;
        tracing::info!(target: "stowplan::serve", transport = self.transport.name(), "waiting for the ranks");
        self.last_delivery = Instant::now();
        while !stop.load(Ordering::SeqCst) && self.options.max_steps.is_none_or(|m| self.summary.steps < m) {
            let incoming = self.transport.receive(self.options.poll)?;
            // A rank may prove the checkpoint behind at any hello: before taking (and
            // acknowledging) anything more. Messages dropped here were not acknowledged.
            let state = self.options.state_dir.join("state.bin");
            Delivered::check(self.transport.delivered()?.as_ref(), self.packer.issued(), &state, self.restored)?;
            if !incoming.is_empty() {
                let started = Instant::now();
                let mut receipts = Vec::with_capacity(incoming.len());
                for m in incoming {
                    receipts.extend(self.handle(m)?);
                }
                self.checkpoint()?;
                self.transport.acknowledge(receipts)?;
                self.receive_seconds += started.elapsed().as_secs_f64();
            }
            if !ready {
                // The barrier: nothing is packed before every rank can take it.
                ready = self.transport.ready()?;
                if !ready {
                    continue;
                }
                // Every rank has said hello: none may hold a step this checkpoint never issued.
                Delivered::check(self.transport.delivered()?.as_ref(), self.packer.issued(), &state, self.restored)?;
                tracing::info!(target: "stowplan::serve", next_step = self.packer.next_step(), "serving");
            }
            let wait = self.last_delivery.elapsed().as_secs_f64();
            let (step, rebuilt) = match inflight.take() {
                Some(step) => {
                    tracing::warn!(target: "stowplan::serve", step = step.metrics.step, "delivering the step in flight at the last checkpoint again");
                    (step, true)
                }
                None => match self.packer.pack(false)? {
                    Some(step) => {
                        // In flight: durable before any rank can see it.
                        self.checkpoint()?;
                        (step, false)
                    }
                    None => continue,
                },
            };
            match self.deliver(step, wait, rebuilt, stop)? {
                Some(report) => on_step(&report),
                None => break,
            }
        }
        self.summary.pending_samples = self.packer.pending().0;
        self.summary.in_flight_step = self.packer.in_flight();
        Ok(self.summary.clone())
    }
}

#[cfg(all(test, feature = "zmq"))]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_event_is_logged_once_per_period_with_the_count_since() {
        let mut t = Throttled::new(Duration::from_secs(3600));
        assert_eq!(t.note(), Some(1), "the first is logged at once");
        assert_eq!((t.note(), t.note()), (None, None), "then counted quietly");
        assert_eq!(t.total(), 3);
        let mut every = Throttled::new(Duration::ZERO);
        assert_eq!((every.note(), every.note()), (Some(1), Some(1)));
    }
}
