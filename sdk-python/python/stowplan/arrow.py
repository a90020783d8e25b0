"""Pack the rows of a ``pyarrow.Table`` into rows of at most ``seq_length`` tokens (issue 28).

The list columns of a tokenized SFT table (``input_ids``, ``labels``, ``attention_mask``, any
list column with the same per-row lengths) are regrouped into packed rows by one kernel plan
(:func:`stowplan.pack` over the lengths read from the list offsets), and the packed rows are
assembled with pyarrow compute: a ``take`` of the flattened values by a per-token permutation
built with numpy from the plan, and new offsets from the bins' token sums. No row becomes a
Python object. Needs ``pyarrow`` (``pip install 'stowplan[hf]'``).

>>> import pyarrow as pa
>>> from stowplan.arrow import pack_table
>>> t = pa.table({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]})
>>> packed = pack_table(t, 4)                       # best-fit decreasing, long rows truncated
>>> packed.to_pydict()
{'input_ids': [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]], 'seq_lengths': [[4], [3, 1], [2]]}
>>> pack_table(t, 4, strategy="bfd_split", position_ids=True).to_pydict()["position_ids"]
[[0, 1, 2, 3], [0, 0, 1, 2], [0, 1, 0]]
"""

from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _stowplan
from .errors import InfeasibleError, InvalidArgumentError

try:
    import pyarrow as pa
    import pyarrow.compute as pc
except ImportError as exc:  # pragma: no cover - the hf extra installs it
    raise ImportError("stowplan.arrow needs pyarrow: pip install 'stowplan[hf]'") from exc

__all__ = [
    "pack_table",
    "STRATEGIES",
    "OVERFLOWS",
    "DEFAULT_STRATEGY",
    "DEFAULT_OVERFLOW",
    "SEQ_LENGTHS",
    "POSITION_IDS",
    "MAX_SEQUENCE_LENGTH",
    "MAX_SEQ_LENGTH",
]

#: Packing strategies: the kernel's ``bfd``, ``ffd`` and ``next-fit`` (``next_fit`` is accepted
#: too), TRL's ``bfd_split`` (``bfd`` with ``overflow="split"``) and ``wrapped`` (every token
#: concatenated in row order and cut into rows of ``seq_length``).
STRATEGIES = ("bfd", "ffd", "next-fit", "bfd_split", "wrapped")
#: What happens to a row longer than ``seq_length`` under ``bfd``, ``ffd`` and ``next-fit``:
#: its first ``seq_length`` tokens are kept (``truncate``), it is cut into fragments of at most
#: ``seq_length`` tokens packed as sequences of their own (``split``), it is left out
#: (``drop``), or :class:`stowplan.InfeasibleError` names it (``error``).
OVERFLOWS = ("truncate", "split", "drop", "error")
DEFAULT_STRATEGY = "bfd"
#: TRL's ``pack_dataset(strategy="bfd")`` truncates too.
DEFAULT_OVERFLOW = "truncate"
#: The output column of each packed row's sequence lengths (TRL's name), ``list<int32>``.
SEQ_LENGTHS = "seq_lengths"
#: The optional output column of positions restarting at 0 at every sequence, ``list<int32>``.
POSITION_IDS = "position_ids"
#: The longest input sequence a plan takes (its lengths are ``u32``).
MAX_SEQUENCE_LENGTH = 2**32 - 1
#: The largest ``seq_length``: a packed row is one Arrow list (``int32`` offsets).
MAX_SEQ_LENGTH = 2**31 - 1

_METHODS = {"bfd": "bfd", "ffd": "ffd", "next-fit": "next-fit", "next_fit": "next-fit", "bfd_split": "bfd"}
# Tokens per output chunk: bounds the per-token permutation's memory and keeps int32 list
# offsets in range; the packed rows do not depend on it.
_CHUNK_TOKENS = 1 << 26


