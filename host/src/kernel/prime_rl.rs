//! prime-rl's HEAD packing (`wit/kernel.wit`, interface `prime-rl`) on either backend:
//! inherent methods of [`Kernel`](super::Kernel), kept apart from
//! [`KernelApi`](super::KernelApi) so the interface stays self-contained.

use stowplan_kernel::peers::prime_rl as k;
pub use stowplan_kernel::peers::prime_rl::{BatchOptions, BatchPlan};

use super::wasm::call;

backends! {
    impl Kernel {
        /// prime-rl's `_karmarkar_karp(weights, num_partitions)`, exactly (see
        /// `prime-rl.karmarkar-karp`): the groups in descending (total, members) order, members
        /// ascending.
        pub fn prime_rl_karmarkar_karp(weights: &[u64], num_partitions: u32) -> Vec<Vec<u32>> {
            native: Ok(k::karmarkar_karp(weights, num_partitions)?),
            wasm: call(|i, s| i.stowplan_kernel_prime_rl().call_karmarkar_karp(s, weights, num_partitions))
                .map(Into::into),
        }

        /// prime-rl's `balanced_partition(weights, num_partitions)`, exactly (see
        /// `prime-rl.balanced-partition`): Karmarkar–Karp, then pairwise-swap refinement.
        pub fn prime_rl_balanced_partition(weights: &[u64], num_partitions: u32) -> Vec<Vec<u32>> {
            native: Ok(k::balanced_partition(weights, num_partitions)?),
            wasm: call(|i, s| i.stowplan_kernel_prime_rl().call_balanced_partition(s, weights, num_partitions))
                .map(Into::into),
        }

        /// The plan of prime-rl's `prepare_batch`, exactly (see `prime-rl.prepare-batch`): per
        /// sample its length, run (LoRA), multimodal class (0: text) and label (routed experts).
        pub fn prime_rl_prepare_batch(lengths: &[u64], runs: &[u32], multimodal: &[u32], labels: &[u32],
            options: &BatchOptions) -> BatchPlan {
            native: Ok(k::prepare_batch(lengths, runs, multimodal, labels, options)?),
            wasm: {
                let o = options.into();
                call(|i, s| i.stowplan_kernel_prime_rl().call_prepare_batch(s, lengths, runs, multimodal, labels, o))
                    .map(Into::into)
            },
        }
    }
}
