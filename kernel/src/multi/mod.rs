//! Packing under several limits at once (vector bin packing): every item has a size in each of
//! up to [`MAX_RESOURCES`] resources (tokens always first; for example image tokens and images
//! after them), every bin a capacity in each, and optionally a maximum number of items
//! (segments) per bin.
//!
//! - **Sizes.** Tokens are rounded up to a multiple of `align`, as in [`pack`]; the other
//!   resources are taken as they are. The segment limit is one more resource, of size 1 for
//!   every item, placed last.
//! - **Method.** [`MultiMethod::Balanced`] (the default) fills bins one at a time so that
//!   their resources run out together, in O(n log n): see `multi/fill.rs`. BFD, FFD
//!   and next-fit are the classic rules below, kept for comparison and for users who want
//!   them.
//! - **Order** (BFD and FFD). Items by their *share* desc, then index asc. An item's share is
//!   Σ over the resources of ⌊size · 2^64 / capacity⌋ (integer: the same order everywhere;
//!   oversized items, whose sum may saturate at 2^128 − 1, come first anyway).
//!   With one resource this is the order of [`pack`].
//! - **Fit.** FFD: the oldest bin in which the item fits in every resource. BFD: among the bins
//!   in which it fits in every resource, the one with the least room left in the item's
//!   *dominant* resource (its largest size / capacity, the first such resource on ties), the
//!   oldest on ties. Next-fit: input order; an item that does not fit in every resource closes
//!   the bin.
//! - **Bound.** Per resource ⌈Σ sizes of the items that fit / capacity⌉ (and for segments
//!   ⌈items / max segments⌉); their maximum is the reported lower bound.
//! - **One resource** without a segment limit: the bins of [`pack`], bit for bit (it is
//!   [`pack`]).
//!
//! An item over any capacity is oversized and follows the [`OversizePolicy`]; under `single`
//! its bin comes first (BFD/FFD, by share desc, index asc) or at its place (next-fit), as in
//! [`pack`].

use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;

use crate::pack::{OversizePolicy, PackMethod, PackOptions, Packing, assemble, bin_offsets, pack};
use crate::{Error, checked_len, invalid};

mod classic;
mod fill;
pub(crate) use classic::dominant;
use classic::{RestMin, best_fit, first_fit};
pub use fill::{MAX_BALANCED_CAPACITY, MAX_BALANCED_ITEMS};

/// The algorithm of [`pack_multi`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum MultiMethod {
    /// Balanced fill (the default): large multimodal items fill bins one at a time so that
    /// the bins' resources run out together, small ones go by best fit, text-only ones by
    /// best fit decreasing on tokens; O(n log n), capacities up to
    /// [`MAX_BALANCED_CAPACITY`]. With one resource, BFD on tokens under the segment limit.
    #[default]
    Balanced,
    /// Best-fit decreasing on the dominant resource (see the module).
    Bfd,
    /// First-fit decreasing (see the module).
    Ffd,
    /// Next-fit in input order.
    NextFit,
}

impl MultiMethod {
    /// The method of [`pack`] that gives the same bins with one resource and no segment
    /// limit (`balanced` is best-fit decreasing there).
    pub fn single(self) -> PackMethod {
        match self {
            MultiMethod::Balanced | MultiMethod::Bfd => PackMethod::Bfd,
            MultiMethod::Ffd => PackMethod::Ffd,
            MultiMethod::NextFit => PackMethod::NextFit,
        }
    }
}

/// The most resources an item can carry (tokens included; the segment limit is not counted).
pub const MAX_RESOURCES: usize = 8;

/// The most items [`pack_multi`]'s `bfd` and `ffd` take in one call with more than one
/// resource or a segment limit: 2^18 (see also [`MAX_FIT_STEPS`]; the `balanced` method has
/// neither limit). Their
/// fits search the open bins one by one where one resource would use an index (a bin may
/// have room in one resource and none in another), so time grows with items × bins: 100,000
/// VLM samples take about 1.5 s. Larger inputs are refused rather than left running for
/// minutes; pack them in windows.
pub const MAX_MULTI_ITEMS: usize = 1 << 18;

