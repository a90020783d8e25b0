//! [`Kernel`] methods for the trainer layout (`layout` interface): pad factors, the
//! context-parallel split and the distribution of micro-batches to ranks, on both backends.

use stowplan_kernel as k;

use crate::wasm::{self, wlay};
use crate::{AlignOptions, Backend, CpLayout, DistributeOptions, Distribution, Error, Factor, Kernel, Padding};

fn w_align(o: &AlignOptions) -> wlay::AlignOptions {
    wlay::AlignOptions {
        cp: o.cp,
        tp: o.tp,
        factor: match o.factor {
            Factor::CpTp => wlay::Factor::CpTp,
            Factor::Roll => wlay::Factor::Roll,
            Factor::Multiple(m) => wlay::Factor::Multiple(m),
        },
        power_of_two: o.power_of_two,
    }
}

impl Kernel {
    /// The alignment factor for `options` (see `wit/kernel.wit`, `layout.pad-factor`).
    pub fn pad_factor(&self, options: &AlignOptions) -> Result<u64, Error> {
        match self.backend() {
            Backend::Native => Ok(k::pad_factor(options)?),
            Backend::Wasm => wasm::with_instance(|inst, store| {
                inst.stowplan_kernel_layout().call_pad_factor(store, w_align(options))
            })?
            .map_err(wasm::error),
        }
    }

    /// The padded packed layout of `lengths` and its zigzag split over `options.cp` ranks
    /// (see `layout.cp-layout`). [`CpRuns::of`](crate::CpRuns::of) turns it into
    /// per-rank runs that [`gather`](crate::CpRuns::gather) a rank's share of a row and
    /// [`unpack`](crate::CpRuns::unpack) the ranks' rows back into one.
    pub fn cp_layout(&self, lengths: &[u64], options: &AlignOptions) -> Result<CpLayout, Error> {
        match self.backend() {
            Backend::Native => Ok(k::cp_layout(lengths, options)?),
            Backend::Wasm => wasm::with_instance(|inst, store| {
                inst.stowplan_kernel_layout().call_cp_layout(store, lengths, w_align(options))
            })?
            .map(|l| CpLayout {
                factor: l.factor,
                cp: options.cp,
                cu_seqlens: l.cu_seqlens,
                cu_seqlens_padded: l.cu_seqlens_padded,
                max_seqlen: l.max_seqlen,
                max_seqlen_padded: l.max_seqlen_padded,
                run_offsets: l.run_offsets,
                run_starts: l.run_starts,
                run_lengths: l.run_lengths,
                local_bounds: l.local_bounds,
                rank_real_tokens: l.rank_real_tokens,
            })
            .map_err(wasm::error),
        }
    }

    /// Micro-batches under a capacity for every DP rank, the same count on each (see
    /// `layout.distribute`).
    pub fn distribute(&self, lengths: &[u64], options: &DistributeOptions<'_>) -> Result<Distribution, Error> {
        match self.backend() {
            Backend::Native => Ok(k::distribute(lengths, options)?),
            Backend::Wasm => {
                let o = wlay::DistributeOptions {
                    capacity: options.capacity,
                    dp: options.dp,
                    cost: crate::balance::w_cost(options.cost),
                    padding: match options.padding {
                        Padding::PerSequence(m) => wlay::Padding::PerSequence(m),
                        Padding::PerMicroBatch(m) => wlay::Padding::PerMicroBatch(m),
                    },
                    runs: options.runs.map(<[u32]>::to_vec),
                    mix_runs: options.mix_runs,
                };
                wasm::with_instance(|inst, store| inst.stowplan_kernel_layout().call_distribute(store, lengths, &o))?
                    .map(|d| Distribution {
                        per_rank: d.per_rank,
                        offsets: d.batches.offsets,
                        indices: d.batches.indices,
                        tokens: d.tokens,
                        real_tokens: d.real_tokens,
                        costs: d.costs,
                        rank_costs: d.rank_costs,
                        packed: d.packed,
                        splits: d.splits,
                        dummies: d.dummies,
                        lower_bound: d.lower_bound,
                    })
                    .map_err(wasm::error)
            }
        }
    }

    /// prime-rl's classic first-fit-decreasing packer, exactly (see `layout.prime-rl-ffd`):
    /// the bins (members in insertion order) and the zero-length samples prime-rl drops.
    pub fn prime_rl_ffd(
        &self,
        lengths: &[u64],
        runs: &[u32],
        labels: &[u32],
        seq_len: u64,
    ) -> Result<(Vec<Vec<u32>>, Vec<u32>), Error> {
        match self.backend() {
            Backend::Native => Ok(k::prime_rl_ffd(lengths, runs, labels, seq_len)?),
            Backend::Wasm => wasm::with_instance(|inst, store| {
                inst.stowplan_kernel_layout().call_prime_rl_ffd(store, lengths, runs, labels, seq_len)
            })?
            .map(|(g, dropped)| (crate::json::lists(&g.offsets, &g.indices), dropped))
            .map_err(wasm::error),
        }
    }
}
