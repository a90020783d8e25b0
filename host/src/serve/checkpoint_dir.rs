//! A packer's checkpoint directory outside `stowplan serve`: the state of an in-process
//! packer (the Ray actor's, `stowplan.ray.PackerActor`), the ranks that acknowledged its
//! step in flight, and the spool of the batches the state names.
//!
//! Layout of `DIR`: `packer_state.bin` ([`wire::ACTOR_CHECKPOINT`]: the encoded
//! [`PackerState`] and the acknowledged ranks), `batches/run_{r}_step_{s}.bin` (each batch
//! the state needs, as received) and `lock` (the owner: one at a time).
//!
//! The rules are those `stowplan serve` keeps for its state directory; the refusals
//! ([`refuse_orphaned_spool`], [`read_spooled`]) are written here and used by both, and
//! serve's own recovery of the files its state does not name (`Server::open`) keeps the same
//! rule with its `rejected/` bounds:
//! - **one owner**: [`CheckpointDir::open`] takes `DIR/lock` for as long as the directory
//!   lives ([`crate::runtime`]'s `flock`, dropped by the kernel when its holder dies); a
//!   second owner is refused naming the first;
//! - **the state and the spool are checked together before anything is deleted**: a spool
//!   that holds batches beside a missing state file is refused ([`refuse_orphaned_spool`]),
//!   since the state that says which of their samples were delivered is gone; every batch
//!   the state names must be in the spool, readable and the batch named
//!   ([`read_spooled`]); a spool file the state does not name is ingested again if the
//!   state has not seen its batch (received after the last checkpoint) and deleted
//!   otherwise, and one that does not decode is set aside in `DIR/rejected/`;
//! - every refusal is a `cache-mismatch` error naming the file and what is wrong (a field,
//!   a missing batch), never a partial restore.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::batch_file_name;
use super::protocol::files;
use crate::Error;
use crate::kernel::Kernel;
use crate::packer::{BatchKey, Packer, PackerOptions, PackerState, TrainingBatch};
use crate::runtime::atomic;
use crate::wire;

/// The state file under the directory.
pub const STATE_FILE: &str = "packer_state.bin";
/// The spool of batches under the directory.
pub const SPOOL: &str = "batches";
/// Spool files that could not be decoded are moved here.
pub const REJECTED: &str = "rejected";
/// The magic of the checkpoint format before [`wire::ACTOR_CHECKPOINT`], refused by name.
const LEGACY_MAGIC: &[u8] = b"SPRAYCK1";

/// What [`wire::ACTOR_CHECKPOINT`] holds.
#[derive(Serialize, Deserialize)]
struct Record {
    /// The encoded [`PackerState`] (its own format and version).
    state: Vec<u8>,
    /// The ranks that acknowledged the step in flight, ascending.
    acked: Vec<u32>,
}

/// A packer's checkpoint directory, owned while this value lives (see the module docs).
#[derive(Debug)]
pub struct CheckpointDir {
    dir: PathBuf,
    _lock: File,
}

/// A packer restored by [`CheckpointDir::load`].
#[derive(Debug)]
pub struct Restored {
    /// The packer, its step in flight to be rebuilt ([`Packer::rebuild_inflight`]).
    pub packer: Packer,
    /// The ranks that acknowledged the step in flight.
    pub acked: Vec<u32>,
    /// Batches spooled after the checkpoint and ingested again (their `(run, step)`).
    pub reingested: Vec<BatchKey>,
    /// Spool files that did not decode, moved to `DIR/rejected/` (their new paths).
    pub set_aside: Vec<PathBuf>,
}

