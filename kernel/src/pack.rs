//! Bin packing: put lengths into bins of `capacity` tokens.
//!
//! Each length is first rounded up to a multiple of `align` (its *aligned length*); bins hold
//! aligned lengths. Methods:
//! - [`PackMethod::Bfd`] best-fit decreasing: items by (aligned length desc, index asc); each
//!   goes to the open bin with the least room that still fits it, ties to the oldest bin;
//!   O(n log n) with an ordered set over (room, bin).
//! - [`PackMethod::Ffd`] first-fit decreasing: same order; each goes to the oldest bin that
//!   fits it; O(n log n) with a max segment tree over the bins' room.
//! - [`PackMethod::NextFit`] order preserving: items in input order; an item that does not
//!   fit closes the current bin and opens a new one.
//!
//! Items whose aligned length exceeds `capacity` follow the [`OversizePolicy`]. Bins are
//! reported in creation order; members of a bin ascending by input index.

use alloc::borrow::Cow;
use alloc::collections::{BTreeSet, BinaryHeap};
use alloc::vec::Vec;
use core::cmp::Reverse;

use crate::bits::BitSet;
use crate::{Error, checked_len, invalid, key_weight, sorted_desc, sorted_desc_keys};

/// The packing algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PackMethod {
    /// Best-fit decreasing (the default).
    #[default]
    Bfd,
    /// First-fit decreasing.
    Ffd,
    /// Next-fit in input order (keeps the input order inside and across bins).
    NextFit,
}

/// What to do with an item whose aligned length exceeds the capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OversizePolicy {
    /// Fail with `infeasible`, naming the first such item (the default).
    #[default]
    Error,
    /// Put the item alone in its own bin (that bin's load exceeds the capacity).
    Single,
    /// Leave the item out and report it in `dropped`.
    Drop,
}

/// Options of [`pack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackOptions {
    /// Tokens per bin, at least 1.
    pub capacity: u64,
    /// Every length is rounded up to a multiple of `align` (at least 1) before packing.
    pub align: u64,
    /// The algorithm.
    pub method: PackMethod,
    /// The oversize policy.
    pub oversize: OversizePolicy,
}

impl PackOptions {
    /// Options with the given capacity and the defaults: `align` 1, BFD, oversize `error`.
    pub fn new(capacity: u64) -> Self {
        Self { capacity, align: 1, method: PackMethod::Bfd, oversize: OversizePolicy::Error }
    }
}

/// The result of [`pack`], in flat form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packing {
    /// `bins + 1` offsets into `indices`: bin `b` is `indices[offsets[b]..offsets[b + 1]]`.
    pub offsets: Vec<u32>,
    /// The indices of the packed items, bin by bin, ascending inside a bin.
    pub indices: Vec<u32>,
    /// The aligned load of each bin (sum of aligned lengths).
    pub loads: Vec<u64>,
    /// Indices of items left out under the `drop` policy, ascending.
    pub dropped: Vec<u32>,
    /// Indices of oversized items placed alone under the `single` policy, ascending.
    pub single: Vec<u32>,
    /// Sum of the real (unaligned) lengths of the packed items.
    pub real_tokens: u64,
    /// Sum of the aligned lengths of the packed items (real tokens + alignment padding).
    pub aligned_tokens: u64,
    /// `ceil(Σ aligned lengths of the items that fit / capacity)`: no packing of those items
    /// uses fewer bins. Bins of oversized items (`single`) come on top.
    pub lower_bound: u64,
}

