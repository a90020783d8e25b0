//! The ZeroMQ transport of `stowplan serve` (libzmq through the `zmq` crate).
//!
//! Three sockets, all bound by the packer so that orchestrators and ranks on other hosts
//! connect to it over TCP: **batches** (PULL: training batches and control messages),
//! **receipts** (PUB: a [`Receipts`] with the packer's incarnation once messages are
//! durable, and an empty one every [`HEARTBEAT`]) and **ranks** (ROUTER: hellos and
//! acknowledgements in, [`RankBatch`]es and [`Refusal`]s out). The protocol is described in
//! [`super::protocol`]; this transport is its server side: the readiness barrier (every
//! rank said hello), [`Refusal::of_hello`], and each step's delivery as a
//! [`StepDelivery`] (resent to a rank whose hello comes from a new connection, delivered
//! once every rank acknowledged it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::protocol::delivery::StepDelivery;
use super::protocol::{HEARTBEAT, RankMessage, Receipt, Receipts, Refusal, ZmqEndpoints};
use super::{Incoming, Transport};
use crate::{Error, RankBatch};

/// At most this many batch messages are taken per receive (bounds the memory of a burst).
const RECEIVE_LIMIT: usize = 16;

fn zmq_error(what: &str, e: zmq::Error) -> Error {
    Error::Io(format!("zeromq: {what}: {e}"))
}

