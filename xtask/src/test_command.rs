//! `cargo xtask test`: every test of the project, the steps that wait on the network or leave
//! a core idle placed beside the ones that compile (BENCHMARKS.md, "Build time"):
//!
//! 1. In the background from the start: the kernel's tests in a debug build (another profile,
//!    so another lock); the Python SDK's virtual environment with its test dependencies
//!    (`sdk-python/run_tests.sh --env`: downloads, no compile); the JavaScript SDK's package
//!    (`sdk-js/run_tests.sh --build-only`: `npm ci` and the jco build).
//! 2. The workspace's tests in one cargo run ([`builds::TESTS`]). Once cargo has compiled them
//!    it lets go of the target directory's lock and runs them. Beside the test binaries then:
//!    the Python SDK's wheel (`run_tests.sh --wheel`: maturin compiles the extension against
//!    the host library just built) and the JavaScript SDK's tests, which run the CLI just
//!    built.
//! 3. The CLI's tests without its features ([`builds::QUICK_START_CLI`]), once the wheel's
//!    cargo has let go of the lock.
//! 4. The Python SDK's tests (`run_tests.sh --tests`), on two pytest workers, with the
//!    JavaScript SDK's still running beside them.
//!
//! A failing step does not stop the steps that do not need it (a failing Rust test stops
//! none: what the later steps need is that the tests compiled); every step started is waited
//! for, and the command fails naming each step that failed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use crate::{builds, root, run, target_dir};

/// The cargo config of a build linking the system's libzmq, which has CURVE (the `zmq`
/// crate's own build of libzmq has not; see the file).
const SYSTEM_LIBZMQ: &str = ".cargo/system-libzmq.toml";

/// The Python SDK's test script, its phases run one at a time.
const PYTHON_SDK: &str = "sdk-python/run_tests.sh";

/// The JavaScript SDK's test script.
const JS_SDK: &str = "sdk-js/run_tests.sh";

/// Runs every test (see the module doc) and prints the whole command's time.
pub fn run_tests() -> ExitCode {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let start = std::time::Instant::now();
    let result = every_test(&cargo);
    eprintln!("xtask: every test: {:.0} s", start.elapsed().as_secs_f64());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::from(1)
        }
    }
}

/// The steps of the module doc. `Err` names every step that failed.
fn every_test(cargo: &str) -> Result<(), String> {
    // Checked before anything starts, so that a missing requirement fails at once.
    let js = js_sdk_present()?;
    let python = root().join(PYTHON_SDK).is_file();
    let mut failed = Vec::new();

    // The kernel's own tests, in a debug build, where an arithmetic overflow panics: the
    // kernel promises an error, never a wrapped sum. (The conformance tests run the release
    // kernel, natively and as the WASM component.)
    let mut kernel = Command::new(cargo);
    kernel.args(["test", "--locked", "-p", "stowplan-kernel"]);
    let kernel = Background::start("kernel tests (debug build)", kernel, "target/kernel-tests.log")?;
    let mut env = python
        .then(|| python_phase("--env", "Python SDK environment", "target/sdk-python-env.log"))
        .and_then(|s| note(s, &mut failed));
    let js_build = js
        .then(|| js_step("JavaScript SDK build", "target/sdk-js-build.log", &["--build-only"], &[]))
        .and_then(|s| note(s, &mut failed));

    let curve = system_libzmq();
    let (mut wheel, mut bin, mut js_tests, mut js_build) = (None, None, None, js_build);
    let rust = timed("Rust tests", || {
        rust_tests(cargo, curve, || {
            if let Some(env) = env.take() {
                match env.finish() {
                    Ok(()) => {
                        wheel = note(
                            python_phase("--wheel", "Python SDK wheel", "target/sdk-python-wheel.log"),
                            &mut failed,
                        )
                    }
                    Err(e) => failed.push(e),
                }
            }
            bin = note(keep_cli(), &mut failed);
            if let Some(bin) = &bin
                && let Some(build) = js_build.take()
                && note(build.finish(), &mut failed).is_some()
            {
                let bin = bin.display().to_string();
                js_tests = note(
                    js_step(
                        "JavaScript SDK",
                        "target/sdk-js-tests.log",
                        &[],
                        &[("STOWPLAN_BIN", &bin), ("STOWPLAN_SDK_JS_BUILT", "1")],
                    ),
                    &mut failed,
                );
            }
        })
    });
    // Awaited here when the tests never started running (they did not compile).
    for step in [env.take(), js_build.take()].into_iter().flatten() {
        note(step.finish(), &mut failed);
    }
    note(kernel.finish(), &mut failed);
    note(rust, &mut failed);
    // `bin` is there once the tests compiled, whether or not they all passed.
    if bin.is_some() {
        let args = [&["test", "--release", "--locked"][..], &builds::QUICK_START_CLI].concat();
        note(timed("the quick start's CLI", || run(cargo, &args)), &mut failed);
    }
    let wheel_built = wheel.is_some_and(|wheel| note(wheel.finish(), &mut failed).is_some());
    match &bin {
        Some(bin) if wheel_built => {
            note(timed("Python SDK tests", || python_tests(bin, curve)), &mut failed);
        }
        _ if python => failed.push("the Python SDK's tests did not run (a step they need failed)".into()),
        _ => {}
    }
    if let Some(js_tests) = js_tests {
        note(js_tests.finish(), &mut failed);
    }
    if failed.is_empty() { Ok(()) } else { Err(failed.join("; ")) }
}

