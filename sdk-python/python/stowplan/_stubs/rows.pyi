"""Stubs of ``stowplan._stowplan``: packed rows of Arrow tables (``src/arrow.rs``)."""

from typing import List, Optional, Tuple

import numpy as np

from ._types import _Lengths

def gather_runs(
    chunks: List[np.ndarray], run_chunks: np.ndarray, run_starts: np.ndarray, run_lengths: np.ndarray
) -> Optional[np.ndarray]:
    """The runs (``run_lengths[i]`` values from ``run_starts[i]`` of ``chunks[run_chunks[i]]``)
    one after the other as one new array; ``None`` for a dtype other than the integer,
    float32 and float64 ones (stowplan.arrow's gather)."""
    ...

ROW_STRATEGIES: List[str]
OVERFLOWS: List[str]
DEFAULT_OVERFLOW: str
MAX_ROW_LENGTH: int
MAX_CAPACITY: int
PACKED_BATCH_TOKENS: int
SEQ_LENGTHS: str
POSITION_IDS: str

def row_packing(strategy: str, overflow: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """The strategy's name (``next_fit`` read as ``next-fit``) and its overflow policy
    (``None`` for ``wrapped``), checked together (stowplan.arrow's rules)."""
    ...

def pack_rows(
    lengths: _Lengths,
    capacity: int,
    strategy: str,
    overflow: Optional[str] = None,
    column: str = "",
    backend: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``lengths`` tokens packed into rows of at most ``capacity`` tokens: the
    items' flat starts and lengths in output order and each packed row's item offsets
    (``int64``); errors name ``column`` and the row."""
    ...

def row_items(
    lengths: _Lengths, capacity: int, overflow: str, column: str = "", row0: int = 0
) -> Tuple[np.ndarray, np.ndarray]:
    """The items (flat start, length) of rows of ``lengths`` tokens under ``overflow``, in
    row order (``int64``); errors number rows from ``row0``."""
    ...

def packed_batches(row_tokens: _Lengths, max_tokens: int) -> np.ndarray:
    """Where the record batches of packed rows end (``row_tokens``: the tokens before each
    row, and the total): ``[0, r1, ..., rows]``, at most ``max_tokens`` tokens each or one
    longer row (``int64``)."""
    ...

def check_row_lengths(lengths: _Lengths, column: str = "", row0: int = 0) -> None:
    """Refuses a row longer than 2**32-1 (the longest a plan takes), naming ``column`` and the
    row numbered from ``row0``."""
    ...

def wrapped_rows(lengths: _Lengths, capacity: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every token cut into rows of ``capacity``: :func:`pack_rows`'s arrays for ``wrapped``."""
    ...

def trl_bfd(
    lengths: _Lengths, batch_ends: _Lengths, seq_length: int, backend: Optional[str] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """TRL's best fit decreasing map batch by map batch (batch ``j``: the sequences from
    ``batch_ends[j-1]`` (0 for the first) to before ``batch_ends[j]``): the bins' ``offsets`` and their members' ``indices`` in the order they
    went in (``int64``)."""
    ...
