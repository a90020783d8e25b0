//! The `balanced` method of [`pack_multi`](super::pack_multi): bins filled one at a time so
//! that their resources run out together, in three phases and O(n log n) time.
//!
//! Every decision uses integers; ties go to the lower input index or the older bin. The
//! items given here all fit (oversized ones were set aside by the caller), tokens already
//! aligned, every capacity below 2^32, fewer than 2^32 − 16 items.
//!
//! *Shares.* The share of a size `v` of resource `q` is `norm(v) = ⌊v · ⌊2^63 / cap⌋ / 2^32⌋`,
//! `v · 2^31 / cap` within one unit (exact when the capacity is a power of two): a multiply
//! instead of a division per size, the same on every platform.
//!
//! One pass classifies the items:
//! - **text** (zero in every resource after tokens) → phase 2;
//! - **large** (complex, ≥ [`LARGE_UNITS`] units of the *bucket resource* `qb`, the smallest
//!   capacity after tokens — a unit is 1 when that capacity is ≤ 64, else capacity / 64 — or
//!   a largest share with `norm(v) >> 20` ≥ [`LARGE_SHARE`], about 8 % of a capacity) →
//!   phase 1a;
//! - **small** (the other complex items) → phase 1b.
//!
//! **Phase 1a, balanced fill.** Large items are bucketed by their `qb` units (0 to 4 exactly,
//! then 5–8, 9–16, 17–32, 33–64) and ordered in a bucket by their size in the *key resource*
//! `qk` (the resource other than `qb` with the largest `Σ norm(v) >> 8` over the large items),
//! index descending on ties. A bin opens with the unplaced large item of the largest share
//! (`norm(v) >> 20` over its resources; index ascending on ties). While it has a free segment,
//! every bucket that may fit offers a candidate — its item with the largest `qk` size within
//! the room that fits in every resource (at most [`TRIES`] tried down the bucket) — and the
//! bin takes the candidate that leaves its rooms most even: with `u_q = norm(room_q) −
//! norm(size_q)` (0 at least), the least `max u − min u`, then the least `Σ u`; then the lower
//! index. No candidate: the bin is done.
//!
//! **Phase 1b, best fit of the small items**, by their *key* descending, index ascending. An
//! item's key is its largest `⌊v · ⌈2^45 / cap⌉ / 2^32⌋ + 1` (at least its size in 1/[`UNITS`]
//! of the capacity, rounded up) over the resources other than `qb` — `qb` too unless all small
//! items have the same `qb` size. A bin's key room is its least `⌊room · ⌊2^45 / cap⌋ / 2^32⌋`
//! (at most its room in 1/[`UNITS`], rounded down) over the same resources, and bins are
//! indexed while they can still take a small item (a free segment, and room ≥ the smallest
//! small size in every resource). An item takes the indexed bin with the smallest key room ≥
//! its key, oldest on ties, checked exactly in every resource ([`SMALL_TRIES`] bins at most),
//! else a new bin.
//!
//! **Phase 2, best fit decreasing of the text items on tokens** (length desc, index asc; the
//! least token room that fits, oldest bin on ties) over every bin with a free segment, then
//! new bins. With one resource this is plain BFD under the segment limit.

use alloc::vec::Vec;

use crate::bits::BitSet;
use crate::rooms::RoomIndex;
use crate::sort::radix_sort_high;

/// Candidates tried per bucket in phase 1a before the bucket is passed over for the bin.
const TRIES: usize = 4;
/// Bins tried per small item in phase 1b before it opens a new bin.
const SMALL_TRIES: usize = 4;
/// Resolution of phase 1b's index: rooms and sizes in 1/`UNITS` of a capacity.
const UNITS: u64 = 8192;
/// A complex item with a share ≥ `LARGE_SHARE` / 2048 (8 %) of some capacity is large.
const LARGE_SHARE: u64 = 164;
/// A complex item with ≥ `LARGE_UNITS` units of the bucket resource is large.
const LARGE_UNITS: usize = 2;
/// A free-segment count that never runs out (no segment limit).
const UNLIMITED: u32 = u32::MAX;

/// The largest capacity the `balanced` method takes (rooms are held in 32 bits).
pub const MAX_BALANCED_CAPACITY: u64 = u32::MAX as u64;

