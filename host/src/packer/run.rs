//! A run (LoRA adapter): its configuration, its progress, and its buffer of pending samples.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::{LossNormalization, SampleKey, update};
use crate::materialize::{LossCounts, RejectReason};

/// A run's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Samples of one of the run's optimizer steps (≥ 1).
    pub batch_size: u64,
}

/// A run's progress and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunProgress {
    /// The run's step: how many times `batch_size` of its samples were consumed.
    pub step: u64,
    /// Samples consumed since the last step advance (below `batch_size`).
    pub samples_this_step: u64,
    /// Set when the step advances; cleared by [`Packer::clear_ready`](super::Packer::clear_ready).
    pub ready_to_update: bool,
    /// Samples consumed (delivered in a packer step) in all.
    pub total_samples: u64,
    /// Tokens consumed in all.
    pub total_tokens: u64,
    /// Samples accepted into the buffer in all.
    pub received_samples: u64,
    /// Samples rejected, by reason.
    pub rejected: BTreeMap<RejectReason, u64>,
    /// Batches ignored because their `(run, step)` was already received.
    pub duplicate_batches: u64,
}

#[derive(Debug)]
pub(super) struct RunState {
    pub(super) config: RunConfig,
    pub(super) progress: RunProgress,
    pub(super) queue: VecDeque<SampleKey>,
    pub(super) queue_tokens: u64,
    /// The queued samples' costs (the cost model's plus their extra costs): all runs' together
    /// stay within `u64`, so no step's cost sums overflow.
    pub(super) queue_cost: u64,
    /// See [`RunRecord::update`](super::checkpoint::RunRecord::update).
    pub(super) update: Option<LossCounts>,
}

impl RunState {
    /// How many of the pending samples may be packed now (see [`update::packable`]).
    pub(super) fn packable(&self, rule: LossNormalization) -> usize {
        update::packable(rule, self.config.batch_size, self.progress.samples_this_step, self.queue.len())
    }
}
