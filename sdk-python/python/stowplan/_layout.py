"""Trainer layout: alignment factors, context-parallel layouts and materialized micro-batches.

>>> import stowplan
>>> lay = stowplan.cp_layout([2, 4, 6, 1], cp=2)          # seed 001's example
>>> lay.factor, lay.cu_seqlens.tolist(), lay.cu_seqlens_padded.tolist()
(4, [0, 2, 6, 12, 13], [0, 4, 8, 16, 20])
>>> lay.gather[0].tolist()                                 # positions CP rank 0 receives
[0, 3, 4, 7, 8, 9, 14, 15, 16, 19]
>>> lay.local_bounds.tolist()
[0, 2, 4, 8, 10]
>>> samples = [
...     {"prompt_ids": [11, 12], "completion_ids": [13, 14, 15], "advantage": 0.5},
...     {"prompt_ids": [21], "completion_ids": [22, 23], "advantage": -1.0},
... ]
>>> m = stowplan.materialize(samples, capacity=64, cp=2)
>>> mb = m.ranks[0][0]
>>> mb.input_ids.tolist(), mb.cu_seqlens_padded.tolist()
([11, 12, 13, 14, 15, 1, 1, 1, 21, 22, 23, 1], [0, 8, 12])
>>> mb.cp_view(1)["input_ids"].tolist()
[13, 14, 15, 1, 22, 23]
>>> stowplan.MicroBatch.from_bytes(mb.to_bytes()).input_ids.tolist() == mb.input_ids.tolist()
True
"""

from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Union

import numpy as np

from . import _stowplan
from ._balance import CostLike, _cost
from ._convert import as_lengths, check_int
from .errors import InvalidArgumentError

__all__ = ["pad_factor", "cp_layout", "CpLayout", "materialize", "Materialized", "MicroBatch"]

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1

#: One materialized micro-batch (a native class): numpy arrays ``input_ids`` (int64),
#: ``position_ids`` (int64), ``loss_mask`` (bool), ``advantages``, ``inference_logprobs``,
#: ``temperatures`` (float32), ``teacher_logprobs`` (float32 or None), ``cu_seqlens`` and
#: ``cu_seqlens_padded`` (int32, flash-attention's format), ``lora_num_tokens`` (int32),
#: ``samples`` (uint32, the sample indices in row order); ``max_seqlen``, ``real_tokens``,
#: ``padding_tokens``, ``dummy``, ``cp``; the ``sequence_lengths`` property; methods
#: ``cp_view(rank)``, ``cp_unpack(rows)``, ``to_bytes()`` and ``MicroBatch.from_bytes(data)``.
MicroBatch = _stowplan.MicroBatch

AlignLike = Union[None, str, int]


def _align(align: AlignLike) -> AlignLike:
    if align is None or isinstance(align, str):
        return align
    return check_int(align, "align", 1, _U64_MAX)


def pad_factor(*, cp: int = 1, tp: int = 1, align: AlignLike = None, power_of_two: bool = False, backend: str = "wasm") -> int:
    """The multiple every sequence length is padded to.

    ``align``: ``None`` or ``"cp_tp"`` — seed 001's ``2·cp·tp`` (``tp`` when ``cp == 1``);
    ``"roll"`` — ROLL's ``lcm(16, 2·cp·tp)`` (``lcm(16, tp)`` when ``cp == 1``); an integer —
    that multiple, which must be a multiple of ``2·cp`` (when ``cp > 1``) and of ``tp``.
    ``power_of_two=True`` rejects ``cp``/``tp`` that are not powers of two.

    >>> pad_factor(cp=2, tp=2), pad_factor(cp=3, align="roll"), pad_factor(tp=3)
    (8, 48, 3)
    """
    return _stowplan.pad_factor(check_int(cp, "cp", 1, _U32_MAX), check_int(tp, "tp", 1, _U32_MAX), _align(align), bool(power_of_two), backend)


