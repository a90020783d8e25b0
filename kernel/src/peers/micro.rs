//! Exact reproductions of the peers' balancing entry points, for compatibility layers:
//! verl 0.9.1 `rearrange_micro_batches` and the trainer's `_balance_batch`, ROLL's
//! `LoadBalancePacker` (`load_balance`) and `batch_balance` (facts in
//! `shared/reference/PEERS.md`, checked against the shared verl and ROLL vectors).
//!
//! Inputs are the peers' integers (`i64`); tensor arithmetic (workloads, per-group sums)
//! wraps like torch `int64`, list arithmetic (partition sums) is exact like Python ints.
//! Failures are the peers' Python exceptions ([`PyError`]) with their messages. Negative
//! lengths are outside every peer's domain (they are attention-mask sums) and give
//! `ValueError`; this is the one place where the reproduction refuses instead of imitating.

use alloc::vec::Vec;

use crate::order::{Order, apply_order};
use crate::peers::verl::{PyError, get_seqlen_balanced_partitions};

/// `24576·s + s²` in torch `int64` arithmetic (wrapping), verl's and ROLL's workload.
pub fn workload(s: i64) -> i64 {
    24_576i64.wrapping_mul(s).wrapping_add(s.wrapping_mul(s))
}

/// Python's `a // b` (floor division); `None` for `b == 0`.
fn floor_div(a: i128, b: i128) -> Option<i128> {
    if b == 0 {
        return None;
    }
    let q = a / b;
    Some(if a % b != 0 && ((a < 0) != (b < 0)) { q - 1 } else { q })
}

fn zero_division() -> PyError {
    PyError::ZeroDivisionError("integer division or modulo by zero".into())
}

/// verl's `ceildiv(a, b) = -(a // -b)`.
fn ceildiv(a: i128, b: i128) -> Result<i128, PyError> {
    floor_div(a, -b).map(|q| -q).ok_or_else(zero_division)
}

/// verl's `roundup_divisible(a, b) = ((a + b - 1) // b) * b`.
fn roundup_divisible(a: i128, b: i128) -> Result<i128, PyError> {
    floor_div(a + b - 1, b).map(|q| q * b).ok_or_else(zero_division)
}

fn check_non_negative(name: &str, seqlens: &[i64]) -> Result<(), PyError> {
    match seqlens.iter().position(|&s| s < 0) {
        Some(i) => Err(PyError::ValueError(alloc::format!("{name}[{i}] = {} is negative", seqlens[i]))),
        None => Ok(()),
    }
}

fn as_k(k: i128) -> Result<u32, PyError> {
    u32::try_from(k).map_err(|_| PyError::ValueError(alloc::format!("micro-batch count {k} is out of range")))
}

/// Arguments of verl's `rearrange_micro_batches` besides the lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerlMicroOptions {
    /// `max_token_len`.
    pub max_token_len: i64,
    /// `min_num_micro_batch` (`None` in verl by default).
    pub min_num_micro_batch: Option<i64>,
    /// `num_batches_divided_by` (virtual pipeline size, `None` by default).
    pub num_batches_divided_by: Option<i64>,
    /// `use_dynamic_bsz_balance` (default `true`): reorder the micro-batches.
    pub use_dynamic_bsz_balance: bool,
    /// `force_group_size` (default 1): consecutive samples kept in one micro-batch.
    pub force_group_size: i64,
    /// The width of the padded attention mask (verl's `max_seq_len` for non-nested input);
    /// `None` for nested input, where it is the longest sample.
    pub padded_width: Option<i64>,
    /// The count after verl's MAX all-reduce over the DP group (`None`: no DP group). The
    /// group-size constraints and the cap check are not all-reduced here (this rank only).
    pub dp_num_micro_batches: Option<i64>,
}

impl VerlMicroOptions {
    /// verl's defaults with `max_token_len`.
    pub fn new(max_token_len: i64) -> Self {
        Self {
            max_token_len,
            min_num_micro_batch: None,
            num_batches_divided_by: None,
            use_dynamic_bsz_balance: true,
            force_group_size: 1,
            padded_width: None,
            dp_num_micro_batches: None,
        }
    }
}

