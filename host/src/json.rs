//! Results as JSON values (the CLI's `--json` output and the conformance vectors' shape).

use serde_json::{Value, json};
use stowplan_kernel::{DpPlan, Figures, MicroPlan, Packing, Partitioning, Plan, unflatten as lists};

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

/// `{"max", "min", "mean", "max_over_mean", "spread"}` of per-group totals (tokens or costs):
/// the balance metrics of a plan, the kernel's [`Figures`].
pub fn summary(values: &[u64]) -> Value {
    let f = Figures::of(values);
    json!({
        "max": f.max,
        "min": f.min,
        "mean": f.mean,
        "max_over_mean": f.max_over_mean,
        "spread": f.spread,
    })
}

/// A micro-batch plan: `{"batches", "tokens", "costs", "restore", "count", "lower_bound",
/// "required", "token_balance", "cost_balance"}` (the balances as in [`summary`]).
pub fn micro_plan(p: &MicroPlan) -> Value {
    json!({
        "batches": lists(&p.offsets, &p.indices),
        "tokens": p.tokens,
        "costs": p.costs,
        "restore": p.restore,
        "count": p.count(),
        "lower_bound": p.lower_bound,
        "required": p.required,
        "token_balance": summary(&p.tokens),
        "cost_balance": summary(&p.costs),
    })
}

/// A DP plan: `{"ranks", "order", "tokens", "costs", "cost_lower_bound", "token_balance",
/// "cost_balance", "verl_unbalance"}`; `verl_unbalance` holds verl's `log_seqlen_unbalance`
/// figures (`global_seqlen/min` …) for these ranks, or null when verl's would fail.
pub fn dp_plan(p: &DpPlan, lengths: &[u64]) -> Value {
    let seqlens: Vec<i64> = lengths.iter().map(|&l| i64::try_from(l).unwrap_or(i64::MAX)).collect();
    let ranks = lists(&p.offsets, &p.order);
    let parts: Vec<Vec<i64>> = ranks.iter().map(|r| r.iter().map(|&i| i64::from(i)).collect()).collect();
    let verl = verl_unbalance("global_seqlen", &seqlens, &parts).ok();
    json!({
        "ranks": ranks,
        "order": p.order,
        "tokens": p.tokens,
        "costs": p.costs,
        "cost_lower_bound": p.cost_lower_bound,
        "token_balance": summary(&p.tokens),
        "cost_balance": summary(&p.costs),
        "verl_unbalance": verl,
    })
}

/// verl's `log_seqlen_unbalance` dict (`{prefix}/min`, `/max`, `/minmax_diff`,
/// `/balanced_min`, `/balanced_max`, `/mean`) for `partitions` of `seqlens`, or verl's error.
pub fn verl_unbalance(
    prefix: &str,
    seqlens: &[i64],
    partitions: &[Vec<i64>],
) -> Result<Value, stowplan_kernel::verl::UnbalanceError> {
    let u = crate::verl_log_seqlen_unbalance(seqlens, partitions)?.figures();
    Ok(json!({
        format!("{prefix}/min"): u.min,
        format!("{prefix}/max"): u.max,
        format!("{prefix}/minmax_diff"): u.minmax_diff,
        format!("{prefix}/balanced_min"): u.balanced_min,
        format!("{prefix}/balanced_max"): u.balanced_max,
        format!("{prefix}/mean"): u.mean,
    }))
}

/// A two-level plan: `{"dp": dp_plan, "micro_batches": [micro_plan per rank], "count",
/// "micro_batch_token_balance", "micro_batch_cost_balance"}` (balances over every
/// micro-batch of every rank).
pub fn plan(p: &Plan, lengths: &[u64]) -> Value {
    let tokens: Vec<u64> = p.ranks.iter().flat_map(|r| r.tokens.iter().copied()).collect();
    let costs: Vec<u64> = p.ranks.iter().flat_map(|r| r.costs.iter().copied()).collect();
    json!({
        "dp": dp_plan(&p.dp, lengths),
        "micro_batches": p.ranks.iter().map(micro_plan).collect::<Vec<_>>(),
        "count": p.ranks.first().map_or(0, MicroPlan::count),
        "micro_batch_token_balance": summary(&tokens),
        "micro_batch_cost_balance": summary(&costs),
    })
}
