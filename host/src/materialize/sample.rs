//! The samples materialization takes, and the checks every one of them passes.

use serde::{Deserialize, Serialize};

use super::MaterializeOptions;
use crate::Error;

/// The temperature a sample was generated with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Temperature<'a> {
    /// One temperature for every token.
    One(f32),
    /// One per completion token; prompt tokens take the first (or 1.0 without completion).
    PerToken(&'a [f32]),
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
    /// The sample's size in each of [`materialize_limited`](super::materialize_limited)'s
    /// limits, in their order (its vision tokens, its images …); empty: 0 in every one (a
    /// text sample).
    pub resources: &'a [u64],
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
    /// A resource the packer has no limit for, or one named twice.
    UnknownResource,
    /// A resource over its cap per micro-batch (samples are never split).
    OverLimit,
}

impl RejectReason {
    /// Every reason, in declaration order.
    pub const ALL: [RejectReason; 11] = [
        RejectReason::LengthMismatch,
        RejectReason::NotFinite,
        RejectReason::Empty,
        RejectReason::EmptyCompletion,
        RejectReason::UnknownRun,
        RejectReason::TeacherLogprobs,
        RejectReason::TooLong,
        RejectReason::InvalidTokenId,
        RejectReason::CostOverflow,
        RejectReason::UnknownResource,
        RejectReason::OverLimit,
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
            RejectReason::UnknownResource => "unknown_resource",
            RejectReason::OverLimit => "over_limit",
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
pub(super) fn validate(samples: &[Sample<'_>], o: &MaterializeOptions) -> Result<u32, Error> {
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
