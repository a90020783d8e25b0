"""Stubs of ``stowplan._stowplan``: the packer runtime and its transports (``src/packer.rs``,
``src/transport.rs``, ``src/protocol.rs``)."""

from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np
import numpy.typing as npt

from .layout import MaterializedBatch

class RankBatch:
    """What one rank receives for one packer step: its micro-batches (numpy arrays) and the
    key (run, orchestrator step, index in the batch) of every sample of the step; a
    micro-batch's ``samples`` index ``sample_runs``/``sample_steps``/``sample_indices``."""

    step: int
    rank: int
    dp: int
    micro_batches: List[MaterializedBatch]
    sample_runs: npt.NDArray[np.uint32]
    sample_steps: npt.NDArray[np.uint64]
    sample_indices: npt.NDArray[np.uint32]
    ready_to_update: List[int]
    def __len__(self) -> int: ...

def encode_training_batch(run: int, step: int, temperature: float, samples: Iterable[Any]) -> bytes:
    """The SPTB wire format: header, format version, postcard body, CRC-32."""

def encode_control(kind: str, run: int, batch_size: int) -> bytes:
    """An add_run/remove_run message (SPCT header)."""

def batch_file_name(run: int, step: int) -> str:
    """run_{run}_step_{step}.bin"""

def write_atomic(path: Any, data: Any) -> None:
    """Replaces the file at path by data atomically (temporary file, fsync, rename)."""

class AtomicFile:
    """A binary file written piece by piece that replaces ``path`` atomically on
    :meth:`commit`; closed without one, its temporary file is removed."""

    def __init__(self, path: Any) -> None: ...
    def write(self, data: bytes) -> int:
        """Appends data; returns its length."""
        ...
    def tell(self) -> int: ...
    def flush(self) -> None: ...
    def commit(self) -> None:
        """Flushes, fsyncs and renames the file over ``path`` (the directory fsynced)."""
        ...
    def close(self) -> None:
        """Abandons the file unless committed."""
        ...
    @property
    def closed(self) -> bool: ...
    def writable(self) -> bool: ...
    def __enter__(self) -> "AtomicFile": ...
    def __exit__(self, *exc: Any) -> bool: ...

def fs_send(root: Any, name: str, data: bytes) -> str:
    """Writes data to ROOT/inbox/NAME atomically; returns the path."""

def control_file_name(kind: str, run: int, nanos: int, pid: int) -> str:
    """control_{nanos:020}_{pid}_{kind}_{run}.bin: a run change's inbox file name (the caller
    passes the time and its process id)."""

def decode_rank_batch(data: bytes) -> RankBatch:
    """Decodes a rank batch (SPRB); a packer's refusal (SPRX) raises InvalidArgumentError."""

def curve_timeout_hint(client_public: str, server_public: str) -> str:
    """What a client that hears nothing from a CURVE packer should check (both keys in Z85),
    appended to its timeout error."""

def secret_certificate_mode_error(path: str, mode: int) -> Optional[str]:
    """Why a secret certificate with these permission bits must not be used (None: only its
    owner may read it)."""

def encode_rank_hello(rank: int, dp: int, next_step: int) -> bytes:
    """A rank's hello to the ZeroMQ packer (SPRM header); rank must be below dp, and
    ``next_step`` is the first step the rank has neither taken nor holds (a step before the
    one the packer delivers gets the rank refused: those steps are gone)."""

def encode_rank_ack(rank: int, step: int) -> bytes:
    """A rank's acknowledgement of a step (SPRM header)."""

def decode_receipts(data: bytes) -> Tuple[int, List[Dict[str, Any]]]:
    """The packer's (incarnation, receipts) (SPRC header)."""

#: Seconds between the packer's heartbeats and between a waiting rank's hellos.
HEARTBEAT: float

class Received:
    """What a :class:`RankReceiver` made of one rank batch: its step, where it went
    (``"in_order"``, ``"held_back"`` or ``"duplicate"``) and the acknowledgement to send."""

    step: int
    arrival: str
    ack: bytes

class RankReceiver:
    """A trainer rank's side of the ZeroMQ protocol (stowplan::serve::RankReceiver), without
    I/O: send ``poll_hello()`` when it returns bytes, read while ``wants_message()``, pass
    each message to ``on_message`` and send back its ``ack``; take steps with
    ``next_batch()``."""

    rank: int
    dp: int
    prefetch: int
    next_step: int
    held_steps: List[int]
    error: Optional[BaseException]
    def __init__(self, rank: int, dp: int, *, next_step: Optional[int] = None, prefetch: Optional[int] = None) -> None: ...
    def poll_hello(self) -> Optional[bytes]:
        """The hello due now (on the first call, then every HEARTBEAT), or None."""
    def hello_due_in(self) -> float:
        """Seconds until the next hello is due (inf after a failure)."""
    def wants_message(self) -> bool:
        """Whether to read the next message (fewer than prefetch steps held, no failure)."""
    def on_message(self, data: bytes) -> Received:
        """Takes one message; raises InvalidArgumentError for a refusal, another rank's batch
        or undecodable bytes (the receiver stays failed)."""
    def has_next(self) -> bool:
        """Whether the step expected next arrived."""
    def next_batch(self) -> Optional[RankBatch]:
        """The step expected next, if it arrived."""
    def timeout_error(self, endpoint: str, waited: float) -> BaseException:
        """The StowplanTimeoutError of a vain wait for the next step."""

class MessageKey:
    """A message not acknowledged yet: ``kind`` ("batch", "add_run", "remove_run"), ``run``,
    a batch's ``step``, a new run's ``batch_size``."""

    kind: str
    run: int
    step: Optional[int]
    batch_size: Optional[int]

