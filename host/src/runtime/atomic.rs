//! Atomic file replacement: write a temporary file beside the target, fsync it, rename it
//! over the target, fsync the directory. Readers see the old or the new file, never a torn
//! one; a crash leaves at most a stale temporary file (named `.NAME.tmp.PID.N`), which
//! readers ignore and the next write of the same process id replaces.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;
use crate::error::io;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// The temporary path used for the next write of `path`.
fn temp_path(path: &Path) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.tmp.{}.{n}", std::process::id()))
}

/// Replaces `path` by `bytes` atomically (creating the parent directory if needed).
pub fn write(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    write_with_mode(path, bytes, 0o666)
}

/// [`write`] with the new file created with `mode` (less the umask), e.g. `0o600` for a
/// file only its owner may read and write.
pub(crate) fn write_with_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), Error> {
    write_as(path, bytes, mode, Place::Replace)
}

/// Creates `path` with `bytes` atomically, never replacing a file: `Ok(false)` when `path`
/// exists already (nothing written). A hard link puts the complete file in place, so the
/// check and the creation are one step (no race with another writer).
#[cfg_attr(not(feature = "zmq"), allow(dead_code))] // its one user (CURVE keys) needs `zmq`
pub(crate) fn create_new_with_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, Error> {
    match write_as(path, bytes, mode, Place::CreateNew) {
        Err(Error::Io(m)) if m.starts_with(EXISTS) => Ok(false),
        r => r.map(|()| true),
    }
}

/// How the temporary file goes into place.
#[derive(Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "zmq"), allow(dead_code))]
enum Place {
    /// Renamed over the target.
    Replace,
    /// Hard-linked to the target, which must not exist.
    CreateNew,
}

/// The start of the error [`write_as`] returns for [`Place::CreateNew`] on an existing file.
const EXISTS: &str = "exists: ";

fn write_as(path: &Path, bytes: &[u8], mode: u32, place: Place) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(|e| io("creating directory", &dir, e))?;
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| io("creating", &tmp, e))?;
        f.write_all(bytes).map_err(|e| io("writing", &tmp, e))?;
        f.sync_all().map_err(|e| io("syncing", &tmp, e))?;
        match place {
            Place::Replace => std::fs::rename(&tmp, path).map_err(|e| io("renaming into place", path, e))?,
            Place::CreateNew => match std::fs::hard_link(&tmp, path) {
                Ok(()) => std::fs::remove_file(&tmp).map_err(|e| io("removing", &tmp, e))?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(Error::Io(format!("{EXISTS}{}", path.display())));
                }
                Err(e) => return Err(io("linking into place", path, e)),
            },
        }
        // Make the rename itself durable.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
