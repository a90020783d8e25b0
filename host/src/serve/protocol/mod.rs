//! The packer's protocols without any I/O: the messages (what orchestrators send besides
//! training batches, [`Control`]; what trainer ranks say over ZeroMQ, [`RankMessage`]; what
//! the packer answers, [`Receipts`] and [`Refusal`]; the ZeroMQ endpoint defaults), and the
//! rules of each side as state machines that SDKs drive:
//!
//! - [`rank::RankReceiver`]: a trainer rank over ZeroMQ (hello cadence, acknowledgements,
//!   steps in order, early steps held back, copies dropped, a refusal reported);
//! - [`sender::BatchSender`]: an orchestrator over ZeroMQ (every message kept until a receipt
//!   names it, resent on a new incarnation or after a timeout, flush);
//! - [`files`]: the filesystem transport's names and a rank's acknowledgement rule
//!   ([`files::FileRankReceiver`]);
//! - [`delivery::StepDelivery`]: the packer delivering one step to its ranks, and
//!   [`slots::RankSlots`]: which connection serves each rank (the server's side of the rank
//!   protocol: hellos, contenders, acknowledgements).
//!
//! No socket, no file and no clock is touched here: the caller moves the bytes, does the
//! file operations a core asks for and passes the time (`now: Instant`), so the server, the
//! Rust clients ([`super::client`]) and every SDK (the Python one through the native module)
//! follow one implementation of the protocol, with one set of wire formats ([`crate::wire`]).
//!
//! The ZeroMQ protocol (see `zmq.rs` for the transport that speaks it):
//! - **batches** (PULL): orchestrators PUSH encoded [`TrainingBatch`](crate::TrainingBatch)es
//!   and [`ControlMessage`]s, one message each, in any order.
//! - **receipts** (PUB): once a message is durable (spooled and checkpointed) the packer
//!   publishes a [`Receipts`] naming it; every message also carries the packer's
//!   *incarnation* (a number new at every start), and one is published every [`HEARTBEAT`]
//!   even when there is nothing to acknowledge. A sender keeps what it sent until a receipt
//!   names it and sends everything unacknowledged again when the incarnation changes (a
//!   restart: messages in flight died with the old process) or after a timeout; the packer
//!   recognises repeats as duplicates (a batch by its `(run, step)`, a control message by its
//!   id), so nothing is lost and nothing is taken or applied twice.
//! - **ranks** (ROUTER): each trainer rank connects a DEALER and says [`RankMessage::Hello`]
//!   (rank, data-parallel size, the step it expects), again every [`HEARTBEAT`]. No step is
//!   delivered before every rank said hello (the readiness barrier). A step is sent to each
//!   rank as its encoded [`RankBatch`](crate::packer::RankBatch); the rank answers
//!   [`RankMessage::Ack`] once it has decoded it, and the step counts as delivered when every
//!   rank acknowledged it; a rank asking for an earlier step (its hello's `next_step`) is
//!   refused ([`Refusal::of_late_rank`]). A rank that reconnects (its new connection took the slot over, see
//!   below) gets the step in flight again; a rank that already had a step acknowledges and drops the
//!   copy, and holds back steps that arrive ahead of the one it expects. A hello with the
//!   wrong data-parallel size or rank gets a [`Refusal`] naming the mismatch
//!   ([`Refusal::of_hello`]). One connection holds a rank's slot: a second connection saying
//!   hello as the same rank waits, takes the slot over once the holder has been silent for
//!   [`RANK_LEASE`] (and gets the step in flight), or is refused when the holder stays alive;
//!   acknowledgements count only from the holder ([`slots`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::packer::RunConfig;
use crate::{Error, wire};

pub mod delivery;
pub mod files;
pub mod rank;
pub mod sender;
pub mod slots;

pub use delivery::StepDelivery;
pub use files::{Cleanup, FileRankReceiver, batch_file_name};
pub use rank::{Arrival, RankReceiver, Received, ToRank};
pub use sender::{BatchSender, MessageKey};
pub use slots::{OnHello, RANK_LEASE, RankSlots, SlotEvent};