impl Packing {
    /// The number of bins.
    pub fn bins(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The members of bin `b` (input indices).
    pub fn bin(&self, b: usize) -> &[u32] {
        &self.indices[self.offsets[b] as usize..self.offsets[b + 1] as usize]
    }

    /// Alignment padding: aligned tokens minus real tokens.
    pub fn padding_tokens(&self) -> u64 {
        self.aligned_tokens - self.real_tokens
    }

    /// Fill of the regular bins (all but the `single` ones): their real tokens over
    /// `bins × capacity`, in 0..=1; 0 when there is no regular bin. `lengths` and `capacity`
    /// are the ones the packing was made from. (A figure for reports, not a decision.)
    pub fn efficiency(&self, lengths: &[u64], capacity: u64) -> f64 {
        let regular = self.bins() - self.single.len();
        if regular == 0 || capacity == 0 {
            return 0.0;
        }
        let single_real: u64 = self.single.iter().map(|&i| lengths[i as usize]).sum();
        (self.real_tokens - single_real) as f64 / (regular as f64 * capacity as f64)
    }
}

/// Packs `lengths` into bins of `options.capacity` tokens.
///
/// Errors: `invalid-argument` for empty `lengths`, `capacity == 0`, `align == 0`, an aligned
/// length or a sum overflowing `u64`; `infeasible` for an oversized item under the `error`
/// policy (the message names the first such index, its length and the capacity).
pub fn pack(lengths: &[u64], options: &PackOptions) -> Result<Packing, Error> {
    let PackOptions { capacity, align, method, oversize } = *options;
    if method == PackMethod::NextFit {
        return Ok(next_fit_runs(lengths, options)?.into_packing(lengths.len()));
    }
    let checked = check(lengths, capacity, align, oversize, |_, _| {})?;
    let Checked { total, fit_total, real_all, dropped, single } = checked;
    let lower_bound = fit_total.div_ceil(capacity);
    // With align 1 the aligned lengths are the lengths: borrow them. (`check` made sure no
    // aligned length overflows.)
    let aligned: Cow<'_, [u64]> = if align == 1 {
        Cow::Borrowed(lengths)
    } else {
        Cow::Owned(lengths.iter().map(|&len| len.div_ceil(align) * align).collect())
    };
    let aligned: &[u64] = &aligned;
    // BFD or FFD, over (index, aligned length) in (length desc, index asc) order — from
    // packed keys read in sequence when the lengths allow (see `sorted_desc_keys`). The fit
    // writes each item's bin in that order (a sequential write), and the assembly groups
    // the items by bin and sorts each bin's few members.
    let fitting = aligned.len() - dropped.len() - single.len();
    let mut assign: Vec<u32> = Vec::with_capacity(aligned.len());
    let (offsets, indices, loads) = match sorted_desc_keys(aligned) {
        Some(keys) => {
            let max = aligned.iter().copied().max().unwrap_or(0);
            let items = keys.iter().map(|&k| (k as u32, key_weight(k, max)));
            let bins = any_fit(items.clone(), capacity, oversize, method, lower_bound, fitting, &mut assign);
            assemble(items, &assign, bins)
        }
        None => {
            let order = sorted_desc(aligned);
            let items = order.iter().map(|&i| (i, aligned[i as usize]));
            let bins = any_fit(items.clone(), capacity, oversize, method, lower_bound, fitting, &mut assign);
            assemble(items, &assign, bins)
        }
    };
    let real_tokens = real_all - dropped.iter().map(|&i| lengths[i as usize]).sum::<u64>();
    let aligned_tokens = total - dropped.iter().map(|&i| aligned[i as usize]).sum::<u64>();
    Ok(Packing { offsets, indices, loads, dropped, single, real_tokens, aligned_tokens, lower_bound })
}

/// The bins' offsets, members (ascending) and loads from `items` in fit order and the bin
/// each went to (`assign`, in the same order; [`NONE`] for a dropped item): a counting sort
/// by bin, then each bin's members sorted.
fn assemble(items: impl Iterator<Item = (u32, u64)>, assign: &[u32], bins: usize) -> (Vec<u32>, Vec<u32>, Vec<u64>) {
    let mut offsets = alloc::vec![0u32; bins + 1];
    for &b in assign {
        if b != NONE {
            offsets[b as usize + 1] += 1;
        }
    }
    for b in 0..bins {
        offsets[b + 1] += offsets[b];
    }
    let mut fill: Vec<u32> = offsets[..bins].to_vec();
    let mut indices = alloc::vec![0u32; offsets[bins] as usize];
    let mut loads = alloc::vec![0u64; bins];
    for ((i, a), &b) in items.zip(assign) {
        if b != NONE {
            let at = &mut fill[b as usize];
            indices[*at as usize] = i;
            *at += 1;
            loads[b as usize] += a;
        }
    }
    for b in 0..bins {
        indices[offsets[b] as usize..offsets[b + 1] as usize].sort_unstable();
    }
    (offsets, indices, loads)
}

/// "No bin": a dropped item's entry in the fit's bin list.
const NONE: u32 = u32::MAX;

