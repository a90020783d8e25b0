//! Static pack plans (the static pack plan contract): every invariant of the raw and aligned plans on random
//! inputs, the checksum against an independent encoding, and the errors.

use proptest::prelude::*;
use sha2::{Digest, Sha256};
use stowplan_kernel::{
    Error, MicroLimits, MultiMethod, PlanLimits, PlanOptions, RawPlan, aligned_plan, raw_plan, raw_plan_limited,
};

/// The documented canonical encoding, written out independently of the kernel.
fn reference_checksum(packs: &[Vec<u32>]) -> [u8; 32] {
    let mut bytes = (packs.len() as u64).to_le_bytes().to_vec();
    for p in packs {
        bytes.extend_from_slice(&(p.len() as u32).to_le_bytes());
        for &i in p {
            bytes.extend_from_slice(&i.to_le_bytes());
        }
    }
    Sha256::digest(&bytes).into()
}

fn packs_of(r: &RawPlan) -> Vec<Vec<u32>> {
    (0..r.packs()).map(|p| r.pack(p).to_vec()).collect()
}

fn aligned(l: u64, a: u64) -> u64 {
    l.div_ceil(a) * a
}

/// Checks every raw-plan invariant of the static pack plan contract and returns the packs.
fn check_raw(lengths: &[u64], o: &PlanOptions, r: &RawPlan) -> Vec<Vec<u32>> {
    check_raw_with(lengths, o, r, &|_| false)
}

/// [`check_raw`] where a sample is also long when `over_limit` says so.
fn check_raw_with(lengths: &[u64], o: &PlanOptions, r: &RawPlan, over_limit: &dyn Fn(usize) -> bool) -> Vec<Vec<u32>> {
    let packs = packs_of(r);
    let long = |i: usize| lengths[i] >= o.capacity || aligned(lengths[i], o.align) > o.capacity || over_limit(i);
    let mut seen = vec![0u32; lengths.len()];
    for (p, pack) in packs.iter().enumerate() {
        assert!(!pack.is_empty());
        // Intra-pack order ascending.
        assert!(pack.windows(2).all(|w| w[0] < w[1]), "pack {p} not ascending: {pack:?}");
        for &i in pack {
            seen[i as usize] += 1;
        }
        if pack.len() >= 2 || !long(pack[0] as usize) {
            let sum: u64 = pack.iter().map(|&i| aligned(lengths[i as usize], o.align)).sum();
            assert!(sum <= o.capacity, "pack {p} holds {sum} > {}", o.capacity);
            assert!(pack.iter().all(|&i| !long(i as usize)), "a long sample shares pack {p}");
        }
        assert_eq!(r.tokens[p], pack.iter().map(|&i| lengths[i as usize]).sum::<u64>());
    }
    // Packs ordered by smallest index (strictly: packs are disjoint).
    assert!(packs.windows(2).all(|w| w[0][0] < w[1][0]));
    for (i, &count) in seen.iter().enumerate() {
        if long(i) && !o.allow_single_long {
            assert_eq!(count, 0, "long sample {i} packed without allow_single_long");
            assert!(r.dropped.binary_search(&(i as u32)).is_ok());
        } else {
            assert_eq!(count, 1, "sample {i} appears {count} times");
        }
        if long(i) && o.allow_single_long {
            assert!(packs.contains(&vec![i as u32]), "long sample {i} not alone");
            assert!(r.single_long.binary_search(&(i as u32)).is_ok());
        }
    }
    assert_eq!(r.checksum, reference_checksum(&packs));
    assert!(r.packs() as u64 >= r.lower_bound);
    packs
}

