"""Packed rows of Arrow tables, the part :mod:`stowplan.arrow`, :mod:`stowplan.hf`,
:mod:`stowplan.ray` and :mod:`stowplan.compat.trl` share: the checks of a table and its
columns, the host's plan of the packed rows (``stowplan::rows``), and the one assembly of the
packed rows from the columns' own chunks (:class:`Flat`, :func:`assemble`). Package-internal:
its names are public so that the modules sharing them import no private name.
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import _stowplan
from .errors import InvalidArgumentError

#: Tokens per output record batch (the host's; the CLI's pack-dataset cuts its batches so too).
BATCH_TOKENS = _stowplan.PACKED_BATCH_TOKENS


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
    """:func:`pack_table`'s rows as a ``RecordBatchReader`` (each batch assembled as it is
    read, so that a writer holds one at a time) and the sha256 of its plan and options (for
    fingerprints). The arguments are checked and the plan made before it returns."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise InvalidArgumentError(f"table must be a pyarrow.Table or RecordBatch (got {type(table).__name__})")
    capacity = _stowplan._integer(capacity, "capacity", 1, _stowplan.MAX_CAPACITY)
    strategy, overflow = check_strategy(strategy, overflow)
    if not isinstance(position_ids, bool):
        raise InvalidArgumentError(f"position_ids must be True or False (got {position_ids!r})")
    names = check_columns(table, columns, position_ids)
    check_rows(table.num_rows)
    if table.num_rows > _stowplan.MAX_ROW_LENGTH:
        raise InvalidArgumentError(f"the table has {table.num_rows} rows; at most 2**32-1 can be packed at once")
    lengths = column_lengths(table, names)
    starts, item_lengths, bin_offsets = plan_items(lengths, capacity, strategy, overflow, names[0], backend)
    digest = hashlib.sha256()
    digest.update(repr((capacity, strategy, overflow, names, position_ids)).encode())
    for a in (starts, item_lengths, bin_offsets):
        digest.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    values = {name: Flat.of(pc.list_flatten(table.column(name))) for name in names}
    types = {name: table.schema.field(name).type for name in names}
    packed = assemble(values, types, starts, item_lengths, bin_offsets, position_ids, contiguous=strategy == "wrapped")
    return packed, digest.hexdigest()


def check_strategy(strategy: Any, overflow: Any) -> Tuple[str, Optional[str]]:
    """The strategy's name and its overflow policy, checked together by the host."""
    return _stowplan.row_packing(strategy, overflow)


def check_columns(table: Any, columns: Optional[Sequence[str]], position_ids: bool) -> List[str]:
    if columns is None:
        names = list(table.column_names)
    elif isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise InvalidArgumentError(f"columns must be a list of column names (got {columns!r})")
    else:
        names = list(columns)
    if not names:
        raise InvalidArgumentError("columns must name at least one list column")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"columns must not repeat a name (got {names!r})")
    present = set(table.column_names)
    for name in names:
        if name not in present:
            raise InvalidArgumentError(f"column {name!r} is not in the table (its columns: {table.column_names})")
    if len(set(table.column_names)) != len(table.column_names):
        raise InvalidArgumentError(f"the table has duplicate column names: {table.column_names}")
    reserved = [_stowplan.SEQ_LENGTHS] + ([_stowplan.POSITION_IDS] if position_ids else [])
    for name in names:
        if name in reserved:
            raise InvalidArgumentError(
                f"column {name!r} is an output column of packing; drop it or leave it out of columns=[...]"
            )
        t = table.schema.field(name).type
        if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
            hint = "" if columns is not None else "; pass columns=[...] to pack only the list columns"
            raise InvalidArgumentError(f"column {name!r} is not a list column (its type is {t}){hint}")
    return names


