//! Building rows: a plan of every rank's micro-batches (the kernel's or a
//! caller's) made into the rows' arrays.

use stowplan_kernel::{AlignOptions, Factor, Padding};

use super::sample::validate;
use super::weights::loss_weights;
use super::{
    CpRuns, LossCounts, MaterializeOptions, MaterializedBatch, Sample, SampleLimits, Temperature, TokenArrays, to_i32,
};
use crate::Error;
use crate::kernel::Kernel;

/// Appends one sample's tokens (and per-sequence padding) to `mb`; `weight` is its loss
/// tokens' weight.
fn push_sample(mb: &mut MaterializedBatch, s: &Sample<'_>, pad: usize, pad_token_id: i64, weight: f32) {
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
fn push_padding(mb: &mut MaterializedBatch, pad: usize, pad_token_id: i64) {
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
) -> Result<(MaterializedBatch, Vec<u64>), Error> {
    let m = o.padding.multiple() as usize;
    let per_sequence = matches!(o.padding, Padding::PerSequence(_));
    let real: usize = members.iter().map(|&i| samples[i as usize].len()).sum();
    let seq_pad = |len: usize| if per_sequence { len.div_ceil(m) * m - len } else { 0 };
    let body: usize = members.iter().map(|&i| samples[i as usize].len()).map(|l| l + seq_pad(l)).sum();
    let total = if members.is_empty() { m } else { body.div_ceil(m) * m };
    let teacher = samples.first().is_some_and(|s| s.teacher_logprobs.is_some());
    let mut mb = MaterializedBatch {
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

/// Every sample's sizes under `limits`, sample by sample (none without limits), a 1 after
/// them for the segments when `max_segments` is set.
pub(super) fn resource_rows(samples: &[Sample<'_>], limits: &SampleLimits) -> Result<Vec<u64>, Error> {
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

/// Builds the micro-batches of a given plan: `plan[r][j]` lists the samples of rank `r`'s
/// micro-batch `j` in row order (an empty list is a dummy). Used for plans from
/// [`plan`](crate::KernelApi::plan) or from a caller. The plan has `options.dp` ranks with the
/// same number of micro-batches each (ranks step together: pad a short rank with dummies);
/// `options.capacity` is checked on every row; `cost` only matters for [`materialize`](super::materialize), and
/// runs may not share a row unless `mix_runs`.
///
/// Errors: those of [`materialize`](super::materialize); a plan of other than `dp` ranks, or ranks with different
/// numbers of micro-batches; a sample index out of range or used twice; a row over the
/// capacity; runs mixed in a row without `mix_runs`; a sample with `resources` (nothing here
/// checks them against limits).
pub fn materialize_plan(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    plan: &[Vec<&[u32]>],
    options: &MaterializeOptions,
) -> Result<Vec<Vec<MaterializedBatch>>, Error> {
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

/// [`materialize_plan`](super::materialize_plan) after `validate` (which gave `num_runs`), with the loss counts of
/// [`materialize_counted`](super::materialize_counted).
pub(super) fn build_plan(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    plan: &[Vec<&[u32]>],
    options: &MaterializeOptions,
    num_runs: u32,
    counts: Option<&[LossCounts]>,
) -> Result<Vec<Vec<MaterializedBatch>>, Error> {
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
    let built: Vec<Result<Vec<(MaterializedBatch, Vec<u64>)>, Error>> = std::thread::scope(|scope| {
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
    let mut ranks: Vec<Vec<MaterializedBatch>> = plan.iter().map(|r| Vec::with_capacity(r.len())).collect();
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
