//! Materialized micro-batches: the CP layout contract's CP example through real rows, invariants on
//! random samples (every real token exactly once across ranks, micro-batches and CP ranks;
//! unpack ∘ split = identity; padding never in the loss; positions restart per sample;
//! equal counts per rank; encode/decode round trip), and the errors, on both kernels.

use proptest::prelude::*;
use stowplan::{
    Error, Kernel, MaterializeOptions,
    kernel::Padding,
    materialize::{MaterializedBatch, Sample, Temperature},
};

fn kernels() -> Vec<Kernel> {
    vec![Kernel::native(), Kernel::wasm().expect("wasm kernel")]
}

/// Owned sample data; token `j` of sample `i` is `1000·(i+1) + j`.
struct Owned {
    prompt: Vec<i64>,
    completion: Vec<i64>,
    logprobs: Vec<f32>,
    run: u32,
}

fn owned(shape: &[(usize, usize, u32)]) -> Vec<Owned> {
    shape
        .iter()
        .enumerate()
        .map(|(i, &(p, c, run))| {
            let id = |j: usize| (1000 * (i + 1) + j) as i64;
            Owned {
                prompt: (0..p).map(id).collect(),
                completion: (p..p + c).map(id).collect(),
                logprobs: (0..c).map(|j| -(j as f32) / 8.0).collect(),
                run,
            }
        })
        .collect()
}

fn borrow(o: &[Owned]) -> Vec<Sample<'_>> {
    o.iter()
        .enumerate()
        .map(|(i, s)| Sample {
            prompt_ids: &s.prompt,
            completion_ids: &s.completion,
            prompt_mask: None,
            completion_mask: None,
            completion_logprobs: Some(&s.logprobs),
            temperature: Temperature::One(0.5 + i as f32 / 100.0),
            advantage: 1.0 + i as f32,
            run: s.run,
            teacher_logprobs: None,
            extra_cost: 0,
            resources: &[],
        })
        .collect()
}

#[test]
fn seed_001_rows_per_cp_rank() {
    // The CP layout contract: lengths 2, 4, 6, 1 (all completion here), cp 2, tp 1, factor 4.
    let data = owned(&[(0, 2, 0), (0, 4, 0), (0, 6, 0), (0, 1, 0)]);
    let samples = borrow(&data);
    let opts = MaterializeOptions { pad_token_id: -1, ..MaterializeOptions::new(64, 1).with_cp(2, 1).unwrap() };
    for k in kernels() {
        let plan = vec![vec![&[0u32, 1, 2, 3][..]]];
        let ranks = stowplan::materialize::materialize_plan(&k, &samples, &plan, &opts).unwrap();
        let mb = &ranks[0][0];
        assert_eq!(mb.cu_seqlens, [0, 2, 6, 12, 13]);
        assert_eq!(mb.cu_seqlens_padded, [0, 4, 8, 16, 20]);
        // Which sample each token of a CP rank's row belongs to (p = padding).
        let owner =
            |ids: &[i64]| -> Vec<Option<i64>> { ids.iter().map(|&t| (t != -1).then_some(t / 1000 - 1)).collect() };
        let (v0, v1) = (mb.cp_view(0).unwrap(), mb.cp_view(1).unwrap());
        let p = None;
        assert_eq!(owner(&v0.input_ids), [Some(0), p, Some(1), Some(1), Some(2), Some(2), p, p, Some(3), p]);
        assert_eq!(owner(&v1.input_ids), [Some(0), p, Some(1), Some(1), Some(2), Some(2), Some(2), Some(2), p, p]);
        assert_eq!(v0.local_bounds, [0, 2, 4, 8, 10]);
        // Padding is never in the loss.
        for v in [&v0, &v1] {
            for (t, m) in v.input_ids.iter().zip(&v.loss_mask) {
                assert!(!(*t == -1 && *m));
            }
        }
        let runs = mb.cp_runs.as_ref().unwrap();
        assert_eq!(runs.unpack(&[&v0.input_ids, &v1.input_ids]).unwrap(), mb.input_ids);
        assert!(matches!(mb.cp_view(2), Err(Error::InvalidArgument(m)) if m.contains("rank must be in 0..2")));
    }
}

