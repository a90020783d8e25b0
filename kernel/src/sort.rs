//! The kernel's sorts: items by (weight descending, index ascending), the order every
//! first-fit and greedy placement visits them in, as stable LSD radix sorts (integer keys,
//! so the order is the same on every backend and platform).

/// Items sorted by (weight descending, index ascending).
pub(crate) fn sorted_desc(weights: &[u64]) -> alloc::vec::Vec<u32> {
    match sorted_desc_keys(weights) {
        Some(keys) => keys.iter().map(|&k| k as u32).collect(),
        None => sorted_desc_indirect(weights),
    }
}

/// Items sorted by (weight descending, index ascending) as packed keys
/// `(max − weight) << 32 | index` (read back with [`key_weight`] and `key as u32`), when every
/// weight is below 2^32: `None` otherwise. The radix passes move the keys themselves, so no
/// pass reads the weights through the permutation (at millions of items those scattered
/// reads were most of the time), and a caller reads weights and indices in sorted order from
/// one array.
pub(crate) fn sorted_desc_keys(weights: &[u64]) -> Option<alloc::vec::Vec<u64>> {
    let max = weights.iter().copied().max().unwrap_or(0);
    if max >> 32 != 0 || weights.len() > u32::MAX as usize {
        return None;
    }
    // Stable LSD radix sort on the high half (`max − w`), 8 bits a pass, only as many passes
    // as `max` has bits; the keys start in index order, so equal weights stay in it.
    let mut keys: alloc::vec::Vec<u64> =
        weights.iter().enumerate().map(|(i, &w)| ((max - w) << 32) | i as u64).collect();
    let mut tmp: alloc::vec::Vec<u64> = alloc::vec![0; keys.len()];
    let bits = 64 - max.leading_zeros();
    let mut shift = 32;
    while shift < 32 + bits {
        let digit = |k: u64| ((k >> shift) & 0xff) as usize;
        let mut counts = [0usize; 257];
        for &k in &keys {
            counts[digit(k) + 1] += 1;
        }
        if counts.iter().any(|&c| c == keys.len()) {
            // Every key has the same digit here: this pass would not move anything.
            shift += 8;
            continue;
        }
        for d in 0..256 {
            counts[d + 1] += counts[d];
        }
        for &k in &keys {
            let d = digit(k);
            tmp[counts[d]] = k;
            counts[d] += 1;
        }
        core::mem::swap(&mut keys, &mut tmp);
        shift += 8;
    }
    Some(keys)
}

/// Sorts `keys` ascending by their bits from `lo` up (a stable LSD radix sort, up to 11 bits a
/// pass, only over the bits that differ between keys): keys equal above `lo` keep their order,
/// so callers that pushed the keys in the order of their low bits get them fully sorted.
pub(crate) fn radix_sort_high(keys: &mut alloc::vec::Vec<u64>, lo: u32) {
    let n = keys.len();
    if n < 2 {
        return;
    }
    let (or, and) = keys.iter().fold((0u64, u64::MAX), |(o, a), &k| (o | k, a & k));
    let vary = if lo >= 64 { 0 } else { (or ^ and) >> lo << lo };
    if vary == 0 {
        return;
    }
    let (first, top) = (vary.trailing_zeros(), 64 - vary.leading_zeros());
    let passes = (top - first).div_ceil(11);
    let width = (top - first).div_ceil(passes);
    let mask = (1u64 << width) - 1;
    let mut tmp = alloc::vec![0u64; n];
    let mut counts = alloc::vec![0u32; 1 << width];
    let mut shift = first;
    while shift < top {
        counts.iter_mut().for_each(|c| *c = 0);
        for &k in keys.iter() {
            counts[((k >> shift) & mask) as usize] += 1;
        }
        let mut sum = 0u32;
        for c in counts.iter_mut() {
            let t = *c;
            *c = sum;
            sum += t;
        }
        for &k in keys.iter() {
            let d = ((k >> shift) & mask) as usize;
            tmp[counts[d] as usize] = k;
            counts[d] += 1;
        }
        core::mem::swap(keys, &mut tmp);
        shift += width;
    }
}

/// The weight a key of [`sorted_desc_keys`] holds, given the largest weight `max`.
pub(crate) fn key_weight(key: u64, max: u64) -> u64 {
    max - (key >> 32)
}

/// [`sorted_desc`] for weights of 2^32 and more: the radix passes move indices and read each
/// weight through them.
fn sorted_desc_indirect(weights: &[u64]) -> alloc::vec::Vec<u32> {
    // Stable LSD radix sort on `max - w` (ascending), 8 bits a pass, only as many passes as
    // `max` has bits: O(n · bytes), and stability keeps equal weights in index order.
    let n = weights.len();
    let max = weights.iter().copied().max().unwrap_or(0);
    let bits = 64 - max.leading_zeros();
    let mut order: alloc::vec::Vec<u32> = (0..n as u32).collect();
    let mut tmp: alloc::vec::Vec<u32> = alloc::vec![0; n];
    let mut shift = 0;
    while shift < bits {
        let digit = |i: u32| (((max - weights[i as usize]) >> shift) & 0xff) as usize;
        let mut counts = [0usize; 257];
        for &i in &order {
            counts[digit(i) + 1] += 1;
        }
        if counts.iter().any(|&c| c == n) {
            // Every item has the same digit here: this pass would not move anything.
            shift += 8;
            continue;
        }
        for d in 0..256 {
            counts[d + 1] += counts[d];
        }
        for &i in &order {
            let d = digit(i);
            tmp[counts[d]] = i;
            counts[d] += 1;
        }
        core::mem::swap(&mut order, &mut tmp);
        shift += 8;
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    fn reference(weights: &[u64]) -> Vec<u32> {
        let mut order: Vec<u32> = (0..weights.len() as u32).collect();
        order.sort_by_key(|&i| (core::cmp::Reverse(weights[i as usize]), i));
        order
    }

    proptest! {
        /// Both paths of `sorted_desc` — packed keys (weights below 2^32) and the indirect
        /// one — give (weight descending, index ascending), as a comparison sort does.
        #[test]
        fn sorted_desc_is_weight_descending_then_index(
            small in proptest::collection::vec(0u64..70_000, 0..300),
            large in proptest::collection::vec(prop_oneof![0u64..5, (1u64 << 32)..(1u64 << 40)], 0..100),
        ) {
            prop_assert_eq!(sorted_desc(&small), reference(&small));
            prop_assert_eq!(sorted_desc(&large), reference(&large));
            if let Some(keys) = sorted_desc_keys(&small) {
                let max = small.iter().copied().max().unwrap_or(0);
                let back: Vec<(u32, u64)> = keys.iter().map(|&k| (k as u32, key_weight(k, max))).collect();
                let want: Vec<(u32, u64)> = reference(&small).into_iter().map(|i| (i, small[i as usize])).collect();
                prop_assert_eq!(back, want);
            }
        }
    }
}
