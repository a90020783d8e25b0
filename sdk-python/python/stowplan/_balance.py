"""Balancing: micro-batches under a hard token cap, DP ranks, and both levels in one plan."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _stowplan
from ._convert import as_lengths, check_int
from .errors import InvalidArgumentError

__all__ = ["COSTS", "MicroBatches", "Balance", "micro_batches", "balance"]

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1

#: Named cost models: a sequence of ``L`` tokens costs ``linear·L + quadratic·L²``.
COSTS: Dict[str, Tuple[int, int]] = {
    "tokens": (1, 0),
    "attention": (24576, 1),
}

CostLike = Union[str, Tuple[int, int], Sequence[int]]
_ORDERS = ("none", "cost_desc", "verl", "roll")


def _cost(cost: CostLike) -> Tuple[int, int]:
    if isinstance(cost, str):
        if cost not in COSTS:
            raise InvalidArgumentError(f"cost must be one of {sorted(COSTS)} or a (linear, quadratic) pair (got {cost!r})")
        return COSTS[cost]
    try:
        linear, quadratic = cost
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"cost must be a name or a (linear, quadratic) pair of integers (got {cost!r})") from None
    return (check_int(linear, "cost linear coefficient", 0, _U64_MAX), check_int(quadratic, "cost quadratic coefficient", 0, _U64_MAX))


def _order(order: str) -> str:
    if order not in _ORDERS:
        raise InvalidArgumentError(f"order must be one of {', '.join(repr(o) for o in _ORDERS)} (got {order!r})")
    return order


def _split(offsets: np.ndarray, indices: np.ndarray) -> List[np.ndarray]:
    """Views of ``indices`` per group (no copy)."""
    bounds = offsets.tolist()
    return [indices[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


def _balance_figures(values: np.ndarray) -> Dict[str, float]:
    """``max``, ``min``, ``mean``, ``max_over_mean`` and ``spread`` of per-group totals."""
    if len(values) == 0:
        return {"max": 0, "min": 0, "mean": 0.0, "max_over_mean": 1.0, "spread": 0}
    mx, mn = int(values.max()), int(values.min())
    mean = sum(int(v) for v in values.tolist()) / len(values)
    return {"max": mx, "min": mn, "mean": mean, "max_over_mean": mx / mean if mean > 0 else 1.0, "spread": mx - mn}


class _Totals:
    """Balance figures of per-group ``tokens`` and ``costs`` arrays."""

    __slots__ = ()
    tokens: np.ndarray
    costs: np.ndarray

    @property
    def token_balance(self) -> Dict[str, float]:
        """``max``, ``min``, ``mean``, ``max_over_mean``, ``spread`` of the tokens per group."""
        return _balance_figures(self.tokens)

    @property
    def cost_balance(self) -> Dict[str, float]:
        """``max``, ``min``, ``mean``, ``max_over_mean``, ``spread`` of the cost per group."""
        return _balance_figures(self.costs)


class MicroBatches(_Totals):
    """Micro-batches of one batch (the result of :func:`micro_batches`, or one rank's part
    of a :class:`Balance`).

    Attributes:
        batches: list of ``uint32`` arrays, the input indices of each micro-batch (ascending),
            in the requested order. In a :class:`Balance` the indices are global.
        offsets: ``uint32`` array of ``count + 1`` boundaries into ``indices``.
        indices: ``uint32`` array, every index once, micro-batch after micro-batch.
        tokens: ``uint64`` array, tokens of each micro-batch (each ``<= max_token_len``).
        costs: ``uint64`` array, cost of each micro-batch.
        restore: ``uint32`` array; ``outputs[restore]`` puts outputs computed in micro-batch
            order (concatenated) back in input order (in a :class:`Balance`: in the order of
            the rank's samples, ``Balance.ranks[r]``).
        lower_bound: ``max(1, ceil(total tokens / max_token_len))``.
        required: the count this batch needs on its own (the count ``count=`` overrides).
    """

    __slots__ = ("offsets", "indices", "tokens", "costs", "restore", "lower_bound", "required", "batches")

    def __init__(self, offsets: np.ndarray, indices: np.ndarray, tokens: np.ndarray, costs: np.ndarray, restore: np.ndarray, lower_bound: int, required: int) -> None:
        self.offsets = offsets
        self.indices = indices
        self.tokens = tokens
        self.costs = costs
        self.restore = restore
        self.lower_bound = lower_bound
        self.required = required
        self.batches: List[np.ndarray] = _split(offsets, indices)

    @property
    def count(self) -> int:
        """The number of micro-batches."""
        return len(self.offsets) - 1

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self.batches)

    def __repr__(self) -> str:
        return f"MicroBatches(count={self.count}, lower_bound={self.lower_bound}, max_tokens={int(self.tokens.max()) if self.count else 0})"


class Balance(_Totals):
    """A global batch over DP ranks (the result of :func:`balance`).

    Attributes:
        ranks: list of ``uint32`` arrays, the input indices each rank gets (ascending; mini-batch
            by mini-batch with ``minibatch_size``).
        order: ``uint32`` permutation of the input: ``batch[order]`` puts every rank's samples
            in one contiguous, equal slice (how verl's and ROLL's dispatchers split a batch).
        offsets: ``uint32`` array of ``dp + 1`` boundaries into ``order``.
        tokens: ``uint64`` array, tokens of each rank.
        costs: ``uint64`` array, cost of each rank.
        cost_lower_bound: ``max(ceil(total cost / dp), costliest group)``.
        micro_batches: with ``max_token_len``, one :class:`MicroBatches` per rank (global
            indices, the same count on every rank); else ``None``.
        lengths: the input lengths (``uint64``/``int64`` array), for the metrics.
    """

    __slots__ = ("offsets", "order", "tokens", "costs", "cost_lower_bound", "ranks", "micro_batches", "lengths")

    def __init__(self, dp: tuple, micro: Optional[list], lengths: np.ndarray) -> None:
        self.offsets, self.order, self.tokens, self.costs, self.cost_lower_bound = dp
        self.ranks: List[np.ndarray] = _split(self.offsets, self.order)
        self.micro_batches: Optional[List[MicroBatches]] = None if micro is None else [MicroBatches(*m) for m in micro]
        self.lengths = lengths

    @property
    def dp(self) -> int:
        """The number of ranks."""
        return len(self.offsets) - 1

    @property
    def count(self) -> Optional[int]:
        """Micro-batches per rank (``None`` without ``max_token_len``)."""
        return None if self.micro_batches is None else self.micro_batches[0].count

    def log_seqlen_unbalance(self, prefix: str = "global_seqlen") -> Dict[str, Union[int, float]]:
        """verl's ``log_seqlen_unbalance`` metrics for these ranks (tokens)."""
        from .compat.verl import log_seqlen_unbalance

        return log_seqlen_unbalance(self.lengths.tolist(), [r.tolist() for r in self.ranks], prefix)

    def __len__(self) -> int:
        return self.dp

    def __repr__(self) -> str:
        return f"Balance(dp={self.dp}, max_cost={int(self.costs.max())}, cost_lower_bound={self.cost_lower_bound}, count={self.count})"


def micro_batches(lengths: Any, max_token_len: int, *, cost: CostLike = "tokens", min_count: int = 0, divisible_by: int = 1, count: Optional[int] = None, order: str = "none", backend: str = "wasm") -> MicroBatches:
    """Splits one rank's batch into micro-batches of at most ``max_token_len`` tokens.

    The cap is hard: no micro-batch ever exceeds it. The count is the smallest the cap allows
    (the bin-packing lower bound on typical inputs), raised to ``min_count``, rounded up to a
    multiple of ``divisible_by`` — or exactly ``count``. The cost is balanced across them.

    Args:
        lengths: tokens per sequence (list, numpy array, CPU tensor …).
        max_token_len: the cap, ``>= 1``.
        cost: ``"tokens"`` (default), ``"attention"`` (``24576·L + L²``, verl's and ROLL's
            workload) or a ``(linear, quadratic)`` pair of integers.
        min_count: at least this many micro-batches (e.g. pipeline stages).
        divisible_by: the count is a multiple of this (virtual pipeline size).
        count: exactly this many (e.g. the count every DP rank agreed on).
        order: ``"none"`` (input order), ``"cost_desc"``, ``"verl"`` (verl's and ROLL's
            cheapest-at-both-ends order) or ``"roll"`` (ROLL's in-rank interleave).
        backend: ``"wasm"`` (default) or ``"native"``.

    Raises:
        InfeasibleError: a sequence longer than ``max_token_len`` (named), or a ``count``
            below what the cap allows.
        InvalidArgumentError: empty input, ``max_token_len`` 0, a count above the number of
            sequences (micro-batches are never empty), ``count`` not a multiple of
            ``divisible_by`` …

    Example:
        >>> mb = micro_batches([100, 900, 50, 950, 400, 600], 2000)
        >>> [b.tolist() for b in mb.batches], mb.tokens.tolist()
        ([[0, 2, 3, 4], [1, 5]], [1500, 1500])
        >>> mb.restore.tolist()  # position of each input in the concatenated micro-batches
        [0, 4, 1, 2, 3, 5]
    """
    linear, quadratic = _cost(cost)
    max_token_len = check_int(max_token_len, "max_token_len", 1, _U64_MAX)
    counts = _count_args(min_count, divisible_by, count)
    arr = as_lengths(lengths, "lengths")
    return MicroBatches(*_stowplan.micro_batches(arr, max_token_len, linear, quadratic, *counts, _order(order), backend))


def _count_args(min_count: Any, divisible_by: Any, count: Any) -> Tuple[int, int, Optional[int]]:
    """``min_count``, ``divisible_by`` and ``count`` checked (ranges named in the errors)."""
    return (
        check_int(min_count, "min_count", 0, _U32_MAX),
        check_int(divisible_by, "divisible_by", 1, _U32_MAX),
        None if count is None else check_int(count, "count", 1, _U32_MAX),
    )


def _labels(groups: Any, n: int) -> Optional[np.ndarray]:
    """Group labels (any hashable values, e.g. uids) as dense ``uint32`` ids."""
    if groups is None:
        return None
    values = groups.tolist() if hasattr(groups, "tolist") else list(groups)
    if len(values) != n:
        raise InvalidArgumentError(f"groups has {len(values)} labels but lengths has {n} entries; give one label per sample")
    ids: Dict[Any, int] = {}
    return np.fromiter((ids.setdefault(v, len(ids)) for v in values), dtype=np.uint32, count=n)


def balance(lengths: Any, dp: int, *, cost: CostLike = "tokens", max_token_len: Optional[int] = None, groups: Any = None, minibatch_size: Optional[int] = None, equal_count: bool = True, min_count: int = 0, divisible_by: int = 1, count: Optional[int] = None, order: str = "none", backend: str = "wasm") -> Balance:
    """Balances a global batch over ``dp`` ranks, and with ``max_token_len`` also splits every
    rank's part into micro-batches (the same count on every rank).

    Every rank gets the same number of samples (``equal_count``), and the costliest rank is
    made as light as the heuristic finds (Karmarkar–Karp on costs, then swaps). The plan is
    a pure function of the global lengths, so every rank can compute it and agree on the
    micro-batch count without an all-reduce.

    Args:
        lengths: tokens per sample of the global batch.
        dp: number of data-parallel ranks, ``>= 1``.
        cost: as in :func:`micro_batches`.
        max_token_len: the micro-batch cap; ``None`` plans only the DP level.
        groups: one label per sample (e.g. uids); samples with the same label stay on one
            rank. Equal counts need groups of one size and a group count divisible by ``dp``.
        minibatch_size: balance each run of this many consecutive samples separately (verl's
            ``keep_minibatch``); each rank lists its samples mini-batch by mini-batch.
        equal_count: every rank gets the same number of samples (default).
        min_count, divisible_by, count, order: as in :func:`micro_batches`, per rank.
        backend: ``"wasm"`` (default) or ``"native"``.

    Example:
        >>> b = balance([100, 900, 50, 950, 400, 600], 2)
        >>> [r.tolist() for r in b.ranks], b.tokens.tolist()
        ([[1, 2, 5], [0, 3, 4]], [1550, 1450])
        >>> b = balance([100, 900, 50, 950, 400, 600, 10, 20], 2, max_token_len=1000, cost="attention")
        >>> b.count, [[m.tolist() for m in r.batches] for r in b.micro_batches]
        (2, [[[1], [5, 6, 7]], [[0, 2, 4], [3]]])
    """
    linear, quadratic = _cost(cost)
    dp = check_int(dp, "dp", 1, _U32_MAX)
    if minibatch_size is not None:
        minibatch_size = check_int(minibatch_size, "minibatch_size", 1, _U32_MAX)
    if max_token_len is not None:
        max_token_len = check_int(max_token_len, "max_token_len", 1, _U64_MAX)
    counts = _count_args(min_count, divisible_by, count)
    arr = as_lengths(lengths, "lengths")
    labels = _labels(groups, len(arr))
    dp_tuple, micro = _stowplan.balance(arr, dp, linear, quadratic, labels, minibatch_size, bool(equal_count), max_token_len, *counts, _order(order), backend)
    return Balance(dp_tuple, micro, arr)
