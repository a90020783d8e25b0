//! Conformance vectors shared by every stowplan host, and helpers to check them.
//!
//! Two families live in `tests/vectors/`:
//! - `*.json` — stowplan's own vectors (schema `stowplan-vector/1`): an `operation`
//!   (`partition` or `pack`), its `input`, and `expected` — either the exact result or
//!   `{"error": KIND}` with KIND `invalid-argument` or `infeasible`.
//! - `verl/*.json` — outputs of the real verl 0.9.1 (schema `verl-seqlen-oracle/1`, copied
//!   from `shared/vectors/verl`), checked with stowplan's verl reproductions.
//!
//! The same files are read by the Python SDK's tests, so every host answers the same.
#![deny(missing_docs)]

pub mod slime;

use std::path::{Path, PathBuf};

use serde_json::Value;
use stowplan::{
    Error, Kernel,
    kernel::{OversizePolicy, PackMethod, PackOptions, PartitionMethod, PartitionOptions, VerlFunction},
};

/// A sample of `prompt_ids` then `completion_ids` with nothing else set: no masks, no
/// logprobs, temperature 1, advantage 1, run 0; `extra_cost` as given.
pub fn plain_sample<'a>(
    prompt_ids: &'a [i64],
    completion_ids: &'a [i64],
    extra_cost: u64,
) -> stowplan::materialize::Sample<'a> {
    stowplan::materialize::Sample {
        prompt_ids,
        completion_ids,
        prompt_mask: None,
        completion_mask: None,
        completion_logprobs: None,
        temperature: stowplan::materialize::Temperature::One(1.0),
        advantage: 1.0,
        run: 0,
        teacher_logprobs: None,
        extra_cost,
        resources: &[],
    }
}

/// The lengths of a shared workload (`../shared/workloads/NAME`, or `$STOWPLAN_WORKLOADS/NAME`).
pub fn workload(name: &str) -> Vec<u64> {
    stowplan::input::parse_lengths(&workload_text(name)).expect("workload parses")
}

/// The rows of a shared workload table (e.g. `vlm-mix-100k.tsv`): per row the first column,
/// then the `columns` named, in that order.
pub fn workload_table(name: &str, columns: &[&str]) -> Vec<u64> {
    stowplan::input::parse_table(&workload_text(name), columns).expect("workload table parses").1
}

fn workload_text(name: &str) -> String {
    let dir = std::env::var_os("STOWPLAN_WORKLOADS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/workloads"));
    std::fs::read_to_string(dir.join(name)).expect("workload")
}

/// The folder holding the vectors.
pub fn vectors_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

/// Every `*.json` file directly in `dir`, sorted by name, parsed.
pub fn load_dir(dir: &Path) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", p.display()));
            (p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(), v)
        })
        .collect()
}

fn u64s(v: &Value, what: &str) -> Result<Vec<u64>, String> {
    v.as_array()
        .ok_or(format!("{what} is not an array"))?
        .iter()
        .map(|x| x.as_u64().ok_or(format!("{what} holds a non-u64 value {x}")))
        .collect()
}

fn lists(offsets: &[u32], indices: &[u32]) -> Value {
    serde_json::to_value(stowplan::kernel::unflatten(offsets, indices)).unwrap_or(Value::Null)
}

fn error_value(e: &Error) -> Value {
    serde_json::json!({ "error": e.kind() })
}

/// Runs one stowplan vector on `kernel` and returns the actual result in the vector's
/// `expected` shape.
pub fn run_stowplan_vector(kernel: &Kernel, v: &Value) -> Result<Value, String> {
    let input = &v["input"];
    match v["operation"].as_str() {
        Some("partition") => {
            let weights = u64s(&input["weights"], "input.weights")?;
            let k = input["k"].as_u64().ok_or("input.k missing")? as u32;
            let method = match input["method"].as_str().unwrap_or("kk") {
                "kk" => PartitionMethod::Kk,
                "greedy" => PartitionMethod::Greedy,
                "verl" => PartitionMethod::Verl,
                m => return Err(format!("unknown method {m}")),
            };
            let options = PartitionOptions {
                method,
                equal_size: input["equal_size"].as_bool().unwrap_or(false),
                refine: input["refine"].as_bool().unwrap_or(method != PartitionMethod::Verl),
            };
            Ok(match kernel.partition(&weights, k, &options) {
                Ok(p) => stowplan::json::partition(&p),
                Err(e) => error_value(&e),
            })
        }
        Some("pack") => {
            let lengths = u64s(&input["lengths"], "input.lengths")?;
            let capacity = input["capacity"].as_u64().ok_or("input.capacity missing")?;
            let options = PackOptions {
                align: input["align"].as_u64().unwrap_or(1),
                method: match input["method"].as_str().unwrap_or("bfd") {
                    "bfd" => PackMethod::Bfd,
                    "ffd" => PackMethod::Ffd,
                    "next-fit" => PackMethod::NextFit,
                    m => return Err(format!("unknown method {m}")),
                },
                oversize: match input["oversize"].as_str().unwrap_or("error") {
                    "error" => OversizePolicy::Error,
                    "single" => OversizePolicy::Single,
                    "drop" => OversizePolicy::Drop,
                    m => return Err(format!("unknown oversize policy {m}")),
                },
                ..PackOptions::new(capacity)
            };
            Ok(match kernel.pack(&lengths, &options) {
                Ok(p) => stowplan::json::packing(&p),
                Err(e) => error_value(&e),
            })
        }
        other => Err(format!("unknown operation {other:?}")),
    }
}

