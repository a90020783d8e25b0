//! Alignment, the context-parallel zigzag split and the distribution to ranks: the CP layout contract's
//! example exactly, invariants on random inputs, and the errors.

use proptest::prelude::*;
use stowplan_kernel::{
    AlignOptions, Cost, CpLayout, DistributeOptions, Error, Factor, Padding, cp_layout, distribute, pad_factor,
};

/// The packed row CP rank `r` receives, with `None` for padding: what the CP layout contract prints.
fn rank_row(l: &CpLayout, lengths: &[u64], r: usize) -> Vec<Option<usize>> {
    let mut row = Vec::new();
    for (start, len) in l.runs(r) {
        for p in start..start + len {
            let i = l.cu_seqlens_padded.partition_point(|&b| b <= p) - 1;
            let within = p - l.cu_seqlens_padded[i];
            row.push((within < lengths[i]).then_some(i));
        }
    }
    row
}

#[test]
fn seed_001_example() {
    let lengths = [2, 4, 6, 1];
    let l = cp_layout(&lengths, &AlignOptions::new(2, 1)).unwrap();
    assert_eq!(l.factor, 4);
    assert_eq!(l.cu_seqlens, [0, 2, 6, 12, 13]);
    assert_eq!(l.cu_seqlens_padded, [0, 4, 8, 16, 20]);
    let p = None;
    // CP0: [0, p, 1, 1, 2, 2, p, p, 3, p]; CP1: [0, p, 1, 1, 2, 2, 2, 2, p, p].
    assert_eq!(rank_row(&l, &lengths, 0), [Some(0), p, Some(1), Some(1), Some(2), Some(2), p, p, Some(3), p]);
    assert_eq!(rank_row(&l, &lengths, 1), [Some(0), p, Some(1), Some(1), Some(2), Some(2), Some(2), Some(2), p, p]);
    // Local boundaries: cu_seqlens_padded // cp.
    assert_eq!(l.local_bounds, [0, 2, 4, 8, 10]);
    assert_eq!(l.rank_real_tokens, [6, 7]);
    assert_eq!((l.max_seqlen, l.max_seqlen_padded), (6, 8));
    // ROLL's own factor for the same input: every sequence pads to 16.
    let roll = cp_layout(&lengths, &AlignOptions { factor: Factor::Roll, ..AlignOptions::new(2, 1) }).unwrap();
    assert_eq!(roll.cu_seqlens_padded, [0, 16, 32, 48, 64]);
}

#[test]
fn pad_factors() {
    let f = |cp, tp, factor| pad_factor(&AlignOptions { cp, tp, factor, power_of_two: false });
    assert_eq!(f(2, 1, Factor::CpTp), Ok(4));
    assert_eq!(f(1, 3, Factor::CpTp), Ok(3));
    assert_eq!(f(4, 2, Factor::CpTp), Ok(16));
    // ROLL (vectors pf_cp1_tp3, pf_cp3_tp1): lcm(16, tp) and lcm(16, 2·cp·tp).
    assert_eq!(f(1, 3, Factor::Roll), Ok(48));
    assert_eq!(f(3, 1, Factor::Roll), Ok(48));
    assert_eq!(f(2, 2, Factor::Roll), Ok(16));
    assert_eq!(f(2, 1, Factor::Multiple(8)), Ok(8));
    let err = |r: Result<u64, Error>| match r {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("expected invalid-argument, got {other:?}"),
    };
    assert!(err(f(0, 1, Factor::CpTp)).contains("cp must be at least 1"));
    assert!(err(f(1, 0, Factor::CpTp)).contains("tp must be at least 1"));
    // Bounded (found by the `kernel` fuzz target: cp = 4211081216 asked cp_layout for 33 GB).
    assert!(err(f(65_537, 1, Factor::CpTp)).contains("cp must be in 1..=65536 (got 65537)"));
    assert!(err(f(1, u32::MAX, Factor::CpTp)).contains("tp must be in 1..=65536"));
    let big = stowplan_kernel::cp_layout(
        &[],
        &AlignOptions { cp: 4_211_081_216, tp: 59_968, factor: Factor::CpTp, power_of_two: false },
    );
    assert!(matches!(big, Err(Error::InvalidArgument(_))));
    assert!(err(f(2, 1, Factor::Multiple(3))).contains("multiple of 2·cp = 4"));
    assert!(err(f(1, 2, Factor::Multiple(3))).contains("multiple of tp = 2"));
    assert!(err(f(1, 1, Factor::Multiple(0))).contains("at least 1"));
    let p2 = pad_factor(&AlignOptions { cp: 3, tp: 1, factor: Factor::CpTp, power_of_two: true });
    assert!(err(p2).contains("cp must be a power of two (got 3)"));
}

