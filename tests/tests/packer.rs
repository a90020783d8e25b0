//! The packer runtime and `serve` over both transports: round-robin, progress, rejection, run
//! separation, equal counts, checkpoint/restore, crashes at every point of a step with nothing
//! lost or delivered twice, and the ZeroMQ protocol (barrier, receipts, refusal, out-of-order
//! batches, a rank reconnecting mid-step).
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use proptest::prelude::*;
use stowplan::serve::{
    Control, ControlMessage, FsTransport, Incoming, ServeOptions, Server, Transport, receive_fs, send_fs,
};
#[cfg(feature = "zmq")]
use stowplan::serve::{RankMessage, Receipt, Receipts, Refusal, ZmqEndpoints};
use stowplan::{
    Error, Kernel, Packer, PackerOptions, TrainingBatch, TrainingSample,
    materialize::RejectReason,
    packer::{BatchKey, PackerState, RankBatch, RunConfig, SampleKey},
};
#[cfg(feature = "zmq")]
use stowplan_zmq::ZmqTransport;

/// A deterministic sample: tokens from (run, step, index).
fn sample(run: u32, step: u64, index: u32, len: usize) -> TrainingSample {
    let base = i64::from(run) * 1_000_000 + step as i64 * 10_000 + i64::from(index) * 100;
    // At least one completion token.
    let p = len.saturating_sub(1).min(3);
    TrainingSample {
        prompt_ids: (0..p as i64).map(|t| base + t).collect(),
        completion_ids: (p as i64..len as i64).map(|t| base + t).collect(),
        completion_logprobs: Some(vec![-0.5; len - p]),
        advantage: index as f32 * 0.25 - 1.0,
        ..TrainingSample::default()
    }
}

fn batch(run: u32, step: u64, lens: &[usize]) -> TrainingBatch {
    TrainingBatch {
        run,
        step,
        temperature: 0.7,
        samples: lens.iter().enumerate().map(|(i, &l)| sample(run, step, i as u32, l)).collect(),
    }
}

fn packer(capacity: u64, dp: u32, runs: u32, batch_size: u64) -> Packer {
    let mut p =
        Packer::new(Kernel::native(), PackerOptions { num_runs: runs, ..PackerOptions::new(capacity, dp) }).unwrap();
    for r in 0..runs {
        p.add_run(r, RunConfig { batch_size }).unwrap();
    }
    p
}

/// Every (key, tokens) a step delivered, checking run separation and equal counts.
fn unpack(ranks: &[RankBatch]) -> Vec<(SampleKey, Vec<i64>)> {
    let per_rank = ranks[0].micro_batches.len();
    let mut out = Vec::new();
    for r in ranks {
        assert_eq!(r.micro_batches.len(), per_rank, "every rank gets the same number of micro-batches");
        for mb in &r.micro_batches {
            let runs: BTreeSet<u32> = mb.samples.iter().map(|&i| r.keys[i as usize].run).collect();
            assert!(runs.len() <= 1, "runs never share a micro-batch: {runs:?}");
            let lora: i32 = mb.lora_num_tokens.iter().sum();
            assert_eq!(lora as usize, mb.input_ids.len(), "lora_num_tokens covers the row");
            for (j, &i) in mb.samples.iter().enumerate() {
                let (a, b) = (mb.cu_seqlens[j] as usize, mb.cu_seqlens[j + 1] as usize);
                out.push((r.keys[i as usize], mb.input_ids[a..b].to_vec()));
            }
        }
    }
    out
}

fn tokens_of(k: SampleKey, lens: &dyn Fn(SampleKey) -> usize) -> Vec<i64> {
    let s = sample(k.run, k.step, k.index, lens(k));
    [s.prompt_ids, s.completion_ids].concat()
}

#[test]
fn round_robin_is_fair_and_persists_across_steps() {
    // Budget of 4 samples of 10 tokens per step; run 0 has 8 pending, run 1 has 2, run 2 has 6.
    let mut p = packer(10, 1, 3, 100);
    let mut p_opts = p.options().clone();
    p_opts.step_tokens = Some(40);
    let mut p2 = Packer::new(Kernel::native(), p_opts).unwrap();
    for r in 0..3 {
        p2.add_run(r, RunConfig { batch_size: 100 }).unwrap();
    }
    p = p2;
    p.ingest(Arc::new(batch(0, 0, &[10; 8])));
    p.ingest(Arc::new(batch(1, 0, &[10; 2])));
    p.ingest(Arc::new(batch(2, 0, &[10; 6])));
    let mut order = Vec::new();
    while let Some(step) = p.pack(true).unwrap() {
        let mut keys: Vec<SampleKey> = step.ranks[0].keys.clone();
        keys.sort_by_key(|k| (k.run, k.index));
        order.push(keys.iter().map(|k| (k.run, k.index)).collect::<Vec<_>>());
        p.delivered(step.metrics.step).unwrap();
    }
    assert_eq!(
        order,
        vec![
            vec![(0, 0), (0, 1), (1, 0), (2, 0)],
            vec![(0, 2), (1, 1), (2, 1), (2, 2)],
            vec![(0, 3), (0, 4), (2, 3), (2, 4)],
            vec![(0, 5), (0, 6), (0, 7), (2, 5)],
        ]
    );
}

#[test]
fn progress_steps_and_ready_to_update() {
    let mut p = packer(64, 2, 2, 3);
    p.ingest(Arc::new(batch(0, 0, &[5, 6, 7, 8, 9])));
    p.ingest(Arc::new(batch(1, 0, &[4, 4])));
    let step = p.pack(true).unwrap().unwrap();
    assert_eq!(step.ranks[0].ready_to_update, vec![0]);
    p.delivered(0).unwrap();
    let a = p.progress(0).unwrap().clone();
    assert_eq!((a.step, a.samples_this_step, a.ready_to_update, a.total_samples, a.total_tokens), (1, 2, true, 5, 35));
    let b = p.progress(1).unwrap();
    assert_eq!((b.step, b.samples_this_step, b.ready_to_update, b.total_tokens), (0, 2, false, 8));
    p.clear_ready(0).unwrap();
    assert!(!p.progress(0).unwrap().ready_to_update);
    p.ingest(Arc::new(batch(0, 1, &[3; 4])));
    p.pack(true).unwrap().unwrap();
    let a = p.progress(0).unwrap();
    assert_eq!((a.step, a.samples_this_step, a.ready_to_update), (3, 0, true), "6 samples: two steps at once");
}

#[test]
fn invalid_samples_are_rejected_with_reasons_and_the_rest_kept() {
    let mut p = packer(16, 1, 1, 1);
    let mut b = batch(0, 0, &[5, 5, 5, 5, 5, 5, 20]);
    b.samples[1].completion_mask = Some(vec![true]);
    b.samples[2].prompt_ids.clear();
    b.samples[2].completion_ids.clear();
    b.samples[2].completion_logprobs = None;
    b.samples[3].completion_ids.clear();
    b.samples[3].completion_logprobs = None;
    b.samples[4].advantage = f32::NAN;
    b.samples[5].teacher_logprobs = Some(vec![0.0; 5]);
    let r = p.ingest(Arc::new(b));
    assert_eq!(r.accepted, 1);
    let reasons: Vec<(u32, RejectReason)> = r.rejected.iter().map(|(i, k, _)| (*i, *k)).collect();
    assert_eq!(
        reasons,
        vec![
            (1, RejectReason::LengthMismatch),
            (2, RejectReason::Empty),
            (3, RejectReason::EmptyCompletion),
            (4, RejectReason::NotFinite),
            (5, RejectReason::TeacherLogprobs),
            (6, RejectReason::TooLong),
        ]
    );
    assert!(r.rejected[5].2.contains("20 tokens, over capacity 16"), "{}", r.rejected[5].2);
    assert_eq!(p.progress(0).unwrap().rejected.values().sum::<u64>(), 6);
    // An unknown run: every sample rejected; a duplicate changes nothing.
    let u = p.ingest(Arc::new(batch(7, 0, &[4, 4])));
    assert_eq!((u.accepted, u.rejected[0].1), (0, RejectReason::UnknownRun));
    let d = p.ingest(Arc::new(batch(0, 0, &[4])));
    assert!(d.duplicate);
    assert_eq!(p.progress(0).unwrap().duplicate_batches, 1);
    let step = p.pack(true).unwrap().unwrap();
    assert_eq!(step.metrics.samples, 1);
}

#[test]
fn runs_can_be_added_and_removed_while_running() {
    let mut p = packer(32, 2, 3, 4);
    p.remove_run(2).unwrap();
    p.ingest(Arc::new(batch(0, 0, &[8; 3])));
    p.ingest(Arc::new(batch(1, 0, &[8; 3])));
    let (dropped, released) = p.remove_run(1).unwrap();
    assert_eq!((dropped, released), (3, vec![BatchKey { run: 1, step: 0 }]));
    p.add_run(2, RunConfig { batch_size: 1 }).unwrap();
    p.ingest(Arc::new(batch(2, 0, &[8; 2])));
    let step = p.pack(true).unwrap().unwrap();
    let runs: BTreeSet<u32> = step.ranks[0].keys.iter().map(|k| k.run).collect();
    assert_eq!(runs, BTreeSet::from([0, 2]));
    assert!(p.remove_run(1).unwrap_err().to_string().contains("run 1 does not exist"));
    assert!(p.add_run(3, RunConfig { batch_size: 1 }).unwrap_err().to_string().contains("run must be in 0..3"));
    assert!(p.add_run(0, RunConfig { batch_size: 1 }).unwrap_err().to_string().contains("already exists"));
    assert!(p.add_run(1, RunConfig { batch_size: 0 }).unwrap_err().to_string().contains("batch_size must be"));
}

