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
    fn partition(&self, weights: &[u64], k: u32, options: &PartitionOptions) -> Result<Partition, Error> {
        Ok(k::partition(weights, k, options)?)
    }

    fn pack(&self, lengths: &[u64], options: &PackOptions) -> Result<Packing, Error> {
        Ok(k::pack(lengths, options)?)
    }

    fn pack_multi(&self, sizes: &[u64], options: &MultiOptions<'_>) -> Result<MultiPacking, Error> {
        Ok(k::pack_multi(sizes, options)?)
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

    fn micro_batches(&self, lengths: &[u64], options: &MicroOptions) -> Result<MicroBatches, Error> {
        Ok(k::micro_batches(lengths, options)?)
    }

    fn micro_batches_with_extra(
        &self,
        lengths: &[u64],
        extra: &[u64],
        options: &MicroOptions,
    ) -> Result<MicroBatches, Error> {
        Ok(k::micro_batches_with_extra(lengths, Some(extra), options)?)
    }

    fn micro_batches_limited(
        &self,
        lengths: &[u64],
        extra: Option<&[u64]>,
        limits: &MicroLimits<'_>,
        options: &MicroOptions,
    ) -> Result<LimitedMicroBatches, Error> {
        Ok(k::micro_batches_limited(lengths, extra, limits, options)?)
    }

    fn balance_dp(&self, lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Result<Balance, Error> {
        Ok(k::balance_dp(lengths, dp, options)?)
    }

    fn plan(
        &self,
        lengths: &[u64],
        dp: u32,
        dp_options: &DpOptions<'_>,
        micro: &MicroOptions,
    ) -> Result<TwoLevelBalance, Error> {
        Ok(k::plan(lengths, dp, dp_options, micro)?)
    }

    fn plan_limited(
        &self,
        lengths: &[u64],
        dp: u32,
        dp_options: &DpOptions<'_>,
        micro: &MicroOptions,
        limits: &MicroLimits<'_>,
    ) -> Result<TwoLevelBalance, Error> {
        Ok(k::plan_limited(lengths, dp, dp_options, micro, limits)?)
    }

    fn verl_rearrange_micro_batches(
        &self,
        seqlens: &[i64],
        options: &VerlMicroOptions,
    ) -> Result<Result<Vec<Vec<u32>>, PyError>, Error> {
        Ok(k::peers::verl_rearrange_micro_batches(seqlens, options))
    }

    fn balance_batch(
        &self,
        seqlens: &[i64],
        dp: u32,
        minibatch_size: Option<i64>,
    ) -> Result<Result<DpReorder, PyError>, Error> {
        Ok(k::peers::balance_batch(seqlens, dp, minibatch_size))
    }

    fn roll_load_balance(
        &self,
        lengths: &[i64],
        options: &RollLoadBalanceOptions,
    ) -> Result<Result<RollMicroBatches, PyError>, Error> {
        Ok(k::peers::roll_load_balance(lengths, options))
    }

    fn pad_factor(&self, options: &AlignOptions) -> Result<u64, Error> {
        Ok(k::pad_factor(options)?)
    }

    fn cp_layout(&self, lengths: &[u64], options: &AlignOptions) -> Result<CpLayout, Error> {
        Ok(k::cp_layout(lengths, options)?)
    }

    fn distribute(&self, lengths: &[u64], options: &DistributeOptions<'_>) -> Result<Distribution, Error> {
        Ok(k::distribute(lengths, options)?)
    }

    fn prime_rl_ffd(
        &self,
        lengths: &[u64],
        runs: &[u32],
        labels: &[u32],
        seq_len: u64,
    ) -> Result<(Vec<Vec<u32>>, Vec<u32>), Error> {
        Ok(k::prime_rl_ffd(lengths, runs, labels, seq_len)?)
    }

    fn trl_bfd(&self, lengths: &[u64], batch_ends: &[u32], seq_length: u64) -> Result<(Vec<u32>, Vec<u32>), Error> {
        Ok(k::trl::trl_bfd(lengths, batch_ends, seq_length)?)
    }

    fn permutation(&self, n: u64, seed: u64, epoch: u64) -> Result<Vec<u32>, Error> {
        Ok(k::shuffle::permutation(n, seed, epoch)?)
    }

    fn raw_plan(&self, lengths: &[u64], options: &PlanOptions) -> Result<RawPlan, Error> {
        Ok(k::raw_plan(lengths, options)?)
    }

    fn raw_plan_limited(
        &self,
        lengths: &[u64],
        options: &PlanOptions,
        limits: &PlanLimits<'_>,
    ) -> Result<LimitedRawPlan, Error> {
        Ok(k::raw_plan_limited(lengths, options, limits)?)
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
