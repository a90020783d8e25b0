//! The packer runtime: rollouts in, balanced micro-batches out to every trainer rank.
//!
//! An orchestrator sends [`TrainingBatch`]es (one run's samples of one orchestrator step,
//! with their temperature). The [`Packer`] keeps one FIFO buffer per run, waits until it holds
//! a token threshold (`seq_len × dp` by default) or a wait timeout has passed since the
//! oldest pending sample arrived, then selects samples **round-robin across runs** from a
//! persistent position (one sample per run per turn, within the step's token budget), packs,
//! balances and materializes them ([`materialize`](crate::materialize::materialize): runs never share a
//! micro-batch, `lora_num_tokens` counts each run's tokens, every rank gets the same number of
//! micro-batches) and hands out one [`RankBatch`] per rank.
//!
//! Per run it tracks progress like prime-rl: a run's step advances each time `batch_size` of
//! its samples have been consumed, which sets `ready_to_update`; totals of samples and tokens.
//! Invalid samples (array lengths that disagree, no tokens, an empty completion, more tokens
//! than `seq_len`, non-finite values, teacher logprobs where the packer expects none or the
//! reverse) are rejected one by one with a reason and counted; the rest of their batch is kept.
//! A batch whose `(run, step)` was already received is a duplicate and ignored, so an
//! orchestrator may resend after a restart.
//!
//! **Durability.** [`Packer::state`] is everything the packer knows but the batches' contents:
//! per-run progress, the order of pending samples (as [`SampleKey`]s), the round-robin
//! position, the keys received, and the step in flight. The server (`serve`) checkpoints it with
//! every step and keeps each received batch in a spool file until all its samples are
//! delivered; [`Packer::restore`] rebuilds the packer from both, and the step in flight is
//! rebuilt byte for byte ([`Packer::rebuild_inflight`]), so nothing is lost or delivered
//! twice across a crash.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

mod seen;
mod update;

pub use seen::SeenBatches;
pub use update::LossNormalization;

use crate::materialize::{LossAggMode, LossCounts, RejectReason, check_sample};
use crate::wire;
use crate::{Cost, Error, Kernel, MaterializeOptions, Materialized, MicroBatch, Padding, Sample, Temperature};

/// One rollout sample as the orchestrator sends it (prime-rl's `TrainingSample` fields).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingSample {
    /// Prompt token ids.
    pub prompt_ids: Vec<i64>,
    /// Completion token ids.
    pub completion_ids: Vec<i64>,
    /// Loss mask of the prompt; `None`: all false.
    pub prompt_mask: Option<Vec<bool>>,
    /// Loss mask of the completion; `None`: all true.
    pub completion_mask: Option<Vec<bool>>,
    /// Inference logprob of every completion token; `None`: all 0.
    pub completion_logprobs: Option<Vec<f32>>,
    /// Temperature of every completion token; `None`: the batch's temperature.
    pub completion_temperatures: Option<Vec<f32>>,
    /// Teacher logprob of every token (prompt + completion).
    pub teacher_logprobs: Option<Vec<f32>>,
    /// The advantage (finite), repeated on every token.
    pub advantage: f32,
    /// A cost on top of the cost model's, in its units (a multimodal sample's image or vision
    /// tokens): balancing over ranks and micro-batches counts it, the `seq_len` cap does not
    /// (see [`Sample::extra_cost`]). 0 for text.
    pub extra_cost: u64,
}

impl TrainingSample {
    /// Tokens (prompt + completion).
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.completion_ids.len()
    }

    /// Whether the sample has no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sample as [`materialize`](crate::materialize::materialize) takes it.
    pub fn as_sample(&self, temperature: f32, run: u32) -> Sample<'_> {
        Sample {
            prompt_ids: &self.prompt_ids,
            completion_ids: &self.completion_ids,
            prompt_mask: self.prompt_mask.as_deref(),
            completion_mask: self.completion_mask.as_deref(),
            completion_logprobs: self.completion_logprobs.as_deref(),
            temperature: match &self.completion_temperatures {
                Some(t) => Temperature::PerToken(t),
                None => Temperature::One(temperature),
            },
            advantage: self.advantage,
            run,
            teacher_logprobs: self.teacher_logprobs.as_deref(),
            extra_cost: self.extra_cost,
        }
    }
}

/// A sample's cost: the cost model's for its tokens plus its extra cost; `None` when that
/// overflows `u64`.
fn cost_of(cost: &Cost, s: &TrainingSample) -> Option<u64> {
    cost.of(s.len() as u64)?.checked_add(s.extra_cost)
}

