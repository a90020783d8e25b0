"""Fill of the SFT frameworks' own packers beside stowplan's, on the same lengths.

Usage:
    pip install --no-deps llamafactory==0.9.5   # its packing function only: no torch needed
    python sdk-python/benchmarks/fill_peers.py [--rows 200000] [--seq-length 8192]
        [--batch-size 1000] [--workload ../shared/workloads/sft-chat-200k.txt]

The lengths (clipped to ``seq-length``, as truncation leaves them; empty ones left out) are
packed by:

- LLaMA-Factory 0.9.5's ``greedy_knapsack`` (``llamafactory.data.processor.processor_utils``),
  as its packed SFT processor calls it: once per ``Dataset.map`` batch of ``--batch-size``
  rows (its ``preprocessing_batch_size``, 1,000 by default). The module is loaded from the
  installed package by its file, without running the package's ``__init__`` (which imports
  torch and transformers); it imports only the standard library.
- stowplan's best fit decreasing over the same batches (like for like), and over the whole
  dataset at once (``stowplan.hf.pack_dataset``'s ``scope="dataset"``).

axolotl's multipack sampler is not measured: ``axolotl.utils.samplers.multipack`` imports
torch (``torch.utils.data``) and ``torch.distributed``, which this CPU machine's registry
only offers as the CUDA build; the script says so. Every output is checked (each batch's
lengths exactly once, no bin over ``seq-length``); the lower bound is ⌈Σ lengths / seq-length⌉
over the whole dataset.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import pathlib
import sys
import time
from collections import Counter
from typing import Callable, List, Optional

import numpy as np

import stowplan

HERE = pathlib.Path(__file__).resolve()
DEFAULT_WORKLOAD = HERE.parents[3] / "shared" / "workloads" / "sft-chat-200k.txt"
#: The LLaMA-Factory release measured.
LLAMAFACTORY_VERSION = "0.9.5"


def llamafactory_knapsack() -> Optional[Callable[[List[int], int], List[List[int]]]]:
    """LLaMA-Factory's ``greedy_knapsack``, or None when the package is not installed."""
    spec = importlib.util.find_spec("llamafactory")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "data" / "processor" / "processor_utils.py"
    module_spec = importlib.util.spec_from_file_location("llamafactory_processor_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # (its dataclasses look their module up)
    module_spec.loader.exec_module(module)
    return module.greedy_knapsack


def checked(bins: List[List[int]], lengths: List[int], capacity: int) -> int:
    """The number of bins; raises unless they hold exactly ``lengths`` within ``capacity``."""
    if Counter(v for b in bins for v in b) != Counter(lengths):
        raise AssertionError("the bins do not hold exactly the batch's lengths")
    if any(sum(b) > capacity for b in bins):
        raise AssertionError(f"a bin is over {capacity}")
    return len(bins)


def stowplan_bins(lengths: List[int], capacity: int) -> List[List[int]]:
    p = stowplan.pack(np.asarray(lengths, dtype=np.uint64), capacity, method="bfd")
    values = np.asarray(lengths, dtype=np.int64)[p.indices.astype(np.int64)]
    return [values[a:b].tolist() for a, b in zip(p.offsets[:-1], p.offsets[1:])]


def main(argv: Optional[List[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=None, help="rows of the workload (default: all)")
    ap.add_argument("--seq-length", type=int, default=8192, help="packed row length (≥ 1)")
    ap.add_argument("--batch-size", type=int, default=1000, help="rows per map batch (≥ 1)")
    ap.add_argument("--workload", type=pathlib.Path, default=DEFAULT_WORKLOAD, help="lengths file")
    a = ap.parse_args(argv)
    if a.seq_length < 1 or a.batch_size < 1 or (a.rows is not None and a.rows < 1):
        ap.error("--rows, --seq-length and --batch-size must be at least 1")
    raw = [int(x) for x in a.workload.read_text().split() if x.strip()]
    raw = raw[: a.rows] if a.rows else raw
    clipped = [min(n, a.seq_length) for n in raw]
    batches = [[n for n in clipped[i : i + a.batch_size] if n > 0] for i in range(0, len(clipped), a.batch_size)]
    everything = [n for b in batches for n in b]
    lower = math.ceil(sum(everything) / a.seq_length)
    print(f"# {a.workload.name}: {len(raw):,} rows, seq_length {a.seq_length}, map batches of {a.batch_size} rows")
    print("# axolotl: not measured (its multipack sampler imports torch and torch.distributed; no CPU torch here)")
    contenders = [("stowplan bfd", "dataset", lambda: [stowplan_bins(everything, a.seq_length)], [everything])]
    contenders.append(("stowplan bfd", f"batch of {a.batch_size}", lambda: [stowplan_bins(b, a.seq_length) for b in batches], batches))
    knapsack = llamafactory_knapsack()
    if knapsack is None:
        print(f"# LLaMA-Factory is not installed (pip install --no-deps llamafactory=={LLAMAFACTORY_VERSION}): skipped")
    else:
        # greedy_knapsack sorts its argument in place: give it a copy, as its processor does.
        contenders.append(
            (f"LLaMA-Factory {LLAMAFACTORY_VERSION} greedy_knapsack", f"batch of {a.batch_size}",
             lambda: [knapsack(list(b), a.seq_length) for b in batches], batches)
        )
    print("| packer | scope | bins | lower bound | over LB | time (s) |")
    print("|---|---|---|---|---|---|")
    for name, scope, call, inputs in contenders:
        t0 = time.perf_counter()
        out = call()
        seconds = time.perf_counter() - t0
        bins = sum(checked(o, i, a.seq_length) for o, i in zip(out, inputs))
        print(f"| {name} | {scope} | {bins:,} | {lower:,} | {100 * (bins - lower) / lower:+.3f} % | {seconds:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
