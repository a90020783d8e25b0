//! Open bins indexed by their remaining room, for best fit: [`Rooms`] finds the bin with the
//! least room that fits an item, and [`SameRoom`] says which bin goes first among bins with
//! the same room — the oldest (the kernel's `bfd`, `multi-pack`) or the one that reached the
//! room first (TRL's best fit, in `trl.rs`).

use alloc::collections::{BTreeSet, BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;

use crate::bits::BitSet;

/// The order in which open bins with the same room are taken.
pub(crate) trait SameRoom: Default {
    /// Whether the order is the order of [`SameRoom::push`] (else: the oldest bin first).
    const QUEUED: bool;
    /// Adds bin `b`.
    fn push(&mut self, b: u32);
    /// Removes and returns the next bin.
    fn pop(&mut self) -> Option<u32>;
    /// Whether no bin is left.
    fn is_empty(&self) -> bool;
    /// Removes every bin.
    fn clear(&mut self);
}

/// The oldest bin (lowest number) first: the kernel's best fit.
impl SameRoom for BinaryHeap<Reverse<u32>> {
    const QUEUED: bool = false;
    fn push(&mut self, b: u32) {
        BinaryHeap::push(self, Reverse(b));
    }
    fn pop(&mut self) -> Option<u32> {
        BinaryHeap::pop(self).map(|Reverse(b)| b)
    }
    fn is_empty(&self) -> bool {
        BinaryHeap::is_empty(self)
    }
    fn clear(&mut self) {
        BinaryHeap::clear(self)
    }
}

/// The bin that came to have the room first: TRL's best fit (in `trl.rs`).
impl SameRoom for VecDeque<u32> {
    const QUEUED: bool = true;
    fn push(&mut self, b: u32) {
        self.push_back(b);
    }
    fn pop(&mut self) -> Option<u32> {
        self.pop_front()
    }
    fn is_empty(&self) -> bool {
        VecDeque::is_empty(self)
    }
    fn clear(&mut self) {
        VecDeque::clear(self)
    }
}

/// Open bins by remaining room, the oldest bin first among equal rooms.
pub(crate) type RoomIndex = Rooms<BinaryHeap<Reverse<u32>>>;

/// Open bins by remaining room, bins with the same room taken in `Q`'s order. Rooms up to
/// 2^20 (and not far above the item count) use one bucket per room value with a two-level
/// bitmap of non-empty buckets; larger capacities use an ordered set of (room, order key,
/// bin), the key being the bin (oldest first) or the insertion count (queued order).
pub(crate) enum Rooms<Q> {
    Buckets { buckets: Vec<Q>, rooms: BitSet },
    Ordered { set: BTreeSet<(u64, u64, u32)>, inserted: u64 },
}

impl<Q: SameRoom> Rooms<Q> {
    pub(crate) fn new(capacity: u64, n: usize) -> Self {
        if capacity <= 1 << 20 && capacity <= 64 * n as u64 + 4096 {
            let slots = capacity as usize + 1;
            Rooms::Buckets { buckets: (0..slots).map(|_| Q::default()).collect(), rooms: BitSet::new(slots) }
        } else {
            Rooms::Ordered { set: BTreeSet::new(), inserted: 0 }
        }
    }

    /// Records bin `b` with `room` left (full bins too: a zero-length item fits there).
    pub(crate) fn insert(&mut self, room: u64, b: u32) {
        match self {
            Rooms::Buckets { buckets, rooms } => {
                buckets[room as usize].push(b);
                rooms.insert(room as usize);
            }
            Rooms::Ordered { set, inserted } => {
                let key = if Q::QUEUED { *inserted } else { u64::from(b) };
                *inserted += 1;
                set.insert((room, key, b));
            }
        }
    }

    /// Removes and returns the (room, bin) with the least room ≥ `a`, ties in `Q`'s order.
    pub(crate) fn take_best(&mut self, a: u64) -> Option<(u64, u32)> {
        match self {
            Rooms::Buckets { buckets, rooms } => {
                let r = rooms.next(a as usize)?;
                let b = buckets[r].pop()?;
                if buckets[r].is_empty() {
                    rooms.remove(r);
                }
                Some((r as u64, b))
            }
            Rooms::Ordered { set, .. } => {
                let found = set.range((a, 0, 0)..).next().copied()?;
                set.remove(&found);
                Some((found.0, found.2))
            }
        }
    }

    /// Removes every bin (the buckets keep their memory).
    pub(crate) fn clear(&mut self) {
        match self {
            Rooms::Buckets { buckets, rooms } => {
                while let Some(r) = rooms.next(0) {
                    buckets[r].clear();
                    rooms.remove(r);
                }
            }
            Rooms::Ordered { set, inserted } => {
                set.clear();
                *inserted = 0;
            }
        }
    }
}
