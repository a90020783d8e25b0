//! One rank's batch into dynamic micro-batches under a hard token cap ([`micro_batches`]):
//! the count the cap needs, then the cost balanced across that many micro-batches.

use alloc::collections::BTreeSet;
use alloc::vec::Vec;
use core::cmp::Reverse;

use super::{Cost, costs_with_extra};
use crate::order::{Order, apply_order};
use crate::pack::{PackOptions, pack};
use crate::refine::{TokenCap, refine};
use crate::sort::sorted_desc;
use crate::{Error, checked_len, checked_sum, invalid};

crate::__options! { $ __micro_options;
/// Options of [`micro_batches`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroOptions {
    /// Hard cap on the tokens of every micro-batch (≥ 1).
    pub capacity: u64,
    /// The cost balanced across micro-batches.
    pub cost: Cost,
    /// At least this many micro-batches (0 and 1 mean no minimum).
    pub min_count: u32,
    /// The count is rounded up to a multiple of this (≥ 1; virtual pipeline stages).
    pub divisible_by: u32,
    /// Exactly this many micro-batches (e.g. the count agreed by every DP rank). Must be a
    /// multiple of `divisible_by`, at least `min_count`, at most the number of sequences.
    pub count: Option<u32>,
    /// The order of the micro-batches.
    pub order: Order,
}
}

impl MicroOptions {
    /// Options with cap `capacity`, token cost, no minimum, no rounding, no forced
    /// count, input order.
    pub fn new(capacity: u64) -> Self {
        Self { capacity, cost: Cost::TOKENS, min_count: 0, divisible_by: 1, count: None, order: Order::None }
    }
}

/// Micro-batches of one batch, in flat form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MicroBatches {
    /// `count + 1` offsets into `indices`.
    pub offsets: Vec<u32>,
    /// Input indices, micro-batch after micro-batch (each micro-batch ascending).
    pub indices: Vec<u32>,
    /// Tokens of each micro-batch (each ≤ `capacity`).
    pub tokens: Vec<u64>,
    /// Cost of each micro-batch.
    pub costs: Vec<u64>,
    /// `restore[i]` is the position of input `i` in `indices`: outputs computed in
    /// micro-batch order are put back in input order by `outputs[restore]`.
    pub restore: Vec<u32>,
    /// `max(1, ceil(total tokens / capacity))`: no plan has fewer micro-batches.
    pub lower_bound: u32,
    /// The count this batch needs on its own: the smallest count found under the cap,
    /// raised to `min_count` and rounded up to `divisible_by` (what `count` overrides).
    pub required: u32,
}

impl MicroBatches {
    /// Number of micro-batches.
    pub fn count(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The input indices of micro-batch `b`.
    pub fn batch(&self, b: usize) -> &[u32] {
        &self.indices[self.offsets[b] as usize..self.offsets[b + 1] as usize]
    }
}

/// Splits one batch (`lengths`, tokens) into micro-batches of at most
/// `options.capacity` tokens, balancing `options.cost` across them.
///
/// Errors: `invalid-argument` for empty `lengths`, `capacity` = 0, `divisible_by` = 0,
/// a cost overflowing `u64`, `count` = 0 / not a multiple of `divisible_by` / below
/// `min_count`, or a count (forced, or raised by `min_count`/`divisible_by`) above the number
/// of sequences (micro-batches are never empty); `infeasible` for a sequence longer than the
/// cap (never split) or a forced count the cap does not allow.
pub fn micro_batches(lengths: &[u64], options: &MicroOptions) -> Result<MicroBatches, Error> {
    micro_batches_with_extra(lengths, None, options)
}

/// [`micro_batches`] where sample `i` also costs `extra[i]` (cost units; `None`: nothing):
/// the cap still counts tokens, the balance counts costs. Errors: those of
/// [`micro_batches`]; `extra` not one per sample, or a cost plus extra above `u64`.
pub fn micro_batches_with_extra(
    lengths: &[u64],
    extra: Option<&[u64]>,
    options: &MicroOptions,
) -> Result<MicroBatches, Error> {
    let costs = micro_checks(lengths, extra, options)?;
    let need = needed_count(lengths, options)?;
    let caps = [options.capacity];
    plan_micro(lengths, &costs, options, need, &Caps { sizes: lengths, caps: &caps })
}

/// Per-micro-batch caps in `r = caps.len()` resources, tokens first: sequence `i`'s sizes
/// are `sizes[i·r..(i+1)·r]` (with tokens only, `sizes` is the lengths).
pub(super) struct Caps<'a> {
    pub(super) sizes: &'a [u64],
    pub(super) caps: &'a [u64],
}

impl Caps<'_> {
    fn r(&self) -> usize {
        self.caps.len()
    }

    /// Every group's loads, group by group.
    fn loads(&self, groups: &[Vec<u32>]) -> Vec<u64> {
        let r = self.r();
        let mut loads = alloc::vec![0u64; groups.len() * r];
        for (g, members) in groups.iter().enumerate() {
            for &i in members {
                for k in 0..r {
                    loads[g * r + k] += self.sizes[i as usize * r + k];
                }
            }
        }
        loads
    }
}