/// A change to the packer's runs, sent by the orchestrator beside its batches.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// Adds a run (an existing run with the same configuration is left as is).
    AddRun {
        /// Run index.
        run: u32,
        /// Its configuration.
        config: RunConfig,
    },
    /// Removes a run and drops its pending samples (counted in the log).
    RemoveRun {
        /// Run index.
        run: u32,
    },
}

/// A [`Control`] as sent: the change and an id the sender gives it, by which the packer
/// recognises the message when it comes again (a sender resends what has no receipt yet; a
/// `RemoveRun` applied twice would drop the samples of a run added in between).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlMessage {
    /// Unique per message (random: [`ControlMessage::new`]).
    pub id: u64,
    /// The change.
    pub control: Control,
}

impl ControlMessage {
    /// `control` with a new random id.
    pub fn new(control: Control) -> Self {
        Self { id: fresh_id(), control }
    }

    /// Encodes in the [`wire::CONTROL`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::CONTROL, self, 24)
    }

    /// Decodes what [`ControlMessage::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        wire::decode(&wire::CONTROL, bytes)
    }
}

/// A random 64-bit id: the first 8 bytes of a sha256 over the time, the process, a counter
/// and an address (two senders' ids collide with probability ~2^-64 per pair).
fn fresh_id() -> u64 {
    use sha2::{Digest, Sha256};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut h = Sha256::new();
    h.update(now.as_nanos().to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    h.update((std::ptr::from_ref(&now) as usize).to_le_bytes());
    let digest = h.finalize();
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Bytes of one message to the packer (an encoded training batch or control message) at
/// most, by default (`stowplan serve --max-message-mib`; the senders' check before they send).
/// A larger message is refused without being read whole: over files it goes to
/// `STATE/rejected/` (its first bytes, within `rejected/`'s bounds); over ZeroMQ libzmq drops
/// its connection (`ZMQ_MAXMSGSIZE`) and the sender's own check names the cap first.
pub const MAX_MESSAGE_BYTES: u64 = 512 << 20;

/// The error of a message of `size` bytes over the cap `max` (`what` names it).
pub fn oversized_message(what: &str, size: u64, max: u64) -> Error {
    Error::InvalidArgument(format!(
        "{what} is {size} bytes, over the packer's message cap of {max} bytes (max_message_bytes; \
         stowplan serve --max-message-mib): send it as several batches of fewer samples"
    ))
}

/// How often the packer publishes an empty [`Receipts`] (its heartbeat), and how often a
/// waiting rank repeats its hello.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// What a trainer rank sends the packer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RankMessage {
    /// "I am rank `rank` of `dp` and lack step `next_step`": sent on connecting and every
    /// [`HEARTBEAT`].
    Hello {
        /// This rank.
        rank: u32,
        /// Data-parallel size the rank was started with (must equal the packer's).
        dp: u32,
        /// The first packer step the rank has neither taken nor holds
        /// ([`RankReceiver::first_missing`]). A rank asking for a step before the one the
        /// packer delivers is refused ([`Refusal::of_late_rank`]): those steps are gone.
        next_step: u64,
    },
    /// "Rank `rank` has step `step`" (also sent for a copy of a step it already had).
    Ack {
        /// This rank.
        rank: u32,
        /// The step received.
        step: u64,
    },
}

impl RankMessage {
    /// Encodes in the [`wire::RANK_MESSAGE`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::RANK_MESSAGE, self, 16)
    }

    /// Decodes what [`RankMessage::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        wire::decode(&wire::RANK_MESSAGE, bytes)
    }
}

/// How far a packer has delivered under a filesystem root (`ROOT/delivered.bin`, written
/// after every step's rank files): every step below `next_step` reached the root. It stays
/// when ranks consume their step files, so a packer whose checkpoint was lost (or replaced
/// by an older copy) finds out before it delivers a step number again ([`Delivered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryMark {
    /// The first step not yet delivered.
    pub next_step: u64,
}

impl DeliveryMark {
    /// Encodes in the [`wire::DELIVERY_MARK`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::DELIVERY_MARK, self, 16)
    }

    /// Decodes what [`DeliveryMark::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        wire::decode(&wire::DELIVERY_MARK, bytes)
    }
}