def pack_table(
    table: Any,
    seq_length: int,
    *,
    strategy: str = DEFAULT_STRATEGY,
    overflow: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    position_ids: bool = False,
    backend: Optional[str] = None,
) -> Any:
    """The rows of ``table`` (a ``pyarrow.Table`` or ``RecordBatch``) packed into rows of at most
    ``seq_length`` tokens, as a new ``pyarrow.Table``.

    ``columns`` are the list columns to pack (default: every column, which must then all be
    lists); the first one's list lengths are the sequence lengths, and every other one must
    have the same length in every row. Other columns are not carried over. The output has the
    packed columns (same types), ``seq_lengths`` (``list<int32>``: the lengths of the
    sequences in each packed row, in row order) and, with ``position_ids=True``,
    ``position_ids`` (``list<int32>``, restarting at 0 at every sequence).

    ``strategy`` (see :data:`STRATEGIES`): ``bfd``/``ffd``/``next-fit`` pack whole sequences by
    the kernel's plan (rows in the plan's bin order, a row's sequences ascending by input row);
    ``bfd_split`` is ``bfd`` with ``overflow="split"``; ``wrapped`` concatenates every token in
    row order and cuts rows of exactly ``seq_length`` (the last one shorter), ``seq_lengths``
    then giving the pieces of the input sequences in each row. ``overflow`` (see
    :data:`OVERFLOWS`, default :data:`DEFAULT_OVERFLOW` as in TRL) applies to ``bfd``, ``ffd``
    and ``next-fit``. Empty sequences carry no token and are left out (as TRL does).
    ``backend``: the kernel's (``"wasm"``, default, or ``"native"``).

    Bad input raises :class:`stowplan.InvalidArgumentError` naming the argument, column and row:
    ``seq_length`` outside ``1..=2**31-1``, an empty table, a missing column, a column that is
    not a list, a null row, list columns whose lengths differ, a sequence longer than
    ``2**32-1``, an output column name among the packed columns.
    """
    return _pack(table, seq_length, strategy, overflow, columns, position_ids, backend)[0]


def _pack(
    table: Any,
    seq_length: int,
    strategy: str,
    overflow: Optional[str],
    columns: Optional[Sequence[str]],
    position_ids: bool,
    backend: Optional[str],
) -> Tuple[Any, str]:
    """:func:`pack_table`'s table and the sha256 of its plan and options (for fingerprints)."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    if not isinstance(table, pa.Table):
        raise InvalidArgumentError(f"table must be a pyarrow.Table or RecordBatch (got {type(table).__name__})")
    seq_length = _stowplan._integer(seq_length, "seq_length", 1, MAX_SEQ_LENGTH)
    strategy, overflow = _check_strategy(strategy, overflow)
    if not isinstance(position_ids, bool):
        raise InvalidArgumentError(f"position_ids must be True or False (got {position_ids!r})")
    names = _check_columns(table, columns, position_ids)
    if table.num_rows == 0:
        raise InvalidArgumentError("the table is empty: there are no rows to pack")
    if table.num_rows > MAX_SEQUENCE_LENGTH:
        raise InvalidArgumentError(f"the table has {table.num_rows} rows; at most 2**32-1 can be packed at once")
    lengths = _lengths(table, names)
    starts, item_lengths, bin_offsets = _items(lengths, seq_length, strategy, overflow, names[0], backend)
    digest = hashlib.sha256()
    digest.update(repr((seq_length, strategy, overflow, names, position_ids)).encode())
    for a in (starts, item_lengths, bin_offsets):
        digest.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    out = _assemble(table, names, starts, item_lengths, bin_offsets, position_ids, contiguous=strategy == "wrapped")
    return out, digest.hexdigest()


def _check_strategy(strategy: Any, overflow: Any) -> Tuple[str, Optional[str]]:
    allowed = "'bfd', 'ffd', 'next-fit', 'bfd_split' or 'wrapped'"
    if not isinstance(strategy, str) or (strategy not in _METHODS and strategy != "wrapped"):
        raise InvalidArgumentError(f"strategy must be {allowed} (got {strategy!r})")
    if overflow is not None and (not isinstance(overflow, str) or overflow not in OVERFLOWS):
        raise InvalidArgumentError(f"overflow must be 'truncate', 'split', 'drop' or 'error' (got {overflow!r})")
    if strategy == "wrapped":
        if overflow is not None:
            raise InvalidArgumentError(f"overflow does not apply to strategy 'wrapped' (got {overflow!r}); leave it None")
        return strategy, None
    if strategy == "bfd_split":
        if overflow not in (None, "split"):
            raise InvalidArgumentError(f"strategy 'bfd_split' splits long rows: overflow must be None or 'split' (got {overflow!r})")
        return strategy, "split"
    return _METHODS[strategy], DEFAULT_OVERFLOW if overflow is None else overflow


def _check_columns(table: Any, columns: Optional[Sequence[str]], position_ids: bool) -> List[str]:
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
    reserved = [SEQ_LENGTHS] + ([POSITION_IDS] if position_ids else [])
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


def _lengths(table: Any, names: List[str]) -> np.ndarray:
    """The first column's per-row lengths (int64), every column checked for nulls and against them."""
    first = None
    for name in names:
        col = table.column(name)
        if col.null_count:
            row = pc.index(pc.is_null(col), True).as_py()
            raise InvalidArgumentError(f"column {name!r} has a null at row {row}; fill or filter nulls before packing")
        lens = pc.list_value_length(col)
        if first is None:
            first = lens
            continue
        same = pc.equal(pc.cast(lens, pa.int64()), pc.cast(first, pa.int64()))
        if not pc.all(same).as_py():
            row = pc.index(same, False).as_py()
            raise InvalidArgumentError(
                f"column {name!r} does not have the offsets of column {names[0]!r}: row {row} has "
                f"{lens[row].as_py()} values, not {first[row].as_py()}"
            )
    assert first is not None
    lengths = first.to_numpy().astype(np.int64, copy=False) if first.num_chunks else np.zeros(0, np.int64)
    if lengths.size and int(lengths.max()) > MAX_SEQUENCE_LENGTH:
        row = int(np.argmax(lengths > MAX_SEQUENCE_LENGTH))
        raise InvalidArgumentError(
            f"column {names[0]!r} row {row} has {int(lengths[row])} values, more than 2**32-1 (the longest sequence a plan takes)"
        )
    return lengths


