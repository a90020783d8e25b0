"""stowplan.arrow.pack_table: Arrow-native packing by the kernel's plan (issue 28, item 1)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stowplan

pa = pytest.importorskip("pyarrow")
from stowplan.arrow import OVERFLOWS, STRATEGIES, pack_table  # noqa: E402


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
    with pytest.raises(stowplan.InfeasibleError, match=r"column 'input_ids' row 1 has 7 values, more than seq_length = 4"):
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


def test_output_is_chunked_without_changing_rows(monkeypatch):
    import stowplan.arrow as arrow

    lengths = np.random.default_rng(5).integers(1, 50, size=500)
    expected = pack_table(table_of(lengths), 100, position_ids=True)
    monkeypatch.setattr(arrow, "_CHUNK_TOKENS", 300)
    small = pack_table(table_of(lengths), 100, position_ids=True)
    assert small.column("input_ids").num_chunks > 10
    assert small.to_pydict() == expected.to_pydict()


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
        (lambda t: pack_table(t, 0), "seq_length must be in 1..=2147483647"),
        (lambda t: pack_table(t, 2**31), "seq_length must be in 1..=2147483647"),
        (lambda t: pack_table(t, 4.0), "seq_length must be an integer"),
        (lambda t: pack_table(t, 4, strategy="best"), "strategy must be 'bfd', 'ffd', 'next-fit', 'bfd_split' or 'wrapped'"),
        (lambda t: pack_table(t, 4, overflow="wrap"), "overflow must be 'truncate', 'split', 'drop' or 'error'"),
        (lambda t: pack_table(t, 4, strategy="wrapped", overflow="drop"), "overflow does not apply to strategy 'wrapped'"),
        (lambda t: pack_table(t, 4, strategy="bfd_split", overflow="drop"), "overflow must be None or 'split'"),
        (lambda t: pack_table(t, 4, position_ids=1), "position_ids must be True or False"),
        (lambda t: pack_table(t, 4, columns=["input_ids", "mask"]), "column 'mask' is not in the table"),
        (lambda t: pack_table(t, 4, columns="input_ids"), "columns must be a list of column names"),
        (lambda t: pack_table(t, 4, columns=[]), "columns must name at least one list column"),
        (lambda t: pack_table(t, 4, columns=["labels", "labels"]), "columns must not repeat a name"),
        (lambda t: pack_table(t.append_column("text", pa.array(["a", "b", "c"])), 4), "column 'text' is not a list column (its type is string); pass columns="),
        (lambda t: pack_table(t.append_column("seq_lengths", t.column("labels")), 4), "column 'seq_lengths' is an output column"),
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
