"""stowplan.compat.slime's scheduling against every slime oracle vector (tests/vectors/slime,
made by running slime's own code), its errors, patch(), and invariants on random input."""

from __future__ import annotations

import json
import pathlib
import struct
import sys
import types
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan
from stowplan.compat import slime

SLIME = pathlib.Path(__file__).resolve().parents[2] / "tests" / "vectors" / "slime"
FILES = sorted(p for p in SLIME.glob("*.json") if p.name != "index.json")
VECTORS = {p.stem: json.loads(p.read_text()) for p in FILES}


def bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def run(v):
    """Calls the compat function of a vector's kind as slime's harness called slime's."""
    inp, kind = v["input"], v["kind"]
    if kind == "first_fit_pack":
        return {"bins": slime.first_fit_pack(list(inp["lengths"]), inp["max_tokens_per_bin"])}
    if kind == "expand_bins":
        bins = [list(b) for b in inp["bins"]]
        assert slime.expand_bins_by_splitting(bins, inp["target_count"], inp["lengths"]) is None
        return {"bins": bins}
    if kind == "kk_partition":
        return {
            "partitions": slime.get_seqlen_balanced_partitions(
                list(inp["seqlen_list"]), inp["k_partitions"], inp["equal_size"]
            )
        }
    if kind == "fwd_flops":
        args = SimpleNamespace(**inp["args"])
        return {"flops": [slime.calculate_fwd_flops([s], args) for s in inp["seqlens"]]}
    if kind == "fwd_flops_total":
        return {"flops": slime.calculate_fwd_flops(list(inp["seqlens"]), SimpleNamespace(**inp["args"]))}
    if kind == "dp_schedule":
        out = slime._build_dp_schedule(
            SimpleNamespace(**inp["args"]),
            dict(inp["train_parallel_config"]),
            list(inp["total_lengths"]),
            inp["global_batch_size"],
            list(inp["rollout_indices"]),
            v.get("python_sum", "naive"),
        )
        keys = ("partitions", "micro_batch_indices", "num_microbatches", "global_batch_sizes")
        return dict(zip(keys, out))
    raise AssertionError(kind)


def test_the_vector_set_is_complete():
    kinds = {}
    for v in VECTORS.values():
        assert v["schema"] == "stowplan-peer-oracle/1"
        assert v["peer"] == "THUDM/slime" and v["peer_commit"] == "624b824a898ab0ec1fcb4d373004c7f3852bf515"
        kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
    assert kinds == {
        "first_fit_pack": 26,
        "expand_bins": 19,
        "kk_partition": 17,
        "fwd_flops": 14,
        "fwd_flops_total": 4,
        "dp_schedule": 83,
    }


@pytest.mark.parametrize("name", sorted(VECTORS))
def test_vector(name):
    v = VECTORS[name]
    want_error = v.get("error")
    if want_error is None:
        got = run(v)
        want = {k: x for k, x in v["output"].items() if k != "derived"}
        assert got == want
        if v["kind"].startswith("fwd_flops"):
            # Bit for bit, and the same Python type (float, or int without layer terms).
            flat = got["flops"] if isinstance(got["flops"], list) else [got["flops"]]
            wbits = v["output"]["derived"]["flops_bits"]
            wbits = wbits if isinstance(wbits, list) else [wbits]
            for g, w, b in zip(flat, want["flops"] if isinstance(want["flops"], list) else [want["flops"]], wbits):
                assert type(g) is type(w)
                if isinstance(g, float):
                    assert bits(g) == b
        return
    if want_error["type"] == "AssertionError":
        with pytest.raises(AssertionError) as e:
            run(v)
        assert type(e.value) is AssertionError
        assert str(e.value) == want_error["message"]
    else:
        # slime's incidental Python errors (ZeroDivisionError, ValueError) are refused with a
        # message naming the argument.
        with pytest.raises(stowplan.InvalidArgumentError):
            run(v)


def small_args(**kw):
    a = dict(
        micro_batch_size=1,
        use_dynamic_batch_size=False,
        max_tokens_per_gpu=None,
        balance_data=False,
        balance_by_flops=False,
        hidden_size=16,
        num_attention_heads=2,
        num_query_groups=2,
        vocab_size=32,
        ffn_hidden_size=64,
        num_experts=None,
        num_layers=2,
        kv_channels=8,
    )
    a.update(kw)
    return a


TP2 = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}


def test_args_may_be_a_dict_or_a_namespace():
    lengths = [300, 20, 500, 40, 90, 10, 700, 60]
    rids = list(range(8))
    a = small_args(use_dynamic_batch_size=True, max_tokens_per_gpu=800, balance_data=True)
    assert slime.build_dp_schedule(a, TP2, lengths, global_batch_size=8, rollout_indices=rids) == slime.build_dp_schedule(
        SimpleNamespace(**a), TP2, lengths, global_batch_size=8, rollout_indices=rids
    )


