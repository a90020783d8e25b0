//! An orchestrator's side of the ZeroMQ protocol as a state machine without I/O:
//! [`BatchSender`].
//!
//! The orchestrator PUSHes messages to the packer's batches endpoint and SUBscribes to its
//! receipts endpoint; the driver (the Rust [`ZmqBatchSender`](crate::serve::client), the
//! Python SDK's `ZmqSender`) owns both sockets and:
//!
//! 1. sends every message through the core first: [`BatchSender::track`] (or
//!    [`BatchSender::batch`], [`BatchSender::control`], which encode) keeps it under its
//!    [`MessageKey`] (a training batch by `(run, step)`, a control message by its content)
//!    with the time it was sent, and returns what to push;
//! 2. gives every message read from the receipts socket to [`BatchSender::on_receipts`],
//!    which forgets the messages it names and returns their receipts (a receipt for a
//!    message not kept, e.g. for a copy acknowledged already or another orchestrator's
//!    message, is not returned);
//! 3. then pushes again what [`BatchSender::due_resends`]`(now)` returns: every message
//!    still unacknowledged when the packer's incarnation changed since the last call (a
//!    restart: what was in flight died with the old process), otherwise those sent
//!    `resend_after` ago or longer without a receipt, and those sent before the first message
//!    of the receipts socket arrived (the first contact) that are still unacknowledged
//!    [`FIRST_CONTACT_GRACE`] after it: ZeroMQ drops what the packer publishes before the
//!    sender's subscription reaches it (the slow joiner), so a receipt for a message taken
//!    that early may never come. The packer recognises a repeated
//!    training batch as a duplicate (by its `(run, step)`) and a run change by its id
//!    ([`ControlMessage::id`]), and acknowledges either, so resending is always safe.
//! 4. A flush is complete when [`BatchSender::is_flushed`]: nothing unacknowledged.
//!
//! The payload type `P` is whatever the driver pushes (`Vec<u8>` by default; the Python SDK
//! keeps its `bytes` objects, so nothing is copied); the core only keeps and hands it back.

use std::fmt;
use std::time::{Duration, Instant};

use super::{Control, ControlMessage, Receipt, Receipts};
use crate::Error;
use crate::packer::{BatchKey, TrainingBatch};

/// What names a message until its receipt: a training batch by `(run, step)` (the packer's
/// duplicate key), a control message by its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageKey {
    /// A training batch.
    Batch(BatchKey),
    /// A control message: its id, and the change (for people).
    Control {
        /// [`ControlMessage::id`].
        id: u64,
        /// The change.
        control: Control,
    },
}

impl MessageKey {
    /// A new control message for `control` (with a fresh id, [`ControlMessage::new`]): the
    /// key it is kept under and the bytes to send.
    pub fn new_control(control: Control) -> Result<(Self, Vec<u8>), Error> {
        let message = ControlMessage::new(control);
        let bytes = message.encode()?;
        Ok((MessageKey::Control { id: message.id, control: message.control }, bytes))
    }

    /// The message a receipt names.
    pub fn of_receipt(receipt: &Receipt) -> Self {
        match receipt {
            Receipt::Batch { run, step, .. } => MessageKey::Batch(BatchKey { run: *run, step: *step }),
            Receipt::Control { id, control, .. } => MessageKey::Control { id: *id, control: control.clone() },
        }
    }
}

/// `batch run 0 step 3`, `add_run 1 (batch_size 8)`, `remove_run 1`.
impl fmt::Display for MessageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MessageKey::Batch(k) => write!(f, "batch run {} step {}", k.run, k.step),
            MessageKey::Control { control: Control::AddRun { run, config }, .. } => {
                write!(f, "add_run {run} (batch_size {})", config.batch_size)
            }
            MessageKey::Control { control: Control::RemoveRun { run }, .. } => write!(f, "remove_run {run}"),
        }
    }
}

#[derive(Debug)]
struct Pending<P> {
    key: MessageKey,
    payload: P,
    sent: Instant,
}

/// An orchestrator's sender over ZeroMQ, without I/O (see the module docs).
#[derive(Debug)]
pub struct BatchSender<P = Vec<u8>> {
    resend_after: Duration,
    /// Oldest first.
    unacked: Vec<Pending<P>>,
    incarnation: Option<u64>,
    /// When [`BatchSender::due_resends`] first ran after the first message of the receipts
    /// socket (the first contact; drivers call it right after [`BatchSender::on_receipts`]).
    contact: Option<Instant>,
    restarted: bool,
    resent: u64,
    max_message_bytes: u64,
}

