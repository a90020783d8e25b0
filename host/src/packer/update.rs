//! Loss normalization per optimizer update.
//!
//! A run's optimizer update is `batch_size` of its samples ([`RunConfig`](super::RunConfig)),
//! in the order they were accepted. Under [`LossNormalization::Update`] every sample's loss
//! weights count over its whole update (`T`, `N` and the longest completion of
//! [`LossAggMode`](crate::materialize::LossAggMode)), however many packer steps the update spans, so the
//! weighted sum over every rank, micro-batch and packer step of an update is the update's
//! unpacked loss. Those counts are known only once every sample of the update has arrived, so
//! under this rule a run's samples are packed only in whole updates' worth of arrivals: the
//! rest of the current update must be pending before any of it is packed. The counts of the
//! update under way are part of the checkpointed state, and the step in flight keeps each
//! sample's, so a restored packer rebuilds the step byte for byte.

use serde::{Deserialize, Serialize};

use crate::Error;

/// Over which samples a packer step's loss weights are normalized.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LossNormalization {
    /// Over the run's samples in the packer step (the default): each packer step's weights
    /// sum to that step's loss, and a run whose update spans several packer steps gets the sum
    /// of their losses. Samples are packed as soon as they arrive.
    #[default]
    Step,
    /// Over the run's optimizer update (`batch_size` samples): the weights of all the packer
    /// steps of an update sum to the update's loss. A run's samples are packed once the rest of
    /// their update has arrived.
    Update,
}

impl stowplan_kernel::Named for LossNormalization {
    const WHAT: &'static str = "loss_normalization";
    const ALL: &'static [Self] = &[LossNormalization::Step, LossNormalization::Update];
    fn as_str(self) -> &'static str {
        match self {
            LossNormalization::Step => "step",
            LossNormalization::Update => "update",
        }
    }
}

impl std::str::FromStr for LossNormalization {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(<Self as stowplan_kernel::Named>::parse_name(s)?)
    }
}

impl std::fmt::Display for LossNormalization {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(stowplan_kernel::Named::as_str(*self))
    }
}

/// How many of a run's `queued` pending samples may be packed now: all of them under
/// [`LossNormalization::Step`]; under [`LossNormalization::Update`], those of the updates
/// whose samples have all arrived (`done` samples of the current update were consumed).
pub(super) fn packable(rule: LossNormalization, batch_size: u64, done: u64, queued: usize) -> usize {
    match rule {
        LossNormalization::Step => queued,
        LossNormalization::Update => {
            let queued = queued as u64;
            let rest = batch_size.saturating_sub(done);
            if queued < rest {
                return 0;
            }
            let whole = (queued - rest) / batch_size * batch_size;
            // At most `queued`, which is a usize.
            usize::try_from(rest + whole).unwrap_or(usize::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_updates_are_packable() {
        use LossNormalization::{Step, Update};
        assert_eq!(packable(Step, 4, 0, 3), 3);
        assert_eq!(packable(Update, 4, 0, 3), 0);
        assert_eq!(packable(Update, 4, 0, 4), 4);
        assert_eq!(packable(Update, 4, 0, 7), 4);
        assert_eq!(packable(Update, 4, 0, 8), 8);
        // One sample of the update was consumed: 3 more complete it.
        assert_eq!(packable(Update, 4, 1, 2), 0);
        assert_eq!(packable(Update, 4, 1, 3), 3);
        assert_eq!(packable(Update, 4, 1, 10), 7);
        assert_eq!(packable(Update, 1, 0, 5), 5);
    }
}
