"""Input semantics: every integer the SDK takes (lengths, weights, counts, token ids, masks,
indices) is exact — never truncated, never parsed from a string, never a bool — over the
whole documented range, and every refusal is an ``InvalidArgumentError`` naming the argument
and the range; contiguous ``uint64``/``int64`` arrays are still read in place."""

from __future__ import annotations

import ast
import enum
import pathlib
import re
import sys
from types import SimpleNamespace

import numpy as np

import pytest

import stowplan
from stowplan.compat import prime_rl, roll, slime, verl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from array_likes import ArrayLike, DLPackOnly  # noqa: E402


class GpuTensor:
    """A tensor that cannot be read on the CPU (torch raises TypeError from ``__array__``)."""

    def __array__(self, dtype=None, copy=None):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")


class Size(enum.IntEnum):
    SMALL = 3


LENGTHS = [5, 3, 7, 2, 6]


@pytest.mark.parametrize(
    "lengths",
    [
        LENGTHS,
        tuple(LENGTHS),
        np.array(LENGTHS, dtype=object),
        *[np.array(LENGTHS, dtype=t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64)],
        np.repeat(np.array(LENGTHS, dtype=np.uint64), 2)[::2],
        [np.int64(5), np.uint8(3), np.int32(7), 2, Size.SMALL.value * 2],
        ArrayLike(np.array(LENGTHS, dtype=np.int32)),
        DLPackOnly(np.array(LENGTHS, dtype=np.uint16)),
        (n for n in LENGTHS),
    ],
    ids=lambda v: type(v).__name__ + (f"[{v.dtype}]" if hasattr(v, "dtype") else ""),
)
def test_every_integer_kind_packs_exactly(lengths):
    assert stowplan.pack(lengths, 10).bins == [[1, 2], [3, 4], [0]]


def test_the_whole_u64_range_is_exact_from_lists():
    # numpy alone reads [2**63, 1] as float64 (2**63 + 1 is not a float64).
    b = stowplan.pack([2**63, 1], 2**64 - 1, oversize="single")
    assert b.bins == [[0, 1]] and b.real_tokens == 2**63 + 1
    b = stowplan.pack([2**63, 2**63 - 1], 2**64 - 1)
    assert b.bins == [[0, 1]] and b.loads.tolist() == [2**64 - 1]
    assert stowplan.pack(np.array([2**64 - 1], dtype=object), 2**64 - 1).loads.tolist() == [2**64 - 1]


@pytest.mark.parametrize("dtype", [np.uint64, np.int64])
def test_contiguous_64_bit_arrays_are_read_in_place(dtype):
    lengths = np.array(LENGTHS * 4, dtype=dtype)
    assert stowplan.balance(lengths, 2).lengths is lengths


@pytest.mark.parametrize(
    "lengths, fragment",
    [
        (np.array([1.7, 2.2, 3.9], dtype=object), "lengths[0] must be an integer in 0..=2**64-1 (got 1.7)"),
        ([1.7, 2.2], "lengths[0] must be an integer in 0..=2**64-1 (got 1.7)"),
        ([4.0, 2], "lengths[0] must be an integer in 0..=2**64-1 (got 4.0)"),
        (np.array([4.0, 2.0]), "lengths must hold integers, not float values (dtype float64); floats are refused even when whole"),
        (np.array([4, 2], dtype=np.float16), "not float values (dtype float16)"),
        (ArrayLike(np.array([4.0, 2.0], dtype=np.float32)), "not float values (dtype float32)"),
        (["30", 1], "lengths[0] must be an integer in 0..=2**64-1 (got '30')"),
        (np.array(["30", "1"]), "lengths must hold integers, not string values"),
        ("30", "lengths must be a sequence of integers, not str"),
        (b"\x03\x04", "lengths must be a sequence of integers, not bytes"),
        ([True, 1], "lengths[0] must be an integer in 0..=2**64-1 (got True)"),
        ([1, np.True_], "lengths[1] must be an integer in 0..=2**64-1 (got np.True_)"),
        (np.array([True, False]), "lengths must hold integers, not bool values (dtype bool)"),
        (np.array([1 + 2j]), "lengths must hold integers, not complex values"),
        ([-1, 1], "lengths[0] must be in 0..=2**64-1 (got -1)"),
        (np.array([3, -1]), "lengths[1] must be in 0..=2**64-1 (got -1)"),
        ([2**64], "lengths[0] must be in 0..=2**64-1 (got 18446744073709551616)"),
        ([[1, 2]], "lengths[0] must be an integer in 0..=2**64-1 (got [1, 2])"),
        (np.array([[1, 2]]), "lengths must be one-dimensional (got shape (1, 2))"),
        (np.int64(5), "lengths must be one-dimensional (got shape ())"),
        (5, "lengths must be a sequence of integers (got int)"),
        (GpuTensor(), "lengths cannot be read as an array"),
    ],
)
def test_lengths_that_are_not_exact_integers_are_refused(lengths, fragment):
    with pytest.raises(stowplan.InvalidArgumentError) as info:
        stowplan.pack(lengths, 100)
    assert fragment in str(info.value)