proptest! {
    /// Every position of the padded row goes to exactly one CP rank, every rank gets the same
    /// number of positions, a rank's local sequence i spans local_bounds[i]..local_bounds[i+1]
    /// of its row, and the real-token counts add up.
    #[test]
    fn zigzag_covers_every_position_once(
        lengths in prop::collection::vec(0u64..200, 0..20),
        cp in 1u32..5,
        tp in 1u32..4,
    ) {
        let l = cp_layout(&lengths, &AlignOptions::new(cp, tp)).unwrap();
        let total = l.padded_tokens() as usize;
        let mut owner = vec![usize::MAX; total];
        for r in 0..cp as usize {
            let mut local = 0u64;
            for (start, len) in l.runs(r) {
                for p in start..start + len {
                    prop_assert_eq!(owner[p as usize], usize::MAX, "position {} twice", p);
                    owner[p as usize] = r;
                    // Which sequence p is in, and that its local position lies in that sequence's local span.
                    let i = l.cu_seqlens_padded.partition_point(|&b| b <= p) - 1;
                    prop_assert!(l.local_bounds[i] <= local && local < l.local_bounds[i + 1]);
                    local += 1;
                }
            }
            prop_assert_eq!(local, total as u64 / u64::from(cp));
        }
        prop_assert!(owner.iter().all(|&o| o != usize::MAX));
        prop_assert_eq!(l.rank_real_tokens.iter().sum::<u64>(), lengths.iter().sum::<u64>());
        for (i, w) in l.cu_seqlens_padded.windows(2).enumerate() {
            prop_assert_eq!((w[1] - w[0]) % l.factor, 0);
            prop_assert!(w[1] - w[0] >= lengths[i] && w[1] - w[0] < lengths[i] + l.factor);
        }
    }

    /// Every sample in exactly one micro-batch, every rank the same count, no micro-batch over
    /// the capacity or mixing runs, dummies only when there are fewer samples than slots.
    #[test]
    fn distribution_invariants(
        lengths in prop::collection::vec(1u64..300, 1..60),
        dp in 1u32..9,
        // At least 320: every length (< 300) padded to a multiple of m (< 9) must fit in the
        // usable capacity floor(cap / m) · m (with 300 a length of 298 and m = 8 did not).
        cap in 320u64..1000,
        m in 1u64..9,
        per_sequence in any::<bool>(),
        nruns in 1u32..4,
        mix in any::<bool>(),
    ) {
        let runs: Vec<u32> = (0..lengths.len() as u32).map(|i| (i * 7 + 3) % nruns).collect();
        let padding = if per_sequence { Padding::PerSequence(m) } else { Padding::PerMicroBatch(m) };
        let o = DistributeOptions { cost: Cost::ATTENTION, padding, runs: Some(&runs), mix_runs: mix, ..DistributeOptions::new(cap, dp) };
        let d = distribute(&lengths, &o).unwrap();
        prop_assert_eq!(d.dp(), dp as usize);
        prop_assert_eq!(d.tokens.len(), (dp * d.per_rank) as usize);
        prop_assert!(d.per_rank >= 1);
        let mut seen = vec![false; lengths.len()];
        let mut empty = 0;
        for b in 0..d.tokens.len() {
            let members = d.batch(b);
            prop_assert!(d.tokens[b] <= cap, "micro-batch {} has {} tokens over {}", b, d.tokens[b], cap);
            prop_assert_eq!(d.tokens[b] % m, 0);
            if members.is_empty() { empty += 1; continue; }
            let real: u64 = members.iter().map(|&i| lengths[i as usize]).sum();
            prop_assert_eq!(d.real_tokens[b], real);
            prop_assert!(d.tokens[b] >= real);
            prop_assert!(members.windows(2).all(|w| (runs[w[0] as usize], w[0]) < (runs[w[1] as usize], w[1])));
            if !mix {
                prop_assert!(members.iter().all(|&i| runs[i as usize] == runs[members[0] as usize]));
            }
            for &i in members {
                prop_assert!(!seen[i as usize]);
                seen[i as usize] = true;
            }
        }
        prop_assert!(seen.iter().all(|&s| s));
        prop_assert_eq!(empty, d.dummies);
        if d.dummies > 0 {
            // Only when every real micro-batch holds one sample.
            prop_assert!((0..d.tokens.len()).all(|b| d.batch(b).len() <= 1));
        }
        prop_assert_eq!(d.packed + d.splits + d.dummies, dp * d.per_rank);
        prop_assert!(d.packed >= d.lower_bound);
        let rank_sum = |r: usize| d.costs[r * d.per_rank as usize..(r + 1) * d.per_rank as usize].iter().sum::<u64>();
        for r in 0..dp as usize {
            prop_assert_eq!(rank_sum(r), d.rank_costs[r]);
        }
        prop_assert!(d.rank_costs.windows(2).all(|w| w[0] >= w[1]), "costliest rank first");
        // Deterministic.
        prop_assert_eq!(distribute(&lengths, &o).unwrap(), d);
    }
}

