//! The peers' entry points the kernel reproduces exactly (`wit/peers.wit`: verl, ROLL,
//! prime-rl's classic packer, TRL), on either backend: inherent methods of [`Kernel`], kept
//! apart from [`KernelApi`](super::KernelApi) so that the trait holds stowplan's own
//! operations only. slime's are [`SlimeApi`](super::SlimeApi), prime-rl's HEAD packing
//! [`prime_rl`](super::prime_rl).

use stowplan_kernel as k;
use stowplan_kernel::peers::verl::PyError;
use stowplan_kernel::peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};

use super::VerlFunction;
use super::wasm::{call, peer_call};

backends! {
    impl Kernel {
        /// Runs verl 0.9.1's `function` exactly: the outer `Result` is a runtime failure of the
        /// kernel, the inner one verl's own result or the Python exception verl raises.
        pub fn verl(function: VerlFunction, seqlens: &[i64], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, PyError> {
            native: Ok(match function {
                VerlFunction::KarmarkarKarp => k::peers::verl::karmarkar_karp(seqlens, k, equal_size),
                VerlFunction::GreedyPartition => k::peers::verl::greedy_partition(seqlens, k, equal_size),
                VerlFunction::GetSeqlenBalancedPartitions => {
                    k::peers::verl::get_seqlen_balanced_partitions(seqlens, k, equal_size)
                }
            }),
            wasm: peer_call(|i, s| i.stowplan_kernel_verl().call_call(s, function.into(), seqlens, k, equal_size)),
        }

        /// verl 0.9.1 `rearrange_micro_batches`, exactly: the outer `Result` is a runtime
        /// failure of the kernel, the inner one verl's index lists or the exception it raises.
        pub fn verl_rearrange_micro_batches(seqlens: &[i64], options: &VerlMicroOptions)
            -> Result<Vec<Vec<u32>>, PyError> {
            native: Ok(k::peers::verl_rearrange_micro_batches(seqlens, options)),
            wasm: peer_call(|i, s| {
                i.stowplan_kernel_peers().call_verl_rearrange_micro_batches(s, seqlens, options.into())
            }),
        }

        /// verl's trainer `_balance_batch` reordering, which is also ROLL's `batch_balance`,
        /// exactly (`minibatch_size` = verl's `keep_minibatch` with `ppo_mini_batch_size`).
        pub fn balance_batch(seqlens: &[i64], dp: u32, minibatch_size: Option<i64>) -> Result<DpReorder, PyError> {
            native: Ok(k::peers::balance_batch(seqlens, dp, minibatch_size)),
            wasm: peer_call(|i, s| i.stowplan_kernel_peers().call_balance_batch(s, seqlens, dp, minibatch_size)),
        }

        /// ROLL's `LoadBalancePacker` micro-batching, exactly.
        pub fn roll_load_balance(lengths: &[i64], options: &RollLoadBalanceOptions)
            -> Result<RollMicroBatches, PyError> {
            native: Ok(k::peers::roll_load_balance(lengths, options)),
            wasm: peer_call(|i, s| i.stowplan_kernel_peers().call_roll_load_balance(s, lengths, options.into())),
        }

        /// prime-rl's classic first-fit-decreasing packer, exactly (see `prime-rl.ffd` in `wit/peers.wit`):
        /// the bins (members in insertion order) and the zero-length samples prime-rl drops.
        pub fn prime_rl_ffd(lengths: &[u64], runs: &[u32], labels: &[u32], seq_len: u64) -> (Vec<Vec<u32>>, Vec<u32>) {
            native: Ok(k::prime_rl_ffd(lengths, runs, labels, seq_len)?),
            wasm: call(|i, s| i.stowplan_kernel_prime_rl().call_ffd(s, lengths, runs, labels, seq_len))
                .map(|(bins, dropped)| (bins.into(), dropped)),
        }

        /// TRL's best fit decreasing per map batch, exactly (see `wit/peers.wit`, `trl.bfd`): the
        /// bins as `(offsets, indices)`, members in the order they went in.
        pub fn trl_bfd(lengths: &[u64], batch_ends: &[u32], seq_length: u64) -> (Vec<u32>, Vec<u32>) {
            native: Ok(k::peers::trl::trl_bfd(lengths, batch_ends, seq_length)?),
            wasm: call(|i, s| i.stowplan_kernel_trl().call_bfd(s, lengths, batch_ends, seq_length))
                .map(|g| (g.offsets, g.indices)),
        }
    }
}
