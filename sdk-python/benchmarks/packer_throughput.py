"""Throughput of `stowplan serve` on one machine: 4 trainer ranks, rollouts shaped like
`shared/workloads/rl-math-8k.txt` (4,096 samples, 7.36M tokens a step) with random tokens.

    python sdk-python/benchmarks/packer_throughput.py [--steps 6] [--transport fs|zmq] [--bin target/release/stowplan]

Per step it reports what `stowplan serve` logs (receive = read + decode + spool of the
orchestrator's batch, pack = select + pack + balance + materialize, deliver = encode + write
every rank's file, or send it over TCP and wait for every rank's acknowledgement (zmq), +
checkpoint) and, end to end, from the orchestrator starting to send until the last rank has
decoded its micro-batches (numpy arrays). The orchestrator waits for every rank before sending
the next step, so steps do not overlap. The first step is a warm-up. Over zmq the orchestrator
PUSHes the encoded batches with a bare pyzmq socket and the ranks use `stowplan.ZmqRankClient`,
all over TCP on loopback.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import stowplan
from stowplan import _stowplan

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from packer_procs import free_ports  # noqa: E402  (the tests' helper)
REPO = HERE.parents[1]
WORKLOAD = REPO.parent / "shared" / "workloads" / "rl-math-8k.txt"

RANK = r"""
import sys, time, stowplan
root, rank, steps, out, dp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
if root.startswith("tcp://"):
    rx = stowplan.ZmqRankClient(root, rank, dp)
else:
    rx = stowplan.FileRankClient(root, rank, poll=0.001)
with open(out, "w") as f:
    for _ in range(steps):
        b = rx.receive()
        n = sum(len(mb.input_ids) for mb in b.micro_batches)
        f.write(f"{b.step} {time.time()} {n}\n"); f.flush()
"""


def batch(lengths: np.ndarray, step: int, rng: np.random.Generator) -> stowplan.TrainingBatch:
    samples = []
    for g in range(0, len(lengths), 8):
        prompt = int(rng.integers(60, 400))
        for total in lengths[g : g + 8].tolist():
            p = min(prompt, total - 1)
            tokens = rng.integers(0, 150_000, size=total, dtype=np.int64)
            samples.append(
                {
                    "prompt_ids": tokens[:p],
                    "completion_ids": tokens[p:],
                    "completion_logprobs": rng.standard_normal(total - p).astype(np.float32),
                    "advantage": float(rng.standard_normal()),
                }
            )
    return stowplan.TrainingBatch(samples=samples, step=step, run=0, temperature=1.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--capacity", dest="seq_len", type=int, default=16384, help="the token cap of a micro-batch")
    ap.add_argument("--transport", default="fs", choices=["fs", "zmq"])
    ap.add_argument("--bin", default=str(REPO / "target" / "release" / "stowplan"))
    a = ap.parse_args()
    lengths = np.loadtxt(WORKLOAD, dtype=np.int64)
    rng = np.random.default_rng(0)
    print(f"workload {WORKLOAD.name}: {len(lengths)} samples, {int(lengths.sum()):,} tokens a step; dp {a.dp}, capacity {a.seq_len}")
    t = time.perf_counter()
    encoded = [batch(lengths, s, rng).encode() for s in range(a.steps)]
    print(f"orchestrator: built and encoded {a.steps} batches in {time.perf_counter() - t:.1f} s "
          f"({len(encoded[0]) / 1e6:.0f} MB each)")
    with tempfile.TemporaryDirectory(dir=os.environ.get("STOWPLAN_BENCH_DIR")) as tmp:
        root = pathlib.Path(tmp) / "root"
        log = open(pathlib.Path(tmp) / "serve.log", "w+")
        cmd = [a.bin, "serve", "--transport", a.transport, "--capacity", str(a.seq_len), "--dp", str(a.dp),
               "--batch-size", str(len(lengths)), "--log-format", "json", "--poll-ms", "1", "--max-steps", str(a.steps)]
        if a.transport == "zmq":
            import zmq

            ports = free_ports(3)
            batches, receipts, where = (f"tcp://127.0.0.1:{p}" for p in ports)
            cmd += ["--state-dir", str(pathlib.Path(tmp) / "state"), "--zmq-batches", batches,
                    "--zmq-receipts", receipts, "--zmq-ranks", where]
            push = zmq.Context.instance().socket(zmq.PUSH)
            push.connect(batches)
            send = lambda s, data: push.send(data, copy=False)  # noqa: E731
        else:
            cmd += ["--root", str(root)]
            where = str(root)
            send = lambda s, data: _stowplan.fs_send(where, _stowplan.batch_file_name(0, s), data)  # noqa: E731
        serve = subprocess.Popen(cmd, stderr=log, stdout=subprocess.DEVNULL)
        outs = [pathlib.Path(tmp) / f"rank{r}.txt" for r in range(a.dp)]
        ranks = [subprocess.Popen([sys.executable, "-c", RANK, where, str(r), str(a.steps), str(outs[r]), str(a.dp)])
                 for r in range(a.dp)]
        time.sleep(1.0)
        sent = []
        for s, data in enumerate(encoded):
            sent.append(time.time())
            send(s, data)
            while True:
                done = [o.exists() and len(o.read_text().splitlines()) > s for o in outs]
                if all(done):
                    break
                time.sleep(0.002)
        for p in ranks:
            p.wait(timeout=60)
        serve.wait(timeout=60)
        log.seek(0)
        steps = [json.loads(l)["fields"] for l in log if '"step delivered"' in l]
        arrivals = [[float(l.split()[1]) for l in o.read_text().splitlines()] for o in outs]
    print(f"{'step':>4} {'tokens':>10} {'receive s':>9} {'pack s':>7} {'deliver s':>9} {'serve s':>8} {'Mtok/s':>7} {'end-to-end s':>12}")
    rows = []
    for s, f in enumerate(steps):
        busy = f["receive_s"] + f["pack_s"] + f["deliver_s"]
        e2e = max(arr[s] for arr in arrivals) - sent[s]
        rows.append((busy, f["pack_s"], f["real_tokens"] / busy, e2e, f["real_tokens"] / e2e))
        print(f"{s:>4} {f['real_tokens']:>10,} {f['receive_s']:>9.3f} {f['pack_s']:>7.3f} {f['deliver_s']:>9.3f} "
              f"{busy:>8.3f} {f['real_tokens'] / busy / 1e6:>7.2f} {e2e:>12.3f}")
    warm = rows[1:] or rows
    print(f"median over steps 1..: serve {statistics.median(r[0] for r in warm):.3f} s/step "
          f"({statistics.median(r[2] for r in warm) / 1e6:.2f} M tokens/s), packing {statistics.median(r[1] for r in warm):.3f} s, "
          f"end to end {statistics.median(r[3] for r in warm):.3f} s ({statistics.median(r[4] for r in warm) / 1e6:.2f} M tokens/s)")


if __name__ == "__main__":
    main()
