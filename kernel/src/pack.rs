//! Bin packing: put lengths into bins of `capacity` tokens.
//!
//! Each length is first rounded up to a multiple of `align` (its *aligned length*); bins hold
//! aligned lengths. Methods:
//! - [`PackMethod::Bfd`] best-fit decreasing: items by (aligned length desc, index asc); each
//!   goes to the open bin with the least room that still fits it, ties to the oldest bin;
//!   O(n log n) with an ordered set over (room, bin).
//! - [`PackMethod::Ffd`] first-fit decreasing: same order; each goes to the oldest bin that
//!   fits it; O(n log n) with a max segment tree over the bins' room.
//! - [`PackMethod::NextFit`] order preserving: items in input order; an item that does not
//!   fit closes the current bin and opens a new one.
//!
//! Items whose aligned length exceeds `capacity` follow the [`OversizePolicy`]. Bins are
//! reported in creation order; members of a bin ascending by input index.

use alloc::borrow::Cow;
use alloc::vec::Vec;

use crate::rooms::RoomIndex;
use crate::sort::{key_weight, sorted_desc, sorted_desc_keys};
use crate::{Error, checked_len, invalid};

/// The packing algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PackMethod {
    /// Best-fit decreasing (the default).
    #[default]
    Bfd,
    /// First-fit decreasing.
    Ffd,
    /// Next-fit in input order (keeps the input order inside and across bins).
    NextFit,
}

/// What to do with an item whose aligned length exceeds the capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OversizePolicy {
    /// Fail with `infeasible`, naming the first such item (the default).
    #[default]
    Error,
    /// Put the item alone in its own bin (that bin's load exceeds the capacity).
    Single,
    /// Leave the item out and report it in `dropped`.
    Drop,
}

crate::__options! { $ __pack_options;
/// Options of [`pack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PackOptions {
    /// Tokens per bin, at least 1.
    pub capacity: u64,
    /// Every length is rounded up to a multiple of `align` (at least 1) before packing.
    pub align: u64,
    /// The algorithm.
    pub method: PackMethod,
    /// The oversize policy.
    pub oversize: OversizePolicy,
}
}

impl PackOptions {
    /// Options with the given capacity and the defaults: `align` 1, BFD, oversize `error`.
    pub fn new(capacity: u64) -> Self {
        Self { capacity, align: 1, method: PackMethod::Bfd, oversize: OversizePolicy::Error }
    }
}

/// The result of [`pack`], in flat form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packing {
    /// `bins + 1` offsets into `indices`: bin `b` is `indices[offsets[b]..offsets[b + 1]]`.
    pub offsets: Vec<u32>,
    /// The indices of the packed items, bin by bin, ascending inside a bin.
    pub indices: Vec<u32>,
    /// The aligned load of each bin (sum of aligned lengths).
    pub loads: Vec<u64>,
    /// Indices of items left out under the `drop` policy, ascending.
    pub dropped: Vec<u32>,
    /// Indices of oversized items placed alone under the `single` policy, ascending.
    pub single: Vec<u32>,
    /// Sum of the real (unaligned) lengths of the packed items.
    pub real_tokens: u64,
    /// Sum of the aligned lengths of the packed items (real tokens + alignment padding).
    pub aligned_tokens: u64,
    /// `ceil(Σ aligned lengths of the items that fit / capacity)`: no packing of those items
    /// uses fewer bins. Bins of oversized items (`single`) come on top.
    pub lower_bound: u64,
}

