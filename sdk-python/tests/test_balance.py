"""Balancing: micro-batches under a hard cap, DP ranks, two-level plans, and the verl/ROLL
compatibility modes against the peers' own outputs."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan
from stowplan.compat import roll, verl

DOCS = [100, 900, 50, 950, 400, 600]


def _mask(lengths, width):
    m = np.zeros((len(lengths), width), dtype=np.int64)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    return m


def test_verl_micro_batch_vectors(verl_vectors):
    cases = [v for v in verl_vectors if v["kind"] == "micro_batch"]
    assert len(cases) >= 14
    for v in cases:
        inp = v["input"]
        out = v["outputs"]["rearrange_micro_batches"]
        batch = inp["seqlen_list"] if inp.get("padded_width") is None else _mask(inp["seqlen_list"], inp["padded_width"])
        call = lambda: verl.rearrange_micro_batches(  # noqa: E731
            batch,
            inp["max_token_len"],
            num_batches_divided_by=inp.get("num_batches_divided_by"),
            min_num_micro_batch=inp.get("min_num_micro_batch"),
            use_dynamic_bsz_balance=inp.get("use_dynamic_bsz_balance", True),
            force_group_size=inp.get("force_group_size", 1),
        )
        if out["ok"]:
            assert call() == out["result"], v["name"]
        else:
            with pytest.raises(BaseException) as info:
                call()
            assert type(info.value).__name__ == out["error_type"], v["name"]
            assert str(info.value) == out["error"], v["name"]


def test_verl_balance_batch_vectors(verl_vectors):
    cases = [v for v in verl_vectors if v["kind"] == "balance_batch"]
    assert cases
    for v in cases:
        inp = v["input"]
        want = v["outputs"]["balance_batch"]["result"]
        global_idx, parts, stats = verl.balance_batch(
            inp["seqlen_list"], inp["dp_size"], keep_minibatch=inp["keep_minibatch"], minibatch_size=inp["minibatch_size"], prefix=inp["prefix"]
        )
        assert global_idx == want["global_idx"] and parts == want["partitions"] and stats == want["stats"], v["name"]


def test_roll_vectors(roll_vectors):
    checked = 0
    for v in roll_vectors:
        inp = v["input"]
        if v["kind"] not in ("load_balance", "batch_balance"):
            continue
        if v["kind"] == "load_balance":
            peers = inp.get("dp_peer_num_micro_batches")
            call = lambda: roll.load_balance(  # noqa: E731
                inp["lengths"],
                inp["max_packed_sequence_length"],
                mask_width=inp["mask_width"],
                min_num_micro_batches=inp.get("min_num_micro_batches", 1),
                tp=inp.get("tp", 1),
                cp=inp.get("cp", 1),
                vp=inp.get("vp", 1),
                dp_num_micro_batches=max(peers) if peers else None,
                algorithm=inp.get("algorithm", "load_balance"),
                dp_group=None if inp.get("dp_group_none") else ...,
            )
            keys = ("micro_batches", "num_micro_batches", "kk_partitions", "restored_positions")
        else:
            call = lambda: roll.batch_balance(  # noqa: E731
                inp["lengths"], inp["dp_size"], minibatch_size=inp.get("minibatch_size"), keep_minibatch=inp.get("keep_minibatch", False)
            )
            keys = ("global_idx", "rank_partitions", "kk_partitions", "metrics", "dropped")
        if "error" in v:
            with pytest.raises(BaseException) as info:
                call()
            assert type(info.value).__name__ == v["error"]["type"], v["name"]
            assert str(info.value) == v["error"]["message"], v["name"]
        else:
            got = call()
            for key in keys:
                assert got[key] == v["output"][key], (v["name"], key)
            if v["kind"] == "load_balance":
                assert got["pad_factor"] == v["output"]["derived"]["pad_factor"], v["name"]
                assert got["padded_lengths"] == v["output"]["derived"]["padded_lengths"], v["name"]
        checked += 1
    assert checked >= 29  # the packer configuration checks (algorithm, dp_group) included


def test_keep_minibatch_tail_is_reported_not_silent():
    lengths = list(range(1, 21))
    with pytest.warns(UserWarning, match="leaves out 4 samples"):
        out = roll.batch_balance(lengths, 2, minibatch_size=8, keep_minibatch=True)
    assert out["dropped"] == [16, 17, 18, 19]
    with pytest.warns(UserWarning, match="leaves out 4 samples"):
        global_idx, _, _ = verl.balance_batch(lengths, 2, keep_minibatch=True, minibatch_size=8)
    assert sorted(global_idx) == list(range(16))
    # stowplan's own API refuses instead of dropping.
    with pytest.raises(stowplan.InvalidArgumentError, match="minibatch_size"):
        stowplan.balance(lengths, 2, minibatch_size=8)


def test_restore_helpers_put_outputs_back():
    parts = verl.rearrange_micro_batches(DOCS, 2000)
    packed = np.array([DOCS[i] for p in parts for i in p])
    assert verl.restore_dynamic_batch(packed, parts).tolist() == DOCS
    assert verl.restore_dynamic_batch(packed.tolist(), parts) == DOCS
    assert verl.get_reverse_idx([2, 0, 1]) == [1, 2, 0]
    with pytest.raises(AssertionError, match="5 vs. 6"):
        verl.restore_dynamic_batch(packed, [p for p in parts][:1] + [[0, 1, 2]])
    lb = roll.load_balance(DOCS, 2000)
    order = [i for b in lb["micro_batches"] for i in b]
    assert roll.restore_results_order([DOCS[i] for i in order], lb["restored_positions"]) == DOCS


def test_verl_mask_input_checks_the_width():
    with pytest.raises(AssertionError, match="max_seq_len=64"):
        verl.rearrange_micro_batches(_mask([10, 20], 64), 32)
    assert verl.rearrange_micro_batches({"attention_mask": _mask([10, 20], 32)}, 32) == [[0, 1]]
    with pytest.raises(ValueError, match="dp_num_micro_batches"):
        verl.rearrange_micro_batches(DOCS, 2000, dp_group=object())
    # The all-reduced count raises the number of micro-batches like verl's collective.
    assert len(verl.rearrange_micro_batches(DOCS, 2000, dp_num_micro_batches=3)) == 3


def test_rl_math_workload_hits_the_lower_bound():
    lengths = np.loadtxt(stowplan_workload(), dtype=np.int64)
    mb = stowplan.micro_batches(lengths, 16384)
    assert mb.count == mb.lower_bound == 450
    assert int(mb.tokens.max()) <= 16384
    b = stowplan.balance(lengths, 8, capacity=16384, cost="attention")
    assert b.cost_balance["max_over_mean"] < 1.005
    assert {m.count for m in b.micro_batches} == {b.count}


def stowplan_workload():
    from conftest import WORKLOADS

    return WORKLOADS / "rl-math-8k.txt"


lengths_st = st.lists(st.integers(0, 300), min_size=1, max_size=80)


@settings(max_examples=120, deadline=None)
@given(lengths=lengths_st, cap=st.integers(300, 1200), min_count=st.integers(0, 4), div=st.integers(1, 3), cost=st.sampled_from(["tokens", "attention", (3, 2)]), order=st.sampled_from(["none", "cost_desc", "verl", "roll"]))
def test_micro_batch_invariants(lengths, cap, min_count, div, cost, order):
    try:
        mb = stowplan.micro_batches(lengths, cap, cost=cost, min_count=min_count, divisible_by=div, order=order)
    except stowplan.InvalidArgumentError as e:
        # Only when min_count / divisible_by push the count past the number of sequences.
        assert "never empty" in str(e)
        return
    assert mb.count % div == 0 and mb.count >= min_count and mb.count >= mb.lower_bound
    assert all(len(b) > 0 for b in mb.batches)
    assert int(mb.tokens.max()) <= cap
    flat = np.concatenate(mb.batches)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert (flat[mb.restore] == np.arange(len(lengths))).all()
    arr = np.array(lengths)
    assert [int(arr[b].sum()) for b in mb.batches] == mb.tokens.tolist()


@settings(max_examples=80, deadline=None)
@given(per_rank=st.integers(1, 12), dp=st.integers(1, 6), data=st.data())
def test_balance_invariants(per_rank, dp, data):
    lengths = data.draw(st.lists(st.integers(0, 500), min_size=per_rank * dp, max_size=per_rank * dp))
    b = stowplan.balance(lengths, dp, cost="attention", capacity=600)
    assert [len(r) for r in b.ranks] == [per_rank] * dp
    assert sorted(b.order.tolist()) == list(range(len(lengths)))
    assert b.costs.max() >= b.cost_lower_bound
    counts = {m.count for m in b.micro_batches}
    assert len(counts) == 1
    for r, m in zip(b.ranks, b.micro_batches):
        assert sorted(np.concatenate(m.batches).tolist()) == sorted(r.tolist())
        assert int(m.tokens.max()) <= 600
        assert (np.concatenate(m.batches)[m.restore] == r).all()


@settings(max_examples=60, deadline=None)
@given(per_rank=st.integers(1, 12), dp=st.integers(1, 5), minibatch=st.booleans(), data=st.data())
def test_rank_micro_batches_are_rank_local(per_rank, dp, minibatch, data):
    """Balance.micro_batches[r].batches are global sample indices; rank_micro_batches gives
    positions in the rank's own share batch[plan.ranks[r]]."""
    lengths = np.array(data.draw(st.lists(st.integers(0, 500), min_size=per_rank * dp, max_size=per_rank * dp)))
    plan = stowplan.balance(lengths, dp, capacity=600, minibatch_size=dp if minibatch else None)
    for r in range(dp):
        mine = lengths[plan.ranks[r]]  # what rank r holds, in the dispatchers' order
        local = stowplan.rank_micro_batches(plan, r)
        glob = stowplan.rank_micro_batches(plan, np.int64(r), local=False)
        assert [g.tolist() for g in glob] == [b.tolist() for b in plan.micro_batches[r].batches]
        assert [mine[p].tolist() for p in local] == [lengths[g].tolist() for g in glob]
        assert all(p.dtype == np.uint32 and int(p.max()) < len(mine) for p in local)
        assert (np.concatenate(local)[plan.micro_batches[r].restore] == np.arange(len(mine))).all()


