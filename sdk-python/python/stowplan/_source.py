"""The rollout data source with a buffer (slime's ``RolloutDataSourceWithBuffer``), run by the Rust
host: prompts from a JSONL file, an epoch cursor with a seeded shuffle identical in every
host, groups of ``n_samples_per_prompt`` samples with consecutive indices, a buffer served
first (FIFO), and a saved state that includes the buffer.

What the buffer keeps of a sample, and so what a saved state holds: a :class:`RolloutSample` is
kept as its fields; plain JSON data (dicts with string keys, lists, strings, ints, floats,
bools, ``None``) as JSON; any other object pickled. Unpickling runs code chosen by whoever
wrote the bytes, so a data source saves and loads pickled samples only when it was made with
``allow_pickle=True``: without it, :meth:`DataSource.save` refuses a buffer holding one and
:meth:`DataSource.load` refuses a state holding one — before unpickling anything, leaving the
data source as it was. (In process, pickled samples come back from :meth:`get_samples` either
way: those bytes were made here.)

>>> import stowplan
>>> ds = stowplan.BufferedDataSource.from_records(
...     [{"prompt": "1+1?", "label": "2"}, {"prompt": "2+2?", "label": "4"}], n_samples_per_prompt=2)
>>> [[s.index for s in g] for g in ds.get_samples(3)]
[[0, 1], [2, 3], [4, 5]]
>>> ds.epoch, ds.offset
(1, 1)
"""

from __future__ import annotations

import json
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence

from . import _stowplan
from ._filter import Filter
from .errors import CacheMismatchError, InvalidArgumentError

__all__ = ["RolloutSample", "DataSource", "BufferedDataSource"]

_UNKNOWN_PROMPT = 2**32 - 1

# How a buffered sample's payload is encoded, by its first byte: empty for a RolloutSample (its
# fields say everything), JSON, or pickle. Pickles written before the tags (protocol >= 2)
# begin with the PROTO opcode and are read as pickles too.
_JSON = b"J"
_PICKLE = b"P"
_PICKLE_UNTAGGED = b"\x80"
_PICKLED = (_PICKLE, _PICKLE_UNTAGGED)
# Nesting deeper than this is pickled rather than walked.
_MAX_JSON_DEPTH = 256

_ALLOW_PICKLE = "allow_pickle=True"


@dataclass
class RolloutSample:
    """A rollout sample drawn from a data source (slime's ``Sample`` fields that the data
    source and buffer filters use). Other samples put into the buffer come back equal: plain
    JSON data (dicts with string keys, lists, strings, ints, floats, bools, ``None``) through
    JSON, any other object pickled — which a data source saves and loads only with
    ``allow_pickle=True`` (see the module documentation)."""

    index: int
    group: int
    prompt_index: int
    prompt: Any
    label: Optional[str] = None
    metadata: Dict[str, Any] = field(default_factory=dict)
    prompt_length: int = 0
    response_length: int = 0
    rewards: List[float] = field(default_factory=list)
    status: str = "pending"


# The former name, for pickles written before the rename (they name stowplan._source.Sample);
# ``stowplan.Sample`` warns and gives RolloutSample.
Sample = RolloutSample


def _get(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, dict):
        return sample.get(name, default)
    return getattr(sample, name, default)


