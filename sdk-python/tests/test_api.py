"""The public API: inputs of every kind, results, errors, threads and properties."""

from __future__ import annotations

import concurrent.futures
import pathlib
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from array_likes import ArrayLike, DLPackOnly  # noqa: E402

DOCS = [100, 900, 50, 950, 400, 600]


@pytest.mark.parametrize(
    "weights",
    [
        DOCS,
        tuple(DOCS),
        np.array(DOCS, dtype=np.uint64),
        np.array(DOCS, dtype=np.int64),
        np.array(DOCS, dtype=np.int32),
        np.array(DOCS, dtype=np.uint16),
        np.repeat(np.array(DOCS, dtype=np.int64), 2)[::2],  # not contiguous
        ArrayLike(DOCS),
        DLPackOnly(np.array(DOCS, dtype=np.int64)),
    ],
)
def test_input_kinds(weights):
    p = stowplan.partition(weights, 2)
    assert p.groups == [[0, 2, 3, 4], [1, 5]]
    assert p.sums.tolist() == [1500, 1500]
    assert (p.total, p.spread, p.lower_bound, p.k, p.max, len(p)) == (3000, 0, 1500, 2, 1500, 2)


def test_outputs_are_numpy():
    p = stowplan.partition(np.arange(1, 101), 7)
    assert p.offsets.dtype == np.uint32 and p.indices.dtype == np.uint32 and p.sums.dtype == np.uint64
    assert len(p.offsets) == 8 and sorted(p.indices.tolist()) == list(range(100))
    b = stowplan.pack(np.arange(1, 101), 120, align=4, method="ffd")
    assert b.loads.dtype == np.uint64 and b.dropped.dtype == np.uint32
    assert b.real_tokens == 5050 and b.padding_tokens == b.aligned_tokens - 5050
    assert 0 < b.efficiency <= 1
    assert "Packing(" in repr(b) and "Partition(" in repr(p)


def test_pack_policies():
    b = stowplan.pack([3, 20, 4, 15], 10, oversize="single")
    assert b.bins == [[1], [3], [0, 2]] and b.single.tolist() == [1, 3] and b.lower_bound == 1
    assert b.efficiency == pytest.approx(7 / 10)
    b = stowplan.pack([3, 20, 4, 15], 10, oversize="drop")
    assert b.bins == [[0, 2]] and b.dropped.tolist() == [1, 3]
    assert stowplan.pack([5, 3, 7, 2, 6], 10, method="next-fit").bins == [[0, 1], [2, 3], [4]]


def test_native_backend_agrees():
    rng = np.random.default_rng(7)
    lengths = rng.integers(1, 8192, size=3000)
    a = stowplan.partition(lengths, 16, backend="wasm")
    b = stowplan.partition(lengths, 16, backend="native")
    assert a.groups == b.groups and a.sums.tolist() == b.sums.tolist()


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: stowplan.partition(DOCS, 0), "k must be in 1..="),
        (lambda: stowplan.partition(DOCS, -3), "k must be in 1..="),
        (lambda: stowplan.partition(DOCS, 2.0), "k must be an integer"),
        (lambda: stowplan.partition(DOCS, True), "k must be an integer"),
        (lambda: stowplan.partition(DOCS, 7), "k must be at most the number of weights n = 6"),
        (lambda: stowplan.partition([], 1), "weights must not be empty"),
        (lambda: stowplan.partition([1, -2, 3], 1), "weights[1] must be in 0..=2**64-1 (got -2)"),
        (lambda: stowplan.partition(np.array([1, -2, 3]), 1), "weights[1] must be in 0..=2**64-1 (got -2)"),
        (lambda: stowplan.partition([1.5, 2.0], 1), "weights[0] must be an integer in 0..=2**64-1 (got 1.5)"),
        (lambda: stowplan.partition([[1, 2]], 1), "weights[0] must be an integer"),
        (lambda: stowplan.partition(np.array([[1, 2]]), 1), "weights must be one-dimensional"),
        (lambda: stowplan.partition([2**64], 1), "weights[0] must be in 0..=2**64-1 (got 18446744073709551616)"),
        (lambda: stowplan.partition([1, 2, 3], 2, equal_size=True), "multiple of k"),
        (lambda: stowplan.partition(DOCS, 2, method="best"), "method must be 'kk', 'greedy' or 'verl'"),
        (lambda: stowplan.partition(DOCS, 2, method="verl", refine=True), "refine must be false"),
        (lambda: stowplan.partition(DOCS, 2, backend="gpu"), "backend must be 'wasm' or 'native'"),
        (lambda: stowplan.pack(DOCS, 0), "capacity must be in 1..="),
        (lambda: stowplan.pack(DOCS, 1000, align=0), "align must be at least 1 (got 0)"),
        (lambda: stowplan.pack(DOCS, 1000, method="worst"), "method must be 'bfd', 'ffd' or 'next-fit'"),
        (lambda: stowplan.pack(DOCS, 1000, oversize="truncate"), "oversize must be 'error', 'single' or 'drop'"),
        (lambda: stowplan.pack([2**63, 2**63], 2**64 - 1), "overflows"),
    ],
)
def test_invalid_arguments_name_the_argument(call, fragment):
    with pytest.raises(stowplan.InvalidArgumentError) as info:
        call()
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, stowplan.StowplanError)


