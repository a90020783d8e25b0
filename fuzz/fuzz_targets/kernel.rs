//! Every kernel entry point (the operations of `wit/kernel.wit`, on the native kernel: the
//! same code the component runs) with arbitrary arguments: each returns a result or a typed
//! error, never panics, and a successful `partition`/`pack` covers every index once. Lists
//! are as long as libFuzzer's input allows (`-max_len`); counts such as `k` or `dp` take any
//! `u32` one time in 16 ([`count`]), so an allocation sized by an argument instead of the
//! input shows up as an out-of-memory crash (it found three: `cp`, `dp` of `balance_dp`,
//! `dp` of `balance_batch`).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use stowplan_kernel as k;
use stowplan_kernel::peers::{RollLoadBalanceOptions, VerlMicroOptions};
use stowplan_kernel::{
    AlignOptions, Cost, DistributeOptions, DpOptions, Factor, MicroOptions, Named, Order, OversizePolicy, PackMethod,
    PackOptions, Padding, PartitionOptions, PlanOptions,
};

/// One call, with its arguments.
#[derive(Arbitrary, Debug)]
enum Call {
    Partition {
        weights: Vec<u64>,
        k: u32,
        method: u8,
        equal_size: bool,
        refine: bool,
    },
    Pack {
        lengths: Vec<u64>,
        capacity: u64,
        align: u64,
        method: u8,
        oversize: u8,
    },
    PackMulti {
        sizes: Vec<u64>,
        capacities: Vec<u64>,
        names: Vec<String>,
        max_segments: u64,
        align: u64,
        method: u8,
        oversize: u8,
    },
    MicroBatches {
        lengths: Vec<u64>,
        capacity: u64,
        cost: (u64, u64),
        min_count: u32,
        divisible_by: u32,
        forced: Option<u32>,
        order: u8,
    },
    BalanceDp {
        lengths: Vec<u64>,
        dp: u32,
        cost: (u64, u64),
        groups: Option<Vec<u32>>,
        minibatch_size: Option<u32>,
        equal_count: bool,
        extra: Option<Vec<u64>>,
    },
    Plan {
        lengths: Vec<u64>,
        dp: u32,
        capacity: u64,
        minibatch_size: Option<u32>,
        order: u8,
    },
    Verl {
        seqlens: Vec<i64>,
        k: u32,
        equal_size: bool,
        function: u8,
    },
    VerlMicro {
        seqlens: Vec<i64>,
        max_token_len: i64,
        min: Option<i64>,
        divided_by: Option<i64>,
        dynamic: bool,
        group: i64,
        width: Option<i64>,
        dp_num: Option<i64>,
    },
    BalanceBatch {
        seqlens: Vec<i64>,
        dp: u32,
        minibatch_size: Option<i64>,
    },
    Roll {
        lengths: Vec<i64>,
        mask_width: i64,
        max_len: i64,
        min: i64,
        tp: i64,
        cp: i64,
        vp: i64,
        dp_num: Option<i64>,
    },
    PadFactor {
        cp: u32,
        tp: u32,
        factor: Option<u64>,
        roll: bool,
        power_of_two: bool,
    },
    CpLayout {
        lengths: Vec<u64>,
        cp: u32,
        tp: u32,
        factor: Option<u64>,
    },
    Distribute {
        lengths: Vec<u64>,
        capacity: u64,
        dp: u32,
        per_sequence: bool,
        multiple: u64,
        runs: Option<Vec<u32>>,
        mix_runs: bool,
        extra: Option<Vec<u64>>,
        /// Further caps per micro-batch: the samples' sizes and the caps.
        limits: Option<(Vec<u64>, Vec<u64>)>,
    },
    PrimeRlFfd {
        lengths: Vec<u64>,
        runs: Vec<u32>,
        labels: Vec<u32>,
        seq_len: u64,
    },
    TrlBfd {
        lengths: Vec<u64>,
        batch_ends: Vec<u32>,
        seq_length: u64,
    },
    RawPlan {
        lengths: Vec<u64>,
        capacity: u64,
        align: u64,
        allow_single_long: bool,
        world_size: u32,
        drop_last: bool,
        /// Further limits: the samples' sizes, the caps, max segments and the method.
        limits: Option<(Vec<u64>, Vec<u64>, u64, u8)>,
    },
    Permutation {
        n: u16,
        seed: u64,
        epoch: u64,
    },
    /// A streaming packer fed in pieces, saved and restored after piece `save_after` (or
    /// restored from arbitrary bytes): every index ends in exactly one bin or the dropped list.
    Stream {
        case: StreamCase,
        save_after: u8,
    },
    /// The streaming packer under limits (one cap per further resource; rows of the tokens and
    /// then each resource's size): pieces of rows, a save and restore after each, or a state
    /// of arbitrary bytes.
    LimitedStream {
        case: StreamCase,
        caps: Vec<u64>,
        max_segments: u64,
    },
}

