"""The exceptions stowplan raises.

Every error is a :class:`StowplanError`. Bad arguments raise :class:`InvalidArgumentError`,
which is also a :class:`ValueError`; requests that cannot be satisfied raise
:class:`InfeasibleError`; a failure of the WebAssembly runtime itself (never bad input)
raises :class:`KernelRuntimeError`.
"""

from __future__ import annotations

__all__ = ["StowplanError", "InvalidArgumentError", "InfeasibleError", "KernelRuntimeError"]


class StowplanError(Exception):
    """Base class of every stowplan error."""


class InvalidArgumentError(StowplanError, ValueError):
    """An argument is outside its documented range; the message names it and the range."""


class InfeasibleError(StowplanError):
    """Valid arguments that no result satisfies, e.g. a length above the bin capacity."""


class KernelRuntimeError(StowplanError, RuntimeError):
    """The embedded WebAssembly kernel failed to load or trapped (a bug, not bad input)."""
