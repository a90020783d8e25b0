"""CP layouts, materialized micro-batches and the prime-rl/ROLL layouts from Python."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan
from stowplan.compat import prime_rl, roll
from stowplan.errors import InvalidArgumentError

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
        back = stowplan.MaterializedBatch.from_bytes(mb.to_bytes())
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
        stowplan.MaterializedBatch.from_bytes(b"garbage")
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
    if s.get("multimodal"):
        out["mm_kwargs"] = {"pixel_values": np.zeros((1, 4), dtype=np.float32)}
    return out


def _close(a, b):
    if isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return a is None or (isinstance(a, float) and math.isnan(a))
    if isinstance(b, float):
        return abs(a - b) < 1e-6
    return a == b


@pytest.mark.parametrize(
    "v", [v for v in load(VECTORS / "prime-rl") if v["kind"] in ("ffd_pack", "pad_micro_batch")], ids=lambda v: v["name"]
)
def test_prime_rl_vectors(v):
    inp = v["input"]
    samples = [_prime_sample(i, s) for i, s in enumerate(inp["samples"])]
    if v["kind"] == "ffd_pack":
        call = lambda: prime_rl.pack_samples(samples, inp["seq_len"], num_loras=inp["num_loras"])  # noqa: E731
    else:
        call = lambda: prime_rl.prepare_micro_batches(  # noqa: E731
            samples, seq_len=inp["seq_len"], num_loras=inp["num_loras"], pad_to_multiple_of=inp["pad_to_multiple_of"], variant=inp["variant"]
        )
    if "error" in v:
        with pytest.raises(BaseException) as info:
            call()
        assert (type(info.value).__name__, str(info.value)) == (v["error"]["type"], v["error"]["message"])
        return
    if v["kind"] == "ffd_pack":
        bins, _ = call()
        assert bins == v["output"]["bins"]
        return
    got = call()
    assert len(got) == len(v["output"]["micro_batches"])
    for g, w in zip(got, v["output"]["micro_batches"]):
        # Every key of the peer's micro-batch, and no other (a text micro-batch carried
        # mm_kwargs, which prime-rl at b5daec1 does not produce); the vectors leave a
        # multimodal micro-batch's mm_kwargs (tensors) out.
        multimodal = {"mm_kwargs"} if g.get("mm_kwargs") is not None else set()
        assert set(g) - multimodal == set(w)
        for key, want in w.items():
            value = g[key]
            value = value.tolist() if isinstance(value, np.ndarray) else value
            assert _close(value, want), (key, value, want)

def test_roll_packs_zero_length_sequences_like_roll():
    seqs = [[0, 0], [1] * 4, [2] * 6, [3]]
    for cp, factor in ((2, 4), (1, 16), (3, None)):
        base = roll.pack_sequences(seqs, cp=cp, pad_val=-1, pad_factor=factor)
        got = roll.pack_sequences([[]] + seqs[:2] + [[], []] + seqs[2:] + [[]], cp=cp, pad_val=-1, pad_factor=factor)
        # A zero-length sequence pads to 0 tokens: it only repeats a boundary.
        assert [r.tolist() for r in got["input_ids"]] == [r.tolist() for r in base["input_ids"]]
        for key in ("cu_seqlens", "cu_seqlens_padded"):
            b = base[key].tolist()
            assert got[key].tolist() == [0, 0] + b[1:3] + [b[2], b[2]] + b[3:] + [b[-1]], key
            assert got[key].dtype == base[key].dtype == np.int32
        assert (got["max_seqlen"], got["pad_factor"]) == (base["max_seqlen"], base["pad_factor"])
        pieces = roll.unpack_sequences(got["input_ids"][0], got["cu_seqlens_padded"], cp=cp)
        assert [len(p) for p in pieces][0] == 0 and len(pieces) == 8
    alone = roll.pack_sequences([[], []], cp=2)
    assert [r.tolist() for r in alone["input_ids"]] == [[], []]
    assert alone["cu_seqlens_padded"].tolist() == [0, 0, 0] and alone["max_seqlen"] == 0
    with pytest.raises(RuntimeError, match="Expected reduction dim"):  # ROLL: max() of no lengths
        roll.pack_sequences([], cp=2)


def _tiny_image():
    return {"pixel_values": np.zeros((1, 4), dtype=np.float32)}


def test_prime_rl_multimodal_samples_get_a_bin_of_their_own():
    text = lambda lora, n, **kw: {"lora": lora, "prompt_ids": [7] * n, "completion_ids": [8], "advantage": 1.0, **kw}  # noqa: E731
    samples = [text(0, 2), text(0, 1, mm_kwargs=_tiny_image()), text(0, 1), text(1, 1, mm_kwargs=_tiny_image()), text(1, 2)]
    bins, zero = prime_rl.pack_samples(samples, 16)
    # (lora, -length) order: 0, 1 (image: its own), 2 (joins 0), 4 (joins 0), 3 (image: its own).
    assert bins == [[0, 2, 4], [1], [3]] and zero == []
    mbs = prime_rl.prepare_micro_batches(samples, seq_len=16, num_loras=2, pad_to_multiple_of=4)
    assert [mb["input_ids"].tolist() for mb in mbs][1:] == [[7, 8, 1, 1], [7, 8, 1, 1]]
    assert mbs[1]["mm_kwargs"] is samples[1]["mm_kwargs"] and "mm_kwargs" not in mbs[0]
    assert [mb["lora_num_tokens"].tolist() for mb in mbs] == [[5, 3], [2, 2], [0, 4]]
    with pytest.raises(stowplan.InvalidArgumentError, match="variant='classic' only"):
        prime_rl.prepare_micro_batches(samples, seq_len=16, num_loras=2, variant="multilora")


def test_prime_rl_prepare_micro_batches_takes_the_zero_length_samples_pack_samples_takes():
    empty = {"prompt_ids": [], "completion_ids": [], "advantage": 1.0}
    full = {"prompt_ids": [1, 2], "completion_ids": [3], "advantage": 1.0}
    samples = [empty, full, dict(empty, lora=1)]
    assert prime_rl.pack_samples(samples, 8) == ([[1]], [0, 2])
    (mb,) = prime_rl.prepare_micro_batches(samples, seq_len=8, num_loras=2, pad_to_multiple_of=4)
    assert mb["input_ids"].tolist() == [1, 2, 3, 1] and mb["lora_num_tokens"].tolist() == [3, 1]
    (mb,) = prime_rl.prepare_micro_batches(samples, seq_len=8, num_loras=2, pad_to_multiple_of=4, variant="multilora")
    assert mb["sequence_lengths"].tolist() == [3, 0, 1]  # (LoRA, -length) order; the padding is the last sample's
    # Alone, a zero-length sample opens a micro-batch without tokens.
    (mb,) = prime_rl.prepare_micro_batches([empty], seq_len=8, pad_to_multiple_of=4)
    assert mb["input_ids"].tolist() == [] and mb["lora_num_tokens"].tolist() == [0] and mb["rewards"].tolist() == []


def test_prime_rl_errors_come_in_prime_rls_order():
    one = {"prompt_ids": [1], "completion_ids": [2], "advantage": 1.0, "lora": 3}
    # Packing (the LoRA's IndexError) comes before padding (the ZeroDivisionError).
    with pytest.raises(IndexError, match="list assignment index out of range"):
        prime_rl.prepare_micro_batches([one], seq_len=8, num_loras=2, pad_to_multiple_of=0)
    with pytest.raises(IndexError, match="^list index out of range$"):
        prime_rl.prepare_micro_batches([one], seq_len=8, num_loras=2, variant="multilora")
    # Nothing to pad: no division.
    assert prime_rl.prepare_micro_batches([], seq_len=8, pad_to_multiple_of=0) == []
    # A multiple below 2 pads nothing.
    (mb,) = prime_rl.prepare_micro_batches([dict(one, lora=0)], seq_len=8, pad_to_multiple_of=-4)
    assert mb["input_ids"].tolist() == [1, 2]


# ------------------------------------------------------------------------------------------
# Loss weights


def _unpacked_loss(samples, losses, mode, horizon):
    """The reference: the step's loss on the unpacked samples, per run (as LossAggMode says)."""
    out = {}
    for run in {s.get("run", 0) for s in samples}:
        mine = [(s, l) for s, l in zip(samples, losses) if s.get("run", 0) == run]
        masked = []
        for s, l in mine:
            mask = list(s.get("prompt_mask", [False] * len(s["prompt_ids"])))
            mask += list(s.get("completion_mask", [True] * len(s["completion_ids"])))
            masked.append([x for x, m in zip(l, mask) if m])
        total = sum(len(t) for t in masked)
        seqs = sum(1 for t in masked if t)
        sums = sum(sum(t) for t in masked)
        longest = max(len(s["completion_ids"]) for s, _ in mine)
        if mode == "token-mean":
            out[run] = sums / total if total else 0.0
        elif mode == "seq-mean-token-mean":
            out[run] = sum(sum(t) / len(t) for t in masked if t) / seqs if seqs else 0.0
        elif mode == "seq-mean-token-sum":
            out[run] = sums / seqs if seqs else 0.0
        else:
            out[run] = sums / (horizon or longest)
    return out


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 12), st.integers(0, 1), st.integers(0, 2**16)),
        min_size=1,
        max_size=24,
    ),
    dp=st.integers(1, 3),
    cp=st.sampled_from([1, 2]),
    mode=st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]),
    horizon=st.one_of(st.none(), st.floats(1.0, 40.0)),
)
def test_weighted_packed_losses_equal_the_unpacked_loss(shape, dp, cp, mode, horizon):
    horizon = horizon if mode == "seq-mean-token-sum-norm" else None  # that mode's option only
    rng = np.random.default_rng(len(shape))
    samples, losses = [], []
    for p, c, run, bits in shape:
        samples.append({
            "prompt_ids": list(range(p)),
            "completion_ids": list(range(c)),
            "advantage": 1.0,
            "run": run,
            "completion_mask": [bool((bits >> j) & 1) or j == 0 for j in range(c)],
        })
        losses.append(rng.uniform(-2, 2, size=p + c))
    m = stowplan.materialize(
        samples, capacity=48, dp=dp, cp=cp, mix_runs=True, num_runs=2, loss_agg_mode=mode, loss_scale_factor=horizon
    )
    packed = {0: 0.0, 1: 0.0}
    for rank in m.ranks:
        for mb in rank:
            assert mb.loss_weights.dtype == np.float32 and len(mb.loss_weights) == len(mb)
            assert not np.any(mb.loss_weights[~mb.loss_mask])
            for k, i in enumerate(mb.samples):
                start = int(mb.cu_seqlens_padded[k])
                n = len(losses[i])
                packed[samples[i]["run"]] += float(np.dot(mb.loss_weights[start : start + n], losses[i]))
            if mb.cp > 1:
                weights = [mb.cp_view(r)["loss_weights"] for r in range(mb.cp)]
                assert np.array_equal(mb.cp_unpack(weights), mb.loss_weights)
    for run, want in _unpacked_loss(samples, losses, mode, horizon).items():
        assert packed[run] == pytest.approx(want, rel=1e-5, abs=1e-5), (mode, run)


