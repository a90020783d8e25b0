//! Materialization: samples plus a plan become the arrays a trainer feeds its model.
//!
//! The kernel decides (which samples share a micro-batch, which rank gets it, the CP split);
//! this module copies tokens natively, so token data never crosses into WASM. A row is the
//! samples of one micro-batch concatenated (prompt then completion), with either
//! - **per-micro-batch padding** ([`Padding::PerMicroBatch`], prime-rl's): one padding
//!   segment at the end up to a multiple, counted in the last sequence's length (in
//!   `cu_seqlens_padded`) and in the last run's `lora_num_tokens`; its `position_ids` restart
//!   at 0; or
//! - **per-sequence padding** ([`Padding::PerSequence`], ROLL's): every sample padded to a
//!   multiple of the factor right after its tokens, `position_ids` continuing through its
//!   padding; with `cp` > 1 each row also carries its zigzag split ([`CpRuns`]) and
//!   [`MicroBatch::cp_view`] gives a CP rank's row.
//!
//! Padding values (prime-rl's): token `pad_token_id`, loss mask false, advantage 0,
//! inference and teacher logprob 0, temperature 1, loss weight 0. A dummy micro-batch (only
//! when there are fewer samples than micro-batch slots) is one padding segment with the same
//! values.
//!
//! **Loss weights.** Every row carries `loss_weights` (f32, the layout of `loss_mask`): the
//! weight of each token's loss in the step's loss under a [`LossAggMode`], computed from the
//! whole step before any rank trains. Σ over every rank, micro-batch and token of
//! `loss_weights × per-token loss` is the loss the unpacked samples give under that mode —
//! however the samples were grouped into rows and ranks, with no all-reduce of counts.

use serde::{Deserialize, Serialize};

use crate::wire;
use crate::{AlignOptions, Cost, CpLayout, DistributeOptions, Distribution, Error, Factor, Kernel, Padding};

/// The temperature a sample was generated with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Temperature<'a> {
    /// One temperature for every token.
    One(f32),
    /// One per completion token; prompt tokens take the first (or 1.0 without completion).
    PerToken(&'a [f32]),
}

/// How a step's per-token losses become its loss (verl's `loss_agg_mode` names). With `m`
/// a sample's loss mask, `ℓ` its per-token losses, `T_s = Σ_t m_t` its loss tokens, `N` the
/// number of samples with `T_s > 0` and `T = Σ_s T_s`, the step's loss is:
/// - `token-mean` (the default): `Σ_s Σ_t m_t·ℓ_t / T`;
/// - `seq-mean-token-mean`: `(1/N) Σ_s (Σ_t m_t·ℓ_t / T_s)`, over samples with `T_s > 0`;
/// - `seq-mean-token-sum`: `(1/N) Σ_s Σ_t m_t·ℓ_t`;
/// - `seq-mean-token-sum-norm` (Dr. GRPO, as verl's `agg_loss` writes it): `Σ_s Σ_t m_t·ℓ_t
///   / H` — no division by `N`, so the loss grows with the number of samples — with `H` the
///   `loss_scale_factor` (tokens, 1..=2^64; default: the longest completion of the run in the
///   step, which changes from step to step: pass verl's maximum response length for a
///   constant horizon).
///
/// The counts are taken per run (LoRA adapter) over the samples of the call (of the plan's
/// samples with `materialize_plan`; call once per mini-batch for mini-batch losses): each
/// run's tokens add up to that run's loss. A token's weight is the factor of its sample
/// (`1/T`, `1/(N·T_s)`, `1/N`, `1/H`) where its loss mask is true, 0 elsewhere (padding,
/// tokens outside the mask, dummies).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LossAggMode {
    /// Every loss token of the step weighs the same.
    #[default]
    TokenMean,
    /// Each sample's mean token loss, averaged over samples.
    SeqMeanTokenMean,
    /// Each sample's summed token loss, averaged over samples.
    SeqMeanTokenSum,
    /// Every sample's summed token loss over a constant horizon.
    SeqMeanTokenSumNorm,
}

impl stowplan_kernel::Named for LossAggMode {
    const WHAT: &'static str = "loss_agg_mode";
    const ALL: &'static [Self] = &[
        LossAggMode::TokenMean,
        LossAggMode::SeqMeanTokenMean,
        LossAggMode::SeqMeanTokenSum,
        LossAggMode::SeqMeanTokenSumNorm,
    ];
    fn as_str(self) -> &'static str {
        match self {
            LossAggMode::TokenMean => "token-mean",
            LossAggMode::SeqMeanTokenMean => "seq-mean-token-mean",
            LossAggMode::SeqMeanTokenSum => "seq-mean-token-sum",
            LossAggMode::SeqMeanTokenSumNorm => "seq-mean-token-sum-norm",
        }
    }
}

impl std::str::FromStr for LossAggMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(<Self as stowplan_kernel::Named>::parse_name(s)?)
    }
}

impl std::fmt::Display for LossAggMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(stowplan_kernel::Named::as_str(*self))
    }
}

