//! Every conversion between the kernel crate's types and the component's WIT types, in one
//! place: options go in with `From<&Options>`, results come out with `From<WitResult>` (or
//! `TryFrom` where the component's answer is checked).

use stowplan_kernel::peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};
use stowplan_kernel::verl::PyError;
use stowplan_kernel::{
    AlignOptions, AlignedPlan, Cost, DistributeOptions, Distribution, DpOptions, DpPlan, Factor, MicroOptions,
    MicroPlan, MultiMethod, MultiOptions, MultiPacking, Order, OversizePolicy, PackMethod, PackOptions, Packing,
    Padding, PartitionMethod, PartitionOptions, Partitioning, Plan, PlanOptions, RawPlan, unflatten,
};

use super::wasm::{wbal, wcompact, wlay, wmicro, wmplan, wmulti, wpack, wpart, wpeers, wplan, wstream, wtypes, wverl};
use crate::Error;
use stowplan_kernel::{Closed, LimitedRawPlan, MicroLimits, PlanLimits, StreamOptions, StreamStatus};

impl From<wtypes::Error> for Error {
    fn from(e: wtypes::Error) -> Self {
        match e {
            wtypes::Error::InvalidArgument(m) => Error::InvalidArgument(m),
            wtypes::Error::Infeasible(m) => Error::Infeasible(m),
        }
    }
}

impl From<wtypes::Groups> for Vec<Vec<u32>> {
    fn from(g: wtypes::Groups) -> Self {
        unflatten(&g.offsets, &g.indices)
    }
}

impl From<&PartitionOptions> for wpart::Options {
    fn from(o: &PartitionOptions) -> Self {
        wpart::Options {
            method: match o.method {
                PartitionMethod::Kk => wpart::Method::Kk,
                PartitionMethod::Greedy => wpart::Method::Greedy,
                PartitionMethod::Verl => wpart::Method::Verl,
            },
            equal_size: o.equal_size,
            refine: o.refine,
        }
    }
}

impl From<wpart::Partitioning> for Partitioning {
    fn from(r: wpart::Partitioning) -> Self {
        Partitioning {
            offsets: r.groups.offsets,
            indices: r.groups.indices,
            sums: r.sums,
            total: r.total,
            spread: r.spread,
            lower_bound: r.lower_bound,
        }
    }
}

impl From<&PackOptions> for wpack::Options {
    fn from(o: &PackOptions) -> Self {
        wpack::Options {
            capacity: o.capacity,
            align: o.align,
            method: match o.method {
                PackMethod::Bfd => wpack::Method::Bfd,
                PackMethod::Ffd => wpack::Method::Ffd,
                PackMethod::NextFit => wpack::Method::NextFit,
            },
            oversize: oversize_to_wit(o.oversize),
        }
    }
}

impl From<&MultiOptions<'_>> for wmulti::Options {
    fn from(o: &MultiOptions<'_>) -> Self {
        wmulti::Options {
            capacities: o.capacities.to_vec(),
            names: o.names.to_vec(),
            max_segments: o.max_segments,
            align: o.align,
            method: o.method.into(),
            oversize: oversize_to_wit(o.oversize),
        }
    }
}

impl From<MultiMethod> for wmulti::MultiMethod {
    fn from(m: MultiMethod) -> Self {
        match m {
            MultiMethod::Balanced => wmulti::MultiMethod::Balanced,
            MultiMethod::Bfd => wmulti::MultiMethod::Bfd,
            MultiMethod::Ffd => wmulti::MultiMethod::Ffd,
            MultiMethod::NextFit => wmulti::MultiMethod::NextFit,
        }
    }
}

impl From<&MicroLimits<'_>> for wmicro::Limits {
    fn from(l: &MicroLimits<'_>) -> Self {
        wmicro::Limits { sizes: l.sizes.to_vec(), caps: l.caps.to_vec(), names: l.names.to_vec() }
    }
}