impl Packing {
    /// The number of bins.
    pub fn bins(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The members of bin `b` (input indices).
    pub fn bin(&self, b: usize) -> &[u32] {
        &self.indices[self.offsets[b] as usize..self.offsets[b + 1] as usize]
    }

    /// Alignment padding: aligned tokens minus real tokens.
    pub fn padding_tokens(&self) -> u64 {
        self.aligned_tokens - self.real_tokens
    }

    /// Fill of the regular bins (all but the `single` ones): their real tokens over
    /// `bins × capacity`, in 0..=1; 0 when there is no regular bin. `lengths` and `capacity`
    /// are the ones the packing was made from. (A figure for reports, not a decision.)
    pub fn efficiency(&self, lengths: &[u64], capacity: u64) -> f64 {
        let regular = self.bins() - self.single.len();
        if regular == 0 || capacity == 0 {
            return 0.0;
        }
        let single_real: u64 = self.single.iter().map(|&i| lengths[i as usize]).sum();
        (self.real_tokens - single_real) as f64 / (regular as f64 * capacity as f64)
    }
}

/// Packs `lengths` into bins of `options.capacity` tokens.
///
/// Errors: `invalid-argument` for empty `lengths`, `capacity == 0`, `align == 0`, an aligned
/// length or a sum overflowing `u64`; `infeasible` for an oversized item under the `error`
/// policy (the message names the first such index, its length and the capacity).
pub fn pack(lengths: &[u64], options: &PackOptions) -> Result<Packing, Error> {
    let PackOptions { capacity, align, method, oversize } = *options;
    if method == PackMethod::NextFit {
        return Ok(next_fit_runs(lengths, options)?.into_packing(lengths.len()));
    }
    let checked = check(lengths, *options)?;
    let Checked { sums: Sums { total, fit_total, real_all }, dropped, single } = checked;
    let lower_bound = fit_total.div_ceil(capacity);
    // With align 1 the aligned lengths are the lengths: borrow them. (`check` made sure no
    // aligned length overflows.)
    let aligned: Cow<'_, [u64]> = if align == 1 {
        Cow::Borrowed(lengths)
    } else {
        Cow::Owned(lengths.iter().map(|&len| len.div_ceil(align) * align).collect())
    };
    let aligned: &[u64] = &aligned;
    // BFD or FFD, over (index, aligned length) in (length desc, index asc) order — from
    // packed keys read in sequence when the lengths allow (see `sorted_desc_keys`). The fit
    // writes each item's bin in that order (a sequential write), and the assembly groups
    // the items by bin and sorts each bin's few members.
    let fitting = aligned.len() - dropped.len() - single.len();
    let mut assign: Vec<u32> = Vec::with_capacity(aligned.len());
    let (offsets, indices, loads) = match sorted_desc_keys(aligned) {
        Some(keys) => {
            let max = aligned.iter().copied().max().unwrap_or(0);
            let items = keys.iter().map(|&k| (k as u32, key_weight(k, max)));
            let bins = any_fit(items.clone(), capacity, oversize, method, lower_bound, fitting, &mut assign);
            assemble(items, &assign, bins)
        }
        None => {
            let order = sorted_desc(aligned);
            let items = order.iter().map(|&i| (i, aligned[i as usize]));
            let bins = any_fit(items.clone(), capacity, oversize, method, lower_bound, fitting, &mut assign);
            assemble(items, &assign, bins)
        }
    };
    let real_tokens = real_all - dropped.iter().map(|&i| lengths[i as usize]).sum::<u64>();
    let aligned_tokens = total - dropped.iter().map(|&i| aligned[i as usize]).sum::<u64>();
    Ok(Packing { offsets, indices, loads, dropped, single, real_tokens, aligned_tokens, lower_bound })
}

/// The bins' offsets, members (ascending) and loads from `items` in fit order and the bin
/// each went to (`assign`, in the same order; [`NONE`] for a dropped item): a counting sort
/// by bin, then each bin's members sorted.
pub(crate) fn assemble(
    items: impl Iterator<Item = (u32, u64)>,
    assign: &[u32],
    bins: usize,
) -> (Vec<u32>, Vec<u32>, Vec<u64>) {
    let offsets = bin_offsets(assign, bins);
    let mut fill: Vec<u32> = offsets[..bins].to_vec();
    let mut indices = alloc::vec![0u32; offsets[bins] as usize];
    let mut loads = alloc::vec![0u64; bins];
    for ((i, a), &b) in items.zip(assign) {
        if b != NONE {
            let at = &mut fill[b as usize];
            indices[*at as usize] = i;
            *at += 1;
            loads[b as usize] += a;
        }
    }
    for b in 0..bins {
        indices[offsets[b] as usize..offsets[b + 1] as usize].sort_unstable();
    }
    (offsets, indices, loads)
}

/// Where each of the `bins` bins starts among the members grouped by bin (`bins + 1`
/// entries), from the bin each item went to ([`NONE`]: none).
pub(crate) fn bin_offsets(assign: &[u32], bins: usize) -> Vec<u32> {
    let mut offsets = alloc::vec![0u32; bins + 1];
    for &b in assign {
        if b != NONE {
            offsets[b as usize + 1] += 1;
        }
    }
    for b in 0..bins {
        offsets[b + 1] += offsets[b];
    }
    offsets
}

