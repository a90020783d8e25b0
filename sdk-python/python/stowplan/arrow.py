"""Pack the rows of a ``pyarrow.Table`` into rows of at most ``seq_length`` tokens.

The list columns of a tokenized SFT table (``input_ids``, ``labels``, ``attention_mask``, any
list column with the same per-row lengths) are regrouped into packed rows by one kernel plan
(the host's ``pack_rows`` over the lengths read from the list offsets: the same rows as the
CLI's ``stowplan pack-dataset``), and the packed rows are assembled from the columns' own chunks: each sequence's run of values copied once (numpy
slices concatenated; Arrow's ``take`` for values that are not numbers without nulls), and new
offsets from the bins' token sums. No row becomes a Python object. Needs ``pyarrow`` (``pip install 'stowplan[hf]'``).

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
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

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
    "pack_batches",
    "STRATEGIES",
    "STREAM_STRATEGIES",
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
#: concatenated in row order and cut into rows of ``seq_length``). The host's list
#: (``stowplan::RowStrategy``), which the CLI's ``pack-dataset`` takes too.
STRATEGIES = tuple(_stowplan.ROW_STRATEGIES)
#: The strategies of a stream (:func:`pack_batches`): ``bfd`` is the kernel's streaming best
#: fit (:class:`stowplan.StreamPacker`: the largest of the ``max_buffered`` waiting sequences
#: placed first, into the fullest of ``max_open_bins`` open bins it fits), ``next-fit`` the
#: same packer with one open bin and no buffer (exactly the static ``next-fit``), ``bfd_split``
#: and ``wrapped`` as in :data:`STRATEGIES`. ``ffd`` needs every length first: not streamed.
STREAM_STRATEGIES = tuple(s for s in STRATEGIES if s != "ffd")
#: What happens to a row longer than ``seq_length`` under ``bfd``, ``ffd`` and ``next-fit``:
#: its first ``seq_length`` tokens are kept (``truncate``), it is cut into fragments of at most
#: ``seq_length`` tokens packed as sequences of their own (``split``), it is left out
#: (``drop``), or :class:`stowplan.InfeasibleError` names it (``error``).
OVERFLOWS = tuple(_stowplan.OVERFLOWS)
DEFAULT_STRATEGY = STRATEGIES[0]
#: TRL's ``pack_dataset(strategy="bfd")`` truncates too.
DEFAULT_OVERFLOW = _stowplan.DEFAULT_OVERFLOW
#: The output column of each packed row's sequence lengths (TRL's name), ``list<int32>``.
SEQ_LENGTHS = _stowplan.SEQ_LENGTHS
#: The optional output column of positions restarting at 0 at every sequence, ``list<int32>``.
POSITION_IDS = _stowplan.POSITION_IDS
#: The longest input sequence a plan takes (its lengths are ``u32``).
MAX_SEQUENCE_LENGTH = _stowplan.MAX_ROW_LENGTH
#: The largest ``seq_length``: a packed row is one Arrow list (``int32`` offsets).
MAX_SEQ_LENGTH = _stowplan.MAX_SEQ_LENGTH

# Tokens per output record batch (the host's; the CLI's pack-dataset cuts its batches so too).
_BATCH_TOKENS = _stowplan.PACKED_BATCH_TOKENS


def _check_rows(rows: int) -> None:
    """Refuses a table (or dataset) without rows: there is nothing to pack."""
    if rows == 0:
        raise InvalidArgumentError("the table is empty: there are no rows to pack")


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
    return _pack(table, seq_length, strategy, overflow, columns, position_ids, backend)[0].read_all()


def _pack(
    table: Any,
    seq_length: int,
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
    seq_length = _stowplan._integer(seq_length, "seq_length", 1, MAX_SEQ_LENGTH)
    strategy, overflow = _check_strategy(strategy, overflow)
    if not isinstance(position_ids, bool):
        raise InvalidArgumentError(f"position_ids must be True or False (got {position_ids!r})")
    names = _check_columns(table, columns, position_ids)
    _check_rows(table.num_rows)
    if table.num_rows > MAX_SEQUENCE_LENGTH:
        raise InvalidArgumentError(f"the table has {table.num_rows} rows; at most 2**32-1 can be packed at once")
    lengths = _lengths(table, names)
    starts, item_lengths, bin_offsets = _plan_items(lengths, seq_length, strategy, overflow, names[0], backend)
    digest = hashlib.sha256()
    digest.update(repr((seq_length, strategy, overflow, names, position_ids)).encode())
    for a in (starts, item_lengths, bin_offsets):
        digest.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
    values = {name: _Flat.of(pc.list_flatten(table.column(name))) for name in names}
    types = {name: table.schema.field(name).type for name in names}
    packed = _assemble(values, types, starts, item_lengths, bin_offsets, position_ids, contiguous=strategy == "wrapped")
    return packed, digest.hexdigest()


def pack_batches(
    batches: Iterable[Any],
    seq_length: int,
    *,
    strategy: str = DEFAULT_STRATEGY,
    overflow: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    position_ids: bool = False,
    max_open_bins: Optional[int] = None,
    max_buffered: Optional[int] = None,
    backend: Optional[str] = None,
) -> Iterator[Any]:
    """The rows of a stream of ``pyarrow.Table``/``RecordBatch`` batches packed into rows of at
    most ``seq_length`` tokens, yielded as ``pyarrow.Table``s (each holding the rows that closed
    while a batch was read, or at the end of the stream) with the columns of :func:`pack_table`.

    Bounded memory, however long the stream: the kernel's :class:`stowplan.StreamPacker`
    (``max_open_bins``, ``max_buffered``: its options, default 64 and 4096) decides, and a
    batch's values are held only while a sequence of it waits in the packer. ``strategy``:
    see :data:`STREAM_STRATEGIES`; ``overflow``, ``columns``, ``position_ids`` and ``backend``
    are :func:`pack_table`'s. The rows do not depend on how the stream is cut into batches;
    with ``next-fit`` and ``wrapped`` they are exactly :func:`pack_table`'s on the whole
    stream. Errors are :func:`pack_table`'s, raised when the iteration reaches the bad batch
    (rows numbered in the stream); an empty stream is refused when it ends.

    >>> import pyarrow as pa
    >>> stream = [pa.table({"input_ids": [[1, 2, 3], [4]]}), pa.table({"input_ids": [[5, 6], [7, 8, 9]]})]
    >>> [t.to_pydict() for t in pack_batches(stream, 4, strategy="wrapped")]
    [{'input_ids': [[1, 2, 3, 4]], 'seq_lengths': [[3, 1]]}, {'input_ids': [[5, 6, 7, 8]], 'seq_lengths': [[2, 2]]}, {'input_ids': [[9]], 'seq_lengths': [[1]]}]
    >>> [t.to_pydict() for t in pack_batches(stream, 4)]       # the stream packer's best fit
    [{'input_ids': [[1, 2, 3, 4], [7, 8, 9], [5, 6]], 'seq_lengths': [[3, 1], [3], [2]]}]
    """
    seq_length = _stowplan._integer(seq_length, "seq_length", 1, MAX_SEQ_LENGTH)
    strategy, overflow = _check_strategy(strategy, overflow)
    if strategy == "ffd":
        raise InvalidArgumentError(
            f"strategy 'ffd' needs every length before the first bin: a stream takes one of {', '.join(map(repr, STREAM_STRATEGIES))}"
        )
    if not isinstance(position_ids, bool):
        raise InvalidArgumentError(f"position_ids must be True or False (got {position_ids!r})")
    if strategy == "wrapped":
        if max_open_bins is not None or max_buffered is not None:
            raise InvalidArgumentError("max_open_bins and max_buffered do not apply to strategy 'wrapped'; leave them None")
        packer = None
    elif strategy == "next-fit":
        if max_open_bins not in (None, 1) or max_buffered not in (None, 0):
            raise InvalidArgumentError(
                f"strategy 'next-fit' is the stream packer with max_open_bins=1, max_buffered=0 (got {max_open_bins!r}, {max_buffered!r})"
            )
        packer = _stowplan.StreamPacker(seq_length, max_open_bins=1, max_buffered=0, backend=backend)
    else:
        packer = _stowplan.StreamPacker(seq_length, max_open_bins=max_open_bins, max_buffered=max_buffered, backend=backend)
    return _stream(iter(batches), seq_length, strategy, overflow, columns, position_ids, packer)


class _Held:
    """A batch's flat values and items while a sequence of it waits in the packer."""

    __slots__ = ("values", "starts", "lengths", "waiting")

    def __init__(self, values: Dict[str, Any], starts: np.ndarray, lengths: np.ndarray) -> None:
        self.values = values
        self.starts = starts
        self.lengths = lengths
        self.waiting = lengths.size


