//! prime-rl's HEAD packing (559b447) and the multi-LoRA packer (de80b48) against their oracle
//! vectors (`vectors/prime-rl`, kinds `distribute_kk` and `balanced_partition`) on the native
//! and the WASM kernel. The glue a compatibility layer keeps outside the kernel is restated
//! here: the sample checks of `prepare_sample` (prime-rl's exceptions), the multimodal
//! compatibility classes, and the coefficients, which come from the vector (the Python tests
//! derive them from the model config; the `cost_coefficients` kind is theirs).

use serde_json::{Value, json};
use stowplan::Kernel;
use stowplan::kernel::prime_rl::{BatchOptions, BatchPlan};
use stowplan_conformance::{load_dir, vectors_dir};

fn kernels() -> Vec<(&'static str, Kernel)> {
    vec![("native", Kernel::native()), ("wasm", Kernel::wasm().expect("the WASM kernel loads"))]
}

fn err(t: &str, m: &str) -> Value {
    json!({"type": t, "message": m})
}

/// One sample of a vector as the kernel sees it.
struct Sample {
    len: u64,
    lora: u64,
    /// The compatibility signature of its tensors; `None` for text.
    mm: Option<String>,
    /// A 0-dim tensor: compatible with nothing.
    mm_alone: bool,
    routed: bool,
    /// prime-rl's `prepare_sample` exception, if any.
    error: Option<Value>,
}

fn sample(i: usize, v: &Value) -> Sample {
    let (lora, p, c) = match v {
        Value::Array(t) => (t[0].as_u64().unwrap(), t[1].as_u64().unwrap(), t[2].as_u64().unwrap()),
        _ => (
            v.get("lora").and_then(Value::as_u64).unwrap_or(0),
            v["prompt_len"].as_u64().unwrap(),
            v["completion_len"].as_u64().unwrap(),
        ),
    };
    let get = |k: &str| v.get(k).filter(|x| !x.is_null());
    let (mut mm, mut mm_alone) = (None, false);
    let mut keys = Vec::new();
    if get("multimodal").and_then(Value::as_bool) == Some(true) {
        let spec = get("mm").cloned().unwrap_or(json!([["pixel_values", "float32", [1, 4]]]));
        let mut parts: Vec<String> = Vec::new();
        for t in spec.as_array().unwrap() {
            let shape = t[2].as_array().unwrap();
            mm_alone |= shape.is_empty();
            keys.push(t[0].as_str().unwrap().to_string());
            parts.push(format!("{}:{}:{}:{:?}", t[0], t[1], shape.len(), &shape[1.min(shape.len())..]));
        }
        parts.sort();
        mm = Some(parts.join("|"));
    }
    let mut error = None;
    let n = p + c;
    let has_type_ids = get("mm_token_type_ids").is_some();
    if mm.is_some() && keys.iter().any(|k| k == "image_grid_thw") && !has_type_ids {
        error = Some(err("ValueError", "image_grid_thw multimodal samples require mm_token_type_ids"));
    }
    let mask_on = get("completion_mask").and_then(Value::as_array).map_or(c > 0, |a| a.iter().any(|b| b == true))
        || get("prompt_mask").and_then(Value::as_array).is_some_and(|a| a.iter().any(|b| b == true));
    let env = get("env_name").and_then(Value::as_str).unwrap_or("env").to_string();
    if error.is_none() && v.get("advantage").is_some_and(Value::is_null) && mask_on {
        let m = format!(
            "sample from env '{env}' has rl member tokens but no advantages — the producer must stamp the \
             advantage stream (the orchestrator broadcasts the rollout scalar)"
        );
        error = Some(err("ValueError", &m));
    }
    if error.is_none() && env == "all" {
        error = Some(err("AssertionError", "env_name='all' is reserved for aggregate metric keys"));
    }
    let _ = i;
    Sample { len: n, lora, mm, mm_alone, routed: get("routed_experts").and_then(Value::as_bool) == Some(true), error }
}