/// One run's samples of one orchestrator step (prime-rl's `TrainingBatch`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingBatch {
    /// Run (LoRA adapter) index, below [`PackerOptions::num_runs`].
    pub run: u32,
    /// The orchestrator's step; `(run, step)` identifies the batch (a second batch with the
    /// same pair is a duplicate).
    pub step: u64,
    /// Sampling temperature of every sample without per-token temperatures (> 0).
    pub temperature: f32,
    /// The samples.
    pub samples: Vec<TrainingSample>,
}

/// Identifies a batch: its run and orchestrator step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BatchKey {
    /// Run index.
    pub run: u32,
    /// Orchestrator step.
    pub step: u64,
}

/// Identifies a sample: its batch and its position in the batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleKey {
    /// Run index.
    pub run: u32,
    /// Orchestrator step of its batch.
    pub step: u64,
    /// Position in the batch's `samples`.
    pub index: u32,
}

impl SampleKey {
    fn batch(self) -> BatchKey {
        BatchKey { run: self.run, step: self.step }
    }
}

impl TrainingBatch {
    /// Tokens over all samples.
    pub fn tokens(&self) -> u64 {
        self.samples.iter().map(|s| s.len() as u64).sum()
    }

    /// The batch's key.
    pub fn key(&self) -> BatchKey {
        BatchKey { run: self.run, step: self.step }
    }

    /// Encodes in the [`wire::TRAINING_BATCH`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::TRAINING_BATCH, self, self.tokens() as usize * 6)
    }

    /// Decodes what [`TrainingBatch::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        wire::decode(&wire::TRAINING_BATCH, bytes)
    }
}

/// What one rank receives for one packer step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankBatch {
    /// Packer step (0, 1, …; consecutive).
    pub step: u64,
    /// This rank.
    pub rank: u32,
    /// Data-parallel ranks.
    pub dp: u32,
    /// Every sample of the step; a micro-batch's `samples` index this list.
    pub keys: Vec<SampleKey>,
    /// This rank's micro-batches (the same number on every rank).
    pub micro_batches: Vec<MicroBatch>,
    /// Runs whose step completed with this packer step (`ready_to_update`).
    pub ready_to_update: Vec<u32>,
}

impl RankBatch {
    /// Encodes in the [`wire::RANK_BATCH`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        let hint: usize = self.micro_batches.iter().map(|m| m.len() * 20).sum();
        wire::encode(&wire::RANK_BATCH, self, hint)
    }

    /// Decodes what [`RankBatch::encode`] wrote, checking every micro-batch's arrays.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        let b: RankBatch = wire::decode(&wire::RANK_BATCH, bytes)?;
        for m in &b.micro_batches {
            m.check_lengths().map_err(|e| Error::InvalidArgument(format!("bytes: {e}")))?;
            if let Some(&i) = m.samples.iter().find(|&&i| i as usize >= b.keys.len()) {
                return Err(Error::InvalidArgument(format!(
                    "bytes: corrupt rank batch: a micro-batch names sample {i} of {}",
                    b.keys.len()
                )));
            }
        }
        Ok(b)
    }
}

/// Options of a [`Packer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PackerOptions {
    /// Tokens of a micro-batch after padding (≥ 1); longer samples are rejected.
    pub seq_len: u64,
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
    /// Pack once this many tokens are pending; `None`: `seq_len × dp` (prime-rl's).
    pub threshold: Option<u64>,
    /// At most this many tokens per step; `None`: everything pending. At least `seq_len`.
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
}

impl PackerOptions {
    /// `seq_len` and `dp`; no padding, pad token 1, token cost, one run, threshold
    /// `seq_len × dp`, every pending token per step, 10 s wait, no teacher logprobs,
    /// `token-mean` loss weights normalized per packer step.
    pub fn new(seq_len: u64, dp: u32) -> Self {
        Self {
            seq_len,
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
        }
    }

    /// The token threshold in effect.
    pub fn threshold_tokens(&self) -> u64 {
        self.threshold.unwrap_or(self.seq_len.saturating_mul(u64::from(self.dp)))
    }

