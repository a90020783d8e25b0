"""Drop-in replacements for verl 0.9.1's ``verl/utils/seqlen_balancing.py``.

Same signatures, same outputs (partition order and member order included), and the same
exception types where verl fails — computed by stowplan's kernel instead of verl's Python::

    from stowplan.compat.verl import get_seqlen_balanced_partitions
    parts = get_seqlen_balanced_partitions(seqlen_list, k_partitions=8, equal_size=True)

Or in place, for an installed verl, in one line: :func:`patch` replaces verl's functions in
``verl.utils.seqlen_balancing`` and in every module that imported them by name (verl's engine
utilities, its trainers, your own modules); :func:`unpatch` (or the :func:`patched` context
manager) restores verl's::

    import stowplan.compat.verl; stowplan.compat.verl.patch()

Out-of-domain inputs behave like verl too: negative lengths, ``n < k`` (``karmarkar_karp``
and ``greedy_partition`` return empty partitions), an empty list. Lengths, counts and indices
are exact integers (Python ints, numpy or torch integers, integer arrays and tensors); floats
(even whole ones), bools and strings, which verl's Python would silently compute with, raise
:class:`stowplan.InvalidArgumentError` naming the argument instead of being truncated. (Once
:func:`patch` is applied, verl's own callers never see that error: an input outside the
kernel's domain — verl's SFT trainer balances a ``float32`` workload tensor — is handed to
verl's original function, so a patched verl computes exactly what an unpatched one does.)

Dynamic batch size: :func:`rearrange_micro_batches` on a ``TensorDict`` is verl's — the
micro-batches (``TensorDict`` s) and their index lists, with ``dp_group=`` all-reducing the
micro-batch count like verl; :func:`prepare_dynamic_batch` does the same to a ``DataProto``;
:func:`restore_dynamic_batch` puts outputs back in input order. On plain lengths or an
attention mask, :func:`rearrange_micro_batches` returns the index lists only.
:func:`balance_batch` is the trainer's ``_balance_batch`` reordering.
"""

from __future__ import annotations

import copy
import functools
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _stowplan
from ..errors import InvalidArgumentError
from . import _patching
from ._inputs import I64, exact_ints, mask_or_lengths

__all__ = [
    "karmarkar_karp",
    "greedy_partition",
    "get_seqlen_balanced_partitions",
    "log_seqlen_unbalance",
    "ceildiv",
    "roundup_divisible",
    "calculate_workload",
    "rearrange_micro_batches",
    "prepare_dynamic_batch",
    "get_reverse_idx",
    "restore_dynamic_batch",
    "get_group_balanced_partitions",
    "balance_batch",
    "VERL_VERSION",
    "PATCHED_FUNCTIONS",
    "patch",
    "unpatch",
    "patched",
    "is_patched",
]

#: The verl release whose functions this module reproduces, and which :func:`patch` requires.
VERL_VERSION = "0.9.1"

_MAX_K = 2**32 - 1
# verl's workload is the kernel's "attention" cost preset: (24576, 1).
_ATTENTION = _stowplan.COST_PRESETS["attention"]


def _int(value: Any, name: str) -> int:
    """An exact integer, else InvalidArgumentError naming ``name``."""
    return _stowplan._integer(value, name, *I64)


def _call(function: str, seqlen_list: Any, k_partitions: int, equal_size: bool) -> List[List[int]]:
    seqlens = exact_ints(seqlen_list)
    k = _int(k_partitions, "k_partitions")
    n = len(seqlens)
    if k < 0:
        # verl builds range(k) = [] sets: every path ends in the error below (or [] for an
        # empty greedy input).
        if function == "greedy_partition":
            if n == 0:
                return []
            raise TypeError("list indices must be integers or slices, not NoneType")
        if function == "get_seqlen_balanced_partitions" and n < k:
            raise AssertionError(f"number of items:[{n}] < k_partitions:[{k}]")
        if equal_size and n % k != 0:
            raise AssertionError(f"{n} % {k} != 0")
        raise IndexError("list index out of range")
    if k > _MAX_K:
        raise MemoryError(f"k_partitions = {k} is above the supported maximum")
    return _stowplan.verl(function, seqlens, k, bool(equal_size))


