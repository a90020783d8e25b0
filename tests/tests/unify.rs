//! One wasmtime build serves every command: `cargo run` of the CLI, `cargo test` of the
//! workspace and the Python wheel must resolve the same features for every crate wasmtime
//! depends on (a difference compiles wasmtime again, minutes on 2 cores). `xtask/unify`
//! turns on the union; this test fails when a new dependency breaks the agreement, naming
//! the crate and both feature sets.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

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

#[test]
fn cli_tests_and_wheel_build_wasmtime_with_the_same_features() {
    let wasmtime_deps: BTreeSet<String> =
        features(&["-p", "wasmtime", "-e", "normal,build"]).into_keys().map(|(name, _)| name).collect();
    let builds = [
        ("cargo run -p stowplan-cli", features(&["-p", "stowplan-cli", "-e", "normal,build"])),
        ("cargo test", features(&["--workspace", "-e", "normal,build,dev"])),
        ("the Python wheel", features(&["-p", "stowplan-python", "-e", "normal,build"])),
    ];
    let mut differ = Vec::new();
    for (i, (a, fa)) in builds.iter().enumerate() {
        for (b, fb) in &builds[i + 1..] {
            for (key, sa) in fa {
                if let Some(sb) = fb.get(key) {
                    if sa != sb && wasmtime_deps.contains(&key.0) {
                        differ.push(format!("{} {}: {a} {sa:?} vs {b} {sb:?}", key.0, key.1));
                    }
                }
            }
        }
    }
    assert!(differ.is_empty(), "features differ (add the union to xtask/unify/Cargo.toml):\n{}", differ.join("\n"));
    assert!(wasmtime_deps.len() > 20, "cargo tree found wasmtime's dependencies");
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
    assert!(cli.keys().any(|(n, _)| n == "zmq-sys"), "the CLI has the ZeroMQ transport");
}