/// Options of [`pack_multi`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiOptions<'a> {
    /// Each resource's capacity per bin (each ≥ 1), tokens first; 1 to [`MAX_RESOURCES`]
    /// entries.
    pub capacities: &'a [u64],
    /// The resources' names for messages, one per capacity and all different (e.g. `tokens`,
    /// `image_tokens`, `images`), or none (`resource 0`, `resource 1`, …).
    pub names: &'a [String],
    /// At most this many items per bin; 0 means no limit.
    pub max_segments: u64,
    /// Token sizes are rounded up to a multiple of `align` (≥ 1).
    pub align: u64,
    /// The algorithm.
    pub method: MultiMethod,
    /// The oversize policy.
    pub oversize: OversizePolicy,
}

/// The result of [`pack_multi`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiPacking {
    /// The bins, as [`pack`] gives them: `loads` are the aligned token loads, `real_tokens`
    /// and `aligned_tokens` count tokens, and `lower_bound` is the largest of
    /// `lower_bounds`.
    pub packing: Packing,
    /// Every bin's load in every resource, bin by bin (`bins × resources` entries, tokens
    /// aligned).
    pub resource_loads: Vec<u64>,
    /// The lower bound of each resource, then of the segment limit when there is one.
    pub lower_bounds: Vec<u64>,
}

/// Packs `n` items whose sizes are `sizes` (row by row: item `i` is
/// `sizes[i·R..(i+1)·R]` with `R = capacities.len()`) into bins within every capacity.
///
/// Errors: `invalid-argument` for no item, `sizes` not a whole number of rows, no or more than
/// [`MAX_RESOURCES`] capacities, names not one per capacity (or empty, twice, or `segments`
/// beside a segment limit), a capacity or `align` of 0, a sum above 2^64 − 1, more than
/// 2^32 − 1 items; with two or more resources or a segment limit, under `balanced` a capacity
/// above [`MAX_BALANCED_CAPACITY`] or more than [`MAX_BALANCED_ITEMS`] items, under `bfd` and
/// `ffd` more than [`MAX_MULTI_ITEMS`] items or a fit needing more than [`MAX_FIT_STEPS`]
/// steps (one resource without a segment limit is [`pack`], which has none of these limits);
/// `infeasible` for an
/// item over a capacity under the `error` policy (naming the item, the resource, its size and
/// the capacity).
pub fn pack_multi(sizes: &[u64], options: &MultiOptions<'_>) -> Result<MultiPacking, Error> {
    pack_multi_within(sizes, options, MAX_FIT_STEPS)
}

/// [`pack_multi`] refusing inputs that need more than `max_steps` fit steps.
fn pack_multi_within(sizes: &[u64], options: &MultiOptions<'_>, max_steps: u64) -> Result<MultiPacking, Error> {
    let MultiOptions { capacities, names, max_segments, align, method, oversize } = *options;
    let r = capacities.len();
    if r == 0 || r > MAX_RESOURCES {
        return invalid!("capacities must have 1 to {MAX_RESOURCES} entries (got {r})");
    }
    if let Some(at) = capacities.iter().position(|&c| c == 0) {
        return invalid!("capacities[{at}] must be at least 1 (got 0)");
    }
    if !names.is_empty() && names.len() != r {
        return invalid!("names has {} entries and capacities {r}: one name per capacity, or none", names.len());
    }
    for (q, name) in names.iter().enumerate() {
        if name.is_empty() {
            return invalid!("names[{q}] must not be empty");
        }
        // Byte by byte: `==` on strings calls `memcmp`, which the component does not link.
        let same = |n: &String| n.len() == name.len() && n.bytes().zip(name.bytes()).all(|(a, b)| a == b);
        if let Some(p) = names[..q].iter().position(same) {
            return invalid!("names[{q}] = {name:?} is given twice (also names[{p}])");
        }
        if max_segments > 0 && same(&String::from(SEGMENTS)) {
            return invalid!(
                "names[{q}] = {name:?} is the segment limit's name: rename the resource or drop max_segments"
            );
        }
    }
    if align == 0 {
        return invalid!("align must be at least 1 (got 0)");
    }
    if sizes.is_empty() || sizes.len() % r != 0 {
        return invalid!(
            "sizes must hold a whole number (≥ 1) of rows of {r} values, one per capacity (got {} values)",
            sizes.len()
        );
    }
    let n = sizes.len() / r;
    checked_len("sizes' rows", n)?;
    let pack_options = PackOptions { align, method: method.single(), oversize, ..PackOptions::new(capacities[0]) };
    if r == 1 && max_segments == 0 {
        let packing = match pack(sizes, &pack_options) {
            Ok(p) => p,
            // `pack` names the item by `lengths[i]`: say it in this function's words (after
            // `pack`'s checks, the first item over the capacity is the one it refused).
            Err(Error::Infeasible(_)) if !names.is_empty() => {
                let over =
                    sizes.iter().map(|&l| l.div_ceil(align).saturating_mul(align)).position(|a| a > capacities[0]);
                let i = over.unwrap_or(0);
                return Err(over_limit(
                    i,
                    sizes[i].div_ceil(align).saturating_mul(align),
                    0,
                    capacities[0],
                    names,
                    align,
                ));
            }
            Err(e) => return Err(e),
        };
        let lower_bounds = alloc::vec![packing.lower_bound];
        return Ok(MultiPacking { resource_loads: packing.loads.clone(), packing, lower_bounds });
    }
    // The methods' own bounds.
    if method == MultiMethod::Balanced {
        if n > MAX_BALANCED_ITEMS {
            return invalid!(
                "sizes has {n} rows; the balanced method takes at most {MAX_BALANCED_ITEMS} items per call \
                 (pack larger inputs in windows)"
            );
        }
        if let Some(q) = capacities.iter().position(|&c| c > MAX_BALANCED_CAPACITY) {
            return invalid!(
                "capacities[{q}] ({}) must be at most {MAX_BALANCED_CAPACITY} with the balanced method \
                 (got {}); use bfd or ffd for larger capacities",
                name(names, q),
                capacities[q]
            );
        }
    } else if n > MAX_MULTI_ITEMS {
        return invalid!(
            "sizes has {n} rows; packing under several limits takes at most {MAX_MULTI_ITEMS} items per call \
             (pack larger inputs in windows)"
        );
    }
    macro_rules! by_resources {
        ($($r:literal)*) => {
            match r {
                $($r => pack_rows::<$r>(sizes, options, max_steps),)*
                _ => invalid!("capacities must have 1 to {MAX_RESOURCES} entries (got {r})"), // checked above
            }
        };
    }
    by_resources!(1 2 3 4 5 6 7 8)
}

