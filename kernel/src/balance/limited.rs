//! Micro-batches under further caps per micro-batch besides the tokens (image tokens,
//! images …): [`micro_batches_limited`].

use alloc::string::String;
use alloc::vec::Vec;

use super::micro::{Caps, MicroBatches, MicroOptions, Need, micro_checks, plan_micro, required_count};
use super::{DpOptions, TwoLevelBalance, plan_ranks};
use crate::pack::OversizePolicy;
use crate::{Error, invalid};

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
pub struct LimitedMicroBatches {
    /// The micro-batches, as [`micro_batches`](super::micro_batches) gives them;
    /// `lower_bound` is the largest of `lower_bounds`.
    pub plan: MicroBatches,
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
///
/// [`micro_batches`]: super::micro_batches
/// [`micro_batches_with_extra`]: super::micro_batches_with_extra
pub fn micro_batches_limited(
    lengths: &[u64],
    extra: Option<&[u64]>,
    limits: &MicroLimits<'_>,
    options: &MicroOptions,
) -> Result<LimitedMicroBatches, Error> {
    let costs = micro_checks(lengths, extra, options)?;
    let rows = Rows::new(lengths, limits, options.capacity, "sequence")?;
    let (need, lower_bounds) = rows.need(lengths.len(), options)?;
    let plan = plan_micro(lengths, &costs, options, need, &rows.caps())?;
    let loads = rows.loads(&plan);
    Ok(LimitedMicroBatches { plan, loads, lower_bounds })
}

/// [`plan`](super::plan) under further caps per micro-batch: DP balancing of the cost (plus
/// the extra costs), then every rank's micro-batches within the token cap and every limit,
/// with one common count (`micro.count` if given, else the largest any rank needs under all
/// the caps, as [`micro_batches_limited`] counts).
///
/// Errors: those of [`plan`](super::plan) and [`micro_batches_limited`] (a sequence over a
/// limit is named by its global index).
pub fn plan_limited(
    lengths: &[u64],
    dp: u32,
    dp_options: &DpOptions<'_>,
    micro: &MicroOptions,
    limits: &MicroLimits<'_>,
) -> Result<TwoLevelBalance, Error> {
    let all = Rows::new(lengths, limits, micro.capacity, "sequence")?;
    let r = all.caps.len();
    plan_ranks(lengths, dp, dp_options, micro, |members, local| {
        let sizes: Vec<u64> = members.iter().flat_map(|&i| all.sizes[i as usize * r..][..r].iter().copied()).collect();
        let rows = Rows { sizes, caps: all.caps.clone(), names: all.names.clone() };
        let (need, _) = rows.need(local.len(), micro)?;
        Ok((need, rows.sizes, rows.caps))
    })
}

/// A batch's sizes in every resource, row by row (tokens first), with every cap and name.
pub(crate) struct Rows {
    sizes: Vec<u64>,
    caps: Vec<u64>,
    names: Vec<String>,
}

impl Rows {
    /// The rows of `lengths` under `limits` (1 to 7 caps), refusing an item over a cap; an item
    /// is a `what` in messages (`sequence`, `sample`).
    pub(crate) fn new(lengths: &[u64], limits: &MicroLimits<'_>, capacity: u64, what: &str) -> Result<Self, Error> {
        let e = limits.caps.len();
        if e == 0 || e >= crate::MAX_RESOURCES {
            return invalid!("limits must have 1 to {} caps besides the tokens (got {e})", crate::MAX_RESOURCES - 1);
        }
        let (caps, names) = resources(lengths.len(), capacity, limits)?;
        let mut sizes = Vec::with_capacity(lengths.len() * (e + 1));
        for (i, &l) in lengths.iter().enumerate() {
            sizes.push(l);
            let row = &limits.sizes[i * e..(i + 1) * e];
            if let Some(k) = (0..e).find(|&k| row[k] > limits.caps[k]) {
                return Err(Error::Infeasible(alloc::format!(
                    "{what} {i} has {} {}, more than its cap {}; {what}s are never split",
                    row[k],
                    names[k + 1],
                    limits.caps[k]
                )));
            }
            sizes.extend_from_slice(row);
        }
        Ok(Self { sizes, caps, names })
    }

    /// The count the `n` rows need under every cap (the balanced fill's bins, or best-fit
    /// decreasing's with a cap above 2^32 − 1, raised per `options`) and the bound of each
    /// resource.
    fn need(&self, n: usize, options: &MicroOptions) -> Result<(Need, Vec<u64>), Error> {
        let packing = self.fill(&self.sizes)?;
        let bins: Vec<Vec<u32>> = (0..packing.packing.bins()).map(|b| packing.packing.bin(b).to_vec()).collect();
        let lower_bounds: Vec<u64> = packing.lower_bounds.iter().map(|&b| b.max(1)).collect();
        let lower = lower_bounds.iter().copied().max().unwrap_or(1);
        // At most n (each sequence fits every cap alone).
        Ok((required_count(lower as u32, bins, n as u32, options)?, lower_bounds))
    }

