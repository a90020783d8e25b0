//! Buffer-filter plugins in the sandbox: the example plugins of `plugins/dist/`
//! against native references, the hostile fixture against every bound, and a data source
//! that keeps serving, with nothing lost from its buffer, after each hostile call.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::json;
use stowplan::{
    DataSource, Error, Filter, FilterError, Kernel,
    filter::{FilterOptions, OnFailure},
    source::{
        BufferColumns, BufferFilter, BufferView, DataSourceOptions, FilterContext, Group, PopFirst, Status,
        synthetic_buffer,
    },
};

fn dist(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../plugins/dist").join(file)
}

fn sha(file: &str) -> String {
    stowplan::runtime::sha256_hex(&std::fs::read(dist(file)).expect("plugins/dist is committed"))
}

fn options(file: &str, config: serde_json::Value) -> FilterOptions {
    FilterOptions { config: config.to_string(), ..FilterOptions::new(&sha(file)) }
}

fn load(file: &str, options: FilterOptions) -> Filter {
    Filter::load(&dist(file), options).expect("plugin loads")
}

fn hostile(mode: &str, tweak: impl FnOnce(&mut FilterOptions)) -> Filter {
    let mut o = options("hostile.wasm", json!({ "mode": mode }));
    tweak(&mut o);
    load("hostile.wasm", o)
}

/// A buffer as a data source holds it: groups and their columns.
struct Buf {
    groups: Vec<Group>,
    columns: BufferColumns,
}

impl Buf {
    fn view(&self) -> BufferView<'_> {
        BufferView { groups: &self.groups, columns: &self.columns }
    }
}

/// `groups` groups of `k` samples with one reward each (group `g`, sample `j`): the host's
/// synthetic buffer with this file's rewards, labels (even samples), metadata and lengths.
fn buffer(groups: usize, k: usize, reward: impl Fn(usize, usize) -> Option<f64>) -> Buf {
    let mut groups = synthetic_buffer(groups, k, 0);
    for (g, group) in groups.iter_mut().enumerate() {
        for (j, s) in group.iter_mut().enumerate() {
            s.prompt = "\"p\"".into();
            s.label = (j % 2 == 0).then(|| format!("label {g}"));
            s.metadata = format!("{{\"g\":{g}}}");
            s.prompt_length = 10;
            s.response_length = (g * 7 + j) as u32;
            s.rewards = reward(g, j).into_iter().collect();
        }
    }
    let columns = BufferColumns::from_groups(&groups);
    Buf { groups, columns }
}

fn ctx(wanted: u32, k: u32) -> FilterContext {
    FilterContext { rollout_id: Some(3), wanted, n_samples_per_prompt: k }
}

#[test]
fn loading_checks_the_pin_the_options_and_the_world() {
    let path = dist("pop_first.wasm");
    let wrong = "0".repeat(64);
    let e = Filter::load(&path, FilterOptions::new(&wrong)).unwrap_err();
    assert!(matches!(&e, Error::Filter(FilterError::HashMismatch(m)) if m.contains(&sha("pop_first.wasm"))), "{e}");
    let e = Filter::load(&path, FilterOptions::new("abc")).unwrap_err();
    assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("sha256 must be 64 hex digits")), "{e}");
    // The pin may carry a `sha256:` prefix and upper-case digits.
    let prefixed = format!("sha256:{}", sha("pop_first.wasm").to_uppercase());
    Filter::load(&path, FilterOptions::new(&prefixed)).expect("prefixed pin");
    let base = FilterOptions::new(&sha("pop_first.wasm"));
    for (o, needle) in [
        (FilterOptions { timeout: Duration::ZERO, ..base.clone() }, "timeout must be in 1 ms"),
        (FilterOptions { fuel: Some(5), ..base.clone() }, "fuel must be at least 10000"),
        (FilterOptions { memory_limit: 1000, ..base.clone() }, "memory_limit must be in 1 MiB"),
        (FilterOptions { output_limit: 1 << 30, ..base.clone() }, "output_limit must be at most 16 MiB"),
        (FilterOptions { config: "{nope".into(), ..base.clone() }, "config must be JSON"),
    ] {
        let e = Filter::load(&path, o).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains(needle)), "{needle}: {e}");
    }
    let e = Filter::load(&dist("missing.wasm"), base).unwrap_err();
    assert_eq!(e.kind(), "io");
    // Not a component at all; a component of another world (the kernel).
    let junk = b"\0asm junk".to_vec();
    let e =
        Filter::from_bytes("junk.wasm", &junk, FilterOptions::new(&stowplan::runtime::sha256_hex(&junk))).unwrap_err();
    assert!(matches!(&e, Error::Filter(FilterError::Load(m)) if m.contains("junk.wasm")), "{e}");
    let kernel = stowplan::kernel::KERNEL_WASM;
    let e = Filter::from_bytes("kernel.wasm", kernel, FilterOptions::new(&stowplan::runtime::sha256_hex(kernel)))
        .unwrap_err();
    assert!(matches!(&e, Error::Filter(FilterError::Load(m)) if m.contains("does not export `filter.select`")), "{e}");
}

