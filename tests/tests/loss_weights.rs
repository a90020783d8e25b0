//! Loss weights: for random samples (prompt and completion lengths, loss masks,
//! runs), random per-token losses, dp, cp, capacities and every aggregation mode, the
//! weighted sum over the materialized layout — every rank, micro-batch and token, and again
//! over the CP ranks' views — equals the loss computed on the unpacked samples, per run; and
//! per mini-batch when each mini-batch is materialized by a call of its own.

use proptest::prelude::*;
use stowplan::{
    Kernel, MaterializeOptions,
    kernel::Named,
    materialize::{LossAggMode, Sample, Temperature},
};

/// One random sample: prompt mask, completion mask, run, and a loss for each of its tokens.
#[derive(Clone, Debug)]
struct Case {
    prompt_mask: Vec<bool>,
    completion_mask: Vec<bool>,
    run: u32,
    losses: Vec<f32>,
}

fn case() -> impl Strategy<Value = Case> {
    (0usize..6, 1usize..24, 0u32..2).prop_flat_map(|(p, c, run)| {
        (
            proptest::collection::vec(prop::bool::weighted(0.2), p),
            proptest::collection::vec(prop::bool::weighted(0.8), c),
            proptest::collection::vec(-3.0f32..3.0, p + c),
        )
            .prop_map(move |(prompt_mask, completion_mask, losses)| Case {
                prompt_mask,
                completion_mask,
                run,
                losses,
            })
    })
}

