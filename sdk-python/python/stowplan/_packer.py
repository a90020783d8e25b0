"""The packer runtime from Python: the orchestrator's sender, the trainer ranks' receiver, and
the in-process :class:`Packer`.

``stowplan serve --transport fs --root ROOT …`` runs the packer as a process. The
orchestrator sends :class:`TrainingBatch` es with :class:`FileSender` (``ROOT/inbox/``), every
trainer rank reads its micro-batches of each step with :class:`FileReceiver`
(``ROOT/rollouts/step_{n}/rank_{r}.bin``) as numpy arrays.

>>> import tempfile, stowplan
>>> root = tempfile.mkdtemp()
>>> packer = stowplan.Packer(seq_len=16, dp=2, num_runs=2)
>>> packer.add_run(0, batch_size=2); packer.add_run(1, batch_size=2)
>>> batch = stowplan.TrainingBatch(run=1, step=0, samples=[
...     {"prompt_ids": [1, 2], "completion_ids": [3, 4, 5], "advantage": 0.5},
...     {"prompt_ids": [6], "completion_ids": [7, 8], "advantage": -1.0},
...     {"prompt_ids": [9], "completion_ids": [], "advantage": 1.0}])
>>> packer.ingest(batch).rejected
[(2, 'empty_completion', 'empty completion (nothing to train on); pass allow_empty_completion to keep such samples')]
>>> ranks, metrics = packer.pack(force=True)
>>> [len(r) for r in ranks], metrics["real_tokens"]
([1, 1], 8)
>>> [mb.lora_num_tokens.tolist() for r in ranks for mb in r.micro_batches]
[[0, 5], [0, 3]]
>>> packer.delivered(0)
[(1, 0)]
>>> packer.progress(1)["step"], packer.progress(1)["ready_to_update"]
(1, True)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import _stowplan

__all__ = ["TrainingBatch", "FileSender", "FileReceiver", "RankBatch", "Packer", "IngestReport"]

RankBatch = _stowplan.RankBatch


@dataclass
class TrainingBatch:
    """One run's samples of one orchestrator step (prime-rl's ``TrainingBatch``).

    ``samples``: mappings or objects with ``prompt_ids``, ``completion_ids`` and
    ``advantage``, optionally ``prompt_mask``, ``completion_mask``, ``completion_logprobs``,
    ``completion_temperatures`` and ``teacher_logprobs`` (lists or numpy arrays), and
    ``extra_cost`` (an integer ≥ 0, default 0: a multimodal sample's image or vision tokens in
    the cost model's units, which balancing over ranks counts and ``seq_len`` does not; a
    sample whose cost would overflow beside the pending ones is rejected as
    ``cost_overflow``), and ``resources`` (a dict of limit name → the sample's size in it, for
    a packer with ``limits``; a limit it does not name is 0). ``(run, step)`` identifies the batch: the packer ignores a second batch with the same pair,
    so resending after a crash is safe.
    """

    samples: Sequence[Any]
    step: int
    run: int = 0
    temperature: float = 1.0

    def encode(self) -> bytes:
        """The batch in stowplan's versioned wire format (what the transports carry)."""
        return _stowplan.encode_training_batch(self.run, self.step, self.temperature, self.samples)


@dataclass
class IngestReport:
    """What :meth:`Packer.ingest` did: samples buffered, samples rejected as
    ``(index, reason, message)``, and whether the batch was a duplicate."""

    accepted: int
    rejected: List[Tuple[int, str, str]] = field(default_factory=list)
    duplicate: bool = False


class FileSender:
    """The orchestrator side of the filesystem transport: writes each batch (and run changes)
    into ``root/inbox/`` atomically (temporary file, fsync, rename)."""

    def __init__(self, root: "os.PathLike[str] | str") -> None:
        self.root = os.fspath(root)
        os.makedirs(os.path.join(self.root, "inbox"), exist_ok=True)

    def send(self, batch: TrainingBatch) -> str:
        """Sends ``batch``; returns the inbox file written."""
        name = _stowplan.batch_file_name(batch.run, batch.step)
        return os.fspath(_stowplan.fs_send(self.root, name, batch.encode()))

    def _control(self, kind: str, run: int, batch_size: int) -> str:
        data = _stowplan.encode_control(kind, run, batch_size)
        name = _stowplan.control_file_name(kind, run, time.time_ns(), os.getpid())
        return os.fspath(_stowplan.fs_send(self.root, name, data))

    def add_run(self, run: int, *, batch_size: int) -> str:
        """Asks the packer to add run ``run`` (a no-op if it exists)."""
        return self._control("add_run", run, batch_size)

    def remove_run(self, run: int) -> str:
        """Asks the packer to remove run ``run``; its pending samples are dropped (logged)."""
        return self._control("remove_run", run, 1)