    /// Checks every range; the message names the option.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.seq_len == 0 || self.seq_len > i32::MAX as u64 {
            return bad(format!("seq_len must be in 1..={} (got {})", i32::MAX, self.seq_len));
        }
        if self.dp == 0 || self.dp > stowplan_kernel::MAX_COUNT {
            return bad(format!("dp must be in 1..={} (got {})", stowplan_kernel::MAX_COUNT, self.dp));
        }
        if self.pad_to_multiple_of == 0 || self.pad_to_multiple_of > self.seq_len {
            return bad(format!(
                "pad_to_multiple_of must be in 1..=seq_len ({}) (got {})",
                self.seq_len, self.pad_to_multiple_of
            ));
        }
        if self.num_runs == 0 || self.num_runs > stowplan_kernel::MAX_COUNT {
            return bad(format!("num_runs must be in 1..={} (got {})", stowplan_kernel::MAX_COUNT, self.num_runs));
        }
        if self.threshold == Some(0) {
            return bad("threshold must be at least 1 token (got 0)".into());
        }
        if let Some(t) = self.step_tokens.filter(|&t| t < self.seq_len) {
            return bad(format!("step_tokens must be at least seq_len ({}) (got {t})", self.seq_len));
        }
        crate::materialize::check_loss_scale_factor(self.loss_agg_mode, self.loss_scale_factor)
    }

    fn materialize_options(&self) -> MaterializeOptions {
        MaterializeOptions {
            padding: Padding::PerMicroBatch(self.pad_to_multiple_of),
            cost: self.cost,
            pad_token_id: self.pad_token_id,
            num_runs: Some(self.num_runs),
            mix_runs: false,
            allow_empty_completion: self.allow_empty_completion,
            loss_agg_mode: self.loss_agg_mode,
            loss_scale_factor: self.loss_scale_factor,
            ..MaterializeOptions::new(self.seq_len, self.dp)
        }
    }

    /// The options that decide a step's contents, as saved in a [`PackerState`].
    fn record(&self) -> OptionsRecord {
        OptionsRecord {
            seq_len: self.seq_len,
            dp: self.dp,
            pad_to_multiple_of: self.pad_to_multiple_of,
            pad_token_id: self.pad_token_id,
            cost: (self.cost.linear, self.cost.quadratic),
            num_runs: self.num_runs,
            teacher_logprobs: self.teacher_logprobs,
            allow_empty_completion: self.allow_empty_completion,
            loss_agg_mode: self.loss_agg_mode,
            loss_scale_factor: self.loss_scale_factor,
            loss_normalization: self.loss_normalization,
        }
    }
}

/// A run's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunConfig {
    /// Samples of one of the run's optimizer steps (≥ 1).
    pub batch_size: u64,
}

/// A run's progress and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunProgress {
    /// The run's step: how many times `batch_size` of its samples were consumed.
    pub step: u64,
    /// Samples consumed since the last step advance (below `batch_size`).
    pub samples_this_step: u64,
    /// Set when the step advances; cleared by [`Packer::clear_ready`].
    pub ready_to_update: bool,
    /// Samples consumed (delivered in a packer step) in all.
    pub total_samples: u64,
    /// Tokens consumed in all.
    pub total_tokens: u64,
    /// Samples accepted into the buffer in all.
    pub received_samples: u64,
    /// Samples rejected, by reason.
    pub rejected: BTreeMap<RejectReason, u64>,
    /// Batches ignored because their `(run, step)` was already received.
    pub duplicate_batches: u64,
}

/// What [`Packer::ingest`] did with a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IngestReport {
    /// The batch.
    pub key: BatchKey,
    /// Samples buffered.
    pub accepted: u32,
    /// Samples rejected: position in the batch, reason, message.
    pub rejected: Vec<(u32, RejectReason, String)>,
    /// The batch was a duplicate and nothing was buffered.
    pub duplicate: bool,
}

/// Figures of one packer step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepMetrics {
    /// Packer step.
    pub step: u64,
    /// Samples packed.
    pub samples: u64,
    /// Real tokens.
    pub real_tokens: u64,
    /// Padding tokens (dummies included).
    pub padding_tokens: u64,
    /// Micro-batches per rank.
    pub micro_batches_per_rank: u64,
    /// Heaviest rank's cost over the mean rank cost (1.0 = perfect).
    pub imbalance: f64,
    /// Seconds spent selecting, packing, balancing and materializing.
    pub pack_seconds: f64,
    /// Samples per run in this step.
    pub run_samples: BTreeMap<u32, u64>,
}

/// One packer step: what each rank gets, and its figures.
#[derive(Debug)]
pub struct PackedStep {
    /// Every rank's batch, `ranks[r].rank == r`.
    pub ranks: Vec<RankBatch>,
    /// Figures.
    pub metrics: StepMetrics,
}

