//! The filesystem transport's rules without I/O: the names under its root and what a rank
//! does with a step's file once it read it.
//!
//! Layout of `ROOT`:
//! - `ROOT/inbox/`: the orchestrator's messages, one file each, written atomically
//!   (temporary file, fsync, rename): a training batch as [`batch_file_name`]
//!   (`run_{r}_step_{s}.bin`, which the packer's spool uses too), a control message as
//!   [`control_file_name`] (`control_{ns:020}_{pid}_{kind}_{run}.bin`: sorted by time). Only
//!   names accepted by [`is_inbox_message`] are read: a name starting with `.` is a temporary
//!   file of a write under way ([`is_temporary`]), one not ending in `.bin` is not a message.
//! - `ROOT/rollouts/step_{n}/rank_{r}.bin` ([`rank_batch_path`]): rank `r`'s share of packer
//!   step `n`, written atomically by the packer.
//! - `ROOT/delivered.bin` ([`DELIVERY_MARK`]): how far the packer has delivered, rewritten
//!   after every step; it outlives the step files ranks consume.
//!
//! A rank's receiver, [`FileRankReceiver`]: it expects its steps in order, from a first
//! step on; the driver waits for [`FileRankReceiver::path`] of the step to exist, reads it
//! and gives the bytes to [`FileRankReceiver::on_file`], which decodes and checks them and
//! answers the clean-up to do ([`Cleanup`]). The acknowledgement rule: without `consume`
//! the files stay (nothing to do); with `consume` the rank removes its file, then tries to
//! remove the step's directory, which succeeds only for the last rank to take the step (the
//! directory is empty then; for the others the removal fails and is ignored).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Control;
use crate::Error;
use crate::packer::{BatchKey, RankBatch};

/// The directory of the orchestrator's messages under the root.
pub const INBOX: &str = "inbox";
/// The directory of the packer's deliveries under the root.
pub const ROLLOUTS: &str = "rollouts";
/// The packer's [`DeliveryMark`](super::DeliveryMark) under the root.
pub const DELIVERY_MARK: &str = "delivered.bin";

/// File name of a training batch in an inbox or a spool: `run_{run}_step_{step}.bin`.
pub fn batch_file_name(key: BatchKey) -> String {
    format!("run_{}_step_{}.bin", key.run, key.step)
}

/// The batch a file name names, if it is one [`batch_file_name`] writes.
pub fn batch_of_file_name(name: &str) -> Option<BatchKey> {
    let (run, step) = name.strip_prefix("run_")?.strip_suffix(".bin")?.split_once("_step_")?;
    let key = BatchKey { run: run.parse().ok()?, step: step.parse().ok()? };
    (batch_file_name(key) == name).then_some(key)
}

/// File name of a control message in an inbox: `control_{nanos:020}_{pid}_{kind}_{run}.bin`
/// (`kind` `add_run` or `remove_run`), where the caller passes the time (`nanos`, e.g. since
/// the Unix epoch) and its process id: names sort by time and never collide between
/// processes.
pub fn control_file_name(control: &Control, nanos: u128, pid: u32) -> String {
    let (kind, run) = match control {
        Control::AddRun { run, .. } => ("add_run", run),
        Control::RemoveRun { run } => ("remove_run", run),
    };
    format!("control_{nanos:020}_{pid}_{kind}_{run}.bin")
}

/// Whether a file name is a temporary file (a write under way, or left by a crash): it
/// starts with `.`.
pub fn is_temporary(name: &str) -> bool {
    name.starts_with('.')
}

/// Whether the packer reads a file of its inbox named `name`: not temporary, ends in `.bin`.
pub fn is_inbox_message(name: &str) -> bool {
    !is_temporary(name) && name.ends_with(".bin")
}

/// Checks a name an orchestrator writes a message under: a plain file name (no `/`), not
/// temporary, ending in `.bin`. Errors: `invalid-argument` naming the name.
pub fn check_message_name(name: &str) -> Result<(), Error> {
    if is_inbox_message(name) && !name.contains('/') {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("name must be a plain file name ending in .bin (got {name:?})")))
    }
}

/// `root/inbox/name`.
pub fn inbox_path(root: &Path, name: &str) -> PathBuf {
    root.join(INBOX).join(name)
}

