//! What the commands share: value parsers built from the kernel's names, the kernel
//! handle, the options every lengths-reading command takes, and printing reports.

use std::ffi::OsStr;
use std::fmt;
use std::io::Write;
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Instant;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use serde::Serialize;
use stowplan::{
    Backend, Kernel,
    kernel::{Cost, Named},
};

use crate::failure::Failure;
use crate::input::InputArgs;

/// A clap value parser of one of the kernel's named enums: `--help` lists
/// [`Named::names`], parsing is the enum's [`FromStr`] (so `next_fit` is `next-fit`), and
/// anything else is clap's own "invalid value" error listing the names.
#[derive(Debug)]
pub struct NamedParser<T>(PhantomData<fn() -> T>);

impl<T> Clone for NamedParser<T> {
    fn clone(&self) -> Self {
        Self(PhantomData)
    }
}

/// The value parser of `T` (`#[arg(value_parser = named::<PackMethod>())]`).
pub fn named<T: Named>() -> NamedParser<T> {
    NamedParser(PhantomData)
}

impl<T> TypedValueParser for NamedParser<T>
where
    T: Named + FromStr + Send + Sync + 'static,
{
    type Value = T;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &OsStr) -> Result<T, clap::Error> {
        if let Some(v) = value.to_str().and_then(|s| s.parse::<T>().ok()) {
            return Ok(v);
        }
        // Not a name: clap's error for a value outside the names (it lists them and
        // suggests the closest one).
        match PossibleValuesParser::new(T::names()).parse_ref(cmd, arg, value) {
            Err(e) => Err(e),
            Ok(s) => Err(clap::Error::raw(
                clap::error::ErrorKind::InvalidValue,
                format!("{s:?} is a name of {} but does not parse\n", T::WHAT),
            )),
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(T::names().map(PossibleValue::new)))
    }
}

/// The options of `partition`, `pack` and `balance` besides their own.
#[derive(clap::Args, Debug)]
pub struct Common {
    /// Where the lengths come from.
    #[command(flatten)]
    pub input: InputArgs,
    /// Which kernel runs the plan: the WASM component (default) or the same code natively.
    #[arg(long, value_parser = named::<Backend>(), default_value_t = Backend::default())]
    pub backend: Backend,
    /// Print the result as JSON on stdout instead of a human summary.
    #[arg(long)]
    pub json: bool,
}

/// A ready kernel and how long getting it ready took.
#[derive(Debug)]
pub struct ReadyKernel {
    /// The kernel.
    pub kernel: Kernel,
    /// Milliseconds to create it (compiling or loading the WASM component).
    pub init_ms: f64,
}

impl ReadyKernel {
    /// Creates the kernel on `backend`, timing it.
    pub fn new(backend: Backend) -> Result<Self, Failure> {
        let t = Instant::now();
        let kernel = Kernel::new(backend)?;
        let init_ms = t.elapsed().as_secs_f64() * 1e3;
        tracing::debug!(%backend, origin = ?kernel.wasm_origin(), ms = init_ms, "kernel ready");
        Ok(Self { kernel, init_ms })
    }

    /// Runs `f` on the kernel and reports its result with the timings of the call.
    pub fn timed<R>(&self, f: impl FnOnce(&Kernel) -> Result<R, stowplan::Error>) -> Result<(R, KernelRun), Failure> {
        let t = Instant::now();
        let r = f(&self.kernel)?;
        let run = KernelRun {
            backend: self.kernel.backend(),
            elapsed_ms: t.elapsed().as_secs_f64() * 1e3,
            init_ms: self.init_ms,
            kernel_origin: self.kernel.wasm_origin(),
        };
        Ok((r, run))
    }
}

/// Which kernel ran a call, and how long it took (part of the `partition`, `pack` and
/// `balance` reports).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct KernelRun {
    /// `wasm` or `native`.
    #[serde(serialize_with = "name")]
    pub backend: Backend,
    /// Milliseconds of the kernel call.
    pub elapsed_ms: f64,
    /// Milliseconds to get the kernel ready.
    pub init_ms: f64,
    /// Where the compiled WASM kernel came from (`cache` or `compiled`); `None` natively.
    pub kernel_origin: Option<&'static str>,
}