/// [`micro_batches`] after validation, given what the batch needs under the caps.
pub(super) fn plan_micro(
    lengths: &[u64],
    costs: &[u64],
    options: &MicroOptions,
    need: Need,
    caps: &Caps<'_>,
) -> Result<MicroBatches, Error> {
    let m = match options.count {
        Some(c) => {
            check_count(c, options, lengths.len() as u32, need.lower_bound)?;
            c
        }
        None => need.required,
    };
    let (lower_bound, required) = (need.lower_bound, need.required);
    let groups = distribute(costs, caps, m, need)?;
    Ok(finish(lengths, costs, groups, options.order, lower_bound, required))
}

/// Validates the arguments of [`micro_batches`] and returns the per-item costs.
pub(super) fn micro_checks(lengths: &[u64], extra: Option<&[u64]>, options: &MicroOptions) -> Result<Vec<u64>, Error> {
    let n = checked_len("lengths", lengths.len())?;
    if n == 0 {
        return invalid!("lengths must not be empty (a batch needs at least one sequence)");
    }
    let cap = options.capacity;
    if cap == 0 {
        return invalid!("capacity must be at least 1 (got 0)");
    }
    if options.divisible_by == 0 {
        return invalid!("divisible_by must be at least 1 (got 0)");
    }
    crate::check_count("divisible_by", options.divisible_by)?;
    crate::check_count("min_count", options.min_count)?;
    if let Some(c) = options.count {
        crate::check_count("count", c)?;
    }
    if let Some((i, &l)) = lengths.iter().enumerate().find(|&(_, &l)| l > cap) {
        return Err(Error::Infeasible(alloc::format!(
            "sequence {i} has {l} tokens, more than capacity = {cap}; sequences are never split"
        )));
    }
    checked_sum("lengths", lengths.iter().copied())?;
    let costs = costs_with_extra(lengths, &options.cost, extra)?;
    // A micro-batch's cost is a sum of item costs: none may wrap.
    checked_sum("costs", costs.iter().copied())?;
    Ok(costs)
}

/// What a batch needs under the cap, before a forced count.
pub(super) struct Need {
    pub(super) lower_bound: u32,
    /// Best-fit decreasing's bins: a feasible assignment with `bins.len()` micro-batches.
    pub(super) bins: Vec<Vec<u32>>,
    pub(super) required: u32,
}

pub(super) fn needed_count(lengths: &[u64], options: &MicroOptions) -> Result<Need, Error> {
    let n = lengths.len() as u32;
    let cap = options.capacity;
    let opts = PackOptions::new(cap);
    let packing = pack(lengths, &opts)?;
    let bins: Vec<Vec<u32>> = (0..packing.bins()).map(|b| packing.bin(b).to_vec()).collect();
    // Every length is ≤ cap, so ceil(total / cap) ≤ n fits in u32.
    let lower_bound = packing.lower_bound.max(1) as u32;
    required_count(lower_bound, bins, n, options)
}

/// The count a batch of `n` sequences needs on its own: `bins` (a feasible assignment) raised
/// to `min_count` and rounded up to `divisible_by`.
pub(super) fn required_count(
    lower_bound: u32,
    bins: Vec<Vec<u32>>,
    n: u32,
    options: &MicroOptions,
) -> Result<Need, Error> {
    let raised = (bins.len() as u32).max(options.min_count);
    let d = options.divisible_by;
    let required = match raised.div_ceil(d).checked_mul(d) {
        Some(r) if r <= n => r,
        _ => {
            if options.count.is_none() {
                return if raised > n {
                    invalid!(
                        "min_count = {} exceeds the number of sequences n = {n}; micro-batches are never empty",
                        options.min_count
                    )
                } else {
                    invalid!(
                        "divisible_by = {d} rounds {raised} micro-batches up past the number of sequences n = {n}; \
                         micro-batches are never empty"
                    )
                };
            }
            // With a forced count, `required` is only reported; saturate it.
            raised.div_ceil(d).saturating_mul(d)
        }
    };
    Ok(Need { lower_bound, bins, required })
}

fn check_count(c: u32, options: &MicroOptions, n: u32, lower_bound: u32) -> Result<(), Error> {
    if c == 0 {
        return invalid!("count must be at least 1 (got 0)");
    }
    if c > n {
        return invalid!("count = {c} exceeds the number of sequences n = {n}; micro-batches are never empty");
    }
    if c % options.divisible_by != 0 {
        return invalid!("count = {c} must be a multiple of divisible_by = {}", options.divisible_by);
    }
    if c < options.min_count {
        return invalid!("count = {c} is below min_count = {}", options.min_count);
    }
    if c < lower_bound {
        return Err(Error::Infeasible(alloc::format!(
            "count = {c} is below what capacity = {} allows: the tokens need at least {lower_bound} \
             micro-batches",
            options.capacity
        )));
    }
    Ok(())
}

