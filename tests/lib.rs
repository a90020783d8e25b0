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
    serde_json::to_value(stowplan::json::lists(offsets, indices)).unwrap_or(Value::Null)
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
