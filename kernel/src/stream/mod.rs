//! Streaming bin packing: lengths arrive a few at a time, and each bin is handed out when it
//! closes, so a dataset that never fits in memory (an iterable pretraining stream) can be
//! packed. Memory is bounded by the options, never by the stream: at most `max_buffered`
//! items wait unplaced and at most `max_open_bins` bins of fewer than [`MAX_BIN_ITEMS`]
//! items each are open; each step costs O(log) of those bounds.
//!
//! The rule, item by item (so the result does not depend on how the stream is cut into
//! [`StreamPacker::add`] calls):
//! 1. An item whose aligned length exceeds the capacity follows the [`OversizePolicy`]:
//!    `error` refuses the call (nothing of it is applied), `single` closes a bin holding it
//!    alone at once, `drop` lists it in [`ClosedBins::dropped`].
//! 2. Otherwise it joins the buffer. While the buffer holds more than `max_buffered` items,
//!    the largest buffered item (longest aligned length, then smallest index) is placed:
//!    - into the open bin with the least room that fits it (best fit; ties to the oldest bin);
//!    - else, with fewer than `max_open_bins` open, into a new bin;
//!    - else the open bin with the least room (ties: the oldest) is *topped up* — it takes,
//!      one by one, the largest buffered item that fits its room (ties: smallest index) until
//!      none fits — and closes; the item opens a new bin.
//! 3. A bin whose room reaches 0, or that holds [`MAX_BIN_ITEMS`] items, closes at once.
//!
//! [`StreamPacker::finish`] places the buffered items largest first by best fit, opening bins
//! as needed (a bin reaching [`MAX_BIN_ITEMS`] items closes at once), then closes every open
//! bin, oldest first. Members of a closed bin ascend by
//! index; bins come out in the order they close.
//!
//! Buffering the smallest items (the largest is always placed first) keeps material to fill
//! the last gaps of a bin before it closes: with the defaults, bins come within 0.2 % of the
//! offline lower bound on the shared workloads (`BENCHMARKS.md`).
//!
//! Under further limits per bin (image tokens, images, segments), [`LimitedStreamPacker`]
//! follows the same rule with every resource (see `stream/limited.rs`).
//!
//! The whole state saves to bytes ([`StreamPacker::state`]: framed, versioned, sha256) and
//! restores exactly ([`StreamPacker::from_state`]): a restarted stream gives the bins an
//! uninterrupted one gives.

use alloc::vec::Vec;

use crate::{Error, OversizePolicy, invalid};

mod buffer;
mod limited;
mod open_bins;
mod state;

pub use limited::{LimitedClosedBins, LimitedStreamPacker, StreamLimits, TOP_UP_SCAN, is_limited_state};

use buffer::Buffer;
use open_bins::OpenBins;

/// The default bound on open bins.
pub const DEFAULT_MAX_OPEN_BINS: u32 = 64;
/// The default bound on buffered (not yet placed) items.
pub const DEFAULT_MAX_BUFFERED: u32 = 4096;
/// The largest `max_open_bins`.
pub const MAX_OPEN_BINS: u32 = 1 << 16;
/// The largest `max_buffered`.
pub const MAX_BUFFERED: u32 = 1 << 20;
/// A bin holding this many items closes (rule 3), so that zero-length items, which take no
/// room, cannot pile up in one bin for ever: memory stays bounded by the options.
pub const MAX_BIN_ITEMS: usize = 1 << 16;
/// Capacities up to this keep the buffer in one bucket per aligned length; larger ones in an
/// ordered set (the same choices, slower).
const BUCKET_CAPACITY: u64 = 1 << 20;

crate::__options! { $ __stream_options;
/// Options of a [`StreamPacker`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamOptions {
    /// Tokens per bin, at least 1.
    pub capacity: u64,
    /// Every length is rounded up to a multiple of `align` (at least 1) before packing.
    pub align: u64,
    /// Open bins at most, 1..=[`MAX_OPEN_BINS`].
    pub max_open_bins: u32,
    /// Buffered items at most, 0..=[`MAX_BUFFERED`] (0: every item is placed on arrival).
    pub max_buffered: u32,
    /// What happens to an item whose aligned length exceeds the capacity.
    pub oversize: OversizePolicy,
}
}

