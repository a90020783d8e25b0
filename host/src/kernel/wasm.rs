//! The WASM backend: the embedded kernel component run by wasmtime.
//!
//! The component is compiled once per process (from a precompiled artifact cached on disk
//! when possible) and instantiated per call from a shared `InstancePre` with an **empty
//! linker**: the kernel imports nothing.

use std::path::PathBuf;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, Store};

use crate::error::{Error, runtime};

mod bindings {
    wasmtime::component::bindgen!({
        path: "wit",
        world: "kernel",
    });
}

pub(crate) use bindings::exports::stowplan::kernel::{
    balance as wbal, layout as wlay, pack as wpack, partition as wpart, peers as wpeers, plan as wplan,
    types as wtypes, verl as wverl,
};

/// The kernel component, built by `cargo xtask build-kernel` (see `ARCHITECTURE.md`).
pub const KERNEL_WASM: &[u8] = include_bytes!("../assets/stowplan_kernel.wasm");

/// The sha256 (hex) recorded when the component was built.
pub const KERNEL_WASM_SHA256: &str = include_str!("../assets/stowplan_kernel.wasm.sha256");

/// Hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) pre: bindings::KernelPre<Tracker>,
    /// Where the compiled component came from: `cache` or `compiled`.
    pub(crate) origin: &'static str,
}

static SHARED: OnceLock<Result<Shared, Error>> = OnceLock::new();

/// The process-wide engine and pre-instantiated kernel, built on first use.
pub(crate) fn shared() -> Result<&'static Shared, Error> {
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
    let engine = Engine::new(&config).map_err(|e| runtime("creating the wasmtime engine", e))?;
    let (component, origin) = load_component(&engine, &actual)?;
    let linker: Linker<Tracker> = Linker::new(&engine);
    let instance_pre = linker
        .instantiate_pre(&component)
        .map_err(|e| runtime("pre-instantiating the kernel (it must import nothing)", e))?;
    let pre = bindings::KernelPre::new(instance_pre).map_err(|e| runtime("binding the kernel's exports", e))?;
    Ok(Shared { engine, pre, origin })
}

/// The cache directory for precompiled components: `$STOWPLAN_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/stowplan`, else `$HOME/.cache/stowplan`; `None` when
/// `STOWPLAN_NO_CACHE` is set (to anything but empty or `0`) or no location is known.
pub fn cache_dir() -> Option<PathBuf> {
    if std::env::var("STOWPLAN_NO_CACHE").is_ok_and(|v| !v.is_empty() && v != "0") {
        return None;
    }
    if let Some(d) = std::env::var_os("STOWPLAN_CACHE_DIR") {
        return Some(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("stowplan"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("stowplan"))
}

/// Compiles the component, or loads the precompiled artifact cached under a name made of the
/// component's sha256 and the engine's compatibility hash. A cached artifact is used only if
/// its own recorded sha256 matches; a broken cache entry is rebuilt, never fatal.
fn load_component(engine: &Engine, wasm_sha: &str) -> Result<(Component, &'static str), Error> {
    load_cached(engine, KERNEL_WASM, wasm_sha, "kernel").map_err(|e| runtime("compiling the kernel component", e))
}

/// Compiles `bytes` (a component whose sha256 is `wasm_sha`) for `engine`, or loads the
/// artifact precompiled earlier from the cache directory ([`cache_dir`]), named
/// `{prefix}-{sha256[..16]}-{engine compatibility hash}.cwasm`. A cached artifact is used only
/// if the sha256 recorded beside it matches its bytes; a broken or unwritable cache is never
/// fatal. Returns where the component came from: `cache` or `compiled`.
pub(crate) fn load_cached(
    engine: &Engine,
    bytes: &[u8],
    wasm_sha: &str,
    prefix: &str,
) -> wasmtime::Result<(Component, &'static str)> {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    let name = format!("{prefix}-{}-{:016x}.cwasm", &wasm_sha[..16], h.finish());
    let path = cache_dir().map(|d| d.join(name));
    if let Some(path) = &path {
        if let (Ok(cached), Ok(sum)) = (std::fs::read(path), std::fs::read_to_string(path.with_extension("sha256"))) {
            if sha256_hex(&cached) == sum.trim() {
                // SAFETY: the bytes are an artifact this code wrote with
                // `Engine::precompile_component` for an engine with the same compatibility
                // hash, and their sha256 matches the one recorded next to them.
                match unsafe { Component::deserialize(engine, &cached) } {
                    Ok(c) => return Ok((c, "cache")),
                    Err(e) => tracing::warn!(path = %path.display(), "ignoring an unusable cached component: {e:?}"),
                }
            }
        }
    }
    let compiled = engine.precompile_component(bytes)?;
    if let Some(path) = &path {
        if let Err(e) = write_atomically(path, &compiled) {
            tracing::debug!(path = %path.display(), "not caching the compiled component: {e}");
        }
    }
    // SAFETY: `compiled` was just produced by `precompile_component` on this engine.
    let component = unsafe { Component::deserialize(engine, &compiled) }?;
    Ok((component, "compiled"))
}

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::write(path.with_extension("sha256.tmp"), sha256_hex(bytes))?;
    std::fs::rename(&tmp, path)?;
    std::fs::rename(path.with_extension("sha256.tmp"), path.with_extension("sha256"))?;
    Ok(())
}

/// Per-store state: tracks the size of the instance's linear memory.
#[derive(Default)]
pub(crate) struct Tracker {
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

/// A warm instance kept for the next call on the same thread.
struct Warm {
    store: Store<Tracker>,
    instance: bindings::Kernel,
}

/// An instance whose linear memory grew beyond this is dropped after its call instead of
/// being kept warm, so an occasional huge call does not pin its memory for the thread's life.
pub const RETAIN_MEMORY_BYTES: usize = 256 << 20;

thread_local! {
    static WARM: std::cell::RefCell<Option<Warm>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` on this thread's warm instance of the kernel (made from the shared
/// pre-instantiation on first use). The kernel is pure, so reusing an instance cannot change
/// a result; an instance that trapped is discarded, never reused.
pub(crate) fn with_instance<R>(
    f: impl FnOnce(&bindings::Kernel, &mut Store<Tracker>) -> wasmtime::Result<R>,
) -> Result<R, Error> {
    let shared = shared()?;
    let warm = WARM.with(|w| w.borrow_mut().take());
    let mut warm = match warm {
        Some(w) => w,
        None => {
            let mut store = Store::new(&shared.engine, Tracker::default());
            store.limiter(|t| t);
            let instance = shared.pre.instantiate(&mut store).map_err(|e| runtime("instantiating the kernel", e))?;
            Warm { store, instance }
        }
    };
    let result = f(&warm.instance, &mut warm.store).map_err(|e| runtime("kernel call trapped", e))?;
    if warm.store.data().memory_bytes <= RETAIN_MEMORY_BYTES {
        WARM.with(|w| *w.borrow_mut() = Some(warm));
    }
    Ok(result)
}

pub(crate) fn error(e: wtypes::Error) -> Error {
    match e {
        wtypes::Error::InvalidArgument(m) => Error::InvalidArgument(m),
        wtypes::Error::Infeasible(m) => Error::Infeasible(m),
    }
}

/// The flat groups of a WIT result as (offsets, indices).
pub(crate) fn flat(g: wtypes::Groups) -> (Vec<u32>, Vec<u32>) {
    (g.offsets, g.indices)
}
