//! The WASM backend of [`SlimeApi`]: the kernel component's `slime` interface.

use stowplan_kernel::flatten;
use stowplan_kernel::slime::{Flops, FlopsArgs, Schedule, ScheduleArgs, SlimeError};

use super::bindings::exports::stowplan::kernel::slime as ws;
use super::{WasmKernel, with_instance, wtypes};
use crate::Error;
use crate::kernel::slime::SlimeApi;

fn err(e: ws::SlimeError) -> SlimeError {
    e.into()
}

fn groups(g: wtypes::Groups) -> Vec<Vec<u32>> {
    g.into()
}

impl SlimeApi for WasmKernel {
    fn first_fit_pack(&self, lengths: &[i64], max_tokens_per_bin: i64) -> Result<Vec<Vec<u32>>, Error> {
        with_instance(|i, s| i.stowplan_kernel_slime().call_first_fit_pack(s, lengths, max_tokens_per_bin)).map(groups)
    }

    fn expand_bins_by_splitting(
        &self,
        bins: &[Vec<u32>],
        target_count: i64,
        lengths: &[i64],
    ) -> Result<Result<Vec<Vec<u32>>, SlimeError>, Error> {
        let (offsets, indices) = flatten(bins);
        let g = wtypes::Groups { offsets, indices };
        let r = with_instance(|i, s| {
            i.stowplan_kernel_slime().call_expand_bins_by_splitting(s, &g, target_count, lengths)
        })?;
        Ok(r.map(groups).map_err(err))
    }

    fn get_seqlen_balanced_partitions(
        &self,
        weights: &[f64],
        k_partitions: u32,
        equal_size: bool,
    ) -> Result<Result<Vec<Vec<u32>>, SlimeError>, Error> {
        let r = with_instance(|i, s| {
            i.stowplan_kernel_slime().call_get_seqlen_balanced_partitions(s, weights, k_partitions, equal_size)
        })?;
        Ok(r.map(groups).map_err(err))
    }

    fn calculate_fwd_flops(&self, seqlens: &[u64], args: &FlopsArgs) -> Result<Result<Flops, SlimeError>, Error> {
        let a = args.into();
        let r = with_instance(|i, s| i.stowplan_kernel_slime().call_calculate_fwd_flops(s, seqlens, &a))?;
        Ok(r.map(Into::into).map_err(err))
    }

    fn build_dp_schedule(
        &self,
        args: &ScheduleArgs,
        model: &FlopsArgs,
        total_lengths: &[i64],
        rollout_indices: &[i64],
    ) -> Result<Result<Schedule, SlimeError>, Error> {
        let (a, m) = (args.into(), model.into());
        let r = with_instance(|i, s| {
            i.stowplan_kernel_slime().call_build_dp_schedule(s, a, &m, total_lengths, rollout_indices)
        })?;
        Ok(r.map(Into::into).map_err(err))
    }
}