/// Waits up to `timeout` for one of `items`; a signal (EINTR, e.g. the SIGTERM that stops the
/// server) ends the wait early, as the caller checks its stop flag next.
fn wait_for(items: &mut [zmq::PollItem<'_>], timeout: Duration) -> Result<(), Error> {
    match zmq::poll(items, timeout.as_millis().max(1) as i64) {
        Ok(_) | Err(zmq::Error::EINTR) => Ok(()),
        Err(e) => Err(zmq_error("polling", e)),
    }
}

/// The ZeroMQ transport (see the module docs).
pub struct ZmqTransport {
    batches: zmq::Socket,
    receipts: zmq::Socket,
    ranks: zmq::Socket,
    // Dropped last: closing a context waits for its sockets.
    _context: zmq::Context,
    dp: u32,
    endpoints: ZmqEndpoints,
    incarnation: u64,
    /// Each rank's routing id, from its latest hello.
    peers: Vec<Option<Vec<u8>>>,
    ready: bool,
    last_published: Instant,
    last_waiting_log: Instant,
}

impl std::fmt::Debug for ZmqTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqTransport")
            .field("endpoints", &self.endpoints)
            .field("dp", &self.dp)
            .field("incarnation", &self.incarnation)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

/// Something a rank said, as the transport understood it.
enum FromRank {
    Hello(u32),
    Ack(u32, u64),
    Other,
}

impl ZmqTransport {
    /// Binds the three sockets for `dp` ranks.
    ///
    /// Errors: `invalid-argument` for `dp` 0; `io` naming the endpoint that cannot be bound
    /// (malformed, or the address is in use).
    pub fn bind(endpoints: &ZmqEndpoints, dp: u32) -> Result<Self, Error> {
        if dp == 0 {
            return Err(Error::InvalidArgument("dp must be at least 1 (got 0)".into()));
        }
        let context = zmq::Context::new();
        let open = |kind: zmq::SocketType, endpoint: &str, what: &str| -> Result<(zmq::Socket, String), Error> {
            let s = context.socket(kind).map_err(|e| zmq_error(what, e))?;
            // Receipts and a last delivery still queued at exit get a second to leave.
            s.set_linger(1000).map_err(|e| zmq_error(what, e))?;
            if kind == zmq::PULL {
                // A burst of batches waits in the orchestrators' queues (their sends block),
                // not in the packer's memory.
                s.set_rcvhwm(RECEIVE_LIMIT as i32).map_err(|e| zmq_error(what, e))?;
            }
            s.bind(endpoint)
                .map_err(|e| Error::Io(format!("zeromq: binding the {what} socket to {endpoint:?}: {e}")))?;
            let actual = s
                .get_last_endpoint()
                .map_err(|e| zmq_error(what, e))?
                .unwrap_or_else(|raw| String::from_utf8_lossy(&raw).into_owned());
            Ok((s, actual))
        };
        let (batches, b) = open(zmq::PULL, &endpoints.batches, "batches")?;
        let (receipts, r) = open(zmq::PUB, &endpoints.receipts, "receipts")?;
        let (ranks, k) = open(zmq::ROUTER, &endpoints.ranks, "ranks")?;
        // Sending to a rank that is not connected fails (and is retried on its next hello)
        // instead of being dropped silently.
        ranks.set_router_mandatory(true).map_err(|e| zmq_error("ranks", e))?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let incarnation = (now.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32);
        Ok(Self {
            batches,
            receipts,
            ranks,
            _context: context,
            dp,
            endpoints: ZmqEndpoints { batches: b, receipts: r, ranks: k },
            incarnation,
            peers: vec![None; dp as usize],
            ready: false,
            // The first receive publishes a heartbeat at once.
            last_published: Instant::now().checked_sub(HEARTBEAT).unwrap_or_else(Instant::now),
            last_waiting_log: Instant::now(),
        })
    }

    /// The endpoints actually bound (a `*` port resolved).
    pub fn endpoints(&self) -> &ZmqEndpoints {
        &self.endpoints
    }

    /// This process's incarnation (see [`Receipts::incarnation`]).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    fn publish(&mut self, receipts: Vec<Receipt>) -> Result<(), Error> {
        let bytes = Receipts { incarnation: self.incarnation, receipts }.encode()?;
        // PUB never blocks: with no subscriber the message is dropped (the sender's timeout
        // or the next incarnation it sees covers that).
        self.receipts.send(bytes, zmq::DONTWAIT).map_err(|e| zmq_error("publishing receipts", e))?;
        self.last_published = Instant::now();
        Ok(())
    }

    fn heartbeat(&mut self) -> Result<(), Error> {
        if self.last_published.elapsed() >= HEARTBEAT {
            self.publish(Vec::new())?;
        }
        Ok(())
    }

    /// Takes one message from the ranks socket, if any, and acts on hellos.
    fn take_from_ranks(&mut self) -> Result<Option<FromRank>, Error> {
        let parts = match self.ranks.recv_multipart(zmq::DONTWAIT) {
            Ok(p) => p,
            Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(e) => return Err(zmq_error("receiving from a rank", e)),
        };
        let [id, payload] = <[Vec<u8>; 2]>::try_from(parts).unwrap_or_default();
        match RankMessage::decode(&payload) {
            Ok(RankMessage::Hello { rank, dp, next_step }) => {
                if let Some(refusal) = Refusal::of_hello(rank, dp, self.dp) {
                    tracing::error!(target: "stowplan::serve", rank, dp, "refused a rank: {}", refusal.message);
                    let refusal = refusal.encode()?;
                    // The peer may already be gone; nothing more to do then.
                    let _ = self.ranks.send_multipart([id, refusal], zmq::DONTWAIT);
                    return Ok(Some(FromRank::Other));
                }
                let slot = &mut self.peers[rank as usize];
                if slot.as_deref() != Some(&id[..]) {
                    tracing::info!(target: "stowplan::serve", rank, next_step, "rank connected");
                    *slot = Some(id);
                }
                Ok(Some(FromRank::Hello(rank)))
            }
            Ok(RankMessage::Ack { rank, step }) => Ok(Some(FromRank::Ack(rank, step))),
            Err(e) => {
                tracing::warn!(target: "stowplan::serve", error = %e, "undecodable message from a rank ignored");
                Ok(Some(FromRank::Other))
            }
        }
    }

    /// Sends `bytes` to rank `r`: the routing id they went to, `None` when the rank is not
    /// connected (it gets them on its next hello).
    fn send_to(&mut self, r: usize, bytes: Vec<u8>) -> Result<Option<Vec<u8>>, Error> {
        let Some(id) = self.peers[r].clone() else { return Ok(None) };
        match self.ranks.send_multipart([id.clone(), bytes], zmq::DONTWAIT) {
            Ok(()) => Ok(Some(id)),
            Err(zmq::Error::EHOSTUNREACH | zmq::Error::EAGAIN) => {
                self.peers[r] = None;
                Ok(None)
            }
            Err(e) => Err(zmq_error(&format!("sending to rank {r}"), e)),
        }
    }

    fn missing(&self) -> Vec<usize> {
        (0..self.dp as usize).filter(|&r| self.peers[r].is_none()).collect()
    }
}

