//! Glue between the WIT `slime` interface and `stowplan_kernel::peers::slime`.

use super::alloc::vec::Vec;

use stowplan_kernel::peers::slime as ks;

use super::exports::stowplan::kernel::{slime, types};
use super::{Kernel, groups_of};

fn slime_error(e: ks::SlimeError) -> slime::SlimeError {
    e.into()
}

impl slime::Guest for Kernel {
    fn first_fit_pack(lengths: Vec<i64>, max_tokens_per_bin: i64) -> types::Groups {
        groups_of(ks::first_fit_pack(&lengths, max_tokens_per_bin))
    }

    fn expand_bins_by_splitting(
        bins: types::Groups,
        target_count: i64,
        lengths: Vec<i64>,
    ) -> Result<types::Groups, slime::SlimeError> {
        ks::expand_bins_by_splitting(bins.into(), target_count, &lengths).map(groups_of).map_err(slime_error)
    }

    fn get_seqlen_balanced_partitions(
        weights: Vec<f64>,
        k_partitions: u32,
        equal_size: bool,
    ) -> Result<types::Groups, slime::SlimeError> {
        ks::get_seqlen_balanced_partitions(&weights, k_partitions, equal_size).map(groups_of).map_err(slime_error)
    }

    fn calculate_fwd_flops(seqlens: Vec<u64>, args: slime::FlopsArgs) -> Result<slime::Flops, slime::SlimeError> {
        ks::calculate_fwd_flops(&seqlens, &args.into()).map(Into::into).map_err(slime_error)
    }

    fn build_dp_schedule(
        args: slime::ScheduleArgs,
        model: slime::FlopsArgs,
        total_lengths: Vec<i64>,
        rollout_indices: Vec<i64>,
    ) -> Result<slime::Schedule, slime::SlimeError> {
        let a: ks::ScheduleArgs = args.into();
        ks::build_dp_schedule(&a, &model.into(), &total_lengths, &rollout_indices).map(Into::into).map_err(slime_error)
    }
}
