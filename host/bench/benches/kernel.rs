//! Criterion benchmarks of the kernel on the shared workloads, WASM vs native.
//!
//! Run: `cargo bench -p stowplan-bench --bench kernel` (workloads from `../shared/workloads`, or
//! `$STOWPLAN_WORKLOADS`). Before timing, each case prints its quality figures (largest
//! group vs lower bound, spread, bins vs lower bound) so BENCHMARKS.md can quote both.

use std::path::PathBuf;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use stowplan::{
    Kernel, MaterializeOptions, StaticPackPlan,
    kernel::{
        Cost, DpOptions, MicroOptions, OversizePolicy, PackMethod, PackOptions, PartitionMethod, PartitionOptions,
        PlanOptions,
    },
    materialize::{Sample, Temperature},
    peers::VerlMicroOptions,
    plan::length_cache::LengthCache,
};

fn workload(name: &str, take: usize) -> Vec<u64> {
    let dir = std::env::var_os("STOWPLAN_WORKLOADS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/workloads"));
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut v = stowplan::input::parse_lengths(&text).expect("workload parses");
    v.truncate(take);
    v
}

fn kernels() -> [(&'static str, Kernel); 2] {
    [("wasm", Kernel::wasm().expect("WASM kernel")), ("native", Kernel::native())]
}

fn partition_cases(c: &mut Criterion) {
    let cases: [(&str, usize, u32, PartitionOptions); 4] = [
        ("unequal_262144_k1024", 262_144, 1024, PartitionOptions::default()),
        ("unequal_16384_k64", 16_384, 64, PartitionOptions::default()),
        ("equal_16384_k64", 16_384, 64, PartitionOptions { equal_size: true, ..Default::default() }),
        (
            "verl_unequal_16384_k64",
            16_384,
            64,
            PartitionOptions { method: PartitionMethod::Verl, refine: false, equal_size: false },
        ),
    ];
    let mut g = c.benchmark_group("partition/pretrain-docs-1m");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(4));
    for (name, n, k, opts) in cases {
        let weights = workload("pretrain-docs-1m.txt", n);
        for (backend, kernel) in kernels() {
            let p = kernel.partition(&weights, k, &opts).expect("partition");
            eprintln!(
                "quality {name} [{backend}]: largest {} lower bound {} (+{}), spread {}",
                p.max_sum(),
                p.lower_bound,
                p.max_sum() - p.lower_bound,
                p.spread
            );
            g.bench_with_input(BenchmarkId::new(name, backend), &weights, |b, w| {
                b.iter(|| kernel.partition(w, k, &opts).expect("partition"))
            });
        }
    }
    g.finish();
}

fn pack_cases(c: &mut Criterion) {
    let lengths = workload("pretrain-docs-1m.txt", usize::MAX);
    let rl = workload("rl-math-8k.txt", usize::MAX);
    let mut g = c.benchmark_group("pack");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
    for (method, label) in [(PackMethod::Bfd, "bfd"), (PackMethod::Ffd, "ffd"), (PackMethod::NextFit, "next-fit")] {
        let opts = PackOptions { method, oversize: OversizePolicy::Single, ..PackOptions::new(32_768) };
        for (backend, kernel) in kernels() {
            let p = kernel.pack(&lengths, &opts).expect("pack");
            let regular = p.bins() - p.single.len();
            eprintln!(
                "quality pack {label} 1m cap 32768 [{backend}]: {} regular bins, lower bound {} (+{:.3}%), {} single",
                regular,
                p.lower_bound,
                100.0 * (regular as f64 - p.lower_bound as f64) / p.lower_bound as f64,
                p.single.len()
            );
            g.bench_with_input(
                BenchmarkId::new(format!("{label}_pretrain-docs-1m_cap32768"), backend),
                &lengths,
                |b, l| b.iter(|| kernel.pack(l, &opts).expect("pack")),
            );
        }
    }
    let opts = PackOptions::new(16_384);
    for (backend, kernel) in kernels() {
        g.bench_with_input(BenchmarkId::new("bfd_rl-math-8k_cap16384", backend), &rl, |b, l| {
            b.iter(|| kernel.pack(l, &opts).expect("pack"))
        });
    }
    g.finish();
}

