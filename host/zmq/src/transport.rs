//! The ZeroMQ transport of `stowplan serve`, its server side (libzmq through the `zmq` crate).
//!
//! Three sockets, all bound by the packer so that orchestrators and ranks on other hosts
//! connect to it over TCP: **batches** (PULL: training batches and control messages),
//! **receipts** (PUB: a [`Receipts`] with the packer's incarnation once messages are
//! durable, and an empty one every [`HEARTBEAT`]) and **ranks** (ROUTER: hellos and
//! acknowledgements in, [`RankBatch`]es and [`Refusal`]s out). The protocol is described in
//! [`protocol`](stowplan::serve::protocol); this transport is its server side: the readiness barrier (every
//! rank said hello), which connection serves each rank ([`RankSlots`]: one connection per
//! rank, acknowledgements only from it, a second connection refused while the first is
//! alive), and each step's delivery as a [`StepDelivery`] (resent to a rank served by a new
//! connection, delivered once every rank acknowledged it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use stowplan::serve::protocol::delivery::StepDelivery;
use stowplan::serve::protocol::{
    Delivered, HEARTBEAT, OnHello, RANK_LEASE, RankMessage, RankSlots, Receipt, Receipts, Refusal, SlotEvent,
    ZmqEndpoints,
};
use stowplan::serve::{Incoming, MAX_MESSAGE_BYTES, Transport, per_rank};
use stowplan::{Error, packer::RankBatch};

use crate::curve::{CurveServer, ZapHandler, require_curve};
use crate::support::{Throttled, zmq_error};

/// At most this many batch messages are taken per receive (bounds the memory of a burst).
const RECEIVE_LIMIT: usize = 16;

/// At most this many messages are taken from the ranks socket at a time, so that a flood of
/// hellos or acknowledgements cannot keep the server from its stop flag and heartbeats.
const RANK_DRAIN_LIMIT: usize = 1024;

/// The largest message a rank may send, in bytes (a hello or an acknowledgement is a few
/// dozen); libzmq drops the connection of a peer that sends more.
const RANK_MESSAGE_LIMIT: i64 = 4096;

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
    /// The CURVE clients' gatekeeper (with `curve`); stopped before the context closes.
    zap: Option<ZapHandler>,
    // Dropped last: closing a context waits for its sockets.
    _context: zmq::Context,
    dp: u32,
    endpoints: ZmqEndpoints,
    incarnation: u64,
    /// Which routing id holds each rank.
    slots: RankSlots<Vec<u8>>,
    /// Acknowledgements ignored (see [`ZmqTransport::ignored_acks`]).
    ignored_acks: Throttled,
    ready: bool,
    /// The furthest any rank's hello said it had got (see [`Transport::delivered`]).
    furthest: Option<Delivered>,
    /// Take no batch before the first hello ([`Transport::wait_for_receivers`]).
    await_hello: bool,
    /// The batches socket's cap (`ZMQ_MAXMSGSIZE`), also the budget of one receive.
    max_message_bytes: u64,
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

/// Something the ranks socket brought that a delivery acts on.
enum FromRank {
    /// A hello of rank `r`, lacking step `next_step`, from the connection holding it.
    Hello(u32, u64),
    /// An acknowledgement of a step by rank `r`, from the connection holding it.
    Ack(u32, u64),
    /// Rank `r`'s slot was taken over by a new connection.
    TookOver(u32),
}

/// How often the transport logs that it ignored acknowledgements from connections that do
/// not hold the rank they name (each is counted; the log line says how many).
const IGNORED_LOG_EVERY: Duration = Duration::from_secs(10);

impl ZmqTransport {
    /// Binds the three sockets for `dp` ranks; with `curve`, every socket is a CURVE server
    /// with its key pair and admits only the client keys it lists ([`curve`](crate::curve)).
    ///
    /// Errors: `invalid-argument` for `dp` 0, or `curve` in a build without CURVE
    /// ([`require_curve`](crate::curve::require_curve)); `io` naming the endpoint that cannot
    /// be bound (malformed, or the address is in use).
    pub fn bind(endpoints: &ZmqEndpoints, dp: u32, curve: Option<&CurveServer>) -> Result<Self, Error> {
        Self::bind_capped(endpoints, dp, curve, MAX_MESSAGE_BYTES)
    }

