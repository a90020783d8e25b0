//! The kernel's identity for Python: `kernel_info()` (the component's sha256 and its
//! imports) and `COST_PRESETS` (the cost presets, name → (linear, quadratic)).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use stowplan::Kernel;

use crate::errors::to_py;

/// The embedded kernel component's sha256 and its imports (always empty):
/// ``{"sha256": …, "imports": […]}``.
#[pyfunction]
fn kernel_info<'py>(py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
    let imports = py.detach(Kernel::wasm_imports).map_err(|e| to_py(py, e))?;
    let d = PyDict::new(py);
    d.set_item("sha256", stowplan::kernel::KERNEL_WASM_SHA256.trim())?;
    d.set_item("imports", imports)?;
    Ok(d)
}

/// Registers `kernel_info` and `COST_PRESETS`.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(kernel_info, m)?)?;
    let presets = PyDict::new(m.py());
    for (name, c) in stowplan::kernel::COST_PRESETS {
        presets.set_item(name, PyTuple::new(m.py(), [c.linear, c.quadratic])?)?;
    }
    m.add("COST_PRESETS", presets)
}
