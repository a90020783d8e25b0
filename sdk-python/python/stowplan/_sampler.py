"""Micro-batches under a hard token cap, balanced over data-parallel ranks: :class:`TokenBudgetBatchSampler`.

Padding-free training (``PaddingFreeCollator``, transformers' ``DataCollatorWithFlattening``)
concatenates whatever the loader hands it, so the loader must bound the tokens. This sampler
cuts each epoch into optimizer steps of ``batch_size`` samples (in a seeded random order), and
plans every step with the kernel's :func:`stowplan.balance`: the step's samples spread over the
``dp_size`` ranks (the same number on each, the costliest rank as light as the heuristic
finds), each rank's part cut into micro-batches of at most ``max_tokens`` tokens, **the same
number of micro-batches on every rank** (so the ranks stay in lockstep). Rank ``rank`` iterates
its micro-batches, step after step, as lists of dataset indices (a DataLoader's
``batch_sampler``). Every rank computes the same plan from the lengths and the seed: no
communication.

>>> lengths = [100, 900, 50, 950, 400, 600, 10, 20]
>>> s = TokenBudgetBatchSampler(lengths, 1000, dp_size=2, rank=0, shuffle=False)
>>> list(s), [sum(lengths[i] for i in mb) for mb in s]               # rank 0: 2 micro-batches
([[1], [5, 6, 7]], [900, 630])
>>> list(TokenBudgetBatchSampler(lengths, 1000, dp_size=2, rank=1, shuffle=False))   # rank 1: 2 too
[[0, 2, 4], [3]]
"""

from __future__ import annotations

from typing import Any, Iterator, List, Optional

import numpy as np

from . import _stowplan
from ._stowplan import balance
from ._convert import as_int64
from .errors import InfeasibleError, InvalidArgumentError

try:  # A torch Sampler when torch is there, so DataLoader(batch_sampler=...) takes it as one.
    from torch.utils.data import Sampler as _Base
except ImportError:  # pragma: no cover - exercised where torch is missing
    _Base = object  # type: ignore[assignment,misc]

__all__ = ["TokenBudgetBatchSampler"]

#: The column whose list lengths are a ``datasets.Dataset``'s sample lengths by default.
DEFAULT_LENGTH_COLUMN = "input_ids"