/// One rollout sample, borrowed from the caller's buffers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample<'a> {
    /// Prompt token ids.
    pub prompt_ids: &'a [i64],
    /// Completion token ids (non-empty unless [`MaterializeOptions::allow_empty_completion`]).
    pub completion_ids: &'a [i64],
    /// Loss mask of the prompt tokens; `None`: all false.
    pub prompt_mask: Option<&'a [bool]>,
    /// Loss mask of the completion tokens; `None`: all true.
    pub completion_mask: Option<&'a [bool]>,
    /// Inference logprob of each completion token; `None`: all 0. Prompt tokens get 0.
    pub completion_logprobs: Option<&'a [f32]>,
    /// Sampling temperature(s), each > 0 and finite.
    pub temperature: Temperature<'a>,
    /// The advantage, repeated on every token (finite).
    pub advantage: f32,
    /// Run (LoRA adapter) index, below [`MaterializeOptions::num_runs`].
    pub run: u32,
    /// Teacher logprob of every token (prompt + completion); all samples or none.
    pub teacher_logprobs: Option<&'a [f32]>,
    /// A cost on top of the cost model's, in its units: a multimodal sample's image patches
    /// or vision tokens, which cost compute its text length does not show. Balancing over
    /// ranks and micro-batches counts it, the capacity does not. 0: a text sample.
    pub extra_cost: u64,
}

impl Sample<'_> {
    /// Tokens of the sample (prompt + completion).
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.completion_ids.len()
    }

    /// Whether the sample has no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Options of [`materialize`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MaterializeOptions {
    /// Tokens of a micro-batch after padding (≥ 1).
    pub capacity: u64,
    /// Data-parallel ranks (≥ 1); every rank gets the same number of micro-batches.
    pub dp: u32,
    /// Context-parallel size (≥ 1). With `cp` > 1 and per-sequence padding every row carries
    /// its zigzag split; the factor must then be a multiple of `2·cp`.
    pub cp: u32,
    /// The padding (factor or multiple ≥ 1).
    pub padding: Padding,
    /// Cost balanced across ranks.
    pub cost: Cost,
    /// Token id of padding.
    pub pad_token_id: i64,
    /// Length of `lora_num_tokens`; `None`: the largest run index + 1.
    pub num_runs: Option<u32>,
    /// Let samples of different runs share a micro-batch (rows are then ordered by run, so
    /// `lora_num_tokens` are contiguous segments).
    pub mix_runs: bool,
    /// Accept samples with an empty completion (they carry no completion loss).
    pub allow_empty_completion: bool,
    /// How per-token losses aggregate into the step's loss (`loss_weights`).
    pub loss_agg_mode: LossAggMode,
    /// The horizon `H` of [`LossAggMode::SeqMeanTokenSumNorm`] (tokens, 1..=2^64); `None`:
    /// the longest completion of the run in the step. Refused with any other mode.
    pub loss_scale_factor: Option<f64>,
    /// Every sample with an extra cost (multimodal) gets a micro-batch of its own
    /// (prime-rl's rule). Needs `mix_runs` false.
    pub multimodal_alone: bool,
}

impl MaterializeOptions {
    /// Capacity and ranks; no CP, no padding, token cost, pad token 1 (prime-rl's), runs
    /// kept apart, empty completions rejected, `token-mean` loss weights.
    pub fn new(capacity: u64, dp: u32) -> Self {
        Self {
            capacity,
            dp,
            cp: 1,
            padding: Padding::PerMicroBatch(1),
            cost: Cost::TOKENS,
            pad_token_id: 1,
            num_runs: None,
            mix_runs: false,
            allow_empty_completion: false,
            loss_agg_mode: LossAggMode::TokenMean,
            loss_scale_factor: None,
            multimodal_alone: false,
        }
    }

    /// Seed 001's CP/TP alignment: per-sequence padding to `2·cp·tp` (`tp` when `cp` = 1).
    pub fn with_cp(self, cp: u32, tp: u32) -> Result<Self, Error> {
        let factor = stowplan_kernel::pad_factor(&AlignOptions::new(cp, tp))?;
        Ok(Self { cp, padding: Padding::PerSequence(factor), ..self })
    }
}

/// The zigzag split of one row over CP ranks, as runs of the padded row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpRuns {
    /// CP size.
    pub cp: u32,
    /// `cp + 1` offsets into `starts`/`lengths`.
    pub offsets: Vec<u32>,
    /// Run starts in the padded row.
    pub starts: Vec<u64>,
    /// Run lengths.
    pub lengths: Vec<u64>,
    /// Local boundaries in every rank's row (`cu_seqlens_padded / cp`).
    pub local_bounds: Vec<i32>,
}

impl CpRuns {
    /// The runs of a kernel [`CpLayout`].
    pub fn of(layout: &CpLayout) -> Result<Self, Error> {
        Ok(Self {
            cp: layout.cp,
            offsets: layout.run_offsets.clone(),
            starts: layout.run_starts.clone(),
            lengths: layout.run_lengths.clone(),
            local_bounds: layout.local_bounds.iter().map(|&b| to_i32("local_bounds", b)).collect::<Result<_, _>>()?,
        })
    }

