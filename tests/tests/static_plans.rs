//! The static pack plan contract, one test per scenario of the contract (named after it), plus the
//! length cache (crash resume, workers, fingerprints, waiting), configuration errors, the
//! saved plan, and the shared workloads on both kernels.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use stowplan::{
    Error, Kernel, PackingConfig, StaticPackPlan,
    kernel::{MicroLimits, MultiMethod, PlanLimits, PlanOptions},
    plan::{config::EffectiveBatch, length_cache::LengthCache},
};
use stowplan_conformance::{workload, workload_table};

fn kernels() -> Vec<Kernel> {
    vec![Kernel::native(), Kernel::wasm().expect("wasm kernel")]
}

/// A fresh directory under the system temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stowplan-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn config(training: serde_json::Value) -> serde_json::Value {
    json!({"training": training, "template": {"max_length": 4096}})
}

fn config_error(v: serde_json::Value, world_size: u32) -> String {
    match PackingConfig::from_json(&v, world_size) {
        Err(e @ Error::Config(_)) => e.to_string(),
        other => panic!("expected a config error, got {other:?}"),
    }
}

// --- Requirement: Stage-1 dataset-level packing is static-only -------------------------

#[test]
fn stage1_dynamic_packing_mode_fails_fast() {
    let e = config_error(config(json!({"packing": true, "packing_mode": "dynamic"})), 1);
    assert!(e.contains("set training.packing_mode=static"), "{e}");
    // Defaults to static when omitted.
    let c = PackingConfig::from_json(&config(json!({"packing": true})), 1).unwrap();
    assert_eq!(c.packing_mode, stowplan::plan::config::PackingMode::Static);
    assert_eq!(c.wait_timeout_s, 7200);
    assert_eq!(c.wait_timeout(), Some(Duration::from_secs(7200)));
    assert_eq!(c.precompute_workers, 8);
    assert_eq!(c.persist_every, None);
    let forever = PackingConfig::from_json(&config(json!({"packing": true, "packing_wait_timeout_s": 0})), 1).unwrap();
    assert_eq!(forever.wait_timeout(), None);
}

#[test]
fn stage1_eval_packing_defaults_to_static_pack_plan_behavior() {
    let kernel = Kernel::native();
    let c = PackingConfig::from_json(&config(json!({"packing": true, "dataloader_drop_last": true})), 4).unwrap();
    assert!(c.eval_packing, "eval packing is on by default with packing");
    // Eval uses the same pipeline (same plan options) with non-dropping alignment.
    assert_eq!(c.train_alignment(), (4, true));
    assert_eq!(c.eval_alignment(), (4, false));
    let lengths: Vec<u64> = (0..101).map(|i| 100 + (i * 37) % 3000).collect();
    let options = c.plan_options().unwrap();
    let (ws, drop) = c.eval_alignment();
    let eval = StaticPackPlan::build(&kernel, &lengths, &options, ws, drop).unwrap();
    let mut covered = vec![false; lengths.len()];
    for i in 0..eval.len() {
        for &s in eval.pack(i).unwrap() {
            covered[s as usize] = true;
        }
    }
    assert!(covered.iter().all(|&c| c), "eval plan covers every sample");
    let off = PackingConfig::from_json(&config(json!({"packing": true, "eval_packing": false})), 4).unwrap();
    assert!(!off.eval_packing);
}

// --- Requirement: static pack-plan mode yields a countable packed dataset ----------------

#[test]
fn static_packing_produces_a_fixed_length_pack_dataset_for_an_epoch() {
    let lengths = workload("rl-math-8k.txt");
    for kernel in kernels() {
        for allow in [false, true] {
            let o = PlanOptions { allow_single_long: allow, ..PlanOptions::new(8192) };
            let plan = StaticPackPlan::build(&kernel, &lengths, &o, 8, false).unwrap();
            // len = number of computed (aligned) packs, the same for every epoch.
            assert_eq!(plan.len(), plan.aligned.packs.len());
            assert_eq!(plan.len() % 8, 0);
            for i in 0..plan.len() {
                let pack = plan.pack(i).unwrap();
                let sum: u64 = pack.iter().map(|&s| lengths[s as usize]).sum();
                let single_long = pack.len() == 1 && lengths[pack[0] as usize] >= 8192;
                assert!(sum <= 8192 || (allow && single_long), "pack {i}: {sum} tokens");
                assert!(!single_long || allow);
            }
            assert!(plan.pack(plan.len()).is_none());
        }
    }
}

// --- Requirement: static pack plans are deterministic and epoch-invariant ----------------

