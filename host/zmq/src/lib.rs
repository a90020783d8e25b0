//! # stowplan-zmq
//!
//! The ZeroMQ transport of `stowplan serve` and its Rust clients, over the
//! [`stowplan`] host library: orchestrators and trainer ranks on other hosts talk to the packer
//! over TCP, optionally encrypted and authenticated with CURVE ([`curve`]).
//!
//! - [`ZmqTransport`]: the server side, a [`Transport`](stowplan::serve::Transport) for
//!   [`stowplan::serve::Server`].
//! - [`ZmqRankClient`]: a trainer rank, around a
//!   [`RankReceiver`](stowplan::serve::protocol::RankReceiver). A background thread owns the
//!   DEALER socket: it says hello, reads and acknowledges up to `prefetch` steps ahead of the
//!   trainer, and hands steps over under a condition variable; `receive` returns them in
//!   order.
//! - [`ZmqBatchSender`]: an orchestrator, around a
//!   [`BatchSender`](stowplan::serve::protocol::BatchSender): PUSH to the batches endpoint,
//!   SUB to the receipts; every call takes the receipts that arrived and resends what is due.
//!
//! The messages and each side's rules are the host's [`protocol`](stowplan::serve::protocol)
//! state machines; this crate is their I/O. Every wait takes a [`Duration`](std::time::Duration);
//! a wait too long to represent waits forever. Errors name what is missing: the step, the
//! endpoint, the messages not acknowledged.
//!
//! A crate of its own, not a feature of the host library: the host library is one build for
//! every consumer, and libzmq (built from source by `zmq-sys`, or the system's with
//! `--config .cargo/system-libzmq.toml`, which CURVE needs) is compiled only for the users of
//! this crate: the CLI's `zmq` feature and the tests.
#![deny(missing_docs)]

mod clients;
pub mod curve;
mod support;
mod transport;

pub use clients::{ZmqBatchSender, ZmqRankClient, ZmqRankOptions, ZmqSenderOptions};
pub use curve::{Certificate, CurveClient, CurveServer, curve_available};
pub use transport::ZmqTransport;