/// The most items the `balanced` method takes in one call (positions, buckets included, are
/// held in 32 bits).
pub const MAX_BALANCED_ITEMS: usize = u32::MAX as usize - 16;

/// Packs the items of `classes` (rows that a pass sorted into classes with their `R` sizes;
/// every item within every capacity, every capacity in `1..=MAX_BALANCED_CAPACITY`,
/// at most [`MAX_BALANCED_ITEMS`] rows) with at most `max_segments` items per bin (0: no
/// limit), into bins numbered from `first`. Writes each item's bin to `assign` (indexed by
/// row), appends every bin's load in every resource to `loads`, and returns the number of
/// bins.
pub(super) fn fill<const R: usize>(
    classes: Classes<R>,
    max_segments: u64,
    first: u32,
    assign: &mut [u32],
    loads: &mut Vec<u64>,
) -> usize {
    let segments = if max_segments == 0 { UNLIMITED } else { max_segments.min(u64::from(UNLIMITED - 1)) as u32 };
    let Classes { scale, ib, .. } = classes;
    Fill { scale, segments, ib, first, rooms: Vec::new(), segs: Vec::new() }.run(classes, assign, loads)
}

/// Bits needed for the indices `0..n`.
fn index_bits(n: usize) -> u32 {
    (usize::BITS - n.saturating_sub(1).leading_zeros()).max(1)
}

/// The capacities and the shares and buckets measured against them.
#[derive(Clone, Copy)]
struct Scale<const R: usize> {
    caps: [u64; R],
    /// `⌊2^63 / cap⌋` per resource: `norm(v) = (v · mul) >> 32`, `v · 2^31 / cap` within one
    /// unit, at most 2^31 for `v ≤ cap`.
    muls: [u64; R],
    /// The bucket resource (the smallest capacity after tokens; 0 with one resource).
    qb: usize,
}

impl<const R: usize> Scale<R> {
    /// `v` (≤ the capacity of `q`) as a fraction of that capacity, in 2^-31 (within one unit;
    /// see the module).
    #[inline]
    fn norm(&self, v: u64, q: usize) -> u32 {
        ((v * self.muls[q]) >> 32) as u32
    }

    /// The bucket of `v` units of the bucket resource.
    #[inline]
    fn bucket(&self, v: u64) -> usize {
        let cap = self.caps[self.qb];
        let per = cap.min(64);
        let u = if per == cap { v } else { v * per / cap };
        if u <= 4 { u as usize } else { 2 + (64 - (u - 1).leading_zeros()) as usize }
    }
}

/// The items sorted into the fill's three classes (see the module) as a pass over the rows
/// meets them ([`Classes::add`]), with what phases 1a and 1b need to know of each class.
pub(super) struct Classes<const R: usize> {
    scale: Scale<R>,
    /// Bits of a row index.
    ib: u32,
    /// `⌈UNITS · 2^32 / cap⌉` per resource: `((v · up) >> 32) + 1` ≥ `⌈v · UNITS / cap⌉`.
    up: [u64; R],
    /// Text items' keys: (cap0 − tokens, row).
    text: Vec<u64>,
    /// Large items: their rows (item j is row `large[j]`), their sizes in 32 bits, their
    /// opener keys (2048 − share, j), and the sum of their shares per resource (`norm >> 8`).
    large: Vec<u32>,
    /// See `large`.
    large_rows: Vec<[u32; R]>,
    /// See `large`.
    openers: Vec<u64>,
    /// See `large`.
    share_sum: [u64; R],
    /// Small items: their rows (item s is row `small[s]`), their sizes in 32 bits, their keys
    /// (UNITS + 1 − key, s), and their least and most size per resource.
    small: Vec<u32>,
    /// See `small`.
    small_rows: Vec<[u32; R]>,
    /// See `small`.
    small_keys: Vec<u64>,
    /// See `small`.
    least: [u64; R],
    /// See `small`.
    most: [u64; R],
}

impl<const R: usize> Classes<R> {
    /// The capacities.
    pub(super) fn caps(&self) -> [u64; R] {
        self.scale.caps
    }

