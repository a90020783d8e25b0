//! Results as JSON: the typed reports (`Serialize`) of the kernel's results, one struct per
//! shape, the one writer of these shapes (no_std, so that the WebAssembly kernel links it too).
//! The CLI's `--json` prints them inside each command's report (the host re-exports this
//! crate as `stowplan::json`), the conformance vectors hold them, and the JavaScript SDK's
//! `toJSONText` gets them from the component (the `reports` interface of `wit/kernel.wit`). The figures in
//! them are the kernel's ([`stowplan_kernel::Figures`], [`stowplan_kernel::peers::verl`]).

#![no_std]
#![deny(missing_docs)]

extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;

use serde::Serialize;
use serde::ser::{SerializeMap, SerializeStruct, Serializer};
use serde_json::Value;
use stowplan_kernel::peers::verl::{UnbalanceError, UnbalanceFigures};
use stowplan_kernel::{Balance, Error, Packing, Partition, TwoLevelBalance, unflatten as lists};

/// A partition: `{"groups", "sums", "total", "spread", "lower_bound"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Groups {
    /// The input indices of each group.
    pub groups: Vec<Vec<u32>>,
    /// The sum of each group.
    pub sums: Vec<u64>,
    /// The sum of all lengths.
    pub total: u64,
    /// Largest group sum minus smallest.
    pub spread: u64,
    /// `max(ceil(total / k), longest length)`.
    pub lower_bound: u64,
}

impl From<&Partition> for Groups {
    fn from(p: &Partition) -> Self {
        Self {
            groups: lists(&p.offsets, &p.indices),
            sums: p.sums.clone(),
            total: p.total,
            spread: p.spread,
            lower_bound: p.lower_bound,
        }
    }
}

/// A packing: `{"bins", "loads", "dropped", "single", "real_tokens", "aligned_tokens",
/// "padding_tokens", "lower_bound"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Bins {
    /// The input indices of each bin.
    pub bins: Vec<Vec<u32>>,
    /// The aligned load of each bin.
    pub loads: Vec<u64>,
    /// Items left out (oversize policy `drop`).
    pub dropped: Vec<u32>,
    /// Items alone in a bin above the capacity (oversize policy `single`).
    pub single: Vec<u32>,
    /// Real tokens packed.
    pub real_tokens: u64,
    /// Aligned tokens packed.
    pub aligned_tokens: u64,
    /// `aligned_tokens - real_tokens`.
    pub padding_tokens: u64,
    /// No packing of the items that fit uses fewer bins.
    pub lower_bound: u64,
}

impl From<&Packing> for Bins {
    fn from(p: &Packing) -> Self {
        Self {
            bins: lists(&p.offsets, &p.indices),
            loads: p.loads.clone(),
            dropped: p.dropped.clone(),
            single: p.single.clone(),
            real_tokens: p.real_tokens,
            aligned_tokens: p.aligned_tokens,
            padding_tokens: p.padding_tokens(),
            lower_bound: p.lower_bound,
        }
    }
}

/// Balance figures of per-group totals (tokens or costs of ranks or micro-batches), the
/// kernel's [`stowplan_kernel::Figures`] (its fields through `Deref`): `{"max", "min", "mean",
/// "max_over_mean", "spread"}`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures(pub stowplan_kernel::Figures);

impl Figures {
    /// The figures of `values`.
    pub fn of(values: &[u64]) -> Self {
        Self(stowplan_kernel::Figures::of(values))
    }
}

impl core::ops::Deref for Figures {
    type Target = stowplan_kernel::Figures;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Serialize for Figures {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Figures", 5)?;
        m.serialize_field("max", &self.max)?;
        m.serialize_field("min", &self.min)?;
        m.serialize_field("mean", &self.mean)?;
        m.serialize_field("max_over_mean", &self.max_over_mean)?;
        m.serialize_field("spread", &self.spread)?;
        m.end()
    }
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "max/mean {:.5}, spread {}", self.max_over_mean, self.spread)
    }
}

/// verl's `log_seqlen_unbalance` figures as its metrics dict: `{"{prefix}/min",
/// "{prefix}/max", "{prefix}/minmax_diff", "{prefix}/balanced_min", "{prefix}/balanced_max",
/// "{prefix}/mean"}` (the kernel's 64-bit [`UnbalanceFigures`]).
#[derive(Clone, Debug, PartialEq)]
pub struct VerlUnbalance {
    /// The keys' prefix (`global_seqlen` in a DP report).
    pub prefix: String,
    /// The figures.
    pub figures: UnbalanceFigures,
}

