//! The function cache: Cranelift's incremental compilation cache for buffer-filter plugins,
//! kept in the compile cache's directory under its checks.
//!
//! Plugins built by the same tool share most of their code: every JavaScript plugin carries
//! the StarlingMonkey engine, every Python one CPython. Compiling such a plugin takes tens of
//! seconds, nearly all of it spent on functions another plugin had already. With this cache,
//! Cranelift looks each function up by the hash of its code and the compiler's settings
//! (`cranelift_codegen::incremental_cache`) and reuses what an earlier compile produced.
//!
//! What a compile adds is written as one *pack* per plugin, `functions-{engine}-{sha256}.pack`
//! (one file rather than one per function: a plugin has tens of thousands), through
//! [`Cache::write`]: atomic, private to the user, with a MAC under the user's cache key. Its
//! entries are native code, so a pack is used only if [`Cache::read`] accepts it, exactly as a
//! precompiled component (ARCHITECTURE.md, "The compile cache: threat model"); a damaged or
//! foreign pack is logged and ignored, never fatal, and the functions are compiled again.
//!
//! The frame of a pack: `SPFC`, the format version (u32), the entry count (u64), then each
//! entry: its key (32 bytes), its length (u32) and its bytes, all little-endian. The packs
//! kept are bounded: past [`MAX_PACK_BYTES`] in all, the oldest are removed.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError, RwLock};

use wasmtime::{CacheStore, Engine};

use super::Cache;

/// The first bytes of a pack.
const MAGIC: &[u8; 4] = b"SPFC";
/// The pack format's version.
const VERSION: u32 = 1;
/// Bytes of a key: Cranelift's cache keys are sha256 hashes.
const KEY_BYTES: usize = 32;
/// How every pack's file name starts.
const PREFIX: &str = "functions-";
/// The packs kept in a cache directory, in bytes in all; the oldest beyond it are removed.
const MAX_PACK_BYTES: u64 = 512 << 20;

type Key = [u8; KEY_BYTES];

/// Cranelift's cache store over the packs of one cache directory (module docs). Shared by
/// the compiler's threads; a compile's new entries are written by [`FunctionCache::flush`].
pub(crate) struct FunctionCache {
    cache: Cache,
    /// The engine's compatibility hash ([`super::engine_hash`]), in every pack's name: set
    /// by [`FunctionCache::attach`] before the first compile.
    engine: OnceLock<u64>,
    /// Every entry known while a compile runs: the packs on disk (read at its first lookup)
    /// and what it compiled. Dropped by [`FunctionCache::flush`], so a process does not hold
    /// the packs between compiles.
    known: RwLock<Option<HashMap<Key, Vec<u8>>>>,
    /// The keys of the entries compiled since the last flush.
    pending: Mutex<Vec<Key>>,
    hits: AtomicU64,
    misses: AtomicU64,
    /// The packs kept, in bytes in all ([`MAX_PACK_BYTES`]).
    max_bytes: u64,
}

impl std::fmt::Debug for FunctionCache {
    // Not derived: the cache holds the user's key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (hits, misses) = self.counts();
        f.debug_struct("FunctionCache")
            .field("dir", &self.cache.dir)
            .field("hits", &hits)
            .field("misses", &misses)
            .finish()
    }
}

impl FunctionCache {
    /// The function cache of the compile cache `cache`.
    pub(super) fn new(cache: Cache) -> Self {
        Self {
            cache,
            engine: OnceLock::new(),
            known: RwLock::new(None),
            pending: Mutex::new(Vec::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            max_bytes: MAX_PACK_BYTES,
        }
    }

    /// Names the engine this cache serves (created with it as its cache store): only packs
    /// made by a compatible engine are read.
    pub(crate) fn attach(&self, engine: &Engine) {
        let _ = self.engine.set(super::engine_hash(engine));
    }

    /// Functions found in the cache and functions compiled, since this cache was made.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (self.hits.load(Ordering::Relaxed), self.misses.load(Ordering::Relaxed))
    }

    /// The packs of `engine` (of any engine if `None`) in the directory, oldest first: name,
    /// modification time and size.
    fn packs(&self, engine: Option<u64>) -> Vec<super::Entry> {
        let want = engine.map_or_else(|| PREFIX.to_string(), |e| format!("{PREFIX}{e:016x}-"));
        self.cache.entries(|name| name.ends_with(".pack") && name.starts_with(&want))
    }