fn check_rows(samples: &[Sample<'_>], mbs: &[&MaterializedBatch], per_sequence: bool) {
    let mut seen = vec![0usize; samples.len()];
    for mb in mbs {
        let n = mb.len();
        assert_eq!(n as i32, *mb.cu_seqlens_padded.last().unwrap());
        for a in [mb.position_ids.len(), mb.loss_mask.len(), mb.advantages.len(), mb.temperatures.len()] {
            assert_eq!(a, n);
        }
        assert_eq!(mb.lora_num_tokens.iter().sum::<i32>() as usize, n);
        assert_eq!(mb.real_tokens + mb.padding_tokens, n as u64);
        for (k, &i) in mb.samples.iter().enumerate() {
            seen[i as usize] += 1;
            let s = &samples[i as usize];
            let start = mb.cu_seqlens_padded[k] as usize;
            let l = s.len();
            assert_eq!((mb.cu_seqlens[k + 1] - mb.cu_seqlens[k]) as usize, l);
            let expect: Vec<i64> = s.prompt_ids.iter().chain(s.completion_ids).copied().collect();
            assert_eq!(&mb.input_ids[start..start + l], &expect[..], "tokens of sample {i}");
            // Positions restart at 0 for every sample.
            assert!(mb.position_ids[start..start + l].iter().enumerate().all(|(j, &p)| p == j as i64));
            assert!(mb.loss_mask[start..start + s.prompt_ids.len()].iter().all(|&m| !m));
            assert!(mb.loss_mask[start + s.prompt_ids.len()..start + l].iter().all(|&m| m));
            if per_sequence {
                let end = mb.cu_seqlens_padded[k + 1] as usize;
                assert!(mb.loss_mask[start + l..end].iter().all(|&m| !m), "padding masked");
                assert!(mb.advantages[start + l..end].iter().all(|&a| a == 0.0));
            }
        }
        // Every padding position is out of the loss: real positions are exactly the samples' tokens.
        let real_in_loss = mb.loss_mask.iter().filter(|&&m| m).count();
        let completion: usize = mb.samples.iter().map(|&i| samples[i as usize].completion_ids.len()).sum();
        assert_eq!(real_in_loss, completion);
        if mb.dummy {
            assert!(mb.samples.is_empty() && mb.advantages.iter().all(|&a| a == 0.0));
        }
    }
    assert!(seen.iter().all(|&c| c == 1), "every sample exactly once: {seen:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn materialized_rows_hold_every_token_once(
        shape in prop::collection::vec((0usize..40, 1usize..60, 0u32..3), 1..40),
        dp in 1u32..6,
        cp in 1u32..4,
        per_sequence in any::<bool>(),
        mix in any::<bool>(),
    ) {
        let data = owned(&shape);
        let samples = borrow(&data);
        let base = MaterializeOptions { mix_runs: mix, ..MaterializeOptions::new(256, dp) };
        let opts = if per_sequence { base.with_cp(cp, 1).unwrap() } else { MaterializeOptions { cp, padding: Padding::PerMicroBatch(u64::from(cp)), ..base } };
        let k = Kernel::native();
        let m = stowplan::materialize(&k, &samples, &opts).unwrap();
        prop_assert_eq!(m.ranks.len(), dp as usize);
        let per_rank = m.ranks[0].len();
        prop_assert!(m.ranks.iter().all(|r| r.len() == per_rank && per_rank >= 1), "equal counts, none starved");
        let all: Vec<&MaterializedBatch> = m.ranks.iter().flatten().collect();
        check_rows(&samples, &all, per_sequence);
        for mb in &all {
            prop_assert!(mb.len() <= 256);
            if !mix {
                prop_assert!(mb.samples.iter().all(|&i| samples[i as usize].run == samples[mb.samples[0] as usize].run));
            }
            // Every real token exactly once across CP ranks; unpack ∘ split = identity.
            if let Some(runs) = &mb.cp_runs {
                let views: Vec<_> = (0..cp as usize).map(|r| mb.cp_view(r).unwrap()).collect();
                let rows: Vec<&[i64]> = views.iter().map(|v| v.input_ids.as_slice()).collect();
                prop_assert_eq!(runs.unpack(&rows).unwrap(), mb.input_ids.clone());
                let mut all_pos: Vec<u64> = views.iter().flat_map(|v| v.positions.clone()).collect();
                all_pos.sort_unstable();
                prop_assert_eq!(all_pos, (0..mb.len() as u64).collect::<Vec<_>>());
                prop_assert!(views.iter().all(|v| v.input_ids.len() == mb.len() / cp as usize));
            }
            // Serialization round trip.
            prop_assert_eq!(&MaterializedBatch::decode(&mb.encode().unwrap()).unwrap(), *mb);
        }
    }
}

#[test]
fn materialize_on_both_kernels_agrees() {
    let data = owned(&[(5, 30, 0), (3, 12, 1), (8, 40, 0), (2, 9, 1), (1, 1, 0)]);
    let samples = borrow(&data);
    let opts = MaterializeOptions::new(64, 2).with_cp(2, 1).unwrap();
    let a = stowplan::materialize(&Kernel::native(), &samples, &opts).unwrap();
    let b = stowplan::materialize(&Kernel::wasm().unwrap(), &samples, &opts).unwrap();
    assert_eq!(a, b);
    assert!(a.padding_overhead() < 0.2);
}

#[test]
fn materialize_errors_name_the_problem() {
    let data = owned(&[(2, 3, 0), (1, 4, 0)]);
    let mut samples = borrow(&data);
    let opts = MaterializeOptions::new(64, 1);
    let k = Kernel::native();
    let inv = |r: Result<stowplan::materialize::Materialized, Error>| match r {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("expected invalid-argument, got {other:?}"),
    };
    let mask = [true];
    samples[1].completion_mask = Some(&mask);
    assert!(
        inv(stowplan::materialize(&k, &samples, &opts))
            .contains("samples[1]: completion_mask has 1 entries but the sample has 4")
    );
    samples[1].completion_mask = None;
    let empty: [i64; 0] = [];
    let mut s2 = samples.clone();
    s2[0].completion_ids = &empty;
    s2[0].completion_logprobs = None;
    assert!(inv(stowplan::materialize(&k, &s2, &opts)).contains("samples[0]: empty completion"));
    assert!(stowplan::materialize(&k, &s2, &MaterializeOptions { allow_empty_completion: true, ..opts }).is_ok());
    let mut s3 = samples.clone();
    s3[0].temperature = Temperature::One(0.0);
    assert!(inv(stowplan::materialize(&k, &s3, &opts)).contains("temperature = 0 must be > 0"));
    let mut s4 = samples.clone();
    s4[1].advantage = f32::NAN;
    assert!(inv(stowplan::materialize(&k, &s4, &opts)).contains("advantage = NaN must be finite"));
    // Non-finite logprobs and negative token ids are refused, naming the sample, field and
    // position (they used to be delivered).
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let logprobs = [0.0, bad, 0.0, 0.0];
        let mut s = samples.clone();
        s[1].completion_logprobs = Some(&logprobs);
        let m = inv(stowplan::materialize(&k, &s, &opts));
        assert!(m.contains("samples[1]: completion_logprobs[1]") && m.contains("must be finite"), "{m}");
        let teacher = [vec![0.0; 5], vec![0.0, 0.0, bad, 0.0, 0.0]];
        let mut s = samples.clone();
        s[0].teacher_logprobs = Some(&teacher[0]);
        s[1].teacher_logprobs = Some(&teacher[1]);
        assert!(inv(stowplan::materialize(&k, &s, &opts)).contains("samples[1]: teacher_logprobs[2]"));
    }
    let mut s = samples.clone();
    s[1].run = 4_000_000_000;
    assert!(
        inv(stowplan::materialize(&k, &s, &opts)).contains("num_runs (the largest run + 1) must be in 1..=1048576")
    );
    let negative = [5, -3, 7];
    let mut s = samples.clone();
    s[0].completion_ids = &negative;
    assert!(inv(stowplan::materialize(&k, &s, &opts)).contains("samples[0]: completion_ids[1] = -3 must be ≥ 0"));
    let mut s5 = samples.clone();
    s5[1].run = 3;
    assert!(
        inv(stowplan::materialize(&k, &s5, &MaterializeOptions { num_runs: Some(2), ..opts }))
            .contains("run = 3 must be below num_runs = 2")
    );
    let teacher = [0.0f32; 5];
    let mut s6 = samples.clone();
    s6[0].teacher_logprobs = Some(&teacher);
    assert!(inv(stowplan::materialize(&k, &s6, &opts)).contains("samples[1]: teacher_logprobs missing"));
    assert!(
        inv(stowplan::materialize(&k, &samples, &MaterializeOptions { cp: 0, ..opts }))
            .contains("cp must be at least 1")
    );
    assert!(
        inv(stowplan::materialize(
            &k,
            &samples,
            &MaterializeOptions { cp: 2, padding: Padding::PerSequence(3), ..opts }
        ))
        .contains("multiple of 2·cp = 4")
    );
    match stowplan::materialize(&k, &samples, &MaterializeOptions::new(4, 1)) {
        Err(Error::Infeasible(m)) => assert!(m.contains("sample 0 has 5 tokens"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A caller's plan: out of range, twice, runs mixed, over capacity.
    let plan = |p: Vec<Vec<&'static [u32]>>| p;
    let e = |p: Vec<Vec<&[u32]>>, o: &MaterializeOptions| {
        stowplan::materialize::materialize_plan(&k, &samples, &p, o).map(|_| ())
    };
    assert!(
        matches!(e(plan(vec![vec![&[0, 7]]]), &opts), Err(Error::InvalidArgument(m)) if m.contains("names sample 7"))
    );
    assert!(
        matches!(e(plan(vec![vec![&[0], &[0]]]), &opts), Err(Error::InvalidArgument(m)) if m.contains("planned twice"))
    );
    assert!(
        matches!(e(plan(vec![vec![&[0, 1]]]), &MaterializeOptions::new(8, 1)), Err(Error::Infeasible(m)) if m.contains("over the capacity 8"))
    );
    // The plan's ranks: as many as dp, with as many micro-batches each (an uneven plan was
    // accepted and reported per_rank from rank 0 alone).
    let two = MaterializeOptions::new(64, 2);
    assert!(
        matches!(e(plan(vec![vec![&[0], &[]], vec![&[1]]]), &two), Err(Error::InvalidArgument(m)) if m.contains("plan[1] has 1 micro-batches but plan[0] has 2"))
    );
    assert!(
        matches!(e(plan(vec![vec![&[0]], vec![&[1]]]), &opts), Err(Error::InvalidArgument(m)) if m.contains("plan has 2 ranks but dp is 1"))
    );
    assert!(e(plan(vec![vec![&[0], &[]], vec![&[1], &[]]]), &two).is_ok(), "dummies even the ranks");
    let mut s7 = samples.clone();
    s7[1].run = 1;
    let mixed = stowplan::materialize::materialize_plan(&k, &s7, &[vec![&[0u32, 1][..]]], &opts).map(|_| ());
    assert!(matches!(mixed, Err(Error::InvalidArgument(m)) if m.contains("mixes runs 0 and 1")));
    // Dummies: 2 samples over 3 ranks: one dummy, zero loss, reported.
    let m = stowplan::materialize(&k, &samples, &MaterializeOptions::new(64, 3)).unwrap();
    assert_eq!(m.distribution.dummies, 1);
    let dummy = m.ranks.iter().flatten().find(|mb| mb.dummy).unwrap();
    assert!(dummy.loss_mask.iter().all(|&x| !x) && dummy.advantages.iter().all(|&a| a == 0.0));
}

#[test]
fn decode_rejects_bad_bytes() {
    let data = owned(&[(2, 3, 0)]);
    let m = stowplan::materialize(&Kernel::native(), &borrow(&data), &MaterializeOptions::new(64, 1)).unwrap();
    let bytes = m.ranks[0][0].encode().unwrap();
    let err = |b: &[u8]| match MaterializedBatch::decode(b) {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(err(b"nope").contains("missing the SPMB header"));
    let mut v2 = bytes.clone();
    v2[4] = 9;
    let reads = format!("format version 9; this build reads {}", stowplan::wire::MICRO_BATCH.version);
    assert!(err(&v2).contains(&reads), "{}", err(&v2));
    // Framed with a CRC-32 (`stowplan::wire`): truncation, an extra byte and any flipped bit
    // are refused as damage before the body is read.
    assert!(err(&bytes[..bytes.len() - 3]).contains("damaged micro-batch"));
    let mut extra = bytes.clone();
    extra.push(0);
    assert!(err(&extra).contains("damaged micro-batch"));
    for bit in (0..bytes.len() * 8).step_by(7) {
        let mut flipped = bytes.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(MaterializedBatch::decode(&flipped).is_err(), "bit {bit} accepted");
    }
}

/// The micro-batch format's bytes are pinned: a change in the struct's layout (a field moved,
/// a nesting that is not plain concatenation) that would make stored or sent micro-batches
/// unreadable fails here, not in a trainer. Two samples with teacher logprobs, one rank, a CP
/// split of 2 (per-sequence padding), so every optional part is present.
#[test]
fn the_micro_batch_bytes_are_pinned() {
    let data = owned(&[(2, 3, 0), (1, 2, 0)]);
    let teacher: Vec<Vec<f32>> = data.iter().map(|o| vec![-0.5; o.prompt.len() + o.completion.len()]).collect();
    let mut samples = borrow(&data);
    for (s, t) in samples.iter_mut().zip(&teacher) {
        s.teacher_logprobs = Some(t);
    }
    let o = MaterializeOptions::new(64, 1).with_cp(2, 1).unwrap();
    let m = stowplan::materialize(&Kernel::native(), &samples, &o).unwrap();
    let mb = &m.ranks[0][0];
    assert!(mb.cp_runs.is_some() && mb.teacher_logprobs.is_some(), "the pin covers the optional parts");
    let hex: String = mb.encode().unwrap().iter().map(|b| format!("{b:02x}")).collect();
    let pinned = concat!(
        "53504d4203000200010cd00fd20fd40fd60fd80f020202a01fa21fa41f020c00020406080a0c0e000204060c00000101",
        "01000000000101000c0000000000000000cdcc4c3ecdcc4c3ecdcc4c3e00000000000000000000000000000000cdcc4c",
        "3ecdcc4c3e000000000c0000803f0000803f0000803f0000803f0000803f000000000000000000000000000000400000",
        "004000000040000000000c000000000000000000000080000000be000080be0000000000000000000000000000000000",
        "000080000000be000000000c0000003f0000003f0000003f0000003f0000003f0000803f0000803f0000803f5c8f023f",
        "5c8f023f5c8f023f0000803f010c000000bf000000bf000000bf000000bf000000bf0000000000000000000000000000",
        "00bf000000bf000000bf0000000003000a10030010181001180804000102030003050500060b02090502030104020300",
        "080c6b76b6e0"
    );
    assert_eq!(hex, pinned);
}
