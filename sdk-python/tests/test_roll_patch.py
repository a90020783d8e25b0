"""stowplan.compat.roll.patch(): ROLL's module-level ``batch_balance`` replaced in
place by stowplan's, with ROLL's signature, ``DataProto.reorder`` call and metrics.

ROLL is not on PyPI, so ROLL's modules are stand-ins registered under ROLL's real module names
(``roll.utils.functionals`` and a pipeline that imported ``batch_balance`` by name), with a
stand-in ``DataProto`` holding the two things ROLL's ``batch_balance`` uses: the
``attention_mask`` tensor in ``.batch`` and ``reorder(index_tensor)``. The replacement's results
are checked against :func:`stowplan.compat.roll.batch_balance`, which the ROLL vectors (made by
ROLL's own code at the commit in ``ROLL_COMMIT``) prove equal to ROLL's, and against those
vectors directly.

Needs torch: the plain SDK suite skips this module loudly; sdk-python/run_verl_tests.sh (torch on
the CPU, STOWPLAN_REQUIRE_VERL=1, which turns the skip into a failure) runs it.

<!-- tested: sdk-python/tests/test_roll_patch.py --> (docs/rl-balancing.md's one-line block runs here.)
"""

from __future__ import annotations

import contextlib
import inspect
import os
import pathlib
import sys
import types
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stowplan.compat import roll as sr

try:
    import torch  # ROLL's DataProto holds torch tensors
except ImportError as exc:  # the plain SDK suite has no torch; run_verl_tests.sh's environment has
    _reason = f"SKIPPED LOUDLY: torch is not importable ({exc}); the ROLL patch tests did NOT run (sdk-python/run_verl_tests.sh runs them)"
    if os.environ.get("STOWPLAN_REQUIRE_VERL") == "1":
        raise RuntimeError(_reason) from exc
    pytest.skip(_reason, allow_module_level=True)

ROOT = pathlib.Path(__file__).resolve().parents[2]
GUIDE_MARKER = "<!-- tested: sdk-python/tests/test_roll_patch.py -->"
ROLL_NAMES = (
    "roll",
    "roll.utils",
    "roll.utils.functionals",
    "roll.utils.sequence_packing",
    "roll.pipeline",
    "roll.pipeline.rlvr",
    "roll.pipeline.rlvr.rlvr_pipeline",
    "roll.distributed.strategy.megatron_strategy",
)
MICRO = "make_micro_batch_iter_for_sequence_packing"

# A stand-in for roll/utils/sequence_packing.py as far as the patched function looks into it:
# the config fields, the packer factory (ROLL's algorithms and error), the two packer classes
# (their methods here only record that ROLL's own code was called), and the module-level
# function with ROLL's signature.
SEQUENCE_PACKING = """
class SequencePackingConfig:
    def __init__(self, algorithm="none", max_packed_sequence_length_forward=None, max_packed_sequence_length_train=None,
                 min_num_micro_batches_forward=1, min_num_micro_batches_train=1):
        self.algorithm = algorithm
        self.max_packed_sequence_length_forward = max_packed_sequence_length_forward
        self.max_packed_sequence_length_train = max_packed_sequence_length_train
        self.min_num_micro_batches_forward = min_num_micro_batches_forward
        self.min_num_micro_batches_train = min_num_micro_batches_train

CALLS = []

class SequencePackingPacker:
    def __init__(self, config=None):
        self.config = config if config is not None else SequencePackingConfig()
    def make_micro_batch_iter_for_sequence_packing(self, *args):
        CALLS.append((type(self).__name__, args))
        return iter(["roll's own"])

class LoadBalancePacker(SequencePackingPacker):
    @staticmethod
    def get_device_name():
        return "cpu"
    def make_micro_batch_iter_for_sequence_packing(self, *args):
        CALLS.append((type(self).__name__, args))
        yield "roll's own"

def get_sequence_packing_packer(config=None):
    if config is None:
        config = SequencePackingConfig()
    if config.algorithm == "load_balance":
        return LoadBalancePacker(config)
    if config.algorithm == "none":
        return SequencePackingPacker(config)
    raise ValueError(f"Illegal sequence packing algorithm {config.algorithm}, algorithm must be in ['none', 'load_balance']")

def make_micro_batch_iter_for_sequence_packing(mini_batch, tp_size, cp_size, vp_size, is_train=False, dp_group=None,
                                               micro_batch_size=None, config=None):
    return get_sequence_packing_packer(config).make_micro_batch_iter_for_sequence_packing(
        mini_batch, tp_size, cp_size, vp_size, is_train, dp_group, micro_batch_size)
"""