/// verl 0.9.1 `rearrange_micro_batches`: the micro-batches' index lists in verl's order.
pub fn verl_rearrange_micro_batches(seqlens: &[i64], o: &VerlMicroOptions) -> Result<Vec<Vec<u32>>, PyError> {
    check_non_negative("seqlens", seqlens)?;
    let empty = || PyError::ValueError("max() arg is an empty sequence".into());
    let max_seq_len = match o.padded_width {
        Some(w) => w,
        None => *seqlens.iter().max().ok_or_else(empty)?,
    };
    if o.max_token_len < max_seq_len {
        return Err(PyError::AssertionError(alloc::format!(
            "max_token_len must be greater than the sequence length. Got max_token_len={} and max_seq_len={max_seq_len}",
            o.max_token_len
        )));
    }
    let g = o.force_group_size;
    let n = seqlens.len() as i64;
    if g == 0 {
        return Err(PyError::ZeroDivisionError("integer modulo by zero".into()));
    }
    if g < 0 {
        return Err(PyError::ValueError(alloc::format!("force_group_size = {g} is negative")));
    }
    if n % g != 0 {
        return Err(PyError::AssertionError(alloc::format!(
            "Batch size {n} must be divisible by force_group_size {g}"
        )));
    }
    let total: i64 = seqlens.iter().fold(0i64, |a, &s| a.wrapping_add(s));
    let num_groups = n / g;
    let mut num = i128::from(num_groups).min(ceildiv(i128::from(total), i128::from(o.max_token_len))?);
    if let Some(m) = o.min_num_micro_batch {
        num = num.max(i128::from(m));
    }
    if let Some(c) = o.dp_num_micro_batches {
        num = num.max(i128::from(c));
    }
    if let Some(d) = o.num_batches_divided_by {
        num = roundup_divisible(num, i128::from(d))?;
    }
    let gu = g as usize;
    let workloads: Vec<i64> =
        seqlens.chunks(gu).map(|c| c.iter().fold(0i64, |a, &s| a.wrapping_add(workload(s)))).collect();
    let group_tokens: Vec<i64> = seqlens.chunks(gu).map(|c| c.iter().fold(0i64, |a, &s| a.wrapping_add(s))).collect();
    let max_group = *group_tokens.iter().max().ok_or_else(empty)?;
    if max_group > o.max_token_len {
        return Err(PyError::ValueError(alloc::format!(
            "A forced group exceeds max_token_len and cannot be split. Got max_group_token_len={max_group} and \
             max_token_len={}.",
            o.max_token_len
        )));
    }
    let step = match o.num_batches_divided_by {
        Some(d) if d != 0 => i128::from(d),
        _ => 1,
    };
    let parts = loop {
        if num > i128::from(num_groups) {
            return Err(PyError::ValueError(alloc::format!(
                "Cannot satisfy max_token_len while keeping forced groups atomic and using the same micro-batch \
                 count across DP ranks. Requested {num} non-empty micro-batches, but a rank has only {num_groups} \
                 forced groups."
            )));
        }
        let parts = get_seqlen_balanced_partitions(&workloads, as_k(num)?, false)?;
        let within = parts.iter().all(|p| {
            p.iter().map(|&i| i128::from(group_tokens[i as usize])).sum::<i128>() <= i128::from(o.max_token_len)
        });
        if within {
            break parts;
        }
        num += step;
    };
    let mut batches: Vec<(i128, Vec<u32>)> = parts
        .into_iter()
        .map(|p| {
            let sum = p.iter().map(|&j| i128::from(workloads[j as usize])).sum::<i128>();
            let samples = p.iter().flat_map(|&j| (j * g as u32)..(j * g as u32 + g as u32)).collect();
            (sum, samples)
        })
        .collect();
    if o.use_dynamic_bsz_balance {
        // Python's stable sort with reverse=True on (workload sum, first index): the keys are
        // unique (first indices differ), so a plain descending sort is the same.
        batches = apply_order(batches, Order::Verl, |b| b.0, |b| b.1.first().copied());
    }
    Ok(batches.into_iter().map(|b| b.1).collect())
}

