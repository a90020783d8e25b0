"""stowplan: plan how variable-length sequences are packed into micro-batches and spread
over ranks.

The algorithms run in stowplan's WebAssembly kernel (through the Rust host and wasmtime);
this package only converts inputs and outputs. Every call releases the GIL and is safe to
make from several threads; contiguous ``uint64``/``int64`` inputs are read in place, so do
not modify an input array from another thread while a call on it runs.

>>> import stowplan
>>> p = stowplan.partition([100, 900, 50, 950, 400, 600], 2)
>>> p.groups, p.sums.tolist(), p.spread
([[0, 2, 3, 4], [1, 5]], [1500, 1500], 0)
>>> b = stowplan.pack([5, 3, 7, 2, 6], 10, method="ffd")
>>> b.bins, b.loads.tolist()
([[1, 2], [3, 4], [0]], [10, 8, 5])
>>> mb = stowplan.micro_batches([100, 900, 50, 950, 400, 600], 2000, cost="attention")
>>> mb.count, mb.tokens.tolist()
(2, [1500, 1500])
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from . import _stowplan
from ._balance import COSTS, Balance, MicroBatches, balance, micro_batches
from ._convert import as_lengths, check_int
from ._layout import CpLayout, Materialized, MicroBatch, cp_layout, materialize, pad_factor
from ._plan import (
    LengthCache,
    PackedDataset,
    PackingConfig,
    StaticPackPlan,
    compute_lengths,
    plan_dataset,
)
from ._filter import Filter
from ._packer import FileReceiver, FileSender, IngestReport, Packer, RankBatch, TrainingBatch
from ._zmq import ZmqReceiver, ZmqSender
from ._source import BufferedDataSource, DataSource, Sample
from . import errors as _errors
from .errors import *  # noqa: F401,F403  (every class of errors.__all__)

__version__: str = _stowplan.__version__

__all__ = [
    "partition",
    "pack",
    "Partition",
    "Packing",
    "micro_batches",
    "balance",
    "MicroBatches",
    "Balance",
    "COSTS",
    "pad_factor",
    "cp_layout",
    "CpLayout",
    "materialize",
    "Materialized",
    "MicroBatch",
    "StaticPackPlan",
    "PackedDataset",
    "PackingConfig",
    "LengthCache",
    "compute_lengths",
    "plan_dataset",
    "DataSource",
    "BufferedDataSource",
    "Sample",
    "Filter",
    "Packer",
    "IngestReport",
    "TrainingBatch",
    "RankBatch",
    "FileSender",
    "FileReceiver",
    "ZmqSender",
    "ZmqReceiver",
    "kernel_info",
] + _errors.__all__

_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1


def _lists(offsets: np.ndarray, indices: np.ndarray) -> List[List[int]]:
    flat = indices.tolist()
    bounds = offsets.tolist()
    return [flat[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


class Partition:
    """The result of :func:`partition`: ``k`` groups of input indices.

    Attributes:
        offsets: ``uint32`` array of ``k + 1`` boundaries into ``indices``.
        indices: ``uint32`` array of every input index once, group after group.
        sums: ``uint64`` array, the sum of each group's weights.
        total: sum of all weights.
        spread: largest group sum minus smallest.
        lower_bound: ``max(ceil(total / k), largest weight)``; no partition's largest group
            is lighter.
    """

    __slots__ = ("offsets", "indices", "sums", "total", "spread", "lower_bound", "_groups")

    def __init__(self, offsets: np.ndarray, indices: np.ndarray, sums: np.ndarray, total: int, spread: int, lower_bound: int) -> None:
        self.offsets = offsets
        self.indices = indices
        self.sums = sums
        self.total = total
        self.spread = spread
        self.lower_bound = lower_bound
        self._groups: Optional[List[List[int]]] = None

    @property
    def groups(self) -> List[List[int]]:
        """The groups as lists of input indices (built on first access)."""
        if self._groups is None:
            self._groups = _lists(self.offsets, self.indices)
        return self._groups

    @property
    def k(self) -> int:
        """The number of groups."""
        return len(self.offsets) - 1

    @property
    def max(self) -> int:
        """The heaviest group's sum."""
        return int(self.sums.max()) if len(self.sums) else 0

    def __len__(self) -> int:
        return self.k

    def __repr__(self) -> str:
        return f"Partition(k={self.k}, total={self.total}, max={self.max}, spread={self.spread}, lower_bound={self.lower_bound})"


