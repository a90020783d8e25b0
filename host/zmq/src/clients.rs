use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use stowplan::serve::protocol::{BatchSender, Control, MessageKey, RankReceiver, Receipt, ToRank};
use stowplan::{
    Error, TrainingBatch,
    packer::{RankBatch, RunConfig},
};

use crate::curve::CurveClient;
use crate::support::zmq_error;

/// How often a waiting thread looks at its stop flag (and a sender at its receipts
/// during a flush).
const TICK: Duration = Duration::from_millis(100);

/// Milliseconds for `zmq_poll`, rounded up (a non-zero wait never becomes a busy poll).
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(i64::MAX)
}

/// Options of a [`ZmqRankClient`].
#[derive(Clone, Debug)]
pub struct ZmqRankOptions {
    /// The first step the rank expects (default 0).
    pub start_step: u64,
    /// Steps received and acknowledged ahead of the one the trainer takes (default
    /// [`DEFAULT_PREFETCH`](stowplan::serve::protocol::rank::DEFAULT_PREFETCH), at least 1).
    pub prefetch: usize,
    /// CURVE keys when the packer runs with CURVE (default none: plain TCP).
    pub curve: Option<CurveClient>,
}

impl Default for ZmqRankOptions {
    /// From step 0, two steps ahead, without CURVE.
    fn default() -> Self {
        Self { start_step: 0, prefetch: stowplan::serve::protocol::rank::DEFAULT_PREFETCH, curve: None }
    }
}

/// `e` with `hint` added to its message when it is a timeout (what a client that hears
/// nothing from a CURVE packer should check).
fn with_hint(e: Error, curve: Option<&CurveClient>) -> Error {
    match (e, curve) {
        (Error::Timeout(m), Some(c)) => Error::Timeout(format!("{m}{}", c.timeout_hint())),
        (e, _) => e,
    }
}

struct RankState {
    core: RankReceiver,
    closed: bool,
    /// A socket failure of the background thread.
    io_error: Option<Error>,
}

struct Shared {
    state: Mutex<RankState>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, RankState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A trainer rank over ZeroMQ: connects a DEALER to the packer's ranks endpoint
/// (`stowplan serve --zmq-ranks`) as rank `rank` of `dp` and returns its steps in order
/// (see the [module docs](super) and [`RankReceiver`]).
pub struct ZmqRankClient {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
    rank: u32,
    curve: Option<CurveClient>,
}

impl std::fmt::Debug for ZmqRankClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqRankClient").field("endpoint", &self.endpoint).field("rank", &self.rank).finish()
    }
}