def test_rank_micro_batches_refuses_what_it_cannot_answer():
    plan = stowplan.balance(DOCS, 2, capacity=2000)
    for rank in (2, -1, True, 1.0):
        with pytest.raises(stowplan.InvalidArgumentError, match=r"rank must be (an integer )?in 0..=1"):
            stowplan.rank_micro_batches(plan, rank)
    with pytest.raises(stowplan.InvalidArgumentError, match="no micro-batches.*capacity"):
        stowplan.rank_micro_batches(stowplan.balance(DOCS, 2), 0)
    with pytest.raises(stowplan.InvalidArgumentError, match="must be a stowplan.Balance"):
        stowplan.rank_micro_batches(stowplan.micro_batches(DOCS, 2000), 0)
    # The global indices of a rank's share do not fit the share itself: the finding.
    mine = np.array(DOCS)[plan.ranks[1]]
    with pytest.raises(IndexError):
        [mine[b] for b in plan.micro_batches[1].batches]


def test_groups_stay_together():
    lengths = [5, 7, 1, 1, 9, 9, 2, 3]
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]
    b = stowplan.balance(lengths, 2, groups=uids)
    for r in b.ranks:
        got = {uids[i] for i in r.tolist()}
        assert all(uids.count(u) == sum(uids[i] == u for i in r.tolist()) for u in got)


