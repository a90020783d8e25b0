//! Refinement of a partition by pairwise moves and swaps.
//!
//! A step picks a heavier group `hi` and a lighter group `lo` (gap `g = sum(hi) - sum(lo)`)
//! and transfers weight `d` with `0 < d < g`, either by moving one item of `hi` to `lo` (not
//! with `equal_size`) or by swapping an item of `hi` with a lighter item of `lo`. Among the
//! candidates it takes the one with `d` closest to `g / 2` (the first found on ties, scanning
//! `hi`'s members in order). Every accepted step lowers the sum of squared group sums by
//! `2·d·(g − d) > 0`, so the process terminates; it also stops after `8·k + 2048` steps.
//!
//! Pairs tried per step: (heaviest, lightest); if nothing improves, the heaviest against
//! the next 16 lighter groups, then the lightest against the next 16 heavier ones. The
//! step stops when none of them improves or the spread is at most 1.
//!
//! With a [`TokenCap`] (micro-batches), the weights are costs and every group also has a
//! load in each capped resource (tokens, and any further limits) that must stay at or below
//! its cap: a move or swap that would push either group's load over a cap is not a candidate.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

const PARTNERS: usize = 16;

/// Hard per-group limits kept by [`refine`], in `r` resources (tokens first): item `i`'s
/// sizes are `sizes[i·r..(i+1)·r]`, group `g`'s loads `loads[g·r..(g+1)·r]` (the sums of its
/// members' sizes), and no load exceeds its cap after a step that starts within them.
pub(crate) struct TokenCap<'a> {
    /// Each item's size in every resource, item by item.
    pub sizes: &'a [u64],
    /// The largest load a group may reach in each resource (`r` entries).
    pub caps: &'a [u64],
    /// Current loads, group by group.
    pub loads: Vec<u64>,
}

impl TokenCap<'_> {
    /// Whether moving item `out` out of group `g` and item `inc` into it keeps every load
    /// within its cap.
    fn fits(&self, g: usize, inc: Option<u32>, out: Option<u32>) -> bool {
        let r = self.caps.len();
        let size = |i: Option<u32>, k: usize| i.map_or(0, |i| self.sizes[i as usize * r + k]);
        (0..r).all(|k| self.loads[g * r + k] - size(out, k) + size(inc, k) <= self.caps[k])
    }

    /// Moves item `i` from group `from` to group `to`.
    fn shift(&mut self, i: u32, from: usize, to: usize) {
        let r = self.caps.len();
        for k in 0..r {
            let s = self.sizes[i as usize * r + k];
            self.loads[from * r + k] -= s;
            self.loads[to * r + k] += s;
        }
    }
}

pub(crate) fn refine(weights: &[u64], groups: &mut [Vec<u32>], equal_size: bool, mut cap: Option<&mut TokenCap<'_>>) {
    let k = groups.len();
    if k < 2 {
        return;
    }
    let mut sums: Vec<u64> = groups.iter().map(|g| g.iter().map(|&i| weights[i as usize]).sum()).collect();
    let mut order: BTreeSet<(u64, u32)> = sums.iter().enumerate().map(|(g, &s)| (s, g as u32)).collect();
    let max_steps = 8 * k + 2048;
    let mut scratch: Vec<(u64, u32)> = Vec::new();
    for _ in 0..max_steps {
        let (Some(&(s_hi, hi)), Some(&(s_lo, lo))) = (order.last(), order.first()) else { return };
        if s_hi - s_lo <= 1 {
            return;
        }
        let mut done =
            try_pair(weights, groups, &mut sums, &mut order, hi, lo, equal_size, &mut scratch, cap.as_deref_mut());
        if !done {
            let partners: Vec<u32> = order.iter().skip(1).take(PARTNERS).filter(|e| e.0 < s_hi).map(|e| e.1).collect();
            for p in partners {
                if try_pair(weights, groups, &mut sums, &mut order, hi, p, equal_size, &mut scratch, cap.as_deref_mut())
                {
                    done = true;
                    break;
                }
            }
        }
        if !done {
            let partners: Vec<u32> =
                order.iter().rev().skip(1).take(PARTNERS).filter(|e| e.0 > s_lo).map(|e| e.1).collect();
            for p in partners {
                if try_pair(weights, groups, &mut sums, &mut order, p, lo, equal_size, &mut scratch, cap.as_deref_mut())
                {
                    done = true;
                    break;
                }
            }
        }
        if !done {
            return;
        }
    }
}

