//! The Rust clients of `stowplan serve` (`stowplan::serve::client` and `stowplan_zmq`), end to end:
//! `ZmqBatchSender` and two `ZmqRankClient`s in threads against the `stowplan` binary
//! (`serve --transport zmq`), killed with SIGKILL mid-run and restarted (every sample exactly
//! once, in step order); a rank against a stand-in packer (steps out of order, a copy, the
//! acknowledgements); refusals, timeouts and argument errors naming what is missing; and
//! `FileRankClient` consuming the steps of the filesystem transport.
//!
//! The packer process is `STOWPLAN_BIN`, else the `stowplan` binary beside this test's
//! directory (`target/release/stowplan`, built by a workspace `cargo test --release`). When
//! there is none (a `cargo test -p stowplan-conformance` alone does not build it) and
//! `STOWPLAN_REQUIRE_SERVE` is unset, this test executable runs the same `Server` itself in a
//! child process ([`serve_child_process`]), which is killed the same way.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stowplan::serve::{
    Control, FileRankClient, FileRankOptions, FsTransport, MessageKey, RankMessage, Receipt, ServeOptions, Server,
    ZmqEndpoints, batch_file_name, send_fs,
};
use stowplan::{
    Error, Kernel, PackerOptions, TrainingBatch, TrainingSample,
    packer::{RankBatch, RunConfig, SampleKey},
};
use stowplan_zmq::{ZmqBatchSender, ZmqRankClient, ZmqRankOptions, ZmqSenderOptions, ZmqTransport};

const SEQ_LEN: u64 = 256;
const SAMPLES: u32 = 10;

/// A deterministic sample of `len` tokens from (run, step, index).
fn sample(k: SampleKey) -> TrainingSample {
    let len = 8 + ((k.index as usize * 37 + k.step as usize * 11 + k.run as usize * 5) % 180);
    let base = i64::from(k.run) * 1_000_000 + k.step as i64 * 10_000 + i64::from(k.index) * 100;
    TrainingSample {
        prompt_ids: (0..3).map(|t| base + t).collect(),
        completion_ids: (3..len as i64).map(|t| base + t).collect(),
        completion_logprobs: Some(vec![-0.5; len - 3]),
        advantage: k.index as f32 * 0.25 - 1.0,
        ..TrainingSample::default()
    }
}

fn tokens(k: SampleKey) -> Vec<i64> {
    let s = sample(k);
    [s.prompt_ids, s.completion_ids].concat()
}

fn batch(run: u32, step: u64) -> TrainingBatch {
    TrainingBatch {
        run,
        step,
        temperature: 0.7,
        samples: (0..SAMPLES).map(|index| sample(SampleKey { run, step, index })).collect(),
    }
}

/// Every (key, tokens) rank batch `b` holds, in micro-batch order.
fn samples_of(b: &RankBatch) -> Vec<(SampleKey, Vec<i64>)> {
    let mut out = Vec::new();
    for mb in &b.micro_batches {
        for (j, &i) in mb.samples.iter().enumerate() {
            let (lo, hi) = (mb.cu_seqlens[j] as usize, mb.cu_seqlens[j + 1] as usize);
            out.push((b.keys[i as usize], mb.input_ids[lo..hi].to_vec()));
        }
    }
    out
}

/// A random number (std only: a fresh `RandomState` is randomly keyed).
fn random(n: u64) -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(n);
    h.finish()
}

/// `n` loopback TCP ports that were free a moment ago, below the kernel's ephemeral range
/// (an outgoing connection, e.g. a rank reconnecting while the packer restarts, never takes
/// one of them as its own port).
fn free_ports(n: usize) -> Vec<u16> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse::<u64>().ok()))
        .unwrap_or(32768);
    let start = low.saturating_sub(12_000).max(1024);
    let mut ports = Vec::new();
    for attempt in 0..10_000u64 {
        if ports.len() == n {
            break;
        }
        let port = (start + random(attempt) % (low - start)) as u16;
        if !ports.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    assert_eq!(ports.len(), n, "no free loopback ports");
    ports
}

