//! The streaming packer under several limits: with no limit it is the streaming packer, bit
//! for bit; with limits every bin keeps every one, every item comes out once, the result does
//! not depend on how the stream is cut, and a saved state continues exactly.

use proptest::prelude::*;
use stowplan_kernel::{
    ClosedBins, Error, LimitedClosedBins, LimitedStreamPacker, OversizePolicy, StreamLimits, StreamOptions,
    StreamPacker,
};

fn options(capacity: u64, align: u64, max_open_bins: u32, max_buffered: u32, oversize: u8) -> StreamOptions {
    let oversize = [OversizePolicy::Error, OversizePolicy::Single, OversizePolicy::Drop][oversize as usize % 3];
    StreamOptions { capacity, align, max_open_bins, max_buffered, oversize }
}

/// Appends `b` to `a`, offsets shifted.
fn extend(a: &mut LimitedClosedBins, b: LimitedClosedBins) {
    let base = a.closed.indices.len() as u32;
    a.closed.offsets.extend(b.closed.offsets[1..].iter().map(|o| o + base));
    a.closed.indices.extend(b.closed.indices);
    a.closed.loads.extend(b.closed.loads);
    a.closed.dropped.extend(b.closed.dropped);
    a.resource_loads.extend(b.resource_loads);
}

fn empty() -> LimitedClosedBins {
    LimitedClosedBins { closed: ClosedBins { offsets: vec![0], ..ClosedBins::default() }, resource_loads: Vec::new() }
}

/// Runs `rows` through a packer in `cuts`-sized calls (a save and restore after each call
/// when `restore`), then finishes.
fn run(
    mut p: LimitedStreamPacker,
    rows: &[u64],
    r: usize,
    cuts: &[usize],
    restore: bool,
) -> Result<LimitedClosedBins, Error> {
    let mut out = empty();
    let mut at = 0;
    let mut k = 0;
    while at < rows.len() / r {
        let step = cuts[k % cuts.len()].max(1).min(rows.len() / r - at);
        extend(&mut out, p.add(&rows[at * r..(at + step) * r])?);
        let s = p.status();
        assert!(s.buffered <= p.options().max_buffered && s.open_bins <= p.options().max_open_bins);
        if restore {
            p = LimitedStreamPacker::from_state(&p.state()).expect("a saved state restores");
        }
        at += step;
        k += 1;
    }
    extend(&mut out, p.finish());
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// No limit and no segment limit: the streaming packer's bins, call for call.
    #[test]
    fn without_limits_it_is_the_streaming_packer(
        lengths in prop::collection::vec(0u64..130, 1..300),
        capacity in 1u64..120, align in prop::sample::select(vec![1u64, 1, 8]),
        open in 1u32..6, buffered in 0u32..20, oversize in 1u8..3,
        cuts in prop::collection::vec(1usize..40, 1..4),
    ) {
        let o = options(capacity, align, open, buffered, oversize);
        let mut plain = StreamPacker::new(o).unwrap();
        let mut limited = LimitedStreamPacker::new(o, StreamLimits::default()).unwrap();
        let mut at = 0;
        let mut k = 0;
        while at < lengths.len() {
            let step = cuts[k % cuts.len()].min(lengths.len() - at);
            let a = plain.add(&lengths[at..at + step]).unwrap();
            let b = limited.add(&lengths[at..at + step]).unwrap();
            prop_assert_eq!(&a, &b.closed);
            at += step;
            k += 1;
        }
        prop_assert_eq!(plain.finish(), limited.finish().closed);
    }

    /// Under limits: every bin within every cap (oversized `single` bins alone), every item
    /// in one bin or dropped, the same bins however the stream is cut or restored.
    #[test]
    fn every_bin_keeps_every_limit(
        rows in prop::collection::vec((0u64..90, 0u64..40, 0u64..5), 1..250),
        capacity in 20u64..120, caps in (1u64..60, 1u64..6), max_segments in prop::sample::select(vec![0u64, 1, 3]),
        open in 1u32..6, buffered in 0u32..20, oversize in 1u8..3,
        cuts in prop::collection::vec(1usize..40, 1..4),
    ) {
        let flat: Vec<u64> = rows.iter().flat_map(|&(t, it, im)| [t, it, im]).collect();
        let o = options(capacity, 1, open, buffered, oversize);
        let limits = StreamLimits { caps: vec![caps.0, caps.1], names: vec!["image_tokens".into(), "images".into()], max_segments };
        let packer = || LimitedStreamPacker::new(o, limits.clone()).unwrap();
        let whole = run(packer(), &flat, 3, &[flat.len()], false).unwrap();
        prop_assert_eq!(&run(packer(), &flat, 3, &cuts, false).unwrap(), &whole);
        prop_assert_eq!(&run(packer(), &flat, 3, &cuts, true).unwrap(), &whole);
        let c = &whole.closed;
        let mut seen = vec![0u32; rows.len()];
        for b in 0..c.bins() {
            let members = c.bin(b);
            prop_assert!(members.windows(2).all(|w| w[0] < w[1]));
            members.iter().for_each(|&i| seen[i as usize] += 1);
            let load = |f: &dyn Fn(&(u64, u64, u64)) -> u64| members.iter().map(|&i| f(&rows[i as usize])).sum::<u64>();
            let (t, it, im) = (load(&|r| r.0), load(&|r| r.1), load(&|r| r.2));
            prop_assert_eq!((c.loads[b], whole.resource_loads[2 * b], whole.resource_loads[2 * b + 1]), (t, it, im));
            let alone = members.len() == 1;
            prop_assert!(alone || (t <= capacity && it <= caps.0 && im <= caps.1), "bin {} over a limit", b);
            prop_assert!(max_segments == 0 || members.len() as u64 <= max_segments);
        }
        for &i in &c.dropped {
            seen[i as usize] += 1;
            let (t, it, im) = rows[i as usize];
            prop_assert!(t > capacity || it > caps.0 || im > caps.1, "dropped item {} fits", i);
        }
        prop_assert!(seen.iter().all(|&k| k == 1), "an item lost or repeated: {:?}", seen);
    }
}