class CpLayout:
    """One packed row of sequences split over context-parallel ranks (Megatron's zigzag).

    Attributes:
        factor: the pad factor; every sequence is padded to a multiple of it.
        cp: the CP size.
        cu_seqlens: ``uint64`` array of ``n + 1`` cumulative real lengths.
        cu_seqlens_padded: ``uint64`` array of ``n + 1`` cumulative padded lengths
            (sequence ``i`` occupies ``cu_seqlens_padded[i]:cu_seqlens_padded[i+1]``).
        max_seqlen, max_seqlen_padded: the longest real and padded length.
        gather: one ``uint64`` array per CP rank, the positions of the padded row it
            receives (chunks ``r`` and ``2·cp−1−r`` of every sequence), in its order.
        local_bounds: ``uint64`` array, every rank's sequence boundaries
            (``cu_seqlens_padded // cp``).
        rank_real_tokens: ``uint64`` array, real tokens per CP rank.
    """

    __slots__ = ("factor", "cp", "cu_seqlens", "cu_seqlens_padded", "max_seqlen", "max_seqlen_padded", "gather", "local_bounds", "rank_real_tokens")

    def __init__(self, cp: int, parts: tuple) -> None:
        (self.factor, self.cu_seqlens, self.cu_seqlens_padded, self.max_seqlen, self.max_seqlen_padded, self.gather, self.local_bounds, self.rank_real_tokens) = parts
        self.cp = cp

    @property
    def padded_tokens(self) -> int:
        """Tokens of the padded row."""
        return int(self.cu_seqlens_padded[-1])

    def split(self, row: Any) -> List[np.ndarray]:
        """Every CP rank's part of ``row`` (an array of the padded row's length)."""
        arr = np.asarray(row)
        if arr.ndim != 1 or len(arr) != self.padded_tokens:
            raise InvalidArgumentError(f"row must be one-dimensional with {self.padded_tokens} elements (got shape {arr.shape})")
        return [arr[g] for g in self.gather]

    def unpack(self, rows: Sequence[Any]) -> np.ndarray:
        """The inverse of :meth:`split`: CP ranks' rows (e.g. per-token outputs) back into
        one padded row. ``rows`` are float32/float64/int64/int32/bool arrays."""
        return _stowplan.scatter(list(self.gather), [np.ascontiguousarray(r) for r in rows], self.padded_tokens)

    def __repr__(self) -> str:
        return f"CpLayout(cp={self.cp}, factor={self.factor}, sequences={len(self.cu_seqlens) - 1}, padded_tokens={self.padded_tokens})"


def cp_layout(lengths: Any, *, cp: int, tp: int = 1, align: AlignLike = None, power_of_two: bool = False, backend: str = "wasm") -> CpLayout:
    """Pads every sequence of ``lengths`` to the pad factor (see :func:`pad_factor`), packs
    them in order and splits the row over ``cp`` ranks. Zero lengths are allowed."""
    cp = check_int(cp, "cp", 1, _U32_MAX)
    parts = _stowplan.cp_layout(as_lengths(lengths, "lengths"), cp, check_int(tp, "tp", 1, _U32_MAX), _align(align), bool(power_of_two), backend)
    return CpLayout(cp, parts)


class Materialized:
    """Every rank's micro-batches (the result of :func:`materialize`).

    Attributes:
        ranks: ``ranks[r]`` is rank ``r``'s list of :data:`MicroBatch` (the same count on
            every rank).
        per_rank: micro-batches per rank.
        real_tokens, padding_tokens: totals (dummies' padding included).
        packed: micro-batches best-fit decreasing made; splits: heaviest ones split to reach
            a multiple of ``dp``; dummies: empty micro-batches added (zero loss mask and
            advantages) because there were fewer samples than slots; lower_bound: no packing
            under the capacity has fewer micro-batches. These four are ``None`` for a
            caller's ``plan``.
        rank_costs: ``uint64`` array, cost per rank (``None`` for a caller's plan).
    """

    __slots__ = ("ranks", "per_rank", "real_tokens", "padding_tokens", "packed", "splits", "dummies", "lower_bound", "rank_costs")

    def __init__(self, ranks: List[List[Any]], figures: Optional[dict]) -> None:
        self.ranks = ranks
        self.per_rank = len(ranks[0]) if ranks else 0
        all_mb = [mb for r in ranks for mb in r]
        self.real_tokens = sum(mb.real_tokens for mb in all_mb)
        self.padding_tokens = sum(mb.padding_tokens for mb in all_mb)
        f = figures or {}
        self.packed = f.get("packed")
        self.splits = f.get("splits")
        self.dummies = f.get("dummies", sum(1 for mb in all_mb if mb.dummy))
        self.lower_bound = f.get("lower_bound")
        self.rank_costs = f.get("rank_costs")

    @property
    def padding_overhead(self) -> float:
        """Padding tokens over real tokens."""
        return self.padding_tokens / self.real_tokens if self.real_tokens else 0.0

    def __repr__(self) -> str:
        return (
            f"Materialized(dp={len(self.ranks)}, per_rank={self.per_rank}, real_tokens={self.real_tokens}, "
            f"padding_tokens={self.padding_tokens}, dummies={self.dummies})"
        )


