"""Type stubs of the native extension ``stowplan._stowplan`` (PyO3).

Use the public functions of :mod:`stowplan` instead; these take already-converted arrays.
"""

from typing import List, Tuple

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