#[test]
fn errors_name_the_item_and_the_limit() {
    let o = StreamOptions::new(100);
    let limits = StreamLimits { caps: vec![8], names: vec!["images".into()], max_segments: 0 };
    let mut p = LimitedStreamPacker::new(o, limits.clone()).unwrap();
    let e = p.add(&[10, 1, 20, 9]).unwrap_err();
    assert!(
        matches!(e, Error::Infeasible(ref m) if m.contains("stream index 1 has 9 images, more than its cap 8")),
        "{e}"
    );
    assert_eq!(p.status().next_index, 0, "nothing applied");
    assert!(p.add(&[1, 2, 3]).unwrap_err().to_string().contains("whole rows of 2 values"));
    let bad = |caps: Vec<u64>, names: Vec<&str>| {
        let l = StreamLimits { caps, names: names.into_iter().map(String::from).collect(), max_segments: 0 };
        LimitedStreamPacker::new(o, l).unwrap_err().to_string()
    };
    assert!(bad(vec![0], vec!["images"]).contains("the cap of images must be at least 1"));
    assert!(bad(vec![1, 2], vec!["a", "a"]).contains("all different"));
    assert!(bad(vec![1], vec!["tokens"]).contains("not \"tokens\""));
    assert!(bad(vec![1; 8], vec![]).contains("at most 7 caps"));
    // States: damage and other kinds are refused.
    let mut q = LimitedStreamPacker::new(o, limits).unwrap();
    q.add(&[10, 1, 20, 2]).unwrap();
    let state = q.state();
    assert!(
        LimitedStreamPacker::from_state(&StreamPacker::new(o).unwrap().state())
            .unwrap_err()
            .to_string()
            .contains("\"SPSL\"")
    );
    for at in [0, 5, 17, state.len() / 2, state.len() - 1] {
        let mut damaged = state.clone();
        damaged[at] ^= 1;
        assert!(LimitedStreamPacker::from_state(&damaged).is_err(), "a flip at {at} restored");
    }
    assert!(LimitedStreamPacker::from_state(&state[..state.len() - 3]).is_err());
    let back = LimitedStreamPacker::from_state(&state).unwrap();
    assert_eq!(back.status(), q.status());
    assert_eq!(back.limits().names, ["images"]);
}

#[test]
fn without_limits_the_state_is_the_plain_packers_inside_its_own_frame() {
    let o = StreamOptions { max_buffered: 2, ..StreamOptions::new(10) };
    let mut p = LimitedStreamPacker::new(o, StreamLimits::default()).unwrap();
    let mut q = StreamPacker::new(o).unwrap();
    assert_eq!(p.add(&[4, 6, 7, 3]).unwrap().closed, q.add(&[4, 6, 7, 3]).unwrap());
    let state = p.state();
    assert_eq!(&state[..4], b"SPSL");
    let mut back = LimitedStreamPacker::from_state(&state).unwrap();
    assert_eq!(back.status(), q.status());
    assert_eq!(back.add(&[2, 5]).unwrap().closed, q.add(&[2, 5]).unwrap());
    assert_eq!(back.finish().closed, q.finish());
}
