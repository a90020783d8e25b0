"""prime-rl at HEAD (559b447) and its multi-LoRA packer (de80b48): every ``distribute_kk``,
``balanced_partition`` and ``cost_coefficients`` vector through ``stowplan.compat.prime_rl``
on both kernel backends, prime-rl's exceptions included, and :func:`prime_rl.patch` on a
stand-in module."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan.compat import prime_rl
from stowplan.errors import InvalidArgumentError

from conftest import VECTORS, load

ALL = load(VECTORS / "prime-rl")
BACKENDS = ["native", "wasm"]


def _kind(kind):
    return [v for v in ALL if v["kind"] == kind]


class _Tensor:
    """An encoded tensor as prime-rl carries it (``dtype`` string, ``shape`` list, ``data``
    bytes: zeros, or the values given)."""

    def __init__(self, dtype, shape, values=None):
        self.dtype, self.shape = dtype, list(shape)
        size = int(np.prod(shape)) if shape else 1
        self.data = np.zeros(size, dtype=np.float32 if dtype == "bfloat16" else dtype).tobytes() if values is None else (
            np.array(values, dtype=dtype).tobytes()
        )


def rollout(i, s):
    """A ``TrainingSample``-like mapping from a vector's compact sample (see the README:
    prompt + completion flattened, the advantage broadcast, token j of sample i is
    (i+1)·100000 + j)."""
    if isinstance(s, list):
        s = {"lora": s[0], "prompt_len": s[1], "completion_len": s[2]}
    p, c = s["prompt_len"], s["completion_len"]
    n = p + c
    mask = list(s.get("prompt_mask", [False] * p)) + list(s.get("completion_mask", [True] * c))
    adv = s.get("advantage", 1.0)
    r = {
        "token_ids": [(i + 1) * 100000 + j for j in range(n)],
        "mask": mask,
        "logprobs": [0.0] * p + [-0.25] * c,
        "temperatures": [1.0] * n,
        "env_name": s.get("env_name", "env"),
        "advantages": None if adv is None else [float(adv)] * n,
    }
    if s.get("multimodal"):
        spec = s.get("mm", [["pixel_values", "float32", [1, 4]]])
        r["mm_kwargs"] = {e[0]: _Tensor(*e[1:]) for e in spec}
    if s.get("routed_experts"):
        r["routed_experts"] = object()
    if "mm_token_type_ids" in s:
        r["mm_token_type_ids"] = s["mm_token_type_ids"]
    return r


def _outcome(call):
    try:
        return {"output": call()}
    except (AssertionError, ZeroDivisionError, IndexError, ValueError, AttributeError, KeyError) as e:
        if isinstance(e, InvalidArgumentError):
            raise
        return {"error": {"type": type(e).__name__, "message": str(e)}}


def _want(v):
    return {"error": v["error"]} if "error" in v else {"output": v["output"]}


def test_the_vectors_are_all_here():
    kinds = {k: len(_kind(k)) for k in ("distribute_kk", "balanced_partition", "cost_coefficients")}
    assert kinds["distribute_kk"] >= 94 and kinds["balanced_partition"] >= 45 and kinds["cost_coefficients"] >= 16


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("v", _kind("distribute_kk"), ids=lambda v: v["name"])
def test_distribute_kk_vectors(v, backend):
    inp = v["input"]
    rollouts = [rollout(i, s) for i, s in enumerate(inp["samples"])]
    extra = {}
    if inp.get("variant") == "multilora":
        extra = {"idxs": [r[0] if isinstance(r, list) else r.get("lora", 0) for r in inp["samples"]],
                 "num_loras": inp["num_loras"]}

    def call():
        plan = prime_rl.prepare_batch_plan(
            rollouts,
            seq_len=inp["seq_len"],
            num_train_workers=inp["num_workers"],
            bin_cost=prime_rl.build_bin_cost(inp.get("model_config")),
            pad_to_multiple_of=inp.get("pad_to_multiple_of", 1),
            backend=backend,
            **extra,
        )
        for rank in plan["per_rank"]:
            for e in rank:
                assert e.pop("bin") is not None
        return plan

    assert _outcome(call) == _want(v)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("v", _kind("balanced_partition"), ids=lambda v: v["name"])
def test_balanced_partition_vectors(v, backend):
    w, k = v["input"]["weights"], v["input"]["num_partitions"]
    got = _outcome(lambda: {
        "karmarkar_karp": prime_rl._karmarkar_karp(w, k, backend=backend),
        "balanced_partition": prime_rl.balanced_partition(w, k, backend=backend),
    })
    assert got == _want(v)


@pytest.mark.parametrize("v", _kind("cost_coefficients"), ids=lambda v: v["name"])
def test_cost_coefficient_vectors(v):
    cfg = v["input"]["model_config"]

    def call():
        linear, quadratic = prime_rl._packing_cost_coeffs(prime_rl._text_config(cfg))
        cost = prime_rl.build_bin_cost(cfg)
        assert (cost.linear, cost.quadratic) == (linear, quadratic)
        return {"linear": linear, "quadratic": quadratic, "bin_costs": [cost(b) for b in v["input"]["bins"]]}

    assert _outcome(call) == _want(v)


def test_config_objects_read_like_dicts():
    cfg = _kind("cost_coefficients")[0]["input"]["model_config"]

    def obj(d):
        return types.SimpleNamespace(**{k: obj(x) if isinstance(x, dict) else x for k, x in d.items()})

    assert prime_rl.packing_cost_coeffs(obj(cfg)) == prime_rl.packing_cost_coeffs(cfg)
    with pytest.raises(AttributeError, match="hidden_size"):
        prime_rl.packing_cost_coeffs({"num_attention_heads": 4})


def test_arguments_out_of_range_name_themselves():
    r = [rollout(0, [0, 3, 4])]
    cost = prime_rl.build_bin_cost(None)
    with pytest.raises(InvalidArgumentError, match="num_train_workers"):
        prime_rl.prepare_batch_plan(r, 10, -1, cost)
    with pytest.raises(InvalidArgumentError, match="seq_len"):
        prime_rl.prepare_batch_plan(r, 0, 1, cost)
    with pytest.raises(InvalidArgumentError, match="bin_cost"):
        prime_rl.prepare_batch_plan(r, 10, 1, lambda seqlens: sum(seqlens))
    with pytest.raises(InvalidArgumentError, match="weights"):
        prime_rl.balanced_partition([1, -2], 2)
    with pytest.raises(InvalidArgumentError, match="idxs"):
        prime_rl.prepare_batch_plan(r, 10, 1, cost, idxs=[-1], num_loras=2)
    # prime-rl's own exceptions for a negative partition count.
    with pytest.raises(IndexError):
        prime_rl.balanced_partition([1, 2], -1)
    with pytest.raises(AssertionError):
        prime_rl.balanced_partition([1, 2, 3], -2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6).flatmap(lambda k: st.tuples(st.just(k), st.lists(st.integers(0, 10**12), min_size=k, max_size=k * 6).filter(lambda w: len(w) % k == 0))))
def test_backends_agree_and_every_index_is_placed_once(case):
    k, w = case
    a = prime_rl.balanced_partition(w, k, backend="native")
    assert a == prime_rl.balanced_partition(w, k, backend="wasm")
    assert sorted(i for g in a for i in g) == list(range(len(w)))


def _stand_in(monkeypatch):
    """A stand-in for ``prime_rl.trainer.batch``: its own partition functions, and a
    ``_distribute_group`` that looks ``balanced_partition`` up at call time, as prime-rl's."""
    mod = types.ModuleType(prime_rl.PATCH_TARGET)
    exec(
        "def balanced_partition(weights, num_partitions):\n    return 'theirs'\n"
        "def _karmarkar_karp(weights, num_partitions):\n    return 'theirs-kk'\n"
        "def _distribute_group(weights, num_train_workers):\n    return balanced_partition(weights, num_train_workers)\n",
        mod.__dict__,
    )
    for name in ("prime_rl", "prime_rl.trainer"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, prime_rl.PATCH_TARGET, mod)
    return mod


