"""The deprecation path of renamed keyword arguments: one place that says how a former name
keeps working for one release.

``@renamed(max_tokens="capacity")`` lets callers still pass ``max_tokens=``: it warns a
``DeprecationWarning`` naming the new name and passes the value on as ``capacity=``. Passing
both is an :class:`~stowplan.errors.InvalidArgumentError`. The native layer's classes call
:func:`warn_renamed` and :func:`both_given` for theirs (``Packer(seq_len=)``). The names themselves are written
once, in ARCHITECTURE.md's names table ("Names across Rust, Python and JavaScript").
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, TypeVar

from .errors import InvalidArgumentError

F = TypeVar("F", bound=Callable[..., Any])


def warn_renamed(where: str, old: str, new: str, stacklevel: int = 3, argument: bool = True) -> None:
    """Warns that ``old`` (an argument of ``where``, shown ``old=``, or with ``argument=False``
    an attribute or constant) is deprecated in favour of ``new``, at the caller ``stacklevel``
    frames up; the native layer calls it too, so that the message is written once."""
    eq = "=" if argument else ""
    warnings.warn(
        f"{where}: {old}{eq} is deprecated and will be removed in the next release; use {new}{eq}", DeprecationWarning, stacklevel=stacklevel
    )


def both_given(where: str, old: str, new: str) -> InvalidArgumentError:
    """The error of a call that gives an argument under both its names."""
    return InvalidArgumentError(f"{where}: give {new}= only ({old}= is its former name, deprecated)")


def renamed(**former: str) -> Callable[[F], F]:
    """A decorator accepting each ``former=new`` keyword under its former name, with a warning."""

    def wrap(function: F) -> F:
        where = getattr(function, "__qualname__", "the call").replace(".__init__", "")
        positional = [
            p.name for p in inspect.signature(function).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in former.items():
                if old in kwargs:
                    if new in kwargs or new in positional[: len(args)]:
                        raise both_given(where, old, new)
                    warn_renamed(where, old, new)
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