/// Checks a stowplan vector: every key of `expected` must equal the actual value (keys not
/// given in `expected` are not checked).
pub fn check_stowplan_vector(kernel: &Kernel, v: &Value) -> Result<(), String> {
    let actual = run_stowplan_vector(kernel, v)?;
    let expected = v["expected"].as_object().ok_or("expected is not an object")?;
    for (key, want) in expected {
        let got = &actual[key.as_str()];
        if got != want {
            return Err(format!("{key}: expected {want}, got {got}"));
        }
    }
    Ok(())
}

/// The verl functions a `partition`-kind verl vector records, with their output keys.
pub const VERL_FUNCTIONS: [(&str, VerlFunction); 3] = [
    ("karmarkar_karp", VerlFunction::KarmarkarKarp),
    ("get_seqlen_balanced_partitions", VerlFunction::GetSeqlenBalancedPartitions),
    ("greedy_partition", VerlFunction::GreedyPartition),
];

/// Checks a verl `partition`-kind vector: all three functions must give verl's result, or
/// fail with verl's exception type. Where verl's `get_seqlen_balanced_partitions` succeeds
/// on in-domain input, stowplan's `partition` with method `verl` must give the same groups.
pub fn check_verl_partition_vector(kernel: &Kernel, v: &Value) -> Result<(), String> {
    let input = &v["input"];
    let seqlens: Vec<i64> = input["seqlen_list"]
        .as_array()
        .ok_or("seqlen_list")?
        .iter()
        .map(|x| x.as_i64().ok_or(format!("non-integer length {x}")))
        .collect::<Result<_, _>>()?;
    let k = input["k_partitions"].as_u64().ok_or("k_partitions")? as u32;
    let equal = input["equal_size"].as_bool().ok_or("equal_size")?;
    for (name, f) in VERL_FUNCTIONS {
        let out = &v["outputs"][name];
        let got = kernel.verl(f, &seqlens, k, equal).map_err(|e| format!("{name}: {e}"))?;
        match (out["ok"].as_bool(), got) {
            (Some(true), Ok(groups)) => {
                let got = serde_json::to_value(&groups).map_err(|e| e.to_string())?;
                if got != out["result"] {
                    return Err(format!("{name}: expected {}, got {got}", out["result"]));
                }
            }
            (Some(false), Err(e)) => {
                if out["error_type"].as_str() != Some(e.type_name()) {
                    return Err(format!("{name}: expected {} ({}), got {e}", out["error_type"], out["error"]));
                }
            }
            (_, Ok(groups)) => return Err(format!("{name}: expected {out}, got Ok({groups:?})")),
            (_, Err(e)) => return Err(format!("{name}: expected {out}, got {e}")),
        }
    }
    // The `verl` method of the main API, where the input is in its domain.
    let out = &v["outputs"]["get_seqlen_balanced_partitions"];
    if out["ok"].as_bool() == Some(true) && seqlens.iter().all(|&s| s >= 0) {
        let weights: Vec<u64> = seqlens.iter().map(|&s| s as u64).collect();
        let options = PartitionOptions { method: PartitionMethod::Verl, equal_size: equal, refine: false };
        let p = kernel.partition(&weights, k, &options).map_err(|e| format!("partition(verl): {e}"))?;
        if lists(&p.offsets, &p.indices) != out["result"] {
            return Err(format!("partition(verl): expected {}, got {}", out["result"], lists(&p.offsets, &p.indices)));
        }
    }
    Ok(())
}

fn i64s(v: &Value, what: &str) -> Result<Vec<i64>, String> {
    v.as_array()
        .ok_or(format!("{what} is not an array"))?
        .iter()
        .map(|x| x.as_i64().ok_or(format!("{what} holds a non-integer value {x}")))
        .collect()
}

fn opt_i64(v: &Value) -> Option<i64> {
    v.as_i64()
}