def test_rollout_ids_any_hashable_in_first_occurrence_order():
    lengths = [5, 6, 7, 8, 9, 10]
    a = small_args(use_dynamic_batch_size=True, max_tokens_per_gpu=10)
    by_int = slime.build_dp_schedule(a, TP2, lengths, global_batch_size=2, rollout_indices=[7, 3, 3, 7, 9, 1])
    by_str = slime.build_dp_schedule(a, TP2, lengths, global_batch_size=2, rollout_indices=["x", "b", "b", "x", "z", "a"])
    assert by_int == by_str


def test_a_missing_model_attribute_raises_when_slime_would_read_it():
    a = small_args(use_dynamic_batch_size=True, max_tokens_per_gpu=100, balance_data=True)
    del a["kv_channels"]
    ns = SimpleNamespace(**a)
    with pytest.raises(AttributeError) as e:
        slime.build_dp_schedule(ns, TP2, [10, 20, 30, 40], global_batch_size=4, rollout_indices=[0, 1, 2, 3])
    with pytest.raises(AttributeError) as want:
        ns.kv_channels  # noqa: B018
    assert str(e.value) == str(want.value)
    # Without balancing no FLOPs are needed, so nothing is read.
    a["balance_data"] = False
    slime.build_dp_schedule(a, TP2, [10, 20, 30, 40], global_batch_size=4, rollout_indices=[0, 1, 2, 3])
    with pytest.raises(AttributeError):
        slime.calculate_fwd_flops([3], {k: v for k, v in a.items() if k != "hidden_size"})


@pytest.mark.parametrize(
    "change, name",
    [
        (dict(global_batch_size=0), "global_batch_size"),
        (dict(tp={**TP2, "dp_size": 0}), "dp_size"),
        (dict(args=small_args(micro_batch_size=0)), "micro_batch_size"),
        (dict(lengths=[1, -2, 3, 4]), "total_lengths"),
        (dict(lengths=[1, 2, 3]), "total_lengths"),
        (dict(args=small_args(use_dynamic_batch_size=True, max_tokens_per_gpu=0, balance_by_flops=True)), "max_tokens_per_gpu"),
        (
            dict(tp={**TP2, "cp_size": 0}, args=small_args(use_dynamic_batch_size=True, max_tokens_per_gpu=9, balance_by_flops=True)),
            "cp_size",
        ),
        (dict(tp={**TP2, "vpp_size": 2, "microbatch_group_size_per_vp_stage": 0}), "microbatch_group_size_per_vp_stage"),
    ],
)
def test_bad_arguments_name_themselves(change, name):
    call = dict(args=small_args(), tp=TP2, lengths=[1, 2, 3, 4], global_batch_size=4)
    call.update(change)
    with pytest.raises(stowplan.InvalidArgumentError, match=name):
        slime.build_dp_schedule(
            call["args"], call["tp"], call["lengths"], global_batch_size=call["global_batch_size"], rollout_indices=[0, 1, 2, 3]
        )


def test_numpy_weights():
    np = pytest.importorskip("numpy")
    w = [1.5, 2.5, 1.5, 0.5, 3.0, 2.5]
    want = slime.get_seqlen_balanced_partitions(w, 3, True)
    assert slime.get_seqlen_balanced_partitions(np.array(w, dtype=np.float64), 3, True) == want
    with pytest.raises(stowplan.InvalidArgumentError, match=r"seqlen_list\[0\]"):
        slime.get_seqlen_balanced_partitions(np.array(w, dtype=np.float32), 3, True)
    ints = [5, 1, 9, 3, 7, 2, 8, 4]
    assert slime.get_seqlen_balanced_partitions(np.array(ints), 2, False) == slime.get_seqlen_balanced_partitions(ints, 2, False)


def test_float_weights_refused_out_of_domain():
    with pytest.raises(stowplan.InvalidArgumentError, match="seqlen_list"):
        slime.get_seqlen_balanced_partitions([1.0, -2.0, 3.0], 2, False)
    with pytest.raises(AssertionError, match=r"number of items:\[2\] < k_partitions:\[3\]"):
        slime.get_seqlen_balanced_partitions([1.0, 2.0], 3, False)