/// The vector's outcome from the kernel's plan, or prime-rl's exception.
fn run_distribute(kernel: &Kernel, v: &Value) -> Result<Value, Value> {
    let input = &v["input"];
    let multilora = input["variant"] == "multilora";
    let samples: Vec<Sample> =
        input["samples"].as_array().unwrap().iter().enumerate().map(|(i, s)| sample(i, s)).collect();
    if let Some(e) = samples.iter().find_map(|s| s.error.clone()) {
        return Err(e);
    }
    let seq_len = input["seq_len"].as_u64().unwrap();
    let w = input["num_workers"].as_i64().unwrap();
    let m = input.get("pad_to_multiple_of").and_then(Value::as_i64).unwrap_or(1);
    let num_loras = input.get("num_loras").and_then(Value::as_u64).unwrap_or(1);
    if multilora && samples.iter().any(|s| s.lora >= num_loras) {
        return Err(err("IndexError", "list index out of range"));
    }
    if m == 0 && !samples.is_empty() {
        return Err(err("ZeroDivisionError", "integer modulo by zero"));
    }
    if w == 0 {
        return Err(err("ZeroDivisionError", "integer modulo by zero"));
    }
    let coeffs = v["output"]["cost_coefficients"].as_array().expect("cost_coefficients");
    let (linear, quadratic) = (coeffs[0].as_u64().unwrap(), coeffs[1].as_u64().unwrap());
    // Multimodal classes: one per signature, a fresh one for a sample compatible with nothing.
    let mut sigs: Vec<String> = Vec::new();
    let mut class = Vec::new();
    let mut fresh = u32::MAX;
    for s in &samples {
        class.push(match (&s.mm, s.mm_alone) {
            (None, _) => 0,
            (Some(_), true) => {
                fresh -= 1;
                fresh
            }
            (Some(sig), false) => match sigs.iter().position(|x| x == sig) {
                Some(p) => p as u32 + 1,
                None => {
                    sigs.push(sig.clone());
                    sigs.len() as u32
                }
            },
        });
    }
    let lengths: Vec<u64> = samples.iter().map(|s| s.len.min(seq_len)).collect();
    let runs: Vec<u32> = samples.iter().map(|s| if multilora { s.lora as u32 } else { 0 }).collect();
    let labels: Vec<u32> = samples.iter().map(|s| u32::from(s.routed)).collect();
    let options = BatchOptions {
        seq_len,
        num_train_workers: u32::try_from(w).unwrap(),
        linear,
        quadratic,
        pad_to_multiple_of: m.max(1) as u64,
        multimodal_same_run: multilora,
    };
    let plan: BatchPlan = kernel
        .prime_rl_prepare_batch(&lengths, &runs, &class, &labels, &options)
        .map_err(|e| err("stowplan", &e.to_string()))?;
    let mut per_rank = Vec::new();
    let mut rank_costs = Vec::new();
    for (rank, flags) in plan.ranks.iter().zip(&plan.dummies) {
        let mut entries = Vec::new();
        let mut total: u128 = 0;
        for (&b, &dummy) in rank.iter().zip(flags) {
            let members = &plan.bins[b as usize];
            let mut seqs: Vec<u64> = members.iter().map(|&i| lengths[i as usize]).collect();
            if let Some(last) = seqs.last_mut() {
                *last += plan.padding[b as usize];
            }
            let cost = plan.costs[b as usize];
            total += u128::from(cost);
            let mut e = json!({"samples": members, "dummy": dummy, "multimodal": plan.multimodal[b as usize],
                "sequence_lengths": seqs, "cost": cost});
            if multilora {
                let mut lnt = vec![0u64; num_loras as usize];
                for &i in members {
                    lnt[samples[i as usize].lora as usize] += lengths[i as usize];
                }
                lnt[num_loras as usize - 1] += plan.padding[b as usize];
                e["lora_num_tokens"] = json!(lnt);
            }
            entries.push(e);
        }
        per_rank.push(Value::Array(entries));
        rank_costs.push(u64::try_from(total).unwrap());
    }
    Ok(json!({"cost_coefficients": [linear, quadratic], "bins": plan.bins, "per_rank": per_rank,
              "rank_costs": rank_costs}))
}

