"""The packer on Ray (``pip install 'stowplan[ray]'``): the packer as an actor, trainer ranks fed
through the object store, and dataset lengths on Ray Data.

:class:`PackerActor` is a plain class; wrap it with the ``ray.remote`` options you choose::

    Actor = ray.remote(num_cpus=1, max_restarts=-1)(stowplan.ray.PackerActor)
    packer = Actor.options(name="packer", lifetime="detached").remote(
        capacity=16384, dp=4, num_runs=1, checkpoint_dir="/ckpt/packer")

It holds a :class:`stowplan.Packer` (same options) and keeps its semantics: per-run buffers,
duplicate batches (by run and step) detected in the receipt, balancing, micro-batches,
materialization with loss weights. Any worker sends batches with ``packer.send.remote(batch)``
(a :class:`stowplan.TrainingBatch`, its encoded bytes, or an ``ObjectRef`` to either: put large
batches in the object store once with :func:`put_batch` and pass the ref; the actor reads them
there in place).

Steps follow the packer's own rules, those ``stowplan serve`` applies: a step is packed when
:meth:`stowplan.Packer.should_pack` says so (or on :meth:`PackerActor.pack`), every rank's
:class:`stowplan.RankBatch` goes to the object store, and the step is marked delivered (its
batches done) once every rank acknowledged it; the next step is packed only then. A rank asking
for a step already delivered is refused (those steps are gone).

With ``checkpoint_dir`` the actor writes the packer's versioned state (:meth:`Packer.state`
and the ranks that acknowledged the step in flight, framed as every durable file is:
``packer_state.bin``, the ``SPAC`` format) after every change, atomically, beside the spool of
the batches it names (``batches/``), and a new actor on the same directory (Ray's
``max_restarts``) resumes from it: the step in flight is rebuilt byte for byte, receipts of
batches sent again say ``duplicate``. The rules are ``stowplan serve``'s for its state
directory (``stowplan::serve::CheckpointDir``): the directory has one owner at a time (a
second actor on it waits ``lock_wait`` seconds, then is refused naming the first;
:meth:`PackerActor.close` or the actor's death lets go), and the state and the spool are
checked together before anything is deleted, so a lost or damaged ``packer_state.bin``
beside spooled batches, a batch file missing, or a bad field is refused naming the file
(``CacheMismatchError``), never a fresh start that would deliver those samples again or lose
them.

:class:`RayReceiver` is a trainer rank's side; it yields :class:`RayRankBatch` es whose numpy
arrays are read-only views of the object store (zero-copy; ``torch.from_numpy`` takes them)
and acknowledges each step once it holds it, retrying across actor restarts. A rank whose
worker dies is restarted with ``start_step`` = the first step it has not trained on (its own
checkpoint): that step is handed out again while it is in flight, since acknowledgements
repeat harmlessly and the step stays in flight until every rank acknowledged it, so no sample
is lost or trained twice. Once every rank acknowledged a step it is gone, as over ZeroMQ.

:func:`compute_lengths` computes per-row lengths of a Ray Dataset on the cluster, in the
dataset's row order, equal to :func:`stowplan.compute_lengths` over the same rows.
:func:`pack_dataset` packs a Ray Dataset's rows on the cluster into the rows
:func:`stowplan.arrow.pack_table` gives for the same rows.
"""

from __future__ import annotations

import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import numpy as np

from . import _renamed, _stowplan
from ._packer import IngestReport, Packer, TrainingBatch
from .errors import InvalidArgumentError, StowplanError, StowplanIOError, StowplanTimeoutError

try:
    import ray
except ImportError as _e:  # pragma: no cover - the extra is missing
    raise ImportError("stowplan.ray needs Ray: pip install 'stowplan[ray]'") from _e

from . import _ray_data  # noqa: E402  (after Ray's import check)
from ._ray_data import compute_lengths, pack_dataset  # noqa: E402

__all__ = ["PackerActor", "RayReceiver", "RayRankBatch", "RayMicroBatch", "put_batch", "compute_lengths", "pack_dataset"]