#[test]
fn plugins_import_only_wasi() {
    for file in ["pop_first.wasm", "top_reward.wasm", "hostile.wasm"] {
        let f = load(file, options(file, json!({})));
        // WASI, and the types-only interface of the filter package itself.
        let allowed = |i: &String| i.starts_with("wasi:") || i == "stowplan:filter/types@0.1.0";
        assert!(f.imports().iter().all(allowed), "{file}: {:?}", f.imports());
        assert_eq!(f.sha256(), sha(file));
    }
}

/// What `top-reward` must return: groups by descending mean of reward `index` (groups without
/// one last), ties in buffer order, groups under `min` left out.
fn top_reward_reference(buffer: &[Group], wanted: u32, index: usize, min: Option<f64>) -> Vec<u32> {
    let mut ranked: Vec<(u32, f64)> = buffer
        .iter()
        .enumerate()
        .map(|(g, group)| {
            let rs: Vec<f64> = group.iter().filter_map(|s| s.rewards.get(index).copied()).collect();
            let mean = if rs.is_empty() { f64::NEG_INFINITY } else { rs.iter().sum::<f64>() / rs.len() as f64 };
            (g as u32, mean)
        })
        .filter(|&(_, m)| min.is_none_or(|min| m >= min))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.into_iter().take(wanted as usize).map(|(g, _)| g).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn example_plugins_match_their_native_references(
        groups in 1usize..40,
        k in 1usize..5,
        wanted in 1u32..50,
        seed in any::<u64>(),
        min in proptest::option::of(-1.0f64..1.0),
    ) {
        let reward = |g: usize, j: usize| {
            let x = (seed ^ (g as u64 * 0x9E37_79B9) ^ (j as u64 * 0x85EB_CA6B)).wrapping_mul(0x2545_F491_4F6C_DD1D);
            (x % 7 != 0).then(|| ((x >> 11) % 2001) as f64 / 1000.0 - 1.0)
        };
        let buf = buffer(groups, k, reward);
        let c = ctx(wanted, k as u32);
        let mut pop = load("pop_first.wasm", options("pop_first.wasm", json!({})));
        prop_assert_eq!(pop.select(&c, buf.view()).unwrap(), PopFirst.select(&c, buf.view()).unwrap());
        let config = match min { Some(m) => json!({ "min_reward": m }), None => json!({}) };
        let mut top = load("top_reward.wasm", options("top_reward.wasm", config));
        prop_assert_eq!(top.select(&c, buf.view()).unwrap(), top_reward_reference(&buf.groups, wanted, 0, min));
    }
}

#[test]
fn top_reward_reads_every_column_it_needs_and_checks_its_config() {
    // Two rewards per sample; rank by the second.
    let mut buf = buffer(5, 3, |g, _| Some(g as f64));
    for (g, group) in buf.groups.iter_mut().enumerate() {
        for s in group {
            s.rewards.push(-(g as f64));
        }
    }
    buf.columns = BufferColumns::from_groups(&buf.groups);
    let mut top = load("top_reward.wasm", options("top_reward.wasm", json!({ "reward_index": 1 })));
    assert_eq!(top.select(&ctx(3, 3), buf.view()).unwrap(), [0, 1, 2]);
    let mut first = load("top_reward.wasm", options("top_reward.wasm", json!({})));
    assert_eq!(first.select(&ctx(3, 3), buf.view()).unwrap(), [4, 3, 2]);
    let mut bad = load("top_reward.wasm", options("top_reward.wasm", json!({ "reward_idx": 1 })));
    let e = bad.try_select(&ctx(3, 3), &buf.columns).unwrap_err();
    assert!(matches!(&e, FilterError::Guest(m) if m.contains("unknown config key \"reward_idx\"")), "{e}");
}

