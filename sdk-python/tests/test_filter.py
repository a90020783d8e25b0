"""Buffer filters as sandboxed WebAssembly plugins, from Python: the example plugins
(Rust, committed in plugins/dist; Python, built here with componentize-py), the hostile
fixture against every bound, and a BufferedDataSource that keeps serving, with nothing lost,
after each failure."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest

import stowplan

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIST = ROOT / "plugins" / "dist"


def load(name, **kwargs):
    path = DIST / name
    return stowplan.Filter.load(path, sha256=stowplan.Filter.hash(path), **kwargs)


def hostile(mode, **kwargs):
    return load("hostile.wasm", config={"mode": mode}, **kwargs)


def scored_source(groups=6, k=4, filter=None):
    """A buffered data source whose buffer holds ``groups`` scored groups: group g has
    reward g (so top-reward serves the newest first)."""
    ds = stowplan.BufferedDataSource.from_records(
        [{"prompt": f"q{i}", "label": str(i)} for i in range(50)], n_samples_per_prompt=k, filter=filter
    )
    drawn = ds.get_samples(groups)
    for g, group in enumerate(drawn):
        for s in group:
            s.rewards = [float(g)]
            s.status = "completed"
    ds.add_samples(drawn)
    return ds, drawn


def indices(groups):
    return [[s.index for s in g] for g in groups]


def test_load_checks_the_pin_and_the_arguments():
    path = DIST / "pop_first.wasm"
    with pytest.raises(stowplan.FilterHashMismatchError, match=stowplan.Filter.hash(path)):
        stowplan.Filter.load(path, sha256="0" * 64)
    with pytest.raises(stowplan.InvalidArgumentError, match="sha256 must be 64 hex digits"):
        stowplan.Filter.load(path, sha256="abc")
    pin = stowplan.Filter.hash(path)
    for kwargs, fragment in [
        ({"timeout": 0}, "timeout must be in"),
        ({"timeout": "1"}, "timeout must be a number"),
        ({"fuel": 5}, "fuel must be"),
        ({"memory_limit": 10}, "memory_limit must be in 1 MiB"),
        ({"memory_limit": -1}, "memory_limit must be in"),
        ({"output_limit": 2**30}, "output_limit must be at most"),
        ({"on_failure": "ignore"}, "on_failure must be error or fallback"),
        ({"config": "{nope"}, "config must be JSON"),
        ({"config": {"x": object()}}, "config must be JSON-serializable"),
    ]:
        with pytest.raises(stowplan.InvalidArgumentError, match=fragment):
            stowplan.Filter.load(path, sha256=pin, **kwargs)
    with pytest.raises(stowplan.StowplanIOError):
        stowplan.Filter.load(DIST / "missing.wasm", sha256=pin)


def test_plugin_files_are_hashed_as_they_stream_within_a_cap(tmp_path):
    # /dev/zero once grew to 24 GiB and was OOM-killed; the cap stops the read.
    with pytest.raises(stowplan.InvalidArgumentError, match=r"larger than max_plugin_bytes \(1048576 bytes"):
        stowplan.Filter.hash("/dev/zero", max_plugin_bytes=1 << 20)
    with pytest.raises(stowplan.InvalidArgumentError, match="max_plugin_bytes"):
        stowplan.Filter.load("/dev/zero", sha256="0" * 64, max_plugin_bytes=1 << 20)
    blob = tmp_path / "blob.wasm"
    blob.write_bytes(bytes(range(256)) * 1000)
    import hashlib

    assert stowplan.Filter.hash(blob) == hashlib.sha256(blob.read_bytes()).hexdigest()
    assert stowplan._stowplan.MAX_PLUGIN_BYTES == 256 << 20
    with pytest.raises(stowplan.InvalidArgumentError, match="max_plugin_bytes"):
        stowplan.Filter.hash(blob, max_plugin_bytes=1000)


def test_a_file_that_is_not_a_filter_component_is_refused(tmp_path):
    junk = tmp_path / "junk.wasm"
    junk.write_bytes(b"\0asm not really")
    with pytest.raises(stowplan.FilterLoadError, match="junk.wasm"):
        stowplan.Filter.load(junk, sha256=stowplan.Filter.hash(junk))
    with pytest.raises(stowplan.InvalidArgumentError, match="filter must be a stowplan.Filter"):
        stowplan.BufferedDataSource.from_records([{"prompt": "q"}], n_samples_per_prompt=1, filter="top_reward.wasm")
    with pytest.raises(stowplan.InvalidArgumentError, match="no buffer to filter"):
        stowplan.DataSource.from_records([{"prompt": "q"}], n_samples_per_prompt=1, filter=load("pop_first.wasm"))


def test_top_reward_serves_the_best_groups_first():
    f = load("top_reward.wasm")
    assert f.name == "top_reward.wasm" and all(i.startswith(("wasi:", "stowplan:filter/")) for i in f.imports)
    ds, drawn = scored_source(filter=f)
    got = ds.get_samples(3)
    assert indices(got) == indices([drawn[5], drawn[4], drawn[3]])
    assert ds.get_buffer_length() == 3
    # min_reward leaves low groups in the buffer; the dataset fills the request.
    ds.filter = load("top_reward.wasm", config={"min_reward": 2})
    got = ds.get_samples(3)
    assert indices(got[:1]) == indices([drawn[2]])
    assert [g[0].prompt_index for g in got[1:]] == [6, 7]
    assert ds.get_buffer_length() == 2
    assert ds.filter.stats["calls"] == 1


def test_must_show_hostile_plugins_leave_the_data_source_serving_with_nothing_lost():
    ds, drawn = scored_source()
    before = ds.get_buffer_length()
    timeout = 0.1
    ds.filter = hostile("loop", timeout=timeout, fuel=None)
    started = time.monotonic()
    with pytest.raises(stowplan.FilterTimeoutError, match="ran past timeout"):
        ds.get_samples(3)
    # The loop never ends by itself; the 2x-deadline bound is tests/tests/plugins.rs's
    # (the same host code), not worth a flaky wall-clock check on a loaded machine here.
    assert time.monotonic() - started < 30
    assert ds.get_buffer_length() == before
    ds.filter = hostile("memory", memory_limit=32 * 2**20)
    with pytest.raises(stowplan.FilterMemoryLimitError, match="memory_limit = 33554432"):
        ds.get_samples(3)
    assert ds.get_buffer_length() == before
    for mode, error in [
        ("panic", stowplan.FilterTrapError),
        ("out-of-range", stowplan.FilterInvalidResultError),
        ("duplicate", stowplan.FilterInvalidResultError),
        ("too-many", stowplan.FilterInvalidResultError),
        ("probe", stowplan.FilterGuestError),
    ]:
        ds.filter = hostile(mode)
        with pytest.raises(error):
            ds.get_samples(3)
        assert ds.get_buffer_length() == before
    out_of_fuel = hostile("loop", fuel=10**7, timeout=60)
    with pytest.raises(stowplan.FilterOutOfFuelError):
        ds.filter = out_of_fuel
        ds.get_samples(1)
    # Every group is still there, in order, and the next draw continues the dataset.
    ds.filter = None
    got = ds.get_samples(len(drawn) + 1)
    assert indices(got[: len(drawn)]) == indices(drawn)
    assert got[-1][0].index == len(drawn) * 4


def test_fallback_serves_first_in_first_out():
    ds, drawn = scored_source(filter=hostile("loop", timeout=0.02, on_failure="fallback"))
    assert indices(ds.get_samples(2)) == indices(drawn[:2])
    assert ds.filter.stats["fallbacks"] == 1
    assert ds.get_buffer_length() == len(drawn) - 2


def test_output_is_captured_and_capped():
    f = hostile("huge-output", output_limit=1000)
    ds, drawn = scored_source(filter=f)
    assert indices(ds.get_samples(1)) == indices(drawn[:1])
    streams = dict(f.last_output)
    assert set(streams) == {"stdout", "stderr"}
    assert "more bytes dropped: output limit 1000" in streams["stdout"]


@pytest.fixture(scope="module")
def variance_plugin(tmp_path_factory):
    """The Python example plugin, built with componentize-py (a test dependency)."""
    if importlib.util.find_spec("componentize_py") is None:
        if os.environ.get("STOWPLAN_REQUIRE_COMPONENTIZE_PY"):
            pytest.fail("componentize-py is required here (pip install 'stowplan[test]')")
        pytest.skip("componentize-py is not installed")
    out = tmp_path_factory.mktemp("py-plugin") / "variance_filter.wasm"
    src = tmp_path_factory.mktemp("py-src")
    shutil.copy(ROOT / "plugins" / "python" / "variance_filter.py", src)
    tool = shutil.which("componentize-py", path=os.path.dirname(sys.executable)) or "componentize-py"
    subprocess.run(
        [tool, "-d", str(ROOT / "wit" / "filter"), "-w", "buffer-filter", "componentize", "variance_filter",
         "-p", str(src), "-o", str(out)],
        check=True,
        capture_output=True,
        cwd=src,
    )
    return out


def test_a_python_plugin_built_with_componentize_py(variance_plugin):
    f = stowplan.Filter.load(variance_plugin, sha256=stowplan.Filter.hash(variance_plugin), timeout=30)
    ds = stowplan.BufferedDataSource.from_records([{"prompt": f"q{i}"} for i in range(20)], n_samples_per_prompt=3, filter=f)
    drawn = ds.get_samples(5)
    # Groups 1 and 3 have disagreeing rewards; the others agree (or are unscored).
    rewards = {0: [1.0, 1.0, 1.0], 1: [0.0, 1.0, 1.0], 2: [0.0, 0.0, 0.0], 3: [0.5, 0.0, 1.0], 4: None}
    for g, group in enumerate(drawn):
        for j, s in enumerate(group):
            s.rewards = [] if rewards[g] is None else [rewards[g][j]]
    ds.add_samples(drawn)
    got = ds.get_samples(3)
    assert indices(got) == indices([drawn[1], drawn[3], drawn[0]])
    # Without fill, only the informative groups leave the buffer.
    ds.filter = stowplan.Filter.load(
        variance_plugin, sha256=stowplan.Filter.hash(variance_plugin), config={"fill": False}, timeout=30
    )
    ds.add_samples([drawn[1]])
    got = ds.get_samples(2)
    assert indices(got[:1]) == indices([drawn[1]]) and got[1][0].prompt_index == 5
    ds.filter = stowplan.Filter.load(
        variance_plugin, sha256=stowplan.Filter.hash(variance_plugin), config={"min_std": -1}, timeout=30
    )
    with pytest.raises(stowplan.FilterGuestError, match="min_std must be a number >= 0"):
        ds.get_samples(1)


def test_slime_compat_takes_a_sandboxed_filter():
    from types import SimpleNamespace

    from stowplan.compat.slime import RolloutDataSource, RolloutDataSourceWithBuffer

    args = SimpleNamespace(prompt_data=None, n_samples_per_prompt=2, rollout_global_dataset=False)
    ds = RolloutDataSourceWithBuffer(args, filter=load("top_reward.wasm"))
    groups = ds.get_samples(3)
    for g, group in enumerate(groups):
        for s in group:
            s.rewards = [float(g)]
    ds.add_samples(groups)
    assert indices(ds.get_samples(1)) == indices(groups[2:])
    with pytest.raises(stowplan.InvalidArgumentError, match="read-only"):
        RolloutDataSource(args, filter=load("top_reward.wasm"))
    with pytest.raises(stowplan.InvalidArgumentError, match="filter=stowplan.Filter.load"):
        RolloutDataSourceWithBuffer(SimpleNamespace(buffer_filter_path="my.filters.f", n_samples_per_prompt=2))


RAY_THEN_TRAP = """
import sys
sys.path.insert(0, sys.argv[1])
import ray
import stowplan
import test_filter as t

