//! How a command fails: a message for stderr and the exit code.

use stowplan::Error;

/// The exit code of an infeasible request (e.g. a length above the capacity).
pub const INFEASIBLE: u8 = 1;
/// The exit code of bad input and of any other error.
pub const BAD_INPUT: u8 = 2;
/// The exit code of a command stopped by SIGINT or SIGTERM (128 + SIGINT, the shell's):
/// `pack-dataset`'s, which the `arrow` feature builds.
#[cfg_attr(not(feature = "arrow"), allow(dead_code))]
pub const INTERRUPTED: u8 = 130;

/// A failure of the CLI with its exit code.
#[derive(Debug)]
pub struct Failure {
    /// The process's exit code: [`INFEASIBLE`], [`BAD_INPUT`] or [`INTERRUPTED`].
    pub code: u8,
    /// What went wrong, printed after `stowplan: error: `.
    pub message: String,
}

impl Failure {
    /// Bad input or another error (exit 2).
    pub fn bad(message: impl Into<String>) -> Self {
        Self { code: BAD_INPUT, message: message.into() }
    }

    /// Stopped by a signal before finishing (exit 130).
    #[cfg_attr(not(feature = "arrow"), allow(dead_code))]
    pub fn interrupted(message: impl Into<String>) -> Self {
        Self { code: INTERRUPTED, message: message.into() }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let code = if matches!(e, Error::Infeasible(_)) { INFEASIBLE } else { BAD_INPUT };
        Self { code, message: e.to_string() }
    }
}

/// `what` in a build without the ZeroMQ transport (the `zmq` feature, off by default so that
/// the quick start does not build libzmq): says how to build one.
#[cfg(not(feature = "zmq"))]
pub fn without_zmq(what: &str) -> Failure {
    Failure::bad(format!(
        "{what}: this stowplan was built without the ZeroMQ transport; build it with \
         `cargo build --release -p stowplan-cli --features zmq` (libzmq from source, no CURVE), or add \
         `--config .cargo/system-libzmq.toml` to link the system's libzmq, which has CURVE (README, \
         `stowplan serve`, ZeroMQ)"
    ))
}
