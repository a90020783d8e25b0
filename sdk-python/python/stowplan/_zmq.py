"""The ZeroMQ transport from Python (sockets from ``pyzmq``: ``pip install 'stowplan[zmq]'``).

``stowplan serve --transport zmq`` binds three sockets (defaults in brackets):
``--zmq-batches`` (PULL, ``tcp://*:5555``) takes training batches and run changes,
``--zmq-receipts`` (PUB, ``tcp://*:5556``) says which of them are durable, and
``--zmq-ranks`` (ROUTER, ``tcp://*:5557``) serves the trainer ranks. Orchestrators and ranks
connect, from this host or others.

:class:`ZmqSender` keeps every message until a receipt names it and sends the unacknowledged
ones again when the packer restarts (its *incarnation* changes) or after ``resend_after``
seconds, and those sent before the packer was first heard from (its first heartbeat) two
seconds after that (ZeroMQ drops what the packer publishes before the subscription reaches
it, so such a message's receipt may be lost); the packer ignores repeated batches (by run and step) and run changes (by the id
each message carries), so a packer killed mid-run or a lost receipt loses nothing and
applies nothing twice.
:class:`ZmqRankClient` says hello (rank, dp, the first step it lacks), acknowledges every step it
has decoded, drops copies of steps it already has and yields steps in order, holding back
one that arrives early. The packer delivers nothing before every rank said hello.

With CURVE (``stowplan serve --zmq-curve-secret/--zmq-curve-clients``; keys from
``stowplan keys DIR NAME``), pass both ``curve_server_key`` (the packer's public certificate,
``packer.key``) and ``curve_secret_key`` (this client's secret certificate,
``NAME.key_secret``, mode 0600; its public ``NAME.key`` must be in the packer's clients
directory): every connection is then encrypted and authenticated. A client whose key the
packer does not list hears nothing, and its timeout error says what to check.

Every protocol decision is the native cores' (``stowplan::serve::protocol``, the same code a
Rust trainer or the packer itself runs): :class:`ZmqSender` drives a ``BatchSender``,
:class:`ZmqRankClient` a ``RankReceiver``. Python keeps the pyzmq sockets, the receiver's
background thread and the waiting.
"""

from __future__ import annotations

import os
import stat
import threading
import time
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from . import _stowplan
from ._packer import RankBatch, TrainingBatch, check_timeout, invalid_argument
from .errors import InvalidArgumentError

__all__ = ["ZmqSender", "ZmqRankClient", "HEARTBEAT"]

#: Seconds between the packer's heartbeats and between a waiting rank's hellos.
HEARTBEAT: float = _stowplan.HEARTBEAT


def _zmq() -> Any:
    try:
        import zmq
    except ImportError as e:  # pragma: no cover - exercised only without pyzmq
        raise ImportError("the ZeroMQ transport needs pyzmq: pip install 'stowplan[zmq]'") from e
    return zmq


_Key = Tuple[Any, ...]


def _key(k: Any) -> _Key:
    """A native ``MessageKey`` as the tuple :attr:`ZmqSender.unacked` shows."""
    return (k.kind, k.run, k.step) if k.kind == "batch" else (k.kind, k.run)


PathLike = Union[str, "os.PathLike[str]"]