    fn runs(&self, r: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (a, b) = (self.offsets[r] as usize, self.offsets[r + 1] as usize);
        self.starts[a..b].iter().zip(&self.lengths[a..b]).map(|(&s, &l)| (s as usize, l as usize))
    }

    fn check_rank(&self, r: usize) -> Result<(), Error> {
        if r >= self.cp as usize {
            return Err(Error::InvalidArgument(format!("rank must be in 0..{} (cp = {}), got {r}", self.cp, self.cp)));
        }
        Ok(())
    }

    /// Positions of the padded row that CP rank `r` receives, in its order (its gather map).
    pub fn positions(&self, r: usize) -> Result<Vec<u64>, Error> {
        self.check_rank(r)?;
        Ok(self.runs(r).flat_map(|(s, l)| (s as u64)..(s + l) as u64).collect())
    }

    /// The elements of `row` (the padded row) CP rank `r` receives.
    pub fn gather<T: Copy>(&self, r: usize, row: &[T]) -> Result<Vec<T>, Error> {
        self.check_rank(r)?;
        let total = self.starts.iter().zip(&self.lengths).map(|(s, l)| s + l).max().unwrap_or(0) as usize;
        if row.len() < total {
            return Err(Error::InvalidArgument(format!("row has {} elements; the layout spans {total}", row.len())));
        }
        let mut out = Vec::with_capacity(total / self.cp as usize);
        for (s, l) in self.runs(r) {
            out.extend_from_slice(&row[s..s + l]);
        }
        Ok(out)
    }

    /// The inverse of [`CpRuns::gather`]: puts every CP rank's row (`rows[r]`, e.g. per-token
    /// outputs of rank `r`) back into one padded row.
    pub fn unpack<T: Copy + Default>(&self, rows: &[&[T]]) -> Result<Vec<T>, Error> {
        if rows.len() != self.cp as usize {
            return Err(Error::InvalidArgument(format!(
                "rows has {} entries; give one per CP rank ({})",
                rows.len(),
                self.cp
            )));
        }
        let total: usize = self.lengths.iter().sum::<u64>() as usize;
        let mut out = vec![T::default(); total];
        for (r, row) in rows.iter().enumerate() {
            let want: usize = self.runs(r).map(|(_, l)| l).sum();
            if row.len() != want {
                return Err(Error::InvalidArgument(format!(
                    "rows[{r}] has {} elements; CP rank {r} holds {want}",
                    row.len()
                )));
            }
            let mut at = 0;
            for (s, l) in self.runs(r) {
                out[s..s + l].copy_from_slice(&row[at..at + l]);
                at += l;
            }
        }
        Ok(out)
    }
}

/// One micro-batch's arrays: one row, every per-token array of its length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MicroBatch {
    /// The samples in the row, in order (empty for a dummy).
    pub samples: Vec<u32>,
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// Positions, restarting at 0 for every sample (and for the end padding segment).
    pub position_ids: Vec<i64>,
    /// Whether each token counts in the loss (false on every padding token).
    pub loss_mask: Vec<bool>,
    /// Each token's weight in the step's loss ([`LossAggMode`]): its sample's factor where
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

/// One CP rank's share of a [`MicroBatch`].
#[derive(Clone, Debug, PartialEq)]
pub struct CpView {
    /// The CP rank.
    pub rank: u32,
    /// Positions of the padded row this rank receives (its gather map).
    pub positions: Vec<u64>,
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// Position ids.
    pub position_ids: Vec<i64>,
    /// Loss mask.
    pub loss_mask: Vec<bool>,
    /// Loss weights.
    pub loss_weights: Vec<f32>,
    /// Advantages.
    pub advantages: Vec<f32>,
    /// Inference logprobs.
    pub inference_logprobs: Vec<f32>,
    /// Temperatures.
    pub temperatures: Vec<f32>,
    /// Teacher logprobs.
    pub teacher_logprobs: Option<Vec<f32>>,
    /// Sequence boundaries in this rank's row (`cu_seqlens_padded / cp`).
    pub local_bounds: Vec<i32>,
}

impl MicroBatch {
    /// Tokens in the row (padding included).
    pub fn len(&self) -> usize {
        self.input_ids.len()
    }

    /// Whether the row has no tokens.
    pub fn is_empty(&self) -> bool {
        self.input_ids.is_empty()
    }

