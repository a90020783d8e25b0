//! Which connection serves each rank, as a state machine without I/O: [`RankSlots`] (the
//! server's rule for hellos and acknowledgements over ZeroMQ).
//!
//! One connection holds a rank's slot. Without this rule a second peer saying hello as rank
//! 1 (a restarted trainer whose old process still runs, or anyone who can reach the port)
//! took the slot, received rank 1's steps and acknowledged them, while the real rank 1
//! waited for ever and the packer reported the samples delivered. The rules:
//!
//! - the first connection to say hello as rank `r` holds `r` ([`OnHello::Holds`]); a
//!   connection serves one rank (a hello for another rank is refused);
//! - a hello of rank `r` from another connection while the holder is *alive* (it said
//!   something within the last [`RANK_LEASE`]; ranks say hello every
//!   [`HEARTBEAT`](super::HEARTBEAT) as long as their process runs) makes that connection a
//!   *contender* ([`OnHello::Waiting`]): it gets nothing. [`RankSlots::tick`] decides as time
//!   passes: when the holder has been silent for [`RANK_LEASE`] (its process died, or its
//!   connection did), the oldest contender still alive takes the slot over
//!   ([`SlotEvent::TookOver`]; the server sends it the step in flight); a contender that has
//!   waited a whole [`RANK_LEASE`] while the holder is still talking (heard within
//!   [`ALIVE_WITHIN`]) is refused ([`SlotEvent::Refused`]: "rank r is held by another
//!   connection that is still alive …"); one whose holder has fallen silent keeps waiting for
//!   the takeover; a contender silent for [`ALIVE_WITHIN`] is forgotten (it is gone);
//! - a holder whose connection is known gone (a send to it failed: the server learns it only
//!   when it sends, i.e. while delivering a step) leaves at once ([`RankSlots::disconnected`]),
//!   so a contender takes over without waiting for the lease;
//! - an acknowledgement counts only from the connection holding the rank
//!   ([`RankSlots::on_ack`]): a forged acknowledgement of another connection counts for nothing.
//!
//! `C` identifies a connection (a ZeroMQ routing id). This rule is about accidents (two
//! processes for one rank) and peers on a trusted network; it does not tie a rank to a key:
//! any peer the packer admits may wait for any rank's slot and take it once its holder is
//! gone. Against a hostile network, turn on CURVE (see the `zmq` transport), which admits
//! only peers whose key the packer lists.

use std::time::{Duration, Instant};

use super::Refusal;

/// How long a rank's connection may stay silent before another connection saying hello as
/// the same rank takes its slot over (five missed hellos), and how long a contender waits
/// before it is refused because the holder is still alive.
pub const RANK_LEASE: Duration = Duration::from_secs(5);

/// A connection heard from within this long is alive (three hellos' time): a holder that
/// spoke this recently gets a waiting contender refused, and a contender silent this long is
/// forgotten.
pub const ALIVE_WITHIN: Duration = Duration::from_secs(3);

/// At most this many connections wait for one rank's slot; a further one is refused at once
/// (bounds what a flood of connections can make the packer remember).
pub const MAX_CONTENDERS: usize = 8;

#[derive(Clone, Debug)]
struct Holder<C> {
    connection: C,
    last_heard: Instant,
}

#[derive(Clone, Debug)]
struct Contender<C> {
    connection: C,
    since: Instant,
    last_heard: Instant,
}

/// What a hello did (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnHello {
    /// The connection holds the rank's slot; `new` when it took it just now (an empty slot).
    Holds {
        /// Whether the slot was taken by this hello.
        new: bool,
    },
    /// Another connection holds the slot and is alive: this one waits (see [`RankSlots::tick`]).
    Waiting,
    /// Refused: send the connection this refusal.
    Refused(Refusal),
}

/// A decision [`RankSlots::tick`] made as time passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotEvent<C> {
    /// `connection`, a contender, took rank `rank`'s slot over from `previous`, silent for
    /// `silent` (`None`: the slot was free, its holder's connection known gone).
    TookOver {
        /// The rank.
        rank: u32,
        /// The new holder.
        connection: C,
        /// The holder it replaced, and how long it had been silent.
        previous: Option<(C, Duration)>,
    },
    /// `connection` waited a whole lease for rank `rank` while the holder kept talking: send
    /// it `refusal`.
    Refused {
        /// The rank.
        rank: u32,
        /// The refused contender.
        connection: C,
        /// What to send it.
        refusal: Refusal,
    },
}

/// The rank slots of a packer serving `dp` ranks (see the module docs).
#[derive(Clone, Debug)]
pub struct RankSlots<C> {
    dp: u32,
    lease: Duration,
    holders: Vec<Option<Holder<C>>>,
    contenders: Vec<Vec<Contender<C>>>,
}