def test_loss_agg_mode_and_scale_factor_are_checked():
    sample = {"prompt_ids": [1], "completion_ids": [2, 3], "advantage": 1.0}
    with pytest.raises(InvalidArgumentError, match="loss_agg_mode must be 'token-mean'"):
        stowplan.materialize([sample], capacity=8, loss_agg_mode="mean")
    with pytest.raises(InvalidArgumentError, match=r"loss_scale_factor must be a number of tokens in 1\.\.=2\^64"):
        stowplan.materialize([sample], capacity=8, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=1e-300)
    with pytest.raises(InvalidArgumentError, match="loss_scale_factor must be a number"):
        stowplan.materialize([sample], capacity=8, loss_scale_factor="wide")
    with pytest.raises(InvalidArgumentError, match="only applies to loss_agg_mode 'seq-mean-token-sum-norm'"):
        stowplan.Packer(capacity=16, dp=1, loss_scale_factor=64)
    mb = stowplan.materialize([sample], capacity=8).ranks[0][0]
    assert mb.loss_weights.tolist() == [0.0, 0.5, 0.5] + [0.0] * (len(mb) - 3)


# ------------------------------------------------------------------------------------------
# Multimodal samples: an extra cost per sample, balanced and not capped


def test_extra_costs_move_the_balance_not_the_cap():
    lengths = [100] * 6
    extra = [10_000, 0, 0, 0, 0, 0]
    b = stowplan.balance(lengths, 2, extra_costs=extra, equal_count=False)
    with_image = next(r for r in range(2) if 0 in b.ranks[r].tolist())
    assert b.ranks[with_image].tolist() == [0] and b.costs[with_image] == 10_100
    assert stowplan.balance(lengths, 2, extra_costs=[0] * 6).ranks[0].tolist() == stowplan.balance(lengths, 2).ranks[0].tolist()
    mb = stowplan.micro_batches([300, 300, 300, 300], 600, extra_costs=np.array([5000, 0, 0, 0]))
    assert all(t <= 600 for t in mb.tokens.tolist())
    assert sorted(mb.costs.tolist()) == [600, 5600]
    with pytest.raises(InvalidArgumentError, match="extra_costs has 2 entries; lengths has 4"):
        stowplan.micro_batches([300, 300, 300, 300], 600, extra_costs=[1, 2])
    with pytest.raises(InvalidArgumentError, match="extra_costs"):
        stowplan.balance([1, 2], 1, extra_costs=[1.5, 0])


