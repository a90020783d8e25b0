"""stowplan.arrow.pack_table: Arrow-native packing by the kernel's plan."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan

pa = pytest.importorskip("pyarrow")
from stowplan.arrow import OVERFLOWS, STRATEGIES, STREAM_STRATEGIES, pack_batches, pack_table  # noqa: E402


def table_of(lengths, *, extra=True, large=False, chunks=1):
    """input_ids numbered 0.. in row order (every token distinct), labels = -input_ids."""
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    values = np.arange(int(offsets[-1]), dtype=np.int32)
    cls, off = (pa.LargeListArray, offsets) if large else (pa.ListArray, offsets.astype(np.int32))
    ids = cls.from_arrays(pa.array(off), pa.array(values))
    cols = {"input_ids": ids}
    if extra:
        cols["labels"] = cls.from_arrays(pa.array(off), pa.array(-values))
    t = pa.table(cols)
    if chunks > 1 and len(lengths) >= chunks:
        cut = len(lengths) // chunks
        t = pa.concat_tables([t.slice(i * cut, cut if i < chunks - 1 else None) for i in range(chunks)])
    return t


def rows_of(packed, name="input_ids"):
    return packed.column(name).to_pylist()


def test_the_docstring_example():
    t = pa.table({"input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10], [11]]})
    assert pack_table(t, 4).to_pydict() == {
        "input_ids": [[1, 2, 3, 4], [8, 9, 10, 11], [6, 7]],
        "seq_lengths": [[4], [3, 1], [2]],
    }


def test_bins_are_the_kernels_plan():
    lengths = [5, 3, 7, 2, 6]
    packed = pack_table(table_of(lengths, extra=False), 10, strategy="ffd")
    plan = stowplan.pack(lengths, 10, method="ffd")
    starts = np.concatenate(([0], np.cumsum(lengths)))
    assert rows_of(packed) == [[t for i in b for t in range(starts[i], starts[i + 1])] for b in plan.bins]
    assert packed.column("seq_lengths").to_pylist() == [[lengths[i] for i in b] for b in plan.bins]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_types_and_columns(strategy):
    t = table_of([3, 9, 0, 4], large=True).append_column("tag", pa.array(["a", "b", "c", "d"]))
    packed = pack_table(t, 5, strategy=strategy, columns=["labels", "input_ids"], position_ids=True)
    assert packed.column_names == ["labels", "input_ids", "seq_lengths", "position_ids"]
    assert packed.schema.field("input_ids").type == t.schema.field("input_ids").type  # large_list kept
    assert packed.schema.field("seq_lengths").type == pa.list_(pa.int32())
    assert packed.schema.field("position_ids").type == pa.list_(pa.int32())
    assert [[-v for v in r] for r in rows_of(packed, "labels")] == rows_of(packed)
    for ids, seqs, pos in zip(rows_of(packed), rows_of(packed, "seq_lengths"), rows_of(packed, "position_ids")):
        assert sum(seqs) == len(ids) <= 5 and 0 not in seqs
        assert pos == [p for n in seqs for p in range(n)]


def test_overflow_policies():
    t = table_of([2, 7, 3], extra=False)  # tokens 0-1, 2-8, 9-11
    assert rows_of(pack_table(t, 4)) == [[2, 3, 4, 5], [9, 10, 11], [0, 1]]  # truncate (TRL's default)
    assert rows_of(pack_table(t, 4, overflow="drop")) == [[9, 10, 11], [0, 1]]
    split = pack_table(t, 4, overflow="split")
    assert sorted(v for r in rows_of(split) for v in r) == list(range(12))
    assert sorted(n for r in rows_of(split, "seq_lengths") for n in r) == [2, 3, 3, 4]
    assert pack_table(t, 4, strategy="bfd_split").equals(split)
    with pytest.raises(stowplan.InfeasibleError, match=r"column 'input_ids' row 1 has 7 values, more than capacity = 4"):
        pack_table(t, 4, overflow="error")
    assert rows_of(pack_table(t, 7, overflow="error")) == [[2, 3, 4, 5, 6, 7, 8], [0, 1, 9, 10, 11]]


def test_wrapped_cuts_the_concatenation():
    t = table_of([3, 0, 5, 1], extra=False)
    packed = pack_table(t, 4, strategy="wrapped", position_ids=True)
    assert rows_of(packed) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert rows_of(packed, "seq_lengths") == [[3, 1], [4], [1]]
    # Positions restart at every piece, as seq_lengths delimits them.
    assert rows_of(packed, "position_ids") == [[0, 1, 2, 0], [0, 1, 2, 3], [0]]


def test_chunked_and_sliced_tables():
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 40, size=300)
    whole = table_of(lengths)
    for strategy in STRATEGIES:
        a = pack_table(whole, 64, strategy=strategy)
        b = pack_table(table_of(lengths, chunks=7), 64, strategy=strategy)
        assert a.to_pydict() == b.to_pydict()
    # A slice whose list offsets do not start at 0.
    sliced = whole.slice(100, 50)
    packed = pack_table(sliced, 64, strategy="next-fit")
    assert [v for r in rows_of(packed) for v in r] == [v for r in sliced.column("input_ids").to_pylist() for v in r]


def test_record_batches_and_native_backend():
    t = table_of([4, 1, 3, 3])
    a = pack_table(t.to_batches()[0], 5)
    assert a.equals(pack_table(t, 5, backend="native"))


def test_all_empty_or_dropped_gives_no_rows():
    packed = pack_table(table_of([0, 0]), 4)
    assert packed.num_rows == 0 and packed.column_names == ["input_ids", "labels", "seq_lengths"]
    assert pack_table(table_of([9, 8]), 4, overflow="drop").num_rows == 0


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda t: pack_table(t, 0), "capacity must be in 1..=2147483647"),
        (lambda t: pack_table(t, 2**31), "capacity must be in 1..=2147483647"),
        (lambda t: pack_table(t, 4.0), "capacity must be an integer"),
        (lambda t: pack_table(t, 4, strategy="best"), "strategy must be 'bfd', 'ffd', 'next-fit', 'bfd_split' or 'wrapped'"),
        (lambda t: pack_table(t, 4, overflow="wrap"), "overflow must be 'truncate', 'split', 'drop' or 'error'"),
        (lambda t: pack_table(t, 4, strategy="wrapped", overflow="drop"), "overflow does not apply to strategy 'wrapped'"),
        (lambda t: pack_table(t, 4, strategy="bfd_split", overflow="drop"), "overflow must be unset or 'split'"),
        (lambda t: pack_table(t, 4, position_ids=1), "position_ids must be True or False"),
        (lambda t: pack_table(t, 4, columns=["input_ids", "mask"]), "column 'mask' is not in the table"),
        (lambda t: pack_table(t, 4, columns="input_ids"), "columns must be a list of column names"),
        (lambda t: pack_table(t, 4, columns=[]), "columns must name at least one list column"),
        (lambda t: pack_table(t, 4, columns=["labels", "labels"]), "columns must not repeat a name"),
        (lambda t: pack_table(t.append_column("text", pa.array(["a", "b", "c"])), 4), "column 'text' is not a list column (its type is Utf8); name the list columns to pack with columns"),
        (lambda t: pack_table(t.append_column("seq_lengths", t.column("labels")), 4), "column 'seq_lengths' is an output column"),
        (
            lambda t: pack_table(t.append_column("tag", pa.array([["a"], ["b"], ["a"]], type=pa.list_(pa.dictionary(pa.int32(), pa.string())))), 4),
            "column 'tag' holds Dictionary(Int32, Utf8) values, which packing does not take (decode the dictionary first",
        ),
        (lambda t: pack_table(t.append_column("position_ids", t.column("labels")), 4, position_ids=True), "column 'position_ids' is an output column"),
        (lambda t: pack_table(t.slice(0, 0), 4), "the table is empty"),
        (lambda t: pack_table([[1, 2]], 4), "table must be a pyarrow.Table or RecordBatch (got list)"),
        (
            lambda t: pack_table(t.set_column(1, "labels", pa.array([[1, 2], [3, 4, 5], [6]])), 4),
            "column 'labels' does not have the offsets of column 'input_ids': row 1 has 3 values, not 2",
        ),
        (
            lambda t: pack_table(t.set_column(1, "labels", pa.array([[1, 2], None, [6, 7, 8]])), 4),
            "column 'labels' has a null at row 1",
        ),
    ],
)
def test_bad_input_names_the_argument_column_and_row(call, fragment):
    t = table_of([2, 2, 3])
    with pytest.raises(stowplan.InvalidArgumentError) as info:
        call(t)
    assert fragment in str(info.value)


def test_lengths_over_2_32_are_refused():
    # A large_list row longer than 2**32-1 values, without allocating them: a null-typed child.
    values = pa.nulls(2**32 + 1)
    col = pa.LargeListArray.from_arrays(pa.array([0, 1, 2**32 + 1], pa.int64()), values)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"column 'x' row 1 has 4294967296 values, more than 2\*\*32-1"):
        pack_table(pa.table({"x": col}), 4)


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 60), min_size=1, max_size=80),
    seq_length=st.integers(1, 64),
    strategy=st.sampled_from(["bfd", "ffd", "next-fit"]),
    overflow=st.sampled_from(OVERFLOWS),
    chunks=st.integers(1, 3),
)
def test_properties(lengths, seq_length, strategy, overflow, chunks):
    lengths = np.array(lengths)
    t = table_of(lengths, chunks=chunks)
    if overflow == "error" and (lengths > seq_length).any():
        with pytest.raises(stowplan.InfeasibleError):
            pack_table(t, seq_length, strategy=strategy, overflow=overflow)
        return
    packed = pack_table(t, seq_length, strategy=strategy, overflow=overflow, position_ids=True)
    rows, seqs = rows_of(packed), rows_of(packed, "seq_lengths")
    assert all(0 < len(r) <= seq_length for r in rows)
    assert [sum(s) for s in seqs] == [len(r) for r in rows]
    assert rows_of(packed, "labels") == [[-v for v in r] for r in rows]
    tokens = sorted(v for r in rows for v in r)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    if overflow == "truncate":
        expected = [v for i, n in enumerate(lengths) for v in range(starts[i], starts[i] + min(n, seq_length))]
    elif overflow == "drop":
        expected = [v for i, n in enumerate(lengths) if n <= seq_length for v in range(starts[i], starts[i + 1])]
    else:  # split, or error with nothing too long: every token exactly once
        expected = list(range(int(starts[-1])))
    assert tokens == expected
    # Each sequence's tokens stay together and in order.
    for r, s in zip(rows, seqs):
        at = 0
        for n in s:
            assert r[at : at + n] == list(range(r[at], r[at] + n))
            at += n


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=60), seq_length=st.integers(1, 32))
def test_wrapped_properties(lengths, seq_length):
    packed = pack_table(table_of(lengths), seq_length, strategy="wrapped")
    rows = rows_of(packed)
    assert [v for r in rows for v in r] == list(range(sum(lengths)))
    assert all(len(r) == seq_length for r in rows[:-1]) and 0 < len(rows[-1]) <= seq_length if rows else True
    assert [sum(s) for s in rows_of(packed, "seq_lengths")] == [len(r) for r in rows]


# --- stowplan.arrow.pack_batches: a stream of batches through the kernel's StreamPacker ---------


def cut(table, sizes):
    """``table`` cut into consecutive batches of the given row counts (the rest in the last)."""
    out, at = [], 0
    for n in sizes:
        if at >= table.num_rows:
            break
        out.append(table.slice(at, n))
        at += n
    if at < table.num_rows:
        out.append(table.slice(at))
    return out


def streamed(batches, seq_length, **options):
    tables = list(pack_batches(batches, seq_length, **options))
    assert all(t.num_rows for t in tables)
    return pa.concat_tables(tables) if tables else None


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=80),
    seq_length=st.integers(1, 48),
    sizes=st.lists(st.integers(0, 25), max_size=8),
    strategy=st.sampled_from(STREAM_STRATEGIES),
    overflow=st.sampled_from([None, "truncate", "split", "drop"]),
    max_open_bins=st.integers(1, 4),
    max_buffered=st.integers(0, 6),
)
def test_stream_properties(lengths, seq_length, sizes, strategy, overflow, max_open_bins, max_buffered):
    t = table_of(lengths)
    if strategy == "wrapped" or strategy == "bfd_split":
        overflow = None
    options = {"strategy": strategy, "overflow": overflow, "position_ids": True}
    if strategy in ("bfd", "bfd_split"):
        options.update(max_open_bins=max_open_bins, max_buffered=max_buffered)
    whole = pack_table(t, seq_length, strategy=strategy, overflow=overflow, position_ids=True)
    if whole.num_rows == 0:
        assert streamed(cut(t, sizes), seq_length, **options) is None
        return
    out = streamed(cut(t, sizes), seq_length, **options)
    # Where the stream is cut changes nothing.
    assert out.equals(streamed([t], seq_length, **options))
    assert out.schema == whole.schema
    if strategy in ("next-fit", "wrapped"):  # the static strategy exactly
        assert out.equals(whole)
    rows, seqs = rows_of(out), out.column("seq_lengths").to_pylist()
    assert all(len(r) <= seq_length for r in rows) and [sum(s) for s in seqs] == [len(r) for r in rows]
    assert rows_of(out, "labels") == [[-v for v in r] for r in rows]
    # The same sequences (tokens) as the static packing: every sample once, none lost.
    assert sorted(v for r in rows for v in r) == sorted(v for r in rows_of(whole) for v in r)
    assert sorted(n for s in seqs for n in s) == sorted(n for s in whole.column("seq_lengths").to_pylist() for n in s)
    if strategy in ("bfd", "bfd_split"):  # the kernel's stream packer's bins, in closing order
        items = [n for s in _stream_items(t, seq_length, overflow or ("split" if strategy == "bfd_split" else "truncate")) for n in s]
        p = stowplan.StreamPacker(seq_length, max_open_bins=max_open_bins, max_buffered=max_buffered)
        bins = p.add(items) + p.finish()
        assert seqs == [[items[i] for i in b] for b in bins]


def _stream_items(t, seq_length, overflow):
    """The item lengths of the stream in order, as pack_table's overflow makes them."""
    out = []
    for n in (len(r) for r in t.column("input_ids").to_pylist()):
        if n == 0 or (overflow == "drop" and n > seq_length):
            continue
        if overflow == "split":
            out.append([min(seq_length, n - k) for k in range(0, n, seq_length)])
        else:
            out.append([min(n, seq_length)])
    return out


