"""Per-row lengths of N documents on Ray Data (`stowplan.ray.compute_lengths`) against local
multiprocessing (`stowplan.compute_lengths` with a worker pool), in one run, rounds
interleaved.

    python sdk-python/benchmarks/ray_lengths.py [--rows 10000000] [--rounds 2] [--workers 2]

The documents: a `text` column of N rows, written once to a Parquet file (Ray Data reads it
with `read_parquet`) and to an Arrow file that `datasets.Dataset.from_file` memory-maps (the
local path's dataset, indexed row by row as `compute_lengths` does). Row i has
`1 + lengths[i mod 200,000] // 64` words (the sft-chat-200k lengths tiled; 21 words on
average), so the length function — a whitespace tokenizer, `len(row["text"].split())` — does
the same work on both paths. Local: a fresh length cache every round, `--workers` processes
(the machine's 2 cores). Ray: a local Ray with `--workers` CPUs (`ray.init(num_cpus=...)`).
Both results are checked equal to each other and to the lengths the file was written from.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

import stowplan

HERE = pathlib.Path(__file__).resolve().parent
WORKLOAD = HERE.parents[2] / "shared" / "workloads" / "sft-chat-200k.txt"
WORDS_PER_TOKEN = 64


def words(row: Dict[str, Any]) -> int:
    """The benchmark's length function: a whitespace tokenizer."""
    return len(row["text"].split())


def write_documents(rows: int, tmp: pathlib.Path) -> np.ndarray:
    """Writes the `text` column to tmp/docs.parquet and tmp/docs.arrow; returns the word
    counts (the expected lengths)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = np.loadtxt(WORKLOAD, dtype=np.int64)
    counts = 1 + np.resize(base, rows) // WORDS_PER_TOKEN
    top = int(counts.max())
    # Each distinct word count's text once; the column is a dictionary array decoded to strings.
    texts = pa.array([" ".join(f"w{j % 97}" for j in range(k)) for k in range(top + 1)], pa.string())
    column = pa.DictionaryArray.from_arrays(pa.array(counts, pa.int32()), texts).cast(pa.large_string())
    table = pa.table({"text": column})
    pq.write_table(table, tmp / "docs.parquet", row_group_size=1 << 18)
    with pa.OSFile(str(tmp / "docs.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 16)
    return counts.astype(np.uint64)


def run_local(tmp: pathlib.Path, workers: int, round_: int) -> np.ndarray:
    import datasets

    ds = datasets.Dataset.from_file(str(tmp / "docs.arrow"))
    return stowplan.compute_lengths(ds, words, cache_dir=tmp / f"cache{round_}", source="docs", workers=workers)


def run_ray(tmp: pathlib.Path) -> np.ndarray:
    import ray.data

    import stowplan.ray as sray

    return sray.compute_lengths(ray.data.read_parquet(str(tmp / "docs.parquet")), length_fn=words)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000, help="documents (≥ 1)")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds (≥ 1)")
    ap.add_argument("--workers", type=int, default=2, help="local processes and Ray CPUs (≥ 1)")
    a = ap.parse_args()
    if a.rows < 1 or a.rounds < 1 or a.workers < 1:
        ap.error("--rows, --rounds and --workers must be at least 1")
    import ray

    with tempfile.TemporaryDirectory(prefix="ray_lengths_") as name:
        tmp = pathlib.Path(name)
        t0 = time.perf_counter()
        expected = write_documents(a.rows, tmp)
        print(f"{a.rows:,} documents, {int(expected.sum()):,} words, written in {time.perf_counter() - t0:.1f} s", flush=True)
        times: Dict[str, List[float]] = {"local": [], "ray": []}
        for r in range(a.rounds):
            for path in (["local", "ray"] if r % 2 == 0 else ["ray", "local"]):
                # Ray runs only during its rounds (started and stopped outside the timing): the
                # local pool forks this process, which must not carry Ray's workers and handlers.
                if path == "ray":
                    ray.init(num_cpus=a.workers, include_dashboard=False, log_to_driver=False, configure_logging=False)
                try:
                    t0 = time.perf_counter()
                    got = run_local(tmp, a.workers, r) if path == "local" else run_ray(tmp)
                    dt = time.perf_counter() - t0
                finally:
                    if path == "ray":
                        ray.shutdown()
                if not np.array_equal(got, expected):
                    sys.exit(f"{path}: lengths differ from the documents' word counts")
                times[path].append(dt)
                print(f"round {r} {path}: {dt:.2f} s ({a.rows / dt / 1e6:.2f} M rows/s)", flush=True)
    print("| path | median | M rows/s | rounds (s) |\n|---|---|---|---|")
    for path, ts in times.items():
        m = statistics.median(ts)
        print(f"| {path} | {m:.2f} s | {a.rows / m / 1e6:.2f} | {' '.join(f'{t:.2f}' for t in ts)} |")
    print(f"ray / local: {statistics.median(times['ray']) / statistics.median(times['local']):.2f}")


if __name__ == "__main__":
    main()
