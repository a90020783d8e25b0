"""Packed rows of Arrow tables, the part :mod:`stowplan.arrow`, :mod:`stowplan.hf`,
:mod:`stowplan.ray` and :mod:`stowplan.compat.trl` share: the checks of a table and its
columns, the host's plan of the packed rows (``stowplan::rows``), and the one assembly of the
packed rows from the columns' own chunks (:class:`Flat`, :func:`assemble`): the host's
(``stowplan-arrow``, the CLI's code), on pyarrow's buffers through the Arrow C Data
Interface. Package-internal:
its names are public so that the modules sharing them import no private name.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from . import _stowplan
from .errors import InvalidArgumentError

def check_rows(rows: int) -> None:
    """Refuses a table (or dataset) without rows: there is nothing to pack."""
    if rows == 0:
        raise InvalidArgumentError("the table is empty: there are no rows to pack")


def pack(
    table: Any,
    capacity: int,
    strategy: str,
    overflow: Optional[str],
    columns: Optional[Sequence[str]],
    position_ids: bool,
    backend: Optional[str],
) -> Tuple[Any, str]:
    """:func:`pack_table`'s rows as a ``RecordBatchReader`` (each batch assembled by the host
    as it is read, so that a writer holds one at a time) and the sha256 of its plan and options
    (for fingerprints): one native call (``_stowplan.pack_table``: the table's buffers read
    through the Arrow C Data Interface, checked, planned and assembled by the host, the CLI's
    ``pack-dataset`` code). The arguments are checked and the plan made before it returns."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise InvalidArgumentError(f"table must be a pyarrow.Table or RecordBatch (got {type(table).__name__})")
    if not isinstance(position_ids, bool):
        raise InvalidArgumentError(f"position_ids must be True or False (got {position_ids!r})")
    capacity = _stowplan._integer(capacity, "capacity", 1, _stowplan.MAX_CAPACITY)
    strategy, overflow = check_strategy(strategy, overflow)
    check_rows(table.num_rows)
    stream, digest = _stowplan.pack_table(
        table, capacity, strategy, overflow=overflow, columns=columns, position_ids=position_ids, backend=backend
    )
    return pa.RecordBatchReader.from_stream(stream), digest


def check_strategy(strategy: Any, overflow: Any) -> Tuple[str, Optional[str]]:
    """The strategy's name and its overflow policy, checked together by the host."""
    return _stowplan.row_packing(strategy, overflow)


def check_columns(table: Any, columns: Optional[Sequence[str]], position_ids: bool) -> List[str]:
    """The list columns of ``table`` (or of a ``pyarrow.Schema``) to pack, checked by the
    host (``stowplan_arrow::select``, as the CLI checks them)."""
    schema = table if isinstance(table, pa.Schema) else table.schema
    return _stowplan.check_columns(schema, columns, position_ids)


def column_lengths(table: Any, names: List[str], row0: int = 0) -> np.ndarray:
    """The first column's per-row lengths (int64), every column checked for nulls and against
    them by the host; errors number the rows from ``row0`` (a stream's batch numbers its rows
    in the stream)."""
    return _stowplan.column_lengths(table, names, row0)


def plan_items(
    lengths: np.ndarray, capacity: int, strategy: str, overflow: Optional[str], first: str, backend: Optional[str]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed rows of rows of ``lengths`` tokens (flat in row order): items (flat start,
    length) in output order and each output row's item offsets, by the host's
    ``stowplan::pack_rows`` (errors name column ``first`` and the row). Shared with
    :func:`stowplan.ray.pack_dataset`, which assembles the same items on the cluster."""
    return _stowplan.pack_rows(lengths, capacity, strategy, overflow, first, backend)


def row_items(lengths: np.ndarray, capacity: int, overflow: Optional[str], first: str, row0: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """The items to pack, in row order: (start in the flat values, length) of every non-empty
    row under ``overflow`` (truncated, cut into fragments, dropped when long, or refused with
    the row numbered from ``row0``), by the host's ``stowplan::rows::row_items``."""
    return _stowplan.row_items(lengths, capacity, overflow or _stowplan.DEFAULT_OVERFLOW, first, row0)


def wrapped_rows(lengths: np.ndarray, capacity: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every token in row order cut into rows of capacity: the items are the pieces of the
    sequences between sequence ends and row cuts (the host's ``stowplan::rows::wrapped_rows``)."""
    return _stowplan.wrapped_rows(lengths, capacity)


class Flat:
    """A column's flat values as chunks (never combined: no copy of the input), which the
    host's assembly reads in place."""

    def __init__(self, chunks: List[Any], type_: Any) -> None:
        self.type = type_
        self.chunks = [c for c in chunks if len(c)]
        self.bases = np.concatenate(([0], np.cumsum([len(c) for c in self.chunks]))).astype(np.int64)

    @classmethod
    def of(cls, values: Any) -> "Flat":
        """The flat values of an Array or ChunkedArray."""
        return cls(values.chunks if isinstance(values, pa.ChunkedArray) else [values], values.type)

    @classmethod
    def join(cls, flats: List["Flat"]) -> "Flat":
        """One after the other (no copy)."""
        return cls([c for f in flats for c in f.chunks], flats[0].type)

    def __len__(self) -> int:
        return int(self.bases[-1])

    def view(self, start: int, length: int) -> "Flat":
        """Values ``start..start+length`` (no copy)."""
        pieces = []
        c = int(np.searchsorted(self.bases, start, side="right")) - 1
        while length > 0:
            at = start - int(self.bases[c])
            n = min(length, len(self.chunks[c]) - at)
            pieces.append(self.chunks[c].slice(at, n))
            start, length, c = start + n, length - n, c + 1
        return Flat(pieces, self.type)


def assemble(
    values: Dict[str, "Flat"],
    types: Dict[str, Any],
    starts: np.ndarray,
    item_lengths: np.ndarray,
    bin_offsets: np.ndarray,
    position_ids: bool,
) -> Any:
    """The packed rows as a ``pyarrow.RecordBatchReader`` (``read_all()``: the table, one
    chunk per batch): row r holds items bin_offsets[r]..bin_offsets[r+1] (an item is the
    ``item_lengths`` values from ``starts`` in every column's flat values, a :class:`Flat`,
    of list type ``types[name]``), assembled by the host as :func:`pack` assembles them
    (``_stowplan.assemble_rows``), in batches of at most ``PACKED_BATCH_TOKENS`` tokens (or
    one row), each built when it is read."""
    names = list(values)
    stream = _stowplan.assemble_rows(
        names,
        [types[n] for n in names],
        [values[n].chunks for n in names],
        np.ascontiguousarray(starts, dtype=np.int64),
        np.ascontiguousarray(item_lengths, dtype=np.int64),
        np.ascontiguousarray(bin_offsets, dtype=np.int64),
        position_ids=position_ids,
    )
    return pa.RecordBatchReader.from_stream(stream)
