//! Glue between the WIT `slime` interface and `stowplan_kernel::slime`.

use super::alloc::vec::Vec;

use stowplan_kernel as k;
use stowplan_kernel::slime as ks;

use super::exports::stowplan::kernel::{slime, types};
use super::{Kernel, groups_of};

fn slime_error(e: ks::SlimeError) -> slime::SlimeError {
    match e {
        ks::SlimeError::AssertionError(m) => slime::SlimeError::AssertionError(m),
        ks::SlimeError::InvalidArgument(m) => slime::SlimeError::InvalidArgument(m),
        ks::SlimeError::MissingAttribute(m) => slime::SlimeError::MissingAttribute(m),
    }
}

fn arg(a: slime::Arg) -> ks::Arg {
    match a {
        slime::Arg::Missing => ks::Arg::Missing,
        slime::Arg::IsNone => ks::Arg::None,
        slime::Arg::Value(v) => ks::Arg::Int(v),
    }
}

fn flops_args(a: slime::FlopsArgs) -> ks::FlopsArgs {
    ks::FlopsArgs {
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
        moe_layer_freq: match a.moe_layer_freq {
            slime::LayerFreq::Missing => ks::LayerFreq::Missing,
            slime::LayerFreq::Every(f) => ks::LayerFreq::Every(f),
            slime::LayerFreq::Pattern(p) => ks::LayerFreq::Pattern(p),
        },
        multi_latent_attention: a.multi_latent_attention,
        q_lora_rank: arg(a.q_lora_rank),
        kv_lora_rank: arg(a.kv_lora_rank),
        qk_head_dim: arg(a.qk_head_dim),
        qk_pos_emb_head_dim: arg(a.qk_pos_emb_head_dim),
        v_head_dim: arg(a.v_head_dim),
    }
}

impl slime::Guest for Kernel {
    fn first_fit_pack(lengths: Vec<i64>, max_tokens_per_bin: i64) -> types::Groups {
        groups_of(ks::first_fit_pack(&lengths, max_tokens_per_bin))
    }

    fn expand_bins_by_splitting(
        bins: types::Groups,
        target_count: i64,
        lengths: Vec<i64>,
    ) -> Result<types::Groups, slime::SlimeError> {
        let bins = k::unflatten(&bins.offsets, &bins.indices);
        ks::expand_bins_by_splitting(bins, target_count, &lengths).map(groups_of).map_err(slime_error)
    }

    fn get_seqlen_balanced_partitions(
        weights: Vec<f64>,
        k_partitions: u32,
        equal_size: bool,
    ) -> Result<types::Groups, slime::SlimeError> {
        ks::get_seqlen_balanced_partitions(&weights, k_partitions, equal_size).map(groups_of).map_err(slime_error)
    }

    fn calculate_fwd_flops(seqlens: Vec<u64>, args: slime::FlopsArgs) -> Result<slime::Flops, slime::SlimeError> {
        match ks::calculate_fwd_flops(&seqlens, &flops_args(args)).map_err(slime_error)? {
            ks::Flops::Float(f) => Ok(slime::Flops::Floating(f)),
            ks::Flops::Int(i) => Ok(slime::Flops::Integer(((i >> 64) as u64, i as u64))),
        }
    }

    fn build_dp_schedule(
        args: slime::ScheduleArgs,
        model: slime::FlopsArgs,
        total_lengths: Vec<i64>,
        rollout_indices: Vec<i64>,
    ) -> Result<slime::Schedule, slime::SlimeError> {
        let a = ks::ScheduleArgs {
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
                slime::PythonSum::Naive => ks::PythonSum::Naive,
                slime::PythonSum::Neumaier => ks::PythonSum::Neumaier,
            },
        };
        let s = ks::build_dp_schedule(&a, &flops_args(model), &total_lengths, &rollout_indices).map_err(slime_error)?;
        Ok(slime::Schedule {
            partitions: groups_of(s.partitions),
            micro_batch_sizes: groups_of(s.micro_batch_sizes),
            num_microbatches: s.num_microbatches,
            num_steps: s.num_steps,
        })
    }
}
