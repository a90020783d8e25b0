//! A plugin file: read (or only hashed) within a size cap, and the pin it must match.

use std::path::Path;

use crate::Error;

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
    let io = |e| Error::io("reading the plugin", path, e);
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

pub(super) fn plugin_too_large(name: &str, max_bytes: u64) -> Error {
    Error::InvalidArgument(format!(
        "{name}: the plugin file is larger than max_plugin_bytes ({max_bytes} bytes; stowplan filter \
         --max-plugin-mib): is it a plugin component?"
    ))
}

/// Normalizes a pin: 64 lowercase hex digits, an optional `sha256:` prefix removed.
pub(super) fn pin(sha256: &str) -> Result<String, Error> {
    let hex = sha256.trim().strip_prefix("sha256:").unwrap_or(sha256.trim()).to_ascii_lowercase();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::InvalidArgument(format!(
            "sha256 must be 64 hex digits, optionally prefixed sha256: (got {sha256:?}); \
             `stowplan filter hash PLUGIN.wasm` prints it"
        )));
    }
    Ok(hex)
}
