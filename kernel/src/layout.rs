//! Layout for the trainer: alignment factors for context/tensor parallelism, cumulative
//! sequence boundaries, the context-parallel zigzag split, and the distribution of packed
//! micro-batches to data-parallel ranks with equal counts.
//!
//! - **Pad factor** ([`pad_factor`]): the CP layout contract's `2·cp·tp` (only `tp` when `cp` = 1: without
//!   a CP split the factor 2 buys nothing), ROLL's `lcm(16, 2·cp·tp)` / `lcm(16, tp)`, or a
//!   caller's multiple.
//! - **CP layout** ([`cp_layout`]): every sequence padded to a multiple of the factor and
//!   packed; `cu_seqlens` (real) and `cu_seqlens_padded`; each padded sequence viewed as
//!   `2·cp` equal chunks, CP rank `r` receives chunks `r` and `2·cp−1−r` (Megatron-Core's
//!   load-balanced "zigzag"), described as runs of the padded packed row; every rank's local
//!   boundaries are `cu_seqlens_padded / cp`.
//! - **Distribution** ([`distribute`]): samples packed into micro-batches under a token cap
//!   (best-fit decreasing, one run/LoRA at a time unless mixing is allowed), the count raised
//!   to a multiple of the DP size by splitting the heaviest micro-batches, dummy micro-batches
//!   only when there are fewer samples than slots, then equal-count Karmarkar–Karp over the
//!   micro-batch costs so every rank gets the same number.

use alloc::vec::Vec;

use crate::balance::{Cost, MicroLimits, Rows, costs, costs_with_extra};
use crate::pack::{PackOptions, pack};
use crate::partition::{PartitionMethod, PartitionOptions, partition};
use crate::{Error, checked_len, checked_sum, invalid};

/// How the alignment factor is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Factor {
    /// The CP layout contract: `2·cp·tp` when `cp` > 1, else `tp` (the default).
    #[default]
    CpTp,
    /// ROLL's: `lcm(16, 2·cp·tp)` when `cp` > 1, else `lcm(16, tp)` (16 for tensor cores).
    Roll,
    /// This multiple (≥ 1). With `cp` > 1 it must be a multiple of `2·cp`, and of `tp`.
    Multiple(u64),
}

/// The largest context- or tensor-parallel size: results hold per-CP-rank lists, so an
/// unbounded `cp` would size an allocation by an argument (the fuzzer found `cp` = 4·10⁹
/// asking for 33 GB); 65,536 is far above any real deployment and keeps `2·cp·tp` in `u64`.
pub const MAX_PARALLEL: u32 = 1 << 16;

crate::__options! { $ __align_options;
/// Parallel sizes and the factor choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlignOptions {
    /// Context-parallel size (1 ..= [`MAX_PARALLEL`]).
    pub cp: u32,
    /// Tensor-parallel size (1 ..= [`MAX_PARALLEL`]; with sequence parallelism a sequence is
    /// split over it).
    pub tp: u32,
    /// The factor rule.
    pub factor: Factor,
    /// Require `cp` and `tp` to be powers of two (some ring-attention kernels need it).
    pub power_of_two: bool,
}
}

/// No parallelism (`cp` = `tp` = 1), the seed's factor, no power-of-two requirement: what
/// every SDK takes for an omitted option (the JavaScript SDK through its build manifest).
impl Default for AlignOptions {
    fn default() -> Self {
        Self { cp: 1, tp: 1, factor: Factor::CpTp, power_of_two: false }
    }
}