    /// No item yet, for rows numbered below `n`, under `caps` (`R` entries, each in
    /// `1..=MAX_BALANCED_CAPACITY`).
    pub(super) fn new(caps: &[u64], n: usize) -> Self {
        let mut c = [0u64; R];
        c.copy_from_slice(caps);
        Classes {
            scale: Scale {
                caps: c,
                muls: c.map(|cap| (1u64 << 63) / cap),
                qb: (1..R).min_by_key(|&q| (c[q], q)).unwrap_or(0),
            },
            ib: index_bits(n),
            up: c.map(|cap| (UNITS << 32).div_ceil(cap)),
            text: Vec::new(),
            large: Vec::new(),
            large_rows: Vec::new(),
            openers: Vec::new(),
            share_sum: [0; R],
            small: Vec::new(),
            small_rows: Vec::new(),
            small_keys: Vec::new(),
            least: [u64::MAX; R],
            most: [0; R],
        }
    }

    /// Sorts row `i` (its sizes `row`, within every capacity) into its class.
    #[inline]
    pub(super) fn add(&mut self, i: usize, row: &[u64; R]) {
        let (ib, s) = (self.ib, self.scale);
        if row[1..].iter().all(|&v| v == 0) {
            self.text.push(((s.caps[0] - row[0]) << ib) | i as u64);
            return;
        }
        let shares: [u32; R] = core::array::from_fn(|q| s.norm(row[q], q));
        let top = u64::from(shares.iter().copied().max().unwrap_or(0) >> 20);
        if s.bucket(row[s.qb]) >= LARGE_UNITS || top >= LARGE_SHARE {
            for q in 0..R {
                self.share_sum[q] += u64::from(shares[q] >> 8);
            }
            self.openers.push(((2048 - top) << ib) | self.large.len() as u64);
            self.large.push(i as u32);
            self.large_rows.push(row.map(|v| v as u32));
        } else {
            let mut key = 0u64;
            for q in 0..R {
                if q != s.qb {
                    key = key.max(((row[q] * self.up[q]) >> 32) + 1);
                }
                self.least[q] = self.least[q].min(row[q]);
                self.most[q] = self.most[q].max(row[q]);
            }
            self.small_keys.push(((UNITS + 1 - key.min(UNITS + 1)) << ib) | self.small.len() as u64);
            self.small.push(i as u32);
            self.small_rows.push(row.map(|v| v as u32));
        }
    }
}

/// One call's state over `R` resources.
struct Fill<const R: usize> {
    scale: Scale<R>,
    /// Free segments of a new bin.
    segments: u32,
    /// Bits of a row index.
    ib: u32,
    /// The number of the first bin.
    first: u32,
    /// Each bin's room per resource and free segments.
    rooms: Vec<[u64; R]>,
    segs: Vec<u32>,
}

impl<const R: usize> Fill<R> {
    /// A new bin with every capacity free; returns its number.
    fn open(&mut self) -> usize {
        self.rooms.push(self.scale.caps);
        self.segs.push(self.segments);
        self.segs.len() - 1
    }

    fn run(mut self, classes: Classes<R>, assign: &mut [u32], loads: &mut Vec<u64>) -> usize {
        let Classes {
            text, large, large_rows, openers, share_sum, small, small_rows, small_keys, least, most, up, ..
        } = classes;
        // ⌊v·UNITS/cap⌋ ≥ (v·dn) >> 32.
        let dn = self.scale.caps.map(|c| (UNITS << 32) / c);
        if !large.is_empty() {
            self.balanced((&large, &large_rows), openers, &share_sum, assign);
        }
        if !small.is_empty() {
            self.best_fit_small((&small, &small_rows), small_keys, (&least, &most), (&dn, &up), assign);
        }
        if !text.is_empty() {
            self.best_fit_text(text, assign);
        }
        for room in &self.rooms {
            loads.extend((0..R).map(|q| self.scale.caps[q] - room[q]));
        }
        self.segs.len()
    }

