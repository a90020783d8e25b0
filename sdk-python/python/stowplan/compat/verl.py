"""Drop-in replacements for verl 0.9.1's ``verl/utils/seqlen_balancing.py``.

Same signatures, same outputs (partition order and member order included), and the same
exception types where verl fails — computed by stowplan's kernel instead of verl's Python::

    from stowplan.compat.verl import get_seqlen_balanced_partitions
    parts = get_seqlen_balanced_partitions(seqlens, k_partitions=8, equal_size=True)

Out-of-domain inputs behave like verl too: negative lengths, ``n < k`` (``karmarkar_karp``
and ``greedy_partition`` return empty partitions), an empty list.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Union

from .. import _stowplan

__all__ = [
    "karmarkar_karp",
    "greedy_partition",
    "get_seqlen_balanced_partitions",
    "log_seqlen_unbalance",
    "ceildiv",
    "roundup_divisible",
]

_MAX_K = 2**32 - 1


def _seqlens(seqlen_list: Any) -> List[int]:
    if hasattr(seqlen_list, "tolist"):
        seqlen_list = seqlen_list.tolist()
    return [int(x) for x in seqlen_list]


def _call(function: str, seqlen_list: Any, k_partitions: int, equal_size: bool) -> List[List[int]]:
    seqlens = _seqlens(seqlen_list)
    k = int(k_partitions)
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
    return _stowplan.verl(function, seqlens, k, bool(equal_size), "wasm")


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
    seqlens = _seqlens(seqlen_list)
    parts = [[int(i) for i in p] for p in partitions]
    lo, hi, bmin, bmax, total, k = _stowplan.log_seqlen_unbalance(seqlens, parts)
    return {
        f"{prefix}/min": lo,
        f"{prefix}/max": hi,
        f"{prefix}/minmax_diff": hi - lo,
        f"{prefix}/balanced_min": bmin,
        f"{prefix}/balanced_max": bmax,
        f"{prefix}/mean": total / k,
    }


def ceildiv(a: int, b: int) -> int:
    """``-(a // -b)``: the ceiling of ``a / b`` for Python ints, as verl computes it."""
    return -(a // -b)


def roundup_divisible(a: int, b: int) -> int:
    """``((a + b - 1) // b) * b``: ``a`` rounded up to a multiple of ``b``, as verl computes it."""
    return ((a + b - 1) // b) * b