SAMPLE = {"prompt_ids": [11, 12], "completion_ids": [13], "advantage": 0.5}


def _sample(**fields):
    return {**SAMPLE, **fields}


def _packer():
    p = stowplan.Packer(capacity=16, dp=1)
    p.add_run(0, batch_size=1)
    return p


def _source():
    return stowplan.BufferedDataSource.from_records([{"prompt": "q"}], n_samples_per_prompt=1)


#: (call, fragment of the message): one per entry point and integer argument.
REFUSED = [
    (lambda: stowplan.partition([1, 2], 2.0), "k must be an integer in 1..=2**32-1 (got 2.0)"),
    (lambda: stowplan.partition([1, 2], True), "k must be an integer in 1..=2**32-1 (got True)"),
    (lambda: stowplan.partition([1.5, 2], 1), "weights[0] must be an integer in 0..=2**64-1"),
    (lambda: stowplan.pack([1, 2], 10.0), "capacity must be an integer in 1..=2**64-1 (got 10.0)"),
    (lambda: stowplan.pack([1, 2], 10, align=np.float64(2)), "align must be an integer (got"),
    (lambda: stowplan.micro_batches([1, 2], 1.5), "capacity must be an integer in 1..=2**64-1"),
    (lambda: stowplan.micro_batches([1, 2], 10, min_count=True), "min_count must be an integer in 0..=2**32-1"),
    (lambda: stowplan.micro_batches([1, 2], 10, cost=(1.5, 0)), "cost linear coefficient must be an integer"),
    (lambda: stowplan.balance([1, 2, 3, 4], 2.0), "dp must be an integer in 1..=2**32-1 (got 2.0)"),
    (lambda: stowplan.balance([1, 2, 3, 4], 2, minibatch_size=2.0), "minibatch_size must be an integer in 1..=2**32-1"),
    (lambda: stowplan.balance([1, 2, 3, 4], 2, groups=0), "groups must be a sequence of labels, one per sample (got 0)"),
    (lambda: stowplan.balance([1, 2, 3, 4], 2, groups="abcd"), "groups must be a sequence of labels"),
    (lambda: stowplan.balance([1, 2, 3, 4], 2, groups=[[0], [0], [1], [1]]), "groups[0] must be a hashable label (got [0])"),
    (lambda: stowplan.pad_factor(cp=2.0), "cp must be an integer in 1..=2**32-1 (got 2.0)"),
    (lambda: stowplan.cp_layout([2, 4], cp=True), "cp must be an integer in 1..=2**32-1 (got True)"),
    (lambda: stowplan.cp_layout([2.0, 4], cp=2), "lengths[0] must be an integer"),
    (lambda: stowplan.cp_layout([2, 4], cp=2).unpack([np.array(["a"] * 6), np.array(["b"] * 6)]), "rows must be one-dimensional numpy arrays"),
    (lambda: stowplan.materialize([_sample(prompt_ids=[1.0, 2])], capacity=8), "samples[0].prompt_ids[0] must be an integer in -2**63..=2**63-1 (got 1.0)"),
    (lambda: stowplan.materialize([_sample(prompt_ids=np.array([1.0, 2.0]))], capacity=8), "samples[0].prompt_ids must hold integers, not float values"),
    (lambda: stowplan.materialize([_sample(completion_ids=[True])], capacity=8), "samples[0].completion_ids[0] must be an integer"),
    (lambda: stowplan.materialize([_sample(completion_ids=["13"])], capacity=8), "samples[0].completion_ids[0] must be an integer"),
    (lambda: stowplan.materialize([_sample(completion_ids="13")], capacity=8), "samples[0].completion_ids must be a sequence of integers, not str"),
    (lambda: stowplan.materialize([_sample(completion_ids=[2**63])], capacity=8), "samples[0].completion_ids[0] must be in -2**63..=2**63-1 (got 9223372036854775808)"),
    (lambda: stowplan.materialize([_sample(completion_ids=np.array([2**63], dtype=np.uint64))], capacity=8), "samples[0].completion_ids[0] must be in -2**63..=2**63-1"),
    (lambda: stowplan.materialize([_sample(completion_ids=[-1])], capacity=8), "completion_ids[0] = -1 must be ≥ 0"),
    (lambda: stowplan.materialize([_sample(completion_mask=[2])], capacity=8), "samples[0].completion_mask[0] must be a bool (or the integer 0 or 1) (got 2)"),
    (lambda: stowplan.materialize([_sample(completion_mask=[1.0])], capacity=8), "samples[0].completion_mask[0] must be a bool (or the integer 0 or 1) (got 1.0)"),
    (lambda: stowplan.materialize([_sample(completion_mask=np.array([0.5]))], capacity=8), "samples[0].completion_mask must hold bools (or the integers 0 and 1), not float values"),
    (lambda: stowplan.materialize([_sample(completion_logprobs=[True])], capacity=8), "samples[0].completion_logprobs[0] must be a number (got True)"),
    (lambda: stowplan.materialize([_sample(completion_logprobs=np.array([True]))], capacity=8), "samples[0].completion_logprobs must hold numbers, not bool values"),
    (lambda: stowplan.materialize([_sample(advantage="0.5")], capacity=8), "samples[0].advantage must be a number (got '0.5')"),
    (lambda: stowplan.materialize([_sample(advantage=np.True_)], capacity=8), "samples[0].advantage must be a number"),
    (lambda: stowplan.materialize([_sample(run=1.0)], capacity=8), "samples[0].run must be an integer in 0..=2**32-1 (got 1.0)"),
    (lambda: stowplan.materialize([_sample(lora=True)], capacity=8), "samples[0].lora must be an integer in 0..=2**32-1 (got True)"),
    (lambda: stowplan.materialize([SAMPLE], capacity=8, plan=[[[0.0]]]), "plan[0][0][0] must be an integer in 0..=2**32-1 (got 0.0)"),
    # A plan of other than dp ranks, or uneven ranks, was accepted (per_rank from rank 0).
    (lambda: stowplan.materialize([SAMPLE, SAMPLE], capacity=64, plan=[[[0], []], [[1]]]), "plan[1] has 1 micro-batches but plan[0] has 2"),
    (lambda: stowplan.materialize([SAMPLE, SAMPLE], capacity=64, dp=3, plan=[[[0]], [[1]]]), "plan has 2 ranks but dp is 3"),
    (lambda: stowplan.materialize([SAMPLE], capacity=8, pad_token_id=True), "pad_token_id must be an integer in -2**63..=2**63-1"),
    (lambda: stowplan.materialize(7, capacity=8), "samples must be an iterable of mappings or objects"),
    (lambda: stowplan.materialize([SAMPLE] * 2, capacity=8, cp=2).ranks[0][0].cp_view(1.0), "rank must be an integer in 0..=1 (got 1.0)"),
    (lambda: stowplan.Packer(capacity=16.0, dp=1), "capacity must be an integer in 1..=2**64-1 (got 16.0)"),
    (lambda: stowplan.Packer.restore(b"", [], capacity=16, dp=1), "not an encoded stowplan packer state"),
    (lambda: stowplan.Packer.restore(7, [], capacity=16, dp=1), "state"),
    (lambda: _packer().add_run(1.0, batch_size=2), "run must be an integer in 0..=2**32-1 (got 1.0)"),
    (lambda: _packer().add_run(1, batch_size=True), "batch_size must be an integer in 1..=2**64-1 (got True)"),
    (lambda: _packer().delivered(0.0), "step must be an integer in 0..=2**64-1 (got 0.0)"),
    (lambda: _packer().ingest(stowplan.TrainingBatch([SAMPLE], step=0.5)), "step must be an integer in 0..=2**64-1 (got 0.5)"),
    (lambda: _packer().ingest(stowplan.TrainingBatch([SAMPLE], step=0, temperature="1")), "temperature must be a number > 0 (got '1')"),
    (lambda: _packer().ingest(stowplan.TrainingBatch([_sample(prompt_ids=[1.5])], step=0)), "samples[0].prompt_ids[0] must be an integer"),
    (lambda: stowplan.TrainingBatch([SAMPLE], step=0, run=True).encode(), "run must be an integer in 0..=2**32-1 (got True)"),
    (lambda: stowplan.StaticPackPlan.from_lengths([100, 200.0], capacity=512), "lengths[1] must be an integer in 0..=2**64-1 (got 200.0)"),
    (lambda: stowplan.StaticPackPlan.from_lengths([100], capacity=512, world_size=True), "world_size must be an integer"),
    (lambda: _source().get_samples(1.5), "num_samples must be an integer in 0..=2**64-1 (got 1.5)"),
    (lambda: _source().get_samples(1, rollout_id=True), "rollout_id must be an integer in 0..=2**64-1 (got True)"),
    (lambda: _source().add_samples([[{"index": 1.0}]]), "groups[0][0].index must be an integer in 0..=2**64-1 (got 1.0)"),
    (lambda: _source().add_samples([[{"index": True}]]), "groups[0][0].index must be an integer"),
    (lambda: _source().add_samples([[{"index": 0, "response_length": "3"}]]), "groups[0][0].response_length must be an integer in 0..=2**32-1"),
    (lambda: _source().add_samples([[{"index": 0, "prompt_length": 2.5}]]), "groups[0][0].prompt_length must be an integer in 0..=2**32-1 (got 2.5)"),
    (lambda: verl.get_seqlen_balanced_partitions([1.5, 2, 3], 2, False), "seqlen_list[0] must be an integer"),
    (lambda: verl.get_seqlen_balanced_partitions([1, 2, 3], 2.0, False), "k_partitions must be an integer"),
    (lambda: verl.karmarkar_karp(np.array([1.0, 2.0]), 1, False), "seqlen_list must hold integers, not float values"),
    (lambda: verl.log_seqlen_unbalance([1, 2], [[0.0], [1]], "x"), "partitions[0][0] must be an integer"),
    (lambda: verl.rearrange_micro_batches([1, 2], 10.5), "max_token_len must be an integer"),
    (lambda: verl.rearrange_micro_batches([1, 2], 10, min_num_micro_batch=1.5), "min_num_micro_batch must be an integer"),
    (lambda: verl.balance_batch([1, 2, 3, 4], 2.0), "dp_size must be an integer"),
    (lambda: verl.calculate_workload([1.5]), "seqlen_list[0] must be an integer"),
    (lambda: verl.restore_dynamic_batch([1, 2], [[0.0, 1]]), "batch_idx_list[0] must be an integer"),
    (lambda: roll.load_balance([1.5, 2], 64), "lengths[0] must be an integer"),
    (lambda: roll.load_balance(np.ones((2, 4), dtype=np.float32), 64), "lengths (an attention mask) must hold bools or integers"),
    (lambda: roll.load_balance([1, 2], 64, vp=2.0), "vp must be an integer"),
    (lambda: roll.batch_balance([1, 2, 3, 4], 2, minibatch_size=2.0, keep_minibatch=True), "minibatch_size must be an integer"),
    (lambda: roll.pack_sequences([[1.0, 2]], cp=1), "samples[0].prompt_ids[0] must be an integer"),
    (lambda: roll.unpack_sequences(list(range(4)), [0, 2.0, 4]), "cu_seqlens_padded[1] must be an integer"),
    (lambda: prime_rl.pack_samples([_sample(lora=1.0)], 8), "samples[0].lora must be an integer"),
    (lambda: prime_rl.pack_samples([_sample(lora=-1)], 8), "samples[0].lora must be in 0..="),
    (lambda: prime_rl.prepare_micro_batches([SAMPLE], seq_len=8.0), "seq_len must be an integer"),
    (lambda: prime_rl.prepare_micro_batches([SAMPLE], seq_len=8, pad_to_multiple_of=True), "pad_to_multiple_of must be an integer"),
    (lambda: slime.RolloutDataSource(SimpleNamespace(n_samples_per_prompt=2.0)), "args.n_samples_per_prompt must be an integer in 1..=2**32-1"),
    (lambda: slime.RolloutDataSource(SimpleNamespace(n_samples_per_prompt=1, prompt_data="x", rollout_seed="7")), "args.rollout_seed must be an integer"),
]


