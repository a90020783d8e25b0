//! The cargo selections of `cargo xtask test`, shared with `tests/tests/unify.rs` (which
//! includes this file) so that the test checks the builds xtask actually runs.

/// The workspace tests, with the quick start's features: everything but the host library
/// (its tests run with the ZeroMQ transport, [`ZMQ`]), the kernel (its tests run in a debug
/// build, where an overflow panics: running them in release too compiled them twice) and the
/// Python extension (a cdylib that the wheel compiles; its test harness was a third compile
/// of it, and `sdk-python/tests` test it through Python).
pub const WORKSPACE_TESTS: [&str; 7] =
    ["--workspace", "--exclude", "stowplan", "--exclude", "stowplan-kernel", "--exclude", "stowplan-python"];

/// The host library, whose doc tests run on the library the quick start built (`--doc`).
pub const HOST: [&str; 2] = ["-p", "stowplan"];

/// One build with the ZeroMQ transport for the host library's own tests and the conformance
/// and CLI tests that speak ZeroMQ (and the CLI with its Arrow reader: this is the build of
/// the binary the SDK tests then run). One cargo run, so that cargo overlaps the compiles.
pub const ZMQ: [&str; 8] = [
    "-p",
    "stowplan",
    "-p",
    "stowplan-conformance",
    "-p",
    "stowplan-cli",
    "--features",
    "stowplan/zmq,stowplan-conformance/zmq,stowplan-cli/zmq,stowplan-cli/arrow",
];

/// The test targets of [`ZMQ`] that are run: the libraries' unit tests (the host's), the
/// host's examples (compiled, as `cargo test` compiles them, and their tests run: they have
/// none), every integration test of the host (`tests/tests/unify.rs` checks that each file of
/// `host/tests` is named here), and the tests that speak ZeroMQ or read Arrow.
pub const ZMQ_TESTS: [&str; 14] = [
    "--lib",
    "--examples",
    "--test",
    "wasm",
    "--test",
    "clients",
    "--test",
    "curve",
    "--test",
    "packer",
    "--test",
    "cli",
    "--test",
    "arrow",
];
