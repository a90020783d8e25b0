"""Packing a dataset that arrives as a stream: :class:`PackedIterableDataset`.

The packs come from the kernel's streaming packer (:class:`stowplan.StreamPacker`): best fit
with at most ``max_open_bins`` bins open and ``max_buffered`` samples waiting, so memory is
bounded however long the stream. Every consumer (each DataLoader worker of each rank) runs
the same packer over the whole source and keeps only its own packs: pack ``p`` (numbered in
the order packs close) goes to rank ``p % world_size``, and that rank's ``k``-th pack to
worker ``k % num_workers``. A DataLoader reads its workers in turn, so each rank sees its
packs in pack order **whatever the number of workers**, and the ranks together see every
pack once. The price: every worker reads (and measures) every sample of the source.

Checkpoints: :meth:`PackedIterableDataset.state_dict` after any pack, then
:meth:`~PackedIterableDataset.load_state_dict` on a fresh dataset over the same source, gives
exactly the packs an uninterrupted run gives — no sample lost or repeated. The state holds
the packer's bytes, how many samples were read, and the stream indices still held; samples
themselves are not saved: resuming reads the source again from its start, keeping only the
held samples (the length function is not called for the others). Take the state in the
process that iterates the dataset (``num_workers=0``) or through a loader that checkpoints
inside its workers (torchdata's ``StatefulDataLoader``).
"""

from __future__ import annotations

import collections
import itertools
from typing import Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Tuple

from . import _stowplan
from .errors import InvalidArgumentError

try:  # A torch IterableDataset when torch is there, so DataLoader takes it as one.
    from torch.utils.data import IterableDataset as _Base
    from torch.utils.data import get_worker_info as _worker_info
except ImportError:  # pragma: no cover - exercised where torch is missing
    _Base = object  # type: ignore[assignment,misc]

    def _worker_info() -> Any:
        return None


_FORMAT = "stowplan.PackedIterableDataset"
_VERSION = 1