/// How long a message waits for its receipt before it is sent again, by default (the Rust
/// client and the Python `ZmqSender` both use it).
pub const DEFAULT_RESEND_AFTER: Duration = Duration::from_secs(30);

/// How long after the first contact a message sent before it waits for its receipt before it
/// is sent again (at most `resend_after`): two of the packer's heartbeats, by which time a
/// receipt published after the subscription arrived has come.
pub const FIRST_CONTACT_GRACE: Duration = super::HEARTBEAT.saturating_mul(2);

impl<P> BatchSender<P> {
    /// A sender that resends a message `resend_after` after it was sent without a receipt.
    ///
    /// Errors: `invalid-argument` for a zero `resend_after`.
    pub fn new(resend_after: Duration) -> Result<Self, Error> {
        if resend_after.is_zero() {
            return Err(Error::InvalidArgument("resend_after must be a duration > 0 (got 0)".into()));
        }
        Ok(Self {
            resend_after,
            unacked: Vec::new(),
            incarnation: None,
            contact: None,
            restarted: false,
            resent: 0,
            max_message_bytes: super::MAX_MESSAGE_BYTES,
        })
    }

    /// Refuses batches whose encoding is over `max` bytes (default
    /// [`MAX_MESSAGE_BYTES`](super::MAX_MESSAGE_BYTES): the packer's own cap; set the same
    /// value as `stowplan serve --max-message-mib`). Errors: `invalid-argument` for 0.
    pub fn set_max_message_bytes(&mut self, max: u64) -> Result<(), Error> {
        if max == 0 {
            return Err(Error::InvalidArgument("max_message_bytes must be at least 1 (got 0)".into()));
        }
        self.max_message_bytes = max;
        Ok(())
    }

    /// The message cap ([`BatchSender::set_max_message_bytes`]).
    pub fn max_message_bytes(&self) -> u64 {
        self.max_message_bytes
    }

    /// Refuses a batch `key` whose encoding is `size` bytes, over the message cap (the
    /// packer would drop it unread). Errors: `invalid-argument` naming the batch and the cap.
    pub fn check_batch_size(&self, key: BatchKey, size: u64) -> Result<(), Error> {
        if size > self.max_message_bytes {
            let what = format!("batch (run {}, step {})", key.run, key.step);
            return Err(super::oversized_message(&what, size, self.max_message_bytes));
        }
        Ok(())
    }

    /// How long a message waits for its receipt before it is sent again.
    pub fn resend_after(&self) -> Duration {
        self.resend_after
    }

    /// Keeps `payload` (the encoded message named `key`, pushed by the caller right after) as
    /// sent at `now` until a receipt names it, and returns it. A message with the key of one
    /// still kept replaces it (and becomes the newest).
    pub fn track(&mut self, key: MessageKey, payload: P, now: Instant) -> &P {
        self.unacked.retain(|p| p.key != key);
        self.unacked.push(Pending { key, payload, sent: now });
        let last = self.unacked.len() - 1;
        &self.unacked[last].payload
    }

    /// Takes one message of the receipts socket: notes the packer's incarnation (a change
    /// makes [`BatchSender::due_resends`] resend everything) and returns the receipts of
    /// messages kept until now, which are forgotten. Errors: those of [`Receipts::decode`].
    pub fn on_receipts(&mut self, bytes: &[u8]) -> Result<Vec<Receipt>, Error> {
        Ok(self.take(Receipts::decode(bytes)?))
    }

    /// [`BatchSender::on_receipts`] for receipts decoded already.
    pub fn take(&mut self, receipts: Receipts) -> Vec<Receipt> {
        if self.incarnation.is_some_and(|i| i != receipts.incarnation) {
            self.restarted = true;
        }
        self.incarnation = Some(receipts.incarnation);
        let mut out = Vec::new();
        for r in receipts.receipts {
            let key = MessageKey::of_receipt(&r);
            if let Some(i) = self.unacked.iter().position(|p| p.key == key) {
                self.unacked.remove(i);
                out.push(r);
            }
        }
        out
    }

