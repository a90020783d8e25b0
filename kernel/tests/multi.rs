//! Packing under several limits (`pack_multi`): every pack within every limit, the
//! fits equal to naive implementations of the documented rules, one resource equal to `pack`
//! bit for bit, and the errors.

use proptest::prelude::*;
use stowplan_kernel::{
    Error, MAX_MULTI_ITEMS, MultiMethod, MultiOptions, MultiPacking, OversizePolicy, PackMethod, PackOptions, pack,
    pack_multi,
};

#[path = "support/vlm.rs"]
mod vlm;

const METHODS: [MultiMethod; 4] = [MultiMethod::Bfd, MultiMethod::Ffd, MultiMethod::NextFit, MultiMethod::Balanced];
/// `pack`'s method for each of [`METHODS`] with one resource.
const SINGLE: [PackMethod; 4] = [PackMethod::Bfd, PackMethod::Ffd, PackMethod::NextFit, PackMethod::Bfd];
const POLICIES: [OversizePolicy; 3] = [OversizePolicy::Error, OversizePolicy::Single, OversizePolicy::Drop];

/// The sizes the fits work on (tokens aligned, the segment resource last) and capacities.
fn work(sizes: &[u64], o: &MultiOptions<'_>) -> (Vec<Vec<u64>>, Vec<u64>) {
    let r = o.capacities.len();
    let mut caps = o.capacities.to_vec();
    if o.max_segments > 0 {
        caps.push(o.max_segments);
    }
    let items = sizes
        .chunks(r)
        .map(|row| {
            let mut v = row.to_vec();
            v[0] = v[0].div_ceil(o.align) * o.align;
            if o.max_segments > 0 {
                v.push(1);
            }
            v
        })
        .collect();
    (items, caps)
}

fn fits(item: &[u64], room: &[u64]) -> bool {
    item.iter().zip(room).all(|(s, r)| s <= r)
}

/// The documented rules, naively: the bins as member lists (before sorting), or `None` when
/// an item is oversized under `error`.
fn reference(sizes: &[u64], o: &MultiOptions<'_>) -> Option<Vec<Vec<u32>>> {
    let (items, caps) = work(sizes, o);
    let over: Vec<bool> = items.iter().map(|it| !fits(it, &caps)).collect();
    if o.oversize == OversizePolicy::Error && over.iter().any(|&x| x) {
        return None;
    }
    let single = o.oversize == OversizePolicy::Single;
    let mut bins: Vec<Vec<u32>> = Vec::new();
    if o.method == MultiMethod::NextFit {
        let mut room: Option<Vec<u64>> = None;
        for (i, it) in items.iter().enumerate() {
            if over[i] {
                if single {
                    bins.push(vec![i as u32]);
                    room = None;
                }
                continue;
            }
            match &mut room {
                Some(r) if fits(it, r) => {}
                _ => {
                    bins.push(Vec::new());
                    room = Some(caps.clone());
                }
            }
            let r = room.as_mut().unwrap();
            for (q, s) in it.iter().enumerate() {
                r[q] -= s;
            }
            bins.last_mut().unwrap().push(i as u32);
        }
        return Some(bins);
    }
    let share = |it: &[u64]| -> u128 { it.iter().zip(&caps).map(|(&s, &c)| ((s as u128) << 64) / c as u128).sum() };
    if single {
        let mut big: Vec<usize> = (0..items.len()).filter(|&i| over[i]).collect();
        big.sort_by(|&a, &b| share(&items[b]).cmp(&share(&items[a])).then(a.cmp(&b)));
        bins.extend(big.into_iter().map(|i| vec![i as u32]));
    }
    let mut order: Vec<usize> = (0..items.len()).filter(|&i| !over[i]).collect();
    order.sort_by(|&a, &b| share(&items[b]).cmp(&share(&items[a])).then(a.cmp(&b)));
    let first = bins.len();
    let mut rooms: Vec<Vec<u64>> = Vec::new();
    for i in order {
        let it = &items[i];
        let mut d = 0;
        for q in 1..it.len() {
            if (it[q] as u128) * (caps[d] as u128) > (it[d] as u128) * (caps[q] as u128) {
                d = q;
            }
        }
        let candidates = (0..rooms.len()).filter(|&b| fits(it, &rooms[b]));
        let chosen =
            if o.method == MultiMethod::Ffd { candidates.min() } else { candidates.min_by_key(|&b| (rooms[b][d], b)) };
        let b = chosen.unwrap_or_else(|| {
            rooms.push(caps.clone());
            bins.push(Vec::new());
            rooms.len() - 1
        });
        for (q, s) in it.iter().enumerate() {
            rooms[b][q] -= s;
        }
        bins[first + b].push(i as u32);
    }
    Some(bins)
}

