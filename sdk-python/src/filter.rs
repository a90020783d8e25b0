//! Buffer-filter plugins for Python (`stowplan._stowplan.Filter`): the host's sandboxed
//! `WasmFilter`, behind a mutex so the class is shareable and calls can release the GIL.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use stowplan::{FilterOptions, OnFailure, WasmFilter};

use crate::{invalid, to_py};

/// A loaded plugin; see `stowplan.Filter` for the Python-facing class.
#[pyclass(module = "stowplan._stowplan", name = "Filter")]
#[derive(Debug)]
pub struct PyFilter {
    pub(crate) inner: Mutex<WasmFilter>,
}

impl PyFilter {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, WasmFilter> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl PyFilter {
    /// Filter(path, sha256, config_json, timeout_s, fuel, memory_limit, output_limit,
    /// on_failure): loads and instantiates the plugin (GIL released while compiling).
    #[new]
    #[pyo3(signature = (path, sha256, config_json, timeout_s, fuel, memory_limit, output_limit, on_failure))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        sha256: &str,
        config_json: String,
        timeout_s: f64,
        fuel: Option<i128>,
        memory_limit: i128,
        output_limit: i128,
        on_failure: &str,
    ) -> PyResult<Self> {
        // Conversions only; the host checks the ranges (and names them).
        let timeout = Duration::try_from_secs_f64(timeout_s)
            .map_err(|_| invalid(py, format!("timeout must be in 0.001..=600 seconds (got {timeout_s})")))?;
        let fuel = fuel
            .map(|f| {
                u64::try_from(f).map_err(|_| invalid(py, format!("fuel must be an integer >= 10000 or None (got {f})")))
            })
            .transpose()?;
        let bytes = |v: i128, what: &str, range: &str| {
            usize::try_from(v).map_err(|_| invalid(py, format!("{what} must be in {range} bytes (got {v})")))
        };
        let options = FilterOptions {
            config: config_json,
            timeout,
            fuel,
            memory_limit: bytes(memory_limit, "memory_limit", "2**20..=2**32")?,
            output_limit: bytes(output_limit, "output_limit", "0..=2**24")?,
            on_failure: on_failure.parse::<OnFailure>().map_err(|e| to_py(py, e))?,
            ..FilterOptions::new(sha256)
        };
        let filter = py.detach(|| WasmFilter::load(&path, options)).map_err(|e| to_py(py, e))?;
        Ok(Self { inner: Mutex::new(filter) })
    }

    /// The plugin's file name.
    #[getter]
    fn name(&self) -> String {
        self.lock().name().to_string()
    }

    /// The component's sha256 (hex).
    #[getter]
    fn sha256(&self) -> String {
        self.lock().sha256().to_string()
    }

    /// The component's imports (WASI interfaces).
    #[getter]
    fn imports(&self) -> Vec<String> {
        self.lock().imports().to_vec()
    }

    /// Where the compiled code came from: "cache" or "compiled".
    #[getter]
    fn origin(&self) -> &'static str {
        self.lock().origin()
    }

    /// Counters: calls, failures, fallbacks, instances.
    #[getter]
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.lock().stats();
        let d = PyDict::new(py);
        d.set_item("calls", s.calls)?;
        d.set_item("failures", s.failures)?;
        d.set_item("fallbacks", s.fallbacks)?;
        d.set_item("instances", s.instances)?;
        Ok(d)
    }

    /// What the last call wrote: a list of ("stdout" | "stderr", text).
    #[getter]
    fn last_output(&self) -> Vec<(String, String)> {
        self.lock().last_output().iter().map(|(s, t)| (s.to_string(), t.clone())).collect()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyFilter>()
}
