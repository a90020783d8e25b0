//! Static pack plans for SFT datasets (the static pack plan contract).
//!
//! A *raw plan* ([`raw_plan`]) groups the samples of a whole dataset into packs of at most
//! `capacity` tokens; it does not depend on the number of ranks. An *aligned plan*
//! ([`aligned_plan`]) is what training consumes: the raw plan truncated (`drop_last`) or
//! padded by repeating its first packs so that every one of `world_size` ranks gets the same
//! number of packs.
//!
//! Rules of the raw plan:
//! - a sample is *long* when `length ≥ capacity` (or its aligned length exceeds
//!   `capacity`); with `allow_single_long` it becomes a pack of its own (which may
//!   exceed `capacity`), otherwise it is dropped; both are listed;
//! - the other samples are packed by best-fit decreasing on aligned lengths (ties: the lower
//!   index first, then the oldest pack), never split or truncated; a pack's aligned total is
//!   at most `capacity`;
//! - inside a pack, indices ascend; packs are ordered by their smallest index (packs are
//!   disjoint, so no two packs share a smallest index and the lexicographic tie-break of the
//!   seed never has to decide).
//!
//! Checksums are the sha256 of the canonical encoding of a list of packs, in lowercase hex:
//! `u64` little-endian number of packs, then per pack a `u32` little-endian size followed by
//! its indices as `u32` little-endian. The aligned plan is encoded as the list of packs it
//! consumes (repeats included), so with `world_size ≤ 1` both checksums are equal.

use alloc::string::String;
use alloc::vec::Vec;

use sha2::{Digest, Sha256};

use crate::balance::{MicroLimits, resources};
use crate::multi::{MultiMethod, MultiOptions, pack_multi};
use crate::pack::{OversizePolicy, PackOptions, Packing, pack};
use crate::{Error, checked_len, invalid};

crate::__options! { $ __plan_options;
/// Options of [`raw_plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanOptions {
    /// The hard per-pack cap in tokens, at least 1.
    pub capacity: u64,
    /// Every length is rounded up to a multiple of `align` (at least 1) before packing.
    pub align: u64,
    /// Long samples (`length ≥ capacity`) become single-sample packs when true and
    /// are dropped when false.
    pub allow_single_long: bool,
}
}

impl PlanOptions {
    /// Options with `capacity` and the defaults: `align` 1, long samples dropped.
    pub fn new(capacity: u64) -> Self {
        Self { capacity, align: 1, allow_single_long: false }
    }
}

/// A raw plan, in flat form: pack `p` is `indices[offsets[p]..offsets[p + 1]]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawPlan {
    /// `packs + 1` offsets into `indices`, starting at 0.
    pub offsets: Vec<u32>,
    /// The sample indices of every pack, pack by pack, ascending inside a pack.
    pub indices: Vec<u32>,
    /// Real tokens of every pack (sum of the members' lengths).
    pub tokens: Vec<u64>,
    /// Long samples emitted as single-sample packs, ascending.
    pub single_long: Vec<u32>,
    /// Long samples dropped (`allow_single_long` false), ascending.
    pub dropped: Vec<u32>,
    /// Real tokens of every packed sample.
    pub real_tokens: u64,
    /// Aligned tokens of the samples in multi-sample-capable packs (all but `single_long`).
    pub aligned_tokens: u64,
    /// `ceil(aligned_tokens / capacity)` + the number of single-long packs: no plan of
    /// the same samples has fewer packs.
    pub lower_bound: u64,
    /// sha256 of the canonical encoding of the packs (see the module docs).
    pub checksum: [u8; 32],
}