def test_multimodal_samples_get_micro_batches_of_their_own():
    samples = [
        {"prompt_ids": [1], "completion_ids": [2, 3, 4], "advantage": 1.0},
        {"prompt_ids": [1], "completion_ids": [2, 3], "advantage": 1.0, "extra_cost": 256},
        {"prompt_ids": [1], "completion_ids": [2], "advantage": 1.0},
        {"prompt_ids": [1], "completion_ids": [2, 3, 4, 5], "advantage": 1.0, "extra_cost": 576},
    ]
    m = stowplan.materialize(samples, capacity=32, multimodal_alone=True)
    rows = [mb.samples.tolist() for mb in m.ranks[0]]
    assert [1] in rows and [3] in rows and [0, 2] in rows, rows
    with pytest.raises(InvalidArgumentError, match="multimodal_alone needs mix_runs false"):
        stowplan.materialize(samples, capacity=32, multimodal_alone=True, mix_runs=True)
    with pytest.raises(InvalidArgumentError, match=r"samples\[0\]\.extra_cost"):
        stowplan.materialize([{**samples[0], "extra_cost": -1}], capacity=32)


DISTRIBUTE = [v for v in load(VECTORS / "prime-rl") if v["kind"] == "distribute"]


@pytest.mark.parametrize("backend", ["native", "wasm"])
@pytest.mark.parametrize("v", DISTRIBUTE, ids=lambda v: v["name"])
def test_prime_rl_round_robin_vectors(v, backend):
    """prime-rl's classic ``prepare_batch`` (13 vectors made by its own code): the plan, the
    micro-batches with their dummy copies, and the packer runtime's round robin."""
    inp = v["input"]
    samples = [_prime_sample(i, s) for i, s in enumerate(inp["samples"])]
    kwargs = dict(
        seq_len=inp["seq_len"], num_train_workers=inp["num_workers"], num_loras=inp["num_loras"],
        pad_to_multiple_of=inp.get("pad_to_multiple_of", 1), backend=backend,
    )
    if "error" in v:
        for call in (prime_rl.round_robin_plan, prime_rl.prepare_batch):
            with pytest.raises(BaseException) as info:
                call(samples, **kwargs)
            assert (type(info.value).__name__, str(info.value)) == (v["error"]["type"], v["error"]["message"])
        return
    plan = prime_rl.round_robin_plan(samples, **kwargs)
    assert plan["bins"] == v["output"]["bins"]
    assert plan["per_rank"] == v["output"]["per_rank"]
    assert plan["rank_tokens"] == [sum(e["num_tokens"] for e in r) for r in v["output"]["per_rank"]]
    ranks = prime_rl.prepare_batch(samples, **kwargs)
    alone = prime_rl.prepare_micro_batches(
        samples, seq_len=inp["seq_len"], num_loras=inp["num_loras"], pad_to_multiple_of=inp.get("pad_to_multiple_of", 1)
    )
    for got, want in zip(ranks, v["output"]["per_rank"]):
        assert len(got) == len(want)
        for mb, entry in zip(got, want):
            source = alone[entry["bin"]]
            assert mb["input_ids"].tolist() == source["input_ids"].tolist()
            if entry["dummy"]:
                assert not mb["loss_mask"].any() and not mb["advantages"].any()
            else:
                assert mb["loss_mask"].tolist() == source["loss_mask"].tolist()
    # The packer runtime's round robin deals the same micro-batches (no training modes there).
    if any(s.get("training_mode", "rl") != "rl" for s in samples):
        return
    extra = [dict(s, run=s["lora"], extra_cost=1 if "mm_kwargs" in s else 0) for s in samples]
    for s in extra:
        for key in ("lora", "mm_kwargs", "training_mode"):
            s.pop(key, None)
    m = stowplan.materialize(
        extra, capacity=inp["seq_len"], dp=inp["num_workers"], padding="micro_batch",
        align=inp.get("pad_to_multiple_of", 1), num_runs=inp["num_loras"], allow_empty_completion=True,
        distribution="round-robin", backend=backend,
    )
    got = [[(mb.samples.tolist(), bool(mb.dummy), len(mb.input_ids)) for mb in rank] for rank in m.ranks]
    want = [[(e["samples"], e["dummy"], e["num_tokens"]) for e in rank] for rank in v["output"]["per_rank"]]
    assert got == want