impl From<&PlanLimits<'_>> for wmplan::PlanLimits {
    fn from(l: &PlanLimits<'_>) -> Self {
        wmplan::PlanLimits { limits: (&l.limits).into(), max_segments: l.max_segments, method: l.method.into() }
    }
}

impl TryFrom<wmplan::LimitedRawPlan> for LimitedRawPlan {
    type Error = Error;
    fn try_from(r: wmplan::LimitedRawPlan) -> Result<Self, Error> {
        Ok(LimitedRawPlan { raw: r.plan.try_into()?, loads: r.loads, lower_bounds: r.lower_bounds })
    }
}

impl From<wmulti::MultiPacking> for MultiPacking {
    fn from(r: wmulti::MultiPacking) -> Self {
        MultiPacking { packing: r.packing.into(), resource_loads: r.resource_loads, lower_bounds: r.lower_bounds }
    }
}

fn oversize_to_wit(o: OversizePolicy) -> wpack::Oversize {
    match o {
        OversizePolicy::Error => wpack::Oversize::Error,
        OversizePolicy::Single => wpack::Oversize::Single,
        OversizePolicy::Drop => wpack::Oversize::Drop,
    }
}

impl From<wpack::Packing> for Packing {
    fn from(r: wpack::Packing) -> Self {
        Packing {
            offsets: r.bins.offsets,
            indices: r.bins.indices,
            loads: r.loads,
            dropped: r.dropped,
            single: r.single,
            real_tokens: r.real_tokens,
            aligned_tokens: r.aligned_tokens,
            lower_bound: r.lower_bound,
        }
    }
}

impl From<wverl::PyError> for PyError {
    fn from(e: wverl::PyError) -> Self {
        match e {
            wverl::PyError::AssertionError(m) => PyError::AssertionError(m),
            wverl::PyError::IndexError(m) => PyError::IndexError(m),
            wverl::PyError::TypeError(m) => PyError::TypeError(m),
            wverl::PyError::ZeroDivisionError(m) => PyError::ZeroDivisionError(m),
            wverl::PyError::MemoryError(m) => PyError::MemoryError(m),
        }
    }
}

impl From<wpeers::PyError> for PyError {
    fn from(e: wpeers::PyError) -> Self {
        let m = e.message;
        match e.exception.as_str() {
            "AssertionError" => PyError::AssertionError(m),
            "IndexError" => PyError::IndexError(m),
            "TypeError" => PyError::TypeError(m),
            "ZeroDivisionError" => PyError::ZeroDivisionError(m),
            "MemoryError" => PyError::MemoryError(m),
            _ => PyError::ValueError(m),
        }
    }
}

impl From<Cost> for wbal::Cost {
    fn from(c: Cost) -> Self {
        wbal::Cost { linear: c.linear, quadratic: c.quadratic }
    }
}

impl From<&MicroOptions> for wbal::MicroOptions {
    fn from(o: &MicroOptions) -> Self {
        wbal::MicroOptions {
            max_token_len: o.max_token_len,
            cost: o.cost.into(),
            min_count: o.min_count,
            divisible_by: o.divisible_by,
            count: o.count,
            order: match o.order {
                Order::None => wbal::Order::None,
                Order::CostDesc => wbal::Order::CostDesc,
                Order::Verl => wbal::Order::Verl,
                Order::Roll => wbal::Order::Roll,
            },
        }
    }
}

impl From<&DpOptions<'_>> for wbal::DpOptions {
    fn from(o: &DpOptions<'_>) -> Self {
        wbal::DpOptions {
            cost: o.cost.into(),
            groups: o.groups.map(<[u32]>::to_vec),
            minibatch_size: o.minibatch_size,
            equal_count: o.equal_count,
        }
    }
}

