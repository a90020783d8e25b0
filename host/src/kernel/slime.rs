//! slime's micro-batch scheduling, reproduced exactly by the kernel (`wit/kernel.wit`,
//! interface `slime`; `stowplan_kernel::slime`), on either backend: reach it with
//! [`Kernel::slime`].

use stowplan_kernel::slime::{self as ks, Flops, FlopsArgs, Schedule, ScheduleArgs, SlimeError};

use super::{Backend, Kernel, native::NativeKernel, wasm::WasmKernel};
use crate::Error;

/// slime's scheduling functions, as each backend implements them. The outer `Result` is a
/// runtime failure of the kernel, the inner one slime's result or how slime fails
/// ([`SlimeError`]). Results are identical on both backends.
pub trait SlimeApi: Send + Sync + std::fmt::Debug {
    /// slime's `first_fit_pack(total_lengths, max_tokens_per_bin)`: bins in creation order
    /// (see [`stowplan_kernel::slime::first_fit_pack`]).
    fn first_fit_pack(&self, lengths: &[i64], max_tokens_per_bin: i64) -> Result<Vec<Vec<u32>>, Error>;

    /// slime's `expand_bins_by_splitting(bins, target_count, lengths)`: the bins after the
    /// call (see [`stowplan_kernel::slime::expand_bins_by_splitting`]).
    fn expand_bins_by_splitting(
        &self,
        bins: &[Vec<u32>],
        target_count: i64,
        lengths: &[i64],
    ) -> Result<Result<Vec<Vec<u32>>, SlimeError>, Error>;

    /// slime's `get_seqlen_balanced_partitions` on float weights (see
    /// [`stowplan_kernel::slime::get_seqlen_balanced_partitions`]; integer lengths go to
    /// [`KernelApi::verl`](super::KernelApi::verl)).
    fn get_seqlen_balanced_partitions(
        &self,
        weights: &[f64],
        k_partitions: u32,
        equal_size: bool,
    ) -> Result<Result<Vec<Vec<u32>>, SlimeError>, Error>;

    /// slime's `calculate_fwd_flops(seqlens, args)`, bit for bit.
    fn calculate_fwd_flops(&self, seqlens: &[u64], args: &FlopsArgs) -> Result<Result<Flops, SlimeError>, Error>;

    /// slime's `build_dp_schedule` (see [`stowplan_kernel::slime::build_dp_schedule`]).
    fn build_dp_schedule(
        &self,
        args: &ScheduleArgs,
        model: &FlopsArgs,
        total_lengths: &[i64],
        rollout_indices: &[i64],
    ) -> Result<Result<Schedule, SlimeError>, Error>;
}

impl Kernel {
    /// slime's scheduling functions on this kernel's backend.
    pub fn slime(&self) -> &'static dyn SlimeApi {
        match self.backend() {
            Backend::Wasm => &WasmKernel,
            Backend::Native => &NativeKernel,
        }
    }
}

impl SlimeApi for NativeKernel {
    forward! {
        fn first_fit_pack(lengths: &[i64], max_tokens_per_bin: i64) -> Vec<Vec<u32>> = ok ks::first_fit_pack;
        fn get_seqlen_balanced_partitions(weights: &[f64], k_partitions: u32, equal_size: bool)
            -> Result<Vec<Vec<u32>>, SlimeError> = ok ks::get_seqlen_balanced_partitions;
        fn calculate_fwd_flops(seqlens: &[u64], args: &FlopsArgs) -> Result<Flops, SlimeError> = ok ks::calculate_fwd_flops;
        fn build_dp_schedule(args: &ScheduleArgs, model: &FlopsArgs, total_lengths: &[i64], rollout_indices: &[i64])
            -> Result<Schedule, SlimeError> = ok ks::build_dp_schedule;
    }

    fn expand_bins_by_splitting(
        &self,
        bins: &[Vec<u32>],
        target_count: i64,
        lengths: &[i64],
    ) -> Result<Result<Vec<Vec<u32>>, SlimeError>, Error> {
        Ok(ks::expand_bins_by_splitting(bins.to_vec(), target_count, lengths))
    }
}