fn balance_cases(c: &mut Criterion) {
    let rl = workload("rl-math-8k.txt", usize::MAX);
    let mut g = c.benchmark_group("balance/rl-math-8k");
    g.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(4));
    let micro = MicroOptions::new(16_384);
    let attention = DpOptions { cost: Cost::ATTENTION, ..DpOptions::default() };
    let two_level = MicroOptions { cost: Cost::ATTENTION, ..micro };
    for (backend, kernel) in kernels() {
        let p = kernel.micro_batches(&rl, None, None, &micro).map(|p| p.plan).expect("micro_batches");
        eprintln!(
            "quality micro_batches cap 16384 [{backend}]: {} micro-batches, lower bound {}, largest {} tokens",
            p.count(),
            p.lower_bound,
            p.tokens.iter().max().unwrap_or(&0)
        );
        g.bench_with_input(BenchmarkId::new("micro_batches_cap16384", backend), &rl, |b, l| {
            b.iter(|| kernel.micro_batches(l, None, None, &micro).map(|p| p.plan).expect("micro_batches"))
        });
        let p = kernel.plan(&rl, 8, &attention, &two_level, None).expect("plan");
        let max = *p.dp.costs.iter().max().unwrap_or(&0) as f64;
        let mean = p.dp.costs.iter().map(|&c| c as f64).sum::<f64>() / p.dp.costs.len() as f64;
        eprintln!(
            "quality plan dp8 attention cap 16384 [{backend}]: heaviest rank {:.6}% over the mean, {} micro-batches per rank",
            100.0 * (max / mean - 1.0),
            p.ranks[0].count()
        );
        g.bench_with_input(BenchmarkId::new("plan_dp8_attention_cap16384", backend), &rl, |b, l| {
            b.iter(|| kernel.plan(l, 8, &attention, &two_level, None).expect("plan"))
        });
    }
    // verl's own algorithm (exact reproduction, add-one-and-retry loop) for comparison.
    let seqlens: Vec<i64> = rl.iter().map(|&l| l as i64).collect();
    let verl = VerlMicroOptions::new(16_384);
    for (backend, kernel) in kernels() {
        let p = kernel.verl_rearrange_micro_batches(&seqlens, &verl).expect("kernel").expect("verl");
        eprintln!("quality verl rearrange_micro_batches cap 16384 [{backend}]: {} micro-batches", p.len());
    }
    g.sample_size(10);
    for (backend, kernel) in kernels() {
        g.bench_with_input(BenchmarkId::new("verl_rearrange_micro_batches_cap16384", backend), &seqlens, |b, l| {
            b.iter(|| kernel.verl_rearrange_micro_batches(l, &verl).expect("kernel").expect("verl"))
        });
    }
    g.finish();
}

/// rl-agentic-32k as rollouts: prompt = a third of each length, pseudo-random token ids
/// (xorshift, fixed seed), per-token logprobs, one temperature.
struct Rollouts {
    prompts: Vec<Vec<i64>>,
    completions: Vec<Vec<i64>>,
    logprobs: Vec<Vec<f32>>,
}

fn rollouts(lengths: &[u64]) -> Rollouts {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % 151_000) as i64
    };
    let mut r = Rollouts { prompts: Vec::new(), completions: Vec::new(), logprobs: Vec::new() };
    for &l in lengths {
        let p = (l / 3) as usize;
        let c = l as usize - p;
        r.prompts.push((0..p).map(|_| next()).collect());
        r.completions.push((0..c).map(|_| next()).collect());
        r.logprobs.push((0..c).map(|j| -((j % 97) as f32) / 32.0).collect());
    }
    r
}