def karmarkar_karp(seqlen_list: List[int], k_partitions: int, equal_size: bool) -> List[List[int]]:
    """verl's largest differencing method: ``k_partitions`` lists of indices, sets in
    descending (sum, size, items) order, members in insertion order."""
    return _call("karmarkar_karp", seqlen_list, k_partitions, equal_size)


def greedy_partition(seqlen_list: List[int], k_partitions: int, equal_size: bool) -> List[List[int]]:
    """verl's greedy partition: input order, each item to the lowest-numbered partition with
    the strictly smallest sum (``equal_size`` adds a bias of ``sum + 1`` per item)."""
    return _call("greedy_partition", seqlen_list, k_partitions, equal_size)


def get_seqlen_balanced_partitions(seqlen_list: List[int], k_partitions: int, equal_size: bool) -> List[List[int]]:
    """verl's balanced partitions: KK, every partition non-empty and sorted ascending.

    Raises ``AssertionError`` like verl when ``len(seqlen_list) < k_partitions`` or a
    partition comes out empty.
    """
    return _call("get_seqlen_balanced_partitions", seqlen_list, k_partitions, equal_size)


def log_seqlen_unbalance(seqlen_list: List[int], partitions: List[List[int]], prefix: str) -> Dict[str, Union[int, float]]:
    """verl's balance metrics: ``{prefix}/min``, ``/max``, ``/minmax_diff`` over contiguous
    chunks of ``len(seqlen_list) // len(partitions)`` items, ``/balanced_min``,
    ``/balanced_max`` over the partitions, and ``/mean`` = total / number of partitions."""
    return _stowplan.log_seqlen_unbalance(seqlen_list, partitions, prefix)


