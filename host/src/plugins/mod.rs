//! Buffer-filter plugins: WebAssembly components of the world `stowplan:filter/buffer-filter`
//! (`wit/filter/filter.wit`) run in a sandbox.
//!
//! - **Pinned**: [`WasmFilter::load`] refuses a file whose sha256 is not the one given
//!   ([`FilterError::HashMismatch`]).
//! - **Compiled once**: the component is precompiled and cached on disk by its sha256 and
//!   the engine's compatibility hash (the cache of the kernel, [`cache_dir`](crate::cache_dir)).
//! - **Bounded**: every call (and every instantiation) runs with a fuel budget and an epoch
//!   deadline (a ticker thread advances the epoch every millisecond while a call runs), and
//!   in a store whose memory cannot grow past the limit (growth past it traps).
//! - **No capabilities**: the only imports a plugin may have are WASI's, and its WASI denies
//!   everything: no preopened directories, no environment or arguments, no network, an
//!   empty stdin, wall and monotonic clocks fixed at 0 (sleeps return at once, so a plugin
//!   cannot block the host), randomness from a constant seed. stdout and stderr are captured
//!   up to [`FilterOptions::output_limit`] bytes per call and logged (target
//!   `stowplan::plugin`).
//! - **Checked**: every selection is validated ([`validate_selection`](crate::rollout::validate_selection)).
//! - **Contained**: an instance that trapped is discarded and the next call gets a fresh one.
//!   [`OnFailure::Fallback`] turns any failure into a FIFO selection with a warning.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime::{Config, Engine, Store, StoreContextMut, UpdateDeadline};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use crate::error::{FilterError, excerpt};
pub use crate::rollout::columns::synthetic_buffer;
use crate::rollout::{BufferColumns, BufferFilter, BufferView, FilterContext, PopFirst, validate_selection};
use crate::{Error, sha256_hex};

use crate::rollout::columns::wit as bindings;
use bindings::stowplan::filter::types as wt;

/// The epoch advances this often while any plugin call runs.
const TICK: Duration = Duration::from_millis(1);

/// What happens when a plugin call fails (any [`FilterError`] at call time).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnFailure {
    /// The request fails with the error; nothing leaves the buffer (the default).
    #[default]
    Error,
    /// The request is served first-in-first-out instead, with a warning in the log.
    Fallback,
}

impl std::str::FromStr for OnFailure {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "error" => Ok(OnFailure::Error),
            "fallback" => Ok(OnFailure::Fallback),
            other => Err(Error::InvalidArgument(format!("on_failure must be error or fallback (got {other:?})"))),
        }
    }
}

/// Bytes of a plugin file at most, by default (`FilterOptions::max_plugin_bytes`,
/// `stowplan filter … --max-plugin-mib`): a JavaScript plugin embeds a 12 MB engine and a
/// Python one a CPython of about 40 MB; a file past the cap is refused after reading at most
/// one byte more, so a device or a growing file cannot exhaust memory.
pub const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// Reads a plugin file of at most `max_bytes` bytes, hashing it as it is read: its bytes and
/// their sha256 (hex). Errors: `invalid-argument` naming the file and the cap when it is
/// larger (or `max_bytes` is 0); `io` naming the file.
pub fn read_plugin(path: &Path, max_bytes: u64) -> Result<(Vec<u8>, String), Error> {
    let mut bytes = Vec::new();
    let sha256 = stream_plugin(path, max_bytes, |chunk| bytes.extend_from_slice(chunk))?;
    Ok((bytes, sha256))
}

/// The sha256 (hex) of a plugin file of at most `max_bytes` bytes, streamed (memory stays at
/// one buffer whatever the size): the pin to load it with. Errors: those of [`read_plugin`].
pub fn hash_plugin(path: &Path, max_bytes: u64) -> Result<String, Error> {
    stream_plugin(path, max_bytes, |_| {})
}

