"""The packer runtime from Python: the orchestrator's sender, the trainer ranks' receiver, and
the in-process :class:`Packer`.

``stowplan serve --transport fs --root ROOT …`` runs the packer as a process. The
orchestrator sends :class:`TrainingBatch` es with :class:`FileSender` (``ROOT/inbox/``), every
trainer rank reads its micro-batches of each step with :class:`FileRankClient`
(``ROOT/rollouts/step_{n}/rank_{r}.bin``) as numpy arrays.

>>> import tempfile, stowplan
>>> root = tempfile.mkdtemp()
>>> packer = stowplan.Packer(capacity=16, dp=2, num_runs=2)
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
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

from . import _stowplan

__all__ = ["TrainingBatch", "FileSender", "FileRankClient", "RankBatch", "Packer", "IngestReport"]

RankBatch = _stowplan.RankBatch
# The in-process packer runtime and what its ingest reports are the native classes.
Packer = _stowplan.Packer
IngestReport = _stowplan.IngestReport


@dataclass
class TrainingBatch:
    """One run's samples of one orchestrator step (prime-rl's ``TrainingBatch``).

    ``samples``: mappings or objects with ``prompt_ids``, ``completion_ids`` and
    ``advantage``, optionally ``prompt_mask``, ``completion_mask``, ``completion_logprobs``,
    ``completion_temperatures`` and ``teacher_logprobs`` (lists or numpy arrays), and
    ``extra_cost`` (an integer ≥ 0, default 0: a multimodal sample's image or vision tokens in
    the cost model's units, which balancing over ranks counts and ``capacity`` does not; a
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


class FileRankClient:
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
            raise invalid_argument(f"rank must be an integer ≥ 0 (got {rank!r})")
        if not isinstance(start_step, int) or isinstance(start_step, bool) or start_step < 0:
            raise invalid_argument(f"start_step must be an integer ≥ 0 (got {start_step!r})")
        check_timeout("timeout", timeout)
        if isinstance(poll, bool) or not (isinstance(poll, (int, float)) and poll > 0):
            raise invalid_argument(f"poll must be a number of seconds > 0 (got {poll!r})")
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
        check_timeout("timeout", timeout)
        step = self.next_step if step is None else step
        wait = self.timeout if timeout is None else timeout
        batch = self._client.receive(step=step, timeout=wait)
        self.next_step = self._client.next_step
        return batch

    def __iter__(self) -> Iterator[RankBatch]:
        while True:
            yield self.receive()


def invalid_argument(message: str) -> Exception:
    from .errors import InvalidArgumentError

    return InvalidArgumentError(message)


def check_timeout(name: str, value: Optional[float]) -> None:
    if value is not None and not (isinstance(value, (int, float)) and value >= 0):
        raise invalid_argument(f"{name} must be None or a number of seconds ≥ 0 (got {value!r})")
