//! One micro-batch's arrays ([`MaterializedBatch`](super::MaterializedBatch)) and their byte encoding.

use serde::{Deserialize, Serialize};

use super::CpRuns;
use crate::{Error, wire};

/// The per-token arrays of one row, all of its length: a micro-batch's
/// ([`MaterializedBatch::arrays`]) or a CP rank's share of one ([`CpView::arrays`](super::CpView::arrays)).
/// Both dereference to it, so `mb.input_ids` reads the array.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TokenArrays {
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// Positions, restarting at 0 for every sample (and for the end padding segment).
    pub position_ids: Vec<i64>,
    /// Whether each token counts in the loss (false on every padding token).
    pub loss_mask: Vec<bool>,
    /// Each token's weight in the step's loss ([`LossAggMode`](super::LossAggMode)): its sample's factor where
    /// `loss_mask` is true, 0 elsewhere (padding, prompt tokens, dummies).
    pub loss_weights: Vec<f32>,
    /// The sample's advantage on each token (0 on padding).
    pub advantages: Vec<f32>,
    /// Inference logprobs (0 on prompt and padding tokens).
    pub inference_logprobs: Vec<f32>,
    /// Sampling temperature of each token (1 on padding).
    pub temperatures: Vec<f32>,
    /// Teacher logprobs (0 on padding), when the samples have them.
    pub teacher_logprobs: Option<Vec<f32>>,
}

impl TokenArrays {
    /// Empty arrays with room for `n` tokens; teacher logprobs with `teacher`.
    pub(super) fn with_capacity(n: usize, teacher: bool) -> Self {
        TokenArrays {
            input_ids: Vec::with_capacity(n),
            position_ids: Vec::with_capacity(n),
            loss_mask: Vec::with_capacity(n),
            loss_weights: Vec::with_capacity(n),
            advantages: Vec::with_capacity(n),
            inference_logprobs: Vec::with_capacity(n),
            temperatures: Vec::with_capacity(n),
            teacher_logprobs: teacher.then(|| Vec::with_capacity(n)),
        }
    }

    /// Tokens in the row (padding included).
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    /// Whether the row has no tokens.
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Whether every array has the row's length.
    fn same_lengths(&self) -> bool {
        let n = self.input_ids.len();
        [
            self.position_ids.len(),
            self.loss_mask.len(),
            self.loss_weights.len(),
            self.advantages.len(),
            self.inference_logprobs.len(),
            self.temperatures.len(),
            self.teacher_logprobs.as_ref().map_or(n, Vec::len),
        ]
        .iter()
        .all(|&l| l == n)
    }
}

/// One micro-batch's arrays: one row, every per-token array of its length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MaterializedBatch {
    /// The samples in the row, in order (empty for a dummy).
    pub samples: Vec<u32>,
    /// Every per-token array of the row (`mb.input_ids` reads through to them).
    pub arrays: TokenArrays,
    /// `samples + 1` cumulative real lengths (a dummy: `[0, 0]`).
    pub cu_seqlens: Vec<i32>,
    /// `samples + 1` boundaries of the sequences in the row, padding included.
    pub cu_seqlens_padded: Vec<i32>,
    /// The longest sequence in the row, padding included.
    pub max_seqlen: i32,
    /// Tokens of each run in the row (padding at the end counts for the last run).
    pub lora_num_tokens: Vec<i32>,
    /// Real tokens.
    pub real_tokens: u64,
    /// Padding tokens.
    pub padding_tokens: u64,
    /// A dummy micro-batch (no samples, zero loss mask and advantages).
    pub dummy: bool,
    /// The zigzag split when `cp` > 1 with per-sequence padding.
    pub cp_runs: Option<CpRuns>,
}

impl std::ops::Deref for MaterializedBatch {
    type Target = TokenArrays;

    fn deref(&self) -> &TokenArrays {
        &self.arrays
    }
}

impl std::ops::DerefMut for MaterializedBatch {
    fn deref_mut(&mut self) -> &mut TokenArrays {
        &mut self.arrays
    }
}

impl MaterializedBatch {
    /// Length of every sequence in the row, padding included (prime-rl's `sequence_lengths`).
    pub fn sequence_lengths(&self) -> Vec<i32> {
        self.cu_seqlens_padded.windows(2).map(|w| w[1] - w[0]).collect()
    }

    /// Encodes in the [`wire::MICRO_BATCH`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::MICRO_BATCH, self, self.len() * 24)
    }

    /// Decodes what [`MaterializedBatch::encode`] wrote. Errors name what is wrong: not a
    /// micro-batch, another version, a corrupt or truncated body, trailing bytes, arrays of
    /// different lengths.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let mb: MaterializedBatch = wire::decode(&wire::MICRO_BATCH, bytes)?;
        mb.check_lengths().map_err(|m| Error::InvalidArgument(format!("bytes: {m}")))?;
        Ok(mb)
    }

    /// Checks that every per-token array has the row's length (as a decoded row must).
    pub(crate) fn check_lengths(&self) -> Result<(), String> {
        let n = self.input_ids.len();
        if !self.arrays.same_lengths() || self.cu_seqlens_padded.last().is_some_and(|&t| t as usize != n) {
            return Err("corrupt micro-batch: per-token arrays of different lengths".into());
        }
        Ok(())
    }
}

/// One CP rank's share of a [`MaterializedBatch`](super::MaterializedBatch): its part of every per-token array.
#[derive(Clone, Debug, PartialEq)]
pub struct CpView {
    /// The CP rank.
    pub rank: u32,
    /// Positions of the padded row this rank receives (its gather map).
    pub positions: Vec<u64>,
    /// The micro-batch's per-token arrays at `positions` (`view.input_ids` reads through).
    pub arrays: TokenArrays,
    /// Sequence boundaries in this rank's row (`cu_seqlens_padded / cp`).
    pub local_bounds: Vec<i32>,
}

impl std::ops::Deref for CpView {
    type Target = TokenArrays;

    fn deref(&self) -> &TokenArrays {
        &self.arrays
    }
}

impl TokenArrays {
    /// CP rank `r`'s part of every array under `runs`.
    fn gather(&self, runs: &CpRuns, r: usize) -> Result<TokenArrays, Error> {
        Ok(TokenArrays {
            input_ids: runs.gather(r, &self.input_ids)?,
            position_ids: runs.gather(r, &self.position_ids)?,
            loss_mask: runs.gather(r, &self.loss_mask)?,
            loss_weights: runs.gather(r, &self.loss_weights)?,
            advantages: runs.gather(r, &self.advantages)?,
            inference_logprobs: runs.gather(r, &self.inference_logprobs)?,
            temperatures: runs.gather(r, &self.temperatures)?,
            teacher_logprobs: self.teacher_logprobs.as_ref().map(|t| runs.gather(r, t)).transpose()?,
        })
    }
}

impl MaterializedBatch {
    /// CP rank `r`'s share of the row. Errors: no CP split in this micro-batch (cp = 1 or
    /// per-micro-batch padding), `r` ≥ cp.
    pub fn cp_view(&self, r: usize) -> Result<CpView, Error> {
        let Some(runs) = &self.cp_runs else {
            return Err(Error::InvalidArgument(
                "this micro-batch has no CP split: materialize with cp > 1 and per-sequence padding".into(),
            ));
        };
        Ok(CpView {
            rank: r as u32,
            positions: runs.positions(r)?,
            arrays: self.arrays.gather(runs, r)?,
            local_bounds: runs.local_bounds.clone(),
        })
    }
}
