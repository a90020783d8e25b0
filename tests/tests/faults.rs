//! Fault campaigns on the framed formats: every single-bit flip, and every
//! truncation, of a realistic encoding of each persisted or transported kind — the packer
//! checkpoint (`state.bin`), a spooled training batch, a rank batch, a micro-batch, the
//! protocol messages, the length cache, a data source's saved state and the streaming
//! packer's state — is refused. Nothing damaged decodes, so nothing damaged
//! is delivered. The counts are printed (`cargo test --test faults -- --nocapture`) and
//! recorded in BENCHMARKS.md.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use stowplan::serve::{Control, ControlMessage, DeliveryMark, Message, RankMessage, Receipt, Receipts, Refusal};
use stowplan::{
    DataSource, Kernel, Packer, PackerOptions, TrainingBatch, TrainingSample,
    packer::{PackerState, RankBatch, RunConfig},
    plan::length_cache::LengthCache,
    source::DataSourceOptions,
};

/// A training batch of `n` samples with every optional field set.
fn batch(run: u32, step: u64, n: usize) -> TrainingBatch {
    TrainingBatch {
        run,
        step,
        temperature: 0.7,
        samples: (0..n)
            .map(|i| {
                let len = 3 + i % 7;
                TrainingSample {
                    prompt_ids: vec![11, 12],
                    completion_ids: (0..len as i64).map(|t| 100 + t).collect(),
                    completion_logprobs: Some(vec![-0.25; len]),
                    advantage: i as f32 - 1.5,
                    ..TrainingSample::default()
                }
            })
            .collect(),
    }
}

/// Flips every bit of `bytes` and truncates it at every length; returns (damaged copies
/// tried, copies refused).
fn campaign(bytes: &[u8], decodes: impl Fn(&[u8]) -> bool) -> (usize, usize) {
    assert!(decodes(bytes), "the undamaged encoding decodes");
    let (mut tried, mut refused) = (0, 0);
    let mut damaged = bytes.to_vec();
    for bit in 0..bytes.len() * 8 {
        damaged[bit / 8] ^= 1 << (bit % 8);
        tried += 1;
        refused += usize::from(!decodes(&damaged));
        damaged[bit / 8] ^= 1 << (bit % 8);
    }
    for len in 0..bytes.len() {
        tried += 1;
        refused += usize::from(!decodes(&bytes[..len]));
    }
    (tried, refused)
}