/// What a packer process serves: the same options as CLI arguments (for the binary) and as
/// [`ServeOptions`] (for [`serve_child_process`]).
#[derive(Clone, Debug)]
struct Serve {
    state_dir: PathBuf,
    endpoints: ZmqEndpoints,
    dp: u32,
}

impl Serve {
    const NUM_RUNS: u32 = 2;
    const BATCH_SIZE: u64 = 8;
    const WAIT_TIMEOUT_MS: u64 = 300;

    fn step_tokens(&self) -> u64 {
        2 * u64::from(self.dp) * SEQ_LEN
    }

    fn cli_args(&self) -> Vec<String> {
        let mut a: Vec<String> = ["serve", "--transport", "zmq", "--log-format", "json", "--poll-ms", "2"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let pairs = [
            ("--state-dir", self.state_dir.display().to_string()),
            ("--capacity", SEQ_LEN.to_string()),
            ("--dp", self.dp.to_string()),
            ("--batch-size", Self::BATCH_SIZE.to_string()),
            ("--num-runs", Self::NUM_RUNS.to_string()),
            ("--wait-timeout", format!("{}", Self::WAIT_TIMEOUT_MS as f64 / 1000.0)),
            ("--step-tokens", self.step_tokens().to_string()),
            ("--zmq-batches", self.endpoints.batches.clone()),
            ("--zmq-receipts", self.endpoints.receipts.clone()),
            ("--zmq-ranks", self.endpoints.ranks.clone()),
        ];
        for (k, v) in pairs {
            a.push(k.into());
            a.push(v);
        }
        a
    }

    fn options(&self) -> ServeOptions {
        ServeOptions {
            packer: PackerOptions {
                num_runs: Self::NUM_RUNS,
                step_tokens: Some(self.step_tokens()),
                wait_timeout: Duration::from_millis(Self::WAIT_TIMEOUT_MS),
                ..PackerOptions::new(SEQ_LEN, self.dp)
            },
            state_dir: self.state_dir.clone(),
            runs: Vec::new(),
            auto_add: Some(RunConfig { batch_size: Self::BATCH_SIZE }),
            max_steps: None,
            poll: Duration::from_millis(2),
            rejected: stowplan::serve::RejectedLimits::default(),
        }
    }

    /// As one line for the child's environment: `STATE_DIR|BATCHES|RECEIPTS|RANKS|DP`.
    fn to_env(&self) -> String {
        let e = &self.endpoints;
        format!("{}|{}|{}|{}|{}", self.state_dir.display(), e.batches, e.receipts, e.ranks, self.dp)
    }

    fn from_env(s: &str) -> Self {
        let p: Vec<&str> = s.split('|').collect();
        Self {
            state_dir: p[0].into(),
            endpoints: ZmqEndpoints { batches: p[1].into(), receipts: p[2].into(), ranks: p[3].into() },
            dp: p[4].parse().unwrap(),
        }
    }

    /// Starts the packer process (logs appended to `log`).
    fn spawn(&self, log: &Path) -> Child {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let mut cmd = match serve_binary() {
            Some(bin) => {
                let mut c = Command::new(bin);
                c.args(self.cli_args());
                c
            }
            None => {
                let mut c = Command::new(std::env::current_exe().unwrap());
                c.args(["--exact", "serve_child_process", "--nocapture", "--test-threads", "1"])
                    .env(CHILD_ENV, self.to_env());
                c
            }
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().unwrap()
    }
}

const CHILD_ENV: &str = "STOWPLAN_TEST_SERVE_CHILD";

/// The `stowplan` binary: `STOWPLAN_BIN`, else `stowplan` in this test's target directory;
/// `None` when there is none (then `STOWPLAN_REQUIRE_SERVE` makes that a failure).
fn serve_binary() -> Option<PathBuf> {
    let path = match std::env::var_os("STOWPLAN_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().ok()?;
            // target/<profile>/deps/clients-<hash> → target/<profile>/stowplan
            exe.parent()?.parent()?.join(format!("stowplan{}", std::env::consts::EXE_SUFFIX))
        }
    };
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os("STOWPLAN_REQUIRE_SERVE").is_none(),
        "the stowplan binary is required but missing at {}",
        path.display()
    );
    None
}

