"""Stubs of ``stowplan._stowplan``: micro-batches and DP balancing (``src/balance.rs``)."""

from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

import numpy as np
import numpy.typing as npt

from ._records import _DpPlan, _MicroPlan
from ._types import _Cost, _Lengths

class MicroBatches(_MicroPlan):
    """Micro-batches of one batch (the result of :func:`micro_batches`, or one rank's part
    of a :class:`Balance`).

    Index spaces: ``indices`` and ``batches`` hold positions in the ``lengths`` the call was
    given — from :func:`micro_batches`, indices into its ``lengths``; in
    ``Balance.micro_batches[r]``, **global** sample indices of the balanced batch (not
    positions in rank ``r``'s own batch: ``stowplan.rank_micro_batches(plan, r)`` gives
    those). ``restore`` is local in both: positions in the concatenated micro-batches, one
    per input of the call (of ``Balance.ranks[r]``, in that order, in a :class:`Balance`)."""

    count: int
    @property
    def batches(self) -> List[npt.NDArray[np.uint32]]: ...
    @property
    def token_balance(self) -> Dict[str, Union[int, float]]: ...
    @property
    def cost_balance(self) -> Dict[str, Union[int, float]]: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[npt.NDArray[np.uint32]]: ...

def micro_batches(
    lengths: _Lengths,
    capacity: Optional[int] = None,
    *,
    cost: Optional[_Cost] = None,
    min_count: Optional[int] = None,
    divisible_by: Optional[int] = None,
    count: Optional[int] = None,
    order: Optional[str] = None,
    extra_costs: Optional[_Lengths] = None,
    resources: Optional[Dict[str, _Lengths]] = None,
    limits: Optional[Dict[str, int]] = None,
    backend: Optional[str] = None,
    max_token_len: Optional[int] = None,
) -> MicroBatches:
    """``capacity``: the tokens of a micro-batch, at most (required; ``max_token_len`` is its
    former name, deprecated). ``cost``: ``"tokens"`` (default), ``"attention"`` or ``(linear, quadratic)``;
    ``order``: ``"none"`` (default), ``"cost_desc"``, ``"verl"`` or ``"roll"``;
    ``resources``/``limits``: further caps per micro-batch (name → sizes, name → cap). The
    result's indices are positions in ``lengths`` (one rank's batch gives local indices)."""

class Balance(_DpPlan):
    """A global batch over DP ranks (the result of :func:`balance`).

    Index spaces: ``order``, ``ranks[r]`` and ``micro_batches[r].batches`` hold **global**
    sample indices (positions in the ``lengths`` given to :func:`balance`). A rank that
    holds only its own samples, ``batch[ranks[r]]``, slices them with
    ``stowplan.rank_micro_batches(plan, r)`` (rank-local positions); ``micro_batches[r].restore``
    is rank-local already."""

    micro_batches: Optional[List[MicroBatches]]
    count: Optional[int]
    dp: int
    lengths: npt.NDArray[Any]
    @property
    def ranks(self) -> List[npt.NDArray[np.uint32]]: ...
    @property
    def token_balance(self) -> Dict[str, Union[int, float]]: ...
    @property
    def cost_balance(self) -> Dict[str, Union[int, float]]: ...
    def log_seqlen_unbalance(self, prefix: str = "global_seqlen") -> Dict[str, Union[int, float]]: ...
    def __len__(self) -> int: ...

def balance(
    lengths: _Lengths,
    dp: int,
    *,
    cost: Optional[_Cost] = None,
    capacity: Optional[int] = None,
    groups: Optional[Iterable[Any]] = None,
    group_size: Optional[int] = None,
    minibatch_size: Optional[int] = None,
    equal_count: Optional[bool] = None,
    min_count: Optional[int] = None,
    divisible_by: Optional[int] = None,
    count: Optional[int] = None,
    order: Optional[str] = None,
    extra_costs: Optional[_Lengths] = None,
    resources: Optional[Dict[str, _Lengths]] = None,
    limits: Optional[Dict[str, int]] = None,
    backend: Optional[str] = None,
    max_token_len: Optional[int] = None,
) -> Balance:
    """DP balancing, and with ``capacity`` (``max_token_len``: its former name, deprecated) the micro-batches of every rank (global
    sample indices; see :class:`Balance`). ``groups``: one label per sample (any hashable,
    e.g. uids; numpy arrays too); samples with the same label stay on one rank (equal counts
    need groups of one size and a group count divisible by ``dp``). ``group_size=G``: the
    CLI's ``--group-size``, runs of ``G`` consecutive samples (``groups=[i // G ...]``)."""

def rank_micro_batches(plan: Balance, rank: int, *, local: bool = True) -> List[npt.NDArray[np.uint32]]:
    """Rank ``rank``'s micro-batches of ``plan`` (made with ``capacity``): rank-local
    positions (into ``batch[plan.ranks[rank]]``), or with ``local=False`` global indices."""
