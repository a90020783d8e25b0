//! [`KernelApi`]: every operation of the kernel, each written once — its signature, its docs
//! and what each backend runs for it, side by side (the macro `backends!` of `mod.rs`).
//! The conversions the WASM bodies use are in `convert.rs`; the component, its instances and
//! the longer WASM calls in `wasm.rs`.

use stowplan_kernel as k;
use stowplan_kernel::{
    AlignOptions, AlignedPlan, Balance, CpLayout, DistributeOptions, Distribution, DpOptions, LimitedMicroBatches,
    LimitedRawPlan, MicroLimits, MicroOptions, MultiOptions, MultiPacking, PackOptions, Packing, Partition,
    PartitionOptions, PlanLimits, PlanOptions, RawPlan, StreamLimits, StreamOptions, TwoLevelBalance,
};

use super::wasm::{self, call, wbal, wplan};
use super::{LimitedStreamPacker, StreamPacker, native};

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
        /// `options.capacities` (tokens first). See `wit/kernel.wit` (`pack.pack-multi`).
        fn pack_multi(sizes: &[u64], options: &MultiOptions<'_>) -> MultiPacking {
            native: Ok(k::pack_multi(sizes, options)?),
            wasm: call(|i, s| i.stowplan_kernel_pack().call_pack_multi(s, sizes, &options.into())).map(Into::into),
        }

        /// Splits one batch into micro-batches of at most `options.capacity` tokens with
        /// balanced costs; sample `i` also costs `extra[i]` when given (cost units, e.g. a
        /// multimodal sample's image tokens: the cap counts tokens, the balance costs), and
        /// every micro-batch stays within `limits` when given (image tokens, images …). See
        /// `wit/kernel.wit` (`balance.micro-batches`) for the count, the order and the errors;
        /// [`stowplan_kernel::ops::micro_batches`] decides what the options change.
        fn micro_batches(lengths: &[u64], extra: Option<&[u64]>, limits: Option<&MicroLimits<'_>>,
            options: &MicroOptions) -> LimitedMicroBatches {
            native: Ok(k::ops::micro_batches(lengths, extra, limits, options)?),
            wasm: {
                let l: Option<wbal::Limits> = limits.map(Into::into);
                call(|i, s| i.stowplan_kernel_balance().call_micro_batches(s, lengths, extra, l.as_ref(), options.into()))
                    .map(Into::into)
            },
        }

        /// Reorders a global batch over `dp` ranks, minimizing the costliest rank. See
        /// `wit/kernel.wit` (`balance.balance-dp`).
        fn balance_dp(lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Balance {
            native: Ok(k::balance_dp(lengths, dp, options)?),
            wasm: {
                let o = options.into();
                call(|i, s| i.stowplan_kernel_balance().call_balance_dp(s, lengths, dp, &o)).map(Into::into)
            },
        }

        /// DP balancing, then every rank's micro-batches with one common count, within `limits`
        /// when given (the extra costs of `dp_options` count at both levels). See
        /// `wit/kernel.wit` (`balance.plan`).
        fn plan(lengths: &[u64], dp: u32, dp_options: &DpOptions<'_>, micro: &MicroOptions,
            limits: Option<&MicroLimits<'_>>) -> TwoLevelBalance {
            native: Ok(k::ops::plan(lengths, dp, dp_options, micro, limits)?),
            wasm: {
                let (o, l): (wbal::DpOptions, Option<wbal::Limits>) = (dp_options.into(), limits.map(Into::into));
                call(|i, s| i.stowplan_kernel_balance().call_plan(s, lengths, dp, &o, micro.into(), l.as_ref()))
                    .map(Into::into)
            },
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

        /// The seeded permutation of `0..n` for `(seed, epoch)` (see `wit/kernel.wit`,
        /// `shuffle.permutation`): the order data sources draw an epoch's prompts in.
        fn permutation(n: u64, seed: u64, epoch: u64) -> Vec<u32> {
            native: Ok(k::shuffle::permutation(n, seed, epoch)?),
            wasm: call(|i, s| i.stowplan_kernel_shuffle().call_permutation(s, n, seed, epoch)),
        }

        /// The raw plan of `lengths`, under further limits per pack when given: image tokens,
        /// images, segments (see `wit/kernel.wit`, `plan.raw-plan`).
        fn raw_plan(lengths: &[u64], options: &PlanOptions, limits: Option<&PlanLimits<'_>>) -> LimitedRawPlan {
            native: Ok(k::ops::raw_plan(lengths, options, limits)?),
            wasm: {
                let l: Option<wplan::PlanLimits> = limits.map(Into::into);
                Ok(call(|i, s| i.stowplan_kernel_plan().call_raw_plan(s, lengths, options.into(), l.as_ref()))?
                    .try_into()?)
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
        /// `streaming`).
        fn limited_stream_packer(options: &StreamOptions, limits: &StreamLimits) -> LimitedStreamPacker {
            native: native::limited(k::LimitedStreamPacker::new(*options, limits.clone())?),
            wasm: wasm::limited_stream_packer(options, limits),
        }

        /// A limited streaming packer from [`LimitedStreamPacker::state`]'s bytes.
        fn limited_stream_packer_from_state(state: &[u8]) -> LimitedStreamPacker {
            native: native::limited(k::LimitedStreamPacker::from_state(state)?),
            wasm: wasm::limited_stream_packer_from_state(state),
        }
    }
}
