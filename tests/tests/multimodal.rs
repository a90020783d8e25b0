//! Multimodal samples: a per-sample extra cost that balancing over ranks
//! and micro-batches counts and capacities do not, on both backends; zero extra costs change
//! nothing; `multimodal_alone` gives every multimodal sample a micro-batch of its own; the
//! packer runtime (`serve --limit`) keeps every micro-batch within every limit.

use std::sync::Arc;

use proptest::prelude::*;
use stowplan::{
    Error, Kernel, MaterializeOptions,
    kernel::{Cost, DistributeOptions, DpOptions, MicroOptions},
};
use stowplan_conformance::plain_sample;

// The kernel tests' batches (tokens, image tokens, images, extra cost).
#[path = "../../kernel/tests/support/vlm.rs"]
mod vlm;
use vlm::{VlmBatch, vlm_batch};

fn kernels() -> [Kernel; 2] {
    [Kernel::native(), Kernel::wasm().expect("wasm kernel")]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Zero extra costs give exactly the plans without them; with extra costs every reported
    /// cost includes them, both backends agree, and the caps still count tokens.
    #[test]
    fn extra_costs_are_balanced_not_capped(
        lengths in proptest::collection::vec(1u64..400, 8..80),
        extra_seed in proptest::collection::vec(0u64..2000, 80),
        dp in 1u32..4,
    ) {
        let n = lengths.len();
        let n = n - n % dp as usize;
        let lengths = &lengths[..n];
        let zeros = vec![0u64; n];
        let extra: Vec<u64> = extra_seed[..n].iter().map(|&e| if e % 3 == 0 { e } else { 0 }).collect();
        let cap = 800;
        let micro = MicroOptions { cost: Cost::ATTENTION, ..MicroOptions::new(cap) };
        let dp_plain = DpOptions { cost: Cost::ATTENTION, ..DpOptions::default() };
        let [native, wasm] = kernels();
        for k in [&native, &wasm] {
            prop_assert_eq!(
                k.plan(lengths, dp, &DpOptions { extra_costs: Some(&zeros), ..dp_plain }, &micro, None).unwrap(),
                k.plan(lengths, dp, &dp_plain, &micro, None).unwrap()
            );
            prop_assert_eq!(k.micro_batches(lengths, Some(&zeros), None, &micro).map(|p| p.plan).unwrap(), k.micro_batches(lengths, None, None, &micro).map(|p| p.plan).unwrap());
            let d = DistributeOptions { cost: Cost::ATTENTION, ..DistributeOptions::new(cap, dp) };
            prop_assert_eq!(k.distribute(lengths, &DistributeOptions { extra_costs: Some(&zeros), ..d }).unwrap(), k.distribute(lengths, &d).unwrap());
        }
        let with = DpOptions { extra_costs: Some(&extra), ..dp_plain };
        let p = native.plan(lengths, dp, &with, &micro, None).unwrap();
        prop_assert_eq!(&p, &wasm.plan(lengths, dp, &with, &micro, None).unwrap());
        let cost = |i: usize| Cost::ATTENTION.of(lengths[i]).unwrap() + extra[i];
        for r in 0..dp as usize {
            let rank_cost: u64 = p.dp.rank(r).iter().map(|&i| cost(i as usize)).sum();
            prop_assert_eq!(rank_cost, p.dp.costs[r], "rank costs include the extra");
            let m = &p.ranks[r];
            for b in 0..m.count() {
                let tokens: u64 = m.batch(b).iter().map(|&i| lengths[i as usize]).sum();
                prop_assert!(tokens <= cap, "the cap counts tokens only");
                let c: u64 = m.batch(b).iter().map(|&i| cost(i as usize)).sum();
                prop_assert_eq!(c, m.costs[b], "micro-batch costs include the extra");
            }
        }
        let d = DistributeOptions { cost: Cost::ATTENTION, extra_costs: Some(&extra), ..DistributeOptions::new(cap, dp) };
        prop_assert_eq!(native.distribute(lengths, &d).unwrap(), wasm.distribute(lengths, &d).unwrap());
    }
}