/// `len` rounded up to a multiple of `align` (no division for the usual `align` 1); the
/// caller knows it does not overflow.
#[inline]
fn aligned(len: u64, align: u64) -> u64 {
    if align == 1 { len } else { len.div_ceil(align) * align }
}

/// The totals and oversize lists of a packing's input, after every check of [`pack`].
struct Checked {
    /// Σ aligned lengths.
    total: u64,
    /// Σ aligned lengths of the items within the capacity.
    fit_total: u64,
    /// Σ real lengths (≤ `total`).
    real_all: u64,
    dropped: Vec<u32>,
    single: Vec<u32>,
}

/// Checks `pack`'s arguments (errors in `pack`'s order and words) and sums the input, for
/// lengths of any unsigned width; `visit(i, aligned length)` sees each item as it passes (so a
/// one-pass algorithm runs in the same loop).
fn check<L: Copy + Into<u64>>(
    lengths: &[L],
    capacity: u64,
    align: u64,
    oversize: OversizePolicy,
    mut visit: impl FnMut(usize, u64),
) -> Result<Checked, Error> {
    checked_len("lengths", lengths.len())?;
    if lengths.is_empty() {
        return invalid!("lengths must not be empty");
    }
    if capacity == 0 {
        return invalid!("capacity must be at least 1 token (got 0)");
    }
    if align == 0 {
        return invalid!("align must be at least 1 (got 0)");
    }
    if align > 1 {
        for (i, &len) in lengths.iter().enumerate() {
            let len: u64 = len.into();
            if len.div_ceil(align).checked_mul(align).is_none() {
                return invalid!("lengths[{i}] = {len} rounded up to a multiple of align = {align} overflows u64");
            }
        }
    }
    // One pass: overflow check of the total, the total of the items that fit, and the
    // oversize policy.
    let (mut total, mut fit_total, mut real_all) = (0u64, 0u64, 0u64);
    let mut dropped = Vec::new();
    let mut single = Vec::new();
    for (i, &len) in lengths.iter().enumerate() {
        let len: u64 = len.into();
        let a = aligned(len, align);
        // Real lengths are at most their aligned ones: this sum cannot overflow when the
        // checked one below does not.
        real_all = real_all.wrapping_add(len);
        total = match total.checked_add(a) {
            Some(t) => t,
            None => return invalid!("the sum of aligned lengths overflows u64 (at most {} allowed)", u64::MAX),
        };
        if a <= capacity {
            fit_total += a;
        } else {
            match oversize {
                OversizePolicy::Error => {
                    return Err(Error::Infeasible(alloc::format!(
                        "lengths[{i}] = {len} (aligned to {a} with align = {align}) exceeds capacity = {capacity}; \
                         use oversize single or drop to accept such items"
                    )));
                }
                OversizePolicy::Single => single.push(i as u32),
                OversizePolicy::Drop => dropped.push(i as u32),
            }
        }
        visit(i, a);
    }
    Ok(Checked { total, fit_total, real_all, dropped, single })
}

/// Next-fit bins in compact form: every bin is a run of consecutive input indices, so a
/// host can rebuild the member lists itself instead of receiving them
/// ([`into_packing`](Self::into_packing)). Bin `b` holds the indices from `starts[b]` up to
/// `starts[b + 1]` (the last: up to n), without the dropped ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NextFitRuns {
    /// The first input index of each bin, ascending.
    pub starts: Vec<u32>,
    /// The aligned load of each bin.
    pub loads: Vec<u64>,
    /// Items left out under `drop`, ascending.
    pub dropped: Vec<u32>,
    /// Oversized items alone in a bin under `single`, ascending.
    pub single: Vec<u32>,
    /// As [`Packing::real_tokens`].
    pub real_tokens: u64,
    /// As [`Packing::aligned_tokens`].
    pub aligned_tokens: u64,
    /// As [`Packing::lower_bound`].
    pub lower_bound: u64,
}