@pytest.mark.parametrize("call, fragment", REFUSED, ids=[f for _, f in REFUSED])
def test_every_entry_point_refuses_inexact_integers_with_the_sdk_error(call, fragment):
    with pytest.raises(stowplan.InvalidArgumentError) as info:
        call()
    assert fragment in str(info.value)
    assert isinstance(info.value, stowplan.StowplanError) and isinstance(info.value, ValueError)


def _stub_options(name: str) -> list:
    """The fields of the generated ``TypedDict`` ``name`` in ``_stubs/_options.pyi`` (from
    the WIT), in order."""
    path = pathlib.Path(stowplan.__file__).with_name("_stubs") / "_options.pyi"
    (cls,) = [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef) and n.name == name]
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]


def test_pack_takes_the_kernel_records_fields_as_its_keyword_options():
    """``pack``'s keyword options are the kernel struct's fields (the binding sets them from
    the struct's own field list) and the stub's (generated from the WIT): the same names;
    ``None`` is each one's default; an unknown one is a TypeError listing them."""
    fields = _stub_options("_PackOptions")
    assert {"align", "method", "oversize"} <= set(fields) and "capacity" not in fields
    default = stowplan.pack([5, 3, 7, 2, 6], 10)
    assert stowplan.pack([5, 3, 7, 2, 6], 10, **{f: None for f in fields}).bins == default.bins
    listed = re.escape(", ".join(fields))
    with pytest.raises(TypeError, match=rf"^pack\(\) got an unexpected keyword argument 'aling' \(besides the parameters of its signature, it takes the kernel options {listed}\)$"):
        stowplan.pack([1, 2], 10, aling=2)
    assert stowplan.pack([3, 3, 3], 8, align=4, method="next_fit").bins == [[0, 1], [2]]
    with pytest.raises(stowplan.InvalidArgumentError, match="oversize must be a string or None"):
        stowplan.pack([1, 2], 10, oversize=1)


