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
//!   [`verl::get_seqlen_balanced_partitions`](crate::peers::verl::get_seqlen_balanced_partitions);
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

use alloc::string::String;

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

mod first_fit;
mod flops;
mod kk;
mod schedule;

pub use first_fit::{expand_bins_by_splitting, first_fit_pack};
pub use flops::{Arg, Flops, FlopsArgs, LayerFreq, calculate_fwd_flops};
pub use kk::{PythonSum, get_seqlen_balanced_partitions};
pub use schedule::{Schedule, ScheduleArgs, build_dp_schedule};

#[cfg(test)]
#[path = "../../../tests/support/slime.rs"]
mod slime_support;

#[cfg(test)]
mod tests {
    use super::kk::Weight;
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;
    use proptest::prelude::*;
    use slime_support::schedule_args;

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
            let want = crate::peers::verl::get_seqlen_balanced_partitions(&lengths, k, equal);
            match (got, want) {
                (Ok(g), Ok(w)) => prop_assert_eq!(g, w),
                (Err(SlimeError::AssertionError(a)), Err(crate::peers::verl::PyError::AssertionError(b))) => prop_assert_eq!(a, b),
                (g, w) => prop_assert!(false, "slime {:?}, verl {:?}", g, w),
            }
        }

        /// The schedule's invariants (slime's module docstring): every kept sample exactly
        /// once, the same micro-batch count on every rank per step, micro-batches tiling each
        /// rank, and (first-fit) no micro-batch over the cap unless it is one oversize sample.
        #[test]
        fn dp_schedule_invariants(
            lengths in proptest::collection::vec(0i64..3000, 1..64),
            drawn in schedule_args(1..5, 1..6000, 1..8, 1..3),
        ) {
            // First-fit by tokens (the cap invariant below), samples balanced by tokens.
            let a = ScheduleArgs {
                micro_batch_size: None,
                use_dynamic_batch_size: true,
                balance_by_flops: false,
                ..drawn
            };
            let (cap, gbs) = (a.max_tokens_per_gpu.unwrap_or(i64::MAX), a.global_batch_size);
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
