//! [`Kernel`] methods for balancing (`balance` interface) and the peers' exact modes
//! (`peers` interface), on both backends.

use stowplan_kernel as k;

use crate::wasm::{self, wbal, wpeers, wtypes};
use crate::{Backend, Cost, DpOptions, DpPlan, Error, Kernel, MicroOptions, MicroPlan, Order, Plan, PyError};
use crate::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};

pub(crate) fn w_cost(c: Cost) -> wbal::Cost {
    wbal::Cost { linear: c.linear, quadratic: c.quadratic }
}

fn w_micro(o: &MicroOptions) -> wbal::MicroOptions {
    wbal::MicroOptions {
        max_token_len: o.max_token_len,
        cost: w_cost(o.cost),
        min_count: o.min_count,
        divisible_by: o.divisible_by,
        count: o.count,
        order: match o.order {
            Order::None => wbal::Order::None,
            Order::CostDesc => wbal::Order::CostDesc,
            Order::Verl => wbal::Order::Verl,
            Order::Roll => wbal::Order::Roll,
        },
    }
}

fn w_dp(o: &DpOptions<'_>) -> wbal::DpOptions {
    wbal::DpOptions {
        cost: w_cost(o.cost),
        groups: o.groups.map(<[u32]>::to_vec),
        minibatch_size: o.minibatch_size,
        equal_count: o.equal_count,
    }
}

fn micro_plan(p: wbal::MicroPlan) -> MicroPlan {
    MicroPlan {
        offsets: p.batches.offsets,
        indices: p.batches.indices,
        tokens: p.tokens,
        costs: p.costs,
        restore: p.restore,
        lower_bound: p.lower_bound,
        required: p.required,
    }
}

fn dp_plan(p: wbal::DpPlan) -> DpPlan {
    DpPlan {
        offsets: p.ranks.offsets,
        order: p.ranks.indices,
        tokens: p.tokens,
        costs: p.costs,
        cost_lower_bound: p.cost_lower_bound,
    }
}

fn py_error(e: wpeers::PyError) -> PyError {
    let m = e.message;
    match e.exception.as_str() {
        "AssertionError" => PyError::AssertionError(m),
        "IndexError" => PyError::IndexError(m),
        "TypeError" => PyError::TypeError(m),
        "ZeroDivisionError" => PyError::ZeroDivisionError(m),
        "MemoryError" => PyError::MemoryError(m),
        _ => PyError::ValueError(m),
    }
}

fn lists(g: wtypes::Groups) -> Vec<Vec<u32>> {
    crate::json::lists(&g.offsets, &g.indices)
}

impl Kernel {
    /// Splits one batch into micro-batches of at most `options.max_token_len` tokens with
    /// balanced costs. See `wit/kernel.wit` (`balance.micro-batches`) for the count, the
    /// order and the errors.
    pub fn micro_batches(&self, lengths: &[u64], options: &MicroOptions) -> Result<MicroPlan, Error> {
        match self.backend() {
            Backend::Native => Ok(k::micro_batches(lengths, options)?),
            Backend::Wasm => wasm::with_instance(|inst, store| {
                inst.stowplan_kernel_balance().call_micro_batches(store, lengths, w_micro(options))
            })?
            .map(micro_plan)
            .map_err(wasm::error),
        }
    }