impl RawPlan {
    /// The number of packs.
    pub fn packs(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// The members of pack `p` (sample indices, ascending).
    pub fn pack(&self, p: usize) -> &[u32] {
        &self.indices[self.offsets[p] as usize..self.offsets[p + 1] as usize]
    }

    /// The checksum in lowercase hex.
    pub fn checksum_hex(&self) -> String {
        hex(&self.checksum)
    }
}

/// An aligned plan: which raw packs training consumes, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AlignedPlan {
    /// Raw pack index of every aligned slot; `len()` is a multiple of `world_size` (when
    /// `world_size > 1`).
    pub packs: Vec<u32>,
    /// Packs repeated at the end (`drop_last` false): raw packs `0..pad_needed`.
    pub pad_needed: u32,
    /// Raw packs left out at the end (`drop_last` true): the last `dropped_packs` packs.
    pub dropped_packs: u32,
    /// Samples in the dropped packs.
    pub dropped_samples: u64,
    /// sha256 of the canonical encoding of the consumed packs (repeats included).
    pub checksum: [u8; 32],
}

impl AlignedPlan {
    /// The checksum in lowercase hex.
    pub fn checksum_hex(&self) -> String {
        hex(&self.checksum)
    }
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Lowercase hex of `bytes`: how a checksum crosses the component boundary ([`unhex`] reads
/// it back there) and stands in plan documents.
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        s.push(DIGITS[(b >> 4) as usize] as char);
        s.push(DIGITS[(b & 15) as usize] as char);
    }
    s
}

/// A checksum that is not 64 lowercase hex digits (what [`unhex`] refuses), as it came.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MalformedChecksum(pub String);

impl core::fmt::Display for MalformedChecksum {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "malformed checksum {:?}: not 64 lowercase hex digits", self.0)
    }
}

/// The sha256 that [`hex`] wrote: exactly 64 lowercase hex digits, else [`MalformedChecksum`].
pub fn unhex(s: &str) -> Result<[u8; 32], MalformedChecksum> {
    let digit = |c: u8| DIGITS.iter().position(|&d| d == c).map(|v| v as u8);
    let mut out = [0u8; 32];
    if s.len() != 2 * out.len() {
        return Err(MalformedChecksum(s.into()));
    }
    for (byte, pair) in out.iter_mut().zip(s.as_bytes().chunks_exact(2)) {
        match (digit(pair[0]), digit(pair[1])) {
            (Some(high), Some(low)) => *byte = (high << 4) | low,
            _ => return Err(MalformedChecksum(s.into())),
        }
    }
    Ok(out)
}

/// The raw plan of `lengths` (one entry per sample, in tokens).
///
/// Errors: `invalid-argument` for no samples, more than 2^32 − 1 samples, a zero length
/// (naming the first), `capacity == 0`, `align == 0`, an aligned length or a total
/// above 2^64 − 1; `infeasible` when every sample is long and `allow_single_long` is false
/// (the plan would have no pack).
pub fn raw_plan(lengths: &[u64], options: &PlanOptions) -> Result<RawPlan, Error> {
    plan_with(
        lengths,
        options,
        |_| false,
        |fit_aligned, _| {
            let opts = PackOptions::new(options.capacity);
            pack(fit_aligned, &opts)
        },
    )
}

/// Further limits of a raw plan beside `capacity` (see [`raw_plan_limited`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlanLimits<'a> {
    /// Every sample's size in each limited resource, and each resource's cap per pack and name
    /// (as for micro-batches: 0 to 7 caps here).
    pub limits: MicroLimits<'a>,
    /// At most this many samples per multi-sample pack; 0 means no limit.
    pub max_segments: u64,
    /// The algorithm packing the samples that are not long.
    pub method: MultiMethod,
}

/// The result of [`raw_plan_limited`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitedRawPlan {
    /// The plan. Its `lower_bound` is the largest of `lower_bounds` plus the single-long packs.
    pub raw: RawPlan,
    /// Every pack's load in each limited resource, pack by pack in plan order (`packs × E`).
    pub loads: Vec<u64>,
    /// The lower bound of the multi-sample packs per resource: tokens (aligned), each limit,
    /// then the segments when `max_segments > 0`.
    pub lower_bounds: Vec<u64>,
    /// Each limit's name (unnamed ones `resource 1`, `resource 2` …).
    pub names: Vec<String>,
}