    /// The messages to push again now, oldest first: all unacknowledged ones when the
    /// packer's incarnation changed since the last call, otherwise those sent at least
    /// `resend_after` before `now`, or sent before the first contact and unacknowledged
    /// [`FIRST_CONTACT_GRACE`] after it. Each counts as sent at `now` again.
    pub fn due_resends(&mut self, now: Instant) -> Vec<&P> {
        if self.contact.is_none() && self.incarnation.is_some() {
            self.contact = Some(now);
        }
        let all = std::mem::take(&mut self.restarted);
        let mut out = Vec::new();
        for p in &mut self.unacked {
            if all || Self::wait_left(self.resend_after, self.contact, p.sent, now).is_zero() {
                p.sent = now;
                self.resent += 1;
                out.push(&p.payload);
            }
        }
        out
    }

    /// How long a message sent at `sent` still waits for its receipt at `now`: until
    /// `resend_after` after it was sent, and if it was sent before the first `contact`, at
    /// most until [`FIRST_CONTACT_GRACE`] (or `resend_after`, if shorter) after that.
    fn wait_left(resend_after: Duration, contact: Option<Instant>, sent: Instant, now: Instant) -> Duration {
        let left = resend_after.saturating_sub(now.saturating_duration_since(sent));
        match contact {
            Some(c) if sent <= c => {
                left.min(FIRST_CONTACT_GRACE.min(resend_after).saturating_sub(now.saturating_duration_since(c)))
            }
            _ => left,
        }
    }

    /// How long until the first unacknowledged message is due again (`None`: nothing is
    /// unacknowledged); a driver with nothing else to do may wait this long.
    pub fn next_resend_in(&self, now: Instant) -> Option<Duration> {
        let contact = self.contact.or(self.incarnation.map(|_| now));
        self.unacked.iter().map(|p| Self::wait_left(self.resend_after, contact, p.sent, now)).min()
    }

    /// The messages not acknowledged yet, oldest first.
    pub fn unacked(&self) -> Vec<&MessageKey> {
        self.unacked.iter().map(|p| &p.key).collect()
    }

    /// Whether every message sent was acknowledged (a flush is complete).
    pub fn is_flushed(&self) -> bool {
        self.unacked.is_empty()
    }

    /// The packer process last heard from (`None`: no receipt yet).
    pub fn incarnation(&self) -> Option<u64> {
        self.incarnation
    }

    /// How many messages were pushed again (after a restart of the packer or a timeout).
    pub fn resent(&self) -> u64 {
        self.resent
    }

    /// The error of a flush that waited `waited` in vain for the packer at `endpoint` (its
    /// receipts endpoint): `timeout`, naming how many messages and the first three.
    pub fn flush_timeout_error(&self, endpoint: &str, waited: Duration) -> Error {
        let first: Vec<String> = self.unacked.iter().take(3).map(|p| p.key.to_string()).collect();
        Error::Timeout(format!(
            "{} messages not acknowledged by the packer at {endpoint} within {} s (first: {}); is `stowplan serve --transport zmq` running?",
            self.unacked.len(),
            waited.as_secs_f64(),
            first.join(", ")
        ))
    }
}

impl BatchSender<Vec<u8>> {
    /// Encodes `batch` and keeps it ([`BatchSender::track`]); returns the bytes to push.
    /// Errors: `invalid-argument` when the encoding is over the message cap
    /// ([`BatchSender::set_max_message_bytes`]): nothing is kept.
    pub fn batch(&mut self, batch: &TrainingBatch, now: Instant) -> Result<&[u8], Error> {
        let bytes = batch.encode()?;
        self.check_batch_size(batch.key(), bytes.len() as u64)?;
        Ok(self.track(MessageKey::Batch(batch.key()), bytes, now))
    }

