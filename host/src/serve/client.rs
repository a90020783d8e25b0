//! The Rust client of a trainer rank over the filesystem transport: [`FileRankClient`] waits
//! for its file of each step, decodes it and consumes it if asked, around a
//! [`FileRankReceiver`] (the protocol core, [`protocol`](super::protocol)). The ZeroMQ
//! clients, `ZmqRankClient` and `ZmqBatchSender`, are in the `stowplan-zmq` crate.
//!
//! Every wait takes a [`Duration`]; a wait too long to represent (e.g. [`Duration::MAX`])
//! waits forever. Errors name what is missing: the file and the step.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::protocol::files::{Cleanup, FileRankReceiver};
use crate::Error;
use crate::packer::RankBatch;

/// Options of a [`FileRankClient`].
#[derive(Clone, Debug)]
pub struct FileRankOptions {
    /// The first step to read (default 0).
    pub start_step: u64,
    /// Remove each file once decoded, and the step's directory with the last rank's file
    /// (default `false`).
    pub consume: bool,
    /// How often to look for a file that is not there yet (default 5 ms; not zero).
    pub poll: Duration,
}

impl Default for FileRankOptions {
    /// From step 0, files kept, polling every 5 ms.
    fn default() -> Self {
        Self { start_step: 0, consume: false, poll: Duration::from_millis(5) }
    }
}

/// A trainer rank over the filesystem transport: reads `ROOT/rollouts/step_{n}/rank_{r}.bin`
/// for step `start_step`, then the next, … (see [`super::protocol::files`]).
#[derive(Debug)]
pub struct FileRankClient {
    core: FileRankReceiver,
    poll: Duration,
}

impl FileRankClient {
    /// Rank `rank` reading under `root`. Errors: `invalid-argument` for a zero `poll`.
    pub fn new(root: impl Into<PathBuf>, rank: u32, options: FileRankOptions) -> Result<Self, Error> {
        if options.poll.is_zero() {
            return Err(Error::InvalidArgument("poll must be a duration > 0 (got 0)".into()));
        }
        Ok(Self { core: FileRankReceiver::new(root, rank, options.start_step, options.consume), poll: options.poll })
    }

    /// The step [`FileRankClient::receive`] returns next.
    pub fn next_step(&self) -> u64 {
        self.core.next_step()
    }

    /// This rank's file of `step`.
    pub fn path(&self, step: u64) -> PathBuf {
        self.core.path(step)
    }

    /// Waits up to `timeout` for the next step and returns it. Errors: `timeout` naming the
    /// file; those of [`super::protocol::files::decode_rank_file`]; `io`.
    pub fn receive(&mut self, timeout: Duration) -> Result<RankBatch, Error> {
        self.receive_step(self.core.next_step(), timeout)
    }

    /// Waits up to `timeout` for step `step` and returns it; the step after it is expected
    /// next. Errors as [`FileRankClient::receive`].
    pub fn receive_step(&mut self, step: u64, timeout: Duration) -> Result<RankBatch, Error> {
        let path = self.core.path(step);
        let bytes = super::wait_for_file(&path, timeout, self.poll)?;
        let (batch, cleanup) = self.core.on_file(step, &bytes)?;
        // The step is taken: a clean-up that fails (a read-only mount, a directory of another
        // user) must not lose it, so it is logged, not returned.
        for c in &cleanup {
            if let Err(e) = clean(c) {
                tracing::warn!(target: "stowplan::serve", "could not clean up after step {step}: {e}");
            }
        }
        Ok(batch)
    }
}

/// Does one clean-up of a [`FileRankReceiver`]: a file already gone or a directory not
/// empty (another rank has not taken the step yet) is fine.
pub fn clean(c: &Cleanup) -> Result<(), Error> {
    match c {
        Cleanup::RemoveFile(p) => match std::fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("removing", p, e)),
            _ => Ok(()),
        },
        Cleanup::RemoveDirIfEmpty(p) => {
            let _ = std::fs::remove_dir(Path::new(p));
            Ok(())
        }
    }
}
