//! What the server receives ([`Message`], [`Incoming`]) and the [`Transport`] it receives and
//! delivers through.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::{ControlMessage, Delivered, Receipt};
use crate::Error;
use crate::packer::{RankBatch, TrainingBatch};
use crate::wire;

/// A message that reached the packer.
#[derive(Debug)]
pub enum Message {
    /// A training batch.
    Batch(Arc<TrainingBatch>),
    /// A run change.
    Control(ControlMessage),
}

impl Message {
    /// Decodes a training batch or a control message (told apart by their headers).
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        if wire::CONTROL.matches(bytes) {
            return ControlMessage::decode(bytes).map(Message::Control);
        }
        if !wire::TRAINING_BATCH.matches(bytes) {
            return Err(Error::InvalidArgument(
                "bytes: neither a training batch (SPTB) nor a control message (SPCT)".into(),
            ));
        }
        TrainingBatch::decode(bytes).map(|b| Message::Batch(Arc::new(b)))
    }
}

/// One received message: its bytes, and the file it came in (filesystem transport), which
/// the server moves into its spool or deletes once the message is durable.
#[derive(Debug)]
pub struct Incoming {
    /// The encoded message.
    pub bytes: Vec<u8>,
    /// The file it was read from, if any.
    pub path: Option<PathBuf>,
    /// `Some(size)`: the message is over the transport's cap ([`MAX_MESSAGE_BYTES`](super::MAX_MESSAGE_BYTES) by
    /// default) and was not read (`bytes` is empty); the server sets its file aside.
    pub oversized: Option<u64>,
}

/// How messages reach the packer and rank batches reach the trainer ranks.
pub trait Transport {
    /// A short name for logs ("fs", "zmq").
    fn name(&self) -> &'static str;
    /// Whether every rank is ready to receive (the barrier before the first step); does not
    /// block. The server packs nothing before this is `true`.
    fn ready(&mut self) -> Result<bool, Error>;
    /// Messages that arrived, waiting at most `timeout` for the first.
    fn receive(&mut self, timeout: Duration) -> Result<Vec<Incoming>, Error>;
    /// Tells the senders that these messages are durable (called after the checkpoint that
    /// made them so). The filesystem transport needs nothing: a message stays in the inbox
    /// until the server has moved or deleted it.
    fn acknowledge(&mut self, receipts: Vec<Receipt>) -> Result<(), Error> {
        let _ = receipts;
        Ok(())
    }
    /// Delivers one step: `ranks[r]` is rank `r`'s batch (encode with [`RankBatch::encode`]).
    /// Returns `false` when `stop` was set before every rank had it: the step then stays in
    /// flight and is delivered again after a restart.
    fn deliver(&mut self, step: u64, ranks: &[RankBatch], stop: &AtomicBool) -> Result<bool, Error>;
    /// What the receivers show of earlier deliveries, if anything (the filesystem root's
    /// step files and delivery mark; the ranks' hellos over ZeroMQ, once [`Transport::ready`]).
    /// The server refuses to serve receivers ahead of its checkpoint ([`Delivered::check`]).
    fn delivered(&mut self) -> Result<Option<Delivered>, Error> {
        Ok(None)
    }
    /// Takes no message until a receiver has shown where it stands (ZeroMQ: a rank's hello),
    /// so that a packer starting without a checkpoint learns whether the ranks are ahead of it
    /// ([`Delivered::check`]) before it acknowledges anything. The filesystem transport's
    /// evidence is on disk from the start: nothing to wait for.
    fn wait_for_receivers(&mut self) {}
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn ready(&mut self) -> Result<bool, Error> {
        (**self).ready()
    }
    fn receive(&mut self, timeout: Duration) -> Result<Vec<Incoming>, Error> {
        (**self).receive(timeout)
    }
    fn acknowledge(&mut self, receipts: Vec<Receipt>) -> Result<(), Error> {
        (**self).acknowledge(receipts)
    }
    fn deliver(&mut self, step: u64, ranks: &[RankBatch], stop: &AtomicBool) -> Result<bool, Error> {
        (**self).deliver(step, ranks, stop)
    }
    fn delivered(&mut self) -> Result<Option<Delivered>, Error> {
        (**self).delivered()
    }
    fn wait_for_receivers(&mut self) {
        (**self).wait_for_receivers()
    }
}

/// Runs `f` on every rank's batch, one thread per rank (encoding is the costly part of a
/// delivery; one rank's encoding overlaps another's write).
pub fn per_rank<T: Send>(
    ranks: &[RankBatch],
    f: impl Fn(usize, &RankBatch) -> Result<T, Error> + Sync,
) -> Result<Vec<T>, Error> {
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = ranks.iter().enumerate().map(|(r, b)| s.spawn(move || f(r, b))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Runtime("a rank's encoder panicked".into()))))
            .collect()
    })
}
