//! Exact reproductions of slime's micro-batch scheduling (`THUDM/slime` at commit
//! `624b824a898ab0ec1fcb4d373004c7f3852bf515`, checked against the oracle vectors in
//! `tests/vectors/slime/`, which were made by running slime's own code):
//!
//! - [`first_fit_pack`] and [`expand_bins_by_splitting`] (`slime/utils/seqlen_balancing.py`);
//! - [`calculate_fwd_flops`] (`slime/utils/flops_utils.py`), bit for bit: the same integer
//!   products (exact, as Python ints) and the same float operations in the same order;
//! - [`get_seqlen_balanced_partitions`]: slime's copy of verl's Karmarkar–Karp, on the FLOPs
//!   weights slime gives it (floats, or integers when the model has no layers). On integer
//!   lengths slime's copy is verl's function (the source differs only in a docstring, type
//!   annotations and the name of an unused loop variable), so integer callers use
//!   [`verl::get_seqlen_balanced_partitions`](crate::verl::get_seqlen_balanced_partitions);
//! - [`build_dp_schedule`] (`slime/utils/dp_schedule.py`): rollouts grouped by id in
//!   first-occurrence order, steps of `global_batch_size` rollouts, first-fit (or FLOPs KK, or
//!   fixed-size chunks) packing per step, alignment by splitting, and the micro-batches
//!   dealt to ranks round-robin or by KK on summed FLOPs.
//!
//! The FLOPs weights are `f64`, so this module — unlike the rest of the kernel — adds floats
//! and compares them: that is what slime decides with. IEEE-754 addition and subtraction are
//! exact-rounded and deterministic in WebAssembly and natively, so the result is still the
//! same everywhere. One float sum depends on the Python that runs slime: the per-micro-batch
//! FLOPs are added with the builtin `sum`, which is a plain left fold up to CPython 3.11 and
//! Neumaier-compensated from 3.12 on ([`PythonSum`]).
//!
//! Failures are values: [`SlimeError::AssertionError`] with slime's message where slime
//! asserts, [`SlimeError::InvalidArgument`] where slime would fail with an incidental Python
//! error (`ZeroDivisionError`, `ValueError`, `TypeError`, `IndexError`) or accept input
//! outside its domain (negative lengths), and [`SlimeError::MissingAttribute`] where slime
//! would read a model attribute that the caller does not have.

use alloc::collections::{BTreeMap, BinaryHeap};
use alloc::string::String;
use alloc::vec::Vec;
use core::cmp::{Ordering, Reverse};

/// A failure of a slime function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlimeError {
    /// `AssertionError` with slime's message (possibly empty, for a bare `assert`).
    AssertionError(String),
    /// An argument outside the range slime handles; the message names it and the range.
    InvalidArgument(String),
    /// slime would read this attribute of `args` here and the caller has none: the caller
    /// raises what reading it raises (Python: `AttributeError`).
    MissingAttribute(String),
}

impl core::fmt::Display for SlimeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            SlimeError::AssertionError(m) => write!(f, "AssertionError: {m}"),
            SlimeError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            SlimeError::MissingAttribute(m) => write!(f, "missing attribute: {m}"),
        }
    }
}

macro_rules! bad {
    ($($arg:tt)*) => {
        SlimeError::InvalidArgument(alloc::format!($($arg)*))
    };
}

// ---------------------------------------------------------------------------------------
// first_fit_pack
// ---------------------------------------------------------------------------------------

/// slime's `first_fit_pack(total_lengths, max_tokens_per_bin)`: each length, in input order
/// (no sorting), goes to the first bin whose sum plus the length is ≤ the cap, else opens a
/// new bin. A bin already over the cap stays a candidate (a zero length fits wherever the
/// sum is ≤ the cap). Bins in creation order, members in insertion order. Sums are exact
/// (`i128`), so any `i64` input behaves as Python ints do. O(n log n).
pub fn first_fit_pack(lengths: &[i64], max_tokens_per_bin: i64) -> Vec<Vec<u32>> {
    first_fit(lengths, i128::from(max_tokens_per_bin))
}

fn first_fit(lengths: &[i64], cap: i128) -> Vec<Vec<u32>> {
    let n = lengths.len();
    // A min-tree over the bin sums (unused leaves at +∞): the first bin with
    // sum ≤ cap − length is the leftmost leaf at most that value.
    let size = n.max(1).next_power_of_two();
    let mut tree: Vec<i128> = alloc::vec![i128::MAX; 2 * size];
    let mut bins: Vec<Vec<u32>> = Vec::new();
    for (idx, &len) in lengths.iter().enumerate() {
        let limit = cap - i128::from(len);
        let j = if tree[1] <= limit {
            let mut node = 1;
            while node < size {
                node = if tree[2 * node] <= limit { 2 * node } else { 2 * node + 1 };
            }
            node - size
        } else {
            bins.push(Vec::new());
            tree[size + bins.len() - 1] = 0;
            bins.len() - 1
        };
        bins[j].push(idx as u32);
        let mut node = size + j;
        tree[node] += i128::from(len);
        while node > 1 {
            node /= 2;
            tree[node] = tree[2 * node].min(tree[2 * node + 1]);
        }
    }
    bins
}

// ---------------------------------------------------------------------------------------
// expand_bins_by_splitting
// ---------------------------------------------------------------------------------------

/// slime's `_split_bin_by_tokens`: members by length descending (stable: equal lengths keep
/// their order in the bin), each to the left half while its sum is ≤ the right's.
fn split_bin(bin: &[u32], lengths: &[i64]) -> (Vec<u32>, Vec<u32>) {
    let mut order = bin.to_vec();
    order.sort_by_key(|&i| Reverse(lengths[i as usize]));
    let (mut left, mut right) = (Vec::new(), Vec::new());
    let (mut s0, mut s1) = (0i128, 0i128);
    for i in order {
        if s0 <= s1 {
            left.push(i);
            s0 += i128::from(lengths[i as usize]);
        } else {
            right.push(i);
            s1 += i128::from(lengths[i as usize]);
        }
    }
    (left, right)
}

fn bin_sum(bin: &[u32], lengths: &[i64]) -> i128 {
    bin.iter().map(|&i| i128::from(lengths[i as usize])).sum()
}