#[test]
fn an_infinite_loop_times_out_within_twice_the_deadline() {
    let buf = buffer(10, 2, |_, _| Some(1.0));
    for timeout_ms in [100u64, 300] {
        let timeout = Duration::from_millis(timeout_ms);
        let mut f = hostile("loop", |o| {
            o.timeout = timeout;
            o.fuel = None;
        });
        let started = Instant::now();
        let e = f.try_select(&ctx(4, 2), &buf.columns).unwrap_err();
        let took = started.elapsed();
        assert_eq!(e.kind(), "timeout", "{e}");
        assert!(took >= timeout && took <= 2 * timeout, "{timeout:?}: stopped after {took:?}");
    }
    // With fuel, the same loop runs out of fuel first.
    let mut f = hostile("loop", |o| {
        o.fuel = Some(50_000_000);
        o.timeout = Duration::from_secs(60);
    });
    let e = f.try_select(&ctx(4, 2), &buf.columns).unwrap_err();
    assert!(matches!(&e, FilterError::OutOfFuel(m) if m.contains("fuel = 50000000")), "{e}");
}

#[test]
fn memory_bombs_hit_the_memory_limit() {
    let buf = buffer(10, 2, |_, _| Some(1.0));
    for mode in ["memory", "huge-result"] {
        let mut f = hostile(mode, |o| o.memory_limit = 32 << 20);
        let e = f.try_select(&ctx(4, 2), &buf.columns).unwrap_err();
        assert!(matches!(&e, FilterError::MemoryLimit(m) if m.contains("memory_limit = 33554432")), "{mode}: {e}");
    }
}

#[test]
fn traps_and_invalid_selections_are_typed_errors() {
    let buf = buffer(6, 2, |_, _| Some(1.0));
    let c = ctx(4, 2);
    let e = hostile("panic", |_| {}).try_select(&c, &buf.columns).unwrap_err();
    assert!(matches!(&e, FilterError::Trap(m) if m.contains("panics on purpose")), "{e}");
    let e = hostile("exit", |_| {}).try_select(&c, &buf.columns).unwrap_err();
    assert!(matches!(&e, FilterError::Trap(m) if m.contains("the plugin called exit(")), "{e}");
    for (mode, needle) in
        [("out-of-range", "index 6 at position 0"), ("duplicate", "index 0 twice"), ("too-many", "at most 4")]
    {
        let e = hostile(mode, |_| {}).try_select(&c, &buf.columns).unwrap_err();
        assert!(matches!(&e, FilterError::InvalidResult(m) if m.contains(needle) && m.contains("hostile.wasm")), "{e}");
    }
}

