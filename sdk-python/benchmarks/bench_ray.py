"""One 7.4M-token RL step to 4 trainer ranks through Ray (stowplan.ray) and through
`stowplan serve` over ZeroMQ, in one run, rounds interleaved.

    python sdk-python/benchmarks/bench_ray.py [--rounds 6] [--bin target/release/stowplan]

The step is `packer_throughput.py`'s: rollouts shaped like `shared/workloads/rl-math-8k.txt`
(4,096 samples, 7,363,780 tokens, random token ids, completion logprobs), one ~47 MB encoded
batch, `--capacity 16384 --dp 4`. Every round sends one step through each path (the order
alternates) and times it end to end: the orchestrator starts sending → the last of the 4 ranks
holds its micro-batches as numpy arrays.

- ZeroMQ: `stowplan serve --transport zmq` (spools the batch, checkpoints), the orchestrator
  PUSHes the encoded bytes with pyzmq, 4 rank processes use `stowplan.ZmqRankClient`
  (packer_throughput.py's ranks); serve's own log splits its time (receive, pack, deliver).
- Ray: a local Ray (`ray.init(num_cpus=2)`), a `PackerActor` with `checkpoint_dir` (the same
  durability: batch and state written atomically before the receipt; `--no-checkpoint`:
  without), 4 rank actors with
  `RayReceiver`; the orchestrator puts the encoded batch in the object store (`stowplan.ray.put_batch`) and sends the ref. The actor's
  time is split by timing its methods (a subclass): fetching the batch from the object store,
  decode (ingest), the batch file (write + fsync, on the actor's writer thread, while the step
  is packed), pack (kernel + materialize), checkpoint (the state), publish (`ray.put` of the 4
  rank batches), and the send call as a whole (all of these but the fetch: with the pack
  overlapping the batch file, less than their sum); "ranks after the send call" is the rest of
  the end-to-end time (the ranks' take, object store get).

Medians over rounds 1.. (round 0 is a warm-up). Figures go to BENCHMARKS.md.
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
from typing import Any, Callable, Dict, List

import numpy as np

import stowplan

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from packer_procs import free_ports  # noqa: E402  (the tests' helper)
from packer_throughput import RANK, REPO, WORKLOAD, batch  # noqa: E402  (the same step and ZeroMQ ranks)


def timed_packer_class(sray: Any) -> Any:
    """PackerActor with its phases timed (seconds, summed until ``timings`` is read). The batch
    file is written on the actor's writer thread while the step is packed: the two overlap."""

    def timed(self: Any, key: str, fn: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self._add(key, time.perf_counter() - t0)

        return call

    class TimedIngest:
        """The actor's packer with its ``ingest`` timed (the native Packer's methods cannot be
        replaced on the instance); everything else is the packer's own."""

        def __init__(self, packer: Any, ingest: Callable[..., Any]) -> None:
            self._inner, self.ingest = packer, ingest

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

    class TimedPacker(sray.PackerActor):
        def __init__(self, **kw: Any) -> None:
            self.t: Dict[str, float] = {}
            write = sray._stowplan.write_atomic  # replaced in this actor's worker process only
            batch_file = timed(self, "batch file (write + fsync)", write)
            sray._stowplan.write_atomic = lambda path, data: (batch_file if "batches" in os.fspath(path) else write)(path, data)
            super().__init__(**kw)

        def _add(self, key: str, dt: float) -> None:
            self.t[key] = self.t.get(key, 0.0) + dt

        def _resume(self) -> None:
            super()._resume()
            self._packer = TimedIngest(self._packer, timed(self, "decode (ingest)", self._packer.ingest))

        def send(self, refs: Any) -> Any:
            import ray

            # Ray resolves an ObjectRef passed as an argument itself before the call; passed in
            # a list it is not, so the fetch from the object store is timed here.
            t0 = time.perf_counter()
            data = ray.get(refs[0])
            self._add("fetch batch", time.perf_counter() - t0)
            return timed(self, "send (all of it)", super().send)(data)

        def _pack_step(self, *, force: bool) -> Any:
            return timed(self, "pack (kernel + materialize)", super()._pack_step)(force=force)

        def _save(self) -> None:
            # The checkpoint is written from the native packer, not the timing wrapper.
            timing, self._packer = self._packer, getattr(self._packer, "_inner", self._packer)
            try:
                timed(self, "checkpoint (state)", super()._save)()
            finally:
                self._packer = timing

        def _publish(self, ranks: List[Any]) -> None:
            timed(self, "publish (ray.put x4)", super()._publish)(ranks)

        def timings(self) -> Dict[str, float]:
            out, self.t = self.t, {}
            return out

    return TimedPacker


def rank_class(sray: Any) -> Any:
    class Rank:
        def __init__(self, packer: Any, rank: int) -> None:
            self.rx = sray.RayReceiver(packer, rank, timeout=120)  # polls every 5 ms (the default)

        def step(self) -> Any:
            t0 = time.perf_counter()
            b = self.rx.receive()
            n = sum(len(mb.input_ids) for mb in b.micro_batches)  # numpy views of the object store
            return time.time(), n, time.perf_counter() - t0

    return Rank


class ZmqPath:
    def __init__(self, tmp: pathlib.Path, binary: str, rounds: int, n: int, dp: int, seq_len: int) -> None:
        import zmq

        ports = free_ports(3)
        batches, receipts, self.where = (f"tcp://127.0.0.1:{p}" for p in ports)
        cmd = [binary, "serve", "--transport", "zmq", "--capacity", str(seq_len), "--dp", str(dp), "--batch-size", str(n),
               "--log-format", "json", "--poll-ms", "1", "--max-steps", str(rounds), "--state-dir", str(tmp / "state"),
               "--zmq-batches", batches, "--zmq-receipts", receipts, "--zmq-ranks", self.where]
        self.log = open(tmp / "serve.log", "w+")
        self.serve = subprocess.Popen(cmd, stderr=self.log, stdout=subprocess.DEVNULL)
        self.push = zmq.Context.instance().socket(zmq.PUSH)
        self.push.connect(batches)
        self.outs = [tmp / f"rank{r}.txt" for r in range(dp)]
        self.ranks = [subprocess.Popen([sys.executable, "-c", RANK, self.where, str(r), str(rounds), str(self.outs[r]), str(dp)])
                      for r in range(dp)]
        self.sent: List[float] = []

    def step(self, s: int, data: bytes) -> float:
        self.sent.append(time.time())
        self.push.send(data, copy=False)
        while not all(o.exists() and len(o.read_text().splitlines()) > s for o in self.outs):
            time.sleep(0.002)
        return max(float(o.read_text().splitlines()[s].split()[1]) for o in self.outs) - self.sent[s]

    def close(self) -> List[Dict[str, float]]:
        for p in self.ranks + [self.serve]:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:  # a round failed: the process still waits for steps
                p.kill()
                p.wait()
        self.push.close(linger=0)
        self.log.seek(0)
        return [json.loads(line)["fields"] for line in self.log if '"step delivered"' in line]


class RayPath:
    def __init__(self, tmp: pathlib.Path, dp: int, seq_len: int, n: int, checkpoint: bool) -> None:
        import ray
        import stowplan.ray as sray

        self.ray, self.sray = ray, sray
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
                 object_store_memory=2 * 2**30)
        Packer = ray.remote(num_cpus=0)(timed_packer_class(sray))
        self.packer = Packer.remote(capacity=seq_len, dp=dp, num_runs=1, checkpoint_dir=str(tmp / "ray-ckpt") if checkpoint else None)
        ray.get(self.packer.add_run.remote(0, batch_size=n))
        Rank = ray.remote(num_cpus=0)(rank_class(sray))
        self.ranks = [Rank.remote(self.packer, r) for r in range(dp)]
        ray.get(self.packer.timings.remote())

    def step(self, data: bytes) -> Dict[str, float]:
        ray = self.ray
        pending = [r.step.remote() for r in self.ranks]  # the ranks wait for the step
        time.sleep(0.05)
        t0 = time.time()
        ref = self.sray.put_batch(data)  # read in place by the actor
        t1 = time.time()
        receipt = ray.get(self.packer.send.remote([ref]))
        t2 = time.time()
        assert receipt.accepted > 0 and not receipt.duplicate
        got = ray.get(pending)
        end = max(g[0] for g in got)
        out = {"put batch (driver)": t1 - t0, "send call (driver)": t2 - t1, "ranks after the send call": end - t2, "end to end": end - t0}
        out.update(ray.get(self.packer.timings.remote()))
        out["tokens"] = sum(g[1] for g in got)
        return out

    def close(self) -> None:
        self.ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--capacity", dest="seq_len", type=int, default=16384, help="the token cap of a micro-batch")
    ap.add_argument("--no-checkpoint", action="store_true", help="the Ray actor without checkpoint_dir (no durable writes)")
    ap.add_argument("--samples", type=int, default=None, help="the first N rollouts of the workload only (a quick check)")
    ap.add_argument("--bin", default=os.environ.get("STOWPLAN_BIN", str(REPO / "target" / "release" / "stowplan")))
    a = ap.parse_args()
    if a.rounds < 1 or (a.samples is not None and a.samples < 8):
        ap.error("--rounds must be at least 1 and --samples at least 8")
    lengths = np.loadtxt(WORKLOAD, dtype=np.int64)[: a.samples]
    print(f"workload {WORKLOAD.name}: {len(lengths)} samples, {int(lengths.sum()):,} tokens a step; dp {a.dp}, capacity {a.seq_len}")
    rng = np.random.default_rng(0)
    encoded = [batch(lengths, s, rng).encode() for s in range(a.rounds)]
    print(f"{a.rounds} batches of {len(encoded[0]) / 1e6:.0f} MB (each path sends the same bytes)")
    with tempfile.TemporaryDirectory(dir=os.environ.get("STOWPLAN_BENCH_DIR")) as tmp_name:
        tmp = pathlib.Path(tmp_name)
        zmq_path = ZmqPath(tmp, a.bin, a.rounds, len(lengths), a.dp, a.seq_len)
        ray_path = RayPath(tmp, a.dp, a.seq_len, len(lengths), not a.no_checkpoint)
        time.sleep(1.0)
        zmq_e2e: List[float] = []
        ray_rows: List[Dict[str, float]] = []
        try:
            for s in range(a.rounds):
                order = ("zmq", "ray") if s % 2 == 0 else ("ray", "zmq")
                for which in order:
                    if which == "zmq":
                        zmq_e2e.append(zmq_path.step(s, encoded[s]))
                    else:
                        ray_rows.append(ray_path.step(encoded[s]))
                print(f"round {s}: zmq {zmq_e2e[-1]:.3f} s, ray {ray_rows[-1]['end to end']:.3f} s ({' then '.join(order)})", flush=True)
        finally:
            serve_rows = zmq_path.close()
            ray_path.close()
    warm = slice(1, None) if a.rounds > 1 else slice(None)
    med = lambda xs: statistics.median(xs[warm])  # noqa: E731
    z, r = med(zmq_e2e), med([row["end to end"] for row in ray_rows])
    tokens = int(lengths.sum())
    print(f"\nmedian over rounds {'1..' if a.rounds > 1 else '0'} ({len(zmq_e2e[warm])} rounds), end to end per step:")
    print("| path | median s | M tokens/s | ratio to zmq |\n|---|---|---|---|")
    print(f"| zmq (`stowplan serve`) | {z:.3f} | {tokens / z / 1e6:.2f} | 1.00 |")
    print(f"| ray (`stowplan.ray`) | {r:.3f} | {tokens / r / 1e6:.2f} | {r / z:.2f} |")
    print("\nwhere the time goes (medians, s):")
    print("zmq serve: " + ", ".join(f"{k} {med([f[k] for f in serve_rows]):.3f}" for k in ("receive_s", "pack_s", "deliver_s")))
    keys = [k for k in ray_rows[-1] if k not in ("end to end", "tokens")]
    print("ray: " + ", ".join(f"{k} {med([row.get(k, 0.0) for row in ray_rows]):.3f}" for k in keys))
    print("rounds (s): zmq " + " ".join(f"{x:.3f}" for x in zmq_e2e) + "; ray " + " ".join(f"{row['end to end']:.3f}" for row in ray_rows))


if __name__ == "__main__":
    main()
