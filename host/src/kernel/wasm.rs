//! The WASM backend: the embedded kernel component run by wasmtime, and its [`KernelApi`]
//! implementation (conversions in `convert.rs`).
//!
//! The component is compiled once per process (from a precompiled artifact cached on disk
//! when possible) and instantiated per call from a shared `InstancePre` with an **empty
//! linker**: the kernel imports nothing.

use std::sync::OnceLock;

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

use stowplan_kernel::peers::{DpReorder, RollLoadBalanceOptions, RollMicroBatches, VerlMicroOptions};
use stowplan_kernel::verl::PyError;
use stowplan_kernel::{
    AlignOptions, AlignedPlan, Balance, CpLayout, DistributeOptions, Distribution, DpOptions, MicroBatches,
    MicroOptions, MultiOptions, MultiPacking, PackOptions, Packing, Partition, PartitionOptions, PlanOptions, RawPlan,
    TwoLevelBalance,
};

use stowplan_kernel::{ClosedBins, NextFitRuns, PackMethod, StreamLimits, StreamOptions, StreamStatus};
use stowplan_kernel::{LimitedMicroBatches, LimitedRawPlan, MicroLimits, PlanLimits};
use wasmtime::component::ResourceAny;

use super::{KernelApi, LimitedStreamPacker, StreamBackend, StreamPacker, VerlFunction};
use crate::error::{Error, runtime};
use crate::runtime::{self, sha256_hex};

mod multi_stream;
mod slime;

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "kernel",
    });
}

pub(super) use bindings::exports::stowplan::kernel as wit;
pub(super) use bindings::exports::stowplan::kernel::{
    balance as wbal, layout as wlay, multi_micro as wmicro, multi_pack as wmulti, multi_plan as wmplan, pack as wpack,
    peers as wpeers, streaming as wstream, types as wtypes, verl as wverl,
};

/// The kernel component, built by `cargo xtask build-kernel` (see `ARCHITECTURE.md`).
pub const KERNEL_WASM: &[u8] = include_bytes!("../../assets/stowplan_kernel.wasm");

/// The sha256 (hex) recorded when the component was built.
pub const KERNEL_WASM_SHA256: &str = include_str!("../../assets/stowplan_kernel.wasm.sha256");

pub(super) struct Shared {
    pub(super) engine: Engine,
    pub(super) pre: bindings::KernelPre<Tracker>,
    /// Where the compiled component came from: `cache` or `compiled`.
    pub(super) origin: &'static str,
}

static SHARED: OnceLock<Result<Shared, Error>> = OnceLock::new();

/// The process-wide engine and pre-instantiated kernel, built on first use.
pub(super) fn shared() -> Result<&'static Shared, Error> {
    SHARED.get_or_init(init).as_ref().map_err(Clone::clone)
}