/// `root/rollouts/step_{step}`: the directory of one packer step.
pub fn step_dir(root: &Path, step: u64) -> PathBuf {
    root.join(ROLLOUTS).join(format!("step_{step}"))
}

/// The step of a directory of `ROOT/rollouts/` named `step_{n}` (`None` for other names).
pub fn step_of_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step_")?;
    // `step_{n}` as step_dir writes it: no sign, no leading zero.
    (digits == "0" || (!digits.starts_with('0') && digits.bytes().all(|b| b.is_ascii_digit())))
        .then(|| digits.parse().ok())
        .flatten()
}

/// `root/rollouts/step_{step}/rank_{rank}.bin`: rank `rank`'s share of step `step`.
pub fn rank_batch_path(root: &Path, step: u64, rank: u32) -> PathBuf {
    step_dir(root, step).join(format!("rank_{rank}.bin"))
}

/// Decodes the bytes of `path`, rank `rank`'s file of step `step`, and checks that they
/// hold that step and rank. Errors: those of [`RankBatch::decode`]; `invalid-argument` when
/// the file holds another step or rank.
pub fn decode_rank_file(path: &Path, bytes: &[u8], step: u64, rank: u32) -> Result<RankBatch, Error> {
    let b = RankBatch::decode(bytes)?;
    if b.step != step || b.rank != rank {
        return Err(Error::InvalidArgument(format!(
            "{} holds step {} rank {}, not step {step} rank {rank}",
            path.display(),
            b.step,
            b.rank
        )));
    }
    Ok(b)
}

/// The error of a rank that waited `waited` in vain for `path`: `timeout`, naming the file.
pub fn missing_file_error(path: &Path, waited: Duration) -> Error {
    Error::Timeout(format!("{} did not appear within {waited:?}", path.display()))
}

/// A file operation a [`FileRankReceiver`] asks its driver to do once it has a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Remove this file (already gone: nothing to do).
    RemoveFile(PathBuf),
    /// Remove this directory if it is empty (not empty or gone: nothing to do).
    RemoveDirIfEmpty(PathBuf),
}

/// A trainer rank's receiver over the filesystem transport, without I/O (see the module
/// docs).
#[derive(Clone, Debug)]
pub struct FileRankReceiver {
    root: PathBuf,
    rank: u32,
    next_step: u64,
    consume: bool,
}

impl FileRankReceiver {
    /// Rank `rank` reading under `root` from step `next_step` on; `consume`: remove each file
    /// once decoded (and the step's directory with the last rank's file).
    pub fn new(root: impl Into<PathBuf>, rank: u32, next_step: u64, consume: bool) -> Self {
        Self { root: root.into(), rank, next_step, consume }
    }

    /// The shared root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The step expected next.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// Whether files are removed once decoded.
    pub fn consume(&self) -> bool {
        self.consume
    }

    /// This rank's file of `step`.
    pub fn path(&self, step: u64) -> PathBuf {
        rank_batch_path(&self.root, step, self.rank)
    }

    /// Takes the bytes of this rank's file of `step` (usually [`FileRankReceiver::next_step`];
    /// another step makes the one after it expected next): the decoded batch and the
    /// clean-up to do, in order. Errors: those of [`decode_rank_file`] (the expected step
    /// stays the same).
    pub fn on_file(&mut self, step: u64, bytes: &[u8]) -> Result<(RankBatch, Vec<Cleanup>), Error> {
        let path = self.path(step);
        let batch = decode_rank_file(&path, bytes, step, self.rank)?;
        self.next_step = step + 1;
        let cleanup = if self.consume {
            vec![Cleanup::RemoveFile(path), Cleanup::RemoveDirIfEmpty(step_dir(&self.root, step))]
        } else {
            Vec::new()
        };
        Ok((batch, cleanup))
    }