/// What both streaming packers take from the fuzzer: their options, the pieces fed to them,
/// and the arbitrary bytes restored from instead when there are some.
#[derive(Arbitrary, Debug)]
struct StreamCase {
    capacity: u64,
    align: u64,
    max_open_bins: u32,
    max_buffered: u32,
    oversize: u8,
    pieces: Vec<Vec<u64>>,
    state: Option<Vec<u8>>,
}

impl StreamCase {
    /// The options, with at most `open` open bins and `buffered` held items (bounds that
    /// keep a call fast; the kernel's own limits are tested where it checks them).
    fn options(&self, open: u32, buffered: u32) -> k::StreamOptions {
        k::StreamOptions {
            capacity: self.capacity,
            align: self.align,
            max_open_bins: self.max_open_bins % open,
            max_buffered: self.max_buffered % buffered,
            oversize: pick::<OversizePolicy>(self.oversize),
        }
    }
}

fn pick<T: Named>(i: u8) -> T {
    T::ALL[usize::from(i) % T::ALL.len()]
}

/// Every index of `0..n` exactly once in `indices`.
fn covers(indices: &[u32], n: usize) -> bool {
    let mut seen = vec![false; n];
    indices.iter().all(|&i| seen.get_mut(i as usize).is_some_and(|s| !std::mem::replace(s, true)))
}

/// A count as the fuzzer gave it one time in 16 (to find allocations sized by a count), else
/// below 4,097 (so that most calls are fast and the fuzzer explores the algorithms).
fn count(c: u32) -> u32 {
    if c >> 28 == 0xF { c } else { c % 4097 }
}

fn cost((linear, quadratic): (u64, u64)) -> Cost {
    Cost { linear, quadratic }
}

