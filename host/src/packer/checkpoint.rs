//! Durability: the packer's state without the batches' contents ([`PackerState`]), saved
//! with every step, and the packer rebuilt from it and the spooled batches.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::machine::{Inflight, Stored};
use super::messages::cost_of;
use super::run::RunState;
use super::{
    BatchKey, LossNormalization, Packer, PackerOptions, RunConfig, RunProgress, SampleKey, SeenBatches, TrainingBatch,
};
use crate::Error;
use crate::kernel::Kernel;
use crate::materialize::{DistributionMode, LossAggMode, LossCounts};
use crate::wire;

/// The packer's state without the batches' contents (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PackerState {
    options: OptionsRecord,
    next_step: u64,
    rr: u32,
    runs: Vec<RunRecord>,
    seen: SeenBatches,
    /// The ids of the latest control messages applied (oldest first, at most
    /// [`RECENT_CONTROLS`](super::RECENT_CONTROLS)).
    controls: Vec<u64>,
    inflight: Option<Inflight>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct OptionsRecord {
    capacity: u64,
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
    /// Each further limit per micro-batch: its name and cap; `segments` last, with
    /// `max_segments`, when set (no limit may have that name).
    limits: Vec<(String, u64)>,
    distribution: DistributionMode,
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

    /// The step in flight (packed, not yet delivered to every rank), if any.
    pub fn in_flight(&self) -> Option<u64> {
        self.inflight.as_ref().map(|i| i.step)
    }

    /// The number of ranks the state was saved with.
    pub fn dp(&self) -> u32 {
        self.options.dp
    }
}

impl PackerOptions {
    /// The options that decide a step's contents, as saved in a [`PackerState`].
    fn record(&self) -> OptionsRecord {
        OptionsRecord {
            capacity: self.capacity,
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
            limits: {
                let (caps, names) = self.limits.kernel_caps();
                names.into_iter().zip(caps).collect()
            },
            distribution: self.distribution,
        }
    }
}

impl Packer {
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
        let now = p.options.record();
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
                let c = cost_of(&p.options.cost, &p.batches[&k.batch()].batch.samples[k.index as usize]);
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
            let want = if p.options.loss_normalization == LossNormalization::Update { i.keys.len() } else { 0 };
            if i.counts.len() != want {
                return Err(Error::CacheMismatch(format!(
                    "the packer state's step in flight has loss counts for {} of its {} samples (want {want} under \
                     loss_normalization '{}')",
                    i.counts.len(),
                    i.keys.len(),
                    p.options.loss_normalization
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