#[test]
fn round_robin_distribution_deals_in_turn_with_dummy_copies_and_persists() {
    use stowplan::materialize::DistributionMode;
    let o = PackerOptions {
        num_runs: 2,
        pad_to_multiple_of: 4,
        distribution: DistributionMode::RoundRobin,
        ..PackerOptions::new(32, 2)
    };
    let mut p = Packer::new(Kernel::native(), o.clone()).unwrap();
    for r in 0..2 {
        p.add_run(r, RunConfig { batch_size: 100 }).unwrap();
    }
    p.ingest(Arc::new(batch(0, 0, &[30, 20, 9])));
    p.ingest(Arc::new(batch(1, 0, &[12, 5])));
    let state = p.state();
    let step = p.pack(true).unwrap().unwrap();
    // First fit by (run, -length) under 32 real tokens, runs sharing rows: [30], [20, 9],
    // [12, 5]. Three rows on two ranks need one dummy, a copy of the first row, dealt last.
    let rows: Vec<&stowplan::materialize::MaterializedBatch> =
        (0..2).flat_map(|j| step.ranks.iter().map(move |r| &r.micro_batches[j])).collect();
    assert_eq!(step.ranks[0].micro_batches.len(), step.ranks[1].micro_batches.len());
    let (real, dummies): (
        Vec<&stowplan::materialize::MaterializedBatch>,
        Vec<&stowplan::materialize::MaterializedBatch>,
    ) = rows.iter().partition(|mb| !mb.dummy);
    assert_eq!(dummies.len(), 1);
    assert!(rows.last().unwrap().dummy, "dummies come after the real rows of their group");
    let dummy = dummies[0];
    assert_eq!(dummy.input_ids, real[0].input_ids, "a dummy copies its group's first micro-batch");
    assert!(dummy.loss_mask.iter().all(|&m| !m) && dummy.advantages.iter().all(|&a| a == 0.0));
    assert!(dummy.loss_weights.iter().all(|&w| w == 0.0));
    assert_eq!((dummy.real_tokens, dummy.padding_tokens), (0, dummy.len() as u64));
    let lens: Vec<usize> =
        real.iter().map(|mb| mb.cu_seqlens.windows(2).map(|w| (w[1] - w[0]) as usize).sum()).collect();
    assert_eq!(lens.iter().sum::<usize>(), 30 + 20 + 9 + 12 + 5);
    assert!(real.iter().all(|mb| mb.len() % 4 == 0 && mb.len() <= 32));
    // Rows are in prime-rl's first-fit order: the longest first.
    assert_eq!(lens[0], 30);
    // The checkpoint names the distribution: restoring it with the balanced one is refused.
    let balanced = PackerOptions { distribution: DistributionMode::Balanced, ..o.clone() };
    let e = Packer::restore(Kernel::native(), balanced, PackerState::decode(&state.encode().unwrap()).unwrap(), |_| {
        unreachable!("options are checked first")
    })
    .unwrap_err();
    assert!(e.to_string().contains("RoundRobin"), "{e}");
    // Round robin takes no limits.
    let limited = PackerOptions {
        limits: stowplan::materialize::SampleLimits { caps: vec![8], names: vec!["images".into()], max_segments: 0 },
        ..o
    };
    let e = Packer::new(Kernel::native(), limited).unwrap_err();
    assert!(e.to_string().contains("round-robin takes no limits"), "{e}");
}

#[test]
fn options_out_of_range_are_named() {
    let bad = |o: PackerOptions| match Packer::new(Kernel::native(), o) {
        Err(Error::InvalidArgument(m)) => m,
        other => panic!("{other:?}"),
    };
    let o = PackerOptions::new(1024, 4);
    assert!(bad(PackerOptions { capacity: 0, ..o.clone() }).contains("capacity must be in 1..="));
    assert!(bad(PackerOptions { dp: 0, ..o.clone() }).contains("dp must be in 1..=1048576 (got 0)"));
    assert!(
        bad(PackerOptions { pad_to_multiple_of: 0, ..o.clone() })
            .contains("pad_to_multiple_of must be in 1..=capacity")
    );
    assert!(bad(PackerOptions { num_runs: 0, ..o.clone() }).contains("num_runs must be in 1..=1048576 (got 0)"));
    assert!(bad(PackerOptions { dp: u32::MAX, ..o.clone() }).contains("dp must be in 1..=1048576"));
    assert!(bad(PackerOptions { threshold: Some(0), ..o.clone() }).contains("threshold must be at least 1"));
    assert!(
        bad(PackerOptions { step_tokens: Some(10), ..o.clone() }).contains("step_tokens must be at least capacity")
    );
    assert!(
        bad(PackerOptions { loss_scale_factor: Some(8.0), ..o.clone() })
            .contains("only applies to loss_agg_mode 'seq-mean-token-sum-norm'")
    );
    let mut p = packer(16, 1, 1, 1);
    p.ingest(Arc::new(batch(0, 0, &[4])));
    p.pack(true).unwrap().unwrap();
    assert!(p.pack(true).unwrap_err().to_string().contains("still in flight"));
    assert!(p.delivered(5).unwrap_err().to_string().contains("step 5 is not in flight"));
}

#[test]
fn threshold_and_wait_timeout_decide_when_to_pack() {
    // A generous timeout: the two checks before it must not see it expire on a loaded machine.
    let o = PackerOptions { wait_timeout: Duration::from_millis(1500), ..PackerOptions::new(100, 2) };
    let mut p = Packer::new(Kernel::native(), o).unwrap();
    p.add_run(0, RunConfig { batch_size: 1 }).unwrap();
    assert!(p.pack(false).unwrap().is_none(), "nothing pending");
    p.ingest(Arc::new(batch(0, 0, &[50; 3])));
    assert!(p.pack(false).unwrap().is_none(), "150 of 200 tokens, not waited yet");
    std::thread::sleep(Duration::from_millis(1600));
    assert!(p.pack(false).unwrap().is_some(), "the oldest sample waited past the timeout");
    p.delivered(0).unwrap();
    p.ingest(Arc::new(batch(0, 1, &[50; 4])));
    assert!(p.pack(false).unwrap().is_some(), "threshold reached");
}

#[test]
fn encodings_are_versioned_and_errors_name_the_problem() {
    let b = batch(1, 2, &[3, 4]);
    assert_eq!(TrainingBatch::decode(&b.encode().unwrap()).unwrap(), b);
    let inv = |r: Result<TrainingBatch, Error>| r.unwrap_err().to_string();
    assert!(inv(TrainingBatch::decode(b"nope")).contains("missing the SPTB header"));
    let mut v = b.encode().unwrap();
    v[4] = 9;
    assert!(inv(TrainingBatch::decode(&v)).contains("training batch format version 9"));
    let mut t = b.encode().unwrap();
    t.truncate(t.len() - 3);
    assert!(inv(TrainingBatch::decode(&t)).contains("damaged training batch"));
    let mut p = packer(16, 2, 2, 1);
    p.ingest(Arc::new(b));
    let step = p.pack(true).unwrap().unwrap();
    let enc = step.ranks[1].encode().unwrap();
    assert_eq!(RankBatch::decode(&enc).unwrap(), step.ranks[1]);
    assert!(RankBatch::decode(&enc[..enc.len() - 1]).is_err());
    assert!(PackerState::decode(&enc).unwrap_err().to_string().contains("missing the SPPS header"));
}