/// slime's `expand_bins_by_splitting(bins, target_count, lengths)` (in place in slime; here
/// the bins after the call): while there are fewer than `target_count` bins, the bin with
/// the largest (token sum, position) among those with at least two members is split in
/// two ([`split_bin`]); the left half stays at its position, the right half is appended.
/// Stops early when only bins of one (or no) member are left.
///
/// Errors (`invalid-argument`): a member of a bin that would be split is not an index of
/// `lengths` (slime: `IndexError`).
pub fn expand_bins_by_splitting(
    bins: Vec<Vec<u32>>,
    target_count: i64,
    lengths: &[i64],
) -> Result<Vec<Vec<u32>>, SlimeError> {
    expand(bins, i128::from(target_count), lengths)
}

fn expand(mut bins: Vec<Vec<u32>>, target_count: i128, lengths: &[i64]) -> Result<Vec<Vec<u32>>, SlimeError> {
    if (bins.len() as i128) >= target_count {
        return Ok(bins);
    }
    for b in bins.iter().filter(|b| b.len() > 1) {
        if let Some(&i) = b.iter().find(|&&i| i as usize >= lengths.len()) {
            return Err(bad!("bins: member {i} is not an index of lengths ({} entries)", lengths.len()));
        }
    }
    let mut heap: BinaryHeap<(i128, usize)> =
        bins.iter().enumerate().filter(|(_, b)| b.len() > 1).map(|(i, b)| (bin_sum(b, lengths), i)).collect();
    while (bins.len() as i128) < target_count {
        let Some((_, idx)) = heap.pop() else { break };
        let (left, right) = split_bin(&bins[idx], lengths);
        if left.len() > 1 {
            heap.push((bin_sum(&left, lengths), idx));
        }
        if right.len() > 1 {
            heap.push((bin_sum(&right, lengths), bins.len()));
        }
        bins[idx] = left;
        bins.push(right);
    }
    Ok(bins)
}

// ---------------------------------------------------------------------------------------
// calculate_fwd_flops
// ---------------------------------------------------------------------------------------

/// One attribute of slime's `args` as the caller has it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Arg {
    /// `args` has no such attribute.
    #[default]
    Missing,
    /// The attribute is `None`.
    None,
    /// The attribute is this integer.
    Int(i64),
}

/// `args.moe_layer_freq` as the caller has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum LayerFreq {
    /// No such attribute: every layer is MoE.
    #[default]
    Missing,
    /// An integer `f`: layer `i` is MoE when `i % f == 0`.
    Every(i64),
    /// A list: entry 0 is a dense layer, an entry > 0 a MoE layer (a negative one neither).
    Pattern(Vec<i64>),
}

/// The attributes of slime's `args` that `calculate_fwd_flops` reads (Megatron's names).
/// Each is read only where slime reads it, so an attribute slime would not touch may be
/// [`Arg::Missing`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlopsArgs {
    /// `hidden_size`.
    pub hidden_size: Arg,
    /// `num_attention_heads`.
    pub num_attention_heads: Arg,
    /// `num_query_groups` (the K/V heads).
    pub num_query_groups: Arg,
    /// `vocab_size` (the LM head).
    pub vocab_size: Arg,
    /// `ffn_hidden_size` (dense layers).
    pub ffn_hidden_size: Arg,
    /// `None` for a dense model; any integer (even 0) means MoE.
    pub num_experts: Arg,
    /// May be negative (then no layers, as `range` of a negative count is empty).
    pub num_layers: Arg,
    /// `kv_channels` (the head dimension without MLA).
    pub kv_channels: Arg,
    /// `moe_ffn_hidden_size` (one expert).
    pub moe_ffn_hidden_size: Arg,
    /// `moe_router_topk` (experts per token).
    pub moe_router_topk: Arg,
    /// Missing and `None` both count as 0 (slime reads it with `getattr(…, None)`).
    pub moe_shared_expert_intermediate_size: Arg,
    /// `moe_layer_freq`: which layers are MoE.
    pub moe_layer_freq: LayerFreq,
    /// `bool(getattr(args, "multi_latent_attention", False))`.
    pub multi_latent_attention: bool,
    /// `q_lora_rank` (MLA; `None`: no q LoRA).
    pub q_lora_rank: Arg,
    /// `kv_lora_rank` (MLA; `None`: no kv LoRA, the K/V projection uses `kv_channels`).
    pub kv_lora_rank: Arg,
    /// `qk_head_dim` (MLA).
    pub qk_head_dim: Arg,
    /// `qk_pos_emb_head_dim` (MLA).
    pub qk_pos_emb_head_dim: Arg,
    /// `v_head_dim` (MLA).
    pub v_head_dim: Arg,
}

/// A result of [`calculate_fwd_flops`]: a Python `float`, or an `int` when no layer term was
/// added (no seqlens, or no layers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Flops {
    /// A float (the attention term divides by 2).
    Float(f64),
    /// An exact integer.
    Int(u128),
}

/// A required non-negative integer attribute.
fn int_of(name: &str, a: Arg) -> Result<u128, SlimeError> {
    match a {
        Arg::Missing => Err(SlimeError::MissingAttribute(name.into())),
        Arg::None => Err(bad!("args.{name} is None; calculate_fwd_flops needs an integer ≥ 0")),
        Arg::Int(v) if v < 0 => Err(bad!("args.{name} = {v} is negative; it must be ≥ 0")),
        Arg::Int(v) => Ok(v as u128),
    }
}

/// `None` for a `None` attribute, else as [`int_of`].
fn opt_of(name: &str, a: Arg) -> Result<Option<u128>, SlimeError> {
    match a {
        Arg::None => Ok(None),
        _ => int_of(name, a).map(Some),
    }
}

/// The exact product (Python ints), or `invalid-argument` beyond 2^128.
fn prod(factors: &[u128]) -> Result<u128, SlimeError> {
    let mut p: u128 = 1;
    for &f in factors {
        p = p.checked_mul(f).ok_or_else(|| bad!("a FLOPs term exceeds 2^128; the model arguments are too large"))?;
    }
    Ok(p)
}