/// Compares a peer's outcome with stowplan's: `want_ok` and `want` are the peer's success
/// flag and result (or error type and message).
fn compare_outcome<T: serde::Serialize>(
    got: Result<T, stowplan::peers::verl::PyError>,
    want_ok: bool,
    want: &Value,
    want_error: (&Value, &Value),
) -> Result<(), String> {
    match (got, want_ok) {
        (Ok(r), true) => {
            let r = serde_json::to_value(&r).map_err(|e| e.to_string())?;
            if &r == want {
                return Ok(());
            }
            // Name the first differing key rather than printing two large documents.
            let key = want
                .as_object()
                .and_then(|o| o.iter().find(|(k, w)| r.get(k.as_str()) != Some(*w)).map(|(k, _)| k.clone()));
            let short = |v: &Value| {
                let s = v.to_string();
                if s.len() > 300 { format!("{}…", &s[..300]) } else { s }
            };
            match key {
                Some(k) => Err(format!("{k}: expected {}, got {}", short(&want[&k]), short(&r[&k]))),
                None => Err(format!("expected {}, got {}", short(want), short(&r))),
            }
        }
        (Err(e), false) => {
            if want_error.0.as_str() != Some(e.type_name()) || want_error.1.as_str() != Some(e.message()) {
                Err(format!("expected {}: {}, got {e}", want_error.0, want_error.1))
            } else {
                Ok(())
            }
        }
        (Ok(r), false) => Err(format!(
            "expected {}: {}, got Ok({})",
            want_error.0,
            want_error.1,
            serde_json::to_value(&r).unwrap_or(Value::Null)
        )),
        (Err(e), true) => Err(format!("expected {want}, got {e}")),
    }
}

/// Checks a verl `micro_batch`-kind vector (`rearrange_micro_batches`): same index lists in
/// the same order, or the same exception type and message.
pub fn check_verl_micro_batch_vector(kernel: &Kernel, v: &Value) -> Result<(), String> {
    let input = &v["input"];
    let seqlens = i64s(&input["seqlen_list"], "seqlen_list")?;
    let options = stowplan::peers::VerlMicroOptions {
        max_token_len: input["max_token_len"].as_i64().ok_or("max_token_len")?,
        min_num_micro_batch: opt_i64(&input["min_num_micro_batch"]),
        num_batches_divided_by: opt_i64(&input["num_batches_divided_by"]),
        use_dynamic_bsz_balance: input["use_dynamic_bsz_balance"].as_bool().unwrap_or(true),
        force_group_size: input["force_group_size"].as_i64().unwrap_or(1),
        padded_width: opt_i64(&input["padded_width"]),
        dp_num_micro_batches: opt_i64(&input["dp_num_micro_batches"]),
    };
    let out = &v["outputs"]["rearrange_micro_batches"];
    let got = kernel.verl_rearrange_micro_batches(&seqlens, &options).map_err(|e| e.to_string())?;
    compare_outcome(got, out["ok"] == true, &out["result"], (&out["error_type"], &out["error"]))
}

/// verl's `log_seqlen_unbalance` dict (`prefix` + `/min` …) for `parts` of `seqlens`.
pub fn unbalance_dict(prefix: &str, seqlens: &[i64], parts: &[Vec<u32>]) -> Result<Value, String> {
    let parts: Vec<Vec<i64>> = parts.iter().map(|p| p.iter().map(|&i| i64::from(i)).collect()).collect();
    stowplan::json::verl_unbalance(prefix, seqlens, &parts).map_err(|e| format!("{e:?}"))
}

/// Checks a verl `balance_batch`-kind vector (the trainer's `_balance_batch`): partitions,
/// `global_idx` and the logged metrics.
pub fn check_verl_balance_batch_vector(kernel: &Kernel, v: &Value) -> Result<(), String> {
    let input = &v["input"];
    let seqlens = i64s(&input["seqlen_list"], "seqlen_list")?;
    let dp = input["dp_size"].as_u64().ok_or("dp_size")? as u32;
    let mb = if input["keep_minibatch"] == true { opt_i64(&input["minibatch_size"]) } else { None };
    let prefix = input["prefix"].as_str().unwrap_or("global_seqlen");
    let out = &v["outputs"]["balance_batch"];
    let got = kernel.balance_batch(&seqlens, dp, mb).map_err(|e| e.to_string())?;
    let got = match got {
        Ok(r) => {
            let global: Vec<u32> = r.partitions.concat();
            let stats = unbalance_dict(prefix, &seqlens, &r.partitions)?;
            Ok(serde_json::json!({"partitions": r.partitions, "global_idx": global, "stats": stats}))
        }
        Err(e) => Err(e),
    };
    compare_outcome(got, out["ok"] == true, &out["result"], (&out["error_type"], &out["error"]))
}