#[test]
fn restore_rebuilds_the_step_in_flight_byte_for_byte() {
    let mut p = packer(64, 2, 2, 2);
    let batches = [batch(0, 0, &[10, 20, 30, 40]), batch(1, 0, &[15, 25]), batch(0, 1, &[5, 6])];
    for b in &batches {
        p.ingest(Arc::new(b.clone()));
    }
    let mut o = p.options().clone();
    let step = p.pack(true).unwrap().unwrap();
    let state = p.state();
    let by_key: BTreeMap<BatchKey, TrainingBatch> = batches.iter().map(|b| (b.key(), b.clone())).collect();
    let load = |k: BatchKey| Ok(Arc::new(by_key[&k].clone()));
    let q = Packer::restore(
        Kernel::wasm().unwrap(),
        o.clone(),
        PackerState::decode(&state.encode().unwrap()).unwrap(),
        load,
    )
    .unwrap();
    let again = q.rebuild_inflight().unwrap().unwrap();
    for (a, b) in step.ranks.iter().zip(&again.ranks) {
        assert_eq!(a.encode().unwrap(), b.encode().unwrap());
    }
    assert_eq!(q.state(), state);
    o.capacity = 128;
    let e = Packer::restore(Kernel::native(), o, state, load).unwrap_err();
    assert!(matches!(e, Error::CacheMismatch(ref m) if m.contains("capacity: 128")), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Any mix of batches over any number of steps: every valid sample delivered exactly
    /// once with its tokens, runs apart, equal counts, progress totals right, even with a
    /// checkpoint/restore between steps.
    #[test]
    fn every_sample_exactly_once(
        batches in prop::collection::vec((0u32..3, prop::collection::vec(1usize..40, 0..12)), 1..8),
        dp in 1u32..4,
        budget in prop::option::of(40u64..200),
        restore_at in 0usize..6,
    ) {
        let o = PackerOptions { num_runs: 3, step_tokens: budget, ..PackerOptions::new(40, dp) };
        let mut p = Packer::new(Kernel::native(), o.clone()).unwrap();
        for r in 0..3 { p.add_run(r, RunConfig { batch_size: 5 }).unwrap(); }
        let mut sent = BTreeMap::new();
        let mut lens = BTreeMap::new();
        for (step, (run, ls)) in batches.iter().enumerate() {
            let b = batch(*run, step as u64, ls);
            for (i, &l) in ls.iter().enumerate() { lens.insert(SampleKey { run: *run, step: step as u64, index: i as u32 }, l); }
            sent.insert(b.key(), b.clone());
            p.ingest(Arc::new(b));
        }
        let mut got = Vec::new();
        let mut n = 0;
        while let Some(step) = p.pack(true).unwrap() {
            got.extend(unpack(&step.ranks));
            p.delivered(step.metrics.step).unwrap();
            n += 1;
            if n == restore_at {
                let load = |k: BatchKey| Ok(Arc::new(sent[&k].clone()));
                p = Packer::restore(Kernel::native(), o.clone(), p.state(), load).unwrap();
            }
        }
        let keys: Vec<SampleKey> = got.iter().map(|(k, _)| *k).collect();
        let unique: BTreeSet<SampleKey> = keys.iter().copied().collect();
        prop_assert_eq!(unique.len(), keys.len(), "no sample twice");
        prop_assert_eq!(unique, lens.keys().copied().collect::<BTreeSet<_>>(), "every sample");
        for (k, t) in &got { prop_assert_eq!(t, &tokens_of(*k, &|k| lens[&k])); }
        for r in 0..3u32 {
            let mine: Vec<usize> = lens.iter().filter(|(k, _)| k.run == r).map(|(_, &l)| l).collect();
            let pr = p.progress(r).unwrap();
            prop_assert_eq!(pr.total_samples, mine.len() as u64);
            prop_assert_eq!(pr.total_tokens, mine.iter().sum::<usize>() as u64);
            prop_assert_eq!(pr.step, mine.len() as u64 / 5);
        }
    }
}

/// The filesystem transport, failing one delivery after `partial` of the ranks' files (a
/// crash in the middle of a step); `crash_at` counts deliveries.
struct Crashing {
    inner: FsTransport,
    deliveries: u32,
    crash_at: Option<(u32, usize)>,
}

impl Transport for Crashing {
    fn name(&self) -> &'static str {
        "fs-crashing"
    }
    fn ready(&mut self) -> Result<bool, Error> {
        self.inner.ready()
    }
    fn receive(&mut self, timeout: Duration) -> Result<Vec<Incoming>, Error> {
        self.inner.receive(timeout)
    }
    fn delivered(&mut self) -> Result<Option<stowplan::serve::Delivered>, Error> {
        // Crashes mid-delivery must never look like a lost checkpoint.
        self.inner.delivered()
    }
    fn deliver(&mut self, step: u64, ranks: &[RankBatch], stop: &AtomicBool) -> Result<bool, Error> {
        self.deliveries += 1;
        match self.crash_at {
            Some((at, partial)) if at == self.deliveries => {
                self.inner.deliver(step, &ranks[..partial], stop)?;
                Err(Error::Io("simulated crash".into()))
            }
            _ => self.inner.deliver(step, ranks, stop),
        }
    }
}

/// Serves `dir` over the filesystem until its inbox is empty, then stops; the packer after.
fn serve_inbox(dir: &Path, o: &ServeOptions) -> Packer {
    serve_inbox_with(dir, o, FsTransport::new(dir, Duration::from_millis(2)).unwrap()).0
}