def test_patch_replaces_and_restores_the_partition_functions(monkeypatch):
    mod = _stand_in(monkeypatch)
    w = [2, 9, 17, 16, 13, 30, 26, 27, 10]
    undo = prime_rl.patch()
    assert mod._distribute_group(w, 3) == [[1, 3, 6], [4, 7, 8], [0, 2, 5]]
    assert mod._karmarkar_karp(w, 3) == [[1, 3, 7], [4, 6, 8], [0, 2, 5]]
    # Weights stowplan does not model go to prime-rl's own function.
    assert mod._distribute_group([2**70, 1], 2) == "theirs"
    undo()
    assert mod._distribute_group(w, 3) == "theirs" and mod._karmarkar_karp(w, 3) == "theirs-kk"


def test_patch_needs_the_module_imported():
    with pytest.raises(InvalidArgumentError, match="not in sys.modules"):
        prime_rl.patch("prime_rl_not_imported.trainer.batch")


def test_rollouts_may_be_objects():
    """prime-rl passes ``TrainingSample`` structs: attributes are read like mapping keys."""
    v = next(v for v in _kind("distribute_kk") if v["name"] == "kk_mm_text_w2")
    inp = v["input"]
    objects = [types.SimpleNamespace(**rollout(i, s)) for i, s in enumerate(inp["samples"])]
    for o in objects:
        for name in ("mm_kwargs", "routed_experts", "mm_token_type_ids", "rl_weights"):
            if not hasattr(o, name):
                setattr(o, name, None)
    plan = prime_rl.prepare_batch_plan(objects, inp["seq_len"], inp["num_workers"], prime_rl.build_bin_cost(None))
    for rank in plan["per_rank"]:
        for e in rank:
            e.pop("bin")
    assert plan == v["output"]