    /// Packs `sizes` (rows of these resources) under every cap: the balanced fill, or
    /// best-fit decreasing with a cap above 2^32 − 1.
    fn fill(&self, sizes: &[u64]) -> Result<crate::MultiPacking, Error> {
        let caps = &self.caps;
        let multi = crate::MultiOptions {
            capacities: caps,
            names: &self.names,
            max_segments: 0,
            align: 1,
            method: if caps.iter().all(|&c| c <= crate::MAX_BALANCED_CAPACITY) {
                crate::MultiMethod::Balanced
            } else {
                crate::MultiMethod::Bfd
            },
            oversize: OversizePolicy::Error,
        };
        crate::pack_multi(sizes, &multi)
    }

    /// The bins of the rows `members` under every cap (as [`fill`](Self::fill) packs them),
    /// each a list of positions in `members`.
    pub(crate) fn pack(&self, members: &[u32]) -> Result<crate::Packing, Error> {
        let r = self.caps.len();
        let sizes: Vec<u64> = members.iter().flat_map(|&i| self.sizes[i as usize * r..][..r].iter().copied()).collect();
        Ok(self.fill(&sizes)?.packing)
    }

    /// `⌈Σ sizes / cap⌉` of every resource after the tokens (0 when its sizes are all 0).
    pub(crate) fn resource_bounds(&self) -> impl Iterator<Item = u64> + '_ {
        let r = self.caps.len();
        (1..r).map(move |q| {
            let total: u128 = self.sizes.iter().skip(q).step_by(r).map(|&s| u128::from(s)).sum();
            u64::try_from(total.div_ceil(u128::from(self.caps[q]))).unwrap_or(u64::MAX)
        })
    }

    fn caps(&self) -> Caps<'_> {
        Caps { sizes: &self.sizes, caps: &self.caps }
    }

    /// Every micro-batch's load in each limited resource.
    fn loads(&self, plan: &MicroBatches) -> Vec<u64> {
        let r = self.caps.len();
        let mut loads = Vec::with_capacity(plan.count() * (r - 1));
        for b in 0..plan.count() {
            for k in 1..r {
                loads.push(plan.batch(b).iter().map(|&i| self.sizes[i as usize * r + k]).sum());
            }
        }
        loads
    }
}

/// Checks limits' caps and names alone, as every call under `limits` does before it reads
/// a size: at most [`MAX_RESOURCES`](crate::MAX_RESOURCES) − 1 caps, each ≥ 1, names one per
/// cap (or none), non-empty, all different and not `tokens`. For a caller that takes limits
/// long before its first batch (the packer runtime) and refuses bad ones up front.
///
/// Errors: `invalid-argument` naming what is wrong (the messages of [`micro_batches_limited`]).
pub fn check_limits(caps: &[u64], names: &[String]) -> Result<(), Error> {
    resources(0, 1, &MicroLimits { sizes: &[], caps, names }).map(|_| ())
}

/// Checks `limits` for `n` sequences (at most 7 caps, each ≥ 1; `E` sizes per sequence; names
/// one per cap or none, non-empty, all different and not `tokens`) and returns every
/// resource's cap and name, the tokens (`tokens_cap`) first; unnamed resources are
/// `resource 1`, `resource 2`, …
pub(crate) fn resources(n: usize, tokens_cap: u64, limits: &MicroLimits<'_>) -> Result<(Vec<u64>, Vec<String>), Error> {
    let e = limits.caps.len();
    if e >= crate::MAX_RESOURCES {
        return invalid!("limits must have at most {} caps besides the tokens (got {e})", crate::MAX_RESOURCES - 1);
    }
    if limits.sizes.len() != n * e {
        return invalid!(
            "limit sizes must have {e} entries per sequence ({} for {n} sequences) (got {})",
            n * e,
            limits.sizes.len()
        );
    }
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
    let mut names: Vec<String> = Vec::with_capacity(e + 1);
    names.push("tokens".into());
    names.extend((0..e).map(|k| limits.names.get(k).cloned().unwrap_or_else(|| alloc::format!("resource {}", k + 1))));
    if let Some(k) = limits.caps.iter().position(|&c| c == 0) {
        return invalid!("the cap of {} must be at least 1 (got 0)", names[k + 1]);
    }
    let mut caps = Vec::with_capacity(e + 1);
    caps.push(tokens_cap);
    caps.extend_from_slice(limits.caps);
    Ok((caps, names))
}