def ceildiv(a: int, b: int) -> int:
    """``-(a // -b)``: the ceiling of ``a / b`` for Python ints, as verl computes it."""
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """``((a + b - 1) // b) * b``: ``a`` rounded up to a multiple of ``b``, as verl computes it."""
    return ((a + b - 1) // b) * b


def calculate_workload(seqlen_list: Any) -> Any:
    """``24576·s + s²`` per length (verl's attention workload for a 7B model). Arrays and
    tensors give the same type back; other sequences give a list of ints."""
    linear, quadratic = _ATTENTION
    if hasattr(seqlen_list, "__array__") or hasattr(seqlen_list, "dtype"):
        return linear * seqlen_list + quadratic * seqlen_list**2
    return [linear * s + quadratic * s**2 for s in exact_ints(seqlen_list)]


def _is_tensordict(batch: Any) -> bool:
    """Whether ``batch`` is a ``tensordict.TensorDictBase`` (without importing tensordict)."""
    td = sys.modules.get("tensordict")
    return td is not None and isinstance(batch, td.TensorDictBase)


def _option(value: Any, name: str, low: int) -> Optional[int]:
    """``None`` or an exact integer ``>= low`` (and within 64 bits), else InvalidArgumentError."""
    if value is None:
        return None
    v = _int(value, name)
    if v < low:
        raise InvalidArgumentError(f"{name} = {v} is out of range: must be None or in {low}..={I64[1]}")
    return v


def rearrange_micro_batches(
    batch: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
    *,
    dp_num_micro_batches: Optional[int] = None,
) -> Any:
    """verl's dynamic batch size split, with stowplan's kernel deciding the micro-batches.

    On a ``TensorDict`` (verl's input: ``"input_ids"``, nested or padded with an
    ``"attention_mask"``) it is verl 0.9.1's function: returns ``(micro_batches,
    micro_bsz_idx)`` — each micro-batch a ``TensorDict`` of the selected rows of every entry
    (nested tensors, sub-``TensorDict`` s and non-tensor entries too), and the index lists in
    verl's order. ``dp_group`` (a ``torch.distributed`` group) all-reduces the micro-batch
    count, the group limits and the token-cap check over the data-parallel ranks exactly as
    verl does (when ``torch.distributed`` is initialized and ``same_micro_num_in_dp``).

    On per-sample token counts (1-D), a 2-D attention mask (its width is checked against
    ``max_token_len`` like verl's) or a mapping with ``"attention_mask"`` it returns the index
    lists only; there ``dp_group`` must be ``None`` and ``dp_num_micro_batches`` (the MAX over
    DP ranks of their counts) stands for verl's all-reduce.

    Args:
        batch: a ``TensorDict``, lengths, an attention mask or a mapping holding one.
        max_token_len: the token cap of a micro-batch (an integer).
        dp_group: the data-parallel process group (``TensorDict`` input), or ``None``.
        num_batches_divided_by: round the count up to a multiple of this (``None`` or ``>= 0``;
            0 raises ``ZeroDivisionError`` like verl).
        same_micro_num_in_dp: all-reduce over ``dp_group`` (as in verl).
        min_num_micro_batch: at least this many micro-batches (``None`` or an integer).
        use_dynamic_bsz_balance: verl's reordering of the micro-batches (largest in the middle).
        force_group_size: runs of this many consecutive samples stay together (``>= 0``).
        dp_num_micro_batches: lengths input only, see above.

    Raises:
        AssertionError, KeyError, ValueError, ZeroDivisionError: where verl raises them, with
            verl's messages.
        stowplan.InvalidArgumentError: an argument verl would compute with that is not an
            exact integer in range (a float ``max_token_len``, a negative ``force_group_size``,
            a float or negative attention mask …); the message names it and the range.

    Example:
        >>> rearrange_micro_batches([100, 900, 50, 950, 400, 600], max_token_len=2000)
        [[1, 5], [0, 2, 3, 4]]
    """
    if _is_tensordict(batch):
        if dp_num_micro_batches is not None:
            raise InvalidArgumentError("dp_num_micro_batches is for lengths input; with a TensorDict pass dp_group (verl's all-reduce)")
        return _rearrange_tensordict(
            batch,
            max_token_len,
            dp_group,
            num_batches_divided_by,
            same_micro_num_in_dp,
            min_num_micro_batch,
            use_dynamic_bsz_balance,
            force_group_size,
        )
    if dp_group is not None:
        raise InvalidArgumentError(
            "dp_group needs a TensorDict batch (verl's input); with lengths or a mask pass dp_num_micro_batches "
            "(the MAX-reduced count) instead"
        )
    seqlens, width = mask_or_lengths(batch, "batch")
    return _stowplan.verl_rearrange_micro_batches(
        seqlens,
        max_token_len,
        min_num_micro_batch=min_num_micro_batch,
        num_batches_divided_by=num_batches_divided_by,
        use_dynamic_bsz_balance=bool(use_dynamic_bsz_balance),
        force_group_size=force_group_size,
        padded_width=width,
        dp_num_micro_batches=dp_num_micro_batches,
    )


def _device_name() -> str:
    """The device verl puts its all-reduce tensors on: the ``get_device_name`` that verl's
    ``seqlen_balancing`` calls (looked up there at call time, as verl's function does), else
    CUDA when available, else the CPU."""
    verl_module = sys.modules.get(_VERL_MODULE)
    if verl_module is not None and callable(getattr(verl_module, "get_device_name", None)):
        return verl_module.get_device_name()
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _rearrange_tensordict(
    batch: Any,
    max_token_len: Any,
    dp_group: Any,
    num_batches_divided_by: Any,
    same_micro_num_in_dp: Any,
    min_num_micro_batch: Any,
    use_dynamic_bsz_balance: Any,
    force_group_size: Any,
) -> Tuple[List[Any], List[List[int]]]:
    import torch
    import torch.distributed as dist

    # Every argument is checked before the first collective, so that no rank leaves the
    # all-reduces below on an InvalidArgumentError (verl's errors after them agree on all ranks).
    cap = _int(max_token_len, "max_token_len")
    group_size = _option(force_group_size, "force_group_size", 0)
    divided_by = _option(num_batches_divided_by, "num_batches_divided_by", 0)
    min_count = _option(min_num_micro_batch, "min_num_micro_batch", I64[0])

    input_ids = batch["input_ids"]
    if input_ids.is_nested:
        lengths_t = input_ids.offsets().diff()
        if lengths_t.numel() == 0:
            raise ValueError("max() arg is an empty sequence")
        max_seq_len = lengths_t.max()  # a 0-d tensor, shown in the message as verl shows it
        source = "batch['input_ids'] (nested)"
    else:
        mask = batch["attention_mask"]
        max_seq_len = mask.shape[-1]
        lengths_t = mask.sum(dim=1)
        source = "batch['attention_mask']"
    assert max_token_len >= max_seq_len, (
        f"max_token_len must be greater than the sequence length. Got max_token_len={max_token_len!r} and max_seq_len={max_seq_len!r}"
    )
    if lengths_t.dtype.is_floating_point or lengths_t.dtype.is_complex:
        raise InvalidArgumentError(f"{source} must hold bools or integers (token counts), not {lengths_t.dtype}")
    lengths = [int(x) for x in lengths_t.long().cpu().tolist()]
    negative = next((i for i, n in enumerate(lengths) if n < 0), None)
    if negative is not None:
        raise InvalidArgumentError(f"{source}: row {negative} counts {lengths[negative]} tokens; counts must be in 0..={I64[1]}")
    width = int(max_seq_len)

    sync = dist.is_available() and dist.is_initialized() and bool(same_micro_num_in_dp) and dp_group is not None
    if not sync:
        micro_bsz_idx = _stowplan.verl_rearrange_micro_batches(
            lengths,
            cap,
            min_num_micro_batch=min_count,
            num_batches_divided_by=divided_by,
            use_dynamic_bsz_balance=bool(use_dynamic_bsz_balance),
            force_group_size=group_size,
            padded_width=width if not input_ids.is_nested else None,
        )
    else:
        micro_bsz_idx = _rearrange_over_dp(
            lengths_t, lengths, cap, width, dp_group, divided_by, min_count, bool(use_dynamic_bsz_balance), group_size, input_ids.is_nested
        )
    return [_select_rows(batch, part) for part in micro_bsz_idx], micro_bsz_idx


def _rearrange_over_dp(
    lengths_t: Any,
    lengths: List[int],
    cap: int,
    width: int,
    dp_group: Any,
    divided_by: Optional[int],
    min_count: Optional[int],
    balance: bool,
    group_size: int,
    nested: bool,
) -> List[List[int]]:
    """verl's count agreement over ``dp_group``: the same three all-reduces in the same order
    (MAX of the counts, MAX of the group limits, MIN of "within the cap" per tried count), each
    tried count partitioned by the kernel; the agreed count's micro-batches from the kernel."""
    import torch
    import torch.distributed as dist

    device = _device_name()
    n = len(lengths)
    assert n % group_size == 0, f"Batch size {n} must be divisible by force_group_size {group_size}"
    total = int(lengths_t.sum().item())  # torch's int64 sum, as verl's
    num_groups = n // group_size
    count = min(num_groups, ceildiv(total, cap))
    if min_count is not None:
        count = max(min_count, count)
    reduced = torch.tensor([count], device=device)
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=dp_group)
    count = int(reduced.cpu().item())
    if divided_by is not None:
        count = roundup_divisible(count, divided_by)

    long = lengths_t.long()
    per_sample = calculate_workload(long)
    workloads = [int(w) for w in per_sample.view(num_groups, group_size).sum(dim=1).cpu().tolist()]
    group_tokens = [int(t) for t in long.view(num_groups, group_size).sum(dim=1).cpu().tolist()]
    if not group_tokens:
        raise ValueError("max() arg is an empty sequence")
    limits = torch.tensor([max(group_tokens), -num_groups], dtype=torch.long, device=device)
    dist.all_reduce(limits, op=dist.ReduceOp.MAX, group=dp_group)
    max_group_tokens, min_num_groups = int(limits[0].item()), -int(limits[1].item())
    if max_group_tokens > cap:
        raise ValueError(
            "A forced group exceeds max_token_len and cannot be split. "
            f"Got max_group_token_len={max_group_tokens} and max_token_len={cap}."
        )
    step = divided_by or 1
    while True:
        if count > min_num_groups:
            raise ValueError(
                "Cannot satisfy max_token_len while keeping forced groups atomic and using the same "
                "micro-batch count across DP ranks. "
                f"Requested {count} non-empty micro-batches, but a rank has only {min_num_groups} forced groups."
            )
        parts = get_seqlen_balanced_partitions(workloads, count, equal_size=False)
        within = all(sum(group_tokens[g] for g in part) <= cap for part in parts)
        agreed = torch.tensor([int(within)], device=device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=dp_group)
        if bool(agreed.item()):
            break
        count += step
    # This rank is within the cap at the agreed count, and the count is at least its own and a
    # multiple of num_batches_divided_by: the kernel's loop stops right there, at verl's lists.
    return _stowplan.verl_rearrange_micro_batches(
        lengths,
        cap,
        min_num_micro_batch=count,
        num_batches_divided_by=divided_by,
        use_dynamic_bsz_balance=balance,
        force_group_size=group_size,
        padded_width=None if nested else width,
    )