impl CheckpointDir {
    /// Opens (creating it and its spool if needed) and owns `dir`, waiting up to `wait` for
    /// another owner to let go (a restart whose predecessor is still dying; on a network
    /// filesystem, until a dead host's lease expires); `owner` names this owner in the lock
    /// file (e.g. "stowplan.ray.PackerActor"). Errors: `io` for the directories, or when
    /// another process owns `dir` after `wait` (the message names it).
    pub fn open(dir: impl Into<PathBuf>, owner: &str, wait: std::time::Duration) -> Result<Self, Error> {
        let dir = dir.into();
        let spool = dir.join(SPOOL);
        std::fs::create_dir_all(&spool).map_err(|e| Error::io("creating directory", &spool, e))?;
        let lock = crate::runtime::lock_exclusive(&dir.join("lock"), "this checkpoint directory", owner, wait)?;
        Ok(Self { dir, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The state file.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Where batch `key` is spooled.
    pub fn batch_path(&self, key: BatchKey) -> PathBuf {
        self.dir.join(SPOOL).join(batch_file_name(key))
    }

    /// The packer the directory holds (`None`: no checkpoint and an empty spool, a fresh
    /// start), checked whole before anything is changed (module docs). `options` must be the
    /// saved ones. Errors: `cache-mismatch` naming the file and the field or batch; `io`.
    pub fn load(&self, kernel: Kernel, options: PackerOptions) -> Result<Option<Restored>, Error> {
        let path = self.state_path();
        let spool = self.dir.join(SPOOL);
        let bytes = match read_durable(&path)? {
            Some(b) => b,
            None => {
                refuse_orphaned_spool(
                    &spool,
                    &path,
                    "an empty checkpoint directory, with every rank started at step 0 and every batch sent again",
                )?;
                return Ok(None);
            }
        };
        let (state, acked) = decode(&path, &bytes)?;
        let needed = state.batches();
        let packer =
            Packer::restore(kernel, options, state, |key| read_spooled(&spool, key)).map_err(|e| named(&path, e))?;
        let mut restored = Restored { packer, acked, reingested: Vec::new(), set_aside: Vec::new() };
        self.recover_spool(&needed, &mut restored)?;
        Ok(Some(restored))
    }

    /// Spool files the state does not name: temporary files of an interrupted write are
    /// removed, batches the state has not seen ingested again, the rest (delivered before
    /// the checkpoint) left for [`CheckpointDir::save`] to delete.
    fn recover_spool(&self, needed: &BTreeSet<BatchKey>, r: &mut Restored) -> Result<(), Error> {
        let spool = self.dir.join(SPOOL);
        let names: BTreeSet<String> = needed.iter().map(|&k| batch_file_name(k)).collect();
        for name in spool_entries(&spool)? {
            let p = spool.join(&name);
            if files::is_temporary(&name) {
                let _ = std::fs::remove_file(&p);
                continue;
            }
            if names.contains(&name) || !is_batch_file(&p) {
                continue;
            }
            let Some(bytes) = read_durable(&p)? else { continue }; // gone meanwhile
            match TrainingBatch::decode(&bytes) {
                Ok(batch) if batch_file_name(batch.key()) == name => {
                    let key = batch.key();
                    let report = r.packer.ingest(Arc::new(batch));
                    if !report.duplicate {
                        r.reingested.push(key);
                    }
                }
                _ => {
                    let rejected = self.dir.join(REJECTED);
                    std::fs::create_dir_all(&rejected).map_err(|e| Error::io("creating directory", &rejected, e))?;
                    let to = rejected.join(&name);
                    std::fs::rename(&p, &to).map_err(|e| Error::io("moving aside", &p, e))?;
                    r.set_aside.push(to);
                }
            }
        }
        Ok(())
    }

    /// Writes the checkpoint of `packer` with the ranks `acked` that acknowledged its step in
    /// flight (atomically), then deletes the spool files of batches it no longer needs.
    /// Errors: `invalid-argument` for `acked` out of `0..dp`, repeated, or without a step in
    /// flight; `io`.
    pub fn save(&self, packer: &Packer, acked: &[u32]) -> Result<(), Error> {
        let state = packer.state();
        check_acked(&state, acked).map_err(Error::InvalidArgument)?;
        let record = Record { state: state.encode()?, acked: acked.to_vec() };
        let bytes = wire::encode(&wire::ACTOR_CHECKPOINT, &record, record.state.len() + 16)?;
        atomic::write(&self.state_path(), &bytes)?;
        let keep: BTreeSet<String> = state.batches().into_iter().map(batch_file_name).collect();
        let spool = self.dir.join(SPOOL);
        for name in spool_entries(&spool)? {
            let p = spool.join(&name);
            if !keep.contains(&name) && !files::is_temporary(&name) && is_batch_file(&p) {
                std::fs::remove_file(&p).map_err(|e| Error::io("removing", &p, e))?;
            }
        }
        Ok(())
    }
}

/// The state and acknowledged ranks of a checkpoint file's bytes; errors name `path` and
/// the field.
fn decode(path: &Path, bytes: &[u8]) -> Result<(PackerState, Vec<u32>), Error> {
    let bad = |m: String| Error::CacheMismatch(format!("{}: {m}", path.display()));
    if bytes.starts_with(LEGACY_MAGIC) {
        return Err(bad(
            "a checkpoint of an earlier stowplan (format SPRAYCK1), which this build does not read: finish the \
             run with that version, or start over with an empty directory"
                .into(),
        ));
    }
    let record: Record = wire::decode(&wire::ACTOR_CHECKPOINT, bytes).map_err(|e| bad(inner(e)))?;
    let state = PackerState::decode(&record.state).map_err(|e| bad(format!("state: {}", inner(e))))?;
    check_acked(&state, &record.acked).map_err(bad)?;
    Ok((state, record.acked))
}

/// The message of a decoding error without its kind's prefix (the caller names the kind).
fn inner(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => m.strip_prefix("bytes: ").map(str::to_string).unwrap_or(m),
        e => e.to_string(),
    }
}

/// Checks acknowledged ranks against a state: ascending, distinct, in `0..dp`, and only
/// with a step in flight.
fn check_acked(state: &PackerState, acked: &[u32]) -> Result<(), String> {
    let dp = state.dp();
    if acked.is_empty() {
        return Ok(());
    }
    if state.in_flight().is_none() {
        return Err(format!("acked: ranks {acked:?} acknowledged a step, but no step is in flight"));
    }
    if let Some(&r) = acked.iter().find(|&&r| r >= dp) {
        return Err(format!("acked: rank {r} out of range 0..{dp}"));
    }
    if acked.windows(2).any(|w| w[0] >= w[1]) {
        return Err(format!("acked: ranks {acked:?} must be ascending and distinct"));
    }
    if acked.len() >= dp as usize {
        return Err(format!(
            "acked: all {dp} ranks acknowledged the step in flight, which is then delivered: a checkpoint never \
             records that"
        ));
    }
    Ok(())
}

/// Adds the state file to an error of the restore (its messages name the batch, not the
/// file that named it).
fn named(path: &Path, e: Error) -> Error {
    match e {
        Error::CacheMismatch(m) => Error::CacheMismatch(format!("{}: {m}", path.display())),
        e => e,
    }
}

/// The names in a spool directory, sorted.
fn spool_entries(spool: &Path) -> Result<Vec<String>, Error> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(spool).map_err(|e| Error::io("listing", spool, e))? {
        let e = e.map_err(|e| Error::io("listing", spool, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// Whether `p` is a regular file (not followed through a symlink) with a batch file's
/// name: the only entries the spool's keeper reads, moves or deletes.
fn is_batch_file(p: &Path) -> bool {
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    files::batch_of_file_name(&name).is_some() && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())
}

/// The spooled batch `key` from `spool`, for a restore. Errors: `cache-mismatch` naming the
/// file when it is missing (deleted or renamed), unreadable, damaged or another batch.
pub(crate) fn read_spooled(spool: &Path, key: BatchKey) -> Result<Arc<TrainingBatch>, Error> {
    let p = spool.join(batch_file_name(key));
    let bytes = read_durable(&p)?.ok_or_else(|| {
        Error::CacheMismatch(format!(
            "{}: a spooled batch the checkpoint needs (run {} step {}) is missing (deleted or renamed?); restore it \
             from a backup, or start over with an empty directory",
            p.display(),
            key.run,
            key.step
        ))
    })?;
    let batch =
        TrainingBatch::decode(&bytes).map_err(|e| Error::CacheMismatch(format!("{}: {}", p.display(), inner(e))))?;
    if batch.key() != key {
        return Err(Error::CacheMismatch(format!(
            "{}: holds batch run {} step {}, not the run {} step {} its name says",
            p.display(),
            batch.key().run,
            batch.key().step,
            key.run,
            key.step
        )));
    }
    Ok(Arc::new(batch))
}

/// Reads a durable file of a packer's directory (a state, a spooled batch, a delivery mark):
/// `None` when it does not exist. Only a regular file is read, never through a symlink, never
/// blocking on a FIFO, at most [`MAX_DURABLE_BYTES`](crate::runtime::MAX_DURABLE_BYTES).
/// Errors: `cache-mismatch` naming the file when it is anything else or larger; `io`.
pub(crate) fn read_durable(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    let max = crate::runtime::MAX_DURABLE_BYTES;
    match crate::runtime::read_regular(path, max) {
        Ok(Ok(bytes)) => Ok(Some(bytes)),
        Ok(Err(size)) => Err(Error::CacheMismatch(format!(
            "{}: {size} bytes, more than a packer writes there ({max} at most): not this packer's file",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidInput || e.raw_os_error() == Some(libc::ELOOP) => {
            Err(Error::CacheMismatch(format!(
                "{}: not a regular file (a symlink, FIFO, device or directory), which a packer never writes: put the \
                 file back, or start over with an empty directory",
                path.display()
            )))
        }
        Err(e) => Err(Error::io("reading", path, e)),
    }
}

/// Refuses to start a new packer beside a spool that holds batches: a packer checkpoints
/// before it spools anything it acknowledged, so spooled batches without `state_path` mean
/// the checkpoint was lost, and with it which of their samples were delivered. `start_over`
/// says what starting over on purpose takes. Errors: `cache-mismatch` naming the missing
/// file, the spool and the ways out; `io`.
pub(crate) fn refuse_orphaned_spool(spool: &Path, state_path: &Path, start_over: &str) -> Result<(), Error> {
    let mut orphans = 0usize;
    let mut first = None;
    for name in spool_entries(spool)? {
        if !files::is_temporary(&name) {
            orphans += 1;
            first = first.or(Some(name));
        }
    }
    match first {
        None => Ok(()),
        Some(name) => Err(Error::CacheMismatch(format!(
            "refusing to start: {} is missing but {} holds {orphans} spooled batch(es) ({name} …): the checkpoint \
             that says which of their samples were delivered is lost, and starting over would deliver them again \
             under step numbers the ranks already have. Restore {} from a backup, or start over on purpose with {start_over}",
            state_path.display(),
            spool.display(),
            state_path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        ))),
    }
}
