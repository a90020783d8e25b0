//! Where lengths come from: a FILE, `-` (standard input), a piped or redirected standard
//! input, or a built-in workload (`--workload NAME`, else the default one).

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use stowplan::input::{WORKLOADS, Workload, parse_lengths};

use crate::failure::Failure;

/// The input options of `partition`, `pack` and `balance`.
#[derive(clap::Args, Debug)]
pub struct InputArgs {
    /// Lengths, one integer per line or a JSON array; `-` reads standard input. Without FILE,
    /// a piped or redirected standard input is read; when standard input is a terminal (or
    /// /dev/null, or closed) the built-in workload is used (see --workload).
    pub file: Option<PathBuf>,
    /// Use this built-in workload instead of a FILE or standard input.
    #[arg(long, value_name = "NAME", value_parser = workload_parser(), conflicts_with = "file")]
    pub workload: Option<&'static Workload>,
    /// The most input read.
    #[command(flatten)]
    pub limit: InputLimit,
}

/// How much input a command reads at most (`stowplan pack /dev/zero` must end).
#[derive(clap::Args, Clone, Copy, Debug)]
pub struct InputLimit {
    /// Refuse a FILE or standard input larger than this many MiB (1 ..= 1048576).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_input_mib: u64,
}

impl InputLimit {
    /// Reads all of `reader` (named `what` in errors), refusing more than the limit, Arrow
    /// data, and anything that is not text at the first line that is not ([`check_text`]): a
    /// binary stream (`/dev/urandom`, `/dev/zero`) is refused after its first chunk, not after
    /// the limit's worth of it.
    fn read(&self, mut reader: impl Read, what: &str) -> Result<String, Failure> {
        let limit = self.max_input_mib << 20;
        let mut bytes = Vec::new();
        let mut chunk = vec![0u8; 64 << 10];
        // Bytes checked so far (a multi-byte character cut by a chunk's end waits for the next).
        let (mut checked, mut lines) = (0usize, 1usize);
        loop {
            let n = match reader.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::bad(format!("reading {what}: {e}"))),
            };
            bytes.extend_from_slice(&chunk[..n]);
            if bytes.len() as u64 > limit {
                return Err(Failure::bad(format!(
                    "{what} is larger than --max-input-mib {} MiB; raise the limit to read it",
                    self.max_input_mib
                )));
            }
            // Arrow's magic (6 bytes) is looked for before anything is called not text.
            if bytes.len() >= 6 {
                if checked == 0 {
                    refuse_arrow(&bytes, what)?;
                }
                checked = check_text(&bytes, checked, &mut lines, false, what)?;
            }
        }
        refuse_arrow(&bytes, what)?;
        check_text(&bytes, checked, &mut lines, true, what)?;
        String::from_utf8(bytes).map_err(|e| Failure::bad(format!("reading {what}: not UTF-8 text ({e})")))
    }
}

/// Refuses Arrow IPC bytes read from a pipe, saying where they are read instead.
fn refuse_arrow(bytes: &[u8], what: &str) -> Result<(), Failure> {
    if bytes.starts_with(b"ARROW1") || bytes.starts_with(&[0xff; 4]) {
        return Err(Failure::bad(format!(
            "{what} holds Arrow IPC data: `stowplan plan` reads it from a file path (--lengths FILE --column NAME), \
             not from a pipe"
        )));
    }
    Ok(())
}

/// Checks `bytes[from..]` as text: UTF-8 without control characters but tab, CR and LF;
/// `lines` counts the lines seen (for the message). Returns how far the bytes are checked: a
/// character cut at the end waits for more bytes unless `last`. Errors name the line.
fn check_text(bytes: &[u8], from: usize, lines: &mut usize, last: bool, what: &str) -> Result<usize, Failure> {
    let rest = &bytes[from..];
    let (valid, bad) = match std::str::from_utf8(rest) {
        Ok(t) => (t, None),
        Err(e) => {
            let t = std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or_default();
            let cut_at_end = e.error_len().is_none() && !last;
            (t, if cut_at_end { None } else { Some(from + e.valid_up_to()) })
        }
    };
    for (i, c) in valid.char_indices() {
        if c == '\n' {
            *lines += 1;
        } else if c.is_control() && c != '\t' && c != '\r' {
            return Err(binary(what, *lines, from + i, c as u32));
        }
    }
    if let Some(at) = bad {
        return Err(binary(what, *lines, at, u32::from(bytes[at])));
    }
    Ok(from + valid.len())
}

/// The refusal of input that is not text.
fn binary(what: &str, line: usize, offset: usize, byte: u32) -> Failure {
    Failure::bad(format!(
        "{what}: line {line} is not text (0x{byte:02x} at byte {offset}): lengths are one integer per line or a JSON \
         array"
    ))
}

/// `--workload`'s parser: the names of [`WORKLOADS`], each listed in `--help` with its
/// description.
fn workload_parser() -> impl TypedValueParser<Value = &'static Workload> {
    PossibleValuesParser::new(WORKLOADS.iter().map(|w| PossibleValue::new(w.name).help(w.description)))
        .try_map(|name| stowplan::input::workload(&name).ok_or_else(|| format!("no built-in workload {name:?}")))
}