    /// Phase 1a (see the module).
    fn balanced(
        &mut self,
        (large, large_rows): (&[u32], &[[u32; R]]),
        mut openers: Vec<u64>,
        share_sum: &[u64; R],
        assign: &mut [u32],
    ) {
        let (ib, qb) = (self.ib, self.scale.qb);
        let m = large.len();
        let imask = (1u64 << ib) - 1;
        let qk = (0..R).filter(|&q| q != qb).max_by_key(|&q| (share_sum[q], core::cmp::Reverse(q))).unwrap_or(0);
        let kcap = self.scale.caps[qk];
        radix_sort_high(&mut openers, ib);
        // Positions: buckets one after the other, each (key asc, index desc) after a sentinel.
        let nb = self.scale.bucket(self.scale.caps[qb]) + 1;
        let kb = 64 - kcap.leading_zeros();
        // (bucket, key, j) in position order: packed into one sortable u64 when they fit (the
        // usual case), else sorted as tuples.
        let (mut packed, mut keyed): (Vec<u64>, Vec<(usize, u32, u32)>) = (Vec::new(), Vec::new());
        if 4 + kb + ib <= 64 {
            packed = (0..m)
                .rev()
                .map(|j| {
                    let row = large_rows[j].map(u64::from);
                    ((self.scale.bucket(row[qb]) as u64) << (kb + ib)) | (row[qk] << ib) | (imask - j as u64)
                })
                .collect();
            radix_sort_high(&mut packed, ib);
        } else {
            keyed = (0..m)
                .map(|j| {
                    let row = large_rows[j];
                    (self.scale.bucket(u64::from(row[qb])), row[qk], j as u32)
                })
                .collect();
            keyed.sort_unstable_by(|a, b| (a.0, a.1, b.2).cmp(&(b.0, b.1, a.2)));
        }
        let unpack =
            |k: u64| ((k >> (kb + ib)) as usize, ((k >> ib) & ((1 << kb) - 1)) as u32, (imask - (k & imask)) as u32);
        let np = m + nb;
        // Sizes in 32 bits (every capacity is below 2^32): half the memory the searches read.
        let mut rec: Vec<[u32; R]> = alloc::vec![[0u32; R]; np];
        let mut j_at = alloc::vec![0u32; np];
        let mut key_at = alloc::vec![0u32; np];
        let mut pos_of = alloc::vec![0u32; m];
        let mut count = alloc::vec![0u32; nb];
        // The t-th entry stands after the sentinels of its bucket and of every bucket before.
        for (t, (b, key, j)) in packed.iter().map(|&k| unpack(k)).chain(keyed.iter().copied()).enumerate() {
            let p = t + b + 1;
            count[b] += 1;
            pos_of[j as usize] = p as u32;
            key_at[p] = key;
            j_at[p] = j;
            rec[p] = large_rows[j as usize];
        }
        drop((packed, keyed));
        let mut start = alloc::vec![0usize; nb + 1];
        for b in 0..nb {
            start[b + 1] = start[b] + count[b] as usize + 1;
        }
        // Directories: bucket b has ds slots (about 2 per item, at most one per key value),
        // slot(v) = ⌊v · ds / (kcap + 1)⌋, and first[s] = the first position whose slot is ≥ s.
        let mut dir_at = alloc::vec![0usize; nb + 1];
        let mut slot_mul = alloc::vec![0u64; nb];
        let mut exact = alloc::vec![false; nb];
        for b in 0..nb {
            let ds = (kcap + 1).min((2 * u64::from(count[b])).max(1).next_power_of_two()).min(1 << 31);
            slot_mul[b] = (ds << 32) / (kcap + 1);
            exact[b] = ds == kcap + 1;
            dir_at[b + 1] = dir_at[b] + ds as usize + 1;
        }
        let mut dir = alloc::vec![0u32; dir_at[nb]];
        for b in 0..nb {
            let d = &mut dir[dir_at[b]..dir_at[b + 1]];
            let (lo, hi) = (start[b] + 1, start[b + 1]);
            let mut s = 0usize;
            for (p, &key) in key_at.iter().enumerate().take(hi).skip(lo) {
                let slot = ((u64::from(key) * slot_mul[b]) >> 32) as usize;
                while s <= slot {
                    d[s] = p as u32;
                    s += 1;
                }
            }
            d[s..].iter_mut().for_each(|x| *x = hi as u32);
        }
        let mut alive = BitSet::full(np);
        let mut nonempty: u32 = 0;
        for b in 0..nb {
            alive.remove(start[b]); // sentinels
            if count[b] > 0 {
                nonempty |= 1 << b;
            }
        }
        // Per-bucket candidate of the current bin (a position; 0: none) with its sizes.
        let mut cand = alloc::vec![0usize; nb];
        let mut cand_rec: Vec<[u32; R]> = alloc::vec![[0u32; R]; nb];
        let mut cand_norm: Vec<[u32; R]> = alloc::vec![[0u32; R]; nb];
        let mut left = [0u32; R];
        for &opener in &openers {
            let o = (opener & imask) as usize;
            // Placed items have left the alive positions.
            if !alive.contains(pos_of[o] as usize) {
                continue;
            }
            let bin = self.open();
            let mut room = self.scale.caps;
            let mut seg = self.segments;
            let mut p = pos_of[o] as usize;
            cand.iter_mut().for_each(|c| *c = 0);
            // Buckets with nothing left that fits this bin (rooms only shrink).
            let mut dead: u32 = 0;
            loop {
                let b = self.scale.bucket(u64::from(rec[p][qb]));
                alive.remove(p);
                count[b] -= 1;
                if count[b] == 0 {
                    nonempty &= !(1 << b);
                }
                for q in 0..R {
                    room[q] -= u64::from(rec[p][q]);
                }
                seg -= 1;
                let j = j_at[p] as usize;
                assign[large[j] as usize] = self.first + bin as u32;
                if seg == 0 {
                    break;
                }
                let bmax = self.scale.bucket(room[qb]);
                let mut mask = nonempty & !dead & ((2u32 << bmax) - 1);
                for q in 0..R {
                    left[q] = self.scale.norm(room[q], q);
                }
                let evenness = |nc: &[u32; R]| {
                    let (mut hi, mut lo, mut sum) = (0u32, u32::MAX, 0u64);
                    for q in 0..R {
                        let u = left[q].saturating_sub(nc[q]);
                        hi = hi.max(u);
                        lo = lo.min(u);
                        sum += u64::from(u);
                    }
                    (hi - lo, sum)
                };
                let limit = room[qk] as u32;
                let mut best = (u32::MAX, u64::MAX);
                let mut best_p = usize::MAX;
                while mask != 0 {
                    let b = mask.trailing_zeros() as usize;
                    mask &= mask - 1;
                    let c = cand[b];
                    if c != 0 && fits(&cand_rec[b], &room) {
                        let e = evenness(&cand_norm[b]);
                        if e < best || (e == best && j_at[c] < j_at[best_p]) {
                            (best, best_p) = (e, c);
                        }
                        continue;
                    }
                    cand[b] = 0;
                    // The last position of bucket b with key ≤ limit.
                    let sl = dir_at[b] + ((u64::from(limit) * slot_mul[b]) >> 32) as usize;
                    let mut hi = dir[sl + 1] as usize;
                    let mut lo = if exact[b] { hi } else { dir[sl] as usize };
                    while lo < hi {
                        let mid = (lo + hi) / 2;
                        if key_at[mid] <= limit {
                            lo = mid + 1;
                        } else {
                            hi = mid;
                        }
                    }
                    let mut c = alive.prev(lo - 1).unwrap_or(0);
                    let mut tries = 0;
                    while c > start[b] && tries < TRIES {
                        if fits(&rec[c], &room) {
                            let nc: [u32; R] = core::array::from_fn(|q| self.scale.norm(u64::from(rec[c][q]), q));
                            let e = evenness(&nc);
                            if e < best || (e == best && j_at[c] < j_at[best_p]) {
                                (best, best_p) = (e, c);
                            }
                            cand[b] = c;
                            cand_rec[b] = rec[c];
                            cand_norm[b] = nc;
                            break;
                        }
                        tries += 1;
                        c = alive.prev(c - 1).unwrap_or(0);
                    }
                    if cand[b] == 0 && c <= start[b] {
                        dead |= 1 << b;
                    }
                }
                if best_p == usize::MAX {
                    break;
                }
                p = best_p;
                cand[self.scale.bucket(u64::from(rec[p][qb]))] = 0;
            }
            self.rooms[bin] = room;
            self.segs[bin] = seg;
        }
    }