/// [`serve_inbox`] over the transport `t`; also the run's summary.
fn serve_inbox_with(dir: &Path, o: &ServeOptions, t: FsTransport) -> (Packer, stowplan::serve::ServeSummary) {
    let mut server = Server::open(Kernel::native(), t, o.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (stop, inbox) = (Arc::clone(&stop), dir.join("inbox"));
        std::thread::spawn(move || {
            while std::fs::read_dir(&inbox).unwrap().next().is_some() {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(50));
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let summary = server.run(&stop, |_| {}).unwrap();
    watcher.join().unwrap();
    let state = PackerState::decode(&std::fs::read(o.state_dir.join("state.bin")).unwrap()).unwrap();
    let spool = o.state_dir.join("spool");
    let packer = Packer::restore(Kernel::native(), o.packer.clone(), state, |k| {
        Ok(Arc::new(TrainingBatch::decode(&std::fs::read(spool.join(stowplan::serve::batch_file_name(k))).unwrap())?))
    })
    .unwrap();
    (packer, summary)
}

/// A 6 GiB file dropped in the inbox was read whole into memory. A file
/// over the message cap is now set aside into `rejected/` unread (cut to `rejected/`'s
/// per-file bound), and the batches beside it are served.
#[test]
fn an_inbox_file_over_the_message_cap_is_set_aside_unread() {
    let dir = std::env::temp_dir().join(format!("stowplan-packer-oversized-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = serve_options(&dir, None);
    o.packer.threshold = Some(1 << 40);
    o.packer.wait_timeout = Duration::from_secs(3600);
    std::fs::create_dir_all(dir.join("inbox")).unwrap();
    // Sparse: 6 GiB of size, no disk; reading it whole would need 6 GiB of memory.
    std::fs::File::create(dir.join("inbox/run_0_step_0.bin")).unwrap().set_len(6 << 30).unwrap();
    send_fs(&dir, "run_1_step_0.bin", &batch(1, 0, &[4, 5]).encode().unwrap()).unwrap();
    let t = FsTransport::new(&dir, Duration::from_millis(2)).unwrap().with_max_message_bytes(1 << 20).unwrap();
    let (packer, summary) = serve_inbox_with(&dir, &o, t);
    assert_eq!((summary.oversized, summary.undecodable, summary.batches), (1, 1, 1));
    assert_eq!(packer.pending().0, 2, "the batch beside it was taken");
    let kept = std::fs::metadata(o.state_dir.join("rejected/run_0_step_0.bin")).unwrap().len();
    assert!(kept <= stowplan::serve::RejectedLimits::default().max_file_bytes, "{kept}");
    assert!(FsTransport::new(&dir, Duration::from_millis(2)).unwrap().with_max_message_bytes(0).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// An inbox entry that is a symlink (or a FIFO) is not a message: it was followed, and an
/// oversized target would have been truncated when set aside.
#[test]
fn inbox_entries_that_are_not_regular_files_are_ignored() {
    let dir = std::env::temp_dir().join(format!("stowplan-packer-symlink-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = serve_options(&dir, None);
    o.packer.threshold = Some(1 << 40);
    o.packer.wait_timeout = Duration::from_secs(3600);
    std::fs::create_dir_all(dir.join("inbox")).unwrap();
    let precious = dir.join("model.bin");
    std::fs::write(&precious, vec![1u8; 3 << 20]).unwrap();
    std::os::unix::fs::symlink(&precious, dir.join("inbox/run_0_step_0.bin")).unwrap();
    send_fs(&dir, "run_1_step_0.bin", &batch(1, 0, &[4, 5]).encode().unwrap()).unwrap();
    let t = FsTransport::new(&dir, Duration::from_millis(2)).unwrap().with_max_message_bytes(1 << 20).unwrap();
    let mut server = Server::open(Kernel::native(), t, o.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let timer = Arc::clone(&stop);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        timer.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    let summary = server.run(&stop, |_| {}).unwrap();
    assert_eq!((summary.batches, summary.oversized, summary.undecodable), (1, 0, 0));
    assert_eq!(std::fs::metadata(&precious).unwrap().len(), 3 << 20, "the link's target is untouched");
    // The sender refuses a message over the packer's default cap itself (no receipts here).
    let big = vec![0u8; (stowplan::serve::MAX_MESSAGE_BYTES + 1) as usize];
    let e = send_fs(&dir, "run_0_step_9.bin", &big).unwrap_err().to_string();
    assert!(e.contains("over the packer's message cap"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over ZeroMQ: one 1 GiB message raised the packer's peak memory to 2 GiB.
/// libzmq now drops the connection of a sender whose message is over the cap before the
/// packer holds it, the senders refuse such a batch themselves (naming the cap), and batches
/// within it go on.
#[test]
#[cfg(feature = "zmq")]
fn a_zmq_message_over_the_cap_is_dropped_before_the_packer_holds_it() {
    use stowplan_zmq::{ZmqBatchSender, ZmqSenderOptions};
    let dir = std::env::temp_dir().join(format!("stowplan-packer-zmq-oversized-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let any = ZmqEndpoints {
        batches: "tcp://127.0.0.1:*".into(),
        receipts: "tcp://127.0.0.1:*".into(),
        ranks: "tcp://127.0.0.1:*".into(),
    };
    let cap = 64 << 10;
    let t = ZmqTransport::bind_capped(&any, 3, None, cap).unwrap();
    let ep = t.endpoints().clone();
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let (stop, o) = (Arc::clone(&stop), serve_options(&dir, None));
        std::thread::spawn(move || Server::open(Kernel::native(), t, o).unwrap().run(&stop, |_| {}).unwrap())
    };
    // A packer started without a checkpoint takes messages once a rank said hello.
    let _rank = stowplan_zmq::ZmqRankClient::connect(&ep.ranks, 0, 3, Default::default()).unwrap();
    // A raw sender of 1 MiB, past any sender's check.
    let ctx = zmq::Context::new();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.connect(&ep.batches).unwrap();
    push.send(vec![0u8; 1 << 20], 0).unwrap();
    // The senders' own check names the cap; a batch within it is acknowledged. Its receipt
    // may be published before the sender's subscription reaches the packer (ZeroMQ drops
    // it): the sender then resends after `resend_after`, 2 s here instead of the default
    // 30 s, which equalled the flush's wait and failed one CI run.
    let options = ZmqSenderOptions {
        max_message_bytes: cap,
        resend_after: Duration::from_secs(2),
        ..ZmqSenderOptions::default()
    };
    let mut sender = ZmqBatchSender::connect(&ep.batches, &ep.receipts, options).unwrap();
    let big = batch(0, 0, &[20_000]);
    match sender.send(&big) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("over the packer's message cap of 65536 bytes"), "{m}"),
        other => panic!("{other:?}"),
    }
    sender.send(&batch(0, 1, &[5, 6])).unwrap();
    sender.flush(Duration::from_secs(30)).unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let summary = server.join().unwrap();
    // One batch taken (a resent copy counts as a duplicate); the oversized one never read.
    assert_eq!((summary.batches - summary.duplicates, summary.undecodable), (1, 0), "{summary:?}");
    assert!(ZmqTransport::bind_capped(&any, 3, None, 0).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `state.bin` once kept every batch key ever received (10k keys → 67 KB,
/// rewritten at every checkpoint); keys are now ranges per run.
#[test]
fn the_checkpoint_does_not_grow_with_the_batches_received() {
    let mut p = Packer::new(Kernel::native(), PackerOptions { num_runs: 2, ..PackerOptions::new(32, 1) }).unwrap();
    let empty = p.state().encode().unwrap().len();
    for step in 0..10_000 {
        // Run 1 was never added: every sample is rejected, but the key is remembered.
        let report = p.ingest(Arc::new(batch(1, step, &[4])));
        assert!(!report.duplicate && report.accepted == 0);
    }
    assert!(p.ingest(Arc::new(batch(1, 77, &[4]))).duplicate, "still recognised");
    let after = p.state().encode().unwrap().len();
    assert!(after < empty + 64, "{empty} → {after} bytes");
}

/// A run change sent again after it was applied (its receipt lost) used to be applied again:
/// a `remove_run 0` resent after run 0 was added back dropped the new run's samples. The
/// packer now knows it by its id, across restarts.
#[test]
fn a_resent_run_change_is_not_applied_twice() {
    let dir = std::env::temp_dir().join(format!("stowplan-packer-resent-control-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = serve_options(&dir, None);
    o.packer.threshold = Some(1 << 40); // nothing is packed: every sample stays pending
    o.packer.wait_timeout = Duration::from_secs(3600);
    let remove = ControlMessage::new(Control::RemoveRun { run: 0 }).encode().unwrap();
    send_fs(&dir, "run_0_step_0.bin", &batch(0, 0, &[4, 5]).encode().unwrap()).unwrap();
    let p = serve_inbox(&dir, &o);
    assert_eq!(p.pending().0, 2);
    send_fs(&dir, "control_1.bin", &remove).unwrap();
    assert_eq!(serve_inbox(&dir, &o).pending().0, 0, "run 0 removed with its samples");
    let add = ControlMessage::new(Control::AddRun { run: 0, config: RunConfig { batch_size: 4 } });
    send_fs(&dir, "control_2.bin", &add.encode().unwrap()).unwrap();
    send_fs(&dir, "run_0_step_1.bin", &batch(0, 1, &[6, 7, 8]).encode().unwrap()).unwrap();
    assert_eq!(serve_inbox(&dir, &o).pending().0, 3, "run 0 back, with its new samples");
    // The first remove_run again, byte for byte (a sender that never saw its receipt).
    send_fs(&dir, "control_3.bin", &remove).unwrap();
    let p = serve_inbox(&dir, &o);
    assert!(p.progress(0).is_some(), "the resent remove_run was applied again");
    assert_eq!(p.pending().0, 3, "samples lost to a resent remove_run");
    let _ = std::fs::remove_dir_all(&dir);
}

fn serve_options(dir: &Path, max_steps: Option<u64>) -> ServeOptions {
    ServeOptions {
        packer: PackerOptions { num_runs: 2, threshold: Some(60), step_tokens: Some(96), ..PackerOptions::new(32, 3) },
        state_dir: dir.join("packer"),
        runs: Vec::new(),
        auto_add: Some(RunConfig { batch_size: 4 }),
        max_steps,
        poll: Duration::from_millis(5),
        rejected: stowplan::serve::RejectedLimits::default(),
    }
}

/// Sends batches into the inbox, serves with a crash at delivery `crash_at` (after `partial`
/// rank files), restarts, and checks what the ranks read.
fn crash_and_resume(crash_at: u32, partial: usize, resend: bool) {
    let dir = std::env::temp_dir()
        .join(format!("stowplan-packer-crash-{}-{crash_at}-{partial}-{resend}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let stop = AtomicBool::new(false);
    let lens = |k: SampleKey| 5 + ((k.index as usize * 7 + k.step as usize * 3 + k.run as usize) % 25);
    let mut expected = BTreeSet::new();
    let mut send = |run: u32, step: u64, n: u32| {
        let ls: Vec<usize> = (0..n).map(|i| lens(SampleKey { run, step, index: i })).collect();
        for i in 0..n {
            expected.insert(SampleKey { run, step, index: i });
        }
        let b = batch(run, step, &ls);
        send_fs(&dir, &stowplan::serve::batch_file_name(b.key()), &b.encode().unwrap()).unwrap();
    };
    std::fs::create_dir_all(dir.join("inbox")).unwrap();
    for s in 0..3 {
        send(0, s, 6);
        send(1, s, 5);
    }
    // First life: crashes at delivery `crash_at`.
    let t = Crashing {
        inner: FsTransport::new(&dir, Duration::from_millis(2)).unwrap(),
        deliveries: 0,
        crash_at: Some((crash_at, partial)),
    };
    let mut server = Server::open(Kernel::native(), t, serve_options(&dir, Some(10))).unwrap();
    let err = server.run(&stop, |_| {}).unwrap_err();
    assert!(err.to_string().contains("simulated crash"));
    drop(server);
    // More batches arrive while the packer is down; the orchestrator may resend one.
    send(0, 3, 4);
    send(1, 3, 9);
    if resend {
        let b = batch(0, 0, &(0..6).map(|i| lens(SampleKey { run: 0, step: 0, index: i })).collect::<Vec<_>>());
        send_fs(&dir, "run_0_step_0.bin", &b.encode().unwrap()).unwrap();
    }
    // Later lives: one step each (every restart resumes from the checkpoint) until
    // nothing is pending and the inbox is empty.
    let mut o = serve_options(&dir, Some(1));
    o.packer.wait_timeout = Duration::ZERO;
    let (mut last, mut duplicates) = (0, 0);
    for life in 0.. {
        assert!(life < 40, "did not drain");
        let t = FsTransport::new(&dir, Duration::from_millis(2)).unwrap();
        let mut server = Server::open(Kernel::native(), t, o.clone()).unwrap();
        server.run(&stop, |_| {}).unwrap();
        duplicates += server.summary().duplicates;
        last = server.packer().next_step();
        let inbox_empty = std::fs::read_dir(dir.join("inbox")).unwrap().next().is_none();
        if server.packer().pending().0 == 0 && inbox_empty {
            break;
        }
    }
    assert_eq!(duplicates, u64::from(resend), "a resent batch is a duplicate");
    // What the ranks read, each step once.
    let mut got = Vec::new();
    for step in 0..last {
        let ranks: Vec<RankBatch> = (0..3)
            .map(|r| receive_fs(&dir, step, r, Duration::from_secs(1), Duration::from_millis(1)).unwrap())
            .collect();
        got.extend(unpack(&ranks));
    }
    let keys: Vec<SampleKey> = got.iter().map(|(k, _)| *k).collect();
    let unique: BTreeSet<SampleKey> = keys.iter().copied().collect();
    assert_eq!(unique.len(), keys.len(), "delivered twice (crash at {crash_at}/{partial})");
    assert_eq!(unique, expected, "lost samples (crash at {crash_at}/{partial})");
    for (k, t) in &got {
        assert_eq!(t, &tokens_of(*k, &lens));
    }
    let spool: Vec<_> = std::fs::read_dir(dir.join("packer/spool")).unwrap().collect();
    assert!(spool.is_empty(), "spool files left after everything was delivered");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn crash_before_any_rank_file_then_resume() {
    crash_and_resume(1, 0, false);
}

#[test]
fn crash_with_some_rank_files_written_then_resume_and_resend() {
    crash_and_resume(1, 2, true);
    crash_and_resume(2, 1, false);
}

#[test]
fn a_damaged_checkpoint_or_needed_spool_file_is_refused_naming_it() {
    // A step delivered, more batches spooled and pending: then damage state.bin, or a
    // spooled batch, one byte at a time.
    let dir = std::env::temp_dir().join(format!("stowplan-packer-damage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = serve_options(&dir, Some(1));
    o.packer.wait_timeout = Duration::ZERO;
    o.packer.step_tokens = Some(32);
    std::fs::create_dir_all(dir.join("inbox")).unwrap();
    for step in 0..3 {
        send_fs(&dir, &format!("run_0_step_{step}.bin"), &batch(0, step, &[12, 12, 12]).encode().unwrap()).unwrap();
    }
    {
        let t = FsTransport::new(&dir, Duration::from_millis(2)).unwrap();
        let mut server = Server::open(Kernel::native(), t, o.clone()).unwrap();
        server.run(&AtomicBool::new(false), |_| {}).unwrap();
    }
    let state = dir.join("packer/state.bin");
    let good = std::fs::read(&state).unwrap();
    let open = || Server::open(Kernel::native(), FsTransport::new(&dir, Duration::from_millis(2)).unwrap(), o.clone());
    for byte in 0..good.len() {
        let mut bad = good.clone();
        bad[byte] ^= 0x20;
        std::fs::write(&state, &bad).unwrap();
        let e = open().unwrap_err().to_string();
        assert!(e.contains("state.bin") && e.contains("packer state"), "byte {byte}: {e}");
    }
    // A FIFO for state.bin blocked the start for ever; a FIFO in the spool is set aside.
    std::fs::remove_file(&state).unwrap();
    make_fifo(&state);
    let e = open().unwrap_err().to_string();
    assert!(e.contains("state.bin: not a regular file"), "{e}");
    std::fs::remove_file(&state).unwrap();
    std::fs::write(&state, &good).unwrap();
    let stray = dir.join("packer/spool/run_7_step_7.bin");
    make_fifo(&stray);
    drop(open().unwrap());
    assert!(!stray.exists() && dir.join("packer/rejected/run_7_step_7.bin").exists(), "the FIFO is set aside");
    // A spooled batch the checkpoint needs: refused naming the file.
    let spool = dir.join("packer/spool");
    let mut spooled: Vec<_> = std::fs::read_dir(&spool).unwrap().map(|e| e.unwrap().path()).collect();
    spooled.sort();
    assert!(!spooled.is_empty(), "pending batches are spooled");
    let first = std::fs::read(&spooled[0]).unwrap();
    let mut bad = first.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    std::fs::write(&spooled[0], &bad).unwrap();
    let e = open().unwrap_err().to_string();
    assert!(e.contains(&*spooled[0].file_name().unwrap().to_string_lossy()) && e.contains("damaged"), "{e}");
    std::fs::write(&spooled[0], &first).unwrap();
    assert!(open().is_ok(), "the undamaged files open again");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The in-process packer's checkpoint directory (the Ray actor's): one owner at a time, the
/// state and the spool checked together before anything is deleted, the acknowledged ranks
/// kept and checked, a batch spooled after the checkpoint ingested again.
#[test]
fn a_checkpoint_dir_has_one_owner_and_checks_state_and_spool_together() {
    use stowplan::serve::CheckpointDir;
    let dir = std::env::temp_dir().join(format!("stowplan-ckdir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let options = PackerOptions { num_runs: 1, ..PackerOptions::new(64, 2) };
    let ck = CheckpointDir::open(&dir, "test", Duration::ZERO).unwrap();
    let second = CheckpointDir::open(&dir, "test", Duration::ZERO).unwrap_err().to_string();
    assert!(second.contains("another stowplan packer uses this checkpoint directory, held by test, pid"), "{second}");
    assert!(ck.load(Kernel::native(), options.clone()).unwrap().is_none(), "a fresh directory");
    let mut p = packer(64, 2, 1, 4);
    for step in 0..3 {
        let b = batch(0, step, &[3, 4, 5]);
        atomic_write(&ck.batch_path(b.key()), &b.encode().unwrap());
        p.ingest(Arc::new(b));
    }
    let step = p.pack(true).unwrap().unwrap();
    assert!(ck.save(&p, &[1, 0]).unwrap_err().to_string().contains("ascending and distinct"));
    assert!(ck.save(&p, &[2]).unwrap_err().to_string().contains("rank 2 out of range 0..2"));
    ck.save(&p, &[1]).unwrap();
    // A batch spooled after the checkpoint (its receipt never sent): ingested again on load.
    let late = batch(0, 3, &[2, 2]);
    atomic_write(&ck.batch_path(late.key()), &late.encode().unwrap());
    let r = ck.load(Kernel::native(), options.clone()).unwrap().unwrap();
    assert_eq!(r.acked, [1]);
    assert_eq!(r.reingested, [late.key()]);
    let restored = r.packer;
    let again = restored.rebuild_inflight().unwrap().unwrap();
    for (a, b) in step.ranks.iter().zip(&again.ranks) {
        assert_eq!(a.encode().unwrap(), b.encode().unwrap(), "the step in flight, byte for byte");
    }
    // The state gone beside the spool: refused, nothing deleted.
    std::fs::remove_file(ck.state_path()).unwrap();
    let spooled = std::fs::read_dir(dir.join("batches")).unwrap().count();
    let e = ck.load(Kernel::native(), options.clone()).unwrap_err();
    assert!(matches!(&e, Error::CacheMismatch(m) if m.contains("packer_state.bin is missing")), "{e}");
    assert_eq!(std::fs::read_dir(dir.join("batches")).unwrap().count(), spooled);
    // Not a regular file where the state or a needed batch belongs (a FIFO would block the
    // read for ever, a symlink to /dev/zero fill memory): refused naming it.
    make_fifo(&ck.state_path());
    let e = ck.load(Kernel::native(), options.clone()).unwrap_err().to_string();
    assert!(e.contains("packer_state.bin: not a regular file"), "{e}");
    std::fs::remove_file(ck.state_path()).unwrap();
    ck.save(&restored, &r.acked).unwrap();
    let needed = ck.batch_path(BatchKey { run: 0, step: 0 });
    std::fs::remove_file(&needed).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &needed).unwrap();
    let e = ck.load(Kernel::native(), options.clone()).unwrap_err().to_string();
    assert!(e.contains("run_0_step_0.bin: not a regular file"), "{e}");
    drop(ck);
    assert!(CheckpointDir::open(&dir, "test", Duration::ZERO).is_ok(), "the first owner let go");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A FIFO at `path` (made in process: a child spawned for it would hold, between its fork and
/// exec, the lock files other tests open and close).
fn make_fifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", path.display());
}

fn atomic_write(path: &Path, bytes: &[u8]) {
    stowplan::runtime::write_atomic(path, bytes).unwrap();
}

#[test]
fn a_garbage_flood_keeps_rejected_within_its_bounds() {
    // 40 undecodable messages (one of 200 kB) into a rejected/ of at most 5 messages and
    // 4 kB: the oldest are dropped and counted, nothing grows without bound, the good batch
    // is still served.
    let dir = std::env::temp_dir().join(format!("stowplan-packer-flood-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = serve_options(&dir, Some(1));
    o.packer.wait_timeout = Duration::ZERO;
    o.rejected = stowplan::serve::RejectedLimits { max_files: 5, max_bytes: 4096, max_file_bytes: 1024 };
    std::fs::create_dir_all(dir.join("inbox")).unwrap();
    for i in 0..40 {
        let garbage = if i == 7 { vec![7u8; 200_000] } else { format!("garbage {i}").into_bytes() };
        send_fs(&dir, &format!("garbage_{i:02}.bin"), &garbage).unwrap();
    }
    send_fs(&dir, "run_0_step_0.bin", &batch(0, 0, &[4, 4]).encode().unwrap()).unwrap();
    let t = FsTransport::new(&dir, Duration::from_millis(2)).unwrap();
    let mut server = Server::open(Kernel::native(), t, o).unwrap();
    let summary = server.run(&AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!((summary.undecodable, summary.rejected_dropped, summary.samples), (40, 35, 2));
    let kept: Vec<u64> =
        std::fs::read_dir(dir.join("packer/rejected")).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).collect();
    assert!(kept.len() <= 5 && kept.iter().sum::<u64>() <= 4096, "{kept:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn control_messages_and_a_second_server_on_the_same_state() {
    let dir = std::env::temp_dir().join(format!("stowplan-packer-control-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = serve_options(&dir, Some(1));
    o.auto_add = None;
    o.packer.wait_timeout = Duration::ZERO;
    let add = Control::AddRun { run: 1, config: RunConfig { batch_size: 2 } };
    std::fs::create_dir_all(dir.join("inbox")).unwrap();
    send_fs(&dir, "control_0.bin", &ControlMessage::new(add).encode().unwrap()).unwrap();
    let b = batch(1, 0, &[4, 4]);
    send_fs(&dir, "run_1_step_0.bin", &b.encode().unwrap()).unwrap();
    let b0 = batch(0, 0, &[4]);
    send_fs(&dir, "run_0_step_0.bin", &b0.encode().unwrap()).unwrap();
    send_fs(&dir, "garbage.bin", b"not a message").unwrap();
    let t = FsTransport::new(&dir, Duration::from_millis(2)).unwrap();
    let mut server = Server::open(Kernel::native(), t, o.clone()).unwrap();
    // A second server on the same root is refused, naming the holder (with another state
    // directory it used to run and overwrite the first one's step files) ...
    let second = FsTransport::new(&dir, Duration::from_millis(2)).unwrap_err().to_string();
    assert!(second.contains("another stowplan packer uses this root, held by stowplan serve, pid "), "{second}");
    // ... and so is one on the same state directory with another root.
    let other_root = dir.join("other-root");
    let t2 = FsTransport::new(&other_root, Duration::from_millis(2)).unwrap();
    let second = Server::open(Kernel::native(), t2, o.clone()).unwrap_err().to_string();
    assert!(
        second.contains("another stowplan packer uses this state directory, held by stowplan serve, pid"),
        "{second}"
    );
    let summary = server.run(&AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!((summary.steps, summary.samples, summary.rejected, summary.undecodable), (1, 2, 1, 1));
    assert!(dir.join("packer/rejected/garbage.bin").is_file(), "undecodable messages are kept aside");
    assert_eq!(server.packer().progress(1).unwrap().step, 1);
    assert!(std::fs::read_dir(dir.join("inbox")).unwrap().next().is_none(), "inbox drained");
    let _ = std::fs::remove_dir_all(&dir);
}

#[cfg(feature = "zmq")]
fn zmq_recv(s: &zmq::Socket, timeout_ms: i64) -> Option<Vec<u8>> {
    if s.poll(zmq::POLLIN, timeout_ms).unwrap() == 0 {
        return None;
    }
    Some(s.recv_bytes(0).unwrap())
}

#[cfg(feature = "zmq")]
fn dealer(ctx: &zmq::Context, endpoint: &str, hello: RankMessage) -> zmq::Socket {
    let s = ctx.socket(zmq::DEALER).unwrap();
    s.set_linger(0).unwrap();
    s.connect(endpoint).unwrap();
    s.send(hello.encode().unwrap(), 0).unwrap();
    s
}

#[test]
#[cfg(feature = "zmq")]
fn zmq_barrier_receipts_refusal_reconnect_and_exactly_once() {
    let dir = std::env::temp_dir().join(format!("stowplan-packer-zmq-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let any = ZmqEndpoints {
        batches: "tcp://127.0.0.1:*".into(),
        receipts: "tcp://127.0.0.1:*".into(),
        ranks: "tcp://127.0.0.1:*".into(),
    };
    assert!(ZmqTransport::bind(&any, 0, None).unwrap_err().to_string().contains("dp must be at least 1"));
    let bad = ZmqEndpoints { batches: "nonsense".into(), ..any.clone() };
    let e = ZmqTransport::bind(&bad, 3, None).unwrap_err().to_string();
    assert!(e.contains("batches") && e.contains("nonsense"), "{e}");

    let stop = Arc::new(AtomicBool::new(false));
    let (server, ep, incarnation) = spawn_zmq_server(&dir, &stop);
    let ctx = zmq::Context::new();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.connect(&ep.batches).unwrap();
    let sub = ctx.socket(zmq::SUB).unwrap();
    sub.set_subscribe(b"").unwrap();
    sub.connect(&ep.receipts).unwrap();
    // The heartbeat proves the subscription is live before anything is sent.
    let first = Receipts::decode(&zmq_recv(&sub, 5000).expect("a heartbeat")).unwrap();
    assert_eq!(first.incarnation, incarnation);

    // A rank of another data-parallel size is refused with the reason.
    let wrong = dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: 0, dp: 2, next_step: 0 });
    let refusal = Refusal::decode(&zmq_recv(&wrong, 5000).expect("a refusal")).unwrap();
    assert!(refusal.message.contains("dp 2") && refusal.message.contains("dp 3"), "{}", refusal.message);

    // Two of three ranks: the barrier holds every step back.
    let mut ranks: Vec<zmq::Socket> =
        (0..2).map(|r| dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: r, dp: 3, next_step: 0 })).collect();
    let lens = |k: SampleKey| 4 + ((k.index as usize * 5 + k.step as usize * 7 + k.run as usize) % 26);
    let mut expected = BTreeSet::new();
    // Out of order, a duplicate, and garbage.
    let order = [(0, 2), (1, 0), (0, 0), (1, 2), (0, 1), (1, 1), (0, 0)];
    for &(run, step) in &order {
        let ls: Vec<usize> = (0..5).map(|i| lens(SampleKey { run, step, index: i })).collect();
        expected.extend((0..5).map(|index| SampleKey { run, step, index }));
        push.send(batch(run, step, &ls).encode().unwrap(), 0).unwrap();
    }
    push.send(&b"garbage"[..], 0).unwrap();
    let add = ControlMessage::new(Control::AddRun { run: 1, config: RunConfig { batch_size: 4 } });
    let remove_unknown = ControlMessage::new(Control::RemoveRun { run: 7 });
    push.send(add.encode().unwrap(), 0).unwrap();
    push.send(add.encode().unwrap(), 0).unwrap(); // resent: recognised by its id
    push.send(remove_unknown.encode().unwrap(), 0).unwrap();
    let mut receipts = Vec::new();
    while receipts.len() < order.len() + 3 {
        let r = Receipts::decode(&zmq_recv(&sub, 10_000).expect("receipts")).unwrap();
        assert_eq!(r.incarnation, incarnation);
        receipts.extend(r.receipts);
    }
    let batches: Vec<(u32, u64, u32, bool)> = receipts
        .iter()
        .filter_map(|r| match *r {
            Receipt::Batch { run, step, accepted, rejected, duplicate } => {
                assert_eq!((accepted, rejected), if duplicate { (0, 0) } else { (5, 0) });
                Some((run, step, accepted, duplicate))
            }
            _ => None,
        })
        .collect();
    assert_eq!(batches.len(), order.len());
    assert_eq!(batches.iter().filter(|b| b.3).map(|b| (b.0, b.1)).collect::<Vec<_>>(), vec![(0, 0)]);
    let (id, control) = (add.id, add.control);
    assert!(receipts.contains(&Receipt::Control { id, control: control.clone(), error: None, duplicate: false }));
    assert!(receipts.contains(&Receipt::Control { id, control, error: None, duplicate: true }));
    assert!(receipts.iter().any(|r| matches!(r, Receipt::Control { id, error: Some(e), duplicate: false, .. }
        if *id == remove_unknown.id && e.contains("7"))));
    for r in &ranks {
        assert!(zmq_recv(r, 400).is_none(), "a step was delivered before every rank said hello");
    }

    // The third rank arrives; rank 1 drops its first copy unacknowledged and reconnects.
    ranks.push(dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: 2, dp: 3, next_step: 0 }));
    let first_copy = RankBatch::decode(&zmq_recv(&ranks[1], 10_000).expect("step 0 for rank 1")).unwrap();
    assert_eq!((first_copy.step, first_copy.rank), (0, 1));
    ranks[1] = dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: 1, dp: 3, next_step: 0 });
    let mut next = [0u64; 3];
    receive_exactly_once(&ranks, &mut next, &expected, &lens);
    // Stopped while a step waits for the ranks' acknowledgements: the step stays in flight.
    push.send(batch(0, 3, &[6, 7, 8, 9, 10, 11]).encode().unwrap(), 0).unwrap();
    let copies: Vec<Vec<u8>> = ranks.iter().map(|s| zmq_recv(s, 10_000).expect("the next step")).collect();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let summary = server.join().unwrap();
    assert_eq!((summary.duplicates, summary.undecodable), (1, 1));
    assert_eq!(summary.in_flight_step, Some(next[0]));
    // The next life delivers it again, byte for byte, once the ranks (reconnected) ask.
    let stop = Arc::new(AtomicBool::new(false));
    let (server, ep, second) = spawn_zmq_server(&dir, &stop);
    assert_ne!(second, incarnation, "a restart is a new incarnation");
    // Rank 0's trainer restarted from an old checkpoint asks for step 0, delivered long ago:
    // refused with the reason (it used to hold the step back and wait for ever).
    let hello = |r: u32, next_step: u64| RankMessage::Hello { rank: r, dp: 3, next_step }.encode().unwrap();
    let stale = dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: 0, dp: 3, next_step: 0 });
    let mut ranks: Vec<zmq::Socket> = (1..3)
        .map(|r| dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: r, dp: 3, next_step: next[r as usize] }))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let refusal = 'wait: loop {
        assert!(std::time::Instant::now() < deadline, "the stale rank was never refused");
        stale.send(hello(0, 0), 0).unwrap();
        while let Some(bytes) = zmq_recv(&stale, 300) {
            if let Ok(r) = Refusal::decode(&bytes) {
                break 'wait r; // (a copy of the step may come first)
            }
        }
    };
    let want = format!("rank 0 asks for step 0, but the packer is delivering step {}", next[0]);
    assert!(refusal.message.contains(&want) && refusal.message.contains("start_step"), "{}", refusal.message);
    // The trainer restarted right takes the freed slot at once.
    ranks.insert(0, dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: 0, dp: 3, next_step: next[0] }));
    for (r, s) in ranks.iter().enumerate() {
        let again = zmq_recv(s, 10_000).expect("the step in flight again");
        assert_eq!(again, copies[r], "rank {r}: the step in flight is rebuilt byte for byte");
        s.send(RankMessage::Ack { rank: r as u32, step: next[r] }.encode().unwrap(), 0).unwrap();
    }
    wait_for_empty_spool(&dir);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let summary = server.join().unwrap();
    assert_eq!((summary.steps, summary.in_flight_step), (1, None));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Plays three raw ZeroMQ ranks (each says hello every second, acknowledges every copy, takes
/// steps in order from `next`) until `expected` samples arrived, then checks each arrived
/// exactly once with its tokens.
#[cfg(feature = "zmq")]
fn receive_exactly_once(
    ranks: &[zmq::Socket],
    next: &mut [u64; 3],
    expected: &BTreeSet<SampleKey>,
    lens: &dyn Fn(SampleKey) -> usize,
) {
    let mut got = Vec::new();
    let mut steps: BTreeMap<u64, Vec<Option<RankBatch>>> = BTreeMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut last_hello = std::time::Instant::now();
    while got.len() < expected.len() {
        assert!(std::time::Instant::now() < deadline, "{} of {} samples delivered", got.len(), expected.len());
        if last_hello.elapsed() >= Duration::from_secs(1) {
            last_hello = std::time::Instant::now();
            for (r, s) in ranks.iter().enumerate() {
                s.send(RankMessage::Hello { rank: r as u32, dp: 3, next_step: next[r] }.encode().unwrap(), 0).unwrap();
            }
        }
        for (r, s) in ranks.iter().enumerate() {
            let Some(bytes) = zmq_recv(s, 20) else { continue };
            let b = RankBatch::decode(&bytes).unwrap();
            assert_eq!(b.rank, r as u32);
            s.send(RankMessage::Ack { rank: r as u32, step: b.step }.encode().unwrap(), 0).unwrap();
            if b.step < next[r] {
                continue; // a copy of a step this rank has
            }
            assert_eq!(b.step, next[r], "steps arrive in order over one connection");
            next[r] += 1;
            let step = b.step;
            let slot = steps.entry(step).or_insert_with(|| vec![None, None, None]);
            slot[r] = Some(b);
            if slot.iter().all(Option::is_some) {
                let full: Vec<RankBatch> = steps.remove(&step).unwrap().into_iter().flatten().collect();
                got.extend(unpack(&full));
            }
        }
    }
    let keys: BTreeSet<SampleKey> = got.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys.len(), got.len(), "a sample delivered twice");
    assert_eq!(&keys, expected);
    for (k, t) in &got {
        assert_eq!(t, &tokens_of(*k, lens));
    }
}

/// Waits (at most 10 s) until the server released every spooled batch: its last step was
/// acknowledged by every rank.
#[cfg(feature = "zmq")]
fn wait_for_empty_spool(dir: &Path) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while dir.join("packer/spool").read_dir().unwrap().next().is_some() {
        assert!(std::time::Instant::now() < deadline, "the delivered step's batch was not released");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A second peer saying hello as rank 1 (an impostor, or a restarted trainer
/// whose old process still runs) used to take the slot, receive rank 1's steps and acknowledge
/// them while the real rank 1 waited for ever. Now it gets nothing but a refusal, its forged
/// acknowledgements count for nothing, and the real rank gets every step exactly once.
#[test]
#[cfg(feature = "zmq")]
fn zmq_a_second_connection_for_a_live_rank_is_refused_and_its_acknowledgements_count_for_nothing() {
    let dir = std::env::temp_dir().join(format!("stowplan-packer-zmq-dup-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let stop = Arc::new(AtomicBool::new(false));
    let (server, ep, _) = spawn_zmq_server(&dir, &stop);
    let ctx = zmq::Context::new();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.connect(&ep.batches).unwrap();
    let ranks: Vec<zmq::Socket> =
        (0..3).map(|r| dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: r, dp: 3, next_step: 0 })).collect();
    let lens = |k: SampleKey| 3 + ((k.index as usize * 3 + k.step as usize * 5) % 20);
    let mut expected = BTreeSet::new();
    for step in 0..4 {
        let ls: Vec<usize> = (0..5).map(|i| lens(SampleKey { run: 0, step, index: i })).collect();
        expected.extend((0..5).map(|index| SampleKey { run: 0, step, index }));
        push.send(batch(0, step, &ls).encode().unwrap(), 0).unwrap();
    }
    // Every real rank holds its slot: each has step 0.
    let firsts: Vec<RankBatch> =
        ranks.iter().map(|s| RankBatch::decode(&zmq_recv(s, 10_000).expect("step 0")).unwrap()).collect();
    assert!(firsts.iter().all(|b| b.step == 0));
    // The impostor says hello as rank 1 and acknowledges step 0 (and later ones) for it.
    let impostor = dealer(&ctx, &ep.ranks, RankMessage::Hello { rank: 1, dp: 3, next_step: 0 });
    for step in 0..8 {
        impostor.send(RankMessage::Ack { rank: 1, step }.encode().unwrap(), 0).unwrap();
    }
    for r in [0, 2] {
        ranks[r].send(RankMessage::Ack { rank: r as u32, step: 0 }.encode().unwrap(), 0).unwrap();
    }
    // The real rank 1 stays alive (hellos) without acknowledging: step 0 is not delivered,
    // so no rank gets step 1, until the impostor is refused.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let refusal = loop {
        assert!(std::time::Instant::now() < deadline, "the impostor was never refused");
        ranks[1].send(RankMessage::Hello { rank: 1, dp: 3, next_step: 0 }.encode().unwrap(), 0).unwrap();
        // A second trainer says hello every heartbeat too (one that falls silent is forgotten).
        impostor.send(RankMessage::Hello { rank: 1, dp: 3, next_step: 0 }.encode().unwrap(), 0).unwrap();
        for r in [0, 2] {
            assert!(zmq_recv(&ranks[r], 0).is_none(), "rank {r} got a step: a forged acknowledgement counted");
        }
        if let Some(bytes) = zmq_recv(&impostor, 500) {
            break Refusal::decode(&bytes).expect("the impostor gets a refusal, never a rank batch");
        }
    };
    assert!(
        refusal.message.contains("rank 1 is held by another connection that is still alive"),
        "{}",
        refusal.message
    );
    // The forged acknowledgements are gone for good: rank 1 acknowledges, and every sample
    // arrives exactly once at the real ranks.
    ranks[1].send(RankMessage::Ack { rank: 1, step: 0 }.encode().unwrap(), 0).unwrap();
    let mut next = [1u64; 3];
    let mut rest = expected.clone();
    for b in &firsts {
        for k in &b.keys {
            rest.remove(k);
        }
    }
    receive_exactly_once(&ranks, &mut next, &rest, &lens);
    assert!(zmq_recv(&impostor, 200).is_none(), "the refused impostor got something more");
    wait_for_empty_spool(&dir);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let summary = server.join().unwrap();
    assert_eq!((summary.samples, summary.in_flight_step), (expected.len() as u64, None));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `serve` over ZeroMQ on free loopback ports for 3 ranks, in a thread: the thread, the
/// endpoints bound and the incarnation.
#[cfg(feature = "zmq")]
fn spawn_zmq_server(
    dir: &Path,
    stop: &Arc<AtomicBool>,
) -> (std::thread::JoinHandle<stowplan::serve::ServeSummary>, ZmqEndpoints, u64) {
    let any = ZmqEndpoints {
        batches: "tcp://127.0.0.1:*".into(),
        receipts: "tcp://127.0.0.1:*".into(),
        ranks: "tcp://127.0.0.1:*".into(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, dir) = (Arc::clone(stop), dir.to_path_buf());
    let handle = std::thread::spawn(move || {
        let t = ZmqTransport::bind(&any, 3, None).unwrap();
        tx.send((t.endpoints().clone(), t.incarnation())).unwrap();
        let mut o = serve_options(&dir, None);
        o.packer.wait_timeout = Duration::from_millis(50);
        let mut server = Server::open(Kernel::native(), t, o).unwrap();
        server.run(&stop, |_| {}).unwrap()
    });
    let (ep, incarnation) = rx.recv().unwrap();
    (handle, ep, incarnation)
}

/// A step's rank batches carry loss weights for the packer's aggregation mode,
/// counted per run over the whole step: with every per-token loss 1, Σ weight over all ranks
/// is 1 per run under token-mean and seq-mean-token-mean, the mean loss-token count per
/// sequence under seq-mean-token-sum.
#[test]
fn rank_batches_carry_the_steps_loss_weights() {
    use stowplan::materialize::LossAggMode;
    for (mode, want) in [
        (LossAggMode::TokenMean, [1.0, 1.0]),
        (LossAggMode::SeqMeanTokenMean, [1.0, 1.0]),
        // Samples of 6, 9, 4 tokens have 3, 6, 1 completion (loss) tokens; of 2, 5 tokens: 1, 2.
        (LossAggMode::SeqMeanTokenSum, [(3.0 + 6.0 + 1.0) / 3.0, (1.0 + 2.0) / 2.0]),
    ] {
        let o = PackerOptions { num_runs: 2, loss_agg_mode: mode, ..PackerOptions::new(64, 2) };
        let mut p = Packer::new(Kernel::native(), o).unwrap();
        p.add_run(0, RunConfig { batch_size: 3 }).unwrap();
        p.add_run(1, RunConfig { batch_size: 2 }).unwrap();
        p.ingest(Arc::new(batch(0, 0, &[6, 9, 4])));
        p.ingest(Arc::new(batch(1, 0, &[2, 5])));
        let step = p.pack(true).unwrap().unwrap();
        let mut sums = [0.0f64; 2];
        for rank in &step.ranks {
            for mb in &rank.micro_batches {
                for (k, &i) in mb.samples.iter().enumerate() {
                    let run = rank.keys[i as usize].run as usize;
                    let (a, b) = (mb.cu_seqlens_padded[k] as usize, mb.cu_seqlens_padded[k + 1] as usize);
                    sums[run] += mb.loss_weights[a..b].iter().map(|&w| f64::from(w)).sum::<f64>();
                }
            }
        }
        for run in 0..2 {
            assert!((sums[run] - want[run]).abs() < 1e-5, "{mode:?} run {run}: {} vs {}", sums[run], want[run]);
        }
    }
}

/// A lost checkpoint used to restart the packer at step 0; it ingested the
/// spool again and rewrote `step_0` and `step_1`, which the ranks had consumed, so ranks going
/// on at step 2 saw 22 of 36 samples. Every way of losing the checkpoint is now refused at
/// start, naming the missing file and the way out, and the right checkpoint still resumes with
/// every sample delivered once.
#[test]
fn a_lost_or_older_checkpoint_is_refused_instead_of_restarting_at_step_0() {
    let dir = std::env::temp_dir().join(format!("stowplan-packer-lost-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut o = serve_options(&dir, Some(1));
    o.packer.wait_timeout = Duration::ZERO;
    let mut expected = BTreeSet::new();
    for step in 0..4u64 {
        let b = batch(0, step, &[10; 6]);
        expected.extend((0..6).map(|index| SampleKey { run: 0, step, index }));
        send_fs(&dir, &stowplan::serve::batch_file_name(b.key()), &b.encode().unwrap()).unwrap();
    }
    let open = |o: &ServeOptions| {
        Server::open(Kernel::native(), FsTransport::new(&dir, Duration::from_millis(2)).unwrap(), o.clone())
    };
    // One step, if there is anything to deliver (all batches are spooled after the first).
    let serve_one = |o: &ServeOptions| {
        let mut s = open(o).unwrap();
        let inbox = std::fs::read_dir(dir.join("inbox")).unwrap().next().is_some();
        if inbox || s.packer().pending().0 > 0 || s.packer().in_flight().is_some() {
            s.run(&AtomicBool::new(false), |_| {}).unwrap();
        }
    };
    let state_dir = o.state_dir.clone();
    let copy_state = |to: &Path| {
        let _ = std::fs::remove_dir_all(to);
        std::fs::create_dir_all(to.join("spool")).unwrap();
        std::fs::copy(state_dir.join("state.bin"), to.join("state.bin")).unwrap();
        for e in std::fs::read_dir(state_dir.join("spool")).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join("spool").join(e.file_name())).unwrap();
        }
    };
    serve_one(&o);
    let older = dir.join("older");
    copy_state(&older);
    serve_one(&o);
    let good = dir.join("good");
    copy_state(&good);
    // What the ranks took of steps 0 and 1.
    let mut got = Vec::new();
    let take = |step: u64, got: &mut Vec<SampleKey>| -> bool {
        if receive_fs(&dir, step, 0, Duration::from_millis(1), Duration::from_millis(1)).is_err() {
            return false;
        }
        for r in 0..3 {
            let b = receive_fs(&dir, step, r, Duration::from_secs(5), Duration::from_millis(1)).unwrap();
            got.extend(b.micro_batches.iter().flat_map(|mb| mb.samples.iter().map(|&i| b.keys[i as usize])));
        }
        true
    };
    assert!(take(0, &mut got) && take(1, &mut got) && !take(2, &mut got), "two steps delivered");
    let refused = |o: &ServeOptions, want: &str| match open(o) {
        Err(Error::CacheMismatch(m)) => {
            assert!(m.contains("refusing to start") && m.contains(want), "{m}");
            assert!(m.contains("Restore") && m.contains("start over on purpose"), "names the way out: {m}");
        }
        other => panic!("opened a packer that lost its checkpoint: {:?}", other.map(|_| ())),
    };
    // The spool is kept but state.bin is gone.
    std::fs::remove_file(state_dir.join("state.bin")).unwrap();
    let spooled = std::fs::read_dir(state_dir.join("spool")).unwrap().count();
    refused(&o, if spooled > 0 { "state.bin is missing but" } else { "receivers already hold steps up to 1" });
    // The whole state directory is gone: the root shows the deliveries.
    std::fs::remove_dir_all(&state_dir).unwrap();
    refused(&o, "receivers already hold steps up to 1");
    // The ranks consumed their step files too: ROOT/delivered.bin still tells.
    std::fs::remove_dir_all(dir.join("rollouts")).unwrap();
    std::fs::create_dir_all(dir.join("rollouts")).unwrap();
    refused(&o, "delivered.bin says so");
    // An older copy of the checkpoint (step 0 delivered, step 1 not).
    std::fs::remove_dir_all(&state_dir).unwrap();
    std::fs::rename(&older, &state_dir).unwrap();
    refused(&o, "was saved at step 1, older than the deliveries");
    // The latest checkpoint resumes: steps 0 and 1 were delivered (and consumed), the rest
    // follows, and every sample arrives once.
    std::fs::remove_dir_all(&state_dir).unwrap();
    std::fs::rename(&good, &state_dir).unwrap();
    let mut step = 2;
    loop {
        serve_one(&o);
        if !take(step, &mut got) {
            break;
        }
        step += 1;
        assert!(step < 20, "did not drain");
    }
    let unique: BTreeSet<SampleKey> = got.iter().copied().collect();
    assert_eq!(unique.len(), got.len(), "a sample delivered twice");
    assert_eq!(unique, expected, "samples lost");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Over ZeroMQ the ranks' hellos are the evidence: a packer with no checkpoint whose ranks ask
/// for step 3 stops, naming the rank, instead of delivering a new step 0 they would skip.
#[test]
#[cfg(feature = "zmq")]
fn a_packer_behind_its_ranks_stops_naming_the_rank() {
    let dir = std::env::temp_dir().join(format!("stowplan-packer-behind-ranks-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let any = ZmqEndpoints {
        batches: "tcp://127.0.0.1:*".into(),
        receipts: "tcp://127.0.0.1:*".into(),
        ranks: "tcp://127.0.0.1:*".into(),
    };
    let t = ZmqTransport::bind(&any, 3, None).unwrap();
    let (ranks, batches) = (t.endpoints().ranks.clone(), t.endpoints().batches.clone());
    let mut server = Server::open(Kernel::native(), t, serve_options(&dir, None)).unwrap();
    // A batch that arrives before any rank said hello is not taken (nor acknowledged) by a
    // packer that started without a checkpoint.
    let ctx = zmq::Context::new();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.set_linger(0).unwrap();
    push.connect(&batches).unwrap();
    push.send(batch(0, 0, &[5, 6]).encode().unwrap(), 0).unwrap();
    let clients: Vec<_> = (0..3)
        .map(|r| {
            let options = stowplan_zmq::ZmqRankOptions { start_step: 3, ..Default::default() };
            stowplan_zmq::ZmqRankClient::connect(&ranks, r, 3, options).unwrap()
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let timer = Arc::clone(&stop);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        timer.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    match server.run(&stop, |_| {}) {
        Err(Error::CacheMismatch(m)) => {
            assert!(m.contains("receivers already hold steps up to 2") && m.contains("asks for step 3"), "{m}");
            assert!(m.contains("state.bin is missing"), "{m}");
        }
        other => panic!("served ranks ahead of it: {other:?}"),
    }
    assert_eq!(server.summary().batches, 0, "nothing taken before the ranks were checked");
    assert_eq!(std::fs::read_dir(dir.join("packer/spool")).unwrap().count(), 0);
    drop(clients);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sample's extra cost (a multimodal sample's vision tokens) crosses the wire with
/// it, and the packer balances ranks with it: four 16-token samples on 2 ranks split 2 + 2 as
/// text, but with 48 extra on one of them that sample's rank gets nothing else.
#[test]
fn the_packer_balances_multimodal_samples_by_their_extra_cost() {
    for (extra, alone) in [(0u64, false), (48, true)] {
        let mut p = Packer::new(Kernel::native(), PackerOptions::new(64, 2)).unwrap();
        p.add_run(0, RunConfig { batch_size: 4 }).unwrap();
        let mut b = batch(0, 0, &[16, 16, 16, 16]);
        b.samples[0].extra_cost = extra;
        let b = TrainingBatch::decode(&b.encode().unwrap()).unwrap();
        assert_eq!(b.samples[0].extra_cost, extra, "the wire carries the extra cost");
        assert_eq!(p.ingest(Arc::new(b)).accepted, 4);
        let step = p.pack(true).unwrap().unwrap();
        let holds = |r: &RankBatch| {
            r.micro_batches
                .iter()
                .flat_map(|mb| mb.samples.iter().map(|&i| r.keys[i as usize].index))
                .collect::<Vec<_>>()
        };
        let with_image = step.ranks.iter().find(|r| holds(r).contains(&0)).unwrap();
        assert_eq!(holds(with_image).len() == 1, alone, "extra {extra}: {:?}", holds(with_image));
        // The step's figures count the extra cost: 64 against 48 (imbalance 64/56).
        let want = if alone { 64.0 / 56.0 } else { 1.0 };
        assert!((step.metrics.imbalance - want).abs() < 1e-9, "{}", step.metrics.imbalance);
    }
}

/// A sample whose cost, extra cost included, would overflow the step's cost sums is rejected
/// at ingest (`cost_overflow`), naming the costs, instead of failing every later step.
#[test]
fn costs_that_overflow_are_rejected_at_ingest() {
    let mut p = Packer::new(Kernel::native(), PackerOptions::new(64, 1)).unwrap();
    p.add_run(0, RunConfig { batch_size: 2 }).unwrap();
    let mut b = batch(0, 0, &[16, 16, 16]);
    b.samples[0].extra_cost = u64::MAX; // 16 + 2^64 - 1 overflows alone
    b.samples[1].extra_cost = u64::MAX / 2;
    b.samples[2].extra_cost = u64::MAX / 2; // fits alone, not beside sample 1
    let r = p.ingest(Arc::new(b));
    assert_eq!(r.accepted, 1);
    let reasons: Vec<(u32, RejectReason)> = r.rejected.iter().map(|(i, k, _)| (*i, *k)).collect();
    assert_eq!(reasons, [(0, RejectReason::CostOverflow), (2, RejectReason::CostOverflow)]);
    assert!(r.rejected[0].2.contains("extra_cost 18446744073709551615 overflows u64"), "{}", r.rejected[0].2);
    // The accepted one packs; its cost left the pending sum, so the same sample fits again.
    let step = p.pack(true).unwrap().unwrap();
    p.delivered(step.metrics.step).unwrap();
    let mut again = batch(0, 1, &[16]);
    again.samples[0].extra_cost = u64::MAX / 2;
    assert_eq!(p.ingest(Arc::new(again)).accepted, 1);
}
