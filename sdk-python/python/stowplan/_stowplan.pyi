"""Type stubs of the native extension ``stowplan._stowplan`` (PyO3).

Use the public functions of :mod:`stowplan` instead; these take already-converted arrays.
"""

from typing import List, Optional, Tuple

import numpy as np
import numpy.typing as npt

__version__: str

def partition(
    weights: npt.NDArray[np.uint64] | npt.NDArray[np.int64],
    k: int,
    method: str,
    equal_size: bool,
    refine: bool,
    backend: str,
) -> Tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.uint64], int, int, int]:
    """-> (offsets, indices, sums, total, spread, lower_bound)"""

def pack(
    lengths: npt.NDArray[np.uint64] | npt.NDArray[np.int64],
    capacity: int,
    align: int,
    method: str,
    oversize: str,
    backend: str,
) -> Tuple[
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint32],
    int,
    int,
    int,
    float,
]:
    """-> (offsets, indices, loads, dropped, single, real_tokens, aligned_tokens, lower_bound, efficiency)"""

def verl(function: str, seqlens: List[int], k: int, equal_size: bool, backend: str) -> List[List[int]]:
    """verl 0.9.1's ``function``; raises the builtin exception verl raises."""

def log_seqlen_unbalance(seqlens: List[int], partitions: List[List[int]]) -> Tuple[int, int, int, int, int, int]:
    """-> (min, max, balanced_min, balanced_max, total, k); raises like verl."""

def kernel_info() -> Tuple[str, List[str]]:
    """-> (component sha256, component imports)"""

_MicroTuple = Tuple[
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint32],
    int,
    int,
]
_DpTuple = Tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.uint64], npt.NDArray[np.uint64], int]

def micro_batches(
    lengths: npt.NDArray[np.uint64] | npt.NDArray[np.int64],
    max_token_len: int,
    linear: int,
    quadratic: int,
    min_count: int,
    divisible_by: int,
    count: Optional[int],
    order: str,
    backend: str,
) -> _MicroTuple:
    """-> (offsets, indices, tokens, costs, restore, lower_bound, required)"""

def balance(
    lengths: npt.NDArray[np.uint64] | npt.NDArray[np.int64],
    dp: int,
    linear: int,
    quadratic: int,
    groups: Optional[npt.NDArray[np.uint32]],
    minibatch_size: Optional[int],
    equal_count: bool,
    max_token_len: Optional[int],
    min_count: int,
    divisible_by: int,
    count: Optional[int],
    order: str,
    backend: str,
) -> Tuple[_DpTuple, Optional[List[_MicroTuple]]]:
    """-> ((offsets, order, tokens, costs, cost_lower_bound), per-rank micro tuples or None)"""

def verl_rearrange_micro_batches(
    seqlens: List[int],
    max_token_len: int,
    min_num_micro_batch: Optional[int],
    num_batches_divided_by: Optional[int],
    use_dynamic_bsz_balance: bool,
    force_group_size: int,
    padded_width: Optional[int],
    dp_num_micro_batches: Optional[int],
    backend: str,
) -> List[List[int]]:
    """verl's index lists; raises verl's builtin exception."""

def balance_batch(seqlens: List[int], dp: int, minibatch_size: Optional[int], backend: str) -> Tuple[List[List[int]], List[List[List[int]]], List[int]]:
    """-> (partitions, kk_partitions, dropped); raises verl's/ROLL's builtin exception."""

def roll_load_balance(
    lengths: List[int],
    mask_width: int,
    max_packed_sequence_length: int,
    min_num_micro_batches: int,
    tp: int,
    cp: int,
    vp: int,
    dp_num_micro_batches: Optional[int],
    backend: str,
) -> Tuple[List[List[int]], List[List[int]], int, List[int]]:
    """-> (micro_batches, kk_partitions, pad_factor, padded_lengths); raises ROLL's exception."""
