//! Partition: split `n` weights into `k` groups with balanced sums.
//!
//! Methods:
//! - [`PartitionMethod::Kk`]: Karmarkar–Karp largest differencing (k-way). Memory is O(n + k)
//!   even without `equal_size` (empty sets are implicit), time O(n log n + merges).
//! - [`PartitionMethod::Greedy`]: longest processing time first (LPT), O(n log n).
//! - [`PartitionMethod::Verl`]: verl 0.9.1's `get_seqlen_balanced_partitions`, reproduced
//!   exactly (group order and member order included); see [`crate::peers::verl`].
//!
//! With `refine`, the `kk` and `greedy` results are improved by pairwise moves and swaps
//! between groups (see `refine.rs`): each accepted step strictly reduces the sum of
//! squared group sums, so it terminates; the work is bounded.
//!
//! Output order for `kk` and `greedy`: groups by sum descending, ties by smallest member
//! index ascending; members ascending. For `verl`: verl's order.

use alloc::collections::{BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;

use crate::sort::sorted_desc;
use crate::{Error, checked_len, checked_sum, flatten, invalid};

/// Which partitioning algorithm to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PartitionMethod {
    /// Karmarkar–Karp largest differencing, k-way (the default).
    #[default]
    Kk,
    /// Longest processing time first: items by weight descending, each to the lightest group.
    Greedy,
    /// verl 0.9.1 `get_seqlen_balanced_partitions`, exactly.
    Verl,
}

crate::__options! { $ __partition_options;
/// Options of [`partition`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionOptions {
    /// The algorithm.
    pub method: PartitionMethod,
    /// Every group gets exactly `n / k` items; requires `n % k == 0`.
    pub equal_size: bool,
    /// Improve `kk`/`greedy` results by bounded pairwise moves and swaps. Must be `false`
    /// with [`PartitionMethod::Verl`] (verl's output is reproduced as is).
    pub refine: bool,
}
}

impl Default for PartitionOptions {
    fn default() -> Self {
        Self { method: PartitionMethod::Kk, equal_size: false, refine: true }
    }
}

/// The result of [`partition`], in flat form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// `k + 1` offsets into `indices`: group `g` is `indices[offsets[g]..offsets[g + 1]]`.
    pub offsets: Vec<u32>,
    /// Every input index exactly once, grouped.
    pub indices: Vec<u32>,
    /// Sum of the weights of each group (`k` entries).
    pub sums: Vec<u64>,
    /// Sum of all weights.
    pub total: u64,
    /// Largest group sum minus smallest group sum.
    pub spread: u64,
    /// `max(ceil(total / k), largest weight)`: no partition's largest group is lighter.
    pub lower_bound: u64,
}