fn materialize_cases(c: &mut Criterion) {
    let lengths = workload("rl-agentic-32k.txt", usize::MAX);
    let data = rollouts(&lengths);
    let samples: Vec<Sample<'_>> = (0..lengths.len())
        .map(|i| Sample {
            prompt_ids: &data.prompts[i],
            completion_ids: &data.completions[i],
            prompt_mask: None,
            completion_mask: None,
            completion_logprobs: Some(&data.logprobs[i]),
            temperature: Temperature::One(1.0),
            advantage: (i % 7) as f32 - 3.0,
            run: 0,
            teacher_logprobs: None,
            extra_cost: 0,
            resources: &[],
        })
        .collect();
    let opts = MaterializeOptions::new(65_536, 8).with_cp(2, 1).expect("cp options");
    let kernel = Kernel::wasm().expect("WASM kernel");
    let m = stowplan::materialize(&kernel, &samples, &opts).expect("materialize");
    let bytes = m.array_bytes();
    eprintln!(
        "quality materialize rl-agentic-32k cap 65536 dp 8 cp 2 (factor 4): {} real tokens, {} padding ({:.4}%), {} \
         micro-batches per rank ({} packed, {} splits, {} dummies, lower bound {}), {:.1} MB of arrays",
        m.real_tokens,
        m.padding_tokens,
        100.0 * m.padding_overhead(),
        m.distribution.per_rank,
        m.distribution.packed,
        m.distribution.splits,
        m.distribution.dummies,
        m.distribution.lower_bound,
        bytes as f64 / 1e6
    );
    let mut g = c.benchmark_group("materialize/rl-agentic-32k");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(6));
    g.throughput(criterion::Throughput::Bytes(bytes));
    g.bench_function("materialize_cap65536_dp8_cp2", |b| {
        b.iter(|| stowplan::materialize(&kernel, &samples, &opts).expect("materialize"))
    });
    g.bench_function("materialize_and_cp_views", |b| {
        b.iter(|| {
            let m = stowplan::materialize(&kernel, &samples, &opts).expect("materialize");
            let views: usize = m
                .ranks
                .iter()
                .flatten()
                .map(|mb| (0..2).map(|r| mb.cp_view(r).expect("view").input_ids.len()).sum::<usize>())
                .sum();
            views
        })
    });
    // The machine's copy bandwidth on the same number of bytes, into fresh memory each time.
    let src = vec![7u8; bytes as usize];
    g.bench_function("memcpy_same_bytes", |b| b.iter(|| src.to_vec()));
    g.finish();
}

