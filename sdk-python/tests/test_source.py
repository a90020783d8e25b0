"""The rollout data source with a buffer from Python (the rollout buffer contract): groups and indices, the
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


def test_a_source_reads_a_file_or_records_and_refuses_a_mixup(tmp_path: pathlib.Path) -> None:
    """One native constructor takes a path or records: the same samples either way,
    ``identity`` for records only, a record that is not JSON named by its position."""
    from stowplan import _stowplan

    path = tmp_path / "prompts.jsonl"
    write_prompts(path, 3)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    from_file = stowplan.DataSource(path, n_samples_per_prompt=2).get_samples(3)
    from_records = stowplan.DataSource.from_records(records, n_samples_per_prompt=2, identity="mine")
    assert [(s.prompt, s.label) for g in from_file for s in g] == [(s.prompt, s.label) for g in from_records.get_samples(3) for s in g]
    assert from_records._native.identity == "mine"
    with pytest.raises(stowplan.InvalidArgumentError, match="identity names records"):
        stowplan.DataSource(path, n_samples_per_prompt=2, identity="mine")
    with pytest.raises(stowplan.InvalidArgumentError, match=r"records\[1\] is not JSON"):
        _stowplan.DataSource(['{"prompt": "a"}', "{"], 1)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"origin must be a path .* \(got int\)"):
        _stowplan.DataSource(7, 1)


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
    assert isinstance(back[2][0], stowplan.RolloutSample) and back[2][0].index == 4


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


class Opaque:
    """A sample type of the caller's (not plain JSON): it travels pickled."""

    def __init__(self, index: int, note: str) -> None:
        self.index, self.note = index, note

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Opaque) and (self.index, self.note) == (other.index, other.note)


class Payload:
    """Unpickling this creates ``marker``: a stand-in for code an attacker's pickle runs."""

    index = 0

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _records() -> list:
    return [{"prompt": f"p{i}"} for i in range(4)]


def test_plain_json_samples_round_trip_through_save_and_load_without_pickle(tmp_path, monkeypatch) -> None:
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("pickle was used")

    monkeypatch.setattr(pickle, "dumps", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    ds = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=2)
    drawn = ds.get_samples(1)[0]
    plain = [
        {"index": drawn[0].index, "tokens": [1, 2, 3], "reward": 0.5, "nested": {"a": [None, True, 2**70, -1.25, "é"]}},
        {"index": drawn[1].index, "status": "aborted", "empty": {}, "list": [[], [1.0, float("inf")]]},
    ]
    ds.add_samples([plain, drawn])  # plain JSON data, and stowplan.RolloutSample objects
    ds.save(tmp_path / "state.spds")
    again = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=2)
    again.load(tmp_path / "state.spds")
    back = again.get_samples(2)
    assert back[0] == plain and type(back[0][0]["nested"]["a"][2]) is int
    assert back[1] == drawn


def test_pickled_samples_are_refused_at_save_without_allow_pickle(tmp_path) -> None:
    ds = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=2)
    assert ds.allow_pickle is False
    ds.add_samples([[Opaque(0, "a"), Opaque(1, "b")]])
    path = tmp_path / "state.spds"
    with pytest.raises(stowplan.InvalidArgumentError, match=r"group 0, sample 0.*allow_pickle=True"):
        ds.save(path)
    assert not path.exists(), "nothing is written"
    ds.add_samples([[{"index": 2, "pair": (1, 2)}, {"index": 3}]])  # a tuple is not plain JSON (JSON gives a list)
    # In process the objects still come back; the buffer is unchanged by the refusal.
    back = ds.get_samples(2)
    assert back == [[Opaque(0, "a"), Opaque(1, "b")], [{"index": 2, "pair": (1, 2)}, {"index": 3}]]
    assert type(back[1][0]["pair"]) is tuple
    trusted = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=2, allow_pickle=True)
    trusted.add_samples([[Opaque(0, "a"), Opaque(1, "b")]])
    trusted.save(path)
    again = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=2, allow_pickle=True)
    again.load(path)
    assert again.get_samples(1) == [[Opaque(0, "a"), Opaque(1, "b")]]
    with pytest.raises(stowplan.InvalidArgumentError, match="allow_pickle must be True or False"):
        stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=2, allow_pickle="yes")