#[test]
fn a_heavy_image_sample_moves_the_balance() {
    // Four equal texts over 2 ranks: 2 + 2. With a big image cost on sample 0, its rank gets
    // it and one cheap sample only when counts are free.
    let lengths = [100u64, 100, 100, 100, 100, 100];
    let extra = [10_000u64, 0, 0, 0, 0, 0];
    for k in kernels() {
        let o = DpOptions { extra_costs: Some(&extra), equal_count: false, ..DpOptions::default() };
        let p = k.balance_dp(&lengths, 2, &o).unwrap();
        let with_image = (0..2).find(|&r| p.rank(r).contains(&0)).unwrap();
        assert_eq!(p.rank(with_image), &[0], "the image sample is alone: {p:?}");
        assert_eq!(p.costs[with_image], 10_100);
        let e = k.balance_dp(&lengths, 2, &DpOptions { extra_costs: Some(&extra[..3]), ..DpOptions::default() });
        match e {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("extra_costs has 3 entries; lengths has 6"), "{m}"),
            other => panic!("{other:?}"),
        }
        let e = k.micro_batches(&[1, 2], Some(&[u64::MAX, 0]), None, &MicroOptions::new(10)).map(|p| p.plan);
        assert!(e.unwrap_err().to_string().contains("extra_costs[0]"), "names the sample");
        // Each cost fits, their sum does not: refused, never a wrapped micro-batch cost.
        let half = 1u64 << 63;
        for e in [
            k.micro_batches(&[1, 1], Some(&[half, half]), None, &MicroOptions::new(10)).map(|p| p.plan).unwrap_err(),
            k.balance_dp(&[1, 1], 1, &DpOptions { extra_costs: Some(&[half, half]), ..DpOptions::default() })
                .unwrap_err(),
        ] {
            assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("the sum of costs overflows u64")), "{e:?}");
        }
    }
}

