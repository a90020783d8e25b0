"""Every result class pickles and unpickles to an equal result: results cross
process boundaries (multiprocessing, Ray's object store) as any Python value does."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import stowplan


def fields(obj, names):
    out = {}
    for name in names:
        v = getattr(obj, name)
        out[name] = v.tolist() if isinstance(v, np.ndarray) else v
    return out


def roundtrip(obj):
    back = pickle.loads(pickle.dumps(obj))
    assert type(back) is type(obj)
    return back


def test_partition_and_packing():
    p = stowplan.partition([100, 900, 50, 950, 400, 600], 2)
    names = ["offsets", "indices", "sums", "total", "spread", "lower_bound", "k", "max", "groups"]
    assert fields(roundtrip(p), names) == fields(p, names)
    b = stowplan.pack([5, 3, 7, 2, 6, 30], 10, align=2, oversize="single")
    names = ["offsets", "indices", "loads", "dropped", "single", "real_tokens", "aligned_tokens", "padding_tokens",
             "lower_bound", "efficiency", "capacity", "num_bins", "bins"]
    assert fields(roundtrip(b), names) == fields(b, names)


def test_multi_packing():
    m = stowplan.pack_multi({"tokens": [900, 300, 700, 500], "images": [2, 0, 1, 1]}, {"tokens": 1200, "images": 2}, max_segments=3)
    back = roundtrip(m)
    assert back.bins == m.bins and back.names == m.names and back.lower_bounds == m.lower_bounds
    assert back.resource_loads.tolist() == m.resource_loads.tolist()
    assert back.packing.loads.tolist() == m.packing.loads.tolist()


def test_micro_batches_and_balance():
    lengths = np.array([3000, 100, 5000, 2500, 800, 1200, 4000, 600], dtype=np.int64)
    mb = stowplan.micro_batches(lengths, capacity=6000)
    names = ["offsets", "indices", "tokens", "costs", "restore", "lower_bound", "required", "count"]
    back = roundtrip(mb)
    assert fields(back, names) == fields(mb, names)
    assert [b.tolist() for b in back.batches] == [b.tolist() for b in mb.batches]
    assert back.token_balance == mb.token_balance
    bal = stowplan.balance(lengths, dp=2, capacity=6000)
    back = roundtrip(bal)
    names = ["offsets", "order", "tokens", "costs", "cost_lower_bound", "count", "dp", "lengths"]
    assert fields(back, names) == fields(bal, names)
    assert [r.tolist() for r in back.ranks] == [r.tolist() for r in bal.ranks]
    assert back.cost_balance == bal.cost_balance
    assert [fields(m, ["indices", "tokens"]) for m in back.micro_batches] == [fields(m, ["indices", "tokens"]) for m in bal.micro_batches]


def test_materialized_and_its_micro_batches():
    samples = [
        {"prompt_ids": [1, 2, 3], "completion_ids": [4, 5], "advantage": 0.5},
        {"prompt_ids": [6], "completion_ids": [7, 8, 9], "advantage": -1.0},
        {"prompt_ids": [10, 11], "completion_ids": [12], "advantage": 0.25},
    ]
    m = stowplan.materialize(samples, dp=1, capacity=8)
    back = roundtrip(m)
    names = ["per_rank", "real_tokens", "padding_tokens", "packed", "splits", "dummies", "lower_bound"]
    assert fields(back, names) == fields(m, names)
    per_token = ["samples", "input_ids", "position_ids", "loss_mask", "loss_weights", "advantages", "cu_seqlens"]
    for rb, ra in zip(back.ranks, m.ranks):
        for x, y in zip(rb, ra):
            assert fields(x, per_token) == fields(y, per_token)
    one = m.ranks[0][0]
    assert fields(roundtrip(one), per_token) == fields(one, per_token)


def test_static_pack_plan_and_stream_packer():
    plan = stowplan.StaticPackPlan.from_lengths([5, 3, 7, 2, 6, 30], capacity=10, world_size=2)
    back = roundtrip(plan)
    assert back == plan and back.aligned_checksum == plan.aligned_checksum
    sp = stowplan.StreamPacker(10, max_open_bins=2)
    sp.add([5, 3, 7])
    back = roundtrip(sp)
    assert back.finish() == sp.finish()


def test_damaged_state_is_refused():
    plan = stowplan.StaticPackPlan.from_lengths([5, 3, 7, 2, 6], capacity=10)
    damaged = plan.to_json().replace('"samples":5', '"samples":6')
    with pytest.raises(stowplan.StowplanError):
        type(plan)._from_state(damaged)
    with pytest.raises(TypeError):
        stowplan.Packing._from_state((np.zeros(2, np.float64),) * 5, (0, 0, 0, 0.0, 1))


def test_inconsistent_pickled_state_is_refused():
    u32 = lambda *v: np.array(v, dtype=np.uint32)  # noqa: E731
    u64 = lambda *v: np.array(v, dtype=np.uint64)  # noqa: E731
    with pytest.raises(stowplan.InvalidArgumentError, match="Packing: the pickled state is inconsistent"):
        stowplan.Packing._from_state((u32(0, 5, 2), u32(0, 1), u64(1), u32(), u32()), (5, 3, 99, 0.5, 10))
    with pytest.raises(stowplan.InvalidArgumentError, match="more real tokens than aligned"):
        stowplan.Packing._from_state((u32(0, 2), u32(0, 1), u64(3), u32(), u32()), (5, 3, 1, 0.5, 10))
    with pytest.raises(stowplan.InvalidArgumentError, match="Partition: the pickled state is inconsistent"):
        stowplan.Partition._from_state(u32(0, 9), u32(0), u64(1), 1, 0, 1)
    m = stowplan.pack_multi({"tokens": [5, 3]}, {"tokens": 10})
    with pytest.raises(stowplan.InvalidArgumentError, match="resource_loads is not a uint64 array"):
        stowplan.MultiPacking._from_state(m.packing, ["a"], "not an array", {"x": -1})
    with pytest.raises(stowplan.InvalidArgumentError, match="names, loads and bounds disagree"):
        stowplan.MultiPacking._from_state(m.packing, ["a"], m.resource_loads, {"x": 1})
    with pytest.raises(stowplan.InvalidArgumentError, match="MicroBatches: the pickled state is inconsistent"):
        stowplan.MicroBatches._from_state((u32(0, 3), u32(0, 1), u64(1), u64(1), u32(0, 1)), 1, 1)