def test_stream_memory_is_let_go():
    # A batch is held only while a sequence of it waits: with one open bin and no buffer, at
    # most the batch in hand and the one before it.
    from stowplan import arrow

    held_sizes = []
    real = arrow._emit

    def spy(bins, held, types, position_ids):
        out = real(bins, held, types, position_ids)
        held_sizes.append(len(held))
        return out

    t = table_of(np.random.default_rng(5).integers(1, 20, size=400))
    arrow._emit = spy
    try:
        out = streamed(cut(t, [10] * 40), 32, strategy="next-fit")
    finally:
        arrow._emit = real
    assert out.equals(pack_table(t, 32, strategy="next-fit"))
    assert max(held_sizes) <= 2 and held_sizes[-1] == 0


@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda b: pack_batches(b, 8, strategy="ffd"), stowplan.InvalidArgumentError, "strategy 'ffd' needs every length"),
        (lambda b: pack_batches(b, 8, strategy="wrapped", max_buffered=3), stowplan.InvalidArgumentError, "do not apply to strategy 'wrapped'"),
        (lambda b: pack_batches(b, 8, strategy="next-fit", max_open_bins=2), stowplan.InvalidArgumentError, "max_open_bins=1, max_buffered=0"),
        (lambda b: pack_batches(b, 8, max_open_bins=0), stowplan.InvalidArgumentError, "max_open_bins"),
        (lambda b: pack_batches(b, 0), stowplan.InvalidArgumentError, "capacity must be in 1..="),
        (lambda b: pack_batches(b, 8, overflow="wrap"), stowplan.InvalidArgumentError, "overflow must be 'truncate', 'split', 'drop' or 'error'"),
        (lambda b: list(pack_batches([], 8)), stowplan.InvalidArgumentError, "the stream is empty"),
        (lambda b: list(pack_batches([b[0].slice(0, 0)], 8)), stowplan.InvalidArgumentError, "the stream is empty"),
        (lambda b: list(pack_batches(b + [[1, 2]], 8)), stowplan.InvalidArgumentError, "batch 2 of the stream must be a pyarrow.Table"),
        (lambda b: list(pack_batches(b, 8, columns=["ids"])), stowplan.InvalidArgumentError, "column 'ids' is not in the table"),
        (
            lambda b: list(pack_batches([b[0], pa.table({"input_ids": pa.array([[1], None], pa.list_(pa.int32()))})], 8, columns=["input_ids"])),
            stowplan.InvalidArgumentError,
            "column 'input_ids' has a null at row 4",
        ),
        (
            lambda b: list(pack_batches([b[0], pa.table({"input_ids": pa.array([[1]], pa.list_(pa.int64()))})], 8, columns=["input_ids"])),
            stowplan.InvalidArgumentError,
            "column 'input_ids' is list<item: int64> in batch 1 of the stream, list<item: int32> before",
        ),
        (lambda b: list(pack_batches(b, 2, overflow="error")), stowplan.InfeasibleError, "column 'input_ids' row 3 has 9 values"),
    ],
)
def test_stream_bad_input(call, error, fragment):
    batches = cut(table_of([1, 2, 0, 9, 3]), [3])
    with pytest.raises(error) as info:
        call(batches)
    assert fragment in str(info.value)