def test_the_packer_takes_keywords_only_and_names_an_unknown_option():
    """The native Packer is the public one: options keyword-only; a checkpoint's
    state and batches go to Packer.restore, never to the constructor."""
    with pytest.raises(TypeError):
        stowplan.Packer(16, 1)
    with pytest.raises(TypeError, match="state"):
        stowplan.Packer(capacity=16, dp=1, state=b"")
    with pytest.raises(TypeError, match="batches"):
        stowplan.Packer.restore(b"", [], capacity=16, dp=1, batches=[])
    with pytest.raises(TypeError, match="positional"):
        stowplan.Packer(capacity=16, dp=1).add_run(0, 2)


def test_token_ids_masks_and_numbers_of_every_kind_are_exact():
    ids = [2**63 - 1, 2**32, 0]
    kinds = [
        {"prompt_ids": ids, "completion_ids": [5], "completion_mask": [True], "completion_logprobs": [-0.5]},
        {"prompt_ids": tuple(ids), "completion_ids": np.array([5], dtype=np.uint8), "completion_mask": np.array([1]), "completion_logprobs": np.array([-0.5], dtype=np.float32)},
        {"prompt_ids": np.array(ids, dtype=object), "completion_ids": ArrayLike([5]), "completion_mask": [np.True_], "completion_logprobs": [np.float64(-0.5)]},
        {"prompt_ids": DLPackOnly(np.array(ids, dtype=np.int64)), "completion_ids": [np.int16(5)], "completion_mask": (1,), "completion_logprobs": [-0.5]},
    ]
    for fields in kinds:
        m = stowplan.materialize([{**fields, "advantage": np.float32(1.0), "run": np.uint8(0)}], capacity=8)
        mb = m.ranks[0][0]
        assert mb.input_ids.tolist() == ids + [5]
        assert mb.loss_mask.tolist() == [False, False, False, True]
        assert mb.inference_logprobs.tolist() == [0.0, 0.0, 0.0, -0.5]


