//! Invariants of every kernel method, checked on random inputs with proptest, and exact
//! agreement of the O(n log n) packers with naive reference implementations.

use proptest::prelude::*;
use stowplan_kernel::{
    Error, OversizePolicy, PackMethod, PackOptions, Packing, Partition, PartitionMethod, PartitionOptions, pack,
    partition,
};

fn check_partition(weights: &[u64], k: u32, opts: &PartitionOptions, p: &Partition) {
    let n = weights.len();
    assert_eq!(p.k(), k as usize, "k groups");
    let mut seen = vec![false; n];
    for g in 0..p.k() {
        let members = p.group(g);
        if opts.equal_size {
            assert_eq!(members.len(), n / k as usize, "equal size");
        }
        assert!(!members.is_empty(), "no empty group when n >= k");
        assert!(members.windows(2).all(|w| w[0] < w[1]), "members ascending");
        let sum: u64 = members.iter().map(|&i| weights[i as usize]).sum();
        assert_eq!(sum, p.sums[g], "sums");
        for &i in members {
            assert!(!seen[i as usize], "index {i} twice");
            seen[i as usize] = true;
        }
    }
    assert!(seen.iter().all(|&s| s), "every index once");
    let total: u64 = weights.iter().sum();
    assert_eq!(p.total, total);
    let max = *p.sums.iter().max().unwrap();
    let min = *p.sums.iter().min().unwrap();
    assert_eq!(p.spread, max - min);
    let lb = total.div_ceil(k as u64).max(*weights.iter().max().unwrap());
    assert_eq!(p.lower_bound, lb);
    assert!(max >= lb, "the lower bound is a bound");
    if opts.method != PartitionMethod::Verl {
        // Canonical order: sum descending, then smallest member ascending.
        for g in 1..p.k() {
            let (a, b) = (p.sums[g - 1], p.sums[g]);
            assert!(a > b || (a == b && p.group(g - 1)[0] < p.group(g)[0]), "group order");
        }
    }
}