@pytest.mark.parametrize("strategy", ["bfd", "wrapped"])
def test_values_of_any_type_and_with_nulls_inside_rows(strategy):
    # Numbers without nulls are copied run by run; strings, bools and values with nulls inside
    # the rows go through Arrow's take: the same rows either way, over several chunks.
    lengths = [3, 5, 0, 2, 7, 1, 4]
    t = table_of(lengths, chunks=3)
    ids = rows_of(t)
    t = t.append_column("text", pa.chunked_array([pa.array([[str(v) for v in r] for r in ids[:3]]), pa.array([[str(v) for v in r] for r in ids[3:]])]))
    t = t.append_column("flag", pa.array([[v % 2 == 0 for v in r] for r in ids]))
    t = t.append_column("maybe", pa.array([[None if v % 3 == 0 else v for v in r] for r in ids], pa.list_(pa.int64())))
    packed = pack_table(t, 6, strategy=strategy)
    out = rows_of(packed)
    assert rows_of(packed, "text") == [[str(v) for v in r] for r in out]
    assert rows_of(packed, "flag") == [[v % 2 == 0 for v in r] for r in out]
    assert rows_of(packed, "maybe") == [[None if v % 3 == 0 else v for v in r] for r in out]
    assert rows_of(packed, "labels") == [[-v for v in r] for r in out]


