"""CP layouts, materialized micro-batches and the prime-rl/ROLL layouts from Python."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan
from stowplan.compat import prime_rl, roll

from conftest import VECTORS, load


def test_seed_001_layout_and_roll_packing():
    lay = stowplan.cp_layout([2, 4, 6, 1], cp=2)
    assert lay.cu_seqlens_padded.tolist() == [0, 4, 8, 16, 20]
    row = np.array([0, 0, -1, -1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, -1, -1, 3, -1, -1, -1])
    parts = lay.split(row)
    assert parts[0].tolist() == [0, -1, 1, 1, 2, 2, -1, -1, 3, -1]
    assert parts[1].tolist() == [0, -1, 1, 1, 2, 2, 2, 2, -1, -1]
    assert lay.unpack(parts).tolist() == row.tolist()
    # ROLL's real factor is 16 for cp = 2.
    r = roll.pack_sequences([[0, 0], [1] * 4, [2] * 6, [3]], cp=2, pad_val=-1)
    assert r["pad_factor"] == 16 and r["cu_seqlens_padded"].tolist() == [0, 16, 32, 48, 64]
    assert roll.get_pad_factor(2, 2) == stowplan.pad_factor(cp=2, tp=2, align="roll") == 16


def test_pad_factor_errors():
    with pytest.raises(stowplan.InvalidArgumentError, match="cp must be in 1"):
        stowplan.pad_factor(cp=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="multiple of 2·cp = 4"):
        stowplan.cp_layout([3], cp=2, align=6)
    with pytest.raises(stowplan.InvalidArgumentError, match="cp must be a power of two"):
        stowplan.cp_layout([3], cp=3, power_of_two=True)
    with pytest.raises(stowplan.InvalidArgumentError, match="align must be None"):
        stowplan.pad_factor(cp=2, align="sixteen")


def _samples(shape):
    out = []
    for i, (p, c, run) in enumerate(shape):
        ids = [1000 * (i + 1) + j for j in range(p + c)]
        out.append({"prompt_ids": ids[:p], "completion_ids": np.array(ids[p:], dtype=np.int64), "advantage": float(i) + 0.5, "run": run, "temperature": 0.7})
    return out


@settings(max_examples=30, deadline=None)
@given(
    shape=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 40), st.integers(0, 2)), min_size=1, max_size=30),
    dp=st.integers(1, 5),
    cp=st.integers(1, 3),
)
def test_every_token_once_across_ranks_and_cp(shape, dp, cp):
    samples = _samples(shape)
    m = stowplan.materialize(samples, capacity=160, dp=dp, cp=cp)
    assert len(m.ranks) == dp and all(len(r) == m.per_rank >= 1 for r in m.ranks)
    seen = []
    for mb in (mb for r in m.ranks for mb in r):
        real = mb.input_ids[mb.loss_mask]
        seen.extend(int(t) for t in mb.input_ids if t != 1)
        assert not mb.loss_mask[mb.input_ids == 1].any(), "padding out of the loss"
        for k, i in enumerate(mb.samples.tolist()):
            s, e = int(mb.cu_seqlens_padded[k]), int(mb.cu_seqlens_padded[k]) + int(np.diff(mb.cu_seqlens)[k])
            assert mb.position_ids[s:e].tolist() == list(range(e - s)), "positions restart per sample"
            assert set(mb.advantages[s:e].tolist()) == {samples[i]["advantage"]}
        assert len(real) == sum(len(samples[i]["completion_ids"]) for i in mb.samples.tolist())
        if cp > 1:
            views = [mb.cp_view(r) for r in range(cp)]
            assert mb.cp_unpack([v["input_ids"] for v in views]).tolist() == mb.input_ids.tolist()
            assert sorted(int(p) for v in views for p in v["positions"]) == list(range(len(mb)))
        back = stowplan.MicroBatch.from_bytes(mb.to_bytes())
        assert back.input_ids.tolist() == mb.input_ids.tolist() and back.loss_mask.tolist() == mb.loss_mask.tolist()
    expected = sorted(t for s in samples for t in list(s["prompt_ids"]) + s["completion_ids"].tolist())
    assert sorted(seen) == expected, "every real token exactly once"


def test_materialize_errors_and_dummies():
    good = _samples([(2, 3, 0), (1, 4, 0)])
    with pytest.raises(stowplan.InvalidArgumentError, match=r"samples\[1\]: completion_mask has 1 entries"):
        stowplan.materialize([good[0], dict(good[1], completion_mask=[True])], capacity=64)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"samples\[0\]: empty completion"):
        stowplan.materialize([dict(good[0], completion_ids=[])], capacity=64)
    with pytest.raises(stowplan.InfeasibleError, match="sample 0 has 5 tokens"):
        stowplan.materialize(good, capacity=4)
    with pytest.raises(stowplan.InvalidArgumentError, match="cp must be in 1"):
        stowplan.materialize(good, capacity=64, cp=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="has no advantage"):
        stowplan.materialize([{"prompt_ids": [1], "completion_ids": [2]}], capacity=64)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"samples\[0\].prompt_ids must be a sequence of integers"):
        stowplan.materialize([{"prompt_ids": "abc", "completion_ids": [2], "advantage": 1.0}], capacity=64)
    with pytest.raises(stowplan.InvalidArgumentError, match="no CP split"):
        stowplan.materialize(good, capacity=64).ranks[0][0].cp_view(0)
    with pytest.raises(stowplan.InvalidArgumentError, match="missing the SPMB header"):
        stowplan.MicroBatch.from_bytes(b"garbage")
    m = stowplan.materialize(good, capacity=64, dp=3)
    assert m.dummies == 1 and m.per_rank == 1
    dummy = next(mb for r in m.ranks for mb in r if mb.dummy)
    assert not dummy.loss_mask.any() and not dummy.advantages.any()


def _prime_sample(i, s):
    if isinstance(s, list):
        s = {"lora": s[0], "prompt_len": s[1], "completion_len": s[2]}
    p = s.get("prompt_len", len(s.get("prompt_ids", [])))
    c = s.get("completion_len", len(s.get("completion_ids", [])))
    ids = [(i + 1) * 100000 + j for j in range(p + c)]
    out = {
        "lora": s.get("lora", 0),
        "prompt_ids": s.get("prompt_ids", ids[:p]),
        "completion_ids": s.get("completion_ids", ids[p:]),
        "completion_logprobs": s.get("completion_logprobs", [-0.25] * c),
        "advantage": s.get("advantage", 1.0),
    }
    for key in ("prompt_mask", "completion_mask", "completion_temperatures", "teacher_logprobs", "env_name", "reward", "training_mode"):
        if key in s:
            out[key] = s[key]
    return out


def _close(a, b):
    if isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return a is None or (isinstance(a, float) and math.isnan(a))
    if isinstance(b, float):
        return abs(a - b) < 1e-6
    return a == b


@pytest.mark.parametrize("v", load(VECTORS / "prime-rl"), ids=lambda v: v["name"])
def test_prime_rl_vectors(v):
    inp = v["input"]
    samples = [_prime_sample(i, s) for i, s in enumerate(inp["samples"])]
    if v["kind"] == "ffd_pack":
        if "error" in v:
            with pytest.raises(AssertionError, match=v["error"]["message"]):
                prime_rl.pack_samples([dict(s, env_name=r.get("env_name")) for s, r in zip(samples, inp["samples"])], inp["seq_len"])
            return
        bins, _ = prime_rl.pack_samples(samples, inp["seq_len"])
        assert bins == v["output"]["bins"]
        return
    call = lambda: prime_rl.prepare_micro_batches(samples, seq_len=inp["seq_len"], num_loras=inp["num_loras"], pad_to_multiple_of=inp["pad_to_multiple_of"], variant=inp["variant"])
    if "error" in v:
        with pytest.raises(ZeroDivisionError, match=v["error"]["message"]):
            call()
        return
    got = call()
    assert len(got) == len(v["output"]["micro_batches"])
    for g, w in zip(got, v["output"]["micro_batches"]):
        for key, want in w.items():
            value = g[key]
            value = value.tolist() if isinstance(value, np.ndarray) else value
            assert _close(value, want), (key, value, want)
