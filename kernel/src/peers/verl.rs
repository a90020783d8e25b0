//! Exact reproductions of verl 0.9.1's `verl/utils/seqlen_balancing.py` partition functions.
//!
//! Behaviour reproduced (facts from `shared/reference/PEERS.md`, checked against the shared
//! vectors): `karmarkar_karp`, `greedy_partition` and `get_seqlen_balanced_partitions` give
//! the same groups in the same order, including verl's behaviour on out-of-domain input
//! (negative lengths, `n < k`, empty input), and fail where verl fails with the same Python
//! exception type and message ([`PyError`]).
//!
//! Unlike verl, empty sets are not materialised: a state holds only its non-empty sets, so
//! memory is O(n) instead of O(n·k). Python's `heapq` sift order is replicated step by step,
//! so ties between states resolve exactly as in verl.

use alloc::collections::BinaryHeap;
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::{Ordering, Reverse};

/// A failure of a verl function, named by the Python exception verl raises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PyError {
    /// `AssertionError` with verl's message.
    AssertionError(String),
    /// `IndexError` (verl indexes an empty list).
    IndexError(String),
    /// `TypeError` (verl indexes a list with `None`).
    TypeError(String),
    /// `ZeroDivisionError` (`n % 0`).
    ZeroDivisionError(String),
    /// `MemoryError`: verl would materialise `n·k` sets; refused above [`MAX_VERL_K`] groups.
    MemoryError(String),
    /// `ValueError` (raised by the micro-batch and DP entry points of [`peers`](super)).
    ValueError(String),
}

impl PyError {
    /// The Python exception class name, e.g. `"AssertionError"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            PyError::AssertionError(_) => "AssertionError",
            PyError::IndexError(_) => "IndexError",
            PyError::TypeError(_) => "TypeError",
            PyError::ZeroDivisionError(_) => "ZeroDivisionError",
            PyError::MemoryError(_) => "MemoryError",
            PyError::ValueError(_) => "ValueError",
        }
    }

    /// The exception message (what `str(exc)` gives in Python).
    pub fn message(&self) -> &str {
        match self {
            PyError::AssertionError(m)
            | PyError::IndexError(m)
            | PyError::TypeError(m)
            | PyError::ZeroDivisionError(m)
            | PyError::MemoryError(m)
            | PyError::ValueError(m) => m,
        }
    }
}

impl core::fmt::Display for PyError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}: {}", self.type_name(), self.message())
    }
}

/// The largest `k` accepted where verl's output would hold `k` lists (`n < k` is allowed by
/// verl's `karmarkar_karp` and `greedy_partition`): 2^24.
pub const MAX_VERL_K: u32 = 1 << 24;

fn index_error() -> PyError {
    PyError::IndexError("list index out of range".into())
}

/// `MemoryError` for `k` above [`MAX_VERL_K`] (where verl would build `k` lists).
pub(crate) fn check_k(k: u32) -> Result<(), PyError> {
    if k > MAX_VERL_K {
        return Err(PyError::MemoryError(alloc::format!(
            "k_partitions = {k} is above the supported maximum of {MAX_VERL_K}"
        )));
    }
    Ok(())
}

/// The integer type of set sums: `i64` when the sum of absolute lengths fits (exact, and
/// fast in WebAssembly), `i128` otherwise (sums of up to 2^64 lengths of any i64 value).
trait Sum: Copy + Ord + Default + core::fmt::Debug + core::ops::Add<Output = Self> + core::ops::Sub<Output = Self> {
    fn of(v: i64) -> Self;
}

impl Sum for i64 {
    fn of(v: i64) -> Self {
        v
    }
}

impl Sum for i128 {
    fn of(v: i64) -> Self {
        i128::from(v)
    }
}

/// A set of verl's KK: its item indices in insertion order. verl's items are
/// (index, length) tuples; indices are unique, so comparing two item lists
/// lexicographically is the same as comparing their index lists.
#[derive(Clone, Debug, Default)]
struct VSet<S> {
    sum: S,
    items: Vec<u32>,
}

