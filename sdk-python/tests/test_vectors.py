"""The repository's conformance vectors through the Python SDK (same files as the Rust runner)."""

from __future__ import annotations

import pytest

import stowplan
from stowplan.compat import verl


def _run(v):
    inp = v["input"]
    if v["operation"] == "partition":
        method = inp.get("method", "kk")
        p = stowplan.partition(
            inp["weights"],
            inp["k"],
            method=method,
            equal_size=inp.get("equal_size", False),
            refine=inp.get("refine", method != "verl"),
        )
        return {"groups": p.groups, "sums": p.sums.tolist(), "total": p.total, "spread": p.spread, "lower_bound": p.lower_bound}
    b = stowplan.pack(
        inp["lengths"],
        inp["capacity"],
        align=inp.get("align", 1),
        method=inp.get("method", "bfd"),
        oversize=inp.get("oversize", "error"),
    )
    return {
        "bins": b.bins,
        "loads": b.loads.tolist(),
        "dropped": b.dropped.tolist(),
        "single": b.single.tolist(),
        "real_tokens": b.real_tokens,
        "aligned_tokens": b.aligned_tokens,
        "lower_bound": b.lower_bound,
    }


ERRORS = {"invalid-argument": stowplan.InvalidArgumentError, "infeasible": stowplan.InfeasibleError}


def test_stowplan_vectors(stowplan_vectors):
    assert len(stowplan_vectors) >= 20
    for v in stowplan_vectors:
        expected = v["expected"]
        if "error" in expected:
            with pytest.raises(ERRORS[expected["error"]]):
                _run(v)
            continue
        got = _run(v)
        for key, want in expected.items():
            assert got[key] == want, (v["name"], key)


def test_verl_partition_vectors(verl_vectors):
    cases = [v for v in verl_vectors if v["kind"] == "partition"]
    assert len(cases) >= 36
    for v in cases:
        inp = v["input"]
        for name in ("karmarkar_karp", "get_seqlen_balanced_partitions", "greedy_partition"):
            out = v["outputs"][name]
            fn = getattr(verl, name)
            if out["ok"]:
                assert fn(inp["seqlen_list"], inp["k_partitions"], inp["equal_size"]) == out["result"], (v["name"], name)
            else:
                with pytest.raises(BaseException) as info:
                    fn(inp["seqlen_list"], inp["k_partitions"], inp["equal_size"])
                assert type(info.value).__name__ == out["error_type"], (v["name"], name, info.value)


def test_verl_log_unbalance_vectors(verl_vectors):
    cases = [v for v in verl_vectors if v["kind"] == "log_unbalance"]
    assert cases
    for v in cases:
        inp = v["input"]
        out = v["outputs"]["log_seqlen_unbalance"]
        if out["ok"]:
            assert verl.log_seqlen_unbalance(inp["seqlen_list"], inp["partitions"], inp["prefix"]) == out["result"]
        else:
            with pytest.raises(BaseException) as info:
                verl.log_seqlen_unbalance(inp["seqlen_list"], inp["partitions"], inp["prefix"])
            assert type(info.value).__name__ == out["error_type"]
            assert str(info.value) == out["error"]


def test_verl_partition_stats_match_log_unbalance(verl_vectors):
    # Each partition vector records verl's log_seqlen_unbalance of verl's result.
    checked = 0
    for v in verl_vectors:
        if v["kind"] != "partition":
            continue
        for name, stats in v.get("stats", {}).items():
            want = stats.get("verl_log_seqlen_unbalance")
            result = v["outputs"][name]
            if not want or not result["ok"]:
                continue
            seqlens = v["input"]["seqlen_list"]
            if "ok" in want:
                with pytest.raises(BaseException) as info:
                    verl.log_seqlen_unbalance(seqlens, result["result"], "global_seqlen")
                assert type(info.value).__name__ == want["error_type"]
            else:
                assert verl.log_seqlen_unbalance(seqlens, result["result"], "global_seqlen") == want
            checked += 1
    assert checked >= 30


def test_scalars():
    assert verl.ceildiv(7, 2) == 4 and verl.ceildiv(8, 2) == 4 and verl.ceildiv(-7, 2) == -3
    assert verl.roundup_divisible(7, 4) == 8 and verl.roundup_divisible(8, 4) == 8
