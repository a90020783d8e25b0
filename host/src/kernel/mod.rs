//! The kernel behind one typed API: [`Kernel`] is a handle that dispatches every operation
//! of `wit/kernel.wit` (the [`KernelApi`] trait) to one of two backends — the embedded
//! WebAssembly component under wasmtime (`wasm.rs`, the default) or the kernel crate called
//! directly (`native.rs`). The choice is made in one place, [`Kernel`]'s `Deref`; the
//! conversions between the WIT types and the kernel's live in `convert.rs`.

/// The native backend's methods that call the kernel function of the same arguments, one
/// line each instead of a restated signature: `try` returns the function's result with its
/// error made the host's (`Ok(f(..)?)`); `ok` returns the function's own value as it is (a
/// peer's `Result`, or a value that cannot fail), inside the backend's (`Ok(f(..))`).
macro_rules! forward {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $how:ident $f:path;)*) => {
        $(fn $name(&self, $($arg: $ty),*) -> Result<$ret, Error> {
            forward!(@$how $f, $($arg),*)
        })*
    };
    (@try $f:path, $($arg:ident),*) => { Ok($f($($arg),*)?) };
    (@ok $f:path, $($arg:ident),*) => { Ok($f($($arg),*)) };
}

mod convert;
mod native;
pub mod prime_rl;
mod slime;
mod wasm;

use std::ops::Deref;

pub use slime::SlimeApi;
pub use wasm::{KERNEL_WASM, KERNEL_WASM_SHA256, RETAIN_MEMORY_BYTES};

use crate::Error;
use stowplan_kernel::peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};
use stowplan_kernel::verl::PyError;
use stowplan_kernel::{
    AlignOptions, AlignedPlan, Balance, CpLayout, DistributeOptions, Distribution, DpOptions, MicroBatches,
    MicroOptions, MultiOptions, MultiPacking, Named, PackOptions, Packing, Partition, PartitionOptions, PlanOptions,
    RawPlan, TwoLevelBalance,
};
use stowplan_kernel::{ClosedBins, LimitedClosedBins, StreamLimits, StreamOptions, StreamStatus};
use stowplan_kernel::{LimitedMicroBatches, LimitedRawPlan, MicroLimits, PlanLimits};

/// Which implementation of the kernel runs a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backend {
    /// The embedded WebAssembly component under wasmtime (the default).
    #[default]
    Wasm,
    /// The kernel crate called directly (same code, compiled natively).
    Native,
}