/// [`pack_multi_within`] over `R` resources, its arguments checked.
fn pack_rows<const R: usize>(sizes: &[u64], options: &MultiOptions<'_>, max_steps: u64) -> Result<MultiPacking, Error> {
    let MultiOptions { capacities, names, max_segments, align, method, oversize } = *options;
    let n = sizes.len() / R;
    // The balanced fill sorts the items into its classes as the scan meets them.
    let mut classes = (method == MultiMethod::Balanced).then(|| fill::Classes::<R>::new(capacities, n));
    let Scan { work, tokens, fit_sums, real_all, dropped, mut single, fitting } =
        scan_rows::<R>(sizes, capacities, align, oversize, names, |i, row| {
            if let Some(classes) = classes.as_mut() {
                classes.add(i, row);
            }
        })?;
    let mut lower_bounds: Vec<u64> = fit_sums.iter().zip(capacities).map(|(&s, &c)| s.div_ceil(c)).collect();
    if max_segments > 0 {
        lower_bounds.push((fitting as u64).div_ceil(max_segments));
    }
    let lower_bound = lower_bounds.iter().copied().max().unwrap_or(0);
    let dropped_real: u64 = dropped.iter().map(|&i| sizes[i as usize * R]).sum();
    let dropped_aligned: u64 = dropped.iter().map(|&i| work[i as usize * R]).sum();
    let (offsets, indices, loads, resource_loads) = if let Some(classes) = classes {
        balanced(&work, classes, max_segments, &mut single, oversize)
    } else {
        classic(&work, capacities, max_segments, method, oversize, lower_bound, max_steps)?
    };
    single.sort_unstable();
    let packing = Packing {
        offsets,
        indices,
        loads,
        dropped,
        single,
        real_tokens: real_all - dropped_real,
        aligned_tokens: tokens - dropped_aligned,
        lower_bound,
    };
    Ok(MultiPacking { packing, resource_loads, lower_bounds })
}

/// The balanced method over `work` (`R` values per item) and its items sorted into
/// `classes`: oversized items under `single` get the first bins, by share desc and index asc
/// (`single` is left in that order), the classes' items go to `fill::fill`.
fn balanced<const R: usize>(
    work: &[u64],
    classes: fill::Classes<R>,
    max_segments: u64,
    single: &mut [u32],
    oversize: OversizePolicy,
) -> Bins {
    let (mut assign, mut resource_loads) = singles_first(work, &classes.caps(), max_segments, single, oversize);
    let first = (resource_loads.len() / R) as u32;
    let bins = first as usize + fill::fill(classes, max_segments, first, &mut assign, &mut resource_loads);
    by_bin(&assign, bins, resource_loads, R)
}