@pytest.mark.parametrize("strategy", ["bfd", "bfd_split", "wrapped"])
def test_numbers_of_every_width_are_gathered_exactly(strategy):
    # Every integer and float width (float16 through numpy, the others natively), over chunks.
    lengths = [3, 5, 0, 2, 7, 1, 4, 9]
    t = table_of(lengths, chunks=3)
    offsets = pa.array(np.concatenate(([0], np.cumsum(lengths))).astype(np.int32))
    flat = np.arange(sum(lengths))
    dtypes = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float16, np.float32, np.float64]
    for dt in dtypes:
        t = t.append_column(np.dtype(dt).name, pa.ListArray.from_arrays(offsets, pa.array((flat * 3 + 1).astype(dt))))
    packed = pack_table(t, 6, strategy=strategy, overflow="split" if strategy == "bfd_split" else None)
    ids = rows_of(packed)
    for dt in dtypes:
        name = np.dtype(dt).name
        assert packed.schema.field(name).type == t.schema.field(name).type
        assert rows_of(packed, name) == [np.array([v * 3 + 1 for v in r]).astype(dt).tolist() for r in ids], name


def _assemble(chunks, starts, lengths, offsets=None, position_ids=False):
    from stowplan import _rows

    flat = _rows.Flat([pa.array(c) for c in chunks], pa.array(chunks[0]).type)
    if offsets is None:
        offsets = [0, len(lengths)]
    types = {"x": pa.list_(flat.type)}
    return _rows.assemble({"x": flat}, types, np.asarray(starts), np.asarray(lengths), np.asarray(offsets), position_ids).read_all()


