//! The batches a packer has received, by `(run, step)`: [`SeenBatches`].
//!
//! Every received key is remembered, so that a batch sent again after any delay is recognised
//! as a duplicate. Kept as ranges of steps per run ([`rangemap`]), so an orchestrator that
//! sends its steps in order costs one range per run however long it runs (10,000 keys were
//! 67 KB of `state.bin`, rewritten at every checkpoint); steps sent out of order cost one
//! range per gap until the gaps fill.

use std::collections::BTreeMap;

use rangemap::RangeInclusiveSet;
use serde::{Deserialize, Serialize};

use super::BatchKey;

/// The `(run, step)` keys received (see the module docs). Saved as `(run, first step, last
/// step)` triples; a saved range whose first step is after its last is refused on load.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<(u32, u64, u64)>", into = "Vec<(u32, u64, u64)>")]
pub struct SeenBatches {
    runs: BTreeMap<u32, RangeInclusiveSet<u64>>,
}

impl From<SeenBatches> for Vec<(u32, u64, u64)> {
    fn from(seen: SeenBatches) -> Self {
        let runs = seen.runs.iter();
        runs.flat_map(|(&run, steps)| steps.iter().map(move |r| (run, *r.start(), *r.end()))).collect()
    }
}

impl TryFrom<Vec<(u32, u64, u64)>> for SeenBatches {
    type Error = String;

    fn try_from(ranges: Vec<(u32, u64, u64)>) -> Result<Self, String> {
        let mut seen = Self::default();
        for (run, first, last) in ranges {
            if first > last {
                return Err(format!("seen batches: run {run}'s range {first}..={last} is reversed"));
            }
            seen.runs.entry(run).or_default().insert(first..=last);
        }
        Ok(seen)
    }
}

impl SeenBatches {
    /// Whether `key` was received.
    pub fn contains(&self, key: BatchKey) -> bool {
        self.runs.get(&key.run).is_some_and(|steps| steps.contains(&key.step))
    }

    /// Records `key`; `false` when it was there already.
    pub fn insert(&mut self, key: BatchKey) -> bool {
        let steps = self.runs.entry(key.run).or_default();
        if steps.contains(&key.step) {
            return false;
        }
        steps.insert(key.step..=key.step);
        true
    }

    /// Ranges kept, all runs together (what the checkpoint's size grows with).
    pub fn ranges(&self) -> usize {
        self.runs.values().map(|s| s.iter().count()).sum()
    }

    /// Keys recorded, all runs together.
    pub fn len(&self) -> u128 {
        let span = |r: &std::ops::RangeInclusive<u64>| u128::from(r.end() - r.start()) + 1;
        self.runs.values().flat_map(|s| s.iter()).map(span).sum()
    }

    /// Whether no key was recorded.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    fn key(run: u32, step: u64) -> BatchKey {
        BatchKey { run, step }
    }

    #[test]
    fn in_order_steps_are_one_range_per_run() {
        let mut s = SeenBatches::default();
        for step in 0..10_000 {
            assert!(s.insert(key(0, step)));
            assert!(s.insert(key(3, step)));
        }
        assert!(!s.insert(key(0, 17)), "a duplicate");
        assert_eq!((s.ranges(), s.len()), (2, 20_000));
        assert!(s.contains(key(3, 9_999)) && !s.contains(key(3, 10_000)) && !s.contains(key(1, 0)));
        assert!(s.insert(key(0, u64::MAX)) && s.contains(key(0, u64::MAX)), "the last step fits");
    }

    proptest! {
        #[test]
        fn it_is_the_set_of_keys_inserted(keys in proptest::collection::vec((0u32..3, 0u64..64), 0..200)) {
            let mut s = SeenBatches::default();
            let mut model = std::collections::BTreeSet::new();
            for &(run, step) in &keys {
                prop_assert_eq!(s.insert(key(run, step)), model.insert((run, step)));
            }
            for run in 0..3 {
                for step in 0..65 {
                    prop_assert_eq!(s.contains(key(run, step)), model.contains(&(run, step)));
                }
            }
            prop_assert_eq!(s.len(), model.len() as u128);
            // Round trip through the checkpoint's encoding.
            let bytes = postcard::to_allocvec(&s).unwrap();
            prop_assert_eq!(postcard::from_bytes::<SeenBatches>(&bytes).unwrap(), s);
        }
    }

    #[test]
    fn a_reversed_saved_range_is_refused_not_a_panic() {
        let bytes = postcard::to_allocvec(&vec![(0u32, 9u64, 3u64)]).unwrap();
        assert!(postcard::from_bytes::<SeenBatches>(&bytes).is_err());
    }
}