class _Curve:
    """CURVE keys of a client: the packer's public key and this client's key pair (Z85),
    read from ZeroMQ certificates with pyzmq's ``zmq.auth.load_certificate``."""

    def __init__(self, server_key: PathLike, secret_key: PathLike) -> None:
        zmq = _zmq()
        if not zmq.has("curve"):
            raise invalid_argument("curve_server_key/curve_secret_key: this pyzmq's libzmq has no CURVE")
        import zmq.auth

        path = os.fspath(secret_key)
        try:
            self.server, _ = zmq.auth.load_certificate(os.fspath(server_key))
            self.public, self.secret = zmq.auth.load_certificate(path)
            mode = stat.S_IMODE(os.stat(path).st_mode)
        except (OSError, ValueError) as e:
            raise invalid_argument(f"curve_server_key/curve_secret_key: {e}") from e
        if self.secret is None:
            raise invalid_argument(
                f"curve_secret_key: certificate {path}: no secret-key line "
                "(this is a public certificate; give NAME.key_secret)"
            )
        refused = _stowplan.secret_certificate_mode_error(path, mode)
        if refused is not None:
            raise invalid_argument(f"curve_secret_key: {refused}")

    @staticmethod
    def of(server_key: Optional[PathLike], secret_key: Optional[PathLike]) -> Optional["_Curve"]:
        """Both or neither: the keys, or None for plain TCP."""
        if (server_key is None) != (secret_key is None):
            raise invalid_argument("curve_server_key and curve_secret_key: give both (CURVE) or neither (plain TCP)")
        return None if server_key is None else _Curve(server_key, secret_key)  # type: ignore[arg-type]

    def apply(self, sock: Any) -> None:
        """Makes ``sock`` a CURVE client of the packer (before it connects)."""
        sock.curve_serverkey = self.server
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret

    def hint(self, e: BaseException) -> BaseException:
        """A timeout error ``e`` with what to check under CURVE."""
        return type(e)(f"{e}{_stowplan.curve_timeout_hint(self.public.decode(), self.server.decode())}")


def _send(sock: Any, data: bytes) -> None:
    zmq = _zmq()
    try:
        sock.send(data, zmq.NOBLOCK)
    except zmq.Again:
        pass


