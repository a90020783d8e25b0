//! Buffer-filter plugins for Python (`stowplan._stowplan.Filter`): the host's sandboxed
//! `Filter`, behind a mutex so the class is shareable and calls can release the GIL.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use stowplan::{
    Filter,
    filter::{FilterOptions, OnFailure},
};

use crate::convert::pythonized;
use crate::str_options;
use crate::{Nullable, int, invalid, number, opt_parse, to_py, u64_arg};

/// A loaded plugin; see `stowplan.Filter` for the Python-facing class.
#[pyclass(module = "stowplan._stowplan", name = "Filter")]
#[derive(Debug)]
pub struct PyFilter {
    pub(crate) inner: Mutex<Filter>,
}

impl PyFilter {
    /// The filter, locked with the GIL held ([`crate::lock`]: never waited for with it held).
    fn locked(&self, py: Python<'_>) -> std::sync::MutexGuard<'_, Filter> {
        crate::lock(py, &self.inner)
    }

    /// The filter, locked without the GIL (inside `py.detach`).
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, Filter> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyFilter {
    /// Filter(path, *, sha256, config=None, timeout=None, fuel=..., memory_limit=None,
    /// output_limit=None, on_failure=None, max_plugin_bytes=None): loads and instantiates the
    /// plugin (GIL released while compiling). Omitted options: the host's defaults
    /// (``FilterOptions::new``: config ``{}``, 1 s, 10**9 fuel, 256 MiB, 64 KiB of output per
    /// stream, ``"error"``, a file of at most ``MAX_PLUGIN_BYTES``);
    /// ``fuel=None``: no fuel bound. ``config`` is JSON text; ``timeout`` seconds.
    #[new]
    #[pyo3(signature = (path, *, sha256, config=None, timeout=None, fuel=Nullable::Omitted, memory_limit=None,
        output_limit=None, on_failure=None, max_plugin_bytes=None))]
    #[allow(clippy::too_many_arguments)]
    fn new<'py>(
        py: Python<'py>,
        path: PathBuf,
        sha256: &str,
        config: Option<String>,
        timeout: Option<&Bound<'py, PyAny>>,
        fuel: Nullable<'py>,
        memory_limit: Option<&Bound<'py, PyAny>>,
        output_limit: Option<&Bound<'py, PyAny>>,
        on_failure: Option<&Bound<'_, PyAny>>,
        max_plugin_bytes: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Self> {
        str_options!(on_failure);
        // Conversions only; the host checks the ranges (and names them).
        let d = FilterOptions::new(sha256);
        let timeout = match timeout {
            None => d.timeout,
            Some(t) => {
                let seconds = number(t, "timeout", "a number of seconds")?;
                Duration::try_from_secs_f64(seconds)
                    .map_err(|_| invalid(py, format!("timeout must be in 0.001..=600 seconds (got {seconds})")))?
            }
        };
        let bytes = |v: Option<&Bound<'py, PyAny>>, name: &str, default: usize| -> PyResult<usize> {
            v.map(|v| int(v, name, 0, u64::MAX.into())).transpose().map(|v| v.unwrap_or(default))
        };
        let options = FilterOptions {
            config: config.unwrap_or(d.config.clone()),
            timeout,
            fuel: fuel.resolve(d.fuel, |f| u64_arg(f, "fuel", 0))?,
            memory_limit: bytes(memory_limit, "memory_limit", d.memory_limit)?,
            output_limit: bytes(output_limit, "output_limit", d.output_limit)?,
            on_failure: opt_parse::<OnFailure>(py, on_failure)?.unwrap_or(d.on_failure),
            max_plugin_bytes: max_plugin_bytes
                .map(|v| u64_arg(v, "max_plugin_bytes", 0))
                .transpose()?
                .unwrap_or(d.max_plugin_bytes),
            ..d
        };
        let filter = py.detach(|| Filter::load(&path, options)).map_err(|e| to_py(py, e))?;
        Ok(Self { inner: Mutex::new(filter) })
    }

    /// The plugin's file name.
    #[getter]
    fn name(&self, py: Python<'_>) -> String {
        self.locked(py).name().to_string()
    }

    /// The component's sha256 (hex).
    #[getter]
    fn sha256(&self, py: Python<'_>) -> String {
        self.locked(py).sha256().to_string()
    }

    /// The component's imports (WASI interfaces).
    #[getter]
    fn imports(&self, py: Python<'_>) -> Vec<String> {
        self.locked(py).imports().to_vec()
    }

    /// Where the compiled code came from: "cache" or "compiled".
    #[getter]
    fn origin(&self, py: Python<'_>) -> &'static str {
        self.locked(py).origin()
    }

    /// Counters: calls, failures, fallbacks, instances.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let stats = self.locked(py).stats();
        pythonized(py, &stats)
    }

    /// What the last call wrote: a list of ("stdout" | "stderr", text).
    #[getter]
    fn last_output(&self, py: Python<'_>) -> Vec<(String, String)> {
        self.locked(py).last_output().iter().map(|(s, t)| (s.to_string(), t.clone())).collect()
    }
}

/// hash_plugin(path, max_plugin_bytes=None): the sha256 (hex) of a plugin file, streamed;
/// a file over ``max_plugin_bytes`` (default ``MAX_PLUGIN_BYTES``) raises
/// ``InvalidArgumentError`` after reading at most one byte more.
#[pyfunction]
#[pyo3(signature = (path, max_plugin_bytes=None))]
fn hash_plugin(py: Python<'_>, path: PathBuf, max_plugin_bytes: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let max = max_plugin_bytes.map(|v| u64_arg(v, "max_plugin_bytes", 0)).transpose()?;
    let max = max.unwrap_or(stowplan::filter::MAX_PLUGIN_BYTES);
    py.detach(|| stowplan::filter::hash_plugin(&path, max)).map_err(|e| to_py(py, e))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("MAX_PLUGIN_BYTES", stowplan::filter::MAX_PLUGIN_BYTES)?;
    m.add_function(wrap_pyfunction!(hash_plugin, m)?)?;
    m.add_class::<PyFilter>()
}