def test_the_packer_rejects_a_sample_with_a_negative_token_id_and_keeps_the_rest():
    report = _packer().ingest(stowplan.TrainingBatch([_sample(completion_ids=[-1]), SAMPLE], step=0))
    assert report.accepted == 1 and [r[:2] for r in report.rejected] == [(0, "invalid_token_id")]


def test_numpy_integers_are_integers_everywhere():
    p = stowplan.partition(np.array([3, 1, 2, 2]), np.int64(2))
    assert p.groups == [[0, 1], [2, 3]]
    assert stowplan.balance([1, 2, 3, 4], np.uint8(2), capacity=np.int32(10)).count == 1
    assert verl.get_seqlen_balanced_partitions(np.array([1, 2, 3, 4]), np.int64(2), True) == [[0, 3], [1, 2]]


# A string option given another type raised pyo3's TypeError naming neither the
# argument nor the function.
WRONG_TYPE = [
    (lambda: stowplan.partition([1, 2, 3], 2, backend=3), "backend"),
    (lambda: stowplan.partition([1, 2, 3], 2, method=b"kk"), "method"),
    (lambda: stowplan.pack([1, 2], 4, oversize=1), "oversize"),
    (lambda: stowplan.micro_batches([1, 2], 4, order=2), "order"),
    (lambda: stowplan.materialize([SAMPLE], capacity=8, loss_agg_mode=3), "loss_agg_mode"),
    (lambda: stowplan.materialize([SAMPLE], capacity=8, padding=["sequence"]), "padding"),
    (lambda: stowplan.StreamPacker(8, oversize=3), "oversize"),
    (lambda: stowplan.StreamPacker.from_state(b"", backend=1.5), "backend"),
    (lambda: stowplan.Packer(capacity=8, dp=1, loss_agg_mode=1), "loss_agg_mode"),
]


