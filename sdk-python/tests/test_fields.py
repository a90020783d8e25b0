"""Per-token fields of any shape and per-sample payload ranges in a micro-batch's layout:
stowplan's own per-token arrays are the oracle — ``input_ids`` and
``teacher_logprobs`` are per-token fields too, so gathering the samples' own token ids must
give the row's ``input_ids`` and slicing them for a CP rank its ``cp_view``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan

PAD = 1  # materialize's default pad token (prime-rl's)


@st.composite
def batches(draw):
    n = draw(st.integers(1, 12))
    samples = []
    for i in range(n):
        p = draw(st.integers(0, 6))
        c = draw(st.integers(1, 10))
        ids = [1000 * (i + 1) + t for t in range(p + c)]
        samples.append({"prompt_ids": ids[:p], "completion_ids": ids[p:], "advantage": 1.0,
                        "teacher_logprobs": [-(i + t / 100) for t in range(p + c)]})
    cp = draw(st.sampled_from([1, 2]))
    dp = draw(st.integers(1, 3))
    return samples, cp, dp


@settings(max_examples=60, deadline=None)
@given(batches())
def test_gathered_fields_follow_the_rows_and_cp_views(case):
    samples, cp, dp = case
    m = stowplan.materialize(samples, capacity=64, dp=dp, cp=cp)
    ids = [np.asarray(s["prompt_ids"] + s["completion_ids"], dtype=np.int64) for s in samples]
    # A (3, L) field like mRoPE position ids: row j is the token ids times (j + 1).
    mrope = [np.stack([a * (j + 1) for j in range(3)]) for a in ids]
    teacher = [np.asarray(s["teacher_logprobs"], dtype=np.float32) for s in samples]
    # Payload: sample i owns i % 3 rows of a shared array, consecutive in sample order.
    counts = [i % 3 for i in range(len(samples))]
    starts = np.concatenate([[0], np.cumsum(counts)])
    ranges = np.stack([starts[:-1], starts[1:]], axis=1)
    seen_payload = []
    for rank in m.ranks:
        for mb in rank:
            got = stowplan.gather_tokens(mb, ids, pad=PAD)
            assert got.dtype == np.int64 and got.tolist() == mb.input_ids.tolist()
            three = stowplan.gather_tokens(mb, mrope, pad=PAD)
            assert three.shape == (3, len(mb))
            real = mb.input_ids != PAD
            for j in range(3):
                assert three[j][real].tolist() == (mb.input_ids[real] * (j + 1)).tolist()
            t = stowplan.gather_tokens(mb, teacher, pad=0.0)
            assert t.dtype == np.float32 and np.array_equal(t, mb.teacher_logprobs)
            if mb.cp > 1:
                for r in range(mb.cp):
                    view = mb.cp_view(r)
                    assert stowplan.cp_slice(mb, r, got).tolist() == view["input_ids"].tolist()
                    assert stowplan.cp_slice(mb, r, three).shape == (3, len(view["input_ids"]))
            p = stowplan.gather_payload(mb, ranges)
            assert len(p.offsets) == len(mb.samples) + 1 and p.offsets[-1] == len(p.index)
            for k, i in enumerate(mb.samples.tolist()):
                assert p.index[p.offsets[k]:p.offsets[k + 1]].tolist() == list(range(starts[i], starts[i + 1]))
            seen_payload.extend(p.index.tolist())
            if mb.dummy:
                assert (got == PAD).all() and len(p.index) == 0
    # Every payload row lands in exactly one micro-batch.
    assert sorted(seen_payload) == list(range(int(starts[-1])))


def test_bad_fields_and_ranges_name_the_argument():
    samples = [{"prompt_ids": [1, 2], "completion_ids": [3], "advantage": 1.0},
               {"prompt_ids": [4], "completion_ids": [5], "advantage": 1.0}]
    m = stowplan.materialize(samples, capacity=16, mix_runs=True)
    mb = next(mb for r in m.ranks for mb in r if len(mb.samples) == 2)
    good = [np.zeros((3, 3)), np.zeros((3, 2))]
    for values, match in [
        ([], "one array per sample"),
        ([np.zeros((3, 3))], "values has 1 entries but the row holds sample 1"),
        ([np.zeros((3, 3)), np.zeros((3, 3))], r"values\[1\] must have shape \(3, 2\)"),
        ([np.zeros((3, 3)), np.zeros((2, 2))], r"values\[1\] must have shape \(3, 2\)"),
        ([np.zeros((3, 3)), np.zeros((3, 2), dtype=np.int32)], r"values\[1\] must have the dtype"),
        ([np.float64(1.0)], r"values\[0\] must be an array"),
    ]:
        with pytest.raises(stowplan.InvalidArgumentError, match=match):
            stowplan.gather_tokens(mb, values)
    assert stowplan.gather_tokens(mb, good).shape == (3, len(mb))
    for ranges, match in [
        ([(0, 1)], "ranges has 1 entries"),
        ([(0, 1, 2)], r"shape \(samples, 2\)"),
        ([(0.5, 1.0), (1.0, 2.0)], "integer"),
        ([(2, 1), (0, 0)], r"ranges\[0\] must satisfy 0 <= start <= end"),
        ([(0, 1), (-1, 0)], r"ranges\[1\] must satisfy"),
    ]:
        with pytest.raises(stowplan.InvalidArgumentError, match=match):
            stowplan.gather_payload(mb, ranges)
    with pytest.raises(stowplan.InvalidArgumentError, match="no CP split"):
        stowplan.cp_slice(mb, 0, np.zeros(len(mb)))
    with pytest.raises(stowplan.InvalidArgumentError, match=r"row must have shape \(\.\.\., "):
        stowplan.cp_slice(mb, 0, np.zeros(len(mb) + 1))
