//! Balance figures of per-group totals: the metrics every front end reports for a plan's ranks
//! and micro-batches (the CLI's and the host's JSON, Python's `token_balance`, the JavaScript
//! SDK's `tokenBalance`), computed here once.

/// `max`, `min`, `mean`, `max / mean` and `max − min` of per-group totals (tokens or costs of
/// ranks or micro-batches).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Figures {
    /// The largest total (0 with no groups).
    pub max: u64,
    /// The smallest total (0 with no groups).
    pub min: u64,
    /// The mean total, from the exact sum (0 with no groups).
    pub mean: f64,
    /// `max / mean`: 1 for a perfect balance, and with no groups or a zero mean.
    pub max_over_mean: f64,
    /// `max − min`.
    pub spread: u64,
}

impl Figures {
    /// The figures of `values`.
    pub fn of(values: &[u64]) -> Self {
        let max = values.iter().copied().max().unwrap_or(0);
        let min = values.iter().copied().min().unwrap_or(0);
        let total: u128 = values.iter().map(|&v| u128::from(v)).sum();
        let mean = if values.is_empty() { 0.0 } else { total as f64 / values.len() as f64 };
        let max_over_mean = if mean > 0.0 { max as f64 / mean } else { 1.0 };
        Figures { max, min, mean, max_over_mean, spread: max - min }
    }
}

#[cfg(test)]
mod tests {
    use super::Figures;

    #[test]
    fn figures_of_totals() {
        let f = Figures::of(&[1550, 1450]);
        assert_eq!((f.max, f.min, f.spread), (1550, 1450, 100));
        assert_eq!(f.mean, 1500.0);
        assert_eq!(f.max_over_mean, 1550.0 / 1500.0);
        let none = Figures::of(&[]);
        assert_eq!((none.max, none.min, none.mean, none.max_over_mean, none.spread), (0, 0, 0.0, 1.0, 0));
        assert_eq!(Figures::of(&[0, 0]).max_over_mean, 1.0);
        // The mean comes from the exact sum, past 2^64.
        assert_eq!(Figures::of(&[u64::MAX, u64::MAX]).mean, u64::MAX as f64);
    }
}