#[test]
fn output_is_captured_up_to_the_limit_and_sleep_does_not_block() {
    let buf = buffer(6, 2, |_, _| Some(1.0));
    let mut f = hostile("huge-output", |o| o.output_limit = 4096);
    assert_eq!(f.try_select(&ctx(4, 2), &buf.columns).unwrap(), [0, 1, 2, 3]);
    let out = f.last_output();
    assert_eq!(out.iter().map(|(s, _)| *s).collect::<Vec<_>>(), ["stdout", "stderr"]);
    for (_, text) in out {
        assert!(text.starts_with(&"x".repeat(1023)) && text.contains("more bytes dropped: output limit 4096"));
        assert!(text.len() < 4096 + 200, "{}", text.len());
    }
    let started = Instant::now();
    let mut f = hostile("sleep", |_| {});
    assert_eq!(f.try_select(&ctx(2, 2), &buf.columns).unwrap(), [0, 1]);
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn the_sandbox_denies_files_environment_and_network_with_fixed_time_and_randomness() {
    let buf = buffer(2, 1, |_, _| None);
    let probe = |_: ()| match hostile("probe", |_| {}).try_select(&ctx(1, 1), &buf.columns) {
        Err(FilterError::Guest(m)) => m,
        other => panic!("probe: {other:?}"),
    };
    let seen = probe(());
    for needle in ["file=denied", "dir=denied", "env=0", "args=0", "wall_ns=0", "slept_ns=0", "net=denied"] {
        assert!(seen.contains(needle), "{needle} not in {seen}");
    }
    // Randomness is seeded with a constant: a fresh instance sees the same bytes.
    assert_eq!(seen, probe(()));
}

#[test]
fn an_instance_is_reused_until_it_traps_then_replaced() {
    let buf = buffer(3, 1, |_, _| None);
    let mut f = hostile("count", |_| {});
    let mut seen = Vec::new();
    for _ in 0..6 {
        seen.push(match f.try_select(&ctx(1, 1), &buf.columns) {
            Err(FilterError::Guest(m)) => m.rsplit(": ").next().unwrap_or_default().to_string(),
            Err(FilterError::Trap(_)) => "trap".to_string(),
            other => panic!("{other:?}"),
        });
    }
    assert_eq!(seen, ["call 1", "call 2", "trap", "call 1", "call 2", "trap"]);
    let stats = f.stats();
    assert_eq!((stats.calls, stats.failures, stats.instances), (6, 6, 2));
}

#[test]
fn fallback_serves_fifo_with_a_warning_instead_of_failing() {
    let buf = buffer(5, 2, |_, _| Some(1.0));
    let mut f = hostile("loop", |o| {
        o.timeout = Duration::from_millis(20);
        o.on_failure = OnFailure::Fallback;
    });
    assert_eq!(f.select(&ctx(3, 2), buf.view()).unwrap(), [0, 1, 2]);
    let mut g = hostile("duplicate", |o| o.on_failure = OnFailure::Fallback);
    assert_eq!(g.select(&ctx(2, 2), buf.view()).unwrap(), [0, 1]);
    assert_eq!((f.stats().fallbacks, g.stats().fallbacks), (1, 1));
    assert_eq!("fallback".parse::<OnFailure>().unwrap(), OnFailure::Fallback);
    assert!(matches!("never".parse::<OnFailure>(), Err(Error::InvalidArgument(m)) if m.contains("on_failure")));
}

/// Must show: after an infinite loop and a memory bomb, the same data source keeps serving,
/// with nothing lost from its buffer.
#[test]
fn a_data_source_keeps_serving_after_hostile_plugins_with_nothing_lost() {
    let records: Vec<_> = (0..50).map(|i| json!({ "prompt": format!("q{i}") })).collect();
    let mut ds = DataSource::from_records(records, "hostile", DataSourceOptions::new(4), Kernel::native()).unwrap();
    let mut groups = ds.get_samples(6, Some(0), None).unwrap();
    for (g, group) in groups.iter_mut().enumerate() {
        for s in group.iter_mut() {
            s.rewards = vec![g as f64];
            s.status = Status::Completed;
        }
    }
    ds.add_samples(groups.clone()).unwrap();
    let before = ds.buffer().to_vec();
    let next_index = ds.next_index();
    let timeout = Duration::from_millis(100);
    let mut looping = hostile("loop", |o| {
        o.timeout = timeout;
        o.fuel = None;
    });
    let started = Instant::now();
    let e = ds.get_samples(3, Some(1), Some(&mut looping)).unwrap_err();
    // Without the deadline the loop never ends; how close to it the call stops is
    // `an_infinite_loop_times_out_within_twice_the_deadline`'s business.
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    assert!(matches!(e, Error::Filter(FilterError::Timeout(_))), "{e}");
    assert_eq!((ds.buffer(), ds.next_index()), (before.as_slice(), next_index));
    let mut bomb = hostile("memory", |o| o.memory_limit = 32 << 20);
    let e = ds.get_samples(3, Some(1), Some(&mut bomb)).unwrap_err();
    assert!(matches!(e, Error::Filter(FilterError::MemoryLimit(_))), "{e}");
    assert_eq!((ds.buffer(), ds.next_index()), (before.as_slice(), next_index));
    // The same filters again: a fresh instance, the same typed errors, still nothing lost.
    assert!(ds.get_samples(3, Some(1), Some(&mut looping)).is_err());
    assert_eq!(ds.buffer(), before.as_slice());
    // And the data source serves: top-reward takes the best groups, then the rest, then the
    // dataset.
    let mut top = load("top_reward.wasm", options("top_reward.wasm", json!({})));
    let got = ds.get_samples(2, Some(2), Some(&mut top)).unwrap();
    assert_eq!(got, [groups[5].clone(), groups[4].clone()]);
    let mut fifo = load("pop_first.wasm", options("pop_first.wasm", json!({})));
    let got = ds.get_samples(6, Some(3), Some(&mut fifo)).unwrap();
    assert_eq!(&got[..4], &groups[..4]);
    assert_eq!(got[4][0].index, next_index);
    assert_eq!(ds.buffer_len(), 0);
}