#[test]
fn distribution_splits_before_dummies() {
    // Two bins of capacity 100 for 4 ranks: two splits make 4 micro-batches, no dummy.
    let lengths = [50, 50, 40, 40];
    let d = distribute(&lengths, &DistributeOptions::new(100, 4)).unwrap();
    assert_eq!((d.packed, d.splits, d.dummies, d.per_rank), (2, 2, 0, 1));
    // Three samples for 4 ranks: one dummy, reported, costing one padding multiple.
    let d = distribute(&[10, 20, 30], &DistributeOptions::new(100, 4)).unwrap();
    assert_eq!((d.dummies, d.per_rank), (1, 1));
    assert_eq!(d.batch(3), &[] as &[u32]);
    assert_eq!(d.tokens[3], 1);
}

#[test]
fn distribution_errors() {
    let inv = |r: Result<_, Error>| match r {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("expected invalid-argument, got {other:?}"),
    };
    let o = DistributeOptions::new(100, 2);
    assert!(inv(distribute(&[], &o)).contains("lengths must not be empty"));
    assert!(inv(distribute(&[5, 0], &o)).contains("lengths[1] = 0"));
    assert!(inv(distribute(&[5], &DistributeOptions { dp: 0, ..o })).contains("dp must be at least 1"));
    assert!(inv(distribute(&[5], &DistributeOptions { capacity: 0, ..o })).contains("capacity must be at least 1"));
    let runs = [0u32];
    assert!(inv(distribute(&[5, 6], &DistributeOptions { runs: Some(&runs), ..o })).contains("runs has 1 entries"));
    let small = DistributeOptions { capacity: 3, padding: Padding::PerMicroBatch(4), ..o };
    assert!(inv(distribute(&[1], &small)).contains("smaller than the padding multiple 4"));
    match distribute(&[50, 101], &o) {
        Err(Error::Infeasible(m)) => assert!(m.contains("sample 1 has 101 tokens"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Padding can push a sample over: 99 pads to 100 (fits), 101 would not; 98 pads to 104 with 8.
    let o8 = DistributeOptions { padding: Padding::PerSequence(8), ..o };
    match distribute(&[98], &o8) {
        Err(Error::Infeasible(m)) => assert!(m.contains("padded to a multiple of 8"), "{m}"),
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Under limits: every micro-batch within the capacity and every cap, every sample once,
    /// runs apart, the same count on every rank, and a lower bound no resource beats.
    #[test]
    fn limited_distribution_keeps_every_limit(
        rows in prop::collection::vec((1u64..300, 0u64..500, 0u64..4), 1..60),
        dp in 1u32..6,
        cap in 320u64..1000,
        image_cap in 500u64..1200,
        images_cap in 3u64..9,
        m in 1u64..5,
        nruns in 1u32..3,
    ) {
        use stowplan_kernel::MicroLimits;
        let lengths: Vec<u64> = rows.iter().map(|r| r.0).collect();
        let sizes: Vec<u64> = rows.iter().flat_map(|r| [r.1, r.2]).collect();
        let runs: Vec<u32> = (0..lengths.len() as u32).map(|i| (i * 5 + 1) % nruns).collect();
        let caps = [image_cap, images_cap];
        let names = ["image_tokens".to_string(), "images".to_string()];
        let limits = MicroLimits { sizes: &sizes, caps: &caps, names: &names };
        let o = DistributeOptions {
            cost: Cost::ATTENTION,
            padding: Padding::PerSequence(m),
            runs: Some(&runs),
            limits: Some(limits),
            ..DistributeOptions::new(cap, dp)
        };
        let d = distribute(&lengths, &o).unwrap();
        prop_assert_eq!(d.tokens.len(), (dp * d.per_rank) as usize);
        let mut seen = vec![false; lengths.len()];
        for b in 0..d.tokens.len() {
            let members = d.batch(b);
            prop_assert!(d.tokens[b] <= cap);
            for q in 0..2 {
                let load: u64 = members.iter().map(|&i| sizes[i as usize * 2 + q]).sum();
                prop_assert!(load <= caps[q], "micro-batch {} holds {} of resource {} over {}", b, load, q, caps[q]);
            }
            prop_assert!(members.iter().all(|&i| runs[i as usize] == runs[members[0] as usize]));
            for &i in members {
                prop_assert!(!seen[i as usize]);
                seen[i as usize] = true;
            }
        }
        prop_assert!(seen.iter().all(|&s| s));
        prop_assert!(d.packed >= d.lower_bound);
        for q in 0..2 {
            let total: u64 = sizes.iter().skip(q).step_by(2).sum();
            prop_assert!(u64::from(d.lower_bound) >= total.div_ceil(caps[q]));
        }
        prop_assert_eq!(distribute(&lengths, &o).unwrap(), d);
    }
}

#[test]
fn limited_distribution_errors_name_the_sample_and_the_limit() {
    use stowplan_kernel::MicroLimits;
    let names = ["images".to_string()];
    let sizes = [1, 9, 2];
    let with = |sizes: &'static [u64], caps: &'static [u64]| DistributeOptions {
        limits: Some(MicroLimits { sizes, caps, names: &[] }),
        ..DistributeOptions::new(100, 2)
    };
    let o = DistributeOptions {
        limits: Some(MicroLimits { sizes: &sizes, caps: &[4], names: &names }),
        ..DistributeOptions::new(100, 2)
    };
    match distribute(&[10, 20, 30], &o) {
        Err(Error::Infeasible(m)) => assert!(m.contains("sample 1 has 9 images, more than its cap 4"), "{m}"),
        other => panic!("{other:?}"),
    }
    for (o, message) in [
        (with(&[1, 2], &[4]), "limit sizes must have 1 entries per sequence"),
        (with(&[1, 2, 3], &[0]), "must be at least 1"),
        (with(&[], &[]), "limits must have 1 to 7 caps"),
    ] {
        match distribute(&[10, 20, 30], &o) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(message), "{m}"),
            other => panic!("{message}: {other:?}"),
        }
    }
}