fn add(a: u128, b: u128) -> Result<u128, SlimeError> {
    a.checked_add(b).ok_or_else(|| bad!("a FLOPs term exceeds 2^128; the model arguments are too large"))
}

/// slime's `calculate_layer_flops` for one sequence length and FFN width.
fn layer_flops(a: &FlopsArgs, s: u128, h: u128, heads: u128, groups: u128, ffn: u128) -> Result<f64, SlimeError> {
    let mla = a.multi_latent_attention;
    // calculate_qkv_projection_flops
    let q = match if mla { opt_of("q_lora_rank", a.q_lora_rank)? } else { None } {
        Some(q_lora) => {
            let hs = int_of("hidden_size", a.hidden_size)?;
            let nh = int_of("num_attention_heads", a.num_attention_heads)?;
            let qk = int_of("qk_head_dim", a.qk_head_dim)?;
            let pos = int_of("qk_pos_emb_head_dim", a.qk_pos_emb_head_dim)?;
            prod(&[2, s, q_lora, add(hs, prod(&[nh, add(qk, pos)?])?)?])?
        }
        None => {
            let q_head_dim = if mla {
                add(int_of("qk_head_dim", a.qk_head_dim)?, int_of("qk_pos_emb_head_dim", a.qk_pos_emb_head_dim)?)?
            } else {
                int_of("kv_channels", a.kv_channels)?
            };
            prod(&[2, s, h, heads, q_head_dim])?
        }
    };
    let kv = match if mla { opt_of("kv_lora_rank", a.kv_lora_rank)? } else { None } {
        Some(kv_lora) => {
            let hs = int_of("hidden_size", a.hidden_size)?;
            let nh = int_of("num_attention_heads", a.num_attention_heads)?;
            let qk = int_of("qk_head_dim", a.qk_head_dim)?;
            let v = int_of("v_head_dim", a.v_head_dim)?;
            let hs2 = int_of("hidden_size", a.hidden_size)?;
            let pos = int_of("qk_pos_emb_head_dim", a.qk_pos_emb_head_dim)?;
            let inner = add(prod(&[kv_lora, add(hs, prod(&[nh, add(qk, v)?])?)?])?, prod(&[hs2, pos])?)?;
            prod(&[2, s, inner])?
        }
        None => prod(&[2, 2, s, h, groups, int_of("kv_channels", a.kv_channels)?])?,
    };
    let qkv = add(q, kv)?;
    // calculate_attention_flops: an int product divided by 2 (true division: the rounded
    // product halved, which is the correctly rounded quotient), then an int product added.
    let (qk_dim, av_dim) = if mla {
        let qk = add(int_of("qk_head_dim", a.qk_head_dim)?, int_of("qk_pos_emb_head_dim", a.qk_pos_emb_head_dim)?)?;
        (qk, int_of("v_head_dim", a.v_head_dim)?)
    } else {
        let kv = int_of("kv_channels", a.kv_channels)?;
        (kv, kv)
    };
    let mut att = prod(&[2, heads, s, s, qk_dim])? as f64 / 2.0;
    att += prod(&[heads, s, s, av_dim])? as f64;
    let out = prod(&[2, s, h, h])?;
    let mlp = prod(&[2, s, h, ffn, 3])?;
    Ok(((qkv as f64 + att) + out as f64) + mlp as f64)
}

/// slime's `calculate_fwd_flops(seqlens, args)`: for each length in order, the dense layers'
/// FLOPs times their count, the MoE layers' times theirs, then the LM head, added to a total
/// that starts at the integer 0.
///
/// Errors: [`SlimeError::MissingAttribute`] for the first attribute slime would read and
/// `args` lacks; `invalid-argument` for a `None` or negative dimension (slime: `TypeError`
/// or a negative count), `moe_layer_freq` = 0 with layers (slime: `ZeroDivisionError`), or
/// products beyond 2^128.
pub fn calculate_fwd_flops(seqlens: &[u64], a: &FlopsArgs) -> Result<Flops, SlimeError> {
    let h = int_of("hidden_size", a.hidden_size)?;
    let heads = int_of("num_attention_heads", a.num_attention_heads)?;
    let groups = int_of("num_query_groups", a.num_query_groups)?;
    let vocab = int_of("vocab_size", a.vocab_size)?;
    let dense_ffn = int_of("ffn_hidden_size", a.ffn_hidden_size)?;
    let layers = |a: &FlopsArgs| match a.num_layers {
        Arg::Int(v) => Ok(v),
        Arg::Missing => Err(SlimeError::MissingAttribute("num_layers".into())),
        Arg::None => Err(bad!("args.num_layers is None; calculate_fwd_flops needs an integer")),
    };
    let (num_dense, num_moe, moe_ffn) = match a.num_experts {
        Arg::Missing => return Err(SlimeError::MissingAttribute("num_experts".into())),
        Arg::None => (layers(a)?, 0i64, 0u128),
        Arg::Int(_) => {
            let shared = match a.moe_shared_expert_intermediate_size {
                Arg::Missing | Arg::None => 0,
                x => int_of("moe_shared_expert_intermediate_size", x)?,
            };
            let moe_ffn = add(
                prod(&[
                    int_of("moe_ffn_hidden_size", a.moe_ffn_hidden_size)?,
                    int_of("moe_router_topk", a.moe_router_topk)?,
                ])?,
                shared,
            )?;
            let (d, m) = match &a.moe_layer_freq {
                LayerFreq::Pattern(p) => {
                    (p.iter().filter(|&&f| f == 0).count() as i64, p.iter().filter(|&&f| f > 0).count() as i64)
                }
                LayerFreq::Every(f) => {
                    let n = layers(a)?.max(0);
                    if n > 0 && *f == 0 {
                        return Err(bad!(
                            "args.moe_layer_freq = 0 with layers; it must not be 0 (slime divides by it)"
                        ));
                    }
                    // i % f == 0 exactly when |f| divides i, whatever the signs.
                    let m = if n == 0 { 0 } else { (n - 1) / f.unsigned_abs().min(i64::MAX as u64) as i64 + 1 };
                    (n - m, m)
                }
                LayerFreq::Missing => (0, layers(a)?),
            };
            (d, m, moe_ffn)
        }
    };
    let mut total = Flops::Int(0);
    let plus = |t: Flops, x: f64| match t {
        Flops::Int(i) => Flops::Float(i as f64 + x),
        Flops::Float(f) => Flops::Float(f + x),
    };
    for &seqlen in seqlens {
        let s = u128::from(seqlen);
        if num_dense > 0 {
            total = plus(total, layer_flops(a, s, h, heads, groups, dense_ffn)? * num_dense as f64);
        }
        if num_moe > 0 {
            total = plus(total, layer_flops(a, s, h, heads, groups, moe_ffn)? * num_moe as f64);
        }
        let lm = prod(&[2, s, h, vocab])?;
        total = match total {
            Flops::Int(i) => Flops::Int(add(i, lm)?),
            Flops::Float(f) => Flops::Float(f + lm as f64),
        };
    }
    Ok(total)
}