impl AlignOptions {
    /// `cp`, `tp`, and the other options' defaults.
    pub fn new(cp: u32, tp: u32) -> Self {
        Self { cp, tp, ..Self::default() }
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The alignment factor every sequence length is padded to a multiple of.
///
/// Errors (`invalid-argument`): `cp` or `tp` outside 1..=[`MAX_PARALLEL`]; not a power of
/// two when required; a [`Factor::Multiple`] of 0, or not a multiple of `2·cp` (when `cp` >
/// 1) and of `tp`.
pub fn pad_factor(o: &AlignOptions) -> Result<u64, Error> {
    if o.cp == 0 {
        return invalid!("cp must be at least 1 (got 0)");
    }
    if o.tp == 0 {
        return invalid!("tp must be at least 1 (got 0)");
    }
    for (name, v) in [("cp", o.cp), ("tp", o.tp)] {
        if v > MAX_PARALLEL {
            return invalid!("{name} must be in 1..={MAX_PARALLEL} (got {v})");
        }
    }
    if o.power_of_two {
        for (name, v) in [("cp", o.cp), ("tp", o.tp)] {
            if !v.is_power_of_two() {
                return invalid!("{name} must be a power of two (got {v}); power_of_two was requested");
            }
        }
    }
    let (cp, tp) = (u64::from(o.cp), u64::from(o.tp));
    let base = if cp > 1 { 2 * cp * tp } else { tp };
    match o.factor {
        Factor::CpTp => Ok(base),
        Factor::Roll => Ok(16 / gcd(16, base) * base),
        Factor::Multiple(0) => invalid!("the alignment multiple must be at least 1 (got 0)"),
        Factor::Multiple(m) => {
            if cp > 1 && m % (2 * cp) != 0 {
                return invalid!(
                    "the alignment multiple {m} must be a multiple of 2·cp = {} so that every sequence splits into \
                     2·cp equal chunks",
                    2 * cp
                );
            }
            if m % tp != 0 {
                return invalid!("the alignment multiple {m} must be a multiple of tp = {tp}");
            }
            Ok(m)
        }
    }
}

/// The layout of one packed micro-batch under context parallelism.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpLayout {
    /// The pad factor used.
    pub factor: u64,
    /// The CP size.
    pub cp: u32,
    /// `n + 1` cumulative real lengths.
    pub cu_seqlens: Vec<u64>,
    /// `n + 1` cumulative padded lengths: sequence `i` is
    /// `[cu_seqlens_padded[i], cu_seqlens_padded[i + 1])` of the padded packed row.
    pub cu_seqlens_padded: Vec<u64>,
    /// The longest real length (0 for no sequences).
    pub max_seqlen: u64,
    /// The longest padded length.
    pub max_seqlen_padded: u64,
    /// `cp + 1` offsets into `run_starts`/`run_lengths`: CP rank `r` receives the runs
    /// `run_offsets[r]..run_offsets[r + 1]`, concatenated in that order.
    pub run_offsets: Vec<u32>,
    /// Start of each run in the padded packed row.
    pub run_starts: Vec<u64>,
    /// Length of each run (adjacent runs are merged, so with `cp` = 1 there is one run).
    pub run_lengths: Vec<u64>,
    /// `n + 1` local boundaries, the same on every rank: `cu_seqlens_padded / cp`.
    pub local_bounds: Vec<u64>,
    /// Real (non-padding) tokens each CP rank receives.
    pub rank_real_tokens: Vec<u64>,
}

impl CpLayout {
    /// Padded tokens of the whole row.
    pub fn padded_tokens(&self) -> u64 {
        self.cu_seqlens_padded.last().copied().unwrap_or(0)
    }

    /// Real tokens of the whole row.
    pub fn real_tokens(&self) -> u64 {
        self.cu_seqlens.last().copied().unwrap_or(0)
    }

    /// The runs `(start, length)` CP rank `r` receives.
    pub fn runs(&self, r: usize) -> impl Iterator<Item = (u64, u64)> + '_ {
        let (a, b) = (self.run_offsets[r] as usize, self.run_offsets[r + 1] as usize);
        self.run_starts[a..b].iter().copied().zip(self.run_lengths[a..b].iter().copied())
    }
}