/// The result of [`balance_batch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DpReorder {
    /// Per rank, the sample indices in the peer's final order; `global_idx` is their
    /// concatenation.
    pub partitions: Vec<Vec<u32>>,
    /// The raw equal-size KK result of each call (one call, or one per mini-batch), rank
    /// order, members ascending, indices local to the call's mini-batch.
    pub kk_partitions: Vec<Vec<Vec<u32>>>,
    /// Samples missing from the result (the peers drop the tail of a batch that is not a
    /// multiple of the mini-batch size), ascending.
    pub dropped: Vec<u32>,
}

/// verl 0.9.1's trainer `_balance_batch` reordering, which is also ROLL's `batch_balance`:
/// equal-size KK of the workloads over `dp` ranks (per mini-batch of `minibatch_size`
/// samples with `keep_minibatch`), then each rank's list sorted by (workload, index) and
/// interleaved `p[::2] + p[1::2][::-1]`.
pub fn balance_batch(seqlens: &[i64], dp: u32, minibatch_size: Option<i64>) -> Result<DpReorder, PyError> {
    check_non_negative("seqlens", seqlens)?;
    // The result holds `dp` lists: refuse a `dp` verl would run out of memory on before
    // allocating them (the fuzzer found dp = 403177717 on no samples asking for 9.7 GB).
    crate::peers::verl::check_k(dp)?;
    let w: Vec<i64> = seqlens.iter().map(|&s| workload(s)).collect();
    let mut ranks: Vec<Vec<u32>> = alloc::vec![Vec::new(); dp as usize];
    let mut kk_partitions = Vec::new();
    match minibatch_size {
        None => {
            let parts = get_seqlen_balanced_partitions(&w, dp, true)?;
            ranks.clone_from(&parts);
            kk_partitions.push(parts);
        }
        Some(mb) => {
            if mb < 0 {
                return Err(PyError::ValueError(alloc::format!("minibatch_size = {mb} is negative")));
            }
            let count = floor_div(w.len() as i128, i128::from(mb)).ok_or_else(zero_division)?;
            for i in 0..count.max(0) as usize {
                let base = i * mb as usize;
                let parts = get_seqlen_balanced_partitions(&w[base..base + mb as usize], dp, true)?;
                for (j, p) in parts.iter().enumerate() {
                    ranks[j].extend(p.iter().map(|&x| x + base as u32));
                }
                kk_partitions.push(parts);
            }
        }
    }
    let mut seen = alloc::vec![false; seqlens.len()];
    for r in &mut ranks {
        // Sort by (workload, index), then `p[::2] + p[1::2][::-1]`.
        *r = apply_order(core::mem::take(r), Order::Roll, |&x| w[x as usize], |&x| x);
        for &x in r.iter() {
            seen[x as usize] = true;
        }
    }
    let dropped = (0..seqlens.len() as u32).filter(|&i| !seen[i as usize]).collect();
    Ok(DpReorder { partitions: ranks, kk_partitions, dropped })
}

/// ROLL's sequence-packing pad factor: `lcm(16, 2·cp·tp)` when `cp > 1`, else `lcm(16, tp)`.
pub fn roll_pad_factor(cp: i64, tp: i64) -> i64 {
    let lcm = |a: i64, b: i64| {
        let (mut x, mut y) = (a.abs(), b.abs());
        while y != 0 {
            (x, y) = (y, x % y);
        }
        if x == 0 { 0 } else { (a / x * b).abs() }
    };
    if cp > 1 { lcm(16, 2 * cp * tp) } else { lcm(16, tp) }
}