_MICRO_FIELDS = (
    "samples",
    "input_ids",
    "position_ids",
    "loss_mask",
    "loss_weights",
    "advantages",
    "inference_logprobs",
    "temperatures",
    "teacher_logprobs",
    "cu_seqlens",
    "cu_seqlens_padded",
    "sequence_lengths",
    "lora_num_tokens",
    "max_seqlen",
    "real_tokens",
    "padding_tokens",
    "dummy",
    "cp",
)
_RANK_FIELDS = ("step", "rank", "dp", "sample_runs", "sample_steps", "sample_indices", "ready_to_update")


class RayMicroBatch:
    """One micro-batch of a :class:`RayRankBatch`: the fields of :class:`stowplan.MaterializedBatch`
    (``input_ids``, ``position_ids``, ``loss_mask``, ``loss_weights``, ``advantages``,
    ``cu_seqlens`` …) as read-only numpy arrays read in place from the object store."""

    __slots__ = _MICRO_FIELDS

    def __init__(self, **fields: Any) -> None:
        for name in _MICRO_FIELDS:
            setattr(self, name, fields[name])

    def __len__(self) -> int:
        return len(self.samples)

    def __reduce__(self) -> Any:
        return (_micro, (tuple(getattr(self, n) for n in _MICRO_FIELDS),))

    def __repr__(self) -> str:
        return f"RayMicroBatch(samples={len(self.samples)}, tokens={len(self.input_ids)})"


def _micro(values: Tuple[Any, ...]) -> RayMicroBatch:
    return RayMicroBatch(**dict(zip(_MICRO_FIELDS, values)))


class RayRankBatch:
    """What one rank receives for one packer step (the fields of :class:`stowplan.RankBatch`):
    ``step``, ``rank``, ``dp``, ``micro_batches`` (:class:`RayMicroBatch`), the sample keys
    ``sample_runs``/``sample_steps``/``sample_indices`` and ``ready_to_update``."""

    __slots__ = _RANK_FIELDS + ("micro_batches",)

    def __init__(self, micro_batches: List[RayMicroBatch], **fields: Any) -> None:
        self.micro_batches = micro_batches
        for name in _RANK_FIELDS:
            setattr(self, name, fields[name])

    @classmethod
    def of(cls, batch: Any) -> "RayRankBatch":
        """A copy of a native :class:`stowplan.RankBatch` that pickles (arrays out of band)."""
        micro = [RayMicroBatch(**{n: getattr(mb, n) for n in _MICRO_FIELDS}) for mb in batch.micro_batches]
        return cls(micro, **{n: getattr(batch, n) for n in _RANK_FIELDS})

    def __len__(self) -> int:
        return len(self.micro_batches)

    def __reduce__(self) -> Any:
        return (_rank, (self.micro_batches, tuple(getattr(self, n) for n in _RANK_FIELDS)))

    def __repr__(self) -> str:
        return f"RayRankBatch(step={self.step}, rank={self.rank}/{self.dp}, micro_batches={len(self.micro_batches)})"


def _rank(micro: List[RayMicroBatch], values: Tuple[Any, ...]) -> RayRankBatch:
    return RayRankBatch(micro, **dict(zip(_RANK_FIELDS, values)))


