//! Building rows: the options, the plan of every rank's micro-batches (the kernel's or a
//! caller's), and the rows' arrays.

use stowplan_kernel::{AlignOptions, Cost, DistributeOptions, Distribution, Factor, MicroLimits, Padding};

use super::micro_batch::{TokenArrays, to_i32};
use super::sample::validate;
use super::weights::loss_weights;
use super::{CpRuns, DistributionMode, LossAggMode, LossCounts, MicroBatch, Sample, Temperature};
use crate::Error;
use crate::kernel::Kernel;

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

    /// Seed 001's CP/TP alignment: per-sequence padding to `2·cp·tp` (`tp` when `cp` = 1).
    pub fn with_cp(self, cp: u32, tp: u32) -> Result<Self, Error> {
        let factor = stowplan_kernel::pad_factor(&AlignOptions::new(cp, tp))?;
        Ok(Self { cp, padding: Padding::PerSequence(factor), ..self })
    }
}

/// Further caps per micro-batch beside the capacity, for [`materialize_limited`]: a
/// vision-language step's image tokens, images … Each sample's sizes are its
/// [`Sample::resources`]. `max_segments` caps the samples (segments) per micro-batch, as
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

/// Appends one sample's tokens (and per-sequence padding) to `mb`; `weight` is its loss
/// tokens' weight.
fn push_sample(mb: &mut MicroBatch, s: &Sample<'_>, pad: usize, pad_token_id: i64, weight: f32) {
    let mb = &mut mb.arrays;
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
        arrays: TokenArrays::with_capacity(total, teacher),
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
    materialize_counted(kernel, samples, options, &SampleLimits::default(), None)
}

/// [`materialize`] under further caps per micro-batch (image tokens, images …): every row
/// stays within the capacity and every one of `limits`, each sample's sizes being its
/// [`Sample::resources`]. Each run's micro-batches are then the kernel's balanced fill under
/// every cap (`multi-micro.distribute`) instead of best-fit decreasing; splits, dummies and the
/// ranks' balance are [`materialize`]'s. With no limits it is [`materialize`].
///
/// Errors: those of [`materialize`]; a sample whose `resources` has neither 0 nor one entry
/// per limit (named); those of the kernel's limits (`infeasible` for a sample over a cap,
/// naming it, the resource, its size and the cap).
pub fn materialize_limited(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    options: &MaterializeOptions,
    limits: &SampleLimits,
) -> Result<Materialized, Error> {
    materialize_counted(kernel, samples, options, limits, None)
}

/// Every sample's sizes under `limits`, sample by sample (none without limits), a 1 after
/// them for the segments when `max_segments` is set.
fn resource_rows(samples: &[Sample<'_>], limits: &SampleLimits) -> Result<Vec<u64>, Error> {
    let e = limits.caps.len();
    let segments = usize::from(limits.max_segments > 0);
    let mut sizes = Vec::with_capacity(samples.len() * (e + segments));
    for (i, s) in samples.iter().enumerate() {
        match s.resources.len() {
            0 => sizes.extend(std::iter::repeat_n(0, e)),
            n if n == e => sizes.extend_from_slice(s.resources),
            n if e == 0 => {
                return Err(Error::InvalidArgument(format!(
                    "samples[{i}].resources has {n} sizes but there are no limits: give the caps \
                     (materialize_limited, which plans the rows), or no resources"
                )));
            }
            n => {
                return Err(Error::InvalidArgument(format!(
                    "samples[{i}].resources has {n} sizes; the limits are {e}{}: give one size per limit, or none",
                    if limits.names.is_empty() { String::new() } else { format!(" ({})", limits.names.join(", ")) }
                )));
            }
        }
        sizes.extend(std::iter::repeat_n(1, segments));
    }
    Ok(sizes)
}

/// [`materialize_limited`] with the loss counts given per sample (`counts[i]`: those of the
/// set sample `i` belongs to, which may reach beyond this call) instead of taken per run here.
pub(crate) fn materialize_counted(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    options: &MaterializeOptions,
    limits: &SampleLimits,
    counts: Option<&[LossCounts]>,
) -> Result<Materialized, Error> {
    let num_runs = validate(samples, options)?;
    if options.distribution == DistributionMode::RoundRobin {
        return super::round_robin::materialize(kernel, samples, options, limits, num_runs, counts);
    }
    if !limits.is_empty() {
        limits.check()?;
    }
    let sizes = resource_rows(samples, limits)?;
    let (caps, names) = limits.kernel_caps();
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
            limits: (!caps.is_empty()).then_some(MicroLimits { sizes: &sizes, caps: &caps, names: &names }),
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
/// capacity; runs mixed in a row without `mix_runs`; a sample with `resources` (nothing here
/// checks them against limits).
pub fn materialize_plan(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    plan: &[Vec<&[u32]>],
    options: &MaterializeOptions,
) -> Result<Vec<Vec<MicroBatch>>, Error> {
    let num_runs = validate(samples, options)?;
    // A given plan is built as it is: sizes under limits would go unchecked, so are refused.
    resource_rows(samples, &SampleLimits::default())?;
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
pub(super) fn build_plan(
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
