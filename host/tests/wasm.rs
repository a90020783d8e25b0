//! The WASM kernel: imports nothing, matches the embedded hash, agrees with the native one.

use proptest::prelude::*;
use stowplan::{
    Backend, Kernel,
    kernel::{
        MultiMethod, MultiOptions, OversizePolicy, PackMethod, PackOptions, PartitionMethod, PartitionOptions,
        VerlFunction,
    },
};

#[test]
fn component_imports_nothing() {
    // `Kernel::wasm` instantiates the component with an empty `Linker`; it would fail if
    // the component imported anything.
    let k = Kernel::wasm().expect("instantiates with an empty linker");
    assert_eq!(k.backend(), Backend::Wasm);
    assert_eq!(Kernel::wasm_imports().unwrap(), Vec::<String>::new());
}

#[test]
fn embedded_component_matches_recorded_hash() {
    assert_eq!(
        stowplan::runtime::sha256_hex(stowplan::kernel::KERNEL_WASM),
        stowplan::kernel::KERNEL_WASM_SHA256.trim()
    );
}

#[test]
fn errors_cross_the_boundary_as_values() {
    let k = Kernel::wasm().unwrap();
    let e = k.partition(&[1, 2], 0, &PartitionOptions::default()).unwrap_err();
    assert_eq!(e.kind(), "invalid-argument");
    assert!(e.to_string().contains("k must be at least 1"), "{e}");
    let e = k.pack(&[5, 50], &PackOptions::new(10)).unwrap_err();
    assert_eq!(e.kind(), "infeasible");
    assert!(e.to_string().contains("lengths[1] = 50"), "{e}");
    let r = k.verl(VerlFunction::GetSeqlenBalancedPartitions, &[5, 6], 3, false).unwrap();
    assert_eq!(r.unwrap_err().to_string(), "AssertionError: number of items:[2] < k_partitions:[3]");
}

#[test]
fn kernel_is_shareable_across_threads() {
    let k = Kernel::wasm().unwrap();
    let lengths: Vec<u64> = (0..2000u64).map(|i| (i * 7919) % 8192 + 1).collect();
    let expected = k.partition(&lengths, 16, &PartitionOptions::default()).unwrap();
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..5 {
                    assert_eq!(k.partition(&lengths, 16, &PartitionOptions::default()).unwrap(), expected);
                }
            });
        }
    });
}

fn part_method() -> impl Strategy<Value = PartitionMethod> {
    prop_oneof![Just(PartitionMethod::Kk), Just(PartitionMethod::Greedy), Just(PartitionMethod::Verl)]
}

/// Lengths for `pack`: up to a few blocks of next-fit's fast path, sometimes with a length
/// over 32 bits (next-fit then sends u64 lengths instead of narrowing them).
fn pack_lengths() -> impl Strategy<Value = Vec<u64>> {
    prop_oneof![
        3 => prop::collection::vec(0u64..3_000, 0..1_200),
        1 => prop::collection::vec(prop_oneof![40 => 0u64..3_000, 1 => Just(1 << 32), 1 => Just(u64::MAX)], 0..600),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn wasm_and_native_agree_on_partition(weights in prop::collection::vec(0u64..50_000, 0..200), k in 0u32..12, method in part_method(), equal_size: bool, refine: bool) {
        let refine = refine && method != PartitionMethod::Verl;
        let o = PartitionOptions { method, equal_size, refine };
        let native = Kernel::native().partition(&weights, k, &o);
        let wasm = Kernel::wasm().unwrap().partition(&weights, k, &o);
        prop_assert_eq!(native, wasm);
    }

    #[test]
    fn wasm_and_native_agree_on_pack(lengths in pack_lengths(), capacity in 0u64..4_000, align in 0u64..8, m in 0..3usize, ov in 0..3usize) {
        let o = PackOptions {
            align,
            method: [PackMethod::Bfd, PackMethod::Ffd, PackMethod::NextFit][m],
            oversize: [OversizePolicy::Error, OversizePolicy::Single, OversizePolicy::Drop][ov],
            ..PackOptions::new(capacity)
        };
        prop_assert_eq!(Kernel::native().pack(&lengths, &o), Kernel::wasm().unwrap().pack(&lengths, &o));
    }

    #[test]
    fn wasm_and_native_agree_on_trl_bfd(
        lengths in prop::collection::vec(0u64..70, 0..400),
        mut batch_ends in prop::collection::vec(0u32..410, 0..6),
        capacity in prop_oneof![0u64..70, (1u64 << 20)..(1 << 21)],
        end_at_n in prop::bool::weighted(0.9),
    ) {
        // Mostly valid cuts (the last at the lengths' count); otherwise the same refusal.
        batch_ends.sort_unstable();
        if end_at_n {
            batch_ends.retain(|&e| e as usize <= lengths.len());
            batch_ends.push(lengths.len() as u32);
        }
        let native = Kernel::native().trl_bfd(&lengths, &batch_ends, capacity);
        prop_assert_eq!(native, Kernel::wasm().unwrap().trl_bfd(&lengths, &batch_ends, capacity));
    }

    #[test]
    fn wasm_and_native_agree_on_pack_multi(
        (r, sizes) in (1usize..=4).prop_flat_map(|r| (Just(r), prop::collection::vec(prop_oneof![Just(0u64), 0u64..300], 0..400 * r))),
        caps in prop::collection::vec(0u64..600, 4), max_segments in 0u64..12, align in 0u64..4, m in 0..4usize, ov in 0..3usize,
    ) {
        let o = MultiOptions {
            capacities: &caps[..r],
            names: &[],
            max_segments,
            align,
            method: [MultiMethod::Balanced, MultiMethod::Bfd, MultiMethod::Ffd, MultiMethod::NextFit][m],
            oversize: [OversizePolicy::Error, OversizePolicy::Single, OversizePolicy::Drop][ov],
        };
        prop_assert_eq!(Kernel::native().pack_multi(&sizes, &o), Kernel::wasm().unwrap().pack_multi(&sizes, &o));
    }

    #[test]
    fn wasm_and_native_agree_on_verl(seqlens in prop::collection::vec(-5i64..1_000, 0..60), k in 0u32..10, equal_size: bool, f in 0..3usize) {
        let f = [VerlFunction::KarmarkarKarp, VerlFunction::GreedyPartition, VerlFunction::GetSeqlenBalancedPartitions][f];
        prop_assert_eq!(Kernel::native().verl(f, &seqlens, k, equal_size).unwrap(), Kernel::wasm().unwrap().verl(f, &seqlens, k, equal_size).unwrap());
    }
}