impl VerlUnbalance {
    /// verl's figures for `partitions` of `seqlens` under `prefix`, or verl's error.
    pub fn of(prefix: &str, seqlens: &[i64], partitions: &[Vec<i64>]) -> Result<Self, UnbalanceError> {
        let u = stowplan_kernel::peers::verl::log_seqlen_unbalance(seqlens, partitions)?;
        Ok(Self { prefix: prefix.to_string(), figures: u.figures() })
    }

    /// The figures of DP `ranks` of `lengths` under `global_seqlen` (lengths above 2^63 − 1
    /// count as 2^63 − 1), or `None` where verl's would fail.
    pub fn of_ranks(lengths: &[u64], ranks: &[Vec<u32>]) -> Option<Self> {
        let seqlens: Vec<i64> = lengths.iter().map(|&l| i64::try_from(l).unwrap_or(i64::MAX)).collect();
        let parts: Vec<Vec<i64>> = ranks.iter().map(|r| r.iter().map(|&i| i64::from(i)).collect()).collect();
        Self::of("global_seqlen", &seqlens, &parts).ok()
    }
}

impl Serialize for VerlUnbalance {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let (p, u) = (&self.prefix, &self.figures);
        let mut m = s.serialize_map(Some(6))?;
        m.serialize_entry(&format!("{p}/min"), &u.min)?;
        m.serialize_entry(&format!("{p}/max"), &u.max)?;
        m.serialize_entry(&format!("{p}/minmax_diff"), &u.minmax_diff)?;
        m.serialize_entry(&format!("{p}/balanced_min"), &u.balanced_min)?;
        m.serialize_entry(&format!("{p}/balanced_max"), &u.balanced_max)?;
        m.serialize_entry(&format!("{p}/mean"), &u.mean)?;
        m.end()
    }
}

/// One rank's (or a batch's) micro-batches: `{"batches", "tokens", "costs", "restore",
/// "count", "lower_bound", "required", "token_balance", "cost_balance"}`, and
/// `"resource_loads"` when the caller fills it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MicroBatches {
    /// The input indices of each micro-batch.
    pub batches: Vec<Vec<u32>>,
    /// Tokens of each micro-batch.
    pub tokens: Vec<u64>,
    /// Cost of each micro-batch.
    pub costs: Vec<u64>,
    /// Puts outputs in micro-batch order back in input order.
    pub restore: Vec<u32>,
    /// Number of micro-batches.
    pub count: usize,
    /// No plan has fewer micro-batches.
    pub lower_bound: u32,
    /// The count these samples need on their own.
    pub required: u32,
    /// Balance of the micro-batches' tokens.
    pub token_balance: Figures,
    /// Balance of the micro-batches' costs.
    pub cost_balance: Figures,
    /// Under further limits: every micro-batch's load in each limit (left out when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resource_loads: Vec<Vec<u64>>,
}

impl From<&stowplan_kernel::MicroBatches> for MicroBatches {
    fn from(p: &stowplan_kernel::MicroBatches) -> Self {
        Self {
            batches: lists(&p.offsets, &p.indices),
            tokens: p.tokens.clone(),
            costs: p.costs.clone(),
            restore: p.restore.clone(),
            count: p.count(),
            lower_bound: p.lower_bound,
            required: p.required,
            token_balance: Figures::of(&p.tokens),
            cost_balance: Figures::of(&p.costs),
            resource_loads: Vec::new(),
        }
    }
}

/// The DP level: `{"ranks", "order", "tokens", "costs", "cost_lower_bound", "token_balance",
/// "cost_balance", "verl_unbalance"}` (`verl_unbalance` null where verl's would fail).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Ranks {
    /// The input indices of each rank.
    pub ranks: Vec<Vec<u32>>,
    /// The permutation of the input, rank after rank.
    pub order: Vec<u32>,
    /// Tokens of each rank.
    pub tokens: Vec<u64>,
    /// Cost of each rank.
    pub costs: Vec<u64>,
    /// No assignment has a lighter costliest rank.
    pub cost_lower_bound: u64,
    /// Balance of the ranks' tokens.
    pub token_balance: Figures,
    /// Balance of the ranks' costs.
    pub cost_balance: Figures,
    /// verl's figures for these ranks.
    pub verl_unbalance: Option<VerlUnbalance>,
}

impl Ranks {
    /// The DP level `p` of `lengths`.
    pub fn new(p: &Balance, lengths: &[u64]) -> Self {
        let ranks = lists(&p.offsets, &p.order);
        Self {
            verl_unbalance: VerlUnbalance::of_ranks(lengths, &ranks),
            ranks,
            order: p.order.clone(),
            tokens: p.tokens.clone(),
            costs: p.costs.clone(),
            cost_lower_bound: p.cost_lower_bound,
            token_balance: Figures::of(&p.tokens),
            cost_balance: Figures::of(&p.costs),
        }
    }
}