impl StreamOptions {
    /// Options with the given capacity and the defaults: `align` 1,
    /// [`DEFAULT_MAX_OPEN_BINS`], [`DEFAULT_MAX_BUFFERED`], oversize `error`.
    pub fn new(capacity: u64) -> Self {
        Self {
            capacity,
            align: 1,
            max_open_bins: DEFAULT_MAX_OPEN_BINS,
            max_buffered: DEFAULT_MAX_BUFFERED,
            oversize: OversizePolicy::Error,
        }
    }

    fn check(&self) -> Result<(), Error> {
        if self.capacity == 0 {
            return invalid!("capacity must be at least 1 token (got 0)");
        }
        if self.align == 0 {
            return invalid!("align must be at least 1 (got 0)");
        }
        if !(1..=MAX_OPEN_BINS).contains(&self.max_open_bins) {
            return invalid!("max_open_bins must be in 1..={MAX_OPEN_BINS} (got {})", self.max_open_bins);
        }
        if self.max_buffered > MAX_BUFFERED {
            return invalid!("max_buffered must be in 0..={MAX_BUFFERED} (got {})", self.max_buffered);
        }
        Ok(())
    }
}

/// Bins closed by one call, in flat form, and the items it dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClosedBins {
    /// `bins + 1` offsets into `indices` (starting at 0).
    pub offsets: Vec<u32>,
    /// Stream indices (0-based, counted over every length ever added), bin by bin,
    /// ascending inside a bin.
    pub indices: Vec<u64>,
    /// The aligned load of each bin (above the capacity only for an oversized item alone).
    pub loads: Vec<u64>,
    /// Oversized items left out under the `drop` policy, ascending.
    pub dropped: Vec<u64>,
}

impl ClosedBins {
    fn empty() -> Self {
        Self { offsets: alloc::vec![0], ..Self::default() }
    }

    /// The number of bins.
    pub fn bins(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The members of bin `b`.
    pub fn bin(&self, b: usize) -> &[u64] {
        &self.indices[self.offsets[b] as usize..self.offsets[b + 1] as usize]
    }

    /// Appends a bin (sorting `members`, which is left empty).
    fn push(&mut self, members: &mut Vec<u64>, load: u64) {
        members.sort_unstable();
        self.indices.extend_from_slice(members);
        members.clear();
        // At most 2^32 − 1: `add` refuses a call that could hand out more items.
        self.offsets.push(self.indices.len() as u32);
        self.loads.push(load);
    }
}

/// Where a stream stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamStatus {
    /// The index the next added length gets (= lengths added so far).
    pub next_index: u64,
    /// Items buffered, not yet in a bin.
    pub buffered: u32,
    /// Bins open.
    pub open_bins: u32,
    /// Items in open bins.
    pub in_open_bins: u64,
    /// The smallest index still held (buffered or in an open bin); `None` when nothing is.
    /// Every smaller index is in a closed bin or was dropped.
    pub oldest_held: Option<u64>,
}

/// A streaming packer (see the module docs for the rule).
#[derive(Clone, Debug)]
pub struct StreamPacker {
    options: StreamOptions,
    next_index: u64,
    buffer: Buffer,
    open: OpenBins,
}

impl StreamPacker {
    /// An empty packer. Errors (`invalid-argument`): `capacity` or `align` 0, `max_open_bins`
    /// outside 1..=2^16, `max_buffered` above 2^20.
    pub fn new(options: StreamOptions) -> Result<Self, Error> {
        options.check()?;
        Ok(Self {
            options,
            next_index: 0,
            buffer: Buffer::new(options.capacity),
            open: OpenBins::new(options.capacity, options.max_open_bins),
        })
    }

    /// The options.
    pub fn options(&self) -> &StreamOptions {
        &self.options
    }

    /// Where the stream stands.
    pub fn status(&self) -> StreamStatus {
        let oldest_bin = self.open.bins.iter().flat_map(|b| b.members.iter().copied()).min();
        let oldest = match (self.buffer.oldest(), oldest_bin) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        StreamStatus {
            next_index: self.next_index,
            buffered: self.buffer.len() as u32,
            open_bins: self.open.count as u32,
            in_open_bins: self.open.held(),
            oldest_held: oldest,
        }
    }