/// Checks a ROLL vector of kind `load_balance` or `batch_balance`. Returns `Ok(false)` for a
/// case stowplan does not model (ROLL's algorithm-name dispatch and its missing-DP-group
/// assertion: configuration of ROLL's packer class, not balancing).
pub fn check_roll_vector(kernel: &Kernel, v: &Value) -> Result<bool, String> {
    let input = &v["input"];
    let expect_ok = v.get("output").is_some();
    let (want_err_type, want_err_msg) = (&v["error"]["type"], &v["error"]["message"]);
    let out = &v["output"];
    match v["kind"].as_str() {
        Some("load_balance") => {
            if input.get("algorithm").is_some() || input.get("dp_group_none").is_some() {
                return Ok(false);
            }
            let lengths = i64s(&input["lengths"], "lengths")?;
            let mut o = stowplan::peers::RollLoadBalanceOptions::new(
                input["mask_width"].as_i64().ok_or("mask_width")?,
                input["max_packed_sequence_length"].as_i64().ok_or("max_packed_sequence_length")?,
            );
            o.min_num_micro_batches = input["min_num_micro_batches"].as_i64().unwrap_or(1);
            o.tp = input["tp"].as_i64().unwrap_or(1);
            o.cp = input["cp"].as_i64().unwrap_or(1);
            o.vp = input["vp"].as_i64().unwrap_or(1);
            o.dp_num_micro_batches = input["dp_peer_num_micro_batches"]
                .as_array()
                .map(|peers| peers.iter().filter_map(Value::as_i64).max().unwrap_or(0));
            let got = kernel.roll_load_balance(&lengths, &o).map_err(|e| e.to_string())?.map(|r| {
                let order: Vec<u32> = r.micro_batches.concat();
                let mut restored = vec![0u32; order.len()];
                for (pos, &i) in order.iter().enumerate() {
                    restored[i as usize] = pos as u32;
                }
                serde_json::json!({
                    "micro_batches": r.micro_batches,
                    "num_micro_batches": r.micro_batches.len(),
                    "kk_partitions": r.kk_partitions,
                    "restored_positions": restored,
                    "pad_factor": r.pad_factor,
                    "padded_lengths": r.padded_lengths,
                })
            });
            let want = serde_json::json!({
                "micro_batches": out["micro_batches"],
                "num_micro_batches": out["num_micro_batches"],
                "kk_partitions": out["kk_partitions"],
                "restored_positions": out["restored_positions"],
                "pad_factor": out["derived"]["pad_factor"],
                "padded_lengths": out["derived"]["padded_lengths"],
            });
            compare_outcome(got, expect_ok, &want, (want_err_type, want_err_msg)).map(|()| true)
        }
        Some("batch_balance") => {
            let lengths = i64s(&input["lengths"], "lengths")?;
            let dp = input["dp_size"].as_u64().ok_or("dp_size")? as u32;
            let mb = if input["keep_minibatch"] == true { opt_i64(&input["minibatch_size"]) } else { None };
            let got = kernel.balance_batch(&lengths, dp, mb).map_err(|e| e.to_string())?;
            let got = match got {
                Ok(r) => {
                    let metrics = unbalance_dict("global_seqlen", &lengths, &r.partitions)?;
                    Ok(serde_json::json!({
                        "global_idx": r.partitions.concat(),
                        "rank_partitions": r.partitions,
                        "kk_partitions": r.kk_partitions,
                        "metrics": metrics,
                        "dropped": r.dropped,
                    }))
                }
                Err(e) => Err(e),
            };
            compare_outcome(got, expect_ok, out, (want_err_type, want_err_msg)).map(|()| true)
        }
        Some("pad_factor") => {
            let (cp, tp) = (input["cp"].as_u64().ok_or("cp")?, input["tp"].as_u64().ok_or("tp")?);
            if cp == 0 || tp == 0 {
                // ROLL treats cp = 0 as no CP and gives 0 for tp = 0; stowplan rejects both.
                return Ok(false);
            }
            let o = stowplan::kernel::AlignOptions {
                factor: stowplan::kernel::Factor::Roll,
                ..stowplan::kernel::AlignOptions::new(cp as u32, tp as u32)
            };
            let got = kernel.pad_factor(&o).map_err(|e| e.to_string())?;
            let want = out["sequence_packing_pad_factor"].as_u64().ok_or("sequence_packing_pad_factor")?;
            if got != want {
                return Err(format!("pad factor {got}, ROLL {want}"));
            }
            Ok(true)
        }
        Some("cp_zigzag") => {
            // ROLL's pad_packed_seq_to (the last sequence takes the rest) is compat.roll's.
            if input.get("pad_packed_seq_to").is_some() {
                return Ok(false);
            }
            let factor = input["pad_factor_override"]
                .as_u64()
                .map_or(stowplan::kernel::Factor::Roll, stowplan::kernel::Factor::Multiple);
            let lengths = u64s(&input["lengths"], "lengths")?;
            let o = stowplan::kernel::AlignOptions {
                factor,
                ..stowplan::kernel::AlignOptions::new(
                    input["cp"].as_u64().ok_or("cp")? as u32,
                    input["tp"].as_u64().unwrap_or(1) as u32,
                )
            };
            match (kernel.cp_layout(&lengths, &o), expect_ok) {
                (Err(Error::InvalidArgument(_)), false) => Ok(true),
                (Ok(l), true) => {
                    let want = u64s(&out["cu_seqlens_padded"], "cu_seqlens_padded")?;
                    if l.cu_seqlens_padded != want {
                        return Err(format!("cu_seqlens_padded {:?}, ROLL {want:?}", l.cu_seqlens_padded));
                    }
                    Ok(true)
                }
                (got, _) => Err(format!("got {got:?}, ROLL {}", if expect_ok { "succeeded" } else { "failed" })),
            }
        }
        _ => Ok(false),
    }
}

