//! # stowplan
//!
//! Plans how variable-length training sequences are stowed into micro-batches and ranks.
//! The algorithms live in a sandboxed WebAssembly component (`stowplan:kernel@0.1.0`, see
//! `wit/kernel.wit`) embedded in this crate; [`Kernel`] runs it with wasmtime. A `native`
//! backend calls the same kernel code directly, for comparison and tests.
//!
//! Layers, each depending only on those before it (ARCHITECTURE.md draws them):
//! [`kernel`] (the two backends behind one dispatch) and `runtime` (hashes, atomic files,
//! the compile cache) and [`wire`] (the one framed format) → [`plan`], `materialize`,
//! `rows` (packed rows of a table), `rollout`, `plugins` (feature `plugins`, on by default)
//! → `packer` (the state machine, no I/O) → [`serve`] (the server loop and the filesystem
//! transport; the ZeroMQ transport is the `stowplan-zmq` crate, `host/zmq`).
//!
//! The API is the items re-exported here. `materialize`, `packer`, `rollout`, `rows` and
//! `runtime` are private: every public item of theirs is re-exported at the root. The other modules
//! stay public because their paths are the API: [`serve`] (the server, its transports, the
//! [`serve::protocol`] state machines and their messages, whose names such as `Message` or
//! `Receipt` only make sense under `serve::`), [`plan`], [`kernel`] (the backends and the
//! peers' plans such as [`kernel::prime_rl`]), [`wire`] (the framed formats), [`json`] and
//! [`input`] (the CLI's and SDKs' shared output and input formats), and `plugins` (its file
//! helpers beside `WasmFilter`).
//!
//! ```no_run
//! use stowplan::{Kernel, PartitionOptions, PackOptions};
//!
//! let kernel = Kernel::wasm()?;
//! let lengths = [812, 95, 4_003, 1_200, 77, 2_500];
//! let p = kernel.partition(&lengths, 2, &PartitionOptions::default())?;
//! assert_eq!(p.k(), 2);
//! let bins = kernel.pack(&lengths, &PackOptions::new(4_096))?;
//! assert!(bins.loads.iter().all(|&l| l <= 4_096));
//! # Ok::<(), stowplan::Error>(())
//! ```
#![deny(missing_docs)]

mod error;
pub mod input;
pub use stowplan_json as json;
pub mod kernel;
mod materialize;
mod packer;
pub mod plan;
#[cfg(feature = "plugins")]
pub mod plugins;
mod rollout;
mod rows;
mod runtime;
pub mod serve;
pub mod wire;