fn arb_case() -> impl Strategy<Value = (Vec<u64>, PlanOptions)> {
    (1u64..200, prop::sample::select(vec![1u64, 1, 4, 8]), any::<bool>()).prop_flat_map(|(cap, align, single)| {
        (
            prop::collection::vec(1u64..cap + cap / 2 + 2, 1..120),
            Just(PlanOptions { capacity: cap, align, allow_single_long: single }),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn raw_plan_invariants((lengths, o) in arb_case()) {
        match raw_plan(&lengths, &o) {
            Ok(r) => {
                check_raw(&lengths, &o, &r);
                // Deterministic.
                prop_assert_eq!(raw_plan(&lengths, &o).unwrap(), r);
            }
            Err(Error::Infeasible(m)) => {
                // Only when every sample is long and dropped.
                prop_assert!(!o.allow_single_long, "{}", m);
                prop_assert!(lengths.iter().all(|&l| l >= o.capacity || aligned(l, o.align) > o.capacity));
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }

    #[test]
    fn aligned_plan_follows_the_pad_and_drop_rules((lengths, o) in arb_case(), ws in 1u32..12, drop_last in any::<bool>()) {
        let Ok(r) = raw_plan(&lengths, &o) else { return Ok(()) };
        let packs = packs_of(&r);
        let n = packs.len();
        match aligned_plan(&r.offsets, &r.indices, ws, drop_last) {
            Ok(a) => {
                let w = ws as usize;
                prop_assert_eq!(a.packs.len() % w, 0);
                if drop_last {
                    prop_assert_eq!(a.packs.len(), n / w * w);
                    prop_assert_eq!(&a.packs, &(0..a.packs.len() as u32).collect::<Vec<_>>());
                    prop_assert_eq!(a.dropped_packs as usize, n - a.packs.len());
                    let dropped: usize = packs[a.packs.len()..].iter().map(Vec::len).sum();
                    prop_assert_eq!(a.dropped_samples as usize, dropped);
                } else {
                    prop_assert_eq!(a.packs.len(), n.div_ceil(w) * w);
                    // Every original pack once, in order, then repeats from the start.
                    prop_assert_eq!(&a.packs[..n], &(0..n as u32).collect::<Vec<_>>()[..]);
                    for (j, &p) in a.packs[n..].iter().enumerate() {
                        prop_assert_eq!(p as usize, j % n);
                    }
                    prop_assert_eq!(a.pad_needed as usize, a.packs.len() - n);
                }
                let consumed: Vec<Vec<u32>> = a.packs.iter().map(|&p| packs[p as usize].clone()).collect();
                prop_assert_eq!(a.checksum, reference_checksum(&consumed));
                if ws == 1 {
                    prop_assert_eq!(a.checksum, r.checksum);
                }
            }
            Err(Error::Infeasible(_)) => prop_assert!(drop_last && n < ws as usize),
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}

#[test]
fn long_samples_follow_the_policy() {
    // length >= capacity is long, even when it would fit exactly.
    let lengths = [10, 4, 3, 12, 6, 2];
    let keep = PlanOptions { allow_single_long: true, ..PlanOptions::new(10) };
    let r = raw_plan(&lengths, &keep).unwrap();
    assert_eq!(packs_of(&r), [vec![0], vec![1, 4], vec![2, 5], vec![3]]);
    assert_eq!(r.single_long, [0, 3]);
    assert_eq!(r.lower_bound, 2 + 2);
    let drop = raw_plan(&lengths, &PlanOptions::new(10)).unwrap();
    assert_eq!(packs_of(&drop), [vec![1, 4], vec![2, 5]]);
    assert_eq!(drop.dropped, [0, 3]);
    // Alignment makes a sample long when its aligned length exceeds the cap.
    let a = PlanOptions { align: 8, ..PlanOptions::new(12) };
    let r = raw_plan(&[9, 3, 2], &a).unwrap();
    assert_eq!(r.dropped, [0]);
    assert_eq!(packs_of(&r), [vec![1], vec![2]]);
}

#[test]
fn ties_break_by_index() {
    // 1,024 equal lengths: best-fit decreasing in index order fills packs of 4 consecutive
    // samples.
    let r = raw_plan(&[1000; 1024], &PlanOptions::new(4000)).unwrap();
    assert_eq!(r.packs(), 256);
    for p in 0..256 {
        assert_eq!(r.pack(p), [4 * p as u32, 4 * p as u32 + 1, 4 * p as u32 + 2, 4 * p as u32 + 3]);
    }
}

#[test]
fn errors_name_the_argument() {
    let msg = |e: Error| e.to_string();
    assert!(msg(raw_plan(&[], &PlanOptions::new(8)).unwrap_err()).contains("lengths must not be empty"));
    assert!(msg(raw_plan(&[1], &PlanOptions::new(0)).unwrap_err()).contains("capacity must be at least 1"));
    let o = PlanOptions { align: 0, ..PlanOptions::new(8) };
    assert!(msg(raw_plan(&[1], &o).unwrap_err()).contains("align must be at least 1"));
    assert!(msg(raw_plan(&[3, 0], &PlanOptions::new(8)).unwrap_err()).contains("lengths[1] = 0"));
    let e = raw_plan(&[9, 8], &PlanOptions::new(8)).unwrap_err();
    assert!(matches!(e, Error::Infeasible(ref m) if m.contains("produced no packs")), "{e}");
    let o = PlanOptions { align: 1 << 63, ..PlanOptions::new(8) };
    assert!(msg(raw_plan(&[(1 << 63) + 1], &o).unwrap_err()).contains("overflows"));
    assert!(msg(aligned_plan(&[0, 1], &[0], 0, false).unwrap_err()).contains("world_size must be at least 1"));
    assert!(matches!(aligned_plan(&[0], &[], 2, false).unwrap_err(), Error::Infeasible(_)));
    assert!(msg(aligned_plan(&[], &[], 2, false).unwrap_err()).contains("offsets must hold"));
    assert!(msg(aligned_plan(&[1, 2], &[0, 1], 2, false).unwrap_err()).contains("offsets[0] must be 0"));
    assert!(msg(aligned_plan(&[0, 1, 1], &[0], 2, false).unwrap_err()).contains("pack 1 is empty"));
    assert!(msg(aligned_plan(&[0, 1], &[0, 1], 2, false).unwrap_err()).contains("last offset"));
    let e = aligned_plan(&[0, 1, 2], &[0, 1], 4, true).unwrap_err();
    assert!(matches!(e, Error::Infeasible(ref m) if m.contains("drops all 2 packs")), "{e}");
    // Fewer packs than ranks without drop_last: repeated cyclically.
    let a = aligned_plan(&[0, 1, 2], &[0, 1], 5, false).unwrap();
    assert_eq!(a.packs, [0, 1, 0, 1, 0]);
}

/// A plan case under limits: lengths, `E` extra sizes per sample, their caps, a segment limit
/// and a method.
type LimitedCase = (Vec<u64>, Vec<u64>, Vec<u64>, u64, MultiMethod, PlanOptions);

fn arb_limited() -> impl Strategy<Value = LimitedCase> {
    let methods =
        prop::sample::select(vec![MultiMethod::Balanced, MultiMethod::Bfd, MultiMethod::Ffd, MultiMethod::NextFit]);
    (arb_case(), 0usize..4, 1u64..12, prop::sample::select(vec![0u64, 0, 1, 2, 5]), methods).prop_flat_map(
        |((lengths, o), e, cap, segments, method)| {
            let n = lengths.len();
            (
                Just(lengths),
                prop::collection::vec(0u64..cap + 3, n * e),
                prop::collection::vec(cap..cap + 4, e),
                Just(segments),
                Just(method),
                Just(o),
            )
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Every regular pack is within every limit; a sample over a limit is long; the packs,
    /// checksum, loads and bounds follow the rules of the raw plan.
    #[test]
    fn limited_plans_keep_every_limit((lengths, sizes, caps, max_segments, method, o) in arb_limited()) {
        let e = caps.len();
        let limits = PlanLimits { limits: MicroLimits { sizes: &sizes, caps: &caps, names: &[] }, max_segments, method };
        let over = |i: usize| (0..e).any(|k| sizes[i * e + k] > caps[k]);
        match raw_plan_limited(&lengths, &o, &limits) {
            Ok(l) => {
                let packs = check_raw_with(&lengths, &o, &l.raw, &over);
                prop_assert_eq!(l.loads.len(), packs.len() * e);
                let mut regular = 0u64;
                for (p, pack) in packs.iter().enumerate() {
                    let single = l.raw.single_long.binary_search(&pack[0]).is_ok() && pack.len() == 1;
                    for k in 0..e {
                        let load: u64 = pack.iter().map(|&i| sizes[i as usize * e + k]).sum();
                        prop_assert_eq!(l.loads[p * e + k], load);
                        prop_assert!(single || load <= caps[k], "pack {} holds {} of limit {}", p, load, k);
                    }
                    prop_assert!(single || max_segments == 0 || pack.len() as u64 <= max_segments);
                    regular += u64::from(!single);
                }
                prop_assert_eq!(l.lower_bounds.len(), 1 + e + usize::from(max_segments > 0));
                let singles = l.raw.single_long.len() as u64;
                prop_assert_eq!(l.raw.lower_bound, l.lower_bounds.iter().max().unwrap() + singles);
                prop_assert!(regular >= l.raw.lower_bound - singles);
                if e == 0 && max_segments == 0 {
                    prop_assert_eq!(&l.raw, &raw_plan(&lengths, &o).unwrap());
                }
            }
            Err(Error::Infeasible(m)) => {
                prop_assert!(!o.allow_single_long, "{}", m);
                prop_assert!((0..lengths.len()).all(|i| over(i) || lengths[i] >= o.capacity
                    || aligned(lengths[i], o.align) > o.capacity));
            }
            Err(e) => prop_assert!(false, "unexpected {e}"),
        }
    }
}

#[test]
fn limited_plan_errors_name_the_limit() {
    let o = PlanOptions::new(10);
    let run = |sizes: &[u64], caps: &[u64], names: &[String], max_segments: u64| {
        let limits =
            PlanLimits { limits: MicroLimits { sizes, caps, names }, max_segments, method: MultiMethod::Balanced };
        raw_plan_limited(&[3, 4], &o, &limits).unwrap_err().to_string()
    };
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(
        run(&[1, 2, 3], &[5], &[], 0)
            .contains("limit sizes must have 1 entries per sequence (2 for 2 sequences) (got 3)")
    );
    assert!(run(&[1, 2], &[0], &names(&["images"]), 0).contains("the cap of images must be at least 1"));
    assert!(run(&[1, 2, 1, 2], &[5, 5], &names(&["images", "images"]), 0).contains("all different"));
    assert!(run(&[1, 2], &[5], &names(&["tokens"]), 0).contains("not \"tokens\""));
    assert!(run(&[1, 2], &[5], &names(&["a", "b"]), 0).contains("one per cap (1) or none (got 2)"));
    assert!(run(&[0; 16], &[5; 8], &[], 0).contains("at most 7 caps"));
    assert!(run(&[1, 2], &[5], &names(&["segments"]), 3).contains("segment limit's name"));
    // A packing length the balanced method cannot take, with a segment limit: named.
    let big = PlanLimits {
        limits: MicroLimits { sizes: &[], caps: &[], names: &[] },
        max_segments: 3,
        method: MultiMethod::Balanced,
    };
    let e = raw_plan_limited(&[3, 4], &PlanOptions::new(5_000_000_000), &big).unwrap_err().to_string();
    assert!(e.contains("capacity = 5000000000 is above 4294967295") && e.contains("bfd or ffd"), "{e}");
    let bfd = PlanLimits { method: MultiMethod::Bfd, ..big };
    assert_eq!(raw_plan_limited(&[3, 4], &PlanOptions::new(5_000_000_000), &bfd).unwrap().raw.packs(), 1);
    // Every sample over a limit, none kept: the error says so.
    let e = run(&[6, 7], &[5], &names(&["images"]), 0);
    assert!(e.contains("2 over a limit") && e.contains("allow_single_long"), "{e}");
}

#[test]
fn a_sample_over_a_limit_is_long() {
    // Sample 1 has 9 images over a cap of 8: alone with allow_single_long, dropped without.
    let sizes = [2, 9, 3, 4];
    let caps = [8];
    let names = ["images".to_string()];
    let limits = PlanLimits {
        limits: MicroLimits { sizes: &sizes, caps: &caps, names: &names },
        max_segments: 2,
        method: MultiMethod::Bfd,
    };
    let keep = PlanOptions { allow_single_long: true, ..PlanOptions::new(100) };
    let l = raw_plan_limited(&[10, 10, 10, 10], &keep, &limits).unwrap();
    // BFD by share: 3 (4 images), then 2 beside it (7 of 8), then 0 in a new pack (segments).
    assert_eq!(packs_of(&l.raw), [vec![0], vec![1], vec![2, 3]]);
    assert_eq!(l.raw.single_long, [1]);
    assert_eq!(l.loads, [2, 9, 7]);
    // Tokens 1, images ⌈9 / 8⌉ = 2, segments ⌈3 / 2⌉ = 2; plus the single pack.
    assert_eq!(l.lower_bounds, [1, 2, 2]);
    assert_eq!(l.raw.lower_bound, 3);
    let drop = raw_plan_limited(&[10, 10, 10, 10], &PlanOptions::new(100), &limits).unwrap();
    assert_eq!(drop.raw.dropped, [1]);
    assert_eq!(packs_of(&drop.raw), [vec![0], vec![2, 3]]);
}

proptest! {
    /// The hex a checksum crosses the component boundary as reads back to the same bytes, and
    /// any other string is refused, as it came: never a wrong checksum.
    #[test]
    fn checksum_hex_reads_back_and_nothing_else_does(
        bytes in prop::array::uniform32(any::<u8>()),
        other in prop_oneof!["[0-9a-f]{64}", "[0-9a-fA-F+g-z é-]{0,70}"],
    ) {
        use stowplan_kernel::plan::{MalformedChecksum, hex, unhex};
        let h = hex(&bytes);
        prop_assert_eq!(h.len(), 64);
        prop_assert_eq!(unhex(&h), Ok(bytes));
        match unhex(&other) {
            Ok(b) => prop_assert_eq!(hex(&b), other),
            Err(e) => prop_assert_eq!(e, MalformedChecksum(other)),
        }
    }
}

#[test]
fn malformed_checksums_are_refused() {
    use stowplan_kernel::plan::{MalformedChecksum, unhex};
    let good = "0123456789abcdef".repeat(4);
    assert!(unhex(&good).is_ok());
    // `+a` and upper case: what `u8::from_str_radix`, which the host once read them with, takes.
    let signed = format!("+a{}", &good[2..]);
    let cases = [&good[..63], &format!("{good}0"), &good.to_uppercase(), &good.replace('f', "g"), "", &"é".repeat(32)];
    for bad in cases.into_iter().chain([signed.as_str()]) {
        assert_eq!(unhex(bad), Err(MalformedChecksum(bad.to_string())), "{bad:?}");
    }
    assert_eq!(unhex("+a").unwrap_err().to_string(), r#"malformed checksum "+a": not 64 lowercase hex digits"#);
}