fn stream_plugin(path: &Path, max_bytes: u64, mut keep: impl FnMut(&[u8])) -> Result<String, Error> {
    use sha2::Digest;
    use std::io::Read;
    if max_bytes == 0 {
        return Err(Error::InvalidArgument("max_plugin_bytes must be at least 1 (got 0)".into()));
    }
    let io = |e| crate::error::io("reading the plugin", path, e);
    let mut file = std::fs::File::open(path).map_err(io)?.take(max_bytes.saturating_add(1));
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io(e)),
        };
        total += n as u64;
        if total > max_bytes {
            return Err(plugin_too_large(&path.display().to_string(), max_bytes));
        }
        hasher.update(&buf[..n]);
        keep(&buf[..n]);
    }
    Ok(crate::runtime::hex(&hasher.finalize()))
}

fn plugin_too_large(name: &str, max_bytes: u64) -> Error {
    Error::InvalidArgument(format!(
        "{name}: the plugin file is larger than max_plugin_bytes ({max_bytes} bytes; stowplan filter \
         --max-plugin-mib): is it a plugin component?"
    ))
}

/// How a plugin is loaded and bounded. [`FilterOptions::new`] gives the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilterOptions {
    /// The sha256 (64 hex digits, optionally prefixed `sha256:`) the file must have.
    pub sha256: String,
    /// The plugin's configuration, JSON text passed to every call (default `{}`).
    pub config: String,
    /// Wall-clock deadline per call, 1 ms ..= 10 min (default 1 s).
    pub timeout: Duration,
    /// Fuel per call (about one unit per WebAssembly instruction), `None` for no fuel bound
    /// (the deadline still applies); at least 10,000 (default 10^9).
    pub fuel: Option<u64>,
    /// Most bytes of linear memory (and table elements ×8) the plugin may hold, 1 MiB ..=
    /// 4 GiB (default 256 MiB).
    pub memory_limit: usize,
    /// Most bytes of stdout and of stderr kept per call; the rest is dropped and counted
    /// (default 64 KiB; at most 16 MiB).
    pub output_limit: usize,
    /// What a failed call does (default [`OnFailure::Error`]).
    pub on_failure: OnFailure,
    /// Bytes of the plugin file at most (default [`MAX_PLUGIN_BYTES`]).
    pub max_plugin_bytes: u64,
}

impl FilterOptions {
    /// Defaults (see the fields), pinned to `sha256`.
    pub fn new(sha256: &str) -> Self {
        Self {
            sha256: sha256.to_string(),
            config: "{}".to_string(),
            timeout: Duration::from_secs(1),
            fuel: Some(1_000_000_000),
            memory_limit: 256 << 20,
            output_limit: 64 << 10,
            on_failure: OnFailure::Error,
            max_plugin_bytes: MAX_PLUGIN_BYTES,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if !(Duration::from_millis(1)..=Duration::from_secs(600)).contains(&self.timeout) {
            return bad(format!("timeout must be in 1 ms ..= 600 s (got {:?})", self.timeout));
        }
        if self.fuel.is_some_and(|f| f < 10_000) {
            return bad(format!("fuel must be at least 10000 or none (got {:?})", self.fuel));
        }
        if !((1 << 20)..=(4usize << 30)).contains(&self.memory_limit) {
            return bad(format!("memory_limit must be in 1 MiB ..= 4 GiB (got {} bytes)", self.memory_limit));
        }
        if self.output_limit > 16 << 20 {
            return bad(format!("output_limit must be at most 16 MiB (got {} bytes)", self.output_limit));
        }
        match serde_json::from_str::<serde_json::Value>(&self.config) {
            Ok(_) => Ok(()),
            Err(e) => bad(format!("config must be JSON text (got {:?}: {e})", self.config)),
        }
    }
}

/// Normalizes a pin: 64 lowercase hex digits, an optional `sha256:` prefix removed.
fn pin(sha256: &str) -> Result<String, Error> {
    let hex = sha256.trim().strip_prefix("sha256:").unwrap_or(sha256.trim()).to_ascii_lowercase();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::InvalidArgument(format!(
            "sha256 must be 64 hex digits, optionally prefixed sha256: (got {sha256:?}); \
             `stowplan filter hash PLUGIN.wasm` prints it"
        )));
    }
    Ok(hex)
}

// ---------------------------------------------------------------------------------------
// The engine, its epoch ticker and the deny-all WASI linker.

struct Runtime {
    engine: Engine,
    linker: Linker<PluginState>,
    /// Plugin calls in flight; the ticker sleeps (parked) while it is 0.
    active: Arc<AtomicUsize>,
    ticker: std::thread::Thread,
}