pub use error::{Error, FilterError};
pub use kernel::{
    Backend, KERNEL_WASM, KERNEL_WASM_SHA256, Kernel, KernelApi, LimitedStreamPacker, SlimeApi, StreamPacker,
    VerlFunction,
};
pub use materialize::{
    CpRuns, CpView, Dealt, DistributionMode, LossAggMode, MaterializeOptions, Materialized, MicroBatch, RejectReason,
    Sample, SampleLimits, Temperature, TokenArrays, check_sample, materialize, materialize_limited, materialize_plan,
    round_robin,
};
pub use packer::{
    BatchKey, IngestReport, LossNormalization, MAX_RESOURCE_NAME, PackedStep, Packer, PackerOptions, PackerState,
    RECENT_CONTROLS, RankBatch, RunConfig, RunProgress, SampleKey, StepMetrics, TrainingBatch, TrainingSample,
};
pub use plan::config::{EffectiveBatch, PackingConfig, PackingMode};
pub use plan::length_cache::LengthCache;
pub use plan::{LogLine, StaticPackPlan};
#[cfg(feature = "plugins")]
pub use plugins::{FilterOptions, FilterStats, OnFailure, WasmFilter};
pub use rollout::{
    BufferColumns, BufferFilter, BufferView, DataSource, DataSourceOptions, FilterContext, Group, PopFirst,
    RolloutSample, Status, synthetic_buffer, validate_selection,
};
pub use rows::{
    MAX_ROW_LENGTH, MAX_SEQ_LENGTH, Overflow, PACKED_BATCH_TOKENS, POSITION_IDS, PackedRows, RowItems, RowPacking,
    RowStrategy, SEQ_LENGTHS, check_row_lengths, check_seq_length, pack_rows, packed_batches, row_items, wrapped_rows,
};
pub use runtime::{AtomicFile, cache_dir, create_atomic, sha256_hex, write_atomic};
pub use stowplan_kernel::peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};
pub use stowplan_kernel::slime;
pub use stowplan_kernel::verl::{PyError, SeqlenUnbalance, UnbalanceError, UnbalanceFigures};
pub use stowplan_kernel::{
    AlignOptions, Balance, Cost, CpLayout, DistributeOptions, Distribution, DpOptions, Factor, Figures, MicroBatches,
    MicroOptions, Order, OversizePolicy, PackMethod, PackOptions, Packing, Padding, Partition, PartitionMethod,
    PartitionOptions, TwoLevelBalance,
};
pub use stowplan_kernel::{AlignedPlan, COST_PRESETS, MAX_COUNT, MAX_PARALLEL, Named, PlanOptions, RawPlan, unflatten};
pub use stowplan_kernel::{ClosedBins, LimitedClosedBins, StreamLimits, StreamOptions, StreamStatus, stream};
/// Former names (see [`stowplan_kernel::renamed`]).
#[allow(deprecated)]
pub use stowplan_kernel::{DpPlan, LimitedMicroPlan, MicroPlan, Partitioning, Plan};
pub use stowplan_kernel::{
    LimitedMicroBatches, LimitedRawPlan, MAX_BALANCED_CAPACITY, MAX_MULTI_ITEMS, MAX_RESOURCES, MicroLimits,
    MultiMethod, MultiOptions, MultiPacking, PlanLimits, SEGMENTS,
};

/// The group label of each of `n` samples when runs of `group_size` consecutive samples (one
/// prompt's rollouts) stay on one rank: sample `i` gets `i / group_size`, for
/// [`DpOptions::groups`]. The CLI's `--group-size` and Python's `balance(group_size=)`.
///
/// With `equal_count` (every rank the same number of samples, which needs groups of one size)
/// `group_size` must be in `1..=n` and divide `n`; without it any `group_size >= 1` is taken
/// and the last run keeps the rest. Anything else is [`Error::InvalidArgument`] naming
/// `group_size` and its range.
pub fn group_labels(n: usize, group_size: i128, equal_count: bool) -> Result<Vec<u32>, Error> {
    let g = match u64::try_from(group_size) {
        Ok(g) if g >= 1 && (!equal_count || n == 0 || (n as u64).is_multiple_of(g)) => g,
        _ if equal_count => {
            return Err(Error::InvalidArgument(format!(
                "group_size must be in 1..={n} and divide the number of samples n = {n} (got {group_size}); \
                 without equal counts (equal_count=False, --unequal-count) any group_size >= 1 is taken \
                 (the last run keeps the rest)"
            )));
        }
        _ => {
            return Err(Error::InvalidArgument(format!(
                "group_size must be at least 1 (got {group_size}): runs of group_size consecutive samples, \
                 the last one keeping the rest"
            )));
        }
    };
    (0..n as u64)
        .map(|i| u32::try_from(i / g).map_err(|_| Error::InvalidArgument(format!("more than 2**32-1 groups of {g}"))))
        .collect()
}

/// verl 0.9.1's `log_seqlen_unbalance` figures for `partitions` of `seqlens` (a metric,
/// computed by the kernel crate natively on every backend; see
/// [`stowplan_kernel::verl::log_seqlen_unbalance`]).
pub fn verl_log_seqlen_unbalance(seqlens: &[i64], partitions: &[Vec<i64>]) -> Result<SeqlenUnbalance, UnbalanceError> {
    stowplan_kernel::verl::log_seqlen_unbalance(seqlens, partitions)
}
