//! Limits beside the tokens: the `resources=`/`limits=` options of
//! `micro_batches`, `balance`, `StaticPackPlan.from_lengths`, `StreamPacker` and
//! `materialize`, read into the kernel's row layout.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::{Lengths, invalid, u64_arg};

/// A ``limits`` dict (resource name → cap per bin or micro-batch, each ≥ 1) as caps and
/// names in its order; empty without one. The kernel checks the names (not ``"tokens"``, at
/// most 7) and names them in its messages.
pub(crate) fn caps_arg(py: Python<'_>, limits: Option<&Bound<'_, PyAny>>) -> PyResult<(Vec<u64>, Vec<String>)> {
    let limits = limits
        .filter(|l| !l.is_none())
        .map(|l| {
            l.cast::<PyDict>().map_err(|_| {
                invalid(py, format!("limits must be a dict of resource name → cap (got {})", l.get_type()))
            })
        })
        .transpose()?;
    let (mut caps, mut names) = (Vec::new(), Vec::new());
    for (k, v) in limits.into_iter().flat_map(|d| d.iter()) {
        let name: String =
            k.extract().map_err(|_| invalid(py, format!("limits' keys must be resource names (str), got {k}")))?;
        caps.push(u64_arg(&v, &format!("limits['{name}']"), 1)?);
        names.push(name);
    }
    Ok((caps, names))
}

/// ``resources`` and ``limits`` together (both or neither): the kernel's rows, caps and names
/// (see [`limit_rows`]), or `None`.
#[allow(clippy::type_complexity)]
pub(crate) fn limits_arg(
    py: Python<'_>,
    resources: Option<&Bound<'_, PyDict>>,
    limits: Option<&Bound<'_, PyDict>>,
    n: usize,
) -> PyResult<Option<(Vec<u64>, Vec<u64>, Vec<String>)>> {
    match (resources, limits) {
        (None, None) => Ok(None),
        (Some(r), Some(c)) => limit_rows(py, r, c, n).map(Some),
        (Some(_), None) => Err(invalid(py, "resources needs limits (the cap of each resource)".into())),
        (None, Some(_)) => Err(invalid(py, "limits needs resources (the sequences' sizes in each)".into())),
    }
}

/// `resources` (name → one size per sequence) and `limits` (the same names → cap) as the
/// kernel's rows: sizes sequence by sequence, caps and names in `resources`' order. Errors
/// name the key: not a string, `"tokens"`, missing from the other dict, sizes not one per
/// sequence (`n`), a cap below 1, more than 7 limits.
pub(crate) fn limit_rows(
    py: Python<'_>,
    resources: &Bound<'_, PyDict>,
    limits: &Bound<'_, PyDict>,
    n: usize,
) -> PyResult<(Vec<u64>, Vec<u64>, Vec<String>)> {
    let most = stowplan::kernel::MAX_RESOURCES - 1;
    if resources.is_empty() || resources.len() > most {
        return Err(invalid(py, format!("resources must name 1 to {most} resources (got {})", resources.len())));
    }
    let key = |k: &Bound<'_, PyAny>, what: &str| -> PyResult<String> {
        let name: String = k.extract().map_err(|_| {
            let shown = k.repr().map(|r| r.to_string()).unwrap_or_default();
            invalid(py, format!("{what}' keys must be resource names (str), got {shown}"))
        })?;
        if name == "tokens" {
            return Err(invalid(
                py,
                format!(
                    "{what}['tokens']: the tokens are lengths and their cap (capacity), not a \
                     further limit"
                ),
            ));
        }
        Ok(name)
    };
    let (mut names, mut caps, mut cols) = (Vec::new(), Vec::new(), Vec::new());
    for (k, values) in resources.iter() {
        let name = key(&k, "resources")?;
        let Some(cap) = limits.get_item(&name)? else {
            return Err(invalid(py, format!("limits has no cap for resources['{name}']")));
        };
        caps.push(u64_arg(&cap, &format!("limits['{name}']"), 1)?);
        let col = Lengths::extract(&values, &format!("resources['{name}']"))?.slice().to_vec();
        if col.len() != n {
            return Err(invalid(
                py,
                format!("resources['{name}'] has {} sizes, lengths {n}: one per sequence", col.len()),
            ));
        }
        cols.push(col);
        names.push(name);
    }
    for k in limits.keys() {
        let name = key(&k, "limits")?;
        if !names.contains(&name) {
            return Err(invalid(
                py,
                format!("limits['{name}'] has no sizes in resources (resources: {})", names.join(", ")),
            ));
        }
    }
    let sizes = (0..n).flat_map(|i| cols.iter().map(move |c| c[i])).collect();
    Ok((sizes, caps, names))
}
