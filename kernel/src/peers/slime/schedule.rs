//! slime's `build_dp_schedule` (`slime/utils/dp_schedule.py`).

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;

use super::SlimeError;
use super::first_fit::{expand, first_fit};
use super::flops::{Flops, FlopsArgs, calculate_fwd_flops};
use super::kk::{PythonSum, Weight, balanced_partitions};

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
/// [`expand_bins_by_splitting`](super::expand_bins_by_splitting) to a multiple of
/// `dp_size · (mb_group if vpp_size > 1 else 1)`, and its micro-batches dealt to the ranks:
/// KK (equal size) on their summed FLOPs with `balance_data`, else micro-batch `j` to rank
/// `j mod dp_size`.
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
