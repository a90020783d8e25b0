"""Pack a Hugging Face dataset with the kernel, and train on the packed rows with transformers, TRL or a torch loop.

:func:`pack_dataset` runs :func:`stowplan.arrow.pack_table` on a ``Dataset``'s Arrow table and
returns an ordinary ``datasets.Dataset`` built from the packed table — no row becomes a Python
object, and with ``scope="dataset"`` (the default) one plan covers the whole dataset, so bins
cross what would be map batches and the result does not depend on ``num_proc``. An
``IterableDataset`` is streamed through the kernel's ``StreamPacker``
(:func:`stowplan.arrow.pack_batches`).

Training: :class:`PaddingFreeCollator` collates samples or packed rows in the layout an
attention backend runs fastest (:data:`LAYOUTS`; :func:`recommend_layout` picks one for a
model), torch tensors by default; :class:`TokenBudgetBatchSampler` forms micro-batches under a
hard token cap and :class:`PaddedBatchSampler` length-grouped padded ones, both balanced over
data-parallel ranks; :func:`check_packing` (and :class:`PackingCheckCallback`, for a
``Trainer``) proves that the packed samples do not see each other, raising
:class:`stowplan.errors.PackingContaminationError`. Needs ``datasets`` and ``pyarrow`` (``pip
install 'stowplan[hf]'``); the samplers, the check and the callback need torch (and
transformers).

>>> from datasets import Dataset
>>> import stowplan.hf
>>> ds = Dataset.from_dict({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]})
>>> packed = stowplan.hf.pack_dataset(ds, 4)
>>> packed[:]
{'input_ids': [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]], 'seq_lengths': [[4], [3, 1], [2]], 'position_ids': [[0, 1, 2, 3], [0, 1, 2, 0], [0, 1]]}
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from . import _stowplan
from ._collate import DEFAULT_LAYOUT, LAYOUTS, PaddingFreeCollator, recommend_layout
from .arrow import DEFAULT_STRATEGY, POSITION_IDS, SEQ_LENGTHS, pack_batches, pack_table
from . import _rows
from ._renamed import renamed
from .errors import InvalidArgumentError, PackingContaminationError, StowplanError  # noqa: F401 (re-exported)

try:
    import datasets
    import pyarrow as pa
    from datasets.iterable_dataset import ArrowExamplesIterable
except ImportError as exc:  # pragma: no cover - the hf extra installs them
    raise ImportError("stowplan.hf needs datasets and pyarrow: pip install 'stowplan[hf]'") from exc

__all__ = [
    "pack_dataset",
    "PaddingFreeCollator",
    "recommend_layout",
    "LAYOUTS",
    "DEFAULT_LAYOUT",
    "TokenBudgetBatchSampler",
    "PaddedBatchSampler",
    "check_packing",
    "PackingContaminationError",
    "PackingCheckCallback",
    "SCOPES",
    "DEFAULT_SCOPE",
]


def __getattr__(name: str) -> Any:
    # The samplers subclass torch's Sampler, the check runs torch and the callback is a
    # transformers TrainerCallback (when installed): they load on use.
    if name in ("TokenBudgetBatchSampler", "PaddedBatchSampler"):
        from . import _sampler

        return getattr(_sampler, name)
    if name in ("check_packing", "PackingCheckCallback"):
        from . import _check

        return getattr(_check, name)
    raise AttributeError(f"module 'stowplan.hf' has no attribute {name!r}")

#: ``"dataset"``: one plan over the whole dataset (identical for any ``num_proc``);
#: ``"batch"``: one plan per ``Dataset.map`` batch (``map_kwargs``' ``batch_size``, datasets'
#: default 1,000 rows), as TRL packs — bins never cross a batch, and the batches (so the
#: result) change with ``num_proc``.
SCOPES = ("dataset", "batch")
DEFAULT_SCOPE = "dataset"
# Rows read from an IterableDataset at a time (an Arrow batch); the packed rows do not depend on it.
_STREAM_ROWS = 1000


@renamed(seq_length="capacity")
def pack_dataset(
    dataset: Any,
    capacity: int,
    *,
    strategy: str = DEFAULT_STRATEGY,
    scope: str = DEFAULT_SCOPE,
    num_proc: Optional[int] = None,
    overflow: Optional[str] = None,
    columns: Optional[Sequence[str]] = None,
    position_ids: bool = True,
    map_kwargs: Optional[Dict[str, Any]] = None,
    max_open_bins: Optional[int] = None,
    max_buffered: Optional[int] = None,
    backend: Optional[str] = None,
    cache_file_name: Any = None,
) -> Any:
    """``dataset`` (a ``datasets.Dataset``, ``IterableDataset`` or a dict of them, each split packed on its own) with
    its list columns packed into rows of at most ``capacity`` tokens, as
    :func:`stowplan.arrow.pack_table` packs a table (``strategy``, ``overflow``, ``columns``,
    ``position_ids`` and ``backend`` are its; the output has the packed columns,
    ``seq_lengths`` and ``position_ids``, unless ``position_ids=False``; other columns are not
    carried over). Both boundary columns by default, so that the samples of a row stay apart
    whatever trainer drops columns: ``transformers.Trainer`` (``remove_unused_columns=True``)
    keeps ``position_ids``, a forward argument, and drops ``seq_lengths``; TRL's ``SFTTrainer``
    keeps ``seq_lengths`` and drops ``position_ids``; :class:`PaddingFreeCollator` reads either.

    ``scope`` (see :data:`SCOPES`): with ``"dataset"`` the result is an in-memory ``Dataset``
    whose fingerprint is a sha256 of the input's fingerprint, the options and the plan, so a
    re-run gives the same fingerprint; ``num_proc`` changes nothing (one kernel call plans
    everything) and ``map_kwargs`` is refused. With ``"batch"``, ``Dataset.map(batched=True,
    num_proc=num_proc, **map_kwargs)`` packs each batch (cached by ``datasets`` as maps are).
    The input's format type is kept.

    ``cache_file_name`` (``scope="dataset"`` only; a path, or for a ``DatasetDict`` a dict of
    one path per split, each its own file): the packed rows are written there, one record
    batch at a time, as an Arrow stream file (the format of datasets' cache files), and the
    result is memory-mapped from it with the same fingerprint as in memory — so the packed
    copy is never held in memory (peak memory: the input, the plan and one batch of at most
    2**26 tokens). The file is written to a temporary file of a unique name beside it, flushed
    to disk and renamed over it, so it is whole or absent; every call writes it anew (the plan
    is made again anyway). Give each packing its own path: the dataset reads its rows from
    that path, as datasets' own cache files are read, so a later write to the same path (a
    re-run with other options) replaces what it reads after pickling. A file of the dataset
    being packed (of any split) is refused before any work.

    A ``datasets.IterableDataset`` (or ``IterableDatasetDict``) is streamed: the result is an
    ``IterableDataset`` whose iteration reads the input in Arrow batches and packs them with
    :func:`stowplan.arrow.pack_batches` — the kernel's :class:`stowplan.StreamPacker`, whose
    ``max_open_bins`` and ``max_buffered`` bound the memory (they apply to streams only).
    Columns and overflow are as above; ``strategy`` is one of
    :data:`stowplan.arrow.STREAM_STRATEGIES` (``ffd`` needs every length first); ``scope``
    must be ``"dataset"`` (one packer over the whole stream); ``num_proc`` changes nothing.
    Every sample goes out once, in rows of at most ``capacity`` tokens, and a re-iteration
    gives the same rows (resume with datasets' ``state_dict``, which replays the stream).
    Argument errors are raised here; errors in the data (nulls, a non-list column, …) when the
    iteration reaches them, naming the row in the stream.

    >>> stream = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6], [7, 8, 9]]}).to_iterable_dataset()
    >>> [row["seq_lengths"] for row in pack_dataset(stream, 4)]
    [[3, 1], [3], [2]]
    """
    for splits in (datasets.DatasetDict, datasets.IterableDatasetDict):
        if isinstance(dataset, splits):
            options = dict(
                strategy=strategy,
                scope=scope,
                num_proc=num_proc,
                overflow=overflow,
                columns=columns,
                position_ids=position_ids,
                map_kwargs=map_kwargs,
                max_open_bins=max_open_bins,
                max_buffered=max_buffered,
                backend=backend,
            )
            files = _split_files(cache_file_name, dataset)
            packed = {}
            for split, ds in dataset.items():
                try:
                    packed[split] = pack_dataset(ds, capacity, **options, cache_file_name=files[split])
                except StowplanError as exc:  # which split, in the same error type
                    raise type(exc)(f"split {split!r}: {exc}") from exc
            return splits(packed)
    if not isinstance(dataset, (datasets.Dataset, datasets.IterableDataset)):
        raise InvalidArgumentError(
            f"dataset must be a datasets.Dataset, IterableDataset, DatasetDict or IterableDatasetDict (got {type(dataset).__name__})"
        )
    if not isinstance(scope, str) or scope not in SCOPES:
        raise InvalidArgumentError(f"scope must be 'dataset' or 'batch' (got {scope!r})")
    if num_proc is not None:
        _stowplan._integer(num_proc, "num_proc", 1, 4096)
    if map_kwargs is not None and not isinstance(map_kwargs, dict):
        raise InvalidArgumentError(f"map_kwargs must be a dict of Dataset.map arguments (got {type(map_kwargs).__name__})")
    if cache_file_name is not None and (scope != "dataset" or isinstance(dataset, datasets.IterableDataset)):
        raise InvalidArgumentError(
            "cache_file_name applies to a Dataset packed with scope='dataset' (scope='batch' takes map_kwargs' "
            "cache_file_name; an IterableDataset is streamed, not written)"
        )
    if isinstance(dataset, datasets.IterableDataset):
        if scope != "dataset" or map_kwargs:
            raise InvalidArgumentError(
                f"an IterableDataset is packed by one stream packer: scope must be 'dataset' and map_kwargs None (got scope={scope!r})"
            )
        return _pack_iterable(dataset, capacity, strategy, overflow, columns, position_ids, max_open_bins, max_buffered, backend)
    if max_open_bins is not None or max_buffered is not None:
        raise InvalidArgumentError(
            "max_open_bins and max_buffered bound the stream packer of an IterableDataset; a Dataset is planned whole: leave them None"
        )
    fmt = dataset.format
    source = dataset.with_format("arrow")
    names = list(columns) if columns is not None and not isinstance(columns, str) else columns
    if scope == "dataset":
        if map_kwargs:
            raise InvalidArgumentError("map_kwargs applies to scope='batch' only; scope='dataset' makes one plan, not a map")
        inputs = [f["filename"] for f in dataset.cache_files]
        path = None if cache_file_name is None else _checked_cache_file(cache_file_name, inputs)
        # Opened before any work: the host refuses a target that is not a regular file (a
        # device, a FIFO, a socket) there, and removes the temporary file if anything fails.
        with contextlib.ExitStack() as stack:
            sink = None if path is None else stack.enter_context(_stowplan.AtomicFile(path))
            table = source[:]  # the rows in the dataset's order (its indices mapping applied), zero-copy without one
            packed, digest = _rows.pack(table, capacity, strategy, overflow, names, position_ids, backend)
            fingerprint = hashlib.sha256(
                "\0".join(["stowplan.hf.pack_dataset", _stowplan.__version__, str(dataset._fingerprint), digest]).encode()
            ).hexdigest()[:16]
            info = datasets.DatasetInfo(features=datasets.Features.from_arrow_schema(packed.schema))
            if sink is None:
                table = datasets.table.InMemoryTable(packed.read_all())
            else:
                _write_packed(sink, packed)
                table = datasets.table.MemoryMappedTable.from_file(path)
        out = datasets.Dataset(table, info=info, split=dataset.split, fingerprint=fingerprint)
    else:
        _rows.check_rows(dataset.num_rows)  # Dataset.map would call nothing and add no columns
        kept = names if names is not None else list(dataset.column_names)
        out = source.map(
            _pack_batch,
            batched=True,
            num_proc=num_proc,
            remove_columns=[c for c in dataset.column_names if c not in kept],
            fn_kwargs={
                "capacity": capacity,
                "strategy": strategy,
                "overflow": overflow,
                "columns": names,
                "position_ids": position_ids,
                "backend": backend,
            },
            **(map_kwargs or {}),
        )
    new = [SEQ_LENGTHS] + ([POSITION_IDS] if position_ids else [])
    cols = fmt.get("columns")
    if cols is not None:
        cols = [c for c in cols if c in out.column_names] + new
    return out.with_format(fmt.get("type"), columns=cols, output_all_columns=fmt.get("output_all_columns", False), **fmt.get("format_kwargs", {}))


def _split_files(cache_file_name: Any, dataset: Any) -> Dict[str, Any]:
    """A ``DatasetDict``'s ``cache_file_name``: None for every split, or one path per split,
    each checked (:func:`_checked_cache_file`) against the files of every split before any
    split is packed."""
    splits = list(dataset)
    if cache_file_name is None:
        return {split: None for split in splits}
    if not isinstance(cache_file_name, dict) or sorted(cache_file_name) != sorted(splits):
        raise InvalidArgumentError(
            f"cache_file_name of a DatasetDict must be a dict with one path per split {sorted(splits)} (got {cache_file_name!r})"
        )
    seen: Dict[str, str] = {}
    # (An IterableDataset has no files; its cache_file_name is refused split by split.)
    inputs = [f["filename"] for ds in dataset.values() for f in getattr(ds, "cache_files", [])]
    for split in splits:
        real = os.path.realpath(_checked_cache_file(cache_file_name[split], inputs))
        if real in seen:
            raise InvalidArgumentError(
                f"cache_file_name gives splits {seen[real]!r} and {split!r} the same file {real!r}: one file per split"
            )
        seen[real] = split
    return cache_file_name


def _checked_cache_file(cache_file_name: Any, inputs: List[str]) -> str:
    """``cache_file_name`` as an absolute path, checked before any work: a non-empty path of
    a file in an existing directory, and none of the ``inputs`` (the files of the dataset
    being packed: writing one would replace the table being read)."""
    try:
        path = os.fspath(cache_file_name)
    except TypeError:
        raise InvalidArgumentError(f"cache_file_name must be a path (got {type(cache_file_name).__name__})") from None
    if not isinstance(path, str) or not path:
        raise InvalidArgumentError(f"cache_file_name must be a non-empty path (got {cache_file_name!r})")
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    if os.path.isdir(path):
        raise InvalidArgumentError(f"cache_file_name {path!r} is a directory; name a file")
    if not os.path.isdir(directory):
        raise InvalidArgumentError(f"cache_file_name {path!r}: its directory does not exist")
    for f in inputs:
        if os.path.exists(path) and os.path.exists(f) and os.path.samefile(path, f):
            raise InvalidArgumentError(
                f"cache_file_name {path!r} is a file of the dataset being packed: writing it would replace its table; "
                "name another file"
            )
    return path


def _write_packed(sink: Any, packed: Any) -> None:
    """Writes the packed batches (a ``RecordBatchReader``) into ``sink`` (the host's
    ``AtomicFile`` of the path :func:`_checked_cache_file` checked: a temporary file of a unique
    name beside it, fsynced, renamed over it, the directory fsynced; removed if the write
    fails) as an Arrow stream, batch by batch, and commits it."""
    with pa.ipc.new_stream(sink, packed.schema) as writer:
        for batch in packed:
            writer.write_batch(batch)
    sink.commit()


def _pack_iterable(
    dataset: Any,
    capacity: int,
    strategy: str,
    overflow: Optional[str],
    columns: Optional[Sequence[str]],
    position_ids: bool,
    max_open_bins: Optional[int],
    max_buffered: Optional[int],
    backend: Optional[str],
) -> Any:
    """The ``IterableDataset`` of ``dataset`` streamed through :func:`pack_batches`."""
    names = list(columns) if columns is not None and not isinstance(columns, str) else columns
    options = {
        "strategy": strategy,
        "overflow": overflow,
        "columns": names,
        "position_ids": position_ids,
        "max_open_bins": max_open_bins,
        "max_buffered": max_buffered,
        "backend": backend,
    }
    pack_batches([], capacity, **options)  # checks the arguments now (iterates nothing)
    features = None
    if dataset.features is not None:  # the output's types, and the columns checked now
        schema = dataset.features.arrow_schema
        kept = _rows.check_columns(schema.empty_table(), names, position_ids)
        new = [pa.field(SEQ_LENGTHS, pa.list_(pa.int32()))] + ([pa.field(POSITION_IDS, pa.list_(pa.int32()))] if position_ids else [])
        features = datasets.Features.from_arrow_schema(pa.schema([schema.field(n) for n in kept] + new))
    generate = functools.partial(_packed_tables, dataset, capacity, options)
    out = datasets.IterableDataset(
        ArrowExamplesIterable(generate, {}),
        info=datasets.DatasetInfo(features=features),
        split=dataset.split,
    )
    formatting = getattr(dataset, "_formatting", None)
    return out.with_format(formatting.format_type) if formatting is not None and formatting.format_type else out


def _packed_tables(dataset: Any, capacity: int, options: Dict[str, Any]) -> Iterator[Tuple[str, Any]]:
    """The packed tables of one iteration of ``dataset`` (keyed as datasets wants)."""
    if getattr(dataset._ex_iterable, "iter_arrow", None) is not None:  # Arrow all the way (Parquet, to_iterable_dataset …)
        batches = dataset.with_format("arrow").iter(batch_size=_STREAM_ROWS)
    else:
        # Python examples (from_generator): datasets' own Arrow rebatching fails on a batch whose
        # lists are all empty (typed null, datasets 5.2), so the batches are built here, typed by
        # the features when known.
        schema = dataset.features.arrow_schema if dataset.features is not None else None
        batches = (pa.table(b, schema=schema) for b in dataset.with_format(None).iter(batch_size=_STREAM_ROWS))
    for i, table in enumerate(pack_batches(batches, capacity, **options)):
        yield str(i), table


def _pack_batch(table: Any, **options: Any) -> Any:
    """One map batch packed (an empty batch stays empty, with the output's columns)."""
    if table.num_rows == 0:
        names = options["columns"] if options["columns"] is not None else table.column_names
        empty = {n: table.column(n) for n in names}
        empty[SEQ_LENGTHS] = pa.array([], pa.list_(pa.int32()))
        if options["position_ids"]:
            empty[POSITION_IDS] = pa.array([], pa.list_(pa.int32()))
        return pa.table(empty)
    return pack_table(table, options.pop("capacity"), **options)