fn weights_and_k() -> impl Strategy<Value = (Vec<u64>, u32)> {
    (1usize..120).prop_flat_map(|n| {
        let w = prop_oneof![
            prop::collection::vec(0u64..10, n),
            prop::collection::vec(0u64..100_000, n),
            prop::collection::vec(prop_oneof![1u64..50, 1000u64..1_000_000], n),
        ];
        (w, 1u32..=(n as u32).min(20))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn partition_invariants((weights, k) in weights_and_k(), method in prop_oneof![Just(PartitionMethod::Kk), Just(PartitionMethod::Greedy)], refine: bool) {
        let opts = PartitionOptions { method, equal_size: false, refine };
        let p = partition(&weights, k, &opts).unwrap();
        check_partition(&weights, k, &opts, &p);
        prop_assert_eq!(&p, &partition(&weights, k, &opts).unwrap(), "deterministic");
    }

    #[test]
    fn equal_size_invariants((weights, k) in weights_and_k(), method in prop_oneof![Just(PartitionMethod::Kk), Just(PartitionMethod::Greedy), Just(PartitionMethod::Verl)], refine: bool) {
        let n = weights.len() - weights.len() % k as usize;
        let weights = &weights[..n];
        let refine = refine && method != PartitionMethod::Verl;
        let opts = PartitionOptions { method, equal_size: true, refine };
        let p = partition(weights, k, &opts).unwrap();
        check_partition(weights, k, &opts, &p);
    }

    #[test]
    fn refinement_never_hurts((weights, k) in weights_and_k(), equal_size: bool, method in prop_oneof![Just(PartitionMethod::Kk), Just(PartitionMethod::Greedy)]) {
        let n = if equal_size { weights.len() - weights.len() % k as usize } else { weights.len() };
        let weights = &weights[..n];
        let plain = partition(weights, k, &PartitionOptions { method, equal_size, refine: false }).unwrap();
        let refined = partition(weights, k, &PartitionOptions { method, equal_size, refine: true }).unwrap();
        prop_assert!(refined.max_sum() <= plain.max_sum());
        prop_assert!(refined.spread <= plain.spread);
    }

    #[test]
    fn verl_method_is_a_partition((weights, k) in weights_and_k()) {
        let opts = PartitionOptions { method: PartitionMethod::Verl, equal_size: false, refine: false };
        match partition(&weights, k, &opts) {
            Ok(p) => check_partition(&weights, k, &opts, &p),
            // verl fails when KK leaves a group empty (e.g. many zero weights); we report it.
            Err(Error::InvalidArgument(m)) => prop_assert!(m.contains("partition is empty"), "{}", m),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}

/// Naive any-fit packer: O(n · bins), written for clarity.
fn reference_pack(lengths: &[u64], o: &PackOptions) -> Vec<Vec<u32>> {
    let aligned: Vec<u64> = lengths.iter().map(|&l| l.div_ceil(o.align) * o.align).collect();
    let mut bins: Vec<(u64, Vec<u32>)> = Vec::new();
    if o.method == PackMethod::NextFit {
        let mut open = false;
        for (i, &a) in aligned.iter().enumerate() {
            if a > o.capacity {
                if o.oversize == OversizePolicy::Single {
                    bins.push((a, vec![i as u32]));
                    open = false;
                }
                continue;
            }
            if open && bins.last().unwrap().0 + a <= o.capacity {
                let last = bins.last_mut().unwrap();
                last.0 += a;
                last.1.push(i as u32);
            } else {
                bins.push((a, vec![i as u32]));
                open = true;
            }
        }
        return bins.into_iter().map(|b| b.1).collect();
    }
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by(|&x, &y| aligned[y].cmp(&aligned[x]).then(x.cmp(&y)));
    let mut full = vec![];
    for &i in &order {
        if aligned[i] > o.capacity {
            if o.oversize == OversizePolicy::Single {
                bins.push((aligned[i], vec![i as u32]));
                full.push(true);
            }
            continue;
        }
        let a = aligned[i];
        let mut choice: Option<usize> = None;
        for (b, (load, _)) in bins.iter().enumerate() {
            if full[b] || load + a > o.capacity {
                continue;
            }
            match (o.method, choice) {
                (_, None) => choice = Some(b),
                (PackMethod::Bfd, Some(c)) if *load > bins[c].0 => choice = Some(b),
                _ => {}
            }
            if o.method == PackMethod::Ffd {
                break;
            }
        }
        match choice {
            Some(b) => {
                bins[b].0 += a;
                bins[b].1.push(i as u32);
            }
            None => {
                bins.push((a, vec![i as u32]));
                full.push(false);
            }
        }
    }
    bins.into_iter()
        .map(|mut b| {
            b.1.sort();
            b.1
        })
        .collect()
}

fn bins(p: &Packing) -> Vec<Vec<u32>> {
    (0..p.bins()).map(|b| p.bin(b).to_vec()).collect()
}

fn pack_case() -> impl Strategy<Value = (Vec<u64>, PackOptions)> {
    let lengths = prop_oneof![
        prop::collection::vec(0u64..40, 1..150),
        prop::collection::vec(1u64..2_000, 1..300),
        prop::collection::vec(prop_oneof![1u64..100, 900u64..1_200], 1..200),
    ];
    let method = prop_oneof![Just(PackMethod::Bfd), Just(PackMethod::Ffd), Just(PackMethod::NextFit)];
    let oversize = prop_oneof![Just(OversizePolicy::Single), Just(OversizePolicy::Drop)];
    // Scaled by 2^11, capacities pass 2^20: BFD's rooms are then an ordered set, not buckets.
    let scale = prop_oneof![3 => Just(1u64), 1 => Just(1u64 << 11)];
    (lengths, 1u64..1_500, 1u64..9, method, oversize, scale).prop_map(
        |(l, capacity, align, method, oversize, scale)| {
            let l = l.into_iter().map(|x| x * scale).collect();
            (l, PackOptions { align, method, oversize, ..PackOptions::new(capacity * scale) })
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn pack_invariants_and_reference((lengths, o) in pack_case()) {
        let p = pack(&lengths, &o).unwrap();
        let aligned: Vec<u64> = lengths.iter().map(|&l| l.div_ceil(o.align) * o.align).collect();
        let mut seen = vec![false; lengths.len()];
        for b in 0..p.bins() {
            let members = p.bin(b);
            prop_assert!(!members.is_empty());
            prop_assert!(members.windows(2).all(|w| w[0] < w[1]));
            let load: u64 = members.iter().map(|&i| aligned[i as usize]).sum();
            prop_assert_eq!(load, p.loads[b]);
            if load > o.capacity {
                prop_assert!(members.len() == 1 && o.oversize == OversizePolicy::Single, "only single bins overflow");
                prop_assert!(p.single.contains(&members[0]));
            }
            for &i in members {
                prop_assert!(!seen[i as usize]);
                seen[i as usize] = true;
            }
        }
        for (i, &a) in aligned.iter().enumerate() {
            let oversized = a > o.capacity;
            prop_assert_eq!(seen[i], !(oversized && o.oversize == OversizePolicy::Drop), "index {} placed iff kept", i);
            prop_assert_eq!(p.dropped.contains(&(i as u32)), oversized && o.oversize == OversizePolicy::Drop);
        }
        let regular = p.bins() - p.single.len();
        prop_assert!(regular as u64 >= p.lower_bound);
        prop_assert_eq!(p.aligned_tokens - p.real_tokens, p.padding_tokens());
        prop_assert_eq!(bins(&p), reference_pack(&lengths, &o), "matches the naive reference");
        prop_assert_eq!(&p, &pack(&lengths, &o).unwrap(), "deterministic");
        if o.method == PackMethod::NextFit {
            let flat: Vec<u32> = p.indices.clone();
            prop_assert!(flat.windows(2).all(|w| w[0] < w[1]), "next-fit keeps the input order");
            // The compact runs, from u32 lengths when they fit, rebuild the same packing.
            let runs = stowplan_kernel::next_fit_runs(&lengths, &o).unwrap();
            prop_assert_eq!(runs.clone().into_packing(lengths.len()), p.clone());
            if let Ok(narrow) = lengths.iter().map(|&l| u32::try_from(l)).collect::<Result<Vec<u32>, _>>() {
                prop_assert_eq!(stowplan_kernel::next_fit_runs(&narrow, &o).unwrap(), runs);
            }
        }
    }
}

/// The first error of `pack`'s rule.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RuleError {
    /// `lengths[i]` rounded up to `align` overflows (checked for every item first).
    Rounding(usize),
    /// The total of the aligned lengths overflows.
    Total,
    /// `lengths[i]` is over the capacity under the `error` policy.
    Oversized(usize),
}

/// Next-fit by its rule, item by item, with checked sums (the reference for lengths of any
/// size): the bins, or the first error.
fn reference_next_fit(lengths: &[u64], o: &PackOptions) -> Result<Vec<Vec<u32>>, RuleError> {
    let aligned: Vec<u64> = lengths
        .iter()
        .enumerate()
        .map(|(i, &len)| len.div_ceil(o.align).checked_mul(o.align).ok_or(RuleError::Rounding(i)))
        .collect::<Result<_, _>>()?;
    let mut bins: Vec<(u64, Vec<u32>)> = Vec::new();
    let mut open = false;
    let mut total = 0u64;
    for (i, &a) in aligned.iter().enumerate() {
        total = total.checked_add(a).ok_or(RuleError::Total)?;
        if a > o.capacity {
            match o.oversize {
                OversizePolicy::Error => return Err(RuleError::Oversized(i)),
                OversizePolicy::Single => {
                    bins.push((a, vec![i as u32]));
                    open = false;
                }
                OversizePolicy::Drop => {}
            }
            continue;
        }
        match bins.last_mut() {
            Some((load, members)) if open && load.checked_add(a).is_some_and(|t| t <= o.capacity) => {
                *load += a;
                members.push(i as u32);
            }
            _ => {
                bins.push((a, vec![i as u32]));
                open = true;
            }
        }
    }
    Ok(bins.into_iter().map(|b| b.1).collect())
}

/// Whether `e` is the error the reference found.
fn is_reference_error(e: &Error, expected: RuleError) -> bool {
    match (e, expected) {
        (Error::InvalidArgument(m), RuleError::Rounding(i)) => {
            m.starts_with(&format!("lengths[{i}] = ")) && m.contains("rounded up")
        }
        (Error::InvalidArgument(m), RuleError::Total) => m.contains("the sum of aligned lengths overflows u64"),
        (Error::Infeasible(m), RuleError::Oversized(i)) => m.starts_with(&format!("lengths[{i}] = ")),
        _ => false,
    }
}

/// Lengths for next-fit's block and group paths: long enough to cross several blocks of
/// 512, mostly within the capacity, with runs of oversized and huge (near 2^60, 2^63,
/// u64::MAX) ones; capacities on both sides of the fast path's bound.
fn next_fit_case() -> impl Strategy<Value = (Vec<u64>, PackOptions)> {
    let huge = prop_oneof![Just(u64::MAX), Just(1 << 60), Just((1 << 60) - 1), Just(1 << 63), (1u64 << 58)..(1 << 62)];
    let run = prop_oneof![
        6 => prop::collection::vec(0u64..60, 1..120),
        1 => prop::collection::vec(60u64..200, 1..10),
        1 => prop::collection::vec(huge, 1..9),
    ];
    let lengths = prop::collection::vec(run, 1..40).prop_map(|runs| runs.concat());
    let capacity = prop_oneof![
        4 => 1u64..400,
        1 => prop_oneof![Just(u64::MAX / 512), Just(u64::MAX / 512 + 1), Just(u64::MAX), (1u64 << 60)..u64::MAX],
    ];
    let align = prop_oneof![4 => Just(1u64), 1 => 2u64..9];
    let oversize = prop_oneof![Just(OversizePolicy::Single), Just(OversizePolicy::Drop), Just(OversizePolicy::Error)];
    (lengths, capacity, align, oversize).prop_map(|(l, capacity, align, oversize)| {
        (l, PackOptions { align, method: PackMethod::NextFit, oversize, ..PackOptions::new(capacity) })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Next-fit's fast paths (blocks, groups of four, the per-item fallback) give the rule's
    /// bins and pack's figures and errors, from u64 and from u32 lengths.
    #[test]
    fn next_fit_matches_its_rule((lengths, o) in next_fit_case()) {
        let bfd = pack(&lengths, &PackOptions { method: PackMethod::Bfd, ..o });
        let runs = stowplan_kernel::next_fit_runs(&lengths, &o);
        match (&runs, reference_next_fit(&lengths, &o)) {
            (Err(e), Err(expected)) => {
                prop_assert!(is_reference_error(e, expected), "{e:?}, the rule's: {expected:?}");
                // The checks come before any packing: the same error for every method.
                prop_assert_eq!(Err(e), bfd.as_ref());
            }
            (Ok(runs), Ok(reference)) => {
                let p = runs.clone().into_packing(lengths.len());
                prop_assert_eq!(bins(&p), reference);
                prop_assert_eq!(&p, &pack(&lengths, &o).unwrap());
                let b = bfd.unwrap();
                prop_assert_eq!((p.real_tokens, p.aligned_tokens, p.lower_bound), (b.real_tokens, b.aligned_tokens, b.lower_bound));
                prop_assert_eq!((&p.dropped, &p.single), (&b.dropped, &b.single));
                let aligned = |i: u32| lengths[i as usize].div_ceil(o.align) * o.align;
                let real: u64 = p.indices.iter().map(|&i| lengths[i as usize]).sum();
                let all: u64 = p.indices.iter().map(|&i| aligned(i)).sum();
                prop_assert_eq!((p.real_tokens, p.aligned_tokens), (real, all));
                for bin in 0..p.bins() {
                    prop_assert_eq!(p.loads[bin], p.bin(bin).iter().map(|&i| aligned(i)).sum::<u64>());
                }
            }
            (got, expected) => prop_assert!(false, "next-fit {:?} but the rule {:?}", got.as_ref().err(), expected.err()),
        }
        if let Ok(narrow) = lengths.iter().map(|&l| u32::try_from(l)).collect::<Result<Vec<u32>, _>>() {
            prop_assert_eq!(stowplan_kernel::next_fit_runs(&narrow, &o), runs);
        }
    }
}

#[test]
fn next_fit_huge_lengths_never_wrap_into_a_bin() {
    // After a single bin no bin is open; four lengths summing to 2^63 + 5 would wrap that
    // state's load to 5, within the capacity, if they were added unchecked.
    let quarter = 1u64 << 61;
    let lengths = [100, quarter, quarter, quarter, quarter + 5, 3, 4];
    for lengths in [&lengths[..], &lengths[..5]] {
        let o = PackOptions { method: PackMethod::NextFit, oversize: OversizePolicy::Single, ..PackOptions::new(10) };
        let p = pack(lengths, &o).unwrap();
        assert_eq!(Ok(bins(&p)), reference_next_fit(lengths, &o));
        assert_eq!(p.single, [0, 1, 2, 3, 4]);
    }
}

#[test]
fn next_fit_full_blocks_near_the_fast_path_bound_overflow_as_the_rule_says() {
    // Blocks of 512 lengths equal to the capacity, with a load carried into the next block:
    // the bins' loads then pass u64 while the block's sum does not. The total overflows, and
    // that error comes back (a debug build checks that no add overflows on the way).
    let c = u64::MAX / 512;
    let cases = [
        (c, vec![c; 1024]),
        (c, [vec![512; 512], vec![c; 512]].concat()),
        (u64::MAX / 513 + 1, vec![u64::MAX / 513 + 1; 1024]),
    ];
    for (capacity, lengths) in cases {
        {
            for oversize in [OversizePolicy::Error, OversizePolicy::Drop, OversizePolicy::Single] {
                let o = PackOptions { method: PackMethod::NextFit, oversize, ..PackOptions::new(capacity) };
                let e = stowplan_kernel::next_fit_runs(&lengths, &o).unwrap_err();
                assert!(is_reference_error(&e, reference_next_fit(&lengths, &o).unwrap_err()), "{e:?}");
            }
        }
    }
    // Just under: 511 + 512 · (u64::MAX / 512) is exactly u64::MAX.
    let capacity = u64::MAX / 512;
    let lengths = [vec![511], vec![0; 511], vec![capacity; 512]].concat();
    let o = PackOptions { method: PackMethod::NextFit, ..PackOptions::new(capacity) };
    let p = pack(&lengths, &o).unwrap();
    assert_eq!((p.aligned_tokens, p.bins()), (u64::MAX, 513));
    assert_eq!(Ok(bins(&p)), reference_next_fit(&lengths, &o));
}

#[test]
fn next_fit_runs_fail_as_pack_does() {
    for (lengths, o) in [
        (vec![], PackOptions::new(10)),
        (vec![3u64], PackOptions::new(0)),
        (vec![3], PackOptions { align: 0, ..PackOptions::new(10) }),
        (vec![3, 11], PackOptions { method: PackMethod::NextFit, ..PackOptions::new(10) }),
        (vec![u64::MAX, 1], PackOptions { method: PackMethod::NextFit, ..PackOptions::new(10) }),
        (vec![u64::MAX - 1], PackOptions { align: 4, ..PackOptions::new(10) }),
    ] {
        let o = PackOptions { method: PackMethod::NextFit, ..o };
        assert_eq!(stowplan_kernel::next_fit_runs(&lengths, &o).unwrap_err(), pack(&lengths, &o).unwrap_err());
    }
}

#[test]
fn partition_errors_name_the_argument() {
    let o = PartitionOptions::default();
    let msg = |e: Error| match e {
        Error::InvalidArgument(m) => m,
        other => panic!("expected invalid-argument, got {other:?}"),
    };
    assert!(msg(partition(&[1, 2], 0, &o).unwrap_err()).contains("k must be at least 1"));
    assert!(msg(partition(&[], 1, &o).unwrap_err()).contains("weights must not be empty"));
    assert!(msg(partition(&[1, 2], 3, &o).unwrap_err()).contains("k must be at most the number of weights n = 2"));
    let eq = PartitionOptions { equal_size: true, ..o };
    assert!(msg(partition(&[1, 2, 3], 2, &eq).unwrap_err()).contains("multiple of k"));
    assert!(msg(partition(&[u64::MAX, 1], 1, &o).unwrap_err()).contains("overflows"));
    let verl = PartitionOptions { method: PartitionMethod::Verl, refine: true, equal_size: false };
    assert!(msg(partition(&[1, 2], 1, &verl).unwrap_err()).contains("refine must be false"));
    let verl = PartitionOptions { refine: false, ..verl };
    assert!(msg(partition(&[u64::MAX / 2 + 1], 1, &verl).unwrap_err()).contains("i64::MAX"));
}

#[test]
fn pack_errors_name_the_argument() {
    let o = PackOptions::new(10);
    assert!(matches!(pack(&[], &o), Err(Error::InvalidArgument(m)) if m.contains("lengths must not be empty")));
    assert!(matches!(pack(&[1], &PackOptions::new(0)), Err(Error::InvalidArgument(m)) if m.contains("capacity")));
    assert!(
        matches!(pack(&[1], &PackOptions { align: 0, ..o }), Err(Error::InvalidArgument(m)) if m.contains("align"))
    );
    assert!(
        matches!(pack(&[3, 11, 12], &o), Err(Error::Infeasible(m)) if m.contains("lengths[1] = 11") && m.contains("capacity = 10"))
    );
    assert!(
        matches!(pack(&[u64::MAX], &PackOptions { align: 2, ..o }), Err(Error::InvalidArgument(m)) if m.contains("overflows"))
    );
    assert!(
        matches!(pack(&[u64::MAX, 1], &PackOptions { oversize: OversizePolicy::Drop, ..o }), Err(Error::InvalidArgument(m)) if m.contains("overflows"))
    );
}

#[test]
fn slime_example_next_fit() {
    // slime's first-fit-in-order example keeps [0,1,3] together; next-fit closes a bin as
    // soon as an item does not fit.
    let o = PackOptions { method: PackMethod::NextFit, ..PackOptions::new(10) };
    let p = pack(&[5, 3, 7, 2, 6], &o).unwrap();
    assert_eq!(bins(&p), vec![vec![0, 1], vec![2, 3], vec![4]]);
    let p = pack(&[5, 3, 7, 2, 6], &PackOptions { method: PackMethod::Ffd, ..o }).unwrap();
    assert_eq!(bins(&p), vec![vec![1, 2], vec![3, 4], vec![0]]);
    assert_eq!(p.lower_bound, 3);
}

#[test]
fn large_k_unequal_uses_little_memory() {
    // n·k would be 2^31 set slots in verl's representation; ours is O(n + k).
    let weights: Vec<u64> = (0..65_536u64).map(|i| (i * 7919) % 5000 + 1).collect();
    let p = partition(&weights, 32_768, &PartitionOptions::default()).unwrap();
    assert_eq!(p.k(), 32_768);
    assert!(p.max_sum() <= p.lower_bound + 5000);
}

mod balance {
    use proptest::prelude::*;
    use stowplan_kernel::{Cost, DpOptions, Error, MicroOptions, Order, balance_dp, micro_batches, plan};

    fn order() -> impl Strategy<Value = Order> {
        prop_oneof![Just(Order::None), Just(Order::CostDesc), Just(Order::Verl), Just(Order::Roll)]
    }

    fn cost() -> impl Strategy<Value = Cost> {
        prop_oneof![
            Just(Cost::TOKENS),
            Just(Cost::ATTENTION),
            (0u64..5, 0u64..5).prop_map(|(linear, quadratic)| Cost { linear, quadratic })
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Cap never exceeded, every index once, no empty micro-batch, count rules, restore.
        #[test]
        fn micro_batch_invariants(
            lengths in proptest::collection::vec(0u64..400, 1..120),
            cap in 400u64..2000,
            min_count in 0u32..6,
            divisible_by in 1u32..4,
            cost in cost(),
            order in order(),
        ) {
            let o = MicroOptions { capacity: cap, cost, min_count, divisible_by, count: None, order };
            let p = match micro_batches(&lengths, &o) {
                Ok(p) => p,
                Err(Error::InvalidArgument(m)) => {
                    prop_assert!(m.contains("never empty"), "{m}");
                    return Ok(());
                }
                Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
            };
            let count = p.count() as u32;
            prop_assert_eq!(count % divisible_by, 0);
            prop_assert!(count >= min_count && count >= p.lower_bound && count == p.required);
            let mut seen = vec![false; lengths.len()];
            for b in 0..p.count() {
                let batch = p.batch(b);
                prop_assert!(!batch.is_empty());
                prop_assert!(batch.windows(2).all(|w| w[0] < w[1]));
                let tokens: u64 = batch.iter().map(|&i| lengths[i as usize]).sum();
                prop_assert_eq!(tokens, p.tokens[b]);
                prop_assert!(tokens <= cap);
                for &i in batch {
                    prop_assert!(!seen[i as usize]);
                    seen[i as usize] = true;
                }
            }
            prop_assert!(seen.iter().all(|&s| s));
            for (i, &pos) in p.restore.iter().enumerate() {
                prop_assert_eq!(p.indices[pos as usize] as usize, i);
            }
        }

        /// A forced count between the required count and n is honoured exactly.
        #[test]
        fn forced_count_is_exact(lengths in proptest::collection::vec(1u64..300, 1..60), extra in 0u32..60) {
            let o = MicroOptions::new(600);
            let need = micro_batches(&lengths, &o).map_err(|e| TestCaseError::fail(format!("{e}")))?.required;
            let c = (need + extra).min(lengths.len() as u32);
            let p = micro_batches(&lengths, &MicroOptions { count: Some(c), ..o }).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(p.count() as u32, c);
            prop_assert!(p.tokens.iter().all(|&t| t <= 600));
        }

        /// Equal counts per rank, every index once, heaviest rank ≥ the bound; two-level plans
        /// give every rank the same micro-batch count and only its own samples.
        #[test]
        fn dp_and_two_level_invariants(
            per_rank in 1usize..20,
            dp in 1u32..7,
            seed in proptest::collection::vec(0u64..700, 140),
            cost in cost(),
        ) {
            let lengths: Vec<u64> = seed.iter().copied().cycle().take(per_rank * dp as usize).collect();
            let o = DpOptions { cost, ..DpOptions::default() };
            let p = balance_dp(&lengths, dp, &o).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            let mut all: Vec<u32> = p.order.clone();
            all.sort_unstable();
            prop_assert_eq!(all, (0..lengths.len() as u32).collect::<Vec<_>>());
            for r in 0..p.dp() {
                prop_assert_eq!(p.rank(r).len(), per_rank);
            }
            prop_assert!(p.costs.iter().copied().max().unwrap_or(0) >= p.cost_lower_bound);
            let two = plan(&lengths, dp, &o, &MicroOptions { cost, ..MicroOptions::new(700) })
                .map_err(|e| TestCaseError::fail(format!("{e}")))?;
            let count = two.ranks[0].count();
            for (r, m) in two.ranks.iter().enumerate() {
                prop_assert_eq!(m.count(), count);
                let mut mine = m.indices.clone();
                mine.sort_unstable();
                let mut want = two.dp.rank(r).to_vec();
                want.sort_unstable();
                prop_assert_eq!(mine, want);
                for (j, &pos) in m.restore.iter().enumerate() {
                    prop_assert_eq!(m.indices[pos as usize], two.dp.rank(r)[j]);
                }
            }
        }

        /// Groups stay on one rank; mini-batches are balanced one at a time and listed in order.
        #[test]
        fn groups_and_minibatches(groups_per_rank in 1usize..5, dp in 1u32..5, size in 1usize..4, seed in proptest::collection::vec(0u64..500, 80)) {
            let n = groups_per_rank * dp as usize * size;
            let lengths: Vec<u64> = seed.iter().copied().cycle().take(n).collect();
            let labels: Vec<u32> = (0..n).map(|i| (i / size) as u32).collect();
            let o = DpOptions { groups: Some(&labels), ..DpOptions::default() };
            let p = balance_dp(&lengths, dp, &o).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            let mut rank_of = vec![0usize; n];
            for r in 0..p.dp() {
                for &i in p.rank(r) {
                    rank_of[i as usize] = r;
                }
            }
            for i in 0..n {
                prop_assert_eq!(rank_of[i], rank_of[i - i % size]);
            }
            let mb = dp as usize * size;
            let o = DpOptions { minibatch_size: Some(mb as u32), ..DpOptions::default() };
            let p = balance_dp(&lengths, dp, &o).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            for r in 0..p.dp() {
                let chunks: Vec<usize> = p.rank(r).iter().map(|&i| i as usize / mb).collect();
                prop_assert!(chunks.windows(2).all(|w| w[0] <= w[1]), "rank {} lists mini-batches in order", r);
                prop_assert_eq!(p.rank(r).len(), n / dp as usize);
            }
        }
    }

    #[test]
    fn errors_name_the_argument() {
        let o = MicroOptions::new(100);
        let e = micro_batches(&[50, 150], &o).unwrap_err();
        assert!(matches!(&e, Error::Infeasible(m) if m.contains("sequence 1 has 150 tokens")), "{e}");
        let e = micro_batches(&[60, 60, 60], &MicroOptions { count: Some(1), ..o }).unwrap_err();
        assert!(matches!(&e, Error::Infeasible(m) if m.contains("count = 1 is below")), "{e}");
        let e = micro_batches(&[60, 60, 60], &MicroOptions { capacity: 0, ..o }).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("capacity")), "{e}");
        let e = micro_batches(&[60, 60, 60], &MicroOptions { divisible_by: 0, ..o }).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("divisible_by")), "{e}");
        // Forced below what best-fit finds but not below the bound: 3 × 60 into 2 × 100 is impossible.
        let e = micro_batches(&[60, 60, 60, 10], &MicroOptions { count: Some(2), ..o }).unwrap_err();
        assert!(matches!(&e, Error::Infeasible(m) if m.contains("no assignment into count = 2")), "{e}");
        let e = plan(&[1, 2, 3, 4], 2, &DpOptions::default(), &MicroOptions::new(3)).unwrap_err();
        assert!(matches!(&e, Error::Infeasible(m) if m.contains("sequence 3 has 4 tokens")), "global index: {e}");
        let e = balance_dp(&[1, 2, 3], 4, &DpOptions::default()).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("at least 4 samples")), "{e}");
        let e = balance_dp(&[1, 2, 3], 0, &DpOptions::default()).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("dp must be at least 1")), "{e}");
        let labels = [0, 0, 1, 1];
        let o = DpOptions { groups: Some(&labels), minibatch_size: Some(2), ..DpOptions::default() };
        assert!(balance_dp(&[1, 2, 3, 4], 1, &o).is_ok());
        let labels = [0, 1, 1, 2];
        let o =
            DpOptions { groups: Some(&labels), minibatch_size: Some(2), equal_count: false, ..DpOptions::default() };
        let e = balance_dp(&[1, 2, 3, 4], 1, &o).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument(m) if m.contains("different mini-batches")), "{e}");
    }
}