impl Named for Backend {
    const WHAT: &'static str = "backend";
    const ALL: &'static [Self] = &[Backend::Wasm, Backend::Native];
    fn as_str(self) -> &'static str {
        match self {
            Backend::Wasm => "wasm",
            Backend::Native => "native",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(Backend::parse_name(s)?)
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verl 0.9.1 function reproduced by [`KernelApi::verl`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VerlFunction {
    /// `karmarkar_karp`.
    KarmarkarKarp,
    /// `greedy_partition`.
    GreedyPartition,
    /// `get_seqlen_balanced_partitions`.
    GetSeqlenBalancedPartitions,
}

/// Every operation of the kernel (`wit/kernel.wit`), as each backend implements it. Call
/// them on a [`Kernel`] (`kernel.partition(…)`): it dereferences to its backend's
/// implementation. Results are identical on both backends (tests prove it on every vector
/// and on random inputs).
pub trait KernelApi: Send + Sync + std::fmt::Debug {
    /// Splits `weights` into `k` groups with balanced sums. See `wit/kernel.wit`
    /// (`partition`) for the methods, the order of the result and the errors.
    fn partition(&self, weights: &[u64], k: u32, options: &PartitionOptions) -> Result<Partition, Error>;

    /// Packs `lengths` into bins of `options.capacity` tokens. See `wit/kernel.wit` (`pack`).
    fn pack(&self, lengths: &[u64], options: &PackOptions) -> Result<Packing, Error>;

    /// Packs items under several limits at once: `sizes` row by row, one value per entry of
    /// `options.capacities` (tokens first). See `wit/kernel.wit` (`multi-pack`).
    fn pack_multi(&self, sizes: &[u64], options: &MultiOptions<'_>) -> Result<MultiPacking, Error>;

    /// Runs verl 0.9.1's `function` exactly: the outer `Result` is a runtime failure of the
    /// kernel, the inner one verl's own result or the Python exception verl raises.
    fn verl(
        &self,
        function: VerlFunction,
        seqlens: &[i64],
        k: u32,
        equal_size: bool,
    ) -> Result<Result<Vec<Vec<u32>>, PyError>, Error>;

    /// Splits one batch into micro-batches of at most `options.max_token_len` tokens with
    /// balanced costs. See `wit/kernel.wit` (`balance.micro-batches`) for the count, the
    /// order and the errors.
    fn micro_batches(&self, lengths: &[u64], options: &MicroOptions) -> Result<MicroBatches, Error>;

    /// [`micro_batches`](Self::micro_batches) where sample `i` also costs `extra[i]` (cost
    /// units, e.g. a multimodal sample's image tokens): the cap counts tokens, the balance
    /// costs (`wit/kernel.wit`, `multimodal`). [`DpOptions::extra_costs`] and
    /// [`DistributeOptions::extra_costs`] do the same for the other balancing calls.
    fn micro_batches_with_extra(
        &self,
        lengths: &[u64],
        extra: &[u64],
        options: &MicroOptions,
    ) -> Result<MicroBatches, Error>;

    /// Micro-batches within the token cap and further caps per micro-batch (image tokens,
    /// images …), balancing the cost plus `extra` costs. See `wit/kernel.wit` (`multi-micro`)
    /// and [`stowplan_kernel::micro_batches_limited`].
    fn micro_batches_limited(
        &self,
        lengths: &[u64],
        extra: Option<&[u64]>,
        limits: &MicroLimits<'_>,
        options: &MicroOptions,
    ) -> Result<LimitedMicroBatches, Error>;

    /// Reorders a global batch over `dp` ranks, minimizing the costliest rank. See
    /// `wit/kernel.wit` (`balance.balance-dp`).
    fn balance_dp(&self, lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Result<Balance, Error>;

    /// DP balancing, then every rank's micro-batches with one common count. See
    /// `wit/kernel.wit` (`balance.plan`).
    fn plan(
        &self,
        lengths: &[u64],
        dp: u32,
        dp_options: &DpOptions<'_>,
        micro: &MicroOptions,
    ) -> Result<TwoLevelBalance, Error>;

    /// [`plan`](Self::plan) under further caps per micro-batch (image tokens, images …):
    /// every rank's micro-batches within the token cap and every limit, one common count
    /// (see `wit/kernel.wit`, `multi-micro.plan`).
    fn plan_limited(
        &self,
        lengths: &[u64],
        dp: u32,
        dp_options: &DpOptions<'_>,
        micro: &MicroOptions,
        limits: &MicroLimits<'_>,
    ) -> Result<TwoLevelBalance, Error>;

    /// verl 0.9.1 `rearrange_micro_batches`, exactly: the outer `Result` is a runtime
    /// failure of the kernel, the inner one verl's index lists or the exception it raises.
    fn verl_rearrange_micro_batches(
        &self,
        seqlens: &[i64],
        options: &VerlMicroOptions,
    ) -> Result<Result<Vec<Vec<u32>>, PyError>, Error>;

    /// verl's trainer `_balance_batch` reordering, which is also ROLL's `batch_balance`,
    /// exactly (`minibatch_size` = verl's `keep_minibatch` with `ppo_mini_batch_size`).
    fn balance_batch(
        &self,
        seqlens: &[i64],
        dp: u32,
        minibatch_size: Option<i64>,
    ) -> Result<Result<DpReorder, PyError>, Error>;

    /// ROLL's `LoadBalancePacker` micro-batching, exactly.
    fn roll_load_balance(
        &self,
        lengths: &[i64],
        options: &RollLoadBalanceOptions,
    ) -> Result<Result<RollMicroBatches, PyError>, Error>;

    /// The alignment factor for `options` (see `wit/kernel.wit`, `layout.pad-factor`).
    fn pad_factor(&self, options: &AlignOptions) -> Result<u64, Error>;

    /// The padded packed layout of `lengths` and its zigzag split over `options.cp` ranks
    /// (see `layout.cp-layout`). [`CpRuns::of`](crate::CpRuns::of) turns it into per-rank
    /// runs that gather a rank's share of a row and unpack the ranks' rows back into one.
    fn cp_layout(&self, lengths: &[u64], options: &AlignOptions) -> Result<CpLayout, Error>;

    /// Micro-batches under a capacity for every DP rank, the same count on each (see
    /// `layout.distribute`).
    fn distribute(&self, lengths: &[u64], options: &DistributeOptions<'_>) -> Result<Distribution, Error>;

    /// prime-rl's classic first-fit-decreasing packer, exactly (see `layout.prime-rl-ffd`):
    /// the bins (members in insertion order) and the zero-length samples prime-rl drops.
    fn prime_rl_ffd(
        &self,
        lengths: &[u64],
        runs: &[u32],
        labels: &[u32],
        seq_len: u64,
    ) -> Result<(Vec<Vec<u32>>, Vec<u32>), Error>;

    /// TRL's best fit decreasing per map batch, exactly (see `wit/kernel.wit`, `trl.bfd`): the
    /// bins as `(offsets, indices)`, members in the order they went in.
    fn trl_bfd(&self, lengths: &[u64], batch_ends: &[u32], seq_length: u64) -> Result<(Vec<u32>, Vec<u32>), Error>;

    /// The seeded permutation of `0..n` for `(seed, epoch)` (see `wit/kernel.wit`,
    /// `shuffle.permutation`): the order data sources draw an epoch's prompts in.
    fn permutation(&self, n: u64, seed: u64, epoch: u64) -> Result<Vec<u32>, Error>;

    /// The raw plan of `lengths` (see `wit/kernel.wit`, `plan.raw-plan`).
    fn raw_plan(&self, lengths: &[u64], options: &PlanOptions) -> Result<RawPlan, Error>;

    /// The raw plan of `lengths` under further limits per pack: image tokens, images,
    /// segments (see `wit/kernel.wit`, `multi-plan.raw-plan`).
    fn raw_plan_limited(
        &self,
        lengths: &[u64],
        options: &PlanOptions,
        limits: &PlanLimits<'_>,
    ) -> Result<LimitedRawPlan, Error>;

    /// The plan `world_size` ranks consume from `raw` (see `plan.align-plan`): truncated to a
    /// multiple of `world_size` with `drop_last`, else padded by repeating the first packs.
    fn aligned_plan(&self, raw: &RawPlan, world_size: u32, drop_last: bool) -> Result<AlignedPlan, Error>;

    /// An empty streaming packer (see `wit/kernel.wit`, `streaming`). On the WASM backend it
    /// owns an instance of its own, which holds its state between calls.
    fn stream_packer(&self, options: &StreamOptions) -> Result<StreamPacker, Error>;

    /// A streaming packer from [`StreamPacker::state`]'s bytes (damage and other versions are
    /// refused with `invalid-argument`).
    fn stream_packer_from_state(&self, state: &[u8]) -> Result<StreamPacker, Error>;

    /// An empty streaming packer under further limits per bin (see `wit/kernel.wit`,
    /// `multi-streaming`).
    fn limited_stream_packer(
        &self,
        options: &StreamOptions,
        limits: &StreamLimits,
    ) -> Result<LimitedStreamPacker, Error>;

    /// A limited streaming packer from [`LimitedStreamPacker::state`]'s bytes.
    fn limited_stream_packer_from_state(&self, state: &[u8]) -> Result<LimitedStreamPacker, Error>;
}

/// One backend's streaming packer; [`StreamPacker`] (`C` = [`ClosedBins`]) and
/// [`LimitedStreamPacker`] (`C` = [`LimitedClosedBins`]) wrap it.
pub(crate) trait StreamBackend<C>: Send + std::fmt::Debug {
    fn add(&mut self, rows: &[u64]) -> Result<C, Error>;
    fn finish(&mut self) -> Result<C, Error>;
    fn state(&mut self) -> Result<Vec<u8>, Error>;
    fn status(&mut self) -> Result<StreamStatus, Error>;
}

/// A streaming packer (`wit/kernel.wit`, `streaming`): lengths go in a few at a time with
/// [`add`](Self::add), each bin comes out when it closes; memory is bounded by the options,
/// whatever the length of the stream. Made by [`KernelApi::stream_packer`] or
/// [`KernelApi::stream_packer_from_state`]; the same bins on both backends.
#[derive(Debug)]
pub struct StreamPacker {
    inner: Box<dyn StreamBackend<ClosedBins>>,
    options: StreamOptions,
}

impl StreamPacker {
    pub(crate) fn new(inner: Box<dyn StreamBackend<ClosedBins>>, options: StreamOptions) -> Self {
        Self { inner, options }
    }

    /// The options it was made with.
    pub fn options(&self) -> &StreamOptions {
        &self.options
    }

    /// Adds the next lengths of the stream; returns the bins that closed (stream indices).
    /// An error applies nothing.
    pub fn add(&mut self, lengths: &[u64]) -> Result<ClosedBins, Error> {
        self.inner.add(lengths)
    }

    /// Places every buffered item and closes every open bin; later lengths continue the
    /// stream's indices.
    pub fn finish(&mut self) -> Result<ClosedBins, Error> {
        self.inner.finish()
    }

    /// The whole state as framed, versioned, checksummed bytes (identical on both backends).
    pub fn state(&mut self) -> Result<Vec<u8>, Error> {
        self.inner.state()
    }

    /// Where the stream stands.
    pub fn status(&mut self) -> Result<StreamStatus, Error> {
        self.inner.status()
    }
}

/// A streaming packer under further limits per bin (`wit/kernel.wit`, `multi-streaming`):
/// items go in as rows (the length, then one size per limit), each bin comes out when it
/// closes, within the capacity and every limit. Made by [`KernelApi::limited_stream_packer`]
/// or [`KernelApi::limited_stream_packer_from_state`]; the same bins on both backends.
#[derive(Debug)]
pub struct LimitedStreamPacker {
    inner: Box<dyn StreamBackend<LimitedClosedBins>>,
    options: StreamOptions,
    limits: StreamLimits,
}

impl LimitedStreamPacker {
    pub(crate) fn new(
        inner: Box<dyn StreamBackend<LimitedClosedBins>>,
        options: StreamOptions,
        limits: StreamLimits,
    ) -> Self {
        Self { inner, options, limits }
    }

    /// The options it was made with.
    pub fn options(&self) -> &StreamOptions {
        &self.options
    }

    /// The limits (unnamed resources named `resource 1`, `resource 2` …).
    pub fn limits(&self) -> &StreamLimits {
        &self.limits
    }

    /// Adds the next items, row by row (the length, then one size per limit); returns the
    /// bins that closed with their loads. An error applies nothing.
    pub fn add(&mut self, rows: &[u64]) -> Result<LimitedClosedBins, Error> {
        self.inner.add(rows)
    }

    /// Places every buffered item and closes every open bin.
    pub fn finish(&mut self) -> Result<LimitedClosedBins, Error> {
        self.inner.finish()
    }

    /// The whole state as framed (`SPSL`), versioned, checksummed bytes.
    pub fn state(&mut self) -> Result<Vec<u8>, Error> {
        self.inner.state()
    }

    /// Where the stream stands.
    pub fn status(&mut self) -> Result<StreamStatus, Error> {
        self.inner.status()
    }
}

/// The stowplan kernel behind one typed API ([`KernelApi`], reached through `Deref`). Cheap
/// to create and to copy; `Send + Sync`.
///
/// With [`Backend::Wasm`], the component is compiled once per process (or loaded
/// precompiled from [`cache_dir`](crate::cache_dir)) and every call runs in this thread's
/// warm instance, made from a shared pre-instantiation (tens of microseconds).
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
    /// artifact from [`cache_dir`](crate::cache_dir)) or `"compiled"`; `None` for the native
    /// backend.
    pub fn wasm_origin(&self) -> Option<&'static str> {
        match self.backend {
            Backend::Wasm => wasm::shared().ok().map(|s| s.origin),
            Backend::Native => None,
        }
    }

    /// The import names of the embedded component (empty: the kernel imports nothing).
    pub fn wasm_imports() -> Result<Vec<String>, Error> {
        wasm::imports()
    }
}

/// The one dispatch point between the backends.
impl Deref for Kernel {
    type Target = dyn KernelApi;
    fn deref(&self) -> &Self::Target {
        match self.backend {
            Backend::Wasm => &wasm::WasmKernel,
            Backend::Native => &native::NativeKernel,
        }
    }
}