def column_lengths(table: Any, names: List[str], row0: int = 0) -> np.ndarray:
    """The first column's per-row lengths (int64), every column checked for nulls and against
    them; errors number the rows from ``row0`` (a stream's batch numbers its rows in the stream)."""
    if table.num_rows == 0:  # (a stream's batch may be empty; pyarrow's all() of nothing is null)
        return np.zeros(0, dtype=np.int64)
    first = None
    for name in names:
        col = table.column(name)
        if col.null_count:
            row = pc.index(pc.is_null(col), True).as_py()
            raise InvalidArgumentError(f"column {name!r} has a null at row {row0 + row}; fill or filter nulls before packing")
        lens = pc.list_value_length(col)
        if first is None:
            first = lens
            continue
        same = pc.equal(pc.cast(lens, pa.int64()), pc.cast(first, pa.int64()))
        if not pc.all(same).as_py():
            row = pc.index(same, False).as_py()
            raise InvalidArgumentError(
                f"column {name!r} does not have the offsets of column {names[0]!r}: row {row0 + row} has "
                f"{lens[row].as_py()} values, not {first[row].as_py()}"
            )
    assert first is not None
    lengths = first.to_numpy().astype(np.int64, copy=False) if first.num_chunks else np.zeros(0, np.int64)
    _stowplan.check_row_lengths(lengths, names[0], row0)
    return lengths


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
    """A column's flat values as chunks (never combined: no copy of the input). Items are runs
    of values, each inside one chunk (as a list row is).

    Gathering items copies each run with one ``memcpy`` (natively, without the GIL) when the
    values are numbers without nulls, the usual token columns; other types fall back to Arrow's
    ``take`` by a per-token index."""

    def __init__(self, chunks: List[Any], type_: Any) -> None:
        self.type = type_
        self.chunks = [c for c in chunks if len(c)]
        self.bases = np.concatenate(([0], np.cumsum([len(c) for c in self.chunks]))).astype(np.int64)
        t = type_
        numeric = (pa.types.is_integer(t) or pa.types.is_floating(t)) and all(c.null_count == 0 for c in self.chunks)
        self.arrays = [c.to_numpy(zero_copy_only=True) for c in self.chunks] if numeric else None

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

    def slice(self, start: int, length: int) -> Any:
        """Values ``start..start+length`` as one array (zero-copy inside one chunk)."""
        chunks = self.view(start, length).chunks
        if not chunks:
            return pa.array([], self.type)
        return chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks)

    def gather(self, starts: np.ndarray, lengths: np.ndarray) -> Any:
        """The items (``lengths`` values from ``starts``), one after the other, as one array."""
        if starts.size == 0:
            return pa.array([], self.type)
        if self.arrays is None:
            combined = pa.concat_arrays(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
            idx_dtype = np.int32 if len(self) <= 2**31 - 1 else np.int64
            ends = np.cumsum(lengths)
            perm = np.arange(int(ends[-1]), dtype=idx_dtype) + np.repeat((starts - (ends - lengths)).astype(idx_dtype), lengths)
            return combined.take(pa.array(perm))
        which = np.searchsorted(self.bases, starts, side="right") - 1
        # Runs that continue one another in the same chunk are copied as one.
        cont = (starts[1:] == starts[:-1] + lengths[:-1]) & (which[1:] == which[:-1])
        first = np.flatnonzero(np.concatenate(([True], ~cont)))
        run_lengths = np.add.reduceat(lengths, first).astype(np.int64)
        run_chunks = which[first].astype(np.int64)
        run_starts = (starts[first] - self.bases[run_chunks]).astype(np.int64)
        arrays = self.arrays
        gathered = _stowplan.gather_runs(arrays, run_chunks, run_starts, run_lengths)
        if gathered is None:  # a dtype the native gather does not take (float16)
            pieces = [arrays[c][a : a + n] for c, a, n in zip(run_chunks.tolist(), run_starts.tolist(), run_lengths.tolist())]
            gathered = np.concatenate(pieces)
        return pa.array(gathered, type=self.type)


def packed_schema(types: Dict[str, Any], position_ids: bool) -> Any:
    """The packed table's schema: the packed columns, ``seq_lengths``, ``position_ids``."""
    seq_type = pa.list_(pa.int32())
    extra = [(_stowplan.SEQ_LENGTHS, seq_type)] + ([(_stowplan.POSITION_IDS, seq_type)] if position_ids else [])
    return pa.schema(list(types.items()) + extra)


def assemble(
    values: Dict[str, "Flat"],
    types: Dict[str, Any],
    starts: np.ndarray,
    item_lengths: np.ndarray,
    bin_offsets: np.ndarray,
    position_ids: bool,
    contiguous: bool,
) -> Any:
    """The packed rows as a ``pyarrow.RecordBatchReader`` (``read_all()``: the table, one
    chunk per batch): row r holds items bin_offsets[r]..bin_offsets[r+1] (an item is the
    ``item_lengths`` values from ``starts`` in every column's flat values, a :class:`Flat`,
    of list type ``types[name]``), in batches of at most ``PACKED_BATCH_TOKENS`` tokens (or one row),
    each built when it is read (cut where the host's ``packed_batches`` cuts: at most
    ``PACKED_BATCH_TOKENS`` tokens per batch, as the CLI's ``pack-dataset`` writes them)."""
    schema = packed_schema(types, position_ids)
    batches = record_batches(values, types, schema, starts, item_lengths, bin_offsets, position_ids, contiguous)
    return pa.RecordBatchReader.from_batches(schema, batches)


def record_batches(
    values: Dict[str, "Flat"],
    types: Dict[str, Any],
    schema: Any,
    starts: np.ndarray,
    item_lengths: np.ndarray,
    bin_offsets: np.ndarray,
    position_ids: bool,
    contiguous: bool,
) -> Iterator[Any]:
    names = list(values)
    item_ends = np.concatenate(([0], np.cumsum(item_lengths))).astype(np.int64)
    row_tokens = item_ends[bin_offsets]  # tokens before each row, and the total
    seq_type = pa.list_(pa.int32())
    ends = _stowplan.packed_batches(row_tokens, BATCH_TOKENS).tolist()
    for r0, r1 in zip(ends[:-1], ends[1:]):
        i0, i1 = int(bin_offsets[r0]), int(bin_offsets[r1])
        t0, t1 = int(item_ends[i0]), int(item_ends[i1])
        lens = item_lengths[i0:i1]
        row_off = row_tokens[r0 : r1 + 1] - t0
        local = item_ends[i0:i1] - t0  # each item's first token in the chunk
        if contiguous:
            taken = {name: values[name].slice(t0, t1 - t0) for name in names}
        else:
            taken = {name: values[name].gather(starts[i0:i1], lens) for name in names}
        columns = []
        for name in names:
            t = types[name]
            if pa.types.is_large_list(t):
                columns.append(pa.LargeListArray.from_arrays(pa.array(row_off), taken[name], type=t))
            else:
                columns.append(pa.ListArray.from_arrays(pa.array(row_off.astype(np.int32)), taken[name], type=t))
        seq_off = pa.array((bin_offsets[r0 : r1 + 1] - i0).astype(np.int32))
        columns.append(pa.ListArray.from_arrays(seq_off, pa.array(lens.astype(np.int32)), type=seq_type))
        if position_ids:
            pos = (np.arange(t1 - t0, dtype=np.int64) - np.repeat(local, lens)).astype(np.int32)
            columns.append(pa.ListArray.from_arrays(pa.array(row_off.astype(np.int32)), pa.array(pos), type=seq_type))
        yield pa.RecordBatch.from_arrays(columns, schema=schema)
