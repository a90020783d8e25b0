//! A trainer rank's side of the ZeroMQ protocol as a state machine without I/O:
//! [`RankReceiver`].
//!
//! The rank's socket is a DEALER connected to the packer's ranks endpoint; the driver (the
//! Rust [`ZmqRankClient`](crate::serve::client), the Python SDK's `ZmqRankClient`) owns it and
//! loops:
//!
//! 1. [`RankReceiver::poll_hello`]`(now)`: when it returns bytes, send them (the hello is due
//!    at once on start, then every [`HEARTBEAT`]; the packer learns from it that the rank is
//!    there, and a hello from a new connection makes it send the unacknowledged step again).
//! 2. While [`RankReceiver::wants_message`] (fewer than `prefetch` steps held, no failure),
//!    wait for one message (at most until the next hello is due,
//!    [`RankReceiver::hello_due_in`]), give it to [`RankReceiver::on_message`] and send the
//!    acknowledgement it returns ([`Received::ack`]). A full receiver reads nothing: the
//!    message waits in the socket, unacknowledged, and the packer sends nothing newer.
//! 3. The trainer takes steps with [`RankReceiver::next_batch`], strictly in order.
//!
//! The rules of a message:
//! - a rank batch of the step expected next is held for the trainer ([`Arrival::InOrder`]);
//!   one ahead of it is held back until the trainer has taken the steps before it
//!   ([`Arrival::HeldBack`]); a copy of a step taken or held already (redelivered after a
//!   restart of the packer or a reconnection) is dropped ([`Arrival::Duplicate`]). All three
//!   are acknowledged: the packer counts a step delivered when every rank acknowledged it.
//! - a [`Refusal`] (another data-parallel size, a rank out of range), a batch addressed to
//!   another rank and undecodable bytes fail the receiver: [`RankReceiver::on_message`]
//!   returns the error, no acknowledgement is sent, and from then on the receiver says no
//!   hello and wants no message ([`RankReceiver::error`]); steps held before stay available.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{HEARTBEAT, RankMessage, Refusal};
use crate::packer::RankBatch;
use crate::{Error, wire};

/// What the packer sent a rank, decoded ([`ToRank::decode`] never fails: bad bytes are a
/// value too, so that a driver can decode outside any lock and hand the result over).
#[derive(Debug)]
pub enum ToRank {
    /// One rank's share of a step.
    Batch(RankBatch),
    /// The packer will not serve this rank.
    Refusal(Refusal),
    /// Bytes that are neither (the error names what is wrong with them).
    Undecodable(Error),
}

impl ToRank {
    /// Decodes a message from the packer's ranks socket (a [`Refusal`] is told apart by its
    /// header; anything else must be a [`RankBatch`]).
    pub fn decode(bytes: &[u8]) -> Self {
        let decoded = if wire::REFUSAL.matches(bytes) {
            Refusal::decode(bytes).map(ToRank::Refusal)
        } else {
            RankBatch::decode(bytes).map(ToRank::Batch)
        };
        decoded.unwrap_or_else(ToRank::Undecodable)
    }
}

/// Where a received step went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// The step the trainer expects next: [`RankReceiver::next_batch`] returns it.
    InOrder,
    /// A step ahead of the one expected, held until the steps before it were taken.
    HeldBack,
    /// A copy of a step taken or held already: dropped.
    Duplicate,
}

/// What [`RankReceiver::on_message`] made of a rank batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// The batch's step.
    pub step: u64,
    /// Where it went.
    pub arrival: Arrival,
    /// The encoded [`RankMessage::Ack`] to send back (for a copy too: its first
    /// acknowledgement may have been lost with a connection).
    pub ack: Vec<u8>,
}

/// How many steps a rank receives and acknowledges ahead of the one its trainer takes, by
/// default (the Rust client and the Python `ZmqRankClient` both use it).
pub const DEFAULT_PREFETCH: usize = 2;

/// A trainer rank's receiver over ZeroMQ, without I/O (see the module docs).
#[derive(Debug)]
pub struct RankReceiver {
    rank: u32,
    dp: u32,
    next_step: u64,
    prefetch: usize,
    held: BTreeMap<u64, RankBatch>,
    last_hello: Option<Instant>,
    failed: Option<Error>,
}

/// Encodes a rank message (a few integers: postcard cannot fail on them).
fn encode(m: &RankMessage) -> Vec<u8> {
    m.encode().expect("a rank message of integers always encodes")
}