class TensorBatch(dict):
    """The tensors of a stand-in DataProto, with ``batch_size`` like ROLL's TensorDict."""

    @property
    def batch_size(self):
        return torch.Size([self["attention_mask"].shape[0]])


class DataProto:
    """ROLL's DataProto as far as the patched functions use it: ``.batch["attention_mask"]``,
    ``.batch.batch_size``, ``meta_info``, ``reorder`` (records every call and reorders every
    tensor like ROLL's) and ``select_idxs`` (the rows, a copy of ``meta_info``)."""

    def __init__(self, attention_mask, meta_info=None, **tensors):
        self.batch = TensorBatch(attention_mask=attention_mask, **tensors)
        self.meta_info = {} if meta_info is None else meta_info
        self.reorder_calls = []

    def select_idxs(self, idxs):
        index = torch.tensor(idxs, dtype=torch.long)
        out = DataProto.__new__(DataProto)
        out.batch = TensorBatch({key: value[index] for key, value in self.batch.items()})
        out.meta_info = dict(self.meta_info)
        out.reorder_calls = []
        out.selected = list(idxs)
        return out

    def reorder(self, indices):
        self.reorder_calls.append(indices)
        if indices.dtype != torch.int64:
            # ROLL builds torch.tensor([]) (float32) when keep_minibatch leaves every sample out;
            # the patched function passes the same tensor, and this stand-in only records it.
            return
        self.batch = {key: value[indices] for key, value in self.batch.items()}


def _mask(lengths, width=None):
    """A right-padded int64 attention mask (ROLL's layout), ``width`` columns."""
    width = max(lengths, default=0) if width is None else width
    mask = torch.zeros((len(lengths), width), dtype=torch.int64)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return mask


def _batch(lengths, width=None, dtype=None):
    mask = _mask(lengths, width)
    return DataProto(mask if dtype is None else mask.to(dtype), sample=torch.arange(len(lengths)))


def _make_original():
    def batch_balance(batch, dp_size, minibatch_size, logging_prefix="global_seqlen", keep_minibatch=False):
        """Stand-in for ROLL's own function (its signature): records the call, returns a marker."""
        batch_balance.calls.append((batch, dp_size, minibatch_size, logging_prefix, keep_minibatch))
        return {"roll's own": True}

    batch_balance.calls = []
    return batch_balance


# Held in a namespace, not as a global of this module: patch() rebinds the function in every
# loaded module that holds it, this test module included.
ROLL = types.SimpleNamespace(batch_balance=_make_original())


@pytest.fixture
def roll_modules(monkeypatch):
    """ROLL's module names in sys.modules: ``roll.utils.functionals.batch_balance`` (ROLL's
    signature) and a pipeline that did ``from roll.utils.functionals import batch_balance`` (and
    one alias); unpatched and removed afterwards."""
    sr.unpatch()
    modules = {name: types.ModuleType(name) for name in ROLL_NAMES}
    functionals = modules["roll.utils.functionals"]
    functionals.batch_balance = ROLL.batch_balance
    pipeline = modules["roll.pipeline.rlvr.rlvr_pipeline"]
    pipeline.batch_balance = ROLL.batch_balance
    pipeline.balance_alias = ROLL.batch_balance
    modules["roll"].utils, modules["roll"].pipeline = modules["roll.utils"], modules["roll.pipeline"]
    modules["roll.utils"].functionals = functionals
    exec(compile(SEQUENCE_PACKING, "roll/utils/sequence_packing.py (stand-in)", "exec"), modules["roll.utils.sequence_packing"].__dict__)
    sequence_packing = modules["roll.utils.sequence_packing"]
    strategy = modules["roll.distributed.strategy.megatron_strategy"]
    strategy.make_micro_batch_iter_for_sequence_packing = getattr(sequence_packing, MICRO)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    ROLL.batch_balance.calls.clear()
    yield types.SimpleNamespace(functionals=functionals, pipeline=pipeline, sequence_packing=sequence_packing, strategy=strategy)
    sr.unpatch()


