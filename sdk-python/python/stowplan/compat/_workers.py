"""The peers' ``patch()`` in Ray worker processes: :func:`patch_runtime_env` and the hook it installs.

A peer's trainer (verl, prime-rl, slime, ROLL) calls the functions stowplan replaces inside
Ray worker actors, in processes of their own: ``patch()`` in the driver does not reach them.
Ray runs a runtime environment's ``worker_process_setup_hook`` in every worker process before
any task or actor code; :func:`patch_runtime_env` names :func:`setup_worker` there, with the
peers to patch in an environment variable. This module imports only the standard library until
the hook runs (Ray imports it in every worker of the job).
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any, Dict, Iterable, List, Optional

from ..errors import InvalidArgumentError

__all__ = ["patch_runtime_env", "setup_worker", "PEERS"]

#: The peers whose ``patch()`` the hook runs, and the module each ``patch`` lives in.
PEERS = {"verl": "stowplan.compat.verl", "roll": "stowplan.compat.roll", "slime": "stowplan.compat.slime", "prime_rl": "stowplan.compat.prime_rl"}
# The top-level package of each peer: its absence means "not installed here".
_PACKAGES = {"verl": "verl", "roll": "roll", "slime": "slime", "prime_rl": "prime_rl"}
#: The environment variables the hook reads: the peers (comma-separated) and a hook of the
#: caller's that ran before (an import path), chained.
PEERS_VARIABLE = "STOWPLAN_PATCH_PEERS"
NEXT_HOOK_VARIABLE = "STOWPLAN_NEXT_SETUP_HOOK"
HOOK = f"{__name__}.setup_worker"

_log = logging.getLogger("stowplan")


def patch_runtime_env(peers: Iterable[str], runtime_env: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``runtime_env`` (a Ray runtime environment dict; default empty) with a
    ``worker_process_setup_hook`` that runs ``stowplan.compat.<peer>.patch()`` for each of
    ``peers`` (``"verl"``, ``"roll"``, ``"slime"``, ``"prime_rl"``) in every Ray worker process,
    before any actor code. Pass it to ``ray.init(runtime_env=...)`` (the job's environment: Ray
    runs a setup hook only from there) before the peer's trainer starts Ray (verl and ROLL call
    ``ray.init`` only when Ray is not running). A hook already there (an import path) runs first; a callable
    hook is refused (it cannot be chained through the environment). The input is not changed.

    In the worker, a peer that is not installed there (its package not found) is skipped with a
    warning on the ``stowplan`` logger (Ray starts workers of every kind); a peer whose
    ``patch()`` fails otherwise (another version than the drop-in reproduces, a broken
    dependency) fails the worker's start, loudly.

    >>> env = patch_runtime_env(["verl"], {"env_vars": {"A": "1"}})
    >>> env["worker_process_setup_hook"], env["env_vars"]
    ('stowplan.compat._workers.setup_worker', {'A': '1', 'STOWPLAN_PATCH_PEERS': 'verl'})
    """
    if isinstance(peers, str):
        peers = [peers]
    try:
        names = list(peers)
    except TypeError:
        names = [peers]
    if not names or any(not isinstance(p, str) or p not in PEERS for p in names):
        raise InvalidArgumentError(f"peers must be a non-empty list of {sorted(PEERS)} (got {names!r})")
    if runtime_env is None:
        runtime_env = {}
    if not isinstance(runtime_env, dict):
        raise InvalidArgumentError(f"runtime_env must be a dict (got {type(runtime_env).__name__})")
    env = dict(runtime_env)
    given = env.get("env_vars") or {}
    if not isinstance(given, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
        raise InvalidArgumentError(f"runtime_env['env_vars'] must be a dict of strings to strings (got {given!r})")
    variables = dict(given)
    previous = env.get("worker_process_setup_hook")
    if previous is not None and previous != HOOK:
        if not isinstance(previous, str):
            raise InvalidArgumentError(
                "runtime_env['worker_process_setup_hook'] is a callable, which cannot be chained: give it as an import path ('module.function')"
            )
        variables[NEXT_HOOK_VARIABLE] = previous
    variables[PEERS_VARIABLE] = ",".join(dict.fromkeys(names))
    env["env_vars"] = variables
    env["worker_process_setup_hook"] = HOOK
    return env


def setup_worker() -> List[str]:
    """The worker process hook :func:`patch_runtime_env` installs: runs the chained hook, then
    each named peer's ``patch()``; returns the peers patched."""
    previous = os.environ.get(NEXT_HOOK_VARIABLE)
    if previous:
        module, _, function = previous.rpartition(".")
        getattr(importlib.import_module(module), function)()
    patched = []
    for peer in filter(None, os.environ.get(PEERS_VARIABLE, "").split(",")):
        if peer not in PEERS:
            raise InvalidArgumentError(f"{PEERS_VARIABLE} names {peer!r}, not one of {sorted(PEERS)}")
        compat = importlib.import_module(PEERS[peer])
        try:
            if peer == "prime_rl":  # its patch wants the target module imported
                importlib.import_module(compat.PATCH_TARGET)
            compat.patch()
        except ImportError as exc:
            if not _not_installed(exc, _PACKAGES[peer]):
                raise  # the peer is there and something is wrong with it: loudly
            _log.warning("stowplan: %s is not installed in this Ray worker (%s): nothing to patch", peer, exc)
            continue
        patched.append(peer)
    return patched


def _not_installed(exc: BaseException, package: str) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says ``package`` itself is not found."""
    seen: BaseException = exc
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and (seen.name or "").split(".")[0] == package:
            return True
        seen = seen.__cause__ or seen.__context__  # type: ignore[assignment]
    return False
