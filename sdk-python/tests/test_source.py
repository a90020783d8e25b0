"""The rollout data source with a buffer from Python (seed 003): groups and indices, the
documented shuffle reproduced in pure Python, the buffer with foreign sample objects, save →
kill -9 → load across processes, and slime's method names."""

from __future__ import annotations

import json
import pathlib
import signal
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import List

import pytest

import stowplan
from stowplan.compat.slime import RolloutDataSource, RolloutDataSourceWithBuffer

M = 2**64 - 1
GOLDEN = 0x9E3779B97F4A7C15


def reference_permutation(n: int, seed: int, epoch: int) -> List[int]:
    """The shuffle exactly as wit/kernel.wit (interface shuffle) documents it."""
    state = (seed + epoch * GOLDEN) & M

    def draw() -> int:
        nonlocal state
        state = (state + GOLDEN) & M
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)

    def bounded(m: int) -> int:
        p = draw() * m
        if p & M < m:
            t = (2**64 - m) % m
            while p & M < t:
                p = draw() * m
        return p >> 64

    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = bounded(i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def write_prompts(path: pathlib.Path, n: int) -> None:
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "label": str(i), "metadata": {"i": i}}) + "\n" for i in range(n)))


def test_groups_and_the_documented_shuffle(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "prompts.jsonl"
    write_prompts(path, 13)
    for backend in ("wasm", "native"):
        ds = stowplan.DataSource(path, n_samples_per_prompt=4, shuffle=True, seed=2024, backend=backend)
        groups = ds.get_samples(30)
        assert [s.index for g in groups for s in g] == list(range(120))
        rows = [g[0].prompt_index for g in groups]
        assert rows[:13] == reference_permutation(13, 2024, 0)
        assert rows[13:26] == reference_permutation(13, 2024, 1)
        assert rows[26:] == reference_permutation(13, 2024, 2)[:4]
        assert groups[0][0].prompt == f"q{rows[0]}" and groups[0][0].metadata == {"i": rows[0]}
        assert (ds.epoch, ds.offset, ds.next_index) == (2, 4, 120)
    with pytest.raises(stowplan.InvalidArgumentError, match="read-only"):
        ds.add_samples(groups[:1])
    with pytest.raises(stowplan.InvalidArgumentError, match="n_samples_per_prompt must be in 1"):
        stowplan.DataSource(path, n_samples_per_prompt=0)
    with pytest.raises(stowplan.StowplanIOError):
        stowplan.DataSource(tmp_path / "missing.jsonl", n_samples_per_prompt=1)


def test_buffer_keeps_foreign_samples_and_validates_groups() -> None:
    ds = stowplan.BufferedDataSource.from_records([{"prompt": f"p{i}"} for i in range(5)], n_samples_per_prompt=2)
    drawn = ds.get_samples(2)
    mine = [[{"index": s.index, "tokens": [1, 2, 3, 4], "response_length": 1, "reward": 0.5, "status": "aborted",
              "custom": object.__name__} for s in g] for g in drawn]
    ds.add_samples(mine)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"groups\[0\] has 1 samples"):
        ds.add_samples([mine[0][:1]])
    with pytest.raises(stowplan.InvalidArgumentError, match="rewards must be numbers"):
        ds.add_samples([[{"index": 0, "reward": "high"}, {"index": 1}]])
    assert ds.get_buffer_length() == 2
    back = ds.get_samples(3)
    assert back[:2] == mine, "buffered groups come first, as the objects that were added"
    assert isinstance(back[2][0], stowplan.Sample) and back[2][0].index == 4


KILLED = """
import json, os, signal, sys, stowplan
ds = stowplan.BufferedDataSource(sys.argv[1], n_samples_per_prompt=3, shuffle=True, seed=7)
ds.load(sys.argv[2]) if os.path.exists(sys.argv[2]) and sys.argv[3] == "resume" else None
if sys.argv[3] == "first":
    groups = ds.get_samples(5)
    ds.add_samples([[{"index": s.index, "reward": 1.0, "status": "aborted", "note": "partial"} for s in groups[1]]])
    ds.update_metadata({"step": 5})
    ds.save(sys.argv[2])
out = [[s["index"] if isinstance(s, dict) else s.index for s in g] for g in ds.get_samples(9)]
print(json.dumps({"next": out, "meta": ds.get_metadata()}), flush=True)
if sys.argv[3] == "first":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_save_kill_load_resumes_the_identical_sequence_across_processes(tmp_path: pathlib.Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(prompts, 6)
    state = tmp_path / "rollout" / "state_5.spds"
    first = subprocess.run([sys.executable, "-c", KILLED, str(prompts), str(state), "first"], capture_output=True, text=True)
    assert first.returncode == -signal.SIGKILL, first.stderr
    resumed = subprocess.run([sys.executable, "-c", KILLED, str(prompts), str(state), "resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    a, b = json.loads(first.stdout), json.loads(resumed.stdout)
    assert b == a, "the restarted process continues exactly where the killed one saved"
    assert a["next"][0] == [3, 4, 5], "the buffered group (kept in the state) comes first"
    assert a["meta"] == {"step": 5}


def test_loading_a_missing_damaged_or_foreign_state_raises(tmp_path: pathlib.Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 4)
    ds = stowplan.BufferedDataSource(prompts, n_samples_per_prompt=2)
    with pytest.raises(stowplan.StowplanIOError):
        ds.load(tmp_path / "nothing.spds")
    ds.save(tmp_path / "s.spds")
    data = bytearray((tmp_path / "s.spds").read_bytes())
    data[8] ^= 0xFF
    (tmp_path / "bad.spds").write_bytes(bytes(data))
    with pytest.raises(stowplan.CacheMismatchError, match="damaged"):
        ds.load(tmp_path / "bad.spds")
    other = stowplan.BufferedDataSource(prompts, n_samples_per_prompt=3)
    with pytest.raises(stowplan.CacheMismatchError, match="n_samples_per_prompt 2 vs 3"):
        other.load(tmp_path / "s.spds")


def test_slime_names(tmp_path: pathlib.Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 3)
    args = SimpleNamespace(prompt_data=str(prompts), n_samples_per_prompt=2, rollout_global_dataset=True,
                           rollout_shuffle=False, rollout_seed=1, input_key="prompt", label_key="label",
                           metadata_key=None, save=str(tmp_path / "ckpt"), load=str(tmp_path / "ckpt"))
    ds = RolloutDataSourceWithBuffer(args)
    groups = ds.get_samples(2)
    assert [g[0].label for g in groups] == ["0", "1"]
    ds.add_samples([groups[1]])
    with pytest.raises(AssertionError, match="must be equal to n_samples_per_prompt"):
        ds.add_samples([groups[0][:1]])
    ds.update_metadata({"a": 1})
    ds.save(3)
    assert (tmp_path / "ckpt" / "rollout" / "stowplan_data_source_3.spds").exists()
    again = RolloutDataSourceWithBuffer(args)
    again.load(3)
    assert again.get_buffer_length() == 1 and again.get_metadata() == {"a": 1}
    assert (again.epoch_id, again.sample_offset, again.sample_index) == (0, 2, 4)
    with pytest.raises(stowplan.StowplanIOError):
        again.load(99)
    with pytest.raises(RuntimeError, match="read-only"):
        RolloutDataSource(args).add_samples(groups)
    with pytest.raises(stowplan.InvalidArgumentError, match="sandboxed WebAssembly"):
        RolloutDataSource(SimpleNamespace(**{**vars(args), "buffer_filter_path": "my.filter"}))
