"""Times stowplan's bin packing against seqpacker and lightbinpack, side by side in one
process, and checks every output.

Usage:
    pip install './sdk-python[bench]'          # stowplan + seqpacker 0.1.3 + lightbinpack 0.1.1
    python sdk-python/benchmarks/compare_packers.py [--sizes 10000,100000,1000000,4000000]
        [--rounds 5] [--capacity 32768] [--workload ../shared/workloads/pretrain-docs-1m.txt]
        [--fixed-cost]

Inputs: ``n`` lengths drawn (seeded, with replacement past the file's size) from the
workload, as an ``int64`` numpy array — each library gets it the way it takes it fastest:
stowplan and seqpacker the array, lightbinpack a Python list built beforehand (that
conversion is not timed). Methods: best-fit decreasing (stowplan ``bfd``, seqpacker and
lightbinpack ``obfd``, their optimized BFD) and first-fit decreasing (``ffd`` everywhere).

Rounds are interleaved (every packer once per round, in a rotating order) so that the
machine's noise hits all alike; the table gives medians and the per-round ratios
(stowplan's time / the peer's: below 1, stowplan is faster). Every output is checked: each
index exactly once, no bin over capacity, and the bin count against the lower bound
``ceil(sum / capacity)``. A peer that is not installed is skipped, saying so.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import statistics
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import stowplan

HERE = pathlib.Path(__file__).resolve()
DEFAULT_WORKLOAD = HERE.parents[3] / "shared" / "workloads" / "pretrain-docs-1m.txt"

#: A packer under test: library, method, the timed call on the prepared input (the library's
#: natural output), and the conversion of that output to bins for the check (not timed).
Packer = Tuple[str, str, Callable[["Input"], object], Callable[[object], List[np.ndarray]]]


def read_lengths(path: pathlib.Path) -> np.ndarray:
    """The workload's lengths (one per line; blank lines and ``#`` comments skipped)."""
    values = [int(line) for line in path.read_text().split("\n") if line.strip() and not line.startswith("#")]
    return np.asarray(values, dtype=np.int64)


