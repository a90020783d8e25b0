"""The deprecation path of renamed keyword arguments: one place that says how a former name
keeps working for one release.

``@renamed(seq_length="capacity")`` lets callers still pass ``seq_length=``: it warns a
``DeprecationWarning`` naming the new name and passes the value on as ``capacity=``. Passing
both is an :class:`~stowplan.errors.InvalidArgumentError`. The names themselves are written
once, in ARCHITECTURE.md's names table ("Names across Rust, Python and JavaScript").
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, TypeVar

from .errors import InvalidArgumentError

F = TypeVar("F", bound=Callable[..., Any])


def renamed(**former: str) -> Callable[[F], F]:
    """A decorator accepting each ``former=new`` keyword under its former name, with a warning."""

    def wrap(function: F) -> F:
        where = getattr(function, "__qualname__", "the call").replace(".__init__", "")

        @functools.wraps(function)
        def call(*args: Any, **kwargs: Any) -> Any:
            for old, new in former.items():
                if old in kwargs:
                    if new in kwargs:
                        raise InvalidArgumentError(f"{where}: give {new}= only ({old}= is its former name, deprecated)")
                    warnings.warn(
                        f"{where}: {old}= is deprecated and will be removed in the next release; use {new}=",
                        DeprecationWarning,
                        stacklevel=2,
                    )
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call  # type: ignore[return-value]

    return wrap