/// Python's `Set.__lt__` as a total order: (sum, item count, items lexicographically).
fn cmp_set<S: Sum>(a: Option<&VSet<S>>, b: Option<&VSet<S>>) -> Ordering {
    let key = |s: Option<&VSet<S>>| s.map_or((S::default(), 0), |s| (s.sum, s.items.len()));
    fn items<S>(s: Option<&VSet<S>>) -> &[u32] {
        s.map_or(&[], |s| &s.items)
    }
    key(a).cmp(&key(b)).then_with(|| items(a).cmp(items(b)))
}

/// A KK state: its non-empty sets in descending order; the `k - sets.len()` empty sets sit
/// logically between the sets that compare above an empty set (sum ≥ 0, `hi` of them) and
/// those below it (sum < 0).
#[derive(Debug)]
struct VState<S> {
    sets: Vec<VSet<S>>,
    hi: usize,
    /// `State.spread`, cached: largest logical set sum minus smallest.
    spread: S,
}

impl<S: Sum> VState<S> {
    fn new(mut sets: Vec<VSet<S>>, k: usize) -> Self {
        // Non-empty sets never compare equal (their items differ), so an unstable sort
        // gives Python's order.
        sets.sort_unstable_by(|a, b| cmp_set(Some(b), Some(a)));
        let hi = sets.iter().filter(|s| s.sum >= S::default()).count();
        let mut state = Self { sets, hi, spread: S::default() };
        state.spread =
            state.at(0, k).map_or(S::default(), |s| s.sum) - state.at(k - 1, k).map_or(S::default(), |s| s.sum);
        state
    }

    /// Where logical position `i` of `k` (descending order) is stored in `sets`, `None` if
    /// that set is empty.
    fn slot(&self, i: usize, k: usize) -> Option<usize> {
        slot(self.hi, self.sets.len(), i, k)
    }

    /// The set at logical position `i` of `k`, `None` if empty.
    fn at(&self, i: usize, k: usize) -> Option<&VSet<S>> {
        self.slot(i, k).map(|p| &self.sets[p])
    }

    /// `State.merge`: set i takes the items of `other`'s set k−1−i; then re-sorted.
    fn merge(self, other: VState<S>, k: usize) -> VState<S> {
        // Logical positions with a non-empty side: self's [0, hi) ∪ [k - lo, k), and
        // other's mirrored, [0, other.lo) ∪ [k - other.hi, k): two ranges in all.
        let (lo_s, lo_o) = (self.sets.len() - self.hi, other.sets.len() - other.hi);
        let head = self.hi.max(lo_o);
        let tail = (k - lo_s).min(k - other.hi).max(head);
        let (hi_s, len_s, hi_o, len_o) = (self.hi, self.sets.len(), other.hi, other.sets.len());
        let (mut mine, mut theirs) = (self.sets, other.sets);
        let mut out = Vec::with_capacity(head + (k - tail));
        for i in (0..head).chain(tail..k) {
            match (slot(hi_s, len_s, i, k), slot(hi_o, len_o, k - 1 - i, k)) {
                (Some(a), Some(b)) => {
                    let mut x = core::mem::take(&mut mine[a]);
                    let y = core::mem::take(&mut theirs[b]);
                    x.sum = x.sum + y.sum;
                    x.items.extend(y.items);
                    out.push(x);
                }
                (Some(a), None) => out.push(core::mem::take(&mut mine[a])),
                (None, Some(b)) => out.push(core::mem::take(&mut theirs[b])),
                (None, None) => {}
            }
        }
        VState::new(out, k)
    }
}

/// Where logical position `i` of `k` is stored among a state's `len` non-empty sets, of which
/// the first `hi` compare above an empty set; `None` if that position holds an empty set.
fn slot(hi: usize, len: usize, i: usize, k: usize) -> Option<usize> {
    let lo = len - hi;
    if i < hi {
        Some(i)
    } else if i >= k - lo {
        Some(hi + i - (k - lo))
    } else {
        None
    }
}

