"""The in-place patching shared by :mod:`stowplan.compat.verl` and :mod:`stowplan.compat.roll`:
a peer's functions are rebound, by identity, in every loaded module that holds them (the
defining module and every module that imported them by name, under any name).

A patch table maps a function's name to ``(original, replacement)``.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, ContextManager, Dict, Iterator, List, Tuple

Table = Dict[str, Tuple[Any, Any]]


def namespaces() -> Iterator[Tuple[str, Dict[str, Any]]]:
    """(name, ``__dict__``) of every loaded module; entries that are not modules with a plain
    namespace (``None`` placeholders, lazy proxies whose attribute access fails) are skipped."""
    for module_name, module in list(sys.modules.items()):
        try:
            namespace = object.__getattribute__(module, "__dict__")
        except Exception:  # noqa: BLE001 - any object may sit in sys.modules
            continue
        if isinstance(namespace, dict):
            yield module_name, namespace


def rebind(mapping: Dict[int, Any]) -> List[str]:
    """Every module attribute (of every loaded module) that is one of ``mapping``'s keys (by
    ``id``) set to the mapped object; the ``module.attribute`` names changed."""
    changed = []
    for module_name, namespace in namespaces():
        for attr, value in list(namespace.items()):
            target = mapping.get(id(value))
            if target is not None and target[0] is value:
                namespace[attr] = target[1]
                changed.append(f"{module_name}.{attr}")
    return changed


def install(table: Table) -> List[str]:
    """Binds every replacement of ``table`` where its original is; the names bound, sorted."""
    return sorted(rebind({id(orig): (orig, new) for orig, new in table.values()}))


def bound_names(table: Table) -> List[str]:
    """The ``module.attribute`` names bound to the replacements of ``table``."""
    replacements = {id(new) for _, new in table.values()}
    return sorted(
        f"{module_name}.{attr}"
        for module_name, namespace in namespaces()
        for attr, value in list(namespace.items())
        if id(value) in replacements
    )


def restore(table: Table) -> List[str]:
    """Puts every original of ``table`` back where its replacement is bound and empties the
    table; the names restored, sorted (none when the table is empty)."""
    if not table:
        return []
    restored = rebind({id(new): (new, orig) for orig, new in table.values()})
    table.clear()
    return sorted(restored)


@contextlib.contextmanager
def scoped(is_patched: Callable[[], bool], patch: Callable[[], List[str]], unpatch: Callable[[], Any]) -> Iterator[List[str]]:
    """``patch()`` for a ``with`` block, then ``unpatch()`` unless it was patched already when
    the block began; yields the names ``patch()`` bound."""
    already = is_patched()
    names = patch()
    try:
        yield names
    finally:
        if not already:
            unpatch()


def controls(
    table: Table, peer: str, patch: Callable[[], List[str]], module: str
) -> Tuple[Callable[[], bool], Callable[[], List[str]], Callable[[], ContextManager[List[str]]]]:
    """The ``is_patched``, ``unpatch`` and ``patched`` of a compat module (named ``module``)
    whose ``patch`` fills ``table`` with ``peer``'s functions (``"verl"``, ``"ROLL"``)."""

    def is_patched() -> bool:
        return bool(table)

    def unpatch() -> List[str]:
        return restore(table)

    @contextlib.contextmanager
    def patched() -> Iterator[List[str]]:
        with scoped(is_patched, patch, unpatch) as names:
            yield names

    is_patched.__doc__ = f"""Whether :func:`patch` is in effect ({peer}'s functions are stowplan's)."""
    unpatch.__doc__ = f"""Restores {peer}'s own functions wherever :func:`patch` (or an import after it) bound
    stowplan's; a no-op when not patched.

    Returns:
        The ``module.attribute`` names restored.
    """
    patched.__doc__ = f""":func:`patch` for the duration of a ``with`` block, then :func:`unpatch` — unless {peer}
    was already patched when the block began (then it stays patched). Yields the names
    :func:`patch` bound.

    Raises:
        ImportError: as :func:`patch`.
    """
    for function in (is_patched, unpatch, patched):
        function.__module__ = module
        function.__qualname__ = function.__name__
    return is_patched, unpatch, patched
