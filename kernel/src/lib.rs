//! # stowplan-kernel
//!
//! The pure algorithms of stowplan: partitioning weights into balanced groups, packing
//! lengths into bins of fixed capacity, and balancing batches over data-parallel ranks and
//! micro-batches under a token cap, alignment and context-parallel layouts for the trainer,
//! the distribution of micro-batches to ranks, and static pack plans of whole datasets (plus exact reproductions of the peers'
//! versions). The same code runs natively (as an `rlib`, used by the
//! host's `native` backend and by tests) and inside the WebAssembly component built from
//! `kernel/wasm` (the host's default backend).
//!
//! Invariants (see `ARCHITECTURE.md`):
//! - **pure**: no I/O, no clocks, no randomness; `no_std` + `alloc`;
//! - **integer decisions**: every comparison that decides a placement uses integers;
//! - **documented tie-breaking**: the same input gives byte-identical output everywhere;
//! - **errors are values** ([`Error`]), never panics on any input.
//!
//! The behaviour of every function is specified item by item in `wit/kernel.wit`; the Rust
//! docs here repeat what a native caller needs.
#![no_std]
#![deny(missing_docs)]

extern crate alloc;

use alloc::string::String;

pub mod balance;
mod bits;
pub mod layout;
pub mod multi;
pub mod names;
pub mod pack;
pub mod partition;
pub mod peers;
pub mod plan;
pub mod prime_rl;
mod refine;
mod rooms;
pub mod shuffle;
pub mod slime;
pub mod stream;
pub mod trl;
pub mod verl;
#[doc(hidden)]
pub mod wit;

pub use balance::{
    Balance, Cost, DpOptions, Figures, LimitedMicroBatches, MicroBatches, MicroLimits, MicroOptions, Order,
    TwoLevelBalance, balance_dp, check_limits, micro_batches, micro_batches_limited, micro_batches_with_extra, plan,
    plan_limited,
};
pub use layout::{
    AlignOptions, CpLayout, DistributeOptions, Distribution, Factor, MAX_PARALLEL, Padding, cp_layout, distribute,
    pad_factor, prime_rl_ffd,
};
pub use multi::{
    MAX_BALANCED_CAPACITY, MAX_BALANCED_ITEMS, MAX_FIT_STEPS, MAX_MULTI_ITEMS, MAX_RESOURCES, MultiMethod,
    MultiOptions, MultiPacking, SEGMENTS, pack_multi,
};
pub use names::{COST_PRESETS, Named};
/// Former names of the balancing and partitioning results (ARCHITECTURE.md, "Names across
/// Rust, Python and JavaScript"), kept for a while.
pub mod renamed {
    /// Renamed [`MicroBatches`](crate::MicroBatches).
    #[deprecated(note = "renamed `MicroBatches`")]
    pub type MicroPlan = crate::MicroBatches;
    /// Renamed [`LimitedMicroBatches`](crate::LimitedMicroBatches).
    #[deprecated(note = "renamed `LimitedMicroBatches`")]
    pub type LimitedMicroPlan = crate::LimitedMicroBatches;
    /// Renamed [`Balance`](crate::Balance).
    #[deprecated(note = "renamed `Balance`")]
    pub type DpPlan = crate::Balance;
    /// Renamed [`TwoLevelBalance`](crate::TwoLevelBalance).
    #[deprecated(note = "renamed `TwoLevelBalance`")]
    pub type Plan = crate::TwoLevelBalance;
    /// Renamed [`Partition`](crate::Partition).
    #[deprecated(note = "renamed `Partition`")]
    pub type Partitioning = crate::Partition;
}
#[allow(deprecated)]
pub use renamed::{DpPlan, LimitedMicroPlan, MicroPlan, Partitioning, Plan};

#[cfg(test)]
#[allow(deprecated)]
mod renamed_tests {
    /// Code written against the former names still compiles and gets the same values.
    #[test]
    fn former_names_are_the_new_types() {
        let lengths = [3, 5, 2, 7];
        let micro: crate::MicroPlan = crate::micro_batches(&lengths, &crate::MicroOptions::new(8)).unwrap();
        let dp: crate::DpPlan = crate::balance_dp(&lengths, 2, &crate::DpOptions::default()).unwrap();
        let both: crate::Plan =
            crate::plan(&lengths, 2, &crate::DpOptions::default(), &crate::MicroOptions::new(8)).unwrap();
        let parts: crate::Partitioning = crate::partition(&lengths, 2, &crate::PartitionOptions::default()).unwrap();
        assert_eq!(both.dp, dp);
        assert_eq!(micro.indices.len(), 4);
        assert_eq!(parts.total, 17);
    }
}

pub use pack::{NextFitRuns, OversizePolicy, PackMethod, PackOptions, Packing, next_fit_runs, pack};
pub use partition::{Partition, PartitionMethod, PartitionOptions, partition};
pub use plan::{
    AlignedPlan, LimitedRawPlan, PlanLimits, PlanOptions, RawPlan, aligned_plan, raw_plan, raw_plan_limited,
};
pub use stream::{
    ClosedBins, LimitedClosedBins, LimitedStreamPacker, StreamLimits, StreamOptions, StreamPacker, StreamStatus,
};

