"""Buffer filters as sandboxed WebAssembly plugins (``stowplan:filter/buffer-filter``, see
``wit/filter/filter.wit``): a filter chooses which buffered groups a
:class:`~stowplan.BufferedDataSource` serves next, like slime's ``buffer_filter`` — but it runs
in the Rust host's sandbox, with no access to files, network or environment, under a deadline,
a fuel budget and a memory limit, and every selection it returns is checked.

>>> import stowplan
>>> pin = stowplan.Filter.hash("plugins/dist/top_reward.wasm")  # doctest: +SKIP
>>> f = stowplan.Filter.load("plugins/dist/top_reward.wasm", sha256=pin)  # doctest: +SKIP
>>> ds = stowplan.BufferedDataSource("prompts.jsonl", n_samples_per_prompt=8, filter=f)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _stowplan
from .errors import InvalidArgumentError

__all__ = ["Filter"]


class Filter:
    """A buffer-filter plugin loaded into the sandbox. Make one with :meth:`load`."""

    def __init__(self, native: "_stowplan.Filter") -> None:
        self._native = native

    @classmethod
    def load(cls, path: Any, *, sha256: str, config: Union[None, str, Dict[str, Any]] = None, **options: Any) -> "Filter":
        """Loads the component at ``path`` if its sha256 is ``sha256`` (64 hex digits,
        optionally ``sha256:``-prefixed; :meth:`hash` computes it) and instantiates it.

        ``config`` (a JSON-serializable dict, or JSON text; default ``{}``) reaches every
        call. Options (omitted: the host's defaults), bounds per call: ``timeout`` seconds
        (0.001–600, default 1), ``fuel`` (about one unit per WebAssembly instruction, at least
        10,000, default 10**9; ``None`` for none), ``memory_limit`` bytes (1 MiB–4 GiB,
        default 256 MiB), ``max_plugin_bytes`` (the file's size; default 256 MiB, refused
        unread past it). stdout/stderr are kept up to ``output_limit`` bytes per call
        (default 64 KiB) and logged. ``on_failure="fallback"`` serves first-in-first-out
        instead of raising when a call fails (with a warning in the log); the default
        ``"error"`` raises a :class:`~stowplan.FilterError` subclass and leaves the buffer
        untouched.
        """
        if config is not None and not isinstance(config, str):
            try:
                config = json.dumps(config)
            except (TypeError, ValueError) as exc:
                raise InvalidArgumentError(f"config must be JSON-serializable: {exc}") from None
        return cls(_stowplan.Filter(os.fspath(path), sha256=sha256, config=config, **options))

    @staticmethod
    def hash(path: Any, *, max_plugin_bytes: Optional[int] = None) -> str:
        """The sha256 (hex) of a plugin file: the pin to pass to :meth:`load`. The file is
        streamed; one over ``max_plugin_bytes`` (default ``stowplan._stowplan.MAX_PLUGIN_BYTES``,
        256 MiB) raises :class:`~stowplan.InvalidArgumentError`, as :meth:`load` does."""
        return _stowplan.hash_plugin(os.fspath(path), max_plugin_bytes)

    @property
    def name(self) -> str:
        """The plugin's file name."""
        return self._native.name

    @property
    def sha256(self) -> str:
        """The component's sha256 (hex)."""
        return self._native.sha256

    @property
    def imports(self) -> List[str]:
        """The component's imports (WASI interfaces the sandbox answers)."""
        return self._native.imports

    @property
    def stats(self) -> Dict[str, int]:
        """Counters: ``calls``, ``failures``, ``fallbacks``, ``instances`` (1 + instances
        replaced after a trap)."""
        return self._native.stats

    @property
    def last_output(self) -> List[Tuple[str, str]]:
        """What the last call wrote, as ``(stream, text)`` pairs."""
        return self._native.last_output

    def __repr__(self) -> str:
        return f"Filter({self.name!r}, sha256={self.sha256[:12]}…)"