@contextlib.contextmanager
def _patched_stand_ins():
    """What :func:`roll_modules` sets up, for the hypothesis tests (which take no
    function-scoped fixture): ROLL's stand-in modules in sys.modules, patched; unpatched and
    sys.modules restored afterwards. Yields the modules by name."""
    modules = {name: types.ModuleType(name) for name in ROLL_NAMES}
    modules["roll.utils.functionals"].batch_balance = ROLL.batch_balance
    exec(compile(SEQUENCE_PACKING, "stand-in", "exec"), modules["roll.utils.sequence_packing"].__dict__)
    modules["roll.distributed.strategy.megatron_strategy"].make_micro_batch_iter_for_sequence_packing = getattr(
        modules["roll.utils.sequence_packing"], MICRO
    )
    saved = {name: sys.modules.get(name) for name in ROLL_NAMES}
    sys.modules.update(modules)
    ROLL.batch_balance.calls.clear()
    try:
        sr.patch()
        yield modules
    finally:
        sr.unpatch()
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _expected(lengths, dp_size, minibatch_size=None, keep_minibatch=False, prefix="global_seqlen"):
    """stowplan.compat.roll.batch_balance's result, its metrics under ``prefix``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the dropped-tail warning (ROLL is silent)
        r = sr.batch_balance(lengths, dp_size, minibatch_size=minibatch_size, keep_minibatch=keep_minibatch)
    metrics = {prefix + key[len("global_seqlen") :]: value for key, value in r["metrics"].items()}
    return r["global_idx"], metrics


def _check_call(function, lengths, dp_size, minibatch_size=None, keep_minibatch=False, prefix=None, positional=False):
    """Runs the patched ``function`` on a stand-in DataProto; checks the one reorder call (an
    int64 index tensor: the compat function's permutation), the reordered rows and the metrics."""
    batch = _batch(lengths)
    if positional:
        metrics = function(batch, dp_size, minibatch_size, "global_seqlen" if prefix is None else prefix, keep_minibatch)
    elif prefix is None:
        metrics = function(batch, dp_size=dp_size, minibatch_size=minibatch_size, keep_minibatch=keep_minibatch)
    else:
        metrics = function(batch, dp_size=dp_size, minibatch_size=minibatch_size, logging_prefix=prefix, keep_minibatch=keep_minibatch)
    global_idx, want = _expected(lengths, dp_size, minibatch_size, keep_minibatch, prefix or "global_seqlen")
    assert len(batch.reorder_calls) == 1
    index = batch.reorder_calls[0]
    assert isinstance(index, torch.Tensor) and index.dtype == torch.tensor(global_idx).dtype and index.tolist() == global_idx
    if global_idx:
        assert index.dtype == torch.int64 and batch.batch["sample"].tolist() == global_idx
    assert type(metrics) is dict and metrics == want
    assert [type(v) for v in metrics.values()] == [type(v) for v in want.values()]
    assert not ROLL.batch_balance.calls
    return metrics


def test_not_importable_is_a_clear_import_error(monkeypatch):
    sr.unpatch()
    for name in ROLL_NAMES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "roll", None)  # `import roll` raises ImportError
    with pytest.raises(ImportError, match=r"needs ROLL \(alibaba/ROLL, commit 8eb27cc\) installed.*import roll\.utils\.functionals"):
        sr.patch()
    with pytest.raises(ImportError):
        with sr.patched():
            pass
    assert not sr.is_patched()


