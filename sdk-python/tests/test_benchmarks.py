"""The benchmark scripts run: a tiny size, one round (their figures are in BENCHMARKS.md)."""

from __future__ import annotations

import os
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


STREAM_SCRIPT = HERE.parent / "benchmarks" / "stream_packers.py"


def test_stream_packers_runs_and_checks_every_output():
    if not WORKLOAD.is_file():
        pytest.skip(f"no shared workloads beside the checkout ({WORKLOAD})")
    args = [sys.executable, str(STREAM_SCRIPT), "--rounds", "1", "--workloads", str(WORKLOAD.parent)]
    cli = os.environ.get("STOWPLAN_BIN")
    args += ["--cli", cli, "--cli-sizes", "1000,2000"] if cli else ["--skip", "cli"]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=300).stdout
    assert "| sft-chat-200k.txt | 16,384 | stowplan, buffer 4,096 (default) |" in out, out
    assert "| stowplan, 4,096 per add |" in out, out
    assert "seqpacker nf" in out or "seqpacker is not installed" in out, out
    if cli:
        assert "| 1,000 |" in out and "| 2,000 |" in out, out


def test_stream_packers_refuses_bad_arguments():
    bad = subprocess.run(
        [sys.executable, str(STREAM_SCRIPT), "--skip", "everything"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--skip: unknown sections" in bad.stderr, bad.stderr


RAY_SCRIPT = HERE.parent / "benchmarks" / "bench_ray.py"


@pytest.mark.xdist_group("ray")  # one worker starts Ray (run_tests.sh)
def test_bench_ray_runs_both_paths():
    """bench_ray.py on 256 rollouts, 2 rounds: both paths deliver every step and are reported."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'stowplan[ray]')")
    pytest.importorskip("zmq", reason="pyzmq is not installed (pip install 'stowplan[zmq]')")
    cli = os.environ.get("STOWPLAN_BIN")
    if not cli:
        pytest.skip("STOWPLAN_BIN is not set (the stowplan binary the ZeroMQ path runs)")
    if not (HERE.parents[2] / "shared" / "workloads" / "rl-math-8k.txt").is_file():
        pytest.skip("no shared workloads beside the checkout")
    run = subprocess.run(
        [sys.executable, str(RAY_SCRIPT), "--rounds", "2", "--samples", "256", "--bin", cli],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, f"bench_ray.py exited {run.returncode}; its stderr ends:\n{run.stderr[-4000:]}"
    out = run.stdout
    assert "| zmq (`stowplan serve`) |" in out and "| ray (`stowplan.ray`) |" in out, out
    assert "round 1: zmq " in out and "(ray then zmq)" in out, out
    assert "publish (ray.put x4)" in out and "deliver_s" in out, out


LENGTHS_SCRIPT = HERE.parent / "benchmarks" / "ray_lengths.py"


@pytest.mark.xdist_group("ray")  # one worker starts Ray (run_tests.sh)
def test_ray_lengths_checks_both_paths():
    """ray_lengths.py on 3,000 documents, 1 round: Ray Data and the local pool both give every
    document's word count (the script exits non-zero otherwise) and are reported."""
    pytest.importorskip("ray", reason="ray is not installed (pip install 'stowplan[ray]')")
    pytest.importorskip("datasets")
    if not (HERE.parents[2] / "shared" / "workloads" / "sft-chat-200k.txt").is_file():
        pytest.skip("no shared workloads beside the checkout")
    out = subprocess.run(
        [sys.executable, str(LENGTHS_SCRIPT), "--rows", "3000", "--rounds", "1"],
        check=True, capture_output=True, text=True, timeout=300,
    ).stdout
    assert "round 0 local:" in out and "round 0 ray:" in out, out
    assert "| local |" in out and "| ray |" in out and "ray / local:" in out, out
    bad = subprocess.run([sys.executable, str(LENGTHS_SCRIPT), "--rows", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be at least 1" in bad.stderr, bad.stderr


HF_SCRIPT = HERE.parent / "benchmarks" / "bench_hf.py"
SFT = HERE.parents[2] / "shared" / "workloads" / "sft-chat-200k.txt"


def _cli_with_arrow(tmp_path):
    """The test command's stowplan binary if it was built with the arrow feature, else None."""
    cli = os.environ.get("STOWPLAN_BIN")
    if not cli:
        return None
    import pyarrow as pa

    probe = tmp_path / "probe.arrow"
    table = pa.table({"input_ids": [[1, 2]]})
    with pa.ipc.new_stream(str(probe), table.schema) as w:
        w.write_table(table)
    out = subprocess.run([cli, "pack-dataset", str(probe), str(tmp_path / "out.arrow"), "--capacity", "4"], capture_output=True, text=True)
    return None if "built without Arrow support" in out.stderr else cli


def test_bench_hf_runs_and_compat_matches_trl(tmp_path):
    if not SFT.is_file():
        pytest.skip(f"no shared workloads beside the checkout ({SFT})")
    pytest.importorskip("datasets")
    contenders = "stowplan:bfd,stowplan:wrapped"
    try:
        import trl  # noqa: F401

        contenders += ",trl:bfd,compat:bfd"
    except Exception:
        pass
    if _cli_with_arrow(tmp_path):
        contenders += ",cli:wrapped"
    args = [sys.executable, str(HF_SCRIPT), "--rows", "500", "--rounds", "1", "--seq-length", "2048", "--workload", str(SFT), "--contenders", contenders]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=600).stdout
    assert "| stowplan:bfd |" in out and "| stowplan:wrapped |" in out, out
    for twin in ("compat:bfd", "cli:wrapped"):
        if twin in contenders:
            row = next(line for line in out.splitlines() if line.startswith(f"| {twin} |"))
            assert row.endswith("| yes |"), out


def test_bench_hf_refuses_bad_arguments():
    bad = subprocess.run([sys.executable, str(HF_SCRIPT), "--contenders", "trl:ffd"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--contenders: unknown ['trl:ffd']" in bad.stderr, bad.stderr


FILL_SCRIPT = HERE.parent / "benchmarks" / "fill_peers.py"


def test_fill_peers_runs_and_checks_every_output():
    if not SFT.is_file():
        pytest.skip(f"no shared workloads beside the checkout ({SFT})")
    out = subprocess.run(
        [sys.executable, str(FILL_SCRIPT), "--rows", "3000", "--workload", str(SFT)],
        check=True, capture_output=True, text=True, timeout=300,
    ).stdout
    assert "| stowplan bfd | dataset |" in out and "| stowplan bfd | batch of 1000 |" in out, out
    # Measured when installed (pip install --no-deps llamafactory), else skipped saying so.
    assert "| LLaMA-Factory 0.9.5 greedy_knapsack | batch of 1000 |" in out or "# LLaMA-Factory is not installed" in out, out
    bad = subprocess.run([sys.executable, str(FILL_SCRIPT), "--seq-length", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be at least 1" in bad.stderr
