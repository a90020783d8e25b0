//! The filesystem transport ([`FsTransport`]) and the two ends it serves: the orchestrator
//! writing into the inbox ([`send_fs`]) and a rank waiting for its file ([`receive_fs`]).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use super::protocol::{self, files};
use super::{Delivered, DeliveryMark, Incoming, MAX_MESSAGE_BYTES, Transport, per_rank};
use crate::Error;
use crate::packer::RankBatch;
use crate::runtime::atomic;

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
            std::fs::create_dir_all(&d).map_err(|e| Error::io("creating directory", &d, e))?;
        }
        let lock =
            crate::runtime::lock_exclusive(&root.join("serve.lock"), "this root", "stowplan serve", Duration::ZERO)?;
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
        for e in std::fs::read_dir(&inbox).map_err(|e| Error::io("listing", &inbox, e))? {
            let e = e.map_err(|e| Error::io("listing", &inbox, e))?;
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
                    match crate::runtime::read_regular(&p, self.max_message_bytes) {
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
                        Err(e) => return Err(Error::io("reading", &p, e)),
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
        // A regular file of a few bytes: a FIFO there must not block the start, nor a huge
        // file be read whole.
        let read = crate::runtime::read_regular(&path, 1 << 12).and_then(|r| {
            r.map_err(|size| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{size} bytes, not a mark")))
        });
        let marked = match read {
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
            Err(e) => return Err(Error::io("reading", &path, e)),
        };
        let rollouts = self.root.join(files::ROLLOUTS);
        let mut last: Option<u64> = None;
        for e in std::fs::read_dir(&rollouts).map_err(|e| Error::io("listing", &rollouts, e))? {
            let e = e.map_err(|e| Error::io("listing", &rollouts, e))?;
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

/// Writes `bytes` (an encoded [`TrainingBatch`](crate::TrainingBatch) or [`Control`](super::Control)) into `root/inbox/` under
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
/// [`FileRankClient`](super::FileRankClient) receives steps in order this way (and can consume them).
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
            Err(e) => return Err(Error::io("reading", path, e)),
        }
        let now = Instant::now();
        let left = deadline.map(|d| d.saturating_duration_since(now));
        if left.is_some_and(|l| l.is_zero()) {
            return Err(files::missing_file_error(path, timeout));
        }
        std::thread::sleep(left.map_or(poll, |l| poll.min(l)));
    }
}
