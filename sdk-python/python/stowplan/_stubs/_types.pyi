"""Type aliases the stubs of ``stowplan._stowplan`` share."""

from typing import Any, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

_Lengths = Union[Sequence[int], npt.NDArray[np.integer[Any]], Any]
_Cost = Union[str, Tuple[int, int], Sequence[int]]
_Align = Union[None, str, int]
