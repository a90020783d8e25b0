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

use std::path::{Path, PathBuf};

use serde_json::Value;
use stowplan::{
    Error, Kernel, OversizePolicy, PackMethod, PackOptions, PartitionMethod, PartitionOptions, VerlFunction,
};

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
    serde_json::to_value(stowplan::unflatten(offsets, indices)).unwrap_or(Value::Null)
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
            let options = PackOptions {
                capacity: input["capacity"].as_u64().ok_or("input.capacity missing")?,
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
    got: Result<T, stowplan::PyError>,
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
    let options = stowplan::VerlMicroOptions {
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
            let mut o = stowplan::RollLoadBalanceOptions::new(
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
            let o = stowplan::AlignOptions {
                factor: stowplan::Factor::Roll,
                ..stowplan::AlignOptions::new(cp as u32, tp as u32)
            };
            let got = kernel.pad_factor(&o).map_err(|e| e.to_string())?;
            let want = out["sequence_packing_pad_factor"].as_u64().ok_or("sequence_packing_pad_factor")?;
            if got != want {
                return Err(format!("pad factor {got}, ROLL {want}"));
            }
            Ok(true)
        }
        Some("cp_zigzag") => {
            let Some(factor) = input["pad_factor_override"].as_u64() else { return Ok(false) };
            let lengths = u64s(&input["lengths"], "lengths")?;
            let o = stowplan::AlignOptions {
                factor: stowplan::Factor::Multiple(factor),
                ..stowplan::AlignOptions::new(
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
    /// Training mode (`rl` or `sft`).
    pub training_mode: String,
}

impl PrimeSample {
    /// Sample `i` of a vector's `samples` list.
    pub fn from_json(i: usize, v: &Value) -> Result<Self, String> {
        let (lora, p, c) = match v {
            Value::Array(t) => (t[0].as_u64(), t[1].as_u64(), t[2].as_u64()),
            _ => (
                v["lora"].as_u64().or(Some(0)),
                v["prompt_len"].as_u64().or(v["prompt_ids"].as_array().map(|a| a.len() as u64)),
                v["completion_len"].as_u64().or(v["completion_ids"].as_array().map(|a| a.len() as u64)),
            ),
        };
        let (lora, p, c) =
            (lora.ok_or("lora")? as u32, p.ok_or("prompt_len")? as usize, c.ok_or("completion_len")? as usize);
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
            training_mode: v.get("training_mode").and_then(Value::as_str).unwrap_or("rl").to_string(),
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

    /// The borrowed [`stowplan::Sample`].
    pub fn sample(&self) -> stowplan::Sample<'_> {
        stowplan::Sample {
            prompt_ids: &self.prompt_ids,
            completion_ids: &self.completion_ids,
            prompt_mask: Some(&self.prompt_mask),
            completion_mask: Some(&self.completion_mask),
            completion_logprobs: Some(&self.completion_logprobs),
            temperature: stowplan::Temperature::PerToken(&self.completion_temperatures),
            advantage: self.advantage,
            run: self.lora,
            teacher_logprobs: self.teacher_logprobs.as_deref(),
        }
    }
}

/// Checks a prime-rl vector of kind `ffd_pack` or `pad_micro_batch` (packing with
/// [`Kernel::prime_rl_ffd`], rows with [`Kernel::materialize_plan`]). `Ok(false)`: a kind
/// or case this runner does not cover (the `env_name == "all"` check lives in the Python
/// compatibility layer).
pub fn check_prime_rl_vector(kernel: &Kernel, v: &Value) -> Result<bool, String> {
    let input = &v["input"];
    let kind = v["kind"].as_str().unwrap_or("");
    if !matches!(kind, "ffd_pack" | "pad_micro_batch") {
        return Ok(false);
    }
    let raw = input["samples"].as_array().ok_or("samples")?;
    if raw.iter().any(|s| s.get("env_name").is_some_and(|e| e == "all")) {
        return Ok(false);
    }
    let seq_len = input["seq_len"].as_u64().ok_or("seq_len")?;
    let num_loras = input["num_loras"].as_u64().ok_or("num_loras")? as u32;
    let samples: Vec<PrimeSample> = raw
        .iter()
        .enumerate()
        .map(|(i, s)| PrimeSample::from_json(i, s).map(|s| s.truncated(seq_len as usize)))
        .collect::<Result<_, _>>()?;
    let lengths: Vec<u64> = samples.iter().map(|s| (s.prompt_ids.len() + s.completion_ids.len()) as u64).collect();
    let runs: Vec<u32> = samples.iter().map(|s| s.lora).collect();
    let labels: Vec<u32> = samples.iter().map(|s| u32::from(s.training_mode != "rl")).collect();
    let (bins, _dropped) = kernel.prime_rl_ffd(&lengths, &runs, &labels, seq_len).map_err(|e| e.to_string())?;
    let out = &v["output"];
    if kind == "ffd_pack" {
        let lnt: Vec<Vec<u64>> = bins
            .iter()
            .map(|b| {
                let mut t = vec![0u64; num_loras as usize];
                for &i in b {
                    t[runs[i as usize] as usize] += lengths[i as usize];
                }
                t
            })
            .collect();
        let got = serde_json::json!({
            "bins": bins,
            "lora_num_tokens": lnt,
            "bin_lengths": bins.iter().map(|b| b.iter().map(|&i| lengths[i as usize]).sum::<u64>()).collect::<Vec<_>>(),
        });
        return if &got == out { Ok(true) } else { Err(format!("got {got}, prime-rl {out}")) };
    }
    let m = input["pad_to_multiple_of"].as_u64().ok_or("pad_to_multiple_of")?;
    let opts = stowplan::MaterializeOptions {
        padding: stowplan::Padding::PerMicroBatch(m),
        num_runs: Some(num_loras),
        mix_runs: true,
        allow_empty_completion: true,
        ..stowplan::MaterializeOptions::new(u64::MAX, 1)
    };
    let borrowed: Vec<stowplan::Sample<'_>> = samples.iter().map(PrimeSample::sample).collect();
    let plan = vec![bins.iter().map(Vec::as_slice).collect::<Vec<_>>()];
    match (stowplan::materialize_plan(&kernel, &borrowed, &plan, &opts), v.get("error")) {
        (Err(Error::InvalidArgument(_)), Some(_)) => Ok(true),
        (Ok(ranks), None) => {
            let want = out["micro_batches"].as_array().ok_or("micro_batches")?;
            if ranks[0].len() != want.len() {
                return Err(format!("{} micro-batches, prime-rl {}", ranks[0].len(), want.len()));
            }
            for (mb, w) in ranks[0].iter().zip(want) {
                let f32s = |x: &[f32]| x.iter().map(|&f| f64::from(f)).collect::<Vec<_>>();
                let mut got = serde_json::json!({
                    "input_ids": mb.input_ids,
                    "position_ids": mb.position_ids,
                    "loss_mask": mb.loss_mask,
                    "advantages": f32s(&mb.advantages),
                    "inference_logprobs": f32s(&mb.inference_logprobs),
                    "temperatures": f32s(&mb.temperatures),
                    "lora_num_tokens": mb.lora_num_tokens,
                });
                let mut w = w.clone();
                if w.get("sequence_lengths").is_some() {
                    got["sequence_lengths"] = serde_json::json!(mb.sequence_lengths());
                }
                if let Some(t) = &mb.teacher_logprobs {
                    got["teacher_logprobs"] = serde_json::json!(f32s(t));
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
        (got, want) => Err(format!("got {:?}, prime-rl {want:?}", got.map(|r| r.len()))),
    }
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
