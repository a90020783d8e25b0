//! The cargo selections of `cargo xtask test`, shared with `tests/tests/unify.rs` (which
//! includes this file) so that the test checks the builds xtask actually runs.

/// Every test of the workspace in one cargo run (unit, integration, doc tests and examples),
/// with the features the tests need: the CLI with the ZeroMQ transport and its Arrow reader,
/// and the conformance tests that speak ZeroMQ. Left out: the kernel (its tests run in a debug
/// build, where an overflow panics: running them in release too compiled them twice), the
/// Python extension (a cdylib that the wheel compiles; `sdk-python/tests` test it through
/// Python) and the criterion benchmarks (`host/bench`, no tests: left in, criterion and its
/// regex engine would compile for nothing). The host library is the one the quick start
/// built: the ZeroMQ transport is a crate of its own (`host/zmq`), so no feature of the tests
/// compiles the library again.
pub const TESTS: [&str; 9] = [
    "--workspace",
    "--exclude",
    "stowplan-kernel",
    "--exclude",
    "stowplan-python",
    "--exclude",
    "stowplan-bench",
    "--features",
    "stowplan-cli/zmq,stowplan-cli/arrow,stowplan-conformance/zmq",
];

/// The CLI's integration tests of what the quick start's binary lacks, with its features:
/// what it says of the ZeroMQ transport and the Arrow reader it is built without (the tests
/// under `cfg(not(feature = …))`, all named [`WITHOUT_FEATURE`]…; `tests/tests/unify.rs` checks
/// it). Its binary and every dependency are those of the first command and of [`TESTS`]; only
/// the two test harnesses compile again, and only those tests run.
pub const QUICK_START_CLI: [&str; 8] =
    ["-p", "stowplan-cli", "--test", "cli", "--test", "arrow", "--", WITHOUT_FEATURE];

/// The name prefix of the CLI's tests of a build without a feature.
pub const WITHOUT_FEATURE: &str = "without_the_feature_";
