//! One build of each crate serves every command: `cargo run` of the CLI, the cargo runs of
//! `cargo xtask test` and the Python wheel must resolve the same features for every crate
//! wasmtime depends on (a difference compiles wasmtime again, minutes on 2 cores), and for
//! the host library's and the CLI's. `xtask/unify` turns on the union; this test fails when a
//! new dependency breaks the agreement, naming the crate and both feature sets.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

// The test targets xtask picks do not change feature resolution: only the selections are used.
#[allow(dead_code)]
#[path = "../../xtask/src/builds.rs"]
mod builds;

/// `cargo tree` with `args`: crate name and version → the feature sets it is built with.
fn features(args: &[&str]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let out = Command::new(cargo)
        .current_dir(root)
        .args(["tree", "--locked", "--prefix", "none", "--format", "{p} [{f}]"])
        .args(args)
        .output()
        .expect("runs cargo tree");
    assert!(out.status.success(), "cargo tree {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let mut map: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let line = line.replace(" (*)", "");
        let mut words = line.split_whitespace();
        let (Some(name), Some(version)) = (words.next(), words.next()) else { continue };
        let feats = line.find('[').map(|i| line[i..].to_string()).unwrap_or_default();
        map.entry((name.to_string(), version.to_string())).or_default().insert(feats);
    }
    map
}

/// The crates `args` (a `cargo tree` selection) depends on, by name.
fn crates(args: &[&str]) -> BTreeSet<String> {
    features(args).into_keys().map(|(name, _)| name).collect()
}

/// Every crate of `shared` that two of `builds` compile with different features.
fn differences(
    builds: &[(&str, &BTreeMap<(String, String), BTreeSet<String>>)],
    shared: &BTreeSet<String>,
) -> Vec<String> {
    let mut differ = Vec::new();
    for (i, (a, fa)) in builds.iter().enumerate() {
        for (b, fb) in &builds[i + 1..] {
            for (key, sa) in fa.iter() {
                if let Some(sb) = fb.get(key) {
                    if sa != sb && shared.contains(&key.0) {
                        differ.push(format!("{} {}: {a} {sa:?} vs {b} {sb:?}", key.0, key.1));
                    }
                }
            }
        }
    }
    differ
}

/// The builds of the README's two commands (`cargo run` of the CLI, then the two cargo runs
/// of `cargo xtask test`) and the Python wheel: wasmtime and the host library are compiled
/// once for all of them (the tests and the wheel use the library the quick start built), the
/// CLI's dependencies once for the quick start and the tests, and the quick start's CLI is
/// the one its featureless tests run.
#[test]
fn the_quick_start_and_the_tests_compile_each_crate_once() {
    let cli = features(&["-p", "stowplan-cli", "-e", "normal,build"]);
    let tests = features(&[&builds::TESTS[..], &["-e", "normal,build,dev"]].concat());
    let wheel = features(&["-p", "stowplan-python", "-e", "normal,build"]);
    let quick_cli = features(&[&builds::QUICK_START_CLI[..2], &["-e", "normal,build,dev"]].concat());
    let wasmtime = crates(&["-p", "wasmtime", "-e", "normal,build"]);
    let host = crates(&["-p", "stowplan", "-e", "normal,build"]);
    // The CLI itself differs (the tests turn on its `zmq` and `arrow` features); what it
    // depends on must not.
    let mut cli_deps = crates(&["-p", "stowplan-cli", "-e", "normal,build"]);
    cli_deps.remove("stowplan-cli");
    let all = [
        ("cargo run -p stowplan-cli", &cli),
        ("cargo xtask test", &tests),
        ("the Python wheel", &wheel),
        ("cargo xtask test, the CLI without its features", &quick_cli),
    ];
    let mut differ = differences(&all, &wasmtime);
    differ.extend(differences(&all, &host));
    differ.extend(differences(&all[..2], &cli_deps));
    // The quick start's CLI itself, too: its tests without features reuse its binary.
    differ.extend(differences(&[all[0], all[3]], &crates(&["-p", "stowplan-cli", "-e", "normal,build"])));
    differ.sort();
    differ.dedup();
    assert!(differ.is_empty(), "features differ (add the union to xtask/unify/Cargo.toml):\n{}", differ.join("\n"));
    assert!(wasmtime.len() > 20 && host.len() > wasmtime.len(), "cargo tree found the dependencies");
    assert!(host.contains("stowplan"), "the host library is among the crates compared");
}

#[test]
fn the_library_and_the_wheel_leave_out_what_only_the_cli_uses() {
    let host = features(&["-p", "stowplan", "-e", "normal"]);
    for name in ["clap", "indicatif", "tracing-subscriber", "signal-hook", "zmq", "zmq-sys"] {
        assert!(!host.keys().any(|(n, _)| n == name), "the host library depends on {name}");
    }
    let wheel = features(&["-p", "stowplan-python", "-e", "normal"]);
    assert!(!wheel.keys().any(|(n, _)| n == "zmq-sys"), "the Python SDK compiles libzmq (it uses pyzmq)");
    let cli = features(&["-p", "stowplan-cli", "-e", "normal"]);
    assert!(!cli.keys().any(|(n, _)| n == "zmq-sys"), "the quick start's CLI compiles libzmq");
    let cli = features(&["-p", "stowplan-cli", "--features", "zmq", "-e", "normal"]);
    assert!(cli.keys().any(|(n, _)| n == "zmq-sys"), "the CLI's zmq feature has the ZeroMQ transport");
    let tests = features(&[&builds::TESTS[..], &["-e", "normal"]].concat());
    assert!(tests.keys().any(|(n, _)| n == "stowplan-zmq"), "the tests build the ZeroMQ transport");
}

/// The CLI's tests of a build without a feature (`#[cfg(not(feature = …))]`) are the ones
/// `cargo xtask test` runs with the quick start's binary, by their name's prefix: a test so
/// gated under another name would run nowhere.
#[test]
fn every_test_of_a_build_without_a_feature_is_run_with_the_quick_start_binary() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../cli/tests");
    let mut found = 0;
    for entry in std::fs::read_dir(dir).expect("reads cli/tests") {
        let path = entry.expect("a directory entry").path();
        let text = std::fs::read_to_string(&path).expect("reads a test file");
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line.trim_start().starts_with("#[cfg(not(feature") {
                continue;
            }
            // The item the attribute gates: a test function, after its other attributes.
            let item = lines[i + 1..].iter().map(|l| l.trim()).find(|l| !l.starts_with("#[")).unwrap_or("");
            if let Some(name) = item.strip_prefix("fn ").and_then(|f| f.split('(').next()) {
                if lines[i + 1..].iter().take_while(|l| l.trim().starts_with("#[")).any(|l| l.trim() == "#[test]") {
                    found += 1;
                    assert!(
                        name.starts_with(builds::WITHOUT_FEATURE),
                        "{}: `{name}` is a test of a build without a feature: name it {}…, or xtask never runs it",
                        path.display(),
                        builds::WITHOUT_FEATURE
                    );
                }
            }
        }
    }
    assert!(found >= 3, "found the CLI's tests of builds without a feature ({found})");
}