/// The micro-batches of a plan: one batch's (no DP level) or every rank's.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Micro {
    /// One batch's micro-batches.
    One(MicroBatches),
    /// Every rank's micro-batches, rank after rank.
    PerRank(Vec<MicroBatches>),
}

impl Micro {
    /// Every rank's micro-batches (one entry for one batch).
    pub fn ranks(&self) -> &[MicroBatches] {
        match self {
            Micro::One(m) => core::slice::from_ref(m),
            Micro::PerRank(r) => r,
        }
    }

    /// The same, to fill in.
    pub fn ranks_mut(&mut self) -> &mut [MicroBatches] {
        match self {
            Micro::One(m) => core::slice::from_mut(m),
            Micro::PerRank(r) => r,
        }
    }
}

/// The levels of a plan: the DP level, the micro-batches, or both, with (both) the count of
/// every rank and the balance over every micro-batch of every rank: `{"dp", "micro_batches",
/// "count", "micro_batch_token_balance", "micro_batch_cost_balance"}`, each left out when the
/// plan has no such level.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Levels {
    /// The DP level.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dp: Option<Ranks>,
    /// The micro-batches.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batches: Option<Micro>,
    /// Both levels: the micro-batch count of every rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// Both levels: balance of the tokens of every micro-batch of every rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch_token_balance: Option<Figures>,
    /// Both levels: balance of the costs of every micro-batch of every rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch_cost_balance: Option<Figures>,
}

impl Levels {
    /// One batch's micro-batches.
    pub fn micro(m: &stowplan_kernel::MicroBatches) -> Self {
        Self { micro_batches: Some(Micro::One(m.into())), ..Self::default() }
    }

    /// The DP level of `lengths` alone.
    pub fn dp(d: &Balance, lengths: &[u64]) -> Self {
        Self { dp: Some(Ranks::new(d, lengths)), ..Self::default() }
    }

    /// Both levels of `lengths`.
    pub fn both(p: &TwoLevelBalance, lengths: &[u64]) -> Self {
        let tokens: Vec<u64> = p.ranks.iter().flat_map(|r| r.tokens.iter().copied()).collect();
        let costs: Vec<u64> = p.ranks.iter().flat_map(|r| r.costs.iter().copied()).collect();
        Self {
            dp: Some(Ranks::new(&p.dp, lengths)),
            micro_batches: Some(Micro::PerRank(p.ranks.iter().map(MicroBatches::from).collect())),
            count: Some(p.ranks.first().map_or(0, stowplan_kernel::MicroBatches::count)),
            micro_batch_token_balance: Some(Figures::of(&tokens)),
            micro_batch_cost_balance: Some(Figures::of(&costs)),
        }
    }

    /// These levels with every micro-batch's `resource_loads`: the sums of its samples'
    /// sizes under further limits, `sizes` holding `resources` values per sample, sample
    /// after sample (with no limits, `resources` 0: the levels as they are).
    ///
    /// Errors (`invalid-argument`): `resources` above the kernel's 7 further limits
    /// ([`MAX_RESOURCES`](stowplan_kernel::MAX_RESOURCES) − 1), sizes with `resources` 0,
    /// `sizes` not a whole number of rows of `resources`, a micro-batch naming a sample beyond
    /// them, a load above u64.
    pub fn with_resource_loads(mut self, sizes: &[u64], resources: usize) -> Result<Self, Error> {
        if resources == 0 {
            if !sizes.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "sizes: {} values but resources is 0 (no limits: no sizes)",
                    sizes.len()
                )));
            }
            return Ok(self);
        }
        let most = stowplan_kernel::MAX_RESOURCES - 1;
        if resources > most {
            return Err(Error::InvalidArgument(format!("resources must be in 0..={most} (got {resources})")));
        }
        if sizes.len() % resources != 0 {
            return Err(Error::InvalidArgument(format!(
                "sizes: {} values are not a whole number of rows of {resources} (one per resource)",
                sizes.len()
            )));
        }
        let samples = sizes.len() / resources;
        for m in self.micro_batches.iter_mut().flat_map(Micro::ranks_mut) {
            m.resource_loads = Vec::with_capacity(m.batches.len());
            for batch in &m.batches {
                let mut loads = alloc::vec![0u64; resources];
                for &i in batch {
                    // Checked before any product: `i < samples` keeps `(i + 1) · resources`
                    // within `sizes.len()` (usize is 32 bits in the component).
                    if i as usize >= samples {
                        return Err(Error::InvalidArgument(format!(
                            "a micro-batch holds sample {i}, beyond the {samples} of sizes"
                        )));
                    }
                    let row = &sizes[i as usize * resources..(i as usize + 1) * resources];
                    for (load, &size) in loads.iter_mut().zip(row) {
                        *load = load.checked_add(size).ok_or_else(|| {
                            Error::InvalidArgument(format!("a micro-batch's load above 2^64 − 1 (sample {i})"))
                        })?;
                    }
                }
                m.resource_loads.push(loads);
            }
        }
        Ok(self)
    }
}