def _select_rows(batch: Any, rows: List[int]) -> Any:
    """A new ``TensorDict`` of ``rows`` of every top-level entry of ``batch``, batch size
    ``[len(rows)]``: tensors indexed with an int64 index tensor, nested (jagged) tensors
    rebuilt from the selected components, sub-``TensorDict`` s and non-tensor stacks indexed,
    entries without a batch dimension kept as they are."""
    import torch
    from tensordict import TensorDict

    index = torch.tensor(rows, dtype=torch.int64)
    selected = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.is_nested:
            selected[key] = _nested_rows(value, rows)
        elif isinstance(value, torch.Tensor) or value.shape:
            selected[key] = value[index]
        else:
            selected[key] = value
    return TensorDict(selected, batch_size=[len(rows)])


def _nested_rows(value: Any, rows: List[int]) -> Any:
    """The jagged nested tensor of components ``rows`` of ``value``, ragged dimension kept."""
    import torch

    parts = value.unbind()
    picked = [parts[i] for i in rows]
    assert picked, "Must provide at least one tensor"
    ragged = getattr(value, "_ragged_idx", value.dim() - 1)
    if picked[0].dim() == 1:
        return torch.nested.as_nested_tensor(picked, layout=torch.jagged)
    values = torch.cat(picked, dim=ragged - 1)
    offsets = torch.zeros(len(picked) + 1, dtype=torch.long, device=values.device)
    offsets[1:] = torch.tensor([p.shape[ragged - 1] for p in picked], dtype=torch.long, device=values.device).cumsum(0)
    out = torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)
    out._ragged_idx = ragged
    return out


