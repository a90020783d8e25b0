//! Balancing: cost models, a global batch over data-parallel ranks, one rank's batch into
//! dynamic micro-batches under a hard token cap, and both levels in one plan.
//!
//! - **Cost** ([`Cost`]): a sequence of `len` tokens costs `linear·len + quadratic·len²`
//!   (integers; [`Cost::TOKENS`] = (1, 0), [`Cost::ATTENTION`] = (24576, 1), the workload
//!   verl and ROLL balance). Every decision compares integer costs.
//! - **DP balancing** ([`balance_dp`]): equal-size Karmarkar–Karp on costs plus swap
//!   refinement, over samples or over groups that must stay together, optionally one
//!   mini-batch at a time (verl's `keep_minibatch`, with the mini-batch order kept).
//! - **Micro-batches** ([`micro_batches`]): the count is the smallest the cap allows
//!   (best-fit decreasing, which reaches the bin-packing lower bound on typical inputs),
//!   raised to `min_count`, rounded up to `divisible_by`, or forced by `count`; then the
//!   cost is balanced across that many micro-batches without any exceeding the cap.
//! - **Two-level plan** ([`plan`]): DP balancing, then every rank's micro-batches with one
//!   common count (the largest any rank needs), computed from the global lengths alone, so
//!   every rank derives the same plan without an all-reduce.

use alloc::collections::BTreeSet;
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::Reverse;

use crate::pack::{OversizePolicy, PackMethod, PackOptions, pack};
use crate::partition::{PartitionMethod, PartitionOptions, partition};
use crate::refine::{TokenCap, refine};
use crate::{Error, checked_len, checked_sum, invalid, sorted_desc};

/// The cost of a sequence of `len` tokens: `linear·len + quadratic·len²`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cost {
    /// Coefficient of `len`.
    pub linear: u64,
    /// Coefficient of `len²`.
    pub quadratic: u64,
}

impl Cost {
    /// Tokens: (1, 0).
    pub const TOKENS: Cost = Cost { linear: 1, quadratic: 0 };
    /// verl's and ROLL's attention workload `24576·len + len²` (a 7B dense model).
    pub const ATTENTION: Cost = Cost { linear: 24_576, quadratic: 1 };

    /// The cost of `len` tokens, or `None` if it does not fit in `u64`.
    pub fn of(&self, len: u64) -> Option<u64> {
        let l = u128::from(len);
        let v = u128::from(self.linear).checked_mul(l)?.checked_add(u128::from(self.quadratic).checked_mul(l * l)?)?;
        u64::try_from(v).ok()
    }
}

impl Default for Cost {
    fn default() -> Self {
        Cost::TOKENS
    }
}

/// Per-item costs plus each item's extra cost (`extra[i]`, e.g. a multimodal sample's image
/// tokens in cost units; `None`: no extra), or an `invalid-argument` error naming a list of
/// the wrong length or the first item whose cost overflows `u64`.
pub fn costs_with_extra(lengths: &[u64], cost: &Cost, extra: Option<&[u64]>) -> Result<Vec<u64>, Error> {
    let mut out = costs(lengths, cost)?;
    if let Some(extra) = extra {
        if extra.len() != lengths.len() {
            return invalid!("extra_costs has {} entries; lengths has {} (one per sample)", extra.len(), lengths.len());
        }
        for (i, (c, &e)) in out.iter_mut().zip(extra).enumerate() {
            *c = c.checked_add(e).ok_or_else(|| {
                Error::InvalidArgument(alloc::format!(
                    "the cost of lengths[{i}] plus extra_costs[{i}] = {e} overflows u64"
                ))
            })?;
        }
    }
    Ok(out)
}

/// Per-item costs, or an `invalid-argument` error naming the first item whose cost
/// overflows `u64`.
pub fn costs(lengths: &[u64], cost: &Cost) -> Result<Vec<u64>, Error> {
    lengths
        .iter()
        .enumerate()
        .map(|(i, &l)| {
            cost.of(l).ok_or_else(|| {
                Error::InvalidArgument(alloc::format!(
                    "the cost of lengths[{i}] = {l} under cost ({}, {}) overflows u64",
                    cost.linear,
                    cost.quadratic
                ))
            })
        })
        .collect()
}