/// "No bin": a dropped item's entry in the fit's bin list.
const NONE: u32 = u32::MAX;

/// `len` rounded up to a multiple of `align` (no division for the usual `align` 1); the
/// caller knows it does not overflow.
#[inline]
fn aligned(len: u64, align: u64) -> u64 {
    if align == 1 { len } else { len.div_ceil(align) * align }
}

/// The running sums of a packing's input. Passed by value, so that a loop keeps them in
/// registers — also in WASM, where a struct updated through `&mut` next to vectors stays in
/// linear memory (that cost BFD and FFD 5–7 ns an item through WASM).
#[derive(Clone, Copy, Default)]
struct Sums {
    /// Σ aligned lengths.
    total: u64,
    /// Σ aligned lengths of the items within the capacity.
    fit_total: u64,
    /// Σ real lengths (≤ `total`).
    real_all: u64,
}

impl Sums {
    /// Counts item `i` (real length `len`, aligned `a`) and applies the oversize policy to
    /// it (its index onto `single` or `dropped`): the per-item checks of [`pack`], in its
    /// words. Always inlined, its rare paths out of line: a call per item (LLVM would not
    /// inline it for WASM otherwise) cost more than the checks.
    #[inline(always)]
    fn add(self, i: usize, len: u64, a: u64, o: PackOptions, lists: Lists<'_>) -> Result<Self, Error> {
        // Real lengths are at most their aligned ones: this sum cannot overflow when the
        // checked one does not.
        let mut sums = Self { real_all: self.real_all.wrapping_add(len), ..self.add_total(a)? };
        if a <= o.capacity {
            sums.fit_total += a;
        } else {
            oversized(i, len, a, o, lists)?;
        }
        Ok(sums)
    }

    /// Adds `a` to the total of the aligned lengths, refusing an overflow.
    #[inline(always)]
    fn add_total(self, a: u64) -> Result<Self, Error> {
        match self.total.checked_add(a) {
            Some(total) => Ok(Self { total, ..self }),
            None => Err(total_overflow()),
        }
    }

    /// Counts `sum`, the lengths of items within the capacity, with `align` 1 (aligned =
    /// real): [`add`](Self::add) of each of them at once.
    fn add_fitting(self, sum: u64) -> Result<Self, Error> {
        let sums = self.add_total(sum)?;
        Ok(Self { fit_total: sums.fit_total + sum, real_all: sums.real_all.wrapping_add(sum), ..sums })
    }
}

/// The error for a total of aligned lengths over `u64`.
#[cold]
#[inline(never)]
fn total_overflow() -> Error {
    Error::InvalidArgument(alloc::format!("the sum of aligned lengths overflows u64 (at most {} allowed)", u64::MAX))
}

/// The oversized items' lists of a packing's input: `single`, then `dropped`.
type Lists<'a> = (&'a mut Vec<u32>, &'a mut Vec<u32>);

/// The oversize policy applied to item `i` (real length `len`, aligned `a` over the capacity).
#[cold]
#[inline(never)]
fn oversized(i: usize, len: u64, a: u64, o: PackOptions, (single, dropped): Lists<'_>) -> Result<(), Error> {
    let PackOptions { capacity, align, .. } = o;
    match o.oversize {
        OversizePolicy::Error => {
            return Err(Error::Infeasible(alloc::format!(
                "lengths[{i}] = {len} (aligned to {a} with align = {align}) exceeds capacity = {capacity}; \
                 use oversize single or drop to accept such items"
            )));
        }
        OversizePolicy::Single => single.push(i as u32),
        OversizePolicy::Drop => dropped.push(i as u32),
    }
    Ok(())
}

/// The sums and oversize lists of a packing's input, after every check of [`pack`].
#[derive(Default)]
struct Checked {
    sums: Sums,
    dropped: Vec<u32>,
    single: Vec<u32>,
}

impl Checked {
    /// [`Sums::add`] into these lists.
    fn add(&mut self, i: usize, len: u64, a: u64, o: PackOptions) -> Result<(), Error> {
        self.sums = self.sums.add(i, len, a, o, (&mut self.single, &mut self.dropped))?;
        Ok(())
    }
}

