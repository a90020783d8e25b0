"""Ray Data for stowplan.ray (``pip install 'stowplan[ray]'``): per-row lengths of a Ray Dataset
(:func:`compute_lengths`) and a Ray Dataset's rows packed on the cluster (:func:`pack_dataset`).
Import them from :mod:`stowplan.ray`."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import ray
import ray.data

from . import _stowplan
from ._plan import checked_length
from ._renamed import renamed
from .errors import InvalidArgumentError, StowplanError

__all__ = ["compute_lengths", "pack_dataset"]


def cause_of(e: BaseException) -> BaseException:
    """The StowplanError a Ray task raised (Ray Data wraps a UDF's in UserCodeException), or e."""
    seen: Optional[BaseException] = e
    for _ in range(8):
        if seen is None or isinstance(seen, StowplanError):
            break
        seen = getattr(seen, "cause", None) or seen.__cause__
    return seen if isinstance(seen, StowplanError) else e


def compute_lengths(
    dataset: Any,
    *,
    column: Optional[str] = None,
    length_fn: Optional[Callable[[Dict[str, Any]], int]] = None,
    batch_size: Optional[int] = 4096,
) -> np.ndarray:
    """Per-row lengths of a Ray Dataset, computed on the cluster with ``map_batches``, in the
    dataset's row order (a ``uint64`` array, whatever the number of blocks or workers).

    Pass exactly one of ``column`` (a column of token sequences: each row's length is the
    sequence's; or of integer lengths, taken as they are) and ``length_fn`` (called with each
    row as a dict; returns an integer >= 0, as :func:`stowplan.compute_lengths`'s).
    """
    if not isinstance(dataset, ray.data.Dataset):
        raise InvalidArgumentError(f"dataset must be a ray.data.Dataset (got {type(dataset).__name__})")
    if (column is None) == (length_fn is None):
        raise InvalidArgumentError("pass exactly one of column= and length_fn=")
    if length_fn is not None and not callable(length_fn):
        raise InvalidArgumentError(f"length_fn must be callable (got {type(length_fn).__name__})")
    if column is not None:
        if not isinstance(column, str):
            raise InvalidArgumentError(f"column must be a column name (got {column!r})")
        names = dataset.schema().names
        if column not in names:
            raise InvalidArgumentError(f"column {column!r} is not in the dataset (columns: {names})")
        fn: Callable[[Any], Dict[str, np.ndarray]] = _column_lengths(column)
    else:
        fn = _row_lengths(length_fn)
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise InvalidArgumentError(f"batch_size must be None or an integer >= 1 (got {batch_size!r})")
    mapped = dataset.map_batches(fn, batch_format="pyarrow", batch_size=batch_size)
    with _execution(mapped):  # in the dataset's row order
        parts = [np.asarray(b["length"], dtype=np.uint64) for b in mapped.iter_batches(batch_format="numpy", batch_size=None)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)


def _column_lengths(column: str) -> Callable[[Any], Dict[str, np.ndarray]]:
    def lengths(table: Any) -> Dict[str, np.ndarray]:
        import pyarrow as pa
        import pyarrow.compute as pc

        col = table.column(column)
        if col.null_count:
            raise InvalidArgumentError(f"column {column!r} has null values")
        t = col.type
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
            out = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        elif pa.types.is_integer(t):
            out = col.to_numpy()
            if len(out) and out.min() < 0:
                raise InvalidArgumentError(f"column {column!r} has negative lengths")
        else:
            raise InvalidArgumentError(f"column {column!r} must hold sequences or integer lengths (type {t})")
        return {"length": np.asarray(out, dtype=np.uint64)}

    return lengths


def _row_lengths(length_fn: Callable[[Dict[str, Any]], int]) -> Callable[[Any], Dict[str, np.ndarray]]:
    def lengths(table: Any) -> Dict[str, np.ndarray]:
        rows = table.to_pylist()
        return {"length": np.array([checked_length(length_fn(r), i) for i, r in enumerate(rows)], dtype=np.uint64)}

    return lengths


# Tokens per output block of pack_dataset (when num_blocks is None): Ray Data's blocks are
# ~128 MiB; 2**24 tokens are 64 MiB per int32 column.
_BLOCK_TOKENS = 1 << 24
_UID, _ROW, _CHUNK, _LEN = "__stowplan_uid", "__stowplan_row", "__stowplan_block", "__stowplan_length"


@renamed(seq_length="capacity")
def pack_dataset(
    dataset: Any,
    capacity: int,
    *,
    strategy: str = "bfd",
    overflow: Optional[str] = None,
    columns: Optional[List[str]] = None,
    position_ids: bool = False,
    backend: Optional[str] = None,
    num_blocks: Optional[int] = None,
) -> Any:
    """The rows of a Ray Dataset packed into rows of at most ``capacity`` tokens: the rows
    :func:`stowplan.arrow.pack_table` gives for the same rows (same options, same columns and
    types, same order), as a materialized Ray Dataset, whatever the number of blocks.

    On the cluster: the dataset is materialized once with a row id, each row's length is
    read there (``map_batches``), the driver makes the one kernel plan
    :func:`~stowplan.arrow.pack_table` makes, then ``map_batches`` tags every row with the
    output block(s) its tokens go to and ``groupby(...).map_groups`` (a sort-based shuffle:
    ``map_batches`` over the sorted groups) assembles each output block with
    :mod:`stowplan.arrow`'s own assembly. ``num_blocks``: the groups of whole packed rows
    assembled, one ``map_groups`` call each (default: one per 2**24 tokens; Ray may store
    several in one block). Errors are :func:`~stowplan.arrow.pack_table`'s; a row number in one is
    counted within a batch of the dataset. Needs a Ray with
    ``ray.data.expressions.monotonically_increasing_id``.
    """
    from . import _rows, arrow as sa

    pa = sa.pa
    if not isinstance(dataset, ray.data.Dataset):
        raise InvalidArgumentError(f"dataset must be a ray.data.Dataset (got {type(dataset).__name__})")
    capacity = _stowplan._integer(capacity, "capacity", 1, sa.MAX_CAPACITY)
    strategy, overflow = _rows.check_strategy(strategy, overflow)
    if not isinstance(position_ids, bool):
        raise InvalidArgumentError(f"position_ids must be True or False (got {position_ids!r})")
    if num_blocks is not None and (isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1):
        raise InvalidArgumentError(f"num_blocks must be None or an integer >= 1 (got {num_blocks!r})")
    schema = dataset.schema()
    if schema is None:
        raise InvalidArgumentError("the dataset is empty: there are no rows to pack")
    base = getattr(schema, "base_schema", schema)
    if not isinstance(base, pa.Schema):
        raise InvalidArgumentError(f"the dataset must hold Arrow blocks (its schema is {schema!r})")
    names = _rows.check_columns(base.empty_table(), columns, position_ids)
    try:
        from ray.data.expressions import monotonically_increasing_id
    except ImportError as e:  # pragma: no cover - older Ray
        raise ImportError("stowplan.ray.pack_dataset needs ray.data.expressions.monotonically_increasing_id (a newer Ray)") from e

    with _execution(dataset):
        tagged = dataset.with_column(_UID, monotonically_increasing_id()).materialize()
        uids, lengths = _uid_lengths(tagged, names)
    if lengths.size == 0:
        raise InvalidArgumentError("the dataset is empty: there are no rows to pack")
    if lengths.size > sa.MAX_SEQUENCE_LENGTH:
        raise InvalidArgumentError(f"the dataset has {lengths.size} rows; at most 2**32-1 can be packed at once")
    starts, item_lengths, bin_offsets = _rows.plan_items(lengths, capacity, strategy, overflow, names[0], backend)
    plan = _block_plan(lengths, starts, item_lengths, bin_offsets, num_blocks)
    plan["uid_of_pair"] = uids[plan["pair_row"]]
    order = np.argsort(plan["uid_of_pair"], kind="stable")
    for k in ("uid_of_pair", "pair_row", "pair_block"):
        plan[k] = plan[k][order]
    ref = ray.put(plan)
    with _execution(tagged, sort_shuffle=True):
        out = (
            tagged.map_batches(_tag(ref), batch_format="pyarrow", zero_copy_batch=True)
            .groupby(_CHUNK, num_partitions=int(plan["block_starts"].size - 1))
            .map_groups(_assembler(ref, names, position_ids), batch_format="pyarrow")
            .materialize()
        )
    return out


class _execution:
    """Runs with a dataset's DataContext set for this module's executions, then puts it back
    (a Dataset runs with the context it holds, which the datasets derived from it share): the
    order of blocks preserved (results in the dataset's row order), a UDF's own exception
    raised (a StowplanError comes out as itself) and, with ``sort_shuffle``, a sort-based
    shuffle (groups in key order)."""

    def __init__(self, dataset: Any, *, sort_shuffle: bool = False) -> None:
        self.ctx = dataset.context if hasattr(dataset, "context") else ray.data.DataContext.get_current()
        self.sort_shuffle = sort_shuffle

    def __enter__(self) -> None:
        ctx = self.ctx
        self.saved = (
            ctx.execution_options.preserve_order,
            getattr(ctx, "raise_original_map_exception", None),
            getattr(ctx, "shuffle_strategy", None),
        )
        ctx.execution_options.preserve_order = True
        if self.saved[1] is not None:
            ctx.raise_original_map_exception = True
        if self.sort_shuffle and self.saved[2] is not None:
            from ray.data.context import ShuffleStrategy

            ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED

    def __exit__(self, kind: Any, e: Any, tb: Any) -> None:
        ctx = self.ctx
        ctx.execution_options.preserve_order = self.saved[0]
        if self.saved[1] is not None:
            ctx.raise_original_map_exception = self.saved[1]
        if self.saved[2] is not None:
            ctx.shuffle_strategy = self.saved[2]
        if isinstance(e, ray.exceptions.RayTaskError):
            cause = cause_of(e)
            if cause is not e:
                raise cause from None


def _uid_lengths(tagged: Any, names: List[str]) -> Tuple[np.ndarray, np.ndarray]:
    """Every row's id and length (int64), in the dataset's row order, checked as pack_table checks."""

    def lengths(table: Any) -> Dict[str, np.ndarray]:
        from ._rows import column_lengths

        return {_UID: table.column(_UID).to_numpy(), _LEN: column_lengths(table, names)}

    parts = list(tagged.map_batches(lengths, batch_format="pyarrow", batch_size=None).iter_batches(batch_format="numpy", batch_size=None))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return (np.concatenate([p[_UID] for p in parts]).astype(np.int64), np.concatenate([p[_LEN] for p in parts]).astype(np.int64))


def _block_plan(
    lengths: np.ndarray, starts: np.ndarray, item_lengths: np.ndarray, bin_offsets: np.ndarray, num_blocks: Optional[int]
) -> Dict[str, np.ndarray]:
    """The plan's items cut into output blocks of whole packed rows (about equal tokens): each
    item's input row and offset in it, the first packed row of every block, and the (input
    row, output block) pairs: which block needs which row."""
    row_starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    # An item's row: the last row starting at or before its first token (empty rows have no items).
    item_row = np.searchsorted(row_starts, starts, side="right").astype(np.int64) - 1
    n_rows = bin_offsets.size - 1
    item_ends = np.concatenate(([0], np.cumsum(item_lengths))).astype(np.int64)
    before = item_ends[bin_offsets[:-1]]  # tokens before each packed row
    total = int(item_ends[-1])
    if num_blocks is None:
        num_blocks = -(-total // _BLOCK_TOKENS)
    num_blocks = max(1, min(num_blocks, n_rows))
    bin_block = (before * num_blocks) // max(total, 1)
    block_starts = np.searchsorted(bin_block, np.arange(num_blocks + 1), side="left").astype(np.int64)
    item_block = np.repeat(bin_block, np.diff(bin_offsets))
    pairs = np.unique(item_row * num_blocks + item_block)
    return {
        "item_row": item_row,
        "item_off": starts - row_starts[item_row],
        "item_len": item_lengths.astype(np.int64),
        "bin_offsets": bin_offsets.astype(np.int64),
        "block_starts": block_starts,
        "pair_row": pairs // num_blocks,
        "pair_block": pairs % num_blocks,
    }


def _tag(ref: Any) -> Callable[[Any], Any]:
    """map_batches: every row once per output block that takes tokens of it, with its row
    number and that block (rows no packed row takes are left out)."""

    def tag(table: Any) -> Any:
        import pyarrow as pa

        plan = ray.get(ref)
        uids = table.column(_UID).to_numpy()
        lo = np.searchsorted(plan["uid_of_pair"], uids, side="left")
        counts = np.searchsorted(plan["uid_of_pair"], uids, side="right") - lo
        take = np.repeat(np.arange(len(uids), dtype=np.int64), counts)
        pick = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(take.size, dtype=np.int64)
        out = table.take(pa.array(take)).drop_columns([_UID])
        out = out.append_column(_ROW, pa.array(plan["pair_row"][pick]))
        return out.append_column(_CHUNK, pa.array(plan["pair_block"][pick]))

    return tag


def _assembler(ref: Any, names: List[str], position_ids: bool) -> Callable[[Any], Any]:
    """map_groups: one output block's packed rows, from the input rows it takes, by
    :mod:`stowplan.arrow`'s assembly."""

    def assemble(group: Any) -> Any:
        import pyarrow.compute as pc

        from ._rows import assemble, Flat

        plan = ray.get(ref)
        block = int(group.column(_CHUNK)[0].as_py())
        group = group.take(pc.sort_indices(group.column(_ROW)))
        rows = group.column(_ROW).to_numpy()
        lens = pc.list_value_length(group.column(names[0])).to_numpy(zero_copy_only=False).astype(np.int64)
        flat = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)
        b0, b1 = int(plan["block_starts"][block]), int(plan["block_starts"][block + 1])
        i0, i1 = int(plan["bin_offsets"][b0]), int(plan["bin_offsets"][b1])
        local = flat[np.searchsorted(rows, plan["item_row"][i0:i1])] + plan["item_off"][i0:i1]
        offsets = plan["bin_offsets"][b0 : b1 + 1] - i0
        values = {name: Flat.of(pc.list_flatten(group.column(name))) for name in names}
        types = {name: group.schema.field(name).type for name in names}
        return assemble(values, types, local, plan["item_len"][i0:i1], offsets, position_ids).read_all()

    return assemble