/// The order of micro-batches in a plan. Members of a micro-batch are always ascending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Order {
    /// By smallest member index (input order).
    #[default]
    None,
    /// By cost descending, ties by smallest member index ascending.
    CostDesc,
    /// verl's and ROLL's micro-batch order: sort by (cost, smallest member) descending into
    /// `L`, then `L[::2][::-1] + L[1::2]` (the smallest at both ends).
    Verl,
    /// ROLL's (and verl's) in-rank sample order applied to micro-batches: sort by (cost,
    /// smallest member) ascending into `p`, then `p[::2] + p[1::2][::-1]`.
    Roll,
}

/// Options of [`micro_batches`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroOptions {
    /// Hard cap on the tokens of every micro-batch (≥ 1).
    pub max_token_len: u64,
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

impl MicroOptions {
    /// Options with cap `max_token_len`, token cost, no minimum, no rounding, no forced
    /// count, input order.
    pub fn new(max_token_len: u64) -> Self {
        Self { max_token_len, cost: Cost::TOKENS, min_count: 0, divisible_by: 1, count: None, order: Order::None }
    }
}

/// Micro-batches of one batch, in flat form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MicroPlan {
    /// `count + 1` offsets into `indices`.
    pub offsets: Vec<u32>,
    /// Input indices, micro-batch after micro-batch (each micro-batch ascending).
    pub indices: Vec<u32>,
    /// Tokens of each micro-batch (each ≤ `max_token_len`).
    pub tokens: Vec<u64>,
    /// Cost of each micro-batch.
    pub costs: Vec<u64>,
    /// `restore[i]` is the position of input `i` in `indices`: outputs computed in
    /// micro-batch order are put back in input order by `outputs[restore]`.
    pub restore: Vec<u32>,
    /// `max(1, ceil(total tokens / max_token_len))`: no plan has fewer micro-batches.
    pub lower_bound: u32,
    /// The count this batch needs on its own: the smallest count found under the cap,
    /// raised to `min_count` and rounded up to `divisible_by` (what `count` overrides).
    pub required: u32,
}

impl MicroPlan {
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
/// `options.max_token_len` tokens, balancing `options.cost` across them.
///
/// Errors: `invalid-argument` for empty `lengths`, `max_token_len` = 0, `divisible_by` = 0,
/// a cost overflowing `u64`, `count` = 0 / not a multiple of `divisible_by` / below
/// `min_count`, or a count (forced, or raised by `min_count`/`divisible_by`) above the number
/// of sequences (micro-batches are never empty); `infeasible` for a sequence longer than the
/// cap (never split) or a forced count the cap does not allow.
pub fn micro_batches(lengths: &[u64], options: &MicroOptions) -> Result<MicroPlan, Error> {
    micro_batches_with_extra(lengths, None, options)
}

/// [`micro_batches`] where sample `i` also costs `extra[i]` (cost units; `None`: nothing):
/// the cap still counts tokens, the balance counts costs. Errors: those of
/// [`micro_batches`]; `extra` not one per sample, or a cost plus extra above `u64`.
pub fn micro_batches_with_extra(
    lengths: &[u64],
    extra: Option<&[u64]>,
    options: &MicroOptions,
) -> Result<MicroPlan, Error> {
    let costs = micro_checks(lengths, extra, options)?;
    let need = needed_count(lengths, options)?;
    let caps = [options.max_token_len];
    plan_micro(lengths, &costs, options, need, &Caps { sizes: lengths, caps: &caps })
}

/// Further limits per micro-batch for [`micro_batches_limited`], beside the tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MicroLimits<'a> {
    /// Every sequence's size in each limited resource, sequence by sequence (sequence `i`:
    /// `sizes[i·E..(i+1)·E]`, `E = caps.len()`): image tokens, images …
    pub sizes: &'a [u64],
    /// Each resource's cap per micro-batch (each ≥ 1); 1 to [`MAX_RESOURCES`](crate::MAX_RESOURCES) − 1 entries.
    pub caps: &'a [u64],
    /// The resources' names for messages, one per cap and all different (and not `tokens`),
    /// or none (`resource 1`, `resource 2`, …).
    pub names: &'a [String],
}