def _stream(
    batches: Iterator[Any],
    seq_length: int,
    strategy: str,
    overflow: Optional[str],
    columns: Optional[Sequence[str]],
    position_ids: bool,
    packer: Any,
) -> Iterator[Any]:
    names: Optional[List[str]] = None
    types: Dict[str, Any] = {}
    rows = 0  # rows read
    held: Dict[int, _Held] = {}  # first item number -> the batch
    items = 0  # items given to the packer
    carry: Optional[Tuple[Dict[str, Any], np.ndarray]] = None  # wrapped: the open row's values and pieces
    for k, batch in enumerate(batches):
        if isinstance(batch, pa.RecordBatch):
            batch = pa.Table.from_batches([batch])
        if not isinstance(batch, pa.Table):
            raise InvalidArgumentError(f"batch {k} of the stream must be a pyarrow.Table or RecordBatch (got {type(batch).__name__})")
        if names is None:
            names = _check_columns(batch, columns, position_ids)
            types = {name: batch.schema.field(name).type for name in names}
        else:
            _check_columns(batch, names, position_ids)
            for name in names:
                if batch.schema.field(name).type != types[name]:
                    raise InvalidArgumentError(
                        f"column {name!r} is {batch.schema.field(name).type} in batch {k} of the stream, {types[name]} before"
                    )
        lengths = _lengths(batch, names, rows)
        values = {name: _Flat.of(pc.list_flatten(batch.column(name))) for name in names}
        if strategy == "wrapped":
            carry, out = _wrap_step(carry, values, lengths, seq_length, types, position_ids, final=False)
        else:
            starts, item_lengths = _items(lengths, seq_length, overflow, names[0], rows)
            if item_lengths.size:
                held[items] = _Held(values, starts, item_lengths)
                items += item_lengths.size
            out = _emit(packer.add(item_lengths.astype(np.uint64)), held, types, position_ids)
        rows += batch.num_rows
        if out.num_rows:
            yield out
    if names is None or rows == 0:
        raise InvalidArgumentError("the stream is empty: there are no rows to pack")
    if strategy == "wrapped":
        out = _wrap_step(carry, None, None, seq_length, types, position_ids, final=True)[1]
    else:
        out = _emit(packer.finish(), held, types, position_ids)
    if out.num_rows:
        yield out


