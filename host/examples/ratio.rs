//! WASM / native time ratio on the same work, measured by alternating the two backends
//! call by call (robust to the load drift of a shared machine). Prints the median time of
//! each backend and their ratio per case.
//!
//! Run: `cargo run --release -p stowplan --example ratio [REPS]` (default 15 repetitions;
//! workloads from `../shared/workloads` or `$STOWPLAN_WORKLOADS`).

use std::path::PathBuf;
use std::time::Instant;

use stowplan::{
    Kernel,
    kernel::{OversizePolicy, PackMethod, PackOptions, PartitionOptions},
};

fn workload(name: &str, take: usize) -> Vec<u64> {
    let dir = std::env::var_os("STOWPLAN_WORKLOADS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/workloads"));
    let text = std::fs::read_to_string(dir.join(name)).expect("workload file");
    let mut v = stowplan::input::parse_lengths(&text).expect("workload parses");
    v.truncate(take);
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

type Case = (&'static str, Box<dyn Fn(&Kernel)>);

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(15);
    let docs = workload("pretrain-docs-1m.txt", usize::MAX);
    let d262 = docs[..262_144].to_vec();
    let d16 = docs[..16_384].to_vec();
    let rl = workload("rl-math-8k.txt", usize::MAX);
    let rl1k = rl[..1024].to_vec();
    let docs2 = docs.clone();
    let docs3 = docs.clone();
    let d16b = d16.clone();
    let single = |method| PackOptions { method, oversize: OversizePolicy::Single, ..PackOptions::new(32_768) };
    let cases: Vec<Case> = vec![
        (
            "partition unequal 262144 k1024",
            Box::new(move |k| drop(k.partition(&d262, 1024, &PartitionOptions::default()).unwrap())),
        ),
        (
            "partition unequal 16384 k64",
            Box::new(move |k| drop(k.partition(&d16, 64, &PartitionOptions::default()).unwrap())),
        ),
        (
            "partition equal 16384 k64",
            Box::new(move |k| {
                drop(k.partition(&d16b, 64, &PartitionOptions { equal_size: true, ..Default::default() }).unwrap())
            }),
        ),
        ("pack bfd 1m cap 32768", Box::new(move |k| drop(k.pack(&docs, &single(PackMethod::Bfd)).unwrap()))),
        ("pack ffd 1m cap 32768", Box::new(move |k| drop(k.pack(&docs2, &single(PackMethod::Ffd)).unwrap()))),
        ("pack next-fit 1m cap 32768", Box::new(move |k| drop(k.pack(&docs3, &single(PackMethod::NextFit)).unwrap()))),
        ("pack bfd rl-math-8k cap 16384", Box::new(move |k| drop(k.pack(&rl, &PackOptions::new(16_384)).unwrap()))),
        (
            // A call's fixed cost: 1,000 calls on 8 lengths (the median per call is this
            // figure's ms = µs per call).
            "pack bfd 8 lengths, 1000 calls",
            Box::new(move |k| {
                for _ in 0..1000 {
                    drop(k.pack(&[5, 3, 7, 2, 6, 4, 8, 1], &PackOptions::new(10)).unwrap());
                }
            }),
        ),
        (
            "partition 1024 rl-math k8",
            Box::new(move |k| drop(k.partition(&rl1k, 8, &PartitionOptions::default()).unwrap())),
        ),
    ];
    let wasm = Kernel::wasm().expect("WASM kernel");
    let native = Kernel::native();
    println!("{:<34} {:>12} {:>12} {:>7}", "case", "wasm ms", "native ms", "ratio");
    for (name, run) in &cases {
        run(&wasm);
        run(&native);
        let (mut tw, mut tn) = (Vec::new(), Vec::new());
        for _ in 0..reps {
            let t = Instant::now();
            run(&wasm);
            tw.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            run(&native);
            tn.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let (w, n) = (median(tw), median(tn));
        println!("{name:<34} {w:>12.3} {n:>12.3} {:>7.2}", w / n);
    }
}