#[test]
fn multimodal_samples_get_micro_batches_of_their_own() {
    let ids: Vec<i64> = (0..64).collect();
    let sample = |n: usize, extra_cost: u64| plain_sample(&ids[..1], &ids[1..n], extra_cost);
    let samples = [sample(4, 0), sample(5, 300), sample(3, 0), sample(6, 0), sample(4, 500), sample(2, 0)];
    for k in kernels() {
        let o = MaterializeOptions { multimodal_alone: true, ..MaterializeOptions::new(64, 1) };
        let m = stowplan::materialize(&k, &samples, &o).unwrap();
        let rows: Vec<&Vec<u32>> = m.ranks.iter().flatten().map(|mb| &mb.samples).collect();
        for mm in [1u32, 4] {
            let row = rows.iter().find(|r| r.contains(&mm)).unwrap();
            assert_eq!(row.as_slice(), &[mm], "multimodal sample {mm} alone: {rows:?}");
        }
        assert!(rows.iter().any(|r| r.len() > 1), "text samples still share: {rows:?}");
        let bad = MaterializeOptions { mix_runs: true, ..o };
        let e = stowplan::materialize(&k, &samples, &bad).unwrap_err().to_string();
        assert!(e.contains("multimodal_alone needs mix_runs false"), "{e}");
        // Without the option they may share; their extra cost is balanced over the ranks.
        let m = stowplan::materialize(&k, &samples, &MaterializeOptions::new(64, 2)).unwrap();
        let costs = &m.distribution.rank_costs;
        assert!(costs.iter().all(|&c| c >= 300), "each rank carries one image: {costs:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Micro-batches under further limits: WASM ≡ native, every micro-batch
    /// within every cap, and errors the same on both backends.
    #[test]
    fn limited_micro_batches_agree_on_both_backends(
        batch in vlm_batch(1..60, (500, 400, 5, 100)),
        image_cap in 300u64..1000,
        images_cap in 3u64..12,
    ) {
        use stowplan::kernel::MicroLimits;
        let VlmBatch { lengths, sizes, extra } = &batch;
        let caps = [image_cap, images_cap];
        let names = ["image_tokens".to_string(), "images".to_string()];
        let limits = MicroLimits { sizes: &sizes, caps: &caps, names: &names };
        let o = MicroOptions { cost: Cost::ATTENTION, ..MicroOptions::new(1000) };
        let [native, wasm] = kernels();
        let a = native.micro_batches(&lengths, Some(&extra), Some(&limits), &o);
        let b = wasm.micro_batches(&lengths, Some(&extra), Some(&limits), &o);
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
        if let Ok(p) = a {
            for m in 0..p.plan.count() {
                for k in 0..2 {
                    prop_assert!(p.loads[m * 2 + k] <= caps[k]);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Both levels under limits: WASM ≡ native, extra costs included.
    #[test]
    fn limited_plans_agree_on_both_backends(
        batch in vlm_batch(8..80, (500, 400, 5, 100)),
        dp in 1u32..4,
    ) {
        use stowplan::kernel::MicroLimits;
        let VlmBatch { lengths, sizes, extra } = &batch;
        let limits = MicroLimits { sizes: &sizes, caps: &[800, 6], names: &[] };
        let d = DpOptions { cost: Cost::ATTENTION, extra_costs: Some(&extra), ..DpOptions::default() };
        let o = MicroOptions { cost: Cost::ATTENTION, ..MicroOptions::new(1000) };
        let [native, wasm] = kernels();
        let a = native.plan(&lengths, dp, &d, &o, Some(&limits));
        let b = wasm.plan(&lengths, dp, &d, &o, Some(&limits));
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}

/// The streaming packer under limits on vlm-mix-100k's first 20,000 rows: both backends give
/// the same bins call for call, a state saved on one continues on the other, and every bin
/// keeps every limit.
#[test]
fn limited_streams_agree_on_both_backends_and_states_cross_them() {
    let rows = stowplan_conformance::workload_table("vlm-mix-100k.tsv", &["image_tokens", "images"]);
    let rows = &rows[..3 * 20_000];
    let options = stowplan::kernel::StreamOptions {
        oversize: stowplan::kernel::OversizePolicy::Drop,
        ..stowplan::kernel::StreamOptions::new(16_384)
    };
    let limits = stowplan::kernel::StreamLimits {
        caps: vec![8_192, 32],
        names: vec!["image_tokens".into(), "images".into()],
        max_segments: 64,
    };
    let [native, wasm] = kernels();
    let mut a = native.limited_stream_packer(&options, &limits).unwrap();
    let mut b = wasm.limited_stream_packer(&options, &limits).unwrap();
    let mut bins = 0;
    for (k, chunk) in rows.chunks(3 * 1_500).enumerate() {
        let (x, y) = (a.add(chunk).unwrap(), b.add(chunk).unwrap());
        assert_eq!(x, y, "chunk {k}");
        for (q, members) in (0..x.closed.bins()).map(|q| (q, x.closed.bin(q))) {
            assert!(members.len() <= 64 && x.closed.loads[q] <= 16_384);
            assert!(x.resource_loads[2 * q] <= 8_192 && x.resource_loads[2 * q + 1] <= 32);
        }
        bins += x.closed.bins();
        if k == 5 {
            // Swap the states: native continues the WASM packer's stream and back.
            let (sa, sb) = (a.state().unwrap(), b.state().unwrap());
            assert_eq!(sa, sb, "the same state bytes on both backends");
            a = native.limited_stream_packer_from_state(&sb).unwrap();
            b = wasm.limited_stream_packer_from_state(&sa).unwrap();
            assert_eq!(b.limits(), &limits);
        }
    }
    let (x, y) = (a.finish().unwrap(), b.finish().unwrap());
    assert_eq!(x, y);
    bins += x.closed.bins();
    assert!(bins > 1_000, "{bins} bins");
    let e = wasm
        .limited_stream_packer(&options, &stowplan::kernel::StreamLimits { caps: vec![0, 32], ..limits.clone() })
        .unwrap_err();
    assert!(e.to_string().contains("the cap of image_tokens must be at least 1"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Rows for every rank under limits (`layout.distribute` with limits): WASM ≡ native, extra costs
    /// included or not.
    #[test]
    fn limited_distributions_agree_on_both_backends(
        batch in vlm_batch(1..80, (500, 400, 5, 100)),
        dp in 1u32..5,
        with_extra in any::<bool>(),
    ) {
        use stowplan::kernel::MicroLimits;
        let VlmBatch { lengths, sizes, extra } = &batch;
        let o = DistributeOptions {
            cost: Cost::ATTENTION,
            extra_costs: with_extra.then_some(&extra[..]),
            limits: Some(MicroLimits { sizes: &sizes, caps: &[800, 6], names: &[] }),
            ..DistributeOptions::new(1000, dp)
        };
        let [native, wasm] = kernels();
        let (a, b) = (native.distribute(&lengths, &o), wasm.distribute(&lengths, &o));
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }
}

/// `materialize_limited` on vlm-mix-100k's first 3,000 rows for 4 ranks: every row within
/// 16,384 tokens, 8,192 image tokens and 32 images, every sample once, the same rows on both
/// backends; `resources` of the wrong size is refused naming the sample.
#[test]
fn materialize_limited_keeps_every_row_within_every_limit() {
    let table = stowplan_conformance::workload_table("vlm-mix-100k.tsv", &["image_tokens", "images"]);
    let rows: Vec<&[u64]> = table.chunks(3).take(3_000).filter(|r| r[0] <= 16_384).collect();
    let ids = vec![7i64; 16_384];
    let resources: Vec<[u64; 2]> = rows.iter().map(|r| [r[1], r[2]]).collect();
    let samples: Vec<stowplan::materialize::Sample<'_>> = rows
        .iter()
        .zip(&resources)
        .map(|(r, res)| stowplan::materialize::Sample {
            resources: res,
            ..plain_sample(&ids[..1], &ids[1..r[0] as usize], r[1])
        })
        .collect();
    let limits = stowplan::materialize::SampleLimits {
        caps: vec![8_192, 32],
        names: vec!["image_tokens".into(), "images".into()],
        ..Default::default()
    };
    let o = MaterializeOptions { cost: Cost::ATTENTION, ..MaterializeOptions::new(16_384, 4) };
    let [native, wasm] = kernels();
    let m = stowplan::materialize::materialize_limited(&native, &samples, &o, &limits).unwrap();
    let w = stowplan::materialize::materialize_limited(&wasm, &samples, &o, &limits).unwrap();
    assert_eq!(m.distribution, w.distribution);
    let mut seen = vec![false; samples.len()];
    for mb in m.ranks.iter().flatten() {
        assert!(mb.len() <= 16_384);
        for q in 0..2 {
            let load: u64 = mb.samples.iter().map(|&i| resources[i as usize][q]).sum();
            assert!(load <= limits.caps[q], "a row holds {load} {} over {}", limits.names[q], limits.caps[q]);
        }
        for &i in &mb.samples {
            assert!(!std::mem::replace(&mut seen[i as usize], true), "sample {i} twice");
        }
    }
    assert!(seen.iter().all(|&s| s), "every sample placed");
    // Token-only packing breaks the limits on this data; the limited rows do not.
    let text: Vec<stowplan::materialize::Sample<'_>> =
        samples.iter().map(|s| stowplan::materialize::Sample { resources: &[], ..*s }).collect();
    let e = stowplan::materialize(&native, &samples, &o).unwrap_err().to_string();
    assert!(e.contains("samples[0].resources has 2 sizes but there are no limits"), "{e}");
    let plain = stowplan::materialize(&native, &text, &o).unwrap();
    // A caller's plan is built as given: resources there would go unchecked, so are refused.
    let p: Vec<Vec<&[u32]>> = plain.ranks.iter().map(|r| r.iter().map(|mb| &mb.samples[..]).collect()).collect();
    let e = stowplan::materialize::materialize_plan(&native, &samples, &p, &o).unwrap_err().to_string();
    assert!(e.contains("samples[0].resources has 2 sizes but there are no limits"), "{e}");
    assert!(stowplan::materialize::materialize_plan(&native, &text, &p, &o).is_ok());
    let over = plain
        .ranks
        .iter()
        .flatten()
        .filter(|mb| mb.samples.iter().map(|&i| resources[i as usize][1]).sum::<u64>() > 32)
        .count();
    assert!(over > 0, "the unlimited rows break the image limit somewhere");
    // Errors: resources of the wrong size; a sample over a limit.
    let one = [5u64];
    let mut bad = samples.clone();
    bad[7].resources = &one;
    let e = stowplan::materialize::materialize_limited(&native, &bad, &o, &limits).unwrap_err().to_string();
    assert!(e.contains("samples[7].resources has 1 sizes; the limits are 2 (image_tokens, images)"), "{e}");
    let many = [0u64, 40];
    let mut bad = samples.clone();
    bad[3].resources = &many;
    match stowplan::materialize::materialize_limited(&wasm, &bad, &o, &limits) {
        Err(Error::Infeasible(m)) => {
            assert!(m.contains("sample 3 has 40 images, more than its cap 32; samples are never split"), "{m}")
        }
        other => panic!("{other:?}"),
    }
}

/// The packer runtime under limits (`serve --limit`): a text or image rollout sample.
fn rollout(index: u32, len: usize, resources: &[(&str, u64)]) -> stowplan::TrainingSample {
    stowplan::TrainingSample {
        prompt_ids: vec![7; 1],
        completion_ids: (0..len as i64 - 1).map(|t| i64::from(index) * 1000 + t).collect(),
        advantage: 0.5,
        extra_cost: resources.iter().find(|(n, _)| *n == "image_tokens").map_or(0, |r| r.1),
        resources: resources.iter().map(|&(n, s)| (n.to_string(), s)).collect(),
        ..Default::default()
    }
}

fn limited_packer(dp: u32, limits: &[(&str, u64)]) -> Result<stowplan::Packer, Error> {
    let options = stowplan::PackerOptions {
        limits: stowplan::materialize::SampleLimits {
            caps: limits.iter().map(|l| l.1).collect(),
            names: limits.iter().map(|l| l.0.to_string()).collect(),
            ..Default::default()
        },
        ..stowplan::PackerOptions::new(256, dp)
    };
    let mut p = stowplan::Packer::new(Kernel::native(), options)?;
    p.add_run(0, stowplan::packer::RunConfig { batch_size: 1 })?;
    Ok(p)
}

/// Every micro-batch's load in each of `names` (micro-batches of every rank, in order).
fn micro_loads(
    step: &stowplan::packer::PackedStep,
    batch: &stowplan::TrainingBatch,
    names: &[String],
) -> Vec<Vec<u64>> {
    let mut loads = Vec::new();
    for r in &step.ranks {
        for mb in &r.micro_batches {
            let mut load = vec![0; names.len()];
            for &i in &mb.samples {
                let sizes = batch.samples[r.keys[i as usize].index as usize].resource_sizes(names).unwrap();
                for (l, s) in load.iter_mut().zip(sizes) {
                    *l += s;
                }
            }
            loads.push(load);
        }
    }
    loads
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Through the wire format and the packer: every micro-batch of every rank stays within
    /// every limit, every sample within its caps is delivered once, the others are rejected
    /// with the limit named, and a checkpoint restores the same step.
    #[test]
    fn the_packer_keeps_every_micro_batch_within_every_limit(
        rows in proptest::collection::vec((2usize..200, 0u64..700, 0u64..7), 4..60),
        dp in 1u32..4,
    ) {
        let limits = [("image_tokens", 600), ("images", 4)];
        let names: Vec<String> = limits.iter().map(|l| l.0.to_string()).collect();
        let samples = rows.iter().enumerate().map(|(i, &(len, it, im))| {
            // Every third sample is text (no resources); some name one limit only.
            let r: Vec<(&str, u64)> = match i % 3 { 0 => vec![], 1 => vec![("images", im)], _ => vec![("image_tokens", it), ("images", im)] };
            rollout(i as u32, len, &r)
        }).collect();
        let batch = stowplan::TrainingBatch { run: 0, step: 0, temperature: 1.0, samples };
        let batch = Arc::new(stowplan::TrainingBatch::decode(&batch.encode().unwrap()).unwrap());
        let mut p = limited_packer(dp, &limits).unwrap();
        let report = p.ingest(Arc::clone(&batch));
        let over: Vec<u32> = (0..rows.len() as u32).filter(|&i| {
            let s = &batch.samples[i as usize];
            s.resource_sizes(&names).unwrap().iter().zip(&limits).any(|(size, l)| *size > l.1)
        }).collect();
        let rejected: Vec<u32> = report.rejected.iter().map(|r| r.0).collect();
        prop_assert_eq!(&rejected, &over);
        for (i, reason, message) in &report.rejected {
            prop_assert_eq!(*reason, stowplan::materialize::RejectReason::OverLimit);
            // The first limit the sample breaks, named with its size and cap.
            let sizes = batch.samples[*i as usize].resource_sizes(&names).unwrap();
            let (size, (name, cap)) = sizes.iter().zip(&limits).find(|(s, l)| **s > l.1).unwrap();
            let want = format!("{size} {name}, over its limit {cap} per micro-batch");
            prop_assert!(message.starts_with(&want), "sample {}: {} (want {})", i, message, want);
        }
        if report.accepted == 0 {
            return Ok(());
        }
        let step = p.pack(true).unwrap().unwrap();
        for load in micro_loads(&step, &batch, &names) {
            for (l, (name, cap)) in load.iter().zip(&limits) {
                prop_assert!(l <= cap, "a micro-batch has {} {}, over its limit {}", l, name, cap);
            }
        }
        let mut delivered: Vec<u32> = step.ranks.iter().flat_map(|r| r.micro_batches.iter().flat_map(|mb| mb.samples.iter().map(|&i| r.keys[i as usize].index))).collect();
        delivered.sort_unstable();
        let accepted: Vec<u32> = (0..rows.len() as u32).filter(|i| !over.contains(i)).collect();
        prop_assert_eq!(delivered, accepted);
        // The checkpoint (limits recorded) rebuilds the same step.
        let state = stowplan::packer::PackerState::decode(&p.state().encode().unwrap()).unwrap();
        let q = stowplan::Packer::restore(Kernel::native(), p.options().clone(), state, |_| Ok(Arc::clone(&batch))).unwrap();
        prop_assert_eq!(q.rebuild_inflight().unwrap().unwrap().ranks, step.ranks);
    }
}

#[test]
fn the_packer_rejects_resources_it_has_no_limit_for_and_refuses_bad_limits() {
    let batch = |samples| Arc::new(stowplan::TrainingBatch { run: 0, step: 0, temperature: 1.0, samples });
    let mut p = limited_packer(1, &[("images", 2)]).unwrap();
    let r = p.ingest(batch(vec![
        rollout(0, 8, &[("images", 2)]),
        rollout(1, 8, &[("frames", 1)]),
        rollout(2, 8, &[("images", 1), ("images", 1)]),
        rollout(3, 8, &[("images", 3)]),
        rollout(4, 8, &[]),
    ]));
    let got: Vec<(u32, &str, &str)> = r.rejected.iter().map(|(i, k, m)| (*i, k.name(), m.as_str())).collect();
    assert_eq!(
        got,
        [
            (1, "unknown_resource", "the sample names resource \"frames\", which is not one of the limits (images)"),
            (2, "unknown_resource", "the sample names resource \"images\" twice"),
            (3, "over_limit", "3 images, over its limit 2 per micro-batch (samples are never split)"),
        ]
    );
    assert_eq!(r.accepted, 2);
    assert_eq!(p.progress(0).unwrap().rejected[&stowplan::materialize::RejectReason::OverLimit], 1);

    // Without limits a sample with resources is rejected, not packed as if it had none.
    let mut text = limited_packer(1, &[]).unwrap();
    let r = text.ingest(batch(vec![rollout(0, 8, &[("images", 1)])]));
    assert_eq!(r.rejected[0].1, stowplan::materialize::RejectReason::UnknownResource);
    assert!(
        r.rejected[0].2.contains("there are no limits to check it against (serve --limit NAME=CAP"),
        "{}",
        r.rejected[0].2
    );

    // Bad limits are refused when the packer is made, naming what is wrong.
    for (limits, want) in [
        (&[("tokens", 9)][..], "not \"tokens\""),
        (&[("images", 2), ("images", 3)][..], "all different"),
        (&[("images", 0)][..], "the cap of images must be at least 1"),
        (&[("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1), ("f", 1), ("g", 1), ("h", 1)][..], "at most 7 caps"),
        // Above 2^32 - 1 the kernel's fill of a step would be best-fit decreasing, whose
        // limits ingest does not check: refused, so that no accepted sample fails a step.
        (&[("images", 1 << 32)][..], "the cap of images must be in 1..=4294967295 (got 4294967296)"),
        (&[(&*"x".repeat(257), 1)][..], "limit names must have at most 256 bytes (got 257"),
    ] {
        match limited_packer(1, limits) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(want), "{limits:?}: {m}"),
            other => panic!("{limits:?}: {other:?}"),
        }
    }
    let unnamed = stowplan::PackerOptions {
        limits: stowplan::materialize::SampleLimits { caps: vec![3], names: vec![], ..Default::default() },
        ..stowplan::PackerOptions::new(64, 1)
    };
    match stowplan::Packer::new(Kernel::native(), unnamed) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("limits must name every cap: 1 caps, 0 names"), "{m}"),
        other => panic!("{other:?}"),
    }

    // The order limits are given in does not matter: they are kept sorted by name.
    let ab = limited_packer(1, &[("b", 2), ("a", 1)]).unwrap();
    assert_eq!(ab.options().limits.names, ["a", "b"]);
    assert_eq!(ab.options().limits.caps, [1, 2]);
    let state = ab.state();
    let ba = limited_packer(1, &[("a", 1), ("b", 2)]).unwrap().options().clone();
    stowplan::Packer::restore(Kernel::native(), ba, state, |_| unreachable!()).unwrap();

    // A forged batch naming more resources than there can be limits, or a name longer than
    // any limit's, is refused whole when decoded (it cannot fill memory with empty names);
    // 7 resources and a name of 256 bytes are decoded.
    for (resources, refused) in [
        (vec![(String::new(), 0); 8], true),
        (vec![(String::new(), 0); 7], false),
        (vec![("x".repeat(257), 0)], true),
        (vec![("x".repeat(256), 0)], false),
    ] {
        let s = stowplan::TrainingSample { resources, ..rollout(0, 4, &[]) };
        let bytes = stowplan::TrainingBatch { samples: vec![s], ..Default::default() }.encode().unwrap();
        match stowplan::TrainingBatch::decode(&bytes) {
            Err(Error::InvalidArgument(m)) => assert!(refused && m.contains("corrupt training batch"), "{m}"),
            Ok(b) => assert!(!refused, "{:?}", b.samples[0].resources.len()),
            other => panic!("{other:?}"),
        }
    }

    // A checkpoint taken under other limits is refused, naming them.
    let state = p.state();
    let other = limited_packer(1, &[("images", 3)]).unwrap().options().clone();
    match stowplan::Packer::restore(Kernel::native(), other, state, |_| unreachable!()) {
        Err(Error::CacheMismatch(m)) => assert!(m.contains("limits: [(\"images\", 2)]"), "{m}"),
        other => panic!("{other:?}"),
    }
}

/// Limits change the step: a rollout of image-heavy samples that fits one micro-batch by
/// tokens is split where the images would overflow, on both backends alike.
#[test]
fn limits_split_a_step_that_tokens_alone_would_not() {
    let samples: Vec<_> = (0..6).map(|i| rollout(i, 20, &[("images", 2)])).collect();
    let batch = Arc::new(stowplan::TrainingBatch { run: 0, step: 0, temperature: 1.0, samples });
    let mut counts = Vec::new();
    for limits in [&[][..], &[("images", 4)][..]] {
        for kernel in kernels() {
            let options = limited_packer(1, limits).unwrap().options().clone();
            let mut p = stowplan::Packer::new(kernel, options).unwrap();
            p.add_run(0, stowplan::packer::RunConfig { batch_size: 1 }).unwrap();
            if limits.is_empty() {
                // The same samples as text: no resources.
                let text: Vec<_> = (0..6).map(|i| rollout(i, 20, &[])).collect();
                p.ingest(Arc::new(stowplan::TrainingBatch { samples: text, ..(*batch).clone() }));
            } else {
                p.ingest(Arc::clone(&batch));
            }
            counts.push(p.pack(true).unwrap().unwrap().ranks[0].micro_batches.len());
        }
    }
    assert_eq!(counts, [1, 1, 3, 3]);
}

/// `max_segments` caps the samples per micro-batch (a resource of size 1 per sample the
/// samples do not give), with or without named limits, on both backends alike; the
/// checkpoint records it (a restore with another cap is refused), and no limit may be named
/// `segments`.
#[test]
fn max_segments_caps_the_samples_of_every_micro_batch() {
    let samples: Vec<_> = (0..12).map(|i| rollout(i, 10, &[("images", 1)])).collect();
    let batch = Arc::new(stowplan::TrainingBatch { run: 0, step: 0, temperature: 1.0, samples });
    let with = |limits: &[(&str, u64)], max_segments| stowplan::PackerOptions {
        limits: stowplan::materialize::SampleLimits {
            caps: limits.iter().map(|l| l.1).collect(),
            names: limits.iter().map(|l| l.0.to_string()).collect(),
            max_segments,
        },
        ..stowplan::PackerOptions::new(256, 2)
    };
    for (limits, max_segments, most) in [(&[][..], 0, 12), (&[][..], 2, 2), (&[("images", 8)][..], 3, 3)] {
        let mut steps = Vec::new();
        for kernel in kernels() {
            let mut p = stowplan::Packer::new(kernel, with(limits, max_segments)).unwrap();
            p.add_run(0, stowplan::packer::RunConfig { batch_size: 1 }).unwrap();
            let text: Vec<_> = (0..12).map(|i| rollout(i, 10, &[])).collect();
            let b = if limits.is_empty() {
                Arc::new(stowplan::TrainingBatch { samples: text, ..(*batch).clone() })
            } else {
                Arc::clone(&batch)
            };
            assert_eq!(p.ingest(Arc::clone(&b)).accepted, 12);
            let step = p.pack(true).unwrap().unwrap();
            let sizes: Vec<usize> =
                step.ranks.iter().flat_map(|r| r.micro_batches.iter().map(|mb| mb.samples.len())).collect();
            assert_eq!(sizes.iter().sum::<usize>(), 12, "{limits:?} {max_segments}");
            assert!(sizes.iter().all(|&n| n <= most), "{limits:?} {max_segments}: {sizes:?}");
            if max_segments > 0 {
                // The checkpoint records the cap: the same options restore it, another does not.
                let state = stowplan::packer::PackerState::decode(&p.state().encode().unwrap()).unwrap();
                let q = stowplan::Packer::restore(Kernel::native(), p.options().clone(), state.clone(), |_| {
                    Ok(Arc::clone(&b))
                })
                .unwrap();
                assert_eq!(q.rebuild_inflight().unwrap().unwrap().ranks, step.ranks);
                match stowplan::Packer::restore(
                    Kernel::native(),
                    with(limits, max_segments + 1),
                    state,
                    |_| unreachable!(),
                ) {
                    Err(Error::CacheMismatch(m)) => assert!(m.contains("(\"segments\","), "{m}"),
                    other => panic!("{other:?}"),
                }
            }
            steps.push(step.ranks);
        }
        assert_eq!(steps[0], steps[1], "WASM and native differ: {limits:?} {max_segments}");
    }
    match stowplan::Packer::new(Kernel::native(), with(&[("segments", 4)], 0)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("may not be named \"segments\""), "{m}"),
        other => panic!("{other:?}"),
    }
    let seven: Vec<(&str, u64)> = ["a", "b", "c", "d", "e", "f", "g"].iter().map(|n| (*n, 1)).collect();
    for (options, want) in [
        (with(&seven, 4), "with max_segments, at most 6 named limits (the segments are one more cap; got 7)"),
        (with(&[], 1 << 32), "max_segments must be in 0..=4294967295 (got 4294967296)"),
    ] {
        match stowplan::Packer::new(Kernel::native(), options) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains(want), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    stowplan::Packer::new(Kernel::native(), with(&seven[..6], 4)).unwrap();
}