fn init() -> Result<Shared, Error> {
    let expected = KERNEL_WASM_SHA256.trim();
    let actual = sha256_hex(KERNEL_WASM);
    if actual != expected {
        return Err(Error::Runtime(format!(
            "embedded kernel component is corrupt: sha256 {actual}, recorded {expected}"
        )));
    }
    let mut config = Config::new();
    config.wasm_component_model(true);
    // `STOWPLAN_PERFMAP=1`: wasmtime writes /tmp/perf-PID.map, so `perf` names the
    // kernel's own functions in a profile (how the next-fit loop was tuned; BENCHMARKS.md).
    if runtime::env_flag("STOWPLAN_PERFMAP") {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    let engine = Engine::new(&config).map_err(|e| runtime("creating the wasmtime engine", e))?;
    let (component, origin) = load_component(&engine, &actual)?;
    let linker: Linker<Tracker> = Linker::new(&engine);
    let instance_pre = linker
        .instantiate_pre(&component)
        .map_err(|e| runtime("pre-instantiating the kernel (it must import nothing)", e))?;
    let pre = bindings::KernelPre::new(instance_pre).map_err(|e| runtime("binding the kernel's exports", e))?;
    Ok(Shared { engine, pre, origin })
}

/// Compiles the component, or loads it precompiled from the cache ([`runtime::load_cached`]).
fn load_component(engine: &Engine, wasm_sha: &str) -> Result<(Component, &'static str), Error> {
    runtime::load_cached(engine, KERNEL_WASM, wasm_sha, "kernel")
        .map_err(|e| runtime("compiling the kernel component", e))
}

/// Per-store state: tracks the size of the instance's linear memory.
#[derive(Default)]
pub(super) struct Tracker {
    memory_bytes: usize,
}

impl wasmtime::ResourceLimiter for Tracker {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.memory_bytes = desired;
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, _desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

/// A fresh instance of the kernel (memory tracked by its store's [`Tracker`]).
fn instantiate() -> Result<Warm, Error> {
    let shared = shared()?;
    let mut store = Store::new(&shared.engine, Tracker::default());
    store.limiter(|t| t);
    let instance = shared.pre.instantiate(&mut store).map_err(|e| runtime("instantiating the kernel", e))?;
    Ok(Warm { store, instance, narrow: Vec::new() })
}

/// A warm instance kept for the next call on the same thread.
struct Warm {
    store: Store<Tracker>,
    instance: bindings::Kernel,
    /// Scratch for lengths narrowed to `u32` before they cross into the component
    /// ([`narrow_into`]), reused so that a large call does not page-fault a fresh buffer each
    /// time. It counts towards [`RETAIN_MEMORY_BYTES`].
    narrow: Vec<u32>,
}

impl Warm {
    /// The memory kept with this instance: its linear memory and its scratch.
    fn retained_bytes(&self) -> usize {
        self.store.data().memory_bytes + self.narrow.capacity() * size_of::<u32>()
    }
}

/// An instance whose linear memory (with its scratch) grew beyond this is dropped after its
/// call instead of being kept warm, so an occasional huge call does not pin its memory for
/// the thread's life.
/// 1 GiB keeps the instance of calls up to tens of millions of lengths (packing 16M lengths
/// peaks near 400 MiB), which otherwise page-fault hundreds of MiB of fresh memory each time.
pub const RETAIN_MEMORY_BYTES: usize = 1 << 30;

thread_local! {
    static WARM: std::cell::RefCell<Option<Warm>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` on this thread's warm instance of the kernel (made from the shared
/// pre-instantiation on first use). The kernel is pure, so reusing an instance cannot change
/// a result; an instance that trapped is discarded, never reused.
fn with_instance<R>(f: impl FnOnce(&bindings::Kernel, &mut Store<Tracker>) -> wasmtime::Result<R>) -> Result<R, Error> {
    with_warm(|w| f(&w.instance, &mut w.store))
}

/// [`with_instance`] with the whole warm state, scratch included.
fn with_warm<R>(f: impl FnOnce(&mut Warm) -> wasmtime::Result<R>) -> Result<R, Error> {
    let warm = WARM.with(|w| w.borrow_mut().take());
    let mut warm = match warm {
        Some(w) => w,
        None => instantiate()?,
    };
    let result = f(&mut warm).map_err(|e| runtime("kernel call trapped", e))?;
    if warm.retained_bytes() <= RETAIN_MEMORY_BYTES {
        WARM.with(|w| *w.borrow_mut() = Some(warm));
    }
    Ok(result)
}

/// `lengths` as `u32` in `out` (cleared first); false when one does not fit. One pass that
/// the compiler vectorises: the check is an OR of every length, not a branch per length.
fn narrow_into(lengths: &[u64], out: &mut Vec<u32>) -> bool {
    out.clear();
    let mut high = 0u64;
    out.extend(lengths.iter().map(|&l| {
        high |= l;
        l as u32
    }));
    high >> 32 == 0
}

/// The import names of the embedded component.
pub(super) fn imports() -> Result<Vec<String>, Error> {
    let shared = shared()?;
    let component = shared.pre.instance_pre().component();
    Ok(component.component_type().imports(&shared.engine).map(|(name, _)| name.to_string()).collect())
}

/// Runs `f` on a warm instance and folds the component's own error into [`Error`].
pub(super) fn call<W>(
    f: impl FnOnce(&bindings::Kernel, &mut Store<Tracker>) -> wasmtime::Result<Result<W, wtypes::Error>>,
) -> Result<W, Error> {
    Ok(with_instance(f)??)
}

/// The embedded component.
#[derive(Debug)]
pub(super) struct WasmKernel;

impl KernelApi for WasmKernel {
    fn partition(&self, weights: &[u64], k: u32, options: &PartitionOptions) -> Result<Partition, Error> {
        call(|i, s| i.stowplan_kernel_partition().call_partition(s, weights, k, options.into())).map(Into::into)
    }

    fn pack(&self, lengths: &[u64], options: &PackOptions) -> Result<Packing, Error> {
        // Next-fit's bins follow the input order: send the lengths as u32 when they fit and
        // take the bins back as runs (half the bytes in, no member list out), then rebuild
        // the member lists here — the component still decides every bin.
        if options.method == PackMethod::NextFit {
            let o: wpack::Options = options.into();
            let runs = with_warm(|w| {
                if !narrow_into(lengths, &mut w.narrow) {
                    return Ok(None);
                }
                let r = w.instance.stowplan_kernel_pack_compact().call_next_fit(
                    &mut w.store,
                    &w.narrow,
                    o.capacity,
                    o.align,
                    o.oversize,
                );
                r.map(Some)
            })?;
            if let Some(runs) = runs {
                return Ok(NextFitRuns::from(runs?).into_packing(lengths.len()));
            }
        }
        call(|i, s| i.stowplan_kernel_pack().call_pack(s, lengths, options.into())).map(Into::into)
    }

    fn pack_multi(&self, sizes: &[u64], options: &MultiOptions<'_>) -> Result<MultiPacking, Error> {
        call(|i, s| i.stowplan_kernel_multi_pack().call_pack(s, sizes, &options.into())).map(Into::into)
    }

    fn verl(
        &self,
        function: VerlFunction,
        seqlens: &[i64],
        k: u32,
        equal_size: bool,
    ) -> Result<Result<Vec<Vec<u32>>, PyError>, Error> {
        let f = function.into();
        let r = with_instance(|i, s| i.stowplan_kernel_verl().call_call(s, f, seqlens, k, equal_size))?;
        Ok(r.map(Into::into).map_err(Into::into))
    }

    fn micro_batches(&self, lengths: &[u64], options: &MicroOptions) -> Result<MicroBatches, Error> {
        call(|i, s| i.stowplan_kernel_balance().call_micro_batches(s, lengths, options.into())).map(Into::into)
    }

    fn micro_batches_with_extra(
        &self,
        lengths: &[u64],
        extra: &[u64],
        options: &MicroOptions,
    ) -> Result<MicroBatches, Error> {
        call(|i, s| i.stowplan_kernel_multimodal().call_micro_batches(s, lengths, extra, options.into()))
            .map(Into::into)
    }

    fn micro_batches_limited(
        &self,
        lengths: &[u64],
        extra: Option<&[u64]>,
        limits: &MicroLimits<'_>,
        options: &MicroOptions,
    ) -> Result<LimitedMicroBatches, Error> {
        let l = limits.into();
        call(|i, s| i.stowplan_kernel_multi_micro().call_micro_batches(s, lengths, extra, &l, options.into()))
            .map(Into::into)
    }

    fn balance_dp(&self, lengths: &[u64], dp: u32, options: &DpOptions<'_>) -> Result<Balance, Error> {
        let o = options.into();
        match options.extra_costs {
            Some(e) => call(|i, s| i.stowplan_kernel_multimodal().call_balance_dp(s, lengths, e, dp, &o)),
            None => call(|i, s| i.stowplan_kernel_balance().call_balance_dp(s, lengths, dp, &o)),
        }
        .map(Into::into)
    }

    fn plan(
        &self,
        lengths: &[u64],
        dp: u32,
        dp_options: &DpOptions<'_>,
        micro: &MicroOptions,
    ) -> Result<TwoLevelBalance, Error> {
        let (o, m) = (dp_options.into(), micro.into());
        match dp_options.extra_costs {
            Some(e) => call(|i, s| i.stowplan_kernel_multimodal().call_plan(s, lengths, e, dp, &o, m)),
            None => call(|i, s| i.stowplan_kernel_balance().call_plan(s, lengths, dp, &o, m)),
        }
        .map(Into::into)
    }

    fn plan_limited(
        &self,
        lengths: &[u64],
        dp: u32,
        dp_options: &DpOptions<'_>,
        micro: &MicroOptions,
        limits: &MicroLimits<'_>,
    ) -> Result<TwoLevelBalance, Error> {
        let (o, m, l) = (dp_options.into(), micro.into(), limits.into());
        let e = dp_options.extra_costs;
        call(|i, s| i.stowplan_kernel_multi_micro().call_plan(s, lengths, e, &l, dp, &o, m)).map(Into::into)
    }

    fn verl_rearrange_micro_batches(
        &self,
        seqlens: &[i64],
        options: &VerlMicroOptions,
    ) -> Result<Result<Vec<Vec<u32>>, PyError>, Error> {
        let r = with_instance(|i, s| {
            i.stowplan_kernel_peers().call_verl_rearrange_micro_batches(s, seqlens, options.into())
        })?;
        Ok(r.map(Into::into).map_err(Into::into))
    }

    fn balance_batch(
        &self,
        seqlens: &[i64],
        dp: u32,
        minibatch_size: Option<i64>,
    ) -> Result<Result<DpReorder, PyError>, Error> {
        let r = with_instance(|i, s| i.stowplan_kernel_peers().call_balance_batch(s, seqlens, dp, minibatch_size))?;
        Ok(r.map(Into::into).map_err(Into::into))
    }

    fn roll_load_balance(
        &self,
        lengths: &[i64],
        options: &RollLoadBalanceOptions,
    ) -> Result<Result<RollMicroBatches, PyError>, Error> {
        let r = with_instance(|i, s| i.stowplan_kernel_peers().call_roll_load_balance(s, lengths, options.into()))?;
        Ok(r.map(Into::into).map_err(Into::into))
    }

    fn pad_factor(&self, options: &AlignOptions) -> Result<u64, Error> {
        call(|i, s| i.stowplan_kernel_layout().call_pad_factor(s, options.into()))
    }

    fn cp_layout(&self, lengths: &[u64], options: &AlignOptions) -> Result<CpLayout, Error> {
        call(|i, s| i.stowplan_kernel_layout().call_cp_layout(s, lengths, options.into())).map(Into::into)
    }

    fn distribute(&self, lengths: &[u64], options: &DistributeOptions<'_>) -> Result<Distribution, Error> {
        let o = options.into();
        match (&options.limits, options.extra_costs) {
            (Some(limits), e) => {
                let l = limits.into();
                call(|i, s| i.stowplan_kernel_multi_micro().call_distribute(s, lengths, e, &l, &o))
            }
            (None, Some(e)) => call(|i, s| i.stowplan_kernel_multimodal().call_distribute(s, lengths, e, &o)),
            (None, None) => call(|i, s| i.stowplan_kernel_layout().call_distribute(s, lengths, &o)),
        }
        .map(Into::into)
    }

    fn prime_rl_ffd(
        &self,
        lengths: &[u64],
        runs: &[u32],
        labels: &[u32],
        seq_len: u64,
    ) -> Result<(Vec<Vec<u32>>, Vec<u32>), Error> {
        call(|i, s| i.stowplan_kernel_layout().call_prime_rl_ffd(s, lengths, runs, labels, seq_len))
            .map(|(bins, dropped)| (bins.into(), dropped))
    }

    fn trl_bfd(&self, lengths: &[u64], batch_ends: &[u32], seq_length: u64) -> Result<(Vec<u32>, Vec<u32>), Error> {
        call(|i, s| i.stowplan_kernel_trl().call_bfd(s, lengths, batch_ends, seq_length))
            .map(|g| (g.offsets, g.indices))
    }

    fn permutation(&self, n: u64, seed: u64, epoch: u64) -> Result<Vec<u32>, Error> {
        call(|i, s| i.stowplan_kernel_shuffle().call_permutation(s, n, seed, epoch))
    }

    fn raw_plan(&self, lengths: &[u64], options: &PlanOptions) -> Result<RawPlan, Error> {
        Ok(call(|i, s| i.stowplan_kernel_plan().call_raw_plan(s, lengths, options.into()))?.try_into()?)
    }

    fn raw_plan_limited(
        &self,
        lengths: &[u64],
        options: &PlanOptions,
        limits: &PlanLimits<'_>,
    ) -> Result<LimitedRawPlan, Error> {
        let l = limits.into();
        Ok(call(|i, s| i.stowplan_kernel_multi_plan().call_raw_plan(s, lengths, options.into(), &l))?.try_into()?)
    }

    fn aligned_plan(&self, raw: &RawPlan, world_size: u32, drop_last: bool) -> Result<AlignedPlan, Error> {
        let packs = wtypes::Groups { offsets: raw.offsets.clone(), indices: raw.indices.clone() };
        Ok(call(|i, s| i.stowplan_kernel_plan().call_align_plan(s, &packs, world_size, drop_last))?.try_into()?)
    }

    fn stream_packer(&self, options: &StreamOptions) -> Result<StreamPacker, Error> {
        let mut warm = instantiate()?;
        let packer = warm
            .instance
            .stowplan_kernel_streaming()
            .packer()
            .call_create(&mut warm.store, options.into())
            .map_err(|e| runtime("kernel call trapped", e))??;
        Ok(StreamPacker::new(Box::new(WasmStream { warm, packer }), *options))
    }

    fn stream_packer_from_state(&self, state: &[u8]) -> Result<StreamPacker, Error> {
        let mut warm = instantiate()?;
        let packer = warm
            .instance
            .stowplan_kernel_streaming()
            .packer()
            .call_restore(&mut warm.store, state)
            .map_err(|e| runtime("kernel call trapped", e))??;
        let mut stream = WasmStream { warm, packer };
        let options = stream.call(|g, s, p| g.call_options(s, p))?.into();
        Ok(StreamPacker::new(Box::new(stream), options))
    }

    fn limited_stream_packer(
        &self,
        options: &StreamOptions,
        limits: &StreamLimits,
    ) -> Result<LimitedStreamPacker, Error> {
        multi_stream::create(options, limits)
    }

    fn limited_stream_packer_from_state(&self, state: &[u8]) -> Result<LimitedStreamPacker, Error> {
        multi_stream::restore(state)
    }
}

/// A streaming packer living in an instance of its own (its state stays in the guest's
/// memory between calls; the resource is dropped with it).
struct WasmStream {
    warm: Warm,
    packer: ResourceAny,
}

impl std::fmt::Debug for WasmStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmStream").finish_non_exhaustive()
    }
}

impl WasmStream {
    fn call<R>(
        &mut self,
        f: impl FnOnce(&wstream::GuestPacker<'_>, &mut Store<Tracker>, ResourceAny) -> wasmtime::Result<R>,
    ) -> Result<R, Error> {
        let guest = self.warm.instance.stowplan_kernel_streaming();
        f(&guest.packer(), &mut self.warm.store, self.packer).map_err(|e| runtime("kernel call trapped", e))
    }
}

impl Drop for WasmStream {
    fn drop(&mut self) {
        // The instance goes with the store; dropping the handle first keeps the component's
        // resource table tidy. A failure here (a trapped instance) leaves nothing behind.
        let _ = self.packer.resource_drop(&mut self.warm.store);
    }
}

impl StreamBackend<ClosedBins> for WasmStream {
    fn add(&mut self, lengths: &[u64]) -> Result<ClosedBins, Error> {
        Ok(self.call(|g, s, p| g.call_add(s, p, lengths))??.into())
    }

    fn finish(&mut self) -> Result<ClosedBins, Error> {
        Ok(self.call(|g, s, p| g.call_finish(s, p))?.into())
    }

    fn state(&mut self) -> Result<Vec<u8>, Error> {
        self.call(|g, s, p| g.call_save(s, p))
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        Ok(self.call(|g, s, p| g.call_status(s, p))?.into())
    }
}