/// Packs `lengths` (real tokens per sequence, zero allowed) with every sequence padded to a
/// multiple of the pad factor, and splits the padded row over `cp` ranks (zigzag).
///
/// Errors (`invalid-argument`): those of [`pad_factor`]; the padded total overflowing `u64`.
pub fn cp_layout(lengths: &[u64], o: &AlignOptions) -> Result<CpLayout, Error> {
    let factor = pad_factor(o)?;
    checked_len("lengths", lengths.len())?;
    let n = lengths.len();
    let mut cu = Vec::with_capacity(n + 1);
    let mut cup = Vec::with_capacity(n + 1);
    let (mut real, mut padded) = (0u64, 0u64);
    cu.push(0);
    cup.push(0);
    for (i, &l) in lengths.iter().enumerate() {
        let p = round_up(l, factor)
            .ok_or_else(|| Error::InvalidArgument(alloc::format!("lengths[{i}] = {l} overflows when padded")))?;
        real = checked_sum("lengths", [real, l])?;
        padded = checked_sum("padded lengths", [padded, p])?;
        cu.push(real);
        cup.push(padded);
    }
    let cp = u64::from(o.cp);
    let chunks = 2 * cp;
    let mut run_offsets = Vec::with_capacity(o.cp as usize + 1);
    let (mut starts, mut lens): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
    let mut rank_real = Vec::with_capacity(o.cp as usize);
    run_offsets.push(0u32);
    for r in 0..cp {
        let first = starts.len();
        let mut real_here = 0u64;
        for (i, &l) in lengths.iter().enumerate() {
            let (off, p) = (cup[i], cup[i + 1] - cup[i]);
            if p == 0 {
                continue;
            }
            // With cp = 1 the rank takes the whole sequence (which need not be even).
            let zigzag = [r, chunks - 1 - r];
            let (c, pieces): (u64, &[u64]) = if cp == 1 { (p, &[0]) } else { (p / chunks, &zigzag) };
            for &chunk in pieces {
                let s = chunk * c;
                real_here += l.saturating_sub(s).min(c);
                if starts.len() > first && starts[starts.len() - 1] + lens[lens.len() - 1] == off + s {
                    let last = lens.len() - 1;
                    lens[last] += c;
                } else {
                    starts.push(off + s);
                    lens.push(c);
                }
            }
        }
        rank_real.push(real_here);
        run_offsets.push(checked_len("runs", starts.len())?);
    }
    let local_bounds = cup.iter().map(|&b| b / cp).collect();
    Ok(CpLayout {
        factor,
        cp: o.cp,
        max_seqlen: lengths.iter().copied().max().unwrap_or(0),
        max_seqlen_padded: cup.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0),
        cu_seqlens: cu,
        cu_seqlens_padded: cup,
        run_offsets,
        run_starts: starts,
        run_lengths: lens,
        local_bounds,
        rank_real_tokens: rank_real,
    })
}

/// `v` rounded up to a multiple of `m` (≥ 1), or `None` on overflow.
pub fn round_up(v: u64, m: u64) -> Option<u64> {
    v.div_ceil(m).checked_mul(m)
}

/// Where padding goes in a micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Padding {
    /// Every sequence is padded to a multiple of this factor (ROLL, and the CP zigzag split).
    PerSequence(u64),
    /// The micro-batch's total is padded to a multiple of this, with one padding segment at
    /// the end (prime-rl's `pad_to_multiple_of`).
    PerMicroBatch(u64),
}

impl Padding {
    /// The multiple (factor) of this padding.
    pub fn multiple(&self) -> u64 {
        match *self {
            Padding::PerSequence(m) | Padding::PerMicroBatch(m) => m,
        }
    }
}

/// Options of [`distribute`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DistributeOptions<'a> {
    /// Token capacity of a micro-batch after padding (≥ 1).
    pub capacity: u64,
    /// Data-parallel ranks (≥ 1).
    pub dp: u32,
    /// The cost balanced across ranks (of padded lengths; the end padding segment of
    /// [`Padding::PerMicroBatch`] counts as its own sequence).
    pub cost: Cost,
    /// The padding.
    pub padding: Padding,
    /// A run (LoRA adapter) index per sample; `None`: all in run 0.
    pub runs: Option<&'a [u32]>,
    /// Let samples of different runs share a micro-batch (members then ordered by run).
    pub mix_runs: bool,
    /// An extra cost per sample on top of `cost` (e.g. a multimodal sample's image tokens);
    /// `None`: none. Balancing counts it; the capacity counts tokens only.
    pub extra_costs: Option<&'a [u64]>,
    /// Further caps per micro-batch beside the tokens (image tokens, images …), with every
    /// sample's size in each; `None`: tokens only.
    pub limits: Option<MicroLimits<'a>>,
}

impl DistributeOptions<'_> {
    /// Capacity `capacity`, `dp` ranks, token cost, no padding, one run, no extra costs.
    pub fn new(capacity: u64, dp: u32) -> Self {
        Self {
            capacity,
            dp,
            cost: Cost::TOKENS,
            padding: Padding::PerMicroBatch(1),
            runs: None,
            mix_runs: false,
            extra_costs: None,
            limits: None,
        }
    }
}