def prepare_dynamic_batch(
    data: Any,
    max_token_len: int,
    dp_group: Any = None,
    num_batches_divided_by: Optional[int] = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: Optional[int] = None,
    use_dynamic_bsz_balance: bool = True,
) -> Tuple[List[Any], List[List[int]]]:
    """verl 0.9.1's ``prepare_dynamic_batch``: a ``DataProto`` split into micro-batches by
    :func:`rearrange_micro_batches` (on ``data.batch``; the arguments mean what they mean
    there), returned as ``(micro_batches, batch_idx_list)``: one ``DataProto`` per micro-batch
    with its rows of the tensors and of every ``non_tensor_batch`` array, and its own deep copy
    of ``meta_info``. Put the outputs back in order with :func:`restore_dynamic_batch`.

    Raises:
        What :func:`rearrange_micro_batches` raises; ``AttributeError`` like verl when ``data``
        is not a ``DataProto``; ``ImportError`` when verl (whose ``DataProto`` class the
        micro-batches are) is not installed.
    """
    from verl.protocol import DataProto  # type: ignore[import-not-found]  # verl's type, verl installed

    tensor_batches, batch_idx_list = rearrange_micro_batches(
        data.batch,
        max_token_len,
        dp_group=dp_group,
        num_batches_divided_by=num_batches_divided_by,
        same_micro_num_in_dp=same_micro_num_in_dp,
        min_num_micro_batch=min_num_micro_batch,
        use_dynamic_bsz_balance=use_dynamic_bsz_balance,
    )
    micro_batches = []
    for tensors, rows in zip(tensor_batches, batch_idx_list):
        micro_batches.append(
            DataProto.from_dict(
                {key: tensors[key] for key in tensors.keys()},
                {key: value[rows] for key, value in data.non_tensor_batch.items()},
                meta_info=copy.deepcopy(data.meta_info),
            )
        )
    return micro_batches, batch_idx_list


