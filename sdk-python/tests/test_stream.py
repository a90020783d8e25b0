"""The streaming packer (``stowplan.StreamPacker``) and ``stowplan.PackedIterableDataset``:
the bins are the kernel's whatever the backend or how the stream is cut, states restore
exactly and damage is refused, every sample reaches exactly one consumer, the packs do not
depend on the number of DataLoader workers, and a restart from a checkpoint gives the packs
of an uninterrupted run."""

from __future__ import annotations

import pickle
import random
from typing import Any, List

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan
from conftest import WORKLOADS
from stowplan.errors import InfeasibleError, InvalidArgumentError


def run(packer: stowplan.StreamPacker, lengths: List[int], chunk: int) -> List[List[int]]:
    bins: List[List[int]] = []
    for start in range(0, len(lengths), chunk):
        bins += packer.add(lengths[start : start + chunk])
    return bins + packer.finish()


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=1, max_size=300),
    capacity=st.integers(1, 400),
    open_bins=st.integers(1, 6),
    buffered=st.integers(0, 40),
    chunk=st.integers(1, 50),
    cut=st.integers(0, 300),
)
def test_bins_are_the_same_on_both_backends_however_cut_and_across_a_restore(
    lengths: List[int], capacity: int, open_bins: int, buffered: int, chunk: int, cut: int
) -> None:
    opts = dict(max_open_bins=open_bins, max_buffered=buffered, oversize="single")
    whole = run(stowplan.StreamPacker(capacity, backend="native", **opts), lengths, len(lengths))
    assert run(stowplan.StreamPacker(capacity, **opts), lengths, chunk) == whole
    seen = sorted(i for b in whole for i in b)
    assert seen == list(range(len(lengths)))
    for b in whole:
        assert b == sorted(b)
        assert sum(lengths[i] for i in b) <= capacity or len(b) == 1
    cut = min(cut, len(lengths))
    first = stowplan.StreamPacker(capacity, **opts)
    bins = first.add(lengths[:cut])
    again = stowplan.StreamPacker.from_state(first.state(), backend="native")
    assert again.state() == first.state()
    bins += again.add(np.array(lengths[cut:], dtype=np.int64)) + again.finish()
    assert bins == whole


def test_status_options_and_pickle() -> None:
    p = stowplan.StreamPacker(10, max_open_bins=2, max_buffered=1, align=2, oversize="drop")
    assert (p.capacity, p.max_open_bins, p.max_buffered, p.align, p.oversize) == (10, 2, 1, 2, "drop")
    assert p.add([3, 11, 4]) == [] and p.last_dropped == [1]
    assert (p.next_index, p.buffered, p.open_bins, p.in_open_bins, p.oldest_held) == (3, 1, 1, 1, 0)
    q = pickle.loads(pickle.dumps(p))
    assert q.state() == p.state() and q.finish() == p.finish() == [[0, 2]]
    d = stowplan.StreamPacker(5)
    assert (d.max_open_bins, d.max_buffered) == (
        stowplan._stowplan.STREAM_DEFAULTS["max_open_bins"],
        stowplan._stowplan.STREAM_DEFAULTS["max_buffered"],
    ) == (64, 4096)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(capacity=0), "capacity"),
        (dict(capacity=10, max_open_bins=0), "max_open_bins must be in 1..=65536"),
        (dict(capacity=10, max_open_bins=70000), "max_open_bins must be in 1..=65536"),
        (dict(capacity=10, max_buffered=-1), "max_buffered"),
        (dict(capacity=10, max_buffered=2**20 + 1), "max_buffered must be in 0..=1048576"),
        (dict(capacity=10, align=0), "align"),
        (dict(capacity=10, oversize="shrink"), "oversize"),
        (dict(capacity=10.0), "capacity"),
        (dict(capacity=10, backend="gpu"), "backend"),
    ],
)
def test_bad_options_are_refused_naming_the_argument(kwargs: dict, needle: str) -> None:
    capacity = kwargs.pop("capacity")
    with pytest.raises(InvalidArgumentError, match=needle):
        stowplan.StreamPacker(capacity, **kwargs)