def _cli() -> str:
    """The stowplan binary (STOWPLAN_BIN, else the workspace's release build), or a skip."""
    path = os.environ.get("STOWPLAN_BIN") or str(pathlib.Path(__file__).resolve().parents[2] / "target" / "release" / "stowplan")
    if not os.path.isfile(path):
        pytest.skip(f"no stowplan binary at {path} (cargo build --release, or set STOWPLAN_BIN)")
    return path


def _rollouts(prompts, per_prompt, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 4096, size=prompts * per_prompt)


@pytest.mark.parametrize("dp, size, cap", [(2, 2, None), (4, 8, 16384), (4, 4, 9000), (3, 1, 5000)])
def test_group_size_is_groups_of_consecutive_runs(dp, size, cap):
    """group_size=G means what the CLI's --group-size G means: labels i // G."""
    lengths = _rollouts(dp * 6, size, seed=dp * 100 + size)
    a = stowplan.balance(lengths, dp, group_size=size, capacity=cap, cost="attention")
    b = stowplan.balance(lengths, dp, groups=[i // size for i in range(len(lengths))], capacity=cap, cost="attention")
    assert a.order.tolist() == b.order.tolist() and a.offsets.tolist() == b.offsets.tolist()
    if cap is not None:
        assert [[m.tolist() for m in x.batches] for x in a.micro_batches] == [[m.tolist() for m in x.batches] for x in b.micro_batches]
    for r in a.ranks:  # every run whole on one rank
        runs = [i // size for i in r.tolist()]
        assert all(runs.count(g) == size for g in set(runs))
    # Any array-like input, as for lengths elsewhere; numpy integers as the size.
    assert stowplan.balance(lengths.tolist(), dp, group_size=np.int32(size)).order.tolist() == stowplan.balance(lengths, dp, group_size=size).order.tolist()


@pytest.mark.parametrize("dp, size, cap", [(2, 3, None), (4, 8, 16384), (8, 8, 16384)])
def test_group_size_agrees_with_the_cli(tmp_path, dp, size, cap):
    lengths = _rollouts(dp * 4, size, seed=7 + size)
    path = tmp_path / "lengths.json"
    path.write_text(json.dumps(lengths.tolist()))
    args = [_cli(), "balance", "--dp", str(dp), "--group-size", str(size), "--cost", "attention", "--json", str(path)]
    if cap is not None:
        args += ["--max-token-len", str(cap)]
    out = json.loads(subprocess.run(args, check=True, capture_output=True, text=True, timeout=60).stdout)
    plan = stowplan.balance(lengths, dp, group_size=size, capacity=cap, cost="attention")
    assert [r.tolist() for r in plan.ranks] == out["dp"]["ranks"]
    if cap is not None:
        assert [[m.tolist() for m in x.batches] for x in plan.micro_batches] == [m["batches"] for m in out["micro_batches"]]


def test_group_size_with_unequal_counts_keeps_the_short_last_run():
    lengths = [5, 7, 1, 9, 9, 2, 3]
    a = stowplan.balance(lengths, 2, group_size=3, equal_count=False)
    b = stowplan.balance(lengths, 2, groups=[0, 0, 0, 1, 1, 1, 2], equal_count=False)
    assert a.order.tolist() == b.order.tolist() and a.offsets.tolist() == b.offsets.tolist()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"group_size": 2, "groups": [0, 0, 1, 1, 2, 2, 3, 3]}, "give groups .* or group_size .*, not both"),
        ({"group_size": 3}, r"group_size must be in 1..=8 and divide the number of samples n = 8 \(got 3\)"),
        ({"group_size": 16}, r"group_size must be in 1..=8 and divide the number of samples n = 8 \(got 16\)"),
        ({"group_size": 0}, r"group_size must be in 1..=8 .*\(got 0\)"),
        ({"group_size": -2}, r"group_size must be in 1..=8 .*\(got -2\)"),
        ({"group_size": 2.0}, r"group_size must be an integer in 1..=8 .*\(got 2.0\)"),
        ({"group_size": True}, r"group_size must be an integer in 1..=8 .*\(got True\)"),
        ({"group_size": 0, "equal_count": False}, r"group_size must be at least 1 \(got 0\)"),
        ({"group_size": 2**70}, r"group_size must be in 1..=8 .*\(got 1180591620717411303424\)"),
        ({"group_size": 2**200}, r"group_size must be in 1..=8 \(got 1606938044258990275541962092341162602522202993782792835301376\)"),
    ],
)
def test_group_size_errors_name_the_argument_and_range(kwargs, match):
    with pytest.raises(stowplan.InvalidArgumentError, match=match):
        stowplan.balance([5, 7, 1, 1, 9, 9, 2, 3], 2, **kwargs)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: stowplan.micro_batches([10, 20000], 16384), stowplan.InfeasibleError, "sequence 1 has 20000 tokens"),
        (lambda: stowplan.micro_batches([10, 20], 0), stowplan.InvalidArgumentError, "capacity must be in 1"),
        (lambda: stowplan.micro_batches([], 10), stowplan.InvalidArgumentError, "lengths must not be empty"),
        (lambda: stowplan.micro_batches([6, 6, 6], 10, count=1), stowplan.InfeasibleError, "count = 1 is below"),
        (lambda: stowplan.micro_batches([6, 6, 6], 10, count=4), stowplan.InvalidArgumentError, "exceeds the number of sequences"),
        (lambda: stowplan.micro_batches([6, 6, 6, 6], 100, count=3, divisible_by=2), stowplan.InvalidArgumentError, "multiple of divisible_by"),
        (lambda: stowplan.micro_batches([6, 6, 6], 10, min_count=5), stowplan.InvalidArgumentError, "min_count = 5 exceeds"),
        (lambda: stowplan.micro_batches([6], 10, cost="flops"), stowplan.InvalidArgumentError, "cost must be 'tokens', 'attention'"),
        (lambda: stowplan.micro_batches([6], 10, cost=(1, -1)), stowplan.InvalidArgumentError, "quadratic"),
        (lambda: stowplan.micro_batches([6], 10, cost=(1, 2, 3)), stowplan.InvalidArgumentError, r"\(linear, quadratic\) pair"),
        (lambda: stowplan.micro_batches([6], 10, order="random"), stowplan.InvalidArgumentError, "order must be"),
        (lambda: stowplan.micro_batches([2**40], 2**41, cost=(2**40, 2**40)), stowplan.InvalidArgumentError, "overflows u64"),
        (lambda: stowplan.balance([1, 2, 3], 4), stowplan.InvalidArgumentError, "at least 4 samples"),
        (lambda: stowplan.balance([1, 2, 3], 2), stowplan.InvalidArgumentError, "not a multiple of dp = 2"),
        (lambda: stowplan.balance([1, 2, 3, 4], 0), stowplan.InvalidArgumentError, "dp must be in 1"),
        (lambda: stowplan.balance([1, 2, 3, 4], 2, groups=[0, 0, 0, 1]), stowplan.InvalidArgumentError, "different sizes"),
        (lambda: stowplan.balance([1, 2, 3, 4], 2, groups=[0, 1]), stowplan.InvalidArgumentError, "one label per sample"),
        (lambda: stowplan.balance([1, 2, 3, 4], 2, minibatch_size=3), stowplan.InvalidArgumentError, "minibatch_size"),
        (lambda: stowplan.balance([1, 2, 3, 4], 2, capacity=3), stowplan.InfeasibleError, "sequence 3 has 4 tokens"),
    ],
)
def test_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_unequal_groups_with_unequal_counts():
    lengths = [5, 7, 1, 9, 9, 2, 3]
    b = stowplan.balance(lengths, 2, groups=[0, 0, 0, 1, 1, 2, 2], equal_count=False)
    assert sorted(b.order.tolist()) == list(range(7))
    assert b.tokens.tolist() in ([18, 18], [18, 18])


