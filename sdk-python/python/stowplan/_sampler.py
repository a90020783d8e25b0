"""Micro-batches balanced over data-parallel ranks: :class:`TokenBudgetBatchSampler` (padding-free, under a hard token cap) and :class:`PaddedBatchSampler` (padded, grouped by length).

Padding-free training (``PaddingFreeCollator``, transformers' ``DataCollatorWithFlattening``)
concatenates whatever the loader hands it, so the loader must bound the tokens. This sampler
cuts each epoch into optimizer steps of ``batch_size`` samples (in a seeded random order), and
plans every step with the kernel's :func:`stowplan.balance`: the step's samples spread over the
``dp_size`` ranks (the same number on each, the costliest rank as light as the heuristic
finds), each rank's part cut into micro-batches of at most ``capacity`` tokens, **the same
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
from ._renamed import renamed, warn_renamed
from .errors import InfeasibleError, InvalidArgumentError

try:  # A torch Sampler when torch is there, so DataLoader(batch_sampler=...) takes it as one.
    from torch.utils.data import Sampler as _Base
except ImportError:  # pragma: no cover - exercised where torch is missing
    _Base = object  # type: ignore[assignment,misc]
try:
    # transformers.Trainer hands a BatchRebalanceSampler (the one sampler it knows to be a
    # rank-aware batch sampler) to its DataLoader as batch_sampler and keeps accelerate from
    # sharding it again: stowplan's samplers are that kind, so they are one for it.
    from transformers.trainer_pt_utils import BatchRebalanceSampler as _TrainerBatchSampler

    _Base = _TrainerBatchSampler  # noqa: F811
except Exception:  # noqa: BLE001 - transformers absent, or too old to have it
    pass

__all__ = ["TokenBudgetBatchSampler", "PaddedBatchSampler"]

#: The column whose list lengths are a ``datasets.Dataset``'s sample lengths by default.
DEFAULT_LENGTH_COLUMN = "input_ids"


class _StepSampler(_Base):  # type: ignore[misc,valid-type]
    """What both samplers share: the epoch's seeded order cut into optimizer steps of
    ``batch_size`` samples, each step planned by :meth:`_plan_step` into rank ``rank``'s
    micro-batches (the same plan on every rank: no communication)."""

    def __init__(
        self,
        lengths: Any,
        *,
        dp_size: int,
        rank: int,
        batch_size: Optional[int],
        shuffle: bool,
        seed: int,
        drop_last: bool,
        length_column: str,
    ) -> None:
        self.lengths = _lengths_of(lengths, length_column)
        n = int(self.lengths.size)
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
        self.epoch = 0
        self._plan: Optional[List[List[List[int]]]] = None
        self._plan_epoch = -1

    @property
    def max_tokens(self) -> int:
        """The former name of :attr:`capacity` (deprecated: it warns, naming ``capacity``)."""
        warn_renamed(type(self).__name__, "max_tokens", "capacity", stacklevel=3)
        return self.capacity

    def _check_cap(self, capacity: int) -> None:
        long = self.lengths > capacity
        if long.any():
            i = int(np.argmax(long))
            raise InfeasibleError(
                f"lengths[{i}] is {int(self.lengths[i])} tokens, more than capacity = {capacity} "
                "(a sample is never split: pack or truncate it first)"
            )

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next iteration follows (call it before each epoch, as with
        ``DistributedSampler``)."""
        self.epoch = _stowplan._integer(epoch, "epoch", 0, 2**63 - 1)

    def _least_step(self) -> int:
        """The fewest samples a step can be planned from."""
        return self.dp_size

    def _plan_step(self, samples: np.ndarray, rng: Any) -> List[List[int]]:
        raise NotImplementedError

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
            # The last, shorter step padded with samples from the start of the order (as
            # DistributedSampler pads) to a multiple of dp_size, and to the least a step needs.
            last = order[full * size :]
            need = max(rest + (-rest) % dp, self._least_step())
            cuts.append(np.concatenate((last, np.resize(order, need - rest))) if need > rest else last)
        steps = [self._plan_step(samples, rng) for samples in cuts]
        self._plan, self._plan_epoch = steps, self.epoch
        return steps

    def steps(self) -> Iterator[List[List[int]]]:
        """This rank's micro-batches of the epoch grouped by optimizer step."""
        return iter(self._steps_of_epoch())

    def __iter__(self) -> Iterator[List[int]]:
        return (mb for step in self._steps_of_epoch() for mb in step)

    def __len__(self) -> int:
        return sum(len(step) for step in self._steps_of_epoch())