def get_reverse_idx(idx_map: Sequence[int]) -> List[int]:
    """The inverse of an index mapping: ``output[idx_map[i]] = i`` (as verl builds it)."""
    reverse = list(idx_map.tolist() if hasattr(idx_map, "tolist") else idx_map)
    for i, idx in enumerate(reverse[:]):
        reverse[idx] = i
    return reverse


def restore_dynamic_batch(data: Any, batch_idx_list: List[List[int]]) -> Any:
    """Puts ``data`` computed in micro-batch order (rows concatenated) back in input order,
    like verl 0.9.1's: ``data[get_reverse_idx(concat(batch_idx_list))]``. ``data`` may be a
    torch tensor (a jagged nested tensor too: its components reordered, as verl does), a numpy
    array or a list; the result has the same type.

    Raises:
        AssertionError: ``data`` has not one row per index (verl's message).
    """
    indices = [i for part in batch_idx_list for i in exact_ints(part, "batch_idx_list")]
    batch_size = data.shape[0] if hasattr(data, "shape") else len(data)
    assert len(indices) == batch_size, f"{len(indices)} vs. {batch_size}"
    revert = get_reverse_idx(indices)
    if isinstance(data, list):
        return [data[i] for i in revert]
    if type(data).__module__.startswith("torch"):
        import torch  # only when a tensor was given

        if data.is_nested:
            parts = data.unbind()
            return torch.nested.as_nested_tensor([parts[i] for i in revert], layout=torch.jagged)
        return data[torch.tensor(revert, dtype=torch.long)]
    return data[np.asarray(revert, dtype=np.int64)]


def get_group_balanced_partitions(seqlen_list: List[int], uid_list: List[Any], k_partitions: int) -> List[List[int]]:
    """verl's prefix-grouper balancing: contiguous runs of equal uids stay together; equal-size
    KK over the runs' workloads; each partition's samples ascending."""
    assert len(seqlen_list) == len(uid_list), "seqlen_list and uid_list must have same length"
    seqlens = exact_ints(seqlen_list)
    uids = list(uid_list.tolist() if hasattr(uid_list, "tolist") else uid_list)
    groups: List[List[int]] = []
    for i, uid in enumerate(uids):
        if groups and uids[groups[-1][0]] == uid:
            groups[-1].append(i)
        else:
            groups.append([i])
    assert len(groups) >= k_partitions, (
        f"Number of uid groups ({len(groups)}) must be >= k_partitions ({k_partitions}). "
        f"Consider reducing world_size or increasing batch_size."
    )
    workloads = [sum(calculate_workload([seqlens[i] for i in g])) for g in groups]
    parts = get_seqlen_balanced_partitions(workloads, k_partitions=k_partitions, equal_size=True)
    return [sorted(i for g in part for i in groups[g]) for part in parts]