def test_another_micro_batch_signature_is_refused(roll_modules):
    def make_micro_batch_iter_for_sequence_packing(mini_batch, tp_size, cp_size, vp_size, is_train=False, dp_group=None, micro_batch_size=None):
        raise AssertionError("not to be called")

    setattr(roll_modules.sequence_packing, MICRO, make_micro_batch_iter_for_sequence_packing)
    with pytest.raises(ImportError, match=r"reproduces ROLL at commit 8eb27cc.*make_micro_batch_iter_for_sequence_packing.*not patched"):
        sr.patch()
    assert not sr.is_patched() and roll_modules.functionals.batch_balance is ROLL.batch_balance


def test_another_signature_is_refused(roll_modules):
    def batch_balance(batch, dp_size, minibatch_size, logging_prefix="global_seqlen"):
        raise AssertionError("not to be called")

    roll_modules.functionals.batch_balance = batch_balance
    with pytest.raises(ImportError, match=r"reproduces ROLL at commit 8eb27cc.*batch_balance.*not patched"):
        sr.patch()
    assert not sr.is_patched() and roll_modules.functionals.batch_balance is batch_balance


def test_patch_binds_stowplans_function_everywhere(roll_modules):
    assert not sr.is_patched()
    original_micro = getattr(roll_modules.sequence_packing, MICRO)
    names = sr.patch()
    assert names == [
        f"roll.distributed.strategy.megatron_strategy.{MICRO}",
        "roll.pipeline.rlvr.rlvr_pipeline.balance_alias",
        "roll.pipeline.rlvr.rlvr_pipeline.batch_balance",
        "roll.utils.functionals.batch_balance",
        f"roll.utils.sequence_packing.{MICRO}",
    ]
    micro = getattr(roll_modules.sequence_packing, MICRO)
    assert micro.__module__ == "stowplan.compat.roll" and micro.__stowplan_original__ is original_micro
    assert getattr(roll_modules.strategy, MICRO) is micro
    assert inspect.signature(micro, follow_wrapped=False) == inspect.signature(original_micro)
    assert sr.is_patched()
    new = roll_modules.functionals.batch_balance
    assert new is not ROLL.batch_balance
    assert new.__module__ == "stowplan.compat.roll" and new.__name__ == "batch_balance"
    assert new.__stowplan_original__ is ROLL.batch_balance
    assert roll_modules.pipeline.batch_balance is new and roll_modules.pipeline.balance_alias is new
    # ROLL's signature, shown and real (the replacement's own, not only through __wrapped__).
    assert inspect.signature(new) == inspect.signature(ROLL.batch_balance)
    assert inspect.signature(new, follow_wrapped=False) == inspect.signature(ROLL.batch_balance)
    assert "stowplan" in new.__doc__
    # A module imported after patch() imports stowplan's.
    late = types.ModuleType("roll.pipeline.late")
    late.batch_balance = sys.modules["roll.utils.functionals"].batch_balance
    sys.modules["roll.pipeline.late"] = late
    try:
        assert late.batch_balance is new
        assert sr.patch() == sorted(names + ["roll.pipeline.late.batch_balance"])  # idempotent: same function
        assert roll_modules.functionals.batch_balance is new
        restored = sr.unpatch()
        assert "roll.pipeline.late.batch_balance" in restored and late.batch_balance is ROLL.batch_balance
    finally:
        del sys.modules["roll.pipeline.late"]
    assert not sr.is_patched() and sr.unpatch() == []
    assert roll_modules.functionals.batch_balance is ROLL.batch_balance
    assert roll_modules.pipeline.batch_balance is ROLL.batch_balance
    assert roll_modules.pipeline.balance_alias is ROLL.batch_balance
    assert getattr(roll_modules.strategy, MICRO) is original_micro is getattr(roll_modules.sequence_packing, MICRO)


def test_patched_context_manager(roll_modules):
    with sr.patched() as names:
        assert "roll.utils.functionals.batch_balance" in names
        assert roll_modules.pipeline.batch_balance is not ROLL.batch_balance
    assert roll_modules.pipeline.batch_balance is ROLL.batch_balance and not sr.is_patched()
    sr.patch()
    with sr.patched():
        pass
    assert sr.is_patched()  # patched before the block: stays patched


