"""Static pack plans for SFT datasets: packs fixed once, before training.

A plan is computed once per run from per-sample lengths, is identical on every rank, in
every host and for any number of precompute workers, and gives a map-style dataset with a
stable ``len``. Per-epoch randomness comes from the sampler shuffling pack indices.

>>> import stowplan
>>> plan = stowplan.StaticPackPlan.from_lengths(
...     [900, 3000, 120, 4096, 2000, 1500], capacity=4096, world_size=2)
>>> plan.raw_packs()
[[0, 1, 2], [4, 5]]
>>> len(plan), plan.dropped_long, plan.pad_needed
(2, [3], 0)
>>> samples = [{"id": i} for i in range(6)]
>>> ds = stowplan.PackedDataset(samples, plan)
>>> len(ds), ds[1]
(2, [{'id': 4}, {'id': 5}])
"""

from __future__ import annotations

import json
import logging
import multiprocessing
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from . import _stowplan
from ._renamed import renamed
from .errors import InvalidArgumentError

__all__ = [
    "StaticPackPlan",
    "LengthCache",
    "PackedDataset",
    "PackingConfig",
    "compute_lengths",
    "plan_dataset",
]

StaticPackPlan = _stowplan.StaticPackPlan
LengthCache = _stowplan.LengthCache
PackingConfig = _stowplan.PackingConfig

_log = logging.getLogger("stowplan.plan")


# Worker state of the precompute pool (inherited by fork, or set by the initializer).
_worker_dataset: Any = None
_worker_fn: Any = None


def _init_worker(dataset: Any, length_fn: Any) -> None:
    global _worker_dataset, _worker_fn
    _worker_dataset, _worker_fn = dataset, length_fn


def _measure(indices: List[int]) -> List[int]:
    return [checked_length(_worker_fn(_worker_dataset[i]), i) for i in indices]


