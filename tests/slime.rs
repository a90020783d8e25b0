//! Checks of the slime oracle vectors (`vectors/slime/*.json`, schema
//! `stowplan-peer-oracle/1`, made by running slime's own code at `peer_commit`) against
//! stowplan's slime reproductions ([`stowplan::kernel::SlimeApi`], and verl's KK for integer
//! `kk_partition` inputs).

use serde_json::{Value, json};
use stowplan::peers::slime as ks;
use stowplan::{Kernel, kernel::VerlFunction};

fn i64s(v: &Value, what: &str) -> Result<Vec<i64>, String> {
    v.as_array()
        .ok_or(format!("{what} is not an array"))?
        .iter()
        .map(|x| x.as_i64().ok_or(format!("{what} holds a non-integer {x}")))
        .collect()
}

fn groups(v: &Value, what: &str) -> Result<Vec<Vec<u32>>, String> {
    v.as_array()
        .ok_or(format!("{what} is not an array"))?
        .iter()
        .map(|g| {
            g.as_array()
                .ok_or(format!("{what} holds a non-list"))?
                .iter()
                .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or(format!("{what}: bad index {x}")))
                .collect()
        })
        .collect()
}

fn arg(args: &Value, name: &str) -> Result<ks::Arg, String> {
    match args.get(name) {
        None => Ok(ks::Arg::Missing),
        Some(Value::Null) => Ok(ks::Arg::None),
        Some(x) => x.as_i64().map(ks::Arg::Int).ok_or(format!("args.{name} = {x} is not an integer")),
    }
}

/// The model attributes of a vector's `args` (absent keys are missing attributes).
pub fn flops_args(args: &Value) -> Result<ks::FlopsArgs, String> {
    Ok(ks::FlopsArgs {
        hidden_size: arg(args, "hidden_size")?,
        num_attention_heads: arg(args, "num_attention_heads")?,
        num_query_groups: arg(args, "num_query_groups")?,
        vocab_size: arg(args, "vocab_size")?,
        ffn_hidden_size: arg(args, "ffn_hidden_size")?,
        num_experts: arg(args, "num_experts")?,
        num_layers: arg(args, "num_layers")?,
        kv_channels: arg(args, "kv_channels")?,
        moe_ffn_hidden_size: arg(args, "moe_ffn_hidden_size")?,
        moe_router_topk: arg(args, "moe_router_topk")?,
        moe_shared_expert_intermediate_size: arg(args, "moe_shared_expert_intermediate_size")?,
        moe_layer_freq: match args.get("moe_layer_freq") {
            None => ks::LayerFreq::Missing,
            Some(Value::Array(_)) => ks::LayerFreq::Pattern(i64s(&args["moe_layer_freq"], "moe_layer_freq")?),
            Some(x) => ks::LayerFreq::Every(x.as_i64().ok_or("moe_layer_freq")?),
        },
        multi_latent_attention: args.get("multi_latent_attention").and_then(Value::as_bool).unwrap_or(false),
        q_lora_rank: arg(args, "q_lora_rank")?,
        kv_lora_rank: arg(args, "kv_lora_rank")?,
        qk_head_dim: arg(args, "qk_head_dim")?,
        qk_pos_emb_head_dim: arg(args, "qk_pos_emb_head_dim")?,
        v_head_dim: arg(args, "v_head_dim")?,
    })
}

/// How stowplan answers a failure slime reports as `want` (`{"type", "message"}`):
/// `AssertionError`s must match exactly; slime's incidental Python errors
/// (`ZeroDivisionError`, `ValueError`, …) must be `invalid-argument`.
fn compare_error(got: &ks::SlimeError, want: &Value) -> Result<(), String> {
    let (ty, msg) = (want["type"].as_str().unwrap_or(""), want["message"].as_str().unwrap_or(""));
    match got {
        ks::SlimeError::AssertionError(m) if ty == "AssertionError" && m == msg => Ok(()),
        ks::SlimeError::InvalidArgument(_) if ty != "AssertionError" && ty != "AttributeError" => Ok(()),
        ks::SlimeError::MissingAttribute(a) if ty == "AttributeError" && msg.contains(a.as_str()) => Ok(()),
        _ => Err(format!("failed with {got:?}, slime raised {ty}: {msg}")),
    }
}

fn outcome<T>(
    got: Result<T, ks::SlimeError>,
    v: &Value,
    check: impl FnOnce(T) -> Result<(), String>,
) -> Result<(), String> {
    match (got, v.get("error")) {
        (Err(e), Some(want)) => compare_error(&e, want),
        (Err(e), None) => Err(format!("failed with {e:?}, slime returned")),
        (Ok(_), Some(want)) => Err(format!("returned, slime raised {want}")),
        (Ok(r), None) => check(r),
    }
}

fn same(got: Value, want: &Value) -> Result<(), String> {
    if &got == want { Ok(()) } else { Err(format!("got {got}, slime {want}")) }
}

fn flops_bits(f: ks::Flops) -> Value {
    match f {
        ks::Flops::Float(x) => json!(x.to_bits()),
        ks::Flops::Int(i) => json!(i as u64),
    }
}

