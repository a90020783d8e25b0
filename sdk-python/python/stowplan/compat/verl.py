"""Drop-in replacements for verl 0.9.1's ``verl/utils/seqlen_balancing.py``.

Same signatures, same outputs (partition order and member order included), and the same
exception types where verl fails — computed by stowplan's kernel instead of verl's Python::

    from stowplan.compat.verl import get_seqlen_balanced_partitions
    parts = get_seqlen_balanced_partitions(seqlens, k_partitions=8, equal_size=True)

Out-of-domain inputs behave like verl too: negative lengths, ``n < k`` (``karmarkar_karp``
and ``greedy_partition`` return empty partitions), an empty list. Lengths, counts and indices
are exact integers (Python ints, numpy or torch integers, integer arrays and tensors); floats
(even whole ones), bools and strings, which verl's Python would silently compute with, raise
:class:`stowplan.InvalidArgumentError` naming the argument instead of being truncated.

Dynamic batch size and DP balancing: :func:`rearrange_micro_batches` returns verl's index
lists (pass the DP-all-reduced count as ``dp_num_micro_batches`` instead of a process
group), :func:`get_reverse_idx` and :func:`restore_dynamic_batch` put outputs back in input
order, and :func:`balance_batch` is the trainer's ``_balance_batch`` reordering.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _stowplan
from ..errors import InvalidArgumentError

__all__ = [
    "karmarkar_karp",
    "greedy_partition",
    "get_seqlen_balanced_partitions",
    "log_seqlen_unbalance",
    "ceildiv",
    "roundup_divisible",
    "calculate_workload",
    "rearrange_micro_batches",
    "get_reverse_idx",
    "restore_dynamic_batch",
    "get_group_balanced_partitions",
    "balance_batch",
]

_MAX_K = 2**32 - 1
# verl's workload is the kernel's "attention" cost preset: (24576, 1).
_ATTENTION = _stowplan.COST_PRESETS["attention"]


# The peers compute with any Python int; the kernel models them in 64 bits.
_I64 = (-(2**63), 2**63 - 1)


def _seqlens(seqlen_list: Any, name: str = "seqlen_list") -> List[int]:
    """Exact integers (a list, tuple, numpy array or tensor), else InvalidArgumentError."""
    return _stowplan._integers(seqlen_list, name, *_I64)


def _int(value: Any, name: str) -> int:
    """An exact integer, else InvalidArgumentError naming ``name``."""
    return _stowplan._integer(value, name, *_I64)


def _call(function: str, seqlen_list: Any, k_partitions: int, equal_size: bool) -> List[List[int]]:
    seqlens = _seqlens(seqlen_list)
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
    return [linear * s + quadratic * s**2 for s in _seqlens(seqlen_list)]


def _mask_or_lengths(batch: Any, name: str) -> Tuple[List[int], Optional[int]]:
    """(lengths, padded width or None) from lengths (exact integers), a 2-D attention mask
    (bools or integers; its row sums), or a mapping holding ``"attention_mask"``."""
    if isinstance(batch, dict) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__") and "attention_mask" in batch.keys()):
        batch, name = batch["attention_mask"], "attention_mask"
    if hasattr(batch, "detach"):  # a torch tensor: off the autograd graph and the GPU
        batch = batch.detach().cpu()
    nested = isinstance(batch, (list, tuple)) and len(batch) > 0 and isinstance(batch[0], (list, tuple, np.ndarray))
    if isinstance(batch, np.ndarray) or hasattr(batch, "__array__") or nested:
        try:
            arr = np.asarray(batch)
        except ValueError as exc:
            raise InvalidArgumentError(f"{name} must be lengths (1-D) or an attention mask (2-D): {exc}") from None
        if arr.ndim == 2:
            if arr.dtype.kind not in "biu":
                raise InvalidArgumentError(f"{name} (an attention mask) must hold bools or integers, not {arr.dtype}")
            return [int(x) for x in arr.sum(axis=1).tolist()], int(arr.shape[1])
        if arr.ndim != 1:
            raise ValueError(f"expected lengths (1-D) or an attention mask (2-D), got shape {arr.shape}")
    return _seqlens(batch, name), None


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
) -> List[List[int]]:
    """verl's dynamic batch size split: the micro-batches' index lists, exactly as verl 0.9.1
    orders them (verl also returns the sliced tensors; slice with these lists).

    Args:
        batch: per-sample token counts (1-D), a 2-D attention mask (its width is checked
            against ``max_token_len`` like verl), or a mapping with ``"attention_mask"``.
        max_token_len, num_batches_divided_by, min_num_micro_batch, use_dynamic_bsz_balance,
            force_group_size: as in verl.
        dp_group: must be ``None``; stowplan does not run collectives. Pass the count agreed
            across DP ranks (verl's MAX all-reduce) as ``dp_num_micro_batches`` instead.
        same_micro_num_in_dp: accepted for signature compatibility (see ``dp_num_micro_batches``).
        dp_num_micro_batches: the MAX over DP ranks of their micro-batch counts.

    Raises:
        AssertionError, ValueError, ZeroDivisionError: where verl raises them, same messages.

    Example:
        >>> rearrange_micro_batches([100, 900, 50, 950, 400, 600], max_token_len=2000)
        [[1, 5], [0, 2, 3, 4]]
    """
    if dp_group is not None:
        raise ValueError("stowplan runs no collectives: pass dp_num_micro_batches (the MAX-reduced count) instead of dp_group")
    seqlens, width = _mask_or_lengths(batch, "batch")
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


def get_reverse_idx(idx_map: Sequence[int]) -> List[int]:
    """The inverse of an index mapping: ``output[idx_map[i]] = i`` (as verl builds it)."""
    reverse = list(idx_map.tolist() if hasattr(idx_map, "tolist") else idx_map)
    for i, idx in enumerate(reverse[:]):
        reverse[idx] = i
    return reverse


def restore_dynamic_batch(data: Any, batch_idx_list: List[List[int]]) -> Any:
    """Puts ``data`` computed in micro-batch order (rows concatenated) back in input order,
    like verl: ``data[get_reverse_idx(concat(batch_idx_list))]``. ``data`` may be a numpy
    array, a torch tensor, or a list.

    Raises:
        AssertionError: ``data`` has not one row per index (verl's message).
    """
    indices = [i for part in batch_idx_list for i in _seqlens(part, "batch_idx_list")]
    batch_size = data.shape[0] if hasattr(data, "shape") else len(data)
    assert len(indices) == batch_size, f"{len(indices)} vs. {batch_size}"
    revert = get_reverse_idx(indices)
    if isinstance(data, list):
        return [data[i] for i in revert]
    if type(data).__module__.startswith("torch"):
        import torch  # only when a tensor was given

        return data[torch.tensor(revert, dtype=torch.long)]
    return data[np.asarray(revert, dtype=np.int64)]


def get_group_balanced_partitions(seqlen_list: List[int], uid_list: List[Any], k_partitions: int) -> List[List[int]]:
    """verl's prefix-grouper balancing: contiguous runs of equal uids stay together; equal-size
    KK over the runs' workloads; each partition's samples ascending."""
    assert len(seqlen_list) == len(uid_list), "seqlen_list and uid_list must have same length"
    seqlens = _seqlens(seqlen_list)
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
    seqlens, _ = _mask_or_lengths(seqlen_list, "seqlen_list")
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
