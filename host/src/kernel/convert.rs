//! Every conversion between the kernel crate's types and the component's WIT types: options
//! go in with `From<&Options>`, results come out with `From<WitResult>` (or `TryFrom` where
//! the component's answer is checked). The records and enums that map field by field are
//! converted by `stowplan_kernel::wit_conversions!`, which the guest expands over its own
//! bindings too; what is left here borrows, is checked, or is the host's own.

use stowplan_kernel::peers::DpReorder;
use stowplan_kernel::verl::PyError;
use stowplan_kernel::{AlignedPlan, DistributeOptions, DpOptions, MultiOptions, MultiPacking, PlanOptions, RawPlan};

use super::wasm::{wbal, wit, wlay, wmicro, wmplan, wmulti, wpeers, wplan, wtypes};
use crate::Error;
use stowplan_kernel::{LimitedRawPlan, MicroLimits, PlanLimits};

stowplan_kernel::wit_conversions!(wit);

impl From<wtypes::Error> for Error {
    fn from(e: wtypes::Error) -> Self {
        stowplan_kernel::Error::from(e).into()
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
            oversize: o.oversize.into(),
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
        Ok(LimitedRawPlan { raw: r.plan.try_into()?, loads: r.loads, lower_bounds: r.lower_bounds, names: r.names })
    }
}

impl From<wmulti::MultiPacking> for MultiPacking {
    fn from(r: wmulti::MultiPacking) -> Self {
        MultiPacking { packing: r.packing.into(), resource_loads: r.resource_loads, lower_bounds: r.lower_bounds }
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

impl From<wpeers::DpReorder> for DpReorder {
    fn from(d: wpeers::DpReorder) -> Self {
        DpReorder {
            partitions: d.partitions.into(),
            kk_partitions: d.kk_partitions.into_iter().map(Into::into).collect(),
            dropped: d.dropped,
        }
    }
}

impl From<&DistributeOptions<'_>> for wlay::DistributeOptions {
    fn from(o: &DistributeOptions<'_>) -> Self {
        wlay::DistributeOptions {
            capacity: o.capacity,
            dp: o.dp,
            cost: o.cost.into(),
            padding: o.padding.into(),
            runs: o.runs.map(<[u32]>::to_vec),
            mix_runs: o.mix_runs,
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