class TokenBudgetBatchSampler(_StepSampler):
    """Yields rank ``rank``'s micro-batches (lists of sample indices) of each epoch; each
    micro-batch holds at most ``capacity`` tokens.

    ``lengths`` — tokens per sample (a sequence or array of ints), or a ``datasets.Dataset``
    (or ``pyarrow.Table``) whose ``length_column`` list lengths are read from its Arrow offsets
    (a packed dataset's rows work too). ``capacity`` — the hard cap (``1..``); a sample longer
    than it raises :class:`InfeasibleError` naming it (pack or truncate first). ``dp_size`` /
    ``rank`` — the data-parallel ranks and this one. ``batch_size`` — samples per optimizer
    step over all ranks, a multiple of ``dp_size`` (default: the whole epoch is one step).
    ``shuffle`` / ``seed`` — the epoch's order (``numpy`` PCG64 seeded by ``(seed, epoch)``, the
    same on every rank; steps' micro-batches are shuffled too); :meth:`set_epoch` sets the
    epoch. ``drop_last`` — drop a last step shorter than ``batch_size``; otherwise it is kept,
    padded with samples from the start of the epoch's order to a multiple of ``dp_size`` (as
    ``DistributedSampler`` pads; for :class:`PaddedBatchSampler` to at least
    ``accumulation_steps × dp_size`` samples too). ``cost`` — :func:`stowplan.balance`'s cost model for the rank
    balance (``"tokens"``, ``"attention"`` or ``(linear, quadratic)``); the cap is in tokens.

    Without padding (``len(lengths)`` a multiple of ``dp_size``, ``batch_size`` dividing it or
    ``drop_last`` False) every index comes once per epoch over the ranks. :meth:`steps` gives
    the same micro-batches grouped by step (gradient accumulation boundaries); ``len()`` is the
    number of micro-batches of this rank in the epoch, the same on every rank.
    """

    @renamed(max_tokens="capacity")
    def __init__(
        self,
        lengths: Any,
        capacity: int,
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
        super().__init__(
            lengths, dp_size=dp_size, rank=rank, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, length_column=length_column
        )
        self.capacity = _stowplan._integer(capacity, "capacity", 1, 2**63 - 1)
        self._check_cap(self.capacity)
        self.cost = cost
        self.backend = backend
        self._steps_of_epoch()  # checks cost and backend now, and plans epoch 0

    def _plan_step(self, samples: np.ndarray, rng: Any) -> List[List[int]]:
        plan = balance(self.lengths[samples], self.dp_size, capacity=self.capacity, cost=self.cost, backend=self.backend)
        mbs = [samples[b.astype(np.int64)].tolist() for b in plan.micro_batches[self.rank].batches]
        if self.shuffle:  # the same permutation on every rank (the counts agree)
            mbs = [mbs[j] for j in rng.permutation(len(mbs))]
        return mbs


#: :class:`PaddedBatchSampler`'s cost models: a micro-batch of ``bs`` samples padded to
#: ``m`` tokens costs ``bs·(linear·m + quadratic·m²)``. ``"attention"`` is
#: :func:`stowplan.balance`'s (``24576·L + L²`` a sample: the linear layers and a dense mask).
PADDED_COSTS = {"tokens": (1.0, 0.0), "attention": (24576.0, 1.0)}


class PaddedBatchSampler(_StepSampler):
    """Yields rank ``rank``'s micro-batches (lists of sample indices) of whole samples, each
    to be padded to its longest member (``PaddingFreeCollator(layout="padded")``): the layout
    for dense-mask attention (SDPA, eager), where a packed row of T tokens costs T², and for
    models that cannot pack (Mamba/SSM).

    Each optimizer step's ``batch_size`` samples (over all ranks) are sorted by length and cut
    into contiguous runs, so a micro-batch holds samples of like lengths: at most
    ``capacity`` padded tokens (``bs · max_len``) each, and as few micro-batches as that cap
    allows, rounded up to the same number on every rank — or exactly ``accumulation_steps``
    per rank when given (``InfeasibleError`` if the cap needs more). Among the cuts into that
    many runs, the one whose costliest micro-batch is cheapest is taken (a bisection on the
    cost, exact for contiguous runs), under ``cost``: :data:`PADDED_COSTS` (``"attention"``,
    the default, or ``"tokens"``) or ``(linear, quadratic)``. The micro-batches are then
    balanced over the ranks by the kernel (:func:`stowplan.balance`, the same count on
    each) and every rank's taken in descending cost, so that the ranks' ``j``-th micro-batches
    (the same accumulation slot) cost alike; with ``shuffle`` the slots' order is shuffled.

    ``lengths``, ``dp_size``, ``rank``, ``batch_size``, ``shuffle``, ``seed``, ``drop_last``,
    ``length_column``, :meth:`set_epoch`, :meth:`steps` and ``len()`` are as in
    :class:`TokenBudgetBatchSampler`. A ``transformers.Trainer`` takes it as it takes its own
    ``BatchRebalanceSampler`` (it is one, where transformers has it): return it from
    ``_get_train_sampler``, with ``accumulation_steps`` = ``gradient_accumulation_steps`` so
    that the trainer's steps are the sampler's.

    >>> s = PaddedBatchSampler([100, 900, 50, 950, 400, 600, 10, 20], 2000, dp_size=2, shuffle=False)
    >>> [[[100, 900, 50, 950, 400, 600, 10, 20][i] for i in mb] for mb in s]   # rank 0
    [[950], [900]]
    """

    @renamed(max_tokens="capacity")
    def __init__(
        self,
        lengths: Any,
        capacity: int,
        *,
        dp_size: int = 1,
        rank: int = 0,
        batch_size: Optional[int] = None,
        accumulation_steps: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        cost: Any = "attention",
        length_column: str = DEFAULT_LENGTH_COLUMN,
        backend: Optional[str] = None,
    ) -> None:
        super().__init__(
            lengths, dp_size=dp_size, rank=rank, batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, length_column=length_column
        )
        self.capacity = _stowplan._integer(capacity, "capacity", 1, 2**63 - 1)
        self._check_cap(self.capacity)
        if self.lengths.size and int(self.lengths.min()) < 1:
            i = int(np.argmin(self.lengths))
            raise InvalidArgumentError(f"lengths[{i}] is 0: a padded micro-batch holds samples of at least one token")
        if accumulation_steps is not None:
            accumulation_steps = _stowplan._integer(accumulation_steps, "accumulation_steps", 1, 2**20)
            if self.batch_size < accumulation_steps * self.dp_size:
                raise InvalidArgumentError(
                    f"batch_size = {self.batch_size} samples cannot fill accumulation_steps = {accumulation_steps} "
                    f"micro-batches on each of dp_size = {self.dp_size} ranks: at least {accumulation_steps * self.dp_size}"
                )
        self.accumulation_steps = accumulation_steps
        if isinstance(cost, str) and cost in PADDED_COSTS:
            self.cost = PADDED_COSTS[cost]
        elif (
            isinstance(cost, tuple)
            and len(cost) == 2
            and all(isinstance(c, (int, float)) and not isinstance(c, bool) and 0 <= c < float("inf") for c in cost)
            and sum(cost) > 0
        ):
            self.cost = (float(cost[0]), float(cost[1]))
        else:
            raise InvalidArgumentError(
                f"cost must be 'attention', 'tokens' or (linear, quadratic), two numbers >= 0 not both 0 (got {cost!r})"
            )
        self.backend = backend
        self._steps_of_epoch()  # checks the backend now, and plans epoch 0

    def _least_step(self) -> int:
        return self.dp_size * (self.accumulation_steps or 1)

    def _one(self, m: int) -> float:
        """The cost of one sample padded to ``m`` tokens."""
        return self.cost[0] * m + self.cost[1] * m * m

    def _runs(self, lengths: np.ndarray, limit: float, most: int) -> Optional[List[int]]:
        """The starts of the fewest contiguous runs of ``lengths`` (descending) with at most
        ``capacity`` padded tokens and cost at most ``limit`` each; None beyond ``most`` runs."""
        starts: List[int] = []
        i, n = 0, int(lengths.size)
        while i < n:
            if len(starts) == most:
                return None
            m = int(lengths[i])
            take = min(self.capacity // m, int(limit // self._one(m)) if limit < float("inf") else n)
            if take < 1:
                return None
            starts.append(i)
            i += take
        return starts

    def _plan_step(self, samples: np.ndarray, rng: Any) -> List[List[int]]:
        dp = self.dp_size
        order = samples[np.argsort(-self.lengths[samples], kind="stable")]
        lengths = self.lengths[order]
        n = int(lengths.size)
        fewest = len(self._runs(lengths, float("inf"), n) or [])
        if self.accumulation_steps is not None:
            count = self.accumulation_steps * dp
            if fewest > count:
                raise InfeasibleError(
                    f"a step's {n} samples need at least {fewest} micro-batches of capacity = {self.capacity} padded tokens, "
                    f"more than accumulation_steps = {self.accumulation_steps} on each of {dp} ranks: raise capacity or accumulation_steps"
                )
        else:
            count = fewest + (-fewest) % dp
        # The least limit on a micro-batch's cost that cuts into at most `count` runs.
        low = max(self._one(int(m)) for m in lengths[:1]) if n else 0.0
        high = max(low, self._one(int(lengths[0])) * n)
        for _ in range(100):
            if high - low <= max(1e-9 * high, 1e-12):
                break
            mid = (low + high) / 2
            if self._runs(lengths, mid, count) is None:
                low = mid
            else:
                high = mid
        starts = self._runs(lengths, high, count) or [0]
        runs = [order[a:b] for a, b in zip(starts, starts[1:] + [n])]
        while len(runs) < count:  # more micro-batches than needed: halve the costliest
            j = max((k for k in range(len(runs)) if len(runs[k]) > 1), key=lambda k: self._cost_of(runs[k]))
            half = len(runs[j]) // 2
            runs[j : j + 1] = [runs[j][:half], runs[j][half:]]
        costs = np.array([self._cost_of(r) for r in runs])
        scale = max(1.0, float(costs.max()) / 2**40)  # integer weights for the kernel
        plan = balance(np.maximum(1, np.round(costs / scale)).astype(np.int64), dp, equal_count=True, backend=self.backend)
        mine = sorted(plan.ranks[self.rank].astype(np.int64).tolist(), key=lambda k: -costs[k])
        slots = rng.permutation(len(mine)) if self.shuffle else np.arange(len(mine))
        return [runs[mine[j]].tolist() for j in slots]

    def _cost_of(self, run: np.ndarray) -> float:
        """A micro-batch's cost: its samples all padded to the longest."""
        return len(run) * self._one(int(self.lengths[run].max()))


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
        from ._rows import check_columns, column_lengths

        if not isinstance(column, str):
            raise InvalidArgumentError(f"length_column must be a column name (got {column!r})")
        names = check_columns(table, [column], False)
        return column_lengths(table, names)
    return as_int64(lengths, "lengths", 0)
