"""ROLL (alibaba/ROLL) sequence-packing balancing, reproduced exactly by stowplan's kernel.

- :func:`load_balance` — ``LoadBalancePacker``: micro-batches of a mini-batch (ROLL does not
  enforce the token cap per micro-batch; use :func:`stowplan.micro_batches` for a hard cap).
- :func:`batch_balance` — the global batch over DP ranks (``roll/utils/functionals.py``).
- :func:`pack_sequences`, :func:`unpack_sequences` — the Megatron strategy's
  ``_pack_sequences``/``_unpack_sequences``: sequences padded to the pad factor, packed, and
  split over CP ranks (zigzag), built by stowplan's Rust host.
- :func:`get_pad_factor`, :func:`restore_results_order`.

The behaviour (and the exception types and messages) is ROLL's at commit ``8eb27cc``,
zero-length sequences included. Lengths, sizes and token ids are exact integers; floats
(even whole ones), bools and strings raise :class:`stowplan.InvalidArgumentError` naming the
argument instead of being truncated.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .. import _stowplan
from .verl import _mask_or_lengths, _seqlens, log_seqlen_unbalance

__all__ = ["get_pad_factor", "load_balance", "restore_results_order", "batch_balance", "pack_sequences", "unpack_sequences"]


def get_pad_factor(cp: int, tp: int) -> int:
    """ROLL's sequence-packing pad factor: ``lcm(16, 2·cp·tp)`` when ``cp > 1``, else
    ``lcm(16, tp)``.

    Example:
        >>> get_pad_factor(2, 2), get_pad_factor(3, 1), get_pad_factor(1, 1)
        (16, 48, 16)
    """
    if cp >= 1 and tp >= 1:
        from .._layout import pad_factor

        return pad_factor(cp=cp, tp=tp, align="roll")
    # ROLL's edge cases (not valid parallel sizes): cp = 0 counts as no CP, tp = 0 gives 0.
    return math.lcm(16, 2 * cp * tp) if cp > 1 else math.lcm(16, tp)


def load_balance(
    lengths: Any,
    max_packed_sequence_length: Optional[int],
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
        max_packed_sequence_length: the cap (checked against ``mask_width`` only); ``None``
            (an unset config field) raises ROLL's ``AssertionError``.
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
    seqlens, width = _mask_or_lengths(lengths, "lengths")
    if max_packed_sequence_length is None:
        raise AssertionError("LoadBalancePacker: max_packed_sequence_length is None")
    if mask_width is None:
        mask_width = width if width is not None else max(seqlens, default=0)
    r = _stowplan.roll_load_balance(
        seqlens,
        mask_width,
        max_packed_sequence_length,
        min_num_micro_batches=min_num_micro_batches,
        tp=tp,
        cp=cp,
        vp=vp,
        dp_num_micro_batches=dp_num_micro_batches,
    )
    batches = r.micro_batches
    order = [i for b in batches for i in b]
    restored = [0] * len(order)
    for pos, i in enumerate(order):
        restored[i] = pos
    return {
        "micro_batches": batches,
        "num_micro_batches": len(batches),
        "kk_partitions": r.kk_partitions,
        "restored_positions": restored,
        "pad_factor": r.pad_factor,
        "padded_lengths": r.padded_lengths,
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
    names them). ``keep_minibatch`` without ``minibatch_size`` raises ROLL's ``TypeError``.

    Example:
        >>> batch_balance([100, 900, 50, 950, 400, 600], 2)["rank_partitions"]
        [[2, 1, 5], [0, 3, 4]]
    """
    seqlens, _ = _mask_or_lengths(lengths, "lengths")
    if keep_minibatch and minibatch_size is None:
        # ROLL divides the batch size by the mini-batch size.
        raise TypeError("unsupported operand type(s) for //: 'int' and 'NoneType'")
    if _stowplan._integer(dp_size, "dp_size", -(2**63), 2**63 - 1) < 0:
        raise ValueError(f"dp_size = {dp_size} is negative")
    reorder = _stowplan.balance_batch(seqlens, dp_size, minibatch_size=minibatch_size if keep_minibatch else None)
    partitions, kk, dropped = reorder.partitions, reorder.kk_partitions, reorder.dropped
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