/// Micro-batches for every DP rank, the same number on each, in flat form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Distribution {
    /// Micro-batches per rank.
    pub per_rank: u32,
    /// `dp · per_rank + 1` offsets into `indices`; rank `r` has micro-batches
    /// `r·per_rank .. (r+1)·per_rank`. A dummy micro-batch has no members.
    pub offsets: Vec<u32>,
    /// Sample indices, micro-batch after micro-batch (each ascending by (run, index)).
    pub indices: Vec<u32>,
    /// Tokens of each micro-batch after padding (a dummy holds one padding multiple).
    pub tokens: Vec<u64>,
    /// Real tokens of each micro-batch.
    pub real_tokens: Vec<u64>,
    /// Cost of each micro-batch.
    pub costs: Vec<u64>,
    /// Cost of each rank.
    pub rank_costs: Vec<u64>,
    /// Micro-batches best-fit decreasing made before any split.
    pub packed: u32,
    /// Splits of the heaviest micro-batches made to reach a multiple of `dp`.
    pub splits: u32,
    /// Dummy micro-batches added (only when there are fewer samples than `dp · per_rank`).
    pub dummies: u32,
    /// `ceil(Σ padded sample tokens / capacity)` (with limits, the largest of that and every
    /// limit's `ceil(Σ sizes / cap)`): no packing under the caps has fewer.
    pub lower_bound: u32,
}

impl Distribution {
    /// Number of ranks.
    pub fn dp(&self) -> usize {
        self.tokens.len().checked_div(self.per_rank as usize).unwrap_or(0)
    }

    /// The members of micro-batch `b` (empty for a dummy).
    pub fn batch(&self, b: usize) -> &[u32] {
        &self.indices[self.offsets[b] as usize..self.offsets[b + 1] as usize]
    }
}

