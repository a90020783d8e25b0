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
the packer's bytes, how many samples were read, the packs closed but not yet handed out and
the stream indices still held, and a sha256 of all of it; samples themselves are not saved:
resuming reads the source again from its start, keeping only the held samples (the length
function is not called for the others). Take the state in the process that iterates the
dataset (``num_workers=0``) or through a loader that checkpoints inside its workers
(torchdata's ``StatefulDataLoader``).

A state is checked field by field before anything is resumed: every key and type, the
settings (against the dataset's and against the options inside the packer bytes), the number
of samples read (against the packer's count of lengths added), the held indices (exactly
those the packer still holds plus those of the waiting packs), the waiting packs' numbers and
members, and the pack counter's bounds; then the sha256, which covers what no cross-check can
(how the waiting packs split their members, the pack counter when no pack waits) — against
damage and edits that leave it as it was; its recipe is public, so it proves no authenticity.
A state failing any check raises :class:`InvalidArgumentError` naming the field. States of
version 1 (before the sha256) are refused.
"""

from __future__ import annotations

import array
import collections
import hashlib
import itertools
import json
import sys
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
#: 2: the state carries a sha256 of its fields (version 1 had none).
_VERSION = 2
#: The keys of a state taken during or after an iteration, and of one taken before any.
_RUN_KEYS = ("format", "version", "settings", "worker", "workers", "packer", "consumed", "next_pack", "queue", "held", "sha256")
_START_KEYS = ("format", "version", "settings", "start", "sha256")
_SHAPES = (
    f"(a state has the keys {', '.join(map(repr, _RUN_KEYS))}; one taken before any iteration "
    f"{', '.join(map(repr, _START_KEYS))}, with 'start' True)"
)
#: The settings' keys and types (the dataset's options the packs depend on).
_SETTINGS = {
    "capacity": int,
    "max_open_bins": int,
    "max_buffered": int,
    "align": int,
    "oversize": str,
    "rank": int,
    "world_size": int,
}
#: The options both the settings and the packer bytes carry.
_PACKER_OPTIONS = ("capacity", "max_open_bins", "max_buffered", "align", "oversize")


class PackedIterableDataset(_Base):  # type: ignore[misc,valid-type]
    """Packs the samples of an iterable dataset into bins of at most ``capacity`` tokens and
    yields each pack (a list of samples, in stream order) when it closes.

    ``dataset`` — any iterable of samples (a torch ``IterableDataset``, a Hugging Face
    ``IterableDataset``, a generator function's result wrapped in a re-iterable, a list);
    iterated once per consumer, and again from its start when resuming. ``length_fn`` —
    ``sample -> tokens`` (a non-negative int). ``capacity``, ``max_open_bins``,
    ``max_buffered``, ``align``, ``oversize`` and ``backend`` are :class:`StreamPacker`'s
    (``None``: its defaults, 64 open bins and 4096 waiting samples). ``oversize`` says what a
    sample longer than ``capacity`` does — real SFT data nearly always has some, so choose:
    ``"error"`` (the default) raises :class:`InfeasibleError` when the iteration reaches it,
    ``"drop"`` skips it, ``"single"`` yields it as a pack alone (over the capacity).
    ``rank`` / ``world_size`` — this data-parallel rank and how many there are (default 0 of
    1). Inside a torch DataLoader the worker is found with ``get_worker_info()``.

    >>> docs = [{"ids": [1] * n} for n in (5, 3, 7, 12, 2, 6, 4)]    # one doc over the capacity
    >>> ds = PackedIterableDataset(docs, lambda d: len(d["ids"]), capacity=10, max_buffered=0, oversize="drop")
    >>> [[len(d["ids"]) for d in pack] for pack in ds]
    [[5, 3, 2], [6, 4], [7]]
    >>> ds = PackedIterableDataset(docs, lambda d: len(d["ids"]), capacity=10, max_buffered=0, oversize="single")
    >>> [[len(d["ids"]) for d in pack] for pack in ds]
    [[12], [5, 3, 2], [6, 4], [7]]
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
        ints, strs, lists and bytes (``torch.save``/pickle/JSON-with-bytes friendly) with a
        sha256 of its fields."""
        if self._live is not None:
            return self._live.state()
        if self._resume is not None:
            return _copy(self._resume)
        return _signed({"format": _FORMAT, "version": _VERSION, "settings": self._settings(), "start": True})

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continues from ``state`` (from :meth:`state_dict` of a dataset with the same
        settings over the same source) at the next iteration; the iterations after it start
        from the beginning of the source again. Every field is checked now (the worker
        against the consumer now inside a DataLoader worker, else when the iteration
        starts): a state of another format, version
        or settings, a missing, extra or mistyped key, damaged packer bytes, or fields that
        disagree with the packer bytes or with each other raise
        :class:`InvalidArgumentError` naming the field, and nothing is loaded."""
        self._resume = _checked(self, state)
        self._live = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(state: Dict[str, Any], key: str, low: int, high: Optional[int] = None) -> int:
    value = state[key]
    if not _is_int(value):
        raise InvalidArgumentError(f"state[{key!r}] must be an int (got {type(value).__name__})")
    if value < low or (high is not None and value > high):
        bound = f"{low}..={high}" if high is not None else f">= {low}"
        raise InvalidArgumentError(f"state[{key!r}] must be {bound} (got {value})")
    return value


def _ints(value: Any, what: str) -> List[int]:
    """A list (or tuple) of ints, as a new list."""
    if not isinstance(value, (list, tuple)):
        raise InvalidArgumentError(f"{what} must be a list of ints (got {type(value).__name__})")
    if not all(type(v) is int for v in value):
        for k, v in enumerate(value):
            if not _is_int(v):
                raise InvalidArgumentError(f"{what}[{k}] must be an int (got {type(v).__name__})")
    return [int(v) for v in value]


def _ascending(values: List[int], what: str, below: int) -> None:
    """``values`` ascend strictly and are stream indices read so far (< ``below``)."""
    for k, v in enumerate(values):
        if v < 0 or v >= below:
            raise InvalidArgumentError(
                f"{what}[{k}] is {v}: not a stream index read so far (state['consumed'] is {below})"
            )
        if k and v <= values[k - 1]:
            raise InvalidArgumentError(
                f"{what} must ascend without repeats ({what}[{k}] is {v} after {values[k - 1]})"
            )


def _u64s(values: List[int]) -> bytes:
    a = array.array("Q", values)
    if sys.byteorder == "big":  # pragma: no cover - the digest is the same on every host
        a.byteswap()
    return len(values).to_bytes(8, "little") + a.tobytes()


def _digest(state: Dict[str, Any]) -> str:
    """The sha256 of a state's fields (its ``"sha256"`` aside), the same on every host. The
    ints in it are u64s: a state is only hashed once its fields are checked."""
    h = hashlib.sha256(b"stowplan.PackedIterableDataset state\0")
    head = {k: state[k] for k in ("format", "version", "settings", "worker", "workers", "consumed", "next_pack", "start") if k in state}
    h.update(json.dumps(head, sort_keys=True, separators=(",", ":")).encode())
    if "packer" in state:
        packer = bytes(state["packer"])
        h.update(len(packer).to_bytes(8, "little") + packer)
        h.update(_u64s(state["held"]))
        h.update(len(state["queue"]).to_bytes(8, "little"))
        for pack, members in state["queue"]:
            h.update(pack.to_bytes(8, "little") + _u64s(members))
    return h.hexdigest()


def _signed(state: Dict[str, Any]) -> Dict[str, Any]:
    state["sha256"] = _digest(state)
    return state


def _copy(state: Dict[str, Any]) -> Dict[str, Any]:
    """A copy sharing no list or dict with ``state`` (bytes are immutable)."""
    out = dict(state)
    out["settings"] = dict(state["settings"])
    if "held" in state:
        out["held"] = list(state["held"])
        out["queue"] = [[p, list(m)] for p, m in state["queue"]]
    return out


def _checked(ds: PackedIterableDataset, state: Any) -> Dict[str, Any]:
    """``state`` checked field by field for ``ds`` (see the module docs), as a fresh dict."""
    if not isinstance(state, dict) or state.get("format") != _FORMAT:
        raise InvalidArgumentError(
            f"state must be a dict from PackedIterableDataset.state_dict() (format {_FORMAT!r}, "
            f"got {'format ' + repr(state.get('format')) if isinstance(state, dict) else type(state).__name__})"
        )
    version = state.get("version")
    if not _is_int(version) or version != _VERSION:
        raise InvalidArgumentError(f"state has version {version!r}; this stowplan reads version {_VERSION}")
    keys = _START_KEYS if "start" in state else _RUN_KEYS
    missing = [k for k in keys if k not in state]
    if missing:
        raise InvalidArgumentError(f"state lacks key(s) {', '.join(map(repr, missing))} {_SHAPES}")
    unknown = sorted(repr(k) for k in state if k not in keys)
    if unknown:
        raise InvalidArgumentError(f"state has unknown key(s) {', '.join(unknown)} {_SHAPES}")

    settings = state["settings"]
    if not isinstance(settings, dict):
        raise InvalidArgumentError(f"state['settings'] must be a dict (got {type(settings).__name__})")
    if set(settings) != set(_SETTINGS):
        raise InvalidArgumentError(
            f"state['settings'] must have the keys {', '.join(map(repr, _SETTINGS))} (got {', '.join(sorted(map(repr, settings)))})"
        )
    for key, kind in _SETTINGS.items():
        value = settings[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidArgumentError(
                f"state['settings'][{key!r}] must be {'an int' if kind is int else 'a str'} (got {type(value).__name__})"
            )
    ours = ds._settings()
    differ = [k for k in _SETTINGS if settings[k] != ours[k]]
    if differ:
        raise InvalidArgumentError(
            "state was saved with other settings than this dataset's: "
            + ", ".join(f"{k} is {settings[k]!r} in the state, {ours[k]!r} here" for k in differ)
        )
    digest = state["sha256"]
    if not isinstance(digest, str) or len(digest) != 64 or digest.strip("0123456789abcdef"):
        raise InvalidArgumentError(f"state['sha256'] must be 64 lowercase hex digits (got {digest!r:.80})")

    if "start" in state:
        if state["start"] is not True:
            raise InvalidArgumentError(f"state['start'] must be True (got {state['start']!r})")
        out: Dict[str, Any] = {"format": _FORMAT, "version": _VERSION, "settings": dict(settings), "start": True}
        return _verified(out, digest)

    workers = _int(state, "workers", 1)
    worker = _int(state, "worker", 0, workers - 1)
    info = _worker_info()
    if info is not None:  # loaded inside a DataLoader worker: the consumer is known already
        _same_consumer(worker, workers, info.id, info.num_workers)
    raw = state["packer"]
    if not isinstance(raw, (bytes, bytearray)):
        raise InvalidArgumentError(f"state['packer'] must be bytes from StreamPacker.state() (got {type(raw).__name__})")
    try:
        packer = _stowplan.StreamPacker.from_state(raw, backend=ds._options["backend"])
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"state['packer'] is refused: {e}") from None
    inside = {k: getattr(packer, k) for k in _PACKER_OPTIONS}
    differ = [k for k in _PACKER_OPTIONS if inside[k] != settings[k]]
    if differ:
        raise InvalidArgumentError(
            "state['packer'] was saved with other options than state['settings'] (and this dataset) say: "
            + ", ".join(f"{k} is {inside[k]!r} in the packer bytes, {settings[k]!r} in the settings" for k in differ)
        )
    consumed = _int(state, "consumed", 0)
    if consumed != packer.next_index:
        raise InvalidArgumentError(
            f"state['consumed'] is {consumed}, but its packer bytes have been given {packer.next_index} samples"
        )
    next_pack = _int(state, "next_pack", 0)
    held = _ints(state["held"], "state['held']")
    _ascending(held, "state['held']", consumed)

    entries = state["queue"]
    if not isinstance(entries, (list, tuple)):
        raise InvalidArgumentError(f"state['queue'] must be a list of [pack number, stream indices] (got {type(entries).__name__})")
    queue: List[List[Any]] = []
    for k, entry in enumerate(entries):
        what = f"state['queue'][{k}]"
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise InvalidArgumentError(f"{what} must be a [pack number, stream indices] pair (got {entry!r:.80})")
        pack = entry[0]
        if not _is_int(pack) or pack < 0:
            raise InvalidArgumentError(f"{what}[0], a pack number, must be an int >= 0 (got {pack!r:.80})")
        if queue and pack != queue[-1][0] + 1:
            raise InvalidArgumentError(
                f"state['queue']'s pack numbers must be consecutive ({what} is pack {pack} after pack {queue[-1][0]})"
            )
        members = _ints(entry[1], f"{what}[1]")
        if not members:
            raise InvalidArgumentError(f"{what}[1] must list the pack's stream indices (got an empty list)")
        _ascending(members, f"{what}[1]", consumed)
        queue.append([pack, members])
    if queue and next_pack != queue[-1][0] + 1:
        raise InvalidArgumentError(
            f"state['next_pack'] is {next_pack}, but state['queue'] ends at pack {queue[-1][0]} "
            f"(next_pack must be {queue[-1][0] + 1})"
        )

    # The indices the packer bytes still hold (waiting or in open bins): finishing this
    # throwaway packer hands out every one of them.
    in_packer = {i for b in packer.finish() for i in b}
    in_packer.update(packer.last_dropped)
    held_set = set(held)
    in_queue: set = set()
    for k, (pack, members) in enumerate(queue):
        for i in members:
            if i in in_packer:
                raise InvalidArgumentError(
                    f"state['queue'][{k}] holds stream index {i}, which its packer bytes still hold (not in a closed pack)"
                )
            if i in in_queue:
                raise InvalidArgumentError(f"state['queue'] holds stream index {i} in two packs")
            if i not in held_set:
                raise InvalidArgumentError(f"state['queue'][{k}] holds stream index {i}, which state['held'] lacks")
            in_queue.add(i)
    lacking = sorted(in_packer - held_set)
    if lacking:
        raise InvalidArgumentError(
            f"state['held'] lacks stream indices its packer bytes still hold: {lacking[:5]}{' …' if len(lacking) > 5 else ''}"
        )
    extra = sorted(held_set - in_packer - in_queue)
    if extra:
        raise InvalidArgumentError(
            f"state['held'] has stream indices neither its packer bytes nor state['queue'] hold: "
            f"{extra[:5]}{' …' if len(extra) > 5 else ''}"
        )

    # Each closed pack holds at least one sample, and a sample leaves the packer only in a
    # closed pack (or dropped, under oversize="drop"): the `gone` samples, neither held nor
    # waiting, are those of the packs handed out (next_pack minus the waiting ones), and the
    # dropped ones. The exact count of packs closed is not in the packer bytes: beyond these
    # bounds (and the queue, which pins next_pack when a pack waits), the sha256 covers it.
    gone = consumed - len(held)
    handed = next_pack - len(queue)
    if handed > gone:
        raise InvalidArgumentError(
            f"state['next_pack'] is {next_pack}: {handed} packs handed out, but only {gone} samples left the packer"
        )
    if settings["oversize"] != "drop" and (handed == 0) != (gone == 0):
        raise InvalidArgumentError(
            f"state['next_pack'] is {next_pack}: {handed} packs handed out, but {gone} samples left the packer "
            "(nothing is dropped under this oversize policy)"
        )
    out = {
        "format": _FORMAT,
        "version": _VERSION,
        "settings": dict(settings),
        "worker": worker,
        "workers": workers,
        "packer": bytes(raw),
        "consumed": consumed,
        "next_pack": next_pack,
        "queue": queue,
        "held": held,
    }
    return _verified(out, digest)


def _same_consumer(saved: int, saved_of: int, worker: int, workers: int) -> None:
    if (saved, saved_of) != (worker, workers):
        raise InvalidArgumentError(
            f"state was saved by worker {saved} of {saved_of} (state['worker'], state['workers']); "
            f"this is worker {worker} of {workers} (resume with the same number of workers)"
        )


def _verified(state: Dict[str, Any], digest: str) -> Dict[str, Any]:
    if _digest(state) != digest:
        raise InvalidArgumentError(
            "state['sha256'] does not match the state's fields: it was edited or damaged "
            "(the cross-checks cannot see every edit, e.g. of how state['queue'] splits its members)"
        )
    state["sha256"] = digest
    return state


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
        # A checked state (load_state_dict), or None.
        self.resume = None if resume is None or resume.get("start") else resume
        if self.resume is not None:
            _same_consumer(self.resume["worker"], self.resume["workers"], worker, workers)
            self.packer = _stowplan.StreamPacker.from_state(self.resume["packer"], backend=ds._options["backend"])
            self.consumed = self.resume["consumed"]
            self.next_pack = self.resume["next_pack"]
        else:
            self.packer = _stowplan.StreamPacker(ds.capacity, **ds._options)

    def owns(self, pack: int) -> bool:
        ds = self.ds
        return pack % ds.world_size == ds.rank and (pack // ds.world_size) % self.workers == self.worker

    def state(self) -> Dict[str, Any]:
        if self.resume is not None and not self.started:
            # Iterated but not yet read from: where the loaded state stood.
            return _copy(self.resume)
        return _signed(
            {
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
        )

    def packs(self) -> Iterator[List[Any]]:
        source = iter(self.ds.dataset)
        if self.resume is not None:
            # Read the source again up to where the state stood, keeping the held samples.
            wanted = set(self.resume["held"])
            read = 0
            for sample in itertools.islice(source, self.consumed):
                if read in wanted:
                    self.held[read] = sample
                read += 1
            if read < self.consumed:
                raise InvalidArgumentError(
                    f"the source ended after {read} of the {self.consumed} samples the state had read "
                    "(state['consumed']) while resuming: is it the same source?"
                )
            self.queue.extend((p, list(b)) for p, b in self.resume["queue"])
        self.started = True
        yield from self.drain()
        length_fn = self.ds.length_fn
        for sample in source:
            index = self.consumed
            length = _stowplan._integer(length_fn(sample), f"length_fn(sample {index})", 0, 2**64 - 1)
            closed = self.packer.add([length])
            # Held only once the packer took it: a state taken after a refused length stays
            # consistent (it does not list an index the packer was never given).
            self.held[index] = sample
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
