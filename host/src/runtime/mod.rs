//! What the rest of the host runs on: content hashes, atomic files, and the on-disk cache of
//! compiled WebAssembly components (the kernel's and plugins').

pub(crate) mod atomic;
#[cfg(feature = "plugins")]
mod functions;

pub use atomic::{AtomicFile, create_new_with_mode as create_atomic, write as write_atomic};
#[cfg(feature = "plugins")]
pub(crate) use functions::FunctionCache;

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

pub(crate) use stowplan_kernel::plan::hex;

/// Takes the exclusive lock of `path` (created if needed) for as long as the returned file
/// lives, and writes who holds it into it (`owner`, e.g. "stowplan serve", this process's id
/// and host); if another process holds it for longer than `wait`, an `io` error saying that
/// another stowplan packer uses `what` and naming the holder as its file says. The lock is
/// `flock`'s: the kernel drops it when its holder dies, so a crash never leaves a directory
/// owned (on a network filesystem, once the dead holder's lease expires: hence `wait`).
pub(crate) fn lock_exclusive(
    path: &Path,
    what: &str,
    owner: &str,
    wait: std::time::Duration,
) -> Result<std::fs::File, crate::Error> {
    use std::io::{Read, Seek, Write};
    // Not truncated on open: the holder's name must survive a refused second opener.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| crate::Error::io("creating", path, e))?;
    let deadline = std::time::Instant::now().checked_add(wait);
    let mut locked = file.try_lock();
    while matches!(locked, Err(std::fs::TryLockError::WouldBlock))
        && deadline.is_none_or(|d| std::time::Instant::now() < d)
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
        locked = file.try_lock();
    }
    if let Err(e) = locked {
        let e = match e {
            std::fs::TryLockError::WouldBlock if wait.is_zero() => "the lock is held".to_string(),
            std::fs::TryLockError::WouldBlock => format!("the lock is held, waited {} s", wait.as_secs_f64()),
            // No lock at all (ENOLCK, or a filesystem without flock): not another owner.
            std::fs::TryLockError::Error(e) => {
                return Err(crate::Error::Io(format!(
                    "{}: cannot lock it ({e}); a packer needs a directory on a filesystem with flock locks \
                     (a local disk; on a network filesystem, one that supports them)",
                    path.display()
                )));
            }
        };
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        let holder = if holder.is_empty() { String::new() } else { format!(", held by {holder}") };
        return Err(crate::Error::Io(format!(
            "{}: another stowplan packer uses {what}{holder} ({e}); a directory has one owner at a time: stop that \
             one first, or use another directory",
            path.display()
        )));
    }
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{owner}, pid {} on {}", std::process::id(), host_name()))
        .and_then(|()| file.flush());
    written.map_err(|e| crate::Error::io("writing", path, e))?;
    Ok(file)
}

/// This machine's host name (`?` when it cannot be read), for lock holders' names.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at most that many bytes.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    if ok && end > 0 { String::from_utf8_lossy(&buf[..end]).into_owned() } else { "?".into() }
}

/// The most bytes a durable file (a checkpoint, a spooled batch, a delivery mark) is read up
/// to: a larger one is refused, never read into memory whole.
pub(crate) const MAX_DURABLE_BYTES: u64 = 4 << 30;

/// Reads `path` whole if it is a regular file holding at most `max` bytes; `Ok(Err(size))`
/// when it is larger (then at most `max + 1` bytes were read: a file that grows cannot make
/// the read unbounded). Never through a symlink (`ELOOP`) and never blocking on a FIFO: a
/// FIFO, a device or a directory is an `InvalidInput` error ("not a regular file").
pub(crate) fn read_regular(path: &Path, max: u64) -> std::io::Result<Result<Vec<u8>, u64>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file"));
    }
    let size = meta.len();
    if size > max {
        return Ok(Err(size));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Ok(Err(bytes.len() as u64));
    }
    Ok(Ok(bytes))
}

