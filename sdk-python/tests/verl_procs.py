"""Helpers of tests/test_verl_patch.py that its spawned data-parallel ranks import too: verl
batches (TensorDict, DataProto) built from a description, deep comparison of verl's results
with stowplan's, and the rank function of the 2-process gloo test.

Imports torch, tensordict and verl only inside the functions, so that importing this module
never fails (the test decides whether to skip).
"""

from __future__ import annotations

import json
import pathlib
import random
import traceback
from typing import Any, Callable, Dict, List, Tuple

# --------------------------------------------------------------------------------------------
# Batches


def make_batch(lengths: List[int], width: int, kind: str = "right", seed: int = 0, extras: bool = True) -> Any:
    """A verl-style TensorDict of ``len(lengths)`` samples. ``kind``: "right"/"left" padded
    int64 masks, "bool" (a bool mask), "holes" (ones scattered over the row, as many as the
    length), "float" (a float32 mask), "nested" (jagged ``input_ids``, no mask). ``extras`` adds
    a float tensor, a 3-D tensor, a sub-TensorDict, a nested float tensor, a per-sample
    non-tensor stack and a non-tensor scalar."""
    import torch
    from tensordict import NonTensorData, NonTensorStack, TensorDict

    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    n = len(lengths)
    fields: Dict[str, Any] = {}
    if kind == "nested" and not n:
        kind = "right"  # torch builds no nested tensor of 0 components
    if kind == "nested":
        fields["input_ids"] = torch.nested.as_nested_tensor(
            [torch.randint(0, 50_000, (L,), generator=g) for L in lengths], layout=torch.jagged
        )
    else:
        mask = torch.zeros(n, width, dtype=torch.int64)
        for i, L in enumerate(lengths):
            if kind == "left":
                mask[i, width - L:] = 1
            elif kind == "holes":
                mask[i, sorted(rnd.sample(range(width), L))] = 1
            else:
                mask[i, :L] = 1
        fields["attention_mask"] = {"bool": mask.bool(), "float": mask.float()}.get(kind, mask)
        fields["input_ids"] = torch.randint(0, 50_000, (n, width), generator=g)
        fields["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    if extras:
        fields["old_log_probs"] = torch.randn(n, max(width, 1), generator=g)
        fields["multi_modal"] = torch.randn(n, 2, 3, generator=g)
        fields["sub"] = TensorDict({"values": torch.randn(n, generator=g), "ids": torch.arange(n)}, batch_size=[n])
        if n:
            fields["rollout_scores"] = torch.nested.as_nested_tensor(
                [torch.randn(max(L, 1), generator=g) for L in lengths], layout=torch.jagged
            )
    td = TensorDict(fields, batch_size=[n])
    if extras and n:
        td["uid"] = NonTensorStack(*[NonTensorData(f"uid-{i // 2}") for i in range(n)])
        td.set_non_tensor("temperature", 0.7)
    return td


def make_dataproto(lengths: List[int], width: int, kind: str = "right", seed: int = 0) -> Any:
    """A verl DataProto: a TensorDict batch (tensors only, as DataProto holds), numpy object
    arrays in ``non_tensor_batch`` and a nested ``meta_info``."""
    import numpy as np
    from verl.protocol import DataProto

    td = make_batch(lengths, width, kind, seed, extras=False)
    n = len(lengths)
    tensors = {key: td[key] for key in td.keys()}
    non_tensors = {
        "uid": np.array([f"uid-{i // 2}" for i in range(n)], dtype=object),
        "reward_extra": np.array([{"score": i, "tags": [i, "x"]} for i in range(n)], dtype=object),
    }
    meta = {"temperature": 0.7, "micro_batch_size": 2, "config": {"nested": [1, 2, 3]}}
    return DataProto.from_dict(tensors, non_tensors, meta_info=meta)


# --------------------------------------------------------------------------------------------
# Comparison


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Tuple[str, Any]:
    """("ok", result) or ("err", (exception type, message))."""
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the comparison is the point
        return "err", (type(exc), str(exc))


def same_tensordict(a: Any, b: Any, where: str = "") -> None:
    """Asserts that two TensorDicts are the same: type, batch size, device, keys in order, and
    every entry — tensor dtype, device, shape, values; nested tensors' values, offsets and
    ragged dimension; sub-TensorDicts recursively; non-tensor data and stacks by value."""
    import torch
    from tensordict import NonTensorData, NonTensorStack

    assert type(a) is type(b), (where, type(a), type(b))
    assert a.batch_size == b.batch_size, (where, a.batch_size, b.batch_size)
    assert a.device == b.device, (where, a.device, b.device)
    ea, eb = dict(a.items()), dict(b.items())
    assert list(ea) == list(eb), (where, list(ea), list(eb))
    for key, x in ea.items():
        y = eb[key]
        w = f"{where}[{key!r}]"
        assert type(x) is type(y), (w, type(x), type(y))
        if isinstance(x, torch.Tensor):
            assert (x.is_nested, x.dtype, x.device, x.layout) == (y.is_nested, y.dtype, y.device, y.layout), w
            if x.is_nested:
                assert x._ragged_idx == y._ragged_idx, w
                assert torch.equal(x.offsets(), y.offsets()) and torch.equal(x.values(), y.values()), w
            else:
                assert x.shape == y.shape and x.stride() == y.stride() and torch.equal(x, y), w
        elif isinstance(x, (NonTensorData, NonTensorStack)):
            assert x.batch_size == y.batch_size and x.tolist() == y.tolist(), w
        else:
            same_tensordict(x, y, w)


def same_micro_batches(want: Any, got: Any, where: str = "") -> None:
    """``(micro_batches, index lists)`` of rearrange_micro_batches compared."""
    assert isinstance(got, tuple) and len(got) == 2, (where, type(got))
    assert got[1] == want[1], (where, got[1], want[1])
    assert all(type(i) is int for part in got[1] for i in part), where
    assert len(got[0]) == len(want[0]), where
    for j, (a, b) in enumerate(zip(want[0], got[0])):
        same_tensordict(a, b, f"{where} micro-batch {j}")


def same_dataprotos(want: Any, got: Any, where: str = "") -> None:
    """``(micro DataProtos, index lists)`` of prepare_dynamic_batch compared."""
    assert got[1] == want[1], (where, got[1], want[1])
    assert len(got[0]) == len(want[0]), where
    for j, (a, b) in enumerate(zip(want[0], got[0])):
        w = f"{where} micro-batch {j}"
        assert type(a) is type(b), w
        same_tensordict(a.batch, b.batch, w)
        assert list(a.non_tensor_batch) == list(b.non_tensor_batch), w
        for key, x in a.non_tensor_batch.items():
            y = b.non_tensor_batch[key]
            assert type(x) is type(y) and x.dtype == y.dtype and x.shape == y.shape, (w, key)
            assert all(p == q for p, q in zip(x.tolist(), y.tolist())), (w, key)
        assert a.meta_info == b.meta_info, w
        assert a.meta_info is not b.meta_info, w


def same_outcome(want: Tuple[str, Any], got: Tuple[str, Any], compare: Callable[..., None], where: str = "") -> None:
    """The same exception (type and message) or results equal by ``compare``."""
    if want[0] == "err":
        assert got[0] == "err", (where, "verl raised", want[1], "stowplan returned")
        assert got[1] == want[1], (where, "verl raised", want[1], "stowplan raised", got[1])
    else:
        assert got[0] == "ok", (where, "verl returned; stowplan raised", got[1])
        compare(want[1], got[1], where)


# --------------------------------------------------------------------------------------------
# Data parallel: one rank of the 2-process gloo test.

DP_KWARGS = ("max_token_len", "num_batches_divided_by", "same_micro_num_in_dp", "min_num_micro_batch", "use_dynamic_bsz_balance", "force_group_size")


def dp_cases(seed: int = 0, random_cases: int = 40) -> List[Dict[str, Any]]:
    """Cases for the DP test: per rank lengths (ranks differ, so the all-reduces matter) and
    verl's keyword arguments. None makes a rank raise before the collectives (that would hang
    verl too); the errors after them (a forced group over the cap on one rank, too few groups
    on one rank) are raised by both ranks."""
    cases: List[Dict[str, Any]] = [
        # rank 0 wants 1 micro-batch, rank 1 wants 3: the MAX makes both use 3.
        {"lengths": [[10, 20, 30, 40], [90, 80, 70, 60, 50, 40]], "width": 100, "kind": "right", "kw": {"max_token_len": 150}},
        # rank 1's balanced split misses the cap at the agreed count: both ranks step on together.
        {"lengths": [[5, 5, 5, 5], [60, 60, 60, 45, 45, 30]], "width": 64, "kind": "left", "kw": {"max_token_len": 100}},
        {"lengths": [[3, 9, 27, 81], [81, 27, 9, 3]], "width": 96, "kind": "nested", "kw": {"max_token_len": 100, "num_batches_divided_by": 2}},
        {"lengths": [[10] * 6, [50, 50, 10, 10, 1, 1]], "width": 64, "kind": "right", "kw": {"max_token_len": 100, "force_group_size": 2}},
        # a forced group over the cap on rank 1 only: ValueError on both (verl agrees first).
        {"lengths": [[10, 10, 10, 10], [60, 50, 10, 10]], "width": 64, "kind": "right", "kw": {"max_token_len": 100, "force_group_size": 2}},
        # rank 0 has fewer groups than the agreed count needs: ValueError on both.
        {"lengths": [[30, 30], [30] * 8], "width": 32, "kind": "right", "kw": {"max_token_len": 60}},
        {"lengths": [[1, 2, 3], [4, 5, 6]], "width": 8, "kind": "bool", "kw": {"max_token_len": 8, "min_num_micro_batch": 2}},
        # no all-reduce: same_micro_num_in_dp=False.
        {"lengths": [[10, 20, 30, 40], [90, 80, 70, 60, 50, 40]], "width": 100, "kind": "right", "kw": {"max_token_len": 150, "same_micro_num_in_dp": False}},
        {"lengths": [[7, 8, 9, 10], [70, 80, 90, 100]], "width": 100, "kind": "holes", "kw": {"max_token_len": 200, "num_batches_divided_by": 0}},
    ]
    rnd = random.Random(seed)
    for _ in range(random_cases):
        width = rnd.randint(1, 48)
        group = rnd.choice([1, 1, 1, 2, 3])
        lengths = [[rnd.randint(0, width) for _ in range(group * rnd.randint(3, 10))] for _ in range(2)]
        kw = {
            "max_token_len": rnd.randint(group * width, 3 * group * width + 4),
            "num_batches_divided_by": rnd.choice([None, None, 1, 2]),
            "min_num_micro_batch": rnd.choice([None, None, 1, 2]),
            "use_dynamic_bsz_balance": rnd.random() < 0.8,
            "force_group_size": group,
        }
        cases.append({"lengths": lengths, "width": width, "kind": rnd.choice(["right", "left", "holes", "bool", "nested"]), "kw": kw})
    return cases


def dp_rank(rank: int, world: int, init_file: str, out_dir: str, cases: List[Dict[str, Any]]) -> None:
    """One DP rank: for every case, verl's rearrange_micro_batches (unpatched), stowplan's, and
    verl's module attribute after stowplan.compat.verl.patch(), all with ``dp_group``; then
    prepare_dynamic_batch likewise. Writes ``rank{rank}.json``: cases checked, verl's outcome of
    each (``["ok", micro-batch count]`` or ``["err", message]``), and the mismatches."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    report: Dict[str, Any] = {"checked": 0, "verl": [], "failures": []}
    try:
        from verl.utils import seqlen_balancing as sb

        from stowplan.compat import verl as sv

        # verl 0.9.1 has no CPU platform: on a machine without a GPU its get_device_name() says
        # "cuda" and verl's own dp_group path fails ("Found no NVIDIA driver"). Its all-reduce
        # tensors go to the CPU here, for verl and for stowplan (which asks the same function).
        sb.get_device_name = lambda: "cpu"
        group = dist.new_group(list(range(world)))
        sv.unpatch()
        original_rearrange = sb.rearrange_micro_batches
        original_prepare = sb.prepare_dynamic_batch
        for i, case in enumerate(cases):
            lengths = case["lengths"][rank]
            kw = dict(case["kw"], dp_group=group)
            where = f"case {i} rank {rank}"
            try:
                batch = make_batch(lengths, case["width"], case["kind"], seed=1000 * i + rank)
                want = outcome(original_rearrange, batch, **kw)
                got = outcome(sv.rearrange_micro_batches, batch, **kw)
                same_outcome(want, got, same_micro_batches, where + " stowplan")
                with sv.patched():
                    assert sb.rearrange_micro_batches is not original_rearrange
                    via_verl = outcome(sb.rearrange_micro_batches, batch, **kw)
                same_outcome(want, via_verl, same_micro_batches, where + " patched")
                if case["kind"] != "nested" and kw.get("force_group_size", 1) == 1:
                    data = make_dataproto(lengths, case["width"], case["kind"], seed=1000 * i + rank)
                    pkw = {k: v for k, v in kw.items() if k != "force_group_size"}
                    want_p = outcome(original_prepare, data, **pkw)
                    got_p = outcome(sv.prepare_dynamic_batch, data, **pkw)
                    same_outcome(want_p, got_p, same_dataprotos, where + " prepare_dynamic_batch")
                report["checked"] += 1
                report["verl"].append(["err", f"{want[1][0].__name__}: {want[1][1]}"] if want[0] == "err" else ["ok", len(want[1][1])])
            except AssertionError as exc:
                report["failures"].append(f"{where}: {exc!r}")
    except Exception:  # noqa: BLE001 - reported to the parent
        report["failures"].append(traceback.format_exc())
    finally:
        pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()