fuzz_target!(|call: Call| match call {
    Call::Partition { weights, k, method, equal_size, refine } => {
        let o = PartitionOptions { method: pick(method), equal_size, refine };
        if let Ok(p) = k::partition(&weights, count(k), &o) {
            assert!(covers(&p.indices, weights.len()), "partition lost or repeated an index");
        }
    }
    Call::Pack { lengths, capacity, align, method, oversize } => {
        let o = PackOptions {
            align,
            method: pick::<PackMethod>(method),
            oversize: pick::<OversizePolicy>(oversize),
            ..PackOptions::new(capacity)
        };
        if let Ok(p) = k::pack(&lengths, &o) {
            let mut all = p.indices.clone();
            all.extend_from_slice(&p.dropped);
            assert!(covers(&all, lengths.len()), "pack lost or repeated an index");
        }
    }
    Call::PackMulti { sizes, capacities, names, max_segments, align, method, oversize } => {
        let o = k::MultiOptions {
            capacities: &capacities,
            names: &names,
            max_segments,
            align,
            method: pick::<k::MultiMethod>(method),
            oversize: pick::<OversizePolicy>(oversize),
        };
        if let Ok(p) = k::pack_multi(&sizes, &o) {
            let r = capacities.len();
            let mut all = p.packing.indices.clone();
            all.extend_from_slice(&p.packing.dropped);
            assert!(covers(&all, sizes.len() / r), "pack_multi lost or repeated an index");
            for (b, loads) in p.resource_loads.chunks(r).enumerate() {
                let single = p.packing.single.contains(&p.packing.bin(b)[0]);
                assert!(single || loads.iter().zip(&capacities).all(|(l, c)| l <= c), "a bin over a limit");
            }
        }
    }
    Call::MicroBatches { lengths, capacity, cost: c, min_count, divisible_by, forced, order } => {
        let o = MicroOptions {
            capacity,
            cost: cost(c),
            min_count: count(min_count),
            divisible_by: count(divisible_by),
            count: forced.map(count),
            order: pick::<Order>(order),
        };
        if let Ok(p) = k::micro_batches(&lengths, &o) {
            assert!(p.tokens.iter().all(|&t| t <= capacity), "a micro-batch over the cap");
        }
    }
    Call::BalanceDp { lengths, dp, cost: c, groups, minibatch_size, equal_count, extra } => {
        let o = DpOptions {
            cost: cost(c),
            groups: groups.as_deref(),
            minibatch_size,
            equal_count,
            extra_costs: extra.as_deref(),
        };
        let _ = k::balance_dp(&lengths, count(dp), &o);
    }
    Call::Plan { lengths, dp, capacity, minibatch_size, order } => {
        let d = DpOptions { minibatch_size, ..DpOptions::default() };
        let m = MicroOptions { order: pick::<Order>(order), ..MicroOptions::new(capacity) };
        let _ = k::plan(&lengths, count(dp), &d, &m);
    }
    Call::Verl { seqlens, k, equal_size, function } => {
        let _ = match function % 3 {
            0 => k::peers::verl::karmarkar_karp(&seqlens, count(k), equal_size),
            1 => k::peers::verl::greedy_partition(&seqlens, count(k), equal_size),
            _ => k::peers::verl::get_seqlen_balanced_partitions(&seqlens, count(k), equal_size),
        };
    }
    Call::VerlMicro { seqlens, max_token_len, min, divided_by, dynamic, group, width, dp_num } => {
        let o = VerlMicroOptions {
            max_token_len,
            min_num_micro_batch: min,
            num_batches_divided_by: divided_by,
            use_dynamic_bsz_balance: dynamic,
            force_group_size: group,
            padded_width: width,
            dp_num_micro_batches: dp_num,
        };
        let _ = k::peers::verl_rearrange_micro_batches(&seqlens, &o);
    }
    Call::BalanceBatch { seqlens, dp, minibatch_size } => {
        let _ = k::peers::balance_batch(&seqlens, count(dp), minibatch_size);
    }
    Call::Roll { lengths, mask_width, max_len, min, tp, cp, vp, dp_num } => {
        let o = RollLoadBalanceOptions {
            mask_width,
            max_packed_sequence_length: max_len,
            min_num_micro_batches: min,
            tp,
            cp,
            vp,
            dp_num_micro_batches: dp_num,
        };
        let _ = k::peers::roll_load_balance(&lengths, &o);
    }
    Call::PadFactor { cp, tp, factor, roll, power_of_two } => {
        let factor = match (factor, roll) {
            (Some(m), _) => Factor::Multiple(m),
            (None, true) => Factor::Roll,
            (None, false) => Factor::CpTp,
        };
        let _ = k::pad_factor(&AlignOptions { cp: count(cp), tp: count(tp), factor, power_of_two });
    }
    Call::CpLayout { lengths, cp, tp, factor } => {
        let factor = factor.map_or(Factor::CpTp, Factor::Multiple);
        let _ = k::cp_layout(&lengths, &AlignOptions { cp: count(cp), tp: count(tp), factor, power_of_two: false });
    }
    Call::Distribute { lengths, capacity, dp, per_sequence, multiple, runs, mix_runs, extra, limits } => {
        let padding = if per_sequence { Padding::PerSequence(multiple) } else { Padding::PerMicroBatch(multiple) };
        let o = DistributeOptions {
            cost: Cost::TOKENS,
            padding,
            runs: runs.as_deref(),
            mix_runs,
            extra_costs: extra.as_deref(),
            limits: limits.as_ref().map(|(sizes, caps)| k::MicroLimits { sizes, caps, names: &[] }),
            ..DistributeOptions::new(capacity, count(dp))
        };
        if let (Ok(d), Some((sizes, caps))) = (k::distribute(&lengths, &o), &limits) {
            // Every micro-batch within every cap.
            let e = caps.len();
            for b in 0..d.tokens.len() {
                for (q, &cap) in caps.iter().enumerate() {
                    let load: u64 = d.batch(b).iter().map(|&i| sizes[i as usize * e + q]).sum();
                    assert!(load <= cap, "a micro-batch over a limit");
                }
            }
        }
    }
    Call::PrimeRlFfd { lengths, runs, labels, seq_len } => {
        let _ = k::prime_rl_ffd(&lengths, &runs, &labels, seq_len);
    }
    Call::TrlBfd { lengths, batch_ends, seq_length } => {
        if let Ok((offsets, indices)) = k::peers::trl::trl_bfd(&lengths, &batch_ends, seq_length) {
            // Every sequence in one bin, no bin over seq_length.
            let mut seen = vec![false; lengths.len()];
            for w in offsets.windows(2) {
                let bin = &indices[w[0] as usize..w[1] as usize];
                assert!(bin.iter().map(|&i| lengths[i as usize]).sum::<u64>() <= seq_length, "a bin over seq_length");
                for &i in bin {
                    assert!(!std::mem::replace(&mut seen[i as usize], true), "a sequence in two bins");
                }
            }
            assert!(seen.iter().all(|&s| s), "a sequence in no bin");
        }
    }
    Call::RawPlan { lengths, capacity, align, allow_single_long, world_size, drop_last, limits } => {
        let options = PlanOptions { capacity, align, allow_single_long };
        let raw = match &limits {
            None => k::raw_plan(&lengths, &options),
            Some((sizes, caps, max_segments, method)) => {
                let l = k::PlanLimits {
                    limits: k::MicroLimits { sizes, caps, names: &[] },
                    max_segments: *max_segments,
                    method: pick::<k::MultiMethod>(*method),
                };
                k::raw_plan_limited(&lengths, &options, &l).map(|p| {
                    let e = caps.len();
                    for (q, loads) in p.loads.chunks(e.max(1)).enumerate() {
                        let m = p.raw.pack(q);
                        let single = m.len() == 1 && p.raw.single_long.contains(&m[0]);
                        assert!(single || loads.iter().zip(caps).all(|(l, c)| l <= c), "a pack over a limit");
                    }
                    p.raw
                })
            }
        };
        if let Ok(raw) = raw {
            let mut all = raw.indices.clone();
            all.extend_from_slice(&raw.dropped);
            assert!(covers(&all, lengths.len()), "raw_plan lost or repeated a sample");
            let _ = k::aligned_plan(&raw.offsets, &raw.indices, count(world_size), drop_last);
        }
    }
    Call::LimitedStream { case, caps, max_segments } => {
        if let Some(bytes) = &case.state {
            if let Ok(mut p) = k::LimitedStreamPacker::from_state(bytes) {
                let r = p.limits().caps.len() + 1;
                let _ = p.add(&vec![1; 3 * r]);
                let _ = p.finish();
            }
            return;
        }
        let o = case.options(70, 200);
        let limits = k::StreamLimits { caps: caps.clone(), names: Vec::new(), max_segments };
        let Ok(mut p) = k::LimitedStreamPacker::new(o, limits) else { return };
        let r = caps.len() + 1;
        let mut seen: Vec<u64> = Vec::new();
        let mut added = 0u64;
        let check = |c: k::LimitedClosedBins, seen: &mut Vec<u64>| {
            for (b, loads) in c.resource_loads.chunks(caps.len().max(1)).enumerate().take(c.closed.bins()) {
                let alone = c.closed.bin(b).len() == 1;
                assert!(alone || loads.iter().zip(&caps).all(|(l, cap)| l <= cap), "a bin over a limit");
            }
            seen.extend_from_slice(&c.closed.indices);
            seen.extend_from_slice(&c.closed.dropped);
        };
        for piece in case.pieces.iter().take(8) {
            let rows = &piece[..piece.len() / r * r];
            if let Ok(c) = p.add(rows) {
                added += (rows.len() / r) as u64;
                check(c, &mut seen);
            }
            p = k::LimitedStreamPacker::from_state(&p.state()).expect("a saved state restores");
        }
        check(p.finish(), &mut seen);
        seen.sort_unstable();
        assert!(seen.iter().copied().eq(0..added), "an item lost or repeated");
    }
    Call::Stream { case, save_after } => {
        if let Some(bytes) = &case.state {
            // Arbitrary bytes: refused or a packer that keeps working.
            if let Ok(mut p) = k::StreamPacker::from_state(bytes) {
                let _ = p.add(&[1, 2, 3]);
                let _ = p.finish();
            }
            return;
        }
        let Ok(mut p) = k::StreamPacker::new(case.options(70_000, 2_000)) else { return };
        let mut seen: Vec<u64> = Vec::new();
        let mut added = 0u64;
        for (i, piece) in case.pieces.iter().enumerate() {
            let Ok(c) = p.add(piece) else { continue };
            added += piece.len() as u64;
            seen.extend_from_slice(&c.indices);
            seen.extend_from_slice(&c.dropped);
            if i == usize::from(save_after) {
                p = k::StreamPacker::from_state(&p.state()).expect("a saved state restores");
            }
        }
        let c = p.finish();
        seen.extend_from_slice(&c.indices);
        seen.extend_from_slice(&c.dropped);
        seen.sort_unstable();
        assert!(seen.iter().copied().eq(0..added), "the stream lost or repeated an index");
    }
    Call::Permutation { n, seed, epoch } => {
        let p = k::shuffle::permutation(u64::from(n), seed, epoch).expect("n < 2^16 is valid");
        assert!(covers(&p, usize::from(n)), "not a permutation");
    }
});
