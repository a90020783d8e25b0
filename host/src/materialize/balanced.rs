//! The balanced distribution: the kernel plans (best-fit decreasing, splits before dummies,
//! Karmarkar–Karp over ranks) and the rows are built; the entry points of materialization.

use stowplan_kernel::{DistributeOptions, MicroLimits};

use super::build::{build_plan, resource_rows};
use super::sample::validate;
use super::{DistributionMode, LossCounts, MaterializeOptions, Materialized, Sample, SampleLimits};
use crate::Error;
use crate::kernel::Kernel;

/// Plans `samples` with [`distribute`](crate::KernelApi::distribute) and builds every rank's micro-batches.
/// See the module docs for the layout and padding values.
///
/// Errors: `invalid-argument` naming the sample and field for a length mismatch, an
/// empty sample or completion (unless allowed), a non-finite advantage or a temperature
/// ≤ 0, a run ≥ `num_runs`, teacher logprobs on some samples only; `cp` = 0, or `cp` > 1
/// with a per-sequence factor that is not a multiple of `2·cp`; those of `distribute`
/// (`infeasible` for a sample longer than the capacity).
pub fn materialize(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    options: &MaterializeOptions,
) -> Result<Materialized, Error> {
    materialize_counted(kernel, samples, options, &SampleLimits::default(), None)
}

/// [`materialize`](super::materialize) under further caps per micro-batch (image tokens, images …): every row
/// stays within the capacity and every one of `limits`, each sample's sizes being its
/// [`Sample::resources`](super::Sample::resources). Each run's micro-batches are then the kernel's balanced fill under
/// every cap (`layout.distribute` with limits) instead of best-fit decreasing; splits, dummies and the
/// ranks' balance are [`materialize`](super::materialize)'s. With no limits it is [`materialize`](super::materialize).
///
/// Errors: those of [`materialize`](super::materialize); a sample whose `resources` has neither 0 nor one entry
/// per limit (named); those of the kernel's limits (`infeasible` for a sample over a cap,
/// naming it, the resource, its size and the cap).
pub fn materialize_limited(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    options: &MaterializeOptions,
    limits: &SampleLimits,
) -> Result<Materialized, Error> {
    materialize_counted(kernel, samples, options, limits, None)
}

/// [`materialize_limited`](super::materialize_limited) with the loss counts given per sample (`counts[i]`: those of the
/// set sample `i` belongs to, which may reach beyond this call) instead of taken per run here.
pub(crate) fn materialize_counted(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    options: &MaterializeOptions,
    limits: &SampleLimits,
    counts: Option<&[LossCounts]>,
) -> Result<Materialized, Error> {
    let num_runs = validate(samples, options)?;
    if options.distribution == DistributionMode::RoundRobin {
        return super::round_robin::materialize(kernel, samples, options, limits, num_runs, counts);
    }
    if !limits.is_empty() {
        limits.check()?;
    }
    let sizes = resource_rows(samples, limits)?;
    let (caps, names) = limits.kernel_caps();
    let lengths: Vec<u64> = samples.iter().map(|s| s.len() as u64).collect();
    let extra: Vec<u64> = samples.iter().map(|s| s.extra_cost).collect();
    let multimodal = extra.iter().any(|&e| e > 0);
    // The kernel keeps labels apart (without `mix_runs`): runs, and with `multimodal_alone`
    // a label of its own for every multimodal sample, after the runs'.
    let mut labels: Vec<u32> = samples.iter().map(|s| s.run).collect();
    if options.multimodal_alone {
        if options.mix_runs {
            return Err(Error::InvalidArgument(
                "multimodal_alone needs mix_runs false (runs sharing micro-batches would share them with multimodal \
                 samples too)"
                    .into(),
            ));
        }
        let mut next = num_runs;
        for (label, &e) in labels.iter_mut().zip(&extra) {
            if e > 0 {
                *label = next;
                next = next.checked_add(1).ok_or_else(|| {
                    Error::InvalidArgument("too many multimodal samples to give each a micro-batch".into())
                })?;
            }
        }
    }
    let d = kernel.distribute(
        &lengths,
        &DistributeOptions {
            capacity: options.capacity,
            dp: options.dp,
            cost: options.cost,
            padding: options.padding,
            runs: Some(&labels),
            mix_runs: options.mix_runs,
            extra_costs: multimodal.then_some(&extra[..]),
            limits: (!caps.is_empty()).then_some(MicroLimits { sizes: &sizes, caps: &caps, names: &names }),
        },
    )?;
    let plan: Vec<Vec<&[u32]>> =
        (0..d.dp()).map(|r| (0..d.per_rank as usize).map(|j| d.batch(r * d.per_rank as usize + j)).collect()).collect();
    let ranks = build_plan(kernel, samples, &plan, options, num_runs, counts)?;
    let (mut real_tokens, mut padding_tokens) = (0, 0);
    for mb in ranks.iter().flatten() {
        real_tokens += mb.real_tokens;
        padding_tokens += mb.padding_tokens;
    }
    Ok(Materialized { ranks, distribution: d, real_tokens, padding_tokens })
}
