"""Balancing: micro-batches under a hard token cap, DP ranks, and both levels in one plan.

The functions and their results are the native module's (``stowplan._stowplan``): options
are parsed and checked in Rust with the kernel's names, and the balance metrics
(``token_balance``, ``cost_balance``, ``log_seqlen_unbalance``) are computed there too.

Index spaces: every index a result holds is a position in the ``lengths`` the call was
given. For :func:`micro_batches` on one rank's batch those are the rank's own (local)
positions; for :func:`balance` on a global batch they are **global**: ``Balance.ranks[r]``
and ``Balance.micro_batches[r].batches`` both hold global sample indices, so index the
global batch with them, or get positions into the rank's own batch
(``batch[plan.ranks[r]]``) from :func:`rank_micro_batches`.

>>> import stowplan
>>> mb = stowplan.micro_batches([100, 900, 50, 950, 400, 600], 2000, cost="attention", order="verl")
>>> mb.count, [b.tolist() for b in mb.batches], mb.token_balance["spread"]
(2, [[1, 5], [0, 2, 3, 4]], 0)
>>> b = stowplan.balance([100, 900, 50, 950, 400, 600], 2)
>>> b.token_balance["max"], b.log_seqlen_unbalance()["global_seqlen/balanced_max"]
(1550, 1550)
>>> stowplan.COSTS["attention"]
(24576, 1)

A rank that holds only its own samples slices them with local positions:

>>> lengths = [100, 900, 50, 950, 400, 600, 10, 20]
>>> plan = stowplan.balance(lengths, 2, max_token_len=1000, cost="attention")
>>> plan.ranks[1].tolist()                                    # global indices of rank 1's samples
[0, 2, 3, 4]
>>> [m.tolist() for m in plan.micro_batches[1].batches]      # global indices too
[[0, 2, 4], [3]]
>>> local = stowplan.rank_micro_batches(plan, 1)             # positions in rank 1's own batch
>>> [m.tolist() for m in local]
[[0, 1, 3], [2]]
>>> mine = [lengths[i] for i in plan.ranks[1]]              # what rank 1 holds: [100, 50, 950, 400]
>>> [[mine[j] for j in m] for m in local]
[[100, 50, 400], [950]]
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from . import _stowplan
from ._convert import as_integers
from .errors import InvalidArgumentError

__all__ = ["COSTS", "MicroBatches", "Balance", "micro_batches", "balance", "rank_micro_batches"]

#: The kernel's named cost models: a sequence of ``L`` tokens costs ``linear·L + quadratic·L²``.
COSTS: Dict[str, Tuple[int, int]] = _stowplan.COST_PRESETS

micro_batches = _stowplan.micro_batches
MicroBatches = _stowplan.MicroBatches
Balance = _stowplan.Balance


def balance(
    lengths: Any,
    dp: int,
    *,
    cost: Any = None,
    max_token_len: Optional[int] = None,
    groups: Optional[Iterable[Any]] = None,
    group_size: Optional[int] = None,
    minibatch_size: Optional[int] = None,
    equal_count: Optional[bool] = None,
    min_count: Optional[int] = None,
    divisible_by: Optional[int] = None,
    count: Optional[int] = None,
    order: Optional[str] = None,
    extra_costs: Any = None,
    resources: Optional[Dict[str, Any]] = None,
    limits: Optional[Dict[str, int]] = None,
    backend: Optional[str] = None,
) -> Any:
    """Balances a global batch over ``dp`` ranks, and with ``max_token_len`` also splits every
    rank's part into micro-batches (the same count on every rank); returns a :class:`Balance`.

    Every rank gets the same number of samples (``equal_count``), and the costliest rank is
    made as light as the heuristic finds (Karmarkar–Karp on costs, then swaps). The plan is a
    pure function of the global lengths, so every rank can compute it and agree on the
    micro-batch count without an all-reduce.

    ``lengths``: tokens per sample of the global batch (list, numpy array, CPU tensor …);
    ``dp``: number of data-parallel ranks, ``>= 1``. Options (omitted or ``None``: the
    default):

    - ``cost`` — ``"tokens"`` (default), ``"attention"`` (``24576·L + L²``) or a
      ``(linear, quadratic)`` pair of integers;
    - ``max_token_len`` — the micro-batch cap (``None``: plan only the DP level);
    - ``groups`` — one label per sample (any hashable values, e.g. the prompt uid of each
      rollout; numpy arrays too): samples with the same label stay on one rank. Equal counts
      need groups of one size and a number of groups divisible by ``dp``;
    - ``group_size`` — the CLI's ``--group-size G``: runs of ``G`` consecutive samples (one
      prompt's ``G`` rollouts) stay on one rank, i.e. ``groups=[i // G for i in
      range(len(lengths))]``. It must be in ``1..=len(lengths)`` and divide ``len(lengths)``
      (with ``equal_count=False`` the last run may be shorter, as with the CLI's
      ``--unequal-count``); give ``groups`` or ``group_size``, not both;
    - ``minibatch_size`` — balance each run of this many consecutive samples separately
      (verl's ``keep_minibatch``; each rank lists its samples mini-batch by mini-batch);
    - ``equal_count`` — every rank gets the same number of samples (default True);
    - ``min_count``, ``divisible_by``, ``count``, ``order`` — as in :func:`micro_batches`,
      per rank;
    - ``extra_costs`` — one extra cost per sample on top of ``cost`` (e.g. a multimodal
      sample's image tokens), counted by both levels, not by the token cap;
    - ``resources``, ``limits`` — further caps per micro-batch (with ``max_token_len``), as in
      :func:`micro_batches`: name → the samples' sizes, name → the cap; every rank's
      micro-batches stay within every cap, with one common count;
    - ``backend`` — ``"wasm"`` (default) or ``"native"``.

    Index spaces: ``order``, ``ranks[r]`` and ``micro_batches[r].batches`` of the result hold
    **global** sample indices (positions in ``lengths``). A rank holding only its share
    ``batch[plan.ranks[r]]`` slices it with :func:`rank_micro_batches` (rank-local positions);
    ``micro_batches[r].restore`` is rank-local already.

    Raises :class:`InvalidArgumentError` naming the argument and its range (``dp`` above the
    number of samples, counts that do not divide, ``groups`` of the wrong length or of
    different sizes, ``group_size`` with ``groups`` or not dividing the samples …) and
    :class:`InfeasibleError` for a sample longer than ``max_token_len``.

    >>> import stowplan
    >>> b = stowplan.balance([100, 900, 50, 950, 400, 600], 2)
    >>> [r.tolist() for r in b.ranks], b.tokens.tolist()
    ([[1, 2, 5], [0, 3, 4]], [1550, 1450])
    >>> rollouts = [5, 7, 1, 1, 9, 9, 2, 3]               # 4 prompts × 2 rollouts, consecutive
    >>> b = stowplan.balance(rollouts, 2, group_size=2)    # = groups=[0, 0, 1, 1, 2, 2, 3, 3]
    >>> [r.tolist() for r in b.ranks]
    [[2, 3, 4, 5], [0, 1, 6, 7]]
    """
    if group_size is not None:
        if groups is not None:
            raise InvalidArgumentError(
                "give groups (one label per sample) or group_size (runs of group_size consecutive samples), not both"
            )
        converted = as_integers(lengths, "lengths")
        n = len(converted)
        g = group_size
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)):
            raise InvalidArgumentError(f"group_size must be an integer in 1..={n} dividing the number of samples (got {g!r})")
        g = int(g)
        # An empty batch is left to the native layer, which names `lengths`.
        if g < 1 or (equal_count is not False and n > 0 and n % g != 0):
            raise InvalidArgumentError(
                f"group_size must be in 1..={n} and divide the number of samples n = {n} (got {g}); "
                "with equal_count=False any group_size >= 1 is taken (the last run keeps the rest)"
            )
        lengths = converted
        groups = np.arange(n, dtype=np.int64) // g
    return _stowplan.balance(
        lengths,
        dp,
        cost=cost,
        max_token_len=max_token_len,
        groups=groups,
        minibatch_size=minibatch_size,
        equal_count=equal_count,
        min_count=min_count,
        divisible_by=divisible_by,
        count=count,
        order=order,
        extra_costs=extra_costs,
        resources=resources,
        limits=limits,
        backend=backend,
    )


def rank_micro_batches(plan: Any, rank: int, *, local: bool = True) -> List[np.ndarray]:
    """The micro-batches of rank ``rank`` of ``plan`` (a :class:`Balance` made with
    ``max_token_len``), as ``uint32`` arrays in the plan's micro-batch order.

    With ``local=True`` (the default) the arrays hold **rank-local** positions: indices into
    the rank's own batch, the samples ``plan.ranks[rank]`` in that order (``batch[plan.ranks[rank]]``,
    which is what verl's and ROLL's dispatchers hand rank ``rank`` after reordering the global
    batch by ``plan.order``). With ``local=False`` they are the global sample indices,
    ``plan.micro_batches[rank].batches`` as they are. ``plan.micro_batches[rank].restore``
    is already rank-local: ``outputs[restore]`` puts the rank's outputs, computed micro-batch
    after micro-batch, back in the order of ``plan.ranks[rank]``.

    Raises :class:`InvalidArgumentError` when ``plan`` is not a :class:`Balance`, has no
    micro-batches, or ``rank`` is not in ``0..=dp-1``.
    """
    if not isinstance(plan, Balance):
        raise InvalidArgumentError(f"plan must be a stowplan.Balance, the result of stowplan.balance (got {type(plan).__name__})")
    if plan.micro_batches is None:
        raise InvalidArgumentError("plan has no micro-batches: make it with stowplan.balance(..., max_token_len=T)")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= int(rank) < plan.dp:
        raise InvalidArgumentError(f"rank must be an integer in 0..={plan.dp - 1} (got {rank!r})")
    mb = plan.micro_batches[int(rank)]
    if not local:
        return list(mb.batches)
    samples = plan.ranks[int(rank)]
    by_index = np.argsort(samples, kind="stable")
    positions = by_index[np.searchsorted(samples, mb.indices, sorter=by_index)].astype(np.uint32)
    return np.split(positions, mb.offsets[1:-1].astype(np.intp))