def _native_callables_with_a_backend():
    """Every function, constructor and static method of the native module that takes
    ``backend=`` (read from their signatures, so a new one is checked without an edit here).
    Methods of an instance (``StaticPackPlan.realign``) are left out."""
    import inspect

    from stowplan import _stowplan as native

    found = []
    for name in dir(native):
        obj = getattr(native, name)
        members = [(name, obj)]
        if inspect.isclass(obj):
            # getattr, not vars(): a static method's __text_signature__ is on the function.
            members += [(f"{name}.{k}", getattr(obj, k)) for k in vars(obj) if not k.startswith("__")]
        for label, member in members:
            sig = getattr(member, "__text_signature__", None) or ""
            if "backend=None" in sig and "$self" not in sig:
                found.append((label, member, sig))
    return found


# A value of a type each required argument's converter takes, by the argument's name
# (anything else gets 1). The native module reads its arguments in order, so ``backend`` is
# read, and refused, before the function checks these values.
_SEQUENCES = {"lengths", "seqlens", "weights", "bins", "runs", "labels", "multimodal", "batch_ends", "total_lengths"}
_SEQUENCES |= {"rollout_ids", "samples"}
_BOOLS = {"equal_size", "use_dynamic_batch_size", "balance_data", "balance_by_flops", "multimodal_same_run"}
_OTHERS = {"function": "karmarkar_karp", "python_sum": "naive", "model": {}, "columns": {}, "capacities": {}}
_OTHERS.update(path="x", origin="x", state=b"")


def _placeholder(name):
    if name in _SEQUENCES:
        return []
    return False if name in _BOOLS else _OTHERS.get(name, 1)


@pytest.mark.parametrize("bad", [1.5, "gpu", b"wasm"])
def test_every_backend_argument_is_checked_the_same_way(bad):
    """``backend`` is read by one converter everywhere: a wrong type or name is an
    InvalidArgumentError naming it, whatever the function."""
    callables = _native_callables_with_a_backend()
    # The module's 23 functions at least (Python < 3.10 gives abi3 classes no signatures).
    assert len(callables) >= 23, [c[0] for c in callables]
    for label, member, sig in callables:
        args, kwargs, keyword = [], {}, False
        for part in sig.strip("()").split(", "):
            if part == "*":
                keyword = True
            elif "=" not in part and keyword:
                kwargs[part] = _placeholder(part)
            elif "=" not in part:
                args.append(_placeholder(part))
        with pytest.raises(stowplan.InvalidArgumentError) as info:
            member(*args, **kwargs, backend=bad)
        want = "backend must be 'wasm' or 'native'" if bad == "gpu" else "backend must be a string or None"
        assert want in str(info.value), (label, str(info.value))