/// `Some` of a step's result, or `None` with its error kept in `failed`.
fn note<T>(result: Result<T, String>, failed: &mut Vec<String>) -> Option<T> {
    result.map_err(|e| failed.push(e)).ok()
}

/// Runs `step`, then prints how long it took (CI's log keeps each step's time).
fn timed<T>(what: &str, step: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    let start = std::time::Instant::now();
    let out = step();
    eprintln!("xtask: {what}: {:.0} s", start.elapsed().as_secs_f64());
    out
}

/// Whether the system's libzmq is installed (pkg-config knows it).
fn system_libzmq() -> bool {
    Command::new("pkg-config").args(["--exists", "libzmq"]).status().is_ok_and(|s| s.success())
}

/// The workspace's tests ([`builds::TESTS`]) in one cargo run, the ZeroMQ transport's
/// included, linked to the system libzmq where pkg-config finds it (`curve`: it has CURVE,
/// and the CURVE tests must pass) and otherwise to the one `zmq-sys` builds from source (no
/// CURVE: those tests are skipped, saying so, unless `STOWPLAN_REQUIRE_CURVE=1` makes that a
/// failure). `running` is called once cargo has compiled every test target and runs the
/// first (it no longer holds the target directory's lock then). Neither wasmtime nor the
/// host library is compiled again (xtask/unify; `tests/tests/unify.rs`).
fn rust_tests(cargo: &str, curve: bool, running: impl FnOnce()) -> Result<(), String> {
    if !curve {
        let hint = "the system libzmq is not installed (Debian: apt install libzmq3-dev pkg-config)";
        if std::env::var("STOWPLAN_REQUIRE_CURVE").as_deref() == Ok("1") {
            return Err(format!("the CURVE tests are required (STOWPLAN_REQUIRE_CURVE=1) but {hint}"));
        }
        eprintln!("xtask: the ZeroMQ tests build libzmq from source and skip the CURVE tests: {hint}");
    }
    let mut args = vec!["test", "--release", "--locked"];
    if curve {
        args.extend(["--config", SYSTEM_LIBZMQ]);
    }
    args.extend(builds::TESTS);
    eprintln!("xtask: $ {}{cargo} {}", if curve { "STOWPLAN_EXPECT_CURVE=1 " } else { "" }, args.join(" "));
    let mut command = Command::new(cargo);
    command.current_dir(root()).args(&args).stderr(Stdio::piped());
    if curve {
        command.env("STOWPLAN_EXPECT_CURVE", "1");
    }
    let mut child = command.spawn().map_err(|e| format!("running {cargo}: {e}"))?;
    let stderr = child.stderr.take().expect("stderr is piped");
    // cargo's stderr (and the tests') passes through line by line; its first `Running` line
    // of a test binary says the compile is over (a verbose cargo's `Running `rustc …`` lines,
    // with a backtick, come while it compiles).
    let (tx, started) = std::sync::mpsc::channel();
    let echo = std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line);
            eprintln!("{line}");
            if line.trim_start().starts_with("Running ") && !line.contains('`') {
                tx.take().map(|tx| tx.send(()));
            }
        }
    });
    if started.recv().is_ok() {
        running();
    }
    let status = child.wait().map_err(|e| format!("waiting for {cargo}: {e}"))?;
    echo.join().map_err(|_| "the thread echoing cargo's output panicked".to_string())?;
    if !status.success() {
        return Err(format!("`{cargo} {}` failed ({status})", args.join(" ")));
    }
    Ok(())
}

/// The `stowplan` binary with the ZeroMQ transport, which the CLI's integration tests built
/// into the target directory, copied to `target/zmq/stowplan`: the SDKs' tests run it, and
/// the quick start's CLI replaces the original next.
fn keep_cli() -> Result<PathBuf, String> {
    let built = target_dir().join("release/stowplan");
    let copy = root().join("target/zmq/stowplan");
    std::fs::create_dir_all(copy.parent().expect("a parent"))
        .and_then(|()| std::fs::copy(&built, &copy))
        .map_err(|e| format!("copying {} to {}: {e}", built.display(), copy.display()))?;
    Ok(copy)
}