// ---------------------------------------------------------------------------------------
// Karmarkar–Karp on FLOPs weights
// ---------------------------------------------------------------------------------------

/// How the Python running slime adds floats with the builtin `sum` (slime sums each
/// micro-batch's FLOPs with it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PythonSum {
    /// CPython ≤ 3.11: a left fold.
    Naive,
    /// CPython ≥ 3.12: Neumaier's compensated sum (the compensation is added at the end).
    #[default]
    Neumaier,
}

/// A weight of slime's KK: `f64` (FLOPs) or `u128` (integer FLOPs of a model without
/// layers). Weights are ≥ 0 and not NaN.
pub(crate) trait Weight: Copy + core::fmt::Debug {
    const ZERO: Self;
    fn plus(self, o: Self) -> Self;
    fn minus(self, o: Self) -> Self;
    fn order(&self, o: &Self) -> Ordering;
    /// Python's builtin `sum` over `items`, starting at the integer 0.
    fn py_sum(items: impl Iterator<Item = Self>, mode: PythonSum) -> Self;
}

impl Weight for f64 {
    const ZERO: Self = 0.0;
    fn plus(self, o: Self) -> Self {
        self + o
    }
    fn minus(self, o: Self) -> Self {
        self - o
    }
    fn order(&self, o: &Self) -> Ordering {
        // No NaN reaches here; ±0 compare equal as in Python.
        self.partial_cmp(o).unwrap_or(Ordering::Equal)
    }
    fn py_sum(mut items: impl Iterator<Item = Self>, mode: PythonSum) -> Self {
        // The first float meets the integer start: 0 + x = x exactly.
        let Some(first) = items.next() else { return 0.0 };
        let mut f = first;
        match mode {
            PythonSum::Naive => items.fold(f, |acc, x| acc + x),
            PythonSum::Neumaier => {
                let mut c = 0.0f64;
                for x in items {
                    let t = f + x;
                    if libm_fabs(f) >= libm_fabs(x) {
                        c += (f - t) + x;
                    } else {
                        c += (x - t) + f;
                    }
                    f = t;
                }
                if c != 0.0 && c.is_finite() {
                    f += c;
                }
                f
            }
        }
    }
}

/// `fabs` without `std`.
fn libm_fabs(x: f64) -> f64 {
    f64::from_bits(x.to_bits() & !(1u64 << 63))
}

impl Weight for u128 {
    const ZERO: Self = 0;
    fn plus(self, o: Self) -> Self {
        self.saturating_add(o)
    }
    fn minus(self, o: Self) -> Self {
        self.saturating_sub(o)
    }
    fn order(&self, o: &Self) -> Ordering {
        self.cmp(o)
    }
    fn py_sum(items: impl Iterator<Item = Self>, _: PythonSum) -> Self {
        items.fold(0, |a, b| a.saturating_add(b))
    }
}

/// A set of the KK: its sum (a left fold of its members' weights in member order, as
/// `Set.add`/`Set.merge` accumulate) and its members.
#[derive(Clone, Debug)]
struct KSet<W> {
    sum: W,
    items: Vec<u32>,
}

/// `Set.__lt__` as an order: (sum, member count, members). Members of different sets are
/// distinct, so comparing the (index, weight) tuples is comparing the indices.
fn cmp_set<W: Weight>(a: &KSet<W>, b: &KSet<W>) -> Ordering {
    a.sum.order(&b.sum).then(a.items.len().cmp(&b.items.len())).then_with(|| a.items.cmp(&b.items))
}

/// A KK state: its non-empty sets in descending order. With weights ≥ 0 every non-empty set
/// compares above an empty one, so the `k − len` empty sets are the last ones.
#[derive(Debug)]
struct KState<W> {
    sets: Vec<KSet<W>>,
    spread: W,
}

impl<W: Weight> KState<W> {
    fn new(mut sets: Vec<KSet<W>>, k: usize) -> Self {
        sets.sort_unstable_by(|a, b| cmp_set(b, a));
        // `sets[0].sum - sets[-1].sum`; an empty last set has the integer sum 0.
        let last = if sets.len() == k { sets[k - 1].sum } else { W::ZERO };
        let spread = sets[0].sum.minus(last);
        Self { sets, spread }
    }

    /// `State.merge`: set i takes the members of `other`'s set k−1−i (added one by one).
    fn merge(mut self, mut other: KState<W>, k: usize, w: &[W]) -> Self {
        let (p, q) = (self.sets.len(), other.sets.len());
        let mut out = Vec::with_capacity((p + q).min(k));
        for i in (0..p).chain(p.max(k - q)..k) {
            let mut set = if i < p {
                core::mem::replace(&mut self.sets[i], KSet { sum: W::ZERO, items: Vec::new() })
            } else {
                KSet { sum: W::ZERO, items: Vec::new() }
            };
            if k - 1 - i < q {
                let theirs = core::mem::take(&mut other.sets[k - 1 - i].items);
                for idx in theirs {
                    set.sum = set.sum.plus(w[idx as usize]);
                    set.items.push(idx);
                }
            }
            out.push(set);
        }
        KState::new(out, k)
    }
}

/// `State.__lt__` for `heapq`: the larger spread first, then the larger largest set.
fn state_lt<W: Weight>(a: &KState<W>, b: &KState<W>) -> bool {
    match a.spread.order(&b.spread) {
        Ordering::Equal => cmp_set(&b.sets[0], &a.sets[0]) == Ordering::Less,
        o => o == Ordering::Greater,
    }
}