class ZmqSender:
    """The orchestrator side: pushes batches and run changes to ``endpoint`` (the packer's
    ``--zmq-batches``) and reads receipts from ``receipts`` (its ``--zmq-receipts``).

    Every message is kept until the packer's receipt says it is durable. Call :meth:`poll`
    now and then (:meth:`send` does) to take receipts and resend what needs it, and
    :meth:`flush` to wait until everything sent is acknowledged. ``curve_server_key`` and
    ``curve_secret_key``: certificate paths for a packer that runs with CURVE (module docs).
    A batch whose encoding is over ``max_message_bytes`` (default: the packer's default
    ``--max-message-mib``) raises :class:`~stowplan.InvalidArgumentError` before it is sent.
    """

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:5555",
        receipts: str = "tcp://127.0.0.1:5556",
        *,
        resend_after: Optional[float] = None,
        context: Any = None,
        curve_server_key: Optional[PathLike] = None,
        curve_secret_key: Optional[PathLike] = None,
        max_message_bytes: Optional[int] = None,
    ) -> None:
        zmq = _zmq()
        self._curve = _Curve.of(curve_server_key, curve_secret_key)
        self.endpoint, self.receipts_endpoint = endpoint, receipts
        # None: the host's defaults; the core checks the values and names the argument.
        self._core = _stowplan.BatchSender(resend_after=resend_after, max_message_bytes=max_message_bytes)
        self.resend_after = self._core.resend_after
        ctx = context or zmq.Context.instance()
        self._push = ctx.socket(zmq.PUSH)
        self._sub = ctx.socket(zmq.SUB)
        try:
            if self._curve is not None:
                self._curve.apply(self._push)
                self._curve.apply(self._sub)
            self._push.connect(endpoint)
            self._sub.setsockopt(zmq.SUBSCRIBE, b"")
            self._sub.connect(receipts)
        except zmq.ZMQError as e:
            self.close()
            raise invalid_argument(f"endpoint/receipts: cannot connect to {endpoint!r} / {receipts!r}: {e}") from e

    @property
    def incarnation(self) -> Optional[int]:
        """The packer process last heard from (a new value: it restarted); None before the
        first receipt or heartbeat."""
        return self._core.incarnation

    @property
    def resent(self) -> int:
        """Messages sent again (after a restart of the packer or a timeout)."""
        return self._core.resent

    def send(self, batch: TrainingBatch) -> List[Dict[str, Any]]:
        """Sends ``batch``; returns the receipts that arrived meanwhile (see :meth:`poll`)."""
        self._push.send(self._core.track_batch(batch.encode(), run=batch.run, step=batch.step), copy=False)
        return self.poll()

    def add_run(self, run: int, *, batch_size: int) -> List[Dict[str, Any]]:
        """Asks the packer to add run ``run`` (a no-op if it exists)."""
        self._push.send(self._core.track_control("add_run", run, batch_size=batch_size), copy=False)
        return self.poll()

    def remove_run(self, run: int) -> List[Dict[str, Any]]:
        """Asks the packer to remove run ``run``; its pending samples are dropped (logged)."""
        self._push.send(self._core.track_control("remove_run", run), copy=False)
        return self.poll()

    @property
    def unacked(self) -> List[_Key]:
        """Messages not yet acknowledged, oldest first: ``("batch", run, step)``,
        ``("add_run", run)`` or ``("remove_run", run)``."""
        return [_key(k) for k in self._core.unacked]

    def poll(self, timeout: float = 0.0) -> List[Dict[str, Any]]:
        """Takes the receipts that arrived (waiting up to ``timeout`` seconds for the first)
        and resends what needs it: everything unacknowledged when the packer restarted, a
        message after ``resend_after`` seconds without a receipt (one sent before the packer
        was first heard from: two seconds after that, module docs). Returns the receipts of
        messages this sender had not seen acknowledged yet (dicts: ``kind`` — ``"batch"``,
        ``"add_run"``, ``"remove_run"`` —, ``run``; a batch's ``step``, ``accepted``,
        ``rejected``, ``duplicate``; a run change's ``error`` and ``duplicate``)."""
        out: List[Dict[str, Any]] = []
        wait_ms = max(0, int(timeout * 1000))
        while self._sub.poll(wait_ms):
            wait_ms = 0
            data = self._sub.recv()
            try:
                out += self._core.on_receipts(data)
            except InvalidArgumentError as e:
                # Skipped, not raised: raising would drop the receipts taken in this loop.
                warnings.warn(f"stowplan: ignoring a damaged receipts message: {e}", RuntimeWarning, stacklevel=2)
        for data in self._core.due_resends():
            self._push.send(data, copy=False)
        return out

    def flush(self, timeout: Optional[float] = 60.0) -> List[Dict[str, Any]]:
        """Waits until every message sent is acknowledged (resending as :meth:`poll` does);
        returns the receipts taken. Raises ``StowplanTimeoutError`` after ``timeout``
        seconds (``None``: no limit) naming what is still unacknowledged."""
        check_timeout("timeout", timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        out = self.poll()
        while not self._core.flushed:
            left = 0.1 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                e = self._core.flush_timeout_error(self.receipts_endpoint, timeout)
                raise e if self._curve is None else self._curve.hint(e)
            out += self.poll(min(left, 0.1))
        return out

    def close(self) -> None:
        """Closes the sockets (messages still queued get a second to leave). Warns when
        messages were never acknowledged: call :meth:`flush` first to be sure the packer
        has everything."""
        core = getattr(self, "_core", None)
        if core is not None and not core.flushed and not self._push.closed:
            pending = self.unacked
            warnings.warn(
                f"ZmqSender closed with {len(pending)} messages the packer never acknowledged "
                f"(first: {pending[:3]}); call flush() before close()",
                stacklevel=2,
            )
        self._push.close(linger=1000)
        self._sub.close(linger=0)

    def __enter__(self) -> "ZmqSender":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ZmqRankClient:
    """A trainer rank's side: connects to ``endpoint`` (the packer's ``--zmq-ranks``) as rank
    ``rank`` of ``dp`` and yields its :class:`RankBatch` of step ``start_step``, then the
    next, …

    A background thread receives, decodes and acknowledges up to ``prefetch`` steps ahead of
    the one the trainer asks for (the packer waits for every rank's acknowledgement before it
    delivers the next step). :meth:`receive` waits up to ``timeout`` seconds (``None``:
    forever) and raises ``StowplanTimeoutError`` after that; a packer that refuses the rank
    (another ``dp``, a rank out of range, a second process for a rank whose connection is
    alive, a ``start_step`` before the step the packer delivers — those steps are gone) makes
    it raise ``InvalidArgumentError`` with the packer's reason.
    ``curve_server_key`` and ``curve_secret_key``: certificate paths for a packer that runs
    with CURVE (module docs).
    """

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:5557",
        rank: int = 0,
        dp: int = 1,
        *,
        start_step: int = 0,
        timeout: Optional[float] = None,
        prefetch: Optional[int] = None,
        context: Any = None,
        curve_server_key: Optional[PathLike] = None,
        curve_secret_key: Optional[PathLike] = None,
    ) -> None:
        check_timeout("timeout", timeout)
        self._curve = _Curve.of(curve_server_key, curve_secret_key)
        # The core checks every argument (rank < dp too) and names it; None: the host's default.
        self._core = _stowplan.RankReceiver(rank, dp, next_step=start_step, prefetch=prefetch)
        zmq = _zmq()
        self.endpoint, self.rank, self.dp = endpoint, rank, dp
        self.timeout, self.prefetch = timeout, self._core.prefetch
        self._ctx = context or zmq.Context.instance()
        self._cond = threading.Condition()
        self._error: Optional[BaseException] = None
        # The connect's own failure, raised here. What the packer says later (a refusal, bad
        # bytes) is `_error`, raised by receive(), however soon after the connect it came.
        self._connect_error: Optional[BaseException] = None
        self._closed = False
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"stowplan-zmq-rank{rank}", daemon=True)
        self._thread.start()
        self._connected.wait()
        if self._connect_error is not None:
            raise self._connect_error

    @property
    def next_step(self) -> int:
        """The step :meth:`receive` returns next."""
        return self._core.next_step

    def _run(self) -> None:
        zmq = _zmq()
        sock = self._ctx.socket(zmq.DEALER)
        sock.linger = 0
        # Hellos and acks go only to a live connection and never block: while the packer is
        # away nothing piles up, and after it is back the next hello introduces the rank.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        try:
            if self._curve is not None:
                self._curve.apply(sock)
            sock.connect(self.endpoint)
        except zmq.ZMQError as e:
            sock.close()
            self._error = self._connect_error = invalid_argument(f"endpoint: cannot connect to {self.endpoint!r}: {e}")
            self._connected.set()
            return
        self._connected.set()
        core = self._core
        try:
            while not self._closed:
                hello = core.poll_hello()
                if hello is not None:
                    _send(sock, hello)
                wait_ms = max(1, min(100, int(core.hello_due_in() * 1000)))
                with self._cond:
                    if not core.wants_message():
                        # Full: wait for the trainer to take a step (or the next hello).
                        self._cond.wait(wait_ms / 1000)
                        continue
                if not sock.poll(wait_ms):
                    continue
                # Raises (and ends the thread) on a refusal, another rank's batch or bad bytes.
                received = core.on_message(sock.recv())
                # Lost only with the connection; the packer then resends on the next hello.
                _send(sock, received.ack)
                with self._cond:
                    self._cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the caller of receive()
            with self._cond:
                self._error = e
                self._cond.notify_all()
        finally:
            sock.close()

    def receive(self, *, timeout: Optional[float] = None) -> RankBatch:
        """Waits for the next step and returns it (``timeout``: the receiver's by default)."""
        check_timeout("timeout", timeout)
        wait = self.timeout if timeout is None else timeout
        deadline = None if wait is None else time.monotonic() + wait
        with self._cond:
            while not self._core.has_next():
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise invalid_argument("receive: the receiver is closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    e = self._core.timeout_error(self.endpoint, wait)
                    raise e if self._curve is None else self._curve.hint(e)
                self._cond.wait(0.5 if left is None else min(left, 0.5))
            batch = self._core.next_batch()
            self._cond.notify_all()
            return batch

    def __iter__(self) -> Iterator[RankBatch]:
        while True:
            yield self.receive()

    def close(self) -> None:
        """Stops the background thread and closes the socket."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join()

    def __enter__(self) -> "ZmqRankClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