/// The raw plan of `lengths` under further limits per pack (image tokens, images, segments):
/// [`raw_plan`]'s rules with these changes.
/// - A sample is also *long* when its size in a limited resource is above that resource's cap;
///   `allow_single_long` decides for it as for a long sample.
/// - The other samples are packed by [`pack_multi`](crate::pack_multi) with `method` under
///   every cap (tokens: `capacity`, on aligned lengths) and `max_segments`.
/// - With no limit and no segment limit, the raw plan is [`raw_plan`]'s, bit for bit,
///   whatever `method`.
///
/// Errors: those of [`raw_plan`]; the limits' (more than 7 caps, sizes not one row per sample,
/// a cap of 0, names not one per cap, empty, repeated or `tokens`); those of
/// [`pack_multi`](crate::pack_multi) for `method` (e.g. `bfd` over 2^18 samples).
pub fn raw_plan_limited(
    lengths: &[u64],
    options: &PlanOptions,
    limits: &PlanLimits<'_>,
) -> Result<LimitedRawPlan, Error> {
    let (caps, names) = resources(lengths.len(), options.capacity, &limits.limits)?;
    let e = caps.len() - 1;
    let limited = e > 0 || limits.max_segments > 0;
    if limited
        && limits.method == MultiMethod::Balanced
        && let Some(q) = caps.iter().position(|&c| c > crate::MAX_BALANCED_CAPACITY)
    {
        let what = if q == 0 { String::from("capacity") } else { alloc::format!("the cap of {}", names[q]) };
        return invalid!(
            "{what} = {} is above {}, which the balanced method does not take; choose method bfd or ffd",
            caps[q],
            crate::MAX_BALANCED_CAPACITY
        );
    }
    if !limited {
        let raw = raw_plan(lengths, options)?;
        let lower_bounds = alloc::vec![raw.aligned_tokens.div_ceil(options.capacity)];
        return Ok(LimitedRawPlan { raw, loads: Vec::new(), lower_bounds, names: Vec::new() });
    }
    let sizes = limits.limits.sizes;
    let over = |i: usize| (0..e).any(|k| sizes[i * e + k] > caps[k + 1]);
    let mut lower_bounds = Vec::new();
    let mut raw = plan_with(lengths, options, over, |fit_aligned, fit_index| {
        let r = e + 1;
        let mut rows = Vec::with_capacity(fit_aligned.len() * r);
        for (&a, &i) in fit_aligned.iter().zip(fit_index) {
            rows.push(a);
            rows.extend_from_slice(&sizes[i as usize * e..(i as usize + 1) * e]);
        }
        let multi = MultiOptions {
            capacities: &caps,
            names: &names,
            max_segments: limits.max_segments,
            align: 1,
            method: limits.method,
            oversize: OversizePolicy::Error,
        };
        let p = pack_multi(&rows, &multi)?;
        lower_bounds = p.lower_bounds;
        Ok(p.packing)
    })?;
    if lower_bounds.is_empty() {
        // Every sample is long: no multi-sample pack.
        lower_bounds = alloc::vec![0; e + 1 + usize::from(limits.max_segments > 0)];
    }
    raw.lower_bound = lower_bounds.iter().max().copied().unwrap_or(0) + raw.single_long.len() as u64;
    let mut loads = Vec::with_capacity(raw.packs() * e);
    for p in 0..raw.packs() {
        for k in 0..e {
            loads.push(raw.pack(p).iter().map(|&i| sizes[i as usize * e + k]).sum());
        }
    }
    Ok(LimitedRawPlan { raw, loads, lower_bounds, names: names[1..].to_vec() })
}

