//! slime's micro-batch scheduling, reproduced exactly by the kernel (`wit/kernel.wit`,
//! interface `slime`; `stowplan_kernel::peers::slime`), on either backend: reach it with
//! [`Kernel::slime`].

use stowplan_kernel::flatten;
use stowplan_kernel::peers::slime::{self as ks, Flops, FlopsArgs, Schedule, ScheduleArgs, SlimeError};

use super::wasm::{peer_call, with_instance, wtypes};
use super::{Backend, Kernel, native::NativeKernel, wasm::WasmKernel};

backends! {
    /// slime's scheduling functions, as each backend implements them. The outer `Result` is a
    /// runtime failure of the kernel, the inner one slime's result or how slime fails
    /// ([`SlimeError`]). Results are identical on both backends.
    pub trait SlimeApi {
        /// slime's `first_fit_pack(total_lengths, max_tokens_per_bin)`: bins in creation order
        /// (see [`stowplan_kernel::peers::slime::first_fit_pack`]).
        fn first_fit_pack(lengths: &[i64], max_tokens_per_bin: i64) -> Vec<Vec<u32>> {
            native: Ok(ks::first_fit_pack(lengths, max_tokens_per_bin)),
            wasm: with_instance(|i, s| i.stowplan_kernel_slime().call_first_fit_pack(s, lengths, max_tokens_per_bin))
                .map(Into::into),
        }

        /// slime's `expand_bins_by_splitting(bins, target_count, lengths)`: the bins after the
        /// call (see [`stowplan_kernel::peers::slime::expand_bins_by_splitting`]).
        fn expand_bins_by_splitting(bins: &[Vec<u32>], target_count: i64, lengths: &[i64])
            -> Result<Vec<Vec<u32>>, SlimeError> {
            native: Ok(ks::expand_bins_by_splitting(bins.to_vec(), target_count, lengths)),
            wasm: {
                let (offsets, indices) = flatten(bins);
                let g = wtypes::Groups { offsets, indices };
                peer_call(|i, s| i.stowplan_kernel_slime().call_expand_bins_by_splitting(s, &g, target_count, lengths))
            },
        }

        /// slime's `get_seqlen_balanced_partitions` on float weights (see
        /// [`stowplan_kernel::peers::slime::get_seqlen_balanced_partitions`]; integer lengths go to
        /// [`KernelApi::verl`](super::KernelApi::verl)).
        fn get_seqlen_balanced_partitions(weights: &[f64], k_partitions: u32, equal_size: bool)
            -> Result<Vec<Vec<u32>>, SlimeError> {
            native: Ok(ks::get_seqlen_balanced_partitions(weights, k_partitions, equal_size)),
            wasm: peer_call(|i, s| {
                i.stowplan_kernel_slime().call_get_seqlen_balanced_partitions(s, weights, k_partitions, equal_size)
            }),
        }

        /// slime's `calculate_fwd_flops(seqlens, args)`, bit for bit.
        fn calculate_fwd_flops(seqlens: &[u64], args: &FlopsArgs) -> Result<Flops, SlimeError> {
            native: Ok(ks::calculate_fwd_flops(seqlens, args)),
            wasm: {
                let a = args.into();
                peer_call(|i, s| i.stowplan_kernel_slime().call_calculate_fwd_flops(s, seqlens, &a))
            },
        }

        /// slime's `build_dp_schedule` (see [`stowplan_kernel::peers::slime::build_dp_schedule`]).
        fn build_dp_schedule(args: &ScheduleArgs, model: &FlopsArgs, total_lengths: &[i64], rollout_indices: &[i64])
            -> Result<Schedule, SlimeError> {
            native: Ok(ks::build_dp_schedule(args, model, total_lengths, rollout_indices)),
            wasm: {
                let (a, m) = (args.into(), model.into());
                peer_call(|i, s| {
                    i.stowplan_kernel_slime().call_build_dp_schedule(s, a, &m, total_lengths, rollout_indices)
                })
            },
        }
    }
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