def test_roll_vectors_through_the_patched_function(roll_modules, roll_vectors):
    sr.patch()
    cases = [v for v in roll_vectors if v["kind"] == "batch_balance"]
    assert len(cases) >= 9
    for v in cases:
        inp = v["input"]
        batch = _batch(inp["lengths"], inp.get("mask_width"))
        args = (batch, inp["dp_size"], inp.get("minibatch_size"))
        kwargs = {"keep_minibatch": inp.get("keep_minibatch", False)}
        if "error" in v:
            with pytest.raises(Exception) as info:
                roll_modules.pipeline.batch_balance(*args, **kwargs)
            assert (type(info.value).__name__, str(info.value)) == (v["error"]["type"], v["error"]["message"]), v["name"]
            assert batch.reorder_calls == [], v["name"]  # ROLL fails before it reorders
            continue
        metrics = roll_modules.pipeline.batch_balance(*args, **kwargs)
        out = v["output"]
        assert [t.tolist() for t in batch.reorder_calls] == [out["global_idx"]], v["name"]
        assert metrics == out["metrics"], v["name"]
    assert not ROLL.batch_balance.calls


def test_keyword_positional_prefix_and_keep_minibatch(roll_modules):
    sr.patch()
    f = roll_modules.functionals.batch_balance
    lengths = [100, 900, 50, 950, 400, 600, 30, 70]
    _check_call(f, lengths, 2)
    _check_call(f, lengths, 2, positional=True)
    metrics = _check_call(f, lengths, 4, prefix="actor/seqlen")
    assert sorted(metrics) == sorted(f"actor/seqlen/{k}" for k in ("min", "max", "minmax_diff", "balanced_min", "balanced_max", "mean"))
    _check_call(f, lengths, 2, minibatch_size=4, keep_minibatch=True)
    _check_call(f, lengths, 2, minibatch_size=4, keep_minibatch=True, positional=True)
    # minibatch_size is ignored without keep_minibatch, as in ROLL.
    _check_call(f, lengths, 2, minibatch_size=3)
    # The tail past the last full mini-batch is left out of the reorder silently, like ROLL.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_call(f, lengths + [5, 6], 2, minibatch_size=4, keep_minibatch=True)


def test_roll_errors_reorder_nothing(roll_modules):
    sr.patch()
    f = roll_modules.functionals.batch_balance
    batch = _batch([3, 1, 2])
    with pytest.raises(TypeError, match=r"unsupported operand type\(s\) for //: 'int' and 'NoneType'"):
        f(batch, 1, None, keep_minibatch=True)
    with pytest.raises(AssertionError, match=r"number of items:\[3\] < k_partitions:\[4\]"):
        f(batch, 4, None)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'minibatch_size'"):
        f(batch, 2)  # ROLL's signature: minibatch_size has no default
    assert batch.reorder_calls == [] and not ROLL.batch_balance.calls


def test_outside_the_kernels_domain_goes_to_roll(roll_modules):
    sr.patch()
    f = roll_modules.pipeline.batch_balance
    batch = _batch([3, 1, 2, 4], dtype=torch.float32)  # a float mask: ROLL computes with floats
    assert f(batch, 2, 4, "p", True) == {"roll's own": True}
    assert ROLL.batch_balance.calls == [(batch, 2, 4, "p", True)]
    assert batch.reorder_calls == []


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5000), min_size=1, max_size=40),
    dp_size=st.integers(1, 8),
    minibatch=st.integers(1, 16),
    keep=st.booleans(),
    positional=st.booleans(),
)
def test_patched_equals_compat_function(lengths, dp_size, minibatch, keep, positional):
    with _patched_stand_ins() as modules:
        f = modules["roll.utils.functionals"].batch_balance
        try:
            _expected(lengths, dp_size, minibatch, keep)
        except Exception as exc:  # ROLL's error: the patched function raises the same
            batch = _batch(lengths)
            with pytest.raises(type(exc)) as info:
                f(batch, dp_size, minibatch, keep_minibatch=keep)
            assert str(info.value) == str(exc)
            try:
                partitions = sr._balance(lengths, dp_size, minibatch, keep)[0]
            except Exception:
                assert batch.reorder_calls == []  # the decision fails: nothing reordered
            else:
                # The metrics fail (no rank has a sample: ROLL's range() step 0) after ROLL's reorder.
                assert [t.tolist() for t in batch.reorder_calls] == [[j for p in partitions for j in p]]
            return
        _check_call(f, lengths, dp_size, minibatch, keep, positional=positional)


