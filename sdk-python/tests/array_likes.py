"""Objects that are arrays only through a protocol, as tensors of other libraries are."""

from __future__ import annotations

import numpy as np


class ArrayLike:
    """Only ``__array__`` (like a CPU torch tensor)."""

    def __init__(self, data):
        self._data = np.asarray(data)

    def __array__(self, dtype=None, copy=None):
        return self._data if dtype is None else self._data.astype(dtype)


class DLPackOnly:
    """Only the DLPack protocol."""

    def __init__(self, data):
        self._data = np.asarray(data)

    def __dlpack__(self, **kwargs):
        return self._data.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()