impl Partition {
    /// The number of groups.
    pub fn k(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The members of group `g` (input indices).
    pub fn group(&self, g: usize) -> &[u32] {
        &self.indices[self.offsets[g] as usize..self.offsets[g + 1] as usize]
    }

    /// The heaviest group's sum.
    pub fn max_sum(&self) -> u64 {
        self.sums.iter().copied().max().unwrap_or(0)
    }

    pub(crate) fn from_groups(weights: &[u64], groups: Vec<Vec<u32>>, k: u32) -> Self {
        let sums: Vec<u64> = groups.iter().map(|g| g.iter().map(|&i| weights[i as usize]).sum()).collect();
        let total: u64 = sums.iter().sum();
        let max = sums.iter().copied().max().unwrap_or(0);
        let min = sums.iter().copied().min().unwrap_or(0);
        let max_item = weights.iter().copied().max().unwrap_or(0);
        let k64 = u64::from(k.max(1));
        let lower_bound = total.div_ceil(k64).max(max_item);
        let (offsets, indices) = flatten(&groups);
        Self { offsets, indices, sums, total, spread: max - min, lower_bound }
    }
}

/// Splits `weights` into `k` groups with balanced sums.
///
/// Errors (`invalid-argument`): `k == 0`; `weights` empty; `n < k`; `equal_size` with
/// `n % k != 0`; the sum of weights overflows `u64`; `refine` with the `verl` method; the
/// `verl` method with a weight above `i64::MAX` (verl works on Python ints).
pub fn partition(weights: &[u64], k: u32, options: &PartitionOptions) -> Result<Partition, Error> {
    let n = checked_len("weights", weights.len())?;
    if k == 0 {
        return invalid!("k must be at least 1 (got 0)");
    }
    if n == 0 {
        return invalid!("weights must not be empty (got 0 weights for k = {k})");
    }
    if n < k {
        return invalid!("k must be at most the number of weights n = {n} (got k = {k})");
    }
    if options.equal_size && n % k != 0 {
        return invalid!(
            "equal_size needs the number of weights n = {n} to be a multiple of k = {k} (n % k = {})",
            n % k
        );
    }
    checked_sum("weights", weights.iter().copied())?;
    let mut groups = match options.method {
        PartitionMethod::Verl => {
            if options.refine {
                return invalid!("refine must be false with method verl (verl's output is reproduced exactly)");
            }
            let mut signed = Vec::with_capacity(weights.len());
            for (i, &w) in weights.iter().enumerate() {
                match i64::try_from(w) {
                    Ok(v) => signed.push(v),
                    Err(_) => {
                        return invalid!(
                            "weights[{i}] = {w} is above i64::MAX, the largest weight method verl accepts"
                        );
                    }
                }
            }
            let groups = crate::peers::verl::get_seqlen_balanced_partitions(&signed, k, options.equal_size)
                .map_err(|e| Error::InvalidArgument(alloc::format!("verl: {e}")))?;
            return Ok(Partition::from_groups(weights, groups, k));
        }
        PartitionMethod::Kk => karmarkar_karp(weights, k, options.equal_size),
        PartitionMethod::Greedy => lpt(weights, k, options.equal_size),
    };
    if options.refine {
        crate::refine::refine(weights, &mut groups, options.equal_size, None);
    }
    Ok(Partition::from_groups(weights, canonical_order(weights, groups), k))
}

/// Sorts members ascending and groups by (sum descending, smallest member ascending).
fn canonical_order(weights: &[u64], mut groups: Vec<Vec<u32>>) -> Vec<Vec<u32>> {
    for g in &mut groups {
        g.sort_unstable();
    }
    let mut keyed: Vec<(u64, u32, Vec<u32>)> = groups
        .into_iter()
        .map(|g| {
            let s = g.iter().map(|&i| weights[i as usize]).sum();
            (s, g.first().copied().unwrap_or(u32::MAX), g)
        })
        .collect();
    keyed.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, _, g)| g).collect()
}

/// Groups from a per-item group label: members come out ascending, no sort needed.
fn groups_from_labels(labels: &[u32], k: usize) -> Vec<Vec<u32>> {
    let mut counts = alloc::vec![0usize; k];
    for &g in labels {
        counts[g as usize] += 1;
    }
    let mut groups: Vec<Vec<u32>> = counts.iter().map(|&c| Vec::with_capacity(c)).collect();
    for (i, &g) in labels.iter().enumerate() {
        groups[g as usize].push(i as u32);
    }
    groups
}

/// LPT: items by (weight desc, index asc); each goes to the group with the smallest
/// (sum, item count, group index) — the count keeps zero weights from leaving a group
/// empty. With `equal_size`, full groups (n/k items) take no more items.
fn lpt(weights: &[u64], k: u32, equal_size: bool) -> Vec<Vec<u32>> {
    let n = weights.len();
    let cap = if equal_size { n / k as usize } else { usize::MAX };
    let mut labels = alloc::vec![0u32; n];
    let mut heap: BinaryHeap<Reverse<(u64, usize, u32)>> = (0..k).map(|g| Reverse((0u64, 0, g))).collect();
    for i in sorted_desc(weights) {
        // The heap is never empty here: n <= k * cap, and only full groups leave it.
        let Some(Reverse((sum, count, g))) = heap.pop() else { break };
        labels[i as usize] = g;
        if count + 1 < cap {
            heap.push(Reverse((sum + weights[i as usize], count + 1, g)));
        }
    }
    groups_from_labels(&labels, k as usize)
}

/// Arena of item sets for Karmarkar–Karp: sets are linked lists of items, named by their
/// first item, so merging two sets is O(1) and memory is O(n).
struct Sets {
    sum: Vec<u64>,
    tail: Vec<u32>,
    next: Vec<u32>,
}

const NIL: u32 = u32::MAX;

