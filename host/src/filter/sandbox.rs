//! The sandbox: the engine, its epoch ticker and the deny-all WASI linker, and the state of a
//! plugin's store (fixed clocks, captured output, memory and table bounds).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use wasmtime::component::{Linker, ResourceTable};
use wasmtime::{Config, Engine, StoreContextMut};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use crate::Error;

/// The epoch advances this often while any plugin call runs.
const TICK: Duration = Duration::from_millis(1);

pub(super) struct Runtime {
    pub(super) engine: Engine,
    pub(super) linker: Linker<PluginState>,
    /// Plugin calls in flight; the ticker sleeps (parked) while it is 0.
    active: Arc<AtomicUsize>,
    ticker: std::thread::Thread,
    /// The compiler's function cache, whose new entries are written after each compile.
    pub(super) functions: Option<Arc<crate::runtime::FunctionCache>>,
}

static RUNTIME: OnceLock<Result<Runtime, Error>> = OnceLock::new();

pub(super) fn runtime() -> Result<&'static Runtime, Error> {
    RUNTIME.get_or_init(init_runtime).as_ref().map_err(Clone::clone)
}

fn init_runtime() -> Result<Runtime, Error> {
    let fail = |what: &str, e: wasmtime::Error| Error::Runtime(format!("{what}: {e:?}"));
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.consume_fuel(true);
    // A plugin's traps (an out-of-bounds access, `unreachable`, a division by zero) are
    // explicit checks, not hardware faults caught by signal handlers: hosts such as Ray
    // install their own SIGSEGV/SIGILL handlers after ours, and a trapping plugin then
    // killed the whole process instead of failing its call. Plugins are small filters;
    // the checks cost them little. (Explicit bounds checks require the null-page spectre
    // guards off, which rely on a fault.)
    config.signals_based_traps(false);
    // SAFETY: both are documented Cranelift settings; they must be off without
    // signals-based traps (see `Config::signals_based_traps`).
    unsafe {
        config.cranelift_flag_set("enable_heap_access_spectre_mitigation", "false");
        config.cranelift_flag_set("enable_table_access_spectre_mitigation", "false");
    }
    // Functions another plugin compiled are reused (plugins built by one tool share an
    // engine: StarlingMonkey, CPython), from the compile cache's directory.
    let functions = crate::runtime::function_cache();
    if let Some(functions) = &functions {
        config.enable_incremental_compilation(functions.clone()).map_err(|e| fail("enabling the function cache", e))?;
    }
    let engine = Engine::new(&config).map_err(|e| fail("creating the plugin engine", e))?;
    if let Some(functions) = &functions {
        functions.attach(&engine);
    }
    let mut linker: Linker<PluginState> = Linker::new(&engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(|e| fail("adding WASI to the plugin linker", e))?;
    // Sleeping returns at once: with fixed clocks there is no time to wait for, and a
    // blocked host thread would escape the epoch deadline.
    linker.allow_shadowing(true);
    let mut clock = linker
        .instance("wasi:clocks/monotonic-clock@0.2.12")
        .map_err(|e| fail("opening wasi:clocks/monotonic-clock", e))?;
    for name in ["subscribe-duration", "subscribe-instant"] {
        clock
            .func_wrap(name, |mut cx: StoreContextMut<'_, PluginState>, (_,): (u64,)| {
                let table = &mut cx.data_mut().table;
                let ready = table.push(Ready)?;
                Ok((wasmtime_wasi::p2::subscribe(table, ready)?,))
            })
            .map_err(|e| fail("replacing wasi:clocks/monotonic-clock subscriptions", e))?;
    }
    linker.allow_shadowing(false);
    let active = Arc::new(AtomicUsize::new(0));
    let (ticking, ticking_engine) = (Arc::clone(&active), engine.clone());
    let handle = std::thread::Builder::new()
        .name("stowplan-plugin-epoch".to_string())
        .spawn(move || {
            // Catch up on every whole tick elapsed, so a late wake-up (a busy machine) does
            // not push deadlines back by its lateness again and again.
            let mut last = Instant::now();
            loop {
                if ticking.load(Ordering::Acquire) == 0 {
                    std::thread::park();
                    last = Instant::now();
                    continue;
                }
                std::thread::sleep(TICK);
                let due = (last.elapsed().as_micros() / TICK.as_micros()) as u32;
                for _ in 0..due {
                    ticking_engine.increment_epoch();
                }
                last += TICK * due;
            }
        })
        .map_err(|e| Error::Runtime(format!("starting the plugin epoch thread: {e}")))?;
    Ok(Runtime { engine, linker, active, ticker: handle.thread().clone(), functions })
}

