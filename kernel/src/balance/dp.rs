//! A global batch over data-parallel ranks ([`balance_dp`]): equal-size Karmarkar–Karp on
//! costs plus swap refinement, over samples or groups, optionally mini-batch by mini-batch.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;

use super::{Cost, costs_with_extra};
use crate::partition::{PartitionMethod, PartitionOptions, partition};
use crate::{Error, checked_len, checked_sum, invalid};

/// Options of [`balance_dp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DpOptions<'a> {
    /// The cost balanced across ranks.
    pub cost: Cost,
    /// A group label per sample: samples with the same label go to the same rank (e.g. the
    /// samples of one prompt). `None`: every sample is its own group.
    pub groups: Option<&'a [u32]>,
    /// Balance each run of `minibatch_size` consecutive samples separately (verl's
    /// `keep_minibatch`): every rank gets `minibatch_size / dp` samples of each mini-batch,
    /// and a rank's slice lists them mini-batch by mini-batch. `None`: the whole batch.
    pub minibatch_size: Option<u32>,
    /// Every rank gets the same number of samples (default). With groups of different
    /// sizes this needs `false`.
    pub equal_count: bool,
    /// An extra cost per sample on top of `cost` (cost units: e.g. a multimodal sample's
    /// image tokens); `None`: none. [`plan`](super::plan) also balances micro-batches with it.
    pub extra_costs: Option<&'a [u64]>,
}

impl Default for DpOptions<'_> {
    fn default() -> Self {
        Self { cost: Cost::TOKENS, groups: None, minibatch_size: None, equal_count: true, extra_costs: None }
    }
}

/// A global batch reordered over `dp` ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Balance {
    /// `dp + 1` offsets into `order`: rank `r` gets `order[offsets[r]..offsets[r + 1]]`.
    pub offsets: Vec<u32>,
    /// The permutation of the input: rank after rank; inside a rank ascending by index
    /// (mini-batch by mini-batch with `minibatch_size`).
    pub order: Vec<u32>,
    /// Tokens of each rank.
    pub tokens: Vec<u64>,
    /// Cost of each rank.
    pub costs: Vec<u64>,
    /// `max(ceil(total cost / dp), costliest group)`: no assignment has a lighter heaviest rank.
    pub cost_lower_bound: u64,
}

