//! `trl::trl_bfd` against TRL's rule written out naively: per map batch, sequences by
//! (length desc, index asc), each to the open bin with the least room that fits it, among
//! equal rooms the bin that came to have its room first, else a new bin. Small capacities
//! exercise the room buckets, large ones the ordered set.

use proptest::prelude::*;
use stowplan_kernel::peers::trl::trl_bfd;
use stowplan_kernel::{Error, PackOptions, pack};

/// The rule, quadratically: bins as (room, when it got that room, members).
fn reference(lengths: &[u64], batch_ends: &[u32], seq_length: u64) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut clock = 0u64;
    for &end in batch_ends {
        let end = end as usize;
        let mut order: Vec<usize> = (start..end).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(lengths[i]), i));
        let mut bins: Vec<(u64, u64, Vec<u32>)> = Vec::new();
        for i in order {
            let size = lengths[i];
            let best =
                (0..bins.len()).filter(|&b| bins[b].0 >= size && bins[b].0 > 0).min_by_key(|&b| (bins[b].0, bins[b].1));
            let b = best.unwrap_or_else(|| {
                bins.push((seq_length, 0, Vec::new()));
                bins.len() - 1
            });
            bins[b].0 -= size;
            bins[b].1 = clock;
            clock += 1;
            bins[b].2.push(i as u32);
        }
        out.extend(bins.into_iter().map(|(_, _, m)| m));
        start = end;
    }
    out
}

fn grouped(offsets: &[u32], indices: &[u32]) -> Vec<Vec<u32>> {
    offsets.windows(2).map(|w| indices[w[0] as usize..w[1] as usize].to_vec()).collect()
}

/// Lengths (few distinct values, so rooms tie often), batch ends and seq_length.
fn case() -> impl Strategy<Value = (Vec<u64>, Vec<u32>, u64)> {
    (prop_oneof![1u64..=64, 8_000u64..=(1 << 22)], 1usize..=6)
        .prop_flat_map(|(seq_length, kinds)| {
            let unit = (seq_length / 8).max(1);
            let sizes = proptest::collection::vec(1u64..=8, kinds);
            (Just(seq_length), Just(unit), sizes, proptest::collection::vec((0usize..6, 0u64..3), 0..120))
        })
        .prop_flat_map(|(seq_length, unit, sizes, picks)| {
            let lengths: Vec<u64> = picks
                .iter()
                .map(|&(k, jitter)| (sizes[k % sizes.len()] * unit + jitter).clamp(1, seq_length))
                .collect();
            let n = lengths.len();
            (Just(lengths), proptest::collection::vec(0..=n as u32, 0..5), Just(seq_length))
        })
        .prop_map(|(lengths, mut cuts, seq_length)| {
            cuts.push(lengths.len() as u32);
            cuts.sort_unstable();
            (lengths, cuts, seq_length)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn matches_trls_rule((lengths, batch_ends, seq_length) in case()) {
        let (offsets, indices) = trl_bfd(&lengths, &batch_ends, seq_length).unwrap();
        prop_assert_eq!(grouped(&offsets, &indices), reference(&lengths, &batch_ends, seq_length));
    }
}

#[test]
fn a_tie_goes_to_the_bin_that_had_the_room_first() {
    // 12 opens bin 0 (room 8), 10 bin 1 (room 10); 9 goes to bin 1 (room 1), 7 to bin 0
    // (room 1, later than bin 1): the last 1 goes to bin 1, where the kernel's best fit
    // (the oldest bin on ties) puts it in bin 0.
    let lengths = [12, 10, 9, 7, 1];
    let (offsets, indices) = trl_bfd(&lengths, &[5], 20).unwrap();
    assert_eq!(grouped(&offsets, &indices), vec![vec![0, 3], vec![1, 2, 4]]);
    assert_eq!(grouped(&offsets, &indices), reference(&lengths, &[5], 20));
    let kernel = pack(&lengths, &PackOptions::new(20)).unwrap();
    assert_eq!(grouped(&kernel.offsets, &kernel.indices), vec![vec![0, 3, 4], vec![1, 2]]);
}

#[test]
fn bins_never_span_batches() {
    let (offsets, indices) = trl_bfd(&[3, 3, 3, 3], &[1, 1, 4], 10).unwrap();
    assert_eq!(grouped(&offsets, &indices), vec![vec![0], vec![1, 2, 3]]);
    assert_eq!(trl_bfd(&[], &[], 5).unwrap(), (vec![0], vec![]));
    assert_eq!(trl_bfd(&[], &[0, 0], 5).unwrap(), (vec![0], vec![]));
}

#[test]
fn errors_name_the_argument() {
    let invalid = |r: Result<(Vec<u32>, Vec<u32>), Error>, what: &str| match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(what), "{m:?} names {what:?}"),
        other => panic!("{what}: {other:?}"),
    };
    invalid(trl_bfd(&[1], &[1], 0), "seq_length must be at least 1");
    invalid(trl_bfd(&[1, 0], &[2], 4), "lengths[1] = 0 is outside 1..=4");
    invalid(trl_bfd(&[1, 5], &[2], 4), "lengths[1] = 5 is outside 1..=4");
    invalid(trl_bfd(&[1, 2], &[2, 1], 4), "batch_ends[1] = 1 is outside 2..=2");
    invalid(trl_bfd(&[1, 2], &[3], 4), "batch_ends[0] = 3 is outside 0..=2");
    invalid(trl_bfd(&[1, 2], &[1], 4), "batch_ends must end at the 2 lengths");
    invalid(trl_bfd(&[1], &[], 4), "batch_ends must end at the 1 lengths");
}