def test_every_error_class_has_one_host_kind():
    """The native module raises the host's errors through ``stowplan.errors._BY_KIND``: every
    concrete class is there once, under a kind; only the two base classes are not, nor
    PackingContaminationError, which Python raises (stowplan.hf.check_packing), never the host."""
    from stowplan import errors

    classes = [getattr(errors, name) for name in errors.__all__]
    assert sorted(c.__name__ for c in errors._BY_KIND.values()) == sorted(
        c.__name__ for c in classes if c not in (errors.StowplanError, errors.FilterError, errors.PackingContaminationError)
    )
    assert all(issubclass(c, errors.FilterError) == k.startswith("filter-") for k, c in errors._BY_KIND.items())


def test_infeasible():
    with pytest.raises(stowplan.InfeasibleError, match=r"lengths\[1\] = 1001 .*capacity = 1000"):
        stowplan.pack([10, 1001], 1000)
    assert not issubclass(stowplan.InfeasibleError, ValueError)


def test_threads_share_the_kernel():
    rng = np.random.default_rng(1)
    batches = [rng.integers(1, 16384, size=2048) for _ in range(8)]
    expected = [stowplan.partition(b, 8).groups for b in batches]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda b: stowplan.partition(b, 8).groups, batches * 3))
    assert got == expected * 3


def test_kernel_info():
    info = stowplan.kernel_info()
    assert len(info["sha256"]) == 64 and info["imports"] == []