def test_the_packed_stream_is_read_once_and_strings_and_nested_lists_are_packed():
    from stowplan import _stowplan

    t = pa.table({"ids": [[1, 2], [3], [4, 5]], "words": [["a", "bb"], ["c"], ["d", "e"]], "nested": [[[1], [2, 3]], [[]], [[4], [5]]]})
    stream, digest = _stowplan.pack_table(t, 3, "next-fit")
    assert len(stream) == 2 and len(digest) == 64
    packed = pa.RecordBatchReader.from_stream(stream).read_all()
    assert packed.column("words").to_pylist() == [["a", "bb", "c"], ["d", "e"]]
    assert packed.column("nested").to_pylist() == [[[1], [2, 3], []], [[4], [5]]]
    with pytest.raises(stowplan.InvalidArgumentError, match="the packed stream was read already"):
        pa.RecordBatchReader.from_stream(stream)
    # The same plan gives the same digest; another capacity another one.
    assert _stowplan.pack_table(t, 3, "next-fit")[1] == digest != _stowplan.pack_table(t, 4, "next-fit")[1]


def test_a_large_native_gather_split_over_threads_is_the_copy_on_one():
    # 12M values (48 MB, over the 32 MiB from which the host copies on every core) in runs of
    # 0..=996, out of order, with one run of 9M values (longer than any share) in the middle.
    chunk = np.arange(12_000_000, dtype=np.int32)
    starts, lengths = [], []
    at = 0
    while at < 11_990_000:
        n = 9_000_000 if len(lengths) == 1000 else (at * 7919) % 997 or 1
        starts.append((at * 31) % (12_000_000 - n))
        lengths.append(n)
        at += n
    got = _assemble([chunk], starts, lengths)
    flat = got.column("x").combine_chunks().flatten().to_numpy()
    assert flat.dtype == np.int32 and flat.nbytes > 32 << 20
    assert np.array_equal(flat, np.concatenate([chunk[s : s + n] for s, n in zip(starts, lengths)]))
    assert got.column("seq_lengths").to_pylist() == [lengths]


def test_the_native_assembly_copies_items_across_chunks_and_names_bad_items():
    a, b = np.array([1, 2, 3, 4], dtype=np.int64), np.array([10, 20], dtype=np.int64)
    # Values 0..6 over two chunks: an item may cross from one chunk to the next.
    got = _assemble([a, b], [4, 2, 0, 3], [2, 2, 1, 2], [0, 2, 4], position_ids=True)
    assert got.column("x").to_pylist() == [[10, 20, 3, 4], [1, 4, 10]]
    assert got.column("position_ids").to_pylist() == [[0, 1, 0, 1], [0, 0, 1]]
    for args, fragment in [
        (([5], [2]), "item 0 (start 5, length 2) is outside the columns' 6 values"),
        (([0], [1], [0, 2]), "offsets must rise from 0 to the number of items (1)"),
        (([0, 1], [1]), "one item length per start"),
    ]:
        with pytest.raises(stowplan.InvalidArgumentError, match=re.escape(fragment)):
            _assemble([a, b], *args)
    with pytest.raises(stowplan.InvalidArgumentError, match="chunk 1 holds Int32 values, not Int64"):
        _assemble([a, b.astype(np.int32)], [0], [1])
