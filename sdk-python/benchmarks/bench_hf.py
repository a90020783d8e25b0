"""Packs a tokenized SFT dataset with TRL 1.16's ``pack_dataset`` and with stowplan, and prints
time, peak memory and bins against the lower bound.

Usage:
    pip install './sdk-python[hf]' trl==1.16.0     # TRL's packing needs no torch
    python sdk-python/benchmarks/bench_hf.py [--rows 1000000] [--rounds 3] [--seq-length 8192]
        [--contenders trl:bfd,stowplan:bfd,...] [--workload ../shared/workloads/sft-chat-200k.txt]

The dataset: the workload's lengths tiled to ``--rows`` rows (1,000,000 = sft-chat-200k five
times), ``input_ids`` and ``labels`` ``list<int32>`` columns (distinct buffers), an in-memory
``datasets.Dataset``. The contenders:

- ``trl:bfd``, ``trl:bfd_split``, ``trl:wrapped`` — ``trl.pack_dataset`` (per 1,000-row map
  batch);
- ``stowplan:bfd``, ``stowplan:bfd_split``, ``stowplan:wrapped`` —
  ``stowplan.hf.pack_dataset(scope="dataset")``: one kernel plan over the whole dataset;
- ``compat:bfd``, ``compat:bfd_split``, ``compat:wrapped`` — ``stowplan.compat.trl.pack_dataset``,
  TRL's output row for row (checked here: the sha256 of its output against TRL's);
- ``stowplan-file:*`` — ``stowplan.hf.pack_dataset(cache_file_name=...)``;
- ``copy:floor`` — the copy floor: the same columns' flat values copied once into fresh memory
  (``numpy.concatenate``, one core) and rebuilt as a ``Dataset`` of the unpacked rows, what
  any packing that copies the values costs at least;
- ``before-stowplan:*``, ``before-compat:*`` — ``stowplan:*``, ``compat:*`` with another stowplan first on the child's
  ``PYTHONPATH`` (``--before DIR``, e.g. ``pip install --no-deps --target DIR`` of an older
  checkout's ``sdk-python``): before and after a change, in the same run;
- ``cli:*`` — ``stowplan pack-dataset TABLE OUT`` (``$STOWPLAN_BIN``, default
  ``target/release/stowplan``, a build with the ``arrow`` feature) on the table's file, then
  ``Dataset.from_file(OUT)``; its peak RSS is the larger of the CLI's and the Python side's.

The table is written once to an Arrow IPC file in a temporary directory. Each measurement
runs in a fresh subprocess (so each peak RSS is its own): the child reads the table into
memory, resets its peak RSS (``/proc/self/clear_refs``), packs (timed: the call that
returns the packed ``Dataset``, end to end including the Arrow rebuild), then reads its peak
RSS (``VmHWM``), counts the rows (bins) and tokens and hashes the output. Rounds are
interleaved (every contender once per round, the order rotating), and the table gives medians.
The lower bound of a contender's bins is ``ceil(tokens it packed / seq_length)`` (``bfd``
truncates, so it packs fewer tokens than ``bfd_split`` and ``wrapped``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

HERE = pathlib.Path(__file__).resolve()
DEFAULT_WORKLOAD = HERE.parents[3] / "shared" / "workloads" / "sft-chat-200k.txt"
# "stowplan-file": stowplan.hf with cache_file_name (the packed rows written to a file beside
# the table, fsynced, and memory-mapped), so that the packed copy is not held in memory.
# "cli": the `stowplan pack-dataset` command on the table's file, no Python packing.
CONTENDERS = tuple(f"{who}:{s}" for who in ("trl", "stowplan", "compat", "stowplan-file", "cli", "before-stowplan", "before-compat") for s in ("bfd", "bfd_split", "wrapped")) + ("copy:floor",)
CLI = pathlib.Path(os.environ.get("STOWPLAN_BIN") or HERE.parents[2] / "target" / "release" / "stowplan")


def read_lengths(path: pathlib.Path) -> np.ndarray:
    values = [int(line) for line in path.read_text().split("\n") if line.strip() and not line.startswith("#")]
    return np.asarray(values, dtype=np.int64)


def build_table(lengths: np.ndarray, first_id: int = 0) -> Any:
    """int32 ``input_ids`` and ``labels`` (-100 at each row's first token) with these row lengths."""
    import pyarrow as pa

    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    total = int(offsets[-1])
    off_type = np.int32 if total < 2**31 else np.int64
    cls = pa.ListArray if off_type is np.int32 else pa.LargeListArray
    ids = np.arange(first_id, first_id + total, dtype=np.int64)
    np.remainder(ids, 32_000, out=ids)  # in place: no temporary as large as the table
    ids = ids.astype(np.int32)
    labels = ids.copy()
    labels[offsets[:-1][lengths > 0]] = -100
    return pa.table(
        {
            "input_ids": cls.from_arrays(pa.array(offsets.astype(off_type)), pa.array(ids)),
            "labels": cls.from_arrays(pa.array(offsets.astype(off_type)), pa.array(labels)),
        }
    )


def write_table(lengths: np.ndarray, path: pathlib.Path) -> None:
    """The dataset's table as an Arrow IPC stream file (the format of the `datasets` cache
    files), which each measurement reads into memory or memory-maps (so no process carries the
    building's garbage into its peak RSS)."""
    import pyarrow as pa

    part = 100_000  # rows built at a time (the file is written piece by piece)
    total = int(lengths.sum())
    if total >= 2**31:
        raise SystemExit(f"--rows: {total:,} tokens do not fit list<int32> offsets; use fewer rows")
    schema = build_table(lengths[:1]).schema
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        done = 0  # tokens before the part: the ids continue across parts
        for at in range(0, lengths.size, part):
            table = build_table(lengths[at : at + part], first_id=done)
            writer.write_table(table, max_chunksize=1 << 20)
            done += int(lengths[at : at + part].sum())


def read_dataset(path: pathlib.Path, mmap: bool) -> Any:
    """A ``datasets.Dataset`` of the file's table: read into memory, or memory-mapped by
    ``Dataset.from_file`` as `datasets` maps its own cache files (its pages the file's, which
    the OS can drop and read again). The in-memory ``Dataset`` gets a fingerprint: without
    one, its constructor fingerprints the table by pickling it, a transient copy of 2.5x its
    size (at 1M rows 24 GiB, which this machine's OOM killer ended)."""
    import datasets
    import pyarrow as pa

    if mmap:
        return datasets.Dataset.from_file(str(path))
    with pa.OSFile(str(path), "rb") as source:
        table = pa.ipc.open_stream(source).read_all()
    return datasets.Dataset(datasets.table.InMemoryTable(table), fingerprint=f"bench_hf-{path.stat().st_size}")


def _status(key: str) -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _digest(dataset: Any) -> str:
    """sha256 of the output's columns (row lengths and values), in column order."""
    import pyarrow.compute as pc

    h = hashlib.sha256()
    table = dataset.data.table
    h.update(json.dumps(table.column_names).encode())
    for name in table.column_names:
        col = table.column(name)
        h.update(pc.list_value_length(col).to_numpy().astype(np.int64).tobytes())
        values = pc.list_flatten(col)
        for chunk in values.chunks if hasattr(values, "chunks") else [values]:
            for at in range(0, len(chunk), 1 << 24):  # in slices: no copy of the whole column
                h.update(np.ascontiguousarray(chunk.slice(at, 1 << 24).to_numpy()).tobytes())
    return h.hexdigest()


def child(contender: str, seq_length: int, path: pathlib.Path, mmap: bool) -> Dict[str, Any]:
    """One measurement (run in its own process)."""
    import datasets
    import pyarrow.compute as pc

    datasets.disable_progress_bars()
    # A memory-mapped Dataset has cache files: without this, TRL's Dataset.map in a later
    # round would load the packed rows its first round wrote instead of packing.
    datasets.disable_caching()
    who, strategy = contender.split(":")
    who = who.removeprefix("before-")  # (the other stowplan is on the PYTHONPATH)
    out_file = path.with_name(f"packed-{os.getpid()}.arrow") if who in ("stowplan-file", "cli") else None
    if who == "cli":

        def pack(ds: Any, seq_length: int, strategy: str) -> Any:
            args = [str(CLI), "pack-dataset", str(path), str(out_file), "--capacity", str(seq_length)]
            args += ["--strategy", strategy, "--columns", "input_ids,labels"]
            subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
            return datasets.Dataset.from_file(str(out_file))

    elif who == "copy":

        def pack(ds: Any, seq_length: int, strategy: str) -> Any:
            import pyarrow as pa

            table = ds.data.table
            columns = {}
            for name in ("input_ids", "labels"):
                lens = pc.list_value_length(table.column(name)).to_numpy()
                offsets = pa.array(np.concatenate(([0], np.cumsum(lens))))
                values = np.concatenate([c.to_numpy() for c in pc.list_flatten(table.column(name)).chunks])
                columns[name] = pa.LargeListArray.from_arrays(offsets, pa.array(values))
            return datasets.Dataset(datasets.table.InMemoryTable(pa.table(columns)), fingerprint="copy")

    elif who == "trl":
        from trl import pack_dataset as pack
    elif who == "compat":
        from stowplan.compat.trl import pack_dataset as pack
    else:
        import stowplan.hf

        def pack(ds: Any, seq_length: int, strategy: str) -> Any:
            # The columns TRL writes (and the CLI by default): no position_ids, which
            # pack_dataset adds by default for trainers that drop seq_lengths.
            return stowplan.hf.pack_dataset(ds, seq_length, strategy=strategy, scope="dataset", cache_file_name=out_file, position_ids=False)

    import pyarrow as pa

    ds = read_dataset(path, mmap)
    table_bytes = ds.data.table.nbytes
    pa.default_memory_pool().release_unused()  # datasets' checks leave a table's worth of freed memory in the pool
    base = _status("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text("5")  # the peak restarts from here
    start = time.perf_counter()
    out = pack(ds, seq_length, strategy=strategy)
    seconds = time.perf_counter() - start
    import resource

    peak = max(_status("VmHWM"), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    tokens = int(pc.sum(pc.list_value_length(out.data.table.column("input_ids"))).as_py())  # (wrapped has no seq_lengths in TRL)
    result = {
        "contender": contender,
        "seconds": seconds,
        "peak_rss": peak,
        "rss_before": base,
        "table_bytes": table_bytes,
        "bins": len(out),
        "tokens": tokens,
        "lower_bound": math.ceil(tokens / seq_length),
        "sha256": _digest(out),
    }
    if out_file is not None:
        del out
        out_file.unlink()  # rounds do not pile packed copies up on the disk
    return result


def run(contenders: List[str], rows: int, rounds: int, seq_length: int, workload: pathlib.Path, mmap: bool, before: Any = None) -> None:
    results: Dict[str, List[Dict[str, Any]]] = {c: [] for c in contenders}
    with tempfile.TemporaryDirectory(prefix="bench_hf_") as tmp:
        path = pathlib.Path(tmp) / "table.arrow"
        write_table(np.resize(read_lengths(workload), rows), path)
        _rounds(contenders, rounds, seq_length, path, mmap, results, before)
    report(contenders, rows, rounds, seq_length, workload, mmap, results)


def _rounds(contenders: List[str], rounds: int, seq_length: int, path: pathlib.Path, mmap: bool, results: Dict[str, List[Dict[str, Any]]], before: Any = None) -> None:
    for r in range(rounds):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for c in order:
            args = [sys.executable, str(HERE), "--child", c, "--seq-length", str(seq_length), "--table", str(path)]
            args += ["--mmap"] if mmap else []
            env = dict(os.environ, PYTHONPATH=str(before)) if c.startswith("before-") else None
            proc = subprocess.run(args, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                sys.exit(f"{c} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            res = json.loads(proc.stdout.strip().splitlines()[-1])
            results[c].append(res)
            print(f"# round {r + 1}: {c}: {res['seconds']:.2f} s, peak RSS {res['peak_rss'] / 2**30:.2f} GiB", file=sys.stderr, flush=True)


def report(contenders: List[str], rows: int, rounds: int, seq_length: int, workload: pathlib.Path, mmap: bool, results: Dict[str, List[Dict[str, Any]]]) -> None:
    first = results[contenders[0]][0]
    print(
        f"\n{rows:,} rows of {workload.name} (tiled), seq_length {seq_length:,}, int32 input_ids + labels: "
        f"Arrow table {first['table_bytes'] / 2**30:.2f} GiB ({'memory-mapped from a file' if mmap else 'in memory'}); "
        f"{rounds} interleaved round(s), medians; "
        "peak RSS = the process's peak while packing (its table and Python's ~0.3 GiB included); "
        "growth = peak minus the RSS just before the call\n"
    )
    print("| contender | time (median) | per round | TRL's median / this (same strategy) | peak RSS | peak / table | growth | bins | lower bound | over LB | same output (compat: TRL's; cli, stowplan-file: stowplan's) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in contenders:
        rs = results[c]
        t = statistics.median(x["seconds"] for x in rs)
        who, strategy = c.split(":")
        trl = results.get(f"trl:{strategy}")
        ratio = f"{statistics.median(x['seconds'] for x in trl) / t:.1f}×" if trl and who != "trl" else "–"
        floor = results.get("copy:floor")
        if floor and who != "copy":
            ratio += f"; {t / statistics.median(x['seconds'] for x in floor):.2f}× the copy floor"
        peak = max(x["peak_rss"] for x in rs)
        growth = max(x["peak_rss"] - x["rss_before"] for x in rs)
        x = rs[0]
        if len({y["sha256"] for y in rs}) != 1:
            raise AssertionError(f"{c}: the output changed between rounds")
        # compat must give TRL's output; the file and CLI routes stowplan.hf's.
        twin = {"compat": "trl", "cli": "stowplan", "stowplan-file": "stowplan", "before-stowplan": "stowplan", "before-compat": "compat"}.get(who)
        theirs = results.get(f"{twin}:{strategy}")
        same = "–"
        if theirs:
            same = "yes" if x["sha256"] == theirs[0]["sha256"] else "**NO**"
            if same != "yes":
                print(f"# {c}: output differs from {twin}:{strategy}'s", file=sys.stderr)
        excess = (x["bins"] / x["lower_bound"] - 1) * 100
        print(
            f"| {c} | {t:.2f} s | {' '.join('%.2f' % y['seconds'] for y in rs)} | {ratio} | {peak / 2**30:.2f} GiB | "
            f"{peak / x['table_bytes']:.2f} | {growth / 2**30:.2f} GiB | {x['bins']:,} | {x['lower_bound']:,} | +{excess:.3f} % | {same} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows of the dataset (the workload tiled)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (≥ 1)")
    ap.add_argument("--seq-length", type=int, default=8192, help="packed row length (≥ 1)")
    ap.add_argument("--contenders", default=",".join(c for c in CONTENDERS if not c.startswith("stowplan-file")), help=f"comma-separated, of {', '.join(CONTENDERS)}")
    ap.add_argument("--workload", type=pathlib.Path, default=DEFAULT_WORKLOAD, help="lengths file")
    ap.add_argument("--mmap", action="store_true", help="memory-map the table from its file instead of reading it into memory")
    ap.add_argument("--before", type=pathlib.Path, help="a directory holding another stowplan, for the before-*:* contenders")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--table", type=pathlib.Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rows < 1 or a.rounds < 1 or a.seq_length < 1:
        ap.error("--rows, --rounds and --seq-length must be at least 1")
    if not a.workload.is_file():
        ap.error(f"--workload {a.workload}: no such file (the shared workloads sit beside the checkout)")
    if a.child:
        print(json.dumps(child(a.child, a.seq_length, a.table, a.mmap)))
        return
    contenders = [c.strip() for c in a.contenders.split(",") if c.strip()]
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown or not contenders:
        ap.error(f"--contenders: unknown {unknown} (choose from {', '.join(CONTENDERS)})")
    if any(c.startswith("before-") for c in contenders) and not (a.before and a.before.is_dir()):
        ap.error("--contenders before-*:* need --before DIR, a directory holding another stowplan")
    run(contenders, a.rows, a.rounds, a.seq_length, a.workload, a.mmap, a.before)


if __name__ == "__main__":
    main()