/// The bin of every item (`work` holds `caps.len()` values per item) with the oversized
/// items of `single` in the first bins under the `single` policy — by share desc, index asc,
/// the order `single` is left in — and every other item in none yet; and those bins' loads.
fn singles_first(
    work: &[u64],
    caps: &[u64],
    max_segments: u64,
    single: &mut [u32],
    oversize: OversizePolicy,
) -> (Vec<u32>, Vec<u64>) {
    let r = caps.len();
    // The share over the resources and the segment column (a constant term, added last as
    // `share` would).
    let segment_share = if max_segments > 0 { (1u128 << 64) / u128::from(max_segments) } else { 0 };
    let share_of = |i: u32| share(&work[i as usize * r..][..r], caps).saturating_add(segment_share);
    single.sort_unstable_by(|&a, &b| share_of(b).cmp(&share_of(a)).then(a.cmp(&b)));
    let mut assign = alloc::vec![NONE; work.len() / r];
    let mut loads: Vec<u64> = Vec::new();
    if oversize == OversizePolicy::Single {
        for (bin, &i) in single.iter().enumerate() {
            assign[i as usize] = bin as u32;
            loads.extend_from_slice(&work[i as usize * r..][..r]);
        }
    }
    (assign, loads)
}

/// The `bins` bins from the bin of every item (`assign`, [`NONE`] for none) and their loads
/// (`r` per bin): the members of each in index order.
fn by_bin(assign: &[u32], bins: usize, resource_loads: Vec<u64>, r: usize) -> Bins {
    let offsets = bin_offsets(assign, bins);
    let mut at: Vec<u32> = offsets[..bins].to_vec();
    let mut indices = alloc::vec![0u32; offsets[bins] as usize];
    for (i, &b) in assign.iter().enumerate() {
        if b != NONE {
            let at = &mut at[b as usize];
            indices[*at as usize] = i as u32;
            *at += 1;
        }
    }
    let loads = resource_loads.iter().step_by(r).copied().collect();
    (offsets, indices, loads, resource_loads)
}

/// The bins of a fit: offsets, members (ascending in each bin), token loads, and loads in
/// every resource (bins × resources).
type Bins = (Vec<u32>, Vec<u32>, Vec<u64>, Vec<u64>);

/// The classic methods (BFD, FFD, next-fit) over `work` (one value per capacity per item)
/// with at most `max_segments` items per bin (0: no limit). Not inlined: one copy serves
/// every resource count.
#[inline(never)]
fn classic(
    work: &[u64],
    capacities: &[u64],
    max_segments: u64,
    method: MultiMethod,
    oversize: OversizePolicy,
    lower_bound: u64,
    max_steps: u64,
) -> Result<Bins, Error> {
    let r = capacities.len();
    let n = work.len() / r;
    // The segment limit is one more resource, of size 1 per item: the classic fits read its
    // column beside the sizes.
    let mut caps: Vec<u64> = capacities.to_vec();
    if max_segments > 0 {
        caps.push(max_segments);
    }
    let (caps, rx) = (&caps[..], caps.len());
    let work: Cow<'_, [u64]> = if rx == r {
        Cow::Borrowed(work)
    } else {
        let mut wx = Vec::with_capacity(n * rx);
        for row in work.chunks_exact(r) {
            wx.extend_from_slice(row);
            wx.push(1);
        }
        Cow::Owned(wx)
    };
    let mut assign: Vec<u32> = Vec::with_capacity(n);
    let order: Vec<u32> = if method == MultiMethod::NextFit {
        let order: Vec<u32> = (0..n as u32).collect();
        next_fit(&work, caps, &order, oversize, &mut assign);
        order
    } else {
        let order = share_order(&work, caps);
        let mut items = order.iter().copied().peekable();
        let mut singles = 0u32;
        // Oversized items (the largest shares) come first: a bin each, or none.
        while let Some(&i) = items.peek() {
            if fits(&work[i as usize * rx..][..rx], caps) {
                break;
            }
            assign.push(if oversize == OversizePolicy::Single { singles } else { NONE });
            singles += u32::from(oversize == OversizePolicy::Single);
            items.next();
        }
        let rest = &order[order.len() - items.count()..];
        let mins = RestMin::new(&work, caps, rest);
        if method == MultiMethod::Bfd {
            best_fit(&work, caps, rest, mins, singles, &mut assign, max_steps)?;
        } else {
            first_fit(&work, caps, rest, mins, singles, lower_bound, &mut assign, max_steps)?;
        }
        order
    };
    let bins = assign.iter().filter(|&&b| b != NONE).map(|&b| b as usize + 1).max().unwrap_or(0);
    let (offsets, indices, loads) = assemble(order.iter().map(|&i| (i, work[i as usize * rx])), &assign, bins);
    let mut resource_loads = alloc::vec![0u64; bins * r];
    for (&i, &b) in order.iter().zip(&assign) {
        if b != NONE {
            let (i, b) = (i as usize, b as usize);
            for q in 0..r {
                resource_loads[b * r + q] += work[i * rx + q];
            }
        }
    }
    Ok((offsets, indices, loads, resource_loads))
}