class PackerActor:
    """The packer runtime as a Ray actor (wrap it with ``ray.remote``; module docs).

    Options: those of :class:`stowplan.Packer` (``capacity``, ``dp``, ``num_runs``,
    ``threshold``, ``wait_timeout`` …), ``checkpoint_dir``: where the state is kept and
    resumed from (``None``: no checkpoints), and ``lock_wait``: seconds to wait for another
    owner of ``checkpoint_dir`` to let go before this actor is refused (default 10: a restart
    whose predecessor is still dying, or on a network filesystem a dead node's lock lease).
    Pass the same options to a restarted actor.
    """

    @_renamed.renamed(seq_len="capacity")
    def __init__(
        self, *, checkpoint_dir: "Optional[os.PathLike[str] | str]" = None, lock_wait: float = 10.0, **options: Any
    ) -> None:
        if "dp" not in options or "capacity" not in options:
            raise InvalidArgumentError("capacity and dp are required (the options of stowplan.Packer)")
        self._options = options
        self._dp: int = options["dp"]
        self._pool: Optional[ThreadPoolExecutor] = None
        self._broken: Optional[BaseException] = None
        self._closed = False
        # The directory is owned while this actor lives: a second owner is refused naming
        # the first, and nothing in it is read or deleted before it is owned.
        self._dir: Optional[_stowplan.CheckpointDir] = (
            None if checkpoint_dir is None else _stowplan.CheckpointDir(os.fspath(checkpoint_dir), owner="stowplan.ray.PackerActor", wait=lock_wait)
        )
        try:
            self.restored = self._resume()
        except BaseException:
            self.close()  # refused: the directory is let go at once, not when this object is collected
            raise

    def close(self) -> None:
        """Lets go of ``checkpoint_dir`` (another actor may own it from then on) and of the
        worker threads; the actor refuses every call after. Ray's ``ray.kill`` and a dead
        process let go too."""
        if self._dir is not None:
            self._dir.close()
        self._dir, self._closed = None, True
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _resume(self) -> bool:
        """Takes the packer as the checkpoint on disk has it (a fresh one without a checkpoint)
        and publishes its step in flight: what a restarted actor starts from. Returns whether
        there was a checkpoint; changes nothing if it fails. The state and the spool of batch
        files are checked together first (``stowplan::serve::CheckpointDir``, the rules
        ``stowplan serve`` keeps): a missing state beside spooled batches, a batch the state
        needs that is missing or damaged, or a damaged field is refused naming the file."""
        loaded = self._load() if self._dir is not None else None
        if loaded is None:
            packer, acked, reingested = Packer(**self._options), set(), []
        else:
            packer, acked_ranks, reingested, set_aside = loaded
            acked = set(acked_ranks)
            for path in set_aside:
                warnings.warn(f"stowplan.ray: a spool file that does not decode was set aside: {os.fspath(path)}", RuntimeWarning, stacklevel=2)
        self._packer, self._acked = packer, acked
        self._inflight: Optional[Tuple[int, List[Any]]] = None  # (step, one ObjectRef per rank)
        if reingested:
            self._save()  # batches spooled after the checkpoint, ingested again: now in it
        try:
            self._published()
        except Exception as e:  # noqa: BLE001 - the step is durable: take() publishes it
            warnings.warn(f"stowplan.ray: publishing the step in flight failed ({e!r}); the next take() tries again", RuntimeWarning, stacklevel=1)
        return loaded is not None

    def _back_to_checkpoint(self) -> None:
        """After a failed write: memory is ahead of the disk (a batch taken, perhaps a step
        packed), so go back to the checkpoint, as a restart would: a batch whose file never
        reached the spool is taken when sent again, one whose file did is taken from the spool
        (and a resend is its duplicate), never one the disk does not hold. If even that fails,
        the actor refuses every call until it is restarted."""
        try:
            self._resume()
        except BaseException as e:  # noqa: BLE001 - kept, raised by every later call
            self._broken = e

    def _commit(self) -> None:
        """Saves the state after a change in memory; if that fails, back to the checkpoint."""
        try:
            self._save()
        except BaseException:
            self._back_to_checkpoint()
            raise

    def _usable(self) -> None:
        if self._closed:
            raise StowplanIOError("this PackerActor was closed: it let go of its checkpoint_dir (start a new one on it)")
        if self._broken is not None:
            raise StowplanIOError(
                f"this PackerActor could not go back to its checkpoint after a failed write ({self._broken}); "
                "restart it (ray.kill(actor, no_restart=False)) to resume from checkpoint_dir"
            )

    # -- checkpoints ---------------------------------------------------------------------

    def _load(self) -> Optional[Tuple[Any, List[int], List[Tuple[int, int]], List[Any]]]:
        assert self._dir is not None
        return self._dir.load(**self._options)

    def _save(self) -> None:
        if self._dir is not None:
            self._dir.save(self._packer, sorted(self._acked))

    # -- orchestrator side ---------------------------------------------------------------

    def add_run(self, run: int, *, batch_size: int) -> None:
        """Adds run ``run`` (a no-op if it exists with this batch size, so that a resent call is
        harmless; refused if it exists with another)."""
        self._usable()
        for r in self._packer.runs():
            if r["run"] == run:
                if r["batch_size"] != batch_size:
                    raise InvalidArgumentError(
                        f"run {run} exists with batch_size {r['batch_size']} (got {batch_size!r}): remove_run({run}) first"
                    )
                return
        self._packer.add_run(run, batch_size=batch_size)
        self._commit()

    def remove_run(self, run: int) -> int:
        """Removes run ``run``; returns how many of its pending samples were dropped."""
        self._usable()
        dropped = self._packer.remove_run(run)
        self._commit()
        return dropped

    def clear_ready(self, run: int) -> None:
        """Clears the run's ``ready_to_update`` after the trainer updated it."""
        self._usable()
        self._packer.clear_ready(run)
        self._commit()

    def send(self, batch: Any) -> IngestReport:
        """Buffers a :class:`TrainingBatch` (or its encoded bytes, or an ``ObjectRef`` to
        either, such as :func:`put_batch` gives); returns the receipt, ``duplicate=True`` for a
        ``(run, step)`` seen before. With ``checkpoint_dir`` the batch is on disk before the
        receipt."""
        if isinstance(batch, ray.ObjectRef):
            batch = ray.get(batch)
        if isinstance(batch, TrainingBatch):
            data: Any = batch.encode()
        elif isinstance(batch, (bytes, bytearray, memoryview, np.ndarray)):
            data = batch  # read in place (bytes, bytearray, memoryview or a numpy array: in the object store)
        else:
            raise InvalidArgumentError(
                f"batch must be a stowplan.TrainingBatch, its encoded bytes or an ObjectRef to either (got {type(batch).__name__})"
            )
        self._usable()
        before = set(self._packer.needed_batches())
        report = self._packer.ingest(data)
        if report.duplicate:
            return report
        if self._dir is None:
            self.pack()
            return report
        # The batch file is written while the step is packed and copied into the object store
        # (all without the GIL); the state, which names the batch, is written once the file
        # is durable, and only then can a rank (take, after this call) see the step.
        try:
            paths = [self._dir.batch_path(run, step) for run, step in set(self._packer.needed_batches()) - before]
            written = self._threads().submit(lambda: [_stowplan.write_atomic(path, data) for path in paths])
            try:
                packed = self._pack_step(force=False)
                if packed is not None:
                    self._publish(packed)
            finally:
                written.result()
            self._save()
        except BaseException:
            self._back_to_checkpoint()
            raise
        return report

    def _pack_step(self, *, force: bool) -> Optional[List[Any]]:
        """Packs the next step (see :meth:`pack`) and returns its rank batches; the caller
        saves the state, then publishes them."""
        if self._published():
            return None
        if not force and not self._packer.should_pack():
            return None
        out = self._packer.pack(force=force)
        if out is None:
            return None
        self._acked = set()
        self._metrics = out[1]
        return out[0]

    def pack(self, *, force: bool = False) -> Optional[Dict[str, Any]]:
        """Packs the next step if none is in flight and the packer should pack (or anything is
        pending and ``force``); returns the step's figures, or None. :meth:`send` packs as soon
        as the packer should, and :meth:`take` when a rank asks (after ``wait_timeout``)."""
        self._usable()
        ranks = self._pack_step(force=force)
        if ranks is None:
            return None
        self._commit()
        self._publish(ranks)
        return self._metrics

    def _publish(self, ranks: List[Any]) -> None:
        # One thread per rank: ray.put copies each rank's arrays into the object store without
        # the GIL, so the copies overlap. Set only once every copy is in: a failure leaves the
        # step unpublished, and _published() tries again (send goes back to the checkpoint).
        step = ranks[0].step
        self._inflight = (step, list(self._threads().map(lambda r: ray.put(RayRankBatch.of(r)), ranks)))

    def _published(self) -> bool:
        """Whether a step is in flight and published (a step whose publication failed is
        rebuilt and published again here)."""
        if self._inflight is None:
            ranks = self._packer.rebuild_inflight()
            if ranks is not None:
                self._publish(ranks)
        return self._inflight is not None

    def _threads(self) -> ThreadPoolExecutor:
        """The actor's worker threads: the batch file's writer and a publication's copies, one
        per rank."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self._dp + 1, thread_name_prefix="stowplan-packer")
        return self._pool

    # -- trainer side --------------------------------------------------------------------

    def _check_rank(self, rank: Any) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self._dp:
            raise InvalidArgumentError(f"rank must be an integer in 0..{self._dp - 1} (got {rank!r})")

    @staticmethod
    def _check_step(step: Any) -> None:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise InvalidArgumentError(f"step must be an integer >= 0 (got {step!r})")

    def take(self, rank: int, step: int) -> Optional[Any]:
        """The ``ObjectRef`` of rank ``rank``'s batch of ``step``, or None while it is not
        packed yet (a step is packed here when the packer should pack). A rank asking for the
        step after the one in flight holds that one: this acknowledges it (as :meth:`ack`).
        Raises :class:`InvalidArgumentError` for a step already delivered, or more than one
        step ahead of the one in flight. A step whose copies into the object store failed is
        published again at the next call (a warning says so; None meanwhile)."""
        self._check_rank(rank)
        self._check_step(step)
        self._usable()
        try:
            if self._published():
                current = self._inflight[0]
                if step == current + 1:
                    self.ack(rank, current)  # asking for the next step: it holds this one
                elif step > current + 1:
                    raise InvalidArgumentError(
                        f"rank {rank} asks for step {step} while step {current} is in flight: a rank is at most one step "
                        "ahead (a start_step of another run, or a packer restarted without its checkpoint_dir?)"
                    )
            if not self._published():
                self.pack()
        except StowplanError:
            raise
        except Exception as e:  # noqa: BLE001 - the object store refused the copies; the step is durable
            warnings.warn(f"stowplan.ray: publishing a packer step failed ({e!r}); the next take() tries again", RuntimeWarning, stacklevel=1)
            return None
        current = self._inflight[0] if self._inflight is not None else self._packer.next_step
        if step < current:
            raise InvalidArgumentError(f"step {step} was delivered to every rank already (the packer is at step {current})")
        if self._inflight is not None and step == current:
            return self._inflight[1][rank]
        return None

    def ack(self, rank: int, step: int) -> bool:
        """Rank ``rank`` holds ``step``; once every rank does the step is delivered. Returns
        whether this acknowledgement completed the step (repeats are ignored)."""
        self._check_rank(rank)
        self._check_step(step)
        self._usable()
        if self._inflight is None or step < self._inflight[0] or rank in self._acked:
            if self._inflight is None and step >= self._packer.next_step:
                raise InvalidArgumentError(f"step {step}: not delivered yet, nothing to acknowledge")
            return False
        if step > self._inflight[0]:
            raise InvalidArgumentError(f"step {step}: not delivered yet (step {self._inflight[0]} is in flight)")
        self._acked.add(rank)
        if len(self._acked) < self._dp:
            self._commit()
            return False
        self._packer.delivered(step)
        self._inflight, self._acked = None, set()
        self._commit()
        return True

    # -- inspection ----------------------------------------------------------------------

    def progress(self, run: int) -> Dict[str, Any]:
        """Run ``run``'s progress (as :meth:`stowplan.Packer.progress`)."""
        self._usable()
        return self._packer.progress(run)

    def pending(self) -> Tuple[int, int]:
        """Samples and tokens pending."""
        self._usable()
        return self._packer.pending()

    def next_step(self) -> int:
        """The next packer step (the one in flight, if any)."""
        self._usable()
        return self._packer.next_step

    def was_restored(self) -> bool:
        """Whether this actor resumed from ``checkpoint_dir``."""
        return self.restored


