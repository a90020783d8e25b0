//! The round-robin distribution (prime-rl's classic trainer, `batch.py` at `b5daec1`): the
//! micro-batches of each modality group completed to a multiple of the ranks with dummy
//! copies of the group's first one, the multimodal group first, micro-batch `i` to rank
//! `i % dp`.

use stowplan_kernel::{Distribution, Padding};

use super::build::build_plan;
use super::{LossCounts, MaterializeOptions, Materialized, Sample, SampleLimits};
use crate::Error;
use crate::kernel::Kernel;

/// One entry of a rank's micro-batches in a round-robin deal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dealt {
    /// The micro-batch (an index into the micro-batches dealt); a dummy names the one it copies.
    pub micro_batch: u32,
    /// A dummy: a copy of `micro_batch` whose loss is switched off.
    pub dummy: bool,
}

/// prime-rl's classic deal of micro-batches to `dp` ranks, given which micro-batches hold a
/// multimodal sample: the multimodal ones, then the text ones (each group in the given
/// order), each group completed to a multiple of `dp` with dummies copying its first
/// micro-batch (an empty group gets none); entry `i` of that sequence goes to rank `i % dp`.
/// Every rank gets the same number of entries.
///
/// Errors: `invalid-argument` for `dp` = 0 (prime-rl divides by zero) or above
/// [`MAX_COUNT`](stowplan_kernel::MAX_COUNT), or more
/// than 2^32 − 1 micro-batches.
pub fn round_robin(multimodal: &[bool], dp: u32) -> Result<Vec<Vec<Dealt>>, Error> {
    if dp == 0 || dp > stowplan_kernel::MAX_COUNT {
        return Err(Error::InvalidArgument(format!("dp must be in 1..={} (got {dp})", stowplan_kernel::MAX_COUNT)));
    }
    if u32::try_from(multimodal.len()).is_err() {
        return Err(Error::InvalidArgument(format!("{} micro-batches to deal; at most 4294967295", multimodal.len())));
    }
    let dp = dp as usize;
    let mut order: Vec<Dealt> = Vec::with_capacity(multimodal.len() + 2 * dp);
    for group in [true, false] {
        let members: Vec<u32> = (0..multimodal.len() as u32).filter(|&b| multimodal[b as usize] == group).collect();
        let Some(&first) = members.first() else { continue };
        order.extend(members.iter().map(|&b| Dealt { micro_batch: b, dummy: false }));
        let dummies = (dp - members.len() % dp) % dp;
        order.extend(std::iter::repeat_n(Dealt { micro_batch: first, dummy: true }, dummies));
    }
    let mut ranks: Vec<Vec<Dealt>> = (0..dp).map(|_| Vec::with_capacity(order.len() / dp)).collect();
    for (i, d) in order.into_iter().enumerate() {
        ranks[i % dp].push(d);
    }
    Ok(ranks)
}

