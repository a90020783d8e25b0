//! Streaming packing under several limits: [`LimitedStreamPacker`], the rule of the parent
//! module with every bin also within a cap per further resource (image tokens, images …) and
//! at most `max_segments` items.
//!
//! The rule, item by item (an item is a row: its length, then its size in each resource):
//! 1. An item over the capacity (aligned) or over any cap is oversized and follows the
//!    [`OversizePolicy`], as in the parent module.
//! 2. Otherwise it joins the buffer, kept by *share* desc then index asc (an item's share is
//!    Σ over the resources of ⌊size · 2^64 / cap⌋, tokens aligned, as in
//!    [`pack_multi`](crate::pack_multi)). While the buffer holds more than `max_buffered`
//!    items, its first item is placed:
//!    - into the open bin where it fits in every resource and segment count with the least
//!      room in the item's *dominant* resource (its largest size / cap, the first such
//!      resource on ties); ties to the oldest bin;
//!    - else, with fewer than `max_open_bins` open, into a new bin;
//!    - else the open bin with the least token room (ties: the oldest) is topped up — going
//!      through the first [`TOP_UP_SCAN`] buffered items in order, it takes each that still
//!      fits it in every resource — and closes; the item opens a new bin.
//! 3. A bin whose token room reaches 0, that holds `max_segments` items, or
//!    [`MAX_BIN_ITEMS`], closes at once.
//!
//! [`LimitedStreamPacker::finish`] places the buffered items in buffer order by rule 2 (the
//! bound on open bins holds there too), then closes every open bin, oldest first.
//!
//! With no cap and no segment limit the packer *is* a [`StreamPacker`](super::StreamPacker)
//! (it delegates to one), so its bins are that packer's, bit for bit.
//!
//! Cost per item: O(log `max_buffered`) in and out of the buffer (an ordered map), a best fit
//! over at most `max_open_bins` open bins, and for a top-up one pass over at most
//! [`TOP_UP_SCAN`] buffered items.
//!
//! The state saves to bytes (`SPSL`, framed like the parent's `SPSK`: versioned, sha256) and
//! restores exactly.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::Reverse;

use super::state::{Reader, check_end, frame, read_options, unframe, write_options};
use super::{ClosedBins, MAX_BIN_ITEMS, StreamOptions, StreamPacker, StreamStatus};
use crate::balance::{MicroLimits, resources};
use crate::multi::{dominant, fits, share};
use crate::{Error, OversizePolicy, invalid};

/// Further limits of a [`LimitedStreamPacker`] beside the tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// Each resource's cap per bin (each ≥ 1); up to 7.
    pub caps: Vec<u64>,
    /// The resources' names for messages, one per cap (all different, not `tokens`), or none
    /// (`resource 1`, `resource 2` …).
    pub names: Vec<String>,
    /// At most this many items per bin; 0 means no limit.
    pub max_segments: u64,
}

/// No further limit: no resource, no segment limit (what every SDK takes for omitted
/// options, the JavaScript SDK through its build manifest).
impl Default for StreamLimits {
    fn default() -> Self {
        Self { caps: Vec::new(), names: Vec::new(), max_segments: 0 }
    }
}

/// Bins closed by one call of a [`LimitedStreamPacker`], with their loads in each limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LimitedClosedBins {
    /// The bins, as [`StreamPacker`](super::StreamPacker) gives them (`loads`: aligned tokens).
    pub closed: ClosedBins,
    /// Every closed bin's load in each limit, bin by bin (`bins × caps` entries).
    pub resource_loads: Vec<u64>,
}

impl LimitedClosedBins {
    fn empty() -> Self {
        Self { closed: ClosedBins::empty(), resource_loads: Vec::new() }
    }
}

/// A buffered item.
#[derive(Clone, Debug)]
struct Item {
    index: u64,
    /// Aligned tokens, then the size in each limit.
    sizes: Vec<u64>,
}

/// The buffer's order: share desc, then index asc.
type Key = (Reverse<u128>, u64);

