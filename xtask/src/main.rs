//! `cargo xtask <command>`: build orchestration.
//!
//! - `build-kernel`: builds `kernel/wasm` for `wasm32-wasip2` (profile `kernel-wasm`, paths
//!   remapped so the bytes do not depend on where the checkout or the cargo registry is) and
//!   writes `host/assets/stowplan_kernel.wasm` and its `.sha256`.
//! - `check-kernel`: builds the same way into `target/` and fails if the bytes differ from
//!   the committed component. Exits 3 (with a message) when no installed toolchain is the
//!   pinned Rust (`kernel/wasm/rust-toolchain.toml`, see [`toolchain`]) or it lacks the
//!   `wasm32-wasip2` target, so callers can tell "cannot check here" from "differs".
//! - `build-plugins`: builds the example buffer-filter plugins (`plugins/`, a workspace of
//!   its own) for `wasm32-wasip2` the same reproducible way and writes them to `plugins/dist/`
//!   with `plugins/dist/SHA256SUMS`.
//! - `check-plugins`: rebuilds them and fails if the bytes differ from the committed ones
//!   (exit 3 when the pinned toolchain or its target is not installed).
//! - Both artifacts are built by the pinned Rust, whatever the toolchain running xtask.
//! - `stubs`: writes the Python stubs of the kernel's result records from the WIT
//!   ([`stubs`]); `check-stubs` fails when the committed ones are stale. They build xtask
//!   with its `stubs` feature (the WIT parser), which no other command needs.
//! - `test`: every test of the project ([`test_command`]): one `cargo test --release` of the
//!   workspace ([`builds::TESTS`]: conformance vectors on native and WASM, the host library's
//!   tests and doc tests, the ZeroMQ transport's, the CLI's with its `zmq` and `arrow`
//!   features), the kernel's tests in a debug build (overflow checks on), the CLI's tests
//!   again without its features ([`builds::QUICK_START_CLI`]), the Python SDK's tests when
//!   `sdk-python/` holds a package (see `sdk-python/README.md`) and the JavaScript SDK's
//!   (`sdk-js/run_tests.sh`) when node and npm are installed (required with
//!   `STOWPLAN_REQUIRE_NODE=1`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use sha2::{Digest, Sha256};

mod builds;
#[cfg(feature = "stubs")]
mod stubs;
mod test_command;
mod toolchain;

use toolchain::Toolchain;

const TARGET: &str = "wasm32-wasip2";
const PROFILE: &str = "kernel-wasm";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// Where the workspace's cargo runs put their artifacts: `CARGO_TARGET_DIR` (relative to the
/// root when relative), else `target/` in the root.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), |d| root().join(d))
}