/// A prime-rl vector sample, with prime-rl's defaults filled in (see
/// `vectors/prime-rl/README.md`).
#[derive(Clone, Debug)]
pub struct PrimeSample {
    /// LoRA index.
    pub lora: u32,
    /// Prompt ids.
    pub prompt_ids: Vec<i64>,
    /// Completion ids.
    pub completion_ids: Vec<i64>,
    /// Prompt loss mask.
    pub prompt_mask: Vec<bool>,
    /// Completion loss mask.
    pub completion_mask: Vec<bool>,
    /// Completion logprobs.
    pub completion_logprobs: Vec<f32>,
    /// Completion temperatures.
    pub completion_temperatures: Vec<f32>,
    /// Advantage.
    pub advantage: f32,
    /// Teacher logprobs.
    pub teacher_logprobs: Option<Vec<f32>>,
    /// Training mode (`rl`, `opd` or `sft`).
    pub training_mode: String,
    /// The sample carries image tensors (`mm_kwargs`): prime-rl gives it a bin of its own.
    pub multimodal: bool,
    /// The environment name (`"all"` is reserved: prime-rl asserts).
    pub env_name: String,
}

impl PrimeSample {
    /// Sample `i` of a vector's `samples` list: a `[lora, prompt_len, completion_len]`
    /// triple or a dict (errors, never panics, on anything else).
    pub fn from_json(i: usize, v: &Value) -> Result<Self, String> {
        let count = |x: Option<&Value>, what: &str| {
            x.and_then(Value::as_u64).ok_or(format!("samples[{i}]: {what} is not a non-negative integer"))
        };
        let (lora, p, c) = match v {
            Value::Array(t) if t.len() == 3 => {
                (count(t.first(), "lora")?, count(t.get(1), "prompt_len")?, count(t.get(2), "completion_len")?)
            }
            Value::Array(t) => return Err(format!("samples[{i}]: a triple has 3 entries, not {}", t.len())),
            Value::Object(_) => {
                let len = |n: &str, ids: &str| match v.get(n) {
                    Some(x) => count(Some(x), n),
                    None => v
                        .get(ids)
                        .and_then(Value::as_array)
                        .map(|a| a.len() as u64)
                        .ok_or(format!("samples[{i}] has neither {n} nor {ids}")),
                };
                (
                    v.get("lora").map_or(Ok(0), |x| count(Some(x), "lora"))?,
                    len("prompt_len", "prompt_ids")?,
                    len("completion_len", "completion_ids")?,
                )
            }
            _ => return Err(format!("samples[{i}] is neither a triple nor a dict")),
        };
        let lora = u32::try_from(lora).map_err(|_| format!("samples[{i}]: lora {lora} is above 2**32-1"))?;
        let (p, c) = (p as usize, c as usize);
        let id = |j: usize| ((i + 1) * 100_000 + j) as i64;
        let ids = |key: &str, default: Vec<i64>| -> Result<Vec<i64>, String> {
            match v.get(key) {
                Some(x) => i64s(x, key),
                None => Ok(default),
            }
        };
        let bools = |key: &str, n: usize, d: bool| -> Vec<bool> {
            v.get(key).and_then(Value::as_array).map_or(vec![d; n], |a| a.iter().map(|b| b == true).collect())
        };
        let floats = |key: &str, n: usize, d: f32| -> Vec<f32> {
            v.get(key)
                .and_then(Value::as_array)
                .map_or(vec![d; n], |a| a.iter().map(|x| x.as_f64().unwrap_or(0.0) as f32).collect())
        };
        let text = |key: &str, d: &str| v.get(key).and_then(Value::as_str).unwrap_or(d).to_string();
        Ok(PrimeSample {
            lora,
            prompt_ids: ids("prompt_ids", (0..p).map(id).collect())?,
            completion_ids: ids("completion_ids", (p..p + c).map(id).collect())?,
            prompt_mask: bools("prompt_mask", p, false),
            completion_mask: bools("completion_mask", c, true),
            completion_logprobs: floats("completion_logprobs", c, -0.25),
            completion_temperatures: floats("completion_temperatures", c, 1.0),
            advantage: v.get("advantage").and_then(Value::as_f64).unwrap_or(1.0) as f32,
            teacher_logprobs: v
                .get("teacher_logprobs")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|x| x.as_f64().unwrap_or(0.0) as f32).collect()),
            training_mode: text("training_mode", "rl"),
            multimodal: v.get("multimodal").and_then(Value::as_bool).unwrap_or(false),
            env_name: text("env_name", "env"),
        })
    }

    /// prime-rl's classic `prepare_sample` truncation to `seq_len` tokens (prompt first).
    pub fn truncated(mut self, seq_len: usize) -> Self {
        let p = self.prompt_ids.len().min(seq_len);
        let c = self.completion_ids.len().min(seq_len - p);
        self.prompt_ids.truncate(p);
        self.prompt_mask.truncate(p);
        self.completion_ids.truncate(c);
        self.completion_mask.truncate(c);
        self.completion_logprobs.truncate(c);
        self.completion_temperatures.truncate(c);
        if let Some(t) = self.teacher_logprobs.as_mut() {
            t.truncate(p + c);
        }
        self
    }

    /// Tokens after truncation.
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.completion_ids.len()
    }

    /// No tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The borrowed [`stowplan::materialize::Sample`].
    pub fn sample(&self) -> stowplan::materialize::Sample<'_> {
        stowplan::materialize::Sample {
            prompt_ids: &self.prompt_ids,
            completion_ids: &self.completion_ids,
            prompt_mask: Some(&self.prompt_mask),
            completion_mask: Some(&self.completion_mask),
            completion_logprobs: Some(&self.completion_logprobs),
            temperature: stowplan::materialize::Temperature::PerToken(&self.completion_temperatures),
            advantage: self.advantage,
            run: self.lora,
            teacher_logprobs: self.teacher_logprobs.as_deref(),
            extra_cost: 0,
            resources: &[],
        }
    }
}

