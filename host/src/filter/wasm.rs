//! The filter: a loaded plugin ([`Filter`]), its instances and calls, and its counters.

use std::path::Path;
use std::time::{Duration, Instant};

use wasmtime::component::ResourceTable;
use wasmtime::{Store, UpdateDeadline};
use wasmtime_wasi::WasiCtxBuilder;

use super::file::{pin, plugin_too_large, read_plugin};
use super::imports::{FILTER_TYPES, allowed_import, declared_imports, imports};
use super::sandbox::{Capture, FixedClock, InFlight, Limiter, PluginState, SEED, runtime, ticks_for};
use super::{FilterOptions, OnFailure};
use crate::Error;
use crate::error::{FilterError, excerpt};
use crate::runtime::sha256_hex;
use crate::source::columns::wit as bindings;
use crate::source::{BufferColumns, BufferFilter, BufferView, FilterContext, PopFirst, validate_selection};
use bindings::stowplan::filter::types as wt;

/// A live instance, reused while nothing traps.
struct Live {
    store: Store<PluginState>,
    filter: bindings::BufferFilter,
}

/// Counters of a [`Filter`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
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
pub struct Filter {
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

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter")
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .field("options", &self.options)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Filter {
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
        let loaded = crate::runtime::load_cached(&rt.engine, bytes, actual, "plugin");
        if let Some(functions) = &rt.functions {
            // What the compile added (also when it failed part way), and the packs it read
            // let go of.
            functions.flush(actual);
            let (reused, compiled) = functions.counts();
            tracing::debug!(plugin = %name, reused, compiled, "functions of the plugins compiled in this process");
        }
        let (component, origin) = loaded.map_err(|e| load("not a WebAssembly component this host can compile", e))?;
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

impl BufferFilter for Filter {
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
        let e = Filter::from_bytes("foreign.wasm", &bytes, FilterOptions::new(&sha256_hex(&bytes))).unwrap_err();
        assert!(e.to_string().contains("it also imports [\"foo:bar/baz\"]"), "{e}");
        // A core module is refused as such, before compiling.
        let module = b"\0asm\x01\x00\x00\x00";
        assert!(declared_imports(module).unwrap_err().contains("a core module"));
    }
}
