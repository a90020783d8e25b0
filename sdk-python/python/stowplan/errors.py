"""The exceptions stowplan raises.

Every error is a :class:`StowplanError`. Bad arguments raise :class:`InvalidArgumentError`,
which is also a :class:`ValueError`; requests that cannot be satisfied raise
:class:`InfeasibleError`; a failure of the WebAssembly runtime itself (never bad input)
raises :class:`KernelRuntimeError`. Static packing adds :class:`ConfigError` (a training
configuration key is invalid), :class:`CacheMismatchError` (a cache artifact was made for
other inputs or is damaged), :class:`StowplanIOError` and :class:`StowplanTimeoutError`.
Buffer filters raise subclasses of :class:`FilterError`, one per way a plugin can fail.
:func:`stowplan.hf.check_packing` raises :class:`PackingContaminationError`.
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
    "FilterTimeoutError",
    "FilterOutOfFuelError",
    "FilterMemoryLimitError",
    "FilterTrapError",
    "FilterInvalidResultError",
    "FilterHashMismatchError",
    "FilterGuestError",
    "FilterLoadError",
    "PackingContaminationError",
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


class PackingContaminationError(StowplanError):
    """A model's outputs on a packed batch differ from its outputs on each sample alone: the
    packed samples see each other. The message names the largest per-token difference (the
    sample and token) and the likely cause; the attributes hold them too."""

    def __init__(self, message: str, *, max_difference: float = 0.0, sample: int = -1, token: int = -1, cause: str = "") -> None:
        super().__init__(message)
        #: The largest absolute difference of a logit, packed against alone.
        self.max_difference = max_difference
        #: The sample (its order in the batch) and the token (in the sample) where it is.
        self.sample = sample
        self.token = token
        #: The likely cause, in words.
        self.cause = cause


class FilterError(StowplanError):
    """A buffer filter failed or returned an invalid selection; the buffer is unchanged."""


class FilterTimeoutError(FilterError, TimeoutError):
    """A plugin call ran past its deadline (``timeout``); its instance was discarded."""


class FilterOutOfFuelError(FilterError):
    """A plugin call used up its fuel budget (``fuel``); its instance was discarded."""


class FilterMemoryLimitError(FilterError, MemoryError):
    """A plugin tried to grow its memory past ``memory_limit``; its instance was discarded."""


class FilterTrapError(FilterError):
    """A plugin trapped (panic, ``unreachable``, exit); the message is the trap's."""


class FilterInvalidResultError(FilterError):
    """A selection broke a rule: an index out of range or twice, or more groups than asked."""


class FilterHashMismatchError(FilterError):
    """The plugin file's sha256 is not the pinned one."""


class FilterGuestError(FilterError):
    """The plugin returned an error of its own (its ``err(text)``)."""


class FilterLoadError(FilterError):
    """The file is not a buffer-filter component this host can run (not a component, another
    world, or imports other than WASI)."""


#: The class of each of the host's error kinds (``stowplan::Error::kind``; a buffer filter's
#: ``filter-`` and ``FilterError::kind``): how the native module raises the host's errors.
_BY_KIND = {
    "invalid-argument": InvalidArgumentError,
    "infeasible": InfeasibleError,
    "runtime": KernelRuntimeError,
    "config": ConfigError,
    "io": StowplanIOError,
    "cache-mismatch": CacheMismatchError,
    "timeout": StowplanTimeoutError,
    "filter-timeout": FilterTimeoutError,
    "filter-out-of-fuel": FilterOutOfFuelError,
    "filter-memory-limit": FilterMemoryLimitError,
    "filter-trap": FilterTrapError,
    "filter-invalid-result": FilterInvalidResultError,
    "filter-hash-mismatch": FilterHashMismatchError,
    "filter-guest": FilterGuestError,
    "filter-load": FilterLoadError,
}
