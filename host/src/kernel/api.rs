//! [`KernelApi`]: every operation of the kernel, each written once — its signature, its docs
//! and what each backend runs for it, side by side (the macro `backends!` of `mod.rs`).
//! The conversions the WASM bodies use are in `convert.rs`; the component, its instances and
//! the longer WASM calls in `wasm.rs`.

use stowplan_kernel as k;
use stowplan_kernel::peers::verl::PyError;
use stowplan_kernel::peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};
use stowplan_kernel::{
    AlignOptions, AlignedPlan, Balance, CpLayout, DistributeOptions, Distribution, DpOptions, LimitedMicroBatches,
    LimitedRawPlan, MicroBatches, MicroLimits, MicroOptions, MultiOptions, MultiPacking, PackOptions, Packing,
    Partition, PartitionOptions, PlanLimits, PlanOptions, RawPlan, StreamLimits, StreamOptions, TwoLevelBalance,
};

use super::wasm::{self, call, peer_call};
use super::{LimitedStreamPacker, StreamPacker, VerlFunction, native};

backends! {
    /// Every operation of the kernel (`wit/kernel.wit`), as each backend implements it. Call
    /// them on a [`Kernel`](super::Kernel) (`kernel.partition(…)`): it dereferences to its
    /// backend's implementation. Results are identical on both backends (tests prove it on
    /// every vector and on random inputs).
    pub trait KernelApi {
        /// Splits `weights` into `k` groups with balanced sums. See `wit/kernel.wit`
        /// (`partition`) for the methods, the order of the result and the errors.
        fn partition(weights: &[u64], k: u32, options: &PartitionOptions) -> Partition {
            native: Ok(k::partition(weights, k, options)?),
            wasm: call(|i, s| i.stowplan_kernel_partition().call_partition(s, weights, k, options.into()))
                .map(Into::into),
        }

        /// Packs `lengths` into bins of `options.capacity` tokens. See `wit/kernel.wit` (`pack`).
        fn pack(lengths: &[u64], options: &PackOptions) -> Packing {
            native: Ok(k::pack(lengths, options)?),
            wasm: wasm::pack(lengths, options),
        }

        /// Packs items under several limits at once: `sizes` row by row, one value per entry of
        /// `options.capacities` (tokens first). See `wit/kernel.wit` (`multi-pack`).
        fn pack_multi(sizes: &[u64], options: &MultiOptions<'_>) -> MultiPacking {
            native: Ok(k::pack_multi(sizes, options)?),
            wasm: call(|i, s| i.stowplan_kernel_multi_pack().call_pack(s, sizes, &options.into())).map(Into::into),
        }

        /// Runs verl 0.9.1's `function` exactly: the outer `Result` is a runtime failure of the
        /// kernel, the inner one verl's own result or the Python exception verl raises.
        fn verl(function: VerlFunction, seqlens: &[i64], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, PyError> {
            native: Ok(match function {
                VerlFunction::KarmarkarKarp => k::peers::verl::karmarkar_karp(seqlens, k, equal_size),
                VerlFunction::GreedyPartition => k::peers::verl::greedy_partition(seqlens, k, equal_size),
                VerlFunction::GetSeqlenBalancedPartitions => {
                    k::peers::verl::get_seqlen_balanced_partitions(seqlens, k, equal_size)
                }
            }),
            wasm: peer_call(|i, s| i.stowplan_kernel_verl().call_call(s, function.into(), seqlens, k, equal_size)),
        }

        /// Splits one batch into micro-batches of at most `options.max_token_len` tokens with
        /// balanced costs. See `wit/kernel.wit` (`balance.micro-batches`) for the count, the
        /// order and the errors.
        fn micro_batches(lengths: &[u64], options: &MicroOptions) -> MicroBatches {
            native: Ok(k::micro_batches(lengths, options)?),
            wasm: call(|i, s| i.stowplan_kernel_balance().call_micro_batches(s, lengths, options.into()))
                .map(Into::into),
        }

        /// [`micro_batches`](Self::micro_batches) where sample `i` also costs `extra[i]` (cost
        /// units, e.g. a multimodal sample's image tokens): the cap counts tokens, the balance
        /// costs (`wit/kernel.wit`, `multimodal`). [`DpOptions::extra_costs`] and
        /// [`DistributeOptions::extra_costs`] do the same for the other balancing calls.
        fn micro_batches_with_extra(lengths: &[u64], extra: &[u64], options: &MicroOptions) -> MicroBatches {
            native: Ok(k::micro_batches_with_extra(lengths, Some(extra), options)?),
            wasm: call(|i, s| i.stowplan_kernel_multimodal().call_micro_batches(s, lengths, extra, options.into()))
                .map(Into::into),
        }

        /// Micro-batches within the token cap and further caps per micro-batch (image tokens,
        /// images …), balancing the cost plus `extra` costs. See `wit/kernel.wit` (`multi-micro`)
        /// and [`stowplan_kernel::micro_batches_limited`].
        fn micro_batches_limited(lengths: &[u64], extra: Option<&[u64]>, limits: &MicroLimits<'_>,
            options: &MicroOptions) -> LimitedMicroBatches {
            native: Ok(k::micro_batches_limited(lengths, extra, limits, options)?),
            wasm: {
                let (l, o) = (limits.into(), options.into());
                call(|i, s| i.stowplan_kernel_multi_micro().call_micro_batches(s, lengths, extra, &l, o))
                    .map(Into::into)
            },
        }

        /// Reorders a global batch over `dp` ranks, minimizing the costliest rank. See
        /// `wit/kernel.wit` (`balance.balance-dp`).
        fn balance_dp(lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Balance {
            native: Ok(k::balance_dp(lengths, dp, options)?),
            wasm: {
                let o = options.into();
                match options.extra_costs {
                    Some(e) => call(|i, s| i.stowplan_kernel_multimodal().call_balance_dp(s, lengths, e, dp, &o)),
                    None => call(|i, s| i.stowplan_kernel_balance().call_balance_dp(s, lengths, dp, &o)),
                }
                .map(Into::into)
            },
        }

        /// DP balancing, then every rank's micro-batches with one common count. See
        /// `wit/kernel.wit` (`balance.plan`).
        fn plan(lengths: &[u64], dp: u32, dp_options: &DpOptions<'_>, micro: &MicroOptions) -> TwoLevelBalance {
            native: Ok(k::plan(lengths, dp, dp_options, micro)?),
            wasm: {
                let (o, m) = (dp_options.into(), micro.into());
                match dp_options.extra_costs {
                    Some(e) => call(|i, s| i.stowplan_kernel_multimodal().call_plan(s, lengths, e, dp, &o, m)),
                    None => call(|i, s| i.stowplan_kernel_balance().call_plan(s, lengths, dp, &o, m)),
                }
                .map(Into::into)
            },
        }

        /// [`plan`](Self::plan) under further caps per micro-batch (image tokens, images …):
        /// every rank's micro-batches within the token cap and every limit, one common count
        /// (see `wit/kernel.wit`, `multi-micro.plan`).
        fn plan_limited(lengths: &[u64], dp: u32, dp_options: &DpOptions<'_>, micro: &MicroOptions,
            limits: &MicroLimits<'_>) -> TwoLevelBalance {
            native: Ok(k::plan_limited(lengths, dp, dp_options, micro, limits)?),
            wasm: {
                let (o, m, l) = (dp_options.into(), micro.into(), limits.into());
                let e = dp_options.extra_costs;
                call(|i, s| i.stowplan_kernel_multi_micro().call_plan(s, lengths, e, &l, dp, &o, m)).map(Into::into)
            },
        }

        /// verl 0.9.1 `rearrange_micro_batches`, exactly: the outer `Result` is a runtime
        /// failure of the kernel, the inner one verl's index lists or the exception it raises.
        fn verl_rearrange_micro_batches(seqlens: &[i64], options: &VerlMicroOptions)
            -> Result<Vec<Vec<u32>>, PyError> {
            native: Ok(k::peers::verl_rearrange_micro_batches(seqlens, options)),
            wasm: peer_call(|i, s| {
                i.stowplan_kernel_peers().call_verl_rearrange_micro_batches(s, seqlens, options.into())
            }),
        }

        /// verl's trainer `_balance_batch` reordering, which is also ROLL's `batch_balance`,
        /// exactly (`minibatch_size` = verl's `keep_minibatch` with `ppo_mini_batch_size`).
        fn balance_batch(seqlens: &[i64], dp: u32, minibatch_size: Option<i64>) -> Result<DpReorder, PyError> {
            native: Ok(k::peers::balance_batch(seqlens, dp, minibatch_size)),
            wasm: peer_call(|i, s| i.stowplan_kernel_peers().call_balance_batch(s, seqlens, dp, minibatch_size)),
        }

        /// ROLL's `LoadBalancePacker` micro-batching, exactly.
        fn roll_load_balance(lengths: &[i64], options: &RollLoadBalanceOptions)
            -> Result<RollMicroBatches, PyError> {
            native: Ok(k::peers::roll_load_balance(lengths, options)),
            wasm: peer_call(|i, s| i.stowplan_kernel_peers().call_roll_load_balance(s, lengths, options.into())),
        }

        /// The alignment factor for `options` (see `wit/kernel.wit`, `layout.pad-factor`).
        fn pad_factor(options: &AlignOptions) -> u64 {
            native: Ok(k::pad_factor(options)?),
            wasm: call(|i, s| i.stowplan_kernel_layout().call_pad_factor(s, options.into())),
        }

        /// The padded packed layout of `lengths` and its zigzag split over `options.cp` ranks
        /// (see `layout.cp-layout`). [`CpRuns::of`](crate::materialize::CpRuns::of) turns it into per-rank
        /// runs that gather a rank's share of a row and unpack the ranks' rows back into one.
        fn cp_layout(lengths: &[u64], options: &AlignOptions) -> CpLayout {
            native: Ok(k::cp_layout(lengths, options)?),
            wasm: call(|i, s| i.stowplan_kernel_layout().call_cp_layout(s, lengths, options.into())).map(Into::into),
        }

        /// Micro-batches under a capacity for every DP rank, the same count on each (see
        /// `layout.distribute`).
        fn distribute(lengths: &[u64], options: &DistributeOptions<'_>) -> Distribution {
            native: Ok(k::distribute(lengths, options)?),
            wasm: wasm::distribute(lengths, options),
        }

        /// prime-rl's classic first-fit-decreasing packer, exactly (see `layout.prime-rl-ffd`):
        /// the bins (members in insertion order) and the zero-length samples prime-rl drops.
        fn prime_rl_ffd(lengths: &[u64], runs: &[u32], labels: &[u32], seq_len: u64) -> (Vec<Vec<u32>>, Vec<u32>) {
            native: Ok(k::prime_rl_ffd(lengths, runs, labels, seq_len)?),
            wasm: call(|i, s| i.stowplan_kernel_layout().call_prime_rl_ffd(s, lengths, runs, labels, seq_len))
                .map(|(bins, dropped)| (bins.into(), dropped)),
        }

        /// TRL's best fit decreasing per map batch, exactly (see `wit/kernel.wit`, `trl.bfd`): the
        /// bins as `(offsets, indices)`, members in the order they went in.
        fn trl_bfd(lengths: &[u64], batch_ends: &[u32], seq_length: u64) -> (Vec<u32>, Vec<u32>) {
            native: Ok(k::peers::trl::trl_bfd(lengths, batch_ends, seq_length)?),
            wasm: call(|i, s| i.stowplan_kernel_trl().call_bfd(s, lengths, batch_ends, seq_length))
                .map(|g| (g.offsets, g.indices)),
        }

        /// The seeded permutation of `0..n` for `(seed, epoch)` (see `wit/kernel.wit`,
        /// `shuffle.permutation`): the order data sources draw an epoch's prompts in.
        fn permutation(n: u64, seed: u64, epoch: u64) -> Vec<u32> {
            native: Ok(k::shuffle::permutation(n, seed, epoch)?),
            wasm: call(|i, s| i.stowplan_kernel_shuffle().call_permutation(s, n, seed, epoch)),
        }

        /// The raw plan of `lengths` (see `wit/kernel.wit`, `plan.raw-plan`).
        fn raw_plan(lengths: &[u64], options: &PlanOptions) -> RawPlan {
            native: Ok(k::raw_plan(lengths, options)?),
            wasm: Ok(call(|i, s| i.stowplan_kernel_plan().call_raw_plan(s, lengths, options.into()))?.try_into()?),
        }

        /// The raw plan of `lengths` under further limits per pack: image tokens, images,
        /// segments (see `wit/kernel.wit`, `multi-plan.raw-plan`).
        fn raw_plan_limited(lengths: &[u64], options: &PlanOptions, limits: &PlanLimits<'_>) -> LimitedRawPlan {
            native: Ok(k::raw_plan_limited(lengths, options, limits)?),
            wasm: {
                let (o, l) = (options.into(), limits.into());
                Ok(call(|i, s| i.stowplan_kernel_multi_plan().call_raw_plan(s, lengths, o, &l))?.try_into()?)
            },
        }

        /// The plan `world_size` ranks consume from `raw` (see `plan.align-plan`): truncated to a
        /// multiple of `world_size` with `drop_last`, else padded by repeating the first packs.
        fn aligned_plan(raw: &RawPlan, world_size: u32, drop_last: bool) -> AlignedPlan {
            native: Ok(k::aligned_plan(&raw.offsets, &raw.indices, world_size, drop_last)?),
            wasm: wasm::aligned_plan(raw, world_size, drop_last),
        }

        /// An empty streaming packer (see `wit/kernel.wit`, `streaming`). On the WASM backend it
        /// owns an instance of its own, which holds its state between calls.
        fn stream_packer(options: &StreamOptions) -> StreamPacker {
            native: native::stream_packer(k::StreamPacker::new(*options)?),
            wasm: wasm::stream_packer(options),
        }

        /// A streaming packer from [`StreamPacker::state`]'s bytes (damage and other versions are
        /// refused with `invalid-argument`).
        fn stream_packer_from_state(state: &[u8]) -> StreamPacker {
            native: native::stream_packer(k::StreamPacker::from_state(state)?),
            wasm: wasm::stream_packer_from_state(state),
        }

        /// An empty streaming packer under further limits per bin (see `wit/kernel.wit`,
        /// `multi-streaming`).
        fn limited_stream_packer(options: &StreamOptions, limits: &StreamLimits) -> LimitedStreamPacker {
            native: native::limited(k::LimitedStreamPacker::new(*options, limits.clone())?),
            wasm: wasm::multi_stream::create(options, limits),
        }

        /// A limited streaming packer from [`LimitedStreamPacker::state`]'s bytes.
        fn limited_stream_packer_from_state(state: &[u8]) -> LimitedStreamPacker {
            native: native::limited(k::LimitedStreamPacker::from_state(state)?),
            wasm: wasm::multi_stream::restore(state),
        }
    }
}