#[test]
fn identical_inputs_produce_identical_pack_plans() {
    let lengths = workload("sft-chat-200k.txt");
    let o = PlanOptions::new(16_384);
    let plans: Vec<StaticPackPlan> = kernels()
        .iter()
        .flat_map(|k| (0..2).map(|_| StaticPackPlan::build(k, &lengths, &o, 8, false).unwrap()).collect::<Vec<_>>())
        .collect();
    for p in &plans[1..] {
        assert_eq!(p, &plans[0], "runs and hosts agree on every pack, its order and the checksums");
    }
    // The recorded checksums of this workload: a change of the plan is a visible event.
    assert_eq!(plans[0].raw_checksum(), "52ea8f554eb03b175bf28bc49e3079ae18e0e0b6fde969093e46db4ddaac99c0");
    assert_eq!(plans[0].aligned_checksum(), "73dac707ed40382aa2c9b79e277155a214f1aaa4d3dc7ebd90964c2cd624dc31");
    // Ties: equal lengths are packed in index order.
    let ties = workload("ties-equal.txt");
    let p = StaticPackPlan::build(&Kernel::native(), &ties, &PlanOptions::new(4000), 1, false).unwrap();
    assert_eq!(p.pack(0).unwrap(), [0, 1, 2, 3]);
}

// --- Requirement: deterministic DDP remainder semantics (pad vs drop) --------------------

/// A plan whose raw pack count is not a multiple of the world sizes used below.
fn remainder_case() -> (Vec<u64>, PlanOptions) {
    let lengths: Vec<u64> = (0..70).map(|i| 50 + (i * 7919) % 900).collect();
    (lengths, PlanOptions::new(1000))
}

#[test]
fn ddp_drop_last_pads_repeats_deterministically_when_disabled() {
    let (lengths, o) = remainder_case();
    for kernel in kernels() {
        let plan = StaticPackPlan::build(&kernel, &lengths, &o, 4, false).unwrap();
        let n = plan.raw_len();
        assert_ne!(n % 4, 0, "the case must leave a remainder");
        assert_eq!(plan.len(), n.div_ceil(4) * 4);
        let pad = plan.len() - n;
        assert_eq!(plan.aligned.pad_needed as usize, pad);
        // All original packs at least once, then the first `pad` packs repeated in order.
        assert_eq!(plan.aligned.packs, (0..n as u32).chain(0..pad as u32).collect::<Vec<_>>());
        assert_eq!(plan, StaticPackPlan::build(&kernel, &lengths, &o, 4, false).unwrap());
        let lines = plan.log_lines();
        assert!(lines[0].contains(&format!("N_raw_packs={n} N_aligned_packs={}", plan.len())), "{lines:?}");
        assert!(lines[0].contains("world_size=4 dataloader_drop_last=false"));
        let repeated: Vec<u32> = (0..pad as u32).collect();
        assert!(lines.iter().any(|l| l.contains(&format!("pad_needed={pad} repeated raw packs {repeated:?}"))));
        assert!(lines.iter().any(|l| l.contains(&plan.raw_checksum()) && l.contains(&plan.aligned_checksum())));
    }
}

#[test]
fn ddp_drop_last_drops_a_deterministic_remainder_subset_when_enabled() {
    let (lengths, o) = remainder_case();
    for kernel in kernels() {
        let plan = StaticPackPlan::build(&kernel, &lengths, &o, 4, true).unwrap();
        let n = plan.raw_len();
        assert_eq!(plan.len(), n / 4 * 4);
        // The dropped remainder is the last n mod 4 packs of the deterministic order.
        assert_eq!(plan.aligned.packs, (0..plan.len() as u32).collect::<Vec<_>>());
        assert_eq!(plan.aligned.dropped_packs as usize, n % 4);
        assert_eq!(plan, StaticPackPlan::build(&kernel, &lengths, &o, 4, true).unwrap());
        assert!(plan.log_lines().iter().any(|l| l.contains("drop_last drops the last")));
        // Another world size drops other packs, deterministically too.
        let three = plan.realign(&kernel, 3, true).unwrap();
        assert_eq!(three.len(), n / 3 * 3);
        assert_eq!(three.raw_checksum(), plan.raw_checksum(), "the raw plan is world-size independent");
    }
}

// --- Requirement: length measurement (multimodal) and the length cache -------------------

/// A stand-in for a vision-language record: text tokens plus image patch tokens, as a
/// template would count them (deterministic in the record only).
fn multimodal_length(i: usize) -> Result<u64, String> {
    let text = 20 + (i * 2654435761) % 1500;
    let images = i % 3;
    let (h, w) = (224 + 28 * (i % 5), 224 + 28 * (i % 7));
    Ok((text + images * (h / 28) * (w / 28)) as u64)
}

