"""Per-token fields of any shape and per-sample payloads, laid out like a micro-batch.

A materialized micro-batch (:class:`stowplan.MaterializedBatch`, also the micro-batches of a
:class:`stowplan.RankBatch`) says which samples its row holds (``samples``, in row order) and
where each starts (``cu_seqlens_padded``); stowplan's own per-token arrays (``input_ids``,
``loss_weights`` …) follow that layout. These functions put the caller's data in the same
layout, so a trainer builds a vision-language batch without passing images through stowplan:

- :func:`gather_tokens` — a per-token field of any dtype and leading shape, one array of shape
  ``(..., L_i)`` per sample (``L_i`` = prompt + completion tokens): mRoPE position ids
  ``(3, L_i)``, token type ids ``(L_i,)``, teacher top-k logprobs ``(k, L_i)`` … The result
  has shape ``(..., len(micro_batch))``, ``pad`` on padding.
- :func:`cp_slice` — a context-parallel rank's share of such a row, as
  ``micro_batch.cp_view(rank)`` slices stowplan's own arrays.
- :func:`gather_payload` — per-sample ranges of rows of the caller's payload arrays
  (``pixel_values`` rows, ``image_grid_thw`` rows), as one index array in row order plus
  offsets per sequence: ``pixel_values[p.index]`` is the micro-batch's images, in the order
  of its sequences, copied once by the caller's own library.

>>> import numpy as np, stowplan
>>> samples = [
...     {"prompt_ids": [11, 12], "completion_ids": [13, 14, 15], "advantage": 1.0},
...     {"prompt_ids": [21], "completion_ids": [22, 23], "advantage": 1.0},
... ]
>>> mrope = [np.arange(3 * 5).reshape(3, 5), 100 + np.arange(3 * 3).reshape(3, 3)]
>>> m = stowplan.materialize(samples, capacity=16, cp=2)
>>> mb = m.ranks[0][0]
>>> stowplan.gather_tokens(mb, mrope)[0].tolist()     # row 0 of (3, 12); padding is 0
[0, 1, 2, 3, 4, 0, 0, 0, 100, 101, 102, 0]
>>> stowplan.cp_slice(mb, 1, stowplan.gather_tokens(mb, mrope))[0].tolist()
[2, 3, 4, 0, 101, 102]
>>> p = stowplan.gather_payload(mb, [(0, 2), (2, 3)])  # sample 0 owns rows 0-1, sample 1 row 2
>>> p.index.tolist(), p.offsets.tolist()
([0, 1, 2], [0, 2, 3])
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import numpy as np

from .errors import InvalidArgumentError

__all__ = ["gather_tokens", "cp_slice", "gather_payload", "Payload"]


def _sequences(micro_batch: Any) -> "list[tuple[int, int, int]]":
    """``(sample, start in the row, real length)`` of every sequence of the row."""
    samples = np.asarray(micro_batch.samples)
    starts = np.asarray(micro_batch.cu_seqlens_padded)
    real = np.diff(np.asarray(micro_batch.cu_seqlens))
    return [(int(s), int(starts[k]), int(real[k])) for k, s in enumerate(samples)]


def gather_tokens(micro_batch: Any, values: Sequence[Any], *, pad: Any = 0) -> np.ndarray:
    """The per-token field ``values`` in ``micro_batch``'s row layout.

    ``values[i]`` is sample ``i``'s field (``i`` as in ``micro_batch.samples``: the index in
    the samples given to :func:`stowplan.materialize`, or in a rank batch's ``keys``), an
    array-like of shape ``(..., L_i)`` with ``L_i`` its tokens (prompt + completion), the same
    leading shape and dtype for every sample. Returns an array of shape
    ``(..., len(micro_batch))``: each sequence's tokens where the row holds them, ``pad`` on
    padding (and on the whole row of a dummy micro-batch).

    Raises :class:`stowplan.InvalidArgumentError` naming ``values[i]`` when a sample of the
    row has no entry, its last axis is not its token count, or its leading shape or dtype
    differs from the others'.
    """
    n = len(values)
    if n == 0:
        raise InvalidArgumentError("values must hold one array per sample (got none)")
    first = np.asarray(values[0])
    if first.ndim == 0:
        raise InvalidArgumentError("values[0] must be an array of shape (..., tokens) (got a scalar)")
    lead, dtype = first.shape[:-1], first.dtype
    out = np.full(lead + (len(micro_batch),), pad, dtype=dtype)
    for sample, start, length in _sequences(micro_batch):
        if sample >= n:
            raise InvalidArgumentError(f"values has {n} entries but the row holds sample {sample}")
        v = np.asarray(values[sample])
        if v.shape != lead + (length,):
            raise InvalidArgumentError(
                f"values[{sample}] must have shape {lead + (length,)} (sample {sample} has {length} tokens; "
                f"every entry has the leading shape {lead} of values[0]) (got {v.shape})"
            )
        if v.dtype != dtype:
            raise InvalidArgumentError(f"values[{sample}] must have the dtype of values[0], {dtype} (got {v.dtype})")
        out[..., start : start + length] = v
    return out


def cp_slice(micro_batch: Any, rank: int, row: Any) -> np.ndarray:
    """Context-parallel rank ``rank``'s share of ``row`` (shape ``(..., len(micro_batch))``,
    e.g. from :func:`gather_tokens`): the positions ``micro_batch.cp_view(rank)`` gives
    stowplan's own arrays. Raises :class:`stowplan.InvalidArgumentError` when the row has no
    CP split, ``rank`` is out of range or ``row``'s last axis is not the row's length."""
    row = np.asarray(row)
    if row.ndim == 0 or row.shape[-1] != len(micro_batch):
        got = "a scalar" if row.ndim == 0 else row.shape
        raise InvalidArgumentError(f"row must have shape (..., {len(micro_batch)}) (got {got})")
    positions = micro_batch.cp_view(rank)["positions"]
    return row[..., positions]


class Payload(NamedTuple):
    """What :func:`gather_payload` returns."""

    #: int64 indices into the caller's payload array, sequence by sequence in row order.
    index: np.ndarray
    #: int64 offsets into ``index``, one per sequence of the row plus one (``cu_seqlens``-like):
    #: sequence ``k``'s payload rows are ``index[offsets[k]:offsets[k + 1]]``.
    offsets: np.ndarray


def gather_payload(micro_batch: Any, ranges: Any) -> Payload:
    """The payload rows of ``micro_batch``'s samples, in row order.

    ``ranges[i] = (start, end)`` are sample ``i``'s rows ``start:end`` of the caller's payload
    array (``pixel_values``, ``image_grid_thw`` …), ``0 ≤ start ≤ end``; a sample without
    payload has ``start == end``. ``i`` is as in :func:`gather_tokens`.

    Raises :class:`stowplan.InvalidArgumentError` naming ``ranges`` or ``ranges[i]``.
    """
    r = np.asarray(ranges)
    if r.ndim != 2 or r.shape[1] != 2 or (r.size and r.dtype.kind not in "iu"):
        raise InvalidArgumentError(f"ranges must be integer (start, end) pairs, shape (samples, 2) (got {r.shape}, {r.dtype})")
    r = r.astype(np.int64, copy=False)
    parts, offsets = [], [0]
    for sample, _, _ in _sequences(micro_batch):
        if sample >= len(r):
            raise InvalidArgumentError(f"ranges has {len(r)} entries but the row holds sample {sample}")
        start, end = int(r[sample, 0]), int(r[sample, 1])
        if not 0 <= start <= end:
            raise InvalidArgumentError(f"ranges[{sample}] must satisfy 0 <= start <= end (got ({start}, {end}))")
        parts.append(np.arange(start, end, dtype=np.int64))
        offsets.append(offsets[-1] + end - start)
    index = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return Payload(index, np.asarray(offsets, dtype=np.int64))
