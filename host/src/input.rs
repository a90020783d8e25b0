//! Reading lengths: one integer per line, or a JSON array of integers.

use crate::Error;
use crate::error::excerpt;

/// How much of a bad line an error message quotes.
const QUOTED: usize = 80;

/// The built-in default workload: 4,096 RL rollout lengths (512 prompts × 8 samples, a copy
/// of `shared/workloads/rl-math-8k.txt`).
pub const DEFAULT_WORKLOAD: &str = include_str!("../assets/rl-math-8k.txt");

/// The name of [`DEFAULT_WORKLOAD`] as shown to users.
pub const DEFAULT_WORKLOAD_NAME: &str = "built-in rl-math-8k (4,096 rollouts)";

/// A built-in workload: lengths embedded in the library, chosen by name (the CLI's
/// `--workload NAME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The name it is chosen by (`rl-math-8k`).
    pub name: &'static str,
    /// What the lengths are, in one line (listed by `stowplan --help`).
    pub description: &'static str,
    /// How reports name it as a source (`built-in rl-math-8k (4,096 rollouts)`).
    pub source: &'static str,
    /// The lengths, in a format [`parse_lengths`] reads.
    pub text: &'static str,
}

/// Every built-in workload, the default ([`DEFAULT_WORKLOAD`]) first. Only small assets are
/// embedded; the large shared workloads (100k+ lines) are read from files.
pub const WORKLOADS: &[Workload] = &[Workload {
    name: "rl-math-8k",
    description: "an RL step on math/reasoning: 512 prompts × 8 rollouts, 4,096 lengths capped at 8,192 tokens",
    source: DEFAULT_WORKLOAD_NAME,
    text: DEFAULT_WORKLOAD,
}];

/// The built-in workload called `name`, if there is one.
pub fn workload(name: &str) -> Option<&'static Workload> {
    WORKLOADS.iter().find(|w| w.name == name)
}

/// Parses lengths from `text`: a JSON array of non-negative integers (when the first
/// non-blank character is `[`), or one non-negative integer per line (blank lines and lines
/// starting with `#` are skipped). Errors name the line (or JSON position) at fault.
pub fn parse_lengths(text: &str) -> Result<Vec<u64>, Error> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        // serde_json's message quotes the offending value (a string of any length): cut it.
        return serde_json::from_str::<Vec<u64>>(trimmed).map_err(|e| {
            Error::InvalidArgument(format!(
                "lengths: expected a JSON array of integers in 0..=18446744073709551615: {}",
                excerpt(&e.to_string(), 2 * QUOTED)
            ))
        });
    }
    let mut out = Vec::new();
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let v = line.parse::<u64>().map_err(|e| {
            Error::InvalidArgument(format!(
                "lengths, line {}: {:?} is not an integer in 0..=18446744073709551615 ({e})",
                no + 1,
                excerpt(line, QUOTED)
            ))
        })?;
        out.push(v);
    }
    Ok(out)
}

/// Parses lengths from column `column` (1-based) of a simple delimited text file: fields
/// separated by tabs (when the line holds one), else commas (when it holds one), else
/// whitespace. Blank lines and lines starting with `#` are skipped; when the first remaining
/// line's field is not an integer it is taken as a header. Errors name the line and column.
pub fn parse_column(text: &str, column: usize) -> Result<Vec<u64>, Error> {
    if column == 0 {
        return Err(Error::InvalidArgument("column is 1-based: it must be at least 1 (got 0)".to_string()));
    }
    let mut out = Vec::new();
    let mut first = true;
    for (no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let field = if line.contains('\t') {
            line.split('\t').nth(column - 1)
        } else if line.contains(',') {
            line.split(',').nth(column - 1)
        } else {
            line.split_whitespace().nth(column - 1)
        };
        let Some(field) = field.map(str::trim) else {
            return Err(Error::InvalidArgument(format!("lengths, line {}: has no column {column}", no + 1)));
        };
        match field.parse::<u64>() {
            Ok(v) => out.push(v),
            Err(_) if first => {}
            Err(e) => {
                return Err(Error::InvalidArgument(format!(
                    "lengths, line {}, column {column}: {:?} is not an integer in 0..=18446744073709551615 ({e})",
                    no + 1,
                    excerpt(field, QUOTED)
                )));
            }
        }
        first = false;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_quote_a_bounded_excerpt_of_a_bad_line() {
        let line = "x".repeat(10_000_000);
        let e = parse_lengths(&format!("5\n{line}\n")).unwrap_err().to_string();
        assert!(e.len() < 300, "{} bytes", e.len());
        assert!(e.contains("line 2") && e.contains("10000000 bytes, the first 80 shown"), "{e}");
        let e = parse_column(&format!("a,b\n1,{line}\n"), 2).unwrap_err().to_string();
        assert!(e.len() < 300 && e.contains("column 2"), "{e}");
        // Found by the `lengths` fuzz target: serde_json quotes a bad string value whole.
        let e = parse_lengths(&format!("[\"{line}\"]")).unwrap_err().to_string();
        assert!(e.len() < 400 && e.contains("invalid type: string"), "{e}");
    }

    #[test]
    fn lines_and_json() {
        assert_eq!(parse_lengths("3\n\n# c\n 5 \n").unwrap(), vec![3, 5]);
        assert_eq!(parse_lengths(" [1, 2,3]").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_lengths(&DEFAULT_WORKLOAD).unwrap().len(), 4096);
    }

    #[test]
    fn workloads_by_name_default_first() {
        assert_eq!(WORKLOADS[0].text, DEFAULT_WORKLOAD);
        assert_eq!(workload("rl-math-8k"), Some(&WORKLOADS[0]));
        assert_eq!(workload("nope"), None);
        for w in WORKLOADS {
            assert!(!parse_lengths(w.text).unwrap().is_empty(), "{}", w.name);
        }
    }

    #[test]
    fn columns() {
        assert_eq!(parse_column("id\tlen\na\t3\nb\t5\n", 2).unwrap(), vec![3, 5]);
        assert_eq!(parse_column("# x\n1,7\n2,9\n", 2).unwrap(), vec![7, 9]);
        assert_eq!(parse_column("1 7\n2   9\n", 1).unwrap(), vec![1, 2]);
        let e = parse_column("1,7\n2\n", 2).unwrap_err();
        assert!(e.to_string().contains("line 2: has no column 2"), "{e}");
        let e = parse_column("1,7\n2,x\n", 2).unwrap_err();
        assert!(e.to_string().contains("line 2, column 2"), "{e}");
        assert!(parse_column("1", 0).unwrap_err().to_string().contains("at least 1"));
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_lengths("1\n-4\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse_lengths("[1, -2]").unwrap_err();
        assert_eq!(e.kind(), "invalid-argument");
    }
}