impl From<wbal::MicroPlan> for MicroPlan {
    fn from(p: wbal::MicroPlan) -> Self {
        MicroPlan {
            offsets: p.batches.offsets,
            indices: p.batches.indices,
            tokens: p.tokens,
            costs: p.costs,
            restore: p.restore,
            lower_bound: p.lower_bound,
            required: p.required,
        }
    }
}

impl From<wbal::DpPlan> for DpPlan {
    fn from(p: wbal::DpPlan) -> Self {
        DpPlan {
            offsets: p.ranks.offsets,
            order: p.ranks.indices,
            tokens: p.tokens,
            costs: p.costs,
            cost_lower_bound: p.cost_lower_bound,
        }
    }
}

impl From<wbal::TwoLevel> for Plan {
    fn from(p: wbal::TwoLevel) -> Self {
        Plan { dp: p.dp.into(), ranks: p.ranks.into_iter().map(Into::into).collect() }
    }
}

impl From<&VerlMicroOptions> for wpeers::VerlMicroOptions {
    fn from(o: &VerlMicroOptions) -> Self {
        wpeers::VerlMicroOptions {
            max_token_len: o.max_token_len,
            min_num_micro_batch: o.min_num_micro_batch,
            num_batches_divided_by: o.num_batches_divided_by,
            use_dynamic_bsz_balance: o.use_dynamic_bsz_balance,
            force_group_size: o.force_group_size,
            padded_width: o.padded_width,
            dp_num_micro_batches: o.dp_num_micro_batches,
        }
    }
}

impl From<wpeers::DpReorder> for DpReorder {
    fn from(d: wpeers::DpReorder) -> Self {
        DpReorder {
            partitions: d.partitions.into(),
            kk_partitions: d.kk_partitions.into_iter().map(Into::into).collect(),
            dropped: d.dropped,
        }
    }
}

impl From<&RollLoadBalanceOptions> for wpeers::RollOptions {
    fn from(o: &RollLoadBalanceOptions) -> Self {
        wpeers::RollOptions {
            mask_width: o.mask_width,
            max_packed_sequence_length: o.max_packed_sequence_length,
            min_num_micro_batches: o.min_num_micro_batches,
            tp: o.tp,
            cp: o.cp,
            vp: o.vp,
            dp_num_micro_batches: o.dp_num_micro_batches,
        }
    }
}

impl From<wpeers::RollMicroBatches> for RollMicroBatches {
    fn from(m: wpeers::RollMicroBatches) -> Self {
        RollMicroBatches {
            micro_batches: m.micro_batches.into(),
            kk_partitions: m.kk_partitions.into(),
            pad_factor: m.pad_factor,
            padded_lengths: m.padded_lengths,
        }
    }
}

impl From<&AlignOptions> for wlay::AlignOptions {
    fn from(o: &AlignOptions) -> Self {
        wlay::AlignOptions {
            cp: o.cp,
            tp: o.tp,
            factor: match o.factor {
                Factor::CpTp => wlay::Factor::CpTp,
                Factor::Roll => wlay::Factor::Roll,
                Factor::Multiple(m) => wlay::Factor::Multiple(m),
            },
            power_of_two: o.power_of_two,
        }
    }
}

impl From<&DistributeOptions<'_>> for wlay::DistributeOptions {
    fn from(o: &DistributeOptions<'_>) -> Self {
        wlay::DistributeOptions {
            capacity: o.capacity,
            dp: o.dp,
            cost: o.cost.into(),
            padding: match o.padding {
                Padding::PerSequence(m) => wlay::Padding::PerSequence(m),
                Padding::PerMicroBatch(m) => wlay::Padding::PerMicroBatch(m),
            },
            runs: o.runs.map(<[u32]>::to_vec),
            mix_runs: o.mix_runs,
        }
    }
}