/// A Python exception a peer raises: `{"type", "message"}` as the vectors spell it.
fn peer_exception(kind: &str, message: &str) -> Value {
    serde_json::json!({ "type": kind, "message": message })
}

/// prime-rl's bins with every sample in them (members in the order they joined), or its
/// exception: [`Kernel::prime_rl_ffd`] on the samples with tokens — text samples share bins
/// (of their training mode when `by_mode`, as in classic), a multimodal sample's label is its
/// own — then each zero-length sample placed at its turn in the (LoRA, −length) order: into
/// the first open bin of its label, unseen, or else into a bin of its own that the next
/// sample of its label joins. A LoRA index ≥ `num_loras` raises prime-rl's `IndexError` at
/// the first such sample's turn (classic assigns the count of a sample that opens a bin).
fn prime_bins(
    kernel: &Kernel,
    samples: &[PrimeSample],
    seq_len: u64,
    num_loras: u32,
    classic: bool,
) -> Result<Vec<Vec<u32>>, Value> {
    if samples.iter().any(|s| s.env_name == "all") {
        return Err(peer_exception("AssertionError", "env_name='all' is reserved for aggregate metric keys"));
    }
    let n = samples.len();
    let lengths: Vec<u64> = samples.iter().map(|s| s.len() as u64).collect();
    let runs: Vec<u32> = samples.iter().map(|s| s.lora).collect();
    let mut modes: Vec<&str> = Vec::new();
    let mut text: Vec<Option<u32>> = Vec::with_capacity(n);
    for s in samples {
        let mode = if classic { s.training_mode.as_str() } else { "" };
        text.push((!s.multimodal).then(|| match modes.iter().position(|m| *m == mode) {
            Some(l) => l as u32,
            None => {
                modes.push(mode);
                (modes.len() - 1) as u32
            }
        }));
    }
    let mut fresh = modes.len() as u32..;
    let labels: Vec<u32> = text.iter().map(|l| l.unwrap_or_else(|| fresh.next().unwrap_or(u32::MAX))).collect();
    let (packed, dropped) = kernel
        .prime_rl_ffd(&lengths, &runs, &labels, seq_len)
        .map_err(|e| peer_exception("stowplan", &e.to_string()))?;
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (runs[i], std::cmp::Reverse(lengths[i])));
    let mut turn = vec![0; n];
    for (t, &i) in order.iter().enumerate() {
        turn[i] = t;
    }
    // (turn it opened at, label, members), in the order the bins were opened.
    let mut bins: Vec<(usize, u32, Vec<u32>)> =
        packed.into_iter().map(|b| (turn[b[0] as usize], labels[b[0] as usize], b)).collect();
    let mut zeros = dropped;
    zeros.sort_by_key(|&z| turn[z as usize]);
    for z in zeros {
        let (t, label) = (turn[z as usize], labels[z as usize]);
        let open = bins.iter().take_while(|b| b.0 < t).count();
        if let Some(b) = bins[..open].iter_mut().find(|b| b.1 == label) {
            b.2.push(z);
            b.2.sort_by_key(|&i| turn[i as usize]);
            continue;
        }
        let mut members = vec![z];
        if let Some(later) = bins[open..].iter().position(|b| b.1 == label) {
            members.extend(bins.remove(open + later).2);
        }
        bins.insert(open, (t, label, members));
    }
    if let Some(&first) = order.iter().find(|&&i| runs[i] >= num_loras) {
        let opens = bins.iter().any(|b| b.2.first() == Some(&(first as u32)));
        let message = if classic && opens { "list assignment index out of range" } else { "list index out of range" };
        return Err(peer_exception("IndexError", message));
    }
    Ok(bins.into_iter().map(|b| b.2).collect())
}

