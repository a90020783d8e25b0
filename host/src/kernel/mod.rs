//! The kernel behind one typed API: [`Kernel`] is a handle that dispatches every operation
//! of `wit/kernel.wit` (the [`KernelApi`] trait) to one of two backends — the embedded
//! WebAssembly component under wasmtime (`wasm.rs`, the default) or the kernel crate called
//! directly (`native.rs`). Each operation is declared once, in `api.rs`, with what each
//! backend runs for it (`backends!`). The choice is made in one place, [`Kernel`]'s `Deref`;
//! the conversions between the WIT types and the kernel's live in `convert.rs`.

/// A trait of kernel operations and its implementations on both backends, from one list:
/// each operation's docs and signature once, then what each backend runs for it (`native:`,
/// `wasm:`, expressions over the arguments, each the whole `Result`). The trait is
/// object-safe; [`NativeKernel`](native::NativeKernel) and [`WasmKernel`](wasm::WasmKernel)
/// implement it. `impl Kernel { pub fn … }` instead makes inherent methods of [`Kernel`] that
/// run their backend's expression. Paths and the error type are absolute (`$crate::…`), so
/// the list may stand in any module below `kernel`.
macro_rules! backends {
    ($(#[$tm:meta])* pub trait $api:ident { $(
        $(#[$m:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty {
            native: $native:expr, wasm: $wasm:expr $(,)?
        }
    )* }) => {
        $(#[$tm])*
        pub trait $api: Send + Sync + std::fmt::Debug {
            $($(#[$m])* fn $name(&self, $($arg: $ty),*) -> Result<$ret, $crate::Error>;)*
        }

        impl $api for $crate::kernel::native::NativeKernel {
            $($(#[$m])* fn $name(&self, $($arg: $ty),*) -> Result<$ret, $crate::Error> {
                $native
            })*
        }

        impl $api for $crate::kernel::wasm::WasmKernel {
            $($(#[$m])* fn $name(&self, $($arg: $ty),*) -> Result<$ret, $crate::Error> {
                $wasm
            })*
        }
    };
    (impl Kernel { $(
        $(#[$m:meta])* pub fn $name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty {
            native: $native:expr, wasm: $wasm:expr $(,)?
        }
    )* }) => {
        impl $crate::kernel::Kernel {
            $($(#[$m])* pub fn $name(&self, $($arg: $ty),*) -> Result<$ret, $crate::Error> {
                match self.backend() {
                    $crate::kernel::Backend::Native => $native,
                    $crate::kernel::Backend::Wasm => $wasm,
                }
            })*
        }
    };
}

mod api;
mod convert;
mod native;
mod peers;
pub mod prime_rl;
mod slime;
mod wasm;

use std::ops::Deref;

pub use api::KernelApi;
pub use slime::SlimeApi;
pub use wasm::{KERNEL_WASM, KERNEL_WASM_SHA256, RETAIN_MEMORY_BYTES};

use crate::Error;
/// The streaming packer's bounds and defaults (`stream::MAX_OPEN_BINS` …).
pub use stowplan_kernel::stream;
/// The operations' options and results, as the kernel crate defines them (the WIT records in
/// Rust form).
pub use stowplan_kernel::{
    AlignOptions, AlignedPlan, Balance, COST_PRESETS, ClosedBins, Cost, CpLayout, DistributeOptions, Distribution,
    DpOptions, Factor, Figures, LimitedClosedBins, LimitedMicroBatches, LimitedRawPlan, MAX_BALANCED_CAPACITY,
    MAX_COUNT, MAX_MULTI_ITEMS, MAX_PARALLEL, MAX_RESOURCES, MicroBatches, MicroLimits, MicroOptions, MultiMethod,
    MultiOptions, MultiPacking, Named, Order, OversizePolicy, PackMethod, PackOptions, Packing, Padding, Partition,
    PartitionMethod, PartitionOptions, PlanLimits, PlanOptions, RawPlan, SEGMENTS, StreamLimits, StreamOptions,
    StreamStatus, TwoLevelBalance, unflatten,
};

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

/// A streaming packer under further limits per bin (`wit/kernel.wit`, `streaming` with limits):
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
/// precompiled from [`cache_dir`](crate::runtime::cache_dir)) and every call runs in this thread's
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
    /// artifact from [`cache_dir`](crate::runtime::cache_dir)) or `"compiled"`; `None` for the native
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
