"""Packing under several limits at once from Python: every bin within every
capacity, one resource equal to ``pack``, the bound per resource, and errors naming the
argument."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan

WORKLOADS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "workloads"


def vlm_rows(min_size, max_size, max_tokens=400):
    """Rows ``(tokens, image tokens, images)`` of a vision-language batch."""
    row = st.tuples(st.integers(1, max_tokens), st.integers(0, 300), st.integers(0, 4))
    return st.lists(row, min_size=min_size, max_size=max_size)


#: Caps for those rows: tokens, image tokens, images.
VLM_CAPS = (st.integers(400, 1200), st.integers(300, 900), st.integers(4, 10))


def vlm_batch(rows, image_cap, images_cap):
    """The lengths, resources and limits of ``rows`` under those caps."""
    lengths = [r[0] for r in rows]
    resources = {"image_tokens": [r[1] for r in rows], "images": [r[2] for r in rows]}
    return lengths, resources, {"image_tokens": image_cap, "images": images_cap}


@st.composite
def cases(draw):
    r = draw(st.integers(1, 4))
    n = draw(st.integers(1, 80))
    names = ["tokens", "image_tokens", "images", "frames"][:r]
    caps = {name: draw(st.integers(1, 60)) for name in names}
    cols = {name: draw(st.lists(st.integers(0, 70), min_size=n, max_size=n)) for name in names}
    return cols, caps, draw(st.integers(0, 6)), draw(st.sampled_from(["balanced", "bfd", "ffd", "next-fit"]))


@settings(max_examples=150, deadline=None)
@given(cases())
def test_every_bin_is_within_every_limit_and_every_item_is_placed_once(case):
    cols, caps, max_segments, method = case
    p = stowplan.pack_multi(cols, caps, max_segments=max_segments, method=method, oversize="drop")
    names = list(cols)
    n = len(cols["tokens"])
    sizes = np.array([cols[k] for k in names], dtype=np.uint64).T
    seen = sorted(i for b in p.bins for i in b) + p.packing.dropped.tolist()
    assert sorted(seen) == list(range(n))
    assert p.resource_loads.shape == (len(p), len(names))
    for b, members in enumerate(p.bins):
        load = sizes[members].sum(axis=0)
        assert load.tolist() == p.resource_loads[b].tolist()
        assert all(load[q] <= caps[k] for q, k in enumerate(names)), (load, caps)
        assert max_segments == 0 or len(members) <= max_segments
    for i in p.packing.dropped:
        assert any(sizes[i][q] > caps[k] for q, k in enumerate(names))
    kept = np.setdiff1d(np.arange(n), p.packing.dropped)
    for q, k in enumerate(names):
        assert p.lower_bounds[k] == -(-int(sizes[kept, q].sum()) // caps[k])
    if max_segments:
        assert p.lower_bounds["segments"] == -(-len(kept) // max_segments)
    assert p.lower_bound == max(p.lower_bounds.values())
    assert len(p) >= p.lower_bound


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 100), min_size=1, max_size=100), st.integers(1, 100), st.sampled_from(["balanced", "bfd", "ffd", "next-fit"]))
def test_one_resource_is_pack(lengths, capacity, method):
    # With one resource, balanced is best-fit decreasing.
    want = stowplan.pack(lengths, capacity, method="bfd" if method == "balanced" else method, oversize="single")
    got = stowplan.pack_multi({"tokens": lengths}, {"tokens": capacity}, method=method, oversize="single")
    assert got.bins == want.bins
    assert got.packing.loads.tolist() == want.loads.tolist()
    assert got.lower_bounds == {"tokens": want.lower_bound}


def test_numpy_columns_and_both_backends_agree():
    rng = np.random.default_rng(7)
    cols = {"tokens": rng.integers(1, 4000, 3000), "image_tokens": rng.integers(0, 2000, 3000), "images": rng.integers(0, 8, 3000)}
    caps = {"tokens": 8192, "image_tokens": 4096, "images": 16}
    a = stowplan.pack_multi(cols, caps, max_segments=16, backend="wasm")
    b = stowplan.pack_multi(cols, caps, max_segments=16, backend="native")
    assert a.bins == b.bins and a.resource_loads.tolist() == b.resource_loads.tolist()


def test_the_vlm_workload_packs_within_every_limit():
    rows = np.loadtxt(WORKLOADS / "vlm-mix-100k.tsv", skiprows=1, dtype=np.uint64)[:20_000]
    cols = {"tokens": rows[:, 0], "image_tokens": rows[:, 1], "images": rows[:, 2]}
    caps = {"tokens": 16384, "image_tokens": 8192, "images": 32}
    p = stowplan.pack_multi(cols, caps, max_segments=64, oversize="drop")
    assert (p.resource_loads <= np.array([16384, 8192, 32], dtype=np.uint64)).all()
    assert len(p) >= p.lower_bound and set(p.lower_bounds) == {"tokens", "image_tokens", "images", "segments"}


def test_errors_name_the_argument_and_the_resource():
    with pytest.raises(stowplan.InfeasibleError, match=r"item 1 needs 40 images \(capacity 32\); use oversize single or drop"):
        stowplan.pack_multi({"tokens": [5, 7], "images": [1, 40]}, {"tokens": 100, "images": 32})
    bad = [
        (({"tokens": [1]}, {"tokens": 0}), r"capacities\['tokens'\]"),
        (({"tokens": [1], "images": [1, 2]}, {"tokens": 9, "images": 9}), r"columns\['images'\] has 2 sizes, columns\['tokens'\] 1"),
        (({"tokens": [1]}, {"tokens": 9, "images": 2}), r"capacities\['images'\] has no column"),
        (({"tokens": [1], "images": [1]}, {"tokens": 9}), r"capacities has no entry for column 'images'"),
        (({}, {}), r"columns must name 1 to 8 resources \(got 0\)"),
        (({"tokens": [-1]}, {"tokens": 9}), r"columns\['tokens'\]"),
    ]
    for (cols, caps), message in bad:
        with pytest.raises(stowplan.InvalidArgumentError, match=message):
            stowplan.pack_multi(cols, caps)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"capacities\[0\] \(tokens\) must be at most 4294967295 with the balanced method"):
        stowplan.pack_multi({"tokens": [1], "images": [1]}, {"tokens": 2**32, "images": 1})
    with pytest.raises(stowplan.InvalidArgumentError, match=r"method must be 'balanced', 'bfd', 'ffd' or 'next-fit' \(got \"best\"\)"):
        stowplan.pack_multi({"tokens": [1], "images": [1]}, {"tokens": 9, "images": 1}, method="best")
    with pytest.raises(stowplan.InvalidArgumentError, match=r"names\[1\] = \"segments\" is the segment limit's name"):
        stowplan.pack_multi({"tokens": [1], "segments": [1]}, {"tokens": 9, "segments": 9}, max_segments=2)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"capacities' keys must be resource names \(str\), got 1"):
        stowplan.pack_multi({"t": [1]}, {"t": 4, 1: 3})
    with pytest.raises(stowplan.InfeasibleError, match=r"item 1 needs 30 tok \(capacity 10\)"):
        stowplan.pack_multi({"tok": [5, 30]}, {"tok": 10})
    with pytest.raises(stowplan.InvalidArgumentError, match="max_segments"):
        stowplan.pack_multi({"tokens": [1]}, {"tokens": 9}, max_segments=-1)
    with pytest.raises(stowplan.InvalidArgumentError, match="method"):
        stowplan.pack_multi({"tokens": [1]}, {"tokens": 9}, method="best")


@settings(max_examples=80, deadline=None)
@given(vlm_rows(1, 60), *VLM_CAPS, st.sampled_from(["wasm", "native"]))
def test_micro_batches_keep_every_limit(rows, cap, image_cap, images_cap, backend):
    lengths, resources, limits = vlm_batch(rows, image_cap, images_cap)
    mb = stowplan.micro_batches(lengths, cap, resources=resources, limits=limits, cost="attention", backend=backend)
    seen = sorted(int(i) for b in mb.batches for i in b)
    assert seen == list(range(len(rows)))
    for b in mb.batches:
        assert sum(lengths[i] for i in b) <= cap
        for name, c in limits.items():
            assert sum(resources[name][i] for i in b) <= c
    bounds = [-(-sum(lengths) // cap), -(-sum(resources["image_tokens"]) // image_cap), -(-sum(resources["images"]) // images_cap)]
    assert mb.lower_bound == max(1, *bounds) and mb.count >= mb.lower_bound
    # A text-only batch: the plan without limits.
    text = stowplan.micro_batches(lengths, cap, resources={"images": [0] * len(rows)}, limits={"images": 1}, backend=backend)
    plain = stowplan.micro_batches(lengths, cap, backend=backend)
    assert [b.tolist() for b in text.batches] == [b.tolist() for b in plain.batches]


@settings(max_examples=60, deadline=None)
@given(vlm_rows(8, 120), st.integers(1, 4), *VLM_CAPS)
def test_balance_keeps_every_limit_on_every_rank(rows, dp, cap, image_cap, images_cap):
    lengths, resources, limits = vlm_batch(rows, image_cap, images_cap)
    try:
        b = stowplan.balance(
            lengths, dp, capacity=cap, resources=resources, limits=limits, cost="attention",
            extra_costs=resources["image_tokens"],
        )
    except stowplan.InvalidArgumentError as e:
        # A rank with fewer samples than the common count needs.
        assert "rank" in str(e)
        return
    native = stowplan.balance(
        lengths, dp, capacity=cap, resources=resources, limits=limits, cost="attention",
        extra_costs=resources["image_tokens"], backend="native",
    )
    assert [[m.tolist() for m in r.batches] for r in b.micro_batches] == [[m.tolist() for m in r.batches] for r in native.micro_batches]
    seen = []
    for rank, mb in zip(b.ranks, b.micro_batches):
        assert mb.count == b.count
        for m in mb.batches:
            assert set(m.tolist()) <= set(rank.tolist())
            assert sum(lengths[i] for i in m) <= cap
            for name, c in limits.items():
                assert sum(resources[name][i] for i in m) <= c
            seen += m.tolist()
    assert sorted(seen) == list(range(len(rows)))
    # The DP level is the one without limits (the extra costs count).
    plain = stowplan.balance(lengths, dp, cost="attention", extra_costs=resources["image_tokens"])
    assert [r.tolist() for r in b.ranks] == [r.tolist() for r in plain.ranks]
    with pytest.raises(stowplan.InvalidArgumentError, match="give capacity with resources and limits"):
        stowplan.balance(lengths, dp, resources=resources, limits=limits)


def test_micro_batch_limit_errors_name_the_argument():
    lengths = [10, 20]
    for kwargs, error, match in [
        (dict(resources={"images": [1, 5]}, limits={"images": 3}), stowplan.InfeasibleError, "sequence 1 has 5 images, more than its cap 3"),
        (dict(resources={"images": [1, 1]}), stowplan.InvalidArgumentError, "resources needs limits"),
        (dict(limits={"images": 3}), stowplan.InvalidArgumentError, "limits needs resources"),
        (dict(resources={"images": [1]}, limits={"images": 3}), stowplan.InvalidArgumentError, r"resources\['images'\] has 1 sizes, lengths 2"),
        (dict(resources={"images": [1, 1]}, limits={"frames": 3}), stowplan.InvalidArgumentError, r"limits has no cap for resources\['images'\]"),
        (dict(resources={"images": [1, 1]}, limits={"images": 3, "frames": 2}), stowplan.InvalidArgumentError, r"limits\['frames'\] has no sizes"),
        (dict(resources={"images": [1, 1]}, limits={"images": 0}), stowplan.InvalidArgumentError, r"limits\['images'\] must be"),
        (dict(resources={"tokens": [1, 1]}, limits={"tokens": 9}), stowplan.InvalidArgumentError, "not a further limit"),
        (dict(resources={}, limits={}), stowplan.InvalidArgumentError, "1 to 7 resources"),
        (dict(resources={"images": [1, -1]}, limits={"images": 3}), stowplan.InvalidArgumentError, r"resources\['images'\]"),
    ]:
        with pytest.raises(error, match=match):
            stowplan.micro_batches(lengths, 100, **kwargs)


@settings(max_examples=60, deadline=None)
@given(
    rows=vlm_rows(1, 60, max_tokens=60),
    dp=st.integers(1, 4),
    image_cap=st.integers(300, 900),
    images_cap=st.integers(4, 9),
    backend=st.sampled_from(["wasm", "native"]),
)
def test_materialize_keeps_every_row_within_every_limit(rows, dp, image_cap, images_cap, backend):
    # Text samples carry no resources; the others name one or both limits.
    samples = []
    for i, (n, it, im) in enumerate(rows):
        s = {"prompt_ids": [3] * n, "completion_ids": [4], "advantage": 1.0, "extra_cost": it}
        if it or im:
            s["resources"] = {"images": im} if i % 3 == 0 else {"image_tokens": it, "images": im}
        samples.append(s)
    sizes = [(it if i % 3 else 0, im) if (it or im) else (0, 0) for i, (_, it, im) in enumerate(rows)]
    limits = {"image_tokens": image_cap, "images": images_cap}
    m = stowplan.materialize(samples, capacity=128, dp=dp, limits=limits, backend=backend)
    seen = []
    for rank in m.ranks:
        assert len(rank) == m.per_rank
        for mb in rank:
            ids = mb.samples.tolist()
            assert len(mb.input_ids) <= 128
            assert sum(sizes[i][0] for i in ids) <= image_cap
            assert sum(sizes[i][1] for i in ids) <= images_cap
            seen += ids
    assert sorted(seen) == list(range(len(rows)))
    other = "native" if backend == "wasm" else "wasm"
    again = stowplan.materialize(samples, capacity=128, dp=dp, limits=limits, backend=other)
    assert [[mb.samples.tolist() for mb in r] for r in again.ranks] == [[mb.samples.tolist() for mb in r] for r in m.ranks]


def test_materialize_limit_errors_name_the_sample_and_the_limit():
    s = lambda **kw: {"prompt_ids": [1, 2], "completion_ids": [3], "advantage": 1.0, **kw}  # noqa: E731
    limits = {"images": 2}
    with pytest.raises(stowplan.InfeasibleError, match="sample 1 has 3 images, more than its cap 2"):
        stowplan.materialize([s(), s(resources={"images": 3})], capacity=16, limits=limits)
    cases = [
        ([s(resources={"image": 1})], limits, "samples\\[0\\] names resource \"image\", which is not one of the limits \\(images\\)"),
        ([s(resources={"images": 1})], None, "samples\\[0\\] has resources but this call has no limits to check them against"),
        ([s(resources=[1])], limits, "samples\\[0\\].resources must be a dict"),
        ([s(resources={2: 1})], limits, "samples\\[0\\].resources' keys must be limit names"),
        ([s(resources={"images": -1})], limits, "samples\\[0\\].resources\\['images'\\]"),
        ([s()], {"images": 0}, "limits\\['images'\\]"),
        ([s()], {"tokens": 5}, "tokens"),
        ([s()], [("images", 2)], "limits must be a dict of resource name → cap"),
    ]
    for samples, lim, message in cases:
        with pytest.raises(stowplan.InvalidArgumentError, match=message):
            stowplan.materialize(samples, capacity=16, limits=lim)
    with pytest.raises(stowplan.InvalidArgumentError, match="a plan is materialized as given"):
        stowplan.materialize([s()], capacity=16, limits=limits, plan=[[[0]]])
    # A given plan takes no resources: refused, not dropped (the packer checks them against
    # its own limits; see test_packer).
    with pytest.raises(stowplan.InvalidArgumentError, match="a given plan takes none"):
        stowplan.materialize([s(resources={"images": 1})], capacity=16, plan=[[[0]]])


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=1, max_size=50),
    dp=st.integers(1, 3),
    max_segments=st.integers(1, 5),
    with_images=st.booleans(),
)
def test_materialize_keeps_at_most_max_segments_samples_per_row(lengths, dp, max_segments, with_images):
    samples = [{"prompt_ids": [3] * n, "completion_ids": [4], "advantage": 1.0} for n in lengths]
    limits = None
    if with_images:
        limits = {"images": 4}
        for i, s in enumerate(samples):
            s["resources"] = {"images": i % 3}
    m = stowplan.materialize(samples, capacity=128, dp=dp, limits=limits, max_segments=max_segments)
    sizes = [len(mb.samples) for rank in m.ranks for mb in rank]
    assert max(sizes) <= max_segments
    assert sorted(int(i) for rank in m.ranks for mb in rank for i in mb.samples) == list(range(len(lengths)))
    for rank in m.ranks:
        for mb in rank:
            if with_images:
                assert sum(samples[int(i)]["resources"]["images"] for i in mb.samples) <= 4


def test_max_segments_errors_name_the_argument():
    s = {"prompt_ids": [1, 2], "completion_ids": [3], "advantage": 1.0}
    with pytest.raises(stowplan.InvalidArgumentError, match="max_segments"):
        stowplan.materialize([s], capacity=16, max_segments=-1)
    with pytest.raises(stowplan.InvalidArgumentError, match="a plan is materialized as given"):
        stowplan.materialize([s], capacity=16, max_segments=2, plan=[[[0]]])
    with pytest.raises(stowplan.InvalidArgumentError, match="segments"):
        stowplan.materialize([s], capacity=16, limits={"segments": 2}, max_segments=2)
