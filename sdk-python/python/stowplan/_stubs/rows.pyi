"""Stubs of ``stowplan._stowplan``: packed rows of Arrow tables (``src/arrow.rs``)."""

from typing import List, Optional, Sequence, Tuple

import numpy as np

from ._types import _Lengths

class PackedStream:
    """Packed rows as an Arrow C stream (``pyarrow.RecordBatchReader.from_stream`` reads it),
    each record batch assembled by the host when it is read; read once."""

    def __arrow_c_stream__(self, requested_schema: Optional[object] = None) -> object: ...
    def __len__(self) -> int: ...

def pack_table(
    table: object,
    capacity: int,
    strategy: str,
    *,
    overflow: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    position_ids: bool = False,
    backend: Optional[str] = None,
) -> Tuple[PackedStream, str]:
    """The rows of ``table`` (anything with ``__arrow_c_stream__``) checked, planned and
    assembled by the host in one call, and the sha256 of the options and plan."""
    ...

def assemble_rows(
    names: List[str],
    types: List[object],
    chunks: List[List[object]],
    starts: _Lengths,
    lengths: _Lengths,
    offsets: _Lengths,
    *,
    position_ids: bool = False,
) -> PackedStream:
    """Packed rows of given items (``starts``, ``lengths``; rows at ``offsets``) of every
    column's flat values (``chunks[c]``, pyarrow arrays of ``types[c]``'s values)."""
    ...

def check_columns(schema: object, columns: Optional[Sequence[str]] = None, position_ids: bool = False) -> List[str]:
    """The list columns of ``schema`` to pack (default: every column), checked by the host."""
    ...

def column_lengths(table: object, columns: Sequence[str], row0: int = 0) -> np.ndarray:
    """The rows' lengths of ``table``'s list ``columns`` (``int64``), every row checked;
    errors number rows from ``row0``."""
    ...

ROW_STRATEGIES: List[str]
OVERFLOWS: List[str]
DEFAULT_OVERFLOW: str
MAX_ROW_LENGTH: int
MAX_CAPACITY: int
PACKED_BATCH_TOKENS: int
SEQ_LENGTHS: str
POSITION_IDS: str

def row_packing(strategy: str, overflow: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """The strategy's name (``next_fit`` read as ``next-fit``) and its overflow policy
    (``None`` for ``wrapped``), checked together (stowplan.arrow's rules)."""
    ...

def pack_rows(
    lengths: _Lengths,
    capacity: int,
    strategy: str,
    overflow: Optional[str] = None,
    column: str = "",
    backend: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``lengths`` tokens packed into rows of at most ``capacity`` tokens: the
    items' flat starts and lengths in output order and each packed row's item offsets
    (``int64``); errors name ``column`` and the row."""
    ...

def row_items(
    lengths: _Lengths, capacity: int, overflow: str, column: str = "", row0: int = 0
) -> Tuple[np.ndarray, np.ndarray]:
    """The items (flat start, length) of rows of ``lengths`` tokens under ``overflow``, in
    row order (``int64``); errors number rows from ``row0``."""
    ...

def wrapped_rows(lengths: _Lengths, capacity: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every token cut into rows of ``capacity``: :func:`pack_rows`'s arrays for ``wrapped``."""
    ...

def trl_bfd(
    lengths: _Lengths, batch_ends: _Lengths, seq_length: int, backend: Optional[str] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """TRL's best fit decreasing map batch by map batch (batch ``j``: the sequences from
    ``batch_ends[j-1]`` (0 for the first) to before ``batch_ends[j]``): the bins' ``offsets`` and their members' ``indices`` in the order they
    went in (``int64``)."""
    ...