def test_round_robin_errors_are_named():
    with pytest.raises(InvalidArgumentError, match="num_train_workers must be at least 1"):
        prime_rl.round_robin_plan([{"prompt_ids": [1], "completion_ids": [2]}], seq_len=4, num_train_workers=-2)
    with pytest.raises(InvalidArgumentError, match="num_train_workers must be an integer"):
        prime_rl.prepare_batch([], seq_len=4, num_train_workers=2.0)
    with pytest.raises(InvalidArgumentError, match="distribution must be 'balanced' or 'round-robin'"):
        stowplan.materialize([{"prompt_ids": [1], "completion_ids": [2], "advantage": 1.0}], capacity=4, distribution="rr")
    with pytest.raises(InvalidArgumentError, match="round-robin takes no limits"):
        stowplan.materialize(
            [{"prompt_ids": [1], "completion_ids": [2], "advantage": 1.0, "resources": {"images": 1}}],
            capacity=4, limits={"images": 2}, distribution="round-robin",
        )
    with pytest.raises(InvalidArgumentError, match="round-robin takes no limits"):
        stowplan.Packer(capacity=16, dp=2, limits={"images": 2}, distribution="round-robin")
    with pytest.raises(InvalidArgumentError, match="dp must be in 1..="):
        stowplan._stowplan.round_robin([True], 0)


