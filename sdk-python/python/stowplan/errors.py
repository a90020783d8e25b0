"""The exceptions stowplan raises.

Every error is a :class:`StowplanError`. Bad arguments raise :class:`InvalidArgumentError`,
which is also a :class:`ValueError`; requests that cannot be satisfied raise
:class:`InfeasibleError`; a failure of the WebAssembly runtime itself (never bad input)
raises :class:`KernelRuntimeError`. Static packing adds :class:`ConfigError` (a training
configuration key is invalid), :class:`CacheMismatchError` (a cache artifact was made for
other inputs or is damaged), :class:`StowplanIOError` and :class:`StowplanTimeoutError`.
"""

from __future__ import annotations

__all__ = [
    "StowplanError",
    "InvalidArgumentError",
    "InfeasibleError",
    "KernelRuntimeError",
    "ConfigError",
    "CacheMismatchError",
    "StowplanIOError",
    "StowplanTimeoutError",
    "FilterError",
]


class StowplanError(Exception):
    """Base class of every stowplan error."""


class InvalidArgumentError(StowplanError, ValueError):
    """An argument is outside its documented range; the message names it and the range."""


class InfeasibleError(StowplanError):
    """Valid arguments that no result satisfies, e.g. a length above the bin capacity."""


class KernelRuntimeError(StowplanError, RuntimeError):
    """The embedded WebAssembly kernel failed to load or trapped (a bug, not bad input)."""


class ConfigError(InvalidArgumentError):
    """A training configuration key is invalid; the message names it and what to set."""


class CacheMismatchError(StowplanError):
    """A cache or plan artifact was made for other inputs, or is damaged; the message names
    what differs and how to proceed (usually: a fresh output directory)."""


class StowplanIOError(StowplanError, OSError):
    """Reading or writing a file failed; the message names the path."""


class StowplanTimeoutError(StowplanError, TimeoutError):
    """Waiting for another process's artifact took longer than allowed."""


class FilterError(StowplanError):
    """A buffer filter failed or returned an invalid selection; the buffer is unchanged."""