/// The balanced method's documented rules (see `multi/fill.rs`), naively: linear scans
/// instead of its buckets, directories and indices.
fn reference_balanced(sizes: &[u64], o: &MultiOptions<'_>) -> Option<Vec<Vec<u32>>> {
    const TRIES: usize = 4;
    const SMALL_TRIES: usize = 4;
    const UNITS: u64 = 8192;
    let (items, caps) = work(sizes, o);
    let over: Vec<bool> = items.iter().map(|it| !fits(it, &caps)).collect();
    if o.oversize == OversizePolicy::Error && over.iter().any(|&x| x) {
        return None;
    }
    let r = o.capacities.len();
    let caps = &caps[..r];
    let share = |it: &[u64]| -> u128 { it.iter().zip(caps).map(|(&s, &c)| ((s as u128) << 64) / c as u128).sum() };
    let mut bins: Vec<Vec<u32>> = Vec::new();
    if o.oversize == OversizePolicy::Single {
        let mut big: Vec<usize> = (0..items.len()).filter(|&i| over[i]).collect();
        // With a segment limit the share counts the segment too (1 / max_segments each).
        let sh = |i: usize| {
            share(&items[i][..r]) + if o.max_segments > 0 { (1u128 << 64) / o.max_segments as u128 } else { 0 }
        };
        big.sort_by(|&a, &b| sh(b).cmp(&sh(a)).then(a.cmp(&b)));
        bins.extend(big.into_iter().map(|i| vec![i as u32]));
    }
    let first = bins.len();
    let segs_cap = if o.max_segments == 0 { u64::MAX } else { o.max_segments };
    let norm = |v: u64, q: usize| -> u64 { (v * ((1u64 << 63) / caps[q])) >> 32 };
    let qb = (1..r).min_by_key(|&q| (caps[q], q)).unwrap_or(0);
    let bucket = |v: u64| -> u64 {
        let per = caps[qb].min(64);
        let u = if per == caps[qb] { v } else { v * per / caps[qb] };
        if u <= 4 { u } else { 2 + (64 - (u - 1).leading_zeros()) as u64 }
    };
    let (mut large, mut small, mut text) = (Vec::new(), Vec::new(), Vec::new());
    for i in (0..items.len()).filter(|&i| !over[i]) {
        let row = &items[i][..r];
        if row[1..].iter().all(|&s| s == 0) {
            text.push(i);
        } else if bucket(row[qb]) >= 2 || (0..r).map(|q| norm(row[q], q) >> 20).max().unwrap() >= 164 {
            large.push(i);
        } else {
            small.push(i);
        }
    }
    let mut rooms: Vec<Vec<u64>> = Vec::new();
    let mut segs: Vec<u64> = Vec::new();
    let put = |rooms: &mut Vec<Vec<u64>>, segs: &mut Vec<u64>, bins: &mut Vec<Vec<u32>>, b: usize, i: usize| {
        for q in 0..r {
            rooms[b][q] -= items[i][q];
        }
        segs[b] -= 1;
        bins[first + b].push(i as u32);
    };
    let open = |rooms: &mut Vec<Vec<u64>>, segs: &mut Vec<u64>, bins: &mut Vec<Vec<u32>>| {
        rooms.push(caps.to_vec());
        segs.push(segs_cap);
        bins.push(Vec::new());
        rooms.len() - 1
    };
    // Phase 1a.
    let qk = (0..r)
        .filter(|&q| q != qb)
        .max_by_key(|&q| (large.iter().map(|&i| norm(items[i][q], q) >> 8).sum::<u64>(), std::cmp::Reverse(q)))
        .unwrap_or(0);
    let top = |i: usize| (0..r).map(|q| norm(items[i][q], q) >> 20).max().unwrap();
    let mut openers: Vec<usize> = (0..large.len()).collect();
    openers.sort_by_key(|&j| (std::cmp::Reverse(top(large[j])), j));
    let mut placed = vec![false; large.len()];
    for o in openers {
        if placed[o] {
            continue;
        }
        let b = open(&mut rooms, &mut segs, &mut bins);
        let mut p = o;
        loop {
            placed[p] = true;
            put(&mut rooms, &mut segs, &mut bins, b, large[p]);
            if segs[b] == 0 {
                break;
            }
            let left: Vec<u64> = (0..r).map(|q| norm(rooms[b][q], q)).collect();
            let mut best: Option<((u64, u64), usize)> = None;
            for k in 0..=8 {
                let mut alive: Vec<usize> =
                    (0..large.len()).filter(|&j| !placed[j] && bucket(items[large[j]][qb]) == k).collect();
                alive.sort_by_key(|&j| (items[large[j]][qk], std::cmp::Reverse(j)));
                let below = alive.iter().filter(|&&j| items[large[j]][qk] <= rooms[b][qk]).count();
                for &j in alive[..below].iter().rev().take(TRIES) {
                    if fits(&items[large[j]][..r], &rooms[b]) {
                        let u: Vec<u64> = (0..r).map(|q| left[q].saturating_sub(norm(items[large[j]][q], q))).collect();
                        let e = (u.iter().max().unwrap() - u.iter().min().unwrap(), u.iter().sum::<u64>());
                        if best.is_none_or(|(be, bj)| (e, j) < (be, bj)) {
                            best = Some((e, j));
                        }
                        break;
                    }
                }
            }
            match best {
                Some((_, j)) => p = j,
                None => break,
            }
        }
    }
    // Phase 1b.
    if !small.is_empty() {
        let least: Vec<u64> = (0..r).map(|q| small.iter().map(|&i| items[i][q]).min().unwrap()).collect();
        let most: Vec<u64> = (0..r).map(|q| small.iter().map(|&i| items[i][q]).max().unwrap()).collect();
        let with_qb = least[qb] != most[qb];
        let used = |q: usize| q != qb || with_qb;
        let key = |i: usize| {
            (0..r)
                .filter(|&q| used(q))
                .map(|q| ((items[i][q] * (UNITS << 32).div_ceil(caps[q])) >> 32) + 1)
                .max()
                .unwrap()
                .min(UNITS + 1)
        };
        let room_key = |room: &[u64]| {
            (0..r)
                .filter(|&q| used(q))
                .map(|q| (room[q] * ((UNITS << 32) / caps[q])) >> 32)
                .min()
                .unwrap_or(UNITS)
                .min(UNITS)
        };
        small.sort_by_key(|&i| (std::cmp::Reverse(key(i)), i));
        for &i in &small {
            let need = key(i);
            let mut viable: Vec<(u64, usize)> = (0..rooms.len())
                .filter(|&b| segs[b] > 0 && (0..r).all(|q| rooms[b][q] >= least[q]) && room_key(&rooms[b]) >= need)
                .map(|b| (room_key(&rooms[b]), b))
                .collect();
            viable.sort();
            let found = viable.iter().take(SMALL_TRIES).map(|&(_, b)| b).find(|&b| fits(&items[i][..r], &rooms[b]));
            let b = found.unwrap_or_else(|| open(&mut rooms, &mut segs, &mut bins));
            put(&mut rooms, &mut segs, &mut bins, b, i);
        }
    }
    // Phase 2.
    text.sort_by_key(|&i| (std::cmp::Reverse(items[i][0]), i));
    for &i in &text {
        let found =
            (0..rooms.len()).filter(|&b| segs[b] > 0 && rooms[b][0] >= items[i][0]).min_by_key(|&b| (rooms[b][0], b));
        let b = found.unwrap_or_else(|| open(&mut rooms, &mut segs, &mut bins));
        put(&mut rooms, &mut segs, &mut bins, b, i);
    }
    Some(bins)
}