def test_the_guides_one_liner(roll_modules):
    text = (ROOT / "docs" / "rl-balancing.md").read_text()
    assert text.count(GUIDE_MARKER) == 1
    block = text.split(GUIDE_MARKER)[1].split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(block, "docs/rl-balancing.md (ROLL in place)", "exec"), {})
    assert sr.is_patched() and roll_modules.pipeline.batch_balance is not ROLL.batch_balance


# ----------------------------------------------------------------------------------------------
# make_micro_batch_iter_for_sequence_packing (the load_balance packer)


def _config(sp, cap, is_train=True, min_num=1, algorithm="load_balance"):
    field = "train" if is_train else "forward"
    return sp.SequencePackingConfig(
        algorithm=algorithm, **{f"max_packed_sequence_length_{field}": cap, f"min_num_micro_batches_{field}": min_num}
    )


def _run_micro(roll_modules, lengths, width, cap, *, tp=1, cp=1, vp=1, min_num=1, is_train=True, dp_group="group"):
    """The patched function through the stand-in Megatron strategy's name; (mini-batch, the
    micro-batches yielded)."""
    sp = roll_modules.sequence_packing
    mini = _batch(lengths, width)
    mini.meta_info = {"global_step": 3}
    it = getattr(roll_modules.strategy, MICRO)(mini, tp, cp, vp, is_train, dp_group, None, _config(sp, cap, is_train, min_num))
    assert mini.meta_info == {"global_step": 3}  # a generator, like ROLL's: nothing before next()
    return mini, list(it)


def _check_micro(mini, micro_batches, want):
    """ROLL's side effects and yields for the kernel's ``want`` (compat.roll.load_balance)."""
    parts = want["micro_batches"]
    assert mini.meta_info["partition_indices_list"] == parts
    assert [mb.selected for mb in micro_batches] == parts
    for i, (mb, part) in enumerate(zip(micro_batches, parts)):
        assert mb.batch["sample"].tolist() == part
        assert mb.meta_info == {
            "global_step": 3,
            "partition_indices_list": parts,
            "micro_batch_idx": i,
            "is_padding_batch": False,
            "partition_indices": part,
            "num_micro_batchs": want["num_micro_batches"],
            "mini_batch_size": len(mini.batch["sample"]),
        }
        assert mb.meta_info["partition_indices"] is mini.meta_info["partition_indices_list"][i]


def test_micro_batches_roll_vectors(roll_modules, roll_vectors):
    sr.patch()
    cases = [v for v in roll_vectors if v["kind"] == "load_balance" and v["input"].get("algorithm", "load_balance") == "load_balance"]
    assert len(cases) >= 15
    for v in cases:
        inp = v["input"]
        kwargs = dict(
            tp=inp.get("tp", 1), cp=inp.get("cp", 1), vp=inp.get("vp", 1), min_num=inp.get("min_num_micro_batches", 1),
            is_train=inp.get("is_train", True), dp_group=None if inp.get("dp_group_none") else "group",
        )
        if "error" in v:
            with pytest.raises(Exception) as info:
                _run_micro(roll_modules, inp["lengths"], inp["mask_width"], inp["max_packed_sequence_length"], **kwargs)
            assert (type(info.value).__name__, str(info.value)) == (v["error"]["type"], v["error"]["message"]), v["name"]
            continue
        mini, micro_batches = _run_micro(roll_modules, inp["lengths"], inp["mask_width"], inp["max_packed_sequence_length"], **kwargs)
        _check_micro(mini, micro_batches, v["output"])
        assert len(micro_batches) == v["output"]["num_micro_batches"], v["name"]
    assert roll_modules.sequence_packing.CALLS == []