/// Text read from a source, and how reports name that source.
#[derive(Debug)]
pub struct Text {
    /// The text.
    pub text: String,
    /// `standard input`, the file's path or the built-in workload's name.
    pub source: String,
}

impl Text {
    /// The built-in `workload`.
    pub fn builtin(workload: &Workload) -> Self {
        Self { text: workload.text.to_string(), source: workload.source.to_string() }
    }

    /// Parses the text as lengths ([`parse_lengths`]); errors name the source.
    pub fn lengths(&self) -> Result<Vec<u64>, Failure> {
        let lengths = parse_lengths(&self.text).map_err(|e| Failure::bad(format!("{}: {e}", self.source)))?;
        tracing::debug!(n = lengths.len(), source = %self.source, "read lengths");
        Ok(lengths)
    }
}

/// Where the lengths come from, as [`InputArgs`] chose it.
enum Source<'a> {
    /// A FILE (`-`: standard input).
    Path(&'a Path),
    /// A piped or redirected standard input.
    Stdin,
    /// A built-in workload.
    Builtin(&'static Workload),
}

impl InputArgs {
    /// FILE (`-` is standard input); without it `--workload`'s workload, else a piped or
    /// redirected standard input, else the default workload (with a note on stderr).
    fn source(&self) -> Source<'_> {
        if let Some(path) = &self.file {
            return Source::Path(path);
        }
        if let Some(workload) = self.workload {
            return Source::Builtin(workload);
        }
        if stdin_has_data() {
            return Source::Stdin;
        }
        let default = &WORKLOADS[0];
        eprintln!(
            "stowplan: no FILE and nothing piped on standard input: using the {}; give a FILE, pipe lengths, or --workload NAME",
            default.source
        );
        Source::Builtin(default)
    }

    /// Reads the text of the lengths from the [source](Self::source), up to the limit.
    pub fn read(&self) -> Result<Text, Failure> {
        match self.source() {
            Source::Path(path) => read_path(path, self.limit),
            Source::Builtin(workload) => Ok(Text::builtin(workload)),
            Source::Stdin => {
                let text = read_stdin(self.limit)?;
                if text.text.trim().is_empty() {
                    return Err(Failure::bad(
                        "standard input is empty: give lengths on it, a FILE, or --workload NAME",
                    ));
                }
                Ok(text)
            }
        }
    }

    /// The [source](Self::source) as a reader, for reading as the bytes arrive (no size
    /// limit: the reader's caller holds a bounded amount), and how reports name it.
    pub fn open(&self) -> Result<(Box<dyn Read>, String), Failure> {
        Ok(match self.source() {
            Source::Path(path) if path.as_os_str() == "-" => (Box::new(std::io::stdin()), "standard input".into()),
            Source::Path(path) => {
                let file =
                    std::fs::File::open(path).map_err(|e| Failure::bad(format!("reading {}: {e}", path.display())))?;
                (Box::new(file), path.display().to_string())
            }
            Source::Stdin => (Box::new(std::io::stdin()), "standard input".into()),
            Source::Builtin(w) => (Box::new(w.text.as_bytes()), w.source.to_string()),
        })
    }
}

/// Reads `path`: `-` is standard input, else a file (with a progress bar over its bytes when
/// stderr is a terminal).
pub fn read_path(path: &Path, limit: InputLimit) -> Result<Text, Failure> {
    if path.as_os_str() == "-" {
        return read_stdin(limit);
    }
    let file = std::fs::File::open(path).map_err(|e| Failure::bad(format!("reading {}: {e}", path.display())))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = progress(size, "reading lengths", "{bytes}/{total_bytes}");
    let text = limit.read(bar.wrap_read(file), &path.display().to_string())?;
    bar.finish_and_clear();
    Ok(Text { text, source: path.display().to_string() })
}

/// Reads all of standard input, up to `limit`.
fn read_stdin(limit: InputLimit) -> Result<Text, Failure> {
    let text = limit.read(std::io::stdin(), "standard input")?;
    Ok(Text { text, source: "standard input".to_string() })
}

/// Whether standard input is to be read: anything but a terminal, `/dev/null` or a closed
/// standard input (those fall back to the built-in workload). A pipe, a file, a socket and
/// any other device (`/dev/zero`, `/dev/urandom`) are read, and refused when they do not hold
/// lengths (the input limit bounds an endless device).
fn stdin_has_data() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return false;
    }
    let Ok(fd) = stdin.as_fd().try_clone_to_owned() else {
        return false;
    };
    let Ok(meta) = std::fs::File::from(fd).metadata() else {
        return false;
    };
    let null = std::fs::metadata("/dev/null");
    let is_null = null
        .is_ok_and(|n| (n.dev(), n.ino()) == (meta.dev(), meta.ino()) || (n.rdev() != 0 && n.rdev() == meta.rdev()));
    !is_null
}

/// A progress bar on stderr, hidden unless stderr is a terminal: `what`, the bar, `counter`
/// (an indicatif template piece such as `{bytes}/{total_bytes}`) and the time taken.
pub fn progress(len: u64, what: &str, counter: &str) -> indicatif::ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        indicatif::ProgressBar::new(len)
    } else {
        indicatif::ProgressBar::hidden()
    };
    let style = indicatif::ProgressStyle::with_template(&format!("{{msg:>16}} [{{bar:40}}] {counter} {{elapsed}}"))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_message(what.to_string());
    bar
}