    /// The entries of this engine's packs on disk.
    fn load(&self) -> HashMap<Key, Vec<u8>> {
        let mut map = HashMap::new();
        if let Some(&engine) = self.engine.get() {
            for (name, _, _) in self.packs(Some(engine)) {
                match self.cache.read(&name).and_then(|bytes| parse(&bytes).map_err(|e| format!("{name}: {e}"))) {
                    Ok(entries) => map.extend(entries),
                    Err(e) => tracing::warn!("ignoring a pack of the function cache: {e}"),
                }
            }
        }
        map
    }

    /// Runs `f` on the entries known, read from disk first if they are not in memory.
    fn with_known<T>(&self, f: impl FnOnce(&mut HashMap<Key, Vec<u8>>) -> T) -> T {
        let mut known = self.known.write().unwrap_or_else(PoisonError::into_inner);
        f(known.get_or_insert_with(|| self.load()))
    }

    /// Writes the entries compiled since the last flush as the pack of the component whose
    /// sha256 is `sha`, then removes the oldest packs past [`MAX_PACK_BYTES`]. Failing to
    /// write is logged, never fatal: the cache only saves time.
    pub(crate) fn flush(&self, sha: &str) {
        let mut keys = std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        // Compiled on two threads at once, a function is inserted twice.
        keys.sort_unstable();
        keys.dedup();
        let known = self.known.write().unwrap_or_else(PoisonError::into_inner).take().unwrap_or_default();
        let Some(&engine) = self.engine.get() else { return };
        let entries: Vec<(&Key, &Vec<u8>)> = keys.iter().filter_map(|k| known.get_key_value(k)).collect();
        if entries.is_empty() {
            return;
        }
        let name = format!("{PREFIX}{engine:016x}-{sha}.pack");
        if let Err(e) = self.cache.write(&name, &frame(&entries)) {
            tracing::debug!(%name, "not writing a pack of the function cache: {e}");
            return;
        }
        self.cache.bound(|n| n.ends_with(".pack") && n.starts_with(PREFIX), self.max_bytes, &name);
    }
}

impl CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let cached =
            self.known.read().unwrap_or_else(PoisonError::into_inner).as_ref().map(|known| known.get(key).cloned());
        let found = cached.unwrap_or_else(|| self.with_known(|known| known.get(key).cloned()));
        let counter = if found.is_some() { &self.hits } else { &self.misses };
        counter.fetch_add(1, Ordering::Relaxed);
        found.map(Cow::Owned)
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let Ok(key) = Key::try_from(key) else { return false };
        let Ok(_) = u32::try_from(value.len()) else { return false };
        self.with_known(|known| known.insert(key, value));
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).push(key);
        true
    }
}