# The kernel's engine first: wasmtime installs its signal handlers then, and ray.init
# replaces them (the order of a trainer that plans, then starts Ray).
stowplan.partition([1, 2, 3], 2)
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
try:
    ds, drawn = t.scored_source()
    ds.filter = t.hostile("panic")
    try:
        ds.get_samples(3)
    except stowplan.FilterTrapError as e:
        print("trap-error:", type(e).__name__)
    ds.filter = None
    print("still-serving:", len(ds.get_samples(len(drawn))))
finally:
    ray.shutdown()
"""


@pytest.mark.xdist_group("ray")  # one worker starts Ray (run_tests.sh)
def test_a_trapping_plugin_fails_its_call_after_ray_took_the_signal_handlers():
    """Ray installs its own SIGSEGV/SIGILL handlers in ``ray.init``; plugin traps are explicit
    checks (no signal), so a trap stays a FilterTrapError instead of killing the process."""
    if os.environ.get("STOWPLAN_REQUIRE_RAY") != "1":
        pytest.importorskip("ray", reason="SKIPPED LOUDLY: ray is not installed; the trap-after-ray.init case is untested")
    out = subprocess.run(
        [sys.executable, "-c", RAY_THEN_TRAP, str(pathlib.Path(__file__).parent)],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-4000:])
    assert "trap-error: FilterTrapError" in out.stdout
    assert "still-serving: 6" in out.stdout