/// A phase of the Python SDK's test script ([`PYTHON_SDK`]), in the background.
fn python_phase(phase: &str, what: &'static str, log: &str) -> Result<Background, String> {
    let mut command = Command::new("bash");
    command.arg(PYTHON_SDK).arg(phase);
    Background::start(what, command, log)
}

/// The Python SDK's tests (the script's `--tests`, in the environment and with the wheel its
/// other phases installed): the serve tests run `bin` (with the ZeroMQ transport), and its
/// CURVE tests must pass where it has CURVE.
fn python_tests(bin: &Path, curve: bool) -> Result<(), String> {
    let mut sdk = Command::new("bash");
    sdk.current_dir(root()).args([PYTHON_SDK, "--tests"]).env("STOWPLAN_BIN", bin);
    if curve {
        sdk.env("STOWPLAN_CURVE_BIN", bin).env("STOWPLAN_REQUIRE_CURVE", "1");
    }
    eprintln!("xtask: $ bash {PYTHON_SDK} --tests");
    let status = sdk.status().map_err(|e| format!("running {PYTHON_SDK}: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("`bash {PYTHON_SDK} --tests` failed ({status})")) }
}

/// Whether the JavaScript SDK's tests run: `sdk-js/` holds them and node and npm are
/// installed. Without node and npm, a loud warning, or an error when
/// `STOWPLAN_REQUIRE_NODE=1` (CI).
fn js_sdk_present() -> Result<bool, String> {
    if !root().join(JS_SDK).is_file() {
        return Ok(false);
    }
    let found = |tool: &str| Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    if found("node") && found("npm") {
        return Ok(true);
    }
    if std::env::var("STOWPLAN_REQUIRE_NODE").is_ok_and(|v| v == "1") {
        return Err("node and npm are required for the JavaScript SDK's tests (STOWPLAN_REQUIRE_NODE=1)".into());
    }
    eprintln!("xtask: WARNING: node or npm not found: the JavaScript SDK's tests ({JS_SDK}) DID NOT RUN");
    Ok(false)
}

/// The JavaScript SDK's test script ([`JS_SDK`]: Node tests, packed-package import, the
/// explorer in headless Chromium) in the background. `--build-only` builds the package,
/// which the Python SDK's README test also runs its blocks against; the tests then run with
/// `STOWPLAN_SDK_JS_BUILT=1`, so nothing rebuilds it beside them.
fn js_step(what: &'static str, log: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Background, String> {
    let mut command = Command::new("bash");
    command.arg(JS_SDK).args(args).envs(env.iter().copied());
    Background::start(what, command, log)
}

/// A step running in the background, its output kept in a log file under `target/` until
/// [`Background::finish`] prints it.
struct Background {
    what: &'static str,
    log: PathBuf,
    /// The command's exit status and how long it ran, from the thread waiting for it (so the
    /// time is the step's, not how long xtask took to ask).
    waiting: std::thread::JoinHandle<std::io::Result<(std::process::ExitStatus, std::time::Duration)>>,
}

impl Background {
    /// Starts `command` in the workspace root, its output to `log` (relative to the root).
    fn start(what: &'static str, mut command: Command, log: &str) -> Result<Self, String> {
        let log = root().join(log);
        std::fs::create_dir_all(log.parent().expect("a parent"))
            .map_err(|e| format!("creating {}: {e}", log.display()))?;
        let file = std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let err = file.try_clone().map_err(|e| format!("opening {} twice: {e}", log.display()))?;
        eprintln!("xtask: {what}: {command:?} > {} (in the background)", log.display());
        let mut child = command
            .current_dir(root())
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("running {what}: {e}"))?;
        let start = std::time::Instant::now();
        let waiting = std::thread::spawn(move || child.wait().map(|status| (status, start.elapsed())));
        Ok(Self { what, log, waiting })
    }

    /// Waits for the step, prints its output and how long it ran, and says whether it passed.
    fn finish(self) -> Result<(), String> {
        let what = self.what;
        let (status, took) = self
            .waiting
            .join()
            .map_err(|_| format!("the thread waiting for {what} panicked"))?
            .map_err(|e| format!("waiting for {what}: {e}"))?;
        let output = std::fs::read(&self.log).map_err(|e| format!("reading {}: {e}", self.log.display()))?;
        eprintln!("xtask: {what}: its output ({}):", self.log.display());
        use std::io::Write;
        std::io::stdout().write_all(&output).and_then(|()| std::io::stdout().flush()).ok();
        eprintln!("xtask: {what}: {:.0} s (in the background)", took.as_secs_f64());
        if status.success() { Ok(()) } else { Err(format!("{what} failed ({status})")) }
    }
}
