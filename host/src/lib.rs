//! # stowplan
//!
//! Plans how variable-length training sequences are stowed into micro-batches and ranks.
//! The algorithms live in a sandboxed WebAssembly component (`stowplan:kernel@0.1.0`, see
//! `wit/kernel.wit`) embedded in this crate; [`Kernel`] runs it with wasmtime. A `native`
//! backend calls the same kernel code directly, for comparison and tests.
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

mod atomic;
mod balance;
pub mod data_source;
mod error;
pub mod input;
pub mod json;
mod layout;
pub mod length_cache;
pub mod materialize;
pub mod packer;
pub mod packing_config;
pub mod plan;
pub mod plugin;
pub mod serve;
mod wasm;

pub use data_source::{
    BufferFilter, BufferView, DataSource, DataSourceOptions, FilterContext, Group, PopFirst, RolloutSample, Status,
};
pub use error::{Error, FilterError};
pub use length_cache::LengthCache;
pub use materialize::{
    CpRuns, CpView, MaterializeOptions, Materialized, MicroBatch, RejectReason, Sample, Temperature, check_sample,
};
pub use packer::{
    BatchKey, IngestReport, PackedStep, Packer, PackerOptions, PackerState, RankBatch, RunConfig, RunProgress,
    SampleKey, StepMetrics, TrainingBatch, TrainingSample,
};
pub use packing_config::{EffectiveBatch, PackingConfig, PackingMode};
pub use plan::{LogLine, StaticPackPlan};
pub use plugin::{BufferColumns, FilterOptions, FilterStats, OnFailure, WasmFilter};
pub use stowplan_kernel::peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};
pub use stowplan_kernel::verl::{PyError, SeqlenUnbalance, UnbalanceError};
pub use stowplan_kernel::{
    AlignOptions, Cost, CpLayout, DistributeOptions, Distribution, DpOptions, DpPlan, Factor, MicroOptions, MicroPlan,
    Order, OversizePolicy, PackMethod, PackOptions, Packing, Padding, PartitionMethod, PartitionOptions, Partitioning,
    Plan,
};
pub use stowplan_kernel::{AlignedPlan, PlanOptions, RawPlan};
pub use wasm::{KERNEL_WASM, KERNEL_WASM_SHA256, cache_dir, sha256_hex};

/// Which implementation of the kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// The embedded WebAssembly component under wasmtime (the default).
    #[default]
    Wasm,
    /// The kernel crate called directly (same code, compiled natively).
    Native,
}

impl std::str::FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "wasm" => Ok(Backend::Wasm),
            "native" => Ok(Backend::Native),
            other => Err(Error::InvalidArgument(format!("backend must be wasm or native (got {other:?})"))),
        }
    }
}

/// A verl 0.9.1 function reproduced by [`Kernel::verl`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerlFunction {
    /// `karmarkar_karp`.
    KarmarkarKarp,
    /// `greedy_partition`.
    GreedyPartition,
    /// `get_seqlen_balanced_partitions`.
    GetSeqlenBalancedPartitions,
}

/// verl 0.9.1's `log_seqlen_unbalance` figures for `partitions` of `seqlens` (a metric,
/// computed by the kernel crate natively on every backend; see
/// [`stowplan_kernel::verl::log_seqlen_unbalance`]).
pub fn verl_log_seqlen_unbalance(seqlens: &[i64], partitions: &[Vec<i64>]) -> Result<SeqlenUnbalance, UnbalanceError> {
    stowplan_kernel::verl::log_seqlen_unbalance(seqlens, partitions)
}

/// The stowplan kernel behind one typed API. Cheap to create and to clone; `Send + Sync`.
///
/// With [`Backend::Wasm`], the component is compiled once per process (or loaded
/// precompiled from [`cache_dir`]) and every call runs in a fresh instance created from a
/// shared pre-instantiation (tens of microseconds).
#[derive(Clone, Copy, Debug, Default)]
pub struct Kernel {
    backend: Backend,
}

impl Kernel {
    /// A kernel on `backend`. For [`Backend::Wasm`] this compiles (or loads) the component
    /// now, so that errors surface here and calls are not slowed by the first compilation.
    pub fn new(backend: Backend) -> Result<Self, Error> {
        if backend == Backend::Wasm {
            wasm::shared()?;
        }
        Ok(Self { backend })
    }

    /// The WASM kernel (the default backend).
    pub fn wasm() -> Result<Self, Error> {
        Self::new(Backend::Wasm)
    }

    /// The native kernel.
    pub fn native() -> Self {
        Self { backend: Backend::Native }
    }