/// `pack`'s checks of its arguments that come before any per-item one (errors in `pack`'s
/// order and words), for lengths of any unsigned width.
fn check_arguments<L: Copy + Into<u64>>(lengths: &[L], capacity: u64, align: u64) -> Result<(), Error> {
    checked_len("lengths", lengths.len())?;
    if lengths.is_empty() {
        return invalid!("lengths must not be empty");
    }
    if capacity == 0 {
        return invalid!("capacity must be at least 1 token (got 0)");
    }
    if align == 0 {
        return invalid!("align must be at least 1 (got 0)");
    }
    if align > 1 {
        for (i, &len) in lengths.iter().enumerate() {
            let len: u64 = len.into();
            if len.div_ceil(align).checked_mul(align).is_none() {
                return invalid!("lengths[{i}] = {len} rounded up to a multiple of align = {align} overflows u64");
            }
        }
    }
    Ok(())
}

/// Checks `pack`'s arguments (errors in `pack`'s order and words) and sums the input in one
/// pass: overflow check of the total, the total of the items that fit, and the oversize
/// policy.
fn check(lengths: &[u64], o: PackOptions) -> Result<Checked, Error> {
    check_arguments(lengths, o.capacity, o.align)?;
    let (mut sums, mut single, mut dropped) = (Sums::default(), Vec::new(), Vec::new());
    for (i, &len) in lengths.iter().enumerate() {
        sums = sums.add(i, len, aligned(len, o.align), o, (&mut single, &mut dropped))?;
    }
    Ok(Checked { sums, dropped, single })
}

/// Next-fit bins in compact form: every bin is a run of consecutive input indices, so a
/// host can rebuild the member lists itself instead of receiving them
/// ([`into_packing`](Self::into_packing)). Bin `b` holds the indices from `starts[b]` up to
/// `starts[b + 1]` (the last: up to n), without the dropped ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NextFitRuns {
    /// The first input index of each bin, ascending.
    pub starts: Vec<u32>,
    /// The aligned load of each bin.
    pub loads: Vec<u64>,
    /// Items left out under `drop`, ascending.
    pub dropped: Vec<u32>,
    /// Oversized items alone in a bin under `single`, ascending.
    pub single: Vec<u32>,
    /// As [`Packing::real_tokens`].
    pub real_tokens: u64,
    /// As [`Packing::aligned_tokens`].
    pub aligned_tokens: u64,
    /// As [`Packing::lower_bound`].
    pub lower_bound: u64,
}

impl NextFitRuns {
    /// The [`Packing`] of `n` input lengths that these runs describe (what [`pack`] returns
    /// for next-fit).
    pub fn into_packing(self, n: usize) -> Packing {
        let (offsets, indices) = if self.dropped.is_empty() {
            // Every index, in order; the bins start where the runs do.
            let mut offsets = self.starts.clone();
            offsets.push(n as u32);
            (offsets, (0..n as u32).collect())
        } else {
            let mut indices = Vec::with_capacity(n.saturating_sub(self.dropped.len()));
            let mut offsets = Vec::with_capacity(self.starts.len() + 1);
            let mut dropped = self.dropped.iter().copied().peekable();
            let mut next_start = self.starts.iter().copied().peekable();
            for i in 0..n as u32 {
                if next_start.peek() == Some(&i) {
                    offsets.push(indices.len() as u32);
                    next_start.next();
                }
                if dropped.peek() == Some(&i) {
                    dropped.next();
                } else {
                    indices.push(i);
                }
            }
            offsets.push(indices.len() as u32);
            (offsets, indices)
        };
        Packing {
            offsets,
            indices,
            loads: self.loads,
            dropped: self.dropped,
            single: self.single,
            real_tokens: self.real_tokens,
            aligned_tokens: self.aligned_tokens,
            lower_bound: self.lower_bound,
        }
    }
}

/// Items per block of [`next_fit_runs`]'s fast path: the sum of a block's lengths within a
/// capacity of at most `u64::MAX / NEXT_FIT_BLOCK` cannot overflow (the loads of a block's
/// bins can, by the load carried into it: [`scan_block`] sums them wrapping).
const NEXT_FIT_BLOCK: usize = 512;

