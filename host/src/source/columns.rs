//! The buffer in the columnar layout of `wit/filter/filter.wit` ([`BufferColumns`]), the
//! WIT bindings of the filter world that define it (`wit`, used by the plugin runtime too),
//! and a made-up buffer for trying filters ([`synthetic_buffer`]).

use super::{Group, RolloutSample, Status};

/// Bindings of the `stowplan:filter/buffer-filter` world (generated from `wit/filter`).
pub(crate) mod wit {
    wasmtime::component::bindgen!({
        path: "wit/filter",
        world: "buffer-filter",
    });
}

use wit::stowplan::filter::types as wt;

/// The buffered groups in the columnar layout of `wit/filter/filter.wit` (`buffer`), kept
/// by [`DataSource`](super::DataSource) beside its buffer and updated as groups come and go, so a plugin
/// call lowers ready-made lists instead of walking every sample again.
pub struct BufferColumns(pub(crate) wt::Buffer);

impl std::fmt::Debug for BufferColumns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferColumns").field("groups", &self.groups()).field("samples", &self.samples()).finish()
    }
}

impl Default for BufferColumns {
    fn default() -> Self {
        BufferColumns(wt::Buffer {
            group_start: vec![0],
            index: Vec::new(),
            group: Vec::new(),
            prompt_length: Vec::new(),
            response_length: Vec::new(),
            reward_start: vec![0],
            rewards: Vec::new(),
            status: Vec::new(),
            has_label: Vec::new(),
            label_start: vec![0],
            labels: Vec::new(),
            metadata_start: vec![0],
            metadata: Vec::new(),
        })
    }
}

/// Appends the spans `range` of a (starts, data) pair to another, rebasing the starts.
fn copy_spans<T: Copy>(
    (starts, data): (&[u32], &[T]),
    range: std::ops::Range<usize>,
    (out_starts, out): (&mut Vec<u32>, &mut Vec<T>),
) {
    let (lo, hi) = (starts[range.start], starts[range.end]);
    let base = out.len() as u32;
    out.extend_from_slice(&data[lo as usize..hi as usize]);
    out_starts.extend(starts[range.start + 1..=range.end].iter().map(|&x| x - lo + base));
}

impl BufferColumns {
    /// The columns of `groups`. The caller keeps the blobs under 4 GiB (the data source's
    /// `add_samples` checks it).
    pub fn from_groups(groups: &[Group]) -> Self {
        let mut c = Self::default();
        c.extend(groups);
        c
    }

    /// Number of groups.
    pub fn groups(&self) -> usize {
        self.0.group_start.len() - 1
    }

    /// Number of samples.
    pub fn samples(&self) -> usize {
        self.0.index.len()
    }

    /// Bytes of labels and of metadata held (each must stay below 4 GiB).
    pub(crate) fn blob_bytes(&self) -> (usize, usize) {
        (self.0.labels.len(), self.0.metadata.len())
    }

    /// Rewards held (all samples).
    pub(crate) fn reward_count(&self) -> usize {
        self.0.rewards.len()
    }

    /// Appends `groups`.
    pub(crate) fn extend(&mut self, groups: &[Group]) {
        let b = &mut self.0;
        for group in groups {
            for s in group {
                b.index.push(s.index);
                b.group.push(s.group);
                b.prompt_length.push(s.prompt_length);
                b.response_length.push(s.response_length);
                b.rewards.extend_from_slice(&s.rewards);
                b.reward_start.push(b.rewards.len() as u32);
                b.status.push(match s.status {
                    Status::Pending => 0,
                    Status::Completed => 1,
                    Status::Truncated => 2,
                    Status::Aborted => 3,
                });
                b.has_label.push(u8::from(s.label.is_some()));
                b.labels.extend_from_slice(s.label.as_deref().unwrap_or("").as_bytes());
                b.label_start.push(b.labels.len() as u32);
                b.metadata.extend_from_slice(s.metadata.as_bytes());
                b.metadata_start.push(b.metadata.len() as u32);
            }
            b.group_start.push(b.index.len() as u32);
        }
    }

