//! The WASM backend of [`SlimeApi`]: the kernel component's `slime` interface.

use stowplan_kernel::slime::{self as ks, Flops, FlopsArgs, Schedule, ScheduleArgs, SlimeError};
use stowplan_kernel::{flatten, unflatten};

use super::bindings::exports::stowplan::kernel::slime as ws;
use super::{WasmKernel, with_instance, wtypes};
use crate::Error;
use crate::kernel::slime::SlimeApi;

fn err(e: ws::SlimeError) -> SlimeError {
    match e {
        ws::SlimeError::AssertionError(m) => SlimeError::AssertionError(m),
        ws::SlimeError::InvalidArgument(m) => SlimeError::InvalidArgument(m),
        ws::SlimeError::MissingAttribute(m) => SlimeError::MissingAttribute(m),
    }
}

fn groups(g: wtypes::Groups) -> Vec<Vec<u32>> {
    unflatten(&g.offsets, &g.indices)
}

fn arg(a: ks::Arg) -> ws::Arg {
    match a {
        ks::Arg::Missing => ws::Arg::Missing,
        ks::Arg::None => ws::Arg::IsNone,
        ks::Arg::Int(v) => ws::Arg::Value(v),
    }
}

fn flops_args(a: &FlopsArgs) -> ws::FlopsArgs {
    ws::FlopsArgs {
        hidden_size: arg(a.hidden_size),
        num_attention_heads: arg(a.num_attention_heads),
        num_query_groups: arg(a.num_query_groups),
        vocab_size: arg(a.vocab_size),
        ffn_hidden_size: arg(a.ffn_hidden_size),
        num_experts: arg(a.num_experts),
        num_layers: arg(a.num_layers),
        kv_channels: arg(a.kv_channels),
        moe_ffn_hidden_size: arg(a.moe_ffn_hidden_size),
        moe_router_topk: arg(a.moe_router_topk),
        moe_shared_expert_intermediate_size: arg(a.moe_shared_expert_intermediate_size),
        moe_layer_freq: match &a.moe_layer_freq {
            ks::LayerFreq::Missing => ws::LayerFreq::Missing,
            ks::LayerFreq::Every(f) => ws::LayerFreq::Every(*f),
            ks::LayerFreq::Pattern(p) => ws::LayerFreq::Pattern(p.clone()),
        },
        multi_latent_attention: a.multi_latent_attention,
        q_lora_rank: arg(a.q_lora_rank),
        kv_lora_rank: arg(a.kv_lora_rank),
        qk_head_dim: arg(a.qk_head_dim),
        qk_pos_emb_head_dim: arg(a.qk_pos_emb_head_dim),
        v_head_dim: arg(a.v_head_dim),
    }
}

impl SlimeApi for WasmKernel {
    fn first_fit_pack(&self, lengths: &[i64], max_tokens_per_bin: i64) -> Result<Vec<Vec<u32>>, Error> {
        with_instance(|i, s| i.stowplan_kernel_slime().call_first_fit_pack(s, lengths, max_tokens_per_bin)).map(groups)
    }

    fn expand_bins_by_splitting(
        &self,
        bins: &[Vec<u32>],
        target_count: i64,
        lengths: &[i64],
    ) -> Result<Result<Vec<Vec<u32>>, SlimeError>, Error> {
        let (offsets, indices) = flatten(bins);
        let g = wtypes::Groups { offsets, indices };
        let r = with_instance(|i, s| {
            i.stowplan_kernel_slime().call_expand_bins_by_splitting(s, &g, target_count, lengths)
        })?;
        Ok(r.map(groups).map_err(err))
    }

    fn get_seqlen_balanced_partitions(
        &self,
        weights: &[f64],
        k_partitions: u32,
        equal_size: bool,
    ) -> Result<Result<Vec<Vec<u32>>, SlimeError>, Error> {
        let r = with_instance(|i, s| {
            i.stowplan_kernel_slime().call_get_seqlen_balanced_partitions(s, weights, k_partitions, equal_size)
        })?;
        Ok(r.map(groups).map_err(err))
    }

    fn calculate_fwd_flops(&self, seqlens: &[u64], args: &FlopsArgs) -> Result<Result<Flops, SlimeError>, Error> {
        let a = flops_args(args);
        let r = with_instance(|i, s| i.stowplan_kernel_slime().call_calculate_fwd_flops(s, seqlens, &a))?;
        Ok(r.map(|f| match f {
            ws::Flops::Floating(x) => Flops::Float(x),
            ws::Flops::Integer((hi, lo)) => Flops::Int((u128::from(hi) << 64) | u128::from(lo)),
        })
        .map_err(err))
    }

    fn build_dp_schedule(
        &self,
        args: &ScheduleArgs,
        model: &FlopsArgs,
        total_lengths: &[i64],
        rollout_indices: &[i64],
    ) -> Result<Result<Schedule, SlimeError>, Error> {
        let a = ws::ScheduleArgs {
            micro_batch_size: args.micro_batch_size,
            use_dynamic_batch_size: args.use_dynamic_batch_size,
            max_tokens_per_gpu: args.max_tokens_per_gpu,
            balance_data: args.balance_data,
            balance_by_flops: args.balance_by_flops,
            dp_size: args.dp_size,
            cp_size: args.cp_size,
            vpp_size: args.vpp_size,
            microbatch_group_size_per_vp_stage: args.microbatch_group_size_per_vp_stage,
            global_batch_size: args.global_batch_size,
            python_sum: match args.python_sum {
                ks::PythonSum::Naive => ws::PythonSum::Naive,
                ks::PythonSum::Neumaier => ws::PythonSum::Neumaier,
            },
        };
        let m = flops_args(model);
        let r = with_instance(|i, s| {
            i.stowplan_kernel_slime().call_build_dp_schedule(s, a, &m, total_lengths, rollout_indices)
        })?;
        Ok(r.map(|s| Schedule {
            partitions: groups(s.partitions),
            micro_batch_sizes: groups(s.micro_batch_sizes),
            num_microbatches: s.num_microbatches,
            num_steps: s.num_steps,
        })
        .map_err(err))
    }
}