    /// The error of a driver that waited `waited` in vain for the file of `step`.
    pub fn timeout_error(&self, step: u64, waited: Duration) -> Error {
        missing_file_error(&self.path(step), waited)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::packer::RunConfig;

    fn bytes(rank: u32, step: u64) -> Vec<u8> {
        RankBatch { step, rank, dp: 2, keys: Vec::new(), micro_batches: Vec::new(), ready_to_update: Vec::new() }
            .encode()
            .unwrap()
    }

    #[test]
    fn names() {
        assert_eq!(batch_file_name(BatchKey { run: 2, step: 17 }), "run_2_step_17.bin");
        assert_eq!(batch_of_file_name("run_2_step_17.bin"), Some(BatchKey { run: 2, step: 17 }));
        for other in ["run_+2_step_17.bin", "run_2_step_17", "run_x_step_1.bin", ".run_2_step_17.bin.tmp.1.2"] {
            assert_eq!(batch_of_file_name(other), None, "{other}");
        }
        let add = Control::AddRun { run: 3, config: RunConfig { batch_size: 8 } };
        assert_eq!(control_file_name(&add, 42, 7), "control_00000000000000000042_7_add_run_3.bin");
        assert_eq!(
            control_file_name(&Control::RemoveRun { run: 1 }, 1_700_000_000_000_000_000, 99),
            "control_01700000000000000000_99_remove_run_1.bin"
        );
        assert!(is_inbox_message("run_0_step_0.bin") && is_inbox_message("control_1_2_add_run_0.bin"));
        assert!(!is_inbox_message(".run_0_step_0.bin.tmp.12.0") && !is_inbox_message(".x.bin"));
        assert!(!is_inbox_message("notes.txt"));
        assert!(is_temporary(".run_0_step_0.bin.tmp.1.2") && !is_temporary("run_0_step_0.bin"));
        assert!(check_message_name("run_0_step_0.bin").is_ok());
        for bad in [".hidden.bin", "a/b.bin", "x.txt", ""] {
            let e = check_message_name(bad).unwrap_err().to_string();
            assert!(e.contains("name must be a plain file name ending in .bin"), "{e}");
        }
        let root = Path::new("/r");
        assert_eq!(inbox_path(root, "m.bin"), Path::new("/r/inbox/m.bin"));
        assert_eq!(rank_batch_path(root, 4, 1), Path::new("/r/rollouts/step_4/rank_1.bin"));
        assert_eq!(step_dir(root, 4), Path::new("/r/rollouts/step_4"));
    }

    #[test]
    fn a_rank_takes_its_steps_and_consumes_them() {
        let mut r = FileRankReceiver::new("/r", 1, 3, true);
        assert_eq!(r.path(r.next_step()), Path::new("/r/rollouts/step_3/rank_1.bin"));
        let (b, cleanup) = r.on_file(3, &bytes(1, 3)).unwrap();
        assert_eq!((b.step, b.rank, r.next_step()), (3, 1, 4));
        assert_eq!(
            cleanup,
            vec![
                Cleanup::RemoveFile("/r/rollouts/step_3/rank_1.bin".into()),
                Cleanup::RemoveDirIfEmpty("/r/rollouts/step_3".into())
            ]
        );
        // Another step: the one after it is expected next.
        r.on_file(9, &bytes(1, 9)).unwrap();
        assert_eq!(r.next_step(), 10);
        let mut keep = FileRankReceiver::new("/r", 0, 0, false);
        assert!(keep.on_file(0, &bytes(0, 0)).unwrap().1.is_empty(), "without consume the files stay");
    }

    #[test]
    fn a_file_of_another_step_or_rank_is_refused() {
        let mut r = FileRankReceiver::new("/r", 1, 0, true);
        let e = r.on_file(0, &bytes(0, 0)).unwrap_err().to_string();
        assert!(e.contains("/r/rollouts/step_0/rank_1.bin holds step 0 rank 0, not step 0 rank 1"), "{e}");
        let e = r.on_file(0, &bytes(1, 5)).unwrap_err().to_string();
        assert!(e.contains("holds step 5 rank 1"), "{e}");
        assert!(r.on_file(0, b"junk").unwrap_err().to_string().contains("not an encoded stowplan rank batch"));
        assert_eq!(r.next_step(), 0, "a failed read expects the same step");
        let e = r.timeout_error(0, Duration::from_millis(50)).to_string();
        assert!(e.contains("rank_1.bin did not appear within 50ms"), "{e}");
    }
}