def materialize(
    samples: Iterable[Any],
    *,
    capacity: int,
    dp: int = 1,
    cp: int = 1,
    tp: int = 1,
    padding: Optional[str] = None,
    align: AlignLike = None,
    cost: CostLike = "tokens",
    pad_token_id: int = 1,
    num_runs: Optional[int] = None,
    mix_runs: bool = False,
    allow_empty_completion: bool = False,
    plan: Optional[Sequence[Sequence[Sequence[int]]]] = None,
    backend: str = "wasm",
) -> Materialized:
    """Packs ``samples`` into micro-batches of at most ``capacity`` tokens (after padding),
    gives each of ``dp`` ranks the same number, and builds their arrays.

    A sample is a mapping or an object with ``prompt_ids``, ``completion_ids`` (lists or
    int64/int32 arrays) and ``advantage``; optionally ``prompt_mask`` (default all False),
    ``completion_mask`` (all True), ``completion_logprobs`` (0), ``temperature`` (one float,
    default 1.0) or ``completion_temperatures`` (one per completion token), ``run`` or
    ``lora`` (default 0) and ``teacher_logprobs`` (every token; all samples or none).

    ``padding``: ``"sequence"`` pads every sample to the factor (default when ``cp > 1``;
    rows then carry their CP split, see ``MicroBatch.cp_view``); ``"micro_batch"`` pads each
    row's total (prime-rl's ``pad_to_multiple_of``; default when ``cp == 1``). ``align``: as
    for :func:`pad_factor` (an integer is used as is). Samples of different runs never share a
    micro-batch unless ``mix_runs``. ``plan``: materialize this plan instead
    (``plan[r][j]`` = the sample indices of rank ``r``'s micro-batch ``j``; ``[]`` = a dummy).

    Raises InvalidArgumentError naming the sample and field (length mismatch, empty
    completion unless ``allow_empty_completion``, temperature ≤ 0, …) and InfeasibleError for
    a sample longer than ``capacity``.
    """
    cp = check_int(cp, "cp", 1, _U32_MAX)
    tp = check_int(tp, "tp", 1, _U32_MAX)
    if padding is None:
        padding = "sequence" if cp > 1 else "micro_batch"
    if padding not in ("sequence", "micro_batch"):
        raise InvalidArgumentError(f"padding must be 'sequence' or 'micro_batch' (got {padding!r})")
    align = _align(align)
    multiple = align if isinstance(align, int) else pad_factor(cp=cp, tp=tp, align=align, backend=backend)
    linear, quadratic = _cost(cost)
    if plan is not None:
        plan = [[[check_int(i, "plan sample index", 0, _U32_MAX) for i in mb] for mb in rank] for rank in plan]
    ranks, figures = _stowplan.materialize(
        samples,
        check_int(capacity, "capacity", 1, _U64_MAX),
        check_int(dp, "dp", 1, _U32_MAX),
        cp,
        padding,
        multiple,
        linear,
        quadratic,
        check_int(pad_token_id, "pad_token_id", -(2**63), 2**63 - 1),
        None if num_runs is None else check_int(num_runs, "num_runs", 1, _U32_MAX),
        bool(mix_runs),
        bool(allow_empty_completion),
        plan,
        backend,
    )
    return Materialized(ranks, figures)
