//! The buffered (not yet placed) items of a stream, by aligned length.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;
use core::cmp::Reverse;

use super::BUCKET_CAPACITY;
use crate::bits::BitSet;

/// The buffered items, by aligned length: the largest fitting a room comes out first,
/// the smallest index among equal lengths.
#[derive(Clone, Debug)]
pub(super) enum Buffer {
    /// One FIFO list per aligned length (indices arrive ascending, so each list is in index
    /// order), in a slab of slots, with a [`BitSet`] of the non-empty lengths.
    Buckets { lengths: BitSet, head: Vec<u32>, tail: Vec<u32>, slots: Vec<Slot>, free: u32, len: usize },
    /// (aligned length, Reverse(index)) for capacities above [`BUCKET_CAPACITY`].
    Ordered(BTreeSet<(u64, Reverse<u64>)>),
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    index: u64,
    next: u32,
}

pub(super) const NIL: u32 = u32::MAX;

impl Buffer {
    pub(super) fn new(capacity: u64) -> Self {
        if capacity <= BUCKET_CAPACITY {
            let n = capacity as usize + 1;
            Buffer::Buckets {
                lengths: BitSet::new(n),
                head: alloc::vec![NIL; n],
                tail: alloc::vec![NIL; n],
                slots: Vec::new(),
                free: NIL,
                len: 0,
            }
        } else {
            Buffer::Ordered(BTreeSet::new())
        }
    }

    pub(super) fn len(&self) -> usize {
        match self {
            Buffer::Buckets { len, .. } => *len,
            Buffer::Ordered(set) => set.len(),
        }
    }

    /// Adds an item; `index` is above every buffered index of the same length.
    pub(super) fn push(&mut self, a: u64, index: u64) {
        match self {
            Buffer::Buckets { lengths, head, tail, slots, free, len } => {
                let s = if *free != NIL {
                    let s = *free;
                    *free = slots[s as usize].next;
                    slots[s as usize] = Slot { index, next: NIL };
                    s
                } else {
                    slots.push(Slot { index, next: NIL });
                    (slots.len() - 1) as u32
                };
                let r = a as usize;
                if tail[r] == NIL {
                    head[r] = s;
                    lengths.insert(r);
                } else {
                    slots[tail[r] as usize].next = s;
                }
                tail[r] = s;
                *len += 1;
            }
            Buffer::Ordered(set) => {
                set.insert((a, Reverse(index)));
            }
        }
    }

    /// Removes and returns the item with the largest aligned length ≤ `room` (smallest index
    /// on ties).
    pub(super) fn pop_at_most(&mut self, room: u64) -> Option<(u64, u64)> {
        match self {
            Buffer::Buckets { lengths, head, tail, slots, free, len } => {
                let r = lengths.prev(usize::try_from(room).unwrap_or(usize::MAX))?;
                let s = head[r];
                let Slot { index, next } = slots[s as usize];
                head[r] = next;
                if next == NIL {
                    tail[r] = NIL;
                    lengths.remove(r);
                }
                slots[s as usize].next = *free;
                *free = s;
                *len -= 1;
                Some((r as u64, index))
            }
            Buffer::Ordered(set) => {
                let found = set.range(..=(room, Reverse(0))).next_back().copied()?;
                set.remove(&found);
                Some((found.0, found.1.0))
            }
        }
    }

    /// Every buffered item as (aligned length, index), in no particular order.
    pub(super) fn items(&self) -> Vec<(u64, u64)> {
        match self {
            Buffer::Buckets { lengths, head, slots, .. } => {
                let mut out = Vec::new();
                let mut r = lengths.next(0);
                while let Some(len) = r {
                    let mut s = head[len];
                    while s != NIL {
                        out.push((len as u64, slots[s as usize].index));
                        s = slots[s as usize].next;
                    }
                    r = lengths.next(len + 1);
                }
                out
            }
            Buffer::Ordered(set) => set.iter().map(|&(a, Reverse(i))| (a, i)).collect(),
        }
    }

    /// The smallest buffered index.
    pub(super) fn oldest(&self) -> Option<u64> {
        self.items().into_iter().map(|(_, i)| i).min()
    }
}