/// Assigns the items to exactly `m` non-empty groups within the caps with balanced costs:
/// cost-greedy first fit (LPT restricted to groups with room); if that gets stuck and `m` is
/// at least best-fit decreasing's count, BFD's bins (plus empty groups); then cap-keeping
/// refinement and filling of any empty group.
fn distribute(costs: &[u64], caps: &Caps<'_>, m: u32, need: Need) -> Result<Vec<Vec<u32>>, Error> {
    let m_us = m as usize;
    let cap = caps.caps[0];
    let mut groups = match lpt_fit(costs, caps, m_us) {
        Some(g) => g,
        None if m_us >= need.bins.len() => {
            let mut g = need.bins;
            g.resize(m_us, Vec::new());
            g
        }
        None => {
            return Err(Error::Infeasible(alloc::format!(
                "no assignment into count = {m} micro-batches of at most {cap} tokens was found (lower bound {}, \
                 best-fit decreasing needs {})",
                need.lower_bound,
                need.bins.len()
            )));
        }
    };
    let mut tc = TokenCap { sizes: caps.sizes, caps: caps.caps, loads: caps.loads(&groups) };
    refine(costs, &mut groups, false, Some(&mut tc));
    fill_empty(costs, &mut groups);
    Ok(groups)
}

/// How many of the cheapest groups LPT-fit probes for room before it asks the least-loaded one.
const PROBES: usize = 64;

/// Items by length descending (so cost descending without extra costs: costs are monotone
/// in the length), each to the cheapest group with room in every cap (ties: lower token
/// load, then lower group number); `None` when an item fits nowhere.
fn lpt_fit(costs: &[u64], caps: &Caps<'_>, m: usize) -> Option<Vec<Vec<u32>>> {
    let r = caps.r();
    let owned: Vec<u64>;
    let lengths: &[u64] = if r == 1 {
        caps.sizes
    } else {
        owned = caps.sizes.iter().step_by(r).copied().collect();
        &owned
    };
    let mut groups: Vec<Vec<u32>> = alloc::vec![Vec::new(); m];
    let mut cost = alloc::vec![0u64; m];
    let mut loads = alloc::vec![0u64; m * r];
    let mut by_cost: BTreeSet<(u64, u64, u32)> = (0..m as u32).map(|g| (0, 0, g)).collect();
    let mut by_load: BTreeSet<(u64, u32)> = (0..m as u32).map(|g| (0, g)).collect();
    for i in sorted_desc(lengths) {
        let len = lengths[i as usize];
        let row = &caps.sizes[i as usize * r..(i as usize + 1) * r];
        let fits = |g: u32| (0..r).all(|k| loads[g as usize * r + k] + row[k] <= caps.caps[k]);
        let g = match by_cost.iter().take(PROBES).map(|e| e.2).find(|&g| fits(g)) {
            Some(g) => g,
            None => by_load.first().map(|e| e.1).filter(|&g| fits(g))?,
        };
        let gu = g as usize;
        let t = gu * r;
        by_cost.remove(&(cost[gu], loads[t], g));
        by_load.remove(&(loads[t], g));
        cost[gu] += costs[i as usize];
        for (k, &s) in row.iter().enumerate() {
            loads[t + k] += s;
        }
        debug_assert_eq!(row[0], len);
        groups[gu].push(i);
        by_cost.insert((cost[gu], loads[t], g));
        by_load.insert((loads[t], g));
    }
    Some(groups)
}

/// Gives every empty group one item: the cheapest item of the group with the most items
/// (ties: the lower group number). Needs `m ≤ n`, which the callers check.
fn fill_empty(costs: &[u64], groups: &mut [Vec<u32>]) {
    for e in 0..groups.len() {
        if !groups[e].is_empty() {
            continue;
        }
        let Some(donor) =
            (0..groups.len()).filter(|&g| groups[g].len() > 1).max_by_key(|&g| (groups[g].len(), Reverse(g)))
        else {
            return;
        };
        let Some((pos, _)) = groups[donor].iter().enumerate().min_by_key(|&(_, &i)| (costs[i as usize], i)) else {
            return;
        };
        let item = groups[donor].swap_remove(pos);
        groups[e].push(item);
    }
}

/// Sorts members, orders the micro-batches by `order`, and computes the figures.
fn finish(
    lengths: &[u64],
    costs: &[u64],
    mut groups: Vec<Vec<u32>>,
    order: Order,
    lower_bound: u32,
    required: u32,
) -> MicroBatches {
    for g in &mut groups {
        g.sort_unstable();
    }
    let cost_of = |g: &Vec<u32>| g.iter().map(|&i| costs[i as usize]).sum::<u64>();
    let first = |g: &Vec<u32>| g.first().copied().unwrap_or(u32::MAX);
    groups = apply_order(groups, order, cost_of, first);
    let (offsets, indices) = crate::flatten(&groups);
    let tokens = groups.iter().map(|g| g.iter().map(|&i| lengths[i as usize]).sum()).collect();
    let bin_costs = groups.iter().map(cost_of).collect();
    let mut restore = alloc::vec![0u32; lengths.len()];
    for (pos, &i) in indices.iter().enumerate() {
        restore[i as usize] = pos as u32;
    }
    MicroBatches { offsets, indices, tokens, costs: bin_costs, restore, lower_bound, required }
}