/// Tries the best move or swap from group `hi` to the lighter group `lo`; applies it and
/// returns `true` if one lowers the larger of the two sums.
#[allow(clippy::too_many_arguments)]
fn try_pair(
    weights: &[u64],
    groups: &mut [Vec<u32>],
    sums: &mut [u64],
    order: &mut BTreeSet<(u64, u32)>,
    hi: u32,
    lo: u32,
    equal_size: bool,
    lo_sorted: &mut Vec<(u64, u32)>,
    mut cap: Option<&mut TokenCap<'_>>,
) -> bool {
    let (h, l) = (hi as usize, lo as usize);
    if sums[h] <= sums[l] {
        return false;
    }
    let gap = sums[h] - sums[l];
    // Distance of a transfer `d` from the ideal gap / 2, doubled to stay in integers:
    // |gap - 2d|. A transfer is valid when 0 < d < gap.
    let score = |d: u64| (gap as u128).abs_diff(2 * d as u128);
    // (score, position in hi, position in lo or usize::MAX for a move)
    let mut best: Option<(u128, usize, usize)> = None;
    let consider = |d: u64, pa: usize, pb: usize, best: &mut Option<(u128, usize, usize)>| {
        if d == 0 || d >= gap {
            return;
        }
        let sc = score(d);
        if best.is_none_or(|b| sc < b.0) {
            *best = Some((sc, pa, pb));
        }
    };
    // Whether a move of `a` (b = None) or a swap of `a` with `b` keeps both loads within the cap.
    let allowed = |a: u32, b: Option<u32>, cap: &Option<&mut TokenCap<'_>>| match cap {
        None => true,
        Some(c) => c.fits(l, Some(a), b) && c.fits(h, b, Some(a)),
    };
    if !equal_size {
        for (pa, &a) in groups[h].iter().enumerate() {
            if allowed(a, None, &cap) {
                consider(weights[a as usize], pa, usize::MAX, &mut best);
            }
        }
    }
    lo_sorted.clear();
    lo_sorted.extend(groups[l].iter().enumerate().map(|(pb, &b)| (weights[b as usize], pb as u32)));
    lo_sorted.sort_unstable();
    if !lo_sorted.is_empty() {
        let half = gap / 2;
        for (pa, &a) in groups[h].iter().enumerate() {
            let wa = weights[a as usize];
            // Want wa - wb ≈ gap / 2, i.e. wb ≈ wa - gap / 2.
            let target = wa.saturating_sub(half);
            let pos = lo_sorted.partition_point(|e| e.0 < target);
            for q in [pos.wrapping_sub(1), pos, pos + 1] {
                if let Some(&(wb, pb)) = lo_sorted.get(q) {
                    if wb < wa && allowed(a, Some(groups[l][pb as usize]), &cap) {
                        consider(wa - wb, pa, pb as usize, &mut best);
                    }
                }
            }
            if best.is_some_and(|b| b.0 <= 1) {
                break;
            }
        }
    }
    let Some((_, pa, pb)) = best else { return false };
    order.remove(&(sums[h], hi));
    order.remove(&(sums[l], lo));
    let a = groups[h].swap_remove(pa);
    sums[h] -= weights[a as usize];
    sums[l] += weights[a as usize];
    if let Some(c) = cap.as_deref_mut() {
        c.shift(a, h, l);
    }
    if pb != usize::MAX {
        let b = groups[l].swap_remove(pb);
        sums[l] -= weights[b as usize];
        sums[h] += weights[b as usize];
        if let Some(c) = cap.as_deref_mut() {
            c.shift(b, l, h);
        }
        groups[h].push(b);
    }
    groups[l].push(a);
    order.insert((sums[h], hi));
    order.insert((sums[l], lo));
    true
}