/// Next-fit of `lengths` (any unsigned width) as runs: the same bins as [`pack`] with
/// [`PackMethod::NextFit`], the same errors; `options.method` is not read. One pass: an item
/// that does not fit closes the current bin; an oversized one is alone (`single`) or skipped
/// (`drop`).
pub fn next_fit_runs<L: Copy + Into<u64>>(lengths: &[L], options: &PackOptions) -> Result<NextFitRuns, Error> {
    let o = *options;
    let PackOptions { capacity, align, .. } = o;
    check_arguments(lengths, capacity, align)?;
    let mut fit = NextFit { checked: Checked::default(), starts: Vec::new(), loads: Vec::new(), open: false };
    if align == 1 && capacity <= u64::MAX / NEXT_FIT_BLOCK as u64 {
        fit.unaligned(lengths, o)?;
    } else {
        let mut load = 0;
        for (i, &len) in lengths.iter().enumerate() {
            let len = len.into();
            load = fit.item(i, len, aligned(len, align), load, o)?;
        }
        fit.close(load);
    }
    let NextFit {
        checked: Checked { sums: Sums { total, fit_total, real_all }, dropped, single }, starts, loads, ..
    } = fit;
    // Every item but the dropped ones is packed.
    let dropped_real: u64 = dropped.iter().map(|&i| lengths[i as usize].into()).sum();
    let dropped_aligned: u64 = dropped.iter().map(|&i| aligned(lengths[i as usize].into(), align)).sum();
    Ok(NextFitRuns {
        starts,
        loads,
        dropped,
        single,
        real_tokens: real_all - dropped_real,
        aligned_tokens: total - dropped_aligned,
        lower_bound: fit_total.div_ceil(capacity),
    })
}

/// [`next_fit_runs`]'s state, but for the load of the bin being filled, which the loops
/// keep in a local (a register, also in WASM).
struct NextFit {
    checked: Checked,
    starts: Vec<u32>,
    /// The loads of the closed bins.
    loads: Vec<u64>,
    /// Whether a bin is being filled (none before the first item and after a single).
    open: bool,
}

impl NextFit {
    /// Checks item `i` (real length `len`, aligned `a`) and fits it; `load` is the load of
    /// the bin being filled, and the result its load after (by value: a local whose address
    /// is taken lives in linear memory in WASM).
    #[inline]
    fn item(&mut self, i: usize, len: u64, a: u64, load: u64, o: PackOptions) -> Result<u64, Error> {
        let capacity = o.capacity;
        self.checked.add(i, len, a, o)?;
        if a > capacity {
            if o.oversize == OversizePolicy::Single {
                self.close(load);
                self.starts.push(i as u32);
                self.loads.push(a);
            }
            Ok(load)
        } else if self.open
            && let Some(next) = load.checked_add(a)
            && next <= capacity
        {
            Ok(next)
        } else {
            self.close(load);
            self.starts.push(i as u32);
            self.open = true;
            Ok(a)
        }
    }

    /// Closes the bin being filled, if any, at `load`.
    fn close(&mut self, load: u64) {
        if self.open {
            self.loads.push(load);
            self.open = false;
        }
    }

    /// Every item with `o.align` 1 and `o.capacity ≤ u64::MAX / NEXT_FIT_BLOCK`, block by block.
    /// [`scan_block`] fits the common items; the first item and an item over the capacity
    /// take [`item`](Self::item), after the sum so far is counted, so the errors and their
    /// order are those of the per-item checks.
    fn unaligned<L: Copy + Into<u64>>(&mut self, lengths: &[L], o: PackOptions) -> Result<(), Error> {
        let mut closed = BlockBins::default();
        // The load of the bin being filled, NO_BIN while none is.
        let mut load = NO_BIN;
        for (block, items) in lengths.chunks(NEXT_FIT_BLOCK).enumerate() {
            let base = block * NEXT_FIT_BLOCK;
            let mut j = 0;
            loop {
                let scan = scan_block(items, j, load, o.capacity, &mut closed);
                self.starts.extend(closed.starts[..scan.closed].iter().map(|&k| (base + k as usize) as u32));
                self.loads.extend_from_slice(&closed.loads[..scan.closed]);
                self.checked.sums = self.checked.sums.add_fitting(scan.sum)?;
                (j, load) = (scan.at, scan.load);
                let Some(&len) = items.get(j) else { break };
                let a = len.into();
                load = self.item(base + j, a, a, load, o)?;
                if !self.open {
                    load = NO_BIN;
                }
                j += 1;
            }
        }
        self.close(load);
        Ok(())
    }
}

