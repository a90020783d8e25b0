//! The rollout data source with a buffer (the rollout buffer contract): groups and indices, epochs with the
//! seeded shuffle on both kernels, buffer-first draws through filters whose results are
//! validated, add_samples validation, and save/load including the buffer.

use proptest::prelude::*;
use serde_json::json;
use stowplan::{
    DataSource, Error, FilterError, Kernel,
    source::{BufferFilter, BufferView, DataSourceOptions, FilterContext, Group, Status},
};

fn records(n: usize) -> Vec<serde_json::Value> {
    (0..n).map(|i| json!({"prompt": format!("question {i}"), "label": i.to_string(), "metadata": {"row": i}})).collect()
}

fn source(n: usize, k: u32, shuffle: bool, kernel: Kernel) -> DataSource {
    let options = DataSourceOptions { shuffle, seed: 7, ..DataSourceOptions::new(k) };
    DataSource::from_records(records(n), "test-dataset", options, kernel).expect("data source")
}

fn rows(groups: &[Group]) -> Vec<u32> {
    groups.iter().map(|g| g[0].prompt_index).collect()
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("stowplan-ds-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

#[test]
fn groups_get_consecutive_indices_and_the_record_fields() {
    let dir = temp_dir("jsonl");
    let path = dir.join("prompts.jsonl");
    std::fs::write(
        &path,
        "{\"q\": \"2+2?\", \"answer\": 4, \"meta\": {\"src\": \"gsm\"}}\n\n{\"q\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n",
    )
    .unwrap();
    let options = DataSourceOptions {
        input_key: "q".into(),
        label_key: Some("answer".into()),
        metadata_key: Some("meta".into()),
        ..DataSourceOptions::new(3)
    };
    let mut ds = DataSource::from_jsonl(&path, options.clone(), Kernel::native()).unwrap();
    assert_eq!(ds.len(), 2);
    assert!(ds.identity().starts_with("sha256:"));
    let g = ds.get_samples(2, None, None).unwrap();
    assert_eq!(g.len(), 2);
    let indices: Vec<u64> = g.iter().flatten().map(|s| s.index).collect();
    assert_eq!(indices, [0, 1, 2, 3, 4, 5]);
    assert_eq!(g[0][0].prompt, "\"2+2?\"");
    assert_eq!(g[0][2].label.as_deref(), Some("4"));
    assert_eq!(g[0][1].metadata, "{\"src\":\"gsm\"}");
    assert_eq!(g[1][0].prompt, "[{\"content\":\"hi\",\"role\":\"user\"}]");
    assert_eq!((g[1][0].label.clone(), g[1][0].metadata.as_str()), (None, "{}"));
    assert!(g.iter().flatten().all(|s| s.status == Status::Pending));
    assert_eq!(g[1].iter().map(|s| s.group).collect::<Vec<_>>(), [1, 1, 1]);
    // Bad records name the line.
    std::fs::write(&path, "{\"q\": \"a\"}\n[1]\n").unwrap();
    let e = DataSource::from_jsonl(&path, options.clone(), Kernel::native()).unwrap_err();
    assert!(e.to_string().contains("record 2: not a JSON object"), "{e}");
    std::fs::write(&path, "{\"prompt\": \"a\"}\n").unwrap();
    let e = DataSource::from_jsonl(&path, options.clone(), Kernel::native()).unwrap_err();
    assert!(e.to_string().contains("record 1: no prompt under input_key \"q\""), "{e}");
    std::fs::write(&path, "{\"q\": \"a\"}\n{oops\n").unwrap();
    let e = DataSource::from_jsonl(&path, options.clone(), Kernel::native()).unwrap_err();
    assert!(e.to_string().contains("line 2: not a JSON record"), "{e}");
    let e = DataSource::from_jsonl(&dir.join("missing.jsonl"), options, Kernel::native()).unwrap_err();
    assert_eq!(e.kind(), "io");
    let e = DataSource::from_records(records(3), "x", DataSourceOptions::new(0), Kernel::native()).unwrap_err();
    assert!(e.to_string().contains("n_samples_per_prompt must be at least 1"), "{e}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn epochs_wrap_around_with_the_seeded_shuffle_on_both_kernels() {
    // The documented PRNG, pinned: (n = 10, seed 42, epoch 0 and 1), values computed by an
    // independent Python implementation of the algorithm as `wit/kernel.wit` describes it.
    assert_eq!(stowplan_kernel_permutation(10, 42, 0), [8, 3, 6, 5, 4, 0, 9, 2, 1, 7]);
    assert_eq!(stowplan_kernel_permutation(10, 42, 1), [6, 7, 4, 3, 9, 5, 0, 8, 2, 1]);
    let mut a = source(10, 2, true, Kernel::native());
    let mut b = source(10, 2, true, Kernel::wasm().unwrap());
    let (ga, gb) = (a.get_samples(25, None, None).unwrap(), b.get_samples(25, None, None).unwrap());
    assert_eq!(ga, gb, "native and WASM shuffles agree");
    assert_eq!((a.epoch(), a.offset()), (2, 5));
    let r = rows(&ga);
    for epoch in r.chunks(10).take(2) {
        let mut sorted = epoch.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..10).collect::<Vec<_>>(), "every prompt once per epoch");
    }
    assert_ne!(r[..10], r[10..20], "each epoch has its own order");
    // Unshuffled: dataset order, wrapping.
    let mut plain = source(4, 1, false, Kernel::native());
    assert_eq!(rows(&plain.get_samples(6, None, None).unwrap()), [0, 1, 2, 3, 0, 1]);
    let mut empty = DataSource::from_records(vec![], "e", DataSourceOptions::new(1), Kernel::native()).unwrap();
    assert_eq!(empty.get_samples(1, None, None).unwrap_err().kind(), "infeasible");
    assert!(empty.get_samples(0, None, None).unwrap().is_empty());
    // A request the buffer cannot fill and the dataset cannot top up takes nothing.
    empty.add_samples(plain.get_samples(1, None, None).unwrap()).unwrap();
    assert_eq!(empty.get_samples(2, None, None).unwrap_err().kind(), "infeasible");
    assert_eq!(empty.buffer_len(), 1);
    assert_eq!(empty.get_samples(1, None, None).unwrap().len(), 1);
}

fn stowplan_kernel_permutation(n: u64, seed: u64, epoch: u64) -> Vec<u32> {
    let opts = DataSourceOptions { shuffle: true, seed, ..DataSourceOptions::new(1) };
    // The first epoch order through a data source with n prompts, epoch by epoch.
    let mut ds = DataSource::from_records(records(n as usize), "p", opts, Kernel::wasm().unwrap()).unwrap();
    let all = ds.get_samples((n * (epoch + 1)) as usize, None, None).unwrap();
    rows(&all[(n * epoch) as usize..])
}

/// A filter returning a fixed selection (or failing).
struct Fixed(Result<Vec<u32>, Error>);

impl BufferFilter for Fixed {
    fn select(&mut self, _: &FilterContext, _: BufferView<'_>) -> Result<Vec<u32>, Error> {
        self.0.clone()
    }
}

#[test]
fn the_buffer_comes_first_through_the_filter_and_bad_selections_take_nothing() {
    let mut ds = source(20, 2, false, Kernel::native());
    let mut first = ds.get_samples(5, None, None).unwrap();
    for (j, g) in first.iter_mut().enumerate() {
        for s in g.iter_mut() {
            s.rewards = vec![j as f64];
            s.status = Status::Aborted;
        }
    }
    ds.add_samples(first.clone()).unwrap();
    assert_eq!(ds.buffer_len(), 5);
    // FIFO (default): the two oldest, then nothing from the dataset.
    let got = ds.get_samples(2, Some(3), None).unwrap();
    assert_eq!(got, first[..2].to_vec());
    // A filter picking groups 2 then 0 of the remaining [2, 3, 4] → [4, 2].
    let got = ds.get_samples(4, Some(4), Some(&mut Fixed(Ok(vec![2, 0])))).unwrap();
    assert_eq!(rows(&got[..2]), [4, 2]);
    assert_eq!(rows(&got[2..]), [5, 6], "the rest comes from the dataset");
    assert_eq!(rows(ds.buffer()), [3]);
    // Invalid selections: typed errors, buffer untouched, dataset cursor untouched.
    let before = (ds.buffer().to_vec(), ds.offset(), ds.next_index());
    for (bad, message) in [(vec![1], "index 1 at position 0; the buffer holds 1 groups"), (vec![0, 0], "index 0 twice")]
    {
        let e = ds.get_samples(2, None, Some(&mut Fixed(Ok(bad)))).unwrap_err();
        assert_eq!(e.kind(), "filter");
        assert!(e.to_string().contains(message), "{e}");
    }
    ds.add_samples(first[..2].to_vec()).unwrap();
    let e = ds.get_samples(1, None, Some(&mut Fixed(Ok(vec![0, 1])))).unwrap_err();
    assert!(e.to_string().contains("returned 2 groups; at most 1"), "{e}");
    let e = ds
        .get_samples(1, None, Some(&mut Fixed(Err(Error::Filter(FilterError::Trap("plugin trapped".into()))))))
        .unwrap_err();
    assert!(e.to_string().contains("plugin trapped"));
    assert_eq!(ds.buffer_len(), 3);
    assert_eq!(ds.buffer()[0], before.0[0]);
    assert_eq!((ds.offset(), ds.next_index()), (before.1, before.2));
}

#[test]
fn add_samples_validates_every_group_before_adding_any() {
    let mut ds = source(4, 3, false, Kernel::native());
    let groups = ds.get_samples(2, None, None).unwrap();
    let mut short = groups.clone();
    short[1].pop();
    let e = ds.add_samples(short).unwrap_err();
    assert!(e.to_string().contains("groups[1] has 2 samples; every group must have n_samples_per_prompt = 3"), "{e}");
    let mut nan = groups.clone();
    nan[0][2].rewards = vec![f64::NAN];
    assert!(ds.add_samples(nan).unwrap_err().to_string().contains("groups[0][2].rewards"));
    let mut meta = groups.clone();
    meta[1][0].metadata = "[1]".into();
    assert!(ds.add_samples(meta).unwrap_err().to_string().contains("groups[1][0].metadata"));
    assert_eq!(ds.buffer_len(), 0, "nothing added on error");
    ds.add_samples(groups).unwrap();
    assert_eq!(ds.buffer_len(), 2);
}

#[test]
fn save_and_load_resume_the_identical_sequence_including_the_buffer() {
    let dir = temp_dir("state");
    let path = dir.join("rollout/state_12.spds");
    let mut ds = source(7, 2, true, Kernel::wasm().unwrap());
    let mut drawn = ds.get_samples(9, None, None).unwrap();
    drawn[0][1].payload = vec![1, 2, 3];
    drawn[0][1].rewards = vec![0.5, 1.0];
    ds.add_samples(drawn[..3].to_vec()).unwrap();
    let mut meta = serde_json::Map::new();
    meta.insert("step".into(), json!(12));
    ds.update_metadata(meta);
    ds.save(&path).unwrap();
    let continued = ds.get_samples(11, None, None).unwrap();
    // A fresh process: same dataset and options, state loaded — not when the caller's check
    // of the saved buffer refuses it (nothing applied then).
    let mut resumed = source(7, 2, true, Kernel::native());
    let refused = resumed.load_checked(&path, |buffer| {
        assert_eq!(buffer[0][1].payload, vec![1, 2, 3], "the check sees the saved buffer");
        Err(Error::InvalidArgument("no".into()))
    });
    assert_eq!(refused.unwrap_err().to_string(), "invalid argument: no");
    assert_eq!((resumed.buffer_len(), resumed.metadata().get("step")), (0, None), "nothing applied");
    resumed.load(&path).unwrap();
    assert_eq!(resumed.buffer_len(), 3);
    assert_eq!(resumed.metadata()["step"], 12);
    assert_eq!(resumed.get_samples(11, None, None).unwrap(), continued);
    // Errors: missing, damaged, foreign.
    let mut other = source(7, 2, true, Kernel::native());
    assert_eq!(other.load(&dir.join("none.spds")).unwrap_err().kind(), "io");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[10] ^= 0xff;
    let damaged = dir.join("damaged.spds");
    std::fs::write(&damaged, &bytes).unwrap();
    let e = other.load(&damaged).unwrap_err();
    assert!(e.to_string().contains("damaged data source state"), "{e}");
    let mut seed = DataSource::from_records(
        records(7),
        "test-dataset",
        DataSourceOptions { shuffle: true, seed: 8, ..DataSourceOptions::new(2) },
        Kernel::native(),
    )
    .unwrap();
    let e = seed.load(&path).unwrap_err();
    assert!(e.to_string().contains("shuffle/seed true/7 vs true/8"), "{e}");
    let mut bigger = source(8, 2, true, Kernel::native());
    assert!(bigger.load(&path).unwrap_err().to_string().contains("(7 prompts) vs test-dataset (8 prompts)"));
    assert_eq!(other.next_index(), 0, "a failed load changes nothing");
    let _ = std::fs::remove_dir_all(dir);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any interleaving of draws and put-backs: every sample index is issued once, groups are
    /// consecutive, and every prompt is drawn exactly once per completed epoch.
    #[test]
    fn draws_issue_each_index_once_and_cover_every_epoch(
        n in 1usize..12,
        k in 1u32..4,
        ops in prop::collection::vec((0usize..6, any::<bool>()), 1..20),
    ) {
        let mut ds = source(n, k, true, Kernel::native());
        let mut issued = Vec::new();
        let mut fresh_rows = Vec::new();
        for (want, put_back) in ops {
            let got = ds.get_samples(want, None, None).unwrap();
            prop_assert_eq!(got.len(), want);
            for g in &got {
                prop_assert_eq!(g.len(), k as usize);
                prop_assert!(g.windows(2).all(|w| w[1].index == w[0].index + 1));
                if !issued.contains(&g[0].index) {
                    fresh_rows.push(g[0].prompt_index);
                    issued.extend(g.iter().map(|s| s.index));
                }
            }
            if put_back {
                ds.add_samples(got).unwrap();
            }
        }
        let mut sorted = issued.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..issued.len() as u64).collect::<Vec<_>>());
        for epoch in fresh_rows.chunks(n).filter(|c| c.len() == n) {
            let mut e = epoch.to_vec();
            e.sort_unstable();
            prop_assert_eq!(e, (0..n as u32).collect::<Vec<_>>());
        }
    }
}