/// Packs samples of `lengths` real tokens into micro-batches of at most `o.capacity` padded
/// tokens and gives every one of `o.dp` ranks the same number of them.
///
/// Steps: best-fit decreasing on the padded lengths, run by run (members never mix runs
/// unless `mix_runs`) — under `limits`, the balanced fill of
/// [`micro_batches_limited`](crate::micro_batches_limited) on the padded lengths and every
/// limit, run by run, and `lower_bound` is the largest bound of any resource; while the count is not a multiple of `dp`, the costliest micro-batch
/// with at least two samples (ties: lowest index) is split in two of balanced cost; if every
/// micro-batch holds one sample, dummies fill the remaining slots; then equal-count
/// Karmarkar–Karp plus swaps over micro-batch costs, the costliest part to rank 0. Inside a
/// rank, micro-batches by cost descending (ties: smallest member), dummies last.
///
/// Errors: `invalid-argument` for empty `lengths`, a zero length (names the sample),
/// `capacity`, `dp` or the padding multiple = 0, a per-micro-batch multiple above the
/// capacity, `runs` of the wrong length, a cost or sum overflowing `u64`; `infeasible` for a
/// sample whose padded length exceeds the capacity (names it; samples are never split); with
/// `limits`, those of [`micro_batches_limited`](crate::micro_batches_limited) (a sample over a
/// cap is `infeasible`, named).
pub fn distribute(lengths: &[u64], o: &DistributeOptions<'_>) -> Result<Distribution, Error> {
    let n = checked_len("lengths", lengths.len())?;
    if n == 0 {
        return invalid!("lengths must not be empty (nothing to distribute)");
    }
    if o.dp == 0 {
        return invalid!("dp must be at least 1 (got 0)");
    }
    crate::check_count("dp", o.dp)?;
    if o.capacity == 0 {
        return invalid!("capacity must be at least 1 token (got 0)");
    }
    let m = o.padding.multiple();
    if m == 0 {
        return invalid!("the padding multiple must be at least 1 (got 0)");
    }
    if let Some(i) = lengths.iter().position(|&l| l == 0) {
        return invalid!("lengths[{i}] = 0: a sample needs at least one token");
    }
    if let Some(r) = o.runs
        && r.len() != lengths.len()
    {
        return invalid!("runs has {} entries but lengths has {n}; give one run index per sample", r.len());
    }
    let per_sequence = matches!(o.padding, Padding::PerSequence(_));
    let cap = if per_sequence { o.capacity } else { o.capacity / m * m };
    if cap == 0 {
        return invalid!("capacity = {} is smaller than the padding multiple {m}", o.capacity);
    }
    let mut sizes = Vec::with_capacity(lengths.len());
    for (i, &l) in lengths.iter().enumerate() {
        let s = if per_sequence { round_up(l, m) } else { Some(l) };
        match s {
            Some(s) if s <= cap => sizes.push(s),
            _ => {
                return Err(Error::Infeasible(alloc::format!(
                    "sample {i} has {l} tokens{}, more than the micro-batch capacity {}{}; samples are never split",
                    if per_sequence && m > 1 { alloc::format!(" (padded to a multiple of {m})") } else { "".into() },
                    o.capacity,
                    if cap != o.capacity {
                        alloc::format!(" (usable {cap} with padding to a multiple of {m})")
                    } else {
                        "".into()
                    },
                )));
            }
        }
    }
    let item_costs = costs_with_extra(&sizes, &o.cost, o.extra_costs)?;
    let rows = o.limits.as_ref().map(|l| Rows::new(&sizes, l, cap, "sample")).transpose()?;
    let total = checked_sum("padded lengths", sizes.iter().copied())?;
    let resource_bound = rows.as_ref().and_then(|r| r.resource_bounds().max()).unwrap_or(0);
    let lower_bound = checked_len("micro-batches", total.div_ceil(cap).max(resource_bound) as usize)?;
    let run_of = |i: u32| if o.mix_runs { 0 } else { o.runs.map_or(0, |r| r[i as usize]) };

    // Best-fit decreasing, one run at a time (runs in ascending order).
    let mut order: Vec<u32> = (0..n).collect();
    order.sort_by_key(|&i| (run_of(i), i));
    let mut bins: Vec<Vec<u32>> = Vec::new();
    let mut start = 0;
    while start < order.len() {
        let run = run_of(order[start]);
        let end = start + order[start..].iter().take_while(|&&i| run_of(i) == run).count();
        let members = &order[start..end];
        let p = match &rows {
            Some(rows) => rows.pack(members)?,
            None => {
                let local: Vec<u64> = members.iter().map(|&i| sizes[i as usize]).collect();
                pack(&local, &PackOptions::new(cap))?
            }
        };
        for b in 0..p.offsets.len() - 1 {
            let span = &p.indices[p.offsets[b] as usize..p.offsets[b + 1] as usize];
            bins.push(span.iter().map(|&j| members[j as usize]).collect());
        }
        start = end;
    }
    let packed = checked_len("micro-batches", bins.len())?;
    let dp = o.dp as usize;
    let slots = bins.len().div_ceil(dp) * dp;
    let pad_cost = |tokens: u64| -> Result<u64, Error> {
        if per_sequence { Ok(0) } else { costs(&[(m - tokens % m) % m], &o.cost).map(|c| c[0]) }
    };
    let bin_cost = |b: &[u32]| -> Result<u64, Error> {
        let tokens = checked_sum("tokens", b.iter().map(|&i| sizes[i as usize]))?;
        checked_sum("costs", b.iter().map(|&i| item_costs[i as usize]).chain([pad_cost(tokens)?]))
    };
    let mut splits = 0u32;
    while bins.len() < slots {
        let mut best: Option<(u64, usize)> = None;
        for (b, members) in bins.iter().enumerate() {
            if members.len() >= 2 {
                let c = bin_cost(members)?;
                if best.is_none_or(|(bc, _)| c > bc) {
                    best = Some((c, b));
                }
            }
        }
        let Some((_, b)) = best else { break };
        let members = core::mem::take(&mut bins[b]);
        let w: Vec<u64> = members.iter().map(|&i| item_costs[i as usize]).collect();
        let halves =
            partition(&w, 2, &PartitionOptions { method: PartitionMethod::Kk, equal_size: false, refine: true })?;
        let half = |g: usize| -> Vec<u32> {
            let mut h: Vec<u32> = halves.group(g).iter().map(|&j| members[j as usize]).collect();
            h.sort_unstable();
            h
        };
        bins[b] = half(0);
        let second = half(1);
        bins.push(second);
        splits += 1;
    }
    let dummies = checked_len("dummies", slots - bins.len())?;
    // Members ascending by (run, index): a micro-batch's runs form contiguous segments.
    let run_label = |i: u32| o.runs.map_or(0, |r| r[i as usize]);
    for b in &mut bins {
        b.sort_unstable_by_key(|&i| (run_label(i), i));
    }
    let dummy_cost = costs(&[m], &o.cost)?[0];
    let mut weights = Vec::with_capacity(slots);
    for b in &bins {
        weights.push(bin_cost(b)?);
    }
    weights.resize(slots, dummy_cost);
    let parts =
        partition(&weights, o.dp, &PartitionOptions { method: PartitionMethod::Kk, equal_size: true, refine: true })?;
    let mut rank_parts: Vec<(u64, Vec<u32>)> =
        (0..parts.k()).map(|g| (parts.sums[g], parts.group(g).to_vec())).collect();
    // Costliest part to rank 0 (ties: the part holding the lowest micro-batch index).
    rank_parts.sort_by_key(|(s, g)| (core::cmp::Reverse(*s), g.iter().copied().min()));
    let per_rank = checked_len("micro-batches per rank", slots / dp)?;
    let mut groups: Vec<Vec<u32>> = Vec::with_capacity(slots);
    let (mut tokens, mut real_tokens, mut mb_costs) = (Vec::new(), Vec::new(), Vec::new());
    let mut rank_costs = Vec::with_capacity(dp);
    for (sum, mut g) in rank_parts {
        let first = |x: u32| bins.get(x as usize).and_then(|b| b.first().copied()).unwrap_or(u32::MAX);
        g.sort_by_key(|&x| (x as usize >= bins.len(), core::cmp::Reverse(weights[x as usize]), first(x)));
        for x in g {
            let members = bins.get(x as usize).cloned().unwrap_or_default();
            let real = members.iter().map(|&i| lengths[i as usize]).sum::<u64>();
            let t = if members.is_empty() {
                m
            } else {
                round_up(members.iter().map(|&i| sizes[i as usize]).sum(), m).unwrap_or(u64::MAX)
            };
            tokens.push(t);
            real_tokens.push(real);
            mb_costs.push(weights[x as usize]);
            groups.push(members);
        }
        rank_costs.push(sum);
    }
    let (offsets, indices) = crate::flatten(&groups);
    Ok(Distribution {
        per_rank,
        offsets,
        indices,
        tokens,
        real_tokens,
        costs: mb_costs,
        rank_costs,
        packed,
        splits,
        dummies,
        lower_bound,
    })
}

