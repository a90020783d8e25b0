//! The packer's options, checked once.

use std::time::Duration;

use stowplan_kernel::{Cost, Padding};

use super::LossNormalization;
use crate::Error;
use crate::materialize::{DistributionMode, LossAggMode, MaterializeOptions, SampleLimits};

/// Options of a [`Packer`](super::Packer).
#[derive(Clone, Debug, PartialEq)]
pub struct PackerOptions {
    /// Tokens of a micro-batch after padding (≥ 1); longer samples are rejected.
    pub capacity: u64,
    /// Data-parallel ranks (≥ 1).
    pub dp: u32,
    /// Per-micro-batch padding to a multiple of this (≥ 1; prime-rl's `pad_to_multiple_of`).
    pub pad_to_multiple_of: u64,
    /// Token id of padding.
    pub pad_token_id: i64,
    /// Cost balanced across ranks.
    pub cost: Cost,
    /// Length of `lora_num_tokens`; run indices are below it (≥ 1).
    pub num_runs: u32,
    /// Pack once this many tokens are pending; `None`: `capacity × dp` (prime-rl's).
    pub threshold: Option<u64>,
    /// At most this many tokens per step; `None`: everything pending. At least `capacity`.
    pub step_tokens: Option<u64>,
    /// Pack what is pending once the oldest pending sample waited this long, even below the
    /// threshold (prime-rl: 10 s).
    pub wait_timeout: Duration,
    /// Samples carry teacher logprobs (all of them) or none do.
    pub teacher_logprobs: bool,
    /// Accept samples with an empty completion.
    pub allow_empty_completion: bool,
    /// How per-token losses aggregate into a loss: every micro-batch's `loss_weights` (see
    /// [`LossAggMode`]), with the counts taken per run over the set
    /// [`PackerOptions::loss_normalization`] names.
    pub loss_agg_mode: LossAggMode,
    /// The horizon of `seq-mean-token-sum-norm`; `None`: the longest completion of the set.
    pub loss_scale_factor: Option<f64>,
    /// The set the loss weights count over: the run's samples in the **packer step** (the
    /// default; a run whose optimizer update spans several packer steps gets the sum of their
    /// losses), or the run's optimizer **update** of `batch_size` samples, however many packer
    /// steps it spans (its samples are then packed once the rest of their update has arrived).
    pub loss_normalization: LossNormalization,
    /// Further caps per micro-batch beside `capacity`, each named (image tokens, images …; at
    /// most 7, none named `tokens`, each cap at most 2^32 − 1, each name at most
    /// [`MAX_RESOURCE_NAME`](super::MAX_RESOURCE_NAME) bytes): every micro-batch stays within
    /// each, a sample's sizes being its
    /// [`TrainingSample::resources`](super::TrainingSample::resources). Their order does not
    /// matter: the packer keeps them sorted by name. None by default (text). Its
    /// `max_segments` caps the samples per micro-batch (none may be named `segments`; with
    /// it, at most 6 named limits).
    pub limits: SampleLimits,
    /// How each step's micro-batches go to the ranks: balanced (the default) or prime-rl's
    /// classic round robin with dummy copies ([`DistributionMode`]; round robin takes no
    /// `limits`).
    pub distribution: DistributionMode,
}

impl PackerOptions {
    /// `capacity` and `dp`; no padding, pad token 1, token cost, one run, threshold
    /// `capacity × dp`, every pending token per step, 10 s wait, no teacher logprobs,
    /// `token-mean` loss weights normalized per packer step, no further limits.
    pub fn new(capacity: u64, dp: u32) -> Self {
        Self {
            capacity,
            dp,
            pad_to_multiple_of: 1,
            pad_token_id: 1,
            cost: Cost::TOKENS,
            num_runs: 1,
            threshold: None,
            step_tokens: None,
            wait_timeout: Duration::from_secs(10),
            teacher_logprobs: false,
            loss_agg_mode: LossAggMode::TokenMean,
            loss_scale_factor: None,
            allow_empty_completion: false,
            loss_normalization: LossNormalization::Step,
            limits: SampleLimits::default(),
            distribution: DistributionMode::Balanced,
        }
    }

    /// The token threshold in effect.
    pub fn threshold_tokens(&self) -> u64 {
        self.threshold.unwrap_or(self.capacity.saturating_mul(u64::from(self.dp)))
    }

    /// Checks every range; the message names the option.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.capacity == 0 || self.capacity > i32::MAX as u64 {
            return bad(format!("capacity must be in 1..={} (got {})", i32::MAX, self.capacity));
        }
        if self.dp == 0 || self.dp > stowplan_kernel::MAX_COUNT {
            return bad(format!("dp must be in 1..={} (got {})", stowplan_kernel::MAX_COUNT, self.dp));
        }
        if self.pad_to_multiple_of == 0 || self.pad_to_multiple_of > self.capacity {
            return bad(format!(
                "pad_to_multiple_of must be in 1..=capacity ({}) (got {})",
                self.capacity, self.pad_to_multiple_of
            ));
        }
        if self.num_runs == 0 || self.num_runs > stowplan_kernel::MAX_COUNT {
            return bad(format!("num_runs must be in 1..={} (got {})", stowplan_kernel::MAX_COUNT, self.num_runs));
        }
        if self.threshold == Some(0) {
            return bad("threshold must be at least 1 token (got 0)".into());
        }
        if let Some(t) = self.step_tokens.filter(|&t| t < self.capacity) {
            return bad(format!("step_tokens must be at least capacity ({}) (got {t})", self.capacity));
        }
        if self.limits.names.len() != self.limits.caps.len() {
            return bad(format!(
                "limits must name every cap: {} caps, {} names",
                self.limits.caps.len(),
                self.limits.names.len()
            ));
        }
        self.limits.check()?;
        if self.distribution == DistributionMode::RoundRobin && !self.limits.is_empty() {
            return bad("distribution round-robin takes no limits (prime-rl's classic packer has none); \
                        use distribution balanced with limits"
                .into());
        }
        for (name, &cap) in self.limits.names.iter().zip(&self.limits.caps) {
            // Above it the kernel's fill of a step falls back to best-fit decreasing, whose
            // item and step limits the samples were not checked against when they arrived.
            if cap > stowplan_kernel::MAX_BALANCED_CAPACITY {
                return bad(format!(
                    "the cap of {name} must be in 1..={} (got {cap})",
                    stowplan_kernel::MAX_BALANCED_CAPACITY
                ));
            }
            if name.len() > super::MAX_RESOURCE_NAME {
                return bad(format!(
                    "limit names must have at most {} bytes (got {} for a name starting {:?})",
                    super::MAX_RESOURCE_NAME,
                    name.len(),
                    name.chars().take(32).collect::<String>()
                ));
            }
        }
        crate::materialize::check_loss_scale_factor(self.loss_agg_mode, self.loss_scale_factor)
    }

    pub(super) fn materialize_options(&self) -> MaterializeOptions {
        MaterializeOptions {
            padding: Padding::PerMicroBatch(self.pad_to_multiple_of),
            cost: self.cost,
            pad_token_id: self.pad_token_id,
            num_runs: Some(self.num_runs),
            mix_runs: false,
            allow_empty_completion: self.allow_empty_completion,
            loss_agg_mode: self.loss_agg_mode,
            loss_scale_factor: self.loss_scale_factor,
            distribution: self.distribution,
            ..MaterializeOptions::new(self.capacity, self.dp)
        }
    }
}