/// Python's `heapq` (the same sift steps), over state indices.
struct Heap(Vec<usize>);

impl Heap {
    fn sift_down<W: Weight>(&mut self, st: &[Option<KState<W>>], start: usize, mut pos: usize) {
        let new = self.0[pos];
        while pos > start {
            let parent_pos = (pos - 1) >> 1;
            let parent = self.0[parent_pos];
            if lt(st, new, parent) {
                self.0[pos] = parent;
                pos = parent_pos;
                continue;
            }
            break;
        }
        self.0[pos] = new;
    }

    fn sift_up<W: Weight>(&mut self, st: &[Option<KState<W>>], mut pos: usize) {
        let end = self.0.len();
        let start = pos;
        let new = self.0[pos];
        let mut child = 2 * pos + 1;
        while child < end {
            let right = child + 1;
            if right < end && !lt(st, self.0[child], self.0[right]) {
                child = right;
            }
            self.0[pos] = self.0[child];
            pos = child;
            child = 2 * pos + 1;
        }
        self.0[pos] = new;
        self.sift_down(st, start, pos);
    }

    fn push<W: Weight>(&mut self, st: &[Option<KState<W>>], item: usize) {
        self.0.push(item);
        let last = self.0.len() - 1;
        self.sift_down(st, 0, last);
    }

    fn pop<W: Weight>(&mut self, st: &[Option<KState<W>>]) -> Option<usize> {
        let last = self.0.pop()?;
        if self.0.is_empty() {
            return Some(last);
        }
        let ret = core::mem::replace(&mut self.0[0], last);
        self.sift_up(st, 0);
        Some(ret)
    }
}

fn lt<W: Weight>(st: &[Option<KState<W>>], a: usize, b: usize) -> bool {
    match (&st[a], &st[b]) {
        (Some(x), Some(y)) => state_lt(x, y),
        _ => false,
    }
}

/// slime's (verl's) `karmarkar_karp` on weights ≥ 0; `k` ≥ 1, n ≥ 1.
fn karmarkar_karp<W: Weight>(w: &[W], k: usize, equal_size: bool) -> Result<Vec<Vec<u32>>, SlimeError> {
    let n = w.len();
    let mut sorted: Vec<u32> = (0..n as u32).collect();
    sorted.sort_by(|&a, &b| w[a as usize].order(&w[b as usize]).then(a.cmp(&b)));
    let single = |i: u32| KSet { sum: W::ZERO.plus(w[i as usize]), items: alloc::vec![i] };
    let mut states: Vec<Option<KState<W>>> = Vec::new();
    let mut heap = Heap(Vec::new());
    if equal_size {
        if !n.is_multiple_of(k) {
            return Err(SlimeError::AssertionError(alloc::format!("{n} % {k} != 0")));
        }
        for run in sorted.chunks(k) {
            states.push(Some(KState::new(run.iter().map(|&i| single(i)).collect(), k)));
            heap.push(&states, states.len() - 1);
        }
    } else {
        for &i in &sorted {
            states.push(Some(KState::new(alloc::vec![single(i)], k)));
            heap.push(&states, states.len() - 1);
        }
    }
    while heap.0.len() > 1 {
        let (Some(a), Some(b)) = (heap.pop(&states), heap.pop(&states)) else { break };
        let (Some(sa), Some(sb)) = (states[a].take(), states[b].take()) else { break };
        states[a] = Some(sa.merge(sb, k, w));
        heap.push(&states, a);
    }
    let Some(fin) = heap.0.first().and_then(|&i| states[i].as_ref()) else {
        return Err(bad!("seqlen_list is empty"));
    };
    let parts: Vec<Vec<u32>> = (0..k).map(|i| fin.sets.get(i).map_or_else(Vec::new, |s| s.items.clone())).collect();
    if equal_size {
        for p in &parts {
            if p.len() * k != n {
                return Err(SlimeError::AssertionError(alloc::format!("{} * {k} != {n}", p.len())));
            }
        }
    }
    Ok(parts)
}

/// slime's `get_seqlen_balanced_partitions` (verl's KK, then every partition non-empty and
/// sorted ascending; partition order kept) on weights of type `W`.
pub(crate) fn balanced_partitions<W: Weight>(w: &[W], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, SlimeError> {
    let n = w.len();
    if n < k as usize {
        return Err(SlimeError::AssertionError(alloc::format!("number of items:[{n}] < k_partitions:[{k}]")));
    }
    if k == 0 {
        return Err(bad!("k_partitions must be ≥ 1 (got 0)"));
    }
    let mut parts = karmarkar_karp(w, k as usize, equal_size)?;
    for (i, p) in parts.iter_mut().enumerate() {
        if p.is_empty() {
            return Err(SlimeError::AssertionError(alloc::format!("the {i}-th partition is empty")));
        }
        p.sort_unstable();
    }
    Ok(parts)
}

/// slime's `get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size)` on float
/// weights (the FLOPs `build_dp_schedule` balances): KK with float set sums, each a left
/// fold of its members' weights in member order, exactly as Python adds them.
///
/// Errors: `AssertionError` with slime's message for n < k and for `equal_size` with
/// n % k ≠ 0; `invalid-argument` for k = 0 or a weight that is negative, NaN or infinite
/// (outside what slime is given; integer lengths of any sign go to
/// [`verl::get_seqlen_balanced_partitions`](crate::verl::get_seqlen_balanced_partitions)).
pub fn get_seqlen_balanced_partitions(weights: &[f64], k: u32, equal_size: bool) -> Result<Vec<Vec<u32>>, SlimeError> {
    if let Some(i) = weights.iter().position(|w| !w.is_finite() || *w < 0.0) {
        return Err(bad!("seqlen_list[{i}] = {} must be a finite number ≥ 0", weights[i]));
    }
    balanced_partitions(weights, k, equal_size)
}

// ---------------------------------------------------------------------------------------
// build_dp_schedule
// ---------------------------------------------------------------------------------------

/// The arguments of slime's `build_dp_schedule` besides the lengths, rollout ids and the
/// model attributes: `args.*`, `train_parallel_config[*]` and `global_batch_size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleArgs {
    /// `getattr(args, "micro_batch_size", None)` (static batching only).
    pub micro_batch_size: Option<i64>,
    /// `args.use_dynamic_batch_size`.
    pub use_dynamic_batch_size: bool,
    /// `args.max_tokens_per_gpu` (dynamic batching only).
    pub max_tokens_per_gpu: Option<i64>,
    /// `args.balance_data`: deal micro-batches to ranks by KK on their FLOPs.
    pub balance_data: bool,
    /// `args.balance_by_flops`: with dynamic batching, pack by KK on FLOPs instead of
    /// first-fit (the token cap then only sets the micro-batch count).
    pub balance_by_flops: bool,
    /// `dp_size` (≥ 1).
    pub dp_size: i64,
    /// `cp_size` (dynamic batching: the cap is `max_tokens_per_gpu · cp_size`).
    pub cp_size: i64,
    /// `vpp_size` (only `> 1` matters).
    pub vpp_size: i64,
    /// `microbatch_group_size_per_vp_stage` (≥ 1 when `vpp_size > 1`).
    pub microbatch_group_size_per_vp_stage: i64,
    /// `global_batch_size`: rollouts per training step.
    pub global_batch_size: i64,
    /// How the running Python's builtin `sum` adds floats.
    pub python_sum: PythonSum,
}

