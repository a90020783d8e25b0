//! slime's `first_fit_pack` and `expand_bins_by_splitting` (`slime/utils/seqlen_balancing.py`).

use alloc::collections::BinaryHeap;
use alloc::vec::Vec;
use core::cmp::Reverse;

use super::SlimeError;

/// slime's `first_fit_pack(total_lengths, max_tokens_per_bin)`: each length, in input order
/// (no sorting), goes to the first bin whose sum plus the length is ≤ the cap, else opens a
/// new bin. A bin already over the cap stays a candidate (a zero length fits wherever the
/// sum is ≤ the cap). Bins in creation order, members in insertion order. Sums are exact
/// (`i128`), so any `i64` input behaves as Python ints do. O(n log n).
pub fn first_fit_pack(lengths: &[i64], max_tokens_per_bin: i64) -> Vec<Vec<u32>> {
    first_fit(lengths, i128::from(max_tokens_per_bin))
}

pub(super) fn first_fit(lengths: &[i64], cap: i128) -> Vec<Vec<u32>> {
    let n = lengths.len();
    // A min-tree over the bin sums (unused leaves at +∞): the first bin with
    // sum ≤ cap − length is the leftmost leaf at most that value.
    let size = n.max(1).next_power_of_two();
    let mut tree: Vec<i128> = alloc::vec![i128::MAX; 2 * size];
    let mut bins: Vec<Vec<u32>> = Vec::new();
    for (idx, &len) in lengths.iter().enumerate() {
        let limit = cap - i128::from(len);
        let j = if tree[1] <= limit {
            let mut node = 1;
            while node < size {
                node = if tree[2 * node] <= limit { 2 * node } else { 2 * node + 1 };
            }
            node - size
        } else {
            bins.push(Vec::new());
            tree[size + bins.len() - 1] = 0;
            bins.len() - 1
        };
        bins[j].push(idx as u32);
        let mut node = size + j;
        tree[node] += i128::from(len);
        while node > 1 {
            node /= 2;
            tree[node] = tree[2 * node].min(tree[2 * node + 1]);
        }
    }
    bins
}

// ---------------------------------------------------------------------------------------
// expand_bins_by_splitting
// ---------------------------------------------------------------------------------------

/// slime's `_split_bin_by_tokens`: members by length descending (stable: equal lengths keep
/// their order in the bin), each to the left half while its sum is ≤ the right's.
fn split_bin(bin: &[u32], lengths: &[i64]) -> (Vec<u32>, Vec<u32>) {
    let mut order = bin.to_vec();
    order.sort_by_key(|&i| Reverse(lengths[i as usize]));
    let (mut left, mut right) = (Vec::new(), Vec::new());
    let (mut s0, mut s1) = (0i128, 0i128);
    for i in order {
        if s0 <= s1 {
            left.push(i);
            s0 += i128::from(lengths[i as usize]);
        } else {
            right.push(i);
            s1 += i128::from(lengths[i as usize]);
        }
    }
    (left, right)
}

fn bin_sum(bin: &[u32], lengths: &[i64]) -> i128 {
    bin.iter().map(|&i| i128::from(lengths[i as usize])).sum()
}

/// slime's `expand_bins_by_splitting(bins, target_count, lengths)` (in place in slime; here
/// the bins after the call): while there are fewer than `target_count` bins, the bin with
/// the largest (token sum, position) among those with at least two members is split in
/// two (`split_bin`); the left half stays at its position, the right half is appended.
/// Stops early when only bins of one (or no) member are left.
///
/// Errors (`invalid-argument`): a member of a bin that would be split is not an index of
/// `lengths` (slime: `IndexError`).
pub fn expand_bins_by_splitting(
    bins: Vec<Vec<u32>>,
    target_count: i64,
    lengths: &[i64],
) -> Result<Vec<Vec<u32>>, SlimeError> {
    expand(bins, i128::from(target_count), lengths)
}

pub(super) fn expand(
    mut bins: Vec<Vec<u32>>,
    target_count: i128,
    lengths: &[i64],
) -> Result<Vec<Vec<u32>>, SlimeError> {
    if (bins.len() as i128) >= target_count {
        return Ok(bins);
    }
    for b in bins.iter().filter(|b| b.len() > 1) {
        if let Some(&i) = b.iter().find(|&&i| i as usize >= lengths.len()) {
            return Err(bad!("bins: member {i} is not an index of lengths ({} entries)", lengths.len()));
        }
    }
    let mut heap: BinaryHeap<(i128, usize)> =
        bins.iter().enumerate().filter(|(_, b)| b.len() > 1).map(|(i, b)| (bin_sum(b, lengths), i)).collect();
    while (bins.len() as i128) < target_count {
        let Some((_, idx)) = heap.pop() else { break };
        let (left, right) = split_bin(&bins[idx], lengths);
        if left.len() > 1 {
            heap.push((bin_sum(&left, lengths), idx));
        }
        if right.len() > 1 {
            heap.push((bin_sum(&right, lengths), bins.len()));
        }
        bins[idx] = left;
        bins.push(right);
    }
    Ok(bins)
}
