"""Type stubs of the native extension ``stowplan._stowplan`` (PyO3).

Most names are re-exported by :mod:`stowplan` as they are. Options are keyword-only and
``None`` (or omitting them) means the host's default; parameters shown as ``= ...`` take a
``None`` of their own meaning (no key, no bound), so only omitting them gives the default.
The stubs are split by topic into ``_stubs/`` (one file per group of ``src/*.rs`` files);
this file re-exports them. ``tests/test_stubs.py`` checks them against the compiled module.
"""

from typing import Any, Dict, List, Tuple

__version__: str
#: The kernel's cost presets, name -> (linear, quadratic).
COST_PRESETS: Dict[str, Tuple[int, int]]
#: The host's default number of length-precompute workers.
DEFAULT_PRECOMPUTE_WORKERS: int
#: The host's default wait for rank 0's length cache, in seconds.
DEFAULT_WAIT_TIMEOUT_S: int

from ._stubs.pack import *
from ._stubs.rows import *
from ._stubs.balance import *
from ._stubs.peers import *
from ._stubs.peers import _prime_rl_balanced_partition as _prime_rl_balanced_partition
from ._stubs.peers import _prime_rl_karmarkar_karp as _prime_rl_karmarkar_karp
from ._stubs.peers import _prime_rl_prepare_batch as _prime_rl_prepare_batch
from ._stubs.layout import *
from ._stubs.plan import *
from ._stubs.source import *
from ._stubs.packer import *

def kernel_info() -> Dict[str, Any]:
    """``{"sha256": component sha256, "imports": component imports}``."""

def _integer(value: Any, name: str, low: int, high: int) -> int:
    """``value`` checked like every integer argument of the native layer: an exact integer
    (a Python int or anything with ``__index__``; never a bool, a float or a string) in
    ``low..=high``, else ``InvalidArgumentError`` naming ``name`` and the range."""

def _integers(values: Any, name: str, low: int, high: int) -> List[int]:
    """A one-dimensional sequence (list, tuple, numpy array, ``__array__``, DLPack) checked
    like every integer sequence of the native layer (see ``stowplan._convert``), as Python
    ints; errors name ``name[i]``."""
