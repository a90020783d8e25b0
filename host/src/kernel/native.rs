//! The native backend: the kernel crate called directly.

use stowplan_kernel as k;
use stowplan_kernel::peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};
use stowplan_kernel::verl::PyError;
use stowplan_kernel::{
    AlignOptions, AlignedPlan, Balance, CpLayout, DistributeOptions, Distribution, DpOptions, MicroBatches,
    MicroOptions, MultiOptions, MultiPacking, PackOptions, Packing, Partition, PartitionOptions, PlanOptions, RawPlan,
    TwoLevelBalance,
};

use stowplan_kernel::{ClosedBins, LimitedClosedBins, StreamLimits, StreamOptions, StreamStatus};
use stowplan_kernel::{LimitedMicroBatches, LimitedRawPlan, MicroLimits, PlanLimits};

use super::{KernelApi, LimitedStreamPacker, StreamBackend, StreamPacker, VerlFunction};
use crate::Error;

/// The kernel crate, compiled natively.
#[derive(Debug)]
pub(super) struct NativeKernel;

impl KernelApi for NativeKernel {
    forward! {
        fn partition(weights: &[u64], k: u32, options: &PartitionOptions) -> Partition = try k::partition;
        fn pack(lengths: &[u64], options: &PackOptions) -> Packing = try k::pack;
        fn pack_multi(sizes: &[u64], options: &MultiOptions<'_>) -> MultiPacking = try k::pack_multi;
        fn micro_batches(lengths: &[u64], options: &MicroOptions) -> MicroBatches = try k::micro_batches;
        fn micro_batches_limited(lengths: &[u64], extra: Option<&[u64]>, limits: &MicroLimits<'_>, options: &MicroOptions)
            -> LimitedMicroBatches = try k::micro_batches_limited;
        fn balance_dp(lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Balance = try k::balance_dp;
        fn plan(lengths: &[u64], dp: u32, dp_options: &DpOptions<'_>, micro: &MicroOptions) -> TwoLevelBalance = try k::plan;
        fn plan_limited(lengths: &[u64], dp: u32, dp_options: &DpOptions<'_>, micro: &MicroOptions, limits: &MicroLimits<'_>)
            -> TwoLevelBalance = try k::plan_limited;
        fn verl_rearrange_micro_batches(seqlens: &[i64], options: &VerlMicroOptions)
            -> Result<Vec<Vec<u32>>, PyError> = ok k::peers::verl_rearrange_micro_batches;
        fn balance_batch(seqlens: &[i64], dp: u32, minibatch_size: Option<i64>) -> Result<DpReorder, PyError>
            = ok k::peers::balance_batch;
        fn roll_load_balance(lengths: &[i64], options: &RollLoadBalanceOptions) -> Result<RollMicroBatches, PyError>
            = ok k::peers::roll_load_balance;
        fn pad_factor(options: &AlignOptions) -> u64 = try k::pad_factor;
        fn cp_layout(lengths: &[u64], options: &AlignOptions) -> CpLayout = try k::cp_layout;
        fn distribute(lengths: &[u64], options: &DistributeOptions<'_>) -> Distribution = try k::distribute;
        fn prime_rl_ffd(lengths: &[u64], runs: &[u32], labels: &[u32], seq_len: u64) -> (Vec<Vec<u32>>, Vec<u32>)
            = try k::prime_rl_ffd;
        fn trl_bfd(lengths: &[u64], batch_ends: &[u32], seq_length: u64) -> (Vec<u32>, Vec<u32>) = try k::trl::trl_bfd;
        fn permutation(n: u64, seed: u64, epoch: u64) -> Vec<u32> = try k::shuffle::permutation;
        fn raw_plan(lengths: &[u64], options: &PlanOptions) -> RawPlan = try k::raw_plan;
        fn raw_plan_limited(lengths: &[u64], options: &PlanOptions, limits: &PlanLimits<'_>) -> LimitedRawPlan
            = try k::raw_plan_limited;
    }

    fn verl(
        &self,
        function: VerlFunction,
        seqlens: &[i64],
        k: u32,
        equal_size: bool,
    ) -> Result<Result<Vec<Vec<u32>>, PyError>, Error> {
        use stowplan_kernel::verl as kv;
        Ok(match function {
            VerlFunction::KarmarkarKarp => kv::karmarkar_karp(seqlens, k, equal_size),
            VerlFunction::GreedyPartition => kv::greedy_partition(seqlens, k, equal_size),
            VerlFunction::GetSeqlenBalancedPartitions => kv::get_seqlen_balanced_partitions(seqlens, k, equal_size),
        })
    }

    fn micro_batches_with_extra(
        &self,
        lengths: &[u64],
        extra: &[u64],
        options: &MicroOptions,
    ) -> Result<MicroBatches, Error> {
        Ok(k::micro_batches_with_extra(lengths, Some(extra), options)?)
    }

    fn aligned_plan(&self, raw: &RawPlan, world_size: u32, drop_last: bool) -> Result<AlignedPlan, Error> {
        Ok(k::aligned_plan(&raw.offsets, &raw.indices, world_size, drop_last)?)
    }

    fn stream_packer(&self, options: &StreamOptions) -> Result<StreamPacker, Error> {
        Ok(StreamPacker::new(Box::new(k::StreamPacker::new(*options)?), *options))
    }

    fn stream_packer_from_state(&self, state: &[u8]) -> Result<StreamPacker, Error> {
        let packer = k::StreamPacker::from_state(state)?;
        let options = *packer.options();
        Ok(StreamPacker::new(Box::new(packer), options))
    }

    fn limited_stream_packer(
        &self,
        options: &StreamOptions,
        limits: &StreamLimits,
    ) -> Result<LimitedStreamPacker, Error> {
        limited(k::LimitedStreamPacker::new(*options, limits.clone())?)
    }

    fn limited_stream_packer_from_state(&self, state: &[u8]) -> Result<LimitedStreamPacker, Error> {
        limited(k::LimitedStreamPacker::from_state(state)?)
    }
}

/// The host's wrapper of a native limited packer.
fn limited(packer: k::LimitedStreamPacker) -> Result<LimitedStreamPacker, Error> {
    let (options, limits) = (*packer.options(), packer.limits().clone());
    Ok(LimitedStreamPacker::new(Box::new(packer), options, limits))
}

impl StreamBackend<LimitedClosedBins> for k::LimitedStreamPacker {
    fn add(&mut self, rows: &[u64]) -> Result<LimitedClosedBins, Error> {
        Ok(k::LimitedStreamPacker::add(self, rows)?)
    }

    fn finish(&mut self) -> Result<LimitedClosedBins, Error> {
        Ok(k::LimitedStreamPacker::finish(self))
    }

    fn state(&mut self) -> Result<Vec<u8>, Error> {
        Ok(k::LimitedStreamPacker::state(self))
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        Ok(k::LimitedStreamPacker::status(self))
    }
}

impl StreamBackend<ClosedBins> for k::StreamPacker {
    fn add(&mut self, lengths: &[u64]) -> Result<ClosedBins, Error> {
        Ok(k::StreamPacker::add(self, lengths)?)
    }

    fn finish(&mut self) -> Result<ClosedBins, Error> {
        Ok(k::StreamPacker::finish(self))
    }

    fn state(&mut self) -> Result<Vec<u8>, Error> {
        Ok(k::StreamPacker::state(self))
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        Ok(k::StreamPacker::status(self))
    }
}