def _to_native(sample: Any, at: str) -> Dict[str, Any]:
    """``sample`` as the native layer's dict (which checks the integers and names them)."""
    rewards = _get(sample, "rewards")
    if rewards is None:
        reward = _get(sample, "reward")
        if reward is None:
            rewards = []
        elif isinstance(reward, dict):
            rewards = [reward[key] for key in sorted(reward)]
        else:
            rewards = [reward]
    try:
        rewards = [float(r) for r in rewards]
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{at}: rewards must be numbers (got {rewards!r})") from None
    status = _get(sample, "status", "pending")
    status = getattr(status, "value", status)
    response_length = _get(sample, "response_length", 0) or 0
    prompt_length = _get(sample, "prompt_length")
    if prompt_length is None:
        tokens = _get(sample, "tokens")
        response = _stowplan._integer(response_length, f"{at}.response_length", 0, _UNKNOWN_PROMPT)
        prompt_length = max(0, len(tokens) - response) if tokens else 0
    label = _get(sample, "label")
    metadata = _get(sample, "metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidArgumentError(f"{at}.metadata must be a dict (got {type(metadata).__name__})")
    prompt_index = _get(sample, "prompt_index")
    native = {
        "index": _get(sample, "index"),
        "group": _get(sample, "group"),
        "prompt_index": _UNKNOWN_PROMPT if prompt_index is None else prompt_index,
        "prompt": json.dumps(_get(sample, "prompt", "")),
        "label": label if label is None or isinstance(label, str) else json.dumps(label),
        "metadata": json.dumps(metadata),
        "prompt_length": prompt_length,
        "response_length": response_length,
        "rewards": rewards,
        "status": str(status),
        "payload": _payload(sample),
    }
    return native


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is plain JSON data that JSON gives back equal and of the same types
    (exact types only: no subclasses, no tuples, string keys)."""
    if depth > _MAX_JSON_DEPTH:
        return False
    t = type(value)
    if value is None or t in (str, int, float, bool):
        return True
    if t is list:
        return all(_plain(v, depth + 1) for v in value)
    if t is dict:
        return all(type(k) is str and _plain(v, depth + 1) for k, v in value.items())
    return False


def _payload(sample: Any) -> bytes:
    """What the buffer keeps of ``sample`` besides the native fields (see ``_JSON``)."""
    if isinstance(sample, RolloutSample):
        return b""
    if _plain(sample):
        return _JSON + json.dumps(sample).encode()
    return _PICKLE + pickle.dumps(sample)


def _pickled(heads: List[List[bytes]]) -> Optional[str]:
    """Where the first pickled sample of a buffer is (``"group g, sample j"``), or None;
    ``heads`` are the payloads' first bytes. A payload of no known encoding raises."""
    where = None
    for g, group in enumerate(heads):
        for j, head in enumerate(group):
            if head in _PICKLED:
                where = where or f"group {g}, sample {j}"
            elif head not in (b"", _JSON):
                raise CacheMismatchError(f"buffer group {g}, sample {j}: a payload of no known encoding (tag {head!r})")
    return where


def _from_native(d: Dict[str, Any]) -> Any:
    payload = d["payload"]
    if payload[:1] == _JSON:
        return json.loads(payload[1:])
    if payload[:1] == _PICKLE:
        return pickle.loads(payload[1:])
    if payload[:1] == _PICKLE_UNTAGGED:
        return pickle.loads(payload)
    if payload:
        raise CacheMismatchError(f"buffered sample {d['index']}: a payload of no known encoding")
    return RolloutSample(
        index=d["index"],
        group=d["group"],
        prompt_index=d["prompt_index"],
        prompt=json.loads(d["prompt"]),
        label=d["label"],
        metadata=json.loads(d["metadata"]),
        prompt_length=d["prompt_length"],
        response_length=d["response_length"],
        rewards=list(d["rewards"]),
        status=d["status"],
    )


class DataSource:
    """Prompts from a JSONL file (``path``), drawn as groups of ``n_samples_per_prompt``
    samples. Read-only: :meth:`add_samples` raises (use :class:`BufferedDataSource`).

    Options (omitted: the host's defaults): ``shuffle`` — the kernel's seeded permutation of
    ``(seed, epoch)`` every epoch (default False); ``seed`` (default 0); ``input_key`` — the
    prompt's key in each record (default ``"prompt"``); ``label_key``, ``metadata_key`` —
    the label's and metadata's keys (defaults ``"label"``, ``"metadata"``; ``None``: none);
    ``backend`` — ``"wasm"`` (default) or ``"native"``; ``allow_pickle`` — save and load
    buffered samples that are neither :class:`RolloutSample` objects nor plain JSON data, pickled
    (default False: :meth:`save` and :meth:`load` refuse them, since unpickling a state runs
    code chosen by whoever wrote it; set it only when every state this data source loads
    comes from a writer you trust).
    """

    _buffered = False

    def __init__(
        self,
        path: Any,
        *,
        n_samples_per_prompt: int,
        filter: Optional[Filter] = None,
        allow_pickle: bool = False,
        **options: Any,
    ) -> None:
        self._native = _stowplan.DataSource(os.fspath(path), n_samples_per_prompt, **options)
        self.n_samples_per_prompt = n_samples_per_prompt
        self.filter = filter
        self.allow_pickle = allow_pickle

    @classmethod
    def from_records(
        cls,
        records: Iterable[Dict[str, Any]],
        *,
        n_samples_per_prompt: int,
        filter: Optional[Filter] = None,
        allow_pickle: bool = False,
        **options: Any,
    ) -> "DataSource":
        """A data source over in-memory records; ``identity`` names them in saved states
        (default ``"records"``); the other options (``allow_pickle`` too) as for the
        constructor."""
        self = cls.__new__(cls)
        self._native = _stowplan.DataSource([json.dumps(r) for r in records], n_samples_per_prompt, **options)
        self.n_samples_per_prompt = n_samples_per_prompt
        self.filter = filter
        self.allow_pickle = allow_pickle
        return self

    @property
    def allow_pickle(self) -> bool:
        """Whether :meth:`save` and :meth:`load` accept pickled samples (see the class)."""
        return self._allow_pickle

    @allow_pickle.setter
    def allow_pickle(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"allow_pickle must be True or False (got {value!r})")
        self._allow_pickle = value

    @property
    def filter(self) -> Optional[Filter]:
        """The buffer filter :meth:`get_samples` uses (``None``: first in, first out)."""
        return self._filter

    @filter.setter
    def filter(self, value: Optional[Filter]) -> None:
        if value is not None and not isinstance(value, Filter):
            raise InvalidArgumentError(f"filter must be a stowplan.Filter or None (got {type(value).__name__})")
        if value is not None and not self._buffered:
            raise InvalidArgumentError(f"{type(self).__name__} has no buffer to filter: use BufferedDataSource")
        self._filter = value

    def get_samples(self, num_samples: int, rollout_id: Optional[int] = None) -> List[List[Any]]:
        """``num_samples`` groups: buffered ones first — chosen by :attr:`filter`, first in
        first out without one — then from the dataset. When the filter fails, a
        :class:`~stowplan.FilterError` subclass is raised and nothing is taken."""
        native_filter = self._filter._native if self._filter is not None else None
        groups = self._native.get_samples(num_samples, rollout_id=rollout_id, filter=native_filter)
        return [[_from_native(d) for d in g] for g in groups]

    def add_samples(self, samples: Sequence[Sequence[Any]]) -> None:
        """Appends groups to the buffer after checking every group has
        ``n_samples_per_prompt`` samples (nothing is added when one is wrong)."""
        if not self._buffered:
            raise InvalidArgumentError(f"cannot add samples to {type(self).__name__}: it is read-only")
        if not isinstance(samples, (list, tuple)) or any(not isinstance(g, (list, tuple)) for g in samples):
            raise InvalidArgumentError("samples must be a list of groups (lists of samples)")
        native = [[_to_native(s, f"groups[{g}][{j}]") for j, s in enumerate(group)] for g, group in enumerate(samples)]
        self._native.add_samples(native)

    def save(self, path: Any) -> None:
        """Writes the state — cursor, indices, metadata and the buffer — atomically.

        Without :attr:`allow_pickle`, a buffer holding a sample that would be saved pickled
        (neither a :class:`RolloutSample` nor plain JSON data) raises
        :class:`~stowplan.InvalidArgumentError` and nothing is written."""
        path = os.fspath(path)
        where = _pickled(self._native.buffer_payload_heads(1))
        if where is not None and not self._allow_pickle:
            raise InvalidArgumentError(
                f"cannot save {path}: buffered sample ({where}) is neither a stowplan.RolloutSample nor plain JSON data "
                f"(dicts with string keys, lists, str, int, float, bool, None), so it would be saved pickled, and "
                f"loading a pickle runs code chosen by whoever wrote the file; buffer such data instead, or make the "
                f"data source with {_ALLOW_PICKLE} if every reader of the state trusts its writer"
            )
        self._native.save(path)

    def load(self, path: Any) -> None:
        """Restores a saved state; a missing, damaged or foreign file raises, and so —
        without :attr:`allow_pickle` — does a state holding pickled samples
        (:class:`~stowplan.InvalidArgumentError`; nothing is unpickled). On error the data
        source is left as it was."""
        path = os.fspath(path)

        def check(heads: List[List[bytes]]) -> None:
            # Runs on the saved buffer before anything of it is applied.
            where = _pickled(heads)
            if where is not None and not self._allow_pickle:
                raise InvalidArgumentError(
                    f"refusing to load {path}: its buffer holds pickled samples ({where} is the first), and "
                    f"unpickling runs code chosen by whoever wrote the file; make the data source with "
                    f"{_ALLOW_PICKLE} only if you trust that writer"
                )

        self._native.load(path, check=check)

    def update_metadata(self, metadata: Dict[str, Any]) -> None:
        """Merges ``metadata`` (JSON-serializable) into the saved metadata."""
        try:
            text = json.dumps(metadata)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"metadata must be JSON-serializable: {exc}") from None
        self._native.update_metadata_json(text)

    def get_metadata(self) -> Dict[str, Any]:
        """The metadata."""
        return json.loads(self._native.metadata_json())

    def get_buffer_length(self) -> int:
        """Groups in the buffer."""
        return self._native.buffer_len

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return self._native.epoch

    @property
    def offset(self) -> int:
        """Prompts of the current epoch already drawn."""
        return self._native.offset

    @property
    def next_index(self) -> int:
        """The index the next sample drawn from the dataset gets."""
        return self._native.next_index

    def __len__(self) -> int:
        return len(self._native)


class BufferedDataSource(DataSource):
    """A :class:`DataSource` with a buffer: :meth:`add_samples` puts groups back (e.g.
    partial rollouts) and :meth:`get_samples` serves them first — oldest first, or in the
    order a sandboxed ``filter=`` :class:`~stowplan.Filter` chooses."""

    _buffered = True