#[test]
fn multimodal_samples_have_deterministic_planning_lengths() {
    let config = json!({"template": "qwen2-vl", "max_length": 16384, "image_patch": 28});
    let n = 200_000;
    let serial_dir = temp_dir("mm-serial");
    let parallel_dir = temp_dir("mm-parallel");
    let mut serial = LengthCache::open(&serial_dir, "train.jsonl", n, &config, None).unwrap();
    let a = serial.precompute(1, multimodal_length).unwrap().to_vec();
    let mut parallel = LengthCache::open(&parallel_dir, "train.jsonl", n, &config, None).unwrap();
    let b = parallel.precompute(8, multimodal_length).unwrap().to_vec();
    assert_eq!(a, b);
    // Written back by index: the cache files are byte-identical.
    let bytes = |d: &Path| std::fs::read(d.join(stowplan::plan::length_cache::FILE_NAME)).unwrap();
    assert_eq!(bytes(&serial_dir), bytes(&parallel_dir));
    // The planning lengths drive sum(length) <= capacity without splitting a sample.
    let plan = StaticPackPlan::build(&Kernel::wasm().unwrap(), &a, &PlanOptions::new(16_384), 8, false).unwrap();
    assert!(plan.raw.tokens.iter().all(|&t| t <= 16_384));
    let _ = std::fs::remove_dir_all(serial_dir);
    let _ = std::fs::remove_dir_all(parallel_dir);
}

