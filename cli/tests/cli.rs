//! The `stowplan` command line: default workload, input formats, JSON, exit codes, cache.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs stowplan with `args`. `stdin: None` gives it /dev/null as standard input (so commands
/// without FILE use the built-in workload); `Some(text)` pipes `text`.
fn stowplan(args: &[&str], stdin: Option<&str>, envs: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stowplan"));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("runs stowplan");
    if let Some(text) = stdin {
        // A command refused at argument parsing exits before reading its input: the broken
        // pipe that leaves is expected, and the exit status below is what the tests judge.
        match child.stdin.take().unwrap().write_all(text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            r => r.expect("writes stowplan's stdin"),
        }
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("valid JSON on stdout")
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("stowplan-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn default_workload_partition_human_summary() {
    let out = stowplan(&["partition"], None, &[]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("partition of 4096 lengths from built-in rl-math-8k"), "{text}");
    assert!(text.contains("lower bound"), "{text}");
    assert!(text.contains("spread"), "{text}");
}

#[test]
fn default_workload_pack_json() {
    let v = json(&stowplan(&["pack", "--capacity", "16384", "--json"], None, &[]));
    assert_eq!(v["n"], 4096);
    let bins = v["bins"].as_array().unwrap();
    let mut seen: Vec<u64> =
        bins.iter().flat_map(|b| b.as_array().unwrap().iter().map(|x| x.as_u64().unwrap())).collect();
    seen.sort();
    assert_eq!(seen, (0..4096).collect::<Vec<u64>>(), "every index once");
    assert!(v["loads"].as_array().unwrap().iter().all(|l| l.as_u64().unwrap() <= 16384));
    assert!(bins.len() as u64 >= v["lower_bound"].as_u64().unwrap());
}

#[test]
fn stdin_json_array_and_file_lines() {
    let v = json(&stowplan(&["partition", "-k", "2", "--json", "-"], Some("[100, 900, 50, 950, 400, 600]"), &[]));
    assert_eq!(v["groups"], serde_json::json!([[0, 2, 3, 4], [1, 5]]));
    assert_eq!(v["spread"], 0);
    let dir = temp_dir("lines");
    let f = dir.join("lengths.txt");
    std::fs::write(&f, "5\n3\n7\n2\n6\n").unwrap();
    let path = f.to_str().unwrap();
    let v = json(&stowplan(&["pack", "-c", "10", "--method", "next-fit", "--json", path], None, &[]));
    assert_eq!(v["bins"], serde_json::json!([[0, 1], [2, 3], [4]]));
    let native = json(&stowplan(
        &["pack", "-c", "10", "--method", "next-fit", "--json", "--backend", "native", path],
        None,
        &[],
    ));
    assert_eq!(native["bins"], v["bins"]);
}

#[test]
fn bad_input_exits_2_naming_the_line() {
    let out = stowplan(&["pack", "-"], Some("12\nabc\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 2"), "{err}");
    let out = stowplan(&["partition", "-k", "0"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("k must be at least 1"));
    let out = stowplan(&["pack", "/nonexistent/lengths.txt"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/lengths.txt"));
    let out = stowplan(&["pack", "--method", "worst-fit"], None, &[]);
    assert_eq!(out.status.code(), Some(2), "clap rejects unknown values");
}

#[test]
fn piped_standard_input_is_read_without_file() {
    // printf '5\n3\n7\n' | stowplan partition -k 2 --json
    let v = json(&stowplan(&["partition", "-k", "2", "--json"], Some("5\n3\n7\n"), &[]));
    assert_eq!(v["n"], 3);
    assert_eq!(v["source"], "standard input");
    assert_eq!((v["total"].as_u64(), v["spread"].as_u64()), (Some(15), Some(1)));
    // Every lengths-reading command.
    let v = json(&stowplan(&["pack", "-c", "10", "--json"], Some("[5, 3, 7]"), &[]));
    assert_eq!(v["n"], 3);
    let v = json(&stowplan(&["balance", "--capacity", "10", "--json"], Some("5\n3\n7\n"), &[]));
    assert_eq!(v["n"], 3);
}

#[test]
fn standard_input_redirected_from_a_file_is_read() {
    let dir = temp_dir("redirect");
    let f = dir.join("lengths.txt");
    std::fs::write(&f, "4\n9\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stowplan"))
        .args(["pack", "-c", "10", "--json"])
        .stdin(std::fs::File::open(&f).unwrap())
        .output()
        .unwrap();
    let v = json(&out);
    assert_eq!(v["n"], 2);
    assert_eq!(v["source"], "standard input");
    // An empty file: the same error as an empty pipe.
    std::fs::write(&f, "").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_stowplan"))
        .args(["pack"])
        .stdin(std::fs::File::open(&f).unwrap())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn input_is_bounded_and_errors_quote_an_excerpt() {
    // Text beyond the limit (1 MiB here) is refused, naming the option.
    let long = "1\n".repeat(600_000);
    let out = stowplan(&["pack", "-", "--max-input-mib", "1"], Some(&long), &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("standard input is larger than --max-input-mib 1 MiB"), "{err}");
    // /dev/zero never ends, and is not text: refused at its first line, not after the limit.
    let out = stowplan(&["plan", "--capacity", "8", "--lengths", "/dev/zero"], None, &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("/dev/zero: line 1 is not text (0x00 at byte 0)"), "{out:?}");
    // A 5 MB bad line gives a short error.
    let line = "7".repeat(5 << 20) + "x\n";
    let out = stowplan(&["partition", "-"], Some(&line), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stderr.len() < 400, "{} bytes of error", out.stderr.len());
}

#[test]
fn empty_piped_standard_input_exits_2_naming_what_to_do() {
    for text in ["", "\n  \n"] {
        let out = stowplan(&["partition", "-k", "2"], Some(text), &[]);
        assert_eq!(out.status.code(), Some(2), "{text:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("standard input is empty: give lengths on it, a FILE, or --workload NAME"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn builtin_workloads_by_name() {
    // /dev/null as standard input: the default workload, with a note on stderr.
    let default = stowplan(&["partition", "--json"], None, &[]);
    assert!(stderr(&default).contains("built-in rl-math-8k"), "{}", stderr(&default));
    let default = json(&default);
    assert_eq!(default["n"], 4096);
    let named = stowplan(&["partition", "--json", "--workload", "rl-math-8k"], None, &[]);
    assert!(!stderr(&named).contains("built-in"), "no note when named: {}", stderr(&named));
    let named = json(&named);
    assert_eq!(named["n"], 4096);
    assert_eq!((&named["groups"], &named["source"]), (&default["groups"], &default["source"]));
    // --workload wins over a piped standard input.
    let v = json(&stowplan(&["pack", "--json", "--workload", "rl-math-8k"], Some("5\n"), &[]));
    assert_eq!(v["n"], 4096);
    // Unknown names are refused, listing the known ones.
    let out = stowplan(&["pack", "--workload", "nope"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("nope") && stderr(&out).contains("rl-math-8k"), "{}", stderr(&out));
    // A FILE and --workload together are refused.
    let out = stowplan(&["balance", "--dp", "2", "--workload", "rl-math-8k", "-"], Some("5\n3\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot be used with"), "{}", stderr(&out));
    // --help lists the workloads with their descriptions.
    let help = String::from_utf8(stowplan(&["partition", "--help"], None, &[]).stdout).unwrap();
    assert!(help.contains("--workload <NAME>") && help.contains("rl-math-8k:"), "{help}");
}

#[test]
fn method_names_come_from_the_kernel() {
    let v = json(&stowplan(&["pack", "-c", "10", "--method", "next_fit", "--json"], Some("5\n3\n7\n"), &[]));
    assert_eq!(v["method"], "next-fit");
    assert_eq!(v["oversize"], "error");
    let out = stowplan(&["pack", "--method", "worst-fit"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("[possible values: balanced, bfd, ffd, next-fit]"), "{}", stderr(&out));
    let v = json(&stowplan(&["partition", "-k", "2", "--method", "greedy", "--json"], Some("5\n3\n7\n"), &[]));
    assert_eq!(v["method"], "greedy");
    let help = String::from_utf8(stowplan(&["balance", "--help"], None, &[]).stdout).unwrap();
    assert!(
        help.contains("[default: none]") && help.contains("cost-desc") && help.contains("[default: tokens]"),
        "{help}"
    );
    let text = String::from_utf8(
        stowplan(&["balance", "--dp", "2", "--cost", "attention", "--workload", "rl-math-8k"], None, &[]).stdout,
    )
    .unwrap();
    assert!(text.contains("cost attention (24576·L + L²), backend wasm"), "{text}");
    let out = stowplan(&["partition", "--backend", "gpu"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("[possible values: wasm, native]"), "{}", stderr(&out));
}

#[test]
fn infeasible_exits_1() {
    let out = stowplan(&["pack", "-c", "100", "-"], Some("50\n101\n"), &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lengths[1] = 101") && err.contains("capacity = 100"), "{err}");
}

#[test]
fn precompiled_kernel_is_cached_and_a_broken_cache_is_rebuilt() {
    let dir = temp_dir("cache");
    let env = [("STOWPLAN_CACHE_DIR", dir.to_str().unwrap())];
    let args = ["partition", "--json", "-k", "4"];
    assert_eq!(json(&stowplan(&args, None, &env))["kernel_origin"], "compiled");
    assert_eq!(json(&stowplan(&args, None, &env))["kernel_origin"], "cache");
    // Corrupt every cached artifact: the next run must recompile, not crash.
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "cwasm") {
            std::fs::write(&p, b"garbage").unwrap();
        }
    }
    assert_eq!(json(&stowplan(&args, None, &env))["kernel_origin"], "compiled");
    assert_eq!(json(&stowplan(&args, None, &env))["kernel_origin"], "cache");
    let no_cache = [("STOWPLAN_CACHE_DIR", dir.to_str().unwrap()), ("STOWPLAN_NO_CACHE", "1")];
    assert_eq!(json(&stowplan(&args, None, &no_cache))["kernel_origin"], "compiled");
}

#[test]
fn the_compile_cache_is_private_and_authenticated() {
    use std::os::unix::fs::PermissionsExt;
    let args = ["partition", "--json", "-k", "4"];
    // Created private to the user, with a key and MAC'd entries.
    let parent = temp_dir("cache-private");
    let dir = parent.join("new");
    let env = [("STOWPLAN_CACHE_DIR", dir.to_str().unwrap())];
    assert_eq!(json(&stowplan(&args, None, &env))["kernel_origin"], "compiled");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("cache.key")), 0o600);
    let entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    assert!(entries.iter().any(|p| p.extension().is_some_and(|x| x == "mac")), "{entries:?}");
    assert!(entries.iter().filter(|p| p.extension().is_some_and(|x| x == "cwasm")).all(|p| mode(p) == 0o600));
    assert_eq!(json(&stowplan(&args, None, &env))["kernel_origin"], "cache");
    // Entries made with another user's (another cache's) key are not trusted.
    let other = parent.join("other");
    let other_env = [("STOWPLAN_CACHE_DIR", other.to_str().unwrap())];
    assert_eq!(json(&stowplan(&args, None, &other_env))["kernel_origin"], "compiled");
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().is_some_and(|n| n != "cache.key") {
            std::fs::copy(&p, other.join(p.file_name().unwrap())).unwrap();
        }
    }
    let out = stowplan(&args, None, &[&other_env[..], &[("STOWPLAN_LOG", "warn")]].concat());
    assert_eq!(json(&out)["kernel_origin"], "compiled");
    assert!(String::from_utf8_lossy(&out.stderr).contains("MAC does not verify"), "{out:?}");
    // A cache directory others may write is not used at all.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = stowplan(&args, None, &env);
    assert_eq!(json(&out)["kernel_origin"], "compiled");
    assert!(String::from_utf8_lossy(&out.stderr).contains("writable by group or others"), "{out:?}");
    let _ = std::fs::remove_dir_all(&parent);
}

#[test]
fn stowplan_log_filters_by_level_and_target_and_a_bad_filter_is_said() {
    use std::os::unix::fs::PermissionsExt;
    // A cache directory others may write: the kernel is compiled, with a warning of target
    // `stowplan::runtime`.
    let dir = temp_dir("log");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let args = ["partition", "-k", "2", "--json"];
    // Every call sets STOWPLAN_LOG (empty: unset), whatever the caller's environment holds.
    let warned = |log: &str| {
        let env = [("STOWPLAN_CACHE_DIR", dir.to_str().unwrap()), ("STOWPLAN_LOG", log)];
        let out = stowplan(&args, Some("5\n3\n"), &env);
        assert!(out.status.success(), "{out:?}");
        (stderr(&out).contains("not using the compile cache"), stderr(&out))
    };
    assert!(warned("").0, "warnings by default");
    assert!(!warned("off").0, "off");
    assert!(!warned("warn,stowplan::runtime=error").0, "a target's own level");
    assert!(warned("error,stowplan::runtime=warn").0, "a target's own level");
    assert!(warned("stowplan=debug").0, "a parent target's level");
    // Blank directives are skipped (tracing-subscriber would read one as `error`).
    let (shown, err) = warned("warn, ,");
    assert!(shown && !err.contains("is not a log filter"), "{err}");
    // A value that is not a filter is said, and the default (warnings) applies.
    for bad in ["stowplan=loud", "stowplan[serve]=debug"] {
        let (shown, err) = warned(bad);
        assert!(shown && err.contains(&format!("STOWPLAN_LOG={bad:?} is not a log filter")), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn balance_two_level_on_the_default_workload() {
    let v =
        json(&stowplan(&["balance", "--dp", "8", "--capacity", "16384", "--cost", "attention", "--json"], None, &[]));
    assert_eq!(v["operation"], "balance");
    assert_eq!(v["dp"]["ranks"].as_array().unwrap().len(), 8);
    let per_rank = v["micro_batches"].as_array().unwrap();
    let count = v["count"].as_u64().unwrap();
    assert!(per_rank.iter().all(|m| m["count"].as_u64() == Some(count)));
    assert!(v["micro_batch_token_balance"]["max"].as_u64().unwrap() <= 16_384);
    assert!(v["dp"]["verl_unbalance"]["global_seqlen/balanced_max"].is_i64());
    let text = String::from_utf8(stowplan(&["balance", "--capacity", "16384"], None, &[]).stdout).unwrap();
    assert!(text.contains("micro-batches") && text.contains("lower bound 450"), "{text}");
}

#[test]
fn balance_errors_exit_with_the_right_code() {
    let out = stowplan(&["balance", "--capacity", "10", "-"], Some("5\n20\n"), &[]);
    assert_eq!(out.status.code(), Some(1), "infeasible: a sequence longer than the cap");
    assert!(String::from_utf8_lossy(&out.stderr).contains("sequence 1 has 20 tokens"));
    let out = stowplan(&["balance", "--dp", "4", "-"], Some("5\n20\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 4 samples"));
    let out = stowplan(&["balance", "--dp", "2", "--cost", "flops"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cost must be 'tokens', 'attention' or LINEAR,QUADRATIC"), "{}", stderr(&out));
    let out = stowplan(&["balance"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to plan"));
    // --group-size follows the host's rule (`stowplan::kernel::group_labels`), as Python's group_size=.
    for (g, extra, want) in [
        ("0", None, "group_size must be in 1..=6 and divide the number of samples n = 6 (got 0)"),
        ("4", None, "group_size must be in 1..=6 and divide the number of samples n = 6 (got 4)"),
        ("0", Some("--unequal-count"), "group_size must be at least 1 (got 0)"),
    ] {
        let mut args = vec!["balance", "--dp", "2", "--group-size", g, "-"];
        args.extend(extra);
        let out = stowplan(&args, Some("5\n20\n3\n4\n1\n9\n"), &[]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(want), "{}", stderr(&out));
    }
    // Groups only matter to the DP level: with --dp 1 the size is not checked (as before).
    let out = stowplan(&["balance", "--capacity", "30", "--group-size", "4", "-"], Some("5\n20\n3\n4\n1\n9\n"), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let out = stowplan(
        &["balance", "--dp", "2", "--group-size", "4", "--unequal-count", "--json", "-"],
        Some("5\n20\n3\n4\n1\n9\n"),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn plan_summary_json_out_file_and_checksums_agree_with_the_library() {
    let dir = temp_dir("cli-plan");
    let out_path = dir.join("plan.json");
    let out = stowplan(
        &["plan", "--capacity", "8192", "--world-size", "7", "--out", out_path.to_str().unwrap(), "--json"],
        None,
        &[],
    );
    let v = json(&out);
    assert_eq!(v["operation"], "plan");
    assert_eq!(v["samples"], 4096);
    let (raw, aligned) = (v["n_raw_packs"].as_u64().unwrap(), v["n_aligned_packs"].as_u64().unwrap());
    assert_eq!(aligned, raw.div_ceil(7) * 7);
    assert_eq!(v["pad_needed"].as_u64().unwrap(), aligned - raw);
    assert!(v["dropped_long"].as_u64().unwrap() > 0, "rl-math-8k has samples at the 8192 cap");
    // The long samples are announced on stderr (never dropped silently).
    assert!(String::from_utf8_lossy(&out.stderr).contains("dropped (allow_single_long=false)"));
    // And the summary's first line says how many of how many.
    let text = stowplan(&["plan", "--capacity", "8192", "--world-size", "7"], None, &[]);
    assert!(text.status.success(), "{}", stderr(&text));
    let first = String::from_utf8_lossy(&text.stdout).lines().next().unwrap_or_default().to_string();
    let dropped = v["dropped_long"].as_u64().unwrap();
    let want = format!("dropped {dropped} of 4096 samples: length >= capacity 8192; --allow-single-long keeps them");
    assert_eq!(first, want);
    // The saved plan loads (checksums verified) and matches the Rust API on the same input.
    let saved = stowplan::StaticPackPlan::load(&out_path).unwrap();
    assert_eq!(saved.raw_checksum(), v["raw_checksum"].as_str().unwrap());
    let lengths = stowplan::input::parse_lengths(stowplan::input::DEFAULT_WORKLOAD).unwrap();
    let api = stowplan::StaticPackPlan::build(
        &stowplan::Kernel::native(),
        &lengths,
        &stowplan::kernel::PlanOptions::new(8192),
        7,
        false,
    )
    .unwrap();
    assert_eq!(api, saved);
    // Human summary.
    let out = stowplan(&["plan", "--capacity", "8192", "--world-size", "7", "--drop-last"], None, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("raw packs") && text.contains("aligned sha256") && text.contains("dropped"), "{text}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plan_reads_a_column_and_keeps_a_length_cache() {
    let dir = temp_dir("cli-plan-column");
    let data = dir.join("lengths.tsv");
    std::fs::write(&data, "id\tlength\na\t700\nb\t300\nc\t1200\nd\t50\n").unwrap();
    let cache = dir.join("cache");
    let args = [
        "plan",
        "--lengths",
        data.to_str().unwrap(),
        "--column",
        "2",
        "--capacity",
        "1000",
        "--allow-single-long",
        "--cache-dir",
        cache.to_str().unwrap(),
        "--json",
    ];
    let first = json(&stowplan(&args, None, &[]));
    assert_eq!(first["samples"], 4);
    assert_eq!(first["single_long"], 1);
    assert_eq!(first["cache"]["reused"], 0);
    let second = json(&stowplan(&args, None, &[]));
    assert_eq!(second["cache"]["reused"], 4);
    assert_eq!(first["raw_checksum"], second["raw_checksum"]);
    // The same cache directory for other data fails fast, naming the cause.
    std::fs::write(&data, "id\tlength\na\t701\nb\t300\nc\t1200\nd\t50\n").unwrap();
    let out = stowplan(&args, None, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cache mismatch") && err.contains("source: cached"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn plan_errors_exit_with_the_right_code() {
    let out = stowplan(&["plan", "--capacity", "0"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("capacity must be at least 1"));
    let out = stowplan(&["plan", "--capacity", "8", "-"], Some("9\n10\n"), &[]);
    assert_eq!(out.status.code(), Some(2), "FILE is --lengths: a positional argument is refused");
    let out = stowplan(&["plan", "--lengths", "-", "--capacity", "8"], Some("9\n10\n"), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("produced no packs"));
    let out = stowplan(&["plan", "--lengths", "-", "--capacity", "8", "--world-size", "0"], Some("3\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("world_size must be at least 1"));
}

fn plugin(file: &str) -> String {
    format!("{}/../plugins/dist/{file}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn filter_hash_and_check_report_the_pin_the_world_and_the_selection() {
    let top = plugin("top_reward.wasm");
    let out = stowplan(&["filter", "hash", &top], None, &[]);
    assert!(out.status.success());
    let line = String::from_utf8(out.stdout).unwrap();
    let pin = line.split_whitespace().next().unwrap().to_string();
    let recorded = std::fs::read_to_string(plugin("SHA256SUMS")).unwrap();
    assert!(recorded.contains(&format!("{pin}  top_reward.wasm")), "{recorded}");
    let out = stowplan(
        &["filter", "check", &top, "--sha256", &pin, "--groups", "50", "--wanted", "5", "--calls", "3", "--json"],
        None,
        &[],
    );
    let report = json(&out);
    assert_eq!(report["sha256"], pin.as_str());
    assert_eq!(report["pinned"], true);
    assert_eq!(report["selection"].as_array().unwrap().len(), 5);
    assert!(
        report["imports"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i.as_str().unwrap().starts_with("wasi:") || i == "stowplan:filter/types@0.1.0")
    );
    // The human summary.
    let out = stowplan(&["filter", "check", &top, "--calls", "2"], None, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("not pinned") && text.contains("exports filter.select") && text.contains("median"), "{text}");
}

#[test]
fn filter_check_errors_exit_2_and_name_the_problem() {
    let top = plugin("top_reward.wasm");
    for (args, needle) in [
        (vec!["filter", "check", &top, "--sha256", "00"], "sha256 must be 64 hex digits"),
        (vec!["filter", "check", &top, "--wanted", "0"], "--wanted"),
        (vec!["filter", "check", &top, "--timeout-ms", "0"], "timeout must be in 1 ms"),
        (vec!["filter", "check", &top, "--config", "{\"reward_index\": -1}"], "reward_index must be an integer"),
        (vec!["filter", "check", "/nonexistent.wasm"], "reading the plugin"),
        // Sizes are bounded before anything is allocated (a 4294967295-group buffer used to
        // abort on a 100 GB allocation).
        (vec!["filter", "check", &top, "--groups", "4294967295"], "1..=1048576"),
        (vec!["filter", "check", &top, "--calls", "4294967295"], "1..=1000000"),
        (vec!["filter", "check", &top, "--samples-per-group", "65537"], "1..=65536"),
        (
            vec!["filter", "check", &top, "--groups", "65536", "--samples-per-group", "65536"],
            "--groups × --samples-per-group must be at most 1048576 samples",
        ),
    ] {
        let out = stowplan(&args, None, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let wrong = "1".repeat(64);
    let out = stowplan(&["filter", "check", &top, "--sha256", &wrong], None, &[]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("hash mismatch"));
    let out = stowplan(&["filter", "check", &plugin("hostile.wasm"), "--config", "{\"mode\": \"panic\"}"], None, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("panics on purpose"));
}

/// `serve --limit`: image samples are spread so that no micro-batch holds more images than
/// the cap; a sample over it is rejected by name; bad limits are refused before serving.
#[test]
fn serve_keeps_micro_batches_within_limits() {
    let root = temp_dir("serve-limits");
    let sample = |images: u64| stowplan::TrainingSample {
        prompt_ids: vec![1, 2],
        completion_ids: vec![3; 10],
        advantage: 1.0,
        resources: vec![("images".to_string(), images)],
        ..Default::default()
    };
    let samples = [2, 2, 2, 2, 2, 2, 5].map(sample).to_vec();
    let batch = stowplan::TrainingBatch { run: 0, step: 0, temperature: 1.0, samples };
    stowplan::serve::send_fs(&root, "run_0_step_0.bin", &batch.encode().unwrap()).unwrap();
    let r = root.to_str().unwrap();
    let args = ["serve", "--root", r, "--capacity", "256", "--dp", "1", "--batch-size", "6", "--max-steps", "1"];
    let out = stowplan(&[&args[..], &["--json", "--threshold", "10", "--limit", "images=4"]].concat(), None, &[]);
    let v = json(&out);
    assert_eq!(v["summary"]["samples"], 6, "{v}");
    assert_eq!(v["runs"][0]["progress"]["rejected"]["over_limit"], 1, "{v}");
    let b =
        stowplan::packer::RankBatch::decode(&std::fs::read(root.join("rollouts/step_0/rank_0.bin")).unwrap()).unwrap();
    // 72 tokens fit one micro-batch of 256; 12 images at 4 per micro-batch need 3.
    assert_eq!(b.micro_batches.len(), 3);
    assert!(b.micro_batches.iter().all(|mb| mb.samples.len() == 2));
    for (limit, want) in [
        ("tokens=9", "--limit tokens=…: the tokens are capped by the command's --capacity"),
        ("images=0", "CAP of at least 1"),
        ("images", "expected NAME=CAP"),
    ] {
        let bad = stowplan(&[&args[..], &["--limit", limit]].concat(), None, &[]);
        assert_eq!(bad.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&bad.stderr).contains(want), "{limit}: {bad:?}");
    }
    // The checkpoint records the limits: another cap is refused, naming it.
    let bad = stowplan(&[&args[..], &["--limit", "images=8"]].concat(), None, &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("limits: [(\"images\", 4)]"), "{bad:?}");
}

/// `serve --max-segments`: at most that many samples in every micro-batch.
#[test]
fn serve_caps_the_samples_of_every_micro_batch() {
    let root = temp_dir("serve-segments");
    let sample = stowplan::TrainingSample {
        prompt_ids: vec![1, 2],
        completion_ids: vec![3; 4],
        advantage: 1.0,
        ..Default::default()
    };
    let batch = stowplan::TrainingBatch { run: 0, step: 0, temperature: 1.0, samples: vec![sample; 7] };
    stowplan::serve::send_fs(&root, "run_0_step_0.bin", &batch.encode().unwrap()).unwrap();
    let r = root.to_str().unwrap();
    let args = ["serve", "--root", r, "--capacity", "256", "--dp", "1", "--batch-size", "7", "--max-steps", "1"];
    let v = json(&stowplan(&[&args[..], &["--json", "--threshold", "10", "--max-segments", "2"]].concat(), None, &[]));
    assert_eq!(v["summary"]["samples"], 7, "{v}");
    let b =
        stowplan::packer::RankBatch::decode(&std::fs::read(root.join("rollouts/step_0/rank_0.bin")).unwrap()).unwrap();
    // 42 tokens fit one micro-batch of 256; 7 samples at 2 per micro-batch need 4.
    let sizes: Vec<usize> = b.micro_batches.iter().map(|mb| mb.samples.len()).collect();
    assert_eq!((sizes.len(), sizes.iter().sum::<usize>()), (4, 7), "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 2), "{sizes:?}");
}

#[test]
fn serve_delivers_a_step_and_names_bad_options() {
    let root = temp_dir("serve");
    let batch = stowplan::TrainingBatch {
        run: 0,
        step: 0,
        temperature: 1.0,
        samples: (0..6)
            .map(|i| stowplan::TrainingSample {
                prompt_ids: vec![1, 2],
                completion_ids: vec![3; 10 + i],
                advantage: 1.0,
                ..Default::default()
            })
            .collect(),
    };
    stowplan::serve::send_fs(&root, "run_0_step_0.bin", &batch.encode().unwrap()).unwrap();
    let r = root.to_str().unwrap();
    let args = ["serve", "--root", r, "--capacity", "64", "--dp", "2", "--batch-size", "3", "--max-steps", "1"];
    let out = stowplan(&[&args[..], &["--json", "--threshold", "10"]].concat(), None, &[]);
    let v = json(&out);
    assert_eq!(v["summary"]["steps"], 1);
    assert_eq!(v["summary"]["samples"], 6);
    assert_eq!(v["runs"][0]["progress"]["step"], 2);
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("step delivered") && logs.contains("imbalance"), "{logs}");
    for rank in 0..2 {
        let bytes = std::fs::read(root.join(format!("rollouts/step_0/rank_{rank}.bin"))).unwrap();
        let b = stowplan::packer::RankBatch::decode(&bytes).unwrap();
        assert_eq!((b.step, b.rank, b.keys.len()), (0, rank, 6));
    }
    // --seq-len, the former name of --capacity, still works for one release with a warning;
    // both at once is a usage error.
    let both = stowplan(
        &["serve", "--root", r, "--capacity", "64", "--seq-len", "64", "--dp", "2", "--batch-size", "3"],
        None,
        &[],
    );
    assert_eq!(both.status.code(), Some(2), "{both:?}");
    assert!(String::from_utf8_lossy(&both.stderr).contains("cannot be used with"), "{both:?}");
    let old = stowplan(&["serve", "--root", r, "--seq-len", "0", "--dp", "2", "--batch-size", "3"], None, &[]);
    let err = String::from_utf8_lossy(&old.stderr);
    assert!(err.contains("--seq-len is deprecated") && err.contains("use --capacity"), "{old:?}");
    assert!(err.contains("capacity must be in 1..="), "the former name reaches the same check: {old:?}");
    let bad = stowplan(&["serve", "--root", r, "--capacity", "0", "--dp", "2", "--batch-size", "3"], None, &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("capacity must be in 1..="), "{:?}", bad);
    let bad = stowplan(&["serve", "--root", r, "--capacity", "64", "--dp", "2", "--batch-size", "0"], None, &[]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--batch-size must be at least 1"), "{:?}", bad);
    // A wait beyond what a Duration holds is refused with its range (it used to panic).
    for wait in ["--wait-timeout=1e30", "--wait-timeout=-1", "--wait-timeout=nan"] {
        let bad = stowplan(&[&args[..], &[wait]].concat(), None, &[]);
        assert_eq!(bad.status.code(), Some(2), "{:?}", bad);
        assert!(
            String::from_utf8_lossy(&bad.stderr).contains("--wait-timeout must be a number of seconds from 0 to 1e9")
        );
    }
    // An unknown distribution is refused listing the names; round robin with limits too.
    let bad = stowplan(&[&args[..], &["--distribution", "rr"]].concat(), None, &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("round-robin"), "{:?}", bad);
    let bad = stowplan(&[&args[..], &["--distribution", "round-robin", "--limit", "images=4"]].concat(), None, &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("round-robin takes no limits"), "{:?}", bad);
    // Restarting with other options than the checkpoint's is refused, naming them (the
    // distribution too).
    let bad = stowplan(&[&args[..], &["--distribution", "round-robin"]].concat(), None, &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("saved with other options"), "{:?}", bad);
    let bad = stowplan(&["serve", "--root", r, "--capacity", "128", "--dp", "2", "--batch-size", "3"], None, &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("saved with other options"), "{:?}", bad);
    // Each transport names what it needs.
    let opts = ["--capacity", "64", "--dp", "2", "--batch-size", "3"];
    let bad = stowplan(&[&["serve", "--transport", "zmq"][..], &opts].concat(), None, &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--state-dir (or --root) is required"), "{:?}", bad);
    let state = root.join("zmq-state");
    let state = state.to_str().unwrap();
    let bad = stowplan(&[&["serve", "--transport", "fs", "--state-dir", state][..], &opts].concat(), None, &[]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--root is required with --transport fs"), "{:?}", bad);
    if cfg!(feature = "zmq") {
        let zmq = ["serve", "--transport", "zmq", "--state-dir", state, "--zmq-ranks", "nonsense"];
        let bad = stowplan(&[&zmq[..], &opts].concat(), None, &[]);
        assert_ne!(bad.status.code(), Some(0));
        let err = String::from_utf8_lossy(&bad.stderr);
        assert!(err.contains("binding the ranks socket") && err.contains("nonsense"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&root);
}

// The tests of what a build lacks are named `without_the_feature_…`: `cargo xtask test` runs
// exactly those with the quick start's binary (xtask/src/builds.rs, QUICK_START_CLI;
// tests/tests/unify.rs checks the naming).
#[cfg(not(feature = "zmq"))]
#[test]
fn without_the_feature_serve_over_zmq_and_keys_say_how_to_build() {
    let root = temp_dir("without-zmq");
    let state = root.join("state");
    let zmq = ["serve", "--transport", "zmq", "--state-dir", state.to_str().unwrap(), "--zmq-ranks", "tcp://*:0"];
    let bad = stowplan(&[&zmq[..], &["--capacity", "64", "--dp", "2", "--batch-size", "3"]].concat(), None, &[]);
    assert_eq!(bad.status.code(), Some(2));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--transport zmq: this stowplan was built without the ZeroMQ transport"), "{err}");
    assert!(err.contains("cargo build --release -p stowplan-cli --features zmq"), "{err}");
    let keys = stowplan(&["keys", root.to_str().unwrap(), "packer"], None, &[]);
    assert_eq!(keys.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&keys.stderr).contains("stowplan keys: this stowplan was built without"));
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn a_reader_that_leaves_early_ends_the_command_quietly() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    // ~1.3 MB of JSON: far more than a pipe holds, so stowplan is still writing when the
    // reader (think `| head`) goes away.
    let dir = temp_dir("early-reader");
    let workload = dir.join("lengths.txt");
    std::fs::write(&workload, "1000\n".repeat(200_000)).unwrap();
    let workload = workload.to_str().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stowplan"))
        .args(["pack", "--json", workload])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs stowplan");
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    assert!(first.starts_with(b"{"), "{first:?}");
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGPIPE), "status {:?}, stderr: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pack --stream`: one JSON array per closed bin on stdout, the same bins as the library's
/// streaming packer, a summary on stderr, and oversized items by policy.
#[test]
fn pack_stream_writes_one_bin_per_line() {
    let lengths = [7u64, 3, 5, 5, 9, 1, 4, 6, 2, 8, 10, 0, 11];
    let text: String = lengths.iter().map(|l| format!("{l}\n")).collect();
    let args = ["pack", "--stream", "-c", "10", "--max-open-bins", "2", "--max-buffered", "3", "--oversize", "drop"];
    let out = stowplan(&[&args[..], &["--json"]].concat(), Some(&text), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Vec<u64>> = String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON array per line"))
        .collect();
    let options = stowplan::kernel::StreamOptions {
        capacity: 10,
        align: 1,
        max_open_bins: 2,
        max_buffered: 3,
        oversize: stowplan::kernel::OversizePolicy::Drop,
    };
    let mut packer = stowplan::Kernel::native().stream_packer(&options).unwrap();
    let mut want = Vec::new();
    for c in [packer.add(&lengths).unwrap(), packer.finish().unwrap()] {
        want.extend((0..c.bins()).map(|b| c.bin(b).to_vec()));
    }
    assert_eq!(lines, want);
    let summary = stderr(&out);
    assert!(summary.contains("stream of 13 lengths") && summary.contains("1 dropped"), "{summary}");
    // Plain text: the same bins, indices separated by spaces.
    let out = stowplan(&args, Some(&text), &[]);
    let plain: Vec<String> = String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
    let want_plain: Vec<String> =
        want.iter().map(|b| b.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(plain, want_plain);
}

/// A bin is written as soon as it closes, while the input is still open.
#[test]
fn pack_stream_writes_a_bin_before_the_input_ends() {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_stowplan"))
        .args(["pack", "--stream", "-c", "10", "--max-buffered", "0", "--json"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"4\n6\n").unwrap();
    stdin.flush().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "[0, 1]\n", "the full bin comes out while stdin is open");
    stdin.write_all(b"3\n").unwrap();
    drop(stdin);
    line.clear();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "[2]\n");
    assert!(child.wait().unwrap().success());
}

#[test]
fn pack_stream_refuses_bad_arguments_and_input() {
    let out = stowplan(&["pack", "--stream", "--max-open-bins", "0"], Some("1\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--max-open-bins") && stderr(&out).contains("1..=65536"), "{}", stderr(&out));
    let out = stowplan(&["pack", "--max-buffered", "5"], Some("1\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--stream"), "{}", stderr(&out));
    let out = stowplan(&["pack", "--stream", "--method", "ffd"], Some("1\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot be used with"), "{}", stderr(&out));
    let out = stowplan(&["pack", "--stream"], Some("[1, 2]"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("one length per line, not a JSON array"), "{}", stderr(&out));
    let out = stowplan(&["pack", "--stream", "-c", "10"], Some("3\nx\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("line 2"), "{}", stderr(&out));
    let out = stowplan(&["pack", "--stream", "-c", "10"], Some("3\n11\n"), &[]);
    assert_eq!(out.status.code(), Some(1), "an item above the capacity is infeasible");
    assert!(stderr(&out).contains("the length at stream index 1, 11"), "{}", stderr(&out));
    let out = stowplan(&["pack", "--stream"], Some("\n# nothing\n"), &[]);
    assert_eq!(out.status.code(), Some(2), "no lengths at all");
    assert!(stderr(&out).contains("no lengths"), "{}", stderr(&out));
    // A line over 4 KiB is refused whole or cut, as the pipe delivers it.
    let long = format!("{}5\n7\n", " ".repeat(5000));
    let out = stowplan(&["pack", "--stream", "-c", "10"], Some(&long), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("line 1: longer than 4096 bytes"), "{}", stderr(&out));
}

/// Dropped items are named in the summary; the lower bound does not wrap near 2^64.
#[test]
fn pack_stream_summary_names_drops_and_counts_exactly() {
    let out = stowplan(&["pack", "--stream", "-c", "10", "--oversize", "drop"], Some("5\n20\n3\n30\n"), &[]);
    assert!(out.status.success());
    assert!(stderr(&out).contains("2 dropped (stream indices 1, 3)"), "{}", stderr(&out));
    let big = "10000000000000000000\n10000000000000000000\n";
    let out = stowplan(&["pack", "--stream", "-c", "18446744073709551615"], Some(big), &[]);
    assert!(stderr(&out).contains("2 bins (lower bound 2"), "{}", stderr(&out));
}

/// Runs stowplan with standard input opened from `path` (a device, a file).
fn stowplan_stdin_from(args: &[&str], path: &str) -> Output {
    let file = std::fs::File::open(path).unwrap();
    Command::new(env!("CARGO_BIN_EXE_stowplan")).args(args).stdin(Stdio::from(file)).output().unwrap()
}

#[test]
fn devices_on_standard_input_are_read_not_taken_for_no_input() {
    // Only a terminal, /dev/null or a closed standard input fall back to the built-in
    // workload; /dev/zero and /dev/urandom are read and refused (they were taken for "no
    // input" and the built-in workload's bins printed, exit 0).
    for device in ["/dev/zero", "/dev/urandom"] {
        let out = stowplan_stdin_from(&["pack", "--json", "--max-input-mib", "1"], device);
        assert_eq!(out.status.code(), Some(2), "{device}: {}", stderr(&out));
        assert!(out.stdout.is_empty(), "{device}: no bins printed");
        assert!(!stderr(&out).contains("built-in"), "{device}: {}", stderr(&out));
    }
    // Binary input is refused at its first bad line, within the first chunk read, not after
    // the default limit's 1 GiB of it (2.1 GB of memory and 20-50 s once).
    for (args, what) in [(&["pack"][..], "standard input"), (&["pack", "/dev/urandom"][..], "/dev/urandom")] {
        let out = stowplan_stdin_from(args, "/dev/urandom");
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        let at = err.split(" at byte ").nth(1).and_then(|r| r.split(')').next()).and_then(|n| n.parse::<usize>().ok());
        assert!(err.contains(&format!("{what}: line ")) && err.contains("is not text"), "{err}");
        assert!(at.is_some_and(|n| n < 64 << 10), "refused past the first chunk: {err}");
    }
    // Text with a bad byte on line 3 names line 3; UTF-8 text and tabs pass.
    let out = stowplan(&["pack", "-c", "8"], Some("1\n2\n3\u{1}\n"), &[]);
    assert!(stderr(&out).contains("standard input: line 3 is not text (0x01 at byte 5)"), "{}", stderr(&out));
    let out = stowplan(&["pack", "-c", "8"], Some("1\t\r\n2\n"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = stowplan_stdin_from(&["pack", "--json"], "/dev/null");
    assert!(stderr(&out).contains("built-in rl-math-8k"), "{}", stderr(&out));
    assert!(out.status.success());
}

#[test]
fn plugin_files_are_read_within_a_cap_and_hashed_as_they_stream() {
    // /dev/zero as a plugin grew memory without end (OOM-killed at 24 GiB): the cap stops
    // the read one byte past it, naming the option.
    for args in [
        &["filter", "hash", "/dev/zero", "--max-plugin-mib", "1"][..],
        &["filter", "check", "/dev/zero", "--max-plugin-mib", "1"],
    ] {
        let out = stowplan(args, None, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("larger than max_plugin_bytes (1048576 bytes"), "{}", stderr(&out));
    }
    // A file within the cap hashes as sha256sum does.
    let dir = temp_dir("plugin-hash");
    let f = dir.join("p.wasm");
    std::fs::write(&f, vec![7u8; 200_000]).unwrap();
    let out = stowplan(&["filter", "hash", f.to_str().unwrap()], None, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let got = line.split_whitespace().next().unwrap().to_string();
    assert_eq!(got.len(), 64);
    let sha = Command::new("sha256sum").arg(&f).output().unwrap();
    assert_eq!(got, String::from_utf8_lossy(&sha.stdout).split_whitespace().next().unwrap());
    let out = stowplan(&["filter", "hash", f.to_str().unwrap(), "--max-plugin-mib", "0"], None, &[]);
    assert_eq!(out.status.code(), Some(2), "0 is out of range");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn pack_with_limits_reads_a_table_and_keeps_every_bin_within_every_limit() {
    let table =
        "tokens\timage_tokens\timages\n900\t800\t2\n300\t0\t0\n700\t600\t1\n500\t300\t1\n200\t0\t0\n600\t0\t0\n";
    let args =
        ["pack", "-c", "1200", "--limit", "images=2", "--limit", "image_tokens=1000", "--max-segments", "3", "--json"];
    let v = json(&stowplan(&args, Some(table), &[]));
    let rows: Vec<[u64; 3]> = table
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<u64> = l.split('\t').map(|x| x.parse().unwrap()).collect();
            [f[0], f[2], f[1]] // the order of the --limit flags: tokens, images, image_tokens
        })
        .collect();
    let bins: Vec<Vec<u64>> = serde_json::from_value(v["bins"].clone()).unwrap();
    let loads: Vec<Vec<u64>> = serde_json::from_value(v["resource_loads"].clone()).unwrap();
    // The kernel's packing, bin for bin.
    let sizes: Vec<u64> = rows.iter().flatten().copied().collect();
    let caps = [1200, 2, 1000];
    let o = stowplan::kernel::MultiOptions {
        capacities: &caps,
        names: &[],
        max_segments: 3,
        align: 1,
        method: stowplan::kernel::MultiMethod::Balanced,
        oversize: stowplan::kernel::OversizePolicy::Error,
    };
    // Balanced fill is the default with limits.
    assert_eq!(v["method"], "balanced");
    let want = stowplan::Kernel::native().pack_multi(&sizes, &o).unwrap();
    assert_eq!(
        bins,
        stowplan::kernel::unflatten(&want.packing.offsets, &want.packing.indices)
            .iter()
            .map(|b| b.iter().map(|&i| i as u64).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
    for (b, members) in bins.iter().enumerate() {
        assert!(members.len() <= 3, "segments");
        for q in 0..3 {
            let load: u64 = members.iter().map(|&i| rows[i as usize][q]).sum();
            assert_eq!(load, loads[b][q]);
            assert!(load <= caps[q], "bin {b} resource {q}");
        }
    }
    let names: Vec<&str> = v["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["tokens", "images", "image_tokens"]);
    assert_eq!(v["segments_lower_bound"], 2);
    // The human summary names every limit.
    let out = stowplan(&args[..args.len() - 1], Some(table), &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("image_tokens") && text.contains("segments"), "{text}");
}

#[test]
fn pack_with_limits_refuses_bad_limits_by_name() {
    let table = "tokens\timages\n5\t1\n7\t40\n";
    let cases: [(&[&str], i32, &str); 5] = [
        (&["--limit", "frames=3"], 2, "no column \"frames\"; its header names tokens, images"),
        (&["--limit", "images=0"], 2, "CAP of at least 1"),
        (&["--limit", "images"], 2, "expected NAME=CAP"),
        (&["--limit", "images=3", "--limit", "images=4"], 2, "\"images\" is given twice"),
        (
            &["--limit", "images=32"],
            1,
            "item 1 needs 40 images (capacity 32); use oversize single or drop to accept such items",
        ),
    ];
    for (extra, code, message) in cases {
        let out = stowplan(&[&["pack"], extra].concat(), Some(table), &[]);
        assert_eq!(out.status.code(), Some(code), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{extra:?}: {}", stderr(&out));
    }
    // --max-segments alone: the input is lengths, not a table (no header eats a length).
    let v = json(&stowplan(&["pack", "-c", "100", "--max-segments", "2", "--json"], Some("5\n6\n7\n"), &[]));
    assert_eq!(v["n"], 3);
    assert_eq!(v["bins"], serde_json::json!([[1, 2], [0]]));
    assert_eq!(v["resources"][0]["name"], "tokens");
    // --method is for whole inputs; a stream has its own rule.
    let out = stowplan(&["pack", "--limit", "images=32", "--stream", "--method", "bfd"], Some(table), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot be used with"), "{}", stderr(&out));
}

#[test]
fn plan_with_limits_records_them_in_the_plan_file() {
    let table = "tokens\timage_tokens\timages\n900\t800\t2\n300\t0\t0\n700\t600\t1\n500\t300\t1\n200\t0\t0\n\
                 600\t0\t0\n1300\t0\t0\n400\t50\t3\n";
    let dir = temp_dir("plan-limits");
    let out_path = dir.join("plan.json");
    let args = [
        "plan",
        "--lengths",
        "-",
        "--capacity",
        "1200",
        "--limit",
        "image_tokens=1000",
        "--limit",
        "images=2",
        "--max-segments",
        "3",
        "--allow-single-long",
        "--out",
        out_path.to_str().unwrap(),
        "--json",
    ];
    let v = json(&stowplan(&args, Some(table), &[]));
    assert_eq!(v["method"], "balanced");
    let names: Vec<&str> =
        v["limits"]["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["tokens", "image_tokens", "images"]);
    // The file is the library's plan, limits included, and loads verified.
    let saved = stowplan::StaticPackPlan::load(&out_path).unwrap();
    let tokens = [900, 300, 700, 500, 200, 600, 1300, 400];
    let extra = [800, 2, 0, 0, 600, 1, 300, 1, 0, 0, 0, 0, 0, 0, 50, 3];
    let names = ["image_tokens".to_string(), "images".to_string()];
    let limits = stowplan::kernel::PlanLimits {
        limits: stowplan::kernel::MicroLimits { sizes: &extra, caps: &[1000, 2], names: &names },
        max_segments: 3,
        method: stowplan::kernel::MultiMethod::Balanced,
    };
    let o = stowplan::kernel::PlanOptions { allow_single_long: true, ..stowplan::kernel::PlanOptions::new(1200) };
    let want =
        stowplan::StaticPackPlan::build_limited(&stowplan::Kernel::native(), &tokens, &o, &limits, 1, false).unwrap();
    assert_eq!(saved, want);
    assert_eq!(v["raw_checksum"], want.raw_checksum());
    // Samples 6 (1,300 tokens) and 7 (3 images) are long: alone in their packs.
    assert_eq!(saved.raw.single_long, [6, 7]);
    for p in 0..saved.raw_len() {
        let m = saved.raw.pack(p);
        if m.len() > 1 {
            assert!(m.len() <= 3);
            assert!(m.iter().map(|&i| extra[2 * i as usize]).sum::<u64>() <= 1000);
            assert!(m.iter().map(|&i| extra[2 * i as usize + 1]).sum::<u64>() <= 2);
        }
    }
    // Refused by name: --method without limits, a limit beside --column or --cache-dir.
    // A plan with a segment limit alone writes and loads back (format 3, no limit's loads).
    let seg_path = dir.join("segments.json");
    let out = stowplan(
        &["plan", "--capacity", "1000", "--max-segments", "3", "--out", seg_path.to_str().unwrap()],
        None,
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let seg = stowplan::StaticPackPlan::load(&seg_path).unwrap();
    assert!((0..seg.raw_len()).all(|p| seg.raw.pack(p).len() <= 3));
    // The summary says why samples were dropped.
    let out = stowplan(&["plan", "--capacity", "1200", "--lengths", "-", "--limit", "images=2"], Some(table), &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("or over a limit"), "{text}");
    let cases: [(&[&str], &str); 3] = [
        (&["--method", "bfd"], "--method applies with --limit or --max-segments"),
        (&["--limit", "images=2", "--column", "1"], "cannot be used with"),
        (&["--max-segments", "2", "--cache-dir", "/tmp"], "cannot be used with"),
    ];
    for (extra, message) in cases {
        let out = stowplan(&[&["plan", "--capacity", "1200", "--lengths", "-"], extra].concat(), Some(table), &[]);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{extra:?}: {}", stderr(&out));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn stream_with_limits_reads_a_table_and_gives_the_library_bins() {
    let mut table = String::from("# a comment\ntokens\timage_tokens\timages\n");
    let mut rows = Vec::new();
    for i in 0..3_000u64 {
        let row = [(i * 7919) % 3_000 + 1, (i * 104_729) % 900, (i * 31) % 4];
        table.push_str(&format!("{}\t{}\t{}\n", row[0], row[1], row[2]));
        rows.extend_from_slice(&row);
    }
    let args = [
        "pack",
        "--stream",
        "-c",
        "4096",
        "--limit",
        "image_tokens=1500",
        "--limit",
        "images=5",
        "--max-segments",
        "6",
        "--max-open-bins",
        "8",
        "--max-buffered",
        "64",
        "--json",
    ];
    let out = stowplan(&args, Some(&table), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let bins: Vec<Vec<u64>> =
        String::from_utf8(out.stdout.clone()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    // The library's packer on the same rows, in one call.
    let options = stowplan::kernel::StreamOptions {
        max_open_bins: 8,
        max_buffered: 64,
        ..stowplan::kernel::StreamOptions::new(4096)
    };
    let limits = stowplan::kernel::StreamLimits {
        caps: vec![1500, 5],
        names: vec!["image_tokens".into(), "images".into()],
        max_segments: 6,
    };
    let mut p = stowplan::Kernel::native().limited_stream_packer(&options, &limits).unwrap();
    let mut want = Vec::new();
    for c in [p.add(&rows).unwrap(), p.finish().unwrap()] {
        want.extend((0..c.closed.bins()).map(|b| c.closed.bin(b).to_vec()));
    }
    assert_eq!(bins, want);
    let mut seen: Vec<u64> = bins.iter().flatten().copied().collect();
    seen.sort_unstable();
    assert_eq!(seen, (0..3_000).collect::<Vec<_>>());
    for b in &bins {
        assert!(b.len() <= 6);
        for q in 0..3 {
            let load: u64 = b.iter().map(|&i| rows[3 * i as usize + q]).sum();
            assert!(load <= [4096, 1500, 5][q], "{b:?}");
        }
    }
    assert!(stderr(&out).contains("and at most 1500 image_tokens, 5 images, 6 segments"), "{}", stderr(&out));
    // Errors name the column and the line.
    let out = stowplan(&["pack", "--stream", "--limit", "frames=3"], Some(&table), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no column \"frames\""), "{}", stderr(&out));
    let out = stowplan(&["pack", "--stream", "--limit", "images=3"], Some("tokens\timages\n5\t1\n6\tx\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("line 3, column \"images\""), "{}", stderr(&out));
    let out = stowplan(&["pack", "--stream", "--limit", "images=3"], Some("tokens\timages\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("the table has a header and no rows"), "{}", stderr(&out));
    let long = format!("tokens\timages\n{}\n", "1".repeat(70_000));
    let out = stowplan(&["pack", "--stream", "--limit", "images=3"], Some(&long), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("table, line 2: longer than 65536 bytes"), "{}", stderr(&out));
    let out = stowplan(&["pack", "--stream", "--limit", "images=3"], Some("tokens\timages\n5\t1\n6\t4\n"), &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("stream index 1 has 4 images, more than its cap 3"), "{}", stderr(&out));
}

#[test]
fn balance_with_limits_gives_the_library_plan_within_every_limit() {
    // 24 samples: tokens, image tokens, images; the images column also weighs the cost.
    let rows: Vec<[u64; 3]> = (0..24u64).map(|i| [100 + (i * 37) % 400, (i * 53) % 300, i % 4]).collect();
    let table: String = std::iter::once("tokens\timage_tokens\timages".to_string())
        .chain(rows.iter().map(|r| format!("{}\t{}\t{}", r[0], r[1], r[2])))
        .collect::<Vec<_>>()
        .join("\n");
    let args = [
        "balance",
        "--dp",
        "2",
        "--capacity",
        "1000",
        "--limit",
        "image_tokens=500",
        "--limit",
        "images=5",
        "--extra-cost",
        "image_tokens",
        "--cost",
        "attention",
        "--json",
    ];
    let v = json(&stowplan(&args, Some(&table), &[]));
    let lengths: Vec<u64> = rows.iter().map(|r| r[0]).collect();
    let sizes: Vec<u64> = rows.iter().flat_map(|r| [r[1], r[2]]).collect();
    let extra: Vec<u64> = rows.iter().map(|r| r[1]).collect();
    let names = ["image_tokens".to_string(), "images".to_string()];
    let limits = stowplan::kernel::MicroLimits { sizes: &sizes, caps: &[500, 5], names: &names };
    let dp = stowplan::kernel::DpOptions {
        cost: stowplan::kernel::Cost::ATTENTION,
        extra_costs: Some(&extra),
        ..stowplan::kernel::DpOptions::default()
    };
    let micro = stowplan::kernel::MicroOptions {
        cost: stowplan::kernel::Cost::ATTENTION,
        ..stowplan::kernel::MicroOptions::new(1000)
    };
    let want = stowplan::Kernel::native().plan(&lengths, 2, &dp, &micro, Some(&limits)).unwrap();
    assert_eq!(v["extra_cost"], "image_tokens");
    for (r, rank) in want.ranks.iter().enumerate() {
        let got = &v["micro_batches"][r];
        let batches: Vec<Vec<u32>> = serde_json::from_value(got["batches"].clone()).unwrap();
        assert_eq!(batches, stowplan::kernel::unflatten(&rank.offsets, &rank.indices), "rank {r}");
        let loads: Vec<[u64; 2]> = serde_json::from_value(got["resource_loads"].clone()).unwrap();
        for (b, members) in batches.iter().enumerate() {
            let load = |q: usize| members.iter().map(|&i| rows[i as usize][q]).sum::<u64>();
            assert!(load(0) <= 1000 && load(1) <= 500 && load(2) <= 5, "rank {r} micro-batch {b}");
            assert_eq!(loads[b], [load(1), load(2)]);
        }
    }
    let names: Vec<&str> =
        v["limits"]["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["tokens", "image_tokens", "images"]);
    // One rank: the library's micro-batches under the limits; the summary names every limit.
    let one = ["balance", "--capacity", "1000", "--limit", "images=5"];
    let v = json(&stowplan(&[&one[..], &["--json"]].concat(), Some(&table), &[]));
    let sizes: Vec<u64> = rows.iter().map(|r| r[2]).collect();
    let names = ["images".to_string()];
    let limits = stowplan::kernel::MicroLimits { sizes: &sizes, caps: &[5], names: &names };
    let want = stowplan::Kernel::native()
        .micro_batches(&lengths, None, Some(&limits), &stowplan::kernel::MicroOptions::new(1000))
        .unwrap();
    let batches: Vec<Vec<u32>> = serde_json::from_value(v["micro_batches"]["batches"].clone()).unwrap();
    assert_eq!(batches, stowplan::kernel::unflatten(&want.plan.offsets, &want.plan.indices));
    let text = String::from_utf8(stowplan(&one, Some(&table), &[]).stdout).unwrap();
    assert!(text.contains("images") && text.contains("per micro-batch at most"), "{text}");
    // Refusals name the argument.
    let cases: [(&[&str], i32, &str); 6] = [
        (&["balance", "--dp", "2", "--limit", "images=5"], 2, "--capacity"),
        (&["balance", "--capacity", "1000", "--limit", "tokens=5"], 2, "not a further limit"),
        (&["balance", "--capacity", "1000", "--limit", "images=5", "--limit", "images=6"], 2, "is given twice"),
        (&["balance", "--capacity", "1000", "--limit", "frames=5"], 2, "no column \"frames\""),
        (&["balance", "--capacity", "1000", "--extra-cost", "frames"], 2, "no column \"frames\""),
        (&["balance", "--capacity", "1000", "--limit", "images=2"], 1, "has 3 images, more than its cap 2"),
    ];
    for (args, code, message) in cases {
        let out = stowplan(args, Some(&table), &[]);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(message), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn the_caps_former_flags_work_for_one_release_warn_and_name_capacity() {
    // Timings differ between runs: compare the plans and the cap they report.
    let plan_of = |v: serde_json::Value| {
        let keys = ["capacity", "dp", "micro_batches", "count", "raw_checksum", "aligned_checksum", "n_raw_packs"];
        keys.map(|k| v.get(k).cloned())
    };
    let cases: [(&[&str], &str); 2] = [
        (&["balance", "--dp", "2", "--json", "-"], "--max-token-len"),
        (&["plan", "--lengths", "-", "--json"], "--packing-length"),
    ];
    for (args, former) in cases {
        let new = stowplan(&[args, &["--capacity", "12"]].concat(), Some("5\n3\n7\n9\n"), &[]);
        let old = stowplan(&[args, &[former, "12"]].concat(), Some("5\n3\n7\n9\n"), &[]);
        assert_eq!(plan_of(json(&old)), plan_of(json(&new)), "{former}");
        assert!(!stderr(&new).contains("deprecated"), "{}", stderr(&new));
        let warned = format!("{former} is deprecated and will be removed in the next release; use --capacity");
        assert!(stderr(&old).contains(&warned), "{former}: {}", stderr(&old));
        let both = stowplan(&[args, &["--capacity", "12", former, "12"]].concat(), Some("5\n3\n7\n9\n"), &[]);
        assert_eq!(both.status.code(), Some(2), "{former}: {}", stderr(&both));
        assert!(stderr(&both).contains("cannot be used with"), "{former}: {}", stderr(&both));
    }
    // Without either, the command says which flag it needs, never the former name.
    let out = stowplan(&["plan", "--lengths", "-"], Some("5\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--capacity"), "{}", stderr(&out));
    let out = stowplan(&["balance", "--limit", "images=3", "-"], Some("5\t1\n"), &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--limit needs --capacity T"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("max-token-len"), "{}", stderr(&out));
}
