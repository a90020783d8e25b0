//! Reading lengths: one integer per line, or a JSON array of integers.

use crate::Error;

/// The built-in default workload: 4,096 RL rollout lengths (512 prompts × 8 samples, a copy
/// of `shared/workloads/rl-math-8k.txt`).
pub const DEFAULT_WORKLOAD: &str = include_str!("../assets/rl-math-8k.txt");

/// The name of [`DEFAULT_WORKLOAD`] as shown to users.
pub const DEFAULT_WORKLOAD_NAME: &str = "built-in rl-math-8k (4,096 rollouts)";

/// Parses lengths from `text`: a JSON array of non-negative integers (when the first
/// non-blank character is `[`), or one non-negative integer per line (blank lines and lines
/// starting with `#` are skipped). Errors name the line (or JSON position) at fault.
pub fn parse_lengths(text: &str) -> Result<Vec<u64>, Error> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        return serde_json::from_str::<Vec<u64>>(trimmed).map_err(|e| {
            Error::InvalidArgument(format!(
                "lengths: expected a JSON array of integers in 0..=18446744073709551615: {e}"
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
                "lengths, line {}: {line:?} is not an integer in 0..=18446744073709551615 ({e})",
                no + 1
            ))
        })?;
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_json() {
        assert_eq!(parse_lengths("3\n\n# c\n 5 \n").unwrap(), vec![3, 5]);
        assert_eq!(parse_lengths(" [1, 2,3]").unwrap(), vec![1, 2, 3]);
        assert_eq!(parse_lengths(&DEFAULT_WORKLOAD).unwrap().len(), 4096);
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse_lengths("1\n-4\n").unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        let e = parse_lengths("[1, -2]").unwrap_err();
        assert_eq!(e.kind(), "invalid-argument");
    }
}
