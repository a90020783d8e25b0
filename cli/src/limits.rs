//! `--limit NAME=CAP` and `--max-segments`, shared by `pack`, `plan` and `balance`: parsing,
//! reading the table they need, and the limits in a report.

use std::fmt;

use serde::Serialize;
use stowplan::kernel::MAX_RESOURCES;

use crate::failure::Failure;
use crate::input::Text;

/// A `--limit` value: NAME=CAP with a capacity of at least 1.
pub fn parse_limit(value: &str) -> Result<(String, u64), String> {
    let (name, cap) = value.split_once('=').ok_or_else(|| format!("{value:?}: expected NAME=CAP, e.g. images=32"))?;
    let cap: u64 = cap.trim().parse().map_err(|e| format!("{value:?}: CAP must be an integer ≥ 1 ({e})"))?;
    if cap == 0 || name.trim().is_empty() {
        return Err(format!("{value:?}: expected NAME=CAP with a name and a CAP of at least 1"));
    }
    Ok((name.trim().to_string(), cap))
}

/// The sizes `limits` need from `text`: with limits, a table whose header names its columns
/// (tokens first, then each limit's column), row by row, and the first column's name;
/// without (a segment limit alone), its lengths under the name `tokens`.
pub fn read_rows(text: &Text, limits: &[(String, u64)]) -> Result<(String, Vec<u64>), Failure> {
    check_limits(limits)?;
    let names: Vec<&str> = limits.iter().map(|(n, _)| n.as_str()).collect();
    read_table(text, &names)
}

/// Checks the `--limit` flags: at most 7, none named `tokens` (the first column, capped by
/// the command's own token flag) and no name twice.
pub fn check_limits(limits: &[(String, u64)]) -> Result<(), Failure> {
    if limits.len() >= MAX_RESOURCES {
        return Err(Failure::bad(format!(
            "--limit: at most {} limits besides the tokens (got {})",
            MAX_RESOURCES - 1,
            limits.len()
        )));
    }
    for (k, (name, _)) in limits.iter().enumerate() {
        if name == "tokens" {
            return Err(Failure::bad(
                "--limit tokens=…: the tokens are capped by the command's --capacity, not a further limit",
            ));
        }
        if limits[..k].iter().any(|(n, _)| n == name) {
            return Err(Failure::bad(format!("--limit {name}=…: {name:?} is given twice")));
        }
    }
    Ok(())
}

/// The columns `names` of the table `text` (its header names them, tokens first), row by row
/// after the first column, and the first column's name; with no names, its lengths under the
/// name `tokens`.
pub fn read_table(text: &Text, names: &[&str]) -> Result<(String, Vec<u64>), Failure> {
    if names.is_empty() {
        return Ok(("tokens".to_string(), text.lengths()?));
    }
    stowplan::input::parse_table(&text.text, names).map_err(|e| Failure::bad(format!("{}: {e}", text.source)))
}

/// A table's rows (tokens, then one size per further column) cut into the tokens and the
/// further sizes, row by row (`width`: the values in a row).
pub fn split_rows(rows: &[u64], width: usize) -> (Vec<u64>, Vec<u64>) {
    let tokens = rows.iter().step_by(width).copied().collect();
    let sizes = rows.chunks(width).flat_map(|row| row[1..].iter().copied()).collect();
    (tokens, sizes)
}

/// Every limit in a report, with the segment limit.
#[derive(Debug, Serialize)]
pub struct Limits {
    /// Every limit: the tokens first, then each `--limit` in order.
    pub resources: Vec<Limit>,
    /// `--max-segments` (0: none).
    pub max_segments: u64,
    /// ⌈packed sequences / max segments⌉ (absent without a segment limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub segments_lower_bound: Option<u64>,
}

/// One limit of [`Limits`].
#[derive(Debug, Serialize)]
pub struct Limit {
    /// The column.
    pub name: String,
    /// Per bin (or pack).
    pub capacity: u64,
    /// ⌈Σ sizes of the packed items / capacity⌉.
    pub lower_bound: u64,
    /// The largest load of a regular bin (or multi-sample pack).
    pub max_load: u64,
}

impl Limits {
    /// The limits `names` (tokens first) with their `caps`, `lower_bounds` (one per name, then
    /// the segments' with a segment limit), and the largest load in each resource of the
    /// regular bins whose loads `rows` gives (one row per bin, one entry per name).
    pub fn new<'a>(
        names: Vec<String>,
        caps: &[u64],
        max_segments: u64,
        lower_bounds: &[u64],
        rows: impl Iterator<Item = &'a [u64]>,
    ) -> Self {
        let mut max_loads = vec![0u64; names.len()];
        for row in rows {
            for (m, &l) in max_loads.iter_mut().zip(row) {
                *m = (*m).max(l);
            }
        }
        let resources = names
            .into_iter()
            .enumerate()
            .map(|(q, name)| Limit { name, capacity: caps[q], lower_bound: lower_bounds[q], max_load: max_loads[q] })
            .collect();
        let segments_lower_bound = (max_segments > 0).then(|| lower_bounds[caps.len()]);
        Limits { resources, max_segments, segments_lower_bound }
    }

    /// The limits for people, one line each; `unit` is what holds the items (`bin`, `pack`,
    /// `micro-batch`) and `units` its plural.
    pub fn write(&self, f: &mut fmt::Formatter<'_>, unit: &str, units: &str) -> fmt::Result {
        for lim in &self.resources {
            writeln!(
                f,
                "  {:<12} {:>12}  per {unit} at most; fullest {unit} {}, lower bound {} {units}",
                lim.name, lim.capacity, lim.max_load, lim.lower_bound
            )?;
        }
        if let Some(bound) = self.segments_lower_bound {
            writeln!(f, "  segments     {:>12}  per {unit} at most; lower bound {bound} {units}", self.max_segments)?;
        }
        Ok(())
    }
}
