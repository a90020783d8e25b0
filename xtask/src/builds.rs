//! The cargo selection of `cargo xtask test`, shared with `tests/tests/unify.rs` (which
//! includes this file) so that the test checks the build xtask actually runs.

/// Every test of the workspace in one cargo run (unit, integration, doc tests and examples),
/// with the features the tests need: the CLI with the ZeroMQ transport and its Arrow reader,
/// and the conformance tests that speak ZeroMQ. Left out: the kernel (its tests run in a debug
/// build, where an overflow panics: running them in release too compiled them twice) and the
/// Python extension (a cdylib that the wheel compiles; `sdk-python/tests` test it through
/// Python). The host library is the one the quick start built: the ZeroMQ transport is a
/// crate of its own (`host/zmq`), so no feature of the tests compiles the library again.
pub const TESTS: [&str; 7] = [
    "--workspace",
    "--exclude",
    "stowplan-kernel",
    "--exclude",
    "stowplan-python",
    "--features",
    "stowplan-cli/zmq,stowplan-cli/arrow,stowplan-conformance/zmq",
];