/// What a transport's receivers show of earlier deliveries: steps below `next_step` reached
/// them, as `evidence` says (a file under the root, a rank's hello).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// The first step the receivers do not hold.
    pub next_step: u64,
    /// Where this was seen, for the error message.
    pub evidence: String,
}

impl Delivered {
    /// The later of two pieces of evidence.
    pub fn max(a: Option<Self>, b: Option<Self>) -> Option<Self> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.next_step > a.next_step { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// The server's rule at start: a packer whose checkpoint issued the steps below `issued`
    /// (`Packer::issued`) may serve receivers that hold at most those. Receivers holding a
    /// later step mean the checkpoint at `state` is missing or older than the deliveries:
    /// serving would number new steps like delivered ones, and the ranks, which skip steps
    /// they have, would never see their samples. Errors: `cache-mismatch` naming the state
    /// file, the evidence and the ways out.
    pub fn check(this: Option<&Self>, issued: u64, state: &std::path::Path, found_state: bool) -> Result<(), Error> {
        let Some(d) = this.filter(|d| d.next_step > issued) else { return Ok(()) };
        let what = if found_state {
            format!("{} was saved at step {issued}, older than the deliveries", state.display())
        } else {
            format!("{} is missing (a new packer starts at step 0)", state.display())
        };
        Err(Error::CacheMismatch(format!(
            "refusing to start: the receivers already hold steps up to {} ({}), but {what}; delivering again would \
             give step numbers the ranks already have to other samples, which they would skip. Restore the \
             packer's latest state.bin (with its spool/) from a backup, or start over on purpose: a new root (or \
             the old one's rollouts/ and delivered.bin removed), an empty state directory, and every rank restarted \
             at step 0",
            d.next_step - 1,
            d.evidence
        )))
    }
}

/// The packer's answer to a rank it will not serve (wrong data-parallel size or rank).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    /// Why, naming the values.
    pub message: String,
}

impl Refusal {
    /// The server's rule for a hello: `None` when rank `rank` of `dp` may be served by a
    /// packer of data-parallel size `served_dp`, otherwise the refusal naming the mismatch
    /// (another `dp`, or a rank out of range).
    pub fn of_hello(rank: u32, dp: u32, served_dp: u32) -> Option<Self> {
        let message = if dp != served_dp {
            format!("rank {rank} was started with dp {dp}, the packer serves dp {served_dp}")
        } else if rank >= served_dp {
            format!("rank {rank} is out of range: ranks are 0..{served_dp} (dp {served_dp})")
        } else {
            return None;
        };
        Some(Self { message })
    }

    /// The server's rule for a rank whose hello asks for step `next_step` while the packer
    /// delivers step `step`: `None` when `next_step ≥ step`; otherwise the refusal saying why
    /// it can never be served. Steps before `step` were acknowledged by every rank — a
    /// connection that acknowledged them holds or took them, so a rank asking for one again
    /// is a new process (a trainer restarted from an older checkpoint), and the packer keeps
    /// no delivered step. Without this rule the rank held the packer's steps back and waited
    /// for ever.
    pub fn of_late_rank(rank: u32, next_step: u64, step: u64) -> Option<Self> {
        (next_step < step).then(|| Self {
            message: format!(
                "rank {rank} asks for step {next_step}, but the packer is delivering step {step}: steps \
                 {next_step}..{} were delivered (every rank acknowledged them) and are not kept; restart this \
                 trainer from a checkpoint at step {step}, or start its receiver at step {step} (start_step) to go \
                 on without them",
                step - 1
            ),
        })
    }

    /// Encodes in the [`wire::REFUSAL`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::REFUSAL, self, self.message.len() + 8)
    }

    /// Decodes what [`Refusal::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        wire::decode(&wire::REFUSAL, bytes)
    }
}

/// CURVE's rules that every client shares, as text (the SDKs read certificates with their own
/// ZeroMQ library, then ask here): what a client that hears nothing from a CURVE packer
/// should check, given both public keys in Z85 (appended to its timeout error).
pub fn curve_timeout_hint(client_public_z85: &str, server_public_z85: &str) -> String {
    format!(
        "; with CURVE, check that the packer's clients directory holds this client's public key \
         {client_public_z85} and that the packer's public key is {server_public_z85}"
    )
}

