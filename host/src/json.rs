//! Results as JSON values (the CLI's `--json` output and the conformance vectors' shape).

use serde_json::{Value, json};

use crate::{Packing, Partitioning};

/// Flat `offsets` + `indices` as a list of index lists.
pub fn lists(offsets: &[u32], indices: &[u32]) -> Vec<Vec<u32>> {
    offsets.windows(2).map(|w| indices[w[0] as usize..w[1] as usize].to_vec()).collect()
}

/// `{"groups", "sums", "total", "spread", "lower_bound"}` of a partition.
pub fn partition(p: &Partitioning) -> Value {
    json!({
        "groups": lists(&p.offsets, &p.indices),
        "sums": p.sums,
        "total": p.total,
        "spread": p.spread,
        "lower_bound": p.lower_bound,
    })
}

/// `{"bins", "loads", "dropped", "single", "real_tokens", "aligned_tokens", "padding_tokens",
/// "lower_bound"}` of a packing.
pub fn packing(p: &Packing) -> Value {
    json!({
        "bins": lists(&p.offsets, &p.indices),
        "loads": p.loads,
        "dropped": p.dropped,
        "single": p.single,
        "real_tokens": p.real_tokens,
        "aligned_tokens": p.aligned_tokens,
        "padding_tokens": p.padding_tokens(),
        "lower_bound": p.lower_bound,
    })
}

/// Adds `extra`'s keys to the object `base`.
pub fn with(mut base: Value, extra: Value) -> Value {
    if let (Some(b), Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
    base
}