    /// Adds `lengths` (the next indices of the stream) and returns the bins that closed.
    ///
    /// Errors, with nothing applied: `invalid-argument` for an aligned length above 2^64 − 1,
    /// or more than 2^32 − 1 entries and held items together; `infeasible` for an oversized item under the `error`
    /// policy (naming its stream index).
    pub fn add(&mut self, lengths: &[u64]) -> Result<ClosedBins, Error> {
        let StreamOptions { capacity, align, oversize, .. } = self.options;
        let held = self.buffer.len() as u64 + self.open.held();
        if lengths.len() as u64 + held > u32::MAX as u64 {
            return invalid!(
                "lengths has {} entries and the packer holds {held} items; at most {} in all per call",
                lengths.len(),
                u32::MAX
            );
        }
        if self.next_index.checked_add(lengths.len() as u64).is_none() {
            return invalid!("the stream index would pass 2^64 − 1");
        }
        for (i, &len) in lengths.iter().enumerate() {
            let Some(a) = len.div_ceil(align).checked_mul(align) else {
                return invalid!(
                    "the length at stream index {}, {len}, rounded up to a multiple of align = {align} overflows u64",
                    self.next_index + i as u64
                );
            };
            if a > capacity && oversize == OversizePolicy::Error {
                return Err(Error::Infeasible(alloc::format!(
                    "the length at stream index {}, {len} (aligned {a}), exceeds capacity = {capacity}; \
                     use oversize single or drop to accept such items",
                    self.next_index + i as u64
                )));
            }
        }
        let mut out = ClosedBins::empty();
        for &len in lengths {
            let index = self.next_index;
            self.next_index += 1;
            // Cannot overflow: checked above.
            let a = len.div_ceil(align) * align;
            if a > capacity {
                match oversize {
                    OversizePolicy::Single => out.push(&mut alloc::vec![index], a),
                    _ => out.dropped.push(index),
                }
                continue;
            }
            self.buffer.push(a, index);
            while self.buffer.len() > self.options.max_buffered as usize {
                self.place_largest(&mut out);
            }
        }
        Ok(out)
    }

    /// Places every buffered item (largest first, best fit, new bins as needed) and closes
    /// every open bin, oldest first. The packer stays usable: later lengths continue the
    /// stream's indices.
    pub fn finish(&mut self) -> ClosedBins {
        let mut out = ClosedBins::empty();
        while let Some((a, index)) = self.buffer.pop_at_most(u64::MAX) {
            let b = self.open.take_best(a).unwrap_or_else(|| self.open.new_bin());
            self.open.put(b, a, index);
            if self.open.bins[b].members.len() >= MAX_BIN_ITEMS {
                self.open.close(b, &mut out);
            } else {
                self.open.index(b);
            }
        }
        self.open.close_all(&mut out);
        out
    }

    /// The largest buffered item into a bin (rule 2 of the module docs).
    fn place_largest(&mut self, out: &mut ClosedBins) {
        let Some((a, index)) = self.buffer.pop_at_most(u64::MAX) else { return };
        let b = match self.open.take_best(a) {
            Some(b) => b,
            None => {
                if self.open.count >= self.options.max_open_bins as usize
                    && let Some(victim) = self.open.take_least()
                {
                    // Fill the victim's room from the buffer: the largest item that fits,
                    // again and again.
                    while self.open.bins[victim].members.len() < MAX_BIN_ITEMS
                        && let Some((a, index)) = self.buffer.pop_at_most(self.open.bins[victim].room)
                    {
                        self.open.put(victim, a, index);
                    }
                    self.open.close(victim, out);
                }
                self.open.new_bin()
            }
        };
        self.open.put(b, a, index);
        if self.open.full(b) {
            self.open.close(b, out);
        } else {
            self.open.index(b);
        }
    }
}