ZIGZAG = [v for v in load(VECTORS / "roll") if v["kind"] == "cp_zigzag"]


@pytest.mark.parametrize("backend", ["native", "wasm"])
@pytest.mark.parametrize("v", ZIGZAG, ids=lambda v: v["name"])
def test_roll_pack_sequences_vectors(v, backend):
    """ROLL's ``_pack_sequences`` and CP split (``pad_packed_seq_to`` included), from vectors
    made by ROLL's own code: every rank's row and the boundaries; where ROLL raises
    ``RuntimeError``, a :class:`roll.PackedLayoutError` (both a ``RuntimeError`` and an
    ``InvalidArgumentError``) with stowplan's message."""
    inp = v["input"]
    pad = inp.get("pad_val", -1)
    seqs = [list(inp["tokens"][i]) if "tokens" in inp else [1000 * i + j for j in range(n)] for i, n in enumerate(inp["lengths"])]
    call = lambda: roll.pack_sequences(  # noqa: E731
        seqs, cp=inp["cp"], tp=inp.get("tp", 1), pad_val=pad, pad_factor=inp.get("pad_factor_override"),
        pad_packed_seq_to=inp.get("pad_packed_seq_to"), backend=backend,
    )
    if "error" in v:
        assert v["error"]["type"] == "RuntimeError"
        with pytest.raises(RuntimeError) as info:
            call()
        assert isinstance(info.value, roll.PackedLayoutError) and isinstance(info.value, InvalidArgumentError)
        return
    got = call()
    out = v["output"]
    assert got["cu_seqlens"].tolist() == out["cu_seqlens"]
    assert got["cu_seqlens_padded"].tolist() == out["cu_seqlens_padded"]
    assert got["max_seqlen"] == out["max_seqlen"] and got["qkv_format"] == out["qkv_format"]
    assert got["pad_factor"] == (inp.get("pad_factor_override") or out["pad_factor"])
    assert [row.tolist() for row in got["input_ids"]] == [r["tokens"] for r in out["ranks"]]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=6),
    st.sampled_from([1, 2, 3]),
    st.integers(0, 5),
)
def test_pad_packed_seq_to_gives_the_last_sequence_the_rest(lengths, cp, extra):
    seqs = [[100 * i + j + 1 for j in range(n)] for i, n in enumerate(lengths)]
    factor = 2 * cp * 2
    before = sum(-(n // -factor) * factor for n in lengths[:-1])
    room = -(lengths[-1] // -(2 * cp)) * (2 * cp) + 2 * cp * extra
    r = roll.pack_sequences(seqs, cp=cp, pad_val=0, pad_factor=factor, pad_packed_seq_to=before + room)
    assert r["cu_seqlens_padded"][-1] == before + room and r["cu_seqlens_padded"][-2] == before
    rows = r["input_ids"]
    assert all(len(row) == (before + room) // cp for row in rows)
    # Every sequence comes back, padded, from its ranks' slices.
    pieces = [roll.unpack_sequences(row, r["cu_seqlens_padded"], cp=cp) for row in rows]
    for i, seq in enumerate(seqs):
        tokens = [t for rank in pieces for t in rank[i].tolist() if t]
        assert sorted(tokens) == seq
    if cp > 1:
        with pytest.raises(roll.PackedLayoutError, match="do not split into"):
            roll.pack_sequences(seqs, cp=cp, pad_val=0, pad_factor=factor, pad_packed_seq_to=before + room + 1)
    if before + lengths[-1] >= 1:
        with pytest.raises(roll.PackedLayoutError, match="is below"):
            roll.pack_sequences(seqs, cp=cp, pad_val=0, pad_factor=factor, pad_packed_seq_to=before + lengths[-1] - 1)
