"""Measures stowplan's streaming packer: the quality of its bins against the offline lower
bound (and seqpacker's streaming packers, when installed), its rate through Python, and
``stowplan pack --stream``'s rate and peak memory on long streams.

Usage:
    pip install './sdk-python[bench]'          # stowplan + seqpacker 0.1.3 + lightbinpack 0.1.1
    python sdk-python/benchmarks/stream_packers.py [--rounds 3] [--cli-sizes 1000000,16000000]
        [--cli target/release/stowplan] [--workloads ../shared/workloads]

1. Quality: sft-chat-200k at capacity 16,384 and pretrain-docs-1m at 32,768 (lengths above
   the capacity left out, for every packer alike), streamed in chunks of 4,096: bins, the
   offline lower bound ``ceil(sum / capacity)`` and the excess over it. stowplan with 64 open
   bins and its default buffer (4,096), and unbuffered; seqpacker's ``nf`` (next fit) and
   ``hk`` (harmonic-k), its bounded-space online packers.
2. Python rate: lengths/s adding one length per call (as an iterable dataset does) and 4,096
   per call; seqpacker takes one length per call. Rounds interleaved, medians.
3. CLI: ``stowplan pack --stream -c 32768 --oversize single`` on streams of N lengths (the
   pretrain-docs-1m lengths repeated) read from a file, output to /dev/null: median wall time,
   lengths/s, and the peak resident memory the command reports (its own ``VmHWM``), which
   should not grow with N.
Every stowplan output is checked: each index once, no bin over capacity.
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import re
import statistics
import subprocess
import tempfile
import time
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

import stowplan

HERE = pathlib.Path(__file__).resolve()
ROOT = HERE.parents[2]
DEFAULT_WORKLOADS = ROOT.parent / "shared" / "workloads"
CASES = (("sft-chat-200k.txt", 16_384), ("pretrain-docs-1m.txt", 32_768))


def read_lengths(path: pathlib.Path) -> np.ndarray:
    """The workload's lengths (one per line; blank lines and ``#`` comments skipped)."""
    values = [int(line) for line in path.read_text().split("\n") if line.strip() and not line.startswith("#")]
    return np.asarray(values, dtype=np.int64)


def check(bins: Sequence[Sequence[int]], lengths: np.ndarray, capacity: int) -> None:
    """Raises unless every index is in exactly one bin and no bin is over capacity."""
    members = np.concatenate([np.asarray(b, dtype=np.int64) for b in bins])
    if len(members) != len(lengths) or not np.array_equal(np.sort(members), np.arange(len(lengths))):
        raise AssertionError("not every index exactly once")
    if max(int(lengths[np.asarray(b)].sum()) for b in bins) > capacity:
        raise AssertionError("a bin over capacity")


def stowplan_bins(lengths: np.ndarray, capacity: int, chunk: int, **options: int) -> List[List[int]]:
    packer = stowplan.StreamPacker(capacity, max_open_bins=64, **options)
    bins: List[List[int]] = []
    for start in range(0, len(lengths), chunk):
        bins += packer.add(lengths[start : start + chunk])
    return bins + packer.finish()


def seqpacker_count(lengths: np.ndarray, capacity: int, strategy: str) -> int:
    import seqpacker

    packer = seqpacker.StreamPacker(capacity=capacity, strategy=strategy)
    count = 0
    for length in lengths.tolist():
        count += len(packer.add(length))
    return count + len(packer.finish())


def have_seqpacker() -> bool:
    try:
        import seqpacker  # noqa: F401

        return True
    except ImportError:
        return False


def quality(workloads: pathlib.Path) -> None:
    print("\n## Quality: streamed bins against the offline lower bound (64 open bins)\n")
    print("| workload | capacity | packer | bins | lower bound | excess |")
    print("|---|---|---|---|---|---|")
    for name, capacity in CASES:
        lengths = read_lengths(workloads / name)
        lengths = lengths[lengths <= capacity]
        lower = math.ceil(int(lengths.sum()) / capacity)
        rows: List[Tuple[str, int]] = []
        for label, options in (("stowplan, buffer 4,096 (default)", {}), ("stowplan, unbuffered", {"max_buffered": 0})):
            bins = stowplan_bins(lengths, capacity, 4096, **options)
            check(bins, lengths, capacity)
            rows.append((label, len(bins)))
        if have_seqpacker():
            for strategy in ("nf", "hk"):
                rows.append((f"seqpacker {strategy}", seqpacker_count(lengths, capacity, strategy)))
        else:
            print("| – | – | seqpacker is not installed (pip install 'stowplan[bench]'): skipped | | | |")
        for label, count in rows:
            print(f"| {name} | {capacity:,} | {label} | {count:,} | {lower:,} | {100 * (count / lower - 1):.3f} % |")