    /// Length of every sequence in the row, padding included (prime-rl's `sequence_lengths`).
    pub fn sequence_lengths(&self) -> Vec<i32> {
        self.cu_seqlens_padded.windows(2).map(|w| w[1] - w[0]).collect()
    }

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
            input_ids: runs.gather(r, &self.input_ids)?,
            position_ids: runs.gather(r, &self.position_ids)?,
            loss_mask: runs.gather(r, &self.loss_mask)?,
            loss_weights: runs.gather(r, &self.loss_weights)?,
            advantages: runs.gather(r, &self.advantages)?,
            inference_logprobs: runs.gather(r, &self.inference_logprobs)?,
            temperatures: runs.gather(r, &self.temperatures)?,
            teacher_logprobs: self.teacher_logprobs.as_ref().map(|t| runs.gather(r, t)).transpose()?,
            local_bounds: runs.local_bounds.clone(),
        })
    }

    /// Encodes in the [`wire::MICRO_BATCH`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::MICRO_BATCH, self, self.len() * 24)
    }

    /// Decodes what [`MicroBatch::encode`] wrote. Errors name what is wrong: not a
    /// micro-batch, another version, a corrupt or truncated body, trailing bytes, arrays of
    /// different lengths.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let mb: MicroBatch = wire::decode(&wire::MICRO_BATCH, bytes)?;
        mb.check_lengths().map_err(|m| Error::InvalidArgument(format!("bytes: {m}")))?;
        Ok(mb)
    }

    /// Checks that every per-token array has the row's length (as a decoded row must).
    pub(crate) fn check_lengths(&self) -> Result<(), String> {
        let n = self.input_ids.len();
        let lens = [
            self.position_ids.len(),
            self.loss_mask.len(),
            self.loss_weights.len(),
            self.advantages.len(),
            self.inference_logprobs.len(),
            self.temperatures.len(),
            self.teacher_logprobs.as_ref().map_or(n, Vec::len),
        ];
        if lens.iter().any(|&l| l != n) || self.cu_seqlens_padded.last().is_some_and(|&t| t as usize != n) {
            return Err("corrupt micro-batch: per-token arrays of different lengths".into());
        }
        Ok(())
    }
}

/// Every rank's micro-batches and what it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Materialized {
    /// `ranks[r]`: rank `r`'s micro-batches (the same number on every rank).
    pub ranks: Vec<Vec<MicroBatch>>,
    /// The kernel's plan (which samples, which rank, splits, dummies).
    pub distribution: Distribution,
    /// Real tokens over all micro-batches.
    pub real_tokens: u64,
    /// Padding tokens over all micro-batches (dummies included).
    pub padding_tokens: u64,
}

impl Materialized {
    /// Padding tokens over real tokens.
    pub fn padding_overhead(&self) -> f64 {
        if self.real_tokens == 0 { 0.0 } else { self.padding_tokens as f64 / self.real_tokens as f64 }
    }

    /// Bytes of every per-token array of every micro-batch (what was written).
    pub fn array_bytes(&self) -> u64 {
        self.ranks.iter().flatten().map(|m| m.len() as u64 * per_token_bytes(m)).sum()
    }
}

fn per_token_bytes(m: &MicroBatch) -> u64 {
    // ids, positions (8 each), mask (1), loss weights, advantages, logprobs, temperatures (4
    // each), teacher (4).
    8 + 8 + 1 + 4 + 4 + 4 + 4 + if m.teacher_logprobs.is_some() { 4 } else { 0 }
}

fn to_i32(name: &str, v: u64) -> Result<i32, Error> {
    i32::try_from(v).map_err(|_| {
        Error::InvalidArgument(format!("{name}: {v} tokens in one row; at most {} fit in int32", i32::MAX))
    })
}

fn bad_sample(i: usize, m: String) -> Error {
    Error::InvalidArgument(format!("samples[{i}]: {m}"))
}

/// Why a sample cannot be materialized (the kind of [`check_sample`]'s error).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RejectReason {
    /// A mask, logprob or temperature array whose length is not its token count.
    LengthMismatch,
    /// A temperature that is not > 0 and finite, or an advantage that is not finite.
    NotFinite,
    /// No tokens at all.
    Empty,
    /// An empty completion where those are not allowed.
    EmptyCompletion,
    /// A run index outside `0..num_runs` (or a run the packer does not know).
    UnknownRun,
    /// Teacher logprobs on some samples but not on others.
    TeacherLogprobs,
    /// More tokens than a micro-batch holds.
    TooLong,
    /// A negative token id.
    InvalidTokenId,
    /// The sample's cost (the cost model's, plus its extra cost) does not fit in `u64`
    /// together with the costs of the samples pending beside it.
    CostOverflow,
}

impl RejectReason {
    /// Every reason, in declaration order.
    pub const ALL: [RejectReason; 9] = [
        RejectReason::LengthMismatch,
        RejectReason::NotFinite,
        RejectReason::Empty,
        RejectReason::EmptyCompletion,
        RejectReason::UnknownRun,
        RejectReason::TeacherLogprobs,
        RejectReason::TooLong,
        RejectReason::InvalidTokenId,
        RejectReason::CostOverflow,
    ];

