//! The WASM backend: the embedded kernel component run by wasmtime, its warm instances and
//! the calls that take more than a line. The [`KernelApi`](super::KernelApi) methods are in
//! `api.rs`, beside the native backend's; the conversions come from `convert.rs`.
//!
//! The component is compiled once per process (from a precompiled artifact cached on disk
//! when possible) and instantiated per call from a shared `InstancePre` with an **empty
//! linker**: the kernel imports nothing.

use std::sync::OnceLock;

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

use stowplan_kernel::{
    AlignedPlan, ClosedBins, DistributeOptions, Distribution, LimitedClosedBins, NextFitRuns, PackMethod, PackOptions,
    Packing, RawPlan, StreamLimits, StreamOptions, StreamStatus,
};
use wasmtime::component::ResourceAny;

use super::{LimitedStreamPacker, StreamBackend, StreamPacker};
use crate::error::{Error, runtime};
use crate::runtime::{self, sha256_hex};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "kernel",
    });
}

pub(super) use bindings::exports::stowplan::kernel as wit;
pub(super) use bindings::exports::stowplan::kernel::{
    balance as wbal, layout as wlay, pack as wpack, peers as wpeers, plan as wplan, streaming as wstream,
    types as wtypes, verl as wverl,
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
    // kernel's own functions in a profile (BENCHMARKS.md, "WASM against native", has the recipe).
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
pub(super) fn with_instance<R>(
    f: impl FnOnce(&bindings::Kernel, &mut Store<Tracker>) -> wasmtime::Result<R>,
) -> Result<R, Error> {
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

/// The embedded component (its [`KernelApi`](super::KernelApi) methods are in `api.rs`,
/// beside the native backend's).
#[derive(Debug)]
pub(super) struct WasmKernel;

/// Runs a peer's function on a warm instance: the outer `Result` is a runtime failure of the
/// kernel, the inner one the peer's own result or how the peer fails (the Python exception it
/// raises, [`PyError`](stowplan_kernel::peers::verl::PyError) or slime's error).
pub(super) fn peer_call<W, T: From<W>, E, P: From<E>>(
    f: impl FnOnce(&bindings::Kernel, &mut Store<Tracker>) -> wasmtime::Result<Result<W, E>>,
) -> Result<Result<T, P>, Error> {
    Ok(with_instance(f)?.map(Into::into).map_err(Into::into))
}

/// [`KernelApi::pack`](super::KernelApi::pack). Next-fit's bins follow the input order: the
/// lengths go in as u32 when they fit and the bins come back as runs (half the bytes in, no
/// member list out), whose member lists are rebuilt here — the component still decides every
/// bin.
pub(super) fn pack(lengths: &[u64], options: &PackOptions) -> Result<Packing, Error> {
    if options.method == PackMethod::NextFit {
        let o: wpack::Options = options.into();
        let runs = with_warm(|w| {
            if !narrow_into(lengths, &mut w.narrow) {
                return Ok(None);
            }
            let r = w.instance.stowplan_kernel_pack().call_next_fit(
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

/// [`KernelApi::distribute`](super::KernelApi::distribute).
pub(super) fn distribute(lengths: &[u64], options: &DistributeOptions<'_>) -> Result<Distribution, Error> {
    let o = options.into();
    call(|i, s| i.stowplan_kernel_layout().call_distribute(s, lengths, &o)).map(Into::into)
}

/// [`KernelApi::aligned_plan`](super::KernelApi::aligned_plan): the raw plan's packs go in.
pub(super) fn aligned_plan(raw: &RawPlan, world_size: u32, drop_last: bool) -> Result<AlignedPlan, Error> {
    let packs = wtypes::Groups { offsets: raw.offsets.clone(), indices: raw.indices.clone() };
    Ok(call(|i, s| i.stowplan_kernel_plan().call_align_plan(s, &packs, world_size, drop_last))?.try_into()?)
}

/// [`KernelApi::stream_packer`](super::KernelApi::stream_packer): a packer in an instance of
/// its own.
pub(super) fn stream_packer(options: &StreamOptions) -> Result<StreamPacker, Error> {
    let stream = WasmStream::new(|i, s| i.stowplan_kernel_streaming().packer().call_create(s, options.into(), None))?;
    Ok(StreamPacker::new(Box::new(stream), *options))
}

/// [`KernelApi::stream_packer_from_state`](super::KernelApi::stream_packer_from_state), with
/// the options the guest reports. A limited packer's state is refused here, as the native
/// backend refuses it.
pub(super) fn stream_packer_from_state(state: &[u8]) -> Result<StreamPacker, Error> {
    let mut stream = restore(state, false)?;
    let options = stream.call(|g, s, p| g.call_options(s, p))?.into();
    Ok(StreamPacker::new(Box::new(stream), options))
}

/// [`KernelApi::limited_stream_packer`](super::KernelApi::limited_stream_packer).
pub(super) fn limited_stream_packer(
    options: &StreamOptions,
    limits: &StreamLimits,
) -> Result<LimitedStreamPacker, Error> {
    let l: wstream::Limits = limits.into();
    let stream =
        WasmStream::new(|i, s| i.stowplan_kernel_streaming().packer().call_create(s, options.into(), Some(&l)))?;
    stream.limited()
}

/// [`KernelApi::limited_stream_packer_from_state`](super::KernelApi::limited_stream_packer_from_state).
pub(super) fn limited_stream_packer_from_state(state: &[u8]) -> Result<LimitedStreamPacker, Error> {
    restore(state, true)?.limited()
}

/// A packer restored from `state` in a new instance, when `state` is of the kind asked for
/// (`limited`: `SPSL`), else the kernel's own refusal of the other kind.
fn restore(state: &[u8], limited: bool) -> Result<WasmStream, Error> {
    if stowplan_kernel::stream::is_limited_state(state) != limited {
        // The kernel's message for a state of the other kind, as the native backend gives it.
        let e = if limited {
            stowplan_kernel::LimitedStreamPacker::from_state(state).err()
        } else {
            stowplan_kernel::StreamPacker::from_state(state).err()
        };
        return Err(e.map_or_else(|| Error::Runtime("a stream-packer state of the other kind".into()), Into::into));
    }
    WasmStream::new(|i, s| i.stowplan_kernel_streaming().packer().call_restore(s, state))
}

/// A streaming packer living in an instance of its own (its state stays in the guest's
/// memory between calls; the resource is dropped with it): the component's one packer
/// resource, plain or limited.
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
    /// The packer resource that `f` makes (create or restore) in a new instance.
    fn new(
        f: impl FnOnce(&bindings::Kernel, &mut Store<Tracker>) -> wasmtime::Result<Result<ResourceAny, wtypes::Error>>,
    ) -> Result<Self, Error> {
        let mut warm = instantiate()?;
        let packer = f(&warm.instance, &mut warm.store).map_err(|e| runtime("kernel call trapped", e))??;
        Ok(WasmStream { warm, packer })
    }

    fn call<R>(
        &mut self,
        f: impl FnOnce(&wstream::GuestPacker<'_>, &mut Store<Tracker>, ResourceAny) -> wasmtime::Result<R>,
    ) -> Result<R, Error> {
        let guest = self.warm.instance.stowplan_kernel_streaming();
        f(&guest.packer(), &mut self.warm.store, self.packer).map_err(|e| runtime("kernel call trapped", e))
    }

    /// The host's limited wrapper, with the options and limits the guest reports.
    fn limited(mut self) -> Result<LimitedStreamPacker, Error> {
        let options = self.call(|g, s, p| g.call_options(s, p))?.into();
        let limits = self.call(|g, s, p| g.call_limits(s, p))?.map(Into::into).unwrap_or_default();
        Ok(LimitedStreamPacker::new(Box::new(self), options, limits))
    }
}

impl Drop for WasmStream {
    fn drop(&mut self) {
        // The instance goes with the store; dropping the handle first keeps the component's
        // resource table tidy. A failure here (a trapped instance) leaves nothing behind.
        let _ = self.packer.resource_drop(&mut self.warm.store);
    }
}

impl StreamBackend<LimitedClosedBins> for WasmStream {
    fn add(&mut self, rows: &[u64]) -> Result<LimitedClosedBins, Error> {
        Ok(self.call(|g, s, p| g.call_add(s, p, rows))??.into())
    }

    fn finish(&mut self) -> Result<LimitedClosedBins, Error> {
        Ok(self.call(|g, s, p| g.call_finish(s, p))?.into())
    }

    fn state(&mut self) -> Result<Vec<u8>, Error> {
        self.call(|g, s, p| g.call_save(s, p))
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        Ok(self.call(|g, s, p| g.call_status(s, p))?.into())
    }
}

/// A plain packer's bins: the limited calls' bins (the component sends no resource loads
/// for them).
impl StreamBackend<ClosedBins> for WasmStream {
    fn add(&mut self, lengths: &[u64]) -> Result<ClosedBins, Error> {
        StreamBackend::<LimitedClosedBins>::add(self, lengths).map(|c| c.closed)
    }

    fn finish(&mut self) -> Result<ClosedBins, Error> {
        StreamBackend::<LimitedClosedBins>::finish(self).map(|c| c.closed)
    }

    fn state(&mut self) -> Result<Vec<u8>, Error> {
        StreamBackend::<LimitedClosedBins>::state(self)
    }

    fn status(&mut self) -> Result<StreamStatus, Error> {
        StreamBackend::<LimitedClosedBins>::status(self)
    }
}