/// [`materialize`](super::materialize) with [`DistributionMode::RoundRobin`], after
/// `validate` (which gave `num_runs`): prime-rl's classic packing (the kernel's
/// `prime-rl-ffd` of the real lengths under the capacity, each row then padded, so that a
/// row may pass the capacity by less than the per-micro-batch multiple, as prime-rl's do),
/// [`round_robin`], and every dummy built as a copy of the micro-batch it names
/// with its loss mask, advantages and loss weights zero (its tokens counted as padding).
pub(super) fn materialize(
    kernel: &Kernel,
    samples: &[Sample<'_>],
    options: &MaterializeOptions,
    limits: &SampleLimits,
    num_runs: u32,
    counts: Option<&[LossCounts]>,
) -> Result<Materialized, Error> {
    if !limits.is_empty() {
        return Err(Error::InvalidArgument(
            "distribution round-robin takes no limits beside the capacity (prime-rl's classic packer has none); \
             use distribution balanced for image or segment caps"
                .into(),
        ));
    }
    let m = options.padding.multiple();
    let per_sequence = matches!(options.padding, Padding::PerSequence(_));
    if m == 0 {
        return Err(Error::InvalidArgument("the padding multiple must be at least 1 (got 0)".into()));
    }
    // prime-rl packs real tokens under `seq_len` and pads each row after: a row may pass the
    // capacity by less than the multiple.
    let cap = options.capacity;
    let row_cap = if per_sequence { cap } else { cap.checked_next_multiple_of(m).unwrap_or(u64::MAX) };
    let mut sizes = Vec::with_capacity(samples.len());
    for (i, s) in samples.iter().enumerate() {
        let l = s.len() as u64;
        let size = if per_sequence { l.checked_next_multiple_of(m) } else { Some(l) };
        match size {
            Some(size) if size <= cap => sizes.push(size),
            _ => {
                return Err(Error::Infeasible(format!(
                    "sample {i} has {l} tokens{}, more than the micro-batch capacity {cap}; samples are never split",
                    if per_sequence && m > 1 { format!(" (padded to a multiple of {m})") } else { String::new() }
                )));
            }
        }
    }
    // Text samples share label 0; every multimodal one has a label of its own.
    let mut next = 0u32;
    let labels: Vec<u32> = samples
        .iter()
        .map(|s| {
            if s.extra_cost > 0 {
                next += 1;
                next
            } else {
                0
            }
        })
        .collect();
    let runs: Vec<u32> = samples.iter().map(|s| s.run).collect();
    let (bins, _) = kernel.prime_rl_ffd(&sizes, &runs, &labels, cap)?;
    let multimodal: Vec<bool> = bins.iter().map(|b| b.iter().any(|&i| samples[i as usize].extra_cost > 0)).collect();
    let deal = round_robin(&multimodal, options.dp)?;
    let plan: Vec<Vec<&[u32]>> = deal
        .iter()
        .map(|rank| rank.iter().map(|d| if d.dummy { &[][..] } else { &bins[d.micro_batch as usize][..] }).collect())
        .collect();
    let build = MaterializeOptions { capacity: row_cap, mix_runs: true, multimodal_alone: false, ..options.clone() };
    let mut ranks = build_plan(kernel, samples, &plan, &build, num_runs, counts)?;
    // Each real micro-batch's place, then every dummy made a copy of its source.
    let mut place = vec![(0, 0); bins.len()];
    for (r, rank) in deal.iter().enumerate() {
        for (j, d) in rank.iter().enumerate() {
            if !d.dummy {
                place[d.micro_batch as usize] = (r, j);
            }
        }
    }
    for (r, rank) in deal.iter().enumerate() {
        for (j, d) in rank.iter().enumerate() {
            if d.dummy {
                let (sr, sj) = place[d.micro_batch as usize];
                let mut copy = ranks[sr][sj].clone();
                copy.dummy = true;
                copy.arrays.loss_mask.fill(false);
                copy.arrays.advantages.fill(0.0);
                copy.arrays.loss_weights.fill(0.0);
                copy.padding_tokens = copy.len() as u64;
                copy.real_tokens = 0;
                ranks[r][j] = copy;
            }
        }
    }
    let cost = |tokens: u64| {
        options
            .cost
            .of(tokens)
            .ok_or_else(|| Error::InvalidArgument(format!("the cost of {tokens} tokens overflows u64")))
    };
    let mut bin_costs = Vec::with_capacity(bins.len());
    for b in &bins {
        let mut c = 0u64;
        let mut used = 0u64;
        for &i in b {
            let s = &samples[i as usize];
            c = c.saturating_add(cost(sizes[i as usize])?).saturating_add(s.extra_cost);
            used += sizes[i as usize];
        }
        bin_costs.push(c.saturating_add(cost((m - used % m) % m)?));
    }
    let per_rank = deal.first().map_or(0, Vec::len);
    let (mut offsets, mut indices) = (vec![0u32], Vec::new());
    let (mut tokens, mut real_tokens, mut costs, mut rank_costs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (rank, built) in deal.iter().zip(&ranks) {
        let mut sum = 0u64;
        for (d, mb) in rank.iter().zip(built) {
            if !d.dummy {
                indices.extend_from_slice(&bins[d.micro_batch as usize]);
            }
            offsets.push(indices.len() as u32);
            tokens.push(mb.len() as u64);
            real_tokens.push(mb.real_tokens);
            costs.push(bin_costs[d.micro_batch as usize]);
            sum = sum.saturating_add(bin_costs[d.micro_batch as usize]);
        }
        rank_costs.push(sum);
    }
    let total: u64 = sizes.iter().sum();
    let dummies = deal.iter().flatten().filter(|d| d.dummy).count() as u32;
    let (mut real, mut padding) = (0, 0);
    for mb in ranks.iter().flatten() {
        real += mb.real_tokens;
        padding += mb.padding_tokens;
    }
    let distribution = Distribution {
        per_rank: per_rank as u32,
        offsets,
        indices,
        tokens,
        real_tokens,
        costs,
        rank_costs,
        packed: bins.len() as u32,
        splits: 0,
        dummies,
        lower_bound: total.div_ceil(cap) as u32,
    };
    Ok(Materialized { ranks, distribution, real_tokens: real, padding_tokens: padding })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::materialize::DistributionMode;

    #[test]
    fn groups_complete_apart_and_deal_in_turn() {
        // Bins 0, 2 multimodal; 1, 3, 4 text; two ranks.
        let r = round_robin(&[true, false, true, false, false], 2).unwrap();
        let d = |micro_batch, dummy| Dealt { micro_batch, dummy };
        assert_eq!(r[0], vec![d(0, false), d(1, false), d(4, false)]);
        assert_eq!(r[1], vec![d(2, false), d(3, false), d(1, true)]);
        assert!(round_robin(&[], 3).unwrap().iter().all(Vec::is_empty));
        assert!(round_robin(&[false], 0).is_err());
        assert_eq!("round-robin".parse::<DistributionMode>().unwrap(), DistributionMode::RoundRobin);
        assert!("rr".parse::<DistributionMode>().unwrap_err().to_string().contains("round-robin"));
    }
}
