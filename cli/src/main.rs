//! `stowplan`: the command-line face of the kernel.
//!
//! Exit codes: 0 ok, 1 infeasible, 2 bad input or any other error, 130 `pack-dataset`
//! stopped by SIGINT/SIGTERM while writing. Logs go to stderr, filtered by `STOWPLAN_LOG`
//! (e.g. `STOWPLAN_LOG=debug`).
//!
//! One file per command: each parses its options, calls the library, and prints a typed
//! report — as JSON with `--json` (its `Serialize`), else for people (its `Display`). The
//! kernel's results inside a report are the library's typed reports (`stowplan::json`).

mod arrow;
mod balance;
mod common;
mod failure;
mod filter;
mod input;
mod keys;
mod limits;
mod pack;
mod pack_dataset;
mod partition;
mod plan;
mod serve;
mod stream;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "stowplan",
    version,
    about = "Plan how variable-length sequences are packed into micro-batches and spread over ranks.",
    after_help = "Lengths: `partition`, `pack` and `balance` read a FILE, `-` (standard input), a piped or \
                  redirected standard input, or a built-in workload (--workload NAME; the default one when \
                  standard input is a terminal)."
)]
struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

/// The commands.
#[derive(Subcommand, Debug)]
enum Command {
    /// Split lengths (weights) into K groups with balanced sums, e.g. a global batch over DP ranks.
    Partition(partition::Args),
    /// Pack lengths into bins of at most CAPACITY tokens, e.g. sequences into packed micro-batches.
    Pack(pack::Args),
    /// Balance a global batch over DP ranks and/or split it into micro-batches of at most
    /// CAPACITY tokens (a hard cap), balancing a cost model.
    Balance(balance::Args),
    /// Build a static pack plan of a whole SFT dataset (packs fixed before training): at most
    /// CAPACITY tokens, aligned so that WORLD_SIZE ranks get the same number of packs.
    Plan(plan::Args),
    /// Pack the rows of a tokenized table (an Arrow IPC file such as a `datasets` cache file)
    /// into rows of at most CAPACITY tokens, written as an Arrow IPC stream (a build with the
    /// `arrow` feature).
    PackDataset(pack_dataset::Args),
    /// Inspect buffer-filter plugins (WebAssembly components of stowplan:filter/buffer-filter).
    #[command(subcommand)]
    Filter(filter::Command),
    /// Run the packer: training batches from an orchestrator in, balanced micro-batches out to
    /// every trainer rank, checkpointed with every step (restart resumes with nothing lost).
    Serve(serve::Args),
    /// Make a ZeroMQ CURVE key pair (certificates DIR/NAME.key and DIR/NAME.key_secret) for
    /// `serve --zmq-curve-secret/--zmq-curve-clients` and its clients (a build with the `zmq`
    /// feature).
    Keys(keys::Args),
}

