//! CURVE on the ZeroMQ transport: certificates, and a packer that admits
//! only the client keys it lists.
//!
//! Certificates are read, written and refused the same in every build. The transport's CURVE
//! needs a libzmq with CURVE: the system's, linked by a build with
//! `--config .cargo/system-libzmq.toml` (`cargo xtask test` runs this file so when the system
//! libzmq is installed, with `STOWPLAN_EXPECT_CURVE=1` so that a libzmq without CURVE fails
//! it; CI installs the library and requires it). In the default build the same test checks
//! that every CURVE entry point refuses, saying how to get CURVE.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use stowplan::serve::{ServeOptions, Server, ZmqEndpoints};
use stowplan::{Error, Kernel, PackerOptions, TrainingBatch, TrainingSample, packer::RunConfig};
use stowplan_zmq::{
    Certificate, CurveClient, CurveServer, ZmqBatchSender, ZmqRankClient, ZmqRankOptions, ZmqSenderOptions,
    ZmqTransport, curve_available,
};

fn temp_dir(what: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("stowplan-curve-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn message(r: Result<impl std::fmt::Debug, Error>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn certificates_round_trip_and_bad_ones_are_refused_naming_the_file() {
    let dir = temp_dir("certs");
    let pair = Certificate { public: [3; 32], secret: Some([5; 32]) };
    let (public, secret) = pair.save(&dir, "rank0").unwrap();
    let secret = secret.unwrap();
    assert_eq!(
        (public.file_name().unwrap(), secret.file_name().unwrap()),
        ("rank0.key".as_ref(), "rank0.key_secret".as_ref())
    );
    assert_eq!(Certificate::load(&public).unwrap(), Certificate { public: [3; 32], secret: None });
    assert_eq!(Certificate::load(&secret).unwrap(), pair);
    assert_eq!(Certificate::load_secret(&secret).unwrap(), ([3; 32], [5; 32]));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(!format!("{pair:?}").contains(&stowplan_zmq::curve::z85(&[5; 32])), "Debug never shows a secret key");

    assert!(message(pair.save(&dir, "rank0")).contains("exists: not overwriting a key"));
    assert!(message(pair.save(&dir, "../x")).contains("name must be a file name"));
    assert!(message(Certificate::load_secret(&public)).contains("no secret-key line"));
    chmod(&secret, 0o644);
    let e = message(Certificate::load(&secret));
    assert!(e.contains("mode 0644") && e.contains("chmod 600") && e.contains("rank0.key_secret"), "{e}");
    chmod(&secret, 0o600);

    let bad = dir.join("bad.key");
    std::fs::write(&bad, "metadata\ncurve\n    public-key = \"not z85 at all\"\n").unwrap();
    let e = message(Certificate::load(&bad));
    assert!(e.contains("bad.key") && e.contains("line 3") && e.contains("40 characters"), "{e}");
    std::fs::write(&bad, "curve\n").unwrap();
    assert!(message(Certificate::load(&bad)).contains("no public-key line"));
    std::fs::write(&bad, vec![b'#'; 70_000]).unwrap();
    assert!(message(Certificate::load(&bad)).contains("not a certificate"));
    assert!(message(Certificate::load(&dir.join("missing.key"))).contains("missing.key"));
    std::fs::remove_file(&bad).unwrap();

    let empty = dir.join("nobody");
    std::fs::create_dir_all(&empty).unwrap();
    assert!(message(CurveServer::load(&secret, &empty)).contains("no client certificate"));
    let server = CurveServer::load(&secret, &dir).unwrap();
    assert_eq!(server.clients, vec![[3; 32]], "the public certificates of the directory");
    let _ = std::fs::remove_dir_all(&dir);
}

fn batch(step: u64) -> TrainingBatch {
    let sample = |i: i64| TrainingSample {
        prompt_ids: vec![step as i64 * 100 + i, 1],
        completion_ids: vec![2, 3, 4],
        completion_logprobs: Some(vec![-0.25; 3]),
        ..TrainingSample::default()
    };
    TrainingBatch { run: 0, step, temperature: 1.0, samples: (0..4).map(sample).collect() }
}

fn free_endpoints() -> ZmqEndpoints {
    let any = "tcp://127.0.0.1:*".to_string();
    ZmqEndpoints { batches: any.clone(), receipts: any.clone(), ranks: any }
}

/// Keys of a packer and three clients in `dir`: the packer admits "rank0" and "orchestrator"
/// (`dir/clients/`), not "stranger".
fn keys(dir: &Path) -> (CurveServer, CurveClient, CurveClient, CurveClient) {
    let clients = dir.join("clients");
    let keys = dir.join("keys");
    let make = |name: &str, admitted: bool| {
        let (public, secret) = Certificate::generate().unwrap().save(&keys, name).unwrap();
        if admitted {
            std::fs::create_dir_all(&clients).unwrap();
            std::fs::copy(&public, clients.join(public.file_name().unwrap())).unwrap();
        }
        secret.unwrap()
    };
    let server_secret = make("packer", false);
    let (rank, orchestrator, stranger) = (make("rank0", true), make("orchestrator", true), make("stranger", false));
    let server_public = keys.join("packer.key");
    let client = |secret: &Path| CurveClient::load(&server_public, secret).unwrap();
    (CurveServer::load(&server_secret, &clients).unwrap(), client(&rank), client(&orchestrator), client(&stranger))
}

#[test]
fn a_curve_packer_admits_only_the_client_keys_it_lists() {
    let dir = temp_dir("serve");
    if !curve_available() {
        assert_ne!(
            std::env::var("STOWPLAN_EXPECT_CURVE").as_deref(),
            Ok("1"),
            "built for CURVE (STOWPLAN_EXPECT_CURVE=1) but this libzmq has none"
        );
        // The default build: every CURVE entry point refuses and says how to get CURVE.
        let e = message(Certificate::generate());
        assert!(e.contains("no CURVE") && e.contains("system-libzmq.toml"), "{e}");
        let pair = Certificate { public: [1; 32], secret: Some([2; 32]) };
        let (public, secret) = pair.save(&dir, "k").unwrap();
        let server = CurveServer::load(&secret.clone().unwrap(), &dir).unwrap();
        assert!(message(ZmqTransport::bind(&free_endpoints(), 1, Some(&server))).contains("no CURVE"));
        let client = CurveClient::load(&public, &secret.unwrap()).unwrap();
        let options = ZmqRankOptions { curve: Some(client.clone()), ..ZmqRankOptions::default() };
        assert!(message(ZmqRankClient::connect("tcp://127.0.0.1:1", 0, 1, options)).contains("no CURVE"));
        let options = ZmqSenderOptions { curve: Some(client), ..ZmqSenderOptions::default() };
        assert!(
            message(ZmqBatchSender::connect("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", options)).contains("no CURVE")
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let (server_keys, rank_keys, orchestrator_keys, stranger_keys) = keys(&dir);
    let transport = ZmqTransport::bind(&free_endpoints(), 1, Some(&server_keys)).unwrap();
    let ep = transport.endpoints().clone();
    let options = ServeOptions {
        packer: PackerOptions { threshold: Some(1), ..PackerOptions::new(64, 1) },
        state_dir: dir.join("state"),
        runs: Vec::new(),
        auto_add: Some(RunConfig { batch_size: 4 }),
        max_steps: None,
        poll: Duration::from_millis(5),
        rejected: stowplan::serve::RejectedLimits::default(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let server = std::thread::spawn(move || {
        let mut server = Server::open(Kernel::native(), transport, options).unwrap();
        server.run(&flag, |_| {}).unwrap()
    });

    // Without keys, or with keys the packer does not list, nothing gets through: no receipt,
    // no step, and the timeout says what to check.
    let plain = ZmqSenderOptions { resend_after: Duration::from_secs(60), ..ZmqSenderOptions::default() };
    let mut intruder = ZmqBatchSender::connect(&ep.batches, &ep.receipts, plain).unwrap();
    intruder.send(&batch(7)).unwrap();
    assert!(matches!(intruder.flush(Duration::from_secs(2)), Err(Error::Timeout(_))), "a plain sender got a receipt");
    let options = ZmqRankOptions { curve: Some(stranger_keys), ..ZmqRankOptions::default() };
    let stranger = ZmqRankClient::connect(&ep.ranks, 0, 1, options).unwrap();

    // The listed orchestrator and rank: every sample once, over encrypted connections.
    // (A packer started without a checkpoint takes messages once an admitted rank said hello.)
    let options = ZmqRankOptions { curve: Some(rank_keys), ..ZmqRankOptions::default() };
    let rank = ZmqRankClient::connect(&ep.ranks, 0, 1, options).unwrap();
    let options = ZmqSenderOptions { curve: Some(orchestrator_keys), ..ZmqSenderOptions::default() };
    let mut orchestrator = ZmqBatchSender::connect(&ep.batches, &ep.receipts, options).unwrap();
    // Heard from first: a receipt published before the subscription reached the packer is
    // lost (ZeroMQ's slow joiner) and the batch resent as a duplicate, which `batches` counts.
    let deadline = Instant::now() + Duration::from_secs(30);
    while orchestrator.incarnation().is_none() {
        assert!(Instant::now() < deadline, "no heartbeat from the packer within 30 s");
        orchestrator.poll(Duration::from_millis(100)).unwrap();
    }
    orchestrator.send(&batch(0)).unwrap();
    orchestrator.flush(Duration::from_secs(20)).unwrap();
    let step = rank.receive(Duration::from_secs(20)).unwrap();
    let mut keys: Vec<u32> = step.keys.iter().map(|k| k.index).collect();
    keys.sort_unstable();
    assert_eq!((step.step, keys), (0, vec![0, 1, 2, 3]));
    assert!(step.keys.iter().all(|k| k.step == 0), "the intruder's batch (step 7) was never taken");

    let e = stranger.receive(Duration::from_millis(500)).unwrap_err().to_string();
    assert!(e.contains("clients directory holds this client's public key"), "{e}");
    drop((stranger, rank, intruder, orchestrator));
    stop.store(true, Ordering::SeqCst);
    let summary = server.join().unwrap();
    assert_eq!((summary.batches, summary.samples), (1, 4), "only the admitted orchestrator's batch arrived");
    let _ = std::fs::remove_dir_all(&dir);
}