/// Whether the environment variable `name` is set to anything but empty or `0`.
pub(crate) fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The cache directory for precompiled components: `$STOWPLAN_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/stowplan`, else `$HOME/.cache/stowplan`; `None` when
/// `STOWPLAN_NO_CACHE` is set (to anything but empty or `0`) or no location is known.
pub fn cache_dir() -> Option<PathBuf> {
    if env_flag("STOWPLAN_NO_CACHE") {
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

/// The compile cache, checked before use (ARCHITECTURE.md, "The compile cache: threat
/// model"): compiled code is native code that runs outside the sandbox, so an entry is used
/// only if the directory and the entry belong to this user and nobody else may write them,
/// and the entry carries a MAC made with this user's cache key.
struct Cache {
    dir: PathBuf,
    key: [u8; 32],
    /// This process's effective user id, which owns the cache and its entries.
    uid: u32,
}

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// File of the per-user key that authenticates cache entries (32 random bytes, mode 0600).
const KEY_FILE: &str = "cache.key";

/// The compiled components kept (`*.cwasm`: the kernel's, plugins'), in bytes in all: past
/// it, the least recently used are removed. A JavaScript or Python plugin compiles to about
/// 80 MB, so a user who edits one would otherwise keep every version.
const MAX_ARTIFACT_BYTES: u64 = 2 << 30;

/// An entry of the cache directory: name, last use (modification time) and size.
type Entry = (String, std::time::SystemTime, u64);

/// The effective user id of this process.
fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// `Ok` if `path` is owned by `uid` and not writable by group or others.
fn check_private(path: &Path, uid: u32) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.file_type().is_symlink() {
        return Err(format!("{} is a symbolic link", path.display()));
    }
    if meta.uid() != uid {
        return Err(format!("{} belongs to user {}, not to this user ({uid})", path.display(), meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!("{} is writable by group or others (mode {:o})", path.display(), meta.mode() & 0o7777));
    }
    Ok(())
}

impl Cache {
    /// Opens (creating, private to the user) the cache directory `dir` and its key.
    fn open(dir: &Path) -> Result<Self, String> {
        use std::os::unix::fs::DirBuilderExt;
        let uid = own_uid();
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        check_private(dir, uid)?;
        let key_path = dir.join(KEY_FILE);
        if !key_path.exists() {
            // Written beside, then hard-linked into place, which fails if another process got
            // there first: every process that starts at once ends up with the same key.
            let mut key = [0u8; 32];
            use std::io::Read;
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut key))
                .map_err(|e| format!("reading /dev/urandom for the cache key: {e}"))?;
            let tmp = dir.join(format!(".{KEY_FILE}.{}", std::process::id()));
            atomic::write_with_mode(&tmp, &key, 0o600).map_err(|e| e.to_string())?;
            let linked = std::fs::hard_link(&tmp, &key_path);
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(format!("creating {}: {e}", key_path.display()));
                }
                _ => {}
            }
        }
        check_private(&key_path, uid)?;
        let bytes = std::fs::read(&key_path).map_err(|e| format!("{}: {e}", key_path.display()))?;
        let key: [u8; 32] = bytes.try_into().map_err(|_| format!("{} is not a 32-byte key", key_path.display()))?;
        Ok(Self { dir: dir.to_path_buf(), key, uid })
    }

    /// The MAC of entry `name` (its name, which holds the component's whole sha256 and the
    /// engine's hash, then its bytes follow) under this user's key: an entry cannot be
    /// passed off under another name.
    fn mac(&self, name: &str) -> HmacSha256 {
        use hmac::Mac;
        // HMAC takes keys of any length.
        let mut mac =
            HmacSha256::new_from_slice(&self.key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(name.as_bytes());
        mac.update(&[0]);
        mac
    }

    /// The entries whose name `ours` accepts, least recently used first.
    fn entries(&self, ours: impl Fn(&str) -> bool) -> Vec<Entry> {
        let mut entries: Vec<Entry> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let meta = entry.metadata().ok()?;
                ours(&name).then(|| (name, meta.modified().unwrap_or(std::time::UNIX_EPOCH), meta.len()))
            })
            .collect();
        entries.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        entries
    }

    /// Removes the least recently used of the entries `ours` accepts (each with its MAC)
    /// until they hold at most `max_bytes` in all; `keep`, the entry just written, stays.
    /// Failing to remove one is ignored: the bound is kept at the next write.
    fn bound(&self, ours: impl Fn(&str) -> bool, max_bytes: u64, keep: &str) {
        let entries = self.entries(ours);
        let mut total: u64 = entries.iter().map(|e| e.2).sum();
        for (old, _, len) in entries {
            if total <= max_bytes {
                break;
            }
            if old == keep {
                continue;
            }
            let path = self.dir.join(&old);
            let _ = std::fs::remove_file(path.with_extension("mac"));
            let _ = std::fs::remove_file(&path);
            total -= len;
        }
    }

    /// Marks entry `name` used now (its modification time), so that [`Cache::bound`] removes
    /// it after the entries used less recently. Failing is ignored: it only orders removals.
    fn touch(&self, name: &str) {
        let _ = std::fs::File::options()
            .write(true)
            .open(self.dir.join(name))
            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    }

    /// The bytes of entry `name` if it is private to this user and its MAC verifies.
    fn read(&self, name: &str) -> Result<Vec<u8>, String> {
        use hmac::Mac;
        let path = self.dir.join(name);
        let mac_path = path.with_extension("mac");
        check_private(&path, self.uid)?;
        check_private(&mac_path, self.uid)?;
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let recorded = std::fs::read(&mac_path).map_err(|e| format!("{}: {e}", mac_path.display()))?;
        let mut mac = self.mac(name);
        mac.update(&bytes);
        mac.verify_slice(&recorded).map_err(|_| format!("{}: its MAC does not verify", path.display()))?;
        Ok(bytes)
    }

    /// Writes entry `name` (artifact, then its MAC; both 0600).
    fn write(&self, name: &str, bytes: &[u8]) -> Result<(), String> {
        use hmac::Mac;
        let path = self.dir.join(name);
        let mut mac = self.mac(name);
        mac.update(bytes);
        let tag = mac.finalize().into_bytes();
        atomic::write_with_mode(&path, bytes, 0o600)
            .and_then(|()| atomic::write_with_mode(&path.with_extension("mac"), &tag, 0o600))
            .map_err(|e| e.to_string())
    }
}