/// `report` as a JSON value (these reports always serialize; a float that is not finite
/// becomes null, as in serde_json).
fn value(report: &impl Serialize) -> Value {
    serde_json::to_value(report).unwrap_or(Value::Null)
}

/// A partition's [`Groups`] as a value.
pub fn partition(p: &Partition) -> Value {
    value(&Groups::from(p))
}

/// A packing's [`Bins`] as a value.
pub fn packing(p: &Packing) -> Value {
    value(&Bins::from(p))
}

/// The [`Figures`] of per-group totals as a value.
pub fn summary(values: &[u64]) -> Value {
    value(&Figures::of(values))
}

/// verl's `log_seqlen_unbalance` dict ([`VerlUnbalance`]) for `partitions` of `seqlens`, or
/// verl's error.
pub fn verl_unbalance(prefix: &str, seqlens: &[i64], partitions: &[Vec<i64>]) -> Result<Value, UnbalanceError> {
    VerlUnbalance::of(prefix, seqlens, partitions).map(|u| value(&u))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// The kernel's micro-batches of `lengths` under `cap`.
    fn micro(lengths: &[u64], cap: u64) -> stowplan_kernel::MicroBatches {
        stowplan_kernel::micro_batches(lengths, &stowplan_kernel::MicroOptions::new(cap)).expect("micro-batches")
    }

    #[test]
    fn the_shapes_and_their_keys() {
        // Results come from the kernel, not listed field by field, so that a field the kernel
        // adds needs no edit here.
        let p = stowplan_kernel::pack(&[5, 5, 3], &stowplan_kernel::PackOptions::new(8)).expect("a packing");
        assert_eq!(
            (p.offsets.as_slice(), p.indices.as_slice(), p.loads.as_slice()),
            (&[0, 2, 3][..], &[0, 2, 1][..], &[8, 5][..])
        );
        let v = packing(&p);
        assert_eq!(v["bins"], serde_json::json!([[0, 2], [1]]));
        assert_eq!(v["padding_tokens"], 0);
        let s = summary(&[1550, 1450]);
        assert_eq!((s["max"].as_u64(), s["spread"].as_u64()), (Some(1550), Some(100)));
        let u =
            verl_unbalance("global_seqlen", &[100, 900, 50, 950], &[vec![0, 3], vec![1, 2]]).expect("verl's figures");
        assert_eq!(u["global_seqlen/balanced_max"], 1050);
        assert_eq!(u["global_seqlen/mean"], 1000.0);
        assert!(verl_unbalance("p", &[1], &[vec![0], vec![0]]).is_err());
        let m = MicroBatches::from(&micro(&[5], 5));
        let v = value(&m);
        assert!(v.get("resource_loads").is_none(), "{v}");
        assert_eq!(v["token_balance"]["max_over_mean"], 1.0);
    }

    #[test]
    fn resource_loads_are_the_sums_of_the_sizes_and_bad_sizes_are_refused() {
        let m = micro(&[5, 6, 4], 9);
        assert_eq!((m.offsets.as_slice(), m.indices.as_slice()), (&[0, 2, 3][..], &[0, 2, 1][..]));
        let sizes = [1, 10, 2, 20, 4, 40];
        let l = Levels::micro(&m).with_resource_loads(&sizes, 2).unwrap();
        assert_eq!(l.micro_batches.unwrap().ranks()[0].resource_loads, vec![vec![5, 50], vec![2, 20]]);
        assert!(
            Levels::micro(&m).with_resource_loads(&[], 0).unwrap().micro_batches.unwrap().ranks()[0]
                .resource_loads
                .is_empty()
        );
        let err = |sizes: &[u64], r: usize| Levels::micro(&m).with_resource_loads(sizes, r).unwrap_err().to_string();
        assert!(err(&sizes, 8).contains("resources must be in 0..=7 (got 8)"));
        assert!(err(&sizes, 0).contains("6 values but resources is 0"));
        assert!(err(&sizes[..5], 2).contains("5 values are not a whole number of rows of 2"));
        assert!(err(&sizes[..4], 2).contains("sample 2, beyond the 2 of sizes"));
        assert!(err(&[u64::MAX, 0, 1, 0, 1, 0], 2).contains("above 2^64 − 1"));
    }
}
