//! The open bins of a stream and their order by (room, age): best fit and least room.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use super::buffer::NIL;
use super::{BUCKET_CAPACITY, ClosedBins, MAX_BIN_ITEMS};
use crate::bits::BitSet;

/// The open bins: a slab of bins (room, age, members) and an order of the *indexed* ones by
/// (room, age), which answers best fit (least room ≥ a, oldest on ties) and least room. A
/// bin being filled or closed is out of the order.
#[derive(Clone, Debug)]
pub(super) struct OpenBins {
    capacity: u64,
    pub(super) bins: Vec<Bin>,
    /// Free slots of `bins` (their `members` keep their allocation for the next bin).
    free: Vec<u32>,
    /// Bins open (indexed or not).
    pub(super) count: usize,
    /// The age the next bin gets.
    next_age: u64,
    /// The open bins not being filled, by (room, age, slot): best fit is the first entry
    /// with room ≥ the item, the least room the first entry.
    order: Order,
}

/// The open bins (room, age, slot) in ascending order. While few bins may be open
/// ([`SMALL_ORDER`]) and rooms are small integers ([`BUCKET_CAPACITY`]): one list per room,
/// oldest first, and a [`BitSet`] of the rooms that have one (a lookup is a few word scans, an
/// insertion walks a list no longer than [`SMALL_ORDER`]). Otherwise a B-tree (O(log) each).
/// The same order either way.
#[derive(Clone, Debug)]
enum Order {
    Buckets {
        rooms: BitSet,
        head: Vec<u32>,
        /// The next (younger) bin of the same room, per slot.
        next: Vec<u32>,
    },
    Tree(BTreeSet<(u64, u64, u32)>),
}

/// The most open bins kept in [`Order::Buckets`].
const SMALL_ORDER: u32 = 256;

impl Order {
    fn new(capacity: u64, max_open_bins: u32) -> Self {
        if capacity <= BUCKET_CAPACITY && max_open_bins <= SMALL_ORDER {
            let n = capacity as usize + 1;
            Order::Buckets { rooms: BitSet::new(n), head: alloc::vec![NIL; n], next: Vec::new() }
        } else {
            Order::Tree(BTreeSet::new())
        }
    }

    /// Adds `(room, age, slot)`; `age_of` gives the age of any slot in the order.
    fn insert(&mut self, (room, age, slot): (u64, u64, u32), age_of: impl Fn(u32) -> u64) {
        match self {
            Order::Buckets { rooms, head, next } => {
                if next.len() <= slot as usize {
                    next.resize(slot as usize + 1, NIL);
                }
                let r = room as usize;
                let (mut prev, mut at) = (NIL, head[r]);
                while at != NIL && age_of(at) < age {
                    prev = at;
                    at = next[at as usize];
                }
                next[slot as usize] = at;
                if prev == NIL {
                    head[r] = slot;
                    rooms.insert(r);
                } else {
                    next[prev as usize] = slot;
                }
            }
            Order::Tree(t) => {
                t.insert((room, age, slot));
            }
        }
    }

    /// Removes and returns the slot of the first entry with room ≥ `a`.
    fn take_from(&mut self, a: u64) -> Option<u32> {
        match self {
            Order::Buckets { rooms, head, next } => {
                let r = rooms.next(usize::try_from(a).ok()?)?;
                let slot = head[r];
                head[r] = next[slot as usize];
                if head[r] == NIL {
                    rooms.remove(r);
                }
                Some(slot)
            }
            Order::Tree(t) => {
                let key = *t.range((a, 0, 0)..).next()?;
                t.remove(&key);
                Some(key.2)
            }
        }
    }

    /// Empties the order.
    fn clear(&mut self) {
        match self {
            Order::Buckets { .. } => while self.take_from(0).is_some() {},
            Order::Tree(t) => t.clear(),
        }
    }
}

#[derive(Clone, Debug, Default)]
pub(super) struct Bin {
    pub(super) room: u64,
    age: u64,
    open: bool,
    pub(super) members: Vec<u64>,
}

impl OpenBins {
    pub(super) fn new(capacity: u64, max_open_bins: u32) -> Self {
        let order = Order::new(capacity, max_open_bins);
        Self { capacity, bins: Vec::new(), free: Vec::new(), count: 0, next_age: 0, order }
    }

    /// Items in open bins.
    pub(super) fn held(&self) -> u64 {
        self.bins.iter().map(|b| b.members.len() as u64).sum()
    }

    /// The open bins' slots, oldest first.
    pub(super) fn by_age(&self) -> Vec<usize> {
        let mut slots: Vec<usize> = (0..self.bins.len()).filter(|&b| self.bins[b].open).collect();
        slots.sort_unstable_by_key(|&b| self.bins[b].age);
        slots
    }

    /// A new, empty bin (the youngest), not in the order.
    pub(super) fn new_bin(&mut self) -> usize {
        let bin = Bin { room: self.capacity, age: self.next_age, open: true, members: Vec::new() };
        self.next_age += 1;
        self.count += 1;
        match self.free.pop() {
            Some(b) => {
                let members = core::mem::take(&mut self.bins[b as usize].members);
                self.bins[b as usize] = Bin { members, ..bin };
                b as usize
            }
            None => {
                self.bins.push(bin);
                self.bins.len() - 1
            }
        }
    }

    pub(super) fn put(&mut self, b: usize, a: u64, index: u64) {
        self.bins[b].room -= a;
        self.bins[b].members.push(index);
    }

    /// Whether bin `b` must close: no room left, or [`MAX_BIN_ITEMS`] members.
    pub(super) fn full(&self, b: usize) -> bool {
        self.bins[b].room == 0 || self.bins[b].members.len() >= MAX_BIN_ITEMS
    }

    /// Closes bin `b` (not in the order) into `out`.
    pub(super) fn close(&mut self, b: usize, out: &mut ClosedBins) {
        let bin = &mut self.bins[b];
        bin.open = false;
        out.push(&mut bin.members, self.capacity - bin.room);
        self.count -= 1;
        self.free.push(b as u32);
    }

    /// Puts bin `b` into the order.
    pub(super) fn index(&mut self, b: usize) {
        let bins = &self.bins;
        self.order.insert((bins[b].room, bins[b].age, b as u32), |slot| bins[slot as usize].age);
    }

    /// Takes the bin with the least room ≥ `a` (the oldest on ties) out of the order.
    pub(super) fn take_best(&mut self, a: u64) -> Option<usize> {
        self.order.take_from(a).map(|b| b as usize)
    }

    /// Takes the bin with the least room (the oldest on ties) out of the order, if any.
    pub(super) fn take_least(&mut self) -> Option<usize> {
        self.take_best(0)
    }

    /// Closes every open bin, oldest first, into `out`.
    pub(super) fn close_all(&mut self, out: &mut ClosedBins) {
        self.order.clear();
        for b in self.by_age() {
            self.close(b, out);
        }
    }
}