impl Sets {
    fn new(weights: &[u64]) -> Self {
        let n = weights.len();
        Self { sum: weights.to_vec(), tail: (0..n as u32).collect(), next: alloc::vec![NIL; n] }
    }

    /// Joins sets `x` and `y`; the result is named by the smaller name, so a set's name is
    /// always its smallest member index.
    fn merge(&mut self, x: u32, y: u32) -> u32 {
        let (a, b) = if x < y { (x as usize, y as usize) } else { (y as usize, x as usize) };
        self.next[self.tail[a] as usize] = b as u32;
        self.tail[a] = self.tail[b];
        self.sum[a] += self.sum[b];
        a as u32
    }

    /// The total order of sets inside a state: (sum, smallest member index).
    fn key(&self, s: u32) -> (u64, u32) {
        (self.sum[s as usize], s)
    }

    /// Writes `label` for every member of set `s`.
    fn label(&self, s: u32, label: u32, labels: &mut [u32]) {
        let mut cur = s;
        while cur != NIL {
            labels[cur as usize] = label;
            cur = self.next[cur as usize];
        }
    }
}

/// A KK state: its non-empty sets in ascending (sum, name) order. Logically it has `k` sets;
/// the `k - len` missing ones are empty and sort before all others.
type State = VecDeque<u32>;

/// Heap entry of a merged state: larger spread first, then larger largest-set sum, then the
/// older state (smaller age); the last field is the slot holding the state.
type Entry = (u64, u64, Reverse<u32>, usize);

fn spread_and_max(sets: &Sets, state: &State, k: usize) -> (u64, u64) {
    let max = state.back().map_or(0, |&s| sets.sum[s as usize]);
    let min = if state.len() < k { 0 } else { state.front().map_or(0, |&s| sets.sum[s as usize]) };
    (max - min, max)
}

/// Adds the single set `s` to `a`: it joins `a`'s smallest logical set (a new set if `a`
/// has fewer than `k`), keeping `a` sorted.
fn absorb_single(sets: &mut Sets, a: &mut State, s: u32, k: usize) {
    let joined = if a.len() < k {
        s
    } else {
        match a.pop_front() {
            Some(smallest) => sets.merge(smallest, s),
            None => s,
        }
    };
    let key = sets.key(joined);
    let pos = a.partition_point(|&x| sets.key(x) < key);
    a.insert(pos, joined);
}

/// Merges `b` into `a` pairing the i-th smallest logical set of one with the i-th largest of
/// the other (the differencing step), keeping `a` sorted. `out` is scratch space.
fn merge_states(sets: &mut Sets, a: &mut State, b: &State, k: usize, out: &mut Vec<(u64, u32)>) {
    let (ma, mb) = (a.len(), b.len());
    out.clear();
    // Logical ascending arrays of length k: A[j] = a[j - (k - ma)] for j >= k - ma.
    // Pair A[j] with B[k - 1 - j]; B[k-1-j] is non-empty for j < mb.
    let first_a = k - ma;
    // Only j in [0, mb) ∪ [k - ma, k) has a non-empty side.
    let js = (0..mb.min(k)).chain(first_a.max(mb)..k);
    for j in js {
        let sa = (j >= first_a).then(|| a[j - first_a]);
        let sb = (j < mb).then(|| b[mb - 1 - j]);
        let joined = match (sa, sb) {
            (Some(x), Some(y)) => sets.merge(x, y),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => continue,
        };
        out.push(sets.key(joined));
    }
    out.sort_unstable();
    a.clear();
    a.extend(out.iter().map(|&(_, s)| s));
}

/// What the next pop yields: a single item not yet made a state, or a merged state's slot.
enum Node {
    Single(u32),
    Merged(usize),
}

