//! Glue between the `prime-rl` WIT interface and `stowplan_kernel::peers::prime_rl`.

use super::Vec;

use stowplan_kernel::peers::prime_rl as p;

use super::exports::stowplan::kernel::prime_rl as w;
use super::{Kernel, error, groups_of, types};

impl w::Guest for Kernel {
    fn karmarkar_karp(weights: Vec<u64>, num_partitions: u32) -> Result<types::Groups, types::Error> {
        p::karmarkar_karp(&weights, num_partitions).map(groups_of).map_err(error)
    }

    fn balanced_partition(weights: Vec<u64>, num_partitions: u32) -> Result<types::Groups, types::Error> {
        p::balanced_partition(&weights, num_partitions).map(groups_of).map_err(error)
    }

    fn prepare_batch(
        lengths: Vec<u64>,
        runs: Vec<u32>,
        multimodal: Vec<u32>,
        labels: Vec<u32>,
        o: w::BatchOptions,
    ) -> Result<w::BatchPlan, types::Error> {
        p::prepare_batch(&lengths, &runs, &multimodal, &labels, &o.into()).map(Into::into).map_err(error)
    }

    fn ffd(
        lengths: Vec<u64>,
        runs: Vec<u32>,
        labels: Vec<u32>,
        seq_len: u64,
    ) -> Result<(types::Groups, Vec<u32>), types::Error> {
        let (bins, dropped) = stowplan_kernel::prime_rl_ffd(&lengths, &runs, &labels, seq_len).map_err(error)?;
        Ok((groups_of(bins), dropped))
    }
}