impl ZmqRankClient {
    /// Connects rank `rank` of `dp` to `endpoint` and starts the background thread (its
    /// first hello goes at once).
    ///
    /// Errors: `invalid-argument` for `dp` 0, `rank` ≥ `dp`, `prefetch` 0 or an
    /// endpoint ZeroMQ cannot connect to (naming it); `io` when the socket or the thread
    /// cannot be made.
    pub fn connect(endpoint: &str, rank: u32, dp: u32, options: ZmqRankOptions) -> Result<Self, Error> {
        let core = RankReceiver::new(rank, dp, options.start_step, options.prefetch)?;
        let context = zmq::Context::new();
        let socket = context.socket(zmq::DEALER).map_err(|e| zmq_error("a rank socket", e))?;
        socket.set_linger(0).map_err(|e| zmq_error("a rank socket", e))?;
        // Hellos and acks go only to a live connection and never block: while the packer
        // is away nothing piles up, and after it is back the next hello introduces the rank.
        socket.set_immediate(true).map_err(|e| zmq_error("a rank socket", e))?;
        if let Some(c) = &options.curve {
            c.apply(&socket, "a rank socket")?;
        }
        socket
            .connect(endpoint)
            .map_err(|e| Error::InvalidArgument(format!("endpoint: cannot connect to {endpoint:?}: {e}")))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(RankState { core, closed: false, io_error: None }),
            changed: Condvar::new(),
        });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("stowplan-zmq-rank{rank}"))
            .spawn(move || {
                let result = run_rank(&socket, &theirs);
                // The socket before its context (closing a context waits for its sockets).
                drop(socket);
                drop(context);
                if let Err(e) = result {
                    theirs.lock().io_error = Some(e);
                    theirs.changed.notify_all();
                }
            })
            .map_err(|e| Error::Io(format!("starting rank {rank}'s receiver thread: {e}")))?;
        Ok(Self { shared, thread: Some(thread), endpoint: endpoint.to_owned(), rank, curve: options.curve })
    }

    /// The endpoint connected to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The step [`ZmqRankClient::receive`] returns next.
    pub fn next_step(&self) -> u64 {
        self.shared.lock().core.next_step()
    }

    /// Waits up to `timeout` for the next step and returns it (a step that arrived is
    /// returned even after a failure).
    ///
    /// Errors: `timeout` naming the rank, the step, the endpoint and the steps held back;
    /// `invalid-argument` when the packer refused the rank (with its reason), sent another
    /// rank's batch or undecodable bytes; `io` when the socket failed.
    pub fn receive(&self, timeout: Duration) -> Result<RankBatch, Error> {
        let deadline = Instant::now().checked_add(timeout);
        let mut st = self.shared.lock();
        loop {
            if let Some(b) = st.core.next_batch() {
                // Room for one more: the thread may read again.
                self.shared.changed.notify_all();
                return Ok(b);
            }
            if let Some(e) = st.core.error().or(st.io_error.as_ref()) {
                return Err(e.clone());
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return Err(with_hint(st.core.timeout_error(&self.endpoint, timeout), self.curve.as_ref()));
            }
            let wait = left.map_or(Duration::from_millis(500), |l| l.min(Duration::from_millis(500)));
            st = self.shared.changed.wait_timeout(st, wait).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

impl Drop for ZmqRankClient {
    /// Stops the background thread and closes the socket.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sends without blocking; a message that cannot leave now (no live connection) is
/// dropped: hellos repeat, and a lost ack is covered by the packer's resend on the next
/// hello from a new connection.
fn send_quietly(socket: &zmq::Socket, bytes: &[u8]) -> Result<(), Error> {
    match socket.send(bytes, zmq::DONTWAIT) {
        Ok(()) | Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => Ok(()),
        Err(e) => Err(zmq_error("sending to the packer", e)),
    }
}

/// The background thread of a [`ZmqRankClient`]: until closed or failed, says hello when
/// due, reads while the receiver wants a message, acknowledges what it took.
fn run_rank(socket: &zmq::Socket, shared: &Shared) -> Result<(), Error> {
    loop {
        let (hello, wants, wait) = {
            let mut st = shared.lock();
            if st.closed || st.core.error().is_some() {
                return Ok(());
            }
            let now = Instant::now();
            let hello = st.core.poll_hello(now);
            (hello, st.core.wants_message(), st.core.hello_due_in(now).min(TICK))
        };
        if let Some(h) = hello {
            send_quietly(socket, &h)?;
        }
        if !wants {
            // Full: wait for the trainer to take a step (or the next hello, or close).
            let st = shared.lock();
            if !st.closed && !st.core.wants_message() {
                drop(shared.changed.wait_timeout(st, wait).unwrap_or_else(PoisonError::into_inner));
            }
            continue;
        }
        match socket.poll(zmq::POLLIN, millis(wait)) {
            Ok(0) | Err(zmq::Error::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(zmq_error("polling the ranks socket", e)),
        }
        let bytes = match socket.recv_bytes(zmq::DONTWAIT) {
            Ok(b) => b,
            Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => continue,
            Err(e) => return Err(zmq_error("receiving from the packer", e)),
        };
        // Decoded outside the lock: the trainer can take a step meanwhile.
        let message = ToRank::decode(&bytes);
        let taken = {
            let mut st = shared.lock();
            let taken = st.core.take(message);
            shared.changed.notify_all();
            taken
        };
        match taken {
            Ok(r) => send_quietly(socket, &r.ack)?,
            // The receiver failed; `receive` reports it.
            Err(_) => return Ok(()),
        }
    }
}

/// Options of a [`ZmqBatchSender`].
#[derive(Clone, Debug)]
pub struct ZmqSenderOptions {
    /// A message without a receipt this long after it was sent is sent again (default
    /// [`DEFAULT_RESEND_AFTER`](stowplan::serve::protocol::sender::DEFAULT_RESEND_AFTER), not
    /// zero).
    pub resend_after: Duration,
    /// CURVE keys when the packer runs with CURVE (default none: plain TCP).
    pub curve: Option<CurveClient>,
    /// A batch whose encoding is larger is refused before it is sent (default
    /// [`MAX_MESSAGE_BYTES`](stowplan::serve::MAX_MESSAGE_BYTES), the packer's default cap).
    pub max_message_bytes: u64,
}

impl Default for ZmqSenderOptions {
    /// Resend after 30 s, without CURVE, the packer's default message cap.
    fn default() -> Self {
        Self {
            resend_after: stowplan::serve::protocol::sender::DEFAULT_RESEND_AFTER,
            curve: None,
            max_message_bytes: stowplan::serve::MAX_MESSAGE_BYTES,
        }
    }
}

/// An orchestrator over ZeroMQ: PUSHes training batches and run changes to the packer's
/// batches endpoint (`stowplan serve --zmq-batches`) and reads its receipts
/// (`--zmq-receipts`); every message is kept until a receipt names it and sent again when
/// the packer restarts or after `resend_after` (see [`BatchSender`]). Every call takes the
/// receipts that arrived and resends what is due; call [`ZmqBatchSender::poll`] now and
/// then when sending nothing, and [`ZmqBatchSender::flush`] to wait until the packer has
/// everything.
pub struct ZmqBatchSender {
    core: BatchSender,
    push: zmq::Socket,
    sub: zmq::Socket,
    // Dropped last: closing a context waits for its sockets.
    _context: zmq::Context,
    receipts_endpoint: String,
    curve: Option<CurveClient>,
}

impl std::fmt::Debug for ZmqBatchSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqBatchSender")
            .field("receipts", &self.receipts_endpoint)
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

/// Pushes one message; blocks while the socket's queue is full (the packer is away and
/// a thousand messages wait): the orchestrator slows down instead of losing messages.
fn push(socket: &zmq::Socket, bytes: &[u8]) -> Result<(), Error> {
    loop {
        match socket.send(bytes, 0) {
            Err(zmq::Error::EINTR) => continue,
            r => return r.map_err(|e| zmq_error("sending to the packer", e)),
        }
    }
}

impl ZmqBatchSender {
    /// Connects to the packer's `batches` and `receipts` endpoints.
    ///
    /// Errors: `invalid-argument` for a zero `resend_after` or an endpoint ZeroMQ cannot
    /// connect to (naming both); `io` when a socket cannot be made.
    pub fn connect(batches: &str, receipts: &str, options: ZmqSenderOptions) -> Result<Self, Error> {
        let mut core = BatchSender::new(options.resend_after)?;
        core.set_max_message_bytes(options.max_message_bytes)?;
        let context = zmq::Context::new();
        let push = context.socket(zmq::PUSH).map_err(|e| zmq_error("the batches socket", e))?;
        let sub = context.socket(zmq::SUB).map_err(|e| zmq_error("the receipts socket", e))?;
        // Messages still queued at close get a second to leave.
        push.set_linger(1000).map_err(|e| zmq_error("the batches socket", e))?;
        sub.set_linger(0).map_err(|e| zmq_error("the receipts socket", e))?;
        sub.set_subscribe(b"").map_err(|e| zmq_error("the receipts socket", e))?;
        if let Some(c) = &options.curve {
            c.apply(&push, "the batches socket")?;
            c.apply(&sub, "the receipts socket")?;
        }
        push.connect(batches).and_then(|()| sub.connect(receipts)).map_err(|e| {
            Error::InvalidArgument(format!("endpoint/receipts: cannot connect to {batches:?} / {receipts:?}: {e}"))
        })?;
        Ok(Self { core, push, sub, _context: context, receipts_endpoint: receipts.to_owned(), curve: options.curve })
    }

    /// Sends `batch`; returns the receipts that arrived meanwhile ([`ZmqBatchSender::poll`]).
    pub fn send(&mut self, batch: &TrainingBatch) -> Result<Vec<Receipt>, Error> {
        push(&self.push, self.core.batch(batch, Instant::now())?)?;
        self.poll(Duration::ZERO)
    }

    /// Asks the packer to add run `run` with `config` (a no-op if it exists); returns the
    /// receipts that arrived meanwhile.
    pub fn add_run(&mut self, run: u32, config: RunConfig) -> Result<Vec<Receipt>, Error> {
        self.control(Control::AddRun { run, config })
    }

    /// Asks the packer to remove run `run` (its pending samples are dropped and logged);
    /// returns the receipts that arrived meanwhile.
    pub fn remove_run(&mut self, run: u32) -> Result<Vec<Receipt>, Error> {
        self.control(Control::RemoveRun { run })
    }

    fn control(&mut self, control: Control) -> Result<Vec<Receipt>, Error> {
        push(&self.push, self.core.control(control, Instant::now())?)?;
        self.poll(Duration::ZERO)
    }

    /// Takes the receipts that arrived (waiting up to `timeout` for the first) and resends
    /// what is due (everything unacknowledged after a restart of the packer, a message
    /// after `resend_after` without a receipt, one sent before the packer was first heard
    /// from [`FIRST_CONTACT_GRACE`](stowplan::serve::protocol::sender::FIRST_CONTACT_GRACE)
    /// after that). Returns the receipts of messages this
    /// sender had not seen acknowledged yet.
    pub fn poll(&mut self, timeout: Duration) -> Result<Vec<Receipt>, Error> {
        let mut out = Vec::new();
        let mut wait = timeout;
        loop {
            match self.sub.poll(zmq::POLLIN, millis(wait)) {
                Ok(0) => break,
                Ok(_) => {}
                Err(zmq::Error::EINTR) => continue,
                Err(e) => return Err(zmq_error("polling the receipts socket", e)),
            }
            wait = Duration::ZERO;
            let bytes = match self.sub.recv_bytes(zmq::DONTWAIT) {
                Ok(b) => b,
                Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => continue,
                Err(e) => return Err(zmq_error("receiving receipts", e)),
            };
            // A damaged receipts message is skipped: failing here would drop the receipts
            // already taken from the core in this loop (the packer sends the next ones).
            match self.core.on_receipts(&bytes) {
                Ok(receipts) => out.extend(receipts),
                Err(e) => tracing::warn!(target: "stowplan::serve", "ignoring a damaged receipts message: {e}"),
            }
        }
        for p in self.core.due_resends(Instant::now()) {
            push(&self.push, p)?;
        }
        Ok(out)
    }

    /// Waits until every message sent is acknowledged (resending as
    /// [`ZmqBatchSender::poll`] does); returns the receipts taken. Errors: `timeout` after
    /// `timeout`, naming how many messages are unacknowledged and the first ones.
    pub fn flush(&mut self, timeout: Duration) -> Result<Vec<Receipt>, Error> {
        let deadline = Instant::now().checked_add(timeout);
        let mut out = self.poll(Duration::ZERO)?;
        while !self.core.is_flushed() {
            let left = deadline.map_or(TICK, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Err(with_hint(
                    self.core.flush_timeout_error(&self.receipts_endpoint, timeout),
                    self.curve.as_ref(),
                ));
            }
            out.extend(self.poll(left.min(TICK))?);
        }
        Ok(out)
    }

    /// The messages not acknowledged yet, oldest first.
    pub fn unacked(&self) -> Vec<MessageKey> {
        self.core.unacked().into_iter().cloned().collect()
    }

    /// The packer process last heard from (`None`: no receipt or heartbeat yet).
    pub fn incarnation(&self) -> Option<u64> {
        self.core.incarnation()
    }

    /// How many messages were sent again.
    pub fn resent(&self) -> u64 {
        self.core.resent()
    }
}

impl Drop for ZmqBatchSender {
    /// Closes the sockets (queued messages get a second to leave); logs a warning when
    /// messages were never acknowledged (call [`ZmqBatchSender::flush`] first to be sure
    /// the packer has everything).
    fn drop(&mut self) {
        if !self.core.is_flushed() {
            let first: Vec<String> = self.core.unacked().iter().take(3).map(|k| k.to_string()).collect();
            tracing::warn!(target: "stowplan::serve", unacked = self.core.unacked().len(), first = ?first, "ZmqBatchSender dropped with messages the packer never acknowledged; flush() first");
        }
    }
}