def _emit(bins: List[List[int]], held: Dict[int, "_Held"], types: Dict[str, Any], position_ids: bool) -> Any:
    """The packed rows of the closed ``bins`` (item numbers), their values gathered from the
    held batches (the touched ones joined without a copy, each item copied once); a batch
    whose items have all gone out is let go."""
    sizes = np.fromiter((len(b) for b in bins), dtype=np.int64, count=len(bins))
    members = np.fromiter((i for b in bins for i in b), dtype=np.int64, count=int(sizes.sum()))
    bin_offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    firsts = np.array(sorted(held), dtype=np.int64)
    which = np.searchsorted(firsts, members, side="right") - 1
    starts = np.empty(members.size, dtype=np.int64)
    item_lengths = np.empty(members.size, dtype=np.int64)
    joined: Dict[str, List[_Flat]] = {name: [] for name in types}
    base = 0  # the joined values before the batch
    for w in np.unique(which):
        first = int(firsts[w])
        h = held[first]
        sel = np.flatnonzero(which == w)
        local = members[sel] - first
        item_lengths[sel] = h.lengths[local]
        starts[sel] = base + h.starts[local]
        for name in types:
            joined[name].append(h.values[name])
        base += len(next(iter(h.values.values())))
        h.waiting -= sel.size
        if h.waiting == 0:
            del held[first]
    values = {name: _Flat.join(f) if f else _Flat([], types[name].value_type) for name, f in joined.items()}
    return _assemble(values, types, starts, item_lengths, bin_offsets, position_ids, contiguous=False).read_all()


def _wrap_step(
    carry: Optional[Tuple[Dict[str, "_Flat"], np.ndarray]],
    values: Optional[Dict[str, "_Flat"]],
    lengths: Optional[np.ndarray],
    seq_length: int,
    types: Dict[str, Any],
    position_ids: bool,
    final: bool,
) -> Tuple[Optional[Tuple[Dict[str, Any], np.ndarray]], Any]:
    """``wrapped`` over a stream: the open row carried over (its values and the pieces of
    sequences in it) joins the batch's tokens, every full row goes out, the last partial one is
    carried (or, at the end, goes out too)."""
    if values is None:
        values, pieces = carry if carry is not None else ({n: _Flat([], t.value_type) for n, t in types.items()}, np.zeros(0, np.int64))
    else:
        assert lengths is not None
        pieces = lengths[lengths > 0]
        if carry is not None:
            values = {n: _Flat.join([carry[0][n], values[n]]) for n in values}
            pieces = np.concatenate((carry[1], pieces))
    starts, item_lengths, bin_offsets = _wrapped(pieces, seq_length)
    total = int(pieces.sum())
    if final or total % seq_length == 0:
        return None, _assemble(values, types, starts, item_lengths, bin_offsets, position_ids, contiguous=True).read_all()
    cut = total - total % seq_length
    rest = (
        {n: v.view(cut, total - cut) for n, v in values.items()},
        item_lengths[bin_offsets[-2] :].astype(np.int64),
    )
    full = bin_offsets[:-1]
    return rest, _assemble(values, types, starts[: full[-1]], item_lengths[: full[-1]], full, position_ids, contiguous=True).read_all()