/// The bins a [`scan_block`] closed: each one's first item (an index into the block) and load.
struct BlockBins {
    starts: [u32; NEXT_FIT_BLOCK],
    loads: [u64; NEXT_FIT_BLOCK],
}

impl Default for BlockBins {
    fn default() -> Self {
        Self { starts: [0; NEXT_FIT_BLOCK], loads: [0; NEXT_FIT_BLOCK] }
    }
}

/// Where a [`scan_block`] stopped.
struct Scan {
    /// The index (in the block) of the item it stopped at, or the block's length.
    at: usize,
    /// The load of the bin being filled ([`NO_BIN`] if none).
    load: u64,
    /// Σ of the lengths it fitted.
    sum: u64,
    /// How many bins it closed (in `closed`).
    closed: usize,
}

/// [`scan_block`]'s load while no bin is open: over any capacity of its caller
/// (≤ `u64::MAX / NEXT_FIT_BLOCK`), and four lengths under 2^60 added to it (or to any
/// load within such a capacity) do not overflow.
const NO_BIN: u64 = 1 << 63;

/// Next-fit of `items[from..]` (a block of at most [`NEXT_FIT_BLOCK`] lengths, `load` the
/// load of the open bin or [`NO_BIN`]) while every item is within `capacity` and a bin is
/// open: an item that fits joins the bin, any other closes it (into `closed`) and opens the
/// next. It stops at an item over the capacity or when no bin is open. This loop is most of
/// a next-fit call, so it is call-free and in a function of its own (the WASM compiler then
/// keeps its state in registers), and the common item costs an add, a compare and a branch:
/// the sum of the fitted lengths comes from the loads afterwards.
#[inline(never)]
fn scan_block<L: Copy + Into<u64>>(
    items: &[L],
    from: usize,
    mut load: u64,
    capacity: u64,
    closed: &mut BlockBins,
) -> Scan {
    let first_load = load;
    let mut n = 0;
    let mut j = from;
    let at = loop {
        // Four items at a time: the group fits the open bin when the load after its last
        // item does — one compare and one branch for four items. Lengths under 2^60 (all
        // of them but oversized ones) cannot overflow these adds (see NO_BIN).
        if let Some(&[a0, a1, a2, a3]) = items.get(j..j + 4) {
            let (a0, a1, a2, a3): (u64, u64, u64, u64) = (a0.into(), a1.into(), a2.into(), a3.into());
            if (a0 | a1 | a2 | a3) >> 60 == 0 {
                let p1 = load + a0;
                let p2 = p1 + a1;
                let p3 = p2 + a2;
                let p4 = p3 + a3;
                if p4 <= capacity {
                    load = p4;
                    j += 4;
                    continue;
                }
                // The first item that does not fit is the k-th: the loads are ascending,
                // so k is the number of them within the capacity (selects, no branches).
                let (mut k, mut before, mut a) = (0, load, a0);
                if p1 <= capacity {
                    (k, before, a) = (1, p1, a1);
                }
                if p2 <= capacity {
                    (k, before, a) = (2, p2, a2);
                }
                if p3 <= capacity {
                    (k, before, a) = (3, p3, a3);
                }
                if a > capacity || load == NO_BIN {
                    load = before;
                    break j + k;
                }
                closed.starts[n] = (j + k) as u32;
                closed.loads[n] = before;
                n += 1;
                load = a;
                j += k + 1;
                continue;
            }
        }
        // One item: the last ones of the block, or a group with a huge length.
        let Some(&len) = items.get(j) else { break items.len() };
        let a = len.into();
        let next = load.saturating_add(a);
        if next <= capacity {
            load = next;
        } else if a > capacity || load == NO_BIN {
            break j;
        } else {
            closed.starts[n] = j as u32;
            closed.loads[n] = load;
            n += 1;
            load = a;
        }
        j += 1;
    };
    // Each length fitted here is in one of the closed bins or the open one, which also hold
    // the load carried in (`first_load`, or NO_BIN in both when no bin was open and none
    // fitted). The loads can exceed u64 by that carried load; the difference, at most
    // NEXT_FIT_BLOCK lengths within the capacity, cannot: wrapping gives it exactly.
    let closed_sum: u64 = closed.loads[..n].iter().sum();
    Scan { at, load, sum: closed_sum.wrapping_add(load).wrapping_sub(first_load), closed: n }
}