/// Parses the command line, runs the command, and turns a failure into its message on stderr
/// and its exit code.
fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        restore_sigpipe();
    }
    ignore_sigxfsz();
    init_logs(&cli.command);
    let result = match cli.command {
        Command::Partition(a) => partition::run(a),
        Command::Pack(a) => pack::run(a),
        Command::Balance(a) => balance::run(a),
        Command::Plan(a) => plan::run(a),
        Command::PackDataset(a) => pack_dataset::run(a),
        Command::Filter(c) => filter::run(c),
        Command::Serve(a) => serve::run(a),
        Command::Keys(a) => keys::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("stowplan: error: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

/// Restores the default action of SIGPIPE. Rust ignores it, so `stowplan pack --json | head`
/// would fail on the first write after `head` left; the one-shot commands behave like every
/// Unix filter instead: a closed stdout ends them quietly. `serve` keeps the ignore: it owns
/// sockets whose peers may go away and reports that as an error.
fn restore_sigpipe() {
    // SAFETY: called before any thread exists; SIG_DFL is a valid action for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Ignores SIGXFSZ, whose default action kills the process (with a core dump) when a write
/// passes the file-size limit (`ulimit -f`): the write then fails with EFBIG instead, which
/// every writer reports as an `io` error naming the file (exit 2), and the atomic writer
/// removes its temporary file, as on a full disk.
fn ignore_sigxfsz() {
    // SAFETY: called before any thread exists; SIG_IGN is a valid action for SIGXFSZ.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Logs to stderr, filtered by `STOWPLAN_LOG`: warnings by default, and `serve`'s step
/// events (a service logs them), as JSON with `serve --log-format json`.
///
/// The filter is a default level and levels per target, `warn,stowplan::serve=debug`
/// (tracing-subscriber's `Targets`: no regular expressions, so the CLI does not compile a
/// regex engine). A value that is not such a filter is said on stderr, and the default is
/// used.
fn init_logs(command: &Command) {
    use tracing_subscriber::prelude::*;
    let (default_filter, json_logs) = match command {
        Command::Serve(a) => ("warn,stowplan::serve=info", a.log_format == serve::LogFormat::Json),
        _ => ("warn", false),
    };
    let given = std::env::var("STOWPLAN_LOG").ok().filter(|v| !v.trim().is_empty());
    let filter = given.and_then(|v| {
        log_filter(&v)
            .map_err(|e| {
                eprintln!(
                    "stowplan: STOWPLAN_LOG={v:?} is not a log filter ({e}): expected a level or target=level \
                     pairs, e.g. `debug` or `warn,stowplan::serve=debug` (levels: off, error, warn, info, debug, \
                     trace); logging with the default, {default_filter:?}"
                )
            })
            .ok()
    });
    let filter = filter.unwrap_or_else(|| log_filter(default_filter).expect("the default log filters parse"));
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = if json_logs { logs.json().boxed() } else { logs.with_ansi(std::io::stderr().is_terminal()).boxed() };
    tracing_subscriber::registry().with(logs.with_filter(filter)).init();
}

/// `text` as a log filter: comma-separated directives, each a level or `target=level`, blank
/// ones skipped (`Targets` reads an empty directive as the level `error`). Span and field
/// selectors (`target[span{field}]=level`, which `Targets` would take as part of a target
/// that matches nothing) are refused.
fn log_filter(text: &str) -> Result<tracing_subscriber::filter::Targets, String> {
    let directives: Vec<&str> = text.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    if let Some(d) = directives.iter().find(|d| d.contains(['[', ']', '{', '}'])) {
        return Err(format!("{d:?} selects spans or fields, which this filter does not"));
    }
    directives.join(",").parse().map_err(|e| format!("{e}"))
}

/// The process's allocator: the system's, with allocations of at least [`HUGE`] bytes marked
/// for transparent huge pages (`madvise(MADV_HUGEPAGE)`, what numpy does for its large
/// arrays). Where THP is `madvise`-only (a common default), `pack-dataset`'s batch buffers
/// (hundreds of MiB each, filled once) otherwise fault in 4 KiB pages: measured, that doubled
/// the time of writing them to the file.
struct HugePages;

/// The size from which an allocation asks for huge pages.
const HUGE: usize = 4 << 20;

// SAFETY: every call is forwarded to `System` unchanged; `madvise` only advises on memory
// `System` just returned (its failure is ignored: it is advice).
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for HugePages {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        if new_size < HUGE {
            // SAFETY: the caller's contract, passed on.
            return unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        }
        // A block growing large (a Vec doubling) moves into memory advised before it is
        // written: the system's realloc would copy into fresh 4 KiB pages first.
        let Ok(new_layout) = std::alloc::Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        // SAFETY: `new_layout` has a non-zero size (≥ HUGE).
        let p = unsafe { self.alloc(new_layout) };
        if !p.is_null() {
            // SAFETY: both blocks are valid for the smaller size and do not overlap; the old
            // one is freed with the layout it was allocated with.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                std::alloc::System.dealloc(ptr, layout);
            }
        }
        p
    }
}

/// Asks for huge pages over the whole 2 MiB pages inside `p..p+size`, when `size` ≥ [`HUGE`].
fn advise(p: *mut u8, size: usize) {
    const PAGE: usize = 2 << 20;
    if p.is_null() || size < HUGE {
        return;
    }
    let start = (p as usize).next_multiple_of(PAGE);
    let end = (p as usize + size) / PAGE * PAGE;
    if end > start {
        // SAFETY: the range lies inside the allocation just made; madvise reads no memory.
        #[allow(unsafe_code)]
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

#[global_allocator]
static ALLOCATOR: HugePages = HugePages;