class TokenBudgetBatchSampler(_Base):  # type: ignore[misc,valid-type]
    """Yields rank ``rank``'s micro-batches (lists of sample indices) of each epoch; each
    micro-batch holds at most ``max_tokens`` tokens.

    ``lengths`` — tokens per sample (a sequence or array of ints), or a ``datasets.Dataset``
    (or ``pyarrow.Table``) whose ``length_column`` list lengths are read from its Arrow offsets
    (a packed dataset's rows work too). ``max_tokens`` — the hard cap (``1..``); a sample longer
    than it raises :class:`InfeasibleError` naming it (pack or truncate first). ``dp_size`` /
    ``rank`` — the data-parallel ranks and this one. ``batch_size`` — samples per optimizer
    step over all ranks, a multiple of ``dp_size`` (default: the whole epoch is one step).
    ``shuffle`` / ``seed`` — the epoch's order (``numpy`` PCG64 seeded by ``(seed, epoch)``, the
    same on every rank; steps' micro-batches are shuffled too); :meth:`set_epoch` sets the
    epoch. ``drop_last`` — drop a last step shorter than ``batch_size``; otherwise it is kept,
    padded with samples from the start of the epoch's order to a multiple of ``dp_size`` (as
    ``DistributedSampler`` pads). ``cost`` — :func:`stowplan.balance`'s cost model for the rank
    balance (``"tokens"``, ``"attention"`` or ``(linear, quadratic)``); the cap is in tokens.

    Without padding (``len(lengths)`` a multiple of ``dp_size``, ``batch_size`` dividing it or
    ``drop_last`` False) every index comes once per epoch over the ranks. :meth:`steps` gives
    the same micro-batches grouped by step (gradient accumulation boundaries); ``len()`` is the
    number of micro-batches of this rank in the epoch, the same on every rank.
    """

    def __init__(
        self,
        lengths: Any,
        max_tokens: int,
        *,
        dp_size: int = 1,
        rank: int = 0,
        batch_size: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        cost: Any = None,
        length_column: str = DEFAULT_LENGTH_COLUMN,
        backend: Optional[str] = None,
    ) -> None:
        self.lengths = _lengths_of(lengths, length_column)
        n = int(self.lengths.size)
        self.max_tokens = _stowplan._integer(max_tokens, "max_tokens", 1, 2**63 - 1)
        self.dp_size = _stowplan._integer(dp_size, "dp_size", 1, 2**20)
        self.rank = _stowplan._integer(rank, "rank", 0, self.dp_size - 1)
        if n < self.dp_size:
            raise InvalidArgumentError(f"lengths has {n} samples; dp_size = {self.dp_size} ranks need at least {self.dp_size}")
        if batch_size is None:
            batch_size = n + (-n) % self.dp_size
        else:
            batch_size = _stowplan._integer(batch_size, "batch_size", 1, 2**63 - 1)
            if batch_size % self.dp_size:
                raise InvalidArgumentError(
                    f"batch_size must be a multiple of dp_size = {self.dp_size} (got {batch_size}): every rank takes the same number of samples"
                )
        self.batch_size = batch_size
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be True or False (got {flag!r})")
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = _stowplan._integer(seed, "seed", 0, 2**64 - 1)
        if drop_last and n < batch_size:
            raise InvalidArgumentError(f"drop_last=True with batch_size = {batch_size} above the {n} samples leaves no step")
        long = self.lengths > self.max_tokens
        if long.any():
            i = int(np.argmax(long))
            raise InfeasibleError(
                f"lengths[{i}] is {int(self.lengths[i])} tokens, more than max_tokens = {self.max_tokens} "
                "(a sample is never split: pack or truncate it first)"
            )
        self.cost = cost
        self.backend = backend
        self.epoch = 0
        self._plan: Optional[List[List[List[int]]]] = None
        self._plan_epoch = -1
        self._steps_of_epoch()  # checks cost and backend now, and plans epoch 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next iteration follows (call it before each epoch, as with
        ``DistributedSampler``)."""
        self.epoch = _stowplan._integer(epoch, "epoch", 0, 2**63 - 1)

    def _steps_of_epoch(self) -> List[List[List[int]]]:
        """This rank's micro-batches of the epoch, step by step (planned once per epoch)."""
        if self._plan is not None and self._plan_epoch == self.epoch:
            return self._plan
        n, size, dp = int(self.lengths.size), self.batch_size, self.dp_size
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(n) if self.shuffle else np.arange(n)
        full, rest = divmod(n, size)
        cuts = [order[k * size : (k + 1) * size] for k in range(full)]
        if rest and not self.drop_last:
            last = order[full * size :]
            pad = (-rest) % dp
            cuts.append(np.concatenate((last, order[:pad])) if pad else last)
        steps: List[List[List[int]]] = []
        for samples in cuts:
            plan = balance(self.lengths[samples], dp, max_token_len=self.max_tokens, cost=self.cost, backend=self.backend)
            mbs = [samples[b.astype(np.int64)].tolist() for b in plan.micro_batches[self.rank].batches]
            if self.shuffle:  # the same permutation on every rank (the counts agree)
                mbs = [mbs[j] for j in rng.permutation(len(mbs))]
            steps.append(mbs)
        self._plan, self._plan_epoch = steps, self.epoch
        return steps

    def steps(self) -> Iterator[List[List[int]]]:
        """This rank's micro-batches of the epoch grouped by optimizer step."""
        return iter(self._steps_of_epoch())

    def __iter__(self) -> Iterator[List[int]]:
        return (mb for step in self._steps_of_epoch() for mb in step)

    def __len__(self) -> int:
        return sum(len(step) for step in self._steps_of_epoch())


def _lengths_of(lengths: Any, column: str) -> np.ndarray:
    """Sample lengths (int64) from a sequence, an array, a ``datasets.Dataset`` or a
    ``pyarrow.Table`` (its ``column``'s list lengths)."""
    table = None
    if type(lengths).__module__.startswith("datasets"):
        import datasets

        if isinstance(lengths, datasets.Dataset):
            table = lengths.with_format("arrow")[:]
        else:
            raise InvalidArgumentError(
                f"lengths must be a sequence of ints, a datasets.Dataset or a pyarrow.Table (got {type(lengths).__name__})"
            )
    elif type(lengths).__module__.startswith("pyarrow"):
        table = lengths
    if table is not None:
        from .arrow import _check_columns, _lengths

        if not isinstance(column, str):
            raise InvalidArgumentError(f"length_column must be a column name (got {column!r})")
        names = _check_columns(table, [column], False)
        return _lengths(table, names)
    return as_int64(lengths, "lengths", 0)