class FileReceiver:
    """A trainer rank's side of the filesystem transport: waits for
    ``root/rollouts/step_{n}/rank_{rank}.bin`` and decodes it into a :class:`RankBatch` whose
    ``micro_batches`` hold numpy arrays.

    Iterating yields step ``start_step``, then the next, … (each waits up to ``timeout``
    seconds, ``None``: forever). With ``consume=True`` a file is deleted once decoded, and
    the step's directory with the last rank's file. The names, the checks and the
    consumption rule are the native ``FileRankClient``'s (``stowplan::serve::protocol::files``).
    """

    def __init__(
        self,
        root: "os.PathLike[str] | str",
        rank: int,
        *,
        start_step: int = 0,
        timeout: Optional[float] = None,
        poll: float = 0.005,
        consume: bool = False,
    ) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise _invalid(f"rank must be an integer ≥ 0 (got {rank!r})")
        if not isinstance(start_step, int) or isinstance(start_step, bool) or start_step < 0:
            raise _invalid(f"start_step must be an integer ≥ 0 (got {start_step!r})")
        _check_timeout("timeout", timeout)
        if isinstance(poll, bool) or not (isinstance(poll, (int, float)) and poll > 0):
            raise _invalid(f"poll must be a number of seconds > 0 (got {poll!r})")
        self.root = os.fspath(root)
        self.rank = rank
        self.next_step = start_step
        self.timeout = timeout
        self.poll = float(poll)
        self.consume = bool(consume)
        self._client = _stowplan.FileRankClient(
            self.root, rank, start_step=start_step, consume=self.consume, poll=self.poll
        )

    def path(self, step: int) -> str:
        """The file of ``step`` for this rank."""
        return os.fspath(self._client.path(step))

    def receive(self, step: Optional[int] = None, *, timeout: Optional[float] = None) -> RankBatch:
        """Waits for ``step`` (default: the next one) and returns it; the next call then
        waits for the step after. Raises ``stowplan.StowplanTimeoutError`` after ``timeout``
        (default: the receiver's)."""
        _check_timeout("timeout", timeout)
        step = self.next_step if step is None else step
        wait = self.timeout if timeout is None else timeout
        batch = self._client.receive(step=step, timeout=wait)
        self.next_step = self._client.next_step
        return batch

    def __iter__(self) -> Iterator[RankBatch]:
        while True:
            yield self.receive()


def _invalid(message: str) -> Exception:
    from .errors import InvalidArgumentError

    return InvalidArgumentError(message)


def _check_timeout(name: str, value: Optional[float]) -> None:
    if value is not None and not (isinstance(value, (int, float)) and value >= 0):
        raise _invalid(f"{name} must be None or a number of seconds ≥ 0 (got {value!r})")


def _no_state(options: Dict[str, Any]) -> None:
    for name in ("state", "batches"):
        if name in options:
            raise _invalid(f"{name} is not an option of Packer: restore a checkpoint with Packer.restore(state, batches, **options)")


