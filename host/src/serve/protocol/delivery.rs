//! The packer's side of delivering one step over ZeroMQ, as a state machine without I/O:
//! [`StepDelivery`] (the server's counterpart of [`RankReceiver`](super::RankReceiver)).
//!
//! The server sends each rank its copy of the step over the connection it last said hello
//! from, notes where it went ([`StepDelivery::sent`]; `None` when the rank is not
//! connected), and then, until [`StepDelivery::is_complete`]:
//! - when rank `r`'s slot is taken over by a new connection
//!   ([`super::slots::RankSlots`]): [`StepDelivery::reassigned`], then sends the copy to it;
//! - on a hello of rank `r` from connection `c`: sends `r` its copy again when
//!   [`StepDelivery::needs_resend`] — `r` has not acknowledged the step and `c` is not the
//!   connection its copy went to (a reconnection: the copy died with the old connection; over
//!   the same connection it is on its way, and a second copy would only be dropped);
//! - on an acknowledgement: [`StepDelivery::on_ack`] (an acknowledgement of another step,
//!   e.g. of a copy of an older one, or of a rank out of range, counts for nothing).
//!
//! The step is delivered when every rank acknowledged it. `C` is whatever identifies a
//! connection (a ZeroMQ routing id).

/// One step being delivered to `dp` ranks (see the module docs).
#[derive(Clone, Debug)]
pub struct StepDelivery<C> {
    step: u64,
    acked: Vec<bool>,
    sent_to: Vec<Option<C>>,
}

impl<C: PartialEq> StepDelivery<C> {
    /// Step `step` for `dp` ranks, nothing sent yet.
    pub fn new(step: u64, dp: usize) -> Self {
        Self { step, acked: vec![false; dp], sent_to: (0..dp).map(|_| None).collect() }
    }

    /// The step delivered.
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Notes that rank `rank`'s copy went over connection `to` (`None`: not sent, the rank
    /// is not connected; its next hello brings it). A rank out of range is ignored.
    pub fn sent(&mut self, rank: usize, to: Option<C>) {
        if let Some(slot) = self.sent_to.get_mut(rank) {
            *slot = to;
        }
    }

    /// Whether a hello of rank `rank` from `connection` calls for its copy again: not
    /// acknowledged, and not sent over that connection.
    pub fn needs_resend(&self, rank: usize, connection: Option<&C>) -> bool {
        rank < self.acked.len() && !self.acked[rank] && self.sent_to[rank].as_ref() != connection
    }

    /// Takes an acknowledgement of `step` by `rank`; `true` when it counted (this step, a
    /// rank in range).
    pub fn on_ack(&mut self, rank: u32, step: u64) -> bool {
        match self.acked.get_mut(rank as usize) {
            Some(a) if step == self.step => {
                *a = true;
                true
            }
            _ => false,
        }
    }

    /// Rank `rank` is served by a new connection (its slot was taken over): whatever the old
    /// connection acknowledged, the new one gets the step again (its trainer may not have it;
    /// a rank that has it acknowledges and drops the copy). A rank out of range is ignored.
    pub fn reassigned(&mut self, rank: usize) {
        if let (Some(a), Some(s)) = (self.acked.get_mut(rank), self.sent_to.get_mut(rank)) {
            *a = false;
            *s = None;
        }
    }

    /// Whether every rank acknowledged the step.
    pub fn is_complete(&self) -> bool {
        self.acked.iter().all(|&a| a)
    }

    /// The ranks that have not acknowledged yet.
    pub fn waiting(&self) -> Vec<usize> {
        (0..self.acked.len()).filter(|&r| !self.acked[r]).collect()
    }

    /// The ranks whose copy could not be sent (not connected).
    pub fn unsent(&self) -> Vec<usize> {
        (0..self.sent_to.len()).filter(|&r| self.sent_to[r].is_none()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_when_every_rank_acknowledged_this_step() {
        let mut d: StepDelivery<u8> = StepDelivery::new(4, 3);
        d.sent(0, Some(10));
        d.sent(1, Some(11));
        d.sent(2, None);
        assert_eq!((d.step(), d.waiting(), d.unsent()), (4, vec![0, 1, 2], vec![2]));
        assert!(!d.on_ack(0, 3), "a copy of an older step counts for nothing");
        assert!(!d.on_ack(7, 4), "a rank out of range counts for nothing");
        assert!(d.on_ack(0, 4) && d.on_ack(1, 4));
        assert!(!d.is_complete());
        assert_eq!(d.waiting(), vec![2]);
        assert!(d.on_ack(2, 4));
        assert!(d.is_complete());
    }

    #[test]
    fn a_hello_from_a_new_connection_gets_the_copy_again() {
        let mut d: StepDelivery<&str> = StepDelivery::new(0, 2);
        d.sent(0, Some("a"));
        d.sent(1, None);
        assert!(!d.needs_resend(0, Some(&"a")), "same connection: the copy is on its way");
        assert!(d.needs_resend(0, Some(&"a2")), "reconnected: the copy died with the old connection");
        assert!(d.needs_resend(1, Some(&"b")), "connected since: never had it");
        d.sent(1, Some("b"));
        assert!(!d.needs_resend(1, Some(&"b")));
        d.on_ack(0, 0);
        assert!(!d.needs_resend(0, Some(&"a3")), "acknowledged: nothing to resend");
        assert!(!d.needs_resend(5, Some(&"x")));
        d.sent(9, Some("ignored"));
        d.on_ack(1, 0);
        assert!(d.is_complete());
        d.reassigned(0);
        assert!(!d.is_complete() && d.needs_resend(0, Some(&"new")), "a new holder gets the step again");
        d.reassigned(7);
    }
}