/// Not a test of its own: the packer process when this executable is started as one
/// (environment [`CHILD_ENV`]); it runs until killed, or stops after 5 minutes.
#[test]
fn serve_child_process() {
    let Ok(spec) = std::env::var(CHILD_ENV) else { return };
    let s = Serve::from_env(&spec);
    let transport = ZmqTransport::bind(&s.endpoints, s.dp, None).unwrap();
    let mut server = Server::open(Kernel::native(), transport, s.options()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let timer = Arc::clone(&stop);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(300));
        timer.store(true, Ordering::SeqCst);
    });
    server.run(&stop, |_| {}).unwrap();
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Kills the packer process when dropped (a failed assertion leaves no process behind).
struct Killed(Option<Child>);

impl Killed {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Sets a flag when dropped (the rank threads stop on it, also when the test fails).
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn zmq_clients_exactly_once_in_order_across_a_sigkill_of_the_packer() {
    const DP: u32 = 2;
    const STEPS: u64 = 8;
    let dir = std::env::temp_dir().join(format!("stowplan-clients-zmq-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("serve.log");
    let ports = free_ports(3);
    let ep = |p: u16| format!("tcp://127.0.0.1:{p}");
    let serve = Serve {
        state_dir: dir.join("state"),
        endpoints: ZmqEndpoints { batches: ep(ports[0]), receipts: ep(ports[1]), ranks: ep(ports[2]) },
        dp: DP,
    };
    eprintln!(
        "packer: {}",
        serve_binary().map_or("this test executable (no stowplan binary)".into(), |p| p.display().to_string())
    );
    let mut packer = Killed(Some(serve.spawn(&log)));

    // The ranks: each takes its steps in order until told to stop.
    let done = Arc::new(AtomicBool::new(false));
    let _stop_ranks = SetOnDrop(Arc::clone(&done));
    let received: Arc<Mutex<Vec<(u32, RankBatch)>>> = Arc::default();
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..DP).map(|_| AtomicU64::new(0)).collect());
    let ranks: Vec<_> = (0..DP)
        .map(|r| {
            let (endpoint, done, received, counts) =
                (serve.endpoints.ranks.clone(), Arc::clone(&done), Arc::clone(&received), Arc::clone(&counts));
            std::thread::spawn(move || -> Result<(), Error> {
                let client = ZmqRankClient::connect(&endpoint, r, DP, ZmqRankOptions::default())?;
                let deadline = Instant::now() + Duration::from_secs(240);
                while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
                    match client.receive(Duration::from_millis(200)) {
                        Ok(b) => {
                            received.lock().unwrap().push((r, b));
                            counts[r as usize].fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::Timeout(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
        })
        .collect();

    // The orchestrator: half the batches, flushed (the first incarnation is known), the rest
    // once the packer was killed, then a flush across the restart.
    let (killed_tx, killed_rx) = std::sync::mpsc::channel::<()>();
    let (half_tx, half_rx) = std::sync::mpsc::channel::<u64>();
    let (batches, receipts) = (serve.endpoints.batches.clone(), serve.endpoints.receipts.clone());
    let orchestrator = std::thread::spawn(move || -> Result<(u64, u64, Vec<Receipt>), Error> {
        let options = ZmqSenderOptions { resend_after: Duration::from_secs(3), ..ZmqSenderOptions::default() };
        let mut sender = ZmqBatchSender::connect(&batches, &receipts, options)?;
        let mut got = Vec::new();
        got.extend(sender.add_run(1, RunConfig { batch_size: Serve::BATCH_SIZE })?);
        for step in 0..STEPS {
            if step == STEPS / 2 {
                got.extend(sender.flush(Duration::from_secs(60))?);
                let first = sender.incarnation().unwrap();
                half_tx.send(first).unwrap();
                // Bounded: the main thread kills the packer or fails.
                let _ = killed_rx.recv_timeout(Duration::from_secs(90));
            }
            for run in 0..Serve::NUM_RUNS {
                got.extend(sender.send(&batch(run, step))?);
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        got.extend(sender.flush(Duration::from_secs(120))?);
        Ok((sender.incarnation().unwrap(), sender.resent(), got))
    });

    let first_incarnation = half_rx
        .recv_timeout(Duration::from_secs(90))
        .unwrap_or_else(|_| panic!("the first half of the batches was not acknowledged\n{}", tail(&log)));
    let deadline = Instant::now() + Duration::from_secs(60);
    while counts.iter().any(|c| c.load(Ordering::SeqCst) < 2) {
        assert!(Instant::now() < deadline, "ranks did not get two steps\n{}", tail(&log));
        assert!(packer.child().try_wait().unwrap().is_none(), "serve exited\n{}", tail(&log));
        std::thread::sleep(Duration::from_millis(10));
    }
    // SIGKILL mid-run: ranks are waiting for more, batches keep coming meanwhile.
    packer.kill();
    killed_tx.send(()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut packer = Killed(Some(serve.spawn(&log)));

    let (last_incarnation, resent, got) = orchestrator.join().unwrap().unwrap_or_else(|e| {
        panic!("the orchestrator failed: {e}\n{}", tail(&log));
    });
    assert_ne!(first_incarnation, last_incarnation, "the sender saw the restart");
    let acked: Vec<(u32, u64)> = got
        .iter()
        .filter_map(|r| match *r {
            Receipt::Batch { run, step, .. } => Some((run, step)),
            _ => None,
        })
        .collect();
    let unique: BTreeSet<(u32, u64)> = acked.iter().copied().collect();
    let sent = STEPS * u64::from(Serve::NUM_RUNS);
    assert_eq!((acked.len() as u64, unique.len() as u64), (sent, sent), "one receipt returned per batch");
    assert!(got.iter().any(|r| matches!(
        r,
        // Applied once; its receipt may be the one of a resend after the SIGKILL (`duplicate`).
        Receipt::Control { control: Control::AddRun { run: 1, .. }, error: None, .. }
    )));

    let expected: BTreeSet<SampleKey> = (0..STEPS)
        .flat_map(|step| {
            (0..Serve::NUM_RUNS).flat_map(move |run| (0..SAMPLES).map(move |index| SampleKey { run, step, index }))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (keys, steps) = {
            let got = received.lock().unwrap();
            let keys: BTreeSet<SampleKey> = got.iter().flat_map(|(_, b)| samples_of(b)).map(|(k, _)| k).collect();
            let steps: Vec<u64> = (0..DP).map(|r| got.iter().filter(|(q, _)| *q == r).count() as u64).collect();
            (keys, steps)
        };
        if keys.len() >= expected.len() && steps.iter().all(|&s| s == steps[0]) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} samples received, steps per rank {steps:?}\n{}",
            keys.len(),
            expected.len(),
            tail(&log)
        );
        assert!(packer.child().try_wait().unwrap().is_none(), "serve exited\n{}", tail(&log));
        std::thread::sleep(Duration::from_millis(20));
    }

    // A rank of another data-parallel size is refused with the packer's reason.
    let wrong = ZmqRankClient::connect(&serve.endpoints.ranks, 0, 3, ZmqRankOptions::default()).unwrap();
    let e = wrong.receive(Duration::from_secs(20)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidArgument(m) if m.contains("the packer refused this rank") && m.contains("dp 3")),
        "{e}"
    );
    drop(wrong);

    done.store(true, Ordering::SeqCst);
    for r in ranks {
        r.join().unwrap().unwrap();
    }
    packer.kill();
    let got = std::mem::take(&mut *received.lock().unwrap());
    // In step order on every rank, each step once.
    for r in 0..DP {
        let steps: Vec<u64> = got.iter().filter(|(q, _)| *q == r).map(|(_, b)| b.step).collect();
        assert_eq!(steps, (0..steps.len() as u64).collect::<Vec<_>>(), "rank {r} took its steps in order");
    }
    // Every sample exactly once, with its tokens; ranks of a step have equal micro-batch counts.
    let mut seen = BTreeMap::new();
    let mut per_step: BTreeMap<u64, BTreeSet<usize>> = BTreeMap::new();
    for (r, b) in &got {
        assert_eq!((b.rank, b.dp), (*r, DP));
        per_step.entry(b.step).or_default().insert(b.micro_batches.len());
        for (k, t) in samples_of(b) {
            assert_eq!(t, tokens(k), "tokens of {k:?}");
            assert!(seen.insert(k, (b.step, *r)).is_none(), "{k:?} delivered twice");
        }
    }
    assert!(per_step.values().all(|c| c.len() == 1), "micro-batch counts differ between ranks: {per_step:?}");
    assert_eq!(seen.keys().copied().collect::<BTreeSet<_>>(), expected, "lost samples");
    eprintln!("{} steps, {} samples, {resent} messages resent", per_step.len(), seen.len());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stand-in packer: a ROUTER on a free loopback port.
fn router(ctx: &zmq::Context) -> (zmq::Socket, String) {
    let s = ctx.socket(zmq::ROUTER).unwrap();
    s.set_linger(0).unwrap();
    s.bind("tcp://127.0.0.1:*").unwrap();
    let ep = s.get_last_endpoint().unwrap().unwrap();
    (s, ep)
}

fn rank_batch(rank: u32, step: u64) -> RankBatch {
    RankBatch { step, rank, dp: 2, keys: Vec::new(), micro_batches: Vec::new(), ready_to_update: Vec::new() }
}

/// The next message from a rank that is not a hello (bounded wait).
fn next_ack(s: &zmq::Socket, deadline: Instant) -> Option<RankMessage> {
    while Instant::now() < deadline {
        if s.poll(zmq::POLLIN, 100).unwrap() > 0 {
            let parts = s.recv_multipart(0).unwrap();
            let m = RankMessage::decode(&parts[1]).unwrap();
            if matches!(m, RankMessage::Ack { .. }) {
                return Some(m);
            }
        }
    }
    None
}

#[test]
fn zmq_rank_client_orders_steps_drops_copies_and_acknowledges_each() {
    let ctx = zmq::Context::new();
    let (router, ep) = router(&ctx);
    let client = ZmqRankClient::connect(&ep, 1, 2, ZmqRankOptions { start_step: 5, prefetch: 4, curve: None }).unwrap();
    assert_eq!((client.endpoint(), client.next_step()), (ep.as_str(), 5));
    assert!(router.poll(zmq::POLLIN, 10_000).unwrap() > 0, "a hello on start");
    let parts = router.recv_multipart(0).unwrap();
    assert_eq!(RankMessage::decode(&parts[1]).unwrap(), RankMessage::Hello { rank: 1, dp: 2, next_step: 5 });
    let peer = parts[0].clone();
    for step in [7, 5, 5, 6, 4] {
        router.send_multipart([peer.clone(), rank_batch(1, step).encode().unwrap()], 0).unwrap();
    }
    let steps: Vec<u64> = (0..3).map(|_| client.receive(Duration::from_secs(10)).unwrap().step).collect();
    assert_eq!(steps, vec![5, 6, 7]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let acks: Vec<u64> = (0..5)
        .map(|_| match next_ack(&router, deadline) {
            Some(RankMessage::Ack { rank: 1, step }) => step,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(acks, vec![7, 5, 5, 6, 4], "every message acknowledged, copies too");
    let e = client.receive(Duration::from_millis(200)).unwrap_err();
    assert!(
        matches!(&e, Error::Timeout(m) if m.contains(&format!("rank 1: step 8 did not arrive from {ep} within 0.2 s"))),
        "{e}"
    );
    // Hellos keep coming every second, naming the step expected.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no hello naming step 8");
        if router.poll(zmq::POLLIN, 100).unwrap() > 0 {
            let m = RankMessage::decode(&router.recv_multipart(0).unwrap()[1]).unwrap();
            if m == (RankMessage::Hello { rank: 1, dp: 2, next_step: 8 }) {
                break;
            }
        }
    }
    // Another rank's batch fails the receiver, naming both ranks.
    router.send_multipart([peer, rank_batch(0, 8).encode().unwrap()], 0).unwrap();
    let e = client.receive(Duration::from_secs(10)).unwrap_err();
    assert!(e.to_string().contains("the packer sent rank 0's batch to rank 1"), "{e}");
}

#[test]
fn zmq_rank_client_prefetches_up_to_its_limit() {
    let ctx = zmq::Context::new();
    let (router, ep) = router(&ctx);
    let client = ZmqRankClient::connect(&ep, 0, 2, ZmqRankOptions { start_step: 0, prefetch: 2, curve: None }).unwrap();
    assert!(router.poll(zmq::POLLIN, 10_000).unwrap() > 0);
    let peer = router.recv_multipart(0).unwrap()[0].clone();
    for step in 0..4 {
        router.send_multipart([peer.clone(), rank_batch(0, step).encode().unwrap()], 0).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let acked: Vec<_> = (0..2).map(|_| next_ack(&router, deadline).unwrap()).collect();
    assert_eq!(acked, vec![RankMessage::Ack { rank: 0, step: 0 }, RankMessage::Ack { rank: 0, step: 1 }]);
    assert!(next_ack(&router, Instant::now() + Duration::from_millis(500)).is_none(), "two held: nothing more read");
    assert_eq!(client.receive(Duration::from_secs(10)).unwrap().step, 0);
    assert_eq!(
        next_ack(&router, Instant::now() + Duration::from_secs(10)),
        Some(RankMessage::Ack { rank: 0, step: 2 })
    );
    let steps: Vec<u64> = (0..3).map(|_| client.receive(Duration::from_secs(10)).unwrap().step).collect();
    assert_eq!(steps, vec![1, 2, 3]);
}

#[test]
fn client_arguments_timeouts_and_unacknowledged_messages_are_named() {
    let e = |r: Result<ZmqRankClient, Error>| r.unwrap_err().to_string();
    assert!(
        e(ZmqRankClient::connect("tcp://127.0.0.1:1", 2, 2, ZmqRankOptions::default()))
            .contains("rank must be below dp 2")
    );
    let no_prefetch = ZmqRankOptions { prefetch: 0, ..ZmqRankOptions::default() };
    assert!(e(ZmqRankClient::connect("tcp://127.0.0.1:1", 0, 1, no_prefetch)).contains("prefetch must be at least 1"));
    assert!(
        e(ZmqRankClient::connect("nonsense", 0, 1, ZmqRankOptions::default()))
            .contains("endpoint: cannot connect to \"nonsense\"")
    );
    let s = |r: Result<ZmqBatchSender, Error>| r.unwrap_err().to_string();
    assert!(
        s(ZmqBatchSender::connect("nonsense", "tcp://127.0.0.1:2", ZmqSenderOptions::default()))
            .contains("cannot connect")
    );
    let zero = ZmqSenderOptions { resend_after: Duration::ZERO, ..ZmqSenderOptions::default() };
    assert!(s(ZmqBatchSender::connect("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", zero)).contains("resend_after"));

    // Nobody listens: the sender keeps the message and names it when a flush times out.
    let ports = free_ports(2);
    let (b, r) = (format!("tcp://127.0.0.1:{}", ports[0]), format!("tcp://127.0.0.1:{}", ports[1]));
    let mut sender = ZmqBatchSender::connect(&b, &r, ZmqSenderOptions::default()).unwrap();
    assert!(sender.add_run(3, RunConfig { batch_size: 4 }).unwrap().is_empty());
    let unacked = sender.unacked();
    let [MessageKey::Control { control, .. }] = &unacked[..] else { panic!("{unacked:?}") };
    assert_eq!(*control, Control::AddRun { run: 3, config: RunConfig { batch_size: 4 } });
    let started = Instant::now();
    let err = sender.flush(Duration::from_millis(200)).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(&err, Error::Timeout(m) if m.contains(&format!("1 messages not acknowledged by the packer at {r} within 0.2 s (first: add_run 3 (batch_size 4))"))),
        "{err}"
    );
    assert_eq!((sender.incarnation(), sender.resent()), (None, 0));
    let rank = ZmqRankClient::connect(&b, 0, 1, ZmqRankOptions::default()).unwrap();
    let e = rank.receive(Duration::from_millis(100)).unwrap_err().to_string();
    assert!(e.contains("rank 0: step 0 did not arrive") && e.contains("held back: steps []"), "{e}");
}

#[test]
fn file_rank_clients_consume_their_steps_in_order() {
    let dir = std::env::temp_dir().join(format!("stowplan-clients-fs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for step in 0..2 {
        let b = batch(0, step);
        send_fs(&dir, &batch_file_name(b.key()), &b.encode().unwrap()).unwrap();
    }
    let options = ServeOptions {
        packer: PackerOptions {
            wait_timeout: Duration::ZERO,
            step_tokens: Some(4 * SEQ_LEN),
            ..PackerOptions::new(SEQ_LEN, 2)
        },
        state_dir: dir.join("packer"),
        runs: Vec::new(),
        auto_add: Some(RunConfig { batch_size: 4 }),
        max_steps: Some(2),
        poll: Duration::from_millis(2),
        rejected: stowplan::serve::RejectedLimits::default(),
    };
    let t = FsTransport::new(&dir, Duration::from_millis(2)).unwrap();
    let mut server = Server::open(Kernel::native(), t, options).unwrap();
    let summary = server.run(&AtomicBool::new(false), |_| {}).unwrap();
    assert_eq!(summary.steps, 2);
    let consume = FileRankOptions { consume: true, ..FileRankOptions::default() };
    let mut ranks: Vec<FileRankClient> =
        (0..2).map(|r| FileRankClient::new(&dir, r, consume.clone()).unwrap()).collect();
    let mut seen = BTreeSet::new();
    for step in 0..2 {
        let step_dir = dir.join(format!("rollouts/step_{step}"));
        for (r, client) in ranks.iter_mut().enumerate() {
            assert_eq!(client.next_step(), step);
            let b = client.receive(Duration::from_secs(5)).unwrap();
            assert_eq!((b.step, b.rank), (step, r as u32));
            assert!(!client.path(step).exists(), "consumed");
            assert_eq!(step_dir.exists(), r == 0, "the last rank removes the step's directory");
            for (k, t) in samples_of(&b) {
                assert_eq!(t, tokens(k));
                assert!(seen.insert(k), "{k:?} twice");
            }
        }
    }
    assert_eq!(seen.len(), 2 * SAMPLES as usize);
    let e = ranks[1].receive(Duration::from_millis(50)).unwrap_err();
    assert!(matches!(&e, Error::Timeout(m) if m.contains("rollouts/step_2/rank_1.bin did not appear")), "{e}");
    // Without consume the files stay; an explicit step is read again.
    let mut keep = FileRankClient::new(&dir, 0, FileRankOptions::default()).unwrap();
    let p = dir.join("rollouts/step_9/rank_0.bin");
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, rank_batch(0, 9).encode().unwrap()).unwrap();
    assert_eq!(keep.receive_step(9, Duration::from_secs(1)).unwrap().step, 9);
    assert!(p.exists());
    assert_eq!(keep.next_step(), 10);
    assert!(
        FileRankClient::new(&dir, 0, FileRankOptions { poll: Duration::ZERO, ..FileRankOptions::default() })
            .unwrap_err()
            .to_string()
            .contains("poll must be")
    );
    let _ = std::fs::remove_dir_all(&dir);
}