static RUNTIME: OnceLock<Result<Runtime, Error>> = OnceLock::new();

fn runtime() -> Result<&'static Runtime, Error> {
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
    let engine = Engine::new(&config).map_err(|e| fail("creating the plugin engine", e))?;
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
    Ok(Runtime { engine, linker, active, ticker: handle.thread().clone() })
}

/// Marks a plugin call in flight (the ticker runs) until dropped.
struct InFlight<'a>(&'a Runtime);

impl<'a> InFlight<'a> {
    fn new(rt: &'a Runtime) -> Self {
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
struct FixedClock;

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
struct Capture(Arc<Mutex<Captured>>);

impl Capture {
    fn new(cap: usize) -> Self {
        Capture(Arc::new(Mutex::new(Captured { cap, ..Captured::default() })))
    }

    fn push(&self, bytes: &[u8]) {
        let mut c = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let room = c.cap.saturating_sub(c.bytes.len()).min(bytes.len());
        c.bytes.extend_from_slice(&bytes[..room]);
        c.dropped += (bytes.len() - room) as u64;
    }

    /// The text captured since the last take, with a note of what was dropped.
    fn take(&self) -> Option<String> {
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
struct Limiter {
    memory_limit: usize,
    hit: bool,
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
struct PluginState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
    /// When the current call must stop (`None`: no limit).
    deadline: Option<Instant>,
}

/// Epoch ticks covering `d`, plus one for the tick in progress.
fn ticks_for(d: Duration) -> u64 {
    d.as_micros().div_ceil(TICK.as_micros()) as u64 + 1
}

impl WasiView for PluginState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

// ---------------------------------------------------------------------------------------
// The filter.

/// A live instance, reused while nothing traps.
struct Live {
    store: Store<PluginState>,
    filter: bindings::BufferFilter,
}

/// Counters of a [`WasmFilter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FilterStats {
    /// Calls made.
    pub calls: u64,
    /// Calls that failed (any [`FilterError`]).
    pub failures: u64,
    /// Failed calls answered FIFO instead ([`OnFailure::Fallback`]).
    pub fallbacks: u64,
    /// Instances made (1 + instances replaced after a trap).
    pub instances: u64,
}

/// A buffer-filter plugin loaded into the sandbox (see the module docs). Implements
/// [`BufferFilter`], so it plugs into [`crate::DataSource::get_samples`].
pub struct WasmFilter {
    name: String,
    sha256: String,
    options: FilterOptions,
    pre: bindings::BufferFilterPre<PluginState>,
    imports: Vec<String>,
    origin: &'static str,
    live: Option<Live>,
    stdout: Capture,
    stderr: Capture,
    last_output: Vec<(&'static str, String)>,
    stats: FilterStats,
}

impl std::fmt::Debug for WasmFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmFilter")
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .field("options", &self.options)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl WasmFilter {
    /// Loads the plugin at `path`. Errors: [`Error::Io`] (unreadable file),
    /// [`Error::InvalidArgument`] (options out of range, naming the option; a file over
    /// `max_plugin_bytes`, refused without reading it whole),
    /// [`FilterError::HashMismatch`] (the file is not the pinned one), [`FilterError::Load`]
    /// (not a component, not the `buffer-filter` world, or imports beyond WASI), and the
    /// call errors of [`FilterError`] for a plugin that fails while instantiating.
    pub fn load(path: &Path, options: FilterOptions) -> Result<Self, Error> {
        let (bytes, sha256) = read_plugin(path, options.max_plugin_bytes)?;
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "plugin".into());
        Self::from_hashed(&name, &bytes, &sha256, options)
    }

    /// Like [`Self::load`], from the component's bytes; `name` labels errors and logs.
    pub fn from_bytes(name: &str, bytes: &[u8], options: FilterOptions) -> Result<Self, Error> {
        Self::from_hashed(name, bytes, &sha256_hex(bytes), options)
    }

    /// [`Self::from_bytes`] with the bytes' sha256 (hex) already computed by [`read_plugin`], so
    /// that [`Self::load`] does not hash a large plugin twice. Private: the pin check trusts
    /// `actual`.
    fn from_hashed(name: &str, bytes: &[u8], actual: &str, options: FilterOptions) -> Result<Self, Error> {
        options.validate()?;
        if bytes.len() as u64 > options.max_plugin_bytes {
            return Err(plugin_too_large(name, options.max_plugin_bytes));
        }
        let expected = pin(&options.sha256)?;
        if actual != expected {
            return Err(FilterError::HashMismatch(format!(
                "{name}: sha256 is {actual}, but {expected} was pinned; check the file (or pin the new hash if \
                 the change is intended)"
            ))
            .into());
        }
        // Refused before compiling (a large plugin takes tens of seconds to compile): not a
        // component, or imports beyond WASI.
        let declared = declared_imports(bytes).map_err(|m| FilterError::Load(format!("{name}: {m}")))?;
        let foreign: Vec<&String> = declared.iter().filter(|i| !allowed_import(i)).collect();
        if !foreign.is_empty() {
            return Err(FilterError::Load(format!(
                "{name}: a plugin may import only WASI 0.2 interfaces (wasi:…@0.2.x) and {FILTER_TYPES}…; it \
                 also imports {foreign:?}"
            ))
            .into());
        }
        let rt = runtime()?;
        let load = |what: &str, e: wasmtime::Error| Error::from(FilterError::Load(format!("{name}: {what}: {e:#}")));
        let (component, origin) = crate::runtime::load_cached(&rt.engine, bytes, actual, "plugin")
            .map_err(|e| load("not a WebAssembly component this host can compile", e))?;
        let imports = imports(&rt.engine, &component);
        let pre = rt.linker.instantiate_pre(&component).map_err(|e| {
            load(
                &format!("its imports are not all WASI 0.2 (a plugin may import nothing else; it imports {imports:?})"),
                e,
            )
        })?;
        let pre = bindings::BufferFilterPre::new(pre).map_err(|e| {
            load("it does not export `filter.select` of the world stowplan:filter/buffer-filter@0.1.0", e)
        })?;
        let mut filter = Self {
            name: name.to_string(),
            sha256: actual.to_string(),
            stdout: Capture::new(options.output_limit),
            stderr: Capture::new(options.output_limit),
            options,
            pre,
            imports,
            origin,
            live: None,
            last_output: Vec::new(),
            stats: FilterStats::default(),
        };
        // Instantiate now, so a plugin that cannot even start fails at load time.
        let live = filter.instantiate().map_err(Error::from)?;
        filter.live = Some(live);
        Ok(filter)
    }

    /// The plugin's name (its file name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The sha256 (hex) of the component.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The options it was loaded with.
    pub fn options(&self) -> &FilterOptions {
        &self.options
    }

    /// The component's imports (WASI interfaces), as `name` strings.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }

    /// Where the compiled code came from: `cache` (precompiled earlier) or `compiled`.
    pub fn origin(&self) -> &'static str {
        self.origin
    }

    /// Counters: calls, failures, fallbacks, instances made.
    pub fn stats(&self) -> FilterStats {
        self.stats
    }

    /// What the last call (or instantiation) wrote: `("stdout" | "stderr", text)`.
    pub fn last_output(&self) -> &[(&'static str, String)] {
        &self.last_output
    }

    fn begin(&self, store: &mut Store<PluginState>) -> Result<(), FilterError> {
        store
            .set_fuel(self.options.fuel.unwrap_or(u64::MAX))
            .map_err(|e| FilterError::Trap(format!("{}: setting fuel: {e}", self.name)))?;
        store.data_mut().deadline = Instant::now().checked_add(self.options.timeout);
        store.set_epoch_deadline(ticks_for(self.options.timeout));
        Ok(())
    }

    fn instantiate(&mut self) -> Result<Live, FilterError> {
        let rt = runtime().map_err(|e| FilterError::Load(e.to_string()))?;
        let wasi = WasiCtxBuilder::new()
            .stdout(self.stdout.clone())
            .stderr(self.stderr.clone())
            .wall_clock(FixedClock)
            .monotonic_clock(FixedClock)
            .secure_random(wasmtime_wasi::Deterministic::new(SEED.to_vec()))
            .insecure_random(wasmtime_wasi::Deterministic::new(SEED.to_vec()))
            .insecure_random_seed(0x5354_4f57_504c_414e)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let state = PluginState {
            wasi,
            table: ResourceTable::new(),
            limiter: Limiter { memory_limit: self.options.memory_limit, hit: false },
            deadline: None,
        };
        let mut store = Store::new(&rt.engine, state);
        store.limiter(|s| &mut s.limiter);
        // The epoch count may lag real time (the ticker catches up after a late wake-up, and
        // ticks of before the call can land in it): the clock decides, so a call is never
        // stopped before its timeout.
        store.epoch_deadline_callback(|ctx| {
            let left = ctx.data().deadline.map(|d| d.saturating_duration_since(Instant::now()));
            Ok(match left {
                Some(left) if left.is_zero() => UpdateDeadline::Interrupt,
                Some(left) => UpdateDeadline::Continue(ticks_for(left)),
                None => UpdateDeadline::Continue(u64::MAX / 2),
            })
        });
        self.begin(&mut store)?;
        self.stats.instances += 1;
        let _in_flight = InFlight::new(rt);
        let started = Instant::now();
        let result = self.pre.instantiate(&mut store);
        self.collect_output();
        match result {
            Ok(filter) => Ok(Live { store, filter }),
            Err(e) => Err(self.classify(&e, store.data().limiter.hit, started.elapsed(), "instantiating")),
        }
    }

    fn collect_output(&mut self) {
        self.last_output.clear();
        for (stream, capture) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if let Some(text) = capture.take() {
                tracing::info!(target: "stowplan::plugin", plugin = %self.name, stream, "{text}");
                self.last_output.push((stream, text));
            }
        }
    }

    /// Names a trap: deadline, fuel, memory limit, exit, or another trap with its message.
    fn classify(&self, e: &wasmtime::Error, memory_hit: bool, elapsed: Duration, doing: &str) -> FilterError {
        let name = &self.name;
        if memory_hit {
            return FilterError::MemoryLimit(format!(
                "{name}: {doing} tried to grow memory past memory_limit = {} bytes",
                self.options.memory_limit
            ));
        }
        match e.downcast_ref::<wasmtime::Trap>() {
            Some(wasmtime::Trap::Interrupt) => {
                return FilterError::Timeout(format!(
                    "{name}: {doing} ran past timeout = {:?} (stopped after {elapsed:.1?})",
                    self.options.timeout
                ));
            }
            Some(wasmtime::Trap::OutOfFuel) => {
                return FilterError::OutOfFuel(format!(
                    "{name}: {doing} used up fuel = {} (after {elapsed:.1?})",
                    self.options.fuel.unwrap_or(u64::MAX)
                ));
            }
            _ => {}
        }
        if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
            return FilterError::Trap(format!("{name}: {doing}: the plugin called exit({})", exit.0));
        }
        let stderr = self
            .last_output
            .iter()
            .find(|(s, _)| *s == "stderr")
            .map(|(_, t)| format!("; stderr: {}", t.trim()))
            .unwrap_or_default();
        FilterError::Trap(format!("{name}: {doing} trapped: {e:#}{stderr}"))
    }

    /// One sandboxed call: the plugin's selection, validated, or a typed error. The buffer is
    /// never touched here.
    pub fn try_select(&mut self, ctx: &FilterContext, buffer: &BufferColumns) -> Result<Vec<u32>, FilterError> {
        self.stats.calls += 1;
        let result = self.call(ctx, buffer);
        if result.is_err() {
            self.stats.failures += 1;
        }
        result
    }

    fn call(&mut self, ctx: &FilterContext, buffer: &BufferColumns) -> Result<Vec<u32>, FilterError> {
        let rt = runtime().map_err(|e| FilterError::Load(e.to_string()))?;
        let mut live = match self.live.take() {
            Some(live) => live,
            None => self.instantiate()?,
        };
        let wctx = wt::Context {
            rollout_id: ctx.rollout_id,
            wanted: ctx.wanted,
            n_samples_per_prompt: ctx.n_samples_per_prompt,
            config: self.options.config.clone(),
        };
        self.begin(&mut live.store)?;
        let started = Instant::now();
        let result = {
            let _in_flight = InFlight::new(rt);
            live.filter.stowplan_filter_filter().call_select(&mut live.store, &wctx, &buffer.0)
        };
        let elapsed = started.elapsed();
        self.collect_output();
        match result {
            Ok(answer) => {
                self.live = Some(live);
                let picks = answer.map_err(|m| {
                    FilterError::Guest(format!("{}: {}", self.name, excerpt(&m, self.options.output_limit)))
                })?;
                validate_selection(&picks, buffer.groups(), ctx.wanted).map_err(|e| match e {
                    Error::Filter(FilterError::InvalidResult(m)) => {
                        FilterError::InvalidResult(format!("{}: {m}", self.name))
                    }
                    other => FilterError::InvalidResult(format!("{}: {other}", self.name)),
                })?;
                Ok(picks)
            }
            // The instance is dropped: the next call makes a fresh one.
            Err(e) => Err(self.classify(&e, live.store.data().limiter.hit, elapsed, "select")),
        }
    }
}

/// The constant the sandbox's random sources repeat.
const SEED: [u8; 8] = *b"stowplan";

impl BufferFilter for WasmFilter {
    fn select(&mut self, ctx: &FilterContext, buffer: BufferView<'_>) -> Result<Vec<u32>, Error> {
        match self.try_select(ctx, buffer.columns) {
            Ok(picks) => Ok(picks),
            Err(e) if self.options.on_failure == OnFailure::Fallback => {
                self.stats.fallbacks += 1;
                tracing::warn!(target: "stowplan::plugin", plugin = %self.name, "{e}; serving first-in-first-out instead (on_failure = fallback)");
                PopFirst.select(ctx, buffer)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The filter package's types-only interface, which toolchains may list as an import.
const FILTER_TYPES: &str = "stowplan:filter/types@";

/// Whether a plugin may import `name`: a WASI 0.2 interface or the filter's types (the
/// linker then checks each WASI interface exactly).
fn allowed_import(name: &str) -> bool {
    (name.starts_with("wasi:") && name.contains("@0.2.")) || name.starts_with(FILTER_TYPES)
}

/// The names a component's top level imports, read from its bytes without compiling them;
/// an error if the bytes are not a WebAssembly component.
fn declared_imports(bytes: &[u8]) -> Result<Vec<String>, String> {
    use wasmparser::{Encoding, Parser, Payload};
    let mut names = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| format!("not a WebAssembly component: {e}"))? {
            Payload::Version { encoding, .. } if depth == 0 && encoding != Encoding::Component => {
                return Err(
                    "not a WebAssembly component (a core module: wrap it with `wasm-tools component new`)".into()
                );
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 0 => {
                for import in reader {
                    let import = import.map_err(|e| format!("not a WebAssembly component: {e}"))?;
                    names.push(import.name.name.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(names)
}

/// The component's imports as names (`wasi:cli/environment@0.2.0`, …).
fn imports(engine: &Engine, component: &Component) -> Vec<String> {
    component.component_type().imports(engine).map(|(name, _)| name.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_texts_are_cut_to_the_output_limit_at_a_character_boundary() {
        assert_eq!(excerpt("short", 10), "short");
        let long = "é".repeat(10);
        assert_eq!(excerpt(&long, 5), "éé… (20 bytes, the first 4 shown)");
    }

    #[test]
    fn imports_are_read_without_compiling() {
        // A component whose only import is a type named like an interface of another package.
        let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
        let name = b"foo:bar/baz";
        let body: Vec<u8> = [&[1u8, 0, name.len() as u8][..], name, &[3, 1]].concat();
        bytes.extend_from_slice(&[10, body.len() as u8]);
        bytes.extend_from_slice(&body);
        assert_eq!(declared_imports(&bytes), Ok(vec!["foo:bar/baz".to_string()]));
        assert!(!allowed_import("foo:bar/baz") && allowed_import("wasi:io/streams@0.2.0"));
        assert!(!allowed_import("wasi:io/streams@0.3.0") && !allowed_import("wasi:io/streams"));
        let e = WasmFilter::from_bytes("foreign.wasm", &bytes, FilterOptions::new(&sha256_hex(&bytes))).unwrap_err();
        assert!(e.to_string().contains("it also imports [\"foo:bar/baz\"]"), "{e}");
        // A core module is refused as such, before compiling.
        let module = b"\0asm\x01\x00\x00\x00";
        assert!(declared_imports(module).unwrap_err().contains("a core module"));
    }
}