def _check_strategy(strategy: Any, overflow: Any) -> Tuple[str, Optional[str]]:
    """The strategy's name and its overflow policy, checked together by the host."""
    return _stowplan.row_packing(strategy, overflow)


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


def _lengths(table: Any, names: List[str], row0: int = 0) -> np.ndarray:
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


def _plan_items(
    lengths: np.ndarray, seq_length: int, strategy: str, overflow: Optional[str], first: str, backend: Optional[str]
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The packed rows of rows of ``lengths`` tokens (flat in row order): items (flat start,
    length) in output order and each output row's item offsets, by the host's
    ``stowplan::pack_rows`` (errors name column ``first`` and the row). Shared with
    :func:`stowplan.ray.pack_dataset`, which assembles the same items on the cluster."""
    return _stowplan.pack_rows(lengths, seq_length, strategy, overflow, first, backend)


def _items(lengths: np.ndarray, seq_length: int, overflow: Optional[str], first: str, row0: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    """The items to pack, in row order: (start in the flat values, length) of every non-empty
    row under ``overflow`` (truncated, cut into fragments, dropped when long, or refused with
    the row numbered from ``row0``), by the host's ``stowplan::row_items``."""
    return _stowplan.row_items(lengths, seq_length, overflow or DEFAULT_OVERFLOW, first, row0)


def _wrapped(lengths: np.ndarray, seq_length: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every token in row order cut into rows of seq_length: the items are the pieces of the
    sequences between sequence ends and row cuts (the host's ``stowplan::wrapped_rows``)."""
    return _stowplan.wrapped_rows(lengths, seq_length)


class _Flat:
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
    def of(cls, values: Any) -> "_Flat":
        """The flat values of an Array or ChunkedArray."""
        return cls(values.chunks if isinstance(values, pa.ChunkedArray) else [values], values.type)

    @classmethod
    def join(cls, flats: List["_Flat"]) -> "_Flat":
        """One after the other (no copy)."""
        return cls([c for f in flats for c in f.chunks], flats[0].type)

    def __len__(self) -> int:
        return int(self.bases[-1])

    def view(self, start: int, length: int) -> "_Flat":
        """Values ``start..start+length`` (no copy)."""
        pieces = []
        c = int(np.searchsorted(self.bases, start, side="right")) - 1
        while length > 0:
            at = start - int(self.bases[c])
            n = min(length, len(self.chunks[c]) - at)
            pieces.append(self.chunks[c].slice(at, n))
            start, length, c = start + n, length - n, c + 1
        return _Flat(pieces, self.type)

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


def _packed_schema(types: Dict[str, Any], position_ids: bool) -> Any:
    """The packed table's schema: the packed columns, ``seq_lengths``, ``position_ids``."""
    seq_type = pa.list_(pa.int32())
    extra = [(SEQ_LENGTHS, seq_type)] + ([(POSITION_IDS, seq_type)] if position_ids else [])
    return pa.schema(list(types.items()) + extra)


def _assemble(
    values: Dict[str, "_Flat"],
    types: Dict[str, Any],
    starts: np.ndarray,
    item_lengths: np.ndarray,
    bin_offsets: np.ndarray,
    position_ids: bool,
    contiguous: bool,
) -> Any:
    """The packed rows as a ``pyarrow.RecordBatchReader`` (``read_all()``: the table, one
    chunk per batch): row r holds items bin_offsets[r]..bin_offsets[r+1] (an item is the
    ``item_lengths`` values from ``starts`` in every column's flat values, a :class:`_Flat`,
    of list type ``types[name]``), in batches of at most ``PACKED_BATCH_TOKENS`` tokens (or one row),
    each built when it is read (cut where the host's ``packed_batches`` cuts: at most
    ``PACKED_BATCH_TOKENS`` tokens per batch, as the CLI's ``pack-dataset`` writes them)."""
    schema = _packed_schema(types, position_ids)
    batches = _batches(values, types, schema, starts, item_lengths, bin_offsets, position_ids, contiguous)
    return pa.RecordBatchReader.from_batches(schema, batches)


def _batches(
    values: Dict[str, "_Flat"],
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
    ends = _stowplan.packed_batches(row_tokens, _BATCH_TOKENS).tolist()
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
