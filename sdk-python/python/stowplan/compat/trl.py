"""TRL's ``pack_dataset`` (``trl.data_utils``, TRL 1.16.0), output for output.

:func:`pack_dataset` returns what ``trl.pack_dataset`` returns for every strategy (``bfd``,
``bfd_split``, ``wrapped``): the same rows in the same order, the same columns and types
(``seq_lengths`` included), the same dropping of empty sequences, one plan per
``Dataset.map`` batch (``map_kwargs``' ``batch_size``, datasets' default 1,000 rows), the
same ``DatasetDict`` handling and format, and builtin exceptions of TRL's types (``ValueError``
for an unknown strategy and for list columns of different lengths, ``TypeError`` for a column
that is not a list). The batches are rebuilt with pyarrow compute, never as Python rows.

TRL's best fit breaks ties between bins with the same room by the order in which they came
to have that room, which the kernel's best fit (ties to the oldest bin) does not; the
kernel's ``trl.bfd`` reproduces TRL's, every map batch in one call. For one plan over the
whole dataset, not bound to map batches, use :func:`stowplan.hf.pack_dataset`.

A ``Dataset`` (or a ``DatasetDict`` of them) whose ``map_kwargs`` name at most the batch size
and options that do not change the rows (``desc``, ``load_from_cache_file``,
``keep_in_memory``) is packed without ``Dataset.map``: every map batch is planned as TRL plans
it, then the whole output table is gathered at once (:mod:`stowplan.arrow`'s assembly, each
sequence's values copied once) into an in-memory ``Dataset`` with TRL's columns, types and
features, whose fingerprint hashes the input's and the options. Other ``map_kwargs``
(``num_proc``, whose shards start new map batches, ``drop_last_batch`` …) and an
``IterableDataset`` go through ``Dataset.map`` as TRL does.

>>> from datasets import Dataset
>>> from stowplan.compat.trl import pack_dataset
>>> ds = Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]],
...                         "attention_mask": [[1, 1, 1, 0, 0], [1, 0], [1, 1, 0], [1]]})
>>> pack_dataset(ds, seq_length=4, strategy="bfd_split")[:]
{'input_ids': [[1, 2, 3, 4], [8, 9, 10, 5], [6, 7, 11]],
 'attention_mask': [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1]],
 'seq_lengths': [[4], [3, 1], [2, 1]]}
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

try:
    import datasets
    import pyarrow as pa
    import pyarrow.compute as pc
except ImportError as exc:  # pragma: no cover - the hf extra installs them
    raise ImportError("stowplan.compat.trl needs datasets and pyarrow: pip install 'stowplan[hf]'") from exc

from .. import _stowplan
from ..errors import InvalidArgumentError
from .._rows import assemble, Flat, row_items  # the items of rows, and the one gather of packed rows

__all__ = ["pack_dataset", "STRATEGIES", "TRL_VERSION", "PackingArgumentError", "PackingColumnTypeError"]

#: The TRL release whose output :func:`pack_dataset` reproduces (the tests compare with it).
TRL_VERSION = "1.16.0"
#: TRL's strategies.
STRATEGIES = ("bfd", "bfd_split", "wrapped")
_SEQ_LENGTHS = "seq_lengths"


def pack_dataset(dataset: Any, seq_length: int, strategy: str = "bfd", map_kwargs: Optional[Dict[str, Any]] = None) -> Any:
    """TRL's ``pack_dataset(dataset, seq_length, strategy, map_kwargs)``: ``dataset`` (a
    ``datasets.Dataset`` or ``DatasetDict``; every column a list column with the same lengths)
    packed per ``Dataset.map`` batch into rows of at most ``seq_length`` tokens.

    ``"bfd"`` truncates sequences longer than ``seq_length`` and packs by best fit decreasing;
    ``"bfd_split"`` cuts them into fragments of ``seq_length`` tokens (the last one shorter)
    instead; both drop empty sequences and add ``seq_lengths``. ``"wrapped"`` cuts the batch's
    concatenated tokens into rows of ``seq_length``. ``map_kwargs`` go to ``Dataset.map``.
    The format of the input (of its first split) is set on the output, ``seq_lengths`` added
    to its columns. A ``seq_length`` that is not an integer in ``1..=2**64-1`` raises
    :class:`stowplan.InvalidArgumentError` (a ``ValueError``; TRL fails by strategy). TRL's
    own refusals keep TRL's type and message and are stowplan's too:
    :class:`PackingArgumentError` (a ``ValueError``: an unknown strategy, columns of different
    lengths) and :class:`PackingColumnTypeError` (a ``TypeError``: a column that is not a list),
    the column named in ``argument`` and in a note.
    """
    if map_kwargs is None:
        map_kwargs = {}
    if strategy not in STRATEGIES:
        raise PackingArgumentError(f"Invalid packing strategy '{strategy}', must be one of {STRATEGIES}.", "strategy")
    # seq_length checked for every strategy (TRL itself fails on 0 with AssertionError,
    # IndexError or ZeroDivisionError by strategy; a negative one gives empty rows):
    # InvalidArgumentError (a ValueError) unless an integer in 1..=2**64-1; then a Python int
    # (numpy's unsigned scalars would turn int64 arithmetic into floats).
    seq_length = _stowplan._integer(seq_length, "seq_length", 1, 2**64 - 1)
    fmt = _format(dataset)
    if strategy != "wrapped" and "columns" in fmt:
        fmt["columns"] = fmt["columns"] + [_SEQ_LENGTHS]
    batch_size = _direct_batch_size(dataset, map_kwargs)
    if batch_size is not False:
        if isinstance(dataset, datasets.DatasetDict):
            packed = datasets.DatasetDict({k: _pack_direct(d, seq_length, strategy, batch_size) for k, d in dataset.items()})
        else:
            packed = _pack_direct(dataset, seq_length, strategy, batch_size)
        return packed.with_format(**fmt)
    dataset = dataset.with_format("arrow")
    if strategy == "wrapped":
        dataset = dataset.map(_pack_wrapped, batched=True, fn_kwargs={"seq_length": seq_length}, **map_kwargs)
    else:
        kwargs = {"seq_length": seq_length, "split": strategy == "bfd_split"}
        dataset = dataset.map(_pack_bfd, batched=True, fn_kwargs=kwargs, **map_kwargs)
    return dataset.with_format(**fmt)


# Dataset.map arguments that do not change its output's rows.
_ROW_NEUTRAL = {"desc", "load_from_cache_file", "keep_in_memory"}


def _direct_batch_size(dataset: Any, map_kwargs: Dict[str, Any]) -> Any:
    """The map batch size (``None``: the whole split) when ``dataset`` can be packed without
    ``Dataset.map`` (see the module docs), else ``False``."""
    splits = list(dataset.values()) if isinstance(dataset, datasets.DatasetDict) else [dataset]
    # (Nulls, and an empty split, take TRL's own path.)
    if not all(isinstance(d, datasets.Dataset) and d.num_rows > 0 for d in splits):
        return False
    if any(c.null_count for d in splits for c in d.data.table.columns):
        return False
    if not set(map_kwargs) <= _ROW_NEUTRAL | {"batch_size"}:
        return False
    size = map_kwargs.get("batch_size", 1000)  # Dataset.map's default
    if size is None or (isinstance(size, int) and size <= 0):
        return None  # datasets: the whole split is one batch
    return size if isinstance(size, int) and not isinstance(size, bool) else False


def _pack_direct(dataset: Any, seq_length: int, strategy: str, batch_size: Optional[int]) -> Any:
    """One split packed map batch by map batch as :func:`_pack_bfd` / :func:`_pack_wrapped`
    pack them, gathered into one table at once (see the module docs)."""
    table = dataset.with_format("arrow")[:]  # the rows in order (an indices mapping applied), not copied
    names = table.column_names
    columns = [table.column(name) for name in names]
    n = table.num_rows
    size = n if batch_size is None else batch_size
    lengths = _checked_lengths(names, columns, size)
    offsets = np.concatenate(([0], np.cumsum(lengths)))  # in the flat values
    batch_rows = np.arange(0, n, size, dtype=np.int64)  # each map batch's first row
    if strategy == "wrapped":
        # Each batch's tokens cut every seq_length from the batch's first token (a seq_length
        # above every batch's tokens cuts as that many: one row a batch; kept in int64).
        seq_length = min(seq_length, int(offsets[-1]) + 1)
        first = offsets[batch_rows]
        total = np.append(first[1:], offsets[-1]) - first
        pieces = -(-total // seq_length)
        row_starts = np.repeat(first, pieces) + seq_length * (np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces))
        row_ends = np.minimum(row_starts + seq_length, np.repeat(first + total, pieces))
        starts, item_lengths, bin_offsets = row_starts, row_ends - row_starts, np.arange(row_starts.size + 1)
    else:
        # Empty sequences left out, long ones truncated (or split into fragments), in row order.
        starts, item_lengths = row_items(lengths, seq_length, "split" if strategy == "bfd_split" else "truncate", names[0])
        item_rows = np.searchsorted(offsets, starts, side="right") - 1
        # The items of each map batch, fitted as TRL fits them; rows batch after batch.
        batch_ends = np.searchsorted(item_rows, np.append(batch_rows[1:], n))
        bin_offsets, idx = _stowplan.trl_bfd(item_lengths, batch_ends, seq_length)
        starts, item_lengths = starts[idx], item_lengths[idx]
    values = {name: Flat.of(pc.list_flatten(c)) for name, c in zip(names, columns)}
    types = {name: c.type for name, c in zip(names, columns)}
    packed = assemble(values, types, starts, item_lengths, bin_offsets, position_ids=False).read_all()
    if strategy == "wrapped":
        packed = packed.drop_columns([_SEQ_LENGTHS])
    elif pa.types.is_large_list(columns[0].type):  # TRL's seq_lengths are list_value_length's type
        packed = packed.set_column(len(names), _SEQ_LENGTHS, packed.column(_SEQ_LENGTHS).cast(pa.list_(pa.int64())))
    features = _features(dataset.features, packed.schema)
    fingerprint = datasets.fingerprint.Hasher.hash(
        ["stowplan.compat.trl.pack_dataset", TRL_VERSION, dataset._fingerprint, seq_length, strategy, batch_size]
    )
    info = datasets.DatasetInfo(features=features)
    return datasets.Dataset(datasets.table.InMemoryTable(packed), info=info, split=dataset.split, fingerprint=fingerprint)


def _checked_lengths(names: List[str], columns: List[Any], batch_size: int) -> np.ndarray:
    """The rows' lengths, the columns checked as TRL's first map batch checks them, column by
    column: a column that is not a list raises ``TypeError`` unless a column before it has
    other lengths in that batch (``ValueError``); with every column a list, other lengths in
    any row raise ``ValueError`` (TRL's map reaches that batch)."""
    not_list = [not (pa.types.is_list(c.type) or pa.types.is_large_list(c.type)) for c in columns]
    lengths = None
    for i, (name, column) in enumerate(zip(names, columns)):
        if not_list[i]:
            raise _not_a_list(name, column.type)
        these = pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
        if lengths is None:
            lengths = these
            continue
        differ = these != lengths
        if differ[:batch_size].any() if any(not_list) else differ.any():
            raise _lengths_differ(name, names[0])
    return lengths


def _features(source: Any, schema: Any) -> Any:
    """The features ``Dataset.map`` gives a table of ``schema`` written over ``source``'s: a
    column whose Arrow type is unchanged keeps its feature, the others are inferred."""
    inferred = datasets.Features.from_arrow_schema(schema)
    kept = {}
    for field in schema:
        old = source.get(field.name)
        same = old is not None and datasets.Features({field.name: old}).arrow_schema.field(field.name).type == field.type
        kept[field.name] = old if same else inferred[field.name]
    return datasets.Features(kept)


def _format(dataset: Any) -> Dict[str, Any]:
    """The format of ``dataset`` (of its first split), ``format_kwargs`` spread out."""
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        dataset = dataset[next(iter(dataset))]
    if isinstance(dataset, datasets.Dataset):
        fmt = dict(dataset.format)
    else:
        formatting = getattr(dataset, "_formatting", None)
        fmt = {"type": formatting.format_type if formatting is not None else None}
    fmt.update(fmt.pop("format_kwargs", {}))
    return fmt


class PackingArgumentError(InvalidArgumentError):
    """What TRL's ``pack_dataset`` raises as ``ValueError`` (an unknown strategy, columns of
    different lengths): an :class:`stowplan.InvalidArgumentError`, itself a ``ValueError``, with
    TRL's message; ``argument`` names what was wrong (``"strategy"`` or the column), and so
    does a note on Python 3.11+."""

    def __init__(self, message: str, argument: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.argument, self.detail = argument, detail
        if detail and hasattr(self, "add_note"):
            self.add_note(detail)

    def __reduce__(self) -> Any:  # pickled whole (Dataset.map with num_proc sends it back)
        return type(self), (self.args[0], self.argument, self.detail)


class PackingColumnTypeError(PackingArgumentError, TypeError):
    """TRL's ``TypeError`` for a column that is not a list column, with TRL's message: also an
    :class:`stowplan.InvalidArgumentError`; ``argument`` is the column."""


def _not_a_list(name: str, type_: Any) -> PackingColumnTypeError:
    return PackingColumnTypeError(
        "Packing requires all columns to be lists of lists.", name, f"stowplan: column {name!r} is {type_}."
    )


def _lengths_differ(name: str, first: str) -> PackingArgumentError:
    return PackingArgumentError(
        "All columns must have values of the same length.", name, f"stowplan: column {name!r} differs from {first!r}."
    )


def _columns(batch: Any) -> List[Any]:
    """The batch's columns as arrays, checked as TRL checks them (in column order)."""
    columns = [c.chunks[0] for c in batch.combine_chunks().columns]
    for i, (name, column) in enumerate(zip(batch.column_names, columns)):
        if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
            raise _not_a_list(name, column.type)
        if i > 0 and not columns[0].offsets.equals(column.offsets):
            raise _lengths_differ(name, batch.column_names[0])
    return columns


def _offsets(values: np.ndarray, column: Any) -> Any:
    return pa.array(values.astype(column.offsets.type.to_pandas_dtype()))


def _pack_bfd(batch: Any, seq_length: int, split: bool) -> Any:
    """One map batch: empty sequences dropped, long ones truncated (or split), best fit decreasing."""
    names = batch.column_names
    columns = _columns(batch)
    lengths = pc.list_value_length(columns[0])
    keep = pc.greater(lengths, 0)
    columns = [pc.filter(c, keep) for c in columns]
    lengths = pc.filter(lengths, keep)
    if split:
        # The rows' fragments of seq_length tokens and the remainder, one after the other.
        frag = row_items(lengths.to_numpy().astype(np.int64), seq_length, "split", names[0])[1]
        ends = np.concatenate(([0], np.cumsum(frag)))
        columns = [type(c).from_arrays(_offsets(ends, c), c.flatten()) for c in columns]
    else:
        columns = [pc.list_slice(c, 0, min(seq_length, 2**63 - 1)) for c in columns]  # Arrow's stop is int64
    lengths = pc.list_value_length(columns[0])
    n = lengths.to_numpy().astype(np.int64)
    counts, order = _stowplan.trl_bfd(n, [len(n)], seq_length)
    counts = counts.astype(np.int32)
    ends = np.concatenate(([0], np.cumsum(n[order])))[counts]  # each row's first token
    idx = pa.array(order)
    out = [type(c).from_arrays(_offsets(ends, c), pc.take(c, idx).flatten()) for c in columns]
    out.append(pa.ListArray.from_arrays(pa.array(counts), pc.take(lengths, idx)))
    return pa.Table.from_arrays(out, names=names + [_SEQ_LENGTHS])


def _pack_wrapped(batch: Any, seq_length: int) -> Any:
    """One map batch: its tokens concatenated and cut every ``seq_length``."""
    columns = _columns(batch)
    values = [c.flatten() for c in columns]
    total = len(values[0])
    step = min(seq_length, total + 1)  # a longer seq_length cuts the same (int64 arithmetic)
    ends = np.concatenate((np.arange(0, total, step, dtype=np.int64), [total]))
    out = [type(c).from_arrays(_offsets(ends, c), v) for c, v in zip(columns, values)]
    return pa.Table.from_arrays(out, names=batch.column_names)