/// Where the WebAssembly builds (the kernel, the plugins) put theirs: always `target/` in the
/// root, whatever `CARGO_TARGET_DIR` says, so that the remapped paths cover it and the bytes do
/// not depend on it.
fn wasm_target_dir() -> PathBuf {
    root().join("target")
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// The pinned toolchain ([`toolchain`]) with the `wasm32-wasip2` target, or the reason the
/// WASM artifacts (`what`: where the committed ones are) cannot be rebuilt here.
fn wasm_toolchain(what: &str) -> Result<Toolchain, String> {
    let toolchain = toolchain::resolve(&root()).map_err(|e| format!("{e}; {what} is used as is"))?;
    if !toolchain.has_target(TARGET) {
        let name = toolchain.name.as_deref().unwrap_or("the PATH's");
        return Err(format!(
            "the {TARGET} target is not installed for toolchain {name} (rustup target add --toolchain {name} \
             {TARGET}); {what} is used as is"
        ));
    }
    eprintln!("xtask: building with {} (pinned in {})", toolchain.version, toolchain::PIN_FILE);
    Ok(toolchain)
}

/// The components the plugins workspace builds (one per member crate but `guest`).
const PLUGINS: [&str; 3] = ["pop_first.wasm", "top_reward.wasm", "hostile.wasm"];

/// Builds the kernel component; returns its bytes.
fn build(toolchain: &Toolchain) -> Result<Vec<u8>, String> {
    let target_dir = wasm_target_dir();
    let dir = target_dir.to_string_lossy();
    cargo_wasm(toolchain, &["-p", "stowplan-kernel-wasm", "--target-dir", &dir, "--profile", PROFILE])?;
    let out = target_dir.join(TARGET).join(PROFILE).join("stowplan_kernel_wasm.wasm");
    std::fs::read(&out).map_err(|e| format!("reading {}: {e}", out.display()))
}

/// Builds the example plugins; returns (file name, bytes) of each.
fn build_plugins(toolchain: &Toolchain) -> Result<Vec<(&'static str, Vec<u8>)>, String> {
    let root = root();
    let manifest = root.join("plugins/Cargo.toml");
    let manifest = manifest.to_string_lossy().into_owned();
    let target_dir = wasm_target_dir();
    let dir = target_dir.to_string_lossy();
    cargo_wasm(toolchain, &["--manifest-path", &manifest, "--target-dir", &dir, "--release", "--workspace"])?;
    PLUGINS
        .iter()
        .map(|&file| {
            let out = target_dir.join(TARGET).join("release").join(file);
            std::fs::read(&out).map(|b| (file, b)).map_err(|e| format!("reading {}: {e}", out.display()))
        })
        .collect()
}

/// `cargo build --locked --target wasm32-wasip2 ARGS` of the pinned toolchain, with paths
/// remapped, so the bytes do not depend on where the checkout or the cargo registry is.
fn cargo_wasm(toolchain: &Toolchain, args: &[&str]) -> Result<(), String> {
    let root = root();
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let flags = format!(
        "-C target-feature=+simd128 --remap-path-prefix={}=/stowplan --remap-path-prefix={}=/cargo",
        root.display(),
        cargo_home.display()
    );
    let status = toolchain
        .command("cargo")
        .current_dir(&root)
        .args(["build", "--locked", "--target", TARGET])
        .args(args)
        .env("CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS", flags)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build for {TARGET} failed ({status})"));
    }
    Ok(())
}

/// `build-plugins` (write) or `check-plugins` (compare with the committed bytes).
fn plugins(toolchain: &Toolchain, write: bool) -> ExitCode {
    let dist = root().join("plugins/dist");
    let built = match build_plugins(toolchain) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::from(2);
        }
    };
    let sums: String = built.iter().map(|(file, bytes)| format!("{}  {file}\n", hex(bytes))).collect();
    if write {
        let written = std::fs::create_dir_all(&dist).and_then(|()| {
            for (file, bytes) in &built {
                std::fs::write(dist.join(file), bytes)?;
            }
            std::fs::write(dist.join("SHA256SUMS"), &sums)
        });
        if let Err(e) = written {
            eprintln!("xtask: writing {}: {e}", dist.display());
            return ExitCode::from(2);
        }
        print!("xtask: wrote {}:\n{sums}", dist.display());
        return ExitCode::SUCCESS;
    }
    let mut differ = Vec::new();
    for (file, bytes) in &built {
        if std::fs::read(dist.join(file)).ok().as_ref() != Some(bytes) {
            differ.push(*file);
        }
    }
    if std::fs::read_to_string(dist.join("SHA256SUMS")).unwrap_or_default() != sums {
        differ.push("SHA256SUMS");
    }
    if differ.is_empty() {
        print!("xtask: plugins are reproducible:\n{sums}");
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "xtask: rebuilt plugins differ from plugins/dist ({}); rebuilt:\n{sums}Run `cargo xtask build-plugins` and \
             commit plugins/dist.",
            differ.join(", ")
        );
        ExitCode::from(1)
    }
}

