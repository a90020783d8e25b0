//! Every conversion between the kernel crate's types and the component's WIT types: options
//! go in with `From<&Options>`, results come out with `From<WitResult>` (or `TryFrom` where
//! the component's answer is checked: a checksum). Those that both sides of the boundary
//! need are `stowplan_kernel::wit_conversions!`, which the guest expands over its own
//! bindings too; what is left here borrows or is the host's own (its errors, `VerlFunction`).

use stowplan_kernel::peers::DpReorder;
use stowplan_kernel::peers::verl::PyError;
use stowplan_kernel::{DistributeOptions, DpOptions, MicroLimits, MultiOptions, PlanLimits};

use super::VerlFunction;
use super::wasm::{wbal, wit, wlay, wpack, wpeers, wplan, wtypes, wverl};
use crate::Error;

stowplan_kernel::wit_conversions!(wit);

impl From<wtypes::Error> for Error {
    fn from(e: wtypes::Error) -> Self {
        stowplan_kernel::Error::from(e).into()
    }
}

impl From<&MultiOptions<'_>> for wpack::MultiOptions {
    fn from(o: &MultiOptions<'_>) -> Self {
        wpack::MultiOptions {
            capacities: o.capacities.to_vec(),
            names: o.names.to_vec(),
            max_segments: o.max_segments,
            align: o.align,
            method: o.method.into(),
            oversize: o.oversize.into(),
        }
    }
}

impl From<&MicroLimits<'_>> for wbal::Limits {
    fn from(l: &MicroLimits<'_>) -> Self {
        wbal::Limits { sizes: l.sizes.to_vec(), caps: l.caps.to_vec(), names: l.names.to_vec() }
    }
}

impl From<&PlanLimits<'_>> for wplan::PlanLimits {
    fn from(l: &PlanLimits<'_>) -> Self {
        wplan::PlanLimits { limits: (&l.limits).into(), max_segments: l.max_segments, method: l.method.into() }
    }
}

impl From<VerlFunction> for wverl::Function {
    fn from(f: VerlFunction) -> Self {
        match f {
            VerlFunction::KarmarkarKarp => wverl::Function::KarmarkarKarp,
            VerlFunction::GreedyPartition => wverl::Function::GreedyPartition,
            VerlFunction::GetSeqlenBalancedPartitions => wverl::Function::GetSeqlenBalancedPartitions,
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

impl From<&DpOptions<'_>> for wbal::DpOptions {
    fn from(o: &DpOptions<'_>) -> Self {
        wbal::DpOptions {
            cost: o.cost.into(),
            groups: o.groups.map(<[u32]>::to_vec),
            minibatch_size: o.minibatch_size,
            equal_count: o.equal_count,
            extra_costs: o.extra_costs.map(<[u64]>::to_vec),
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
            extra_costs: o.extra_costs.map(<[u64]>::to_vec),
            limits: o.limits.as_ref().map(Into::into),
        }
    }
}

impl From<stowplan_kernel::plan::MalformedChecksum> for Error {
    fn from(e: stowplan_kernel::plan::MalformedChecksum) -> Self {
        Error::Runtime(format!("kernel returned a {e}"))
    }
}