impl<C: Clone + PartialEq> RankSlots<C> {
    /// `dp` empty slots; contenders wait `lease` (the server uses [`RANK_LEASE`]).
    pub fn new(dp: u32, lease: Duration) -> Self {
        let n = dp as usize;
        Self { dp, lease, holders: vec![None; n], contenders: vec![Vec::new(); n] }
    }

    /// The connection holding rank `rank`, if any.
    pub fn holder(&self, rank: u32) -> Option<&C> {
        self.holders.get(rank as usize)?.as_ref().map(|h| &h.connection)
    }

    /// The rank `connection` holds, if any.
    pub fn rank_of(&self, connection: &C) -> Option<u32> {
        self.holders.iter().position(|h| h.as_ref().is_some_and(|h| h.connection == *connection)).map(|r| r as u32)
    }

    /// The rank `connection` waits for as a contender, if any.
    fn waiting_for(&self, connection: &C) -> Option<u32> {
        self.contenders.iter().position(|w| w.iter().any(|c| c.connection == *connection)).map(|r| r as u32)
    }

    /// Whether every rank's slot is held (the readiness barrier).
    pub fn all_held(&self) -> bool {
        self.holders.iter().all(Option::is_some)
    }

    /// The ranks no connection holds.
    pub fn missing(&self) -> Vec<u32> {
        (0..self.dp).filter(|&r| self.holders[r as usize].is_none()).collect()
    }

    /// Takes a hello of rank `rank` of `dp` from `connection` at `now` (see the module docs).
    pub fn on_hello(&mut self, rank: u32, dp: u32, connection: &C, now: Instant) -> OnHello {
        if let Some(refusal) = Refusal::of_hello(rank, dp, self.dp) {
            return OnHello::Refused(refusal);
        }
        // The common case first, in O(1): the holder's heartbeat (the scans below are for
        // connections new to this rank).
        if let Some(h) = &mut self.holders[rank as usize]
            && h.connection == *connection
        {
            h.last_heard = now;
            return OnHello::Holds { new: false };
        }
        if let Some(other) = self.rank_of(connection).or_else(|| self.waiting_for(connection)).filter(|&o| o != rank) {
            return OnHello::Refused(Refusal {
                message: format!(
                    "this connection said hello as rank {other} before: a connection serves one rank (not also rank {rank})"
                ),
            });
        }
        let r = rank as usize;
        match &mut self.holders[r] {
            Some(_) => {
                let waiting = &mut self.contenders[r];
                if let Some(c) = waiting.iter_mut().find(|c| c.connection == *connection) {
                    c.last_heard = now;
                    OnHello::Waiting
                } else if waiting.len() >= MAX_CONTENDERS {
                    OnHello::Refused(Refusal {
                        message: format!(
                            "rank {rank} is held by another connection and {MAX_CONTENDERS} more are waiting for it"
                        ),
                    })
                } else {
                    waiting.push(Contender { connection: connection.clone(), since: now, last_heard: now });
                    OnHello::Waiting
                }
            }
            slot @ None => {
                *slot = Some(Holder { connection: connection.clone(), last_heard: now });
                self.contenders[r].retain(|c| c.connection != *connection);
                OnHello::Holds { new: true }
            }
        }
    }

    /// Takes an acknowledgement said to come from rank `rank`: `true` when `connection`
    /// holds that rank (it then counts, and the holder was heard from); `false` for any other
    /// connection or a rank out of range (it counts for nothing).
    pub fn on_ack(&mut self, rank: u32, connection: &C, now: Instant) -> bool {
        match self.holders.get_mut(rank as usize) {
            Some(Some(h)) if h.connection == *connection => {
                h.last_heard = now;
                true
            }
            _ => false,
        }
    }

    /// The connection to rank `rank`'s holder is gone (a send to it failed): the slot is free
    /// for the oldest contender at the next [`RankSlots::tick`], or for the next hello. Nothing
    /// happens when `connection` does not hold `rank`.
    pub fn disconnected(&mut self, rank: u32, connection: &C) {
        if let Some(slot) = self.holders.get_mut(rank as usize)
            && slot.as_ref().is_some_and(|h| h.connection == *connection)
        {
            *slot = None;
        }
    }