@pytest.mark.parametrize("call, name", WRONG_TYPE)
def test_a_string_option_of_another_type_is_refused_naming_it(call, name):
    with pytest.raises(stowplan.InvalidArgumentError, match=f"^{name} must be a string or None"):
        call()


def test_partition_takes_the_kernel_records_fields_as_its_keyword_options():
    """``partition``'s keyword options are the stub's ``_PartitionOptions`` (the WIT's
    fields); ``None`` is each one's default, verl unrefined unless ``refine`` is given."""
    fields = _stub_options("_PartitionOptions")
    assert {"method", "equal_size", "refine"} <= set(fields)
    weights = [100, 900, 50, 950, 400, 600]
    assert stowplan.partition(weights, 2, **{f: None for f in fields}).groups == stowplan.partition(weights, 2).groups
    listed = re.escape(", ".join(fields))
    with pytest.raises(TypeError, match=rf"^partition\(\) got an unexpected keyword argument 'methd' \(besides the parameters of its signature, it takes the kernel options {listed}\)$"):
        stowplan.partition(weights, 2, methd="kk")
    verl = stowplan.partition(weights, 2, method="verl", refine=None)
    assert verl.groups == stowplan.partition(weights, 2, method="verl", refine=False).groups
    with pytest.raises(stowplan.InvalidArgumentError, match="refine"):
        stowplan.partition(weights, 2, method="verl", refine=True)
    with pytest.raises(stowplan.InvalidArgumentError, match="equal_size must be True or False"):
        stowplan.partition(weights, 2, equal_size=1)


def test_static_pack_plan_takes_the_kernel_plan_options_as_keywords():
    """``StaticPackPlan.from_lengths`` takes the kernel's plan options (the stub's
    ``_FromLengthsOptions``) beside its own parameters; an unknown keyword lists them."""
    fields = _stub_options("_FromLengthsOptions")
    assert {"align", "allow_single_long"} <= set(fields) and "capacity" not in fields
    plan = stowplan.StaticPackPlan.from_lengths([900, 300, 1500], capacity=1200, allow_single_long=True, align=None)
    assert plan.raw_packs() == stowplan.StaticPackPlan.from_lengths([900, 300, 1500], capacity=1200, allow_single_long=True).raw_packs()
    assert [2] in plan.raw_packs()
    listed = re.escape(", ".join(fields))
    with pytest.raises(TypeError, match=rf"got an unexpected keyword argument 'allow_long' \(besides the parameters of its signature, it takes the kernel options {listed}\)$"):
        stowplan.StaticPackPlan.from_lengths([1, 2], capacity=4, allow_long=True)