/// An open bin.
#[derive(Clone, Debug)]
struct Bin {
    /// Room left in every resource, tokens first.
    room: Vec<u64>,
    members: Vec<u64>,
}

/// A streaming packer under several limits (see the module docs for the rule).
#[derive(Clone, Debug)]
pub struct LimitedStreamPacker {
    options: StreamOptions,
    limits: StreamLimits,
    /// Every resource's cap, tokens (the capacity) first.
    caps: Vec<u64>,
    next_index: u64,
    /// Sizes by share desc, index asc.
    buffer: BTreeMap<Key, Vec<u64>>,
    /// Oldest first.
    open: Vec<Bin>,
    /// Without any limit: the plain packer, which does everything.
    plain: Option<StreamPacker>,
}

impl LimitedStreamPacker {
    /// An empty packer. Errors (`invalid-argument`): those of
    /// [`StreamPacker::new`](super::StreamPacker::new); more than 7 caps, a cap of 0, names not
    /// one per cap, empty, repeated or `tokens`.
    pub fn new(options: StreamOptions, limits: StreamLimits) -> Result<Self, Error> {
        options.check()?;
        let micro = MicroLimits { sizes: &[], caps: &limits.caps, names: &limits.names };
        let (caps, names) = resources(0, options.capacity, &micro)?;
        let limits = StreamLimits { names: names[1..].to_vec(), ..limits };
        let plain = (caps.len() == 1 && limits.max_segments == 0).then(|| StreamPacker::new(options)).transpose()?;
        Ok(Self { options, limits, caps, next_index: 0, buffer: BTreeMap::new(), open: Vec::new(), plain })
    }

    /// The options.
    pub fn options(&self) -> &StreamOptions {
        &self.options
    }

    /// The limits (unnamed resources named `resource 1`, `resource 2` …).
    pub fn limits(&self) -> &StreamLimits {
        &self.limits
    }

    /// Where the stream stands.
    pub fn status(&self) -> StreamStatus {
        if let Some(p) = &self.plain {
            return p.status();
        }
        let held = self.buffer.keys().map(|k| k.1).chain(self.open.iter().flat_map(|b| b.members.iter().copied()));
        StreamStatus {
            next_index: self.next_index,
            buffered: self.buffer.len() as u32,
            open_bins: self.open.len() as u32,
            in_open_bins: self.held_in_bins(),
            oldest_held: held.min(),
        }
    }

    fn held_in_bins(&self) -> u64 {
        self.open.iter().map(|b| b.members.len() as u64).sum()
    }

    /// Adds the next items of the stream, row by row (`rows[i·R..(i+1)·R]`: the length, then
    /// the size in each limit; `R` = 1 + the number of caps), and returns the bins that closed.
    ///
    /// Errors, with nothing applied: `invalid-argument` for `rows` not a whole number of rows,
    /// an aligned length above 2^64 − 1, or more than 2^32 − 1 items and held items together;
    /// `infeasible` for an oversized item under the `error` policy (naming its stream index,
    /// the resource, its size and the cap).
    pub fn add(&mut self, rows: &[u64]) -> Result<LimitedClosedBins, Error> {
        if let Some(p) = &mut self.plain {
            return p.add(rows).map(|closed| LimitedClosedBins { closed, resource_loads: Vec::new() });
        }
        let r = self.caps.len();
        if !rows.len().is_multiple_of(r) {
            return invalid!(
                "rows must hold whole rows of {r} values (the length, then one size per limit) (got {} values)",
                rows.len()
            );
        }
        let n = rows.len() / r;
        let held = self.buffer.len() as u64 + self.held_in_bins();
        if n as u64 + held > u32::MAX as u64 {
            return invalid!("rows has {n} items and the packer holds {held}; at most {} in all per call", u32::MAX);
        }
        if self.next_index.checked_add(n as u64).is_none() {
            return invalid!("the stream index would pass 2^64 − 1");
        }
        let align = self.options.align;
        let mut items = Vec::with_capacity(n);
        for (i, row) in rows.chunks_exact(r).enumerate() {
            let index = self.next_index + i as u64;
            let Some(a) = row[0].div_ceil(align).checked_mul(align) else {
                return invalid!(
                    "the length at stream index {index}, {}, rounded up to a multiple of align = {align} overflows u64",
                    row[0]
                );
            };
            let mut sizes = row.to_vec();
            sizes[0] = a;
            if let Some(q) = (0..r).find(|&q| sizes[q] > self.caps[q])
                && self.options.oversize == OversizePolicy::Error
            {
                let name = if q == 0 { "tokens" } else { self.limits.names[q - 1].as_str() };
                return Err(Error::Infeasible(alloc::format!(
                    "the item at stream index {index} has {} {name}, more than its cap {}; use oversize single or drop \
                     to accept such items",
                    sizes[q],
                    self.caps[q]
                )));
            }
            items.push(sizes);
        }
        let mut out = LimitedClosedBins::empty();
        for sizes in items {
            let index = self.next_index;
            self.next_index += 1;
            if !fits(&sizes, &self.caps) {
                match self.options.oversize {
                    OversizePolicy::Single => push(&mut out, alloc::vec![index], &sizes),
                    _ => out.closed.dropped.push(index),
                }
                continue;
            }
            self.buffer.insert((Reverse(share(&sizes, &self.caps)), index), sizes);
            while self.buffer.len() > self.options.max_buffered as usize {
                let Some(item) = self.pop_first() else { break };
                self.place(item, &mut out);
            }
        }
        Ok(out)
    }