/// What [`scan_rows`] finds in the rows.
struct Scan<'a> {
    /// The sizes, tokens aligned (the caller's rows when `align` is 1).
    work: Cow<'a, [u64]>,
    /// The aligned tokens of every item.
    tokens: u64,
    /// Each resource's sum over the items within every capacity.
    fit_sums: Vec<u64>,
    /// The unaligned tokens of every item.
    real_all: u64,
    /// The oversized items, by the policy (in index order).
    dropped: Vec<u32>,
    single: Vec<u32>,
    /// The number of items within every capacity.
    fitting: usize,
}

/// One pass over the rows of `sizes` (`R` values each): aligns the tokens, sorts the items
/// into fitting and oversized ones, and calls `on_fit(i, aligned sizes)` for every fitting
/// item in index order. Errors, item by item: an aligned size or a resource's sum past
/// 2^64 − 1, then an oversized item under the `error` policy.
fn scan_rows<'a, const R: usize>(
    sizes: &'a [u64],
    capacities: &[u64],
    align: u64,
    oversize: OversizePolicy,
    names: &[String],
    mut on_fit: impl FnMut(usize, &[u64; R]),
) -> Result<Scan<'a>, Error> {
    let mut caps = [0u64; R];
    caps.copy_from_slice(capacities);
    let mut aligned: Vec<u64> = if align == 1 { Vec::new() } else { sizes.to_vec() };
    let (mut sums, mut fit_sums) = ([0u64; R], [0u64; R]);
    let mut real_all: u64 = 0;
    let mut fitting = 0usize;
    let (mut dropped, mut single) = (Vec::new(), Vec::new());
    for (i, row) in sizes.chunks_exact(R).enumerate() {
        let mut item = [0u64; R];
        item.copy_from_slice(row);
        if align != 1 {
            item[0] = match item[0].div_ceil(align).checked_mul(align) {
                Some(a) => a,
                None => {
                    return invalid!(
                        "sizes[{i}][0] ({}) = {} aligned to {align} overflows u64",
                        name(names, 0),
                        item[0]
                    );
                }
            };
            aligned[i * R] = item[0];
        }
        let mut over = 0u32;
        for q in 0..R {
            sums[q] = match sums[q].checked_add(item[q]) {
                Some(t) => t,
                None => {
                    let what = name(names, q);
                    return invalid!("the sum of the sizes of {what} overflows u64 (at most {} allowed)", u64::MAX);
                }
            };
            over |= u32::from(item[q] > caps[q]) << q;
        }
        real_all += row[0]; // ≤ the aligned sum, which did not overflow
        if over == 0 {
            for q in 0..R {
                fit_sums[q] += item[q];
            }
            on_fit(i, &item);
            fitting += 1;
            continue;
        }
        let q = over.trailing_zeros() as usize;
        match oversize {
            OversizePolicy::Error => return Err(over_limit(i, item[q], q, caps[q], names, align)),
            OversizePolicy::Single => single.push(i as u32),
            OversizePolicy::Drop => dropped.push(i as u32),
        }
    }
    let work = if align == 1 { Cow::Borrowed(sizes) } else { Cow::Owned(aligned) };
    Ok(Scan { work, tokens: sums[0], fit_sums: fit_sums.to_vec(), real_all, dropped, single, fitting })
}

/// The `infeasible` error of item `i`, which needs `s` of resource `q` (capacity `c`).
fn over_limit(i: usize, s: u64, q: usize, c: u64, names: &[String], align: u64) -> Error {
    let what = match names.get(q) {
        Some(name) => name.clone(),
        None => alloc::format!("of {}", name(names, q)),
    };
    let aligned = if q == 0 && align > 1 { alloc::format!(", tokens aligned to {align}") } else { String::new() };
    Error::Infeasible(alloc::format!(
        "item {i} needs {s} {what} (capacity {c}{aligned}); use oversize single or drop to accept such items"
    ))
}