    /// Decides, as of `now`, every contender's fate (see the module docs): contenders silent
    /// for [`ALIVE_WITHIN`] are forgotten; the oldest remaining contender of a rank whose
    /// holder has been silent for a lease (or is gone) takes the slot; a contender that waited
    /// a lease while the holder is still alive is refused; the others wait on.
    pub fn tick(&mut self, now: Instant) -> Vec<SlotEvent<C>> {
        let mut events = Vec::new();
        let (lease, silent_for) = (self.lease, |t: Instant| now.saturating_duration_since(t));
        for r in 0..self.holders.len() {
            self.contenders[r].retain(|c| silent_for(c.last_heard) < ALIVE_WITHIN);
            if self.contenders[r].is_empty() {
                continue;
            }
            let rank = r as u32;
            let holder_silent = self.holders[r].as_ref().map(|h| silent_for(h.last_heard));
            if holder_silent.is_none_or(|s| s >= lease) {
                let next = self.contenders[r].remove(0);
                let promoted = Holder { connection: next.connection.clone(), last_heard: next.last_heard };
                let previous = self.holders[r].replace(promoted);
                events.push(SlotEvent::TookOver {
                    rank,
                    connection: next.connection,
                    previous: previous.map(|p| (p.connection, holder_silent.unwrap_or_default())),
                });
            }
            let holder_alive = self.holders[r].as_ref().is_some_and(|h| silent_for(h.last_heard) < ALIVE_WITHIN);
            if !holder_alive {
                continue; // the holder fell silent: the contenders wait for the takeover
            }
            let (refused, waiting): (Vec<_>, Vec<_>) =
                self.contenders[r].drain(..).partition(|c| silent_for(c.since) >= lease);
            self.contenders[r] = waiting;
            events.extend(refused.into_iter().map(|c| SlotEvent::Refused {
                rank,
                connection: c.connection,
                refusal: Refusal {
                    message: format!(
                        "rank {rank} is held by another connection that is still alive (it spoke within the last {} s): \
                         a rank is served over one connection; stop the other trainer process for rank {rank} \
                         (or wait for it to exit) and start this one again",
                        ALIVE_WITHIN.as_secs()
                    ),
                },
            }));
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(5);

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn the_first_connection_holds_a_rank_and_acknowledgements_count_only_from_it() {
        let t0 = Instant::now();
        let mut s: RankSlots<&str> = RankSlots::new(2, LEASE);
        assert_eq!(s.on_hello(1, 2, &"a", t0), OnHello::Holds { new: true });
        assert_eq!(s.on_hello(1, 2, &"a", t0), OnHello::Holds { new: false });
        assert_eq!((s.all_held(), s.missing()), (false, vec![0]));
        assert!(s.on_ack(1, &"a", t0));
        assert!(!s.on_ack(1, &"forger", t0), "a forged acknowledgement counts for nothing");
        assert!(!s.on_ack(0, &"a", t0), "a connection acknowledges only for its own rank");
        assert!(!s.on_ack(9, &"a", t0));
        let OnHello::Refused(r) = s.on_hello(0, 2, &"a", t0) else { panic!("one connection, two ranks") };
        assert!(r.message.contains("rank 1") && r.message.contains("rank 0"), "{}", r.message);
        let OnHello::Refused(r) = s.on_hello(0, 3, &"b", t0) else { panic!("another dp") };
        assert!(r.message.contains("dp 3"), "{}", r.message);
        assert_eq!(s.on_hello(0, 2, &"b", t0), OnHello::Holds { new: true });
        assert!(s.all_held());
        assert_eq!(s.rank_of(&"b"), Some(0));
    }

    #[test]
    fn a_second_connection_is_refused_while_the_holder_is_alive() {
        let t0 = Instant::now();
        let mut s: RankSlots<&str> = RankSlots::new(2, LEASE);
        s.on_hello(1, 2, &"real", t0);
        assert_eq!(s.on_hello(1, 2, &"dup", at(t0, 1)), OnHello::Waiting);
        for t in 2..6 {
            s.on_hello(1, 2, &"real", at(t0, t)); // the holder keeps its heartbeat
            assert_eq!(s.on_hello(1, 2, &"dup", at(t0, t)), OnHello::Waiting);
            assert!(s.tick(at(t0, t)).is_empty(), "second {t}");
        }
        let events = s.tick(at(t0, 6));
        let [SlotEvent::Refused { rank: 1, connection: "dup", refusal }] = &events[..] else { panic!("{events:?}") };
        assert!(refusal.message.contains("still alive"), "{}", refusal.message);
        assert_eq!(s.holder(1), Some(&"real"));
        assert!(s.tick(at(t0, 7)).is_empty());
    }

    /// `who` says hello as rank `rank` (of `dp`) at each second of `seconds`, ticking after each.
    fn hellos(
        s: &mut RankSlots<&'static str>,
        t0: Instant,
        who: &'static str,
        rank: u32,
        dp: u32,
        seconds: std::ops::Range<u64>,
    ) -> Vec<SlotEvent<&'static str>> {
        let mut events = Vec::new();
        for t in seconds {
            s.on_hello(rank, dp, &who, at(t0, t));
            events.extend(s.tick(at(t0, t)));
        }
        events
    }

    #[test]
    fn a_contender_takes_over_from_a_silent_or_gone_holder() {
        let t0 = Instant::now();
        let mut s: RankSlots<&str> = RankSlots::new(1, LEASE);
        s.on_hello(0, 1, &"old", t0);
        assert_eq!(s.on_hello(0, 1, &"new", at(t0, 2)), OnHello::Waiting);
        assert!(hellos(&mut s, t0, "new", 0, 1, 3..5).is_empty(), "the holder is silent for less than a lease");
        let events = hellos(&mut s, t0, "new", 0, 1, 5..6);
        assert_eq!(events, vec![SlotEvent::TookOver { rank: 0, connection: "new", previous: Some(("old", LEASE)) }]);
        assert!(s.on_ack(0, &"new", at(t0, 5)) && !s.on_ack(0, &"old", at(t0, 5)));
        // The old process comes back: it is now the contender, refused while "new" talks.
        assert_eq!(s.on_hello(0, 1, &"old", at(t0, 6)), OnHello::Waiting);
        for t in 7..11 {
            s.on_hello(0, 1, &"new", at(t0, t));
            s.on_hello(0, 1, &"old", at(t0, t));
            assert!(s.tick(at(t0, t)).is_empty());
        }
        assert!(matches!(&s.tick(at(t0, 11))[..], [SlotEvent::Refused { connection: "old", .. }]));
        // A known disconnection frees the slot at once.
        assert_eq!(s.on_hello(0, 1, &"third", at(t0, 12)), OnHello::Waiting);
        s.disconnected(0, &"old"); // not the holder: nothing happens
        assert_eq!(s.holder(0), Some(&"new"));
        s.disconnected(0, &"new");
        assert_eq!(s.tick(at(t0, 12)), vec![SlotEvent::TookOver { rank: 0, connection: "third", previous: None }]);
        assert_eq!(s.holder(0), Some(&"third"));
    }

    #[test]
    fn a_holder_that_dies_while_a_contender_waits_is_taken_over_not_defended() {
        // The old trainer still says hello for a moment after its restart began.
        let t0 = Instant::now();
        let mut s: RankSlots<&str> = RankSlots::new(1, LEASE);
        assert!(hellos(&mut s, t0, "old", 0, 1, 0..3).is_empty());
        let mut events = Vec::new();
        for t in 1..8 {
            s.on_hello(0, 1, &"new", at(t0, t));
            events.extend(s.tick(at(t0, t)));
        }
        // "new" waited a lease at t = 6, but "old" had fallen silent: no refusal, a takeover at 7.
        assert_eq!(events, vec![SlotEvent::TookOver { rank: 0, connection: "new", previous: Some(("old", LEASE)) }]);
    }

    #[test]
    fn a_contender_that_falls_silent_is_forgotten_not_promoted() {
        // A crash-looping trainer: "b" says hello once and dies; "c", the next restart, lives.
        let t0 = Instant::now();
        let mut s: RankSlots<&str> = RankSlots::new(1, LEASE);
        s.on_hello(0, 1, &"a", t0);
        assert_eq!(s.on_hello(0, 1, &"b", at(t0, 1)), OnHello::Waiting);
        let events = hellos(&mut s, t0, "c", 0, 1, 2..6);
        assert_eq!(events, vec![SlotEvent::TookOver { rank: 0, connection: "c", previous: Some(("a", LEASE)) }]);
        assert_eq!(s.holder(0), Some(&"c"));
    }

    #[test]
    fn a_connection_waiting_for_one_rank_cannot_hold_another() {
        let t0 = Instant::now();
        let mut s: RankSlots<&str> = RankSlots::new(2, LEASE);
        s.on_hello(0, 2, &"x", t0);
        assert_eq!(s.on_hello(0, 2, &"y", t0), OnHello::Waiting);
        let OnHello::Refused(r) = s.on_hello(1, 2, &"y", t0) else { panic!("waiting for 0, holding 1") };
        assert!(r.message.contains("a connection serves one rank"), "{}", r.message);
        assert_eq!(s.holder(1), None);
    }

    #[test]
    fn contenders_are_bounded() {
        let t0 = Instant::now();
        let mut s: RankSlots<u32> = RankSlots::new(1, LEASE);
        s.on_hello(0, 1, &0, t0);
        for c in 1..=MAX_CONTENDERS as u32 {
            assert_eq!(s.on_hello(0, 1, &c, t0), OnHello::Waiting);
        }
        assert!(matches!(s.on_hello(0, 1, &99, t0), OnHello::Refused(_)));
    }
}
