//! slime's copy of verl's Karmarkar–Karp on FLOPs weights (floats, or integers when the
//! model has no layers), and Python's builtin `sum` over floats.

use alloc::vec::Vec;
use core::cmp::Ordering;

use super::SlimeError;

/// How the Python running slime adds floats with the builtin `sum` (slime sums each
/// micro-batch's FLOPs with it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PythonSum {
    /// CPython ≤ 3.11: a left fold.
    Naive,
    /// CPython ≥ 3.12: Neumaier's compensated sum (the compensation is added at the end).
    #[default]
    Neumaier,
}

/// A weight of slime's KK: `f64` (FLOPs) or `u128` (integer FLOPs of a model without
/// layers). Weights are ≥ 0 and not NaN.
pub(crate) trait Weight: Copy + core::fmt::Debug {
    const ZERO: Self;
    fn plus(self, o: Self) -> Self;
    fn minus(self, o: Self) -> Self;
    fn order(&self, o: &Self) -> Ordering;
    /// Python's builtin `sum` over `items`, starting at the integer 0.
    fn py_sum(items: impl Iterator<Item = Self>, mode: PythonSum) -> Self;
}

impl Weight for f64 {
    const ZERO: Self = 0.0;
    fn plus(self, o: Self) -> Self {
        self + o
    }
    fn minus(self, o: Self) -> Self {
        self - o
    }
    fn order(&self, o: &Self) -> Ordering {
        // No NaN reaches here; ±0 compare equal as in Python.
        self.partial_cmp(o).unwrap_or(Ordering::Equal)
    }
    fn py_sum(mut items: impl Iterator<Item = Self>, mode: PythonSum) -> Self {
        // The first float meets the integer start: 0 + x = x exactly.
        let Some(first) = items.next() else { return 0.0 };
        let mut f = first;
        match mode {
            PythonSum::Naive => items.fold(f, |acc, x| acc + x),
            PythonSum::Neumaier => {
                let mut c = 0.0f64;
                for x in items {
                    let t = f + x;
                    if libm_fabs(f) >= libm_fabs(x) {
                        c += (f - t) + x;
                    } else {
                        c += (x - t) + f;
                    }
                    f = t;
                }
                if c != 0.0 && c.is_finite() {
                    f += c;
                }
                f
            }
        }
    }
}

/// `fabs` without `std`.
fn libm_fabs(x: f64) -> f64 {
    f64::from_bits(x.to_bits() & !(1u64 << 63))
}

impl Weight for u128 {
    const ZERO: Self = 0;
    fn plus(self, o: Self) -> Self {
        self.saturating_add(o)
    }
    fn minus(self, o: Self) -> Self {
        self.saturating_sub(o)
    }
    fn order(&self, o: &Self) -> Ordering {
        self.cmp(o)
    }
    fn py_sum(items: impl Iterator<Item = Self>, _: PythonSum) -> Self {
        items.fold(0, |a, b| a.saturating_add(b))
    }
}

/// A set of the KK: its sum (a left fold of its members' weights in member order, as
/// `Set.add`/`Set.merge` accumulate) and its members.
#[derive(Clone, Debug)]
struct KSet<W> {
    sum: W,
    items: Vec<u32>,
}

/// `Set.__lt__` as an order: (sum, member count, members). Members of different sets are
/// distinct, so comparing the (index, weight) tuples is comparing the indices.
fn cmp_set<W: Weight>(a: &KSet<W>, b: &KSet<W>) -> Ordering {
    a.sum.order(&b.sum).then(a.items.len().cmp(&b.items.len())).then_with(|| a.items.cmp(&b.items))
}

/// A KK state: its non-empty sets in descending order. With weights ≥ 0 every non-empty set
/// compares above an empty one, so the `k − len` empty sets are the last ones.
#[derive(Debug)]
struct KState<W> {
    sets: Vec<KSet<W>>,
    spread: W,
}

impl<W: Weight> KState<W> {
    fn new(mut sets: Vec<KSet<W>>, k: usize) -> Self {
        sets.sort_unstable_by(|a, b| cmp_set(b, a));
        // `sets[0].sum - sets[-1].sum`; an empty last set has the integer sum 0.
        let last = if sets.len() == k { sets[k - 1].sum } else { W::ZERO };
        let spread = sets[0].sum.minus(last);
        Self { sets, spread }
    }

    /// `State.merge`: set i takes the members of `other`'s set k−1−i (added one by one).
    fn merge(mut self, mut other: KState<W>, k: usize, w: &[W]) -> Self {
        let (p, q) = (self.sets.len(), other.sets.len());
        let mut out = Vec::with_capacity((p + q).min(k));
        for i in (0..p).chain(p.max(k - q)..k) {
            let mut set = if i < p {
                core::mem::replace(&mut self.sets[i], KSet { sum: W::ZERO, items: Vec::new() })
            } else {
                KSet { sum: W::ZERO, items: Vec::new() }
            };
            if k - 1 - i < q {
                let theirs = core::mem::take(&mut other.sets[k - 1 - i].items);
                for idx in theirs {
                    set.sum = set.sum.plus(w[idx as usize]);
                    set.items.push(idx);
                }
            }
            out.push(set);
        }
        KState::new(out, k)
    }
}

/// `State.__lt__` for `heapq`: the larger spread first, then the larger largest set.
fn state_lt<W: Weight>(a: &KState<W>, b: &KState<W>) -> bool {
    match a.spread.order(&b.spread) {
        Ordering::Equal => cmp_set(&b.sets[0], &a.sets[0]) == Ordering::Less,
        o => o == Ordering::Greater,
    }
}

/// Python's `heapq` (the same sift steps), over state indices.
struct Heap(Vec<usize>);