impl Transport for ZmqTransport {
    fn name(&self) -> &'static str {
        "zmq"
    }

    fn ready(&mut self) -> Result<bool, Error> {
        if !self.ready {
            while self.take_from_ranks()?.is_some() {}
            self.ready = self.peers.iter().all(Option::is_some);
            if !self.ready && self.last_waiting_log.elapsed() >= Duration::from_secs(10) {
                self.last_waiting_log = Instant::now();
                tracing::info!(target: "stowplan::serve", missing = ?self.missing(), endpoint = %self.endpoints.ranks, "waiting for ranks to connect");
            }
        }
        Ok(self.ready)
    }

    fn receive(&mut self, timeout: Duration) -> Result<Vec<Incoming>, Error> {
        self.heartbeat()?;
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            while out.len() < RECEIVE_LIMIT {
                match self.batches.recv_bytes(zmq::DONTWAIT) {
                    Ok(bytes) => out.push(Incoming { bytes, path: None }),
                    Err(zmq::Error::EAGAIN) => break,
                    Err(e) => return Err(zmq_error("receiving a batch", e)),
                }
            }
            while self.take_from_ranks()?.is_some() {}
            let now = Instant::now();
            if !out.is_empty() || now >= deadline {
                return Ok(out);
            }
            let mut items = [self.batches.as_poll_item(zmq::POLLIN), self.ranks.as_poll_item(zmq::POLLIN)];
            wait_for(&mut items, (deadline - now).min(HEARTBEAT))?;
            self.heartbeat()?;
        }
    }

    fn acknowledge(&mut self, receipts: Vec<Receipt>) -> Result<(), Error> {
        if receipts.is_empty() { Ok(()) } else { self.publish(receipts) }
    }

    fn deliver(&mut self, step: u64, ranks: &[RankBatch], stop: &AtomicBool) -> Result<bool, Error> {
        let dp = self.dp as usize;
        if ranks.len() != dp {
            return Err(Error::InvalidArgument(format!("ranks: {} rank batches for dp {dp}", ranks.len())));
        }
        let encoded = super::per_rank(ranks, |_, b| b.encode())?;
        // Which ranks acknowledged, and the routing id each copy went to.
        let mut delivery = StepDelivery::new(step, dp);
        for (r, bytes) in encoded.into_iter().enumerate() {
            let to = self.send_to(r, bytes)?;
            delivery.sent(r, to);
        }
        let started = Instant::now();
        let mut last_log = started;
        while !delivery.is_complete() {
            if stop.load(Ordering::SeqCst) {
                tracing::warn!(target: "stowplan::serve", step, "stopped before every rank acknowledged the step: it stays in flight and is delivered again on restart");
                return Ok(false);
            }
            self.heartbeat()?;
            wait_for(&mut [self.ranks.as_poll_item(zmq::POLLIN)], Duration::from_millis(100))?;
            while let Some(m) = self.take_from_ranks()? {
                match m {
                    FromRank::Hello(r) if delivery.needs_resend(r as usize, self.peers[r as usize].as_ref()) => {
                        let r = r as usize;
                        let to = self.send_to(r, ranks[r].encode()?)?;
                        delivery.sent(r, to);
                    }
                    FromRank::Ack(r, s) => {
                        delivery.on_ack(r, s);
                    }
                    _ => {}
                }
            }
            if last_log.elapsed() >= Duration::from_secs(10) {
                last_log = Instant::now();
                tracing::warn!(target: "stowplan::serve", step, waiting = ?delivery.waiting(), not_connected = ?delivery.unsent(), seconds = started.elapsed().as_secs(), "waiting for ranks to acknowledge the step");
            }
        }
        Ok(true)
    }
}
