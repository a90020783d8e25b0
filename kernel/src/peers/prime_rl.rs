//! Exact reproductions of prime-rl's orchestrator-side packing at HEAD
//! (`PrimeIntellect-ai/prime-rl` 559b447, `trainer/batch.py`, called by
//! `orchestrator/packing.py`), and of the last trainer-side multi-LoRA packer (de80b48).
//!
//! - [`karmarkar_karp`]: `_karmarkar_karp(weights, num_partitions)`, equal-size
//!   Karmarkar–Karp: items sorted by (weight, index) ascending, cut into states of
//!   `num_partitions` one-item sets, the two states with the largest spread merged (the i-th
//!   largest set of one with the i-th smallest of the other) until one is left; its sets in
//!   descending (total, items) order, members ascending.
//! - [`balanced_partition`]: that result refined by pairwise swaps
//!   (`_refine_by_swapping`): the swap with the smallest (max load, spread), first found in
//!   (left rank, right rank, left position, right position) order, while one improves.
//! - [`prepare_batch`]: `prepare_batch`'s plan: first fit by descending length (stable; at
//!   de80b48 by (LoRA, −length)), the heaviest splittable bins split until the count is a
//!   multiple of the workers, every bin padded, multimodal and text bins distributed as two
//!   groups, each completed with copies of its first bin and balanced with
//!   [`balanced_partition`] over the bin costs `linear·Σlen + quadratic·Σlen²`.
//!
//! prime-rl's weights and costs are Python ints; here inputs and results are `u64` and sums
//! are exact `u128`, so every comparison decides as prime-rl's does. A state's sets are
//! disjoint and never empty, so prime-rl's heap order has no ties and any priority queue
//! with the same order pops the same states.

use alloc::collections::BinaryHeap;
use alloc::vec::Vec;
use core::cmp::{Ordering, Reverse};

use crate::{Error, check_count, checked_len, invalid};

/// A set of a Karmarkar–Karp state (`_WeightedSet`): total and members in insertion order.
#[derive(Clone, Debug)]
struct WSet {
    total: u128,
    items: Vec<u32>,
}

/// `_WeightedSet.__lt__`: by total, then by members lexicographically.
fn cmp_set(a: &WSet, b: &WSet) -> Ordering {
    a.total.cmp(&b.total).then_with(|| a.items.cmp(&b.items))
}

/// A Karmarkar–Karp state (`_KKState`): its sets in descending order.
#[derive(Debug)]
struct State {
    sets: Vec<WSet>,
}

impl State {
    fn spread(&self) -> u128 {
        self.sets[0].total - self.sets[self.sets.len() - 1].total
    }

    fn sort(&mut self) {
        self.sets.sort_by(|a, b| cmp_set(b, a));
    }
}

impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for State {}