/// slime's 4-tuple, in flat form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// `partitions`: the global sample indices of each rank, step after step.
    pub partitions: Vec<Vec<u32>>,
    /// The size of each micro-batch of each rank, in order: `micro_batch_indices[r]` is
    /// consecutive ranges of these sizes over `0..len(partitions[r])`.
    pub micro_batch_sizes: Vec<Vec<u32>>,
    /// `num_microbatches`: micro-batches per rank, one value per step.
    pub num_microbatches: Vec<u32>,
    /// The number of steps (`global_batch_sizes` is `global_batch_size` repeated this often).
    pub num_steps: u32,
}

/// Per-sample FLOPs of one step, computed when first needed.
enum Workloads {
    Float(Vec<f64>),
    Int(Vec<u128>),
}

fn workloads(step_lengths: &[i64], model: &FlopsArgs) -> Result<Workloads, SlimeError> {
    let mut fl = Vec::with_capacity(step_lengths.len());
    let mut int = Vec::new();
    for &l in step_lengths {
        match calculate_fwd_flops(&[l as u64], model)? {
            Flops::Float(f) => fl.push(f),
            Flops::Int(i) => int.push(i),
        }
    }
    Ok(if int.is_empty() { Workloads::Float(fl) } else { Workloads::Int(int) })
}

fn python_floor_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b != 0 && ((a < 0) != (b < 0)) { q - 1 } else { q }
}