    /// Places every buffered item (in buffer order, by rule 2) and closes every open bin,
    /// oldest first. The packer stays usable.
    pub fn finish(&mut self) -> LimitedClosedBins {
        if let Some(p) = &mut self.plain {
            return LimitedClosedBins { closed: p.finish(), resource_loads: Vec::new() };
        }
        let mut out = LimitedClosedBins::empty();
        while let Some(item) = self.pop_first() {
            self.place(item, &mut out);
        }
        for bin in core::mem::take(&mut self.open) {
            self.push_bin(&mut out, bin);
        }
        out
    }

    /// The first buffered item, taken out.
    fn pop_first(&mut self) -> Option<Item> {
        self.buffer.pop_first().map(|((_, index), sizes)| Item { index, sizes })
    }

    /// Rule 2 for the first buffered item.
    fn place(&mut self, item: Item, out: &mut LimitedClosedBins) {
        let b = match self.best_fit(&item.sizes) {
            Some(b) => b,
            None => {
                if self.open.len() >= self.options.max_open_bins as usize {
                    // The open bin with the least token room (the oldest on ties) is topped up
                    // from the buffer and closes.
                    let victim = (0..self.open.len()).min_by_key(|&b| (self.open[b].room[0], b)).unwrap_or(0);
                    // Room only shrinks: one pass over the first TOP_UP_SCAN buffered items, in
                    // order, takes every item that fits when its turn comes.
                    let mut room = self.open[victim].room.clone();
                    let mut taken = Vec::new();
                    let mut members = self.open[victim].members.len();
                    for (key, sizes) in self.buffer.iter().take(TOP_UP_SCAN) {
                        if members >= MAX_BIN_ITEMS
                            || (self.limits.max_segments > 0 && members as u64 >= self.limits.max_segments)
                        {
                            break;
                        }
                        if fits(sizes, &room) {
                            room.iter_mut().zip(sizes).for_each(|(r, s)| *r -= s);
                            members += 1;
                            taken.push(*key);
                        }
                    }
                    for key in taken {
                        let sizes = self.buffer.remove(&key).unwrap_or_default();
                        self.put(victim, Item { index: key.1, sizes });
                    }
                    self.close(victim, out);
                }
                self.open_bin()
            }
        };
        self.put(b, item);
        if self.open[b].room[0] == 0 || self.at_most_items(b) {
            self.close(b, out);
        }
    }

