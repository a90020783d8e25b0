//! What every ZeroMQ piece shares: libzmq failures as errors, and logging an event
//! that may flood at most once per period.

use std::time::{Duration, Instant};

use stowplan::Error;

/// A libzmq failure while doing `what`, as an `io` error (every ZeroMQ piece of `serve`).
pub(crate) fn zmq_error(what: &str, e: ::zmq::Error) -> Error {
    Error::Io(format!("zeromq: {what}: {e}"))
}

/// Counts an event that is logged at most once per `every` (a flood of it must not flood the
/// log): [`Throttled::note`] says when to log and how many happened since the last line.
#[derive(Debug)]
pub(crate) struct Throttled {
    every: Duration,
    total: u64,
    logged: u64,
    last: Option<Instant>,
}

impl Throttled {
    /// Logged at most once per `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self { every, total: 0, logged: 0, last: None }
    }

    /// Counts one event; `Some(n)` when a line is due now, `n` events since the last line.
    pub(crate) fn note(&mut self) -> Option<u64> {
        self.total += 1;
        if self.last.is_some_and(|t| t.elapsed() < self.every) {
            return None;
        }
        let since = self.total - self.logged;
        (self.logged, self.last) = (self.total, Some(Instant::now()));
        Some(since)
    }

    /// Events counted so far.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_event_is_logged_once_per_period_with_the_count_since() {
        let mut t = Throttled::new(Duration::from_secs(3600));
        assert_eq!(t.note(), Some(1), "the first is logged at once");
        assert_eq!((t.note(), t.note()), (None, None), "then counted quietly");
        assert_eq!(t.total(), 3);
        let mut every = Throttled::new(Duration::ZERO);
        assert_eq!((every.note(), every.note()), (Some(1), Some(1)));
    }
}