    /// Encodes `control` as a [`ControlMessage`] with a new id and keeps it
    /// ([`BatchSender::track`]); returns the bytes to push.
    pub fn control(&mut self, control: Control, now: Instant) -> Result<&[u8], Error> {
        let (key, bytes) = MessageKey::new_control(control)?;
        Ok(self.track(key, bytes, now))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::packer::RunConfig;

    fn batch(run: u32, step: u64) -> TrainingBatch {
        TrainingBatch { run, step, temperature: 1.0, samples: Vec::new() }
    }

    fn receipt(run: u32, step: u64) -> Receipt {
        Receipt::Batch { run, step, accepted: 1, rejected: 0, duplicate: false }
    }

    fn receipts(incarnation: u64, receipts: Vec<Receipt>) -> Vec<u8> {
        Receipts { incarnation, receipts }.encode().unwrap()
    }

    fn sec(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn messages_are_kept_until_a_receipt_names_them() {
        let t0 = Instant::now();
        let mut s = BatchSender::new(sec(30)).unwrap();
        let b0 = s.batch(&batch(0, 0), t0).unwrap().to_vec();
        assert_eq!(b0, batch(0, 0).encode().unwrap());
        s.batch(&batch(1, 0), t0).unwrap();
        let add = Control::AddRun { run: 2, config: RunConfig { batch_size: 4 } };
        let add_id = ControlMessage::decode(s.control(add.clone(), t0).unwrap()).unwrap().id;
        let remove = ControlMessage::decode(s.control(Control::RemoveRun { run: 2 }, t0).unwrap()).unwrap();
        assert_eq!(remove.control, Control::RemoveRun { run: 2 });
        assert_ne!(add_id, remove.id, "every control message has its own id");
        let control = |id, control, error| Receipt::Control { id, control, error, duplicate: false };
        assert!(!s.is_flushed());
        assert_eq!(s.incarnation(), None);
        // Receipts for kept messages only; the heartbeat (no receipts) sets the incarnation.
        assert!(s.on_receipts(&receipts(7, vec![])).unwrap().is_empty());
        assert_eq!(s.incarnation(), Some(7));
        let other = Control::AddRun { run: 2, config: RunConfig { batch_size: 5 } };
        let got = s
            .on_receipts(&receipts(
                7,
                vec![
                    receipt(1, 0),
                    receipt(1, 0),                    // a second receipt (for a copy): not new
                    receipt(9, 9),                    // another orchestrator's batch
                    control(add_id ^ 1, other, None), // another message
                    control(add_id, add.clone(), None),
                ],
            ))
            .unwrap();
        assert_eq!(got, vec![receipt(1, 0), control(add_id, add, None)]);
        let left: Vec<String> = s.unacked().iter().map(|k| k.to_string()).collect();
        assert_eq!(left, vec!["batch run 0 step 0", "remove_run 2"]);
        s.on_receipts(&receipts(7, vec![receipt(0, 0), control(remove.id, remove.control, Some("no".into()))]))
            .unwrap();
        assert!(s.is_flushed());
        assert!(s.due_resends(t0 + sec(1000)).is_empty());
        assert_eq!(s.next_resend_in(t0), None);
        assert!(s.on_receipts(b"junk").unwrap_err().to_string().contains("missing the SPRC header"));
    }

    #[test]
    fn resent_after_the_timeout_oldest_first() {
        let t0 = Instant::now();
        let mut s: BatchSender<&str> = BatchSender::new(sec(30)).unwrap();
        s.track(MessageKey::Batch(BatchKey { run: 0, step: 0 }), "a", t0);
        s.track(MessageKey::Batch(BatchKey { run: 0, step: 1 }), "b", t0 + sec(10));
        assert!(s.due_resends(t0 + sec(29)).is_empty());
        assert_eq!(s.next_resend_in(t0 + sec(29)), Some(sec(1)));
        assert_eq!(s.due_resends(t0 + sec(30)), vec![&"a"]);
        assert_eq!(s.resent(), 1);
        // "a" counts as sent at 30 s now; "b" is due at 40 s.
        assert_eq!(s.next_resend_in(t0 + sec(30)), Some(sec(10)));
        assert!(s.due_resends(t0 + sec(39)).is_empty());
        assert_eq!(s.due_resends(t0 + sec(40)), vec![&"b"]);
        assert_eq!(s.due_resends(t0 + sec(75)), vec![&"a", &"b"]);
        assert_eq!(s.resent(), 4);
        // Sending a key again replaces the kept message and makes it the newest.
        s.track(MessageKey::Batch(BatchKey { run: 0, step: 0 }), "a2", t0 + sec(80));
        let keys: Vec<String> = s.unacked().iter().map(|k| k.to_string()).collect();
        assert_eq!(keys, vec!["batch run 0 step 1", "batch run 0 step 0"]);
        assert_eq!(s.due_resends(t0 + sec(105)), vec![&"b"]);
        assert_eq!(s.due_resends(t0 + sec(110)), vec![&"a2"], "the replacement counts from its own send");
        let e = s.flush_timeout_error("tcp://127.0.0.1:5556", Duration::from_millis(200)).to_string();
        assert!(
            e.contains("2 messages not acknowledged by the packer at tcp://127.0.0.1:5556 within 0.2 s (first: batch run 0 step 1, batch run 0 step 0)"),
            "{e}"
        );
        assert!(BatchSender::<Vec<u8>>::new(Duration::ZERO).unwrap_err().to_string().contains("resend_after"));
    }

    #[test]
    fn what_was_sent_before_the_first_contact_is_resent_soon_after_it() {
        // The packer took "a" and published its receipt before this sender's subscription
        // reached it (ZeroMQ dropped it): "a" goes again FIRST_CONTACT_GRACE after the first
        // heartbeat heard, not resend_after after it was sent.
        let t0 = Instant::now();
        let mut s: BatchSender<&str> = BatchSender::new(sec(600)).unwrap();
        s.track(MessageKey::Batch(BatchKey { run: 0, step: 0 }), "a", t0);
        s.track(MessageKey::Batch(BatchKey { run: 0, step: 1 }), "b", t0);
        assert!(s.due_resends(t0 + sec(5)).is_empty(), "no contact yet: the usual timeout");
        assert_eq!(s.next_resend_in(t0 + sec(5)), Some(sec(595)));
        s.on_receipts(&receipts(1, vec![receipt(0, 1)])).unwrap(); // first contact, at 6 s
        assert_eq!(s.next_resend_in(t0 + sec(6)), Some(FIRST_CONTACT_GRACE));
        assert!(s.due_resends(t0 + sec(6)).is_empty());
        s.track(MessageKey::Batch(BatchKey { run: 0, step: 2 }), "c", t0 + sec(7)); // after contact
        assert!(s.due_resends(t0 + sec(7)).is_empty());
        assert_eq!(s.next_resend_in(t0 + sec(7)), Some(sec(1)));
        assert_eq!(s.due_resends(t0 + sec(8)), vec![&"a"], "once the grace is over, what came before contact");
        // "a" counts as sent at 8 s, after the contact: the usual timeout from now on.
        assert!(s.due_resends(t0 + sec(100)).is_empty());
        assert_eq!(s.due_resends(t0 + sec(607)), vec![&"c"]);
        assert_eq!(s.due_resends(t0 + sec(608)), vec![&"a"]);
        // A resend_after shorter than the grace wins.
        let mut s: BatchSender<&str> = BatchSender::new(Duration::from_millis(500)).unwrap();
        s.track(MessageKey::Batch(BatchKey { run: 0, step: 0 }), "a", t0);
        s.on_receipts(&receipts(1, vec![])).unwrap();
        assert_eq!(s.due_resends(t0 + Duration::from_millis(500)), vec![&"a"]);
    }

    #[test]
    fn a_new_incarnation_resends_everything_unacknowledged_once() {
        let t0 = Instant::now();
        let mut s: BatchSender<u32> = BatchSender::new(sec(600)).unwrap();
        for step in 0..4 {
            s.track(MessageKey::Batch(BatchKey { run: 0, step }), step as u32, t0);
        }
        s.on_receipts(&receipts(1, vec![receipt(0, 0)])).unwrap();
        assert!(s.due_resends(t0 + sec(1)).is_empty(), "the first incarnation heard is no restart");
        // A restart: its receipts are taken first, then everything still unacknowledged goes.
        let got = s.on_receipts(&receipts(2, vec![receipt(0, 2)])).unwrap();
        assert_eq!(got, vec![receipt(0, 2)]);
        assert_eq!(s.incarnation(), Some(2));
        assert_eq!(s.due_resends(t0 + sec(2)), vec![&1, &3]);
        assert!(s.due_resends(t0 + sec(3)).is_empty(), "once");
        // Heartbeats of the same incarnation change nothing; another restart resends again.
        s.on_receipts(&receipts(2, vec![])).unwrap();
        assert!(s.due_resends(t0 + sec(4)).is_empty());
        s.on_receipts(&receipts(3, vec![])).unwrap();
        assert_eq!(s.due_resends(t0 + sec(5)), vec![&1, &3]);
        assert_eq!(s.resent(), 4);
        // A restart with nothing unacknowledged resends nothing.
        s.on_receipts(&receipts(3, vec![receipt(0, 1), receipt(0, 3)])).unwrap();
        s.on_receipts(&receipts(4, vec![])).unwrap();
        assert!(s.due_resends(t0 + sec(6)).is_empty());
        assert!(s.is_flushed());
    }
}
