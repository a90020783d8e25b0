//! `stowplan serve`: the [`Packer`](crate::Packer) as a long-running process between an orchestrator and
//! the trainer ranks, over a [`Transport`].
//!
//! The [`Server`] loop: receive messages (training batches and run changes), keep each
//! accepted batch in a spool file, checkpoint, and whenever the packer is ready pack a step,
//! checkpoint it as *in flight*, deliver every rank's [`RankBatch`](crate::packer::RankBatch), mark it delivered,
//! checkpoint again and drop the spool files of fully delivered batches. After a crash
//! ([`Server::open`] on the same state directory) the step in flight is rebuilt from the spool
//! and delivered again (identical bytes; receivers skip a step they already have), batches
//! spooled after the last checkpoint are ingested again, and a batch the orchestrator sends
//! again is recognised as a duplicate: nothing is lost and nothing is delivered twice.
//!
//! Two transports: [`FsTransport`] (files under a shared root) and `ZmqTransport` (ZeroMQ over
//! TCP, for orchestrators and ranks on other hosts; the `stowplan-zmq` crate, `host/zmq`);
//! [`protocol`] holds the messages both speak and each side's rules as state machines without
//! I/O, [`client`] the Rust client of a rank over files ([`FileRankClient`]; `stowplan-zmq` has
//! the ZeroMQ ones, `ZmqRankClient` and `ZmqBatchSender`).
//!
//! State directory: `state.bin` (the [`PackerState`](crate::packer::PackerState), replaced atomically), `spool/`
//! (`run_{r}_step_{s}.bin`, the batches' encodings), `rejected/` (messages that could not be
//! decoded, kept for inspection), `lock` (held while a server runs; a second server on the
//! same directory is refused, naming the holder's pid). The filesystem transport also holds
//! `ROOT/serve.lock`: a second server on the same root is refused even with another state
//! directory.

mod checkpoint_dir;
pub mod client;
mod fs;
pub mod protocol;
mod server;
mod transport;

pub use checkpoint_dir::{CheckpointDir, Restored};
pub use client::{FileRankClient, FileRankOptions};
pub(crate) use fs::wait_for_file;
pub use fs::{FsTransport, receive_fs, send_fs};
pub use protocol::{
    Arrival, BatchSender, Control, ControlMessage, Delivered, DeliveryMark, HEARTBEAT, MAX_MESSAGE_BYTES, MessageKey,
    RankMessage, RankReceiver, Receipt, Receipts, Received, Refusal, StepDelivery, ToRank, ZmqEndpoints,
    batch_file_name,
};
pub use server::{RejectedLimits, ServeOptions, ServeSummary, Server, StepReport};
pub use transport::{Incoming, Message, Transport, per_rank};