#[cfg(test)]
#[path = "../../tests/support/stream.rs"]
mod stream_support;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use stream_support::stream_case;

    fn options(capacity: u64, open: u32, buffered: u32, oversize: OversizePolicy) -> StreamOptions {
        StreamOptions { capacity, align: 1, max_open_bins: open, max_buffered: buffered, oversize }
    }

    /// Every bin of a whole run, `lengths` added in pieces cut at `cuts`.
    fn run(o: StreamOptions, lengths: &[u64], cuts: &[usize]) -> (Vec<(Vec<u64>, u64)>, Vec<u64>) {
        let mut p = StreamPacker::new(o).unwrap();
        let mut bins = Vec::new();
        let mut dropped = Vec::new();
        let mut start = 0;
        let mut take = |c: ClosedBins, bins: &mut Vec<(Vec<u64>, u64)>| {
            for b in 0..c.bins() {
                bins.push((c.bin(b).to_vec(), c.loads[b]));
            }
            dropped.extend_from_slice(&c.dropped);
        };
        for &cut in cuts.iter().chain([lengths.len()].iter()) {
            let end = cut.clamp(start, lengths.len());
            take(p.add(&lengths[start..end]).unwrap(), &mut bins);
            start = end;
        }
        take(p.finish(), &mut bins);
        (bins, dropped)
    }

    proptest! {
        /// Every index lands in exactly one bin (or is dropped), no regular bin is over the
        /// capacity, loads are the members' aligned sums, the open and buffered counts stay
        /// within their bounds, and how the stream is cut into calls changes nothing.
        #[test]
        fn bins_are_a_partition_within_bounds_whatever_the_cuts(
            (lengths, o) in stream_case(120, 1..400, 150, 6, 40),
            cuts in proptest::collection::vec(0usize..400, 0..6),
        ) {
            let capacity = o.capacity;
            let (bins, dropped) = run(o, &lengths, &cuts);
            let (whole, whole_dropped) = run(o, &lengths, &[]);
            prop_assert_eq!(&bins, &whole);
            prop_assert_eq!(&dropped, &whole_dropped);
            let mut seen = alloc::vec![false; lengths.len()];
            for (members, load) in &bins {
                prop_assert!(!members.is_empty());
                prop_assert!(members.windows(2).all(|w| w[0] < w[1]));
                let sum: u64 = members.iter().map(|&i| lengths[i as usize]).sum();
                prop_assert_eq!(sum, *load);
                prop_assert!(*load <= capacity || members.len() == 1);
                for &i in members {
                    prop_assert!(!seen[i as usize]);
                    seen[i as usize] = true;
                }
            }
            for &i in &dropped {
                prop_assert!(lengths[i as usize] > capacity);
                prop_assert!(!seen[i as usize]);
                seen[i as usize] = true;
            }
            prop_assert!(seen.iter().all(|&s| s));
        }

        /// A packer saved and restored at any point gives the bins of an uninterrupted
        /// run; the ordered-set buffer (large capacities) makes the choices of the buckets.
        #[test]
        fn restore_continues_exactly_and_both_buffers_agree(
            (lengths, o) in stream_case(90, 1..300, 100, 5, 30),
            at in 0usize..300,
        ) {
            let o = StreamOptions { oversize: OversizePolicy::Single, ..o };
            let (whole, _) = run(o, &lengths, &[]);
            let at = at.min(lengths.len());
            let mut p = StreamPacker::new(o).unwrap();
            let first = p.add(&lengths[..at]).unwrap();
            let state = p.state();
            let mut q = StreamPacker::from_state(&state).unwrap();
            prop_assert_eq!(q.state(), state);
            let mut bins: Vec<(Vec<u64>, u64)> = Vec::new();
            for c in [first, q.add(&lengths[at..]).unwrap(), q.finish()] {
                for b in 0..c.bins() {
                    bins.push((c.bin(b).to_vec(), c.loads[b]));
                }
            }
            prop_assert_eq!(&bins, &whole);
            // The same choices with the ordered set: scale lengths and capacity past the
            // bucket limit.
            let scale = 2 * BUCKET_CAPACITY;
            let big: Vec<u64> = lengths.iter().map(|&l| l * scale).collect();
            let (scaled, _) = run(StreamOptions { capacity: o.capacity * scale, ..o }, &big, &[]);
            let unscaled: Vec<(Vec<u64>, u64)> = scaled.into_iter().map(|(m, l)| (m, l / scale)).collect();
            prop_assert_eq!(unscaled, whole);
        }

        /// Damaged states are refused, never restored: any flipped byte, any truncation.
        #[test]
        fn damaged_states_are_refused(
            lengths in proptest::collection::vec(0u64..50, 1..80),
            flip in any::<usize>(),
            bit in 0u8..8,
            cut in any::<usize>(),
        ) {
            let mut p = StreamPacker::new(options(60, 3, 10, OversizePolicy::Error)).unwrap();
            p.add(&lengths).unwrap();
            let state = p.state();
            let mut flipped = state.clone();
            let at = flip % flipped.len();
            flipped[at] ^= 1 << bit;
            prop_assert!(StreamPacker::from_state(&flipped).is_err());
            prop_assert!(StreamPacker::from_state(&state[..cut % state.len()]).is_err());
        }
    }

    #[test]
    fn bad_options_and_oversize_items_are_refused_naming_the_argument() {
        let err = |o: StreamOptions| match StreamPacker::new(o) {
            Err(Error::InvalidArgument(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(err(StreamOptions { capacity: 0, ..StreamOptions::new(1) }).contains("capacity"));
        assert!(err(StreamOptions { align: 0, ..StreamOptions::new(1) }).contains("align"));
        assert!(
            err(StreamOptions { max_open_bins: 0, ..StreamOptions::new(1) })
                .contains("max_open_bins must be in 1..=65536")
        );
        assert!(
            err(StreamOptions { max_buffered: MAX_BUFFERED + 1, ..StreamOptions::new(1) }).contains("max_buffered")
        );
        let mut p = StreamPacker::new(StreamOptions::new(10)).unwrap();
        p.add(&[3, 4]).unwrap();
        let before = p.state();
        match p.add(&[1, 11, 2]) {
            Err(Error::Infeasible(m)) => assert!(m.contains("stream index 3"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(p.state(), before, "a refused call applies nothing");
        let mut a = StreamPacker::new(StreamOptions { align: 1 << 40, ..StreamOptions::new(u64::MAX) }).unwrap();
        assert!(matches!(a.add(&[u64::MAX]), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn zero_length_items_cannot_pile_up() {
        // Zeros take no room: without the item bound they would all join one bin for ever.
        let mut p = StreamPacker::new(options(10, 4, 0, OversizePolicy::Error)).unwrap();
        let zeros = alloc::vec![0u64; 3 * MAX_BIN_ITEMS + 5];
        let c = p.add(&zeros).unwrap();
        assert_eq!(c.bins(), 3);
        assert!((0..3).all(|b| c.bin(b).len() == MAX_BIN_ITEMS));
        assert_eq!(p.status().in_open_bins, 5);
        let c = p.finish();
        assert_eq!((c.bins(), c.bin(0).len()), (1, 5));
    }

    #[test]
    fn bins_close_when_full_and_when_the_open_bins_run_out() {
        // Capacity 10, one open bin, nothing buffered: a full bin closes at once; an item
        // that does not fit closes the open bin.
        let mut p = StreamPacker::new(options(10, 1, 0, OversizePolicy::Error)).unwrap();
        let c = p.add(&[4, 6, 7, 2]).unwrap();
        assert_eq!((c.bins(), c.bin(0), c.loads[0]), (1, &[0, 1][..], 10));
        let c = p.add(&[5]).unwrap();
        assert_eq!((c.bin(0), c.loads[0]), (&[2, 3][..], 9));
        let c = p.finish();
        assert_eq!((c.bins(), c.bin(0), c.loads[0]), (1, &[4][..], 5));
        assert_eq!(
            p.status(),
            StreamStatus { next_index: 5, buffered: 0, open_bins: 0, in_open_bins: 0, oldest_held: None }
        );
        // With a buffer, a bin that must close is topped up from it first.
        let mut p = StreamPacker::new(options(10, 1, 2, OversizePolicy::Error)).unwrap();
        let c = p.add(&[7, 1, 2, 8, 9]).unwrap();
        // 7 is placed (bin A); 8 arrives, 8 is placed: no fit, A is topped up with 2 and 1
        // (7+2+1 = 10) and closes.
        assert_eq!((c.bins(), c.bin(0), c.loads[0]), (1, &[0, 1, 2][..], 10));
        assert_eq!(p.status().oldest_held, Some(3));
    }
}