/// Best or first fit decreasing over `items` — (index, aligned length) in (length desc,
/// index asc) order, `fitting` of them within `capacity` — pushing each item's bin onto
/// `assign`, in that order ([`NONE`] for a dropped one); returns the number of bins. The oversized items come first: with `single` each
/// opens its own bin (numbered first), otherwise they were dropped already.
fn any_fit(
    items: impl Iterator<Item = (u32, u64)>,
    capacity: u64,
    oversize: OversizePolicy,
    method: PackMethod,
    lower_bound: u64,
    fitting: usize,
    assign: &mut Vec<u32>,
) -> usize {
    let mut items = items.peekable();
    let mut singles = 0u32;
    while let Some(&(_, a)) = items.peek() {
        if a <= capacity {
            break;
        }
        if oversize == OversizePolicy::Single {
            assign.push(singles);
            singles += 1;
        } else {
            assign.push(NONE);
        }
        items.next();
    }
    // Any-fit algorithms leave at most one bin at most half full, so they open at most
    // 2·lower_bound + 1 bins.
    let max_bins = (2 * lower_bound + 1).min(fitting as u64) as usize;
    let opened = if method == PackMethod::Bfd {
        best_fit(items, capacity, fitting, assign, singles)
    } else {
        first_fit(items, capacity, assign, singles, max_bins)
    };
    singles as usize + opened
}

/// Best fit: the bin with the least room ≥ the item, the oldest on ties. Returns the
/// number of bins opened (numbered from `first`).
fn best_fit(
    items: impl Iterator<Item = (u32, u64)>,
    capacity: u64,
    n: usize,
    assign: &mut Vec<u32>,
    first: u32,
) -> usize {
    let mut rooms = RoomIndex::new(capacity, n);
    let mut opened = 0usize;
    for (_, a) in items {
        let (room, b) = match rooms.take_best(a) {
            Some(found) => found,
            None => {
                opened += 1;
                (capacity, (opened - 1) as u32)
            }
        };
        assign.push(first + b);
        rooms.insert(room - a, b);
    }
    opened
}

/// First fit over a max segment tree of the bins' room: the oldest bin with room ≥ the
/// item. Returns the number of bins opened (numbered from `first`).
fn first_fit(
    items: impl Iterator<Item = (u32, u64)>,
    capacity: u64,
    assign: &mut Vec<u32>,
    first: u32,
    max_bins: usize,
) -> usize {
    // Unopened bins (leaves beyond `opened`) hold the full capacity.
    let mut leaves = max_bins.max(1).next_power_of_two();
    let mut tree = alloc::vec![capacity; 2 * leaves];
    let mut opened = 0usize;
    for (_, a) in items {
        if tree[1] < a {
            // All `leaves` bins are too full (the any-fit bound makes this unreachable):
            // double the tree; the new leaves are fresh bins.
            let old = core::mem::take(&mut tree);
            tree = alloc::vec![capacity; 4 * leaves];
            tree[2 * leaves..3 * leaves].copy_from_slice(&old[leaves..]);
            leaves *= 2;
            for node in (1..leaves).rev() {
                tree[node] = tree[2 * node].max(tree[2 * node + 1]);
            }
        }
        // Descend to the leftmost leaf with room >= a.
        let mut node = 1;
        while node < leaves {
            node = if tree[2 * node] >= a { 2 * node } else { 2 * node + 1 };
        }
        let leaf = node - leaves;
        opened = opened.max(leaf + 1);
        assign.push(first + leaf as u32);
        tree[node] -= a;
        // Up the path while the maximum changes (above that, nothing does).
        let mut up = node / 2;
        while up >= 1 {
            let max = tree[2 * up].max(tree[2 * up + 1]);
            if tree[up] == max {
                break;
            }
            tree[up] = max;
            up /= 2;
        }
    }
    opened
}