/// Why the secret certificate at `path`, with permission bits `mode`, must not be used:
/// `None` when only its owner may read it (like an ssh key), else the message.
pub fn secret_certificate_mode_error(path: &str, mode: u32) -> Option<String> {
    (mode & 0o077 != 0).then(|| {
        format!(
            "certificate {path}: a secret certificate must be readable by its owner only (mode {:04o}): chmod 600 {path}",
            mode & 0o777
        )
    })
}

/// That one message reached the packer and is durable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Receipt {
    /// A training batch.
    Batch {
        /// Its run.
        run: u32,
        /// Its orchestrator step.
        step: u64,
        /// Samples kept.
        accepted: u32,
        /// Samples rejected (reasons are in the packer's log).
        rejected: u32,
        /// The batch had been received before and was ignored this time.
        duplicate: bool,
    },
    /// A control message; `error` says why it was not applied (it is not retried).
    Control {
        /// The message's id ([`ControlMessage::id`]).
        id: u64,
        /// The change.
        control: Control,
        /// Why it was not applied, if it was not.
        error: Option<String>,
        /// The message had been applied before (sent again) and was ignored this time.
        duplicate: bool,
    },
}

/// What the packer publishes on the receipts socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipts {
    /// Identifies the packer process: a new value means it restarted.
    pub incarnation: u64,
    /// Messages that became durable (empty in a heartbeat).
    pub receipts: Vec<Receipt>,
}

impl Receipts {
    /// Encodes in the [`wire::RECEIPTS`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::RECEIPTS, self, 16 + 24 * self.receipts.len())
    }

    /// Decodes what [`Receipts::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        wire::decode(&wire::RECEIPTS, bytes)
    }
}

/// Where the packer's three sockets bind: ZeroMQ endpoints such as `tcp://*:5555`,
/// `tcp://127.0.0.1:*` (a free port: the transport reports the endpoints it bound) or `ipc:///path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZmqEndpoints {
    /// PULL socket for training batches and control messages.
    pub batches: String,
    /// PUB socket for receipts.
    pub receipts: String,
    /// ROUTER socket the ranks connect to.
    pub ranks: String,
}

impl ZmqEndpoints {
    /// Default of [`ZmqEndpoints::batches`]: port 5555 on every interface.
    pub const DEFAULT_BATCHES: &'static str = "tcp://*:5555";
    /// Default of [`ZmqEndpoints::receipts`]: port 5556 on every interface.
    pub const DEFAULT_RECEIPTS: &'static str = "tcp://*:5556";
    /// Default of [`ZmqEndpoints::ranks`]: port 5557 on every interface.
    pub const DEFAULT_RANKS: &'static str = "tcp://*:5557";
}

impl Default for ZmqEndpoints {
    /// Ports 5555 (batches), 5556 (receipts) and 5557 (ranks) on every interface.
    fn default() -> Self {
        Self {
            batches: Self::DEFAULT_BATCHES.into(),
            receipts: Self::DEFAULT_RECEIPTS.into(),
            ranks: Self::DEFAULT_RANKS.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_asking_for_a_step_already_delivered_is_refused_with_the_way_out() {
        assert_eq!(Refusal::of_late_rank(2, 7, 7), None);
        assert_eq!(Refusal::of_late_rank(2, 9, 7), None, "a rank ahead drops the copies itself");
        let r = Refusal::of_late_rank(2, 3, 7).expect("steps 3..6 are gone");
        assert!(r.message.contains("rank 2 asks for step 3") && r.message.contains("steps 3..6"), "{}", r.message);
        assert!(r.message.contains("start_step") && r.message.contains("checkpoint at step 7"), "{}", r.message);
        assert_eq!(Refusal::decode(&r.encode().unwrap()).unwrap(), r);
    }

    #[test]
    fn control_messages_get_their_own_ids_and_round_trip() {
        let c = Control::RemoveRun { run: 4 };
        let (a, b) = (ControlMessage::new(c.clone()), ControlMessage::new(c));
        assert_ne!(a.id, b.id);
        assert_eq!(ControlMessage::decode(&a.encode().unwrap()).unwrap(), a);
    }
}