    /// The reason's snake_case name (used in logs, metrics and Python).
    pub fn name(self) -> &'static str {
        match self {
            RejectReason::LengthMismatch => "length_mismatch",
            RejectReason::NotFinite => "not_finite",
            RejectReason::Empty => "empty",
            RejectReason::EmptyCompletion => "empty_completion",
            RejectReason::UnknownRun => "unknown_run",
            RejectReason::TeacherLogprobs => "teacher_logprobs",
            RejectReason::TooLong => "too_long",
            RejectReason::InvalidTokenId => "invalid_token_id",
            RejectReason::CostOverflow => "cost_overflow",
        }
    }
}

/// Checks one sample: array lengths, token ids ≥ 0, finite logprobs, temperatures, empty
/// sample or completion, advantage, run below `num_runs`, and teacher logprobs present
/// exactly when `teacher`. The message names the field, the position and the rule.
pub fn check_sample(
    s: &Sample<'_>,
    allow_empty_completion: bool,
    num_runs: u32,
    teacher: bool,
) -> Result<(), (RejectReason, String)> {
    let (p, c) = (s.prompt_ids.len(), s.completion_ids.len());
    let check = |field: &str, got: Option<usize>, want: usize, what: &str| match got {
        Some(g) if g != want => Err((
            RejectReason::LengthMismatch,
            format!("{field} has {g} entries but the sample has {want} {what} tokens"),
        )),
        _ => Ok(()),
    };
    check("prompt_mask", s.prompt_mask.map(<[bool]>::len), p, "prompt")?;
    check("completion_mask", s.completion_mask.map(<[bool]>::len), c, "completion")?;
    check("completion_logprobs", s.completion_logprobs.map(<[f32]>::len), c, "completion")?;
    check("teacher_logprobs", s.teacher_logprobs.map(<[f32]>::len), p + c, "prompt + completion")?;
    for (field, ids) in [("prompt_ids", s.prompt_ids), ("completion_ids", s.completion_ids)] {
        if let Some(j) = ids.iter().position(|&id| id < 0) {
            return Err((RejectReason::InvalidTokenId, format!("{field}[{j}] = {} must be ≥ 0", ids[j])));
        }
    }
    for (field, values) in [("completion_logprobs", s.completion_logprobs), ("teacher_logprobs", s.teacher_logprobs)] {
        if let Some(j) = values.and_then(|v| v.iter().position(|x| !x.is_finite())) {
            let v = values.map_or(0.0, |v| v[j]);
            return Err((RejectReason::NotFinite, format!("{field}[{j}] = {v} must be finite")));
        }
    }
    match s.temperature {
        Temperature::PerToken(t) => {
            check("temperatures", Some(t.len()), c, "completion")?;
            if let Some(j) = t.iter().position(|&x| !(x > 0.0 && x.is_finite())) {
                return Err((RejectReason::NotFinite, format!("temperatures[{j}] = {} must be > 0 and finite", t[j])));
            }
        }
        Temperature::One(x) if !(x > 0.0 && x.is_finite()) => {
            return Err((RejectReason::NotFinite, format!("temperature = {x} must be > 0 and finite")));
        }
        Temperature::One(_) => {}
    }
    if p + c == 0 {
        return Err((RejectReason::Empty, "the sample has no tokens".into()));
    }
    if c == 0 && !allow_empty_completion {
        return Err((
            RejectReason::EmptyCompletion,
            "empty completion (nothing to train on); pass allow_empty_completion to keep such samples".into(),
        ));
    }
    if !s.advantage.is_finite() {
        return Err((RejectReason::NotFinite, format!("advantage = {} must be finite", s.advantage)));
    }
    if s.run >= num_runs {
        return Err((RejectReason::UnknownRun, format!("run = {} must be below num_runs = {num_runs}", s.run)));
    }
    if s.teacher_logprobs.is_some() != teacher {
        return Err((
            RejectReason::TeacherLogprobs,
            format!(
                "teacher_logprobs {} but {} them; give them for every sample or none",
                if teacher { "missing" } else { "given" },
                if teacher { "the others have" } else { "the others do not have" }
            ),
        ));
    }
    Ok(())
}

