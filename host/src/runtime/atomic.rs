//! Atomic file replacement: write a temporary file beside the target, fsync it, rename it
//! over the target, fsync the directory. Readers see the old or the new file, never a torn
//! one; a crash leaves at most a stale temporary file (named `.NAME.tmp.PID.N`), which
//! readers ignore. A temporary file is created new, never opened if it exists, so two
//! writers never share one (threads of a process differ in N; processes that share a
//! directory but not a pid namespace, in containers, take the next N). [`write`] takes the
//! whole content; [`AtomicFile`] takes it piece by piece.
//!
//! Every file stowplan writes (plans, packed datasets, caches, checkpoints, the spool, rank
//! batches) goes through here, so one rule holds for all of them: **only a regular file is
//! replaced.** A target that exists and is anything else (a device such as `/dev/null`, a
//! FIFO, a socket, a directory, or a symlink to one) is refused with an `invalid-argument`
//! error naming it, before anything is written and again just before the rename; renaming
//! over it would replace the device node or FIFO itself.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::Error;

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

/// Creates `path` with `bytes` atomically, never replacing a file, the new file created with
/// `mode` (less the umask): `Ok(false)` when `path` exists already (nothing written). A hard
/// link puts the complete file in place, so the check and the creation are one step (no race
/// with another writer).
pub fn create_new_with_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<bool, Error> {
    match write_as(path, bytes, mode, Place::CreateNew) {
        Err(Error::Io(m)) if m.starts_with(EXISTS) => Ok(false),
        r => r.map(|()| true),
    }
}

/// How the temporary file goes into place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Renamed over the target.
    Replace,
    /// Hard-linked to the target, which must not exist.
    CreateNew,
    /// In place already (nothing to clean up).
    Done,
}

/// The start of the error [`write_as`] returns for [`Place::CreateNew`] on an existing file.
const EXISTS: &str = "exists: ";

fn write_as(path: &Path, bytes: &[u8], mode: u32, place: Place) -> Result<(), Error> {
    let mut f = AtomicFile::open(path, mode, place)?;
    f.write_all(bytes).map_err(|e| Error::io("writing", &f.tmp, e))?;
    f.commit()
}

/// A file written piece by piece (it is a [`Write`]) and put in place atomically by
/// [`AtomicFile::commit`]: a temporary file beside the target, fsynced, renamed over the
/// target, the directory fsynced. Dropped without a commit (an error, a panic), the
/// temporary is removed and the target left as it was. For content too large to hold (a
/// packed dataset); [`write`] is the one-call form.
#[derive(Debug)]
pub struct AtomicFile {
    path: PathBuf,
    dir: PathBuf,
    tmp: PathBuf,
    file: Option<std::io::BufWriter<File>>,
    place: Place,
}

impl AtomicFile {
    /// Starts replacing `path` (its parent directory created if needed).
    pub fn create(path: &Path) -> Result<Self, Error> {
        Self::open(path, 0o666, Place::Replace)
    }

    /// Checks, without writing, that `path` may be replaced: it does not exist or is a
    /// regular file (the module docs' rule, which every write checks again), for a caller
    /// that refuses before long work. Errors: `invalid-argument` naming the path and what it is.
    pub fn check_target(path: &Path) -> Result<(), Error> {
        refuse_non_regular(path)
    }

    fn open(path: &Path, mode: u32, place: Place) -> Result<Self, Error> {
        use std::os::unix::fs::OpenOptionsExt;
        refuse_non_regular(path)?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating directory", &dir, e))?;
        let (tmp, file) = loop {
            let tmp = temp_path(path);
            match OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp) {
                Ok(file) => break (tmp, file),
                // Another writer's (or a crashed one's): take the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("creating", &tmp, e)),
            }
        };
        Ok(AtomicFile {
            path: path.to_path_buf(),
            dir,
            tmp,
            file: Some(std::io::BufWriter::with_capacity(1 << 20, file)),
            place,
        })
    }

    /// Puts the file in place: everything written is flushed and fsynced, then renamed over
    /// the target, and the rename made durable. On an error the target is left as it was.
    pub fn commit(mut self) -> Result<(), Error> {
        let file = self.file.take().expect("an AtomicFile is finished once");
        let file = file.into_inner().map_err(|e| Error::io("writing", &self.tmp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io("syncing", &self.tmp, e))?;
        drop(file);
        match self.place {
            Place::Replace => {
                refuse_non_regular(&self.path)?;
                std::fs::rename(&self.tmp, &self.path).map_err(|e| Error::io("renaming into place", &self.path, e))?
            }
            Place::CreateNew => match std::fs::hard_link(&self.tmp, &self.path) {
                Ok(()) => std::fs::remove_file(&self.tmp).map_err(|e| Error::io("removing", &self.tmp, e))?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(Error::Io(format!("{EXISTS}{}", self.path.display())));
                }
                Err(e) => return Err(Error::io("linking into place", &self.path, e)),
            },
            Place::Done => {}
        }
        self.place = Place::Done;
        // Make the rename itself durable.
        if let Ok(d) = File::open(&self.dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.as_mut().map_or(Ok(0), |f| f.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.as_mut().map_or(Ok(()), |f| f.flush())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.place != Place::Done {
            drop(self.file.take());
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Refuses a `path` that exists and is not a regular file (followed through symlinks): see
/// the module docs. Errors: `invalid-argument` naming the path and what it is.
fn refuse_non_regular(path: &Path) -> Result<(), Error> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::metadata(path) else { return Ok(()) };
    let t = meta.file_type();
    let what = if t.is_file() {
        return Ok(());
    } else if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Err(Error::InvalidArgument(format!(
        "{}: exists and is {what}; stowplan replaces only regular files (the rename would replace it): name a file",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stowplan-atomic-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_streamed_file_appears_whole_on_commit_and_not_at_all_without() {
        let dir = scratch("stream");
        let path = dir.join("out.arrow");
        write(&path, b"old").unwrap();
        let mut f = AtomicFile::create(&path).unwrap();
        f.write_all(b"new ").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old", "the target is untouched while writing");
        f.write_all(b"content").unwrap();
        drop(f); // an error on the way: no commit
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert_eq!(entries(&dir), ["out.arrow"], "the temporary is removed");
        let mut f = AtomicFile::create(&path).unwrap();
        f.write_all(b"new content").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new content");
        assert_eq!(entries(&dir), ["out.arrow"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_target_that_is_not_a_regular_file_is_refused_and_left_alone() {
        use std::os::unix::fs::FileTypeExt;
        let dir = scratch("special");
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let socket = dir.join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let link = dir.join("null-link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        let sub = dir.join("sub");
        std::fs::create_dir(&sub).unwrap();
        for (path, what) in [
            (Path::new("/dev/null"), "a character device"),
            (fifo.as_path(), "a FIFO"),
            (socket.as_path(), "a socket"),
            (link.as_path(), "a character device"),
            (sub.as_path(), "a directory"),
        ] {
            let before = std::fs::symlink_metadata(path).unwrap().file_type();
            for err in [write(path, b"x").unwrap_err(), AtomicFile::create(path).unwrap_err()] {
                let m = err.to_string();
                assert!(matches!(err, Error::InvalidArgument(_)), "{m}");
                assert!(m.contains(&path.display().to_string()) && m.contains(what), "{m}");
            }
            let after = std::fs::symlink_metadata(path).unwrap().file_type();
            assert_eq!(before, after, "{} was replaced", path.display());
        }
        assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        assert_eq!(entries(&dir), ["fifo", "null-link", "socket", "sub"], "no temporary file is left");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