/// The bytes of a pack holding `entries` (module docs).
fn frame(entries: &[(&Key, &Vec<u8>)]) -> Vec<u8> {
    let size: usize = entries.iter().map(|(_, v)| KEY_BYTES + 4 + v.len()).sum();
    let mut out = Vec::with_capacity(16 + size);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (key, value) in entries {
        out.extend_from_slice(*key);
        // `insert` refuses values whose length does not fit.
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

/// The entries of a pack, or what is wrong with it.
fn parse(bytes: &[u8]) -> Result<Vec<(Key, Vec<u8>)>, String> {
    let mut rest = bytes;
    let mut take = |n: usize, what: &str| -> Result<&[u8], String> {
        if rest.len() < n {
            return Err(format!("cut short in its {what}"));
        }
        let (head, tail) = rest.split_at(n);
        rest = tail;
        Ok(head)
    };
    if take(4, "magic")? != MAGIC {
        return Err("not a pack (its magic is not SPFC)".into());
    }
    let version = u32::from_le_bytes(take(4, "version")?.try_into().map_err(|_| "version")?);
    if version != VERSION {
        return Err(format!("format version {version}, this stowplan reads {VERSION}"));
    }
    let count = u64::from_le_bytes(take(8, "entry count")?.try_into().map_err(|_| "count")?);
    let mut entries = Vec::new();
    for _ in 0..count {
        let key: Key = take(KEY_BYTES, "keys")?.try_into().map_err(|_| "key")?;
        let len = u32::from_le_bytes(take(4, "lengths")?.try_into().map_err(|_| "length")?) as usize;
        entries.push((key, take(len, "entries")?.to_vec()));
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after its last entry", rest.len()));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::Arc;
    use wasmtime::Config;

    fn plugin(name: &str) -> Vec<u8> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist").join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stowplan-functions-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// An engine over a new function cache of `dir` (a process's first compile).
    fn engine(dir: &std::path::Path) -> (Engine, Arc<FunctionCache>) {
        let cache = Arc::new(FunctionCache::new(Cache::open(dir).expect("opens the cache")));
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.enable_incremental_compilation(cache.clone()).expect("takes the cache");
        let engine = Engine::new(&config).expect("an engine");
        cache.attach(&engine);
        (engine, cache)
    }

    /// `name` compiled by a new engine over the cache of `dir`: the code, and the cache's
    /// (reused, compiled) counts.
    fn compile(dir: &std::path::Path, name: &str) -> (Vec<u8>, (u64, u64)) {
        let (engine, cache) = engine(dir);
        let bytes = plugin(name);
        let compiled = engine.precompile_component(&bytes).expect("compiles");
        cache.flush(&super::super::sha256_hex(&bytes));
        (compiled, cache.counts())
    }

    #[test]
    fn a_second_compile_reuses_the_functions_and_produces_the_same_bytes() {
        let dir = temp_dir("reuse");
        // (A module's identical functions are compiled once: the later ones are hits.)
        let (first, (hits, misses)) = compile(&dir, "pop_first.wasm");
        assert!(misses > 100 && hits < misses, "{misses} functions compiled, {hits} reused");
        // (Not every function comes from the pack: Cranelift caches only what it can
        // serialize.)
        let (again, (reused, compiled)) = compile(&dir, "pop_first.wasm");
        assert_eq!(reused + compiled, hits + misses);
        assert!(reused > 4 * compiled, "{reused} reused, {compiled} compiled again");
        assert_eq!(again, first, "the cached code is the compiled code");
        // Another plugin of the same guest crate shares its standard library's functions.
        let (_, (hits, misses)) = compile(&dir, "top_reward.wasm");
        assert!(hits > 50, "{hits} reused, {misses} compiled");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_damaged_pack_is_ignored_and_everything_compiled_again() {
        let dir = temp_dir("damaged");
        let (first, _) = compile(&dir, "pop_first.wasm");
        assert!(!engine(&dir).1.load().is_empty(), "the pack is read back");
        let pack = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|e| e == "pack"))
            .expect("a pack was written");
        let mut bytes = std::fs::read(&pack).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&pack, bytes).unwrap();
        let (_, cache) = engine(&dir);
        assert!(cache.load().is_empty(), "nothing taken from a pack whose MAC fails");
        let (again, _) = compile(&dir, "pop_first.wasm");
        assert_eq!(again, first);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_oldest_packs_beyond_the_bound_are_removed() {
        let dir = temp_dir("bound");
        let mut cache = FunctionCache::new(Cache::open(&dir).expect("opens the cache"));
        cache.engine.set(1).expect("no engine yet");
        cache.max_bytes = 2 * (16 + 36 + 1000);
        for (i, sha) in ["a", "b", "c"].iter().enumerate() {
            cache.insert(&[i as u8; 32], vec![0; 1000]);
            cache.flush(sha);
            // Distinct modification times, oldest first.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let left: Vec<String> = cache.packs(None).into_iter().map(|p| p.0).collect();
        assert_eq!(left, [format!("{PREFIX}{:016x}-b.pack", 1), format!("{PREFIX}{:016x}-c.pack", 1)]);
        assert!(!dir.join(format!("{PREFIX}{:016x}-a.mac", 1)).exists(), "its MAC goes with it");
        assert_eq!(cache.load().len(), 2);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn packs_parse_back_and_damage_is_named() {
        let entries = vec![([7u8; 32], vec![1, 2, 3]), ([9u8; 32], Vec::new())];
        let bytes = frame(&entries.iter().map(|(k, v)| (k, v)).collect::<Vec<_>>());
        assert_eq!(parse(&bytes).unwrap(), entries);
        assert!(parse(&bytes[..bytes.len() - 1]).unwrap_err().contains("cut short"));
        assert!(parse(b"XXXX").unwrap_err().contains("magic"));
        let mut long = bytes.clone();
        long.push(0);
        assert!(parse(&long).unwrap_err().contains("after its last entry"));
        let mut huge = bytes;
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse(&huge).unwrap_err().contains("cut short"), "a count past the bytes is refused, not allocated");
    }
}