class Packer:
    """The packer runtime in process: per-run buffers, a token threshold with a wait timeout,
    round-robin selection across runs, per-run progress, packing, balancing and
    materialization. ``stowplan serve`` runs the same code as a process.

    Options as in ``stowplan serve``: ``seq_len`` (micro-batch capacity; longer samples are
    rejected), ``dp`` (ranks), ``pad_to_multiple_of``, ``pad_token_id``, ``cost`` (``"tokens"``,
    ``"attention"`` or ``(linear, quadratic)``), ``num_runs`` (length of ``lora_num_tokens``),
    ``threshold`` (default ``seq_len × dp``), ``step_tokens`` (default: all pending),
    ``wait_timeout`` (seconds), ``teacher_logprobs``, ``allow_empty_completion``,
    ``loss_agg_mode`` (each micro-batch's ``loss_weights``: ``"token-mean"`` by default, as
    :func:`stowplan.materialize`), ``loss_scale_factor`` and ``loss_normalization``: the
    samples the weights count over, ``"step"`` (a run's samples in the packer step, the
    default) or ``"update"`` (a run's optimizer update of ``batch_size`` samples, however many
    packer steps it spans, so that Σ weight × loss over all of them is the update's unpacked
    loss; a run's samples are then packed once the rest of their update has arrived), and
    ``limits``: further caps per micro-batch by name (``{"image_tokens": 8192, "images": 32}``,
    ``stowplan serve --limit``), which every micro-batch keeps, a sample's sizes being its
    ``resources``; a sample over a cap is rejected as ``over_limit``, one naming a resource
    without a limit as ``unknown_resource``; ``max_segments``: at most this many samples per
    micro-batch (``stowplan serve --max-segments``; 0 or ``None``: no limit; one more cap
    beside ``limits``, of which there may then be 6; no limit may be named ``"segments"``).
    ``backend``: the kernel's, as every function's
    (``"wasm"``, the default, or ``"native"``). An unknown option is a ``TypeError`` naming it.
    """

    def __init__(self, *, seq_len: int, dp: int, **options: Any) -> None:
        # The options are the native packer's, named once in _stowplan.pyi (Packer); a None
        # option is the host's default (stowplan::PackerOptions::new), the one `stowplan serve`
        # uses.
        _no_state(options)
        self._inner = _stowplan.Packer(seq_len, dp, **options)

    def add_run(self, run: int, *, batch_size: int) -> None:
        """Adds run ``run`` (below ``num_runs``) whose step advances every ``batch_size`` samples."""
        self._inner.add_run(run, batch_size)

    def remove_run(self, run: int) -> int:
        """Removes run ``run``; returns how many of its pending samples were dropped."""
        return self._inner.remove_run(run)

    def clear_ready(self, run: int) -> None:
        """Clears the run's ``ready_to_update`` after the trainer updated it."""
        self._inner.clear_ready(run)

    def ingest(self, batch: "TrainingBatch | bytes") -> IngestReport:
        """Buffers the batch's valid samples; invalid ones are rejected with a reason. ``batch``:
        a :class:`TrainingBatch`, or its encoded bytes (``bytes``, ``bytearray``, a contiguous
        ``memoryview`` or numpy ``uint8`` array: read in place)."""
        if isinstance(batch, (bytes, bytearray, memoryview, np.ndarray)):
            accepted, rejected, duplicate = self._inner.ingest_bytes(batch, "batch")
        else:
            accepted, rejected, duplicate = self._inner.ingest(batch.run, batch.step, batch.temperature, batch.samples)
        return IngestReport(accepted, rejected, duplicate)

    def should_pack(self) -> bool:
        """Whether the threshold is reached or the oldest pending sample waited ``wait_timeout``."""
        return self._inner.should_pack()

    def pack(self, *, force: bool = False) -> Optional[Tuple[List[RankBatch], Dict[str, Any]]]:
        """Packs the next step if :meth:`should_pack` (or anything is pending and ``force``):
        one :class:`RankBatch` per rank and the step's figures. Call :meth:`delivered` once
        the ranks have it."""
        return self._inner.pack(force)

    def delivered(self, step: int) -> List[Tuple[int, int]]:
        """Marks the step in flight delivered; returns the ``(run, step)`` batches now done."""
        return self._inner.delivered(step)

    def pending(self) -> Tuple[int, int]:
        """Samples and tokens pending."""
        return self._inner.pending()

    @property
    def next_step(self) -> int:
        """The next packer step (the one in flight, if any)."""
        return self._inner.next_step()

    def runs(self) -> List[Dict[str, Any]]:
        """Every run's configuration and progress."""
        return self._inner.runs()

    def progress(self, run: int) -> Dict[str, Any]:
        """Run ``run``'s progress: ``step``, ``samples_this_step``, ``ready_to_update``,
        ``total_samples``, ``total_tokens``, ``received_samples``, ``rejected`` (by reason),
        ``duplicate_batches``."""
        for r in self.runs():
            if r["run"] == run:
                return r
        raise _invalid(f"run {run} does not exist")

    def state(self) -> bytes:
        """The checkpoint (versioned bytes): progress, pending order, round-robin position and
        the step in flight, without the batches' contents (see :meth:`needed_batches`)."""
        return self._inner.state()

    def needed_batches(self) -> List[Tuple[int, int]]:
        """The ``(run, step)`` batches a restore of :meth:`state` needs."""
        return self._inner.needed_batches()

    @classmethod
    def restore(cls, state: bytes, batches: Sequence["TrainingBatch | bytes"], /, **options: Any) -> "Packer":
        """A packer from :meth:`state` and the batches it names, with the same options."""
        encoded = [b if isinstance(b, bytes) else b.encode() for b in batches]
        _no_state(options)
        packer = cls.__new__(cls)
        packer._inner = _stowplan.Packer(**options, state=bytes(state), batches=encoded)
        return packer

    def rebuild_inflight(self) -> Optional[List[RankBatch]]:
        """After :meth:`restore`: the step that was in flight, byte for byte as before."""
        return self._inner.rebuild_inflight()