impl Balance {
    /// Number of ranks.
    pub fn dp(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The input indices of rank `r`.
    pub fn rank(&self, r: usize) -> &[u32] {
        &self.order[self.offsets[r] as usize..self.offsets[r + 1] as usize]
    }
}

/// Reorders a global batch over `dp` ranks so that the heaviest rank's cost is as small as
/// the heuristic finds (equal-size Karmarkar–Karp on costs, then swaps).
///
/// Errors (`invalid-argument`): `dp` = 0; empty `lengths`; fewer samples (or groups) than
/// ranks; `groups` of the wrong length; `equal_count` with n (or the mini-batch size) not a
/// multiple of `dp`, or with groups of different sizes or a group count not a multiple of
/// `dp`; `minibatch_size` = 0, not dividing n, or not a multiple of `dp`; a group spanning
/// two mini-batches; a cost overflowing `u64`.
pub fn balance_dp(lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Result<Balance, Error> {
    let n = checked_len("lengths", lengths.len())?;
    if dp == 0 {
        return invalid!("dp must be at least 1 (got 0)");
    }
    crate::check_count("dp", dp)?;
    if n == 0 {
        return invalid!("lengths must not be empty (a batch needs at least one sequence)");
    }
    let costs = costs_with_extra(lengths, &options.cost, options.extra_costs)?;
    checked_sum("lengths", lengths.iter().copied())?;
    let total_cost = checked_sum("costs", costs.iter().copied())?;
    let mb = match options.minibatch_size {
        None => n,
        Some(0) => return invalid!("minibatch_size must be at least 1 (got 0)"),
        Some(m) if n % m != 0 => {
            return invalid!(
                "the batch size n = {n} is not a multiple of minibatch_size = {m}: the last {} samples would be \
                 left out",
                n % m
            );
        }
        Some(m) if options.equal_count && m % dp != 0 => {
            return invalid!("minibatch_size = {m} must be a multiple of dp = {dp} for equal sample counts per rank");
        }
        Some(m) => m,
    };
    let units = units(n, options.groups)?;
    // Split the units by mini-batch (a unit must lie inside one).
    let mut per_mb: Vec<Vec<usize>> = alloc::vec![Vec::new(); (n / mb) as usize];
    for (u, members) in units.iter().enumerate() {
        let b = members[0] / mb;
        if let Some(&bad) = members.iter().find(|&&i| i / mb != b) {
            return invalid!(
                "groups: samples {} and {bad} share a group but lie in different mini-batches of minibatch_size = {mb}",
                members[0]
            );
        }
        per_mb[b as usize].push(u);
    }
    let mut ranks: Vec<Vec<u32>> = alloc::vec![Vec::new(); dp as usize];
    let mut rank_cost = alloc::vec![0u64; dp as usize];
    let mut costliest = 0u64;
    for us in &per_mb {
        let weights: Vec<u64> = us.iter().map(|&u| units[u].iter().map(|&i| costs[i as usize]).sum()).collect();
        costliest = costliest.max(weights.iter().copied().max().unwrap_or(0));
        if us.len() < dp as usize {
            return invalid!(
                "dp = {dp} ranks need at least {dp} {} per {}, got {}",
                if options.groups.is_some() { "groups" } else { "samples" },
                if options.minibatch_size.is_some() { "mini-batch" } else { "batch" },
                us.len()
            );
        }
        let equal_size = options.equal_count && equal_units(&units, us, dp)?;
        let p = partition(&weights, dp, &PartitionOptions { method: PartitionMethod::Kk, equal_size, refine: true })?;
        // The heaviest part of this mini-batch goes to the lightest rank so far (ties: lower rank).
        let mut free: BTreeSet<(u64, u32)> = (0..dp).map(|r| (rank_cost[r as usize], r)).collect();
        for g in 0..p.k() {
            let Some((_, r)) = free.pop_first() else { break };
            let mut members: Vec<u32> =
                p.group(g).iter().flat_map(|&u| units[us[u as usize]].iter().copied()).collect();
            members.sort_unstable();
            rank_cost[r as usize] += p.sums[g];
            ranks[r as usize].extend(members);
        }
    }
    let (offsets, order) = crate::flatten(&ranks);
    let tokens = ranks.iter().map(|r| r.iter().map(|&i| lengths[i as usize]).sum()).collect();
    let cost_lower_bound = total_cost.div_ceil(u64::from(dp)).max(costliest);
    Ok(Balance { offsets, order, tokens, costs: rank_cost, cost_lower_bound })
}

/// The balancing units: one per sample, or one per group label (members ascending, units
/// ordered by their first member).
fn units(n: u32, groups: Option<&[u32]>) -> Result<Vec<Vec<u32>>, Error> {
    let Some(labels) = groups else {
        return Ok((0..n).map(|i| alloc::vec![i]).collect());
    };
    if labels.len() != n as usize {
        return invalid!("groups has {} labels but lengths has {n} entries; give one label per sample", labels.len());
    }
    let mut by_label: Vec<(u32, u32)> = labels.iter().enumerate().map(|(i, &l)| (l, i as u32)).collect();
    by_label.sort_unstable();
    let mut units: Vec<Vec<u32>> = Vec::new();
    for (j, &(l, i)) in by_label.iter().enumerate() {
        if j > 0 && by_label[j - 1].0 == l {
            if let Some(u) = units.last_mut() {
                u.push(i);
            }
        } else {
            units.push(alloc::vec![i]);
        }
    }
    units.sort_unstable_by_key(|u| u[0]);
    Ok(units)
}

/// Whether the units `us` allow equal sample counts per rank: all the same size and their
/// number a multiple of `dp`. An error says why not.
fn equal_units(units: &[Vec<u32>], us: &[usize], dp: u32) -> Result<bool, Error> {
    let size = units[us[0]].len();
    if let Some(&u) = us.iter().find(|&&u| units[u].len() != size) {
        return invalid!(
            "groups of different sizes ({size} and {}) cannot give every rank the same number of samples; \
             set equal_count to false",
            units[u].len()
        );
    }
    if us.len() % dp as usize != 0 {
        return invalid!(
            "{} {} is not a multiple of dp = {dp}: equal sample counts per rank are impossible; \
             set equal_count to false or change the batch size",
            us.len(),
            if size > 1 { "groups" } else { "samples" }
        );
    }
    Ok(true)
}
