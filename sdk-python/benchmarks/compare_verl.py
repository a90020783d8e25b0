"""Times stowplan's Python SDK against verl 0.9.1 on the shared workloads and prints ratios.

Usage:
    pip install ./sdk-python && pip install --no-deps verl==0.9.1
    python sdk-python/benchmarks/compare_verl.py [--workloads ../shared/workloads]

verl's ``verl/utils/seqlen_balancing.py`` imports torch, tensordict and verl's own package.
When torch is installed the real module is imported; otherwise the script loads the same
file from the installed verl wheel with empty stand-ins for those imports — the functions
timed here (``karmarkar_karp``, ``get_seqlen_balanced_partitions``) never touch them. The
output says which was used. Without verl installed, the verl columns are skipped with a
message.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys
import time
import types

import numpy as np

import stowplan
from stowplan.compat import verl as compat

HERE = pathlib.Path(__file__).resolve()
DEFAULT_WORKLOADS = HERE.parents[3] / "shared" / "workloads"


def load_verl():
    """Returns (module, how) or (None, reason)."""
    try:
        import torch  # noqa: F401

        from verl.utils import seqlen_balancing

        return seqlen_balancing, "real verl module (torch installed)"
    except Exception:  # noqa: BLE001 - any import failure means "fall back"
        pass
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        return None, "verl is not installed (pip install --no-deps verl==0.9.1)"
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / "utils" / "seqlen_balancing.py"
    if not path.is_file():
        return None, f"verl is installed but {path} is missing"
    stand_ins = {
        "torch": types.ModuleType("torch"),
        "torch.distributed": types.ModuleType("torch.distributed"),
        "verl": types.ModuleType("verl"),
        "verl.protocol": types.ModuleType("verl.protocol"),
        "verl.utils": types.ModuleType("verl.utils"),
        "verl.utils.tensordict_utils": types.ModuleType("verl.utils.tensordict_utils"),
        "verl.utils.device": types.ModuleType("verl.utils.device"),
    }
    stand_ins["torch"].distributed = stand_ins["torch.distributed"]
    stand_ins["torch"].Tensor = object
    stand_ins["verl.protocol"].DataProto = object
    stand_ins["verl.utils"].tensordict_utils = stand_ins["verl.utils.tensordict_utils"]
    stand_ins["verl.utils.device"].get_device_name = lambda: "cpu"
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        module_spec = importlib.util.spec_from_file_location("verl_seqlen_balancing", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module, f"verl 0.9.1's {path.name} from the installed wheel, torch/tensordict replaced by stand-ins"


def read(path: pathlib.Path, n: int | None = None) -> list[int]:
    values = [int(line) for line in path.read_text().split()]
    return values[:n] if n else values


def median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=pathlib.Path, default=DEFAULT_WORKLOADS)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each large case (median)")
    args = parser.parse_args()
    verl, how = load_verl()
    print(f"stowplan {stowplan.__version__}, kernel {stowplan.kernel_info()['sha256'][:12]}; verl: {how}")

    rl = read(args.workloads / "rl-math-8k.txt")
    docs = read(args.workloads / "pretrain-docs-1m.txt", 262_144)

    # 1. Per-call overhead: 1,024 lengths into 8 groups.
    small_list = rl[:1024]
    small_np = np.asarray(small_list, dtype=np.int64)
    for _ in range(200):
        stowplan.partition(small_np, 8)
    calls = 2000
    per_call_np = median_time(lambda: stowplan.partition(small_np, 8), calls) * 1e6
    per_call_list = median_time(lambda: stowplan.partition(small_list, 8), calls) * 1e6
    per_call_native = median_time(lambda: stowplan.partition(small_np, 8, backend="native"), calls) * 1e6
    print(f"per call, 1,024 lengths into 8 groups (median of {calls}): numpy int64 {per_call_np:.1f} us, "
          f"list {per_call_list:.1f} us, native backend {per_call_native:.1f} us")

    # 2. verl-compatible partitions, identical output.
    rows = []
    for label, seqlens, k, equal in [
        ("unequal 16,384 k=64", docs[:16_384], 64, False),
        ("equal 16,384 k=64", docs[:16_384], 64, True),
        ("unequal 4,096 rl-math k=16", rl, 16, False),
    ]:
        ours = compat.get_seqlen_balanced_partitions(seqlens, k, equal)
        t_ours = median_time(lambda: compat.get_seqlen_balanced_partitions(seqlens, k, equal), args.repeat)
        if verl is not None:
            theirs = verl.get_seqlen_balanced_partitions(seqlens, k, equal)
            identical = theirs == ours
            # Alternate verl and stowplan so both see the same machine load; the ratio is
            # the median of the per-pair ratios.
            pairs = []
            for _ in range(args.repeat):
                tv = median_time(lambda: verl.get_seqlen_balanced_partitions(seqlens, k, equal), 1)
                to = median_time(lambda: compat.get_seqlen_balanced_partitions(seqlens, k, equal), 3)
                pairs.append((tv, to))
            t_verl = statistics.median(p[0] for p in pairs)
            t_ours = statistics.median(p[1] for p in pairs)
            ratio = statistics.median(p[0] / p[1] for p in pairs)
            rows.append((label, t_verl, t_ours, identical))
            print(f"get_seqlen_balanced_partitions {label}: verl {t_verl * 1e3:.1f} ms, stowplan.compat.verl "
                  f"{t_ours * 1e3:.2f} ms, {ratio:.0f}x faster (median of {args.repeat} interleaved pairs), "
                  f"identical output: {identical}")
        else:
            print(f"get_seqlen_balanced_partitions {label}: stowplan.compat.verl {t_ours * 1e3:.2f} ms (verl skipped)")

    # 3. Beyond verl's reach: 262,144 lengths into 1,024 groups.
    big = np.asarray(docs, dtype=np.int64)
    t_big = median_time(lambda: stowplan.partition(big, 1024), args.repeat)
    p = stowplan.partition(big, 1024)
    print(f"stowplan.partition 262,144 into 1,024 (kk): {t_big * 1e3:.1f} ms, largest {p.max} vs lower bound "
          f"{p.lower_bound}, spread {p.spread} (verl: killed after 120 s at 14.5 GiB)")
    if rows and not all(r[3] for r in rows):
        sys.exit("outputs differ from verl")


if __name__ == "__main__":
    main()
