//! What materialization takes and gives: its options, further caps, the distribution mode,
//! the loss aggregation mode, and the materialized ranks.

use serde::{Deserialize, Serialize};
use stowplan_kernel::{AlignOptions, Cost, Distribution, Padding};

use super::MaterializedBatch;
use crate::Error;

/// Options of [`materialize`](super::materialize).
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
    /// How micro-batches go to ranks: [`DistributionMode::Balanced`] (the default) or
    /// prime-rl's classic [`DistributionMode::RoundRobin`] (which packs by its own rule:
    /// runs share micro-batches, each multimodal sample in one of its own, so `mix_runs` and
    /// `multimodal_alone` do not apply; no limits).
    pub distribution: DistributionMode,
}

impl MaterializeOptions {
    /// Capacity and ranks; no CP, no padding, token cost, pad token 1 (prime-rl's), runs
    /// kept apart, empty completions rejected, `token-mean` loss weights.
    pub fn new(capacity: u64, dp: u32) -> Self {
        Self {
            capacity,
            dp,
            cp: AlignOptions::default().cp,
            padding: Padding::PerMicroBatch(1),
            cost: Cost::TOKENS,
            pad_token_id: 1,
            num_runs: None,
            mix_runs: false,
            allow_empty_completion: false,
            loss_agg_mode: LossAggMode::TokenMean,
            loss_scale_factor: None,
            multimodal_alone: false,
            distribution: DistributionMode::Balanced,
        }
    }

    /// The CP layout contract's CP/TP alignment: per-sequence padding to `2·cp·tp` (`tp` when `cp` = 1).
    pub fn with_cp(self, cp: u32, tp: u32) -> Result<Self, Error> {
        let factor = stowplan_kernel::pad_factor(&AlignOptions::new(cp, tp))?;
        Ok(Self { cp, padding: Padding::PerSequence(factor), ..self })
    }
}

/// Further caps per micro-batch beside the capacity, for [`materialize_limited`](super::materialize_limited): a
/// vision-language step's image tokens, images … Each sample's sizes are its
/// [`Sample::resources`](super::Sample::resources). `max_segments` caps the samples (segments) per micro-batch, as
/// some attention kernels need: a resource of size 1 per sample named
/// [`SEGMENTS`](stowplan_kernel::SEGMENTS) after the others, which the samples do not give.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SampleLimits {
    /// Each resource's cap per micro-batch (each ≥ 1); at most 7 with the segments.
    pub caps: Vec<u64>,
    /// Their names for messages, one per cap, all different and not `tokens` nor `segments`
    /// (or none: `resource 1`, `resource 2`, …).
    pub names: Vec<String>,
    /// At most this many samples per micro-batch; 0: no limit.
    pub max_segments: u64,
}

impl SampleLimits {
    /// Whether there is any limit.
    pub fn is_empty(&self) -> bool {
        self.caps.is_empty() && self.max_segments == 0
    }

    /// Refuses what only the segments cap makes wrong, naming `max_segments`: a limit named
    /// `segments`, more than 6 named limits beside it, a cap above
    /// [`MAX_BALANCED_CAPACITY`](stowplan_kernel::MAX_BALANCED_CAPACITY). The rest is the
    /// kernel's check of [`SampleLimits::kernel_caps`].
    pub fn check(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.names.iter().any(|n| n == stowplan_kernel::SEGMENTS) {
            return bad(format!(
                "a limit may not be named {:?}: the samples per micro-batch are capped by max_segments",
                stowplan_kernel::SEGMENTS
            ));
        }
        if self.max_segments > 0 {
            let most = stowplan_kernel::MAX_RESOURCES - 2;
            if self.caps.len() > most {
                return bad(format!(
                    "with max_segments, at most {most} named limits (the segments are one more cap; got {})",
                    self.caps.len()
                ));
            }
            if self.max_segments > stowplan_kernel::MAX_BALANCED_CAPACITY {
                return bad(format!(
                    "max_segments must be in 0..={} (got {})",
                    stowplan_kernel::MAX_BALANCED_CAPACITY,
                    self.max_segments
                ));
            }
        }
        let (caps, names) = self.kernel_caps();
        Ok(stowplan_kernel::check_limits(&caps, &names)?)
    }

    /// The caps and names the kernel gets: these, then `segments` with `max_segments` when
    /// set (unnamed resources then named `resource 1`, `resource 2`, … as the kernel would).
    pub fn kernel_caps(&self) -> (Vec<u64>, Vec<String>) {
        let (mut caps, mut names) = (self.caps.clone(), self.names.clone());
        if self.max_segments > 0 {
            if names.is_empty() {
                names = (1..=caps.len()).map(|k| format!("resource {k}")).collect();
            }
            caps.push(self.max_segments);
            names.push(stowplan_kernel::SEGMENTS.into());
        }
        (caps, names)
    }
}

/// Every rank's micro-batches and what it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Materialized {
    /// `ranks[r]`: rank `r`'s micro-batches (the same number on every rank).
    pub ranks: Vec<Vec<MaterializedBatch>>,
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

fn per_token_bytes(m: &MaterializedBatch) -> u64 {
    // ids, positions (8 each), mask (1), loss weights, advantages, logprobs, temperatures (4
    // each), teacher (4).
    8 + 8 + 1 + 4 + 4 + 4 + 4 + if m.teacher_logprobs.is_some() { 4 } else { 0 }
}

/// How a step's micro-batches are given to the data-parallel ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DistributionMode {
    /// stowplan's: best-fit decreasing, the costliest micro-batches split until every rank
    /// has as many, dummies (one padding segment) only when nothing can be split, the cost
    /// balanced over ranks by Karmarkar–Karp. The default.
    #[default]
    Balanced,
    /// prime-rl's classic trainer: first fit by (run, descending length), runs sharing
    /// micro-batches and every multimodal sample in one of its own; each modality group
    /// completed to a multiple of the ranks with copies of its first micro-batch (the loss
    /// switched off), the multimodal group first; micro-batch `i` to rank `i % dp`. No
    /// balancing: `cost` only reports. As prime-rl's, the packing counts real tokens under
    /// the capacity and pads each row after, so with per-micro-batch padding a row may pass
    /// the capacity by less than the multiple (never when the capacity is a multiple of it).
    RoundRobin,
}

impl stowplan_kernel::Named for DistributionMode {
    const WHAT: &'static str = "distribution";
    const ALL: &'static [Self] = &[DistributionMode::Balanced, DistributionMode::RoundRobin];
    fn as_str(self) -> &'static str {
        match self {
            DistributionMode::Balanced => "balanced",
            DistributionMode::RoundRobin => "round-robin",
        }
    }
}

impl std::str::FromStr for DistributionMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(<Self as stowplan_kernel::Named>::parse_name(s)?)
    }
}

impl std::fmt::Display for DistributionMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(stowplan_kernel::Named::as_str(*self))
    }
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