impl RankReceiver {
    /// Rank `rank` of `dp` ranks, expecting step `next_step` first, holding at most
    /// `prefetch` steps the trainer has not taken yet.
    ///
    /// Errors: `invalid-argument` for `dp` 0, `rank` ≥ `dp` or `prefetch` 0.
    pub fn new(rank: u32, dp: u32, next_step: u64, prefetch: usize) -> Result<Self, Error> {
        if dp == 0 {
            return Err(Error::InvalidArgument("dp must be at least 1 (got 0)".into()));
        }
        if rank >= dp {
            return Err(Error::InvalidArgument(format!("rank must be below dp {dp} (got {rank})")));
        }
        if prefetch == 0 {
            return Err(Error::InvalidArgument("prefetch must be at least 1 (got 0)".into()));
        }
        Ok(Self { rank, dp, next_step, prefetch, held: BTreeMap::new(), last_hello: None, failed: None })
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// The data-parallel size the rank was started with.
    pub fn dp(&self) -> u32 {
        self.dp
    }

    /// The step [`RankReceiver::next_batch`] returns next.
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// How many steps the receiver holds at most before it stops reading.
    pub fn prefetch(&self) -> usize {
        self.prefetch
    }

    /// The hello to send now, if one is due: on the first call, then every [`HEARTBEAT`];
    /// never after a failure.
    pub fn poll_hello(&mut self, now: Instant) -> Option<Vec<u8>> {
        if self.failed.is_some() || !self.hello_due_in(now).is_zero() {
            return None;
        }
        self.last_hello = Some(now);
        Some(encode(&RankMessage::Hello { rank: self.rank, dp: self.dp, next_step: self.first_missing() }))
    }

    /// The first step this rank has neither taken nor holds: what its hello asks for (steps
    /// held ahead of the trainer are not asked for again).
    pub fn first_missing(&self) -> u64 {
        let mut step = self.next_step;
        while self.held.contains_key(&step) {
            step += 1;
        }
        step
    }

    /// How long until the next hello is due ([`Duration::ZERO`]: now; [`Duration::MAX`]:
    /// never, the receiver failed). A driver waits for a message at most this long.
    pub fn hello_due_in(&self, now: Instant) -> Duration {
        if self.failed.is_some() {
            return Duration::MAX;
        }
        match self.last_hello {
            None => Duration::ZERO,
            Some(last) => HEARTBEAT.saturating_sub(now.saturating_duration_since(last)),
        }
    }

    /// Whether the driver should read the next message: fewer than `prefetch` steps held and
    /// no failure.
    pub fn wants_message(&self) -> bool {
        self.failed.is_none() && self.held.len() < self.prefetch
    }

    /// Takes one message from the packer (see the module docs for the rules). `Ok`: a rank
    /// batch, with the acknowledgement to send. Errors (the receiver fails and keeps the
    /// error, [`RankReceiver::error`]): `invalid-argument` for a refusal ("the packer refused
    /// this rank: …" with the packer's reason), a batch of another rank, bytes that do not
    /// decode (naming what is wrong with them).
    pub fn on_message(&mut self, bytes: &[u8]) -> Result<Received, Error> {
        self.take(ToRank::decode(bytes))
    }

    /// [`RankReceiver::on_message`] for a message decoded already ([`ToRank::decode`]).
    pub fn take(&mut self, message: ToRank) -> Result<Received, Error> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let batch = match message {
            ToRank::Batch(b) => b,
            ToRank::Refusal(r) => {
                return Err(self.fail(Error::InvalidArgument(format!("the packer refused this rank: {}", r.message))));
            }
            ToRank::Undecodable(e) => return Err(self.fail(e)),
        };
        if batch.rank != self.rank {
            let e =
                Error::InvalidArgument(format!("the packer sent rank {}'s batch to rank {}", batch.rank, self.rank));
            return Err(self.fail(e));
        }
        let step = batch.step;
        let arrival = if step < self.next_step || self.held.contains_key(&step) {
            Arrival::Duplicate
        } else {
            self.held.insert(step, batch);
            if step == self.next_step { Arrival::InOrder } else { Arrival::HeldBack }
        };
        Ok(Received { step, arrival, ack: encode(&RankMessage::Ack { rank: self.rank, step }) })
    }

    fn fail(&mut self, e: Error) -> Error {
        self.failed = Some(e.clone());
        e
    }

    /// Whether the step expected next is here ([`RankReceiver::next_batch`] returns it).
    pub fn has_next(&self) -> bool {
        self.held.contains_key(&self.next_step)
    }