    /// The open bin taking `sizes` by best fit on its dominant resource (the oldest on ties).
    fn best_fit(&self, sizes: &[u64]) -> Option<usize> {
        let d = dominant(sizes, &self.caps);
        let mut best: Option<usize> = None;
        for (b, bin) in self.open.iter().enumerate() {
            if self.at_most_items(b) || !fits(sizes, &bin.room) {
                continue;
            }
            if best.is_none_or(|k| bin.room[d] < self.open[k].room[d]) {
                best = Some(b);
            }
        }
        best
    }

    /// Whether open bin `b` holds as many items as a bin may.
    fn at_most_items(&self, b: usize) -> bool {
        let m = self.open[b].members.len();
        m >= MAX_BIN_ITEMS || (self.limits.max_segments > 0 && m as u64 >= self.limits.max_segments)
    }

    fn open_bin(&mut self) -> usize {
        self.open.push(Bin { room: self.caps.clone(), members: Vec::new() });
        self.open.len() - 1
    }

    fn put(&mut self, b: usize, item: Item) {
        let bin = &mut self.open[b];
        for (room, s) in bin.room.iter_mut().zip(&item.sizes) {
            *room -= s;
        }
        bin.members.push(item.index);
    }

    fn close(&mut self, b: usize, out: &mut LimitedClosedBins) {
        let bin = self.open.remove(b);
        self.push_bin(out, bin);
    }

    fn push_bin(&self, out: &mut LimitedClosedBins, bin: Bin) {
        let loads: Vec<u64> = self.caps.iter().zip(&bin.room).map(|(c, r)| c - r).collect();
        push(out, bin.members, &loads);
    }

    /// The whole state as bytes: `SPSL`, format version (u32 LE), payload length (u64 LE),
    /// the payload (options, limits, then the stream index, the buffered items by index with
    /// their sizes, the open bins oldest first with their rooms and members — or, without any
    /// limit, the plain packer's `SPSK` state), and the sha256 of everything before it.
    pub fn state(&self) -> Vec<u8> {
        let mut p = Vec::new();
        write_options(&mut p, &self.options);
        p.extend_from_slice(&self.limits.max_segments.to_le_bytes());
        p.extend_from_slice(&(self.limits.caps.len() as u32).to_le_bytes());
        for (cap, name) in self.limits.caps.iter().zip(&self.limits.names) {
            p.extend_from_slice(&cap.to_le_bytes());
            p.extend_from_slice(&(name.len() as u32).to_le_bytes());
            p.extend_from_slice(name.as_bytes());
        }
        if let Some(plain) = &self.plain {
            // Without limits: the plain packer's own state.
            let inner = plain.state();
            p.extend_from_slice(&(inner.len() as u64).to_le_bytes());
            p.extend_from_slice(&inner);
            return frame(STATE_MAGIC, STATE_VERSION, &p);
        }
        p.extend_from_slice(&self.next_index.to_le_bytes());
        let mut items: Vec<(u64, &Vec<u64>)> = self.buffer.iter().map(|(k, sizes)| (k.1, sizes)).collect();
        items.sort_unstable_by_key(|&(index, _)| index);
        p.extend_from_slice(&(items.len() as u32).to_le_bytes());
        for (index, sizes) in items {
            p.extend_from_slice(&index.to_le_bytes());
            sizes.iter().for_each(|s| p.extend_from_slice(&s.to_le_bytes()));
        }
        p.extend_from_slice(&(self.open.len() as u32).to_le_bytes());
        for bin in &self.open {
            bin.room.iter().for_each(|s| p.extend_from_slice(&s.to_le_bytes()));
            let mut members = bin.members.clone();
            members.sort_unstable();
            p.extend_from_slice(&(members.len() as u32).to_le_bytes());
            members.iter().for_each(|m| p.extend_from_slice(&m.to_le_bytes()));
        }
        frame(STATE_MAGIC, STATE_VERSION, &p)
    }