def test_backends_agree():
    lengths = np.loadtxt(stowplan_workload(), dtype=np.int64)[:1024]
    a = stowplan.balance(lengths, 4, capacity=8192, cost="attention", order="verl")
    n = stowplan.balance(lengths, 4, capacity=8192, cost="attention", order="verl", backend="native")
    assert (a.order == n.order).all()
    assert all((x.indices == y.indices).all() for x, y in zip(a.micro_batches, n.micro_batches))


def test_roll_keep_minibatch_without_minibatch_size_raises_rolls_type_error():
    # ROLL computes len(batch) // minibatch_size.
    with pytest.raises(TypeError, match=r"^unsupported operand type\(s\) for //: 'int' and 'NoneType'$"):
        roll.batch_balance(DOCS, 2, keep_minibatch=True)
    assert roll.batch_balance(DOCS, 2, minibatch_size=None)["rank_partitions"] == roll.batch_balance(DOCS, 2)["rank_partitions"]


def test_roll_load_balance_without_a_cap_raises_rolls_assertion():
    with pytest.raises(AssertionError, match=r"^LoadBalancePacker: max_packed_sequence_length is None$"):
        roll.load_balance(DOCS, None)
    with pytest.raises(AssertionError, match="LoadBalancePacker: max_packed_sequence_length is None"):
        roll.load_balance(_mask([10, 20], 32), None)


