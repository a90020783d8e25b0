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
//! - **Figures** ([`Figures`]): `max`, `min`, `mean`, `max / mean` and the spread of the
//!   per-group totals of a plan, the metrics every front end reports.
//! - **Two-level plan** ([`plan`]): DP balancing, then every rank's micro-batches with one
//!   common count (the largest any rank needs), computed from the global lengths alone, so
//!   every rank derives the same plan without an all-reduce.

use alloc::vec::Vec;

use crate::{Error, invalid};

mod dp;
mod figures;
mod limited;
mod micro;

pub use crate::order::Order;
pub use dp::{Balance, DpOptions, balance_dp};
pub use figures::Figures;
pub(crate) use limited::Rows;
pub(crate) use limited::resources;
pub use limited::{LimitedMicroBatches, MicroLimits, check_limits, micro_batches_limited, plan_limited};
pub use micro::{MicroBatches, MicroOptions, micro_batches, micro_batches_with_extra};

use micro::{Caps, Need, micro_checks, needed_count, plan_micro};

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

/// Both levels: DP balancing, then every rank's micro-batches with one common count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwoLevelBalance {
    /// The DP level.
    pub dp: Balance,
    /// Every rank's micro-batches (indices into the global input), rank after rank.
    pub ranks: Vec<MicroBatches>,
}

/// Plans `lengths` over `dp` ranks, then each rank's samples into micro-batches of at most
/// `micro.capacity` tokens. Every rank gets the same count: `micro.count` if given,
/// else the largest count any rank requires. Each rank's [`MicroBatches`] holds global
/// indices, and its `restore` maps the rank's samples in [`Balance::rank`] order.
///
/// Errors: those of [`balance_dp`] and [`micro_batches`].
pub fn plan(
    lengths: &[u64],
    dp: u32,
    dp_options: &DpOptions<'_>,
    micro: &MicroOptions,
) -> Result<TwoLevelBalance, Error> {
    plan_ranks(lengths, dp, dp_options, micro, |_, local| {
        Ok((needed_count(local, micro)?, local.to_vec(), alloc::vec![micro.capacity]))
    })
}

/// The two levels: the global checks, DP balancing, then every rank's micro-batches with one
/// common count. `rank(members, local lengths)` gives a rank's need, and its sizes row by row
/// with the caps they are held to (the lengths and `capacity`, or more resources).
fn plan_ranks(
    lengths: &[u64],
    dp: u32,
    dp_options: &DpOptions<'_>,
    micro: &MicroOptions,
    rank: impl Fn(&[u32], &[u64]) -> Result<(Need, Vec<u64>, Vec<u64>), Error>,
) -> Result<TwoLevelBalance, Error> {
    // Name an oversized sequence by its global index (the per-rank checks see local ones).
    let extra = dp_options.extra_costs;
    micro_checks(lengths, extra, &MicroOptions { count: None, min_count: 0, ..*micro })?;
    let dp_plan = balance_dp(lengths, dp, dp_options)?;
    // Each rank's lengths, costs and needs, computed once: the needs give the agreed count.
    let mut locals = Vec::with_capacity(dp as usize);
    for r in 0..dp_plan.dp() {
        let members = dp_plan.rank(r);
        let local: Vec<u64> = members.iter().map(|&i| lengths[i as usize]).collect();
        let local_extra: Option<Vec<u64>> = extra.map(|e| members.iter().map(|&i| e[i as usize]).collect());
        let costs = micro_checks(&local, local_extra.as_deref(), micro)?;
        let (need, sizes, caps) = rank(members, &local)?;
        locals.push((local, costs, need, sizes, caps));
    }
    let count = micro.count.or_else(|| locals.iter().map(|l| l.2.required).max());
    let opts = MicroOptions { count, ..*micro };
    let mut ranks = Vec::with_capacity(locals.len());
    for (r, (local, costs, need, sizes, caps)) in locals.into_iter().enumerate() {
        let mut mp =
            plan_micro(&local, &costs, &opts, need, &Caps { sizes: &sizes, caps: &caps }).map_err(|e| match e {
                Error::InvalidArgument(m) => Error::InvalidArgument(alloc::format!("rank {r}: {m}")),
                Error::Infeasible(m) => Error::Infeasible(alloc::format!("rank {r}: {m}")),
            })?;
        let global = dp_plan.rank(r);
        for i in &mut mp.indices {
            *i = global[*i as usize];
        }
        ranks.push(mp);
    }
    Ok(TwoLevelBalance { dp: dp_plan, ranks })
}
