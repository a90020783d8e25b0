//! Packing under several limits on `vlm-mix-100k.tsv`: stowplan's multi-limit
//! balanced fill, BFD and FFD beside what users do today (pack by tokens with BFD, then split every pack
//! that breaks another limit), and beside single-resource BFD on the same rows for time; the
//! static plan under the same limits (`raw_plan` with limits) and the streaming packer under them
//! (`LimitedStreamPacker`, default bounds: 64 open bins, 4,096 buffered).
//! Rounds interleave the contenders; prints packs, the gap to the per-resource lower bound
//! and median times, through the WASM component and natively.
//!
//! Run: `cargo run --release -p stowplan --example vlm [ROUNDS]` (default 11; the workload
//! from `../shared/workloads` or `$STOWPLAN_WORKLOADS`).

use std::path::PathBuf;
use std::time::Instant;

use stowplan::{
    Backend, Kernel,
    kernel::{
        MicroLimits, MultiMethod, MultiOptions, OversizePolicy, PackOptions, PlanLimits, PlanOptions, StreamLimits,
        StreamOptions,
    },
};

const METHODS: [MultiMethod; 3] = [MultiMethod::Balanced, MultiMethod::Bfd, MultiMethod::Ffd];

const CAPS: [u64; 3] = [16_384, 8_192, 32];
const MAX_SEGMENTS: u64 = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The static plan of the rows under the limits (the 5 long rows are already left out).
fn plan(kernel: &Kernel, tokens: &[u64], extra: &[u64]) -> usize {
    let limits = PlanLimits {
        limits: MicroLimits { sizes: extra, caps: &CAPS[1..], names: &[] },
        max_segments: MAX_SEGMENTS,
        method: MultiMethod::Balanced,
    };
    // A row of exactly 16,384 tokens would be long in a static plan (the static pack plan contract); none is.
    kernel.raw_plan(tokens, &PlanOptions::new(CAPS[0]), Some(&limits)).expect("plan").raw.packs()
}

/// The streaming packer under the limits, fed 4,096 rows a call.
fn stream(kernel: &Kernel, flat: &[u64]) -> usize {
    let limits = StreamLimits { caps: CAPS[1..].to_vec(), names: Vec::new(), max_segments: MAX_SEGMENTS };
    let mut p = kernel.limited_stream_packer(&StreamOptions::new(CAPS[0]), &limits).expect("stream");
    let mut bins = 0;
    for chunk in flat.chunks(3 * 4096) {
        bins += p.add(chunk).expect("add").closed.bins();
    }
    bins + p.finish().expect("finish").closed.bins()
}

/// Today's way: BFD on tokens, then each pack cut, in member order, wherever the next member
/// would break a limit (image tokens, images or segments).
fn baseline(kernel: &Kernel, rows: &[[u64; 3]]) -> usize {
    let tokens: Vec<u64> = rows.iter().map(|r| r[0]).collect();
    let p = kernel.pack(&tokens, &PackOptions::new(CAPS[0])).expect("token BFD");
    let mut packs = 0;
    for b in 0..p.bins() {
        let (mut img_tok, mut imgs, mut segs) = (0u64, 0u64, 0u64);
        packs += 1;
        for &i in p.bin(b) {
            let r = rows[i as usize];
            if img_tok + r[1] > CAPS[1] || imgs + r[2] > CAPS[2] || segs + 1 > MAX_SEGMENTS {
                packs += 1;
                (img_tok, imgs, segs) = (0, 0, 0);
            }
            img_tok += r[1];
            imgs += r[2];
            segs += 1;
        }
    }
    packs
}

fn main() {
    let rounds: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(11);
    let dir = std::env::var_os("STOWPLAN_WORKLOADS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/workloads"));
    let text = std::fs::read_to_string(dir.join("vlm-mix-100k.tsv")).expect("vlm-mix-100k.tsv");
    let all: Vec<[u64; 3]> = text
        .lines()
        .skip(1)
        .map(|l| {
            let v: Vec<u64> = l.split('\t').map(|x| x.parse().expect("a number")).collect();
            [v[0], v[1], v[2]]
        })
        .collect();
    let rows: Vec<[u64; 3]> = all.iter().copied().filter(|r| r[0] <= CAPS[0]).collect();
    println!("{} rows, {} over {} tokens dropped", rows.len(), all.len() - rows.len(), CAPS[0]);
    let flat: Vec<u64> = rows.iter().flatten().copied().collect();
    let tokens: Vec<u64> = rows.iter().map(|r| r[0]).collect();
    let multi = |method| MultiOptions {
        capacities: &CAPS,
        names: &[],
        max_segments: MAX_SEGMENTS,
        align: 1,
        method,
        oversize: OversizePolicy::Error,
    };
    let kernels = [
        ("wasm", Kernel::new(Backend::Wasm).expect("wasm")),
        ("native", Kernel::new(Backend::Native).expect("native")),
    ];
    let base = baseline(&kernels[1].1, &rows);
    println!("baseline (token BFD, then split): {base} packs");
    for (name, k) in &kernels {
        for method in METHODS {
            let p = k.pack_multi(&flat, &multi(method)).expect("multi");
            println!(
                "{name} {method}: {} packs, lower bounds {:?} (max {}), {:.1}% above it, {:.1}% fewer than the baseline",
                p.packing.bins(),
                p.lower_bounds,
                p.packing.lower_bound,
                100.0 * (p.packing.bins() as f64 / p.packing.lower_bound as f64 - 1.0),
                100.0 * (1.0 - p.packing.bins() as f64 / base as f64)
            );
        }
    }
    let extra: Vec<u64> = rows.iter().flat_map(|r| [r[1], r[2]]).collect();
    println!(
        "static plan (balanced): {} packs; stream (64 open, 4,096 buffered): {} bins",
        plan(&kernels[1].1, &tokens, &extra),
        stream(&kernels[1].1, &flat)
    );
    // Per kernel: single-resource BFD, each method, the baseline, the plan, the stream.
    let per = METHODS.len() + 4;
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); 2 * per];
    for _ in 0..rounds {
        for (j, (_, k)) in kernels.iter().enumerate() {
            let t = Instant::now();
            k.pack(&tokens, &PackOptions::new(CAPS[0])).expect("bfd");
            times[j * per].push(t.elapsed().as_secs_f64() * 1e3);
            for (m, method) in METHODS.into_iter().enumerate() {
                let t = Instant::now();
                k.pack_multi(&flat, &multi(method)).expect("multi");
                times[j * per + 1 + m].push(t.elapsed().as_secs_f64() * 1e3);
            }
            let t = Instant::now();
            baseline(k, &rows);
            times[j * per + per - 3].push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            plan(k, &tokens, &extra);
            times[j * per + per - 2].push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            stream(k, &flat);
            times[j * per + per - 1].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    for (j, (name, _)) in kernels.iter().enumerate() {
        let m: Vec<f64> = times[j * per..(j + 1) * per].iter().map(|t| median(t.clone())).collect();
        let methods: Vec<String> = METHODS
            .iter()
            .enumerate()
            .map(|(i, method)| format!("multi {method} {:.2} ms ({:.2}x)", m[1 + i], m[1 + i] / m[0]))
            .collect();
        println!(
            "{name}: single-resource BFD {:.2} ms, {}, baseline {:.2} ms, static plan {:.2} ms, stream {:.2} ms",
            m[0],
            methods.join(", "),
            m[per - 3],
            m[per - 2],
            m[per - 1]
        );
    }
}