def put_batch(batch: "TrainingBatch | bytes") -> Any:
    """Puts a :class:`stowplan.TrainingBatch` (or its encoded bytes) in the object store and
    returns the ``ObjectRef`` to pass to :meth:`PackerActor.send`. The encoded bytes go in as a
    numpy ``uint8`` array, which the actor reads in place; a ``bytes`` object would be copied
    out of the store again by every ``ray.get``."""
    if isinstance(batch, TrainingBatch):
        batch = batch.encode()
    if not isinstance(batch, (bytes, bytearray, memoryview, np.ndarray)):
        raise InvalidArgumentError(f"batch must be a stowplan.TrainingBatch or its encoded bytes (got {type(batch).__name__})")
    return ray.put(np.frombuffer(batch, dtype=np.uint8))


class RayReceiver:
    """Trainer rank ``rank``'s batches from a :class:`PackerActor` handle: step ``start_step``,
    then the next, … Each step is acknowledged once it is fetched (the rank then holds it, as
    :class:`stowplan.ZmqRankClient` does), without waiting for the actor's answer (call
    :meth:`flush` before the process ends); asking for a step acknowledges the step in flight
    before it (a ``start_step`` one past it says the rank holds it); an actor that dies and is
    restarted by Ray is waited for, and so is one that died for good (no restarts left), which
    the timeout error then names. :meth:`receive` waits up to ``timeout`` seconds (``None``:
    forever) and raises :class:`stowplan.StowplanTimeoutError` after that; ``poll``: seconds
    between asks while the step is not packed yet."""

    def __init__(
        self, actor: Any, rank: int, *, start_step: int = 0, timeout: Optional[float] = None, poll: float = 0.005
    ) -> None:
        if isinstance(actor, type) or not hasattr(actor, "take") or not hasattr(actor, "ack"):
            what = f"the class {actor.__name__}" if isinstance(actor, type) else type(actor).__name__
            raise InvalidArgumentError(
                f"actor must be a PackerActor handle, as ray.remote(PackerActor).remote(...) returns (got {what})"
            )
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise InvalidArgumentError(f"rank must be an integer >= 0 (got {rank!r})")
        if isinstance(start_step, bool) or not isinstance(start_step, int) or start_step < 0:
            raise InvalidArgumentError(f"start_step must be an integer >= 0 (got {start_step!r})")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise InvalidArgumentError(f"timeout must be None or a number of seconds >= 0 (got {timeout!r})")
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or poll <= 0:
            raise InvalidArgumentError(f"poll must be a number of seconds > 0 (got {poll!r})")
        self.actor, self.rank, self.next_step = actor, rank, start_step
        self.timeout, self.poll = timeout, float(poll)
        self._ack: Optional[Tuple[int, Any]] = None  # (step, ObjectRef) of the acknowledgement in flight
        self._unreachable: Optional[BaseException] = None  # the actor's last failure while retrying

    def _call(self, method: Any, deadline: Optional[float], *args: Any) -> Any:
        """One actor call, retried while the actor is restarting."""
        while True:
            try:
                out = ray.get(method.remote(*args))
                self._unreachable = None
                return out
            except ray.exceptions.RayTaskError as e:
                raise _ray_data.cause_of(e) from None
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as e:
                if getattr(e, "actor_init_failed", False):
                    raise  # e.g. a damaged checkpoint: no restart can succeed
                self._unreachable = e
                self._wait(deadline)

    def _wait(self, deadline: Optional[float]) -> None:
        if deadline is not None and time.monotonic() >= deadline:
            why = ""
            if self._unreachable is not None:
                first = str(self._unreachable).strip().splitlines()[0] if str(self._unreachable).strip() else ""
                why = (
                    f"; the packer actor did not answer ({type(self._unreachable).__name__}: {first[:200]}): "
                    "is it dead for good (no max_restarts left, or killed with no_restart=True)?"
                )
            raise StowplanTimeoutError(f"rank {self.rank}: step {self.next_step} did not arrive within {self.timeout} s{why}")
        time.sleep(self.poll)

    def receive(self) -> RayRankBatch:
        """Waits for the next step and returns it. Its acknowledgement is sent without waiting
        for the actor: the next :meth:`receive` (or :meth:`flush`) makes sure it arrived, and
        sends it again to an actor restarted since; asking for the next step acknowledges it
        too."""
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self._settle(deadline)
        step = self.next_step
        while True:
            ref = self._call(self.actor.take, deadline, self.rank, step)
            if ref is None:
                self._wait(deadline)
                continue
            try:
                batch = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
                self._wait(deadline)  # the actor died with the object: ask the new one
                continue
            break
        self._ack = (step, self.actor.ack.remote(self.rank, step))
        self.next_step = step + 1
        return batch

    def flush(self) -> None:
        """Waits until the acknowledgement of the last step received reached the actor (call it
        before a rank's process ends, so that the step is not handed out again)."""
        self._settle(None if self.timeout is None else time.monotonic() + self.timeout)

    def _settle(self, deadline: Optional[float]) -> None:
        if self._ack is None:
            return
        step, ref = self._ack
        self._ack = None
        try:
            ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            raise _ray_data.cause_of(e) from None
        except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError):
            self._call(self.actor.ack, deadline, self.rank, step)  # the actor restarted meanwhile

    def __iter__(self) -> Iterator[RayRankBatch]:
        while True:
            yield self.receive()