@settings(max_examples=150, deadline=None)
@given(
    weights=st.lists(st.integers(0, 100_000), min_size=1, max_size=150),
    k=st.integers(1, 12),
    method=st.sampled_from(["kk", "greedy"]),
    equal_size=st.booleans(),
)
def test_partition_invariants(weights, k, method, equal_size):
    if k > len(weights):
        k = len(weights)
    if equal_size:
        weights = weights[: len(weights) - len(weights) % k]
    p = stowplan.partition(weights, k, method=method, equal_size=equal_size)
    assert len(p.groups) == k
    assert sorted(i for g in p.groups for i in g) == list(range(len(weights)))
    assert [sum(weights[i] for i in g) for g in p.groups] == p.sums.tolist()
    assert p.spread == max(p.sums) - min(p.sums)
    assert p.max >= p.lower_bound == max(-(-sum(weights) // k), max(weights))
    if equal_size:
        assert {len(g) for g in p.groups} == {len(weights) // k}
    native = stowplan.partition(weights, k, method=method, equal_size=equal_size, backend="native")
    assert native.groups == p.groups


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=200),
    capacity=st.integers(1, 4000),
    align=st.integers(1, 8),
    method=st.sampled_from(["bfd", "ffd", "next-fit"]),
    oversize=st.sampled_from(["single", "drop"]),
)
def test_pack_invariants(lengths, capacity, align, method, oversize):
    b = stowplan.pack(lengths, capacity, align=align, method=method, oversize=oversize)
    aligned = [-(-x // align) * align for x in lengths]
    placed = sorted(i for bin_ in b.bins for i in bin_)
    oversized = [i for i, a in enumerate(aligned) if a > capacity]
    expected = [i for i in range(len(lengths)) if not (oversize == "drop" and i in oversized)]
    assert placed == expected
    for bin_, load in zip(b.bins, b.loads.tolist()):
        assert load == sum(aligned[i] for i in bin_)
        assert load <= capacity or (len(bin_) == 1 and bin_[0] in b.single.tolist())
    assert b.num_bins - len(b.single) >= b.lower_bound


def test_options_are_keyword_only_and_none_is_the_default():
    default = stowplan.pack(DOCS, 1000)
    explicit_none = stowplan.pack(DOCS, 1000, align=None, method=None, oversize=None, backend=None)
    assert default.bins == explicit_none.bins and default.loads.tolist() == explicit_none.loads.tolist()
    assert stowplan.partition(DOCS, 2, method="verl").groups == stowplan.partition(DOCS, 2, method="verl", refine=None).groups
    # The kernel's spelling, `_` accepted for `-`.
    assert stowplan.pack([5, 3, 7, 2, 6], 10, method="next_fit").bins == stowplan.pack([5, 3, 7, 2, 6], 10, method="next-fit").bins
    with pytest.raises(TypeError):
        stowplan.pack(DOCS, 1000, 2)  # align is keyword-only
    assert stowplan.COSTS == {"tokens": (1, 0), "attention": (24576, 1)}


def test_results_are_read_only_native_objects():
    p = stowplan.partition(DOCS, 2)
    assert isinstance(p, stowplan.Partition) and p.groups is p.groups
    with pytest.raises(AttributeError):
        p.total = 0
    b = stowplan.balance(DOCS, 2, capacity=2000)
    assert [type(m) for m in b.micro_batches] == [stowplan.MicroBatches] * 2
    assert b.token_balance == {"max": 1550, "min": 1450, "mean": 1500.0, "max_over_mean": 1550 / 1500, "spread": 100}
    assert "Balance(dp=2" in repr(b) and "MicroBatches(count=" in repr(b.micro_batches[0])


@pytest.mark.parametrize(
    "old, new",
    [("ZmqReceiver", "ZmqRankClient"), ("FileReceiver", "FileRankClient"), ("Sample", "RolloutSample"), ("MicroBatch", "MaterializedBatch")],
)
def test_former_names_warn_and_give_the_new_class(old, new):
    with pytest.warns(DeprecationWarning, match=f"stowplan.{old} is now stowplan.{new}"):
        cls = getattr(stowplan, old)
    assert cls is getattr(stowplan, new)
    assert old not in stowplan.__all__ and new in stowplan.__all__


LENGTHS = [100, 900, 50, 950, 400, 600]
CONFIG = {"training": {"packing": True}, "template": {"max_length": 1000}}


@pytest.mark.parametrize(
    "call, old, new",
    [
        (lambda **k: stowplan.micro_batches(LENGTHS, **k).batches, "max_token_len", "capacity"),
        (lambda **k: stowplan.balance(LENGTHS, 2, **k).micro_batches[0].batches, "max_token_len", "capacity"),
        (lambda **k: stowplan.StaticPackPlan.from_lengths(LENGTHS, **k).raw_packs(), "packing_length", "capacity"),
        (lambda **k: stowplan.plan_dataset(LENGTHS, int, log=False, **k).raw_packs(), "packing_length", "capacity"),
    ],
)
def test_the_caps_former_names_warn_name_capacity_and_give_the_same_plan(call, old, new):
    want = call(**{new: 1000})
    with pytest.warns(DeprecationWarning, match=rf"{old}= is deprecated and will be removed in the next release; use {new}="):
        got = call(**{old: 1000})
    assert [list(map(int, b)) for b in got] == [list(map(int, b)) for b in want]
    with pytest.raises(stowplan.InvalidArgumentError, match=rf"give {new}= only \({old}= is its former name, deprecated\)"):
        call(**{new: 1000, old: 1000})


def test_the_cap_is_required_and_named():
    with pytest.raises(stowplan.InvalidArgumentError, match=r"micro_batches: capacity .* is required"):
        stowplan.micro_batches(LENGTHS)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"StaticPackPlan.from_lengths: capacity .* is required"):
        stowplan.StaticPackPlan.from_lengths(LENGTHS)


def test_the_caps_former_attribute_names_warn_and_name_capacity():
    plan = stowplan.StaticPackPlan.from_lengths(LENGTHS, capacity=1000)
    with pytest.warns(DeprecationWarning, match=r"StaticPackPlan: packing_length is deprecated .*; use capacity$"):
        assert plan.packing_length == plan.capacity == 1000
    c = stowplan.PackingConfig.from_dict(CONFIG, world_size=1)
    with pytest.warns(DeprecationWarning, match=r"PackingConfig: packing_length_key is deprecated .*; use capacity_key$"):
        assert c.packing_length_key == c.capacity_key == "template.max_length"
    assert "capacity=1000" in repr(c) and "packing_length" not in repr(c) and c.to_dict()["capacity"] == 1000