/// Checks every sample; returns the run count.
fn validate(samples: &[Sample<'_>], o: &MaterializeOptions) -> Result<u32, Error> {
    let teacher = samples.first().is_some_and(|s| s.teacher_logprobs.is_some());
    let max_run = samples.iter().map(|s| s.run).max().unwrap_or(0);
    let num_runs = o.num_runs.unwrap_or(max_run.saturating_add(1));
    // Every micro-batch holds `num_runs` counters (`lora_num_tokens`): bounded, so that a run
    // index of 4·10⁹ cannot ask for gigabytes.
    if num_runs == 0 || num_runs > stowplan_kernel::MAX_COUNT {
        let from = if o.num_runs.is_some() { "" } else { " (the largest run + 1)" };
        return Err(Error::InvalidArgument(format!(
            "num_runs{from} must be in 1..={} (got {num_runs})",
            stowplan_kernel::MAX_COUNT
        )));
    }
    for (i, s) in samples.iter().enumerate() {
        check_sample(s, o.allow_empty_completion, num_runs, teacher).map_err(|(_, m)| bad_sample(i, m))?;
    }
    Ok(num_runs)
}

/// Appends one sample's tokens (and per-sequence padding) to `mb`; `weight` is its loss
/// tokens' weight.
fn push_sample(mb: &mut MicroBatch, s: &Sample<'_>, pad: usize, pad_token_id: i64, weight: f32) {
    let (p, c) = (s.prompt_ids.len(), s.completion_ids.len());
    let start = mb.loss_mask.len();
    mb.input_ids.extend_from_slice(s.prompt_ids);
    mb.input_ids.extend_from_slice(s.completion_ids);
    mb.input_ids.extend(std::iter::repeat_n(pad_token_id, pad));
    mb.position_ids.extend(0..(p + c + pad) as i64);
    match s.prompt_mask {
        Some(m) => mb.loss_mask.extend_from_slice(m),
        None => mb.loss_mask.extend(std::iter::repeat_n(false, p)),
    }
    match s.completion_mask {
        Some(m) => mb.loss_mask.extend_from_slice(m),
        None => mb.loss_mask.extend(std::iter::repeat_n(true, c)),
    }
    mb.loss_mask.extend(std::iter::repeat_n(false, pad));
    mb.loss_weights.extend(mb.loss_mask[start..].iter().map(|&m| if m { weight } else { 0.0 }));
    mb.advantages.extend(std::iter::repeat_n(s.advantage, p + c));
    mb.advantages.extend(std::iter::repeat_n(0.0, pad));
    mb.inference_logprobs.extend(std::iter::repeat_n(0.0, p));
    match s.completion_logprobs {
        Some(l) => mb.inference_logprobs.extend_from_slice(l),
        None => mb.inference_logprobs.extend(std::iter::repeat_n(0.0, c)),
    }
    mb.inference_logprobs.extend(std::iter::repeat_n(0.0, pad));
    match s.temperature {
        Temperature::One(t) => mb.temperatures.extend(std::iter::repeat_n(t, p + c)),
        Temperature::PerToken(t) => {
            mb.temperatures.extend(std::iter::repeat_n(t.first().copied().unwrap_or(1.0), p));
            mb.temperatures.extend_from_slice(t);
        }
    }
    mb.temperatures.extend(std::iter::repeat_n(1.0, pad));
    if let (Some(out), Some(t)) = (mb.teacher_logprobs.as_mut(), s.teacher_logprobs) {
        out.extend_from_slice(t);
        out.extend(std::iter::repeat_n(0.0, pad));
    }
}

/// Appends a padding segment of `pad` tokens whose positions restart at 0.
fn push_padding(mb: &mut MicroBatch, pad: usize, pad_token_id: i64) {
    mb.input_ids.extend(std::iter::repeat_n(pad_token_id, pad));
    mb.position_ids.extend(0..pad as i64);
    mb.loss_mask.extend(std::iter::repeat_n(false, pad));
    mb.loss_weights.extend(std::iter::repeat_n(0.0, pad));
    mb.advantages.extend(std::iter::repeat_n(0.0, pad));
    mb.inference_logprobs.extend(std::iter::repeat_n(0.0, pad));
    mb.temperatures.extend(std::iter::repeat_n(1.0, pad));
    if let Some(t) = mb.teacher_logprobs.as_mut() {
        t.extend(std::iter::repeat_n(0.0, pad));
    }
}

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
fn loss_weights(
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

/// Builds one row from `members` (sample indices, in row order); empty members: a dummy.
/// `weights[i]`: sample `i`'s loss-token weight.
fn build(
    samples: &[Sample<'_>],
    members: &[u32],
    num_runs: u32,
    o: &MaterializeOptions,
    weights: &[f32],
) -> Result<(MicroBatch, Vec<u64>), Error> {
    let m = o.padding.multiple() as usize;
    let per_sequence = matches!(o.padding, Padding::PerSequence(_));
    let real: usize = members.iter().map(|&i| samples[i as usize].len()).sum();
    let seq_pad = |len: usize| if per_sequence { len.div_ceil(m) * m - len } else { 0 };
    let body: usize = members.iter().map(|&i| samples[i as usize].len()).map(|l| l + seq_pad(l)).sum();
    let total = if members.is_empty() { m } else { body.div_ceil(m) * m };
    let teacher = samples.first().is_some_and(|s| s.teacher_logprobs.is_some());
    let mut mb = MicroBatch {
        samples: members.to_vec(),
        input_ids: Vec::with_capacity(total),
        position_ids: Vec::with_capacity(total),
        loss_mask: Vec::with_capacity(total),
        loss_weights: Vec::with_capacity(total),
        advantages: Vec::with_capacity(total),
        inference_logprobs: Vec::with_capacity(total),
        temperatures: Vec::with_capacity(total),
        teacher_logprobs: teacher.then(|| Vec::with_capacity(total)),
        cu_seqlens: Vec::with_capacity(members.len() + 1),
        cu_seqlens_padded: Vec::with_capacity(members.len() + 1),
        max_seqlen: 0,
        lora_num_tokens: vec![0; num_runs as usize],
        real_tokens: real as u64,
        padding_tokens: (total - real) as u64,
        dummy: members.is_empty(),
        cp_runs: None,
    };
    to_i32("a micro-batch", total as u64)?;
    let (mut cu, mut cup) = (0i32, 0i32);
    mb.cu_seqlens.push(0);
    mb.cu_seqlens_padded.push(0);
    let mut real_lengths = Vec::with_capacity(members.len());
    for &i in members {
        let s = &samples[i as usize];
        let pad = seq_pad(s.len());
        push_sample(&mut mb, s, pad, o.pad_token_id, weights[i as usize]);
        cu += s.len() as i32;
        cup += (s.len() + pad) as i32;
        mb.cu_seqlens.push(cu);
        mb.cu_seqlens_padded.push(cup);
        mb.lora_num_tokens[s.run as usize] += (s.len() + pad) as i32;
        real_lengths.push(s.len() as u64);
    }
    let tail = total - body;
    if tail > 0 {
        push_padding(&mut mb, tail, o.pad_token_id);
        if let Some(last) = num_runs.checked_sub(1) {
            mb.lora_num_tokens[last as usize] += tail as i32;
        }
        if members.is_empty() {
            mb.cu_seqlens.push(0);
            mb.cu_seqlens_padded.push(tail as i32);
        } else if let Some(l) = mb.cu_seqlens_padded.last_mut() {
            // prime-rl: the end padding belongs to the last sequence.
            *l += tail as i32;
        }
    }
    mb.max_seqlen = mb.sequence_lengths().into_iter().max().unwrap_or(0);
    Ok((mb, real_lengths))
}

/// Plans `samples` with [`distribute`](crate::KernelApi::distribute) and builds every rank's micro-batches.
/// See the module docs for the layout and padding values.
///
/// Errors: `invalid-argument` naming the sample and field for a length mismatch, an
/// empty sample or completion (unless allowed), a non-finite advantage or a temperature
/// ≤ 0, a run ≥ `num_runs`, teacher logprobs on some samples only; `cp` = 0, or `cp` > 1
/// with a per-sequence factor that is not a multiple of `2·cp`; those of `distribute`
/// (`infeasible` for a sample longer than the capacity).
pub fn materialize(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    options: &MaterializeOptions,
) -> Result<Materialized, Error> {
    materialize_counted(kernel, samples, options, None)
}

/// [`materialize`] with the loss counts given per sample (`counts[i]`: those of the set
/// sample `i` belongs to, which may reach beyond this call) instead of taken per run here.
pub(crate) fn materialize_counted(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    options: &MaterializeOptions,
    counts: Option<&[LossCounts]>,
) -> Result<Materialized, Error> {
    let num_runs = validate(samples, options)?;
    let lengths: Vec<u64> = samples.iter().map(|s| s.len() as u64).collect();
    let extra: Vec<u64> = samples.iter().map(|s| s.extra_cost).collect();
    let multimodal = extra.iter().any(|&e| e > 0);
    // The kernel keeps labels apart (without `mix_runs`): runs, and with `multimodal_alone`
    // a label of its own for every multimodal sample, after the runs'.
    let mut labels: Vec<u32> = samples.iter().map(|s| s.run).collect();
    if options.multimodal_alone {
        if options.mix_runs {
            return Err(Error::InvalidArgument(
                "multimodal_alone needs mix_runs false (runs sharing micro-batches would share them with multimodal \
                 samples too)"
                    .into(),
            ));
        }
        let mut next = num_runs;
        for (label, &e) in labels.iter_mut().zip(&extra) {
            if e > 0 {
                *label = next;
                next = next.checked_add(1).ok_or_else(|| {
                    Error::InvalidArgument("too many multimodal samples to give each a micro-batch".into())
                })?;
            }
        }
    }
    let d = kernel.distribute(
        &lengths,
        &DistributeOptions {
            capacity: options.capacity,
            dp: options.dp,
            cost: options.cost,
            padding: options.padding,
            runs: Some(&labels),
            mix_runs: options.mix_runs,
            extra_costs: multimodal.then_some(&extra[..]),
        },
    )?;
    let plan: Vec<Vec<&[u32]>> =
        (0..d.dp()).map(|r| (0..d.per_rank as usize).map(|j| d.batch(r * d.per_rank as usize + j)).collect()).collect();
    let ranks = build_plan(kernel, samples, &plan, options, num_runs, counts)?;
    let (mut real_tokens, mut padding_tokens) = (0, 0);
    for mb in ranks.iter().flatten() {
        real_tokens += mb.real_tokens;
        padding_tokens += mb.padding_tokens;
    }
    Ok(Materialized { ranks, distribution: d, real_tokens, padding_tokens })
}

/// Builds the micro-batches of a given plan: `plan[r][j]` lists the samples of rank `r`'s
/// micro-batch `j` in row order (an empty list is a dummy). Used for plans from
/// [`plan`](crate::KernelApi::plan) or from a caller. The plan has `options.dp` ranks with the
/// same number of micro-batches each (ranks step together: pad a short rank with dummies);
/// `options.capacity` is checked on every row; `cost` only matters for [`materialize`], and
/// runs may not share a row unless `mix_runs`.
///
/// Errors: those of [`materialize`]; a plan of other than `dp` ranks, or ranks with different
/// numbers of micro-batches; a sample index out of range or used twice; a row over the
/// capacity; runs mixed in a row without `mix_runs`.
pub fn materialize_plan(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    plan: &[Vec<&[u32]>],
    options: &MaterializeOptions,
) -> Result<Vec<Vec<MicroBatch>>, Error> {
    let num_runs = validate(samples, options)?;
    if plan.len() != options.dp as usize {
        return Err(Error::InvalidArgument(format!(
            "plan has {} ranks but dp is {}: give one list of micro-batches per data-parallel rank",
            plan.len(),
            options.dp
        )));
    }
    let per_rank = plan.first().map_or(0, Vec::len);
    if let Some((r, rank)) = plan.iter().enumerate().find(|(_, rank)| rank.len() != per_rank) {
        return Err(Error::InvalidArgument(format!(
            "plan[{r}] has {} micro-batches but plan[0] has {per_rank}: every rank needs the same number \
             (ranks step together; pad with empty lists, which become dummy micro-batches)",
            rank.len()
        )));
    }
    build_plan(kernel, samples, plan, options, num_runs, None)
}

/// [`materialize_plan`] after `validate` (which gave `num_runs`), with the loss counts of
/// [`materialize_counted`].
fn build_plan(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    plan: &[Vec<&[u32]>],
    options: &MaterializeOptions,
    num_runs: u32,
    counts: Option<&[LossCounts]>,
) -> Result<Vec<Vec<MicroBatch>>, Error> {
    if options.cp == 0 {
        return Err(Error::InvalidArgument("cp must be at least 1 (got 0)".into()));
    }
    if options.padding.multiple() == 0 {
        return Err(Error::InvalidArgument("the padding multiple must be at least 1 (got 0)".into()));
    }
    let cp_split = options.cp > 1 && matches!(options.padding, Padding::PerSequence(_));
    let align =
        AlignOptions { factor: Factor::Multiple(options.padding.multiple()), ..AlignOptions::new(options.cp, 1) };
    if cp_split {
        kernel.pad_factor(&align)?;
    }
    let mut used = vec![false; samples.len()];
    for (r, rank) in plan.iter().enumerate() {
        for (j, members) in rank.iter().enumerate() {
            for &i in members.iter() {
                match used.get_mut(i as usize) {
                    None => {
                        return Err(Error::InvalidArgument(format!(
                            "plan[{r}][{j}] names sample {i}; there are {} samples",
                            samples.len()
                        )));
                    }
                    Some(true) => {
                        return Err(Error::InvalidArgument(format!("plan[{r}][{j}]: sample {i} is planned twice")));
                    }
                    Some(u) => *u = true,
                }
                let first = samples[members[0] as usize].run;
                if !options.mix_runs && samples[i as usize].run != first {
                    return Err(Error::InvalidArgument(format!(
                        "plan[{r}][{j}] mixes runs {first} and {} in one micro-batch; set mix_runs to allow it",
                        samples[i as usize].run
                    )));
                }
            }
        }
    }
    let weights = &loss_weights(samples, &used, options, counts)?;
    // Rows are independent: build them on every core.
    let jobs: Vec<(usize, &[u32])> =
        plan.iter().enumerate().flat_map(|(r, rank)| rank.iter().map(move |m| (r, *m))).collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len().max(1));
    let chunk = jobs.len().div_ceil(threads).max(1);
    let built: Vec<Result<Vec<(MicroBatch, Vec<u64>)>, Error>> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || part.iter().map(|(_, m)| build(samples, m, num_runs, options, weights)).collect())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(Error::Runtime("a build thread panicked".into()))))
            .collect()
    });
    let mut ranks: Vec<Vec<MicroBatch>> = plan.iter().map(|r| Vec::with_capacity(r.len())).collect();
    let mut job = jobs.iter();
    for part in built {
        for (mut mb, real_lengths) in part? {
            let Some(&(r, _)) = job.next() else { break };
            if mb.len() as u64 > options.capacity {
                return Err(Error::Infeasible(format!(
                    "plan[{r}][{}] needs {} tokens after padding, over the capacity {}",
                    ranks[r].len(),
                    mb.len(),
                    options.capacity
                )));
            }
            if cp_split {
                // A dummy's padding segment splits like one sequence of its length.
                let lengths = if mb.dummy { vec![mb.len() as u64] } else { real_lengths };
                mb.cp_runs = Some(CpRuns::of(&kernel.cp_layout(&lengths, &align)?)?);
            }
            ranks[r].push(mb);
        }
    }
    Ok(ranks)
}