/// slime's `build_dp_schedule(args, train_parallel_config, total_lengths, global_batch_size=…,
/// rollout_indices=…)`. Samples are grouped by rollout id (first-occurrence order); step `s`
/// takes rollouts `s·gbs .. (s+1)·gbs` (trailing rollouts that do not fill a step are
/// dropped) and their samples in rollout order. Each step is packed — first-fit under
/// `max_tokens_per_gpu · cp_size` (dynamic), KK on FLOPs into ⌈tokens / cap⌉ micro-batches
/// (dynamic with `balance_by_flops`; one sample each when that is not fewer than the
/// samples), or chunks of `micro_batch_size` (static) — then grown by
/// [`expand_bins_by_splitting`] to a multiple of `dp_size · (mb_group if vpp_size > 1 else
/// 1)`, and its micro-batches dealt to the ranks: KK (equal size) on their summed FLOPs with
/// `balance_data`, else micro-batch `j` to rank `j mod dp_size`.
///
/// `total_lengths[i]` is the length of sample `i` (entries beyond `rollout_indices` are
/// ignored); `rollout_indices[i]` its rollout id.
///
/// Errors: `AssertionError` with slime's message where slime asserts (no cap with dynamic
/// batching, fewer rollouts than a step, a step with fewer samples than ranks, no
/// `micro_batch_size` with static batching, a static count not aligned, a dynamic count that
/// cannot be split far enough); `invalid-argument` for a negative length, too few lengths,
/// `global_batch_size` = 0, `dp_size` < 1, `mb_group` < 1 with `vpp_size` > 1,
/// `micro_batch_size` = 0, and a cap (`max_tokens_per_gpu · cp_size`) of 0 with
/// `balance_by_flops`; [`SlimeError::MissingAttribute`] (or a FLOPs error, see [`calculate_fwd_flops`]) when
/// FLOPs are needed and `model` lacks what they need.
pub fn build_dp_schedule(
    a: &ScheduleArgs,
    model: &FlopsArgs,
    total_lengths: &[i64],
    rollout_indices: &[i64],
) -> Result<Schedule, SlimeError> {
    if let Some(i) = total_lengths.iter().position(|&l| l < 0) {
        return Err(bad!("total_lengths[{i}] = {} is negative; lengths must be ≥ 0", total_lengths[i]));
    }
    let dp = a.dp_size;
    let mut max_per_bin: i128 = 0;
    if a.use_dynamic_batch_size {
        let Some(mt) = a.max_tokens_per_gpu else { return Err(SlimeError::AssertionError(String::new())) };
        // Any cap, as slime: first-fit under a cap ≤ 0 gives each sample that is not empty
        // a micro-batch of its own. Only `balance_by_flops` divides by it.
        max_per_bin = i128::from(mt) * i128::from(a.cp_size);
    }
    let group = if a.vpp_size > 1 { a.microbatch_group_size_per_vp_stage } else { 1 };

    // Group samples by rollout id, in first-occurrence order.
    let mut slot: BTreeMap<i64, usize> = BTreeMap::new();
    let mut rollouts: Vec<Vec<u32>> = Vec::new();
    for (pos, &rid) in rollout_indices.iter().enumerate() {
        let g = *slot.entry(rid).or_insert_with(|| {
            rollouts.push(Vec::new());
            rollouts.len() - 1
        });
        rollouts[g].push(pos as u32);
    }
    if a.global_batch_size == 0 {
        return Err(bad!("global_batch_size must be ≥ 1 (got 0)"));
    }
    let gbs = i128::from(a.global_batch_size);
    let num_steps = python_floor_div(rollouts.len() as i128, gbs);
    if num_steps < 1 {
        return Err(SlimeError::AssertionError(alloc::format!(
            "num_rollouts ({}) < global_batch_size ({gbs}); need at least one rollout per step.",
            rollouts.len()
        )));
    }
    let (num_steps, gbs) = (num_steps as usize, gbs as usize);
    let ranks = dp.max(0) as usize;
    // A step asserts dp_size ≤ its samples before any rank is used.
    let mut partitions: Vec<Vec<u32>> = alloc::vec![Vec::new(); ranks.min(rollout_indices.len())];
    let mut sizes: Vec<Vec<u32>> = alloc::vec![Vec::new(); partitions.len()];
    let mut num_microbatches = Vec::with_capacity(num_steps);

    for step in 0..num_steps {
        let sample_indices: Vec<u32> =
            rollouts[step * gbs..(step + 1) * gbs].iter().flat_map(|r| r.iter().copied()).collect();
        let mut step_lengths = Vec::with_capacity(sample_indices.len());
        for &i in &sample_indices {
            match total_lengths.get(i as usize) {
                Some(&l) => step_lengths.push(l),
                None => {
                    return Err(bad!(
                        "total_lengths has {} entries, but rollout_indices has {}; there must be a length per sample",
                        total_lengths.len(),
                        rollout_indices.len()
                    ));
                }
            }
        }
        let n = sample_indices.len();
        if (n as i128) < i128::from(dp) {
            return Err(SlimeError::AssertionError(alloc::format!(
                "step {step}: {n} samples < dp_size {dp}; each step needs at least one sample per rank."
            )));
        }
        let mut cache: Option<Workloads> = None;
        // 1. Pack.
        let mut mbs: Vec<Vec<u32>> = if a.use_dynamic_batch_size {
            if a.balance_by_flops {
                let total: i128 = step_lengths.iter().map(|&l| i128::from(l)).sum();
                if max_per_bin == 0 {
                    return Err(bad!(
                        "max_tokens_per_gpu · cp_size must not be 0 with balance_by_flops (slime divides by it)"
                    ));
                }
                let num_mbs = python_floor_div(total + max_per_bin - 1, max_per_bin).max(1);
                if num_mbs >= n as i128 {
                    (0..n as u32).map(|i| alloc::vec![i]).collect()
                } else {
                    let w = cache.insert(workloads(&step_lengths, model)?);
                    match w {
                        Workloads::Float(w) => balanced_partitions(w, num_mbs as u32, false)?,
                        Workloads::Int(w) => balanced_partitions(w, num_mbs as u32, false)?,
                    }
                }
            } else {
                first_fit(&step_lengths, max_per_bin)
            }
        } else {
            match a.micro_batch_size {
                None => return Err(SlimeError::AssertionError(String::new())),
                Some(0) => return Err(bad!("micro_batch_size must not be 0 with static batching")),
                Some(m) if m < 0 => Vec::new(),
                Some(m) => {
                    let m = (m as u64).min(n as u64).max(1) as usize;
                    (0..n).step_by(m).map(|s| (s as u32..(s + m).min(n) as u32).collect()).collect()
                }
            }
        };
        // 2. Align.
        if dp < 1 {
            return Err(bad!("dp_size must be ≥ 1 (got {dp})"));
        }
        if group < 1 {
            return Err(bad!("microbatch_group_size_per_vp_stage must be ≥ 1 when vpp_size > 1 (got {group})"));
        }
        let align = i128::from(dp) * i128::from(group);
        let len = mbs.len() as i128;
        let target = (((len + align - 1) / align) * align).max(align);
        if target != len {
            if a.use_dynamic_batch_size {
                mbs = expand(mbs, target, &step_lengths)?;
                if mbs.len() as i128 != target {
                    return Err(SlimeError::AssertionError(alloc::format!(
                        "dynamic path: could only produce {} mbs after maximal splitting; need {target}. step {step} has {n} samples, below the alignment threshold ({align}).",
                        mbs.len()
                    )));
                }
            } else {
                let m = a.micro_batch_size.unwrap_or(0);
                return Err(SlimeError::AssertionError(alloc::format!(
                    "static path: num_mbs ({len}) is not a multiple of dp_size * mb_group ({align}); got step_size={n}, micro_batch_size={m}, dp_size={dp}, mb_group={group}. Splitting static mbs would break the fixed-size invariant; adjust the config so step_size % (dp_size * micro_batch_size * mb_group) == 0."
                )));
            }
        }
        let kk = mbs.len();
        let dpu = dp as usize;
        num_microbatches.push((kk / dpu) as u32);
        // 3. Distribute.
        let rank_mbs: Vec<Vec<u32>> = if a.balance_data {
            if cache.is_none() {
                cache = Some(workloads(&step_lengths, model)?);
            }
            match cache.as_ref() {
                Some(Workloads::Float(w)) => {
                    let weights: Vec<f64> =
                        mbs.iter().map(|b| f64::py_sum(b.iter().map(|&i| w[i as usize]), a.python_sum)).collect();
                    balanced_partitions(&weights, dp as u32, true)?
                }
                Some(Workloads::Int(w)) => {
                    let weights: Vec<u128> =
                        mbs.iter().map(|b| u128::py_sum(b.iter().map(|&i| w[i as usize]), a.python_sum)).collect();
                    balanced_partitions(&weights, dp as u32, true)?
                }
                None => Vec::new(),
            }
        } else {
            (0..dpu).map(|r| (r..kk).step_by(dpu).map(|j| j as u32).collect()).collect()
        };
        // 4. Per-rank partitions and micro-batch sizes.
        for (r, list) in rank_mbs.iter().enumerate() {
            for &j in list {
                let b = &mbs[j as usize];
                partitions[r].extend(b.iter().map(|&i| sample_indices[i as usize]));
                sizes[r].push(b.len() as u32);
            }
        }
    }
    Ok(Schedule { partitions, micro_batch_sizes: sizes, num_microbatches, num_steps: num_steps as u32 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use proptest::prelude::*;

    /// slime's first-fit as written: a linear scan of the bins for every length.
    fn first_fit_reference(lengths: &[i64], cap: i64) -> Vec<Vec<u32>> {
        let (mut bins, mut sums): (Vec<Vec<u32>>, Vec<i128>) = (Vec::new(), Vec::new());
        for (i, &l) in lengths.iter().enumerate() {
            match sums.iter().position(|&s| s + i128::from(l) <= i128::from(cap)) {
                Some(j) => {
                    bins[j].push(i as u32);
                    sums[j] += i128::from(l);
                }
                None => {
                    bins.push(vec![i as u32]);
                    sums.push(i128::from(l));
                }
            }
        }
        bins
    }

    fn small_model() -> FlopsArgs {
        FlopsArgs {
            hidden_size: Arg::Int(16),
            num_attention_heads: Arg::Int(2),
            num_query_groups: Arg::Int(2),
            vocab_size: Arg::Int(32),
            ffn_hidden_size: Arg::Int(64),
            num_experts: Arg::None,
            num_layers: Arg::Int(2),
            kv_channels: Arg::Int(8),
            ..FlopsArgs::default()
        }
    }

    proptest! {
        /// Every index exactly once; a bin over the cap holds a single item that is itself
        /// over the cap; the same bins as the linear scan slime runs.
        #[test]
        fn first_fit_places_every_index_once_within_the_cap(
            lengths in proptest::collection::vec(0i64..200, 0..120),
            cap in 1i64..250,
        ) {
            let bins = first_fit_pack(&lengths, cap);
            let mut seen: Vec<u32> = bins.iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..lengths.len() as u32).collect::<Vec<_>>());
            for b in &bins {
                let sum: i64 = b.iter().map(|&i| lengths[i as usize]).sum();
                prop_assert!(sum <= cap || (b.len() == 1 && lengths[b[0] as usize] > cap), "bin {:?} sums {}", b, sum);
            }
            prop_assert_eq!(bins, first_fit_reference(&lengths, cap));
        }

        /// Splitting keeps every member exactly once and reaches the target unless only
        /// single-member bins are left.
        #[test]
        fn expand_keeps_members_and_reaches_the_target(
            lengths in proptest::collection::vec(0i64..100, 1..60),
            cap in 1i64..300,
            extra in 0i64..40,
        ) {
            let bins = first_fit_pack(&lengths, cap);
            let target = bins.len() as i64 + extra;
            let Ok(out) = expand_bins_by_splitting(bins, target, &lengths) else {
                return Err(TestCaseError::fail("expand failed on valid bins"));
            };
            let mut seen: Vec<u32> = out.iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..lengths.len() as u32).collect::<Vec<_>>());
            prop_assert!(out.len() as i64 == target || out.iter().all(|b| b.len() <= 1));
        }

        /// On small integers (exact in f64) the float KK is verl's integer KK.
        #[test]
        fn float_kk_on_integers_is_verls(
            lengths in proptest::collection::vec(0i64..10_000, 1..80),
            k in 1u32..9,
            equal in any::<bool>(),
        ) {
            let w: Vec<f64> = lengths.iter().map(|&l| l as f64).collect();
            let got = get_seqlen_balanced_partitions(&w, k, equal);
            let want = crate::verl::get_seqlen_balanced_partitions(&lengths, k, equal);
            match (got, want) {
                (Ok(g), Ok(w)) => prop_assert_eq!(g, w),
                (Err(SlimeError::AssertionError(a)), Err(crate::verl::PyError::AssertionError(b))) => prop_assert_eq!(a, b),
                (g, w) => prop_assert!(false, "slime {:?}, verl {:?}", g, w),
            }
        }

        /// The schedule's invariants (slime's module docstring): every kept sample exactly
        /// once, the same micro-batch count on every rank per step, micro-batches tiling each
        /// rank, and (first-fit) no micro-batch over the cap unless it is one oversize sample.
        #[test]
        fn dp_schedule_invariants(
            lengths in proptest::collection::vec(0i64..3000, 1..64),
            dp in 1i64..5,
            cap in 1i64..6000,
            gbs in 1i64..8,
            balance_data in any::<bool>(),
            vpp in 1i64..3,
        ) {
            let a = ScheduleArgs {
                micro_batch_size: None,
                use_dynamic_batch_size: true,
                max_tokens_per_gpu: Some(cap),
                balance_data,
                balance_by_flops: false,
                dp_size: dp,
                cp_size: 1,
                vpp_size: vpp,
                microbatch_group_size_per_vp_stage: 2,
                global_batch_size: gbs,
                python_sum: PythonSum::Naive,
            };
            let rids: Vec<i64> = (0..lengths.len() as i64).collect();
            let s = match build_dp_schedule(&a, &small_model(), &lengths, &rids) {
                Ok(s) => s,
                Err(SlimeError::AssertionError(_)) => return Ok(()),
                Err(e) => return Err(TestCaseError::fail(alloc::format!("{e}"))),
            };
            let kept = (lengths.len() as i64 / gbs * gbs) as u32;
            let mut seen: Vec<u32> = s.partitions.iter().flatten().copied().collect();
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..kept).collect::<Vec<_>>());
            let per_rank: u32 = s.num_microbatches.iter().sum();
            for (r, sizes) in s.micro_batch_sizes.iter().enumerate() {
                prop_assert_eq!(sizes.len() as u32, per_rank);
                prop_assert_eq!(sizes.iter().sum::<u32>() as usize, s.partitions[r].len());
                let mut start = 0usize;
                for &n in sizes {
                    let mb = &s.partitions[r][start..start + n as usize];
                    let tokens: i64 = mb.iter().map(|&i| lengths[i as usize]).sum();
                    prop_assert!(tokens <= cap || mb.len() == 1);
                    start += n as usize;
                }
            }
        }
    }

    #[test]
    fn neumaier_recovers_what_the_fold_loses() {
        let big = 2f64.powi(60);
        let xs = [big, 100.0, 100.0, 100.0];
        assert_eq!(f64::py_sum(xs.iter().copied(), PythonSum::Naive), big);
        assert_eq!(f64::py_sum(xs.iter().copied(), PythonSum::Neumaier), big + 256.0);
    }
}