impl PartialOrd for State {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for State {
    /// Greater = popped first: prime-rl's heap minimum, the larger spread, then the larger
    /// first set.
    fn cmp(&self, other: &Self) -> Ordering {
        self.spread().cmp(&other.spread()).then_with(|| cmp_set(&self.sets[0], &other.sets[0]))
    }
}

/// Checks prime-rl's preconditions of `_karmarkar_karp` (its `assert`s and `len % k`).
fn check_partition_args(n: usize, k: u32) -> Result<(), Error> {
    if k == 0 {
        return invalid!("num_partitions must be at least 1 (got 0)");
    }
    check_count("num_partitions", k)?;
    checked_len("weights", n)?;
    if n < k as usize || !n.is_multiple_of(k as usize) {
        return invalid!("weights ({n}) must be a positive multiple of num_partitions ({k})");
    }
    Ok(())
}

/// prime-rl's `_karmarkar_karp(weights, num_partitions)`: the `num_partitions` groups of
/// item indices, groups in descending (total, members) order, members ascending.
///
/// Errors (`invalid-argument`; prime-rl's `AssertionError`/`ZeroDivisionError`):
/// `num_partitions` = 0 or above 2^20, `weights` not a positive multiple of it long.
pub fn karmarkar_karp(weights: &[u64], num_partitions: u32) -> Result<Vec<Vec<u32>>, Error> {
    check_partition_args(weights.len(), num_partitions)?;
    let k = num_partitions as usize;
    let mut order: Vec<u32> = (0..weights.len() as u32).collect();
    order.sort_by_key(|&i| (weights[i as usize], i));
    let mut heap: BinaryHeap<State> = BinaryHeap::with_capacity(order.len() / k);
    for chunk in order.chunks(k) {
        let mut state = State {
            sets: chunk
                .iter()
                .map(|&i| WSet { total: u128::from(weights[i as usize]), items: alloc::vec![i] })
                .collect(),
        };
        state.sort();
        heap.push(state);
    }
    while heap.len() > 1 {
        let (Some(mut state), Some(other)) = (heap.pop(), heap.pop()) else { break };
        for (set, mut from) in state.sets.iter_mut().zip(other.sets.into_iter().rev()) {
            set.total += from.total;
            set.items.append(&mut from.items);
        }
        state.sort();
        heap.push(state);
    }
    let state = heap.pop().map(|s| s.sets).unwrap_or_default();
    Ok(state
        .into_iter()
        .map(|s| {
            let mut items = s.items;
            items.sort_unstable();
            items
        })
        .collect())
}

/// The (max load, spread) score of prime-rl's swap refinement.
fn score(max: u128, min: u128) -> (u128, u128) {
    (max, max - min)
}

/// prime-rl's `_refine_by_swapping(weights, partitions)`: while some swap of two items of
/// different groups lowers (max load, spread), the best one (the first found in (left
/// group, right group, left position, right position) order among equals) is made, the two
/// items trading places. Members stay at their positions; nothing is re-sorted.
pub fn refine_by_swapping(weights: &[u64], partitions: &mut [Vec<u32>]) {
    let w = |i: u32| u128::from(weights[i as usize]);
    let mut loads: Vec<u128> = partitions.iter().map(|p| p.iter().map(|&i| w(i)).sum()).collect();
    let k = partitions.len();
    // With at most one item per group a swap only trades two loads: the multiset of loads,
    // hence the score, stays, and prime-rl makes no swap. (Skipping the k² pairs keeps
    // W = 2^20 ranks of single bins and dummies from taking hours.)
    if partitions.iter().all(|p| p.len() <= 1) {
        return;
    }
    loop {
        let max = loads.iter().copied().max().unwrap_or(0);
        let min = loads.iter().copied().min().unwrap_or(0);
        let mut best = score(max, min);
        let mut best_swap: Option<(usize, usize, usize, usize, u128, u128)> = None;
        // The three largest and three smallest loads (group numbers): the loads of the
        // groups a swap between l and r keeps have their max and min among them.
        let mut by_load: Vec<usize> = (0..k).collect();
        by_load.sort_by_key(|&g| (loads[g], g));
        let low: Vec<usize> = by_load.iter().copied().take(3).collect();
        let high: Vec<usize> = by_load.iter().rev().copied().take(3).collect();
        for l in 0..k {
            for r in l + 1..k {
                let rest_max = high.iter().find(|&&g| g != l && g != r).map(|&g| loads[g]);
                let rest_min = low.iter().find(|&&g| g != l && g != r).map(|&g| loads[g]);
                for (lp, &li) in partitions[l].iter().enumerate() {
                    for (rp, &ri) in partitions[r].iter().enumerate() {
                        let new_l = loads[l] - w(li) + w(ri);
                        let new_r = loads[r] - w(ri) + w(li);
                        let hi = rest_max.map_or(new_l.max(new_r), |m| m.max(new_l).max(new_r));
                        let lo = rest_min.map_or(new_l.min(new_r), |m| m.min(new_l).min(new_r));
                        let s = score(hi, lo);
                        if s < best {
                            best = s;
                            best_swap = Some((l, r, lp, rp, new_l, new_r));
                        }
                    }
                }
            }
        }
        let Some((l, r, lp, rp, new_l, new_r)) = best_swap else { return };
        loads[l] = new_l;
        loads[r] = new_r;
        let (left, right) = partitions.split_at_mut(r);
        core::mem::swap(&mut left[l][lp], &mut right[0][rp]);
    }
}

/// prime-rl's `balanced_partition(weights, num_partitions)`: [`karmarkar_karp`], then
/// [`refine_by_swapping`]. Errors: those of [`karmarkar_karp`].
pub fn balanced_partition(weights: &[u64], num_partitions: u32) -> Result<Vec<Vec<u32>>, Error> {
    let mut parts = karmarkar_karp(weights, num_partitions)?;
    refine_by_swapping(weights, &mut parts);
    Ok(parts)
}

/// `build_bin_cost`'s cost of a bin whose sequences have these lengths:
/// `linear·Σlen + quadratic·Σlen²`, or an error when it does not fit in u128.
pub fn bin_cost(lengths: &[u64], linear: u64, quadratic: u64) -> Result<u128, Error> {
    let overflow = || {
        Error::InvalidArgument(alloc::format!(
            "the cost of a bin (linear {linear}, quadratic {quadratic}, {} sequences) overflows u128",
            lengths.len()
        ))
    };
    let mut sum: u128 = 0;
    let mut squares: u128 = 0;
    for &n in lengths {
        let n = u128::from(n);
        sum = sum.checked_add(n).ok_or_else(overflow)?;
        squares = squares.checked_add(n * n).ok_or_else(overflow)?;
    }
    u128::from(linear)
        .checked_mul(sum)
        .and_then(|a| u128::from(quadratic).checked_mul(squares).and_then(|b| a.checked_add(b)))
        .ok_or_else(overflow)
}

/// Options of [`prepare_batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// `seq_len`: lengths are cut to it, and no bin holds more (≥ 1).
    pub seq_len: u64,
    /// `num_train_workers` (1..=2^20).
    pub num_train_workers: u32,
    /// The cost coefficients of `build_bin_cost`: a bin costs `linear·Σlen + quadratic·Σlen²`.
    pub linear: u64,
    /// See `linear`.
    pub quadratic: u64,
    /// `pad_to_multiple_of`: every bin is padded to a multiple of it when it is above 1
    /// (prime-rl pads nothing for 1 and below; 0 is refused, prime-rl divides by it).
    pub pad_to_multiple_of: u64,
    /// de80b48's rule: a bin holding a multimodal sample, or a multimodal sample, only
    /// joins with samples of the first sample's run (LoRA). HEAD has no runs (false).
    pub multimodal_same_run: bool,
}