/// The most steps (candidate bins tried by BFD, tree nodes visited by FFD) one call may take:
/// 2^30, seconds to tens of seconds. The fits take items × bins steps in the worst case (a
/// bin may have room in one resource and none in another); an input that needs more is
/// refused with an error instead of running for minutes.
pub const MAX_FIT_STEPS: u64 = 1 << 30;

/// The error of `n` items that need more than `max_steps` fit steps.
fn too_many_steps(n: usize, max_steps: u64) -> Error {
    Error::InvalidArgument(alloc::format!(
        "packing these {n} items under several limits needs more than {max_steps} fit steps: many bins have \
         room in one resource but not in another; pack the items in smaller windows"
    ))
}

/// The name of the segment limit beside the named resources (in messages and bounds).
pub const SEGMENTS: &str = "segments";

/// Resource `q`'s name in messages: its name, `segments` after the named ones, or
/// `resource q`.
fn name(names: &[String], q: usize) -> String {
    match names.get(q) {
        Some(n) => n.clone(),
        None if !names.is_empty() => SEGMENTS.into(),
        None => alloc::format!("resource {q}"),
    }
}

/// "No bin": a dropped item's entry in the bin list.
const NONE: u32 = u32::MAX;

/// Whether `item` fits into `room` in every resource.
#[inline]
pub(crate) fn fits(item: &[u64], room: &[u64]) -> bool {
    item.iter().zip(room).all(|(s, r)| s <= r)
}

/// The item indices by share desc, index asc (see the module), oversized items first.
fn share_order(work: &[u64], caps: &[u64]) -> Vec<u32> {
    let rx = caps.len();
    let n = work.len() / rx;
    let mut keyed: Vec<(bool, u128, u32)> = (0..n)
        .map(|i| {
            let item = &work[i * rx..][..rx];
            // Oversized items first: their bins come before the others.
            (!fits(item, caps), share(item, caps), i as u32)
        })
        .collect();
    keyed.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

/// An item's share: Σ over its resources of ⌊size · 2^64 / capacity⌋, saturating.
pub(crate) fn share(item: &[u64], caps: &[u64]) -> u128 {
    item.iter().zip(caps).fold(0u128, |acc, (&s, &c)| acc.saturating_add(((s as u128) << 64) / c as u128))
}

/// Next-fit in input order; oversized items stand at their place (a bin of their own under
/// `single`, none under `drop`).
fn next_fit(work: &[u64], caps: &[u64], order: &[u32], oversize: OversizePolicy, assign: &mut Vec<u32>) {
    let rx = caps.len();
    let mut room: Vec<u64> = caps.to_vec();
    let mut bins = 0u32;
    let mut open = false;
    for &i in order {
        let item = &work[i as usize * rx..][..rx];
        if !fits(item, caps) {
            // A single bin stands at its place and closes the open bin; a dropped item leaves
            // it open.
            if oversize == OversizePolicy::Single {
                assign.push(bins);
                bins += 1;
                open = false;
            } else {
                assign.push(NONE);
            }
            continue;
        }
        if !open || !fits(item, &room) {
            room.copy_from_slice(caps);
            bins += 1;
            open = true;
        }
        for (r, s) in room.iter_mut().zip(item) {
            *r -= s;
        }
        assign.push(bins - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An input whose fits try every earlier bin (each has room in tokens, none in images) is
    /// refused once it passes the step budget, and packs with a budget that allows it.
    #[test]
    fn the_step_budget_refuses_an_input_that_would_run_for_minutes() {
        // One item of 1 image, so packs with 5 images of room have not run out of images.
        let mut sizes = alloc::vec![1, 1];
        for i in 0..400u64 {
            sizes.extend_from_slice(if i % 2 == 0 { &[300_000, 95] } else { &[600_000, 10] });
        }
        for method in [MultiMethod::Bfd, MultiMethod::Ffd] {
            let o = MultiOptions {
                capacities: &[1_000_000, 100],
                names: &[],
                max_segments: 0,
                align: 1,
                method,
                oversize: OversizePolicy::Error,
            };
            let e = pack_multi_within(&sizes, &o, 2_000).unwrap_err();
            assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("needs more than 2000 fit steps")), "{e:?}");
            assert_eq!(pack_multi_within(&sizes, &o, 1 << 24).unwrap(), pack_multi(&sizes, &o).unwrap());
        }
    }
}
