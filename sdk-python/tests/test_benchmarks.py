"""The benchmark scripts run: a tiny size, one round (their figures are in BENCHMARKS.md)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE.parent / "benchmarks" / "compare_packers.py"
WORKLOAD = HERE.parents[2] / "shared" / "workloads" / "pretrain-docs-1m.txt"


def test_compare_packers_runs_and_checks_every_output():
    if not WORKLOAD.is_file():
        pytest.skip(f"no shared workloads beside the checkout ({WORKLOAD})")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--sizes", "1000,2000", "--rounds", "2", "--workload", str(WORKLOAD)],
        check=True, capture_output=True, text=True, timeout=300,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| 1,000 |") or line.startswith("| 2,000 |")]
    assert any("| bfd | stowplan |" in r for r in rows) and any("| ffd | stowplan |" in r for r in rows), out
    for peer in ("seqpacker", "lightbinpack"):
        # Measured when installed (the bench extra), else skipped saying so.
        assert f"| bfd | {peer} |" in out or f"# {peer} is not installed" in out, out


def test_compare_packers_refuses_bad_arguments():
    bad = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--rounds, --capacity and every size must be at least 1" in bad.stderr