def pack_sequences(
    sequences: Sequence[Any],
    *,
    cp: int = 1,
    tp: int = 1,
    cp_rank: Optional[int] = None,
    pad_val: int = 0,
    pad_factor: Optional[int] = None,
    backend: Optional[str] = None,
) -> Dict[str, Any]:
    """ROLL's sequence packing of ``sequences`` (each the valid tokens of one sample): every
    sequence padded with ``pad_val`` to a multiple of ``pad_factor`` (default ROLL's
    :func:`get_pad_factor`; stowplan's own default is ``2·cp·tp``), concatenated, and split over ``cp``
    ranks — rank ``r`` gets chunks ``r`` and ``2·cp−1−r`` of every sequence.

    Returns ``{"input_ids": the row of CP rank cp_rank (or a list with every rank's row when
    cp_rank is None), "cu_seqlens", "cu_seqlens_padded", "max_seqlen" (padded),
    "pad_factor", "qkv_format": "thd"}``.

    Example (factor 2·cp·tp = 4; -1 marks padding):
        >>> r = pack_sequences([[0, 0], [1, 1, 1, 1], [2] * 6, [3]], cp=2, pad_val=-1, pad_factor=4)
        >>> [row.tolist() for row in r["input_ids"]]
        [[0, -1, 1, 1, 2, 2, -1, -1, 3, -1], [0, -1, 1, 1, 2, 2, 2, 2, -1, -1]]
        >>> r["cu_seqlens_padded"].tolist()
        [0, 4, 8, 16, 20]
    """
    from .._layout import materialize

    factor = get_pad_factor(cp, tp) if pad_factor is None else pad_factor
    sequences = [list(seq) for seq in sequences]
    if not sequences:
        # ROLL takes the max of the (empty) padded lengths: torch refuses.
        raise RuntimeError(
            "max(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        )
    # A zero-length sequence takes no token on any rank; it only repeats a boundary.
    present = [i for i, seq in enumerate(sequences) if seq]
    samples = [{"prompt_ids": sequences[i], "completion_ids": [], "advantage": 0.0} for i in present]
    cu_real = np.zeros(len(sequences) + 1, dtype=np.int32)
    cu_padded = np.zeros(len(sequences) + 1, dtype=np.int32)
    if samples:
        m = materialize(
            samples,
            capacity=2**63,
            cp=cp,
            padding="sequence",
            align=factor,
            pad_token_id=pad_val,
            allow_empty_completion=True,
            plan=[[list(range(len(samples)))]],
            backend=backend,
        )
        mb = m.ranks[0][0]
        rows = [mb.cp_view(r)["input_ids"] for r in range(cp)] if cp > 1 else [mb.input_ids]
        real = np.zeros(len(sequences), dtype=np.int32)
        padded = np.zeros(len(sequences), dtype=np.int32)
        real[present] = np.diff(mb.cu_seqlens)
        padded[present] = mb.sequence_lengths
        cu_real[1:], cu_padded[1:] = np.cumsum(real), np.cumsum(padded)
    else:
        rows = [np.zeros(0, dtype=np.int64) for _ in range(_stowplan._integer(cp, "cp", 1, 2**32 - 1))]
    lengths = np.diff(cu_padded)
    return {
        "input_ids": rows if cp_rank is None else rows[cp_rank],
        "cu_seqlens": cu_real,
        "cu_seqlens_padded": cu_padded,
        "max_seqlen": int(lengths.max()),
        "pad_factor": factor,
        "qkv_format": "thd",
    }


def unpack_sequences(row: Any, cu_seqlens_padded: Any, cp: int = 1) -> List[Any]:
    """ROLL's ``_unpack_sequences``: the slices of one CP rank's ``row`` (e.g. its logits)
    per sequence, from ``cu_seqlens_padded[:-1] // cp`` to ``cu_seqlens_padded[1:] // cp``.

    Example:
        >>> unpack_sequences(list(range(10)), [0, 4, 8, 16, 20], cp=2)
        [[0, 1], [2, 3], [4, 5, 6, 7], [8, 9]]
    """
    bounds = [b // cp for b in _seqlens(cu_seqlens_padded, "cu_seqlens_padded")]
    return [row[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]