    /// The step expected next, if it arrived; the one after is expected from then on.
    pub fn next_batch(&mut self) -> Option<RankBatch> {
        let b = self.held.remove(&self.next_step)?;
        self.next_step += 1;
        Some(b)
    }

    /// The steps held, ascending (the next one, if it arrived, and those held back).
    pub fn held_steps(&self) -> Vec<u64> {
        self.held.keys().copied().collect()
    }

    /// Why the receiver failed, if it did (the error [`RankReceiver::on_message`] returned).
    pub fn error(&self) -> Option<&Error> {
        self.failed.as_ref()
    }

    /// The error of a driver that waited `waited` for the next step from `endpoint` in vain:
    /// `timeout`, naming the rank, the step and the steps held back.
    pub fn timeout_error(&self, endpoint: &str, waited: Duration) -> Error {
        Error::Timeout(format!(
            "rank {}: step {} did not arrive from {endpoint} within {} s (held back: steps {:?})",
            self.rank,
            self.next_step,
            waited.as_secs_f64(),
            self.held_steps()
        ))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn batch(rank: u32, step: u64) -> RankBatch {
        RankBatch { step, rank, dp: 2, keys: Vec::new(), micro_batches: Vec::new(), ready_to_update: Vec::new() }
    }

    fn bytes(rank: u32, step: u64) -> Vec<u8> {
        batch(rank, step).encode().unwrap()
    }

    fn ack(rank: u32, step: u64) -> Vec<u8> {
        RankMessage::Ack { rank, step }.encode().unwrap()
    }

    #[test]
    fn arguments_are_checked() {
        let e = |r: Result<RankReceiver, Error>| r.unwrap_err().to_string();
        assert!(e(RankReceiver::new(0, 0, 0, 1)).contains("dp must be at least 1"));
        assert!(e(RankReceiver::new(2, 2, 0, 1)).contains("rank must be below dp 2 (got 2)"));
        assert!(e(RankReceiver::new(0, 2, 0, 0)).contains("prefetch must be at least 1"));
        let r = RankReceiver::new(1, 2, 5, 3).unwrap();
        assert_eq!((r.rank(), r.dp(), r.next_step(), r.prefetch()), (1, 2, 5, 3));
    }

    #[test]
    fn hello_on_start_then_every_heartbeat() {
        let t0 = Instant::now();
        let mut r = RankReceiver::new(1, 2, 7, 2).unwrap();
        assert_eq!(r.hello_due_in(t0), Duration::ZERO);
        let hello = r.poll_hello(t0).expect("a hello on start");
        assert_eq!(RankMessage::decode(&hello).unwrap(), RankMessage::Hello { rank: 1, dp: 2, next_step: 7 });
        assert_eq!(r.poll_hello(t0), None);
        let half = t0 + HEARTBEAT / 2;
        assert_eq!(r.poll_hello(half), None);
        assert_eq!(r.hello_due_in(half), HEARTBEAT / 2);
        // The hello names the first step the rank lacks at the time (held steps included).
        r.on_message(&bytes(1, 7)).unwrap();
        r.on_message(&bytes(1, 8)).unwrap();
        r.next_batch().unwrap();
        assert_eq!((r.next_step(), r.first_missing()), (8, 9));
        let later = t0 + HEARTBEAT;
        let hello = r.poll_hello(later).expect("a hello after a heartbeat");
        assert_eq!(RankMessage::decode(&hello).unwrap(), RankMessage::Hello { rank: 1, dp: 2, next_step: 9 });
        assert_eq!(r.poll_hello(later + HEARTBEAT - Duration::from_millis(1)), None);
        // Late polls: the cadence restarts from the hello sent, none is sent twice to catch up.
        let late = later + 5 * HEARTBEAT;
        assert!(r.poll_hello(late).is_some());
        assert!(r.poll_hello(late + Duration::from_millis(1)).is_none());
        // A clock that went "back" (an Instant before the last hello) is never a panic.
        assert_eq!(r.hello_due_in(t0), HEARTBEAT);
    }

    #[test]
    fn steps_in_order_early_ones_held_back_copies_dropped_everything_acknowledged() {
        let mut r = RankReceiver::new(0, 2, 0, 4).unwrap();
        let arrivals: Vec<(u64, Arrival, Vec<u8>)> = [2u64, 0, 0, 1, 2]
            .iter()
            .map(|&s| {
                let got = r.on_message(&bytes(0, s)).unwrap();
                (got.step, got.arrival, got.ack)
            })
            .collect();
        assert_eq!(
            arrivals,
            vec![
                (2, Arrival::HeldBack, ack(0, 2)),
                (0, Arrival::InOrder, ack(0, 0)),
                (0, Arrival::Duplicate, ack(0, 0)),
                (1, Arrival::HeldBack, ack(0, 1)),
                (2, Arrival::Duplicate, ack(0, 2)),
            ]
        );
        assert_eq!(r.held_steps(), vec![0, 1, 2]);
        let taken: Vec<u64> = std::iter::from_fn(|| r.next_batch()).map(|b| b.step).collect();
        assert_eq!(taken, vec![0, 1, 2]);
        assert!(!r.has_next() && r.next_batch().is_none());
        assert_eq!(r.next_step(), 3);
        // A copy of a step already taken (redelivered after a restart): acknowledged, dropped.
        let copy = r.on_message(&bytes(0, 1)).unwrap();
        assert_eq!((copy.arrival, copy.ack), (Arrival::Duplicate, ack(0, 1)));
        assert!(r.held_steps().is_empty());
        let e = r.timeout_error("tcp://127.0.0.1:5557", Duration::from_millis(200)).to_string();
        assert!(e.contains("rank 0: step 3 did not arrive from tcp://127.0.0.1:5557 within 0.2 s"), "{e}");
    }

    #[test]
    fn the_prefetch_limit_stops_reading() {
        let mut r = RankReceiver::new(0, 1, 10, 2).unwrap();
        assert!(r.wants_message());
        assert_eq!(r.on_message(&bytes(0, 10)).unwrap().arrival, Arrival::InOrder);
        assert!(r.wants_message());
        assert_eq!(r.on_message(&bytes(0, 11)).unwrap().arrival, Arrival::HeldBack);
        assert!(!r.wants_message(), "two steps held: the next message waits in the socket");
        // A message taken anyway is never lost (it was read: it is held and acknowledged).
        assert_eq!(r.on_message(&bytes(0, 12)).unwrap().arrival, Arrival::HeldBack);
        assert_eq!(r.next_batch().unwrap().step, 10);
        assert!(!r.wants_message());
        assert_eq!(r.next_batch().unwrap().step, 11);
        assert!(r.wants_message());
        assert!(r.has_next());
        assert_eq!(r.next_batch().unwrap().step, 12);
    }

    #[test]
    fn a_refusal_fails_the_receiver_with_the_packers_reason() {
        let t0 = Instant::now();
        let mut r = RankReceiver::new(0, 3, 0, 2).unwrap();
        r.poll_hello(t0).unwrap();
        r.on_message(&bytes(0, 0)).unwrap();
        let refusal = Refusal::of_hello(0, 3, 2).unwrap();
        assert!(refusal.message.contains("started with dp 3, the packer serves dp 2"), "{}", refusal.message);
        let e = r.on_message(&refusal.encode().unwrap()).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArgument(m) if m.starts_with("the packer refused this rank:") && m.contains("dp 3")),
            "{e}"
        );
        assert_eq!(r.error(), Some(&e));
        assert!(!r.wants_message());
        assert_eq!(r.poll_hello(t0 + 10 * HEARTBEAT), None, "no hello after a refusal");
        assert_eq!(r.hello_due_in(t0), Duration::MAX);
        assert_eq!(r.on_message(&bytes(0, 1)).unwrap_err(), e, "the failure sticks");
        // What arrived before is still handed out.
        assert_eq!(r.next_batch().unwrap().step, 0);
    }

    #[test]
    fn another_ranks_batch_and_garbage_fail_the_receiver() {
        let mut r = RankReceiver::new(1, 2, 0, 2).unwrap();
        let e = r.on_message(&bytes(0, 0)).unwrap_err().to_string();
        assert!(e.contains("the packer sent rank 0's batch to rank 1"), "{e}");
        let mut r = RankReceiver::new(1, 2, 0, 2).unwrap();
        let e = r.on_message(b"garbage").unwrap_err().to_string();
        assert!(e.contains("not an encoded stowplan rank batch"), "{e}");
        assert!(r.error().is_some());
        let mut damaged = bytes(1, 0);
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        let mut r = RankReceiver::new(1, 2, 0, 2).unwrap();
        let e = r.on_message(&damaged).unwrap_err().to_string();
        assert!(e.contains("damaged rank batch"), "{e}");
        assert!(Refusal::of_hello(5, 2, 2).unwrap().message.contains("rank 5 is out of range: ranks are 0..2"));
        assert_eq!(Refusal::of_hello(1, 2, 2), None);
    }
}
