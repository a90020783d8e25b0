//! The operations as the WIT (`wit/kernel.wit`) offers them: each takes its optional extra
//! costs and limits, and this is the one place that decides what they change. Both the
//! component's exports (`kernel/wasm`) and the host's native backend call these, so the
//! choice "limits, extra costs or plain" is written once.

use alloc::vec;
use alloc::vec::Vec;

use crate::{
    DpOptions, Error, LimitedMicroBatches, LimitedRawPlan, MicroLimits, MicroOptions, MultiMethod, PlanLimits,
    PlanOptions, TwoLevelBalance,
};

/// One batch's micro-batches (`balance.micro-batches`): under `limits` those of
/// [`micro_batches_limited`](crate::micro_batches_limited), else those of
/// [`micro_batches_with_extra`](crate::micro_batches_with_extra), with no loads and the
/// plan's lower bound as the only one. `extra`: one extra cost per sample, or none.
pub fn micro_batches(
    lengths: &[u64],
    extra: Option<&[u64]>,
    limits: Option<&MicroLimits<'_>>,
    options: &MicroOptions,
) -> Result<LimitedMicroBatches, Error> {
    match limits {
        Some(l) => crate::micro_batches_limited(lengths, extra, l, options),
        None => {
            let plan = crate::micro_batches_with_extra(lengths, extra, options)?;
            let lower_bounds = vec![u64::from(plan.lower_bound)];
            Ok(LimitedMicroBatches { plan, loads: Vec::new(), lower_bounds })
        }
    }
}

/// Both levels (`balance.plan`): DP balancing (with `dp_options.extra_costs`, which both
/// levels count), then every rank's micro-batches, under `limits` when given
/// ([`plan_limited`](crate::plan_limited), else [`plan`](crate::plan)).
pub fn plan(
    lengths: &[u64],
    dp: u32,
    dp_options: &DpOptions<'_>,
    micro: &MicroOptions,
    limits: Option<&MicroLimits<'_>>,
) -> Result<TwoLevelBalance, Error> {
    match limits {
        Some(l) => crate::plan_limited(lengths, dp, dp_options, micro, l),
        None => crate::plan(lengths, dp, dp_options, micro),
    }
}

/// A static raw plan (`plan.raw-plan`), under `limits` when given
/// ([`raw_plan_limited`](crate::raw_plan_limited); none is no limit and no segment limit:
/// [`raw_plan`](crate::raw_plan)'s plan with the token bound alone).
pub fn raw_plan(
    lengths: &[u64],
    options: &PlanOptions,
    limits: Option<&PlanLimits<'_>>,
) -> Result<LimitedRawPlan, Error> {
    const NONE: PlanLimits<'static> = PlanLimits {
        limits: MicroLimits { sizes: &[], caps: &[], names: &[] },
        max_segments: 0,
        method: MultiMethod::Balanced,
    };
    crate::raw_plan_limited(lengths, options, limits.unwrap_or(&NONE))
}
