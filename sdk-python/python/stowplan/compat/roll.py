"""ROLL (alibaba/ROLL) sequence-packing balancing, reproduced exactly by stowplan's kernel.

- :func:`load_balance` — ``LoadBalancePacker``: micro-batches of a mini-batch (ROLL does not
  enforce the token cap per micro-batch; use :func:`stowplan.micro_batches` for a hard cap).
- :func:`batch_balance` — the global batch over DP ranks (``roll/utils/functionals.py``).
- :func:`get_pad_factor`, :func:`restore_results_order`.

The behaviour (and the exception types and messages) is ROLL's at commit ``8eb27cc``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Optional, Sequence

from .. import _stowplan
from .verl import _mask_or_lengths, log_seqlen_unbalance

__all__ = ["get_pad_factor", "load_balance", "restore_results_order", "batch_balance"]


def get_pad_factor(cp: int, tp: int) -> int:
    """ROLL's sequence-packing pad factor: ``lcm(16, 2·cp·tp)`` when ``cp > 1``, else
    ``lcm(16, tp)``.

    Example:
        >>> get_pad_factor(2, 2), get_pad_factor(3, 1), get_pad_factor(1, 1)
        (16, 48, 16)
    """
    return math.lcm(16, 2 * cp * tp) if cp > 1 else math.lcm(16, tp)


def load_balance(
    lengths: Any,
    max_packed_sequence_length: int,
    *,
    mask_width: Optional[int] = None,
    min_num_micro_batches: int = 1,
    tp: int = 1,
    cp: int = 1,
    vp: int = 1,
    dp_num_micro_batches: Optional[int] = None,
) -> Dict[str, Any]:
    """ROLL's ``load_balance`` micro-batching of one mini-batch.

    Args:
        lengths: real tokens per sample (1-D) or the 2-D attention mask (its width is the
            ``mask_width``).
        max_packed_sequence_length: the cap (checked against ``mask_width`` only).
        mask_width: the padded mask width; defaults to the mask's width or the longest length.
        min_num_micro_batches, tp, cp, vp: as in ROLL's config.
        dp_num_micro_batches: the MAX over DP ranks of their counts (ROLL's all-reduce).

    Returns:
        ``{"micro_batches", "num_micro_batches", "kk_partitions", "restored_positions",
        "pad_factor", "padded_lengths"}`` — the micro-batches in ROLL's yield order, and
        for every sample its position in that order.

    Example:
        >>> load_balance([2, 4, 6, 1], 32)["micro_batches"]
        [[1, 2], [0, 3]]
    """
    seqlens, width = _mask_or_lengths(lengths)
    if mask_width is None:
        mask_width = width if width is not None else max(seqlens, default=0)
    batches, kk, factor, padded = _stowplan.roll_load_balance(
        seqlens,
        int(mask_width),
        int(max_packed_sequence_length),
        int(min_num_micro_batches),
        int(tp),
        int(cp),
        int(vp),
        None if dp_num_micro_batches is None else int(dp_num_micro_batches),
        "wasm",
    )
    order = [i for b in batches for i in b]
    restored = [0] * len(order)
    for pos, i in enumerate(order):
        restored[i] = pos
    return {
        "micro_batches": batches,
        "num_micro_batches": len(batches),
        "kk_partitions": kk,
        "restored_positions": restored,
        "pad_factor": factor,
        "padded_lengths": padded,
    }


def restore_results_order(results: Sequence[Any], restored_positions: Sequence[int]) -> List[Any]:
    """Outputs produced in micro-batch order back in sample order: element ``i`` is
    ``results[restored_positions[i]]`` (ROLL's ``restore_results_order``)."""
    return [results[p] for p in restored_positions]


def batch_balance(lengths: Any, dp_size: int, *, minibatch_size: Optional[int] = None, keep_minibatch: bool = False) -> Dict[str, Any]:
    """ROLL's ``batch_balance``: the global batch over ``dp_size`` ranks.

    Returns ``{"global_idx", "rank_partitions", "kk_partitions", "metrics", "dropped"}``:
    the permutation ROLL reorders by, its ``dp_size`` equal contiguous slices, the raw
    equal-size KK result(s), ROLL's ``global_seqlen/*`` metrics, and the samples ROLL leaves
    out (the tail past the last full mini-batch with ``keep_minibatch``; a ``UserWarning``
    names them).

    Example:
        >>> batch_balance([100, 900, 50, 950, 400, 600], 2)["rank_partitions"]
        [[2, 1, 5], [0, 3, 4]]
    """
    seqlens, _ = _mask_or_lengths(lengths)
    if int(dp_size) < 0:
        raise ValueError(f"dp_size = {dp_size} is negative")
    mb = int(minibatch_size) if keep_minibatch and minibatch_size is not None else None
    partitions, kk, dropped = _stowplan.balance_batch(seqlens, int(dp_size), mb, "wasm")
    if dropped:
        warnings.warn(
            f"batch_balance (like ROLL) leaves out {len(dropped)} samples past the last full mini-batch: {dropped[:16]}",
            stacklevel=2,
        )
    return {
        "global_idx": [j for p in partitions for j in p],
        "rank_partitions": partitions,
        "kk_partitions": kk,
        "metrics": log_seqlen_unbalance(seqlens, partitions, "global_seqlen"),
        "dropped": dropped,
    }