impl Heap {
    fn sift_down<W: Weight>(&mut self, st: &[Option<KState<W>>], start: usize, mut pos: usize) {
        let new = self.0[pos];
        while pos > start {
            let parent_pos = (pos - 1) >> 1;
            let parent = self.0[parent_pos];
            if lt(st, new, parent) {
                self.0[pos] = parent;
                pos = parent_pos;
                continue;
            }
            break;
        }
        self.0[pos] = new;
    }

    fn sift_up<W: Weight>(&mut self, st: &[Option<KState<W>>], mut pos: usize) {
        let end = self.0.len();
        let start = pos;
        let new = self.0[pos];
        let mut child = 2 * pos + 1;
        while child < end {
            let right = child + 1;
            if right < end && !lt(st, self.0[child], self.0[right]) {
                child = right;
            }
            self.0[pos] = self.0[child];
            pos = child;
            child = 2 * pos + 1;
        }
        self.0[pos] = new;
        self.sift_down(st, start, pos);
    }

    fn push<W: Weight>(&mut self, st: &[Option<KState<W>>], item: usize) {
        self.0.push(item);
        let last = self.0.len() - 1;
        self.sift_down(st, 0, last);
    }

    fn pop<W: Weight>(&mut self, st: &[Option<KState<W>>]) -> Option<usize> {
        let last = self.0.pop()?;
        if self.0.is_empty() {
            return Some(last);
        }
        let ret = core::mem::replace(&mut self.0[0], last);
        self.sift_up(st, 0);
        Some(ret)
    }
}

fn lt<W: Weight>(st: &[Option<KState<W>>], a: usize, b: usize) -> bool {
    match (&st[a], &st[b]) {
        (Some(x), Some(y)) => state_lt(x, y),
        _ => false,
    }
}

/// slime's (verl's) `karmarkar_karp` on weights ≥ 0; `k` ≥ 1, n ≥ 1.
fn karmarkar_karp<W: Weight>(w: &[W], k: usize, equal_size: bool) -> Result<Vec<Vec<u32>>, SlimeError> {
    let n = w.len();
    let mut sorted: Vec<u32> = (0..n as u32).collect();
    sorted.sort_by(|&a, &b| w[a as usize].order(&w[b as usize]).then(a.cmp(&b)));
    let single = |i: u32| KSet { sum: W::ZERO.plus(w[i as usize]), items: alloc::vec![i] };
    let mut states: Vec<Option<KState<W>>> = Vec::new();
    let mut heap = Heap(Vec::new());
    if equal_size {
        if !n.is_multiple_of(k) {
            return Err(SlimeError::AssertionError(alloc::format!("{n} % {k} != 0")));
        }
        for run in sorted.chunks(k) {
            states.push(Some(KState::new(run.iter().map(|&i| single(i)).collect(), k)));
            heap.push(&states, states.len() - 1);
        }
    } else {
        for &i in &sorted {
            states.push(Some(KState::new(alloc::vec![single(i)], k)));
            heap.push(&states, states.len() - 1);
        }
    }
    while heap.0.len() > 1 {
        let (Some(a), Some(b)) = (heap.pop(&states), heap.pop(&states)) else { break };
        let (Some(sa), Some(sb)) = (states[a].take(), states[b].take()) else { break };
        states[a] = Some(sa.merge(sb, k, w));
        heap.push(&states, a);
    }
    let Some(fin) = heap.0.first().and_then(|&i| states[i].as_ref()) else {
        return Err(bad!("seqlen_list is empty"));
    };
    let parts: Vec<Vec<u32>> = (0..k).map(|i| fin.sets.get(i).map_or_else(Vec::new, |s| s.items.clone())).collect();
    if equal_size {
        for p in &parts {
            if p.len() * k != n {
                return Err(SlimeError::AssertionError(alloc::format!("{} * {k} != {n}", p.len())));
            }
        }
    }
    Ok(parts)
}

/// slime's `get_seqlen_balanced_partitions` (verl's KK, then every partition non-empty and
/// sorted ascending; partition order kept) on weights of type `W`.
pub(crate) fn balanced_partitions<W: Weight>(w: &[W], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, SlimeError> {
    let n = w.len();
    if n < k as usize {
        return Err(SlimeError::AssertionError(alloc::format!("number of items:[{n}] < k_partitions:[{k}]")));
    }
    if k == 0 {
        return Err(bad!("k_partitions must be ≥ 1 (got 0)"));
    }
    let mut parts = karmarkar_karp(w, k as usize, equal_size)?;
    for (i, p) in parts.iter_mut().enumerate() {
        if p.is_empty() {
            return Err(SlimeError::AssertionError(alloc::format!("the {i}-th partition is empty")));
        }
        p.sort_unstable();
    }
    Ok(parts)
}

/// slime's `get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size)` on float
/// weights (the FLOPs `build_dp_schedule` balances): KK with float set sums, each a left
/// fold of its members' weights in member order, exactly as Python adds them.
///
/// Errors: `AssertionError` with slime's message for n < k and for `equal_size` with
/// n % k ≠ 0; `invalid-argument` for k = 0 or a weight that is negative, NaN or infinite
/// (outside what slime is given; integer lengths of any sign go to
/// [`verl::get_seqlen_balanced_partitions`](crate::peers::verl::get_seqlen_balanced_partitions)).
pub fn get_seqlen_balanced_partitions(weights: &[f64], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, SlimeError> {
    if let Some(i) = weights.iter().position(|w| !w.is_finite() || *w < 0.0) {
        return Err(bad!("seqlen_list[{i}] = {} must be a finite number ≥ 0", weights[i]));
    }
    balanced_partitions(weights, k, equal_size)
}