impl From<wlay::Distribution> for Distribution {
    fn from(d: wlay::Distribution) -> Self {
        Distribution {
            per_rank: d.per_rank,
            offsets: d.batches.offsets,
            indices: d.batches.indices,
            tokens: d.tokens,
            real_tokens: d.real_tokens,
            costs: d.costs,
            rank_costs: d.rank_costs,
            packed: d.packed,
            splits: d.splits,
            dummies: d.dummies,
            lower_bound: d.lower_bound,
        }
    }
}

impl From<&PlanOptions> for wplan::PlanOptions {
    fn from(o: &PlanOptions) -> Self {
        wplan::PlanOptions { packing_length: o.packing_length, align: o.align, allow_single_long: o.allow_single_long }
    }
}

/// A sha256 the component returned as hex, as bytes.
fn unhex(s: &str) -> Result<[u8; 32], Error> {
    let bad = || Error::Runtime(format!("kernel returned a malformed checksum {s:?}"));
    if s.len() != 64 {
        return Err(bad());
    }
    let mut out = [0u8; 32];
    for (j, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(s.get(2 * j..2 * j + 2).ok_or_else(bad)?, 16).map_err(|_| bad())?;
    }
    Ok(out)
}

impl TryFrom<wplan::RawPackPlan> for RawPlan {
    type Error = Error;
    fn try_from(r: wplan::RawPackPlan) -> Result<Self, Error> {
        Ok(RawPlan {
            offsets: r.packs.offsets,
            indices: r.packs.indices,
            tokens: r.tokens,
            single_long: r.single_long,
            dropped: r.dropped,
            real_tokens: r.real_tokens,
            aligned_tokens: r.aligned_tokens,
            lower_bound: r.lower_bound,
            checksum: unhex(&r.checksum)?,
        })
    }
}

impl TryFrom<wplan::AlignedPackPlan> for AlignedPlan {
    type Error = Error;
    fn try_from(a: wplan::AlignedPackPlan) -> Result<Self, Error> {
        Ok(AlignedPlan {
            packs: a.packs,
            pad_needed: a.pad_needed,
            dropped_packs: a.dropped_packs,
            dropped_samples: a.dropped_samples,
            checksum: unhex(&a.checksum)?,
        })
    }
}

impl From<wcompact::NextFitRuns> for stowplan_kernel::NextFitRuns {
    fn from(r: wcompact::NextFitRuns) -> Self {
        stowplan_kernel::NextFitRuns {
            starts: r.starts,
            loads: r.loads,
            dropped: r.dropped,
            single: r.single,
            real_tokens: r.real_tokens,
            aligned_tokens: r.aligned_tokens,
            lower_bound: r.lower_bound,
        }
    }
}

impl From<&StreamOptions> for wstream::Options {
    fn from(o: &StreamOptions) -> Self {
        wstream::Options {
            capacity: o.capacity,
            align: o.align,
            max_open_bins: o.max_open_bins,
            max_buffered: o.max_buffered,
            oversize: oversize_to_wit(o.oversize),
        }
    }
}

impl From<wstream::Options> for StreamOptions {
    fn from(o: wstream::Options) -> Self {
        StreamOptions {
            capacity: o.capacity,
            align: o.align,
            max_open_bins: o.max_open_bins,
            max_buffered: o.max_buffered,
            oversize: match o.oversize {
                wpack::Oversize::Error => OversizePolicy::Error,
                wpack::Oversize::Single => OversizePolicy::Single,
                wpack::Oversize::Drop => OversizePolicy::Drop,
            },
        }
    }
}

impl From<wstream::Closed> for Closed {
    fn from(c: wstream::Closed) -> Self {
        Closed { offsets: c.offsets, indices: c.indices, loads: c.loads, dropped: c.dropped }
    }
}

impl From<wstream::Status> for StreamStatus {
    fn from(s: wstream::Status) -> Self {
        StreamStatus {
            next_index: s.next_index,
            buffered: s.buffered,
            open_bins: s.open_bins,
            in_open_bins: s.in_open_bins,
            oldest_held: s.oldest_held,
        }
    }
}