/// Arguments of ROLL's `load_balance` micro-batching besides the lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RollLoadBalanceOptions {
    /// The padded width of the mini-batch's attention mask (ROLL checks the cap against it).
    pub mask_width: i64,
    /// `max_packed_sequence_length` (the cap, which ROLL does not enforce per micro-batch).
    pub max_packed_sequence_length: i64,
    /// `min_num_micro_batches` (default 1).
    pub min_num_micro_batches: i64,
    /// Tensor-parallel size (default 1).
    pub tp: i64,
    /// Context-parallel size (default 1).
    pub cp: i64,
    /// Virtual-pipeline size (default 1): the count is rounded up to a multiple of it.
    pub vp: i64,
    /// The count after ROLL's MAX all-reduce over the DP group (`None`: single process).
    pub dp_num_micro_batches: Option<i64>,
}

impl RollLoadBalanceOptions {
    /// ROLL's defaults with the mask width and the cap.
    pub fn new(mask_width: i64, max_packed_sequence_length: i64) -> Self {
        Self {
            mask_width,
            max_packed_sequence_length,
            min_num_micro_batches: 1,
            tp: 1,
            cp: 1,
            vp: 1,
            dp_num_micro_batches: None,
        }
    }
}

/// The result of [`roll_load_balance`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RollMicroBatches {
    /// The micro-batches in ROLL's yield order.
    pub micro_batches: Vec<Vec<u32>>,
    /// The raw KK partitions before the reorder (members ascending).
    pub kk_partitions: Vec<Vec<u32>>,
    /// The pad factor applied to every length.
    pub pad_factor: i64,
    /// Every length rounded up to the pad factor (ROLL counts and weighs these).
    pub padded_lengths: Vec<i64>,
}

/// ROLL's `LoadBalancePacker` micro-batching: lengths padded to the pad factor, count
/// `min(max(1, ceil(Σ padded / cap)), n)` raised to `min_num_micro_batches`, to the DP
/// maximum, then rounded up to `vp`; unequal KK on the padded workloads; verl's order.
pub fn roll_load_balance(lengths: &[i64], o: &RollLoadBalanceOptions) -> Result<RollMicroBatches, PyError> {
    check_non_negative("lengths", lengths)?;
    if o.max_packed_sequence_length < o.mask_width {
        return Err(PyError::AssertionError(alloc::format!(
            "max_packed_sequence_length ({}) must be >= max sequence length in batch ({})",
            o.max_packed_sequence_length,
            o.mask_width
        )));
    }
    let f = roll_pad_factor(o.cp, o.tp);
    let mut padded = Vec::with_capacity(lengths.len());
    for &l in lengths {
        let q = ceildiv(i128::from(l), i128::from(f))?;
        padded
            .push(i64::try_from(q * i128::from(f)).map_err(|_| PyError::ValueError("padded length overflows".into()))?);
    }
    let total: i128 = padded.iter().map(|&p| i128::from(p)).sum();
    let n = lengths.len() as i128;
    let mut k = ceildiv(total, i128::from(o.max_packed_sequence_length))?.max(1).min(n);
    k = k.max(i128::from(o.min_num_micro_batches));
    if let Some(c) = o.dp_num_micro_batches {
        k = k.max(i128::from(c));
    }
    k = roundup_divisible(k, i128::from(o.vp))?;
    let w: Vec<i64> = padded.iter().map(|&p| workload(p)).collect();
    let kk_partitions = get_seqlen_balanced_partitions(&w, as_k(k)?, false)?;
    let batches: Vec<(i128, Vec<u32>)> =
        kk_partitions.iter().map(|p| (p.iter().map(|&i| i128::from(w[i as usize])).sum(), p.clone())).collect();
    let micro_batches =
        apply_order(batches, Order::Verl, |b| b.0, |b| b.1.first().copied()).into_iter().map(|b| b.1).collect();
    Ok(RollMicroBatches { micro_batches, kk_partitions, pad_factor: f, padded_lengths: padded })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dp_verl_could_not_hold_is_a_memory_error_before_any_allocation() {
        // Found by the `kernel` fuzz target: no samples, dp = 403177717 asked for 9.7 GB.
        match balance_batch(&[], 403_177_717, None) {
            Err(PyError::MemoryError(m)) => assert!(m.contains("k_partitions = 403177717"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert!(balance_batch(&[5, 3, 7, 1], 2, None).is_ok());
    }
}