    /// Reorders a global batch over `dp` ranks, minimizing the costliest rank. See
    /// `wit/kernel.wit` (`balance.balance-dp`).
    pub fn balance_dp(&self, lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Result<DpPlan, Error> {
        match self.backend() {
            Backend::Native => Ok(k::balance_dp(lengths, dp, options)?),
            Backend::Wasm => wasm::with_instance(|inst, store| {
                inst.stowplan_kernel_balance().call_balance_dp(store, lengths, dp, &w_dp(options))
            })?
            .map(dp_plan)
            .map_err(wasm::error),
        }
    }

    /// DP balancing, then every rank's micro-batches with one common count. See
    /// `wit/kernel.wit` (`balance.plan`).
    pub fn plan(
        &self,
        lengths: &[u64],
        dp: u32,
        dp_options: &DpOptions<'_>,
        micro: &MicroOptions,
    ) -> Result<Plan, Error> {
        match self.backend() {
            Backend::Native => Ok(k::plan(lengths, dp, dp_options, micro)?),
            Backend::Wasm => wasm::with_instance(|inst, store| {
                inst.stowplan_kernel_balance().call_plan(store, lengths, dp, &w_dp(dp_options), w_micro(micro))
            })?
            .map(|p| Plan { dp: dp_plan(p.dp), ranks: p.ranks.into_iter().map(micro_plan).collect() })
            .map_err(wasm::error),
        }
    }

    /// verl 0.9.1 `rearrange_micro_batches`, exactly: the outer `Result` is a runtime
    /// failure of the kernel, the inner one verl's index lists or the exception it raises.
    pub fn verl_rearrange_micro_batches(
        &self,
        seqlens: &[i64],
        options: &VerlMicroOptions,
    ) -> Result<Result<Vec<Vec<u32>>, PyError>, Error> {
        match self.backend() {
            Backend::Native => Ok(k::peers::verl_rearrange_micro_batches(seqlens, options)),
            Backend::Wasm => {
                let o = wpeers::VerlMicroOptions {
                    max_token_len: options.max_token_len,
                    min_num_micro_batch: options.min_num_micro_batch,
                    num_batches_divided_by: options.num_batches_divided_by,
                    use_dynamic_bsz_balance: options.use_dynamic_bsz_balance,
                    force_group_size: options.force_group_size,
                    padded_width: options.padded_width,
                    dp_num_micro_batches: options.dp_num_micro_batches,
                };
                let r = wasm::with_instance(|inst, store| {
                    inst.stowplan_kernel_peers().call_verl_rearrange_micro_batches(store, seqlens, o)
                })?;
                Ok(r.map(lists).map_err(py_error))
            }
        }
    }

    /// verl's trainer `_balance_batch` reordering, which is also ROLL's `batch_balance`,
    /// exactly (`minibatch_size` = verl's `keep_minibatch` with `ppo_mini_batch_size`).
    pub fn balance_batch(
        &self,
        seqlens: &[i64],
        dp: u32,
        minibatch_size: Option<i64>,
    ) -> Result<Result<DpReorder, PyError>, Error> {
        match self.backend() {
            Backend::Native => Ok(k::peers::balance_batch(seqlens, dp, minibatch_size)),
            Backend::Wasm => {
                let r = wasm::with_instance(|inst, store| {
                    inst.stowplan_kernel_peers().call_balance_batch(store, seqlens, dp, minibatch_size)
                })?;
                Ok(r.map(|d| DpReorder {
                    partitions: lists(d.partitions),
                    kk_partitions: d.kk_partitions.into_iter().map(lists).collect(),
                    dropped: d.dropped,
                })
                .map_err(py_error))
            }
        }
    }

    /// ROLL's `LoadBalancePacker` micro-batching, exactly.
    pub fn roll_load_balance(
        &self,
        lengths: &[i64],
        options: &RollLoadBalanceOptions,
    ) -> Result<Result<RollMicroBatches, PyError>, Error> {
        match self.backend() {
            Backend::Native => Ok(k::peers::roll_load_balance(lengths, options)),
            Backend::Wasm => {
                let o = wpeers::RollOptions {
                    mask_width: options.mask_width,
                    max_packed_sequence_length: options.max_packed_sequence_length,
                    min_num_micro_batches: options.min_num_micro_batches,
                    tp: options.tp,
                    cp: options.cp,
                    vp: options.vp,
                    dp_num_micro_batches: options.dp_num_micro_batches,
                };
                let r = wasm::with_instance(|inst, store| {
                    inst.stowplan_kernel_peers().call_roll_load_balance(store, lengths, o)
                })?;
                Ok(r.map(|m| RollMicroBatches {
                    micro_batches: lists(m.micro_batches),
                    kk_partitions: lists(m.kk_partitions),
                    pad_factor: m.pad_factor,
                    padded_lengths: m.padded_lengths,
                })
                .map_err(py_error))
            }
        }
    }
}