def test_roll_algorithm_none_chunks_the_mini_batch_like_roll():
    """``algorithm="none"``: ROLL's ``SequencePackingPacker`` cuts ``len // micro_batch_size``
    contiguous chunks with ``DataProto.chunk`` (``np.array_split``: the first ones longer)."""
    r = roll.load_balance([5] * 7, 64, algorithm="none", micro_batch_size=3)
    assert r["micro_batches"] == [[0, 1, 2, 3], [4, 5, 6]] and r["num_micro_batches"] == 2
    assert r["restored_positions"] == list(range(7)) and r["kk_partitions"] == []
    with pytest.raises(AssertionError, match="SequencePackingPacker: micro_batch_size is None"):
        roll.load_balance([5, 6], 64, algorithm="none")
    with pytest.raises(ZeroDivisionError):
        roll.load_balance([5, 6], 64, algorithm="none", micro_batch_size=0)
    with pytest.raises(ValueError, match="number sections must be larger than 0"):
        roll.load_balance([5, 6], 64, algorithm="none", micro_batch_size=3)
    with pytest.raises(ValueError, match="Illegal sequence packing algorithm greedy"):
        roll.load_balance([5, 6], 64, algorithm="greedy")
    with pytest.raises(AssertionError, match="LoadBalancePacker: dp_group is None"):
        roll.load_balance([5, 6], None, dp_group=None)  # ROLL checks the group before the cap