/// The plan of `prepare_batch`: the bins and which rank trains which, in prime-rl's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchPlan {
    /// The bins after splitting (creation order, split halves: the left one in place, the
    /// right one appended), members in joining order.
    pub bins: Vec<Vec<u32>>,
    /// Whether each bin holds a multimodal sample.
    pub multimodal: Vec<bool>,
    /// Padding tokens of each bin, counted in its last sequence's length.
    pub padding: Vec<u64>,
    /// Cost of each bin after padding.
    pub costs: Vec<u64>,
    /// Per rank, the bins it trains, in order (multimodal ones first); a dummy is the index
    /// of the bin it copies.
    pub ranks: Vec<Vec<u32>>,
    /// Per rank, whether each entry is a dummy (loss switched off).
    pub dummies: Vec<Vec<bool>>,
}

/// A bin while packing (`_MicroBatchBin`).
struct Bin {
    members: Vec<u32>,
    length: u64,
}

/// prime-rl's `prepare_batch` plan (559b447; with `multimodal_same_run`, de80b48's).
///
/// Per sample: `lengths` (cut to `seq_len`), `runs` (the LoRA index; packing order is
/// (run, −length), stable; all 0 at HEAD), `multimodal` (0: text; c ≥ 1: a multimodal
/// sample whose tensors are compatible with exactly the samples of class c — give a
/// sample that shares with none a class of its own) and `labels` (a bin only takes samples
/// with its first sample's label: prime-rl's routed-experts presence).
///
/// First fit: each sample to the first bin with room (`length + len ≤ seq_len`), the same
/// label, and, when both the bin and the sample are multimodal, the same class as the
/// bin's first multimodal sample. With more than one worker, while there are fewer bins
/// than `max(ceil(bins / W)·W, W)`, the bin with the largest (cost, index) among those
/// with two or more samples and no multimodal one is split: its samples by descending
/// single cost (stable), each to the left half when its cost ≤ the right half's.
/// Then the padding, and per group (multimodal bins, then text bins) the group completed
/// to a multiple of W with copies of its first bin, distributed by [`balanced_partition`]
/// over the padded costs.
///
/// Errors (`invalid-argument`): `runs`/`multimodal`/`labels` not one per length,
/// `seq_len` or `num_train_workers` or `pad_to_multiple_of` = 0, W above 2^20, a cost above
/// u64.
pub fn prepare_batch(
    lengths: &[u64],
    runs: &[u32],
    multimodal: &[u32],
    labels: &[u32],
    options: &BatchOptions,
) -> Result<BatchPlan, Error> {
    let n = checked_len("lengths", lengths.len())?;
    if runs.len() != lengths.len() || multimodal.len() != lengths.len() || labels.len() != lengths.len() {
        return invalid!(
            "runs ({}), multimodal ({}) and labels ({}) need one entry per length ({n})",
            runs.len(),
            multimodal.len(),
            labels.len()
        );
    }
    let BatchOptions { seq_len, num_train_workers: w, linear, quadratic, pad_to_multiple_of: m, .. } = *options;
    if seq_len == 0 {
        return invalid!("seq_len must be at least 1 (got 0)");
    }
    if w == 0 {
        return invalid!("num_train_workers must be at least 1 (got 0)");
    }
    check_count("num_train_workers", w)?;
    if m == 0 {
        return invalid!("pad_to_multiple_of must be at least 1 (got 0)");
    }
    let len = |i: u32| lengths[i as usize].min(seq_len);
    let single = |i: u32| bin_cost(&[len(i)], linear, quadratic);
    let workload = |members: &[u32]| {
        let l: Vec<u64> = members.iter().map(|&i| len(i)).collect();
        bin_cost(&l, linear, quadratic)
    };

    // First fit by (run, −length), stable.
    let mut order: Vec<u32> = (0..n).collect();
    order.sort_by_key(|&i| (runs[i as usize], Reverse(len(i))));
    let mut bins: Vec<Bin> = Vec::new();
    for i in order {
        let l = len(i);
        let mm = multimodal[i as usize];
        let fits = |b: &Bin| {
            let first = b.members[0] as usize;
            if b.length.checked_add(l).is_none_or(|t| t > seq_len) || labels[first] != labels[i as usize] {
                return false;
            }
            let bin_mm = b.members.iter().map(|&j| multimodal[j as usize]).find(|&c| c != 0);
            if options.multimodal_same_run && (bin_mm.is_some() || mm != 0) && runs[first] != runs[i as usize] {
                return false;
            }
            match bin_mm {
                Some(c) if mm != 0 => c == mm,
                _ => true,
            }
        };
        match bins.iter_mut().find(|b| fits(b)) {
            Some(b) => {
                b.members.push(i);
                b.length += l;
            }
            None => bins.push(Bin { members: alloc::vec![i], length: l }),
        }
    }

    // Split the heaviest bins until the count is a multiple of the workers.
    if w > 1 {
        let wu = w as usize;
        let target = bins.len().div_ceil(wu).saturating_mul(wu).max(wu);
        while bins.len() < target {
            let mut pick: Option<(u128, usize)> = None;
            for (idx, b) in bins.iter().enumerate() {
                if b.members.len() > 1 && b.members.iter().all(|&j| multimodal[j as usize] == 0) {
                    let cand = (workload(&b.members)?, idx);
                    if pick.is_none_or(|p| cand > p) {
                        pick = Some(cand);
                    }
                }
            }
            let Some((_, idx)) = pick else { break };
            let mut ranked: Vec<(u128, u32)> = Vec::with_capacity(bins[idx].members.len());
            for &j in &bins[idx].members {
                ranked.push((single(j)?, j));
            }
            ranked.sort_by_key(|&(c, _)| Reverse(c));
            let (mut left, mut right) = (Vec::new(), Vec::new());
            let (mut lw, mut rw) = (0u128, 0u128);
            for (c, j) in ranked {
                if lw <= rw {
                    left.push(j);
                    lw += c;
                } else {
                    right.push(j);
                    rw += c;
                }
            }
            let length = |v: &[u32]| v.iter().map(|&j| len(j)).sum::<u64>();
            let (ll, rl) = (length(&left), length(&right));
            bins[idx] = Bin { members: left, length: ll };
            bins.push(Bin { members: right, length: rl });
        }
    }

    // Padding and costs.
    let nb = bins.len();
    let mut padding = Vec::with_capacity(nb);
    let mut costs = Vec::with_capacity(nb);
    let mut is_mm = Vec::with_capacity(nb);
    for b in &bins {
        let mut seqs: Vec<u64> = b.members.iter().map(|&j| len(j)).collect();
        let pad = if m > 1 { (m - b.length % m) % m } else { 0 };
        if let Some(last) = seqs.last_mut() {
            *last = match last.checked_add(pad) {
                Some(v) => v,
                None => return invalid!("bin of {} tokens padded by {pad} overflows u64", b.length),
            };
        }
        let cost = bin_cost(&seqs, linear, quadratic)?;
        let Ok(cost) = u64::try_from(cost) else {
            return invalid!("the cost of a bin ({cost}) is above u64::MAX");
        };
        padding.push(pad);
        costs.push(cost);
        is_mm.push(b.members.iter().any(|&j| multimodal[j as usize] != 0));
    }

    // Distribution: multimodal group, then text group, each with copies of its first bin.
    let wu = w as usize;
    let mut ranks: Vec<Vec<u32>> = (0..wu).map(|_| Vec::new()).collect();
    let mut dummies: Vec<Vec<bool>> = (0..wu).map(|_| Vec::new()).collect();
    for want_mm in [true, false] {
        let mut group: Vec<(u32, bool)> =
            (0..nb as u32).filter(|&b| is_mm[b as usize] == want_mm).map(|b| (b, false)).collect();
        if group.is_empty() {
            continue;
        }
        let extra = (wu - group.len() % wu) % wu;
        let first = group[0].0;
        group.extend(core::iter::repeat_n((first, true), extra));
        let weights: Vec<u64> = group.iter().map(|&(b, _)| costs[b as usize]).collect();
        let parts = balanced_partition(&weights, w)?;
        for (r, part) in parts.into_iter().enumerate() {
            for g in part {
                let (b, dummy) = group[g as usize];
                ranks[r].push(b);
                dummies[r].push(dummy);
            }
        }
    }
    Ok(BatchPlan {
        bins: bins.into_iter().map(|b| b.members).collect(),
        multimodal: is_mm,
        padding,
        costs,
        ranks,
        dummies,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn swap_refinement_improves_the_kk_result() {
        // prime-rl's bp_swap_improves vector.
        let w = [2, 9, 17, 16, 13, 30, 26, 27, 10];
        assert_eq!(karmarkar_karp(&w, 3).unwrap(), [[1, 3, 7], [4, 6, 8], [0, 2, 5]]);
        assert_eq!(balanced_partition(&w, 3).unwrap(), [[1, 3, 6], [4, 7, 8], [0, 2, 5]]);
    }

    #[test]
    fn partition_preconditions_are_errors() {
        assert!(karmarkar_karp(&[1, 2, 3], 2).is_err());
        assert!(karmarkar_karp(&[1], 2).is_err());
        assert!(karmarkar_karp(&[], 1).is_err());
        assert!(karmarkar_karp(&[1, 2], 0).is_err());
    }

    fn loads(w: &[u64], parts: &[Vec<u32>]) -> Vec<u128> {
        parts.iter().map(|p| p.iter().map(|&i| u128::from(w[i as usize])).sum()).collect()
    }

    /// What the refinement minimizes: (max load, spread).
    fn score(loads: &[u128]) -> (u128, u128) {
        let (hi, lo) = (*loads.iter().max().unwrap(), *loads.iter().min().unwrap());
        (hi, hi - lo)
    }

    prop_compose! {
        /// `k` groups and `k · m` weights below `max` (the equal-size KK needs `k | n`).
        fn groups_and_weights(max_k: u32, max_m: usize, max: u64)(k in 1..max_k, m in 1..max_m)(
            k in Just(k), m in Just(m), w in proptest::collection::vec(0..max, k as usize * m),
        ) -> (u32, usize, Vec<u64>) {
            (k, m, w)
        }
    }

    /// prime-rl's `_refine_by_swapping`, literally: every candidate's loads rebuilt in full.
    fn naive_refine(weights: &[u64], parts: &mut [Vec<u32>]) {
        let w = |i: u32| u128::from(weights[i as usize]);
        let mut loads = loads(weights, parts);
        loop {
            let mut best = score(&loads);
            let mut best_swap = None;
            for l in 0..parts.len() {
                for r in l + 1..parts.len() {
                    for lp in 0..parts[l].len() {
                        for rp in 0..parts[r].len() {
                            let mut new = loads.clone();
                            new[l] = loads[l] - w(parts[l][lp]) + w(parts[r][rp]);
                            new[r] = loads[r] - w(parts[r][rp]) + w(parts[l][lp]);
                            if score(&new) < best {
                                best = score(&new);
                                best_swap = Some((l, r, lp, rp, new));
                            }
                        }
                    }
                }
            }
            let Some((l, r, lp, rp, new)) = best_swap else { return };
            loads = new;
            let t = parts[l][lp];
            parts[l][lp] = parts[r][rp];
            parts[r][rp] = t;
        }
    }

    proptest! {
        /// The refinement with its shortcuts (three largest/smallest loads, single-item
        /// groups) makes prime-rl's swaps, one for one.
        #[test]
        fn refinement_equals_the_literal_loop((k, _m, w) in groups_and_weights(8, 5, 50)) {
            let kk = karmarkar_karp(&w, k).unwrap();
            let (mut a, mut b) = (kk.clone(), kk);
            refine_by_swapping(&w, &mut a);
            naive_refine(&w, &mut b);
            prop_assert_eq!(a, b);
        }

        /// Every index appears exactly once, every group holds n / k of them, and the swap
        /// refinement never worsens the KK result's (max load, spread).
        #[test]
        fn partitions_cover_every_index_once_and_refinement_never_worsens(
            (k, m, w) in groups_and_weights(7, 7, 1_000_000),
        ) {
            let kk = karmarkar_karp(&w, k).unwrap();
            let bp = balanced_partition(&w, k).unwrap();
            for parts in [&kk, &bp] {
                prop_assert_eq!(parts.len(), k as usize);
                prop_assert!(parts.iter().all(|p| p.len() == m));
                let mut all: Vec<u32> = parts.iter().flatten().copied().collect();
                all.sort_unstable();
                prop_assert_eq!(all, (0..w.len() as u32).collect::<Vec<_>>());
            }
            prop_assert!(score(&loads(&w, &bp)) <= score(&loads(&w, &kk)));
        }

        /// Every sample is in exactly one bin, every rank gets the same number of bins,
        /// no bin exceeds seq_len before padding, and dummies only copy a group's first bin.
        #[test]
        fn prepare_batch_places_every_sample_once(
            lengths in proptest::collection::vec(0u64..120, 0..40),
            w in 1u32..9, m in 1u64..9, quadratic in 0u64..3,
            mm_every in 0usize..5,
        ) {
            let n = lengths.len();
            let multimodal: Vec<u32> = (0..n).map(|i| u32::from(mm_every > 0 && i % (mm_every + 2) == 0)).collect();
            let zeros = alloc::vec![0u32; n];
            let o = BatchOptions { seq_len: 100, num_train_workers: w, linear: 1, quadratic, pad_to_multiple_of: m,
                multimodal_same_run: false };
            let plan = prepare_batch(&lengths, &zeros, &multimodal, &zeros, &o).unwrap();
            let mut all: Vec<u32> = plan.bins.iter().flatten().copied().collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..n as u32).collect::<Vec<_>>());
            for b in &plan.bins {
                prop_assert!(b.iter().map(|&i| lengths[i as usize].min(100)).sum::<u64>() <= 100);
            }
            let per = plan.ranks[0].len();
            prop_assert!(plan.ranks.iter().all(|r| r.len() == per));
            let real: usize = plan.dummies.iter().flatten().filter(|d| !**d).count();
            prop_assert_eq!(real, plan.bins.len());
        }
    }
}