/// An error returned by a kernel operation. Mirrors the WIT `error` variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// An argument is out of its documented range; the message names the argument and the
    /// allowed range.
    InvalidArgument(String),
    /// The arguments are valid but no result satisfies them (e.g. an item longer than the
    /// bin capacity under the `error` oversize policy); the message says which item and why.
    Infeasible(String),
}

impl core::fmt::Display for Error {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Error::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            Error::Infeasible(m) => write!(f, "infeasible: {m}"),
        }
    }
}

/// Shorthand for `Err(Error::InvalidArgument(format!(...)))`.
macro_rules! invalid {
    ($($arg:tt)*) => {
        Err($crate::Error::InvalidArgument(alloc::format!($($arg)*)))
    };
}
pub(crate) use invalid;

/// The largest count that sizes a result (`dp`, `world_size`, a micro-batch `count`,
/// `min_count`, `divisible_by`): 2^20. Allocations must follow the input, not a count alone
/// (the fuzzer found `dp` = 235,802,205 on one length asking for gigabytes).
pub const MAX_COUNT: u32 = 1 << 20;

/// `invalid-argument` unless `value` ≤ [`MAX_COUNT`], naming `name`.
pub(crate) fn check_count(name: &str, value: u32) -> Result<(), Error> {
    if value > MAX_COUNT {
        return invalid!("{name} must be at most {MAX_COUNT} (got {value})");
    }
    Ok(())
}

/// Converts a list length to `u32`, the index type of every result.
pub(crate) fn checked_len(name: &str, len: usize) -> Result<u32, Error> {
    u32::try_from(len).map_err(|_| {
        Error::InvalidArgument(alloc::format!("{name} has {len} entries; at most {} are supported", u32::MAX))
    })
}

/// Sum of `values` in `u64`, or an `invalid-argument` error naming `name` on overflow.
pub(crate) fn checked_sum(name: &str, values: impl IntoIterator<Item = u64>) -> Result<u64, Error> {
    let mut total: u64 = 0;
    for v in values {
        total = match total.checked_add(v) {
            Some(t) => t,
            None => return invalid!("the sum of {name} overflows u64 (at most {} allowed)", u64::MAX),
        };
    }
    Ok(total)
}

/// Flat `offsets` (one more than there are groups, starting at 0) and `indices` from
/// per-group index lists: the form every result crosses the WIT boundary in.
pub fn flatten(groups: &[alloc::vec::Vec<u32>]) -> (alloc::vec::Vec<u32>, alloc::vec::Vec<u32>) {
    let mut offsets = alloc::vec::Vec::with_capacity(groups.len() + 1);
    let total: usize = groups.iter().map(|g| g.len()).sum();
    let mut indices = alloc::vec::Vec::with_capacity(total);
    offsets.push(0u32);
    for g in groups {
        indices.extend_from_slice(g);
        // `total` fits in u32: every index list length was checked by `checked_len`.
        offsets.push(indices.len() as u32);
    }
    (offsets, indices)
}

/// Per-group index lists from flat `offsets` and `indices` (the inverse of [`flatten`]).
/// Offsets outside `indices` or decreasing give empty groups rather than a panic.
pub fn unflatten(offsets: &[u32], indices: &[u32]) -> alloc::vec::Vec<alloc::vec::Vec<u32>> {
    offsets.windows(2).map(|w| indices.get(w[0] as usize..w[1] as usize).unwrap_or(&[]).to_vec()).collect()
}

/// Items sorted by (weight descending, index ascending).
pub(crate) fn sorted_desc(weights: &[u64]) -> alloc::vec::Vec<u32> {
    match sorted_desc_keys(weights) {
        Some(keys) => keys.iter().map(|&k| k as u32).collect(),
        None => sorted_desc_indirect(weights),
    }
}

/// Items sorted by (weight descending, index ascending) as packed keys
/// `(max − weight) << 32 | index` (read back with [`key_weight`] and `key as u32`), when every
/// weight is below 2^32: `None` otherwise. The radix passes move the keys themselves, so no
/// pass reads the weights through the permutation (at millions of items those scattered
/// reads were most of the time), and a caller reads weights and indices in sorted order from
/// one array.
pub(crate) fn sorted_desc_keys(weights: &[u64]) -> Option<alloc::vec::Vec<u64>> {
    let max = weights.iter().copied().max().unwrap_or(0);
    if max >> 32 != 0 || weights.len() > u32::MAX as usize {
        return None;
    }
    // Stable LSD radix sort on the high half (`max − w`), 8 bits a pass, only as many passes
    // as `max` has bits; the keys start in index order, so equal weights stay in it.
    let mut keys: alloc::vec::Vec<u64> =
        weights.iter().enumerate().map(|(i, &w)| ((max - w) << 32) | i as u64).collect();
    let mut tmp: alloc::vec::Vec<u64> = alloc::vec![0; keys.len()];
    let bits = 64 - max.leading_zeros();
    let mut shift = 32;
    while shift < 32 + bits {
        let digit = |k: u64| ((k >> shift) & 0xff) as usize;
        let mut counts = [0usize; 257];
        for &k in &keys {
            counts[digit(k) + 1] += 1;
        }
        if counts.iter().any(|&c| c == keys.len()) {
            // Every key has the same digit here: this pass would not move anything.
            shift += 8;
            continue;
        }
        for d in 0..256 {
            counts[d + 1] += counts[d];
        }
        for &k in &keys {
            let d = digit(k);
            tmp[counts[d]] = k;
            counts[d] += 1;
        }
        core::mem::swap(&mut keys, &mut tmp);
        shift += 8;
    }
    Some(keys)
}