#[test]
fn every_flipped_bit_and_truncation_of_every_format_is_refused() {
    let mut packer = Packer::new(Kernel::native(), PackerOptions::new(64, 2)).unwrap();
    packer.add_run(0, RunConfig { batch_size: 4 }).unwrap();
    let spooled = batch(0, 0, 12);
    packer.ingest(Arc::new(spooled.clone()));
    let step = packer.pack(true).unwrap().expect("a step");
    // A checkpoint with a step in flight and samples pending.
    packer.ingest(Arc::new(batch(0, 1, 9)));
    let state = packer.state();
    let micro = step.ranks[0].micro_batches[0].clone();
    let cases: Vec<(&str, Vec<u8>, Box<dyn Fn(&[u8]) -> bool>)> = vec![
        ("packer state (state.bin)", state.encode().unwrap(), Box::new(|b| PackerState::decode(b).is_ok())),
        ("spooled training batch", spooled.encode().unwrap(), Box::new(|b| TrainingBatch::decode(b).is_ok())),
        ("rank batch (rank_R.bin)", step.ranks[1].encode().unwrap(), Box::new(|b| RankBatch::decode(b).is_ok())),
        (
            "micro-batch",
            micro.encode().unwrap(),
            Box::new(|b| stowplan::materialize::MaterializedBatch::decode(b).is_ok()),
        ),
        (
            "control message",
            ControlMessage::new(Control::AddRun { run: 3, config: RunConfig { batch_size: 8 } }).encode().unwrap(),
            Box::new(|b| Message::decode(b).is_ok()),
        ),
        (
            "rank hello",
            RankMessage::Hello { rank: 1, dp: 4, next_step: 9 }.encode().unwrap(),
            Box::new(|b| RankMessage::decode(b).is_ok()),
        ),
        (
            "receipts",
            Receipts {
                incarnation: 77,
                receipts: vec![Receipt::Batch { run: 0, step: 1, accepted: 10, rejected: 2, duplicate: false }],
            }
            .encode()
            .unwrap(),
            Box::new(|b| Receipts::decode(b).is_ok()),
        ),
        (
            "refusal",
            Refusal { message: "dp 4, this packer serves 2".into() }.encode().unwrap(),
            Box::new(|b| Refusal::decode(b).is_ok()),
        ),
        (
            "delivery mark (delivered.bin)",
            DeliveryMark { next_step: 12_345 }.encode().unwrap(),
            Box::new(|b| DeliveryMark::decode(b).is_ok()),
        ),
    ];
    // The two files read from a path: the length cache and a data source's saved state. Each
    // damaged copy is written to a file and loaded.
    let dir = std::env::temp_dir().join(format!("stowplan-faults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = serde_json::json!({"max_length": 512});
    let mut cache = LengthCache::open(&dir, "data.jsonl", 40, &config, None).unwrap();
    cache.precompute(1, |i| Ok(10 + i as u64)).unwrap();
    let cache_bytes = std::fs::read(dir.join(stowplan::plan::length_cache::FILE_NAME)).unwrap();
    let records: Vec<serde_json::Value> = (0..5).map(|i| serde_json::json!({"prompt": format!("q{i}")})).collect();
    let options = DataSourceOptions::new(2);
    let mut source = DataSource::from_records(records.clone(), "faults", options.clone(), Kernel::native()).unwrap();
    source.get_samples(2, None, None).unwrap();
    let state_path = dir.join("state.spds");
    source.save(&state_path).unwrap();
    let state_bytes = std::fs::read(&state_path).unwrap();
    let damaged = dir.join("damaged");
    let dir2 = dir.clone();
    let cases: Vec<(&str, Vec<u8>, Box<dyn Fn(&[u8]) -> bool>)> = cases
        .into_iter()
        .chain([
            (
                "length cache (lengths.splc)",
                cache_bytes,
                Box::new(move |b: &[u8]| {
                    let d = dir2.join("cache");
                    std::fs::create_dir_all(&d).unwrap();
                    std::fs::write(d.join(stowplan::plan::length_cache::FILE_NAME), b).unwrap();
                    LengthCache::open(&d, "data.jsonl", 40, &serde_json::json!({"max_length": 512}), None).is_ok()
                }) as Box<dyn Fn(&[u8]) -> bool>,
            ),
            (
                "data source state",
                state_bytes,
                Box::new(move |b: &[u8]| {
                    std::fs::write(&damaged, b).unwrap();
                    let mut fresh =
                        DataSource::from_records(records.clone(), "faults", options.clone(), Kernel::native()).unwrap();
                    fresh.load(&damaged).is_ok()
                }),
            ),
        ])
        .collect();
    // The streaming packer's state (SPSK, the kernel's own framing with a sha256): a packer
    // holding buffered items and open bins, restored through the WASM component.
    let mut stream = Kernel::native()
        .stream_packer(&stowplan::kernel::StreamOptions {
            max_open_bins: 3,
            max_buffered: 4,
            ..stowplan::kernel::StreamOptions::new(100)
        })
        .unwrap();
    stream.add(&[30, 70, 45, 10, 5, 60, 25, 90]).unwrap();
    let stream_state = stream.state().unwrap();
    let wasm = Kernel::wasm().unwrap();
    let cases: Vec<(&str, Vec<u8>, Box<dyn Fn(&[u8]) -> bool>)> = cases
        .into_iter()
        .chain([(
            "stream packer state (SPSK)",
            stream_state,
            Box::new(move |b: &[u8]| wasm.stream_packer_from_state(b).is_ok()) as Box<dyn Fn(&[u8]) -> bool>,
        )])
        .collect();
    let (mut all_tried, mut all_refused) = (0, 0);
    for (what, bytes, decodes) in &cases {
        let (tried, refused) = campaign(bytes, decodes);
        println!(
            "{what}: {} bytes, {tried} damaged copies, {refused} refused, {} accepted",
            bytes.len(),
            tried - refused
        );
        assert_eq!(refused, tried, "{what}: a damaged copy decoded");
        all_tried += tried;
        all_refused += refused;
    }
    println!("all formats: {all_tried} damaged copies, {all_refused} refused, 0 accepted");
    let _ = std::fs::remove_dir_all(&dir);
}