class BatchSender:
    """An orchestrator's side of the ZeroMQ protocol (stowplan::serve::BatchSender), without
    I/O: messages go through ``track_batch``/``track_control`` (which return the bytes to
    push), receipts through ``on_receipts``; push what ``due_resends()`` returns."""

    unacked: List[MessageKey]
    flushed: bool
    incarnation: Optional[int]
    resent: int
    resend_after: float
    max_message_bytes: int
    def __init__(self, *, resend_after: Optional[float] = None, max_message_bytes: Optional[int] = None) -> None: ...
    def track_batch(self, data: bytes, *, run: int, step: int) -> bytes:
        """Keeps an encoded training batch until its receipt; returns it."""
    def track_control(self, kind: str, run: int, *, batch_size: Optional[int] = None) -> bytes:
        """Encodes and keeps an add_run/remove_run message until its receipt; returns it."""
    def on_receipts(self, data: bytes) -> List[Dict[str, Any]]:
        """The receipts (dicts, as decode_receipts) of messages kept until now."""
    def due_resends(self) -> List[bytes]:
        """The messages to push again now, oldest first."""
    def flush_timeout_error(self, endpoint: str, waited: float) -> BaseException:
        """The StowplanTimeoutError of a vain flush, naming what is unacknowledged."""

class FileRankClient:
    """A trainer rank over the filesystem transport (stowplan::serve::FileRankClient)."""

    next_step: int
    def __init__(
        self, root: Any, rank: int, *, start_step: Optional[int] = None, consume: bool = False, poll: Optional[float] = None
    ) -> None: ...
    def path(self, step: int) -> str:
        """This rank's file of ``step``."""
    def receive(self, *, step: Optional[int] = None, timeout: Optional[float] = None) -> RankBatch:
        """Waits for step ``step`` (default: the next) up to ``timeout`` seconds (None: forever)."""

class IngestReport:
    """What :meth:`Packer.ingest` did: samples buffered, samples rejected as ``(index,
    reason, message)``, and whether the batch was a duplicate. Frozen, compared by value."""

    accepted: int
    rejected: List[Tuple[int, str, str]]
    duplicate: bool
    def __init__(self, accepted: int, rejected: List[Tuple[int, str, str]] = ..., duplicate: bool = False) -> None: ...

class Packer:
    """The packer runtime in process (``stowplan serve`` runs the same code): training batches
    in, every rank's batch of a step out. Options are keyword-only, as ``stowplan serve``'s;
    an omitted one is the host's default; :meth:`restore` resumes a checkpoint."""

    def __init__(
        self,
        *,
        capacity: Optional[int] = None,
        dp: int,
        pad_to_multiple_of: Optional[int] = None,
        pad_token_id: Optional[int] = None,
        cost: Any = None,
        num_runs: Optional[int] = None,
        threshold: Optional[int] = None,
        step_tokens: Optional[int] = None,
        wait_timeout: Optional[float] = None,
        teacher_logprobs: Optional[bool] = None,
        allow_empty_completion: Optional[bool] = None,
        loss_agg_mode: Optional[str] = None,
        loss_scale_factor: Optional[float] = None,
        loss_normalization: Optional[str] = None,
        limits: Optional[Dict[str, int]] = None,
        max_segments: Optional[int] = None,
        distribution: Optional[str] = None,
        backend: Optional[str] = None,
        seq_len: Optional[int] = None,
    ) -> None: ...
    @staticmethod
    def restore(state: bytes, batches: Iterable[Any], /, **options: Any) -> Packer:
        """A packer from :meth:`state` and the batches it names (``TrainingBatch`` es or their
        bytes), with the same options."""
    def add_run(self, run: int, *, batch_size: int) -> None: ...
    def remove_run(self, run: int) -> int: ...
    def clear_ready(self, run: int) -> None: ...
    def ingest(self, batch: Any) -> IngestReport:
        """``batch``: a ``TrainingBatch`` or its encoded bytes (any contiguous buffer)."""
    def should_pack(self) -> bool: ...
    def pack(self, *, force: bool = False) -> Optional[Tuple[List[RankBatch], Dict[str, Any]]]: ...
    def delivered(self, step: int) -> List[Tuple[int, int]]: ...
    def pending(self) -> Tuple[int, int]: ...
    @property
    def next_step(self) -> int: ...
    def runs(self) -> List[Dict[str, Any]]: ...
    def progress(self, run: int) -> Dict[str, Any]: ...
    def state(self) -> bytes: ...
    def needed_batches(self) -> List[Tuple[int, int]]: ...
    def rebuild_inflight(self) -> Optional[List[RankBatch]]: ...

class CheckpointDir:
    """A packer's checkpoint directory (``stowplan::serve::CheckpointDir``: the state, the
    ranks that acknowledged its step in flight, the spool of batches), owned while open; a
    second owner is refused naming the first. :class:`stowplan.ray.PackerActor` keeps its
    checkpoint with it."""

    def __init__(self, path: Any, *, owner: str, wait: Optional[float] = None) -> None: ...
    @property
    def path(self) -> Any: ...
    @property
    def closed(self) -> bool: ...
    def batch_path(self, run: int, step: int) -> Any: ...
    def load(self, **options: Any) -> Optional[Tuple[Packer, List[int], List[Tuple[int, int]], List[Any]]]:
        """The packer the directory holds (``None``: a fresh one), checked whole first."""
    def save(self, packer: Packer, acked: List[int]) -> None: ...
    def close(self) -> None:
        """Lets go of the directory; later calls are refused."""
