//! The cargo selections of `cargo xtask test`, shared with `tests/tests/unify.rs` (which
//! includes this file) so that the test checks the builds xtask actually runs.

/// The workspace tests: everything but the host library, with the quick start's features.
pub const WORKSPACE_TESTS: [&str; 3] = ["--workspace", "--exclude", "stowplan"];

/// The host library's own tests, with the ZeroMQ transport.
pub const ZMQ_HOST: [&str; 4] = ["-p", "stowplan", "--features", "zmq"];

/// The conformance and CLI tests that speak ZeroMQ, with the transport (and the CLI with its
/// Arrow reader: this is the build of the binary the SDK tests run).
pub const ZMQ_REST: [&str; 6] = [
    "-p",
    "stowplan-conformance",
    "-p",
    "stowplan-cli",
    "--features",
    "stowplan-conformance/zmq,stowplan-cli/zmq,stowplan-cli/arrow",
];

/// The test targets of [`ZMQ_REST`] that are run.
pub const ZMQ_REST_TESTS: [&str; 10] =
    ["--test", "clients", "--test", "curve", "--test", "packer", "--test", "cli", "--test", "arrow"];
