"""Conversion of user inputs (lists, numpy arrays, torch tensors, DLPack) to numpy arrays."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import InvalidArgumentError


def as_lengths(values: Any, name: str) -> np.ndarray:
    """Returns ``values`` as a one-dimensional C-contiguous ``uint64`` or ``int64`` array.

    Contiguous ``uint64``/``int64`` numpy arrays (and CPU tensors of those dtypes, through
    ``__array__`` or DLPack) pass through without a copy; other integer dtypes are widened.
    Negative values are rejected by the native layer, which names the index. The native
    layer calls this for every lengths argument that is not already such an array.
    """
    if isinstance(values, np.ndarray):
        arr = values
    elif hasattr(values, "__array__"):
        arr = np.asarray(values)
    elif hasattr(values, "__dlpack__"):
        arr = np.from_dlpack(values)
    else:
        try:
            arr = np.asarray(values)
        except (OverflowError, ValueError, TypeError) as exc:
            raise InvalidArgumentError(f"{name} must be a sequence of integers in 0..=2**64-1: {exc}") from None
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{name} must be one-dimensional (got shape {arr.shape})")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    kind = arr.dtype.kind
    if kind == "O":
        # Python ints too large for int64: let numpy check the uint64 range.
        try:
            arr = np.array(values, dtype=np.uint64)
        except (OverflowError, ValueError, TypeError) as exc:
            raise InvalidArgumentError(f"{name} must hold integers in 0..=2**64-1: {exc}") from None
        return arr
    if kind == "u":
        return np.ascontiguousarray(arr, dtype=np.uint64)
    if kind == "i":
        return np.ascontiguousarray(arr, dtype=np.int64)
    raise InvalidArgumentError(f"{name} must hold integers (got dtype {arr.dtype})")