    /// [`ZmqTransport::bind`] with a cap on a message's size on the batches socket other than
    /// [`MAX_MESSAGE_BYTES`]: libzmq drops the connection of a sender whose message is larger
    /// before the packer holds it in memory (`ZMQ_MAXMSGSIZE`); senders check the cap first
    /// and name it. Errors: those of `bind`; `invalid-argument` for a cap of 0 or over 2^63.
    pub fn bind_capped(
        endpoints: &ZmqEndpoints,
        dp: u32,
        curve: Option<&CurveServer>,
        max_message_bytes: u64,
    ) -> Result<Self, Error> {
        let max_message = i64::try_from(max_message_bytes).ok().filter(|&m| m > 0).ok_or_else(|| {
            Error::InvalidArgument(format!("max_message_bytes must be in 1..=2^63-1 (got {max_message_bytes})"))
        })?;
        if dp == 0 {
            return Err(Error::InvalidArgument("dp must be at least 1 (got 0)".into()));
        }
        if curve.is_some() {
            require_curve()?;
        }
        let context = zmq::Context::new();
        // The gatekeeper listens before any CURVE socket can take a connection.
        let zap = curve.map(|c| ZapHandler::start(&context, c.clients.clone())).transpose()?;
        // `max_message`: a larger message drops its sender's connection instead of being
        // buffered; set before bind, since libzmq copies a socket's options into its listener.
        let open = |kind: zmq::SocketType,
                    endpoint: &str,
                    what: &str,
                    max_message: i64|
         -> Result<(zmq::Socket, String), Error> {
            let mut s = context.socket(kind).map_err(|e| zmq_error(what, e))?;
            s.set_maxmsgsize(max_message).map_err(|e| zmq_error(what, e))?;
            if let Some(c) = curve {
                c.apply(&mut s, what)?;
            }
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
        let (batches, b) = open(zmq::PULL, &endpoints.batches, "batches", max_message)?;
        // Subscribers send only subscriptions (a few bytes).
        let (receipts, r) = open(zmq::PUB, &endpoints.receipts, "receipts", RANK_MESSAGE_LIMIT)?;
        // Ranks say a few dozen bytes at a time.
        let (ranks, k) = open(zmq::ROUTER, &endpoints.ranks, "ranks", RANK_MESSAGE_LIMIT)?;
        // Sending to a rank that is not connected fails (and is retried on its next hello)
        // instead of being dropped silently.
        ranks.set_router_mandatory(true).map_err(|e| zmq_error("ranks", e))?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let incarnation = (now.as_nanos() as u64) ^ (u64::from(std::process::id()) << 32);
        Ok(Self {
            batches,
            receipts,
            ranks,
            zap,
            _context: context,
            dp,
            endpoints: ZmqEndpoints { batches: b, receipts: r, ranks: k },
            incarnation,
            slots: RankSlots::new(dp, RANK_LEASE),
            ignored_acks: Throttled::new(IGNORED_LOG_EVERY),
            ready: false,
            furthest: None,
            await_hello: false,
            max_message_bytes,
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

    /// Acknowledgements ignored so far because they came from a connection that does not
    /// hold the rank they name (a forged or stale acknowledgement).
    pub fn ignored_acks(&self) -> u64 {
        self.ignored_acks.total()
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

    /// Sends `refusal` to `connection` (which may be gone already: nothing more to do then).
    fn refuse(&mut self, connection: Vec<u8>, refusal: &Refusal) -> Result<(), Error> {
        let _ = self.ranks.send_multipart([connection, refusal.encode()?], zmq::DONTWAIT);
        Ok(())
    }

    /// Takes one message from the ranks socket, if any: the routing id, the payload and the
    /// peer's address (for logs). `Ok(None)`: nothing waiting.
    fn recv_rank_message(&self) -> Result<Option<(Vec<u8>, Vec<u8>, String)>, Error> {
        let recv = |flags| self.ranks.recv_msg(flags).map_err(|e| zmq_error("receiving from a rank", e));
        let id = match self.ranks.recv_msg(zmq::DONTWAIT) {
            Ok(m) => m,
            Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(e) => return Err(zmq_error("receiving from a rank", e)),
        };
        if !id.get_more() {
            return Ok(Some((id.to_vec(), Vec::new(), String::new())));
        }
        // The other frames of a multipart message arrive with the first.
        let mut payload = recv(0)?;
        let mut more = payload.get_more();
        while more {
            // A DEALER sends one frame; extra frames make the message undecodable.
            more = recv(0)?.get_more();
            payload = zmq::Message::new();
        }
        let peer = payload.gets("Peer-Address").unwrap_or("unknown address").to_owned();
        Ok(Some((id.to_vec(), payload.to_vec(), peer)))
    }

    /// Takes the messages waiting on the ranks socket (at most [`RANK_DRAIN_LIMIT`]), applies the slot rules
    /// ([`RankSlots`]), answers refusals and returns what a delivery acts on.
    fn poll_ranks(&mut self) -> Result<Vec<FromRank>, Error> {
        if let Some(zap) = &self.zap {
            zap.check()?;
        }
        let mut out = Vec::new();
        let mut taken = 0;
        while taken < RANK_DRAIN_LIMIT
            && let Some((id, payload, peer)) = self.recv_rank_message()?
        {
            taken += 1;
            let now = Instant::now();
            match RankMessage::decode(&payload) {
                Ok(RankMessage::Hello { rank, dp, next_step }) => match self.slots.on_hello(rank, dp, &id, now) {
                    OnHello::Holds { new } => {
                        if new {
                            tracing::info!(target: "stowplan::serve", rank, next_step, peer = %peer, "rank connected");
                        }
                        let seen = Delivered {
                            next_step,
                            evidence: format!("rank {rank} ({peer}) asks for step {next_step}"),
                        };
                        self.furthest = Delivered::max(self.furthest.take(), Some(seen));
                        out.push(FromRank::Hello(rank, next_step));
                    }
                    OnHello::Waiting => {
                        tracing::debug!(target: "stowplan::serve", rank, peer = %peer, "a second connection for a held rank waits");
                    }
                    OnHello::Refused(refusal) => {
                        tracing::error!(target: "stowplan::serve", rank, dp, peer = %peer, "refused a rank: {}", refusal.message);
                        self.refuse(id, &refusal)?;
                    }
                },
                Ok(RankMessage::Ack { rank, step }) => {
                    if self.slots.on_ack(rank, &id, now) {
                        out.push(FromRank::Ack(rank, step));
                    } else if let Some(since) = self.ignored_acks.note() {
                        tracing::warn!(target: "stowplan::serve", ignored = since, total = self.ignored_acks.total(), peer = %peer,
                            "ignored acknowledgements from connections that do not hold the rank they name (forged, or from a replaced connection)");
                    }
                }
                Err(e) => {
                    tracing::warn!(target: "stowplan::serve", error = %e, peer = %peer, "undecodable message from a rank ignored");
                }
            }
        }
        for event in self.slots.tick(Instant::now()) {
            match event {
                SlotEvent::TookOver { rank, previous, connection: _ } => {
                    match previous {
                        Some((_, silent)) => {
                            tracing::warn!(target: "stowplan::serve", rank, silent_ms = silent.as_millis() as u64,
                            "rank {rank} is now served by a new connection (the old one fell silent): the step in flight goes to the new one, and the old one is refused if it comes back")
                        }
                        None => {
                            tracing::info!(target: "stowplan::serve", rank, "rank {rank} reconnected (its old connection is gone)")
                        }
                    }
                    out.push(FromRank::TookOver(rank));
                }
                SlotEvent::Refused { rank, connection, refusal } => {
                    tracing::error!(target: "stowplan::serve", rank, "refused a second connection for a rank: {}", refusal.message);
                    self.refuse(connection, &refusal)?;
                }
            }
        }
        Ok(out)
    }

    /// Sends `bytes` to rank `r`: the routing id they went to, `None` when the rank is not
    /// connected (it gets them once a connection holds its slot again).
    fn send_to(&mut self, r: usize, bytes: Vec<u8>) -> Result<Option<Vec<u8>>, Error> {
        let Some(id) = self.slots.holder(r as u32).cloned() else { return Ok(None) };
        match self.ranks.send_multipart([id.clone(), bytes], zmq::DONTWAIT) {
            Ok(()) => Ok(Some(id)),
            Err(zmq::Error::EHOSTUNREACH | zmq::Error::EAGAIN) => {
                self.slots.disconnected(r as u32, &id);
                Ok(None)
            }
            Err(e) => Err(zmq_error(&format!("sending to rank {r}"), e)),
        }
    }
}

impl Transport for ZmqTransport {
    fn name(&self) -> &'static str {
        "zmq"
    }

    fn ready(&mut self) -> Result<bool, Error> {
        if !self.ready {
            self.poll_ranks()?;
            self.ready = self.slots.all_held();
            if !self.ready && self.last_waiting_log.elapsed() >= Duration::from_secs(10) {
                self.last_waiting_log = Instant::now();
                tracing::info!(target: "stowplan::serve", missing = ?self.slots.missing(), endpoint = %self.endpoints.ranks, "waiting for ranks to connect");
            }
        }
        Ok(self.ready)
    }

    fn receive(&mut self, timeout: Duration) -> Result<Vec<Incoming>, Error> {
        self.heartbeat()?;
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            // Ranks first: a hello proving the packer behind is seen before any batch is taken.
            self.poll_ranks()?;
            let taking = !self.await_hello || self.furthest.is_some();
            // At most about two messages' worth held at once (each is capped at bind).
            let mut held = 0u64;
            while taking && out.len() < RECEIVE_LIMIT && held < self.max_message_bytes {
                match self.batches.recv_bytes(zmq::DONTWAIT) {
                    Ok(bytes) => {
                        held += bytes.len() as u64;
                        out.push(Incoming { bytes, path: None, oversized: None })
                    }
                    Err(zmq::Error::EAGAIN) => break,
                    Err(e) => return Err(zmq_error("receiving a batch", e)),
                }
            }
            let now = Instant::now();
            if !out.is_empty() || now >= deadline {
                return Ok(out);
            }
            let wait = (deadline - now).min(HEARTBEAT);
            if taking {
                let mut items = [self.batches.as_poll_item(zmq::POLLIN), self.ranks.as_poll_item(zmq::POLLIN)];
                wait_for(&mut items, wait)?;
            } else {
                wait_for(&mut [self.ranks.as_poll_item(zmq::POLLIN)], wait)?;
            }
            self.heartbeat()?;
        }
    }

    fn acknowledge(&mut self, receipts: Vec<Receipt>) -> Result<(), Error> {
        if receipts.is_empty() { Ok(()) } else { self.publish(receipts) }
    }

    fn delivered(&mut self) -> Result<Option<Delivered>, Error> {
        Ok(self.furthest.clone())
    }

    fn wait_for_receivers(&mut self) {
        self.await_hello = true;
    }

    fn deliver(&mut self, step: u64, ranks: &[RankBatch], stop: &AtomicBool) -> Result<bool, Error> {
        let dp = self.dp as usize;
        if ranks.len() != dp {
            return Err(Error::InvalidArgument(format!("ranks: {} rank batches for dp {dp}", ranks.len())));
        }
        let encoded = per_rank(ranks, |_, b| b.encode())?;
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
            for m in self.poll_ranks()? {
                match m {
                    FromRank::Hello(r, next_step) if let Some(refusal) = Refusal::of_late_rank(r, next_step, step) => {
                        tracing::error!(target: "stowplan::serve", rank = r, next_step, step, "refused a rank: {}", refusal.message);
                        if let Some(id) = self.slots.holder(r).cloned() {
                            self.refuse(id.clone(), &refusal)?;
                            // Free the slot: a trainer restarted right can take it at once.
                            self.slots.disconnected(r, &id);
                            delivery.reassigned(r as usize);
                        }
                    }
                    FromRank::Hello(r, _) if delivery.needs_resend(r as usize, self.slots.holder(r)) => {
                        let r = r as usize;
                        let to = self.send_to(r, ranks[r].encode()?)?;
                        delivery.sent(r, to);
                    }
                    FromRank::TookOver(r) => {
                        let r = r as usize;
                        delivery.reassigned(r);
                        let to = self.send_to(r, ranks[r].encode()?)?;
                        delivery.sent(r, to);
                    }
                    FromRank::Ack(r, s) => {
                        delivery.on_ack(r, s);
                    }
                    FromRank::Hello(..) => {}
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