/// Sorts `keys` ascending by their bits from `lo` up (a stable LSD radix sort, up to 11 bits a
/// pass, only over the bits that differ between keys): keys equal above `lo` keep their order,
/// so callers that pushed the keys in the order of their low bits get them fully sorted.
pub(crate) fn radix_sort_high(keys: &mut alloc::vec::Vec<u64>, lo: u32) {
    let n = keys.len();
    if n < 2 {
        return;
    }
    let (or, and) = keys.iter().fold((0u64, u64::MAX), |(o, a), &k| (o | k, a & k));
    let vary = if lo >= 64 { 0 } else { (or ^ and) >> lo << lo };
    if vary == 0 {
        return;
    }
    let (first, top) = (vary.trailing_zeros(), 64 - vary.leading_zeros());
    let passes = (top - first).div_ceil(11);
    let width = (top - first).div_ceil(passes);
    let mask = (1u64 << width) - 1;
    let mut tmp = alloc::vec![0u64; n];
    let mut counts = alloc::vec![0u32; 1 << width];
    let mut shift = first;
    while shift < top {
        counts.iter_mut().for_each(|c| *c = 0);
        for &k in keys.iter() {
            counts[((k >> shift) & mask) as usize] += 1;
        }
        let mut sum = 0u32;
        for c in counts.iter_mut() {
            let t = *c;
            *c = sum;
            sum += t;
        }
        for &k in keys.iter() {
            let d = ((k >> shift) & mask) as usize;
            tmp[counts[d] as usize] = k;
            counts[d] += 1;
        }
        core::mem::swap(keys, &mut tmp);
        shift += width;
    }
}

/// The weight a key of [`sorted_desc_keys`] holds, given the largest weight `max`.
pub(crate) fn key_weight(key: u64, max: u64) -> u64 {
    max - (key >> 32)
}

/// [`sorted_desc`] for weights of 2^32 and more: the radix passes move indices and read each
/// weight through them.
fn sorted_desc_indirect(weights: &[u64]) -> alloc::vec::Vec<u32> {
    // Stable LSD radix sort on `max - w` (ascending), 8 bits a pass, only as many passes as
    // `max` has bits: O(n · bytes), and stability keeps equal weights in index order.
    let n = weights.len();
    let max = weights.iter().copied().max().unwrap_or(0);
    let bits = 64 - max.leading_zeros();
    let mut order: alloc::vec::Vec<u32> = (0..n as u32).collect();
    let mut tmp: alloc::vec::Vec<u32> = alloc::vec![0; n];
    let mut shift = 0;
    while shift < bits {
        let digit = |i: u32| (((max - weights[i as usize]) >> shift) & 0xff) as usize;
        let mut counts = [0usize; 257];
        for &i in &order {
            counts[digit(i) + 1] += 1;
        }
        if counts.iter().any(|&c| c == n) {
            // Every item has the same digit here: this pass would not move anything.
            shift += 8;
            continue;
        }
        for d in 0..256 {
            counts[d + 1] += counts[d];
        }
        for &i in &order {
            let d = digit(i);
            tmp[counts[d]] = i;
            counts[d] += 1;
        }
        core::mem::swap(&mut order, &mut tmp);
        shift += 8;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    fn reference(weights: &[u64]) -> Vec<u32> {
        let mut order: Vec<u32> = (0..weights.len() as u32).collect();
        order.sort_by_key(|&i| (core::cmp::Reverse(weights[i as usize]), i));
        order
    }

    proptest! {
        /// Both paths of `sorted_desc` — packed keys (weights below 2^32) and the indirect
        /// one — give (weight descending, index ascending), as a comparison sort does.
        #[test]
        fn sorted_desc_is_weight_descending_then_index(
            small in proptest::collection::vec(0u64..70_000, 0..300),
            large in proptest::collection::vec(prop_oneof![0u64..5, (1u64 << 32)..(1u64 << 40)], 0..100),
        ) {
            prop_assert_eq!(sorted_desc(&small), reference(&small));
            prop_assert_eq!(sorted_desc(&large), reference(&large));
            if let Some(keys) = sorted_desc_keys(&small) {
                let max = small.iter().copied().max().unwrap_or(0);
                let back: Vec<(u32, u64)> = keys.iter().map(|&k| (k as u32, key_weight(k, max))).collect();
                let want: Vec<(u32, u64)> = reference(&small).into_iter().map(|i| (i, small[i as usize])).collect();
                prop_assert_eq!(back, want);
            }
        }
    }
}