#[test]
fn length_cache_resumes_after_a_crash_from_the_last_flush() {
    let dir = temp_dir("resume");
    let config = json!({"max_length": 4096});
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let mut cache = LengthCache::open(&dir, "ds", 10_000, &config, Some(1000)).unwrap();
    // The length function "crashes" at sample 4,321.
    let e = cache
        .precompute(1, |i| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i == 4321 { Err("tokenizer crashed".to_string()) } else { multimodal_length(i) }
        })
        .unwrap_err();
    assert!(e.to_string().contains("sample 4321: tokenizer crashed"), "{e}");
    drop(cache);
    // A new process: resumes with the 4,321 lengths flushed, computes only the rest.
    let mut again = LengthCache::open(&dir, "ds", 10_000, &config, Some(1000)).unwrap();
    assert_eq!(again.known(), 4321);
    calls.store(0, std::sync::atomic::Ordering::Relaxed);
    let lengths = again
        .precompute(4, |i| {
            calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            multimodal_length(i)
        })
        .unwrap()
        .to_vec();
    assert_eq!(calls.load(std::sync::atomic::Ordering::Relaxed), 10_000 - 4321);
    assert_eq!(lengths, (0..10_000).map(|i| multimodal_length(i).unwrap()).collect::<Vec<_>>());
    // A periodic flush happened on the way (every 1,000 lengths), not only at the end.
    assert!(again.flushes() >= 5, "{} flushes", again.flushes());
    // Stale temporary files from a killed writer are ignored.
    std::fs::write(dir.join(".lengths.splc.tmp.99999.0"), b"partial").unwrap();
    let reopened = LengthCache::open(&dir, "ds", 10_000, &config, None).unwrap();
    assert!(reopened.is_complete());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn length_cache_fingerprint_mismatch_fails_fast() {
    let dir = temp_dir("mismatch");
    let config = json!({"max_length": 4096, "template": "chatml"});
    let mut c = LengthCache::open(&dir, "data/a.jsonl", 100, &config, None).unwrap();
    c.precompute(2, multimodal_length).unwrap();
    let e = LengthCache::open(&dir, "data/b.jsonl", 100, &config, None).unwrap_err();
    assert_eq!(e.kind(), "cache-mismatch");
    assert!(e.to_string().contains("source: cached \"data/a.jsonl\", now \"data/b.jsonl\""), "{e}");
    let other = json!({"max_length": 8192, "template": "chatml"});
    let e = LengthCache::open(&dir, "data/a.jsonl", 100, &other, None).unwrap_err();
    assert!(e.to_string().contains("config.max_length: cached 4096, now 8192"), "{e}");
    // Waiting ranks fail at once too, not after the timeout.
    let e = LengthCache::wait(&dir, "data/b.jsonl", 100, &config, None).unwrap_err();
    assert_eq!(e.kind(), "cache-mismatch");
    // A damaged file is reported, not silently recomputed.
    let path = dir.join(stowplan::plan::length_cache::FILE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 40;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let e = LengthCache::open(&dir, "data/a.jsonl", 100, &config, None).unwrap_err();
    assert!(e.to_string().contains("damaged length cache"), "{e}");
    // A non-deterministic length function is caught when a length changes.
    std::fs::remove_file(&path).unwrap();
    let mut c = LengthCache::open(&dir, "data/a.jsonl", 100, &config, None).unwrap();
    c.set(3, 10).unwrap();
    assert_eq!(c.set(3, 11).unwrap_err().kind(), "cache-mismatch");
    assert_eq!(c.set(100, 1).unwrap_err().kind(), "invalid-argument");
    assert_eq!(c.set(4, 0).unwrap_err().kind(), "invalid-argument");
    assert!(LengthCache::open(&dir, "x", 1, &config, Some(0)).is_err());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn non_rank0_waits_for_the_cache_with_a_timeout() {
    let dir = temp_dir("wait");
    let config = json!({"max_length": 4096});
    // Nobody writes: the configured timeout fires.
    let t = std::time::Instant::now();
    let e = LengthCache::wait(&dir, "ds", 1000, &config, Some(Duration::from_millis(300))).unwrap_err();
    assert_eq!(e.kind(), "timeout");
    assert!(e.to_string().contains("packing_wait_timeout_s"), "{e}");
    assert!(t.elapsed() >= Duration::from_millis(300));
    // Rank 0 writes while another rank waits (partial flushes are not taken as complete).
    let waiter = {
        let (dir, config) = (dir.clone(), config.clone());
        std::thread::spawn(move || LengthCache::wait(&dir, "ds", 1000, &config, None))
    };
    let mut c = LengthCache::open(&dir, "ds", 1000, &config, Some(100)).unwrap();
    let lengths = c
        .precompute(1, |i| {
            if i % 100 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
            multimodal_length(i)
        })
        .unwrap()
        .to_vec();
    assert_eq!(waiter.join().unwrap().unwrap(), lengths);
    let _ = std::fs::remove_dir_all(dir);
}

// --- Requirement: effective_batch_size semantics when packing forces batch size 1 --------

#[test]
fn effective_batch_size_is_honored_after_packing_forces_batch_size_1() {
    let c = PackingConfig::from_json(
        &config(json!({"packing": true, "effective_batch_size": 64, "per_device_train_batch_size": 4,
                       "gradient_accumulation_steps": 2})),
        8,
    )
    .unwrap();
    assert_eq!(c.batch.per_device_train_batch_size, 1);
    assert_eq!(c.batch.gradient_accumulation_steps, 8);
    assert_eq!(c.batch.realized_packs_per_step, 64);
    assert_eq!(c.batch.requested_packs_per_step, Some(64));
    let r = c.batch.report();
    assert!(r.contains("requested 64 packs/step") && r.contains("realized 64"), "{r}");
}

#[test]
fn global_effective_batch_is_preserved_when_effective_batch_size_is_unset() {
    let b = EffectiveBatch::derive(8, 4, 2, None, true).unwrap();
    assert_eq!((b.per_device_train_batch_size, b.gradient_accumulation_steps), (1, 8));
    assert_eq!(b.configured_packs_per_step, 64);
    assert_eq!(b.realized_packs_per_step, 64);
    assert!(b.report().contains("configured 64 packs/step"));
    // Without packing nothing is forced.
    let plain = EffectiveBatch::derive(8, 4, 2, None, false).unwrap();
    assert_eq!((plain.per_device_train_batch_size, plain.gradient_accumulation_steps), (4, 2));
}

#[test]
fn fail_fast_when_effective_batch_size_is_not_world_size_divisible() {
    let e = config_error(config(json!({"packing": true, "effective_batch_size": 60})), 8);
    assert!(e.contains("training.effective_batch_size = 60 is not divisible by world_size = 8"), "{e}");
    assert!(e.contains("e.g. 56 or 64"), "{e}");
    let e = config_error(config(json!({"packing": true, "effective_batch_size": 3})), 8);
    assert!(e.contains("e.g. 8"), "{e}");
}

#[test]
fn static_mode_warns_on_partial_epoch_accumulation_windows() {
    let b = EffectiveBatch::derive(4, 1, 8, None, true).unwrap();
    assert_eq!(b.accumulation_warning(16), None);
    let w = b.accumulation_warning(20).expect("remainder");
    assert!(w.contains("20 packed batches per rank") && w.contains("leave 4"), "{w}");
    assert!(b.accumulation_warning(5).expect("fewer than one window").contains("5 packed batches"));
    // From a real plan: 70 samples on 4 ranks.
    let (lengths, o) = remainder_case();
    let plan = StaticPackPlan::build(&Kernel::native(), &lengths, &o, 4, false).unwrap();
    assert!(b.accumulation_warning(plan.per_rank() as u64).is_some());
}

// --- Configuration validation ----------------------------------------------------------

#[test]
fn config_rejects_what_the_seed_forbids() {
    let e = config_error(config(json!({"packing": true, "packing_length": 4096})), 1);
    assert!(e.contains("training.packing_length is deprecated") && e.contains("template.max_length"), "{e}");
    for key in ["packing_length_precompute_workers", "packing_length_cache_persist_every"] {
        for bad in [json!(0), json!(-3), json!("8")] {
            let e = config_error(config(json!({"packing": true, key: bad})), 1);
            assert!(e.contains(&format!("training.{key} must be a positive integer")), "{e}");
        }
    }
    let e = config_error(config(json!({"packing": true, "packing_wait_timeout_s": -1})), 1);
    assert!(e.contains("training.packing_wait_timeout_s must be an integer"), "{e}");
    let e = config_error(config(json!({"packing": true, "packing_mod": "static"})), 1);
    assert!(e.contains("unknown key training.packing_mod"), "{e}");
    let e = config_error(config(json!({"packing": true, "packing_mode": "fast"})), 1);
    assert!(e.contains("must be \"static\" or \"dynamic\""), "{e}");
    let e = config_error(json!({"training": {"packing": true}}), 1);
    assert!(e.contains("set template.max_length"), "{e}");
    let e = config_error(
        json!({"training": {"packing": true}, "template": {"max_length": 8}, "custom": {"fusion_config": "mix.yaml"}}),
        1,
    );
    assert!(e.contains("custom.fusion_config") && e.contains("every epoch"), "{e}");
    let e = config_error(config(json!({"packing": "yes"})), 1);
    assert!(e.contains("training.packing must be true or false"), "{e}");
    assert_eq!(PackingConfig::from_json(&config(json!({})), 0).unwrap_err().kind(), "invalid-argument");
    // Fallback to model.max_model_len, and the dataset source for fingerprints.
    let c = PackingConfig::from_json(
        &json!({"training": {"packing": true}, "model": {"max_model_len": 2048}, "custom": {"train_jsonl": "a.jsonl"}}),
        2,
    )
    .unwrap();
    assert_eq!((c.capacity, c.capacity_key.as_deref()), (Some(2048), Some("model.max_model_len")));
    assert_eq!(c.dataset_source.as_deref(), Some("a.jsonl"));
    // Dynamic mode is fine when dataset-level packing is off.
    let off = PackingConfig::from_json(&json!({"training": {"packing_mode": "dynamic"}}), 1).unwrap();
    assert!(!off.packing && !off.eval_packing);
}

// --- Saved plans and the must-show workloads --------------------------------------------

#[test]
fn saved_plans_round_trip_and_tampering_is_detected() {
    let dir = temp_dir("saved");
    let path = dir.join("plan.json");
    let (lengths, o) = remainder_case();
    let plan = StaticPackPlan::build(&Kernel::native(), &lengths, &o, 4, false).unwrap();
    plan.save(&path).unwrap();
    assert_eq!(StaticPackPlan::load(&path).unwrap(), plan);
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    doc["raw_plan"][0][0] = json!(69);
    std::fs::write(&path, doc.to_string()).unwrap();
    assert_eq!(StaticPackPlan::load(&path).unwrap_err().kind(), "cache-mismatch");
    // Every field is covered: editing any one of them is refused (format 1 checksummed only
    // the packs, so an edited packing_length or dropped_samples loaded and the log lied).
    plan.save(&path).unwrap();
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for (key, value) in saved.as_object().unwrap() {
        if key == "format" {
            continue;
        }
        let mut edited = saved.clone();
        edited[key] = match value {
            serde_json::Value::Number(n) => json!(n.as_u64().unwrap() + 1),
            serde_json::Value::Bool(b) => json!(!b),
            serde_json::Value::String(_) => json!("0".repeat(64)),
            serde_json::Value::Array(a) if a.is_empty() => json!([5]),
            serde_json::Value::Array(_) => json!([]),
            other => panic!("{key}: {other}"),
        };
        std::fs::write(&path, edited.to_string()).unwrap();
        let e = StaticPackPlan::load(&path).unwrap_err();
        assert_eq!(e.kind(), "cache-mismatch", "{key}: {e}");
    }
    let mut old = saved.clone();
    old["format"] = json!("stowplan.static-pack-plan/1");
    std::fs::write(&path, old.to_string()).unwrap();
    assert!(StaticPackPlan::load(&path).unwrap_err().to_string().contains("rebuild the plan"));
    std::fs::write(&path, b"{}").unwrap();
    assert_eq!(StaticPackPlan::load(&path).unwrap_err().kind(), "invalid-argument");
    assert_eq!(StaticPackPlan::load(&dir.join("missing.json")).unwrap_err().kind(), "io");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn workloads_pack_close_to_the_lower_bound_with_identical_checksums_on_both_kernels() {
    let sft = workload("sft-chat-200k.txt");
    let sum: u64 = sft.iter().sum();
    let bound = sum.div_ceil(16_384);
    let o = PlanOptions { allow_single_long: true, ..PlanOptions::new(16_384) };
    let plan = StaticPackPlan::build(&Kernel::wasm().unwrap(), &sft, &o, 8, false).unwrap();
    // Within 0.5 % of ceil(Σ / 16,384), every sample kept.
    assert!((plan.raw_len() as u64) * 1000 <= bound * 1005, "{} packs, bound {bound}", plan.raw_len());
    assert_eq!(plan.raw.indices.len(), sft.len());
    let docs = workload("pretrain-docs-1m.txt");
    let o = PlanOptions { allow_single_long: true, ..PlanOptions::new(32_768) };
    let a = StaticPackPlan::build(&Kernel::wasm().unwrap(), &docs, &o, 8, false).unwrap();
    let b = StaticPackPlan::build(&Kernel::native(), &docs, &o, 8, false).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.raw_checksum(), "91be2b30eb63eb8ea8dfa3502beb5c34c1e552987e449f43f3529e14d2f00621");
    assert_eq!(a.aligned_checksum(), "99091bdfbffa874e2671f2a1cccfb8ecadad68451a4fea34ca6d77e7adaddacc");
}

/// Recomputes every checksum of an edited plan document by the documented recipe (the raw and
/// aligned plans' checksums, the aligned plan, then `document_sha256`): what a forger does.
fn reseal(doc: &mut serde_json::Value) {
    let packs: Vec<Vec<u32>> = serde_json::from_value(doc["raw_plan"].clone()).unwrap();
    let mut offsets = vec![0u32];
    let mut indices = Vec::new();
    for p in &packs {
        indices.extend_from_slice(p);
        offsets.push(indices.len() as u32);
    }
    let raw = stowplan::kernel::RawPlan {
        offsets,
        indices,
        tokens: Vec::new(),
        single_long: Vec::new(),
        dropped: Vec::new(),
        real_tokens: 0,
        aligned_tokens: 0,
        lower_bound: 0,
        checksum: [0; 32],
    };
    let k = Kernel::native();
    let ws = doc["world_size"].as_u64().unwrap() as u32;
    // The kernel will not checksum every shape (an empty pack): then only the document hash.
    if let (Ok(aligned), Ok(raw)) =
        (k.aligned_plan(&raw, ws, doc["drop_last"].as_bool().unwrap()), k.aligned_plan(&raw, 1, false))
    {
        doc["raw_checksum"] = json!(raw.checksum_hex());
        doc["aligned_checksum"] = json!(aligned.checksum_hex());
        doc["aligned_plan"] = json!(aligned.packs);
    }
    doc["document_sha256"] = json!("");
    let canonical = serde_json::to_string(doc).unwrap();
    doc["document_sha256"] = json!(stowplan::runtime::sha256_hex(canonical.as_bytes()));
}

/// A plan edited with its checksums recomputed (the recipe is documented)
/// loaded without structural checks. Each forgery below reseals correctly and is refused for
/// its structure; an honest reseal of an unchanged plan still loads.
#[test]
fn a_resealed_forged_plan_is_refused_for_its_structure() {
    let dir = temp_dir("forged");
    let path = dir.join("plan.json");
    let (lengths, o) = remainder_case();
    let plan = StaticPackPlan::build(&Kernel::native(), &lengths, &o, 2, false).unwrap();
    plan.save(&path).unwrap();
    // Plans of every shape the kernel makes pass the structural checks: long samples kept
    // alone or dropped, alignment, drop_last.
    let mut long = lengths.clone();
    long[3] = 5_000;
    long[40] = 1_001;
    for (allow_single_long, align, drop_last) in [(true, 8, true), (false, 16, false), (true, 1, false)] {
        let o = PlanOptions { allow_single_long, align, ..PlanOptions::new(1000) };
        let p = StaticPackPlan::build(&Kernel::native(), &long, &o, 3, drop_last).unwrap();
        p.save(&path).unwrap();
        assert_eq!(StaticPackPlan::load(&path).unwrap(), p, "{allow_single_long} {align} {drop_last}");
    }
    plan.save(&path).unwrap();
    let saved: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let mut same = saved.clone();
    reseal(&mut same);
    assert_eq!(same, saved, "the recipe reproduces the document");
    let n = saved["samples"].as_u64().unwrap();
    let first = saved["raw_plan"][0][0].as_u64().unwrap();
    let second_pack_first = saved["raw_plan"][1][0].clone();
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("out of range", Box::new(move |d| d["raw_plan"][0].as_array_mut().unwrap().push(json!(n + 5)))),
        (
            "appears twice",
            Box::new(move |d| {
                let p = d["raw_plan"][0].as_array_mut().unwrap();
                p.push(second_pack_first.clone());
                p.sort_by_key(|v| v.as_u64());
            }),
        ),
        ("appears twice", Box::new(move |d| d["dropped_samples"] = json!([first]))),
        ("over packing_length", Box::new(|d| d["raw_tokens"][0] = json!(1u64 << 40))),
        (
            "hold 69 of the 70 samples",
            Box::new(|d| {
                let p = d["raw_plan"][0].as_array_mut().unwrap();
                let last = p.pop();
                if p.is_empty() {
                    p.push(last.unwrap());
                    d["raw_plan"][1].as_array_mut().unwrap().pop();
                }
            }),
        ),
        ("samples is", Box::new(|d| d["samples"] = json!(1u64 << 40))),
        ("real_tokens", Box::new(|d| d["real_tokens"] = json!(d["real_tokens"].as_u64().unwrap() + 1))),
        ("lower_bound", Box::new(|d| d["lower_bound"] = json!(0))),
        ("is empty", Box::new(|d| d["raw_plan"].as_array_mut().unwrap().push(json!([])))),
        ("not strictly ascending", Box::new(|d| d["raw_plan"][0].as_array_mut().unwrap().reverse())),
        ("single_long lists", Box::new(|d| d["single_long"] = json!([0]))),
    ];
    for (want, edit) in &cases {
        let mut forged = saved.clone();
        edit(&mut forged);
        if forged["raw_tokens"].as_array().unwrap().len() != forged["raw_plan"].as_array().unwrap().len() {
            forged["raw_tokens"].as_array_mut().unwrap().push(json!(0));
        }
        reseal(&mut forged);
        std::fs::write(&path, forged.to_string()).unwrap();
        match StaticPackPlan::load(&path) {
            Err(Error::CacheMismatch(m)) => assert!(m.contains(want), "{want}: {m}"),
            other => panic!("{want}: a forged plan loaded: {other:?}"),
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

// --- Plans under further limits (image tokens, images, segments) ----------------------

/// The first `n` rows of vlm-mix-100k: tokens, then image tokens and images per sample.
fn vlm_rows(n: usize) -> (Vec<u64>, Vec<u64>) {
    let rows = workload_table("vlm-mix-100k.tsv", &["image_tokens", "images"]);
    let rows = &rows[..3 * n];
    let tokens = rows.iter().step_by(3).copied().collect();
    let extra = rows.chunks(3).flat_map(|r| [r[1], r[2]]).collect();
    (tokens, extra)
}

#[test]
fn limited_plans_keep_every_limit_and_round_trip_through_format_3() {
    let (tokens, extra) = vlm_rows(20_000);
    let names = ["image_tokens".to_string(), "images".to_string()];
    let caps = [8_192, 32];
    let limits = PlanLimits {
        limits: MicroLimits { sizes: &extra, caps: &caps, names: &names },
        max_segments: 64,
        method: MultiMethod::Balanced,
    };
    let o = PlanOptions { allow_single_long: true, ..PlanOptions::new(16_384) };
    let plans: Vec<StaticPackPlan> =
        kernels().iter().map(|k| StaticPackPlan::build_limited(k, &tokens, &o, &limits, 8, false).unwrap()).collect();
    assert_eq!(plans[0], plans[1], "WASM and native plans differ");
    let plan = &plans[0];
    let l = plan.limits.as_ref().expect("limits recorded");
    assert_eq!((l.names.as_slice(), l.caps.as_slice(), l.max_segments), (&names[..], &caps[..], 64));
    for p in 0..plan.raw_len() {
        let members = plan.raw.pack(p);
        if members.len() == 1 && plan.raw.single_long.contains(&members[0]) {
            continue;
        }
        assert!(members.len() <= 64 && plan.raw.tokens[p] <= 16_384, "pack {p}");
        for q in 0..2 {
            let load: u64 = members.iter().map(|&i| extra[2 * i as usize + q]).sum();
            assert_eq!(l.loads[2 * p + q], load);
            assert!(load <= caps[q], "pack {p} holds {load} {}", names[q]);
        }
    }
    assert_eq!(plan.raw.lower_bound, l.lower_bounds.iter().max().unwrap() + plan.raw.single_long.len() as u64);
    assert!(plan.log_lines().iter().any(|line| line.contains("limits image_tokens<=8192 images<=32 segments<=64")));
    // Format 3, verified on load and equal after the round trip.
    let doc = plan.to_json();
    assert_eq!(doc["format"], json!("stowplan.static-pack-plan/3"));
    assert_eq!(StaticPackPlan::from_json(&doc).unwrap(), *plan);
    // A segment limit alone: format 3 with no limit's loads, and it loads back.
    let segments = PlanLimits { limits: MicroLimits { sizes: &[], caps: &[], names: &[] }, max_segments: 3, ..limits };
    let plan3 = StaticPackPlan::build_limited(&kernels()[1], &tokens[..500], &o, &segments, 2, false).unwrap();
    let doc = plan3.to_json();
    assert_eq!(doc["format"], json!("stowplan.static-pack-plan/3"));
    assert_eq!(StaticPackPlan::from_json(&doc).unwrap(), plan3);
    assert!((0..plan3.raw_len()).all(|p| plan3.raw.pack(p).len() <= 3));
    // Without limits, the plan of tokens only (format 2, unchanged).
    let none = PlanLimits { limits: MicroLimits { sizes: &[], caps: &[], names: &[] }, max_segments: 0, ..limits };
    let plain = StaticPackPlan::build_limited(&kernels()[0], &tokens, &o, &none, 8, false).unwrap();
    assert_eq!(plain, StaticPackPlan::build(&kernels()[0], &tokens, &o, 8, false).unwrap());
    assert_eq!(plain.to_json()["format"], json!("stowplan.static-pack-plan/2"));
}

#[test]
fn forged_limits_are_refused_even_when_resealed() {
    let (tokens, extra) = vlm_rows(2_000);
    let names = ["image_tokens".to_string(), "images".to_string()];
    let limits = PlanLimits {
        limits: MicroLimits { sizes: &extra, caps: &[8_192, 32], names: &names },
        max_segments: 64,
        method: MultiMethod::Bfd,
    };
    let plan =
        StaticPackPlan::build_limited(&Kernel::native(), &tokens, &PlanOptions::new(16_384), &limits, 2, true).unwrap();
    let doc = plan.to_json();
    let refused = |edit: &dyn Fn(&mut serde_json::Value), seal: bool| {
        let mut d = doc.clone();
        edit(&mut d);
        if seal {
            reseal(&mut d);
        }
        StaticPackPlan::from_json(&d).unwrap_err()
    };
    // Any edit without resealing: the document's sha256.
    for key in ["names", "caps", "max_segments", "method", "loads"] {
        let e = refused(&|d| d["limits"][key] = json!(null), false);
        assert!(matches!(e, Error::CacheMismatch(_) | Error::InvalidArgument(_)), "{key}: {e}");
    }
    let e = refused(&|d| d["limits"]["loads"][0][1] = json!(33), false);
    assert_eq!(e.kind(), "cache-mismatch");
    // Resealed: the limits' rules.
    let e = refused(&|d| d["limits"]["loads"][0][1] = json!(33), true);
    assert!(e.to_string().contains("over its cap 32"), "{e}");
    let e = refused(&|d| d["limits"]["caps"][1] = json!(0), true);
    assert!(e.to_string().contains("caps ≥ 1"), "{e}");
    let e = refused(&|d| d["limits"]["method"] = json!("worst-fit"), true);
    assert!(e.to_string().contains("worst-fit"), "{e}");
    let e = refused(&|d| d["limits"]["max_segments"] = json!(1), true);
    assert!(e.to_string().contains("over max_segments 1"), "{e}");
    let e = refused(&|d| d["limits"]["names"][1] = json!("tokens"), true);
    assert!(e.to_string().contains("not \"tokens\""), "{e}");
    let e = refused(&|d| d["limits"]["loads"].as_array_mut().unwrap().truncate(1), true);
    assert!(e.to_string().contains("loads has 1 rows"), "{e}");
    // Lower loads than recorded change the image tokens' bound (the largest here): the
    // recorded lower_bound no longer follows.
    assert_eq!(
        plan.limits.as_ref().unwrap().lower_bounds.iter().max(),
        Some(&plan.limits.as_ref().unwrap().lower_bounds[1])
    );
    let e = refused(
        &|d| {
            for row in d["limits"]["loads"].as_array_mut().unwrap() {
                row[0] = json!(0);
            }
        },
        true,
    );
    assert!(e.to_string().contains("lower_bound"), "{e}");
    // Format and limits go together.
    let e = refused(&|d| d["format"] = json!("stowplan.static-pack-plan/2"), true);
    assert_eq!(e.kind(), "invalid-argument");
    let e = refused(&|d| drop(d.as_object_mut().unwrap().remove("limits")), true);
    assert_eq!(e.kind(), "invalid-argument");
}