def balance_batch(
    seqlen_list: Any,
    dp_size: int,
    *,
    keep_minibatch: bool = False,
    minibatch_size: Optional[int] = None,
    uid_list: Optional[List[Any]] = None,
    prefix: str = "global_seqlen",
) -> Tuple[List[int], List[List[int]], Dict[str, Union[int, float]]]:
    """verl's trainer ``_balance_batch``: returns ``(global_idx, partitions, metrics)`` where
    ``batch.reorder(global_idx)`` is verl's reordering, ``partitions`` each rank's samples in
    verl's order and ``metrics`` its ``log_seqlen_unbalance`` dict.

    ``seqlen_list`` is per-sample token counts or a 2-D attention mask. ``keep_minibatch``
    with ``minibatch_size`` (verl's ``ppo_mini_batch_size``) balances each mini-batch on its
    own. ``uid_list`` selects verl's prefix-grouper path (same-uid runs stay on one rank).

    verl silently drops the tail of a batch that is not a multiple of ``minibatch_size``;
    this reproduces that and warns (``UserWarning``) naming the dropped samples.

    Example:
        >>> global_idx, parts, _ = balance_batch([100, 900, 50, 950, 400, 600], 2)
        >>> global_idx
        [2, 1, 5, 0, 3, 4]
    """
    seqlens, _ = mask_or_lengths(seqlen_list, "seqlen_list")
    if uid_list is not None:
        num_groups = len(set(uid_list.tolist() if hasattr(uid_list, "tolist") else uid_list))
        if num_groups % dp_size != 0:
            raise ValueError(
                f"PrefixGrouper with balance_batch requires num_uid_groups ({num_groups}) "
                f"% dp_size ({dp_size}) == 0. "
                f"This ensures each rank gets equal number of groups. "
                f"Current batch_size={len(seqlens)}, adjust batch_size to be a multiple of "
                f"dp_size * rollout.n."
            )
        partitions = get_group_balanced_partitions(seqlens, uid_list, dp_size)
        dropped: List[int] = []
    else:
        if keep_minibatch and minibatch_size is None:
            raise TypeError("keep_minibatch needs minibatch_size (verl's ppo_mini_batch_size)")
        if _int(dp_size, "dp_size") < 0:
            raise ValueError(f"dp_size = {dp_size} is negative")
        mb = minibatch_size if keep_minibatch else None
        reorder = _stowplan.balance_batch(seqlens, dp_size, minibatch_size=mb)
        partitions, dropped = reorder.partitions, reorder.dropped
    if dropped:
        warnings.warn(
            f"balance_batch (like verl) leaves out {len(dropped)} samples past the last full mini-batch: {dropped[:16]}",
            stacklevel=2,
        )
    global_idx = [j for part in partitions for j in part]
    return global_idx, partitions, log_seqlen_unbalance(seqlens, partitions, prefix)


# ----------------------------------------------------------------------------------------------
# patch(): stowplan's functions in an installed verl, in place.

#: The functions of ``verl.utils.seqlen_balancing`` that :func:`patch` replaces: the ones whose
#: result stowplan's kernel decides. (``ceildiv``, ``roundup_divisible``, ``calculate_workload``,
#: ``get_reverse_idx`` and ``restore_dynamic_batch`` are arithmetic or reindexing; verl's stay.)
PATCHED_FUNCTIONS = (
    "karmarkar_karp",
    "greedy_partition",
    "get_seqlen_balanced_partitions",
    "log_seqlen_unbalance",
    "get_group_balanced_partitions",
    "rearrange_micro_batches",
    "prepare_dynamic_batch",
)

