"""Processes of the end-to-end packer tests:

    python packer_procs.py orchestrator ROOT STEPS RUNS [DELAY]
    python packer_procs.py resend ROOT RUN STEP
    python packer_procs.py rank ROOT RANK OUT
    python packer_procs.py orchestrator-zmq BATCHES RECEIPTS STEPS RUNS DELAY
    python packer_procs.py rank-zmq RANKS RANK DP OUT

The orchestrator sends deterministic batches (:func:`make_batch`) through
``stowplan.FileSender`` (or ``stowplan.ZmqSender``, then waits until the packer acknowledged
everything); a rank receives its steps with ``stowplan.FileRankClient`` (or
``stowplan.ZmqRankClient``) and saves, per step, the micro-batch count and every sample's key and
tokens to ``OUT/rank{R}_step{N}.npz``.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import time
from typing import Any, Dict, List

import numpy as np

import stowplan

SEQ_LEN = 2048
SAMPLES = 12


def free_ports(n: int) -> List[int]:
    """``n`` TCP ports on loopback that were free a moment ago (for the ZeroMQ endpoints).

    Taken below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``, 32768 and
    up by default): an outgoing connection never picks one of them as its own port, so a rank
    reconnecting while the packer restarts cannot occupy (or connect to itself on) the port
    the packer is about to bind again."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start = max(1024, low - 12_000)
    rng = random.Random()
    ports: List[int] = []
    while len(ports) < n:
        port = rng.randrange(start, low) if start < low else 0
        if port and port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            ports.append(s.getsockname()[1])
    return ports


def make_batch(run: int, step: int) -> stowplan.TrainingBatch:
    """12 valid samples with random tokens and one longer than ``SEQ_LEN`` (rejected)."""
    rng = np.random.default_rng(run * 100_003 + step)
    samples: List[Dict[str, Any]] = []
    for i in range(SAMPLES + 1):
        total = SEQ_LEN + 100 if i == SAMPLES else int(rng.integers(40, 1500))
        p = int(rng.integers(1, 30))
        tokens = rng.integers(0, 150_000, size=total, dtype=np.int64)
        samples.append(
            {
                "prompt_ids": tokens[:p],
                "completion_ids": tokens[p:],
                "completion_logprobs": rng.standard_normal(total - p).astype(np.float32),
                "advantage": float(i) - 6.0,
            }
        )
    return stowplan.TrainingBatch(samples=samples, step=step, run=run, temperature=0.8)


def await_contact(sender: Any, timeout: float = 30.0) -> None:
    """Polls a ZmqSender until the packer was heard from: a receipt published before the
    sender's subscription reached the packer is lost (ZeroMQ's slow joiner), and the batch is
    then resent and acknowledged as the duplicate it is, which a test asserting an exact
    receipt must not see."""
    deadline = time.monotonic() + timeout
    while sender.incarnation is None:
        assert time.monotonic() < deadline, f"no heartbeat from the packer within {timeout} s"
        sender.poll(0.1)


def expected_tokens(run: int, step: int) -> Dict[int, np.ndarray]:
    """Index → tokens of every valid sample of a batch."""
    b = make_batch(run, step)
    return {i: np.concatenate([s["prompt_ids"], s["completion_ids"]]) for i, s in enumerate(b.samples[:SAMPLES])}


def orchestrator(root: str, steps: int, runs: int, delay: float) -> None:
    sender = stowplan.FileSender(root)
    for step in range(steps):
        for run in range(runs):
            sender.send(make_batch(run, step))
        time.sleep(delay)


def orchestrator_zmq(batches: str, receipts: str, steps: int, runs: int, delay: float) -> None:
    with stowplan.ZmqSender(batches, receipts, resend_after=3.0) as sender:
        for step in range(steps):
            for run in range(runs):
                sender.send(make_batch(run, step))
            time.sleep(delay)
        sender.flush(timeout=120)
        print(f"resent {sender.resent}", flush=True)


def rank(root: str, r: int, out: str) -> None:
    for batch in stowplan.FileRankClient(root, r, poll=0.002):
        save(batch, r, out)


def rank_zmq(endpoint: str, r: int, dp: int, out: str) -> None:
    for batch in stowplan.ZmqRankClient(endpoint, r, dp):
        save(batch, r, out)


def save(batch: stowplan.RankBatch, r: int, out: str) -> None:
    """Writes what rank ``r`` got in ``batch`` to ``OUT/rank{r}_step{N}.npz``."""
    keys, tokens, offsets = [], [], [0]
    for mb in batch.micro_batches:
        for j, i in enumerate(mb.samples.tolist()):
            keys.append((int(batch.sample_runs[i]), int(batch.sample_steps[i]), int(batch.sample_indices[i])))
            a, b = int(mb.cu_seqlens[j]), int(mb.cu_seqlens[j + 1])
            tokens.append(mb.input_ids[a:b])
            offsets.append(offsets[-1] + b - a)
    tmp = os.path.join(out, f".rank{r}_step{batch.step}.npz")
    with open(tmp, "wb") as f:
        np.savez(
            f,
            keys=np.array(keys, dtype=np.int64).reshape(-1, 3),
            tokens=np.concatenate(tokens) if tokens else np.zeros(0, np.int64),
            offsets=np.array(offsets, dtype=np.int64),
            micro_batches=np.int64(len(batch.micro_batches)),
        )
    os.replace(tmp, os.path.join(out, f"rank{r}_step{batch.step}.npz"))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "orchestrator":
        orchestrator(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]) if len(sys.argv) > 5 else 0.0)
    elif mode == "resend":
        stowplan.FileSender(sys.argv[2]).send(make_batch(int(sys.argv[3]), int(sys.argv[4])))
    elif mode == "rank":
        rank(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    elif mode == "orchestrator-zmq":
        orchestrator_zmq(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6]))
    elif mode == "rank-zmq":
        rank_zmq(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
