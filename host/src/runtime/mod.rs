//! What the rest of the host runs on: content hashes, atomic files, and the on-disk cache of
//! compiled WebAssembly components (the kernel's and plugins').

pub(crate) mod atomic;

use std::path::PathBuf;

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
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
        // The artifact first, its sidecar second: a reader that finds the sidecar finds the
        // artifact it describes (a crash in between leaves an artifact without a sidecar,
        // which is recompiled).
        let written = atomic::write(path, &compiled)
            .and_then(|()| atomic::write(&path.with_extension("sha256"), sha256_hex(&compiled).as_bytes()));
        if let Err(e) = written {
            tracing::debug!(path = %path.display(), "not caching the compiled component: {e}");
        }
    }
    // SAFETY: `compiled` was just produced by `precompile_component` on this engine.
    let component = unsafe { Component::deserialize(engine, &compiled) }?;
    Ok((component, "compiled"))
}