@pytest.mark.parametrize("tagged", [True, False], ids=["tagged", "untagged (an older state or a forged one)"])
def test_a_malicious_pickle_in_a_saved_state_is_not_run_on_load(tmp_path, tagged) -> None:
    import pickle

    marker = tmp_path / "pwned"
    path = tmp_path / "state.spds"
    writer = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=1, allow_pickle=True)
    if tagged:
        writer.add_samples([[Payload(marker)]])
        writer.save(path)
    else:  # the payload as the native layer stores it, without the SDK's tag
        sample = {"index": 0, "group": None, "prompt_index": 0, "prompt": '""', "label": None, "metadata": "{}",
                  "prompt_length": 0, "response_length": 0, "rewards": [], "status": "pending",
                  "payload": pickle.dumps(Payload(marker))}
        writer._native.add_samples([[sample]])
        writer._native.save(str(path))
    assert not marker.exists()

    victim = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=1)
    victim.update_metadata({"step": 1})
    first = victim.get_samples(1)
    before = (victim.epoch, victim.offset, victim.next_index, victim.get_buffer_length(), victim.get_metadata())
    with pytest.raises(stowplan.InvalidArgumentError, match=r"refusing to load .*pickled samples.*allow_pickle=True"):
        victim.load(path)
    assert not marker.exists(), "the pickle was not run"
    assert (victim.epoch, victim.offset, victim.next_index, victim.get_buffer_length(), victim.get_metadata()) == before
    assert [s.index for g in victim.get_samples(2) for s in g] == [first[0][0].index + 1, first[0][0].index + 2]
    assert not marker.exists()

    # The same file with the opt-in: the state loads, and the pickle runs when the sample is drawn.
    trusting = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=1, allow_pickle=True)
    trusting.load(path)
    trusting.get_samples(1)
    assert marker.exists(), "the payload is a real one"


def test_a_payload_of_no_known_encoding_is_refused_on_load(tmp_path) -> None:
    writer = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=1)
    sample = {"index": 0, "group": None, "prompt_index": 0, "prompt": '""', "label": None, "metadata": "{}",
              "prompt_length": 0, "response_length": 0, "rewards": [], "status": "pending", "payload": b"Zjunk"}
    writer._native.add_samples([[sample]])
    writer._native.save(str(tmp_path / "s.spds"))
    for allow in (False, True):
        reader = stowplan.BufferedDataSource.from_records(_records(), n_samples_per_prompt=1, allow_pickle=allow)
        with pytest.raises(stowplan.CacheMismatchError, match="no known encoding"):
            reader.load(tmp_path / "s.spds")
        assert reader.get_buffer_length() == 0


def test_slime_data_source_takes_allow_pickle(tmp_path: pathlib.Path) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 3)
    args = SimpleNamespace(prompt_data=str(prompts), n_samples_per_prompt=1, rollout_global_dataset=True,
                           save=str(tmp_path / "ckpt"), load=str(tmp_path / "ckpt"))
    ds = RolloutDataSourceWithBuffer(args)
    ds.add_samples([[Opaque(0, "slime's own Sample class travels pickled")]])
    with pytest.raises(stowplan.InvalidArgumentError, match="allow_pickle=True"):
        ds.save(1)
    trusted = RolloutDataSourceWithBuffer(args, allow_pickle=True)
    trusted.add_samples([[Opaque(0, "x")]])
    trusted.save(1)
    with pytest.raises(stowplan.InvalidArgumentError, match="refusing to load"):
        RolloutDataSourceWithBuffer(args).load(1)
    again = RolloutDataSourceWithBuffer(args, allow_pickle=True)
    again.load(1)
    assert again.get_samples(1) == [[Opaque(0, "x")]]


def test_a_sample_pickled_under_its_former_name_loads():
    import pickle

    sample = stowplan.RolloutSample(index=3, group=1, prompt_index=1, prompt="2+2?", rewards=[1.0])
    # A pickle written before the rename names stowplan._source.Sample.
    old = pickle.dumps(sample, protocol=0).replace(b"\nRolloutSample\n", b"\nSample\n")
    assert b"\nSample\n" in old
    assert pickle.loads(old) == sample