def _items(
    lengths: np.ndarray, seq_length: int, strategy: str, overflow: Optional[str], first: str, backend: Optional[str]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed rows of rows of ``lengths`` tokens (flat in row order): items (flat start,
    length) in output order and each output row's item offsets. Shared with
    :func:`stowplan.ray.pack_dataset`, which assembles the same items on the cluster."""
    if strategy == "wrapped":
        return _wrapped(lengths, seq_length)
    return _planned(lengths, seq_length, strategy, overflow, first, backend)


def _planned(
    lengths: np.ndarray, seq_length: int, strategy: str, overflow: Optional[str], first: str, backend: Optional[str]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Items (flat start, length) in output order and each output row's item offsets, from the
    kernel's plan."""
    row_starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    keep = lengths > 0
    long = lengths > seq_length
    if overflow == "error" and long.any():
        row = int(np.argmax(long))
        raise InfeasibleError(
            f"column {first!r} row {row} has {int(lengths[row])} values, more than seq_length = {seq_length} "
            "(overflow='error'; 'truncate', 'split' or 'drop' handle it)"
        )
    if overflow == "drop":
        keep &= ~long
    rows = np.flatnonzero(keep)
    if overflow == "split":
        # Fragments of seq_length tokens, the last one of a sequence holding the remainder.
        n_frag = -(-lengths[rows] // seq_length)
        frag_rows = np.repeat(rows, n_frag)
        first_frag = np.cumsum(n_frag) - n_frag
        k = np.arange(frag_rows.size, dtype=np.int64) - np.repeat(first_frag, n_frag)
        starts = row_starts[frag_rows] + k * seq_length
        item_lengths = np.minimum(lengths[frag_rows] - k * seq_length, seq_length)
    else:
        starts = row_starts[rows]
        item_lengths = np.minimum(lengths[rows], seq_length)
    if item_lengths.size == 0:
        return starts, item_lengths, np.zeros(1, dtype=np.int64)
    plan = _stowplan.pack(item_lengths.astype(np.uint64), seq_length, method=_METHODS[strategy], backend=backend)
    order = plan.indices.astype(np.int64)
    return starts[order], item_lengths[order], plan.offsets.astype(np.int64)


def _wrapped(lengths: np.ndarray, seq_length: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every token in row order cut into rows of seq_length: the items are the pieces of the
    sequences between sequence ends and row cuts."""
    total = int(lengths.sum())
    ends = np.cumsum(lengths[lengths > 0])
    cuts = np.arange(0, total, seq_length, dtype=np.int64)
    bounds = np.union1d(np.concatenate(([0], ends)), cuts)
    starts = bounds[:-1]
    item_lengths = np.diff(bounds)
    bin_offsets = np.concatenate((np.searchsorted(starts, cuts), [starts.size])).astype(np.int64)
    return starts, item_lengths, bin_offsets


def _flat_values(col: Any) -> Any:
    values = pc.list_flatten(col)
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _assemble(
    table: Any,
    names: List[str],
    starts: np.ndarray,
    item_lengths: np.ndarray,
    bin_offsets: np.ndarray,
    position_ids: bool,
    contiguous: bool,
) -> Any:
    """The packed table: row r holds items bin_offsets[r]..bin_offsets[r+1], built in chunks of
    at most _CHUNK_TOKENS tokens (or one row)."""
    n_rows = bin_offsets.size - 1
    item_ends = np.concatenate(([0], np.cumsum(item_lengths))).astype(np.int64)
    row_tokens = item_ends[bin_offsets]  # tokens before each row, and the total
    values = {name: _flat_values(table.column(name)) for name in names}
    types = {name: table.schema.field(name).type for name in names}
    seq_type = pa.list_(pa.int32())
    out: Dict[str, List[Any]] = {name: [] for name in names}
    out[SEQ_LENGTHS] = []
    if position_ids:
        out[POSITION_IDS] = []
    idx_dtype = np.int32 if len(values[names[0]]) <= 2**31 - 1 else np.int64  # indices into the flat values
    r0 = 0
    while r0 < n_rows:
        r1 = int(np.searchsorted(row_tokens, row_tokens[r0] + _CHUNK_TOKENS, side="right")) - 1
        r1 = min(max(r1, r0 + 1), n_rows)
        i0, i1 = int(bin_offsets[r0]), int(bin_offsets[r1])
        t0, t1 = int(item_ends[i0]), int(item_ends[i1])
        lens = item_lengths[i0:i1]
        row_off = row_tokens[r0 : r1 + 1] - t0
        local = item_ends[i0:i1] - t0  # each item's first token in the chunk
        if contiguous:
            taken = {name: values[name].slice(t0, t1 - t0) for name in names}
        else:
            perm = pa.array(np.arange(t1 - t0, dtype=idx_dtype) + np.repeat((starts[i0:i1] - local).astype(idx_dtype), lens))
            taken = {name: values[name].take(perm) for name in names}
        for name in names:
            t = types[name]
            if pa.types.is_large_list(t):
                out[name].append(pa.LargeListArray.from_arrays(pa.array(row_off), taken[name], type=t))
            else:
                out[name].append(pa.ListArray.from_arrays(pa.array(row_off.astype(np.int32)), taken[name], type=t))
        seq_off = pa.array((bin_offsets[r0 : r1 + 1] - i0).astype(np.int32))
        out[SEQ_LENGTHS].append(pa.ListArray.from_arrays(seq_off, pa.array(lens.astype(np.int32)), type=seq_type))
        if position_ids:
            pos = (np.arange(t1 - t0, dtype=np.int64) - np.repeat(local, lens)).astype(np.int32)
            out[POSITION_IDS].append(pa.ListArray.from_arrays(pa.array(row_off.astype(np.int32)), pa.array(pos), type=seq_type))
        r0 = r1
    arrays = [pa.chunked_array(out[k], type=types.get(k, seq_type)) for k in out]
    return pa.Table.from_arrays(arrays, names=list(out))