/// Karmarkar–Karp largest differencing for `k` groups.
///
/// Unequal: every item starts as its own state (one set, `k - 1` implicit empty ones), taken
/// in (weight desc, index asc) order. Equal size: items sorted by (weight desc, index asc)
/// are cut into runs of `k`, each run a state of `k` single-item sets. The two states of
/// highest priority (spread, then largest set, then age, single items being the oldest) are
/// merged until one is left.
fn karmarkar_karp(weights: &[u64], k: u32, equal_size: bool) -> Vec<Vec<u32>> {
    let k = k as usize;
    if k == 1 {
        return alloc::vec![(0..weights.len() as u32).collect()];
    }
    let mut sets = Sets::new(weights);
    let order = sorted_desc(weights);
    // Merged states live in reusable slots; `free` lists the empty ones.
    let mut slots: Vec<State> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut heap: BinaryHeap<Entry> = BinaryHeap::new();
    let mut age: u32 = 0;
    let mut scratch: Vec<(u64, u32)> = Vec::new();
    // Single items not yet turned into states, consumed in `order` (their priority is
    // (w, w), non-increasing along `order`).
    let mut pending: &[u32] = &[];
    if equal_size {
        for run in order.chunks(k) {
            let mut st: State = run.iter().copied().collect();
            st.make_contiguous().sort_unstable_by_key(|&s| sets.key(s));
            let (spread, max) = spread_and_max(&sets, &st, k);
            heap.push((spread, max, Reverse(age), slots.len()));
            age += 1;
            slots.push(st);
        }
    } else {
        pending = &order;
    }
    let pop = |heap: &mut BinaryHeap<Entry>, pending: &mut &[u32]| -> Option<Node> {
        let single = pending.first().map(|&i| weights[i as usize]);
        let take_single = match (single, heap.peek()) {
            (Some(w), Some(top)) => (w, w) >= (top.0, top.1),
            (Some(_), None) => true,
            (None, _) => false,
        };
        if take_single {
            let i = pending[0];
            *pending = &pending[1..];
            Some(Node::Single(i))
        } else {
            heap.pop().map(|e| Node::Merged(e.3))
        }
    };
    loop {
        // Fast path, the common case: the heap's top state absorbs the next single item.
        // That is what the two pops below would do when the top beats the next item and the
        // item beats the runner-up (the larger child of the root); updating the top in place
        // costs one sift instead of a pop and a push, and gives the same result.
        if let (Some(&i), Some(top)) = (pending.first(), heap.peek()) {
            let w = weights[i as usize];
            let runner_up = heap.as_slice()[1..].iter().take(2).max();
            if (w, w) < (top.0, top.1) && runner_up.is_none_or(|r| (w, w) >= (r.0, r.1)) {
                pending = &pending[1..];
                if let Some(mut top) = heap.peek_mut() {
                    let slot = top.3;
                    absorb_single(&mut sets, &mut slots[slot], i, k);
                    let (spread, max) = spread_and_max(&sets, &slots[slot], k);
                    *top = (spread, max, Reverse(age), slot);
                    age += 1;
                }
                continue;
            }
        }
        let Some(a) = pop(&mut heap, &mut pending) else { break };
        let Some(b) = pop(&mut heap, &mut pending) else {
            // `a` is the final state: label each item with its set's position.
            let mut labels = alloc::vec![0u32; weights.len()];
            if let Node::Merged(slot) = a {
                for (g, &s) in slots[slot].iter().enumerate() {
                    sets.label(s, g as u32, &mut labels);
                }
            }
            return groups_from_labels(&labels, k);
        };
        let slot = match (a, b) {
            (Node::Single(x), Node::Single(y)) => {
                let slot = free.pop().unwrap_or_else(|| {
                    // Small: a pair state grows as it absorbs sets; sizing it to k could cost
                    // O(n·k) memory when many pair states coexist.
                    slots.push(State::with_capacity(4));
                    slots.len() - 1
                });
                let st = &mut slots[slot];
                st.clear();
                // k >= 2: two separate sets, ascending by (sum, name).
                let (lo, hi) = if sets.key(x) < sets.key(y) { (x, y) } else { (y, x) };
                st.push_back(lo);
                st.push_back(hi);
                slot
            }
            (Node::Single(x), Node::Merged(slot)) | (Node::Merged(slot), Node::Single(x)) => {
                absorb_single(&mut sets, &mut slots[slot], x, k);
                slot
            }
            (Node::Merged(sa), Node::Merged(sb)) => {
                let b_state = core::mem::take(&mut slots[sb]);
                merge_states(&mut sets, &mut slots[sa], &b_state, k, &mut scratch);
                slots[sb] = b_state;
                slots[sb].clear();
                free.push(sb);
                sa
            }
        };
        let (spread, max) = spread_and_max(&sets, &slots[slot], k);
        heap.push((spread, max, Reverse(age), slot));
        age += 1;
    }
    alloc::vec![Vec::new(); k]
}
