//! A set of integers `0..n` with ordered neighbour queries: a tree of 64-bit words (each bit
//! of a level marks a non-zero word of the level below), so [`BitSet::next`] and
//! [`BitSet::prev`] look at one word per level — three levels cover 2^18 values, four 2^24.
//! Used by best fit's rooms (`rooms`) and the streaming packer's buffer (`stream`).

use alloc::vec::Vec;

/// Integers `0..n`, each present or not.
#[derive(Clone, Debug)]
pub(crate) struct BitSet {
    /// `levels[0]` holds one bit per value; `levels[l + 1]` one bit per word of `levels[l]`
    /// (set when that word is non-zero). The last level is one word.
    levels: Vec<Vec<u64>>,
}

impl BitSet {
    /// An empty set of the values `0..n` (`n` ≥ 1).
    pub(crate) fn new(n: usize) -> Self {
        let mut levels = Vec::new();
        let mut words = n.max(1).div_ceil(64);
        loop {
            levels.push(alloc::vec![0u64; words]);
            if words == 1 {
                break;
            }
            words = words.div_ceil(64);
        }
        Self { levels }
    }

    /// The set of every value `0..n` (`n` ≥ 1).
    pub(crate) fn full(n: usize) -> Self {
        let mut set = Self::new(n);
        let mut len = n.max(1);
        for words in &mut set.levels {
            words.iter_mut().for_each(|w| *w = u64::MAX);
            if len % 64 != 0 {
                let last = words.len() - 1;
                words[last] = (1u64 << (len % 64)) - 1;
            }
            len = len.div_ceil(64);
        }
        set
    }

    /// Whether `i` (`i < n`) is in the set.
    pub(crate) fn contains(&self, i: usize) -> bool {
        self.levels[0][i / 64] >> (i % 64) & 1 != 0
    }

    /// Adds `i` (`i < n`).
    pub(crate) fn insert(&mut self, mut i: usize) {
        for words in &mut self.levels {
            let was = words[i / 64];
            words[i / 64] = was | 1 << (i % 64);
            if was != 0 {
                return;
            }
            i /= 64;
        }
    }

    /// Removes `i` (`i < n`).
    pub(crate) fn remove(&mut self, mut i: usize) {
        for words in &mut self.levels {
            words[i / 64] &= !(1 << (i % 64));
            if words[i / 64] != 0 {
                return;
            }
            i /= 64;
        }
    }

    /// The smallest value in the set that is ≥ `from`.
    pub(crate) fn next(&self, from: usize) -> Option<usize> {
        let mut i = from;
        let mut level = 0;
        loop {
            let words = &self.levels[level];
            let w = i / 64;
            let bits = words.get(w)? & (u64::MAX << (i % 64));
            if bits != 0 {
                i = w * 64 + bits.trailing_zeros() as usize;
                break;
            }
            level += 1;
            if level == self.levels.len() {
                return None;
            }
            i = w + 1;
        }
        while level > 0 {
            level -= 1;
            i = i * 64 + self.levels[level][i].trailing_zeros() as usize;
        }
        Some(i)
    }

    /// The largest value in the set that is ≤ `to` (any `to`, also ≥ n).
    pub(crate) fn prev(&self, to: usize) -> Option<usize> {
        let mut i = to;
        let mut level = 0;
        loop {
            let words = &self.levels[level];
            let (w, mask) =
                if i / 64 >= words.len() { (words.len() - 1, u64::MAX) } else { (i / 64, u64::MAX >> (63 - i % 64)) };
            let bits = words[w] & mask;
            if bits != 0 {
                i = w * 64 + 63 - bits.leading_zeros() as usize;
                break;
            }
            level += 1;
            if w == 0 || level == self.levels.len() {
                return None;
            }
            i = w - 1;
        }
        while level > 0 {
            level -= 1;
            i = i * 64 + 63 - self.levels[level][i].leading_zeros() as usize;
        }
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::collections::BTreeSet;
    use proptest::prelude::*;

    proptest! {
        /// `next` and `prev` agree with an ordered set after any inserts and removes.
        #[test]
        fn neighbours_match_an_ordered_set(
            n in 1usize..300_000,
            ops in proptest::collection::vec((any::<bool>(), any::<u32>()), 0..400),
            probes in proptest::collection::vec(any::<u32>(), 0..60),
        ) {
            let mut bits = BitSet::new(n);
            let mut set = BTreeSet::new();
            for (add, v) in ops {
                let v = v as usize % n;
                if add { bits.insert(v); set.insert(v); } else { bits.remove(v); set.remove(&v); }
            }
            for p in probes {
                let p = p as usize % (n + 70);
                prop_assert_eq!(bits.next(p), set.range(p..).next().copied());
                prop_assert_eq!(bits.prev(p), set.range(..=p).next_back().copied());
            }
        }
    }
}
