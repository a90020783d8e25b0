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
pub mod ops;
mod order;
pub mod pack;
pub mod partition;
pub mod peers;
pub mod plan;
mod refine;
mod rooms;
pub mod shuffle;
mod sort;
pub mod stream;
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