/// The raw plan of `lengths`: long samples (`over` is true, or the token rule of [`raw_plan`])
/// split off, the others packed by `pack_fit` (their aligned lengths and sample indices, both
/// ascending by index; the bins' members index those lists), then the packs put in order.
fn plan_with(
    lengths: &[u64],
    options: &PlanOptions,
    over: impl Fn(usize) -> bool,
    pack_fit: impl FnOnce(&[u64], &[u32]) -> Result<Packing, Error>,
) -> Result<RawPlan, Error> {
    let n = checked_len("lengths", lengths.len())?;
    let PlanOptions { capacity, align, allow_single_long } = *options;
    if n == 0 {
        return invalid!("lengths must not be empty (a plan needs at least one sample)");
    }
    if capacity == 0 {
        return invalid!("capacity must be at least 1 token (got 0)");
    }
    if align == 0 {
        return invalid!("align must be at least 1 (got 0)");
    }
    // Split long samples from the ones that are packed together.
    let mut fit_index: Vec<u32> = Vec::with_capacity(lengths.len());
    let mut fit_aligned: Vec<u64> = Vec::with_capacity(lengths.len());
    let (mut long, mut total, mut over_limit) = (Vec::new(), 0u64, 0usize);
    for (i, &len) in lengths.iter().enumerate() {
        if len == 0 {
            return invalid!("lengths[{i}] = 0: every sample must have at least 1 token");
        }
        let Some(a) = len.div_ceil(align).checked_mul(align) else {
            return invalid!("lengths[{i}] = {len} rounded up to a multiple of align = {align} overflows u64");
        };
        total = match total.checked_add(a) {
            Some(t) => t,
            None => return invalid!("the sum of aligned lengths overflows u64 (at most {} allowed)", u64::MAX),
        };
        let over_i = over(i);
        over_limit += usize::from(over_i);
        if len >= capacity || a > capacity || over_i {
            long.push(i as u32);
        } else {
            fit_index.push(i as u32);
            fit_aligned.push(a);
        }
    }
    let (single_long, dropped) = if allow_single_long { (long, Vec::new()) } else { (Vec::new(), long) };
    // Packs as (first index, range in `members`), the long singles after the regular bins.
    let mut members: Vec<u32> = Vec::with_capacity(lengths.len() - dropped.len());
    let mut packs: Vec<(u32, u32, u32)> = Vec::new();
    let mut aligned_tokens = 0;
    if !fit_aligned.is_empty() {
        let bins = pack_fit(&fit_aligned, &fit_index)?;
        aligned_tokens = bins.aligned_tokens;
        packs.reserve(bins.bins() + single_long.len());
        // Members of a bin ascend by position in `fit_index`, which ascends by sample index.
        for b in 0..bins.bins() {
            let start = members.len() as u32;
            members.extend(bins.bin(b).iter().map(|&j| fit_index[j as usize]));
            packs.push((members[start as usize], start, members.len() as u32));
        }
    }
    drop(fit_index);
    drop(fit_aligned);
    for &i in &single_long {
        let start = members.len() as u32;
        members.push(i);
        packs.push((i, start, start + 1));
    }
    if packs.is_empty() && over_limit > 0 {
        return Err(Error::Infeasible(alloc::format!(
            "static packing produced no packs: all {n} samples are long ({over_limit} over a limit, the others \
             with length >= capacity = {capacity}) and allow_single_long is false; raise the limits or \
             set allow_single_long = true"
        )));
    }
    if packs.is_empty() {
        return Err(Error::Infeasible(alloc::format!(
            "static packing produced no packs: all {n} samples have length >= capacity = {capacity} \
             and allow_single_long is false; raise capacity or set allow_single_long = true"
        )));
    }
    // Packs are disjoint, so their first indices are distinct: sorting by it is total.
    packs.sort_unstable_by_key(|&(first, _, _)| first);
    let mut offsets = Vec::with_capacity(packs.len() + 1);
    let mut indices = Vec::with_capacity(members.len());
    let mut tokens = Vec::with_capacity(packs.len());
    offsets.push(0u32);
    let mut packed_real = 0u64;
    for &(_, start, end) in &packs {
        let pack = &members[start as usize..end as usize];
        let t: u64 = pack.iter().map(|&i| lengths[i as usize]).sum();
        packed_real += t;
        tokens.push(t);
        indices.extend_from_slice(pack);
        offsets.push(indices.len() as u32);
    }
    let lower_bound = aligned_tokens.div_ceil(capacity) + single_long.len() as u64;
    let checksum = checksum(&offsets, &indices, 0..packs.len() as u32);
    Ok(RawPlan {
        offsets,
        indices,
        tokens,
        single_long,
        dropped,
        real_tokens: packed_real,
        aligned_tokens,
        lower_bound,
        checksum,
    })
}

