"""stowplan: plan how variable-length sequences are packed into micro-batches and spread
over ranks.

The algorithms run in stowplan's WebAssembly kernel (through the Rust host and wasmtime);
this package only converts inputs and outputs. Every call releases the GIL and is safe to
make from several threads; contiguous ``uint64``/``int64`` inputs are read in place, so do
not modify an input array from another thread while a call on it runs.

Options are keyword-only; an omitted option (or ``None``) takes the host's default, and
option names are the kernel's (``"next-fit"``, also spelled ``"next_fit"``). Results are
read-only objects whose arrays are numpy arrays owning the Rust vectors.

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
>>> b = stowplan.balance([100, 900, 50, 950, 400, 600], 2)
>>> b.token_balance["max"], b.log_seqlen_unbalance()["global_seqlen/balanced_max"]
(1550, 1550)
>>> stowplan.COSTS["attention"]
(24576, 1)
>>> p
Partition(k=2, total=3000, max=1500, spread=0, lower_bound=1500)

Trainer layout: alignment factors, context-parallel layouts and materialized micro-batches.

>>> lay = stowplan.cp_layout([2, 4, 6, 1], cp=2)          # padded to multiples of 2·cp = 4
>>> row = list(range(lay.padded_tokens))
>>> [part.tolist() for part in lay.split(row)]            # what every CP rank receives
[[0, 3, 4, 7, 8, 9, 14, 15, 16, 19], [1, 2, 5, 6, 10, 11, 12, 13, 17, 18]]
>>> lay.unpack(lay.split(row)).tolist() == row
True
>>> samples = [{"prompt_ids": [1, 2], "completion_ids": [3], "advantage": 1.0}] * 3
>>> m = stowplan.materialize(samples, capacity=8, dp=2)
>>> m.per_rank, m.real_tokens, m.packed, m.splits, m.dummies
(1, 9, 2, 0, 0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import _stowplan

# Partitions, packings, balances and trainer layouts are computed and held by the native
# module; their results are its frozen classes (numpy arrays owned without a copy), exported
# as they are (documented in ``_stowplan.pyi``).
from ._stowplan import (
    Balance,
    CpLayout,
    MaterializedBatch,
    Materialized,
    MicroBatches,
    MultiPacking,
    Packing,
    Partition,
    StreamPacker,
    balance,
    cp_layout,
    kernel_info,
    materialize,
    micro_batches,
    pack,
    pack_multi,
    pad_factor,
    partition,
    rank_micro_batches,
)
from ._fields import Payload, cp_slice, gather_payload, gather_tokens
from ._plan import (
    LengthCache,
    PackedDataset,
    PackingConfig,
    StaticPackPlan,
    compute_lengths,
    plan_dataset,
)
from ._filter import Filter
from ._packer import FileRankClient, FileSender, IngestReport, Packer, RankBatch, TrainingBatch
from ._zmq import ZmqRankClient, ZmqSender
from ._source import BufferedDataSource, DataSource, RolloutSample
from . import errors as _errors
from .errors import *  # noqa: F401,F403  (every class of errors.__all__)

__version__: str = _stowplan.__version__

#: The kernel's named cost models: a sequence of ``L`` tokens costs ``linear·L + quadratic·L²``.
COSTS = _stowplan.COST_PRESETS

#: Former names (ARCHITECTURE.md, "Names across Rust, Python and JavaScript"), kept for a
#: while: each use warns with ``DeprecationWarning`` and names its replacement.
_RENAMED = {
    "ZmqReceiver": "ZmqRankClient",
    "FileReceiver": "FileRankClient",
    "Sample": "RolloutSample",
    "MicroBatch": "MaterializedBatch",
}

if TYPE_CHECKING:  # what type checkers see of the former names (at run time: __getattr__)
    ZmqReceiver = ZmqRankClient
    FileReceiver = FileRankClient
    Sample = RolloutSample
    MicroBatch = MaterializedBatch


def __getattr__(name: str) -> object:
    # PackedIterableDataset imports torch (when installed) for its base class: only on use.
    if name == "PackedIterableDataset":
        from ._stream import PackedIterableDataset

        return PackedIterableDataset
    if name in _RENAMED:
        import warnings

        new = _RENAMED[name]
        warnings.warn(f"stowplan.{name} is now stowplan.{new}", DeprecationWarning, stacklevel=2)
        return globals()[new]
    raise AttributeError(f"module 'stowplan' has no attribute {name!r}")

__all__ = [
    "partition",
    "pack",
    "pack_multi",
    "Partition",
    "Packing",
    "MultiPacking",
    "StreamPacker",
    "PackedIterableDataset",
    "micro_batches",
    "balance",
    "rank_micro_batches",
    "MicroBatches",
    "Balance",
    "COSTS",
    "pad_factor",
    "cp_layout",
    "CpLayout",
    "materialize",
    "gather_tokens",
    "cp_slice",
    "gather_payload",
    "Payload",
    "Materialized",
    "MaterializedBatch",
    "StaticPackPlan",
    "PackedDataset",
    "PackingConfig",
    "LengthCache",
    "compute_lengths",
    "plan_dataset",
    "DataSource",
    "BufferedDataSource",
    "RolloutSample",
    "Filter",
    "Packer",
    "IngestReport",
    "TrainingBatch",
    "RankBatch",
    "FileSender",
    "FileRankClient",
    "ZmqSender",
    "ZmqRankClient",
    "kernel_info",
] + _errors.__all__
