//! The state machine: samples buffered per run, selected round-robin, packed and
//! materialized into one step at a time, delivered, released.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::messages::cost_of;
use super::run::RunState;
use super::{
    BatchKey, IngestReport, LossNormalization, PackedStep, PackerOptions, RankBatch, RunConfig, RunProgress, SampleKey,
    SeenBatches, StepMetrics, TrainingBatch,
};
use crate::Error;
use crate::kernel::Kernel;
use crate::materialize::{LossCounts, Materialized, RejectReason, Sample, SampleLimits, check_sample};

/// The step packed but not yet delivered to every rank (saved in the checkpoint).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Inflight {
    pub(super) step: u64,
    pub(super) keys: Vec<SampleKey>,
    pub(super) ready: Vec<u32>,
    /// Each key's update's loss counts under [`LossNormalization::Update`]; empty otherwise.
    pub(super) counts: Vec<LossCounts>,
}

#[derive(Debug)]
pub(super) struct Stored {
    pub(super) batch: Arc<TrainingBatch>,
    /// Accepted samples not yet delivered.
    pub(super) remaining: u32,
}

/// The packer runtime (see the module docs). Not thread-safe by itself; one driver owns it.
#[derive(Debug)]
pub struct Packer {
    pub(super) kernel: Kernel,
    pub(super) options: PackerOptions,
    pub(super) runs: BTreeMap<u32, RunState>,
    pub(super) batches: HashMap<BatchKey, Stored>,
    pub(super) seen: SeenBatches,
    pub(super) controls: VecDeque<u64>,
    pub(super) rr: u32,
    pub(super) next_step: u64,
    pub(super) inflight: Option<Inflight>,
    pub(super) oldest_pending: Option<Instant>,
}

/// How many control messages the packer remembers by id (and so recognises when one is sent
/// again): the latest 4,096.
pub const RECENT_CONTROLS: usize = 4096;

impl Packer {
    /// A packer without runs.
    ///
    /// Errors: `invalid-argument` naming the option out of range.
    pub fn new(kernel: Kernel, mut options: PackerOptions) -> Result<Self, Error> {
        options.validate()?;
        // One order for the same limits, whatever order they were given in: the steps and
        // the checkpoint's record do not depend on it.
        let l = &mut options.limits;
        let mut by_name: Vec<(String, u64)> = l.names.drain(..).zip(l.caps.drain(..)).collect();
        by_name.sort();
        (l.names, l.caps) = by_name.into_iter().unzip();
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
    /// at or above it. A receiver that does (`serve`'s `Server` checks the
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
        let o = &self.options;
        let mut accepted = Vec::new();
        let known = self.runs.contains_key(&key.run);
        let mut pending_cost = self.runs.values().fold(0u64, |c, s| c.saturating_add(s.queue_cost));
        for (i, s) in batch.samples.iter().enumerate() {
            let verdict = if !known {
                Err((
                    RejectReason::UnknownRun,
                    format!("run {} is not registered (runs: {:?})", key.run, self.runs.keys().collect::<Vec<_>>()),
                ))
            } else if s.len() as u64 > o.capacity {
                Err((RejectReason::TooLong, format!("{} tokens, over capacity {}", s.len(), o.capacity)))
            } else if let Err(verdict) = check_resources(s, &o.limits) {
                Err(verdict)
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
    /// checked when they arrived, each resource within its cap, and every cap is one the
    /// kernel's balanced fill takes, so no step can fail on them).
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
        let names = &self.options.limits.names;
        // Checked when they arrived (see `check_resources`).
        let sizes = inflight
            .keys
            .iter()
            .map(|k| self.batches[&k.batch()].batch.samples[k.index as usize].resource_sizes(names))
            .collect::<Result<Vec<_>, String>>()
            .map_err(|e| Error::Runtime(format!("a sample of the step in flight {e}")))?;
        let samples: Vec<Sample<'_>> = inflight
            .keys
            .iter()
            .zip(&sizes)
            .map(|(k, sizes)| {
                let b = &self.batches[&k.batch()].batch;
                Sample { resources: sizes, ..b.samples[k.index as usize].as_sample(b.temperature, k.run) }
            })
            .collect();
        let counts = (!inflight.counts.is_empty()).then_some(&inflight.counts[..]);
        let m: Materialized = crate::materialize::materialize_counted(
            &self.kernel,
            &samples,
            &self.options.materialize_options(),
            &self.options.limits,
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

    pub(super) fn reset_oldest(&mut self) {
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
}

/// Checks a sample's resources against the packer's limits: each named once, each one of
/// them, each within its cap.
fn check_resources(s: &super::TrainingSample, limits: &SampleLimits) -> Result<(), (RejectReason, String)> {
    let sizes = s.resource_sizes(&limits.names).map_err(|e| {
        let hint = if limits.names.is_empty() { " (serve --limit NAME=CAP, Packer(limits=))" } else { "" };
        (RejectReason::UnknownResource, format!("the sample {e}{hint}"))
    })?;
    match sizes.iter().zip(&limits.caps).zip(&limits.names).find(|((size, cap), _)| size > cap) {
        Some(((size, cap), name)) => Err((
            RejectReason::OverLimit,
            format!("{size} {name}, over its limit {cap} per micro-batch (samples are never split)"),
        )),
        None => Ok(()),
    }
}
