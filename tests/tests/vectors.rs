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
    use stowplan::UnbalanceError as E;
    match stowplan::verl_log_seqlen_unbalance(seqlens, parts) {
        Ok(u) => Ok(serde_json::json!({
            "global_seqlen/min": u.min as i64,
            "global_seqlen/max": u.max as i64,
            "global_seqlen/minmax_diff": (u.max - u.min) as i64,
            "global_seqlen/balanced_min": u.balanced_min as i64,
            "global_seqlen/balanced_max": u.balanced_max as i64,
            "global_seqlen/mean": u.total as f64 / u.k as f64,
        })),
        Err(E::ZeroDivision(m)) => Err(("ZeroDivisionError", m)),
        Err(E::Value(m)) => Err(("ValueError", m)),
        Err(E::Index(m)) => Err(("IndexError", m)),
    }
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
