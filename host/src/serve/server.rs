//! The [`Server`] loop: receive, spool, checkpoint, pack, deliver (see the `serve` module docs).

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::checkpoint_dir::{read_durable, read_spooled, refuse_orphaned_spool};
use super::protocol::files;
use super::{Control, ControlMessage, Delivered, Incoming, Message, Receipt, Transport, batch_file_name};
use crate::Error;
use crate::kernel::Kernel;
use crate::packer::{BatchKey, PackedStep, Packer, PackerOptions, PackerState, RunConfig, StepMetrics, TrainingBatch};
use crate::runtime::atomic;

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
            std::fs::create_dir_all(&d).map_err(|e| Error::io("creating directory", &d, e))?;
        }
        let lock = crate::runtime::lock_exclusive(
            &dir.join("lock"),
            "this state directory",
            "stowplan serve",
            Duration::ZERO,
        )?;
        let spool = dir.join("spool");
        let state_path = dir.join("state.bin");
        let (mut packer, restored) = match read_durable(&state_path)? {
            Some(bytes) => {
                let state = PackerState::decode(&bytes)
                    .map_err(|e| Error::CacheMismatch(format!("{}: {e}", state_path.display())))?;
                (Packer::restore(kernel, options.packer.clone(), state, |key| read_spooled(&spool, key))?, true)
            }
            None => {
                let start_over = "an empty state directory, a new root and every rank restarted at step 0";
                refuse_orphaned_spool(&spool, &state_path, start_over)?;
                (Packer::new(kernel, options.packer.clone())?, false)
            }
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
            .map_err(|e| Error::io("listing", &spool, e))?
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
            // A FIFO, a device or a symlink there is not a batch (nor read: it could block).
            let bytes = match read_durable(&p) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => continue,
                Err(e @ Error::CacheMismatch(_)) => {
                    tracing::warn!(target: "stowplan::serve", file = %p.display(), error = %e, "unreadable spool entry set aside");
                    self.set_aside(&p)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
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
        std::fs::rename(p, &to).map_err(|e| Error::io("moving aside", p, e))?;
        let cut = self.options.rejected.max_file_bytes.min(self.options.rejected.max_bytes);
        if std::fs::symlink_metadata(&to).is_ok_and(|m| m.is_file() && m.len() > cut) {
            use std::os::unix::fs::OpenOptionsExt;
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&to)
                .and_then(|f| f.set_len(cut))
                .map_err(|e| Error::io("truncating", &to, e))?;
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
            .map_err(|e| Error::io("listing", &dir, e))?
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
            std::fs::remove_file(&p).map_err(|e| Error::io("removing", &p, e))?;
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
                    Some(p) => std::fs::rename(p, &spooled).map_err(|e| Error::io("moving into the spool", p, e))?,
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
        step: PackedStep,
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