fn main() -> ExitCode {
    let cmd = std::env::args().nth(1).unwrap_or_default();
    let assets = root().join("host/assets");
    let wasm_path = assets.join("stowplan_kernel.wasm");
    let sha_path = assets.join("stowplan_kernel.wasm.sha256");
    match cmd.as_str() {
        "test" => test_command::run_tests(),
        "stubs" | "check-stubs" => stubs(cmd == "check-stubs"),
        "build-plugins" | "check-plugins" => match wasm_toolchain("plugins/dist") {
            Ok(toolchain) => plugins(&toolchain, cmd == "build-plugins"),
            Err(e) => {
                eprintln!("xtask: {e}");
                ExitCode::from(3)
            }
        },
        "build-kernel" | "check-kernel" => {
            let toolchain = match wasm_toolchain(&format!("the committed {}", wasm_path.display())) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("xtask: {e}");
                    return ExitCode::from(3);
                }
            };
            let bytes = match build(&toolchain) {
                Ok(b) => b,
                Err(e) => {
                    eprintln!("xtask: {e}");
                    return ExitCode::from(2);
                }
            };
            let sum = hex(&bytes);
            if cmd == "build-kernel" {
                if let Err(e) =
                    std::fs::write(&wasm_path, &bytes).and_then(|()| std::fs::write(&sha_path, format!("{sum}\n")))
                {
                    eprintln!("xtask: writing {}: {e}", wasm_path.display());
                    return ExitCode::from(2);
                }
                println!("xtask: wrote {} ({} bytes, sha256 {sum})", wasm_path.display(), bytes.len());
                ExitCode::SUCCESS
            } else {
                let committed = std::fs::read(&wasm_path).unwrap_or_default();
                let recorded = std::fs::read_to_string(&sha_path).unwrap_or_default();
                if committed == bytes && recorded.trim() == sum {
                    println!("xtask: kernel component is reproducible (sha256 {sum}, {} bytes)", bytes.len());
                    ExitCode::SUCCESS
                } else {
                    eprintln!(
                        "xtask: the rebuilt kernel component differs from the committed one: rebuilt sha256 {sum} \
                         ({} bytes), committed sha256 {} ({} bytes), recorded {}. Run `cargo xtask build-kernel` \
                         and commit host/assets.",
                        bytes.len(),
                        hex(&committed),
                        committed.len(),
                        recorded.trim()
                    );
                    ExitCode::from(1)
                }
            }
        }
        _ => {
            eprintln!(
                "usage: cargo xtask test | build-kernel | check-kernel | build-plugins | check-plugins | stubs | \
                 check-stubs"
            );
            ExitCode::from(2)
        }
    }
}

/// Writes the Python stubs generated from the WIT ([`stubs::OUT`], [`stubs::OPTIONS_OUT`]), or
/// with `check` fails (1) when a committed file differs.
#[cfg(feature = "stubs")]
fn stubs(check: bool) -> ExitCode {
    let root = root();
    let files = match stubs::generate(&root.join("wit")) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::from(2);
        }
    };
    let mut stale = false;
    for (out, text) in files {
        let path = root.join(out);
        if check {
            if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
                println!("xtask: {out} is what the WIT gives");
            } else {
                eprintln!("xtask: {out} is not what the WIT gives: run `cargo xtask stubs` and commit it");
                stale = true;
            }
            continue;
        }
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("xtask: writing {}: {e}", path.display());
            return ExitCode::from(2);
        }
        println!("xtask: wrote {out}");
    }
    if stale { ExitCode::from(1) } else { ExitCode::SUCCESS }
}

/// Without the `stubs` feature: runs xtask again with it (only these commands need the WIT
/// parser, so the others do not build it).
#[cfg(not(feature = "stubs"))]
fn stubs(check: bool) -> ExitCode {
    let cmd = if check { "check-stubs" } else { "stubs" };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let args = ["run", "--quiet", "--release", "-p", "xtask", "--features", "stubs", "--", cmd];
    eprintln!("xtask: $ {cargo} {}", args.join(" "));
    // Its own exit code: 1 a stale file, 2 the WIT or the file could not be read or written.
    match Command::new(&cargo).current_dir(root()).args(args).status() {
        Ok(status) => ExitCode::from(status.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(2)),
        Err(e) => {
            eprintln!("xtask: running {cargo}: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs a command in the workspace root, echoing it; `Err` with a message if it fails.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    run_with(program, args, &[])
}

/// [`run`] with environment variables `env` set for the command.
fn run_with(program: &str, args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let shown: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
    eprintln!("xtask: $ {shown}{program} {}", args.join(" "));
    let status = Command::new(program)
        .current_dir(root())
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("running {program}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("`{program} {}` failed ({status})", args.join(" "))) }
}