impl NextFitRuns {
    /// The [`Packing`] of `n` input lengths that these runs describe (what [`pack`] returns
    /// for next-fit).
    pub fn into_packing(self, n: usize) -> Packing {
        let (offsets, indices) = if self.dropped.is_empty() {
            // Every index, in order; the bins start where the runs do.
            let mut offsets = self.starts.clone();
            offsets.push(n as u32);
            (offsets, (0..n as u32).collect())
        } else {
            let mut indices = Vec::with_capacity(n.saturating_sub(self.dropped.len()));
            let mut offsets = Vec::with_capacity(self.starts.len() + 1);
            let mut dropped = self.dropped.iter().copied().peekable();
            let mut next_start = self.starts.iter().copied().peekable();
            for i in 0..n as u32 {
                if next_start.peek() == Some(&i) {
                    offsets.push(indices.len() as u32);
                    next_start.next();
                }
                if dropped.peek() == Some(&i) {
                    dropped.next();
                } else {
                    indices.push(i);
                }
            }
            offsets.push(indices.len() as u32);
            (offsets, indices)
        };
        Packing {
            offsets,
            indices,
            loads: self.loads,
            dropped: self.dropped,
            single: self.single,
            real_tokens: self.real_tokens,
            aligned_tokens: self.aligned_tokens,
            lower_bound: self.lower_bound,
        }
    }
}

/// Next-fit of `lengths` (any unsigned width) as runs: the same bins as [`pack`] with
/// [`PackMethod::NextFit`], the same errors; `options.method` is not read. One pass: an item
/// that does not fit closes the current bin; an oversized one is alone (`single`) or skipped
/// (`drop`).
pub fn next_fit_runs<L: Copy + Into<u64>>(lengths: &[L], options: &PackOptions) -> Result<NextFitRuns, Error> {
    let PackOptions { capacity, align, oversize, .. } = *options;
    let mut starts = Vec::new();
    let mut loads = Vec::new();
    // The load of the bin being filled; `None` before the first item and after a single.
    let mut current: Option<u64> = None;
    let checked = check(lengths, capacity, align, oversize, |i, a| {
        if a > capacity {
            if oversize == OversizePolicy::Single {
                if let Some(load) = current.take() {
                    loads.push(load);
                }
                starts.push(i as u32);
                loads.push(a);
            }
            return;
        }
        current = match current {
            Some(load) if load + a <= capacity => Some(load + a),
            Some(load) => {
                loads.push(load);
                starts.push(i as u32);
                Some(a)
            }
            None => {
                starts.push(i as u32);
                Some(a)
            }
        };
    })?;
    if let Some(load) = current {
        loads.push(load);
    }
    let Checked { total, fit_total, real_all, dropped, single } = checked;
    // Every item but the dropped ones is packed.
    let dropped_real: u64 = dropped.iter().map(|&i| lengths[i as usize].into()).sum();
    let dropped_aligned: u64 = dropped.iter().map(|&i| aligned(lengths[i as usize].into(), align)).sum();
    Ok(NextFitRuns {
        starts,
        loads,
        dropped,
        single,
        real_tokens: real_all - dropped_real,
        aligned_tokens: total - dropped_aligned,
        lower_bound: fit_total.div_ceil(capacity),
    })
}

/// Best or first fit decreasing over `items` — (index, aligned length) in (length desc,
/// index asc) order, `fitting` of them within `capacity` — pushing each item's bin onto
/// `assign`, in that order ([`NONE`] for a dropped one); returns the number of bins. The oversized items come first: with `single` each
/// opens its own bin (numbered first), otherwise they were dropped already.
fn any_fit(
    items: impl Iterator<Item = (u32, u64)>,
    capacity: u64,
    oversize: OversizePolicy,
    method: PackMethod,
    lower_bound: u64,
    fitting: usize,
    assign: &mut Vec<u32>,
) -> usize {
    let mut items = items.peekable();
    let mut singles = 0u32;
    while let Some(&(_, a)) = items.peek() {
        if a <= capacity {
            break;
        }
        if oversize == OversizePolicy::Single {
            assign.push(singles);
            singles += 1;
        } else {
            assign.push(NONE);
        }
        items.next();
    }
    // Any-fit algorithms leave at most one bin at most half full, so they open at most
    // 2·lower_bound + 1 bins.
    let max_bins = (2 * lower_bound + 1).min(fitting as u64) as usize;
    let opened = if method == PackMethod::Bfd {
        best_fit(items, capacity, fitting, assign, singles)
    } else {
        first_fit(items, capacity, assign, singles, max_bins)
    };
    singles as usize + opened
}

