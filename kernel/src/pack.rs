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

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use crate::{Error, checked_len, checked_sum, flatten, invalid};

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
}

/// Packs `lengths` into bins of `options.capacity` tokens.
///
/// Errors: `invalid-argument` for empty `lengths`, `capacity == 0`, `align == 0`, an aligned
/// length or a sum overflowing `u64`; `infeasible` for an oversized item under the `error`
/// policy (the message names the first such index, its length and the capacity).
pub fn pack(lengths: &[u64], options: &PackOptions) -> Result<Packing, Error> {
    let n = checked_len("lengths", lengths.len())?;
    let PackOptions { capacity, align, method, oversize } = *options;
    if n == 0 {
        return invalid!("lengths must not be empty");
    }
    if capacity == 0 {
        return invalid!("capacity must be at least 1 token (got 0)");
    }
    if align == 0 {
        return invalid!("align must be at least 1 (got 0)");
    }
    let mut aligned = Vec::with_capacity(lengths.len());
    for (i, &len) in lengths.iter().enumerate() {
        match len.div_ceil(align).checked_mul(align) {
            Some(a) => aligned.push(a),
            None => return invalid!("lengths[{i}] = {len} rounded up to a multiple of align = {align} overflows u64"),
        }
    }
    checked_sum("aligned lengths", aligned.iter().copied())?;
    let mut dropped = Vec::new();
    let mut single = Vec::new();
    for (i, &a) in aligned.iter().enumerate() {
        if a > capacity {
            match oversize {
                OversizePolicy::Error => {
                    return Err(Error::Infeasible(alloc::format!(
                        "lengths[{i}] = {} (aligned to {a} with align = {align}) exceeds capacity = {capacity}; \
                         use oversize single or drop to accept such items",
                        lengths[i]
                    )));
                }
                OversizePolicy::Single => single.push(i as u32),
                OversizePolicy::Drop => dropped.push(i as u32),
            }
        }
    }
    let fits = |i: u32| aligned[i as usize] <= capacity;
    let mut bins: Vec<Vec<u32>> = match method {
        PackMethod::NextFit => next_fit(&aligned, capacity, oversize),
        PackMethod::Bfd | PackMethod::Ffd => {
            let mut order: Vec<u32> = (0..n).collect();
            order.sort_unstable_by(|&a, &b| aligned[b as usize].cmp(&aligned[a as usize]).then(a.cmp(&b)));
            // Oversized items come first in this order; with `single` each opens its own bin.
            let mut bins: Vec<Vec<u32>> = single.iter().map(|&i| alloc::vec![i]).collect();
            let fitting: Vec<u32> = order.into_iter().filter(|&i| fits(i)).collect();
            if method == PackMethod::Bfd {
                best_fit(&aligned, capacity, &fitting, &mut bins);
            } else {
                first_fit(&aligned, capacity, &fitting, &mut bins);
            }
            bins
        }
    };
    for b in &mut bins {
        b.sort_unstable();
    }
    let loads: Vec<u64> = bins.iter().map(|b| b.iter().map(|&i| aligned[i as usize]).sum()).collect();
    let packed = || bins.iter().flatten().map(|&i| i as usize);
    let real_tokens = packed().map(|i| lengths[i]).sum();
    let aligned_tokens = packed().map(|i| aligned[i]).sum();
    let fit_total: u64 = aligned.iter().copied().filter(|&a| a <= capacity).sum();
    let (offsets, indices) = flatten(&bins);
    Ok(Packing {
        offsets,
        indices,
        loads,
        dropped,
        single,
        real_tokens,
        aligned_tokens,
        lower_bound: fit_total.div_ceil(capacity),
    })
}

fn next_fit(aligned: &[u64], capacity: u64, oversize: OversizePolicy) -> Vec<Vec<u32>> {
    let mut bins: Vec<Vec<u32>> = Vec::new();
    let mut current: Vec<u32> = Vec::new();
    let mut used = 0u64;
    for (i, &a) in aligned.iter().enumerate() {
        if a > capacity {
            if oversize == OversizePolicy::Single {
                if !current.is_empty() {
                    bins.push(core::mem::take(&mut current));
                    used = 0;
                }
                bins.push(alloc::vec![i as u32]);
            }
            continue;
        }
        if used + a > capacity && !current.is_empty() {
            bins.push(core::mem::take(&mut current));
            used = 0;
        }
        current.push(i as u32);
        used += a;
    }
    if !current.is_empty() {
        bins.push(current);
    }
    bins
}

/// Best fit over an ordered set of (room, bin): the smallest room ≥ the item, oldest bin on ties.
fn best_fit(aligned: &[u64], capacity: u64, order: &[u32], bins: &mut Vec<Vec<u32>>) {
    let mut open: BTreeSet<(u64, u32)> = BTreeSet::new();
    for &i in order {
        let a = aligned[i as usize];
        let found = open.range((a, 0)..).next().copied();
        let (room, b) = match found {
            Some(entry) => {
                open.remove(&entry);
                entry
            }
            None => {
                bins.push(Vec::new());
                (capacity, (bins.len() - 1) as u32)
            }
        };
        bins[b as usize].push(i);
        let left = room - a;
        if left > 0 {
            open.insert((left, b));
        }
    }
}

/// First fit over a max segment tree of the bins' room: the oldest bin with room ≥ the item.
fn first_fit(aligned: &[u64], capacity: u64, order: &[u32], bins: &mut Vec<Vec<u32>>) {
    // At most one bin per item; leaves beyond the opened bins hold a full capacity.
    let first_bin = bins.len();
    let leaves = order.len().max(1).next_power_of_two();
    let mut tree = alloc::vec![capacity; 2 * leaves];
    for &i in order {
        let a = aligned[i as usize];
        // Descend to the leftmost leaf with room >= a (the root always qualifies: an
        // unopened bin has the full capacity and a <= capacity).
        let mut node = 1;
        while node < leaves {
            node = if tree[2 * node] >= a { 2 * node } else { 2 * node + 1 };
        }
        let leaf = node - leaves;
        let b = first_bin + leaf;
        if b == bins.len() {
            bins.push(Vec::new());
        }
        bins[b].push(i);
        tree[node] -= a;
        let mut up = node / 2;
        while up >= 1 {
            tree[up] = tree[2 * up].max(tree[2 * up + 1]);
            up /= 2;
        }
    }
}