    /// A packer from [`state`](Self::state)'s bytes. Errors (`invalid-argument`, naming what is
    /// wrong): not a limited stream-packer state, another format version, damage (length or
    /// sha256 mismatch), or contents no packer can hold (checked in full).
    pub fn from_state(state: &[u8]) -> Result<Self, Error> {
        let mut r = Reader { bytes: unframe(state, STATE_MAGIC, STATE_VERSION, "limited stream-packer")? };
        let options = read_options(&mut r)?;
        let max_segments = r.u64()?;
        let e = r.count(12, crate::MAX_RESOURCES as u32 - 1, "limits")?;
        let (mut caps, mut names) = (Vec::new(), Vec::new());
        for _ in 0..e {
            caps.push(r.u64()?);
            let len = r.count(1, 1 << 12, "name bytes")?;
            let mut bytes = Vec::with_capacity(len as usize);
            for _ in 0..len {
                bytes.push(r.u8()?);
            }
            match String::from_utf8(bytes) {
                Ok(name) => names.push(name),
                Err(_) => return invalid!("state holds a limit name that is not UTF-8"),
            }
        }
        let mut packer = Self::new(options, StreamLimits { caps, names, max_segments })?;
        if packer.plain.is_some() {
            let len = r.u64()?;
            if len != r.bytes.len() as u64 {
                return invalid!("state is damaged: its plain packer's state does not fill the rest of it");
            }
            let plain = StreamPacker::from_state(r.bytes)?;
            if *plain.options() != options {
                return invalid!("state's plain packer has other options than the state");
            }
            packer.plain = Some(plain);
            return Ok(packer);
        }
        let rows = packer.caps.len();
        packer.next_index = r.u64()?;
        let buffered = r.count(8 + 8 * rows, options.max_buffered, "buffered items")?;
        let mut held: Vec<u64> = Vec::new();
        for _ in 0..buffered {
            let index = r.u64()?;
            let sizes = (0..rows).map(|_| r.u64()).collect::<Result<Vec<u64>, Error>>()?;
            if !fits(&sizes, &packer.caps) || !sizes[0].is_multiple_of(options.align) {
                return invalid!("state holds a buffered item over a cap, or a length that is not aligned");
            }
            if held.last().is_some_and(|&last| index <= last) {
                return invalid!("state's buffered items are not in ascending index order");
            }
            held.push(index);
            packer.buffer.insert((Reverse(share(&sizes, &packer.caps)), index), sizes);
        }
        let open = r.count(8 * rows + 4, options.max_open_bins, "open bins")?;
        for _ in 0..open {
            let room = (0..rows).map(|_| r.u64()).collect::<Result<Vec<u64>, Error>>()?;
            if room[0] == 0 || !fits(&room, &packer.caps) {
                return invalid!("state holds an open bin whose room is 0 in tokens or above a cap");
            }
            let count = r.count(8, MAX_BIN_ITEMS as u32 - 1, "members of an open bin")?;
            if count == 0 || (max_segments > 0 && u64::from(count) >= max_segments) {
                return invalid!("state holds an open bin of {count} members: empty, or one that would have closed");
            }
            let members = (0..count).map(|_| r.u64()).collect::<Result<Vec<u64>, Error>>()?;
            held.extend_from_slice(&members);
            packer.open.push(Bin { room, members });
        }
        check_end(&r, held, packer.next_index)?;
        Ok(packer)
    }
}

/// Appends a bin of `members` (sorted here) whose loads in every resource are `loads`
/// (tokens first).
fn push(out: &mut LimitedClosedBins, mut members: Vec<u64>, loads: &[u64]) {
    out.closed.push(&mut members, loads[0]);
    out.resource_loads.extend_from_slice(&loads[1..]);
}

/// A top-up looks at this many buffered items at most (the first ones in buffer order), so
/// that a step costs O(`max_open_bins` + 4,096) whatever `max_buffered` is.
pub const TOP_UP_SCAN: usize = 4096;

const STATE_MAGIC: &[u8; 4] = b"SPSL";

/// Whether `state` is (or claims to be) a limited packer's: it starts with `SPSL`. What
/// decides which packer restores a state; the restore checks every other byte.
pub fn is_limited_state(state: &[u8]) -> bool {
    state.starts_with(STATE_MAGIC)
}
const STATE_VERSION: u32 = 1;
