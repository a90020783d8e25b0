//! `cargo xtask <command>`: build orchestration.
//!
//! - `build-kernel`: builds `kernel/wasm` for `wasm32-wasip2` (profile `kernel-wasm`, paths
//!   remapped so the bytes do not depend on where the checkout or the cargo registry is) and
//!   writes `host/assets/stowplan_kernel.wasm` and its `.sha256`.
//! - `check-kernel`: builds the same way into `target/` and fails if the bytes differ from
//!   the committed component. Exits 3 (with a message) when the `wasm32-wasip2` target is
//!   not installed, so callers can tell "cannot check here" from "differs".
//! - `test`: every test of the project — `cargo test --release` of the workspace (kernel
//!   proptests, conformance vectors on native and WASM, host and CLI tests), then the
//!   Python SDK's tests when `sdk-python/` holds a package (see `sdk-python/README.md`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use sha2::{Digest, Sha256};

const TARGET: &str = "wasm32-wasip2";
const PROFILE: &str = "kernel-wasm";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

fn hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn target_installed() -> bool {
    let out = Command::new("rustc").args(["--print", "sysroot"]).output();
    let Ok(out) = out else { return false };
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Path::new(&sysroot).join("lib/rustlib").join(TARGET).join("lib").is_dir()
}

/// Builds the component; returns its bytes.
fn build() -> Result<Vec<u8>, String> {
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
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--locked", "-p", "stowplan-kernel-wasm", "--target", TARGET, "--profile", PROFILE])
        .env("CARGO_TARGET_WASM32_WASIP2_RUSTFLAGS", flags)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build for {TARGET} failed ({status})"));
    }
    let out = root.join("target").join(TARGET).join(PROFILE).join("stowplan_kernel_wasm.wasm");
    std::fs::read(&out).map_err(|e| format!("reading {}: {e}", out.display()))
}

fn main() -> ExitCode {
    let cmd = std::env::args().nth(1).unwrap_or_default();
    let assets = root().join("host/assets");
    let wasm_path = assets.join("stowplan_kernel.wasm");
    let sha_path = assets.join("stowplan_kernel.wasm.sha256");
    match cmd.as_str() {
        "test" => run_tests(),
        "build-kernel" | "check-kernel" => {
            if !target_installed() {
                eprintln!(
                    "xtask: the {TARGET} target is not installed (rustup target add {TARGET}); \
                     the committed {} is used as is",
                    wasm_path.display()
                );
                return ExitCode::from(3);
            }
            let bytes = match build() {
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
            eprintln!("usage: cargo xtask test | build-kernel | check-kernel");
            ExitCode::from(2)
        }
    }
}

/// Runs a command in the workspace root, echoing it; `Err` with a message if it fails.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    eprintln!("xtask: $ {program} {}", args.join(" "));
    let status =
        Command::new(program).current_dir(root()).args(args).status().map_err(|e| format!("running {program}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("`{program} {}` failed ({status})", args.join(" "))) }
}

fn run_tests() -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut steps: Vec<(&str, Vec<&str>)> = vec![(cargo.as_str(), vec!["test", "--release", "--locked"])];
    let sdk_script = root().join("sdk-python/run_tests.sh");
    let sdk_script = sdk_script.to_string_lossy().into_owned();
    if Path::new(&sdk_script).is_file() {
        steps.push(("bash", vec![sdk_script.as_str()]));
    }
    for (program, args) in steps {
        if let Err(e) = run(program, &args) {
            eprintln!("xtask: {e}");
            return ExitCode::from(1);
        }
    }
    ExitCode::SUCCESS
}