/// Static pack plans (raw + aligned, checksums included), and the length cache's precompute
/// with 1 and 8 workers on 200,000 samples.
fn plan_cases(c: &mut Criterion) {
    let sft = workload("sft-chat-200k.txt", usize::MAX);
    let docs = workload("pretrain-docs-1m.txt", usize::MAX);
    let mut g = c.benchmark_group("plan");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
    let cases = [
        ("sft-chat-200k_L16384_ws8", &sft, PlanOptions::new(16_384)),
        (
            "pretrain-docs-1m_L32768_single-long_ws8",
            &docs,
            PlanOptions { allow_single_long: true, ..PlanOptions::new(32_768) },
        ),
    ];
    for (name, lengths, opts) in cases {
        let sum: u64 = lengths.iter().sum();
        for (backend, kernel) in kernels() {
            let p = StaticPackPlan::build(&kernel, lengths, &opts, 8, false).expect("plan");
            eprintln!(
                "quality plan {name} [{backend}]: {} raw packs (lower bound {}, ceil(sum/L) {}), {} aligned, {} \
                 single-long, {} dropped, efficiency {:.3}%, raw {} aligned {}",
                p.raw_len(),
                p.raw.lower_bound,
                sum.div_ceil(opts.capacity),
                p.len(),
                p.raw.single_long.len(),
                p.raw.dropped.len(),
                100.0 * p.efficiency(),
                &p.raw_checksum()[..16],
                &p.aligned_checksum()[..16]
            );
            g.bench_with_input(BenchmarkId::new(name, backend), lengths, |b, l| {
                b.iter(|| StaticPackPlan::build(&kernel, l, &opts, 8, false).expect("plan"))
            });
        }
    }
    // A length function costing a few µs per sample (a stand-in for a cheap tokenizer call).
    let measure = |i: usize| -> Result<u64, String> {
        let mut h = i as u64 ^ 0x9e37_79b9_7f4a_7c15;
        for _ in 0..4_000 {
            h = h.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        }
        Ok(1 + h % 16_384)
    };
    let dir = std::env::temp_dir().join(format!("stowplan-bench-cache-{}", std::process::id()));
    let config = serde_json::json!({"bench": true});
    for workers in [1usize, 8] {
        g.bench_function(BenchmarkId::new("length_cache_200k_precompute", workers), |b| {
            b.iter(|| {
                let _ = std::fs::remove_dir_all(&dir);
                let mut cache = LengthCache::open(&dir, "bench", 200_000, &config, None).expect("open");
                cache.precompute(workers, measure).expect("precompute").len()
            })
        });
    }
    let _ = std::fs::remove_dir_all(&dir);
    g.finish();
}

/// Buffer filters: 64 of 1,000 buffered groups × 8 samples per call, the instance
/// reused, validation included; the native FIFO for scale; and a whole `get_samples` round
/// (64 groups out through top-reward, 64 back in) on a data source holding 1,000.
fn filter_cases(c: &mut Criterion) {
    use stowplan::{
        DataSource, Filter,
        filter::FilterOptions,
        source::{BufferColumns, BufferFilter, BufferView, DataSourceOptions, FilterContext, PopFirst},
    };
    let dist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../plugins/dist");
    let groups = stowplan::filter::synthetic_buffer(1000, 8, 0);
    let columns = BufferColumns::from_groups(&groups);
    let view = BufferView { groups: &groups, columns: &columns };
    let ctx = FilterContext { rollout_id: Some(0), wanted: 64, n_samples_per_prompt: 8 };
    let mut g = c.benchmark_group("filter");
    g.bench_function("native_pop_first/64_of_1000x8", |b| b.iter(|| PopFirst.select(&ctx, view).expect("fifo")));
    for name in ["pop_first", "top_reward"] {
        let path = dist.join(format!("{name}.wasm"));
        let sha = stowplan::runtime::sha256_hex(&std::fs::read(&path).expect("plugins/dist"));
        let mut f = Filter::load(&path, FilterOptions::new(&sha)).expect("plugin");
        g.bench_function(BenchmarkId::new("wasm", format!("{name}/64_of_1000x8")), |b| {
            b.iter(|| f.select(&ctx, view).expect("select"))
        });
    }
    let path = dist.join("top_reward.wasm");
    let sha = stowplan::runtime::sha256_hex(&std::fs::read(&path).expect("plugins/dist"));
    let mut top = Filter::load(&path, FilterOptions::new(&sha)).expect("plugin");
    let records = (0..2000).map(|i| serde_json::json!({ "prompt": format!("q{i}") })).collect();
    let mut ds = DataSource::from_records(records, "bench", DataSourceOptions::new(8), Kernel::native()).expect("ds");
    ds.add_samples(groups.clone()).expect("fill the buffer");
    g.bench_function("data_source_round/top_reward/64_of_1000x8", |b| {
        b.iter(|| {
            let out = ds.get_samples(64, None, Some(&mut top)).expect("get");
            ds.add_samples(out).expect("put back");
        })
    });
    g.finish();
}

criterion_group!(benches, partition_cases, pack_cases, balance_cases, materialize_cases, plan_cases, filter_cases);
criterion_main!(benches);