    /// Keeps the groups whose `keep` flag is set (one flag per group), in order.
    pub(crate) fn retain(&mut self, keep: &[bool]) {
        let old = std::mem::take(self);
        let (o, b) = (&old.0, &mut self.0);
        for (g, _) in keep.iter().enumerate().filter(|(_, k)| **k) {
            let range = o.group_start[g] as usize..o.group_start[g + 1] as usize;
            let samples = range.clone();
            b.index.extend_from_slice(&o.index[samples.clone()]);
            b.group.extend_from_slice(&o.group[samples.clone()]);
            b.prompt_length.extend_from_slice(&o.prompt_length[samples.clone()]);
            b.response_length.extend_from_slice(&o.response_length[samples.clone()]);
            b.status.extend_from_slice(&o.status[samples.clone()]);
            b.has_label.extend_from_slice(&o.has_label[samples]);
            copy_spans((&o.reward_start, &o.rewards), range.clone(), (&mut b.reward_start, &mut b.rewards));
            copy_spans((&o.label_start, &o.labels), range.clone(), (&mut b.label_start, &mut b.labels));
            copy_spans((&o.metadata_start, &o.metadata), range, (&mut b.metadata_start, &mut b.metadata));
            b.group_start.push(b.index.len() as u32);
        }
    }
}

/// A made-up buffer for trying filters (`stowplan filter check`, benchmarks): `groups`
/// groups of `samples_per_group` completed samples with one reward in [0, 1), response lengths
/// in 1..=4096, a label and metadata, all drawn from `seed` (deterministic).
pub fn synthetic_buffer(groups: usize, samples_per_group: usize, seed: u64) -> Vec<Group> {
    let mut rng = stowplan_kernel::shuffle::SplitMix64::new(seed, 0);
    let mut next = move || rng.next_u64();
    (0..groups)
        .map(|g| {
            (0..samples_per_group)
                .map(|j| RolloutSample {
                    index: (g * samples_per_group + j) as u64,
                    group: g as u64,
                    prompt_index: g as u32,
                    prompt: format!("\"synthetic prompt {g}\""),
                    label: Some(format!("answer {g}")),
                    metadata: format!("{{\"source\":\"synthetic\",\"group\":{g}}}"),
                    prompt_length: 1 + (next() % 1024) as u32,
                    response_length: 1 + (next() % 4096) as u32,
                    rewards: vec![(next() >> 11) as f64 / (1u64 << 53) as f64],
                    status: Status::Completed,
                    payload: Vec::new(),
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_kept_by_retain_and_extend_equal_columns_made_afresh() {
        let mut groups = synthetic_buffer(40, 3, 9);
        for (g, group) in groups.iter_mut().enumerate() {
            for (j, s) in group.iter_mut().enumerate() {
                s.rewards = vec![0.5; (g + j) % 3];
                s.label = (g % 4 != 0).then(|| "é".repeat(g % 5));
                s.status = [Status::Pending, Status::Completed, Status::Truncated, Status::Aborted][(g + j) % 4];
            }
        }
        let mut columns = BufferColumns::from_groups(&groups[..25]);
        for step in 0..30u64 {
            let keep: Vec<bool> =
                (0..groups.len().min(columns.groups())).map(|g| (g as u64 * 7 + step) % 3 != 0).collect();
            columns.retain(&keep);
            let mut kept: Vec<Group> = Vec::new();
            let mut current: Vec<Group> = std::mem::take(&mut groups);
            for (g, group) in current.drain(..keep.len()).enumerate() {
                if keep[g] {
                    kept.push(group);
                }
            }
            let refill: Vec<Group> = current.drain(..current.len().min(4)).collect();
            columns.extend(&refill);
            kept.extend(refill);
            kept.extend(current.drain(..));
            groups = kept;
            let live = columns.groups();
            assert_eq!(format!("{:?}", columns.0), format!("{:?}", BufferColumns::from_groups(&groups[..live]).0));
        }
    }
}