def draw(lengths: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``n`` lengths: the workload itself when ``n`` equals its size, else a seeded draw."""
    if n == len(lengths):
        return lengths.copy()
    return np.random.default_rng(seed).choice(lengths, size=n, replace=n > len(lengths))


def split(flat: np.ndarray, bounds: np.ndarray) -> List[np.ndarray]:
    """Bins from a flat array of members and the bins' boundaries."""
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


class Input:
    """One input, in each library's form (the list is built once, outside the timing)."""

    def __init__(self, array: np.ndarray, with_list: bool) -> None:
        self.array = array
        self.as_list: Optional[List[int]] = array.tolist() if with_list else None


def packers(capacity: int) -> Tuple[List[Packer], List[str]]:
    """Every packer available here, and a line for each library that is missing."""
    out: List[Packer] = []
    missing: List[str] = []
    for method in ("bfd", "ffd"):
        out.append((
            "stowplan", method,
            lambda a, m=method: stowplan.pack(a.array, capacity, method=m),
            lambda p: split(p.indices, p.offsets),
        ))
    try:
        import seqpacker

        for strategy, method in (("obfd", "bfd"), ("ffd", "ffd")):
            sp = seqpacker.Packer(capacity, strategy)
            out.append((
                "seqpacker", method,
                lambda a, sp=sp: sp.pack_flat(a.array),
                lambda r: split(r[0], np.concatenate(([0], r[1], [len(r[0])]))),
            ))
    except ImportError:
        missing.append("seqpacker is not installed (pip install 'stowplan[bench]'): skipped")
    try:
        import lightbinpack

        for fn, method in ((lightbinpack.obfd, "bfd"), (lightbinpack.ffd, "ffd")):
            out.append((
                "lightbinpack", method,
                lambda a, fn=fn: fn(a.as_list, capacity),
                lambda bins: [np.asarray(b, dtype=np.int64) for b in bins],
            ))
    except ImportError:
        missing.append("lightbinpack is not installed (pip install 'stowplan[bench]'): skipped")
    return out, missing


def check(bins: Sequence[np.ndarray], lengths: np.ndarray, capacity: int) -> int:
    """Raises unless every index is in exactly one bin and no bin is over capacity; returns
    the number of bins."""
    members = np.concatenate([np.asarray(b, dtype=np.int64) for b in bins]) if bins else np.zeros(0, np.int64)
    if len(members) != len(lengths) or not np.array_equal(np.sort(members), np.arange(len(lengths))):
        raise AssertionError("not every index exactly once")
    loads = np.array([int(lengths[np.asarray(b, dtype=np.int64)].sum()) for b in bins])
    if len(loads) and int(loads.max()) > capacity:
        raise AssertionError(f"a bin holds {int(loads.max())} > capacity {capacity}")
    return len(bins)


def run(sizes: Sequence[int], rounds: int, capacity: int, workload: pathlib.Path) -> None:
    base = read_lengths(workload)
    base = base[base <= capacity]
    available, missing = packers(capacity)
    for line in missing:
        print(f"# {line}")
    print(f"# workload {workload.name} ({len(base):,} lengths ≤ {capacity}), capacity {capacity}, {rounds} rounds")
    print("| items | method | library | median ms | bins (lower bound) | stowplan / library, per round |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        lengths = draw(base, n)
        data = Input(lengths, with_list=any(p[0] == "lightbinpack" for p in available))
        lower = math.ceil(int(lengths.sum()) / capacity)
        # A warm-up call each (caches, the kernel's first instantiation), checked, not timed.
        bins = {(lib, method): check(to_bins(call(data)), lengths, capacity) for lib, method, call, to_bins in available}
        times: Dict[Tuple[str, str], List[float]] = {(p[0], p[1]): [] for p in available}
        for r in range(rounds):
            # A rotating order: no packer always runs first or last.
            for lib, method, call, _ in available[r % len(available):] + available[: r % len(available)]:
                start = time.perf_counter()
                call(data)
                times[(lib, method)].append(time.perf_counter() - start)
        for method in ("bfd", "ffd"):
            ours = times[("stowplan", method)]
            for lib in ("stowplan", "seqpacker", "lightbinpack"):
                if (lib, method) not in times:
                    continue
                t = times[(lib, method)]
                ratios = "–" if lib == "stowplan" else " ".join(f"{a / b:.2f}" for a, b in zip(ours, t))
                median_ms = statistics.median(t) * 1e3
                print(f"| {n:,} | {method} | {lib} | {median_ms:.2f} | {bins[(lib, method)]:,} ({lower:,}) | {ratios} |")


def fixed_cost(rounds: int, calls: int = 20_000) -> None:
    """Microseconds per call on 8 lengths (capacity 10): the cost of a call itself. Compare
    stowplan's with the Rust host's own per-call time on the same input
    (``cargo run --release -p stowplan --example ratio``, case "pack bfd 8 lengths")."""
    lengths = [5, 3, 7, 2, 6, 4, 8, 1]
    array = np.asarray(lengths, dtype=np.int64)
    runs: Dict[str, Callable[[], object]] = {
        "stowplan.pack(int64 array), wasm": lambda: stowplan.pack(array, 10),
        "stowplan.pack(list), wasm": lambda: stowplan.pack(lengths, 10),
        "stowplan.pack(int64 array), native": lambda: stowplan.pack(array, 10, backend="native"),
    }
    try:
        import seqpacker

        sp = seqpacker.Packer(10, "obfd")
        runs["seqpacker Packer.pack_flat(int64 array)"] = lambda: sp.pack_flat(array)
    except ImportError:
        pass
    try:
        import lightbinpack

        runs["lightbinpack obfd(list)"] = lambda: lightbinpack.obfd(lengths, 10)
    except ImportError:
        pass
    times: Dict[str, List[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for label in list(runs)[r % len(runs):] + list(runs)[: r % len(runs)]:
            call = runs[label]
            call()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            times[label].append((time.perf_counter() - start) / calls * 1e6)
    print(f"\n| fixed cost: 8 lengths, capacity 10 ({calls:,} calls a round) | median µs per call | per round |")
    print("|---|---|---|")
    for label, t in times.items():
        print(f"| {label} | {statistics.median(t):.2f} | {' '.join(f'{x:.2f}' for x in t)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000,4000000", help="comma-separated item counts")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (≥ 1)")
    ap.add_argument("--capacity", type=int, default=32768, help="bin capacity in tokens (≥ 1)")
    ap.add_argument("--workload", type=pathlib.Path, default=DEFAULT_WORKLOAD, help="lengths file")
    ap.add_argument("--fixed-cost", action="store_true", help="also time calls on 8 lengths (µs per call)")
    a = ap.parse_args()
    sizes = [int(s) for s in a.sizes.split(",") if s.strip()]
    if a.rounds < 1 or a.capacity < 1 or any(n < 1 for n in sizes):
        ap.error("--rounds, --capacity and every size must be at least 1")
    if not a.workload.is_file():
        ap.error(f"--workload {a.workload}: no such file (the shared workloads sit beside the checkout)")
    run(sizes, a.rounds, a.capacity, a.workload)
    if a.fixed_cost:
        fixed_cost(a.rounds)


if __name__ == "__main__":
    main()