/// The result of [`micro_batches_limited`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitedMicroPlan {
    /// The micro-batches, as [`micro_batches`] gives them; `lower_bound` is the largest of
    /// `lower_bounds`.
    pub plan: MicroPlan,
    /// Every micro-batch's load in each limited resource, micro-batch by micro-batch, in the
    /// plan's order (`count × E` entries).
    pub loads: Vec<u64>,
    /// Per resource, tokens first: `max(1, ⌈Σ sizes / cap⌉)`.
    pub lower_bounds: Vec<u64>,
}

/// [`micro_batches_with_extra`] under further caps per micro-batch (image tokens, images …):
/// every micro-batch stays within the token cap and within every one of `limits`, and the
/// balance still counts the cost model plus the extra costs. The count needed is the one
/// [`pack_multi`](crate::pack_multi)'s balanced fill finds under all the caps (its best-fit
/// decreasing when a cap is above [`MAX_BALANCED_CAPACITY`](crate::MAX_BALANCED_CAPACITY)),
/// raised by `min_count` and `divisible_by`; the assignment is the cost-greedy fit and refinement of
/// [`micro_batches`], with a move or swap allowed only when every cap holds. With no limits
/// it is [`micro_batches_with_extra`].
///
/// Errors: those of [`micro_batches_with_extra`]; `sizes` not `E` per sequence, no cap or
/// more than 7, a cap of 0, names not one per cap or repeated, a resource sum above 2^64 − 1;
/// `infeasible` for a sequence over a cap (naming it, the resource, its size and the cap);
/// those of [`pack_multi`](crate::pack_multi) (best-fit decreasing's item and step limits, with
/// a cap above 2^32 − 1).
pub fn micro_batches_limited(
    lengths: &[u64],
    extra: Option<&[u64]>,
    limits: &MicroLimits<'_>,
    options: &MicroOptions,
) -> Result<LimitedMicroPlan, Error> {
    let costs = micro_checks(lengths, extra, options)?;
    let e = limits.caps.len();
    if e == 0 || e >= crate::MAX_RESOURCES {
        return invalid!("limits must have 1 to {} caps besides the tokens (got {e})", crate::MAX_RESOURCES - 1);
    }
    let n = lengths.len();
    if limits.sizes.len() != n * e {
        return invalid!(
            "limit sizes must have {e} entries per sequence ({} for {n} sequences) (got {})",
            n * e,
            limits.sizes.len()
        );
    }
    let name =
        |k: usize| -> String { limits.names.get(k).cloned().unwrap_or_else(|| alloc::format!("resource {}", k + 1)) };
    if !limits.names.is_empty() && limits.names.len() != e {
        return invalid!("limit names must be one per cap ({e}) or none (got {})", limits.names.len());
    }
    // Byte by byte: the WASM guest has no memcmp.
    let same = |a: &str, b: &str| a.len() == b.len() && a.bytes().zip(b.bytes()).all(|(x, y)| x == y);
    for (k, nk) in limits.names.iter().enumerate() {
        if nk.is_empty() || same(nk, "tokens") || limits.names[..k].iter().any(|o| same(o, nk)) {
            return invalid!("limit names must be non-empty, all different and not \"tokens\" (got {nk:?} at {k})");
        }
    }
    if let Some(k) = limits.caps.iter().position(|&c| c == 0) {
        return invalid!("the cap of {} must be at least 1 (got 0)", name(k));
    }
    // Rows of all the resources, tokens first.
    let r = e + 1;
    let mut sizes = Vec::with_capacity(n * r);
    for (i, &l) in lengths.iter().enumerate() {
        sizes.push(l);
        let row = &limits.sizes[i * e..(i + 1) * e];
        if let Some(k) = (0..e).find(|&k| row[k] > limits.caps[k]) {
            return Err(Error::Infeasible(alloc::format!(
                "sequence {i} has {} {}, more than its cap {}; sequences are never split",
                row[k],
                name(k),
                limits.caps[k]
            )));
        }
        sizes.extend_from_slice(row);
    }
    let mut caps = Vec::with_capacity(r);
    caps.push(options.max_token_len);
    caps.extend_from_slice(limits.caps);
    let mut names: Vec<String> = Vec::with_capacity(r);
    names.push("tokens".into());
    names.extend((0..e).map(name));
    let multi = crate::MultiOptions {
        capacities: &caps,
        names: &names,
        max_segments: 0,
        align: 1,
        method: if caps.iter().all(|&c| c <= crate::MAX_BALANCED_CAPACITY) {
            crate::MultiMethod::Balanced
        } else {
            crate::MultiMethod::Bfd
        },
        oversize: OversizePolicy::Error,
    };
    let packing = crate::pack_multi(&sizes, &multi)?;
    let bins: Vec<Vec<u32>> = (0..packing.packing.bins()).map(|b| packing.packing.bin(b).to_vec()).collect();
    let lower_bounds: Vec<u64> = packing.lower_bounds.iter().map(|&b| b.max(1)).collect();
    let lower = lower_bounds.iter().copied().max().unwrap_or(1);
    // At most n (each sequence fits every cap alone).
    let need = required_count(lower as u32, bins, n as u32, options)?;
    let caps_view = Caps { sizes: &sizes, caps: &caps };
    let plan = plan_micro(lengths, &costs, options, need, &caps_view)?;
    let mut loads = Vec::with_capacity(plan.count() * e);
    for b in 0..plan.count() {
        for k in 1..r {
            loads.push(plan.batch(b).iter().map(|&i| sizes[i as usize * r + k]).sum());
        }
    }
    Ok(LimitedMicroPlan { plan, loads, lower_bounds })
}