/// Best fit: the bin with the least room ≥ the item, the oldest on ties. Returns the
/// number of bins opened (numbered from `first`).
fn best_fit(
    items: impl Iterator<Item = (u32, u64)>,
    capacity: u64,
    n: usize,
    assign: &mut Vec<u32>,
    first: u32,
) -> usize {
    let mut rooms = RoomIndex::new(capacity, n);
    let mut opened = 0usize;
    for (_, a) in items {
        let (room, b) = match rooms.take_best(a) {
            Some(found) => found,
            None => {
                opened += 1;
                (capacity, (opened - 1) as u32)
            }
        };
        assign.push(first + b);
        rooms.insert(room - a, b);
    }
    opened
}

/// Open bins by remaining room. Rooms up to 2^20 (and not far above the item count) use
/// one bucket per room value with a two-level bitmap of non-empty buckets; larger
/// capacities use an ordered set of (room, bin).
enum RoomIndex {
    Buckets { buckets: Vec<BinaryHeap<Reverse<u32>>>, rooms: BitSet },
    Ordered(BTreeSet<(u64, u32)>),
}

impl RoomIndex {
    fn new(capacity: u64, n: usize) -> Self {
        if capacity <= 1 << 20 && capacity <= 64 * n as u64 + 4096 {
            let slots = capacity as usize + 1;
            RoomIndex::Buckets { buckets: (0..slots).map(|_| BinaryHeap::new()).collect(), rooms: BitSet::new(slots) }
        } else {
            RoomIndex::Ordered(BTreeSet::new())
        }
    }

    /// Records bin `b` with `room` left (full bins too: a zero-length item fits there).
    fn insert(&mut self, room: u64, b: u32) {
        match self {
            RoomIndex::Buckets { buckets, rooms } => {
                buckets[room as usize].push(Reverse(b));
                rooms.insert(room as usize);
            }
            RoomIndex::Ordered(set) => {
                set.insert((room, b));
            }
        }
    }

    /// Removes and returns the (room, bin) with the least room ≥ `a`, oldest bin on ties.
    fn take_best(&mut self, a: u64) -> Option<(u64, u32)> {
        match self {
            RoomIndex::Buckets { buckets, rooms } => {
                let r = rooms.next(a as usize)?;
                let Reverse(b) = buckets[r].pop()?;
                if buckets[r].is_empty() {
                    rooms.remove(r);
                }
                Some((r as u64, b))
            }
            RoomIndex::Ordered(set) => {
                let found = set.range((a, 0)..).next().copied()?;
                set.remove(&found);
                Some(found)
            }
        }
    }
}

/// First fit over a max segment tree of the bins' room: the oldest bin with room ≥ the
/// item. Returns the number of bins opened (numbered from `first`).
fn first_fit(
    items: impl Iterator<Item = (u32, u64)>,
    capacity: u64,
    assign: &mut Vec<u32>,
    first: u32,
    max_bins: usize,
) -> usize {
    // Unopened bins (leaves beyond `opened`) hold the full capacity.
    let mut leaves = max_bins.max(1).next_power_of_two();
    let mut tree = alloc::vec![capacity; 2 * leaves];
    let mut opened = 0usize;
    for (_, a) in items {
        if tree[1] < a {
            // All `leaves` bins are too full (the any-fit bound makes this unreachable):
            // double the tree; the new leaves are fresh bins.
            let old = core::mem::take(&mut tree);
            tree = alloc::vec![capacity; 4 * leaves];
            tree[2 * leaves..3 * leaves].copy_from_slice(&old[leaves..]);
            leaves *= 2;
            for node in (1..leaves).rev() {
                tree[node] = tree[2 * node].max(tree[2 * node + 1]);
            }
        }
        // Descend to the leftmost leaf with room >= a.
        let mut node = 1;
        while node < leaves {
            node = if tree[2 * node] >= a { 2 * node } else { 2 * node + 1 };
        }
        let leaf = node - leaves;
        opened = opened.max(leaf + 1);
        assign.push(first + leaf as u32);
        tree[node] -= a;
        // Up the path while the maximum changes (above that, nothing does).
        let mut up = node / 2;
        while up >= 1 {
            let max = tree[2 * up].max(tree[2 * up + 1]);
            if tree[up] == max {
                break;
            }
            tree[up] = max;
            up /= 2;
        }
    }
    opened
}