def test_micro_batches_other_packers_and_errors_are_rolls(roll_modules):
    sr.patch()
    sp, f = roll_modules.sequence_packing, getattr(roll_modules.strategy, MICRO)
    mini = _batch([3, 5])
    assert list(f(mini, 1, 1, 1, True, "group", 1, _config(sp, 64, algorithm="none"))) == ["roll's own"]
    assert list(f(mini, 1, 1, 1)) == ["roll's own"]  # config=None: ROLL's default packer ("none")
    assert [c[0] for c in sp.CALLS] == ["SequencePackingPacker", "SequencePackingPacker"]
    with pytest.raises(ValueError, match="Illegal sequence packing algorithm greedy"):
        f(mini, 1, 1, 1, config=_config(sp, 64, algorithm="greedy"))  # eagerly, like ROLL's
    with pytest.raises(AssertionError, match="LoadBalancePacker: max_packed_sequence_length is None"):
        next(f(mini, 1, 1, 1, False, "group", None, _config(sp, 64, is_train=True)))  # forward cap unset
    # A float mask is outside the kernel's domain: ROLL's LoadBalancePacker computes it.
    sp.CALLS.clear()
    float_mini = _batch([3, 5], dtype=torch.float32)
    assert list(f(float_mini, 1, 1, 1, True, "group", None, _config(sp, 64))) == ["roll's own"]
    assert [c[0] for c in sp.CALLS] == ["LoadBalancePacker"]


def test_micro_batches_all_reduce_over_dp(roll_modules, monkeypatch):
    """With torch.distributed initialized, the count is MAX-reduced over dp_group (a stand-in
    all_reduce with a peer rank's count) before the kernel partitions, like ROLL."""
    import torch.distributed as dist

    reduces = []

    def all_reduce(tensor, op=None, group=None):
        reduces.append((tensor.tolist(), op, group, tensor.device.type))
        tensor.fill_(max(int(tensor.item()), 5))

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    sr.patch()
    lengths = [700, 30, 420, 960, 55, 610, 200, 80]
    mini, micro_batches = _run_micro(roll_modules, lengths, 1000, 2048, tp=2, cp=2, vp=2)
    own = sr.load_balance(lengths, 2048, mask_width=1000, tp=2, cp=2, vp=1)["num_micro_batches"]
    assert reduces == [([own], dist.ReduceOp.MAX, "group", "cpu")]
    want = sr.load_balance(lengths, 2048, mask_width=1000, tp=2, cp=2, vp=2, dp_num_micro_batches=5)
    assert want["num_micro_batches"] == 6
    _check_micro(mini, micro_batches, want)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 3000), min_size=1, max_size=40),
    extra_width=st.integers(0, 50),
    cap_factor=st.integers(1, 8),
    tp=st.integers(1, 4),
    cp=st.integers(1, 4),
    vp=st.integers(1, 3),
    min_num=st.integers(1, 6),
    is_train=st.booleans(),
)
def test_micro_batches_equal_compat_load_balance(lengths, extra_width, cap_factor, tp, cp, vp, min_num, is_train):
    width = max(lengths) + extra_width
    cap = width * cap_factor
    with _patched_stand_ins() as modules:
        ns = types.SimpleNamespace(sequence_packing=modules["roll.utils.sequence_packing"], strategy=modules["roll.distributed.strategy.megatron_strategy"])
        try:
            want = sr.load_balance(lengths, cap, mask_width=width, min_num_micro_batches=min_num, tp=tp, cp=cp, vp=vp)
        except Exception as exc:  # ROLL's error (k > n): the patched function raises the same
            with pytest.raises(type(exc)) as info:
                _run_micro(ns, lengths, width, cap, tp=tp, cp=cp, vp=vp, min_num=min_num, is_train=is_train)
            assert str(info.value) == str(exc)
            return
        mini, micro_batches = _run_micro(ns, lengths, width, cap, tp=tp, cp=cp, vp=vp, min_num=min_num, is_train=is_train)
        _check_micro(mini, micro_batches, want)
        assert ns.sequence_packing.CALLS == []