/// Per-micro-batch caps in `r = caps.len()` resources, tokens first: sequence `i`'s sizes
/// are `sizes[i·r..(i+1)·r]` (with tokens only, `sizes` is the lengths).
struct Caps<'a> {
    sizes: &'a [u64],
    caps: &'a [u64],
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
fn plan_micro(
    lengths: &[u64],
    costs: &[u64],
    options: &MicroOptions,
    need: Need,
    caps: &Caps<'_>,
) -> Result<MicroPlan, Error> {
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
fn micro_checks(lengths: &[u64], extra: Option<&[u64]>, options: &MicroOptions) -> Result<Vec<u64>, Error> {
    let n = checked_len("lengths", lengths.len())?;
    if n == 0 {
        return invalid!("lengths must not be empty (a batch needs at least one sequence)");
    }
    let cap = options.max_token_len;
    if cap == 0 {
        return invalid!("max_token_len must be at least 1 (got 0)");
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
            "sequence {i} has {l} tokens, more than max_token_len = {cap}; sequences are never split"
        )));
    }
    checked_sum("lengths", lengths.iter().copied())?;
    let costs = costs_with_extra(lengths, &options.cost, extra)?;
    // A micro-batch's cost is a sum of item costs: none may wrap.
    checked_sum("costs", costs.iter().copied())?;
    Ok(costs)
}

/// What a batch needs under the cap, before a forced count.
struct Need {
    lower_bound: u32,
    /// Best-fit decreasing's bins: a feasible assignment with `bins.len()` micro-batches.
    bins: Vec<Vec<u32>>,
    required: u32,
}

fn needed_count(lengths: &[u64], options: &MicroOptions) -> Result<Need, Error> {
    let n = lengths.len() as u32;
    let cap = options.max_token_len;
    let opts = PackOptions { capacity: cap, align: 1, method: PackMethod::Bfd, oversize: OversizePolicy::Error };
    let packing = pack(lengths, &opts)?;
    let bins: Vec<Vec<u32>> = (0..packing.bins()).map(|b| packing.bin(b).to_vec()).collect();
    // Every length is ≤ cap, so ceil(total / cap) ≤ n fits in u32.
    let lower_bound = packing.lower_bound.max(1) as u32;
    required_count(lower_bound, bins, n, options)
}

/// The count a batch of `n` sequences needs on its own: `bins` (a feasible assignment) raised
/// to `min_count` and rounded up to `divisible_by`.
fn required_count(lower_bound: u32, bins: Vec<Vec<u32>>, n: u32, options: &MicroOptions) -> Result<Need, Error> {
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
            "count = {c} is below what max_token_len = {} allows: the tokens need at least {lower_bound} \
             micro-batches",
            options.max_token_len
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
) -> MicroPlan {
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
    MicroPlan { offsets, indices, tokens, costs: bin_costs, restore, lower_bound, required }
}