/// Checks one slime vector on `kernel`: every kind, errors included.
pub fn check_slime_vector(kernel: &Kernel, v: &Value) -> Result<(), String> {
    let input = &v["input"];
    let out = &v["output"];
    let api = kernel.slime();
    match v["kind"].as_str().unwrap_or("") {
        "first_fit_pack" => {
            let cap = input["max_tokens_per_bin"].as_i64().ok_or("max_tokens_per_bin")?;
            let bins = api.first_fit_pack(&i64s(&input["lengths"], "lengths")?, cap).map_err(|e| e.to_string())?;
            same(json!(bins), &out["bins"])
        }
        "expand_bins" => {
            let bins = groups(&input["bins"], "bins")?;
            let target = input["target_count"].as_i64().ok_or("target_count")?;
            let lengths = i64s(&input["lengths"], "lengths")?;
            let r = api.expand_bins_by_splitting(&bins, target, &lengths).map_err(|e| e.to_string())?;
            outcome(r, v, |b| same(json!(b), &out["bins"]))
        }
        "kk_partition" => {
            let k = u32::try_from(input["k_partitions"].as_u64().ok_or("k_partitions")?).map_err(|e| e.to_string())?;
            let eq = input["equal_size"].as_bool().ok_or("equal_size")?;
            if let Some(bits) = input.get("seqlen_list_bits") {
                let w: Vec<f64> = bits
                    .as_array()
                    .ok_or("seqlen_list_bits")?
                    .iter()
                    .map(|b| b.as_u64().map(f64::from_bits).ok_or("seqlen_list_bits"))
                    .collect::<Result<_, _>>()?;
                let r = api.get_seqlen_balanced_partitions(&w, k, eq).map_err(|e| e.to_string())?;
                return outcome(r, v, |p| same(json!(p), &out["partitions"]));
            }
            // Integer lengths: slime's copy of verl's function is verl's.
            let seqlens = i64s(&input["seqlen_list"], "seqlen_list")?;
            let r = kernel
                .verl(VerlFunction::GetSeqlenBalancedPartitions, &seqlens, k, eq)
                .map_err(|e| e.to_string())?
                .map_err(|e| match e {
                    stowplan::peers::verl::PyError::AssertionError(m) => ks::SlimeError::AssertionError(m),
                    other => ks::SlimeError::InvalidArgument(other.to_string()),
                });
            outcome(r, v, |p| same(json!(p), &out["partitions"]))
        }
        "fwd_flops" | "fwd_flops_total" => {
            let args = flops_args(&input["args"])?;
            let seqlens: Vec<u64> = i64s(&input["seqlens"], "seqlens")?.into_iter().map(|s| s as u64).collect();
            // Floats are compared by their bits (`derived.flops_bits`), integers as integers.
            let want = |flops: &Value, bits: &Value| if bits.is_null() { flops.clone() } else { bits.clone() };
            if v["kind"] == "fwd_flops" {
                let mut got = Vec::new();
                for &s in &seqlens {
                    match api.calculate_fwd_flops(&[s], &args).map_err(|e| e.to_string())? {
                        Ok(f) => got.push(flops_bits(f)),
                        Err(e) => return outcome::<()>(Err(e), v, |_| Ok(())),
                    }
                }
                let flops = out["flops"].as_array().ok_or("flops")?;
                let bits = out["derived"]["flops_bits"].as_array().ok_or("flops_bits")?;
                same(json!(got), &json!(flops.iter().zip(bits).map(|(f, b)| want(f, b)).collect::<Vec<_>>()))
            } else {
                let r = api.calculate_fwd_flops(&seqlens, &args).map_err(|e| e.to_string())?;
                outcome(r, v, |f| same(flops_bits(f), &want(&out["flops"], &out["derived"]["flops_bits"])))
            }
        }
        "dp_schedule" => {
            let a = &input["args"];
            let tp = &input["train_parallel_config"];
            let int = |x: &Value, what: &str| x.as_i64().ok_or(format!("{what} is not an integer"));
            let args = ks::ScheduleArgs {
                micro_batch_size: a.get("micro_batch_size").and_then(Value::as_i64),
                use_dynamic_batch_size: a["use_dynamic_batch_size"].as_bool().ok_or("use_dynamic_batch_size")?,
                max_tokens_per_gpu: a.get("max_tokens_per_gpu").and_then(Value::as_i64),
                balance_data: a["balance_data"].as_bool().ok_or("balance_data")?,
                balance_by_flops: a["balance_by_flops"].as_bool().ok_or("balance_by_flops")?,
                dp_size: int(&tp["dp_size"], "dp_size")?,
                cp_size: int(&tp["cp_size"], "cp_size")?,
                vpp_size: int(&tp["vpp_size"], "vpp_size")?,
                microbatch_group_size_per_vp_stage: int(
                    &tp["microbatch_group_size_per_vp_stage"],
                    "microbatch_group_size_per_vp_stage",
                )?,
                global_batch_size: int(&input["global_batch_size"], "global_batch_size")?,
                python_sum: match v.get("python_sum").and_then(Value::as_str) {
                    Some("neumaier") => ks::PythonSum::Neumaier,
                    _ => ks::PythonSum::Naive,
                },
            };
            let model = flops_args(a)?;
            let lengths = i64s(&input["total_lengths"], "total_lengths")?;
            let rids = i64s(&input["rollout_indices"], "rollout_indices")?;
            let r = api.build_dp_schedule(&args, &model, &lengths, &rids).map_err(|e| e.to_string())?;
            outcome(r, v, |s| {
                let mbi: Vec<Vec<Vec<u32>>> = s
                    .micro_batch_sizes
                    .iter()
                    .map(|sizes| {
                        let mut start = 0u32;
                        sizes
                            .iter()
                            .map(|&n| {
                                let r: Vec<u32> = (start..start + n).collect();
                                start += n;
                                r
                            })
                            .collect()
                    })
                    .collect();
                let gbs = vec![args.global_batch_size; s.num_steps as usize];
                same(json!(s.partitions), &out["partitions"])?;
                same(json!(mbi), &out["micro_batch_indices"])?;
                same(json!(s.num_microbatches), &out["num_microbatches"])?;
                same(json!(gbs), &out["global_batch_sizes"])
            })
        }
        other => Err(format!("unknown slime kind {other:?}")),
    }
}
