//! Loss weights: each token's weight in the step's loss under a [`LossAggMode`].

use serde::{Deserialize, Serialize};

use super::{LossAggMode, MaterializeOptions, Sample};
use crate::Error;

/// The counts a loss weight divides by (see [`LossAggMode`]) over a set of samples: a run's
/// samples in a call (the default), or a set the caller chose (the packer runtime's optimizer
/// updates).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LossCounts {
    /// Loss tokens, `T`.
    pub tokens: u64,
    /// Samples with loss tokens, `N`.
    pub seqs: u64,
    /// The longest completion (the default horizon of `seq-mean-token-sum-norm`).
    pub longest: u64,
}

impl LossCounts {
    /// Counts `s` in.
    pub fn add(&mut self, s: &Sample<'_>) {
        let t = loss_tokens(s);
        self.tokens += t;
        self.seqs += u64::from(t > 0);
        self.longest = self.longest.max(s.completion_ids.len() as u64);
    }
}

/// A sample's loss tokens: true entries of its prompt and completion masks.
fn loss_tokens(s: &Sample<'_>) -> u64 {
    let prompt = s.prompt_mask.map_or(0, |m| m.iter().filter(|&&b| b).count());
    let completion = s.completion_mask.map_or(s.completion_ids.len(), |m| m.iter().filter(|&&b| b).count());
    (prompt + completion) as u64
}

/// Each sample's loss-token weight under `o.loss_agg_mode` (see [`LossAggMode`]), with the
/// counts taken per run over the samples in the plan (`used`), or given per sample
/// (`counts[i]`: those of the set sample `i` belongs to); computed in f64, stored as f32.
pub(super) fn loss_weights(
    samples: &[Sample<'_>],
    used: &[bool],
    o: &MaterializeOptions,
    counts: Option<&[LossCounts]>,
) -> Result<Vec<f32>, Error> {
    check_loss_scale_factor(o.loss_agg_mode, o.loss_scale_factor)?;
    let mut runs: std::collections::HashMap<u32, LossCounts> = std::collections::HashMap::new();
    if counts.is_none() {
        for (s, _) in samples.iter().zip(used).filter(|(_, u)| **u) {
            runs.entry(s.run).or_default().add(s);
        }
    }
    Ok(samples
        .iter()
        .zip(used)
        .enumerate()
        .map(|(i, (s, &u))| {
            let c = match counts {
                Some(c) => c.get(i).copied().unwrap_or_default(),
                None => runs.get(&s.run).copied().unwrap_or_default(),
            };
            let (total, seqs, longest) = (c.tokens as f64, c.seqs as f64, c.longest);
            let t = loss_tokens(s) as f64;
            let w = match o.loss_agg_mode {
                _ if !u || t == 0.0 => 0.0,
                LossAggMode::TokenMean => 1.0 / total,
                LossAggMode::SeqMeanTokenMean => 1.0 / (seqs * t),
                LossAggMode::SeqMeanTokenSum => 1.0 / seqs,
                LossAggMode::SeqMeanTokenSumNorm => 1.0 / o.loss_scale_factor.unwrap_or(longest.max(1) as f64),
            };
            w as f32
        })
        .collect())
}

/// `invalid-argument` unless the horizon is a number of tokens in 1..=2^64, given for
/// `seq-mean-token-sum-norm` only.
pub(crate) fn check_loss_scale_factor(mode: LossAggMode, h: Option<f64>) -> Result<(), Error> {
    match h {
        Some(_) if mode != LossAggMode::SeqMeanTokenSumNorm => Err(Error::InvalidArgument(format!(
            "loss_scale_factor only applies to loss_agg_mode 'seq-mean-token-sum-norm' (the mode is '{mode}')"
        ))),
        // A number of tokens: 1/H is then a normal f32 (a horizon below 1 or beyond it would
        // give infinite or vanishing weights).
        Some(h) if !(1.0..=MAX_LOSS_SCALE_FACTOR).contains(&h) => {
            Err(Error::InvalidArgument(format!("loss_scale_factor must be a number of tokens in 1..=2^64 (got {h})")))
        }
        _ => Ok(()),
    }
}

/// The largest `loss_scale_factor`: 2^64 tokens.
const MAX_LOSS_SCALE_FACTOR: f64 = 18_446_744_073_709_551_616.0;
