"""Balancing: micro-batches under a hard token cap, DP ranks, and both levels in one plan.

The functions and their results are the native module's (``stowplan._stowplan``): options
are parsed and checked in Rust with the kernel's names, and the balance metrics
(``token_balance``, ``cost_balance``, ``log_seqlen_unbalance``) are computed there too.

>>> import stowplan
>>> mb = stowplan.micro_batches([100, 900, 50, 950, 400, 600], 2000, cost="attention", order="verl")
>>> mb.count, [b.tolist() for b in mb.batches], mb.token_balance["spread"]
(2, [[1, 5], [0, 2, 3, 4]], 0)
>>> b = stowplan.balance([100, 900, 50, 950, 400, 600], 2)
>>> b.token_balance["max"], b.log_seqlen_unbalance()["global_seqlen/balanced_max"]
(1550, 1550)
>>> stowplan.COSTS["attention"]
(24576, 1)
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

from . import _stowplan

__all__ = ["COSTS", "MicroBatches", "Balance", "micro_batches", "balance"]

#: The kernel's named cost models: a sequence of ``L`` tokens costs ``linear·L + quadratic·L²``.
COSTS: Dict[str, Tuple[int, int]] = _stowplan.COST_PRESETS

micro_batches = _stowplan.micro_batches
balance = _stowplan.balance
MicroBatches = _stowplan.MicroBatches
Balance = _stowplan.Balance