def test_bad_lengths_oversize_and_damaged_states_are_refused() -> None:
    p = stowplan.StreamPacker(10)
    p.add([1, 2])
    before = p.state()
    with pytest.raises(InvalidArgumentError, match="lengths"):
        p.add([1.5])
    with pytest.raises(InvalidArgumentError, match="lengths"):
        p.add([-1])
    with pytest.raises(InfeasibleError, match="stream index 3"):
        p.add([3, 12])
    assert p.state() == before, "a refused call applies nothing"
    damaged = bytearray(before)
    damaged[len(damaged) // 2] ^= 0x10
    with pytest.raises(InvalidArgumentError, match="damaged"):
        stowplan.StreamPacker.from_state(bytes(damaged))
    with pytest.raises(InvalidArgumentError, match="damaged|not a stowplan"):
        stowplan.StreamPacker.from_state(before[:-5])
    with pytest.raises(InvalidArgumentError, match="must be bytes"):
        stowplan.StreamPacker.from_state("state")  # type: ignore[arg-type]


def test_streamed_sft_workload_is_within_0_2_percent_of_the_lower_bound() -> None:
    lengths = np.loadtxt(WORKLOADS / "sft-chat-200k.txt", dtype=np.int64)
    bins = run(stowplan.StreamPacker(16384, max_open_bins=64), lengths.tolist(), 10_000)
    lower = -(-int(lengths.sum()) // 16384)
    assert len(bins) * 1000 <= lower * 1002, (len(bins), lower)


# ------------------------------------------------------------------------------------------
# PackedIterableDataset


def docs(n: int, seed: int = 7) -> List[dict]:
    rng = random.Random(seed)
    return [{"id": i, "n": rng.choice([rng.randint(1, 60), rng.randint(50, 200)])} for i in range(n)]


def ids(packs: List[List[Any]]) -> List[List[int]]:
    return [[d["id"] for d in pack] for pack in packs]


def dataset(source: List[dict], **kw: Any) -> stowplan.PackedIterableDataset:
    kw.setdefault("max_open_bins", 4)
    kw.setdefault("max_buffered", 16)
    return stowplan.PackedIterableDataset(source, lambda d: d["n"], 256, **kw)


def interleave(per_worker: List[List[List[int]]]) -> List[List[int]]:
    """A DataLoader's order: one item from each worker in turn."""
    out: List[List[int]] = []
    for k in range(max(len(w) for w in per_worker)):
        out += [w[k] for w in per_worker if k < len(w)]
    return out


def test_packs_cover_every_sample_once_and_follow_the_stream_packer() -> None:
    source = docs(500)
    packs = ids(list(dataset(source)))
    assert sorted(i for p in packs for i in p) == list(range(500))
    direct = stowplan.StreamPacker(256, max_open_bins=4, max_buffered=16)
    assert packs == run(direct, [d["n"] for d in source], 1)


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_the_same_packs_whatever_the_number_of_workers(world_size: int, workers: int) -> None:
    source = docs(400)
    everything = ids(list(dataset(source)))
    for rank in range(world_size):
        ds = dataset(source, rank=rank, world_size=world_size)
        per_worker = [ids(list(ds._iter_shard(w, workers))) for w in range(workers)]
        assert interleave(per_worker) == everything[rank::world_size]


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("stop", [0, 1, 5, 17, 40])
def test_a_restart_from_a_checkpoint_gives_the_uninterrupted_packs(workers: int, stop: int) -> None:
    source = docs(300, seed=stop)
    for worker in range(workers):
        whole = ids(list(dataset(source, rank=1, world_size=2)._iter_shard(worker, workers)))
        first = dataset(source, rank=1, world_size=2)
        it = first._iter_shard(worker, workers)
        head = ids([next(it) for _ in range(min(stop, len(whole)))])
        state = pickle.loads(pickle.dumps(first.state_dict()))
        second = dataset(source, rank=1, world_size=2)
        second.load_state_dict(state)
        tail = ids(list(second._iter_shard(worker, workers)))
        assert head + tail == whole


def test_states_of_other_settings_versions_or_workers_are_refused() -> None:
    source = docs(100)
    ds = dataset(source)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    with pytest.raises(InvalidArgumentError, match="settings"):
        dataset(source, max_open_bins=5).load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="version"):
        dataset(source).load_state_dict({**state, "version": 99})
    with pytest.raises(InvalidArgumentError, match="format"):
        dataset(source).load_state_dict({"anything": 1})
    damaged = bytearray(state["packer"])
    damaged[-1] ^= 1
    with pytest.raises(InvalidArgumentError, match="damaged"):
        dataset(source).load_state_dict({**state, "packer": bytes(damaged)})
    other = dataset(source)
    other.load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="worker 0 of 1"):
        next(other._iter_shard(0, 2))
    short = dataset(source[:1])
    short.load_state_dict(state)
    with pytest.raises(InvalidArgumentError, match="same source"):
        list(short)