/// Marks a plugin call in flight (the ticker runs) until dropped.
pub(super) struct InFlight<'a>(&'a Runtime);

impl<'a> InFlight<'a> {
    pub(super) fn new(rt: &'a Runtime) -> Self {
        if rt.active.fetch_add(1, Ordering::AcqRel) == 0 {
            rt.ticker.unpark();
        }
        InFlight(rt)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A pollable that is always ready (what the sandbox's clocks subscribe with).
struct Ready;

#[wasmtime_wasi::async_trait]
impl Pollable for Ready {
    async fn ready(&mut self) {}
}

/// Clocks fixed at 0.
pub(super) struct FixedClock;

impl HostWallClock for FixedClock {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FixedClock {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

/// Captured output of one stream: bytes up to a cap, the rest counted.
#[derive(Default, Debug)]
struct Captured {
    bytes: Vec<u8>,
    dropped: u64,
    cap: usize,
}

/// stdout or stderr of a plugin: never blocks, never fails, keeps at most `cap` bytes.
#[derive(Clone, Debug)]
pub(super) struct Capture(Arc<Mutex<Captured>>);

impl Capture {
    pub(super) fn new(cap: usize) -> Self {
        Capture(Arc::new(Mutex::new(Captured { cap, ..Captured::default() })))
    }

    fn push(&self, bytes: &[u8]) {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let room = c.cap.saturating_sub(c.bytes.len()).min(bytes.len());
        c.bytes.extend_from_slice(&bytes[..room]);
        c.dropped += (bytes.len() - room) as u64;
    }

    /// The text captured since the last take, with a note of what was dropped.
    pub(super) fn take(&self) -> Option<String> {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if c.bytes.is_empty() && c.dropped == 0 {
            return None;
        }
        let mut text = String::from_utf8_lossy(&c.bytes).into_owned();
        if c.dropped > 0 {
            text.push_str(&format!("\n[… {} more bytes dropped: output limit {} bytes]", c.dropped, c.cap));
        }
        c.bytes.clear();
        c.dropped = 0;
        Some(text)
    }
}

impl IsTerminal for Capture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capture {
    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }

    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for Capture {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.push(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }
    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 << 10)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capture {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Capture {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.push(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Memory and table bounds of a store; remembers whether a growth was refused.
pub(super) struct Limiter {
    pub(super) memory_limit: usize,
    pub(super) hit: bool,
}

impl wasmtime::ResourceLimiter for Limiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.hit = true;
            wasmtime::bail!("memory would grow to {desired} bytes, past the limit of {} bytes", self.memory_limit);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired.saturating_mul(8) > self.memory_limit {
            self.hit = true;
            wasmtime::bail!("a table would grow to {desired} elements, past the memory limit");
        }
        Ok(true)
    }
}

/// The state of a plugin's store.
pub(super) struct PluginState {
    pub(super) wasi: WasiCtx,
    pub(super) table: ResourceTable,
    pub(super) limiter: Limiter,
    /// When the current call must stop (`None`: no limit).
    pub(super) deadline: Option<Instant>,
}

/// Epoch ticks covering `d`, plus one for the tick in progress.
pub(super) fn ticks_for(d: Duration) -> u64 {
    d.as_micros().div_ceil(TICK.as_micros()) as u64 + 1
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The constant the sandbox's random sources repeat.
pub(super) const SEED: [u8; 8] = *b"stowplan";