_VERL_MODULE = "verl.utils.seqlen_balancing"
# name -> (verl's original, the replacement installed by patch()); empty when not patched.
_PATCH: Dict[str, Tuple[Callable[..., Any], Callable[..., Any]]] = {}


def _verl_module() -> Any:
    """``verl.utils.seqlen_balancing`` of an installed verl at :data:`VERL_VERSION`, else
    ImportError saying what is missing or which version was found."""
    import importlib

    try:
        verl = importlib.import_module("verl")
        module = importlib.import_module(_VERL_MODULE)
    except ImportError as exc:
        raise ImportError(
            f"stowplan.compat.verl.patch() needs verl {VERL_VERSION} installed, and `import {_VERL_MODULE}` failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    version = getattr(verl, "__version__", None)
    if version != VERL_VERSION:
        raise ImportError(
            f"stowplan.compat.verl reproduces verl {VERL_VERSION}, but verl {version} is installed "
            f"({getattr(verl, '__file__', '?')}): its seqlen balancing may differ, so it is not patched"
        )
    return module


def _replacement(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """stowplan's ``name`` for verl's callers: the kernel's result; an input outside the
    kernel's domain (InvalidArgumentError: floats, strings …) goes to verl's ``original``, so
    the patched verl computes (or raises) exactly what verl computes there."""
    ours = globals()[name]

    @functools.wraps(original)
    def replacement(*args: Any, **kwargs: Any) -> Any:
        try:
            return ours(*args, **kwargs)
        except InvalidArgumentError:
            return original(*args, **kwargs)

    replacement.__module__ = __name__
    replacement.__qualname__ = f"patched.{name}"
    replacement.__doc__ = (
        f"stowplan's ``{name}`` (stowplan.compat.verl.{name}) installed in verl by "
        f"stowplan.compat.verl.patch(); inputs outside the kernel's domain go to verl's own.\n\n"
        + (original.__doc__ or "")
    )
    # __wrapped__ (from functools.wraps) is verl's function: inspect.signature shows verl's.
    replacement.__stowplan_function__ = ours  # type: ignore[attr-defined]
    replacement.__stowplan_original__ = original  # type: ignore[attr-defined]
    return replacement


def patch() -> List[str]:
    """Replaces verl 0.9.1's balancing functions (:data:`PATCHED_FUNCTIONS`) with stowplan's,
    in place: in ``verl.utils.seqlen_balancing`` and in every loaded module that holds them
    under any name (``from verl.utils.seqlen_balancing import rearrange_micro_batches`` in
    ``verl.workers.engine.utils``, the trainers' balance functions, your own modules); modules
    imported afterwards import stowplan's. Idempotent: a second call changes nothing.

    The replacements take verl's arguments and return verl's results (``TensorDict`` and
    ``DataProto`` micro-batches included), decided by the kernel; an input outside the kernel's
    domain (e.g. the ``float32`` workloads verl's SFT trainer balances) is computed by verl's
    original function, so nothing verl does changes but the speed.

    Returns:
        The ``module.attribute`` names now bound to stowplan's functions.

    Raises:
        ImportError: verl is not importable, or is not verl :data:`VERL_VERSION`.

    Example::

        import stowplan.compat.verl; stowplan.compat.verl.patch()
    """
    module = _verl_module()
    if _PATCH:
        return _patching.bound_names(_PATCH)
    for name in PATCHED_FUNCTIONS:
        original = getattr(module, name)
        _PATCH[name] = (original, _replacement(name, original))
    return _patching.install(_PATCH)


is_patched, unpatch, patched = _patching.controls(_PATCH, "verl", patch, __name__)
