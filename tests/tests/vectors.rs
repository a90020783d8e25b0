//! Every conformance vector against the native kernel and the WASM kernel.

use stowplan::Kernel;
use stowplan_conformance::{check_stowplan_vector, check_verl_partition_vector, load_dir, vectors_dir};

fn kernels() -> Vec<(&'static str, Kernel)> {
    vec![("native", Kernel::native()), ("wasm", Kernel::wasm().expect("the WASM kernel loads"))]
}

/// Checks every vector on every backend and reports all failures at once.
fn check_all(vectors: &[&(String, serde_json::Value)], check: fn(&Kernel, &serde_json::Value) -> Result<(), String>) {
    let mut failures = Vec::new();
    for (backend, kernel) in kernels() {
        for (name, v) in vectors {
            if let Err(e) = check(&kernel, v) {
                failures.push(format!("{backend} {name}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn verl_partition_vectors() {
    let vectors = load_dir(&vectors_dir().join("verl"));
    let partition: Vec<_> = vectors.iter().filter(|(_, v)| v["kind"] == "partition").collect();
    assert!(partition.len() >= 36, "expected the 36 shared verl partition vectors, found {}", partition.len());
    check_all(&partition, check_verl_partition_vector);
}

#[test]
fn stowplan_vectors() {
    let vectors = load_dir(&vectors_dir());
    assert!(vectors.len() >= 10, "expected stowplan's own vectors, found {}", vectors.len());
    check_all(&vectors.iter().collect::<Vec<_>>(), check_stowplan_vector);
}

fn ints(v: &serde_json::Value) -> Vec<i64> {
    v.as_array().expect("array").iter().map(|x| x.as_i64().expect("integer")).collect()
}

/// verl's `log_seqlen_unbalance` figures, as verl's dict would hold them.
fn unbalance_dict(seqlens: &[i64], parts: &[Vec<i64>]) -> Result<serde_json::Value, (&'static str, String)> {
    use stowplan::peers::verl::UnbalanceError as E;
    stowplan::json::verl_unbalance("global_seqlen", seqlens, parts).map_err(|e| match e {
        E::ZeroDivision(m) => ("ZeroDivisionError", m),
        E::Value(m) => ("ValueError", m),
        E::Index(m) => ("IndexError", m),
    })
}

#[test]
fn verl_log_unbalance_vectors_and_partition_stats() {
    let vectors = load_dir(&vectors_dir().join("verl"));
    let mut checked = 0;
    for (name, v) in &vectors {
        let mut cases: Vec<(Vec<i64>, Vec<Vec<i64>>, serde_json::Value)> = Vec::new();
        if v["kind"] == "log_unbalance" {
            let parts = v["input"]["partitions"].as_array().unwrap().iter().map(ints).collect();
            cases.push((ints(&v["input"]["seqlen_list"]), parts, v["outputs"]["log_seqlen_unbalance"].clone()));
        } else if v["kind"] == "partition" {
            for (f, stats) in v["stats"].as_object().into_iter().flatten() {
                let out = &v["outputs"][f.as_str()];
                let Some(want) = stats.get("verl_log_seqlen_unbalance") else { continue };
                if out["ok"] != true {
                    continue;
                }
                let parts = out["result"].as_array().unwrap().iter().map(ints).collect();
                let want = if want.get("ok") == Some(&serde_json::Value::Bool(false)) {
                    want.clone()
                } else {
                    serde_json::json!({"ok": true, "result": want})
                };
                cases.push((ints(&v["input"]["seqlen_list"]), parts, want));
            }
        }
        for (seqlens, parts, want) in cases {
            match (unbalance_dict(&seqlens, &parts), want["ok"].as_bool()) {
                (Ok(got), Some(true)) => assert_eq!(got, want["result"], "{name}"),
                (Err((ty, msg)), Some(false)) => {
                    assert_eq!(ty, want["error_type"], "{name}");
                    assert_eq!(msg, want["error"], "{name}");
                }
                (got, _) => panic!("{name}: expected {want}, got {got:?}"),
            }
            checked += 1;
        }
    }
    assert!(checked >= 30, "checked {checked}");
}

#[test]
fn verl_micro_batch_and_balance_batch_vectors() {
    let vectors = load_dir(&vectors_dir().join("verl"));
    let micro: Vec<_> = vectors.iter().filter(|(_, v)| v["kind"] == "micro_batch").collect();
    assert!(micro.len() >= 14, "expected the 14 shared verl micro_batch vectors, found {}", micro.len());
    check_all(&micro, stowplan_conformance::check_verl_micro_batch_vector);
    let balance: Vec<_> = vectors.iter().filter(|(_, v)| v["kind"] == "balance_batch").collect();
    assert!(!balance.is_empty(), "expected the shared verl balance_batch vector");
    check_all(&balance, stowplan_conformance::check_verl_balance_batch_vector);
}

#[test]
fn roll_load_balance_and_batch_balance_vectors() {
    let vectors = load_dir(&vectors_dir().join("roll"));
    let cases: Vec<_> =
        vectors.iter().filter(|(_, v)| v["kind"] == "load_balance" || v["kind"] == "batch_balance").collect();
    let modelled = std::sync::atomic::AtomicUsize::new(0);
    let check = |kernel: &Kernel, v: &serde_json::Value| -> Result<(), String> {
        if stowplan_conformance::check_roll_vector(kernel, v)? {
            modelled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    };
    let mut failures = Vec::new();
    for (backend, kernel) in kernels() {
        for (name, v) in &cases {
            if let Err(e) = check(&kernel, v) {
                failures.push(format!("{backend} {name}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    // Of the shared load_balance/batch_balance cases, 3 test ROLL's packer configuration
    // (algorithm name, missing DP group), which stowplan does not model; the rest are checked.
    assert!(cases.len() >= 29, "expected the shared ROLL vectors, found {}", cases.len());
    assert_eq!(modelled.into_inner(), 2 * (cases.len() - 3), "ROLL vectors checked on both backends");
}

#[test]
fn prime_rl_packing_and_padding_vectors() {
    let all = stowplan_conformance::load_dir(&stowplan_conformance::vectors_dir().join("prime-rl"));
    let cases = all.iter().filter(|(_, v)| v["kind"] == "ffd_pack" || v["kind"] == "pad_micro_batch").count();
    let mut checked = 0;
    for (name, kernel) in kernels() {
        for (file, v) in &all {
            match stowplan_conformance::check_prime_rl_vector(&kernel, v) {
                Ok(true) => checked += 1,
                Ok(false) => {}
                Err(e) => panic!("{name}: {file}: {e}"),
            }
        }
    }
    // Every ffd_pack and pad_micro_batch vector (errors, multimodal and zero-length samples
    // included), on both kernels.
    assert!(cases >= 23, "expected the prime-rl packing vectors, found {cases}");
    assert_eq!(checked, 2 * cases, "vectors checked");
}

#[test]
fn prime_rl_round_robin_distribution_vectors() {
    let all = stowplan_conformance::load_dir(&stowplan_conformance::vectors_dir().join("prime-rl"));
    let cases = all.iter().filter(|(_, v)| v["kind"] == "distribute").count();
    let mut checked = 0;
    for (name, kernel) in kernels() {
        for (file, v) in &all {
            match stowplan_conformance::check_prime_rl_distribute(&kernel, v) {
                Ok(true) => checked += 1,
                Ok(false) => {}
                Err(e) => panic!("{name}: {file}: {e}"),
            }
        }
    }
    // Every classic `prepare_batch` vector but the one with training modes (the packer runtime
    // has none), on both kernels.
    assert_eq!(cases, 13, "expected the prime-rl distribute vectors");
    assert_eq!(checked, 2 * (cases - 1), "vectors checked");
}

/// A prime-rl vector built here: `samples` (triples or dicts) packed by the classic packer.
fn prime_ffd(samples: serde_json::Value, num_loras: u32, outcome: serde_json::Value) -> serde_json::Value {
    let mut v =
        serde_json::json!({"kind": "ffd_pack", "input": {"seq_len": 8, "num_loras": num_loras, "samples": samples}});
    let key = if outcome.get("type").is_some() { "error" } else { "output" };
    v[key] = outcome;
    v
}

#[test]
fn prime_rl_runner_reports_bad_triples_and_wrong_errors_instead_of_panicking() {
    use serde_json::json;
    let kernel = Kernel::native();
    let check = |v: serde_json::Value| stowplan_conformance::check_prime_rl_vector(&kernel, &v);
    // A triple whose LoRA is past num_loras (it joins sample 0's bin): prime-rl's IndexError,
    // compared by type and message.
    let index = json!({"type": "IndexError", "message": "list index out of range"});
    assert_eq!(check(prime_ffd(json!([[0, 1, 1], [3, 2, 2]]), 2, index)), Ok(true));
    let wrong = json!({"type": "ZeroDivisionError", "message": "integer modulo by zero"});
    assert!(check(prime_ffd(json!([[0, 1, 1], [3, 2, 2]]), 2, wrong)).is_err(), "another exception is a mismatch");
    // Malformed triples are errors of the vector, not panics.
    let bins = json!({"bins": [[0]], "lora_num_tokens": [[2]], "bin_lengths": [2]});
    assert!(check(prime_ffd(json!([[0, 1]]), 1, bins.clone())).is_err());
    assert!(check(prime_ffd(json!([[0, -1, 1]]), 1, bins.clone())).is_err());
    assert_eq!(check(prime_ffd(json!([[0, 1, 1]]), 1, bins)), Ok(true));
    // A zero-length triple alone opens a bin of its own, which stays empty.
    let empty = json!({"bins": [[]], "lora_num_tokens": [[0]], "bin_lengths": [0]});
    assert_eq!(check(prime_ffd(json!([[0, 0, 0]]), 1, empty)), Ok(true));
}

#[test]
fn roll_pad_factor_and_zigzag_vectors() {
    let all = stowplan_conformance::load_dir(&stowplan_conformance::vectors_dir().join("roll"));
    let mut checked = 0;
    for (name, kernel) in kernels() {
        for (file, v) in all.iter().filter(|(_, v)| v["kind"] == "pad_factor" || v["kind"] == "cp_zigzag") {
            match stowplan_conformance::check_roll_vector(&kernel, v) {
                Ok(true) => checked += 1,
                Ok(false) => {}
                Err(e) => panic!("{name}: {file}: {e}"),
            }
        }
    }
    // pf_cp1_tp3, pf_cp3_tp1, the factor-3 zigzag failure and the three layouts at ROLL's own
    // factor (cz_pack_cp2_seed001, cz_pack_cp1_tp3, cz_pack_cp3), on both kernels.
    assert_eq!(checked, 2 * 6, "vectors checked");
}
