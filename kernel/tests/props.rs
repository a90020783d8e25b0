//! Invariants of every kernel method, checked on random inputs with proptest, and exact
//! agreement of the O(n log n) packers with naive reference implementations.

use proptest::prelude::*;
use stowplan_kernel::{
    Error, OversizePolicy, PackMethod, PackOptions, Packing, PartitionMethod, PartitionOptions, Partitioning, pack,
    partition,
};

fn check_partition(weights: &[u64], k: u32, opts: &PartitionOptions, p: &Partitioning) {
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
    (lengths, 1u64..1_500, 1u64..9, method, oversize)
        .prop_map(|(l, capacity, align, method, oversize)| (l, PackOptions { capacity, align, method, oversize }))
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
        }
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