impl KernelRun {
    /// The `time` line of the human summaries, label padded to `width` and the time right
    /// aligned in `digits` characters.
    pub fn time_line(&self, f: &mut fmt::Formatter<'_>, width: usize, digits: usize) -> fmt::Result {
        writeln!(f, "  {:<width$}{:>digits$.3} ms  (kernel ready in {:.1} ms)", "time", self.elapsed_ms, self.init_ms)
    }
}

/// Serializes a named enum as its name (`#[serde(serialize_with = "name")]`).
pub fn name<T: Named, S: serde::Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(value.as_str())
}

/// A cost model in JSON: `{"linear": A, "quadratic": B}`.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CostJson {
    /// Coefficient of `L`.
    pub linear: u64,
    /// Coefficient of `L²`.
    pub quadratic: u64,
}

impl From<Cost> for CostJson {
    fn from(c: Cost) -> Self {
        Self { linear: c.linear, quadratic: c.quadratic }
    }
}

/// A cost model for people: the preset's name and its formula (`attention (24576·L + L²)`),
/// or the formula alone (`3·L + 2·L²`).
#[derive(Clone, Copy, Debug)]
pub struct CostText(pub Cost);

impl fmt::Display for CostText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Cost { linear, quadratic } = self.0;
        let term = |c: u64, var: &str| match c {
            0 => None,
            1 => Some(var.to_string()),
            c => Some(format!("{c}·{var}")),
        };
        let terms: Vec<String> = [term(linear, "L"), term(quadratic, "L²")].into_iter().flatten().collect();
        let formula = if terms.is_empty() { "0".to_string() } else { terms.join(" + ") };
        match self.0.preset_name() {
            Some(preset) => write!(f, "{preset} ({formula})"),
            None => f.write_str(&formula),
        }
    }
}

/// Prints `report` on stdout: as one line of JSON with `--json`, else its human summary.
pub fn print_report<R: Serialize + fmt::Display>(report: &R, json: bool) -> Result<(), Failure> {
    if json { print_json(report, false) } else { print_human(report) }
}

/// Prints `report`'s human form on stdout.
pub fn print_human<R: fmt::Display>(report: &R) -> Result<(), Failure> {
    write_stdout(|out| write!(out, "{report}"))
}

/// Prints `report` on stdout as JSON (`pretty`: indented over several lines).
pub fn print_json<R: Serialize>(report: &R, pretty: bool) -> Result<(), Failure> {
    let text = if pretty { serde_json::to_string_pretty(report) } else { serde_json::to_string(report) }
        .map_err(|e| Failure::bad(format!("encoding the report as JSON: {e}")))?;
    write_stdout(|out| writeln!(out, "{text}"))
}

/// Writes to stdout and flushes; a failed write is an error (a closed pipe ends the one-shot
/// commands by SIGPIPE before that).
fn write_stdout(write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    write(&mut out).and_then(|()| out.flush()).map_err(|e| Failure::bad(format!("writing standard output: {e}")))
}

/// The smallest and largest of `values` (`0..0` when empty), for "`min`..`max` items" lines.
pub fn min_max(values: impl IntoIterator<Item = usize>) -> (usize, usize) {
    values
        .into_iter()
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((v.min(lo), v.max(hi))),
        })
        .unwrap_or((0, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_for_people() {
        assert_eq!(CostText(Cost::ATTENTION).to_string(), "attention (24576·L + L²)");
        assert_eq!(CostText(Cost::TOKENS).to_string(), "tokens (L)");
        assert_eq!(CostText(Cost { linear: 3, quadratic: 2 }).to_string(), "3·L + 2·L²");
        assert_eq!(CostText(Cost { linear: 0, quadratic: 0 }).to_string(), "0");
    }

    #[test]
    fn min_max_of_sizes() {
        assert_eq!(min_max([3, 1, 2]), (1, 3));
        assert_eq!(min_max([]), (0, 0));
    }
}

/// The token cap a command was given: `--capacity`, or its former flag `--{former}` (hidden,
/// `conflicts_with = "capacity"`), which keeps working for one release with a warning that
/// names the new flag. The one place the commands' former cap flags are handled.
pub fn capacity(command: &str, capacity: Option<u64>, former: (&str, Option<u64>)) -> Option<u64> {
    if former.1.is_some() {
        tracing::warn!(
            target: "stowplan::cli",
            "stowplan {command}: --{} is deprecated and will be removed in the next release; use --capacity",
            former.0
        );
    }
    capacity.or(former.1)
}