/// Every invariant of a result: each index once (or dropped), bins within every limit
/// (but `single` ones), loads, bounds.
fn check(sizes: &[u64], o: &MultiOptions<'_>, p: &MultiPacking) {
    let r = o.capacities.len();
    let n = sizes.len() / r;
    let (items, caps) = work(sizes, o);
    let mut seen = vec![false; n];
    let bins = p.packing.bins();
    assert_eq!(p.resource_loads.len(), bins * r);
    for b in 0..bins {
        let members = p.packing.bin(b);
        assert!(!members.is_empty(), "no empty bin");
        assert!(members.windows(2).all(|w| w[0] < w[1]), "members ascending");
        let mut load = vec![0u64; caps.len()];
        for &i in members {
            assert!(!std::mem::replace(&mut seen[i as usize], true), "index {i} twice");
            for (q, s) in items[i as usize].iter().enumerate() {
                load[q] += s;
            }
        }
        assert_eq!(&load[..r], &p.resource_loads[b * r..(b + 1) * r], "resource loads of bin {b}");
        assert_eq!(load[0], p.packing.loads[b], "token load of bin {b}");
        if p.packing.single.binary_search(&members[0]).is_err() {
            assert!(fits(&load, &caps), "bin {b} within every limit: {load:?} vs {caps:?}");
        } else {
            assert_eq!(members.len(), 1, "a single bin holds one item");
        }
    }
    for &i in &p.packing.dropped {
        assert!(!std::mem::replace(&mut seen[i as usize], true), "dropped {i} also packed");
        assert!(!fits(&items[i as usize], &caps), "only oversized items are dropped");
    }
    assert!(seen.iter().all(|&s| s), "every index packed or dropped");
    let fitting: Vec<&Vec<u64>> = items.iter().filter(|it| fits(it, &caps)).collect();
    if r > 1 || o.max_segments > 0 {
        let bounds: Vec<u64> =
            (0..caps.len()).map(|q| fitting.iter().map(|it| it[q]).sum::<u64>().div_ceil(caps[q])).collect();
        assert_eq!(p.lower_bounds, bounds);
    }
    assert_eq!(p.packing.lower_bound, *p.lower_bounds.iter().max().unwrap());
    let regular = bins - p.packing.single.len();
    assert!(regular as u64 >= p.packing.lower_bound, "the lower bound is a bound");
}