def checked_length(value: Any, index: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgumentError(f"the length function returned {value!r} for sample {index}; it must return an int")
    return int(value)


def compute_lengths(
    dataset: Sequence[Any],
    length_fn: Callable[[Any], int],
    *,
    cache_dir: Any,
    source: str,
    config: Optional[Dict[str, Any]] = None,
    workers: Optional[int] = None,
    persist_every: Optional[int] = None,
    rank: int = 0,
    wait_timeout_s: Optional[float] = None,
    verify: int = 8,
) -> np.ndarray:
    """Per-sample planning lengths, ``length_fn(dataset[i])`` for every ``i``, through the
    fingerprinted cache under ``cache_dir`` (run-scoped, e.g. ``output_dir/stowplan``).

    Rank 0 computes the missing lengths — serially with ``workers=1``, else on a
    ``multiprocessing`` pool whose results are written back by index, so the cache is
    byte-identical to a serial one; ``None``: the host's default of 8) — flushing every
    ``persist_every`` lengths (adaptive by default) so a crash resumes from the last flush.
    Other ranks wait up to ``wait_timeout_s`` seconds (0 = forever; ``None``: the host's
    default, 7200) for rank 0's complete cache. ``source`` identifies the dataset
    (e.g. the resolved JSONL path) and ``config`` everything else lengths depend on
    (template, max length …): both enter the fingerprint, and a cache made for other inputs
    raises :class:`stowplan.CacheMismatchError`. On rank 0, ``verify`` lengths already in
    the cache (evenly spread) are measured again: a different result means the length
    function is not deterministic or something it depends on changed without entering the
    fingerprint, and raises :class:`stowplan.CacheMismatchError` instead of planning with
    stale lengths.
    """
    if workers is None:
        workers = _stowplan.DEFAULT_PRECOMPUTE_WORKERS
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise InvalidArgumentError(f"workers must be a positive integer (got {workers!r})")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise InvalidArgumentError(f"rank must be an integer >= 0 (got {rank!r})")
    n = len(dataset)
    config_json = json.dumps(config, sort_keys=True) if config is not None else None
    if rank != 0:
        return LengthCache.wait(cache_dir, source, n, config_json=config_json, timeout_s=wait_timeout_s)
    cache = LengthCache(cache_dir, source, n, config_json, persist_every)
    missing = cache.missing().tolist()
    if cache.known and verify > 0:
        known = np.setdiff1d(np.arange(n), np.asarray(missing, dtype=np.int64)) if missing else np.arange(n)
        picks = known[np.linspace(0, len(known) - 1, min(verify, len(known))).astype(np.int64)].tolist()
        # Recording a known index with another length raises CacheMismatchError.
        cache.set_many(picks, [checked_length(length_fn(dataset[i]), i) for i in picks])
    if missing:
        _log.info("length cache %s: computing %d of %d lengths on %d worker(s)", cache.path, len(missing), n, workers)
    chunk = max(1, min(cache.persist_every, 4096) // workers)
    chunks = [missing[j : j + chunk] for j in range(0, len(missing), chunk)]
    try:
        if workers == 1 or len(missing) <= chunk:
            for part in chunks:
                done: List[int] = []
                try:
                    for i in part:
                        done.append(checked_length(length_fn(dataset[i]), i))
                finally:
                    # Record what this chunk measured, also when the length function failed.
                    cache.set_many(part[: len(done)], done)
        else:
            ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
            with ctx.Pool(workers, initializer=_init_worker, initargs=(dataset, length_fn)) as pool:
                # imap keeps the chunk order; each result is written back by index.
                for part, lengths in zip(chunks, pool.imap(_measure, chunks)):
                    cache.set_many(part, lengths)
    except BaseException:
        cache.flush()  # keep what was computed for the next attempt
        raise
    return cache.finish()


class PackedDataset:
    """A map-style dataset of packs: ``len(ds)`` is the number of aligned packs of ``plan``
    (stable for every epoch) and ``ds[i]`` the list of raw samples of aligned pack ``i``, in
    ascending index order.

    Works with ``torch.utils.data.DataLoader`` as a map-style dataset; one item is one pack
    (``per_device_train_batch_size`` 1), so use ``batch_size=None`` (or a ``collate_fn``
    that concatenates the pack's samples) and shuffle with the sampler, e.g.
    ``DataLoader(ds, batch_size=None, sampler=DistributedSampler(ds, shuffle=True))``. The
    plan never changes between epochs: there is no ``set_epoch``.

    Datasets that define ``set_epoch`` may resample per epoch, which would silently pair the
    plan with other samples; they are rejected unless ``epoch_invariant=True`` states that
    their per-index samples never change.
    """

    def __init__(self, dataset: Sequence[Any], plan: Any, *, epoch_invariant: bool = False) -> None:
        if not isinstance(plan, StaticPackPlan):
            raise InvalidArgumentError(f"plan must be a stowplan.StaticPackPlan (got {type(plan).__name__})")
        n = len(dataset)
        if n != plan.samples:
            raise InvalidArgumentError(
                f"dataset has {n} samples but the plan was built from {plan.samples}; rebuild the plan for this dataset"
            )
        if callable(getattr(dataset, "set_epoch", None)) and not epoch_invariant:
            raise InvalidArgumentError(
                "dataset defines set_epoch, so it may resample per epoch, but a static pack plan needs per-index "
                "samples that never change; disable static packing for it, or pass epoch_invariant=True if set_epoch "
                "does not change what dataset[i] returns"
            )
        self.dataset = dataset
        self.plan = plan

    def __len__(self) -> int:
        return len(self.plan)

    def __getitem__(self, index: int) -> List[Any]:
        return [self.dataset[i] for i in self.plan.pack(index)]

    def __repr__(self) -> str:
        return f"PackedDataset({len(self)} packs of {self.plan.samples} samples, world_size={self.plan.world_size})"


@renamed(packing_length="capacity")
def plan_dataset(
    dataset: Sequence[Any],
    length_fn: Callable[[Any], int],
    *,
    config: Optional[PackingConfig] = None,
    capacity: Optional[int] = None,
    world_size: int = 1,
    drop_last: bool = False,
    allow_single_long: bool = False,
    align: int = 1,
    eval: bool = False,
    cache_dir: Any = None,
    source: Optional[str] = None,
    length_config: Optional[Dict[str, Any]] = None,
    workers: Optional[int] = None,
    persist_every: Optional[int] = None,
    rank: int = 0,
    wait_timeout_s: Optional[float] = None,
    backend: Optional[str] = None,
    log: bool = True,
) -> Any:
    """The static pack plan of ``dataset``: planning lengths (cached under ``cache_dir`` when
    given, see :func:`compute_lengths`), the raw plan and its alignment, logged (pack
    counts, world size, drop_last, repeats, long samples, checksums). With ``config`` (a :class:`PackingConfig`) the capacity, long-sample
    policy, alignment, ``drop_last`` (never for ``eval=True``), world size, workers, flush
    cadence, wait timeout and dataset source come from it, and a partial accumulation window
    is warned about. ``workers``, ``wait_timeout_s`` and ``backend`` left ``None`` take the
    host's defaults. (``align`` and ``allow_single_long`` are spelled out because they enter
    the length cache's fingerprint as given.) ``packing_length=`` is the former name of
    ``capacity`` (deprecated: warns, for one release).
    """
    if config is not None:
        if not isinstance(config, PackingConfig):
            raise InvalidArgumentError(f"config must be a stowplan.PackingConfig (got {type(config).__name__})")
        if config.capacity is None:
            raise InvalidArgumentError("config has no packing length (packing is off)")
        capacity = config.capacity
        world_size = config.world_size
        drop_last = False if eval else config.dataloader_drop_last
        allow_single_long = config.allow_single_long
        align = config.align
        workers = config.precompute_workers
        persist_every = config.persist_every
        wait_timeout_s = config.wait_timeout_s
        source = source if source is not None else config.dataset_source
    if capacity is None:
        raise InvalidArgumentError("capacity is required (or pass config=PackingConfig.from_dict(...))")
    if eval:
        drop_last = False  # evaluation sees every sample
    if cache_dir is None:
        lengths = np.fromiter((checked_length(length_fn(s), i) for i, s in enumerate(dataset)), dtype=np.int64)
    else:
        if source is None:
            raise InvalidArgumentError("source (the dataset's identity, e.g. its resolved path) is required with cache_dir")
        fingerprint_config = {
            "packing_length": capacity,  # the length cache's fingerprint key, as its files have it
            "align": align,
            "allow_single_long": allow_single_long,
            "length": length_config,
        }
        lengths = compute_lengths(
            dataset,
            length_fn,
            cache_dir=cache_dir,
            source=source,
            config=fingerprint_config,
            workers=workers,
            persist_every=persist_every,
            rank=rank,
            wait_timeout_s=wait_timeout_s,
        )
    plan = StaticPackPlan.from_lengths(
        lengths,
        capacity=capacity,
        world_size=world_size,
        drop_last=drop_last,
        allow_single_long=allow_single_long,
        align=align,
        backend=backend,
    )
    if log:
        plan.log()
    if config is not None and not eval:
        config.accumulation_warning(plan)
    return plan