def test_bad_arguments_and_lengths_are_refused_naming_them() -> None:
    with pytest.raises(InvalidArgumentError, match="length_fn"):
        stowplan.PackedIterableDataset([], "len", 10)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="rank"):
        dataset([], rank=2, world_size=2)
    with pytest.raises(InvalidArgumentError, match="world_size"):
        dataset([], world_size=0)
    with pytest.raises(InvalidArgumentError, match="max_open_bins"):
        dataset([], max_open_bins=0)
    with pytest.raises(InvalidArgumentError, match=r"length_fn\(sample 1\)"):
        list(stowplan.PackedIterableDataset([1, 2.5], lambda x: x, 10))
    with pytest.raises(InfeasibleError, match="stream index 1"):
        list(stowplan.PackedIterableDataset([1, 20], lambda x: x, 10))
    dropped = stowplan.PackedIterableDataset([1, 20, 3], lambda x: x, 10, oversize="drop")
    assert list(dropped) == [[1, 3]]
    single = stowplan.PackedIterableDataset([1, 20, 3], lambda x: x, 10, oversize="single", max_buffered=0)
    assert list(single) == [[20], [1, 3]]


def test_torch_dataloader_gives_the_same_packs_with_workers() -> None:
    torch = pytest.importorskip("torch")
    source = docs(200)
    ds = dataset(source)
    plain = ids(list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)))
    workers = ids(list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)))
    assert workers == plain == ids(list(dataset(source)))


def test_a_loaded_state_resumes_one_iteration_only() -> None:
    # Found in review: every later pass resumed from the checkpoint again.
    source = docs(120)
    whole = ids(list(dataset(source)))
    first = dataset(source)
    it = iter(first)
    head = ids([next(it) for _ in range(3)])
    state = first.state_dict()
    second = dataset(source)
    second.load_state_dict(state)
    assert head + ids(list(second)) == whole
    assert ids(list(second)) == whole, "the next epoch starts from the beginning"


def test_a_state_taken_before_the_first_pack_of_a_resumed_run_is_the_loaded_one() -> None:
    # Found in review: iter() then state_dict() (what StatefulDataLoader does on a restart)
    # lost the held samples.
    source = docs(150)
    whole = ids(list(dataset(source)))
    first = dataset(source)
    it = iter(first)
    head = ids([next(it) for _ in range(4)])
    state = first.state_dict()
    second = dataset(source)
    second.load_state_dict(state)
    iter(second)
    again = second.state_dict()
    assert again == state
    third = dataset(source)
    third.load_state_dict(again)
    assert head + ids(list(third)) == whole


def test_zero_length_samples_do_not_pile_up_in_one_bin() -> None:
    p = stowplan.StreamPacker(100, max_buffered=0)
    bins = p.add(np.zeros(70_000, dtype=np.int64))
    assert [len(b) for b in bins] == [65_536] and p.in_open_bins == 70_000 - 65_536
    assert len(p.finish()[0]) == 70_000 - 65_536


def test_states_are_accepted_as_bytearray() -> None:
    p = stowplan.StreamPacker(10)
    p.add([3, 4])
    assert stowplan.StreamPacker.from_state(bytearray(p.state())).state() == p.state()
    with pytest.raises(InvalidArgumentError, match='must start with "SPSK"'):
        stowplan.StreamPacker.from_state(b"x" * 64)
