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

from typing import Any, Dict, List, Tuple

import numpy as np

from . import _stowplan
from .errors import InvalidArgumentError

__all__ = ["COSTS", "MicroBatches", "Balance", "micro_batches", "balance", "rank_micro_batches"]

#: The kernel's named cost models: a sequence of ``L`` tokens costs ``linear·L + quadratic·L²``.
COSTS: Dict[str, Tuple[int, int]] = _stowplan.COST_PRESETS

micro_batches = _stowplan.micro_batches
balance = _stowplan.balance
MicroBatches = _stowplan.MicroBatches
Balance = _stowplan.Balance


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