class Packing:
    """The result of :func:`pack`: bins of input indices.

    Attributes:
        offsets: ``uint32`` array of ``bins + 1`` boundaries into ``indices``.
        indices: ``uint32`` array of the packed input indices, bin after bin, ascending in a bin.
        loads: ``uint64`` array, each bin's aligned load (≤ capacity except oversized singles).
        dropped: ``uint32`` array of indices left out under ``oversize="drop"``.
        single: ``uint32`` array of oversized indices placed alone under ``oversize="single"``.
        real_tokens: sum of the real lengths packed.
        aligned_tokens: sum of the aligned lengths packed.
        lower_bound: ``ceil(aligned lengths that fit / capacity)``, the fewest bins possible
            for those items (single bins come on top).
        efficiency: real tokens of the regular (non-single) bins over their capacity, 0..1.
        capacity: the capacity the bins were packed to.
    """

    __slots__ = ("offsets", "indices", "loads", "dropped", "single", "real_tokens", "aligned_tokens", "lower_bound", "efficiency", "capacity", "_bins")

    def __init__(self, offsets: np.ndarray, indices: np.ndarray, loads: np.ndarray, dropped: np.ndarray, single: np.ndarray, real_tokens: int, aligned_tokens: int, lower_bound: int, efficiency: float, capacity: int) -> None:
        self.offsets = offsets
        self.indices = indices
        self.loads = loads
        self.dropped = dropped
        self.single = single
        self.real_tokens = real_tokens
        self.aligned_tokens = aligned_tokens
        self.lower_bound = lower_bound
        self.efficiency = efficiency
        self.capacity = capacity
        self._bins: Optional[List[List[int]]] = None

    @property
    def bins(self) -> List[List[int]]:
        """The bins as lists of input indices (built on first access)."""
        if self._bins is None:
            self._bins = _lists(self.offsets, self.indices)
        return self._bins

    @property
    def num_bins(self) -> int:
        """The number of bins."""
        return len(self.offsets) - 1

    @property
    def padding_tokens(self) -> int:
        """Alignment padding: aligned tokens minus real tokens."""
        return self.aligned_tokens - self.real_tokens

    def __len__(self) -> int:
        return self.num_bins

    def __repr__(self) -> str:
        return f"Packing(bins={self.num_bins}, lower_bound={self.lower_bound}, real_tokens={self.real_tokens}, dropped={len(self.dropped)}, single={len(self.single)})"


def partition(weights: Any, k: int, *, equal_size: bool = False, method: str = "kk", refine: Optional[bool] = None, backend: str = "wasm") -> Partition:
    """Splits ``weights`` (e.g. sequence lengths in tokens) into ``k`` groups with balanced sums.

    Args:
        weights: non-negative integers — a list, a numpy integer array (``uint64``/``int64``
            read without copying when contiguous), or anything with ``__array__``/DLPack such
            as a CPU torch tensor.
        k: number of groups, ``1 <= k <= len(weights)``.
        equal_size: every group gets ``len(weights) / k`` items (must divide).
        method: ``"kk"`` (Karmarkar–Karp, default), ``"greedy"`` (LPT) or ``"verl"`` (verl
            0.9.1's exact ``get_seqlen_balanced_partitions`` output).
        refine: improve ``kk``/``greedy`` by pairwise moves/swaps; default ``True`` except for
            ``"verl"``, which never refines.
        backend: ``"wasm"`` (default) or ``"native"`` (same kernel code, compiled natively).

    Returns:
        A :class:`Partition`: groups ordered by sum descending (ties: smallest member first),
        members ascending; verl's order for ``method="verl"``.

    Raises:
        InvalidArgumentError: ``k`` out of range, empty or negative weights, ``equal_size``
            with ``len(weights) % k != 0``, sums above ``2**64 - 1``, an unknown method …

    Example:
        >>> partition([3, 1, 2, 2], 2).groups
        [[0, 1], [2, 3]]
    """
    k = check_int(k, "k", 1, _U32_MAX)
    if refine is None:
        refine = method != "verl"
    arr = as_lengths(weights, "weights")
    return Partition(*_stowplan.partition(arr, k, method, bool(equal_size), bool(refine), backend))


def pack(lengths: Any, capacity: int, *, align: int = 1, method: str = "bfd", oversize: str = "error", backend: str = "wasm") -> Packing:
    """Packs ``lengths`` (tokens) into bins of at most ``capacity`` tokens.

    Args:
        lengths: non-negative integers (list, numpy array, CPU tensor, DLPack …).
        capacity: tokens per bin, ``>= 1``.
        align: each length is rounded up to a multiple of ``align`` (``>= 1``) first.
        method: ``"bfd"`` (best-fit decreasing, default), ``"ffd"`` (first-fit decreasing) or
            ``"next-fit"`` (keeps the input order).
        oversize: what to do with a length above ``capacity``: ``"error"`` (default, raises
            :class:`InfeasibleError`), ``"single"`` (its own bin) or ``"drop"`` (left out,
            listed in ``dropped``).
        backend: ``"wasm"`` (default) or ``"native"``.

    Returns:
        A :class:`Packing`; bins in creation order, members ascending.

    Example:
        >>> pack([5, 3, 7, 2, 6], 10).bins
        [[1, 2], [3, 4], [0]]
    """
    capacity = check_int(capacity, "capacity", 1, _U64_MAX)
    align = check_int(align, "align", 1, _U64_MAX)
    arr = as_lengths(lengths, "lengths")
    return Packing(*_stowplan.pack(arr, capacity, align, method, oversize, backend), capacity=capacity)


def kernel_info() -> dict:
    """The embedded kernel component's sha256 and its imports (always empty)."""
    sha256, imports = _stowplan.kernel_info()
    return {"sha256": sha256, "imports": imports}
