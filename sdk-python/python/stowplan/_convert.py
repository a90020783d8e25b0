"""Conversion of array-like inputs (numpy arrays of any dtype, torch tensors through
``__array__`` or DLPack, other iterables) for the native layer, which calls these functions
for every sequence it cannot read directly.

The rules, the same for every entry point (lengths, weights, token ids, masks, indices):

- integers are exact: integer arrays of any width are widened without loss; object arrays
  and other iterables become lists whose elements the native layer checks one by one (a
  Python int or anything with ``__index__``, never a bool, a float or a string);
- float arrays are refused, even when every value is whole (a float length or token id is
  almost always a conversion mistake, and above ``2**53`` floats are not exact): convert with
  ``.astype(numpy.int64)`` once the values are known to be whole;
- bool arrays are refused as integers (a bool is a flag, not a count); masks accept them;
- strings (and string arrays) are refused.

Every refusal is an :class:`~stowplan.InvalidArgumentError` naming the argument. The range
checks (e.g. ``0..=2**64-1`` for lengths) are the native layer's, which names the index.
"""

from __future__ import annotations

from typing import Any, List, Optional, Union

import numpy as np

from .errors import InvalidArgumentError

#: What each refused numpy dtype kind holds, for messages.
_KINDS = {"b": "bool", "f": "float", "c": "complex", "U": "string", "S": "bytes", "M": "datetime", "m": "timedelta", "V": "raw"}

_FLOAT_HINT = "floats are refused even when whole; convert with .astype(numpy.int64) once the values are known to be whole"


def array_of(values: Any, name: str) -> Optional[np.ndarray]:
    """``values`` as a numpy array when it is one or exposes ``__array__``/DLPack (CPU
    tensors are read without a copy), else ``None``."""
    if isinstance(values, np.ndarray):
        return values
    try:
        if hasattr(values, "__array__"):
            return np.asarray(values)
        if hasattr(values, "__dlpack__"):
            return np.from_dlpack(values)
    except (TypeError, ValueError, RuntimeError, BufferError) as exc:
        raise InvalidArgumentError(f"{name} cannot be read as an array (a CPU tensor or numpy array is needed): {exc}") from None
    return None


def _sequence(values: Any, name: str, what: str, kinds: str) -> Union[np.ndarray, List[Any]]:
    """A one-dimensional numpy array whose dtype kind is one of ``kinds`` (returned as is), or
    a list of the elements (object arrays, other iterables) for the native layer to check."""
    if isinstance(values, (str, bytes, bytearray)):
        raise InvalidArgumentError(f"{name} must be a sequence of {what}, not {type(values).__name__}")
    arr = array_of(values, name)
    if arr is None:
        try:
            return list(values)
        except TypeError:
            raise InvalidArgumentError(f"{name} must be a sequence of {what} (got {type(values).__name__})") from None
    if arr.ndim != 1:
        raise InvalidArgumentError(f"{name} must be one-dimensional (got shape {arr.shape})")
    kind = arr.dtype.kind
    if kind == "O":
        return arr.tolist()
    if kind not in kinds:
        hint = f"; {_FLOAT_HINT}" if kind == "f" and "f" not in kinds else ""
        raise InvalidArgumentError(
            f"{name} must hold {what}, not {_KINDS.get(kind, str(arr.dtype))} values (dtype {arr.dtype}){hint}"
        )
    return arr


def as_integers(values: Any, name: str) -> Union[np.ndarray, List[Any]]:
    """``values`` (lengths, weights, token ids, indices) as a one-dimensional C-contiguous
    ``uint64`` or ``int64`` array, or a list whose elements the native layer checks one by
    one. Contiguous ``uint64``/``int64`` arrays come back as they are (no copy)."""
    arr = _sequence(values, name, "integers", "iu")
    if isinstance(arr, list):
        return arr
    if arr.dtype.kind == "u":
        return np.ascontiguousarray(arr, dtype=np.uint64)
    return np.ascontiguousarray(arr, dtype=np.int64)


def as_int64(values: Any, name: str, low: int) -> np.ndarray:
    """``values`` (as :func:`as_integers` takes them) as a one-dimensional ``int64`` array of
    values in ``low..=2**63-1``: lists checked element by element by the native layer (errors
    name ``name[i]``), arrays at once."""
    from ._stowplan import _integers  # (the native layer imports this module lazily)

    arr = as_integers(values, name)
    if isinstance(arr, list):
        return np.array(_integers(arr, name, low, 2**63 - 1), dtype=np.int64)
    bad = (arr < low) if arr.dtype == np.int64 else (arr > 2**63 - 1)
    if bad.any():
        i = int(np.argmax(bad))
        lo = "-2**63" if low == -(2**63) else str(low)
        raise InvalidArgumentError(f"{name} must hold values in {lo}..=2**63-1 (got {int(arr[i])} at [{i}])")
    return arr.astype(np.int64, copy=False)


def as_mask(values: Any, name: str) -> Union[np.ndarray, List[Any]]:
    """A loss mask as a ``bool`` array, an ``int64``/``uint64`` array (the native layer
    accepts only 0 and 1 in it) or a list (bools, or the integers 0 and 1)."""
    arr = _sequence(values, name, "bools (or the integers 0 and 1)", "biu")
    if isinstance(arr, list):
        return arr
    if arr.dtype.kind == "b":
        return np.ascontiguousarray(arr, dtype=np.bool_)
    return as_integers(arr, name)


def as_numbers(values: Any, name: str) -> Union[np.ndarray, List[Any]]:
    """Per-token numbers (logprobs, temperatures) as a ``float64`` array, or a list whose
    elements the native layer checks (ints or floats; never bools or strings)."""
    arr = _sequence(values, name, "numbers", "fiu")
    if isinstance(arr, list):
        return arr
    return np.ascontiguousarray(arr, dtype=np.float64)
