"""Stubs of ``stowplan._stowplan``: partitions, packings, packing under several limits and the
streaming packer (``src/pack.rs``, ``src/multi.rs``, ``src/stream.rs``)."""

from typing import Dict, List, Mapping, Optional

import numpy as np
import numpy.typing as npt
from typing_extensions import Unpack

from ._options import _PackOptions, _PartitionOptions
from ._records import _Packing, _Partitioning
from ._types import _Lengths

class Partition(_Partitioning):
    """``k`` groups of input indices (the result of :func:`partition`)."""

    k: int
    max: int
    @property
    def groups(self) -> List[List[int]]: ...
    def __len__(self) -> int: ...

def partition(
    weights: _Lengths,
    k: int,
    *,
    backend: Optional[str] = None,
    **options: Unpack[_PartitionOptions],
) -> Partition:
    """``options``: the fields of :class:`_PartitionOptions` (the kernel's, with their docs)."""

class Packing(_Packing):
    """Bins of input indices (the result of :func:`pack`)."""

    padding_tokens: int
    efficiency: float
    capacity: int
    num_bins: int
    @property
    def bins(self) -> List[List[int]]: ...
    def __len__(self) -> int: ...

def pack(
    lengths: _Lengths,
    capacity: int,
    *,
    backend: Optional[str] = None,
    **options: Unpack[_PackOptions],
) -> Packing:
    """``options``: the fields of :class:`_PackOptions` (the kernel's, with their docs)."""

class MultiPacking:
    """Bins under several limits (the result of :func:`pack_multi`)."""

    packing: Packing
    names: List[str]
    resource_loads: npt.NDArray[np.uint64]
    lower_bounds: Dict[str, int]
    @property
    def bins(self) -> List[List[int]]: ...
    @property
    def lower_bound(self) -> int: ...
    def __len__(self) -> int: ...

def pack_multi(
    columns: Mapping[str, _Lengths],
    capacities: Mapping[str, int],
    *,
    max_segments: Optional[int] = None,
    align: Optional[int] = None,
    method: Optional[str] = None,
    oversize: Optional[str] = None,
    backend: Optional[str] = None,
) -> MultiPacking:
    """``columns``: each resource's sizes, tokens first; ``capacities``: each one's capacity
    per bin (the same names); ``max_segments``: items per bin at most; ``method``:
    ``"balanced"`` (default), ``"bfd"``, ``"ffd"`` or ``"next_fit"``."""

STREAM_DEFAULTS: Dict[str, int]

class StreamPacker:
    """A streaming bin packer (bins close as lengths arrive; bounded memory)."""

    def __init__(
        self,
        capacity: int,
        *,
        max_open_bins: Optional[int] = None,
        max_buffered: Optional[int] = None,
        align: Optional[int] = None,
        oversize: Optional[str] = None,
        limits: Optional[Dict[str, int]] = None,
        max_segments: Optional[int] = None,
        backend: Optional[str] = None,
    ) -> None:
        """``max_open_bins`` 1..=65536 (default 64), ``max_buffered`` 0..=1048576 (default
        4096), ``oversize`` — what a length above ``capacity`` does: ``"error"`` (default;
        :class:`InfeasibleError`, nothing of the call applied), ``"single"`` (a bin of its
        own) or ``"drop"`` (left out, listed in :attr:`last_dropped`). Real SFT and
        pretraining streams have such lengths: pass ``"drop"`` or ``"single"``. ``limits``
        (name → cap per bin) and ``max_segments``: further limits per bin."""
    @staticmethod
    def from_state(state: bytes, *, backend: Optional[str] = None) -> StreamPacker: ...
    def add(self, lengths: _Lengths, *, resources: Optional[Dict[str, _Lengths]] = None) -> List[List[int]]: ...
    def finish(self) -> List[List[int]]: ...
    def state(self) -> bytes: ...
    @property
    def limits(self) -> Dict[str, int]: ...
    @property
    def max_segments(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def max_open_bins(self) -> int: ...
    @property
    def max_buffered(self) -> int: ...
    @property
    def align(self) -> int: ...
    @property
    def oversize(self) -> str: ...
    @property
    def next_index(self) -> int: ...
    @property
    def buffered(self) -> int: ...
    @property
    def open_bins(self) -> int: ...
    @property
    def in_open_bins(self) -> int: ...
    @property
    def oldest_held(self) -> Optional[int]: ...
    @property
    def last_dropped(self) -> List[int]: ...