/// A hash of what makes `engine`'s compiled code usable by another engine (wasmtime's
/// compatibility hash): it names cached artifacts and packs of the function cache.
fn engine_hash(engine: &Engine) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    h.finish()
}

/// The compile cache of [`cache_dir`], or `None` (logged) if there is none or it is unusable.
fn open_cache() -> Option<Cache> {
    cache_dir().and_then(|dir| match Cache::open(&dir) {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!("not using the compile cache: {e}");
            None
        }
    })
}

/// The function cache ([`FunctionCache`]) of the compile cache, for an engine that compiles
/// plugins; `None` where there is no usable compile cache.
#[cfg(feature = "plugins")]
pub(crate) fn function_cache() -> Option<std::sync::Arc<FunctionCache>> {
    open_cache().map(|cache| std::sync::Arc::new(FunctionCache::new(cache)))
}

/// Compiles `bytes` (a component whose sha256 is `wasm_sha`) for `engine`, or loads the
/// artifact precompiled earlier from the cache directory ([`cache_dir`]), named
/// `{prefix}-{sha256}-{engine compatibility hash}.cwasm` (the whole sha256, also under the
/// entry's MAC). A cached artifact is used only
/// if the cache and the entry are private to this user and the entry's MAC verifies; an
/// unusable, foreign or unwritable cache is logged and never fatal (the component is
/// compiled). Returns where the component came from: `cache` or `compiled`.
pub(crate) fn load_cached(
    engine: &Engine,
    bytes: &[u8],
    wasm_sha: &str,
    prefix: &str,
) -> wasmtime::Result<(Component, &'static str)> {
    let name = format!("{prefix}-{wasm_sha}-{:016x}.cwasm", engine_hash(engine));
    let cache = open_cache();
    if let Some(cache) = &cache {
        match cache.read(&name) {
            // SAFETY: the bytes are an artifact written by `Cache::write` with
            // `Engine::precompile_component` output for an engine with the same compatibility
            // hash (it is in the name), private to this user and authenticated by its MAC.
            Ok(cached) => match unsafe { Component::deserialize(engine, &cached) } {
                Ok(c) => {
                    cache.touch(&name);
                    return Ok((c, "cache"));
                }
                Err(e) => tracing::warn!(%name, "ignoring an unusable cached component: {e:?}"),
            },
            Err(e) if cache.dir.join(&name).exists() => tracing::warn!("ignoring a cached component: {e}"),
            Err(_) => {}
        }
    }
    let compiled = engine.precompile_component(bytes)?;
    if let Some(cache) = &cache {
        match cache.write(&name, &compiled) {
            Ok(()) => cache.bound(|n| n.ends_with(".cwasm"), MAX_ARTIFACT_BYTES, &name),
            Err(e) => tracing::debug!(%name, "not caching the compiled component: {e}"),
        }
    }
    // SAFETY: `compiled` was just produced by `precompile_component` on this engine.
    let component = unsafe { Component::deserialize(engine, &compiled) }?;
    Ok((component, "compiled"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compiled_components_are_bounded_and_the_least_recently_used_go_first() {
        let dir = std::env::temp_dir().join(format!("stowplan-cache-bound-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = Cache::open(&dir).expect("opens the cache");
        let cwasm = |n: &str| n.ends_with(".cwasm");
        for name in ["a.cwasm", "b.cwasm", "c.cwasm"] {
            cache.write(name, &[0; 1000]).expect("writes");
            // Distinct modification times, oldest first.
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        cache.write("other.pack", &[0; 5000]).expect("writes");
        // A use (a cache hit): "a" becomes the most recently used.
        cache.touch("a.cwasm");
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.write("d.cwasm", &[0; 1000]).expect("writes");
        cache.bound(cwasm, 2000, "d.cwasm");
        let left: Vec<String> = cache.entries(cwasm).into_iter().map(|e| e.0).collect();
        assert_eq!(left, ["a.cwasm", "d.cwasm"]);
        assert!(!dir.join("b.mac").exists() && !dir.join("c.mac").exists(), "their MACs go with them");
        assert!(dir.join("other.pack").exists(), "other entries are not counted or removed");
        // The entry just written stays even when it alone is over the bound.
        cache.bound(cwasm, 10, "d.cwasm");
        let left: Vec<String> = cache.entries(cwasm).into_iter().map(|e| e.0).collect();
        assert_eq!(left, ["d.cwasm"]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