/// prime-rl's classic packer (`packed_samples_into_micro_bs`, trainer `batch.py` before
/// #2723), exactly: lengths truncated to `seq_len`; items sorted stably by (run, length
/// descending); each goes to the first bin in creation order whose label (training mode)
/// matches and that has room (`used + len ≤ seq_len`), else to a new bin. Runs may share a
/// bin. Zero-length items go nowhere (prime-rl drops them silently; they are returned in
/// the second list so a caller can report them).
///
/// Returns the bins (members in insertion order, bins in creation order) and the dropped
/// items. Errors (`invalid-argument`): `runs`/`labels` of another length than `lengths`,
/// `seq_len` = 0.
pub fn prime_rl_ffd(
    lengths: &[u64],
    runs: &[u32],
    labels: &[u32],
    seq_len: u64,
) -> Result<(Vec<Vec<u32>>, Vec<u32>), Error> {
    let n = checked_len("lengths", lengths.len())?;
    if runs.len() != lengths.len() || labels.len() != lengths.len() {
        return invalid!("runs ({}) and labels ({}) need one entry per length ({n})", runs.len(), labels.len());
    }
    if seq_len == 0 {
        return invalid!("seq_len must be at least 1 (got 0)");
    }
    let len = |i: u32| lengths[i as usize].min(seq_len);
    let mut order: Vec<u32> = (0..n).collect();
    order.sort_by_key(|&i| (runs[i as usize], core::cmp::Reverse(len(i))));
    let mut bins: Vec<(u32, u64, Vec<u32>)> = Vec::new();
    let mut dropped = Vec::new();
    for i in order {
        let l = len(i);
        if l == 0 {
            dropped.push(i);
            continue;
        }
        let label = labels[i as usize];
        match bins.iter_mut().find(|(b, used, _)| *b == label && used + l <= seq_len) {
            Some((_, used, members)) => {
                *used += l;
                members.push(i);
            }
            None => bins.push((label, l, alloc::vec![i])),
        }
    }
    dropped.sort_unstable();
    Ok((bins.into_iter().map(|(_, _, m)| m).collect(), dropped))
}
