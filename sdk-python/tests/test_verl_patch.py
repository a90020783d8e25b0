"""stowplan.compat.verl against the REAL verl 0.9.1: the TensorDict/DataProto
functions verl's trainer calls — rearrange_micro_batches (dp_group included, over a real
2-process gloo group), prepare_dynamic_batch, restore_dynamic_batch — give verl's results
(every micro-batch tensor, every index list, the same exceptions with the same messages), and
stowplan.compat.verl.patch() puts stowplan's functions into verl in place, where verl's own
callers use them, and unpatch() restores verl's.

Needs torch, tensordict and verl 0.9.1 (with the few packages ``import verl.protocol`` needs:
sdk-python/run_verl_tests.sh builds that environment). Without them the tests skip loudly, and
fail instead when STOWPLAN_REQUIRE_VERL=1 (as run_verl_tests.sh sets it).

<!-- tested: sdk-python/tests/test_verl_patch.py --> (docs/rl-balancing.md's one-line block runs here.)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import sys
import tempfile
import time
import types

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stowplan
from stowplan.compat import verl as sv

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import verl_procs as vp  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE_MARKER = "<!-- tested: sdk-python/tests/test_verl_patch.py -->"


def _load_verl():
    try:
        import tensordict  # noqa: F401
        import torch  # noqa: F401
        import verl
        import verl.protocol  # noqa: F401
        from verl.utils import seqlen_balancing
    except Exception as exc:  # ImportError, or a broken dependency of verl
        reason = (
            f"SKIPPED LOUDLY: torch, tensordict and verl {sv.VERL_VERSION} are not importable "
            f"({type(exc).__name__}: {exc}); the verl drop-in tests did NOT run (sdk-python/run_verl_tests.sh runs them)"
        )
        if os.environ.get("STOWPLAN_REQUIRE_VERL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    assert verl.__version__ == sv.VERL_VERSION, f"tests pin verl {sv.VERL_VERSION}, found {verl.__version__}"
    return seqlen_balancing


@pytest.fixture(scope="module")
def sb():
    """verl.utils.seqlen_balancing, unpatched before and after each test module."""
    module = _load_verl()
    sv.unpatch()
    yield module
    sv.unpatch()


@pytest.fixture
def orig(sb):
    """verl's own functions (verl unpatched during the test unless it patches)."""
    sv.unpatch()
    functions = {name: getattr(sb, name) for name in (*sv.PATCHED_FUNCTIONS, "restore_dynamic_batch")}
    assert all(f.__module__ == "verl.utils.seqlen_balancing" for f in functions.values())
    yield functions
    sv.unpatch()


def _patched_call(sb, name, *args, **kwargs):
    """verl's module attribute called with stowplan's patch in effect."""
    with sv.patched():
        assert getattr(sb, name).__module__ == "stowplan.compat.verl"
        return vp.outcome(getattr(sb, name), *args, **kwargs)


# --------------------------------------------------------------------------------------------
# rearrange_micro_batches on TensorDicts


