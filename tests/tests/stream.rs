//! The streaming packer through the host: the WASM component and the native kernel give the
//! same bins and the same state bytes, states restore across backends, damage is refused, and
//! on the shared workloads the bins stay within 0.2 % of the offline lower bound.

use proptest::prelude::*;
use stowplan::{
    Error, Kernel, StreamPacker,
    kernel::{ClosedBins, OversizePolicy, StreamOptions},
};
use stowplan_conformance::workload;

#[path = "../../kernel/tests/support/stream.rs"]
mod support;
use support::stream_case;

/// Every closed bin as (members, load), and the dropped indices.
fn collect(out: &mut (Vec<(Vec<u64>, u64)>, Vec<u64>), c: ClosedBins) {
    for b in 0..c.bins() {
        out.0.push((c.bin(b).to_vec(), c.loads[b]));
    }
    out.1.extend_from_slice(&c.dropped);
}

fn run(packer: &mut StreamPacker, lengths: &[u64], chunk: usize) -> (Vec<(Vec<u64>, u64)>, Vec<u64>) {
    let mut out = (Vec::new(), Vec::new());
    for piece in lengths.chunks(chunk.max(1)) {
        collect(&mut out, packer.add(piece).expect("add"));
    }
    collect(&mut out, packer.finish().expect("finish"));
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Both backends: the same bins, the same state at a cut, and a state saved by one
    /// restores in the other and continues exactly.
    #[test]
    fn backends_agree_and_states_cross_backends(
        (lengths, options) in stream_case(700, 1..600, 1000, 9, 64),
        chunk in 1usize..200,
        cut in 0usize..600,
    ) {
        let (native, wasm) = (Kernel::native(), Kernel::wasm().expect("wasm kernel"));
        let whole = run(&mut native.stream_packer(&options).unwrap(), &lengths, chunk);
        prop_assert_eq!(&run(&mut wasm.stream_packer(&options).unwrap(), &lengths, chunk), &whole);

        let cut = cut.min(lengths.len());
        let mut a = native.stream_packer(&options).unwrap();
        let mut b = wasm.stream_packer(&options).unwrap();
        let mut out = (Vec::new(), Vec::new());
        collect(&mut out, a.add(&lengths[..cut]).unwrap());
        b.add(&lengths[..cut]).unwrap();
        let state = a.state().unwrap();
        prop_assert_eq!(&b.state().unwrap(), &state);
        prop_assert_eq!(a.status().unwrap(), b.status().unwrap());
        let mut restored = wasm.stream_packer_from_state(&state).unwrap();
        prop_assert_eq!(restored.options(), &options);
        collect(&mut out, restored.add(&lengths[cut..]).unwrap());
        collect(&mut out, restored.finish().unwrap());
        prop_assert_eq!(out, whole);
    }
}

#[test]
fn damaged_states_and_bad_options_are_refused_on_both_backends() {
    for kernel in [Kernel::native(), Kernel::wasm().expect("wasm kernel")] {
        let mut p = kernel.stream_packer(&StreamOptions::new(100)).unwrap();
        p.add(&[30, 40, 50, 60]).unwrap();
        let state = p.state().unwrap();
        let mut bad = state.clone();
        bad[20] ^= 1;
        match kernel.stream_packer_from_state(&bad) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("sha256"), "{m}"),
            other => panic!("{other:?}"),
        }
        match kernel.stream_packer_from_state(b"not a state at all, but long enough to be read as one..") {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("not a stowplan stream-packer state"), "{m}"),
            other => panic!("{other:?}"),
        }
        // The right magic, cut short: truncated, not foreign.
        match kernel.stream_packer_from_state(&state[..20]) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("20 bytes") && m.contains("(truncated)"), "{m}"),
            other => panic!("{other:?}"),
        }
        match kernel.stream_packer(&StreamOptions { max_open_bins: 0, ..StreamOptions::new(100) }) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("max_open_bins must be in 1..=65536"), "{m}"),
            other => panic!("{other:?}"),
        }
        match p.add(&[1, 101]) {
            Err(Error::Infeasible(m)) => assert!(m.contains("stream index 5"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(p.state().unwrap(), state, "a refused add applies nothing");
    }
}

/// The component has one packer resource, plain or limited: a state of one kind handed to
/// the other kind's restore is refused, with the same message on both backends.
#[test]
fn a_state_of_the_other_kind_is_refused_alike_on_both_backends() {
    let limits = stowplan::kernel::StreamLimits { caps: vec![4], names: vec!["images".into()], max_segments: 0 };
    let refusals: Vec<(String, String)> = [Kernel::native(), Kernel::wasm().expect("wasm kernel")]
        .iter()
        .map(|kernel| {
            let mut plain = kernel.stream_packer(&StreamOptions::new(100)).unwrap();
            plain.add(&[30, 40]).unwrap();
            let mut limited = kernel.limited_stream_packer(&StreamOptions::new(100), &limits).unwrap();
            limited.add(&[30, 1, 40, 2]).unwrap();
            let as_plain = match kernel.stream_packer_from_state(&limited.state().unwrap()) {
                Err(Error::InvalidArgument(m)) => m,
                other => panic!("a limited state restored as a plain packer: {other:?}"),
            };
            let as_limited = match kernel.limited_stream_packer_from_state(&plain.state().unwrap()) {
                Err(Error::InvalidArgument(m)) => m,
                other => panic!("a plain state restored as a limited packer: {other:?}"),
            };
            // Each kind still restores its own state.
            kernel.stream_packer_from_state(&plain.state().unwrap()).unwrap();
            let back = kernel.limited_stream_packer_from_state(&limited.state().unwrap()).unwrap();
            assert_eq!(back.limits(), &limits);
            (as_plain, as_limited)
        })
        .collect();
    assert_eq!(refusals[0], refusals[1], "native and WASM refuse alike");
}

/// The streaming quality goal: with 64 open bins (and the default buffer), the bins of a
/// streamed workload are within 0.2 % of the offline lower bound of the items that fit.
#[test]
fn streamed_workloads_come_within_0_2_percent_of_the_lower_bound() {
    for (name, capacity) in [("sft-chat-200k.txt", 16_384u64), ("pretrain-docs-1m.txt", 32_768)] {
        let lengths = workload(name);
        let options = StreamOptions { oversize: OversizePolicy::Single, ..StreamOptions::new(capacity) };
        assert_eq!(options.max_open_bins, 64);
        let (bins, _) = run(&mut Kernel::wasm().unwrap().stream_packer(&options).unwrap(), &lengths, 4096);
        let lower = lengths.iter().filter(|&&l| l <= capacity).sum::<u64>().div_ceil(capacity);
        let regular = bins.iter().filter(|(_, load)| *load <= capacity).count() as u64;
        let singles = lengths.iter().filter(|&&l| l > capacity).count() as u64;
        assert_eq!(bins.len() as u64, regular + singles);
        assert!(regular * 1000 <= lower * 1002, "{name}: {regular} bins, lower bound {lower}");
    }
}