/// Checks a prime-rl vector of kind `ffd_pack` or `pad_micro_batch` (packing with
/// [`prime_bins`], rows with [`Kernel::materialize_plan`]), errors included (type and
/// message). `Ok(false)`: a kind this runner does not cover.
pub fn check_prime_rl_vector(kernel: &Kernel, v: &Value) -> Result<bool, String> {
    let input = &v["input"];
    let kind = v["kind"].as_str().unwrap_or("");
    if !matches!(kind, "ffd_pack" | "pad_micro_batch") {
        return Ok(false);
    }
    let raw = input["samples"].as_array().ok_or("samples")?;
    let seq_len = input["seq_len"].as_u64().ok_or("seq_len")?;
    let num_loras = u32::try_from(input["num_loras"].as_u64().ok_or("num_loras")?).map_err(|e| e.to_string())?;
    let classic = input.get("variant").and_then(Value::as_str).unwrap_or("classic") == "classic";
    let samples: Vec<PrimeSample> = raw
        .iter()
        .enumerate()
        .map(|(i, s)| PrimeSample::from_json(i, s).map(|s| s.truncated(seq_len as usize)))
        .collect::<Result<_, _>>()?;
    let lengths: Vec<u64> = samples.iter().map(|s| s.len() as u64).collect();
    let bins = prime_bins(kernel, &samples, seq_len, num_loras, classic);
    let multiple = input.get("pad_to_multiple_of").and_then(Value::as_i64);
    // prime-rl pads every micro-batch: `len % 0` on the first one.
    let bins = match (bins, multiple) {
        (Ok(b), Some(0)) if !b.is_empty() => Err(peer_exception("ZeroDivisionError", "integer modulo by zero")),
        (b, _) => b,
    };
    let bins = match (bins, v.get("error")) {
        (Err(got), Some(want)) => {
            return if &got == want { Ok(true) } else { Err(format!("raised {got}, prime-rl {want}")) };
        }
        (Err(got), None) => return Err(format!("raised {got}, prime-rl returned")),
        (Ok(_), Some(want)) => return Err(format!("returned, prime-rl raised {want}")),
        (Ok(bins), None) => bins,
    };
    let out = &v["output"];
    if kind == "ffd_pack" {
        let lnt: Vec<Vec<u64>> = bins
            .iter()
            .map(|b| {
                let mut t = vec![0u64; num_loras as usize];
                for &i in b {
                    t[samples[i as usize].lora as usize] += lengths[i as usize];
                }
                t
            })
            .collect();
        let visible: Vec<Vec<u32>> =
            bins.iter().map(|b| b.iter().copied().filter(|&i| lengths[i as usize] > 0).collect()).collect();
        let got = serde_json::json!({
            "bins": visible,
            "lora_num_tokens": lnt,
            "bin_lengths": bins.iter().map(|b| b.iter().map(|&i| lengths[i as usize]).sum::<u64>()).collect::<Vec<_>>(),
        });
        return if &got == out { Ok(true) } else { Err(format!("got {got}, prime-rl {out}")) };
    }
    // The samples with tokens, renumbered; a bin only zero-length samples opened has no row.
    let kept: Vec<usize> = (0..samples.len()).filter(|&i| lengths[i] > 0).collect();
    let mut renumber = vec![u32::MAX; samples.len()];
    for (j, &i) in kept.iter().enumerate() {
        renumber[i] = j as u32;
    }
    let rows_plan: Vec<Vec<u32>> = bins
        .iter()
        .map(|b| b.iter().filter(|&&i| lengths[i as usize] > 0).map(|&i| renumber[i as usize]).collect::<Vec<u32>>())
        .filter(|b| !b.is_empty())
        .collect();
    let opts = stowplan::MaterializeOptions {
        padding: stowplan::kernel::Padding::PerMicroBatch(multiple.filter(|&m| m > 1).unwrap_or(1) as u64),
        num_runs: Some(num_loras),
        mix_runs: true,
        allow_empty_completion: true,
        ..stowplan::MaterializeOptions::new(u64::MAX, 1)
    };
    let borrowed: Vec<stowplan::materialize::Sample<'_>> = kept.iter().map(|&i| samples[i].sample()).collect();
    let plan = vec![rows_plan.iter().map(Vec::as_slice).collect::<Vec<_>>()];
    let mut rows = if kept.is_empty() {
        Vec::new()
    } else {
        stowplan::materialize::materialize_plan(kernel, &borrowed, &plan, &opts)
            .map_err(|e| e.to_string())?
            .swap_remove(0)
    }
    .into_iter();
    let want = out["micro_batches"].as_array().ok_or("micro_batches")?;
    if bins.len() != want.len() {
        return Err(format!("{} micro-batches, prime-rl {}", bins.len(), want.len()));
    }
    let f32s = |x: &[f32]| x.iter().map(|&f| f64::from(f)).collect::<Vec<_>>();
    for (members, w) in bins.iter().zip(want) {
        let mut got = match members.iter().any(|&i| lengths[i as usize] > 0).then(|| rows.next()).flatten() {
            Some(mb) => {
                let mut sequence: Vec<u64> = members.iter().map(|&i| lengths[i as usize]).collect();
                if let Some(last) = sequence.last_mut() {
                    *last += mb.padding_tokens;
                }
                let mut got = serde_json::json!({
                    "input_ids": mb.input_ids,
                    "position_ids": mb.position_ids,
                    "loss_mask": mb.loss_mask,
                    "advantages": f32s(&mb.advantages),
                    "inference_logprobs": f32s(&mb.inference_logprobs),
                    "temperatures": f32s(&mb.temperatures),
                    "lora_num_tokens": mb.lora_num_tokens,
                    "sequence_lengths": sequence,
                });
                if let Some(t) = &mb.teacher_logprobs {
                    got["teacher_logprobs"] = serde_json::json!(f32s(t));
                }
                got
            }
            None => serde_json::json!({
                "input_ids": [], "position_ids": [], "loss_mask": [], "advantages": [], "inference_logprobs": [],
                "temperatures": [], "lora_num_tokens": vec![0; num_loras as usize],
                "sequence_lengths": vec![0; members.len()],
            }),
        };
        let mut w = w.clone();
        if w.get("sequence_lengths").is_none() {
            got.as_object_mut().map(|o| o.remove("sequence_lengths"));
        }
        let keys: Vec<String> = got.as_object().map(|o| o.keys().cloned().collect()).unwrap_or_default();
        let mut want_sub = serde_json::Map::new();
        for k in &keys {
            want_sub.insert(k.clone(), w[k.as_str()].take());
        }
        let want_v = round_floats(&Value::Object(want_sub));
        if round_floats(&got) != want_v {
            return Err(format!("got {got}, prime-rl {want_v}"));
        }
    }
    Ok(true)
}

