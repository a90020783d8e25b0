"""The peers' inputs, read as the peers read them, for the compatibility layers of verl and
ROLL: exact integers in 64 bits, and lengths or a 2-D attention mask (its row sums).
Package-internal: its names are public so that the layers sharing them import no private name.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from .. import _stowplan
from ..errors import InvalidArgumentError

# The peers compute with any Python int; the kernel models them in 64 bits.
I64 = (-(2**63), 2**63 - 1)


def exact_ints(seqlen_list: Any, name: str = "seqlen_list") -> List[int]:
    """Exact integers (a list, tuple, numpy array or tensor), else InvalidArgumentError."""
    return _stowplan._integers(seqlen_list, name, *I64)


def mask_or_lengths(batch: Any, name: str) -> Tuple[List[int], Optional[int]]:
    """(lengths, padded width or None) from lengths (exact integers), a 2-D attention mask
    (bools or integers; its row sums), or a mapping holding ``"attention_mask"``."""
    if isinstance(batch, dict) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__") and "attention_mask" in batch.keys()):
        batch, name = batch["attention_mask"], "attention_mask"
    if hasattr(batch, "detach"):  # a torch tensor: off the autograd graph and the GPU
        batch = batch.detach().cpu()
    nested = isinstance(batch, (list, tuple)) and len(batch) > 0 and isinstance(batch[0], (list, tuple, np.ndarray))
    if isinstance(batch, np.ndarray) or hasattr(batch, "__array__") or nested:
        try:
            arr = np.asarray(batch)
        except ValueError as exc:
            raise InvalidArgumentError(f"{name} must be lengths (1-D) or an attention mask (2-D): {exc}") from None
        if arr.ndim == 2:
            if arr.dtype.kind not in "biu":
                raise InvalidArgumentError(f"{name} (an attention mask) must hold bools or integers, not {arr.dtype}")
            return [int(x) for x in arr.sum(axis=1).tolist()], int(arr.shape[1])
        if arr.ndim != 1:
            raise ValueError(f"expected lengths (1-D) or an attention mask (2-D), got shape {arr.shape}")
    return exact_ints(batch, name), None