    /// Phase 1b (see the module).
    fn best_fit_small(
        &mut self,
        (small, small_rows): (&[u32], &[[u32; R]]),
        mut keys: Vec<u64>,
        (least, most): (&[u64; R], &[u64; R]),
        (dn, up): (&[u64; R], &[u64; R]),
        assign: &mut [u32],
    ) {
        let (ib, qb) = (self.ib, self.scale.qb);
        let imask = (1u64 << ib) - 1;
        // The bucket resource stays out of the keys only when every small item has the same
        // size in it (then "room ≥ that size", asked of every indexed bin, is exact).
        let with_qb = least[qb] != most[qb];
        if with_qb {
            for k in keys.iter_mut() {
                let s = (*k & imask) as usize;
                let row = small_rows[s].map(u64::from);
                let key = (0..R).map(|q| ((row[q] * up[q]) >> 32) + 1).max().unwrap_or(0);
                *k = ((UNITS + 1 - key.min(UNITS + 1)) << ib) | s as u64;
            }
        }
        radix_sort_high(&mut keys, ib);
        let viable = |room: &[u64; R], seg: u32| seg > 0 && (0..R).all(|q| room[q] >= least[q]);
        let room_key = |room: &[u64; R]| -> u64 {
            (0..R).filter(|&q| q != qb || with_qb).map(|q| (room[q] * dn[q]) >> 32).min().unwrap_or(UNITS).min(UNITS)
        };
        let mut index = RoomIndex::new(UNITS, small.len() + self.segs.len());
        for b in 0..self.segs.len() {
            if viable(&self.rooms[b], self.segs[b]) {
                index.insert(room_key(&self.rooms[b]), b as u32);
            }
        }
        let mut held: Vec<(u64, u32)> = Vec::with_capacity(SMALL_TRIES);
        // The rows gathered in key order first, in a pass of independent loads (the loop
        // below would wait on each one).
        let rows: Vec<[u32; R]> = keys.iter().map(|&k| small_rows[(k & imask) as usize]).collect();
        for (&k, &row) in keys.iter().zip(&rows) {
            let s = (k & imask) as usize;
            let i = small[s] as usize;
            let need = UNITS + 1 - (k >> ib);
            let mut found = None;
            for _ in 0..SMALL_TRIES {
                let Some((key, b)) = index.take_best(need) else { break };
                if fits(&row, &self.rooms[b as usize]) {
                    found = Some(b as usize);
                    break;
                }
                held.push((key, b));
            }
            for (key, b) in held.drain(..) {
                index.insert(key, b);
            }
            let b = match found {
                Some(b) => b,
                None => self.open(),
            };
            for q in 0..R {
                self.rooms[b][q] -= u64::from(row[q]);
            }
            self.segs[b] -= 1;
            assign[i] = self.first + b as u32;
            if viable(&self.rooms[b], self.segs[b]) {
                index.insert(room_key(&self.rooms[b]), b as u32);
            }
        }
    }

    /// Phase 2 (see the module).
    fn best_fit_text(&mut self, mut keys: Vec<u64>, assign: &mut [u32]) {
        let ib = self.ib;
        let imask = (1u64 << ib) - 1;
        let cap = self.scale.caps[0];
        radix_sort_high(&mut keys, ib);
        let mut index = RoomIndex::new(cap, keys.len() + self.segs.len());
        for b in 0..self.segs.len() {
            if self.segs[b] > 0 {
                index.insert(self.rooms[b][0], b as u32);
            }
        }
        for &k in &keys {
            let i = (k & imask) as usize;
            let a = cap - (k >> ib);
            let (room, b) = match index.take_best(a) {
                Some(found) => found,
                None => (cap, self.open() as u32),
            };
            assign[i] = self.first + b;
            self.rooms[b as usize][0] = room - a;
            self.segs[b as usize] -= 1;
            if self.segs[b as usize] > 0 {
                index.insert(room - a, b);
            }
        }
    }
}

/// Whether `item` (sizes in 32 or 64 bits) fits into `room` in every resource.
#[inline]
fn fits<T: Copy + Into<u64>, const R: usize>(item: &[T; R], room: &[u64; R]) -> bool {
    (0..R).all(|q| item[q].into() <= room[q])
}