fn sorted(mut bins: Vec<Vec<u32>>) -> Vec<Vec<u32>> {
    for b in &mut bins {
        b.sort_unstable();
    }
    bins
}

fn bins_of(p: &MultiPacking) -> Vec<Vec<u32>> {
    (0..p.packing.bins()).map(|b| p.packing.bin(b).to_vec()).collect()
}

/// Items of 1–4 resources and capacities, with many zeros and sizes near the capacities.
fn case() -> impl Strategy<Value = (Vec<u64>, Vec<u64>, u64, u64, usize, usize)> {
    (1usize..=4, 1usize..120).prop_flat_map(|(r, n)| {
        (
            prop::collection::vec(prop_oneof![Just(0u64), 0u64..40, 0u64..120], n * r),
            prop::collection::vec(1u64..100, r),
            prop_oneof![Just(0u64), 1u64..10],
            prop_oneof![Just(1u64), 1u64..6],
            0usize..4,
            0usize..3,
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn every_pack_is_within_every_limit_and_follows_the_documented_rule(
        (sizes, caps, max_segments, align, m, ov) in case()
    ) {
        let o = MultiOptions { capacities: &caps, names: &[], max_segments, align, method: METHODS[m], oversize: POLICIES[ov] };
        let got = pack_multi(&sizes, &o);
        let want = if o.method == MultiMethod::Balanced { reference_balanced(&sizes, &o) } else { reference(&sizes, &o) };
        match want {
            None => prop_assert!(matches!(got, Err(Error::Infeasible(_))), "{got:?}"),
            Some(want) => {
                let p = got.unwrap();
                check(&sizes, &o, &p);
                prop_assert_eq!(bins_of(&p), sorted(want));
            }
        }
    }

    #[test]
    fn one_resource_is_pack_bit_for_bit(
        lengths in prop::collection::vec(0u64..200, 1..150), capacity in 1u64..150, align in 1u64..5,
        m in 0usize..4, ov in 0usize..3, zeros: bool,
    ) {
        let o = PackOptions { align, method: SINGLE[m], oversize: POLICIES[ov], ..PackOptions::new(capacity) };
        let want = pack(&lengths, &o);
        let one = pack_multi(&lengths, &MultiOptions { capacities: &[capacity], names: &[], max_segments: 0, align, method: METHODS[m], oversize: o.oversize });
        prop_assert_eq!(one.as_ref().map(|p| &p.packing), want.as_ref());
        // A second resource every item leaves empty goes through the vector fits and changes
        // nothing: the same bins as `pack`.
        let wide = if zeros { 1 } else { 1_000 };
        let sizes: Vec<u64> = lengths.iter().flat_map(|&l| [l, 0]).collect();
        let two = pack_multi(&sizes, &MultiOptions { capacities: &[capacity, wide], names: &[], max_segments: 0, align, method: METHODS[m], oversize: o.oversize });
        match (two, want) {
            (Ok(t), Ok(w)) => {
                prop_assert_eq!(&t.packing.offsets, &w.offsets);
                prop_assert_eq!(&t.packing.indices, &w.indices);
                prop_assert_eq!(&t.packing.loads, &w.loads);
                prop_assert_eq!(&t.packing.dropped, &w.dropped);
                prop_assert_eq!(&t.packing.single, &w.single);
            }
            (Err(_), Err(_)) => {}
            (t, w) => prop_assert!(false, "{t:?} vs {w:?}"),
        }
    }
}

/// Items shaped like vision-language samples: half text only, the others with small or large
/// shares of 2–4 resources whose capacities differ widely (so every phase of the balanced
/// method and each of its buckets is reached).
fn vlm_case() -> impl Strategy<Value = (Vec<u64>, Vec<u64>, u64)> {
    (2usize..=4, 1usize..260).prop_flat_map(|(r, n)| {
        let caps = (100u64..3000, prop::collection::vec(2u64..400, r - 1));
        (
            caps,
            prop::collection::vec((any::<bool>(), 0u64..4, prop::collection::vec(0u64..1000, r)), n),
            prop_oneof![Just(0u64), 2u64..40],
        )
            .prop_map(move |((c0, rest), raw, seg)| {
                let caps: Vec<u64> = std::iter::once(c0).chain(rest).collect();
                let sizes = raw
                    .iter()
                    .flat_map(|(text, scale, v)| {
                        // Scale 0: ≤ 1/64 of the capacity, 1: ≤ 1/16, 2: ≤ 1/4, 3: up to all of it.
                        let div = [64u64, 16, 4, 1][*scale as usize];
                        let caps = caps.clone();
                        v.iter()
                            .enumerate()
                            .map(move |(q, &x)| if q > 0 && *text { 0 } else { x * caps[q] / 1000 / div })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                (sizes, caps, seg)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn balanced_follows_its_documented_rule_on_vlm_like_items((sizes, caps, max_segments) in vlm_case(), ov in 0usize..3) {
        let o = MultiOptions { capacities: &caps, names: &[], max_segments, align: 1, method: MultiMethod::Balanced, oversize: POLICIES[ov] };
        let p = pack_multi(&sizes, &o).unwrap();
        check(&sizes, &o, &p);
        prop_assert_eq!(bins_of(&p), sorted(reference_balanced(&sizes, &o).unwrap()));
    }
}

/// Capacities at the edges of the balanced method's arithmetic (1, around 64 units, around
/// the room index's 2^20, up to 2^32 − 1) and sizes at the edges of each (0, the capacity,
/// one less, a 64th, an 8th, a half, a little over: oversized).
fn extreme_case() -> impl Strategy<Value = (Vec<u64>, Vec<u64>, u64, u64)> {
    const CAPS: [u64; 11] = [1, 2, 63, 64, 65, 100, 1 << 20, (1 << 20) + 1, 1 << 31, (1 << 32) - 2, (1 << 32) - 1];
    (1usize..=8, 1usize..50).prop_flat_map(|(r, n)| {
        (
            prop::collection::vec(prop_oneof![prop::sample::select(&CAPS[..]), 1u64..5000], r),
            prop::collection::vec((any::<bool>(), prop::collection::vec((0usize..8, any::<u64>()), r)), n),
            prop::sample::select(&[0u64, 1, 2, 3, 64, u64::MAX][..]),
            prop::sample::select(&[1u64, 2, 3, 64][..]),
        )
            .prop_map(move |(caps, raw, seg, align)| {
                let sizes = raw
                    .iter()
                    .flat_map(|(text, picks)| {
                        picks
                            .iter()
                            .enumerate()
                            .map(|(q, &(kind, x))| {
                                let c = caps[q];
                                if q > 0 && *text {
                                    return 0;
                                }
                                match kind {
                                    0 => 0,
                                    1 => c,
                                    2 => c - 1,
                                    3 => c / 64,
                                    4 => c / 8,
                                    5 => c / 2,
                                    6 => c + 1 + x % 3,
                                    _ => x % (c + 1),
                                }
                            })
                            .collect::<Vec<_>>()
                    })
                    .collect();
                (sizes, caps.clone(), seg, align)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn balanced_follows_its_rule_at_the_edges_of_its_arithmetic((sizes, caps, max_segments, align) in extreme_case(), ov in 0usize..3) {
        let o = MultiOptions { capacities: &caps, names: &[], max_segments, align, method: MultiMethod::Balanced, oversize: POLICIES[ov] };
        let got = pack_multi(&sizes, &o);
        match reference_balanced(&sizes, &o) {
            None => prop_assert!(matches!(got, Err(Error::Infeasible(_))), "{got:?}"),
            Some(want) => {
                let p = got.unwrap();
                check(&sizes, &o, &p);
                prop_assert_eq!(bins_of(&p), sorted(want));
            }
        }
    }
}

fn opts(caps: &[u64]) -> MultiOptions<'_> {
    MultiOptions {
        capacities: caps,
        names: &[],
        max_segments: 0,
        align: 1,
        method: MultiMethod::Bfd,
        oversize: OversizePolicy::Error,
    }
}

#[test]
fn an_item_over_a_limit_follows_each_oversize_policy() {
    let caps = [100, 10, 2];
    let sizes = [50, 5, 1, 60, 3, 3, 40, 11, 0, 30, 2, 1];
    let err = pack_multi(&sizes, &opts(&caps)).unwrap_err();
    assert_eq!(
        err,
        Error::Infeasible(
            "item 1 needs 3 of resource 2 (capacity 2); use oversize single or drop to accept such items".into()
        )
    );
    let single = pack_multi(&sizes, &MultiOptions { oversize: OversizePolicy::Single, ..opts(&caps) }).unwrap();
    assert_eq!(single.packing.single, vec![1, 2]);
    assert_eq!(bins_of(&single)[..2], [vec![1], vec![2]], "single bins first, by share desc");
    assert_eq!(bins_of(&single)[2..], [vec![0, 3]]);
    let dropped = pack_multi(&sizes, &MultiOptions { oversize: OversizePolicy::Drop, ..opts(&caps) }).unwrap();
    assert_eq!(dropped.packing.dropped, vec![1, 2]);
    assert_eq!(bins_of(&dropped), [vec![0, 3]]);
    assert_eq!(dropped.packing.real_tokens, 80);
    assert_eq!(dropped.lower_bounds, vec![1, 1, 1]);
    // Tokens are aligned before the check, and the message says so.
    let aligned = pack_multi(&[99, 0], &MultiOptions { align: 8, ..opts(&[100, 1]) }).unwrap_err();
    assert!(
        matches!(&aligned, Error::Infeasible(m) if m.contains("needs 104 of resource 0 (capacity 100, tokens aligned to 8)")),
        "{aligned:?}"
    );
}

#[test]
fn the_segment_limit_caps_items_per_pack() {
    let sizes = [1u64; 10];
    let p = pack_multi(&sizes, &MultiOptions { max_segments: 3, ..opts(&[100]) }).unwrap();
    assert_eq!(p.packing.bins(), 4);
    assert_eq!(p.lower_bounds, vec![1, 4]);
    assert!((0..4).all(|b| p.packing.bin(b).len() <= 3));
}

#[test]
fn names_say_which_resource_and_are_checked() {
    let names: Vec<String> = ["tokens", "image_tokens", "images"].map(String::from).to_vec();
    let caps = [100, 10, 2];
    let err = pack_multi(&[50, 5, 1, 60, 3, 3], &MultiOptions { names: &names, ..opts(&caps) }).unwrap_err();
    assert_eq!(
        err,
        Error::Infeasible(
            "item 1 needs 3 images (capacity 2); use oversize single or drop to accept such items".into()
        )
    );
    let msg = |names: &[String]| match pack_multi(&[1, 1, 1], &MultiOptions { names, ..opts(&caps) }).unwrap_err() {
        Error::InvalidArgument(m) => m,
        e => panic!("{e:?}"),
    };
    let twice: Vec<String> = ["tokens", "images", "images"].map(String::from).to_vec();
    assert_eq!(msg(&twice), "names[2] = \"images\" is given twice (also names[1])");
    assert_eq!(msg(&names[..2]), "names has 2 entries and capacities 3: one name per capacity, or none");
    let seg: Vec<String> = ["tokens", "segments", "images"].map(String::from).to_vec();
    let r = pack_multi(&[1, 1, 1], &MultiOptions { names: &seg, max_segments: 4, ..opts(&caps) });
    assert!(matches!(&r, Err(Error::InvalidArgument(m)) if m.contains("is the segment limit's name")), "{r:?}");
    assert!(
        pack_multi(&[1, 1, 1], &MultiOptions { names: &seg, ..opts(&caps) }).is_ok(),
        "a column may be called segments without the limit"
    );
    let empty: Vec<String> = ["tokens", "", "images"].map(String::from).to_vec();
    assert_eq!(msg(&empty), "names[1] must not be empty");
    // One named resource goes through `pack`, and the message still names it.
    let tok: Vec<String> = vec!["tok".into()];
    let one = pack_multi(&[5, 30], &MultiOptions { names: &tok, align: 4, ..opts(&[10]) }).unwrap_err();
    assert_eq!(
        one,
        Error::Infeasible(
            "item 1 needs 32 tok (capacity 10, tokens aligned to 4); use oversize single or drop to accept such items"
                .into()
        )
    );
    let over = pack_multi(&[u64::MAX, 1, 1, 1, 1, 1], &MultiOptions { names: &names, ..opts(&[u64::MAX, 10, 10]) });
    assert!(
        matches!(&over, Err(Error::InvalidArgument(m)) if m.contains("the sum of the sizes of tokens overflows")),
        "{over:?}"
    );
}

#[test]
fn bad_arguments_are_named() {
    let msg = |r: Result<MultiPacking, Error>| match r.unwrap_err() {
        Error::InvalidArgument(m) => m,
        e => panic!("{e:?}"),
    };
    assert!(msg(pack_multi(&[1, 2, 3], &opts(&[10, 10]))).contains("whole number (≥ 1) of rows of 2 values"));
    assert!(msg(pack_multi(&[], &opts(&[10]))).contains("whole number (≥ 1) of rows"));
    assert!(msg(pack_multi(&[1], &opts(&[]))).contains("capacities must have 1 to 8 entries (got 0)"));
    assert!(msg(pack_multi(&[1; 9], &opts(&[1; 9]))).contains("capacities must have 1 to 8 entries (got 9)"));
    assert!(msg(pack_multi(&[1, 1], &opts(&[10, 0]))).contains("capacities[1] must be at least 1 (got 0)"));
    assert!(
        msg(pack_multi(&[1, 1], &MultiOptions { align: 0, ..opts(&[10, 10]) })).contains("align must be at least 1")
    );
    assert!(
        msg(pack_multi(&[u64::MAX, 1, 1, 1], &opts(&[u64::MAX, 10])))
            .contains("the sum of the sizes of resource 0 overflows")
    );
    let many = vec![1u64; 2 * (MAX_MULTI_ITEMS + 1)];
    assert!(msg(pack_multi(&many, &opts(&[10, 10]))).contains("at most 262144 items per call"));
}

/// Micro-batches under further limits: every micro-batch within the token
/// cap and every limit, every sequence exactly once, no empty micro-batch, the count at least
/// the per-resource bound and at most best-fit decreasing's under all the caps (before
/// `min_count`), loads reported right; a batch that uses none of the limited resources gets
/// `micro_batches_with_extra`'s plan exactly.
mod limited_micro_batches {
    use super::vlm::{VlmBatch, vlm_batch};
    use proptest::prelude::*;
    use stowplan_kernel::{Cost, Error, MicroLimits, MicroOptions, micro_batches_limited, micro_batches_with_extra};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn every_micro_batch_is_within_every_cap(
            batch in vlm_batch(1..80, (400, 300, 4, 50)),
            cap in 400u64..1200,
            image_cap in 300u64..900,
            images_cap in 4u64..10,
            min_count in 0u32..4,
            attention in any::<bool>(),
        ) {
            let VlmBatch { lengths, sizes, extra } = &batch;
            let caps = [image_cap, images_cap];
            let names = ["image_tokens".to_string(), "images".to_string()];
            let limits = MicroLimits { sizes: &sizes, caps: &caps, names: &names };
            let cost = if attention { Cost::ATTENTION } else { Cost::TOKENS };
            let o = MicroOptions { cost, min_count: min_count.min(lengths.len() as u32), ..MicroOptions::new(cap) };
            let p = micro_batches_limited(&lengths, Some(&extra), &limits, &o).unwrap();
            let mut seen = vec![false; lengths.len()];
            for b in 0..p.plan.count() {
                let members = p.plan.batch(b);
                prop_assert!(!members.is_empty());
                let tokens: u64 = members.iter().map(|&i| lengths[i as usize]).sum();
                prop_assert!(tokens <= cap && tokens == p.plan.tokens[b]);
                for k in 0..2 {
                    let load: u64 = members.iter().map(|&i| sizes[i as usize * 2 + k]).sum();
                    prop_assert!(load <= caps[k], "micro-batch {} over cap {}", b, k);
                    prop_assert_eq!(load, p.loads[b * 2 + k]);
                }
                for &i in members {
                    prop_assert!(!seen[i as usize]);
                    seen[i as usize] = true;
                }
            }
            prop_assert!(seen.iter().all(|&s| s));
            let bound = |sum: u64, c: u64| sum.div_ceil(c).max(1);
            let want = [
                bound(lengths.iter().sum(), cap),
                bound(sizes.iter().step_by(2).sum(), image_cap),
                bound(sizes.iter().skip(1).step_by(2).sum(), images_cap),
            ];
            prop_assert_eq!(&p.lower_bounds[..], &want[..]);
            prop_assert!(p.plan.count() as u64 >= *want.iter().max().unwrap());
            // The count: the balanced fill's under all the caps, raised to min_count.
            let rows3: Vec<u64> = lengths.iter().zip(sizes.chunks(2)).flat_map(|(&l, s)| [l, s[0], s[1]]).collect();
            let all_caps = [cap, image_cap, images_cap];
            let fill = stowplan_kernel::pack_multi(&rows3, &stowplan_kernel::MultiOptions {
                capacities: &all_caps,
                names: &[],
                max_segments: 0,
                align: 1,
                method: stowplan_kernel::MultiMethod::Balanced,
                oversize: stowplan_kernel::OversizePolicy::Error,
            }).unwrap();
            prop_assert_eq!(p.plan.count(), fill.packing.bins().max(o.min_count as usize));
            // A text-only batch (no sequence uses the limited resources): the plain plan, bit
            // for bit.
            let zeros = vec![0u64; sizes.len()];
            let text = micro_batches_limited(&lengths, Some(&extra), &MicroLimits { sizes: &zeros, ..limits }, &o).unwrap();
            prop_assert_eq!(text.plan, micro_batches_with_extra(&lengths, Some(&extra), &o).unwrap());
        }
    }

    #[test]
    fn errors_name_the_limit() {
        let names = ["image_tokens".to_string()];
        let o = MicroOptions::new(100);
        let at = |sizes: &[u64], caps: &[u64], names: &[String]| {
            micro_batches_limited(&[10, 20], None, &MicroLimits { sizes, caps, names }, &o).unwrap_err().to_string()
        };
        assert!(at(&[5, 90], &[50], &names).contains("sequence 1 has 90 image_tokens, more than its cap 50"));
        assert!(matches!(
            micro_batches_limited(&[10, 20], None, &MicroLimits { sizes: &[5, 90], caps: &[50], names: &names }, &o),
            Err(Error::Infeasible(_))
        ));
        assert!(at(&[5], &[50], &names).contains("1 entries per sequence (2 for 2 sequences) (got 1)"));
        assert!(at(&[], &[], &[]).contains("limits must have 1 to 7 caps"));
        assert!(at(&[5, 5], &[0], &names).contains("the cap of image_tokens must be at least 1"));
        assert!(at(&[5, 5], &[50], &["tokens".to_string()]).contains("not \"tokens\""));
        let two = ["a".to_string(), "a".to_string()];
        assert!(at(&[1, 1, 1, 1], &[5, 5], &two).contains("all different"));
        assert!(at(&[5, 5], &[50], &two).contains("one per cap (1) or none (got 2)"));
    }
}

/// Both levels under limits: every rank's micro-batches within every cap, one common count
/// (the largest any rank needs), every sequence once; the DP level is `balance_dp`'s; a batch
/// that uses none of the limited resources gets `plan`'s result exactly.
mod limited_plans {
    use super::vlm::{VlmBatch, vlm_batch};
    use proptest::prelude::*;
    use stowplan_kernel::{
        DpOptions, MicroLimits, MicroOptions, balance_dp, micro_batches_limited, plan, plan_limited,
    };

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn every_rank_keeps_every_cap_with_one_count(
            batch in vlm_batch(8..120, (400, 300, 4, 50)),
            dp in 1u32..5,
            cap in 400u64..1200,
            caps in (300u64..900, 4u64..10),
            extra_costs in any::<bool>(),
        ) {
            let VlmBatch { lengths, sizes, extra } = &batch;
            let caps = [caps.0, caps.1];
            let limits = MicroLimits { sizes: &sizes, caps: &caps, names: &[] };
            let d = DpOptions { extra_costs: extra_costs.then_some(&extra[..]), ..DpOptions::default() };
            let o = MicroOptions::new(cap);
            let p = match plan_limited(&lengths, dp, &d, &o, &limits) {
                Ok(p) => p,
                Err(e) => {
                    // Only when a rank has fewer sequences than the common count needs.
                    prop_assert!(e.to_string().contains("rank"), "{}", e);
                    return Ok(());
                }
            };
            prop_assert_eq!(&p.dp, &balance_dp(&lengths, dp, &d).unwrap());
            let count = p.ranks[0].count();
            let mut seen = vec![false; lengths.len()];
            for (q, mp) in p.ranks.iter().enumerate() {
                prop_assert_eq!(mp.count(), count);
                // The count is the largest any rank needs alone.
                let members = p.dp.rank(q);
                let local: Vec<u64> = members.iter().map(|&i| lengths[i as usize]).collect();
                let local_sizes: Vec<u64> = members.iter().flat_map(|&i| [sizes[2 * i as usize], sizes[2 * i as usize + 1]]).collect();
                let alone = micro_batches_limited(&local, None, &MicroLimits { sizes: &local_sizes, ..limits }, &o).unwrap();
                prop_assert!(alone.plan.count() <= count);
                for b in 0..mp.count() {
                    let batch = mp.batch(b);
                    prop_assert!(batch.iter().all(|i| members.contains(i)));
                    prop_assert!(batch.iter().map(|&i| lengths[i as usize]).sum::<u64>() <= cap);
                    for k in 0..2 {
                        prop_assert!(batch.iter().map(|&i| sizes[2 * i as usize + k]).sum::<u64>() <= caps[k]);
                    }
                    for &i in batch {
                        prop_assert!(!seen[i as usize]);
                        seen[i as usize] = true;
                    }
                }
            }
            prop_assert!(seen.iter().all(|&s| s));
            let zeros = vec![0u64; sizes.len()];
            if let Ok(text) = plan_limited(&lengths, dp, &d, &o, &MicroLimits { sizes: &zeros, ..limits }) {
                prop_assert_eq!(text, plan(&lengths, dp, &d, &o).unwrap());
            }
        }
    }

    #[test]
    fn a_sequence_over_a_limit_is_named() {
        let names = ["images".to_string()];
        let l = MicroLimits { sizes: &[1, 2, 9, 0], caps: &[4], names: &names };
        let e = plan_limited(&[10, 20, 30, 40], 2, &DpOptions::default(), &MicroOptions::new(100), &l).unwrap_err();
        assert!(e.to_string().contains("sequence 2 has 9 images, more than its cap 4"), "{e}");
    }
}