class PackedIterableDataset(_Base):  # type: ignore[misc,valid-type]
    """Packs the samples of an iterable dataset into bins of at most ``capacity`` tokens and
    yields each pack (a list of samples, in stream order) when it closes.

    ``dataset`` — any iterable of samples (a torch ``IterableDataset``, a Hugging Face
    ``IterableDataset``, a generator function's result wrapped in a re-iterable, a list);
    iterated once per consumer, and again from its start when resuming. ``length_fn`` —
    ``sample -> tokens`` (a non-negative int). ``capacity``, ``max_open_bins``,
    ``max_buffered``, ``align``, ``oversize`` and ``backend`` are :class:`StreamPacker`'s
    (``None``: its defaults, 64 open bins and 4096 waiting samples); with
    ``oversize="drop"`` a too-long sample is skipped, with ``"single"`` it is a pack alone.
    ``rank`` / ``world_size`` — this data-parallel rank and how many there are (default 0 of
    1). Inside a torch DataLoader the worker is found with ``get_worker_info()``.

    >>> docs = [{"ids": [1] * n} for n in (5, 3, 7, 2, 6, 4)]
    >>> ds = PackedIterableDataset(docs, lambda d: len(d["ids"]), capacity=10, max_buffered=0)
    >>> [[len(d["ids"]) for d in pack] for pack in ds]
    [[5, 3, 2], [6, 4], [7]]
    """

    def __init__(
        self,
        dataset: Iterable[Any],
        length_fn: Callable[[Any], int],
        capacity: int,
        *,
        max_open_bins: Optional[int] = None,
        max_buffered: Optional[int] = None,
        align: Optional[int] = None,
        oversize: Optional[str] = None,
        rank: int = 0,
        world_size: int = 1,
        backend: Optional[str] = None,
    ) -> None:
        if not callable(length_fn):
            raise InvalidArgumentError(f"length_fn must be callable (got {type(length_fn).__name__})")
        world_size = _stowplan._integer(world_size, "world_size", 1, 2**20)
        rank = _stowplan._integer(rank, "rank", 0, world_size - 1)
        self._options: Dict[str, Any] = {
            "max_open_bins": max_open_bins,
            "max_buffered": max_buffered,
            "align": align,
            "oversize": oversize,
            "backend": backend,
        }
        # Checks every option now (and fixes the defaults into the state's options).
        probe = _stowplan.StreamPacker(capacity, **self._options)
        self.capacity: int = probe.capacity
        self.max_open_bins: int = probe.max_open_bins
        self.max_buffered: int = probe.max_buffered
        self.align: int = probe.align
        self.oversize: str = probe.oversize
        self.dataset = dataset
        self.length_fn = length_fn
        self.rank = rank
        self.world_size = world_size
        self._resume: Optional[Dict[str, Any]] = None
        self._live: Optional[_Run] = None

    def __getstate__(self) -> Dict[str, Any]:
        # A copy for a DataLoader worker starts from the loaded state, not mid-iteration.
        state = dict(self.__dict__)
        state["_live"] = None
        return state

    def _settings(self) -> Dict[str, Any]:
        return {
            "capacity": self.capacity,
            "max_open_bins": self.max_open_bins,
            "max_buffered": self.max_buffered,
            "align": self.align,
            "oversize": self.oversize,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def __iter__(self) -> Iterator[List[Any]]:
        info = _worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self._iter_shard(worker, workers)

    def _iter_shard(self, worker: int, workers: int) -> Iterator[List[Any]]:
        """The packs of worker ``worker`` of ``workers`` of this rank (what ``__iter__`` yields
        inside a DataLoader worker)."""
        run = _Run(self, worker, workers, self._resume)
        # A loaded state resumes one iteration: the next ones start from the beginning.
        self._resume = None
        self._live = run
        return run.packs()

    def state_dict(self) -> Dict[str, Any]:
        """Where this dataset's iteration stands, after the last pack it yielded: a dict of
        ints, lists and bytes (``torch.save``/pickle/JSON-with-bytes friendly)."""
        if self._live is not None:
            return self._live.state()
        if self._resume is not None:
            return dict(self._resume)
        return {"format": _FORMAT, "version": _VERSION, "settings": self._settings(), "start": True}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`state_dict` of a dataset with the same
        settings over the same source) at the next iteration; the iterations after it start
        from the beginning of the source again. A state of another format,
        version or settings raises :class:`InvalidArgumentError`; damaged packer bytes are
        refused by the kernel."""
        if not isinstance(state, dict) or state.get("format") != _FORMAT:
            raise InvalidArgumentError(f"state must be a dict from PackedIterableDataset.state_dict() (format {_FORMAT!r})")
        if state.get("version") != _VERSION:
            raise InvalidArgumentError(
                f"state has version {state.get('version')!r}; this stowplan reads version {_VERSION}"
            )
        if state.get("settings") != self._settings():
            raise InvalidArgumentError(
                f"state was saved with settings {state.get('settings')!r}; this dataset has {self._settings()!r}"
            )
        if not state.get("start"):
            # Checks the packer's bytes (framing, version, sha256) now rather than at the next
            # iteration.
            _stowplan.StreamPacker.from_state(state["packer"], backend=self._options["backend"])
        self._resume = dict(state)
        self._live = None


class _Run:
    """One iteration of a :class:`PackedIterableDataset` by one consumer."""

    def __init__(self, ds: PackedIterableDataset, worker: int, workers: int, resume: Optional[Dict[str, Any]]):
        self.ds = ds
        self.worker = worker
        self.workers = workers
        self.held: Dict[int, Any] = {}
        #: Packs closed but not yet handed out (or skipped): (pack number, stream indices).
        self.queue: Deque[Tuple[int, List[int]]] = collections.deque()
        self.consumed = 0
        self.next_pack = 0
        self.started = False
        self.resume = None if resume is None or resume.get("start") else resume
        if self.resume is not None:
            if (self.resume.get("worker"), self.resume.get("workers")) != (worker, workers):
                raise InvalidArgumentError(
                    f"state was saved by worker {self.resume.get('worker')} of {self.resume.get('workers')}; "
                    f"this is worker {worker} of {workers} (resume with the same number of workers)"
                )
            self.packer = _stowplan.StreamPacker.from_state(self.resume["packer"], backend=ds._options["backend"])
            self.consumed = int(self.resume["consumed"])
            self.next_pack = int(self.resume["next_pack"])
        else:
            self.packer = _stowplan.StreamPacker(ds.capacity, **ds._options)

    def owns(self, pack: int) -> bool:
        ds = self.ds
        return pack % ds.world_size == ds.rank and (pack // ds.world_size) % self.workers == self.worker

    def state(self) -> Dict[str, Any]:
        if self.resume is not None and not self.started:
            # Iterated but not yet read from: where the loaded state stood.
            return dict(self.resume)
        return {
            "format": _FORMAT,
            "version": _VERSION,
            "settings": self.ds._settings(),
            "worker": self.worker,
            "workers": self.workers,
            "packer": self.packer.state(),
            "consumed": self.consumed,
            "next_pack": self.next_pack,
            "queue": [[p, list(b)] for p, b in self.queue],
            "held": sorted(self.held),
        }

    def packs(self) -> Iterator[List[Any]]:
        source = iter(self.ds.dataset)
        if self.resume is not None:
            # Read the source again up to where the state stood, keeping the held samples.
            wanted = set(self.resume["held"])
            for i, sample in enumerate(itertools.islice(source, self.consumed)):
                if i in wanted:
                    self.held[i] = sample
            missing = wanted.difference(self.held)
            if missing:
                raise InvalidArgumentError(
                    f"the source ended after fewer than {self.consumed} samples while resuming "
                    f"(stream indices {sorted(missing)[:5]} missing): is it the same source?"
                )
            self.queue.extend((int(p), [int(i) for i in b]) for p, b in self.resume["queue"])
        self.started = True
        yield from self.drain()
        length_fn = self.ds.length_fn
        for sample in source:
            index = self.consumed
            self.held[index] = sample
            length = _stowplan._integer(length_fn(sample), f"length_fn(sample {index})", 0, 2**64 - 1)
            closed = self.packer.add([length])
            self.consumed += 1
            for i in self.packer.last_dropped:
                del self.held[i]
            self.enqueue(closed)
            yield from self.drain()
        self.enqueue(self.packer.finish())
        for i in self.packer.last_dropped:
            del self.held[i]
        yield from self.drain()

    def enqueue(self, closed: List[List[int]]) -> None:
        for members in closed:
            self.queue.append((self.next_pack, members))
            self.next_pack += 1

    def drain(self) -> Iterator[List[Any]]:
        while self.queue:
            pack, members = self.queue.popleft()
            samples = [self.held.pop(i) for i in members]
            if self.owns(pack):
                yield samples