fn run_partition(kernel: &Kernel, v: &Value) -> Result<Value, Value> {
    let input = &v["input"];
    let weights: Vec<u64> = input["weights"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    let k = input["num_partitions"].as_u64().unwrap();
    if k == 0 {
        return Err(err("ZeroDivisionError", "integer modulo by zero"));
    }
    if weights.len() < k as usize || weights.len() % k as usize != 0 {
        // The kernel refuses what prime-rl asserts.
        let refused = kernel.prime_rl_karmarkar_karp(&weights, k as u32).is_err()
            && kernel.prime_rl_balanced_partition(&weights, k as u32).is_err();
        assert!(refused, "the kernel refuses {} weights over {k} partitions", weights.len());
        return Err(err("AssertionError", ""));
    }
    let kk = kernel.prime_rl_karmarkar_karp(&weights, k as u32).map_err(|e| err("stowplan", &e.to_string()))?;
    let bp = kernel.prime_rl_balanced_partition(&weights, k as u32).map_err(|e| err("stowplan", &e.to_string()))?;
    Ok(json!({"karmarkar_karp": kk, "balanced_partition": bp}))
}

/// A vector with a multimodal sample that carries `mm_token_type_ids` and is longer than
/// `seq_len` (prime-rl cuts it at an image boundary, in Python).
fn cuts_multimodal(v: &Value) -> bool {
    let seq_len = v["input"]["seq_len"].as_u64().unwrap_or(u64::MAX);
    v["input"]["samples"].as_array().into_iter().flatten().any(|s| {
        s.get("mm_token_type_ids").is_some()
            && s["prompt_len"].as_u64().unwrap_or(0) + s["completion_len"].as_u64().unwrap_or(0) > seq_len
    })
}

#[test]
fn prime_rl_head_vectors_on_both_kernels() {
    let all = load_dir(&vectors_dir().join("prime-rl"));
    let mut counts = std::collections::BTreeMap::new();
    let mut failures = Vec::new();
    for (backend, kernel) in kernels() {
        for (file, v) in &all {
            let kind = v["kind"].as_str().unwrap_or("");
            let got = match kind {
                // prime-rl's `_truncate_mm` (a cut at an image boundary) is Python glue, run by
                // sdk-python/tests/test_prime_rl_head.py; the kernel sees its lengths.
                "distribute_kk" if cuts_multimodal(v) => continue,
                "distribute_kk" => run_distribute(&kernel, v),
                "balanced_partition" => run_partition(&kernel, v),
                _ => continue,
            };
            let want = match (v.get("output"), v.get("error")) {
                (_, Some(e)) => Err(e.clone()),
                (Some(o), None) => Ok(o.clone()),
                _ => panic!("{file}: neither output nor error"),
            };
            if got == want {
                *counts.entry((backend, kind)).or_insert(0) += 1;
            } else {
                failures.push(format!("{backend} {file}:\n  got  {got:?}\n  want {want:?}"));
            }
        }
    }
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    for backend in ["native", "wasm"] {
        assert!(counts[&(backend, "distribute_kk")] >= 94, "{counts:?}");
        assert!(counts[&(backend, "balanced_partition")] >= 45, "{counts:?}");
    }
}

#[test]
fn native_and_wasm_agree_on_random_batches() {
    let (native, wasm) = (Kernel::native(), Kernel::wasm().unwrap());
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % m
    };
    for _ in 0..200 {
        let n = next(60) as usize;
        let lengths: Vec<u64> = (0..n).map(|_| next(300)).collect();
        let runs: Vec<u32> = (0..n).map(|_| next(3) as u32).collect();
        let mm: Vec<u32> = (0..n).map(|_| if next(4) == 0 { 1 + next(2) as u32 } else { 0 }).collect();
        let labels: Vec<u32> = (0..n).map(|_| u32::from(next(10) == 0)).collect();
        let o = BatchOptions {
            seq_len: 64 + next(500),
            num_train_workers: 1 + next(8) as u32,
            linear: next(5),
            quadratic: next(3),
            pad_to_multiple_of: 1 + next(16),
            multimodal_same_run: next(2) == 0,
        };
        let a = native.prime_rl_prepare_batch(&lengths, &runs, &mm, &labels, &o).unwrap();
        let b = wasm.prime_rl_prepare_batch(&lengths, &runs, &mm, &labels, &o).unwrap();
        assert_eq!(a, b);
        let k = 1 + next(6) as u32;
        let w: Vec<u64> = (0..(k as usize * (1 + next(5) as usize))).map(|_| next(1 << 40)).collect();
        assert_eq!(
            native.prime_rl_balanced_partition(&w, k).unwrap(),
            wasm.prime_rl_balanced_partition(&w, k).unwrap()
        );
    }
    // Errors are the same values.
    let o = BatchOptions {
        seq_len: 10,
        num_train_workers: 0,
        linear: 1,
        quadratic: 0,
        pad_to_multiple_of: 1,
        multimodal_same_run: false,
    };
    let e1 = native.prime_rl_prepare_batch(&[1], &[0], &[0], &[0], &o).unwrap_err().to_string();
    let e2 = wasm.prime_rl_prepare_batch(&[1], &[0], &[0], &[0], &o).unwrap_err().to_string();
    assert_eq!(e1, e2);
    assert!(e1.contains("num_train_workers must be at least 1"), "{e1}");
}
