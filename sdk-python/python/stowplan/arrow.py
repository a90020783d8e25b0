"""Pack the rows of a ``pyarrow.Table`` into rows of at most ``capacity`` tokens.

The list columns of a tokenized SFT table (``input_ids``, ``labels``, ``attention_mask``, any
list column with the same per-row lengths) are regrouped into packed rows by one kernel plan
(the host's ``pack_rows`` over the lengths read from the list offsets) and assembled by the
host (``stowplan-arrow``, the code of the CLI's ``stowplan pack-dataset``, so the rows
are the same): :func:`pack_table` is one native call that reads the table's buffers in place
through the Arrow C Data Interface and copies each sequence's run of values once into the
packed record batches (no row becomes a Python object). Lists of numbers, booleans, strings,
binaries and lists of those are packed; dictionaries, structs and views are refused naming the
column. Needs ``pyarrow`` (``pip install 'stowplan[hf]'``).

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

from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import _stowplan
from ._renamed import renamed, warn_renamed
from .errors import InvalidArgumentError

try:
    import pyarrow as pa
    import pyarrow.compute as pc
except ImportError as exc:  # pragma: no cover - the hf extra installs it
    raise ImportError("stowplan.arrow needs pyarrow: pip install 'stowplan[hf]'") from exc

from . import _rows  # noqa: E402  (after the pyarrow check: it imports pyarrow)

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
    "MAX_CAPACITY",
]

#: Packing strategies: the kernel's ``bfd``, ``ffd`` and ``next-fit`` (``next_fit`` is accepted
#: too), TRL's ``bfd_split`` (``bfd`` with ``overflow="split"``) and ``wrapped`` (every token
#: concatenated in row order and cut into rows of ``capacity``). The host's list
#: (``stowplan::rows::RowStrategy``), which the CLI's ``pack-dataset`` takes too.
STRATEGIES = tuple(_stowplan.ROW_STRATEGIES)
#: The strategies of a stream (:func:`pack_batches`): ``bfd`` is the kernel's streaming best
#: fit (:class:`stowplan.StreamPacker`: the largest of the ``max_buffered`` waiting sequences
#: placed first, into the fullest of ``max_open_bins`` open bins it fits), ``next-fit`` the
#: same packer with one open bin and no buffer (exactly the static ``next-fit``), ``bfd_split``
#: and ``wrapped`` as in :data:`STRATEGIES`. ``ffd`` needs every length first: not streamed.
STREAM_STRATEGIES = tuple(s for s in STRATEGIES if s != "ffd")
#: What happens to a row longer than ``capacity`` under ``bfd``, ``ffd`` and ``next-fit``:
#: its first ``capacity`` tokens are kept (``truncate``), it is cut into fragments of at most
#: ``capacity`` tokens packed as sequences of their own (``split``), it is left out
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
#: The largest ``capacity``: a packed row is one Arrow list (``int32`` offsets).
MAX_CAPACITY = _stowplan.MAX_CAPACITY


def __getattr__(name: str) -> Any:
    # The former name of MAX_CAPACITY, for one release.
    if name == "MAX_SEQ_LENGTH":
        warn_renamed("stowplan.arrow", "MAX_SEQ_LENGTH", "MAX_CAPACITY", argument=False)
        return MAX_CAPACITY
    raise AttributeError(f"module 'stowplan.arrow' has no attribute {name!r}")

@renamed(seq_length="capacity")
def pack_table(
    table: Any,
    capacity: int,
    *,
    strategy: str = DEFAULT_STRATEGY,
    overflow: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    position_ids: bool = False,
    backend: Optional[str] = None,
) -> Any:
    """The rows of ``table`` (a ``pyarrow.Table`` or ``RecordBatch``) packed into rows of at most
    ``capacity`` tokens, as a new ``pyarrow.Table``.

    ``columns`` are the list columns to pack (default: every column, which must then all be
    lists); the first one's list lengths are the sequence lengths, and every other one must
    have the same length in every row. Other columns are not carried over. The output has the
    packed columns (same types), ``seq_lengths`` (``list<int32>``: the lengths of the
    sequences in each packed row, in row order) and, with ``position_ids=True``,
    ``position_ids`` (``list<int32>``, restarting at 0 at every sequence).

    ``strategy`` (see :data:`STRATEGIES`): ``bfd``/``ffd``/``next-fit`` pack whole sequences by
    the kernel's plan (rows in the plan's bin order, a row's sequences ascending by input row);
    ``bfd_split`` is ``bfd`` with ``overflow="split"``; ``wrapped`` concatenates every token in
    row order and cuts rows of exactly ``capacity`` (the last one shorter), ``seq_lengths``
    then giving the pieces of the input sequences in each row. ``overflow`` (see
    :data:`OVERFLOWS`, default :data:`DEFAULT_OVERFLOW` as in TRL) applies to ``bfd``, ``ffd``
    and ``next-fit``. Empty sequences carry no token and are left out (as TRL does).
    ``backend``: the kernel's (``"wasm"``, default, or ``"native"``).

    Bad input raises :class:`stowplan.InvalidArgumentError` naming the argument, column and row:
    ``capacity`` outside ``1..=2**31-1``, an empty table, a missing column, a column that is
    not a list or holds values packing does not take (dictionaries, structs, views), a null
    row, list columns whose lengths differ, a sequence longer than ``2**32-1``, an output
    column name among the packed columns, strings or inner lists of one output record batch
    past their ``int32`` offsets (use the ``large_`` types).
    """
    return _rows.pack(table, capacity, strategy, overflow, columns, position_ids, backend)[0].read_all()


@renamed(seq_length="capacity")
def pack_batches(
    batches: Iterable[Any],
    capacity: int,
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
    most ``capacity`` tokens, yielded as ``pyarrow.Table``s (each holding the rows that closed
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
    capacity = _stowplan._integer(capacity, "capacity", 1, MAX_CAPACITY)
    strategy, overflow = _rows.check_strategy(strategy, overflow)
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
        packer = _stowplan.StreamPacker(capacity, max_open_bins=1, max_buffered=0, backend=backend)
    else:
        packer = _stowplan.StreamPacker(capacity, max_open_bins=max_open_bins, max_buffered=max_buffered, backend=backend)
    return _stream(iter(batches), capacity, strategy, overflow, columns, position_ids, packer)


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
    capacity: int,
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
            names = _rows.check_columns(batch, columns, position_ids)
            types = {name: batch.schema.field(name).type for name in names}
        else:
            _rows.check_columns(batch, names, position_ids)
            for name in names:
                if batch.schema.field(name).type != types[name]:
                    raise InvalidArgumentError(
                        f"column {name!r} is {batch.schema.field(name).type} in batch {k} of the stream, {types[name]} before"
                    )
        lengths = _rows.column_lengths(batch, names, rows)
        values = {name: _rows.Flat.of(pc.list_flatten(batch.column(name))) for name in names}
        if strategy == "wrapped":
            carry, out = _wrap_step(carry, values, lengths, capacity, types, position_ids, final=False)
        else:
            starts, item_lengths = _rows.row_items(lengths, capacity, overflow, names[0], rows)
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
        out = _wrap_step(carry, None, None, capacity, types, position_ids, final=True)[1]
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
    joined: Dict[str, List[_rows.Flat]] = {name: [] for name in types}
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
    values = {name: _rows.Flat.join(f) if f else _rows.Flat([], types[name].value_type) for name, f in joined.items()}
    return _rows.assemble(values, types, starts, item_lengths, bin_offsets, position_ids).read_all()


def _wrap_step(
    carry: Optional[Tuple[Dict[str, "_rows.Flat"], np.ndarray]],
    values: Optional[Dict[str, "_rows.Flat"]],
    lengths: Optional[np.ndarray],
    capacity: int,
    types: Dict[str, Any],
    position_ids: bool,
    final: bool,
) -> Tuple[Optional[Tuple[Dict[str, Any], np.ndarray]], Any]:
    """``wrapped`` over a stream: the open row carried over (its values and the pieces of
    sequences in it) joins the batch's tokens, every full row goes out, the last partial one is
    carried (or, at the end, goes out too)."""
    if values is None:
        values, pieces = carry if carry is not None else ({n: _rows.Flat([], t.value_type) for n, t in types.items()}, np.zeros(0, np.int64))
    else:
        assert lengths is not None
        pieces = lengths[lengths > 0]
        if carry is not None:
            values = {n: _rows.Flat.join([carry[0][n], values[n]]) for n in values}
            pieces = np.concatenate((carry[1], pieces))
    starts, item_lengths, bin_offsets = _rows.wrapped_rows(pieces, capacity)
    total = int(pieces.sum())
    if final or total % capacity == 0:
        return None, _rows.assemble(values, types, starts, item_lengths, bin_offsets, position_ids).read_all()
    cut = total - total % capacity
    rest = (
        {n: v.view(cut, total - cut) for n, v in values.items()},
        item_lengths[bin_offsets[-2] :].astype(np.int64),
    )
    full = bin_offsets[:-1]
    return rest, _rows.assemble(values, types, starts[: full[-1]], item_lengths[: full[-1]], full, position_ids).read_all()