    /// The backend of this kernel.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Where the compiled WASM kernel came from in this process: `"cache"` (a precompiled
    /// artifact from [`cache_dir`]) or `"compiled"`; `None` for the native backend.
    pub fn wasm_origin(&self) -> Option<&'static str> {
        match self.backend {
            Backend::Wasm => wasm::shared().ok().map(|s| s.origin),
            Backend::Native => None,
        }
    }

    /// Splits `weights` into `k` groups with balanced sums. See `wit/kernel.wit`
    /// (`partition`) for the methods, the order of the result and the errors.
    pub fn partition(&self, weights: &[u64], k: u32, options: &PartitionOptions) -> Result<Partitioning, Error> {
        match self.backend {
            Backend::Native => Ok(stowplan_kernel::partition(weights, k, options)?),
            Backend::Wasm => {
                use wasm::wpart;
                let opts = wpart::Options {
                    method: match options.method {
                        PartitionMethod::Kk => wpart::Method::Kk,
                        PartitionMethod::Greedy => wpart::Method::Greedy,
                        PartitionMethod::Verl => wpart::Method::Verl,
                    },
                    equal_size: options.equal_size,
                    refine: options.refine,
                };
                let r = wasm::with_instance(|inst, store| {
                    inst.stowplan_kernel_partition().call_partition(store, weights, k, opts)
                })?
                .map_err(wasm::error)?;
                let (offsets, indices) = wasm::flat(r.groups);
                Ok(Partitioning {
                    offsets,
                    indices,
                    sums: r.sums,
                    total: r.total,
                    spread: r.spread,
                    lower_bound: r.lower_bound,
                })
            }
        }
    }

    /// Packs `lengths` into bins of `options.capacity` tokens. See `wit/kernel.wit` (`pack`).
    pub fn pack(&self, lengths: &[u64], options: &PackOptions) -> Result<Packing, Error> {
        match self.backend {
            Backend::Native => Ok(stowplan_kernel::pack(lengths, options)?),
            Backend::Wasm => {
                use wasm::wpack;
                let opts = wpack::Options {
                    capacity: options.capacity,
                    align: options.align,
                    method: match options.method {
                        PackMethod::Bfd => wpack::Method::Bfd,
                        PackMethod::Ffd => wpack::Method::Ffd,
                        PackMethod::NextFit => wpack::Method::NextFit,
                    },
                    oversize: match options.oversize {
                        OversizePolicy::Error => wpack::Oversize::Error,
                        OversizePolicy::Single => wpack::Oversize::Single,
                        OversizePolicy::Drop => wpack::Oversize::Drop,
                    },
                };
                let r = wasm::with_instance(|inst, store| inst.stowplan_kernel_pack().call_pack(store, lengths, opts))?
                    .map_err(wasm::error)?;
                let (offsets, indices) = wasm::flat(r.bins);
                Ok(Packing {
                    offsets,
                    indices,
                    loads: r.loads,
                    dropped: r.dropped,
                    single: r.single,
                    real_tokens: r.real_tokens,
                    aligned_tokens: r.aligned_tokens,
                    lower_bound: r.lower_bound,
                })
            }
        }
    }

    /// Runs verl 0.9.1's `function` exactly: the outer `Result` is a runtime failure of the
    /// kernel, the inner one verl's own result or the Python exception verl raises.
    pub fn verl(
        &self,
        function: VerlFunction,
        seqlens: &[i64],
        k: u32,
        equal_size: bool,
    ) -> Result<Result<Vec<Vec<u32>>, PyError>, Error> {
        use stowplan_kernel::verl as kv;
        match self.backend {
            Backend::Native => Ok(match function {
                VerlFunction::KarmarkarKarp => kv::karmarkar_karp(seqlens, k, equal_size),
                VerlFunction::GreedyPartition => kv::greedy_partition(seqlens, k, equal_size),
                VerlFunction::GetSeqlenBalancedPartitions => kv::get_seqlen_balanced_partitions(seqlens, k, equal_size),
            }),
            Backend::Wasm => {
                use wasm::wverl;
                let f = match function {
                    VerlFunction::KarmarkarKarp => wverl::Function::KarmarkarKarp,
                    VerlFunction::GreedyPartition => wverl::Function::GreedyPartition,
                    VerlFunction::GetSeqlenBalancedPartitions => wverl::Function::GetSeqlenBalancedPartitions,
                };
                let r = wasm::with_instance(|inst, store| {
                    inst.stowplan_kernel_verl().call_call(store, f, seqlens, k, equal_size)
                })?;
                Ok(match r {
                    Ok(g) => {
                        let (offsets, indices) = wasm::flat(g);
                        Ok(json::lists(&offsets, &indices))
                    }
                    Err(e) => Err(match e {
                        wverl::PyError::AssertionError(m) => PyError::AssertionError(m),
                        wverl::PyError::IndexError(m) => PyError::IndexError(m),
                        wverl::PyError::TypeError(m) => PyError::TypeError(m),
                        wverl::PyError::ZeroDivisionError(m) => PyError::ZeroDivisionError(m),
                        wverl::PyError::MemoryError(m) => PyError::MemoryError(m),
                    }),
                })
            }
        }
    }

    /// The import names of the embedded component (empty: the kernel imports nothing).
    pub fn wasm_imports() -> Result<Vec<String>, Error> {
        let shared = wasm::shared()?;
        let component = shared.pre.instance_pre().component();
        Ok(component.component_type().imports(&shared.engine).map(|(name, _)| name.to_string()).collect())
    }
}