/// Python's `heapq` with `State.__lt__`, on (spread, state index) entries: the spread is
/// kept in the entry so most comparisons need not look at the state.
struct PyHeap<S> {
    heap: Vec<(S, usize)>,
}

impl<S: Sum> PyHeap<S> {
    fn lt(states: &[Option<VState<S>>], k: usize, a: (S, usize), b: (S, usize)) -> bool {
        if a.0 != b.0 {
            return a.0 > b.0;
        }
        let (Some(sa), Some(sb)) = (&states[a.1], &states[b.1]) else { return false };
        // self.sets[0] > other.sets[0]
        cmp_set(sb.at(0, k), sa.at(0, k)) == Ordering::Less
    }

    fn sift_down(&mut self, states: &[Option<VState<S>>], k: usize, start: usize, mut pos: usize) {
        let new = self.heap[pos];
        while pos > start {
            let parent_pos = (pos - 1) >> 1;
            let parent = self.heap[parent_pos];
            if Self::lt(states, k, new, parent) {
                self.heap[pos] = parent;
                pos = parent_pos;
                continue;
            }
            break;
        }
        self.heap[pos] = new;
    }

    fn sift_up(&mut self, states: &[Option<VState<S>>], k: usize, mut pos: usize) {
        let end = self.heap.len();
        let start = pos;
        let new = self.heap[pos];
        let mut child = 2 * pos + 1;
        while child < end {
            let right = child + 1;
            if right < end && !Self::lt(states, k, self.heap[child], self.heap[right]) {
                child = right;
            }
            self.heap[pos] = self.heap[child];
            pos = child;
            child = 2 * pos + 1;
        }
        self.heap[pos] = new;
        self.sift_down(states, k, start, pos);
    }

    fn push(&mut self, states: &[Option<VState<S>>], k: usize, item: usize) {
        let spread = states[item].as_ref().map_or(S::default(), |s| s.spread);
        self.heap.push((spread, item));
        let last = self.heap.len() - 1;
        self.sift_down(states, k, 0, last);
    }

    fn pop(&mut self, states: &[Option<VState<S>>], k: usize) -> Option<usize> {
        let last = self.heap.pop()?;
        if self.heap.is_empty() {
            return Some(last.1);
        }
        let ret = self.heap[0];
        self.heap[0] = last;
        self.sift_up(states, k, 0);
        Some(ret.1)
    }
}