/// Reorders `items` by `order`, given each item's cost and its tie-breaking key.
pub(crate) fn apply_order<T, C: Ord, K: Ord>(
    mut items: Vec<T>,
    order: Order,
    cost: impl Fn(&T) -> C,
    key: impl Fn(&T) -> K,
) -> Vec<T> {
    match order {
        Order::None => items.sort_by_key(|t| key(t)),
        Order::CostDesc => items.sort_by(|a, b| cost(b).cmp(&cost(a)).then(key(a).cmp(&key(b)))),
        Order::Verl => {
            items.sort_by(|a, b| (cost(b), key(b)).cmp(&(cost(a), key(a))));
            return ends_small(items, true);
        }
        Order::Roll => {
            items.sort_by(|a, b| (cost(a), key(a)).cmp(&(cost(b), key(b))));
            return ends_small(items, false);
        }
    }
    items
}

/// `L[::2][::-1] + L[1::2]` (`evens_reversed`) or `L[::2] + L[1::2][::-1]`.
fn ends_small<T>(items: Vec<T>, evens_reversed: bool) -> Vec<T> {
    let mut evens = Vec::with_capacity(items.len().div_ceil(2));
    let mut odds = Vec::with_capacity(items.len() / 2);
    for (i, t) in items.into_iter().enumerate() {
        if i % 2 == 0 { evens.push(t) } else { odds.push(t) }
    }
    if evens_reversed {
        evens.reverse();
    } else {
        odds.reverse();
    }
    evens.extend(odds);
    evens
}

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
    /// image tokens); `None`: none. [`plan`] also balances micro-batches with it.
    pub extra_costs: Option<&'a [u64]>,
}

impl Default for DpOptions<'_> {
    fn default() -> Self {
        Self { cost: Cost::TOKENS, groups: None, minibatch_size: None, equal_count: true, extra_costs: None }
    }
}

/// A global batch reordered over `dp` ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DpPlan {
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

impl DpPlan {
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
pub fn balance_dp(lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Result<DpPlan, Error> {
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
    Ok(DpPlan { offsets, order, tokens, costs: rank_cost, cost_lower_bound })
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

/// Both levels: DP balancing, then every rank's micro-batches with one common count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The DP level.
    pub dp: DpPlan,
    /// Every rank's micro-batches (indices into the global input), rank after rank.
    pub ranks: Vec<MicroPlan>,
}

/// Plans `lengths` over `dp` ranks, then each rank's samples into micro-batches of at most
/// `micro.max_token_len` tokens. Every rank gets the same count: `micro.count` if given,
/// else the largest count any rank requires. Each rank's [`MicroPlan`] holds global
/// indices, and its `restore` maps the rank's samples in [`DpPlan::rank`] order.
///
/// Errors: those of [`balance_dp`] and [`micro_batches`].
pub fn plan(lengths: &[u64], dp: u32, dp_options: &DpOptions<'_>, micro: &MicroOptions) -> Result<Plan, Error> {
    // Name an oversized sequence by its global index (the per-rank checks see local ones).
    let extra = dp_options.extra_costs;
    micro_checks(lengths, extra, &MicroOptions { count: None, min_count: 0, ..*micro })?;
    let dp_plan = balance_dp(lengths, dp, dp_options)?;
    // Each rank's lengths, costs and needs, computed once: the needs give the agreed count.
    let mut locals = Vec::with_capacity(dp as usize);
    for r in 0..dp_plan.dp() {
        let local: Vec<u64> = dp_plan.rank(r).iter().map(|&i| lengths[i as usize]).collect();
        let local_extra: Option<Vec<u64>> = extra.map(|e| dp_plan.rank(r).iter().map(|&i| e[i as usize]).collect());
        let costs = micro_checks(&local, local_extra.as_deref(), micro)?;
        let need = needed_count(&local, micro)?;
        locals.push((local, costs, need));
    }
    let count = micro.count.or_else(|| locals.iter().map(|l| l.2.required).max());
    let opts = MicroOptions { count, ..*micro };
    let mut ranks = Vec::with_capacity(locals.len());
    for (r, (local, costs, need)) in locals.into_iter().enumerate() {
        let caps = [micro.max_token_len];
        let mut mp =
            plan_micro(&local, &costs, &opts, need, &Caps { sizes: &local, caps: &caps }).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(alloc::format!("rank {r}: {m}")),
                Error::Infeasible(m) => Error::Infeasible(alloc::format!("rank {r}: {m}")),
            })?;
        let global = dp_plan.rank(r);
        for i in &mut mp.indices {
            *i = global[*i as usize];
        }
        ranks.push(mp);
    }
    Ok(Plan { dp: dp_plan, ranks })
}