/// The unpacked reference of each run's loss (f64), by the formulas of [`LossAggMode`].
fn reference(cases: &[Case], mode: LossAggMode, horizon: Option<f64>, run: u32) -> f64 {
    let mine: Vec<&Case> = cases.iter().filter(|c| c.run == run).collect();
    let masked = |c: &Case| -> (f64, f64) {
        let mask = c.prompt_mask.iter().chain(&c.completion_mask);
        let (mut sum, mut n) = (0.0, 0.0);
        for (&m, &l) in mask.zip(&c.losses) {
            if m {
                sum += f64::from(l);
                n += 1.0;
            }
        }
        (sum, n)
    };
    let total: f64 = mine.iter().map(|c| masked(c).1).sum();
    let seqs = mine.iter().filter(|c| masked(c).1 > 0.0).count() as f64;
    let longest = mine.iter().map(|c| c.completion_mask.len()).max().unwrap_or(1) as f64;
    let sums: f64 = mine.iter().map(|c| masked(c).0).sum();
    match mode {
        LossAggMode::TokenMean if total > 0.0 => sums / total,
        LossAggMode::SeqMeanTokenMean if seqs > 0.0 => {
            mine.iter().map(|c| masked(c)).filter(|(_, n)| *n > 0.0).map(|(s, n)| s / n).sum::<f64>() / seqs
        }
        LossAggMode::SeqMeanTokenSum if seqs > 0.0 => sums / seqs,
        LossAggMode::SeqMeanTokenSumNorm => sums / horizon.unwrap_or(longest),
        _ => 0.0,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn weighted_packed_losses_equal_the_unpacked_reference(
        cases in proptest::collection::vec(case(), 1..40),
        dp in 1u32..4,
        cp_split in any::<bool>(),
        extra_capacity in 0u64..64,
        mode in 0usize..4,
        horizon in prop::option::of(1.0f64..50.0),
        wasm in any::<bool>(),
    ) {
        let mode = LossAggMode::ALL[mode];
        // The horizon is an option of seq-mean-token-sum-norm only.
        let horizon = horizon.filter(|_| mode == LossAggMode::SeqMeanTokenSumNorm);
        let ids: Vec<Vec<i64>> = cases.iter().map(|c| (0..c.losses.len() as i64).collect()).collect();
        let samples: Vec<Sample<'_>> = cases
            .iter()
            .zip(&ids)
            .map(|(c, ids)| {
                let p = c.prompt_mask.len();
                Sample {
                    prompt_ids: &ids[..p],
                    completion_ids: &ids[p..],
                    prompt_mask: Some(&c.prompt_mask),
                    completion_mask: Some(&c.completion_mask),
                    completion_logprobs: None,
                    temperature: Temperature::One(1.0),
                    advantage: 1.0,
                    run: c.run,
                    teacher_logprobs: None,
            extra_cost: 0,
            resources: &[],
                }
            })
            .collect();
        let base = MaterializeOptions {
            loss_agg_mode: mode,
            loss_scale_factor: horizon,
            num_runs: Some(2),
            mix_runs: true,
            ..MaterializeOptions::new(0, dp)
        };
        let base = if cp_split { base.with_cp(2, 1).unwrap() } else { base };
        // Room for the longest sample after padding, plus some.
        let capacity = 32 + extra_capacity;
        let options = MaterializeOptions { capacity, ..base };
        let kernel = if wasm { Kernel::wasm().unwrap() } else { Kernel::native() };
        let m = stowplan::materialize(&kernel, &samples, &options).unwrap();
        // Σ w × ℓ per run, from the rows: the sequence k of a row is sample mb.samples[k],
        // occupying cu_seqlens_padded[k] .. + its length.
        let mut packed = [0.0f64; 2];
        let mut by_cp = [0.0f64; 2];
        for mb in m.ranks.iter().flatten() {
            prop_assert_eq!(mb.loss_weights.len(), mb.len());
            let mut loss_row = vec![0.0f32; mb.len()];
            let mut run_row = vec![0u32; mb.len()];
            for (k, &i) in mb.samples.iter().enumerate() {
                let start = mb.cu_seqlens_padded[k] as usize;
                let c = &cases[i as usize];
                loss_row[start..start + c.losses.len()].copy_from_slice(&c.losses);
                run_row[start..start + c.losses.len()].fill(c.run);
            }
            for p in 0..mb.len() {
                if mb.loss_weights[p] != 0.0 {
                    prop_assert!(mb.loss_mask[p], "a weight outside the loss mask");
                }
                packed[run_row[p] as usize] += f64::from(mb.loss_weights[p]) * f64::from(loss_row[p]);
            }
            if let Some(runs) = &mb.cp_runs {
                for r in 0..runs.cp as usize {
                    let view = mb.cp_view(r).unwrap();
                    for (&pos, &w) in view.positions.iter().zip(&view.loss_weights) {
                        let pos = pos as usize;
                        by_cp[run_row[pos] as usize] += f64::from(w) * f64::from(loss_row[pos]);
                    }
                }
            } else {
                by_cp = packed;
            }
        }
        // Mini-batches: one call each, each call's weights add up to that mini-batch's loss.
        if cases.len() >= 2 {
            let half = cases.len() / 2;
            for (part, range) in [(&cases[..half], 0..half), (&cases[half..], half..cases.len())] {
                let m = stowplan::materialize(&kernel, &samples[range.clone()], &options).unwrap();
                let mut sums = [0.0f64; 2];
                for mb in m.ranks.iter().flatten() {
                    for (k, &i) in mb.samples.iter().enumerate() {
                        let c = &part[i as usize];
                        let start = mb.cu_seqlens_padded[k] as usize;
                        let w = &mb.loss_weights[start..start + c.losses.len()];
                        sums[c.run as usize] += w.iter().zip(&c.losses).map(|(&w, &l)| f64::from(w) * f64::from(l)).sum::<f64>();
                    }
                }
                for run in 0..2u32 {
                    let want = reference(part, mode, horizon, run);
                    prop_assert!((sums[run as usize] - want).abs() <= 1e-5 * (1.0 + want.abs()) + 1e-5, "mini-batch {mode:?} run {run}");
                }
            }
        }
        for run in 0..2u32 {
            let want = reference(&cases, mode, horizon, run);
            let tolerance = 1e-5 * (1.0 + want.abs()) + 1e-5;
            prop_assert!((packed[run as usize] - want).abs() <= tolerance, "{mode:?} run {run}: packed {} vs unpacked {want}", packed[run as usize]);
            prop_assert!((by_cp[run as usize] - want).abs() <= tolerance, "{mode:?} run {run}: CP views {} vs {want}", by_cp[run as usize]);
        }
    }
}

#[test]
fn bad_loss_scale_factors_are_refused_naming_the_option() {
    let ids: Vec<i64> = (0..4).collect();
    let samples = [stowplan_conformance::plain_sample(&ids[..1], &ids[1..], 0)];
    for bad in [0.0, 0.5, -1.0, 1e-300, 1e300, f64::NAN, f64::INFINITY] {
        let o = MaterializeOptions {
            loss_agg_mode: LossAggMode::SeqMeanTokenSumNorm,
            loss_scale_factor: Some(bad),
            ..MaterializeOptions::new(16, 1)
        };
        let e = stowplan::materialize(&Kernel::native(), &samples, &o).unwrap_err().to_string();
        assert!(e.contains("loss_scale_factor must be a number of tokens in 1..=2^64"), "{e}");
    }
    let o = MaterializeOptions { loss_scale_factor: Some(100.0), ..MaterializeOptions::new(16, 1) };
    let e = stowplan::materialize(&Kernel::native(), &samples, &o).unwrap_err().to_string();
    assert!(e.contains("only applies to loss_agg_mode 'seq-mean-token-sum-norm'"), "{e}");
    assert_eq!("seq_mean_token_sum".parse::<LossAggMode>().unwrap(), LossAggMode::SeqMeanTokenSum);
    let e = "mean".parse::<LossAggMode>().unwrap_err().to_string();
    assert!(e.contains("loss_agg_mode must be 'token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum' or 'seq-mean-token-sum-norm'"), "{e}");
}

/// Under `LossNormalization::Update` the weights count over each run's
/// optimizer update (`batch_size` samples in arrival order), however many packer steps it
/// spans. Samples arrive in batches of random sizes interleaved across runs, packer steps are
/// small (`step_tokens`), the packer is checkpointed and restored at random points; the sum
/// of weight × loss over every rank, micro-batch and packer step of an update equals the
/// update's unpacked loss, no sample is packed before the rest of its update has arrived, and
/// the samples of an incomplete update are not packed at all.
mod per_update {
    use std::collections::{BTreeMap, HashMap};
    use std::sync::Arc;

    use proptest::prelude::*;
    use stowplan::{
        Kernel, Packer, PackerOptions, TrainingBatch, TrainingSample,
        kernel::Named,
        materialize::LossAggMode,
        packer::{BatchKey, LossNormalization, PackerState, RunConfig, SampleKey},
    };

    use super::{Case, case, reference};

    fn training_sample(c: &Case) -> TrainingSample {
        let p = c.prompt_mask.len();
        let ids: Vec<i64> = (0..c.losses.len() as i64).collect();
        TrainingSample {
            prompt_ids: ids[..p].to_vec(),
            completion_ids: ids[p..].to_vec(),
            prompt_mask: Some(c.prompt_mask.clone()),
            completion_mask: Some(c.completion_mask.clone()),
            advantage: 1.0,
            ..TrainingSample::default()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn weights_add_up_to_each_updates_loss_across_packer_steps(
            runs in proptest::collection::vec((1u64..6, proptest::collection::vec(case(), 0..24)), 1..3),
            chunks in proptest::collection::vec(1usize..5, 64),
            order in proptest::collection::vec(0usize..2, 64),
            dp in 1u32..4,
            step_tokens in 32u64..100,
            mode in 0usize..4,
            restore_at in proptest::collection::vec(any::<bool>(), 64),
        ) {
            let mode = LossAggMode::ALL[mode];
            let options = PackerOptions {
                num_runs: 2,
                step_tokens: Some(step_tokens),
                loss_agg_mode: mode,
                loss_normalization: LossNormalization::Update,
                ..PackerOptions::new(32, dp)
            };
            let mut packer = Packer::new(Kernel::native(), options.clone()).unwrap();
            for (run, (batch_size, _)) in runs.iter().enumerate() {
                packer.add_run(run as u32, RunConfig { batch_size: *batch_size }).unwrap();
            }
            // Every run's samples, cut into batches; the batches of the runs interleaved.
            let mut batches: Vec<Vec<TrainingBatch>> = Vec::new();
            let mut position: HashMap<SampleKey, usize> = HashMap::new();
            let mut chunk = chunks.iter().cycle();
            for (run, (_, cases)) in runs.iter().enumerate() {
                let (mut at, mut step, mut mine) = (0, 0u64, Vec::new());
                while at < cases.len() {
                    let n = (*chunk.next().unwrap()).min(cases.len() - at);
                    for index in 0..n {
                        position.insert(SampleKey { run: run as u32, step, index: index as u32 }, at + index);
                    }
                    let samples = cases[at..at + n].iter().map(training_sample).collect();
                    mine.push(TrainingBatch { run: run as u32, step, temperature: 1.0, samples });
                    at += n;
                    step += 1;
                }
                mine.reverse();
                batches.push(mine);
            }
            let mut by_key: HashMap<BatchKey, Arc<TrainingBatch>> = HashMap::new();
            let mut received = [0usize; 2];
            // Σ weight × loss per (run, update), and the samples packed per run.
            let mut sums: BTreeMap<(u32, usize), f64> = BTreeMap::new();
            let mut packed = [0usize; 2];
            let mut turn = order.iter().cycle();
            let mut restore = restore_at.iter().cycle();
            loop {
                let run = *turn.next().unwrap() % runs.len();
                let next = batches[run].pop().or_else(|| batches.iter_mut().find_map(Vec::pop));
                let more = next.is_some();
                if let Some(b) = next {
                    received[b.run as usize] += b.samples.len();
                    let n = b.samples.len();
                    let b = Arc::new(b);
                    by_key.insert(b.key(), Arc::clone(&b));
                    prop_assert_eq!(packer.ingest(b).accepted as usize, n);
                }
                while let Some(step) = packer.pack(true).unwrap() {
                    let n = step.metrics.step;
                    for rank in &step.ranks {
                        for mb in &rank.micro_batches {
                            for (k, &i) in mb.samples.iter().enumerate() {
                                let key = rank.keys[i as usize];
                                let (run, at) = (key.run as usize, position[&key]);
                                let (batch_size, cases) = &runs[run];
                                let update = at / *batch_size as usize;
                                // The whole update had arrived.
                                prop_assert!(received[run] >= (update + 1) * *batch_size as usize, "packed before its update arrived");
                                let c = &cases[at];
                                let start = mb.cu_seqlens_padded[k] as usize;
                                let w = &mb.loss_weights[start..start + c.losses.len()];
                                *sums.entry((key.run, update)).or_default() +=
                                    w.iter().zip(&c.losses).map(|(&w, &l)| f64::from(w) * f64::from(l)).sum::<f64>();
                            }
                        }
                    }
                    for k in &step.ranks[0].keys {
                        packed[k.run as usize] += 1;
                    }
                    packer.delivered(n).unwrap();
                    if *restore.next().unwrap() {
                        let state = PackerState::decode(&packer.state().encode().unwrap()).unwrap();
                        packer = Packer::restore(Kernel::native(), options.clone(), state, |k| Ok(Arc::clone(&by_key[&k]))).unwrap();
                    }
                }
                if !more {
                    break;
                }
            }
            for (run, (batch_size, cases)) in runs.iter().enumerate() {
                let bs = *batch_size as usize;
                // Whole updates only.
                prop_assert_eq!(packed[run], cases.len() / bs * bs);
                for (update, part) in cases.chunks(bs).enumerate().filter(|(_, p)| p.len() == bs) {
                    // `reference` counts the cases of one run: the update's, as run 0.
                    let part: Vec<Case> = part.iter().cloned().map(|c| Case { run: 0, ..c }).collect();
                    let want = reference(&part, mode, None, 0);
                    let got = sums.get(&(run as u32, update)).copied().unwrap_or(0.0);
                    prop_assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()) + 1e-5, "{mode:?} run {run} update {update}: {got} vs {want}");
                }
            }
        }
    }
}