/// The packer's state without the batches' contents (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackerState {
    options: OptionsRecord,
    next_step: u64,
    rr: u32,
    runs: Vec<RunRecord>,
    seen: SeenBatches,
    /// The ids of the latest control messages applied (oldest first, at most
    /// [`RECENT_CONTROLS`]).
    controls: Vec<u64>,
    inflight: Option<Inflight>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct OptionsRecord {
    seq_len: u64,
    dp: u32,
    pad_to_multiple_of: u64,
    pad_token_id: i64,
    cost: (u64, u64),
    num_runs: u32,
    teacher_logprobs: bool,
    allow_empty_completion: bool,
    loss_agg_mode: LossAggMode,
    loss_scale_factor: Option<f64>,
    loss_normalization: LossNormalization,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct RunRecord {
    run: u32,
    config: RunConfig,
    progress: RunProgress,
    queue: Vec<SampleKey>,
    /// The loss counts of the update under way, once its first sample was packed
    /// ([`LossNormalization::Update`]).
    update: Option<LossCounts>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Inflight {
    step: u64,
    keys: Vec<SampleKey>,
    ready: Vec<u32>,
    /// Each key's update's loss counts under [`LossNormalization::Update`]; empty otherwise.
    counts: Vec<LossCounts>,
}

impl PackerState {
    /// Encodes in the [`wire::PACKER_STATE`] format.
    pub fn encode(&self) -> Result<Vec<u8>, Error> {
        wire::encode(&wire::PACKER_STATE, self, 1024)
    }

    /// Decodes what [`PackerState::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<Self, Error> {
        wire::decode(&wire::PACKER_STATE, bytes)
    }

    /// Every batch a pending or in-flight sample belongs to, in order.
    pub fn batches(&self) -> BTreeSet<BatchKey> {
        let queued = self.runs.iter().flat_map(|r| r.queue.iter());
        queued.chain(self.inflight.iter().flat_map(|i| i.keys.iter())).map(|k| k.batch()).collect()
    }

    /// Whether `key` was received.
    pub fn seen(&self, key: BatchKey) -> bool {
        self.seen.contains(key)
    }
}

#[derive(Debug)]
struct RunState {
    config: RunConfig,
    progress: RunProgress,
    queue: VecDeque<SampleKey>,
    queue_tokens: u64,
    /// The queued samples' costs (the cost model's plus their extra costs): all runs' together
    /// stay within `u64`, so no step's cost sums overflow.
    queue_cost: u64,
    /// See [`RunRecord::update`].
    update: Option<LossCounts>,
}

impl RunState {
    /// How many of the pending samples may be packed now (see [`update::packable`]).
    fn packable(&self, rule: LossNormalization) -> usize {
        update::packable(rule, self.config.batch_size, self.progress.samples_this_step, self.queue.len())
    }
}

#[derive(Debug)]
struct Stored {
    batch: Arc<TrainingBatch>,
    /// Accepted samples not yet delivered.
    remaining: u32,
}

/// The packer runtime (see the module docs). Not thread-safe by itself; one driver owns it.
#[derive(Debug)]
pub struct Packer {
    kernel: Kernel,
    options: PackerOptions,
    runs: BTreeMap<u32, RunState>,
    batches: HashMap<BatchKey, Stored>,
    seen: SeenBatches,
    controls: VecDeque<u64>,
    rr: u32,
    next_step: u64,
    inflight: Option<Inflight>,
    oldest_pending: Option<Instant>,
}

/// How many control messages the packer remembers by id (and so recognises when one is sent
/// again): the latest 4,096.
pub const RECENT_CONTROLS: usize = 4096;

impl Packer {
    /// A packer without runs.
    ///
    /// Errors: `invalid-argument` naming the option out of range.
    pub fn new(kernel: Kernel, options: PackerOptions) -> Result<Self, Error> {
        options.validate()?;
        Ok(Self {
            kernel,
            options,
            runs: BTreeMap::new(),
            batches: HashMap::new(),
            seen: SeenBatches::default(),
            controls: VecDeque::new(),
            rr: 0,
            next_step: 0,
            inflight: None,
            oldest_pending: None,
        })
    }

    /// The options.
    pub fn options(&self) -> &PackerOptions {
        &self.options
    }

    /// Adds run `run`. Errors: `invalid-argument` when `run` ≥ `num_runs`, the run exists, or
    /// `batch_size` is 0.
    pub fn add_run(&mut self, run: u32, config: RunConfig) -> Result<(), Error> {
        if run >= self.options.num_runs {
            return Err(Error::InvalidArgument(format!(
                "run must be in 0..{} (num_runs) (got {run})",
                self.options.num_runs
            )));
        }
        if config.batch_size == 0 {
            return Err(Error::InvalidArgument("batch_size must be at least 1 (got 0)".into()));
        }
        if self.runs.contains_key(&run) {
            return Err(Error::InvalidArgument(format!("run {run} already exists")));
        }
        let state = RunState {
            config,
            progress: RunProgress::default(),
            queue: VecDeque::new(),
            queue_tokens: 0,
            queue_cost: 0,
            update: None,
        };
        self.runs.insert(run, state);
        Ok(())
    }

    /// Removes run `run` and its pending samples; returns how many were dropped (their
    /// batches are released as if delivered). Samples of the step in flight stay delivered.
    /// Errors: `invalid-argument` for an unknown run.
    pub fn remove_run(&mut self, run: u32) -> Result<(usize, Vec<BatchKey>), Error> {
        let state = self.runs.remove(&run).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "run {run} does not exist (runs: {:?})",
                self.runs.keys().collect::<Vec<_>>()
            ))
        })?;
        let dropped = state.queue.len();
        let released = self.release(state.queue.iter().copied());
        self.reset_oldest();
        Ok((dropped, released))
    }

    /// The runs and their configuration and progress.
    pub fn runs(&self) -> impl Iterator<Item = (u32, &RunConfig, &RunProgress)> {
        self.runs.iter().map(|(&r, s)| (r, &s.config, &s.progress))
    }

    /// A run's progress, if it exists.
    pub fn progress(&self, run: u32) -> Option<&RunProgress> {
        self.runs.get(&run).map(|s| &s.progress)
    }

    /// Clears a run's `ready_to_update` (after the trainer updated it). Errors: unknown run.
    pub fn clear_ready(&mut self, run: u32) -> Result<(), Error> {
        let s = self.runs.get_mut(&run).ok_or_else(|| Error::InvalidArgument(format!("run {run} does not exist")))?;
        s.progress.ready_to_update = false;
        Ok(())
    }

    /// Samples and tokens pending over all runs.
    pub fn pending(&self) -> (usize, u64) {
        self.runs.values().fold((0, 0), |(n, t), s| (n + s.queue.len(), t + s.queue_tokens))
    }

    /// Samples and tokens that may be packed now: every pending one, but under
    /// [`LossNormalization::Update`] only those of updates whose samples have all arrived.
    pub fn packable(&self) -> (usize, u64) {
        let rule = self.options.loss_normalization;
        if rule == LossNormalization::Step {
            return self.pending();
        }
        self.runs.values().fold((0, 0), |(n, t), s| {
            let k = s.packable(rule);
            let tokens: u64 = s.queue.iter().take(k).map(|key| self.sample_len(key)).sum();
            (n + k, t + tokens)
        })
    }

    /// The tokens of a pending or in-flight sample.
    fn sample_len(&self, key: &SampleKey) -> u64 {
        self.batches[&key.batch()].batch.samples[key.index as usize].len() as u64
    }

    /// Whether the batch `key` was received before (a second copy would be a duplicate).
    pub fn seen(&self, key: BatchKey) -> bool {
        self.seen.contains(key)
    }

    /// The step packed but not yet [`Packer::delivered`], if any.
    pub fn in_flight(&self) -> Option<u64> {
        self.inflight.as_ref().map(|i| i.step)
    }

    /// Steps below this were packed (delivered, or in flight): no receiver can hold a step
    /// at or above it. A receiver that does ([`Server`](crate::serve::Server) checks the
    /// root and the ranks' hellos) proves the checkpoint is older than the deliveries.
    pub fn issued(&self) -> u64 {
        self.next_step
    }

    /// The next packer step.
    pub fn next_step(&self) -> u64 {
        self.inflight.as_ref().map_or(self.next_step, |i| i.step)
    }

    /// Buffers `batch`'s valid samples in its run's buffer. A batch of an unknown run has
    /// every sample rejected as `unknown_run`; a duplicate `(run, step)` changes nothing.
    pub fn ingest(&mut self, batch: Arc<TrainingBatch>) -> IngestReport {
        let key = batch.key();
        let mut report = IngestReport { key, accepted: 0, rejected: Vec::new(), duplicate: false };
        if self.seen.contains(key) {
            report.duplicate = true;
            if let Some(s) = self.runs.get_mut(&key.run) {
                s.progress.duplicate_batches += 1;
            }
            return report;
        }
        self.seen.insert(key);
        let o = self.options;
        let mut accepted = Vec::new();
        let known = self.runs.contains_key(&key.run);
        let mut pending_cost = self.runs.values().fold(0u64, |c, s| c.saturating_add(s.queue_cost));
        for (i, s) in batch.samples.iter().enumerate() {
            let verdict = if !known {
                Err((
                    RejectReason::UnknownRun,
                    format!("run {} is not registered (runs: {:?})", key.run, self.runs.keys().collect::<Vec<_>>()),
                ))
            } else if s.len() as u64 > o.seq_len {
                Err((RejectReason::TooLong, format!("{} tokens, over seq_len {}", s.len(), o.seq_len)))
            } else {
                let sample = s.as_sample(batch.temperature, key.run);
                check_sample(&sample, o.allow_empty_completion, o.num_runs, o.teacher_logprobs).and_then(|()| {
                    match cost_of(&o.cost, s).and_then(|c| pending_cost.checked_add(c).map(|t| (c, t))) {
                        Some((c, total)) => {
                            pending_cost = total;
                            Ok(c)
                        }
                        None => Err((
                            RejectReason::CostOverflow,
                            format!(
                                "the cost of its {} tokens plus extra_cost {} overflows u64 with the {pending_cost} \
                                 of the samples pending",
                                s.len(),
                                s.extra_cost
                            ),
                        )),
                    }
                })
            };
            match verdict {
                Ok(cost) => accepted.push((i as u32, s.len() as u64, cost)),
                Err((reason, message)) => report.rejected.push((i as u32, reason, message)),
            }
        }
        report.accepted = accepted.len() as u32;
        if let Some(state) = self.runs.get_mut(&key.run) {
            for &(_, reason, _) in &report.rejected {
                *state.progress.rejected.entry(reason).or_default() += 1;
            }
            state.progress.received_samples += accepted.len() as u64;
            for (index, len, cost) in accepted {
                state.queue.push_back(SampleKey { run: key.run, step: key.step, index });
                state.queue_tokens += len;
                state.queue_cost += cost;
            }
        }
        if report.accepted > 0 {
            self.batches.insert(key, Stored { batch, remaining: report.accepted });
            self.oldest_pending.get_or_insert_with(Instant::now);
        }
        report
    }

    /// Whether a step should be packed now: the threshold is reached, or samples are pending
    /// and the oldest has waited `wait_timeout` (counting only [`Packer::packable`] ones).
    pub fn should_pack(&self, now: Instant) -> bool {
        let (n, tokens) = self.packable();
        n > 0
            && (tokens >= self.options.threshold_tokens()
                || self.oldest_pending.is_some_and(|t| now.duration_since(t) >= self.options.wait_timeout))
    }

    /// Selects this step's samples round-robin across runs (at most [`RunState::packable`]
    /// of each) and advances run progress; under [`LossNormalization::Update`], also each
    /// sample's update's loss counts.
    fn select(&mut self) -> (Vec<SampleKey>, Vec<u32>, Vec<LossCounts>) {
        let budget = self.options.step_tokens.unwrap_or(u64::MAX);
        let rule = self.options.loss_normalization;
        let per_update = rule == LossNormalization::Update;
        let mut used = 0u64;
        let mut keys = Vec::new();
        let mut counts = Vec::new();
        // How many samples each run may still give, and its position in its update.
        let mut left: BTreeMap<u32, (usize, u64)> =
            self.runs.iter().map(|(&r, s)| (r, (s.packable(rule), s.progress.samples_this_step))).collect();
        let ids: Vec<u32> = self.runs.keys().copied().collect();
        let start = ids.iter().position(|&r| r >= self.rr).unwrap_or(0);
        let mut order: Vec<u32> = ids[start..].iter().chain(&ids[..start]).copied().collect();
        let mut last = None;
        // Samples and tokens taken from each run.
        let mut taken: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        while !order.is_empty() {
            order.retain(|run| {
                let Some(state) = self.runs.get_mut(run) else { return false };
                let Some(&head) = state.queue.front() else { return false };
                let Some((left, position)) = left.get_mut(run).filter(|(left, _)| *left > 0) else { return false };
                let sample = |k: &SampleKey| {
                    let b = &self.batches[&k.batch()].batch;
                    b.samples[k.index as usize].as_sample(b.temperature, k.run)
                };
                let len = sample(&head).len() as u64;
                if used + len > budget {
                    return false;
                }
                used += len;
                if per_update {
                    if *position % state.config.batch_size == 0 || state.update.is_none() {
                        // The update's first sample: its samples are the next batch_size ones.
                        let mut c = LossCounts::default();
                        let rest = state.config.batch_size - *position % state.config.batch_size;
                        for k in state.queue.iter().take(usize::try_from(rest).unwrap_or(usize::MAX)) {
                            c.add(&sample(k));
                        }
                        state.update = Some(c);
                    }
                    counts.push(state.update.unwrap_or_default());
                    *position += 1;
                }
                *left -= 1;
                state.queue.pop_front();
                state.queue_tokens -= len;
                // Accepted, so it fits (see `ingest`).
                let b = &self.batches[&head.batch()].batch;
                state.queue_cost -= cost_of(&self.options.cost, &b.samples[head.index as usize]).unwrap_or(0);
                keys.push(head);
                let t = taken.entry(*run).or_default();
                *t = (t.0 + 1, t.1 + len);
                last = Some(*run);
                true
            });
        }
        if let Some(l) = last {
            // The next step starts with the run after the last one served.
            self.rr = l.wrapping_add(1);
        }
        let mut ready = Vec::new();
        for (run, (samples, tokens)) in taken {
            let Some(state) = self.runs.get_mut(&run) else { continue };
            let p = &mut state.progress;
            p.total_samples += samples;
            p.total_tokens += tokens;
            p.samples_this_step += samples;
            let before = p.step;
            while p.samples_this_step >= state.config.batch_size {
                p.samples_this_step -= state.config.batch_size;
                p.step += 1;
                p.ready_to_update = true;
            }
            if p.step > before {
                ready.push(run);
                if p.samples_this_step == 0 {
                    // The next update's counts are taken when its first sample is packed.
                    state.update = None;
                }
            }
        }
        (keys, ready, counts)
    }

    /// Packs the next step now if [`Packer::should_pack`] (or anything is pending and `force`).
    /// The step stays in flight until [`Packer::delivered`]; until then the next call errors.
    ///
    /// Errors: a step still in flight; those of [`materialize`](crate::materialize::materialize) (a bug: samples were
    /// checked when they arrived).
    pub fn pack(&mut self, force: bool) -> Result<Option<PackedStep>, Error> {
        if let Some(i) = &self.inflight {
            return Err(Error::InvalidArgument(format!(
                "step {} is still in flight; call delivered({}) first",
                i.step, i.step
            )));
        }
        if self.packable().0 == 0 || !(force || self.should_pack(Instant::now())) {
            return Ok(None);
        }
        let started = Instant::now();
        let (keys, ready, counts) = self.select();
        self.reset_oldest();
        let step = self.next_step;
        self.next_step += 1;
        self.inflight = Some(Inflight { step, keys, ready, counts });
        self.build_inflight(started).map(Some)
    }

    /// Rebuilds the step in flight (after [`Packer::restore`]): the same bytes as before.
    pub fn rebuild_inflight(&self) -> Result<Option<PackedStep>, Error> {
        match self.inflight {
            None => Ok(None),
            Some(_) => self.build_inflight(Instant::now()).map(Some),
        }
    }

    fn build_inflight(&self, started: Instant) -> Result<PackedStep, Error> {
        let Some(inflight) = &self.inflight else {
            return Err(Error::InvalidArgument("no step in flight".into()));
        };
        let samples: Vec<Sample<'_>> = inflight
            .keys
            .iter()
            .map(|k| {
                let b = &self.batches[&k.batch()].batch;
                b.samples[k.index as usize].as_sample(b.temperature, k.run)
            })
            .collect();
        let counts = (!inflight.counts.is_empty()).then_some(&inflight.counts[..]);
        let m: Materialized = crate::materialize::materialize_counted(
            &self.kernel,
            &samples,
            &self.options.materialize_options(),
            counts,
        )?;
        let mean = m.distribution.rank_costs.iter().map(|&c| c as f64).sum::<f64>() / f64::from(self.options.dp);
        let max = m.distribution.rank_costs.iter().copied().max().unwrap_or(0) as f64;
        let mut run_samples = BTreeMap::new();
        for k in &inflight.keys {
            *run_samples.entry(k.run).or_insert(0) += 1;
        }
        let metrics = StepMetrics {
            step: inflight.step,
            samples: inflight.keys.len() as u64,
            real_tokens: m.real_tokens,
            padding_tokens: m.padding_tokens,
            micro_batches_per_rank: u64::from(m.distribution.per_rank),
            imbalance: if mean > 0.0 { max / mean } else { 1.0 },
            pack_seconds: started.elapsed().as_secs_f64(),
            run_samples,
        };
        let ranks = m
            .ranks
            .into_iter()
            .enumerate()
            .map(|(r, micro_batches)| RankBatch {
                step: inflight.step,
                rank: r as u32,
                dp: self.options.dp,
                keys: inflight.keys.clone(),
                micro_batches,
                ready_to_update: inflight.ready.clone(),
            })
            .collect();
        Ok(PackedStep { ranks, metrics })
    }

    /// Marks the step in flight delivered; returns the batches now fully delivered (their
    /// spool files may go). Errors: `step` is not the step in flight.
    pub fn delivered(&mut self, step: u64) -> Result<Vec<BatchKey>, Error> {
        match self.inflight.take() {
            Some(i) if i.step == step => Ok(self.release(i.keys.into_iter())),
            other => {
                let now = other.as_ref().map(|i| i.step);
                self.inflight = other;
                Err(Error::InvalidArgument(format!("step {step} is not in flight (in flight: {now:?})")))
            }
        }
    }

    /// Counts samples as delivered or dropped; returns the batches with none left.
    fn release(&mut self, keys: impl Iterator<Item = SampleKey>) -> Vec<BatchKey> {
        let mut done = Vec::new();
        for k in keys {
            let b = k.batch();
            if let Some(s) = self.batches.get_mut(&b) {
                s.remaining = s.remaining.saturating_sub(1);
                if s.remaining == 0 {
                    self.batches.remove(&b);
                    done.push(b);
                }
            }
        }
        done
    }

    fn reset_oldest(&mut self) {
        let any = self.runs.values().any(|s| !s.queue.is_empty());
        self.oldest_pending = if any { Some(self.oldest_pending.unwrap_or_else(Instant::now)) } else { None };
    }

    /// Whether the control message `id` was applied already (one of the latest
    /// [`RECENT_CONTROLS`]): a sender that lost its receipt sends it again, and applying a
    /// `RemoveRun` twice would drop the samples of a run added since.
    pub fn control_applied(&self, id: u64) -> bool {
        self.controls.contains(&id)
    }

    /// Records that the control message `id` was applied (forgetting the oldest beyond
    /// [`RECENT_CONTROLS`]); checkpointed with the state.
    pub fn note_control(&mut self, id: u64) {
        if self.controls.len() >= RECENT_CONTROLS {
            self.controls.pop_front();
        }
        self.controls.push_back(id);
    }

    /// The state to checkpoint (see the module docs).
    pub fn state(&self) -> PackerState {
        PackerState {
            options: self.options.record(),
            next_step: self.next_step,
            rr: self.rr,
            runs: self
                .runs
                .iter()
                .map(|(&run, s)| RunRecord {
                    run,
                    config: s.config,
                    progress: s.progress.clone(),
                    queue: s.queue.iter().copied().collect(),
                    update: s.update,
                })
                .collect(),
            seen: self.seen.clone(),
            controls: self.controls.iter().copied().collect(),
            inflight: self.inflight.clone(),
        }
    }

    /// A packer from a saved state and the batches it names (`load(key)` returns each).
    ///
    /// Errors: `cache-mismatch` when `options` differ from the saved ones in anything that
    /// decides a step's contents (the message names the option), or a batch does not have the
    /// sample a key names; those of `load`.
    pub fn restore(
        kernel: Kernel,
        options: PackerOptions,
        state: PackerState,
        mut load: impl FnMut(BatchKey) -> Result<Arc<TrainingBatch>, Error>,
    ) -> Result<Self, Error> {
        let mut p = Self::new(kernel, options)?;
        let now = options.record();
        if state.options != now {
            let (a, b) = (format!("{:?}", state.options), format!("{now:?}"));
            return Err(Error::CacheMismatch(format!(
                "the packer state was saved with other options: saved {a}, given {b}; start with the saved options or \
                 a fresh state directory"
            )));
        }
        let mut remaining: HashMap<BatchKey, u32> = HashMap::new();
        for k in state.runs.iter().flat_map(|r| r.queue.iter()).chain(state.inflight.iter().flat_map(|i| &i.keys)) {
            *remaining.entry(k.batch()).or_default() += 1;
        }
        for (&key, &n) in &remaining {
            let batch = load(key)?;
            if batch.key() != key {
                return Err(Error::CacheMismatch(format!("spooled batch {key:?} holds batch {:?}", batch.key())));
            }
            p.batches.insert(key, Stored { batch, remaining: n });
        }
        let check = |k: &SampleKey, p: &Packer| -> Result<u64, Error> {
            p.batches[&k.batch()].batch.samples.get(k.index as usize).map(|s| s.len() as u64).ok_or_else(|| {
                Error::CacheMismatch(format!("the packer state names sample {k:?}, which its spooled batch lacks"))
            })
        };
        let mut all_costs = 0u64;
        for r in state.runs {
            let (mut tokens, mut cost) = (0, 0u64);
            for k in &r.queue {
                tokens += check(k, &p)?;
                let c = cost_of(&options.cost, &p.batches[&k.batch()].batch.samples[k.index as usize]);
                cost = c.and_then(|c| cost.checked_add(c)).filter(|&c| all_costs.checked_add(c).is_some()).ok_or_else(
                    || Error::CacheMismatch(format!("the pending samples' costs overflow u64 at sample {k:?}")),
                )?;
            }
            all_costs += cost;
            let s = RunState {
                config: r.config,
                progress: r.progress,
                queue: r.queue.into(),
                queue_tokens: tokens,
                queue_cost: cost,
                update: r.update,
            };
            p.runs.insert(r.run, s);
        }
        if let Some(i) = &state.inflight {
            for k in &i.keys {
                check(k, &p)?;
            }
            let want = if options.loss_normalization == LossNormalization::Update { i.keys.len() } else { 0 };
            if i.counts.len() != want {
                return Err(Error::CacheMismatch(format!(
                    "the packer state's step in flight has loss counts for {} of its {} samples (want {want} under \
                     loss_normalization '{}')",
                    i.counts.len(),
                    i.keys.len(),
                    options.loss_normalization
                )));
            }
        }
        p.seen = state.seen;
        p.controls = state.controls.into_iter().collect();
        p.rr = state.rr;
        p.next_step = state.next_step;
        p.inflight = state.inflight;
        p.reset_oldest();
        Ok(p)
    }
}