/// The aligned plan of the raw plan given in flat form (`offsets`, `indices`) for
/// `world_size` ranks, per the static pack plan contract:
/// - `world_size ≤ 1`: the raw plan;
/// - `drop_last`: the first `floor(N / world_size) · world_size` packs;
/// - otherwise: the raw plan followed by its first `pad_needed = (world_size − N mod
///   world_size) mod world_size` packs, in order.
///
/// Errors: `invalid-argument` for `world_size == 0`, offsets that do not start at 0, decrease,
/// end elsewhere than `indices.len()` or leave a pack empty; `infeasible` for a plan with no
/// pack, or one whose every pack `drop_last` would drop (fewer packs than ranks).
pub fn aligned_plan(offsets: &[u32], indices: &[u32], world_size: u32, drop_last: bool) -> Result<AlignedPlan, Error> {
    if world_size == 0 {
        return invalid!("world_size must be at least 1 (got 0)");
    }
    crate::check_count("world_size", world_size)?;
    checked_len("indices", indices.len())?;
    match offsets.first() {
        None => return invalid!("offsets must hold at least one entry (0)"),
        Some(&o) if o != 0 => return invalid!("offsets[0] must be 0 (got {o})"),
        Some(_) => {}
    }
    for (p, w) in offsets.windows(2).enumerate() {
        if w[1] <= w[0] {
            return invalid!(
                "pack {p} is empty or offsets decrease (offsets[{p}] = {}, offsets[{}] = {})",
                w[0],
                p + 1,
                w[1]
            );
        }
    }
    let last = offsets[offsets.len() - 1] as usize;
    if last != indices.len() {
        return invalid!("the last offset must equal the number of indices = {} (got {last})", indices.len());
    }
    let n = (offsets.len() - 1) as u64;
    if n == 0 {
        return Err(Error::Infeasible(String::from("static packing produced no packs: the raw plan is empty")));
    }
    let ws = u64::from(world_size.max(1));
    let (kept, pad_needed) = if ws == 1 {
        (n, 0)
    } else if drop_last {
        (n / ws * ws, 0)
    } else {
        (n, (ws - n % ws) % ws)
    };
    if kept == 0 {
        return Err(Error::Infeasible(alloc::format!(
            "drop_last with world_size = {world_size} drops all {n} packs of the raw plan; \
             use drop_last = false (repeat packs) or fewer ranks"
        )));
    }
    // pad_needed < world_size ≤ n when n ≥ world_size; otherwise repeat the plan cyclically.
    let packs: Vec<u32> = (0..kept as u32).chain((0..pad_needed).map(|j| (j % n) as u32)).collect();
    let dropped_samples = u64::from(offsets[offsets.len() - 1] - offsets[kept as usize]);
    let checksum = checksum(offsets, indices, packs.iter().copied());
    Ok(AlignedPlan {
        packs,
        pad_needed: pad_needed as u32,
        dropped_packs: (n - kept) as u32,
        dropped_samples,
        checksum,
    })
}

/// sha256 of the canonical encoding of the packs `order` of the flat plan.
fn checksum(offsets: &[u32], indices: &[u32], order: impl ExactSizeIterator<Item = u32>) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update((order.len() as u64).to_le_bytes());
    // Encode through a small buffer: one `update` per 16 KiB, not per index.
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 14);
    for p in order {
        let pack = &indices[offsets[p as usize] as usize..offsets[p as usize + 1] as usize];
        buf.extend_from_slice(&(pack.len() as u32).to_le_bytes());
        for &i in pack {
            if buf.len() + 4 > buf.capacity() {
                hasher.update(&buf);
                buf.clear();
            }
            buf.extend_from_slice(&i.to_le_bytes());
        }
        if buf.len() + 4 > buf.capacity() {
            hasher.update(&buf);
            buf.clear();
        }
    }
    hasher.update(&buf);
    hasher.finalize().into()
}