def python_rate(workloads: pathlib.Path, rounds: int) -> None:
    lengths = read_lengths(workloads / "pretrain-docs-1m.txt")
    capacity = 32_768
    lengths = lengths[lengths <= capacity][:200_000]
    as_list = lengths.tolist()

    def one_by_one() -> None:
        packer = stowplan.StreamPacker(capacity)
        for length in as_list:
            packer.add([length])
        packer.finish()

    def chunked() -> None:
        stowplan_bins(lengths, capacity, 4096)

    runs: Dict[str, Callable[[], None]] = {"stowplan, one length per add": one_by_one, "stowplan, 4,096 per add": chunked}
    if have_seqpacker():
        runs["seqpacker nf, one length per add"] = lambda: seqpacker_count(lengths, capacity, "nf")
        runs["seqpacker hk, one length per add"] = lambda: seqpacker_count(lengths, capacity, "hk")
    times: Dict[str, List[float]] = {k: [] for k in runs}
    for r in range(rounds):
        order = list(runs)[r % len(runs):] + list(runs)[: r % len(runs)]
        for label in order:
            start = time.perf_counter()
            runs[label]()
            times[label].append(time.perf_counter() - start)
    print(f"\n## Python: {len(lengths):,} pretrain-docs-1m lengths, capacity {capacity:,}, {rounds} rounds\n")
    print("| packer | median ms | lengths/s |")
    print("|---|---|---|")
    for label, t in times.items():
        median = statistics.median(t)
        print(f"| {label} | {median * 1e3:.1f} | {len(lengths) / median / 1e6:.2f} M |")


def cli_rate(workloads: pathlib.Path, cli: pathlib.Path, sizes: Sequence[int], rounds: int) -> None:
    base = (workloads / "pretrain-docs-1m.txt").read_bytes()
    if not base.endswith(b"\n"):
        base += b"\n"
    lines = base.count(b"\n")
    print(f"\n## CLI: stowplan pack --stream -c 32768 --oversize single, {rounds} rounds\n")
    print("| lengths | median s | lengths/s | peak RSS (MiB), per round |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for n in sizes:
            path = pathlib.Path(tmp) / f"stream-{n}.txt"
            with path.open("wb") as f:
                whole, rest = divmod(n, lines)
                for _ in range(whole):
                    f.write(base)
                f.write(b"".join(base.splitlines(keepends=True)[:rest]))
            files[n] = path
        times: Dict[int, List[float]] = {n: [] for n in sizes}
        rss: Dict[int, List[float]] = {n: [] for n in sizes}
        for r in range(rounds):
            for n in sizes[r % len(sizes):] + sizes[: r % len(sizes)]:
                args = [str(cli), "pack", "--stream", "-c", "32768", "--oversize", "single", str(files[n])]
                start = time.perf_counter()
                with open(os.devnull, "wb") as sink:
                    proc = subprocess.run(args, stdout=sink, stderr=subprocess.PIPE, text=True)
                times[n].append(time.perf_counter() - start)
                if proc.returncode != 0:
                    raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
                found = re.search(r"stream of (\d+) lengths.*peak memory ([0-9.]+) MiB", proc.stderr)
                if not found or int(found.group(1)) != n:
                    raise AssertionError(f"unexpected summary: {proc.stderr}")
                rss[n].append(float(found.group(2)))
        for n in sizes:
            median = statistics.median(times[n])
            per_round = " ".join(f"{m:.1f}" for m in rss[n])
            print(f"| {n:,} | {median:.3f} | {n / median / 1e6:.1f} M | {per_round} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (≥ 1)")
    ap.add_argument("--cli-sizes", default="1000000,16000000", help="comma-separated stream lengths for the CLI")
    ap.add_argument("--cli", type=pathlib.Path, default=ROOT / "target" / "release" / "stowplan", help="stowplan binary")
    ap.add_argument("--workloads", type=pathlib.Path, default=DEFAULT_WORKLOADS, help="the shared workloads folder")
    ap.add_argument("--skip", default="", help="comma-separated sections to leave out: quality, python, cli")
    a = ap.parse_args()
    sizes = [int(s) for s in a.cli_sizes.split(",") if s.strip()]
    if a.rounds < 1 or any(n < 1 for n in sizes):
        ap.error("--rounds and every size must be at least 1")
    missing = [name for name, _ in CASES if not (a.workloads / name).is_file()]
    if missing:
        ap.error(f"--workloads {a.workloads}: no {', '.join(missing)} (the shared workloads sit beside the checkout)")
    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    unknown = skip - {"quality", "python", "cli"}
    if unknown:
        ap.error(f"--skip: unknown sections {sorted(unknown)} (quality, python, cli)")
    if "cli" not in skip and not a.cli.is_file():
        ap.error(f"--cli {a.cli}: no such binary (cargo build --release -p stowplan-cli)")
    if "quality" not in skip:
        quality(a.workloads)
    if "python" not in skip:
        python_rate(a.workloads, a.rounds)
    if "cli" not in skip:
        cli_rate(a.workloads, a.cli, sizes, a.rounds)


if __name__ == "__main__":
    main()
