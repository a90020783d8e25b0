//! TRL's packing (`trl.data_utils.pack_dataset`, TRL 1.16.0), exactly: the best fit
//! decreasing that TRL's `bfd` and `bfd_split` strategies run on every `Dataset.map` batch.
//!
//! TRL sorts a batch's sequences by length descending (ties: the earlier one first) and puts
//! each into the open bin with the least room that fits it, else into a new bin of
//! `seq_length`. Among bins with the same room it takes the one that came to have that room
//! first (a queue per room), which is not the kernel's best fit (the oldest bin first); a
//! bin that is full leaves the queues. Bins never span map batches.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::rooms::Rooms;
use crate::sort::sorted_desc;
use crate::{Error, checked_len, invalid};

/// TRL's bins of `lengths` (the sequences after TRL's truncation or split, every one in
/// `1..=seq_length`), map batch by map batch: batch `j` is the indices
/// `batch_ends[j - 1]..batch_ends[j]` (from 0 for `j` = 0; `batch_ends` non-decreasing, the
/// last one `lengths.len()`; a batch may be empty).
///
/// Returns the bins in flat form, `(offsets, indices)`: bin `b` holds
/// `indices[offsets[b]..offsets[b + 1]]`, in the order the sequences went in; the bins of
/// each batch in the order TRL opened them, batch after batch.
///
/// Errors (`invalid-argument`): `seq_length` = 0; a length of 0 or above `seq_length`,
/// named with its index; `batch_ends` decreasing, past the sequences or not ending at their
/// count; more than 2^32 − 1 sequences.
pub fn trl_bfd(lengths: &[u64], batch_ends: &[u32], seq_length: u64) -> Result<(Vec<u32>, Vec<u32>), Error> {
    let n = checked_len("lengths", lengths.len())?;
    if seq_length == 0 {
        return invalid!("seq_length must be at least 1 (got 0)");
    }
    if let Some(i) = lengths.iter().position(|&l| l == 0 || l > seq_length) {
        return invalid!("lengths[{i}] = {} is outside 1..={seq_length} (seq_length)", lengths[i]);
    }
    let mut previous = 0u32;
    let mut widest = 0u32;
    for (j, &end) in batch_ends.iter().enumerate() {
        if end < previous || end > n {
            return invalid!(
                "batch_ends[{j}] = {end} is outside {previous}..={n} (from the previous end to the number of lengths)"
            );
        }
        widest = widest.max(end - previous);
        previous = end;
    }
    if previous != n {
        return invalid!("batch_ends must end at the {n} lengths (the last end is {previous})");
    }
    let mut rooms: Rooms<VecDeque<u32>> = Rooms::new(seq_length, widest as usize);
    let mut offsets = Vec::with_capacity(n as usize / 2 + 2);
    let mut indices = Vec::with_capacity(n as usize);
    offsets.push(0u32);
    // Each bin's members, appended in the order they go in; the batch's bins are laid out
    // into `indices` when the batch ends.
    let mut members: Vec<Vec<u32>> = Vec::new();
    let mut start = 0u32;
    for &end in batch_ends {
        let batch = &lengths[start as usize..end as usize];
        let mut opened = 0usize;
        for i in sorted_desc(batch) {
            let size = batch[i as usize];
            let (room, b) = match rooms.take_best(size) {
                Some(found) => found,
                None => {
                    if opened == members.len() {
                        members.push(Vec::new());
                    }
                    opened += 1;
                    (seq_length, (opened - 1) as u32)
                }
            };
            members[b as usize].push(start + i);
            if room > size {
                rooms.insert(room - size, b);
            }
        }
        for bin in &mut members[..opened] {
            indices.extend_from_slice(bin);
            // At most n indices: fits in u32 (checked above).
            offsets.push(indices.len() as u32);
            bin.clear();
        }
        rooms.clear();
        start = end;
    }
    Ok((offsets, indices))
}