KINDS = ["right", "left", "holes", "bool", "nested"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_rearrange_micro_batches_matches_verl(sb, orig, data):
    group = data.draw(st.sampled_from([1] * 8 + [2, 3, 4, 0]), label="force_group_size")
    n = data.draw(st.integers(1, 20), label="n") if data.draw(st.integers(0, 19), label="nonempty") else 0
    if group and data.draw(st.integers(0, 9), label="divisible") > 0:
        n -= n % group  # mostly a whole number of groups (else verl's AssertionError)
    lengths = data.draw(st.lists(st.integers(0, 48), min_size=n, max_size=n), label="lengths")
    kind = data.draw(st.sampled_from(KINDS), label="kind")
    width = max(lengths, default=0) + data.draw(st.integers(0 if n else 1, 6), label="slack")
    longest = max(lengths, default=0) if kind == "nested" and n else width
    fits = data.draw(st.integers(0, 7), label="fits") > 0
    kw = {
        "max_token_len": data.draw(st.integers(longest, 4 * longest + 8) if fits else st.integers(0, longest + 1), label="max_token_len"),
        "num_batches_divided_by": data.draw(st.sampled_from([None, None, None, 1, 2, 3, 0]), label="num_batches_divided_by"),
        "same_micro_num_in_dp": data.draw(st.booleans(), label="same_micro_num_in_dp"),
        "min_num_micro_batch": data.draw(st.sampled_from([None, None, None, -1, 0, 1, 2, 5, 25]), label="min_num_micro_batch"),
        "use_dynamic_bsz_balance": data.draw(st.booleans(), label="use_dynamic_bsz_balance"),
        "force_group_size": group,
    }
    batch = vp.make_batch(lengths, width, kind, seed=n, extras=data.draw(st.booleans(), label="extras"))
    want = vp.outcome(orig["rearrange_micro_batches"], batch, **kw)
    got = vp.outcome(sv.rearrange_micro_batches, batch, **kw)
    vp.same_outcome(want, got, vp.same_micro_batches, "stowplan")
    vp.same_outcome(want, _patched_call(sb, "rearrange_micro_batches", batch, **kw), vp.same_micro_batches, "patched verl")
    # Every argument positionally, in verl's order (dp_group third).
    args = [kw["max_token_len"], None, *(kw[k] for k in ("num_batches_divided_by", "same_micro_num_in_dp", "min_num_micro_batch", "use_dynamic_bsz_balance", "force_group_size"))]
    vp.same_outcome(want, vp.outcome(sv.rearrange_micro_batches, batch, *args), vp.same_micro_batches, "positional")


def _fixed_cases():
    """(name, batch, kwargs): the realistic shapes, and every error verl raises."""
    import torch
    from tensordict import TensorDict

    rows = [812, 95, 403, 1200, 77, 250, 640, 33]
    full = vp.make_batch(rows, 1280, "right", seed=1)
    return [
        ("realistic", full, {"max_token_len": 2048}),
        ("realistic vpp", full, {"max_token_len": 2048, "num_batches_divided_by": 4}),
        ("realistic min", full, {"max_token_len": 4096, "min_num_micro_batch": 5}),
        ("realistic unbalanced order", full, {"max_token_len": 2048, "use_dynamic_bsz_balance": False}),
        ("realistic groups", full, {"max_token_len": 2560, "force_group_size": 2}),
        ("left padded", vp.make_batch(rows, 1300, "left", seed=2), {"max_token_len": 1500}),
        ("nested", vp.make_batch(rows, 0, "nested", seed=3), {"max_token_len": 1500}),
        ("one sample", vp.make_batch([5], 5, "right", seed=4), {"max_token_len": 5}),
        ("all empty rows", vp.make_batch([0, 0, 0], 4, "right", seed=5), {"max_token_len": 4}),
        ("numpy max_token_len", full, {"max_token_len": __import__("numpy").int64(2048)}),
        ("numpy max_token_len below width", full, {"max_token_len": __import__("numpy").int64(1000)}),
        ("dp_group without torch.distributed", full, {"max_token_len": 2048, "dp_group": object()}),
        # verl's errors
        ("cap below width", full, {"max_token_len": 1279}),
        ("cap below nested longest", vp.make_batch(rows, 0, "nested", seed=3), {"max_token_len": 1199}),
        ("zero cap, zero width", vp.make_batch([0, 0], 0, "right", seed=6, extras=False), {"max_token_len": 0}),
        ("groups do not divide", full, {"max_token_len": 4096, "force_group_size": 3}),
        ("group size 0", full, {"max_token_len": 4096, "force_group_size": 0}),
        ("divided by 0", full, {"max_token_len": 4096, "num_batches_divided_by": 0}),
        ("forced group over the cap", full, {"max_token_len": 1280, "force_group_size": 4}),
        ("more micro-batches than samples", full, {"max_token_len": 4096, "min_num_micro_batch": 9}),
        ("empty batch", vp.make_batch([], 4, "right", seed=7, extras=False), {"max_token_len": 4}),
        ("no input_ids", TensorDict({"attention_mask": torch.ones(2, 3, dtype=torch.long)}, batch_size=[2]), {"max_token_len": 8}),
        ("no attention_mask", TensorDict({"input_ids": torch.ones(2, 3, dtype=torch.long)}, batch_size=[2]), {"max_token_len": 8}),
        ("1-D attention_mask", TensorDict({"input_ids": torch.ones(2, 3), "attention_mask": torch.ones(2, dtype=torch.long)}, batch_size=[2]), {"max_token_len": 8}),
    ]


def test_rearrange_micro_batches_fixed_cases_match_verl(sb, orig):
    checked = errors = 0
    for name, batch, kw in _fixed_cases():
        want = vp.outcome(orig["rearrange_micro_batches"], batch, **kw)
        vp.same_outcome(want, vp.outcome(sv.rearrange_micro_batches, batch, **kw), vp.same_micro_batches, name)
        vp.same_outcome(want, _patched_call(sb, "rearrange_micro_batches", batch, **kw), vp.same_micro_batches, name + " (patched)")
        checked += 1
        errors += want[0] == "err"
    assert checked >= 23 and errors >= 12, (checked, errors)


def test_inputs_verl_would_compute_with_raise_invalid_argument_directly_and_run_verl_patched(sb, orig):
    """Direct calls refuse what is not an exact integer (naming it); the patched verl hands it
    to verl's own function, so verl's callers see verl's behaviour, result or exception."""
    batch = vp.make_batch([10, 20, 30, 40], 48, "right", seed=8)
    floaty = vp.make_batch([10, 20, 30, 40], 48, "float", seed=8)
    cases = [
        (batch, {"max_token_len": 64.0}, "max_token_len"),
        (batch, {"max_token_len": 200.5}, "max_token_len"),
        (batch, {"max_token_len": None}, "max_token_len"),
        (batch, {"max_token_len": True}, "max_token_len"),
        (batch, {"max_token_len": 64, "force_group_size": -2}, "force_group_size"),
        (batch, {"max_token_len": 64, "num_batches_divided_by": -2}, "num_batches_divided_by"),
        (batch, {"max_token_len": 64, "min_num_micro_batch": 2.0}, "min_num_micro_batch"),
        (batch, {"max_token_len": 64, "num_batches_divided_by": 2.0}, "num_batches_divided_by"),
        (floaty, {"max_token_len": 64}, "attention_mask"),
        (floaty, {"max_token_len": 1000}, "attention_mask"),
    ]
    for b, kw, name in cases:
        with pytest.raises(stowplan.InvalidArgumentError, match=name):
            sv.rearrange_micro_batches(b, **kw)
        want = vp.outcome(orig["rearrange_micro_batches"], b, **kw)
        vp.same_outcome(want, _patched_call(sb, "rearrange_micro_batches", b, **kw), vp.same_micro_batches, f"{name} {kw}")
    with pytest.raises(stowplan.InvalidArgumentError, match="dp_num_micro_batches"):
        sv.rearrange_micro_batches(batch, 64, dp_num_micro_batches=2)


def test_lengths_input_still_returns_index_lists():
    assert sv.rearrange_micro_batches([100, 900, 50, 950, 400, 600], 2000) == [[1, 5], [0, 2, 3, 4]]
    with pytest.raises(stowplan.InvalidArgumentError, match="dp_group"):
        sv.rearrange_micro_batches([100, 900], 2000, dp_group=object())


def test_signatures_are_verls(sb, orig):
    for name in (*sv.PATCHED_FUNCTIONS, "restore_dynamic_batch"):
        want = inspect.signature(orig[name])
        mine = inspect.signature(getattr(sv, name))
        names = [(p.name, p.kind, p.default) for p in want.parameters.values()]
        assert [(p.name, p.kind, p.default) for p in mine.parameters.values()][: len(names)] == names, name
        extra = list(mine.parameters.values())[len(names):]
        assert all(p.kind is p.KEYWORD_ONLY for p in extra), (name, extra)
    assert not list(inspect.signature(sv.prepare_dynamic_batch).parameters)[7:]
    with sv.patched():
        for name in sv.PATCHED_FUNCTIONS:
            assert inspect.signature(getattr(sb, name)) == inspect.signature(orig[name]), name


# --------------------------------------------------------------------------------------------
# prepare_dynamic_batch / restore_dynamic_batch on DataProto and tensors


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_prepare_dynamic_batch_matches_verl(sb, orig, data):
    n = data.draw(st.integers(1, 16), label="n")
    lengths = data.draw(st.lists(st.integers(0, 40), min_size=n, max_size=n), label="lengths")
    width = max(lengths) + data.draw(st.integers(1, 4), label="slack")
    kind = data.draw(st.sampled_from(["right", "left", "holes", "bool"]), label="kind")
    kw = {
        "max_token_len": data.draw(st.integers(width - 1, 3 * width), label="max_token_len"),
        "num_batches_divided_by": data.draw(st.sampled_from([None, 1, 2]), label="num_batches_divided_by"),
        "min_num_micro_batch": data.draw(st.sampled_from([None, 1, 3, 20]), label="min_num_micro_batch"),
        "use_dynamic_bsz_balance": data.draw(st.booleans(), label="use_dynamic_bsz_balance"),
    }
    proto = vp.make_dataproto(lengths, width, kind, seed=n)
    want = vp.outcome(orig["prepare_dynamic_batch"], proto, **kw)
    vp.same_outcome(want, vp.outcome(sv.prepare_dynamic_batch, proto, **kw), vp.same_dataprotos, "stowplan")
    vp.same_outcome(want, _patched_call(sb, "prepare_dynamic_batch", proto, **kw), vp.same_dataprotos, "patched verl")
    if want[0] == "ok":
        # Outputs in micro-batch order go back in input order, as verl puts them.
        import torch

        parts = want[1][1]
        rows = torch.cat([mb.batch["input_ids"] for mb in want[1][0]])
        restored = sv.restore_dynamic_batch(rows, parts)
        assert torch.equal(restored, orig["restore_dynamic_batch"](rows, parts))
        assert torch.equal(restored, proto.batch["input_ids"])


def test_restore_dynamic_batch_matches_verl_on_dense_and_nested(orig):
    import torch

    parts = [[3, 0], [1], [4, 2, 5]]
    dense = torch.arange(6 * 3).view(6, 3)
    for data in (dense, dense.float(), torch.nested.as_nested_tensor([torch.arange(k + 1) for k in range(6)], layout=torch.jagged)):
        want, got = orig["restore_dynamic_batch"](data, parts), sv.restore_dynamic_batch(data, parts)
        assert type(want) is type(got) and want.is_nested == got.is_nested and want.dtype == got.dtype
        if want.is_nested:
            assert torch.equal(want.values(), got.values()) and torch.equal(want.offsets(), got.offsets())
        else:
            assert torch.equal(want, got)
    want = vp.outcome(orig["restore_dynamic_batch"], dense[:5], parts)
    assert vp.outcome(sv.restore_dynamic_batch, dense[:5], parts)[1] == want[1] == (AssertionError, "6 vs. 5")


# --------------------------------------------------------------------------------------------
# The list-level functions, patched, on what verl's trainers pass them


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(0, 5000), min_size=0, max_size=40), k=st.integers(0, 6), equal=st.booleans())
def test_patched_partition_functions_match_verl_on_trainer_inputs(sb, orig, lengths, k, equal):
    """ray_trainer balances calculate_workload(int64 tensor); sft_trainer_ray balances a
    float32 tensor (torch.Tensor([...])): the kernel takes the first, verl's own function the
    second (its float32 sums decide verl's result)."""
    import torch

    inputs = [
        lengths,
        torch.tensor(lengths, dtype=torch.int64),
        sb.calculate_workload(torch.tensor(lengths, dtype=torch.int64)),  # ray_trainer._balance_batch
        sb.calculate_workload(torch.Tensor(lengths)),  # sft_trainer_ray: float32
    ]
    calls = [(name, (x, k, equal)) for name in ("karmarkar_karp", "greedy_partition", "get_seqlen_balanced_partitions") for x in inputs]
    if k and len(lengths) >= k:
        parts = orig["get_seqlen_balanced_partitions"](lengths, k, False)
        calls.append(("log_seqlen_unbalance", (lengths, parts, "global_seqlen")))
        calls.append(("get_group_balanced_partitions", (lengths, [i // 2 for i in range(len(lengths))], k)))
    wants = [vp.outcome(orig[name], *args) for name, args in calls]  # verl unpatched
    with sv.patched():
        gots = [vp.outcome(getattr(sb, name), *args) for name, args in calls]
    for (name, args), want, got in zip(calls, wants, gots):
        vp.same_outcome(want, got, lambda a, b, w: (a == b) or pytest.fail(f"{w}: {a} != {b}"), f"{name}{args}")


# --------------------------------------------------------------------------------------------
# dp_group: a real 2-process gloo group


def test_rearrange_micro_batches_over_a_real_gloo_dp_group(sb):
    import torch.multiprocessing as mp

    cases = vp.dp_cases(seed=0, random_cases=40)
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init")
        ctx = mp.start_processes(vp.dp_rank, args=(2, init, tmp, cases), nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + 300
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                pytest.fail("the 2-rank gloo test hung (a rank left the collectives early)")
        reports = [json.loads(pathlib.Path(tmp, f"rank{r}.json").read_text()) for r in range(2)]
    for r, report in enumerate(reports):
        assert not report["failures"], f"rank {r}:\n" + "\n".join(report["failures"])
        assert report["checked"] == len(cases), (r, report)
    verl0, verl1 = reports[0]["verl"], reports[1]["verl"]
    # verl succeeded on most cases; its errors are the ones raised on both ranks after the
    # all-reduces (divided by 0, a forced group over the cap, too few groups on a rank).
    errors = [(i, a[1]) for i, (a, b) in enumerate(zip(verl0, verl1)) if a[0] == "err" or b[0] == "err"]
    assert all(verl0[i][0] == verl1[i][0] == "err" for i, _ in errors), errors
    assert 3 <= len(errors) <= 10 and all(e.split(":")[0] in ("ValueError", "ZeroDivisionError") for _, e in errors), errors
    # The all-reduces mattered: case 0, rank 0 alone would use 1 micro-batch, the MAX makes it
    # rank 1's 3; case 1, rank 1's split misses the cap at 3 and both ranks step on to 4;
    # case 7 (same_micro_num_in_dp=False) does not all-reduce.
    assert verl0[0] == verl1[0] == ["ok", 3] and verl0[1] == verl1[1] == ["ok", 4], (verl0[:2], verl1[:2])
    assert verl0[7] == ["ok", 1] and verl1[7] == ["ok", 3], (verl0[7], verl1[7])
    assert all(a == b for i, (a, b) in enumerate(zip(verl0, verl1)) if i != 7)  # every agreed count on both ranks


# --------------------------------------------------------------------------------------------
# patch() / unpatch()


def _engine_utils(sb):
    """verl.workers.engine.utils: verl's own caller of rearrange_micro_batches and
    restore_dynamic_batch (``from verl.utils.seqlen_balancing import ...``; its
    prepare_micro_batches is what verl's engines call). Imported as verl imports it when its
    package imports (that needs the engines' FSDP/Megatron stacks), else its file loaded
    under its own name, with verl's own imports."""
    name = "verl.workers.engine.utils"
    if name in sys.modules:
        return sys.modules[name]
    try:
        return importlib.import_module(name)
    except ImportError:
        pass
    path = pathlib.Path(sb.__file__).parents[1] / "workers" / "engine" / "utils.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_patch_changes_what_verls_own_callers_use_and_unpatch_restores(sb, orig, monkeypatch):
    from verl.utils import tensordict_utils as tu

    engine = _engine_utils(sb)
    assert engine.rearrange_micro_batches is orig["rearrange_micro_batches"]
    original_restore = engine.restore_dynamic_batch

    def data():
        td = vp.make_batch([812, 95, 403, 1200, 77, 250, 640, 33], 1280, "right", seed=9)
        tu.assign_non_tensor(td, max_token_len_per_gpu=1024, sp_size=2, use_dynamic_bsz=True)
        return td

    want = engine.prepare_micro_batches(data(), dp_group=None)
    calls = []
    kernel = stowplan._stowplan.verl_rearrange_micro_batches

    def spy(*args, **kwargs):
        calls.append(args[1])
        return kernel(*args, **kwargs)

    monkeypatch.setattr(stowplan._stowplan, "verl_rearrange_micro_batches", spy)
    bound = sv.patch()
    try:
        assert "verl.workers.engine.utils.rearrange_micro_batches" in bound
        assert "verl.utils.seqlen_balancing.rearrange_micro_batches" in bound
        assert engine.rearrange_micro_batches is sb.rearrange_micro_batches is not orig["rearrange_micro_batches"]
        assert engine.rearrange_micro_batches.__stowplan_function__ is sv.rearrange_micro_batches
        assert engine.restore_dynamic_batch is original_restore  # not replaced: verl's reindexing stays
        got = engine.prepare_micro_batches(data(), dp_group=None)
        assert calls == [2048], calls  # verl's engine ran stowplan's kernel (max_token_len_per_gpu × sp_size)
        vp.same_micro_batches(want, got, "engine.prepare_micro_batches")
        # verl's own prepare_dynamic_batch calls the patched module attribute too.
        assert sb.prepare_dynamic_batch.__stowplan_function__ is sv.prepare_dynamic_batch
        assert sv.patch() == bound and engine.rearrange_micro_batches is sb.rearrange_micro_batches  # idempotent
    finally:
        restored = sv.unpatch()
    assert "verl.workers.engine.utils.rearrange_micro_batches" in restored
    assert engine.rearrange_micro_batches is orig["rearrange_micro_batches"]
    for name in sv.PATCHED_FUNCTIONS:
        assert getattr(sb, name) is orig[name], name
    calls.clear()
    vp.same_micro_batches(want, engine.prepare_micro_batches(data(), dp_group=None), "unpatched")
    assert calls == []
    assert sv.unpatch() == [] and not sv.is_patched()


def test_patch_reaches_aliases_in_any_module_and_later_imports(sb, orig):
    before = types.ModuleType("stand_in_trainer_before")
    exec("from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions as balance, log_seqlen_unbalance", before.__dict__)
    sys.modules[before.__name__] = before
    try:
        with sv.patched() as bound:
            assert f"{before.__name__}.balance" in bound and f"{before.__name__}.log_seqlen_unbalance" in bound
            assert before.balance is sb.get_seqlen_balanced_partitions is not orig["get_seqlen_balanced_partitions"]
            after = types.ModuleType("stand_in_trainer_after")
            exec("from verl.utils.seqlen_balancing import karmarkar_karp", after.__dict__)
            sys.modules[after.__name__] = after
            assert after.karmarkar_karp is sb.karmarkar_karp is not orig["karmarkar_karp"]
            assert before.balance([5, 1, 4, 2], 2, True) == orig["get_seqlen_balanced_partitions"]([5, 1, 4, 2], 2, True)
            with sv.patched():  # nested: stays patched on the inner exit
                pass
            assert sv.is_patched()
        assert not sv.is_patched()
        assert before.balance is orig["get_seqlen_balanced_partitions"] and after.karmarkar_karp is orig["karmarkar_karp"]
        assert sb.get_seqlen_balanced_partitions is orig["get_seqlen_balanced_partitions"]
    finally:
        sys.modules.pop("stand_in_trainer_before", None)
        sys.modules.pop("stand_in_trainer_after", None)


def test_patch_refuses_a_missing_or_different_verl(sb, monkeypatch):
    import verl

    monkeypatch.setattr(verl, "__version__", "0.9.0")
    with pytest.raises(ImportError, match=r"reproduces verl 0\.9\.1, but verl 0\.9\.0 is installed"):
        sv.patch()
    assert not sv.is_patched()
    monkeypatch.setattr(verl, "__version__", sv.VERL_VERSION)
    monkeypatch.setitem(sys.modules, "verl.utils.seqlen_balancing", None)
    with pytest.raises(ImportError, match=r"needs verl 0\.9\.1 installed, and `import verl\.utils\.seqlen_balancing` failed"):
        sv.patch()
    assert not sv.is_patched()


def test_the_guides_one_liner_runs(sb, orig):
    """docs/rl-balancing.md's block after the marker, run as written."""
    text = (ROOT / "docs" / "rl-balancing.md").read_text()
    assert text.count(GUIDE_MARKER) == 1
    block = text.split(GUIDE_MARKER)[1].split("```python\n", 1)[1].split("```", 1)[0]
    try:
        exec(compile(block, "docs/rl-balancing.md (verl in place)", "exec"), {})
        assert sv.is_patched() and sb.rearrange_micro_batches is not orig["rearrange_micro_batches"]
    finally:
        sv.unpatch()


def test_patch_runtime_env_patches_verl_in_real_ray_workers(sb):
    """verl calls rearrange_micro_batches inside Ray worker actors: patch() in the driver does
    not reach them; a runtime environment from stowplan.compat.patch_runtime_env does, before
    any actor code (a real local Ray, a real verl imported by the actor)."""
    import ray

    from stowplan.compat import patch_runtime_env

    @ray.remote
    class Worker:
        def where(self):
            # Self-contained (Ray ships the class by value): verl's caller of the function,
            # which imports it by name, loaded from its file as _engine_utils loads it.
            import importlib.util
            import pathlib

            import verl.utils.seqlen_balancing as balancing

            path = pathlib.Path(balancing.__file__).parents[1] / "workers" / "engine" / "utils.py"
            spec = importlib.util.spec_from_file_location("verl.workers.engine.utils", path)
            engine_utils = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(engine_utils)
            return [balancing.rearrange_micro_batches.__module__, engine_utils.rearrange_micro_batches.__module__]

    ray.init(num_cpus=1, include_dashboard=False, runtime_env=patch_runtime_env(["verl"]))
    try:
        assert ray.get(Worker.remote().where.remote(), timeout=120) == ["stowplan.compat.verl"] * 2
        # The driver is not patched by it: only the workers are.
        assert not sv.is_patched()
    finally:
        ray.shutdown()
    # Without the runtime environment the worker runs verl's own.
    ray.init(num_cpus=1, include_dashboard=False)
    try:
        assert ray.get(Worker.remote().where.remote(), timeout=120) == ["verl.utils.seqlen_balancing"] * 2
    finally:
        ray.shutdown()