/// Floats rounded to 6 significant decimals (the arrays are float32; the vectors float64).
fn round_floats(v: &Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => serde_json::json!((n.as_f64().unwrap_or(0.0) * 1e6).round() / 1e6),
        Value::Array(a) => Value::Array(a.iter().map(round_floats).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), round_floats(x))).collect()),
        other => other.clone(),
    }
}

/// Checks a prime-rl `distribute` vector (classic `prepare_batch`: packing, padding, dummies
/// per modality group, round robin) against [`stowplan::materialize`] with
/// [`DistributionMode::RoundRobin`](stowplan::materialize::DistributionMode::RoundRobin): the same
/// micro-batches (samples in row order) on the same ranks, the same dummies (copies with the
/// loss off) and token counts; `num_workers = 0` is the host's `invalid-argument` naming `dp`
/// where prime-rl divides by zero. `Ok(false)`: an input the packer runtime has no notion
/// of (training modes other than `rl`, zero-length samples).
pub fn check_prime_rl_distribute(kernel: &Kernel, v: &Value) -> Result<bool, String> {
    if v["kind"] != "distribute" {
        return Ok(false);
    }
    let input = &v["input"];
    let raw = input["samples"].as_array().ok_or("samples")?;
    let seq_len = input["seq_len"].as_u64().ok_or("seq_len")?;
    let num_loras = u32::try_from(input["num_loras"].as_u64().ok_or("num_loras")?).map_err(|e| e.to_string())?;
    let dp = u32::try_from(input["num_workers"].as_u64().ok_or("num_workers")?).map_err(|e| e.to_string())?;
    let multiple = input.get("pad_to_multiple_of").and_then(Value::as_u64).unwrap_or(1);
    let samples: Vec<PrimeSample> = raw
        .iter()
        .enumerate()
        .map(|(i, s)| PrimeSample::from_json(i, s).map(|s| s.truncated(seq_len as usize)))
        .collect::<Result<_, _>>()?;
    if samples.iter().any(|s| s.training_mode != "rl" || s.is_empty()) {
        return Ok(false);
    }
    let borrowed: Vec<stowplan::materialize::Sample<'_>> = samples
        .iter()
        .map(|s| stowplan::materialize::Sample { extra_cost: u64::from(s.multimodal), ..s.sample() })
        .collect();
    let options = stowplan::MaterializeOptions {
        padding: stowplan::kernel::Padding::PerMicroBatch(multiple),
        num_runs: Some(num_loras),
        allow_empty_completion: true,
        distribution: stowplan::materialize::DistributionMode::RoundRobin,
        ..stowplan::MaterializeOptions::new(seq_len, dp)
    };
    let m = match (stowplan::materialize(kernel, &borrowed, &options), v.get("error")) {
        (Err(e), Some(want)) if want["type"] == "ZeroDivisionError" && dp == 0 => {
            return if e.to_string().contains("dp must be") { Ok(true) } else { Err(format!("raised {e}")) };
        }
        (Err(e), _) => return Err(format!("raised {e}")),
        (Ok(_), Some(want)) => return Err(format!("returned, prime-rl raised {want}")),
        (Ok(m), None) => m,
    };
    let bins = &v["output"]["bins"];
    let mut got_ranks = Vec::new();
    for rank in &m.ranks {
        let mut entries = Vec::new();
        for mb in rank {
            let members = serde_json::json!(mb.samples);
            let bin = bins.as_array().and_then(|b| b.iter().position(|x| x == &members));
            entries.push(serde_json::json!({
                "bin": bin,
                "samples": members,
                "dummy": mb.dummy,
                "multimodal": mb.samples.iter().any(|&i| samples[i as usize].multimodal),
                "num_tokens": mb.len(),
            }));
            if mb.dummy && (mb.loss_mask.iter().any(|&x| x) || mb.advantages.iter().any(|&a| a != 0.0)) {
                return Err(format!("a dummy copy of bin {bin:?} trains"));
            }
        }
        got_ranks.push(Value::Array(entries));
    }
    let got = Value::Array(got_ranks);
    let want = &v["output"]["per_rank"];
    if &got == want { Ok(true) } else { Err(format!("got {got}, prime-rl {want}")) }
}