/// verl's `karmarkar_karp(seqlen_list, k_partitions, equal_size)`: `k` lists of indices in
/// verl's order (sets by descending (sum, count, items); members in insertion order).
pub fn karmarkar_karp(seqlens: &[i64], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, PyError> {
    let n = seqlens.len();
    if equal_size {
        if k == 0 {
            return Err(PyError::ZeroDivisionError("integer modulo by zero".into()));
        }
        if n % k as usize != 0 {
            return Err(PyError::AssertionError(alloc::format!("{n} % {k} != 0")));
        }
    } else if k == 0 && n > 0 {
        return Err(index_error());
    }
    if n == 0 {
        return Err(index_error());
    }
    check_k(k)?;
    // Exact in i64 when no partial sum can overflow it; i128 otherwise.
    let abs_total: i128 = seqlens.iter().map(|&s| i128::from(s).abs()).sum();
    if abs_total <= i128::from(i64::MAX) {
        kk_with::<i64>(seqlens, k as usize, equal_size)
    } else {
        kk_with::<i128>(seqlens, k as usize, equal_size)
    }
}

fn kk_with<S: Sum>(seqlens: &[i64], ku: usize, equal_size: bool) -> Result<Vec<Vec<u32>>, PyError> {
    let mut sorted: Vec<(i64, i64)> = seqlens.iter().enumerate().map(|(i, &s)| (s, i as i64)).collect();
    sorted.sort_unstable();
    let single = |s: i64, i: i64| VSet { sum: S::of(s), items: alloc::vec![i as u32] };
    let mut states: Vec<Option<VState<S>>> = Vec::new();
    let mut heap = PyHeap { heap: Vec::new() };
    if equal_size {
        for run in sorted.chunks(ku) {
            states.push(Some(VState::new(run.iter().map(|&(s, i)| single(s, i)).collect(), ku)));
            heap.push(&states, ku, states.len() - 1);
        }
    } else {
        for &(s, i) in &sorted {
            states.push(Some(VState::new(alloc::vec![single(s, i)], ku)));
            heap.push(&states, ku, states.len() - 1);
        }
    }
    while heap.heap.len() > 1 {
        let (Some(a), Some(b)) = (heap.pop(&states, ku), heap.pop(&states, ku)) else { break };
        let (Some(sa), Some(sb)) = (states[a].take(), states[b].take()) else { break };
        states[a] = Some(sa.merge(sb, ku));
        heap.push(&states, ku, a);
    }
    let Some(final_state) = heap.heap.first().and_then(|&(_, i)| states[i].as_ref()) else {
        return Err(index_error());
    };
    Ok((0..ku).map(|i| final_state.at(i, ku).map_or_else(Vec::new, |s| s.items.clone())).collect())
}

/// verl's `greedy_partition(seqlen_list, k_partitions, equal_size)`: items in input order,
/// each to the lowest-index partition with the strictly smallest sum; `equal_size` adds a
/// bias of `sum + 1` to every item.
pub fn greedy_partition(seqlens: &[i64], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, PyError> {
    let n = seqlens.len();
    if k == 0 {
        if n == 0 {
            return Ok(Vec::new());
        }
        return Err(PyError::TypeError("list indices must be integers or slices, not NoneType".into()));
    }
    check_k(k)?;
    let bias: i128 = if equal_size { seqlens.iter().map(|&s| i128::from(s)).sum::<i128>() + 1 } else { 0 };
    let mut parts: Vec<Vec<u32>> = alloc::vec![Vec::new(); k as usize];
    let mut heap: BinaryHeap<Reverse<(i128, u32)>> = (0..k).map(|j| Reverse((0i128, j))).collect();
    for (i, &s) in seqlens.iter().enumerate() {
        let Some(Reverse((sum, j))) = heap.pop() else { break };
        parts[j as usize].push(i as u32);
        heap.push(Reverse((sum + i128::from(s) + bias, j)));
    }
    if equal_size {
        for p in &parts {
            if p.len() * k as usize != n {
                return Err(PyError::AssertionError(alloc::format!("{} * {k} != {n}", p.len())));
            }
        }
    }
    Ok(parts)
}

/// verl's `get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size)`: KK, then
/// every partition must be non-empty and is sorted ascending; partition order is kept.
pub fn get_seqlen_balanced_partitions(seqlens: &[i64], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, PyError> {
    let n = seqlens.len();
    if n < k as usize {
        return Err(PyError::AssertionError(alloc::format!("number of items:[{n}] < k_partitions:[{k}]")));
    }
    let mut parts = karmarkar_karp(seqlens, k, equal_size)?;
    for (i, p) in parts.iter_mut().enumerate() {
        if p.is_empty() {
            return Err(PyError::AssertionError(alloc::format!("the {i}-th partition is empty")));
        }
        p.sort_unstable();
    }
    Ok(parts)
}

/// The integer figures of verl's `log_seqlen_unbalance(seqlen_list, partitions, prefix)`.
/// verl's `mean` is `total / k` in Python float division; the other keys are
/// `min`, `max`, `minmax_diff = max - min`, `balanced_min`, `balanced_max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqlenUnbalance {
    /// Smallest sum over contiguous chunks of `n / k` items of the input order ("before").
    pub min: i128,
    /// Largest such chunk sum.
    pub max: i128,
    /// Smallest partition sum ("after").
    pub balanced_min: i128,
    /// Largest partition sum.
    pub balanced_max: i128,
    /// Sum over all chunks (every item once).
    pub total: i128,
    /// Number of partitions (the divisor of `mean`).
    pub k: usize,
}

/// verl's `log_seqlen_unbalance`: chunk sums of the input order in steps of `n // k`, and
/// partition sums (indices follow Python's rules: negative indices count from the end).
/// Fails like verl ([`UnbalanceError`]): `ZeroDivisionError` with no partitions,
/// `ValueError("range() arg 3 must not be zero")` when `n < k`, `IndexError` for an index
/// outside the list.
pub fn log_seqlen_unbalance(seqlens: &[i64], partitions: &[Vec<i64>]) -> Result<SeqlenUnbalance, UnbalanceError> {
    let n = seqlens.len();
    let k = partitions.len();
    if k == 0 {
        return Err(UnbalanceError::ZeroDivision("integer division or modulo by zero".into()));
    }
    let chunk = n / k;
    if chunk == 0 {
        return Err(UnbalanceError::Value("range() arg 3 must not be zero".into()));
    }
    let (mut min, mut max, mut total): (Option<i128>, Option<i128>, i128) = (None, None, 0);
    for c in seqlens.chunks(chunk) {
        let s: i128 = c.iter().map(|&x| i128::from(x)).sum();
        min = Some(min.map_or(s, |m| m.min(s)));
        max = Some(max.map_or(s, |m| m.max(s)));
        total += s;
    }
    let mut sums = Vec::with_capacity(k);
    for p in partitions {
        let mut s: i128 = 0;
        for &i in p {
            let idx = if i < 0 { i.checked_add(n as i64) } else { Some(i) };
            match idx.and_then(|j| usize::try_from(j).ok()).filter(|&j| j < n) {
                Some(j) => s += i128::from(seqlens[j]),
                None => return Err(UnbalanceError::Index("list index out of range".into())),
            }
        }
        sums.push(s);
    }
    Ok(SeqlenUnbalance {
        min: min.unwrap_or(0),
        max: max.unwrap_or(0),
        balanced_min: sums.iter().copied().min().unwrap_or(0),
        balanced_max: sums.iter().copied().max().unwrap_or(0),
        total,
        k,
    })
}

/// verl's `log_seqlen_unbalance` figures as a JSON metrics dict holds them: the sums wrapped
/// to 64 bits (two's complement; exact for any batch whose total fits in 63 bits) and the
/// mean of the partition sums.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UnbalanceFigures {
    /// `{prefix}/min`: the smallest chunk sum of the input order.
    pub min: i64,
    /// `{prefix}/max`: the largest chunk sum.
    pub max: i64,
    /// `{prefix}/minmax_diff`: `max − min`.
    pub minmax_diff: i64,
    /// `{prefix}/balanced_min`: the smallest partition sum.
    pub balanced_min: i64,
    /// `{prefix}/balanced_max`: the largest partition sum.
    pub balanced_max: i64,
    /// `{prefix}/mean`: every item's sum over the number of partitions.
    pub mean: f64,
}

impl SeqlenUnbalance {
    /// The figures in 64 bits, as the CLI's JSON and the WIT interface give them.
    pub fn figures(&self) -> UnbalanceFigures {
        UnbalanceFigures {
            min: self.min as i64,
            max: self.max as i64,
            minmax_diff: (self.max - self.min) as i64,
            balanced_min: self.balanced_min as i64,
            balanced_max: self.balanced_max as i64,
            mean: self.total as f64 / self.k as f64,
        }
    }
}

impl UnbalanceError {
    /// The Python exception's class name (`ZeroDivisionError`, `ValueError`, `IndexError`).
    pub fn type_name(&self) -> &'static str {
        match self {
            UnbalanceError::ZeroDivision(_) => "ZeroDivisionError",
            UnbalanceError::Value(_) => "ValueError",
            UnbalanceError::Index(_) => "IndexError",
        }
    }

    /// The exception's message (`str(exc)`).
    pub fn message(&self) -> &str {
        match self {
            UnbalanceError::ZeroDivision(m) | UnbalanceError::Value(m) | UnbalanceError::Index(m) => m,
        }
    }
}

/// A failure of [`log_seqlen_unbalance`], named by the Python exception verl raises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnbalanceError {
    /// `ZeroDivisionError` (no partitions).
    ZeroDivision(String),
    /// `ValueError` (fewer items than partitions: a zero chunk size).
    Value(String),
    /// `IndexError` (a partition names an index outside the list).
    Index(String),
}