def _reference_first_fit(lengths, cap):
    bins, sums = [], []
    for i, x in enumerate(lengths):
        for j, s in enumerate(sums):
            if s + x <= cap:
                bins[j].append(i)
                sums[j] += x
                break
        else:
            bins.append([i])
            sums.append(x)
    return bins


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 120), max_size=60), st.integers(1, 150))
def test_first_fit_every_index_once_and_within_the_cap(lengths, cap):
    bins = slime.first_fit_pack(lengths, cap)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert sum(lengths[i] for i in b) <= cap or len(b) >= 1 and lengths[b[0]] > cap
    assert bins == _reference_first_fit(lengths, cap)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(0, 3000), min_size=1, max_size=48),
    st.integers(1, 4),
    st.integers(1, 8000),
    st.booleans(),
    st.booleans(),
    st.integers(1, 6),
)
def test_dp_schedule_places_every_kept_sample_once(lengths, dp, cap, balance_data, flops, gbs):
    a = small_args(use_dynamic_batch_size=True, max_tokens_per_gpu=cap, balance_data=balance_data, balance_by_flops=flops)
    tp = {**TP2, "dp_size": dp}
    rids = list(range(len(lengths)))
    try:
        parts, mbi, nmb, gbss = slime.build_dp_schedule(a, tp, lengths, global_batch_size=gbs, rollout_indices=rids)
    except AssertionError:
        return
    kept = (len(lengths) // gbs) * gbs
    assert sorted(i for p in parts for i in p) == list(range(kept))
    for r in range(dp):
        assert [i for mb in mbi[r] for i in mb] == list(range(len(parts[r])))
        assert len(mbi[r]) == sum(nmb)
    assert gbss == [gbs] * (kept // gbs)


def _stand_in_slime():
    """Stand-in slime modules under slime's names: the defining modules, and a module that
    imported the functions by name."""
    saved = {k: sys.modules.get(k) for k in ("slime", "slime.utils", "slime.utils.seqlen_balancing",
                                              "slime.utils.flops_utils", "slime.utils.dp_schedule",
                                              "slime.backends.user")}
    pkg = types.ModuleType("slime")
    utils = types.ModuleType("slime.utils")
    sb = types.ModuleType("slime.utils.seqlen_balancing")
    fu = types.ModuleType("slime.utils.flops_utils")
    ds = types.ModuleType("slime.utils.dp_schedule")
    user = types.ModuleType("slime.backends.user")

    def first_fit_pack(total_lengths, max_tokens_per_bin):
        return "slime"

    def expand_bins_by_splitting(bins, target_count, lengths):
        return "slime"

    def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
        return "slime"

    def calculate_fwd_flops(seqlens, args):
        return "slime"

    def build_dp_schedule(args, train_parallel_config, total_lengths, *, global_batch_size, rollout_indices):
        return "slime"

    sb.first_fit_pack, sb.expand_bins_by_splitting = first_fit_pack, expand_bins_by_splitting
    sb.get_seqlen_balanced_partitions = get_seqlen_balanced_partitions
    fu.calculate_fwd_flops = calculate_fwd_flops
    ds.build_dp_schedule, ds.calculate_fwd_flops, ds.first_fit_pack = build_dp_schedule, calculate_fwd_flops, first_fit_pack
    ds.expand_bins_by_splitting, ds.get_seqlen_balanced_partitions = expand_bins_by_splitting, get_seqlen_balanced_partitions
    user.calculate_fwd_flops = calculate_fwd_flops
    user.unrelated = len
    for m in (pkg, utils, sb, fu, ds, user):
        sys.modules[m.__name__] = m
    return saved, sb, fu, ds, user


def test_patch_replaces_slime_functions_everywhere_they_were_imported():
    saved, sb, fu, ds, user = _stand_in_slime()
    try:
        replaced = slime.patch()
        assert set(replaced) == {
            "slime.utils.seqlen_balancing.first_fit_pack",
            "slime.utils.seqlen_balancing.expand_bins_by_splitting",
            "slime.utils.seqlen_balancing.get_seqlen_balanced_partitions",
            "slime.utils.flops_utils.calculate_fwd_flops",
            "slime.utils.dp_schedule.build_dp_schedule",
            "slime.utils.dp_schedule.calculate_fwd_flops",
            "slime.utils.dp_schedule.first_fit_pack",
            "slime.utils.dp_schedule.expand_bins_by_splitting",
            "slime.utils.dp_schedule.get_seqlen_balanced_partitions",
            "slime.backends.user.calculate_fwd_flops",
        }
        assert sb.first_fit_pack([5, 3, 7, 2, 6], 10) == [[0, 1, 3], [2], [4]]
        assert ds.build_dp_schedule is slime.build_dp_schedule
        assert user.calculate_fwd_flops is slime.calculate_fwd_flops and user.unrelated is len
        assert slime.patch() == []
        restored = slime.unpatch()
        assert set(restored) == set(replaced)
        assert sb.first_fit_pack([1], 1) == "slime" and user.calculate_fwd_flops([1], None) == "slime"
    finally:
        slime.unpatch()
        for k, m in saved.items():
            if m is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = m


def test_patch_without_slime_raises_import_error(monkeypatch):
    for k in list(sys.modules):
        if k == "slime" or k.startswith("slime."):
            monkeypatch.delitem(sys.modules, k)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if "scratch-slime" not in p])
    with pytest.raises(ImportError):
        slime.patch()
