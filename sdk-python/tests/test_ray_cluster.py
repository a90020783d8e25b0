"""stowplan.ray on a two-node Ray cluster on localhost: ``ray start --head``, then a second
``ray start --address`` with a resource of its own (``node2``); trainer ranks scheduled there
receive their batches from the packer actor on the head node through the object store.

Both nodes run as ``ray start --block`` children of this test, each in a session of its own,
and are stopped by signalling those sessions: ``ray stop`` would stop every Ray of the machine.
The driver is a subprocess too (see DRIVER).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

if os.environ.get("STOWPLAN_REQUIRE_RAY") == "1":
    import ray  # noqa: F401
else:
    ray = pytest.importorskip("ray", reason="SKIPPED LOUDLY: ray is not installed (pip install 'stowplan[ray]'); stowplan.ray is untested")

# One xdist worker runs every test that starts Ray (run_tests.sh: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray")

START_TIMEOUT = 90  # seconds for both nodes to join
# The nodes and the driver without token authentication (a local test cluster).
ENV = dict(os.environ, RAY_AUTH_MODE="disabled")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args, env, log):
    return subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address", "127.0.0.1",
         "--num-cpus", "1", "--object-store-memory", str(200 * 2**20), "--disable-usage-stats", *args],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )


def _stop(procs, timeout=3):
    """Stops ``ray start --block`` children and the Ray processes each started (its session):
    SIGTERM to all at once, then SIGKILL to what is left after ``timeout`` seconds. A node
    given the time stopped within a second or took its whole 10 s grace period, which only
    delayed the teardown: the test's temporary directory goes with it."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # --block stops its node's processes on SIGTERM
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever of the session is left
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def two_nodes():
    """The head's address once both nodes joined; both stopped afterwards."""
    # A short directory: Ray's socket paths must stay under the 107-byte limit of AF_UNIX.
    tmp = tempfile.mkdtemp(prefix="spray", dir="/tmp")
    port = _free_port()
    log = open(os.path.join(tmp, "nodes.log"), "w")
    procs = [_ray_start(["--head", "--port", str(port), "--temp-dir", tmp, "--include-dashboard", "false"], ENV, log)]
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # the head's GCS listens
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert procs[0].poll() is None and time.monotonic() < deadline, open(log.name).read()[-3000:]
            time.sleep(0.2)
        procs.append(_ray_start(["--address", f"127.0.0.1:{port}", "--resources", '{"node2": 1}'], ENV, log))
        yield f"127.0.0.1:{port}", deadline
    finally:
        _stop(procs)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


# The driver runs in a process of its own: in a process that already ran a local Ray
# (test_ray.py's) and then connects to this cluster, the first actor is cancelled at creation
# (Ray 2.60; the head's GCS logs the driver's worker, job 01000000, as failed). A fresh process
# does not hit it.
DRIVER = r"""
import json, sys, time
import numpy as np
import ray, stowplan, stowplan.ray as sray

address, deadline = sys.argv[1], float(sys.argv[2])
ray.init(address=address, log_to_driver=False, configure_logging=False)
while len([n for n in ray.nodes() if n["Alive"]]) < 2:  # the second node joins
    assert time.time() < deadline, "the second node did not join"
    time.sleep(0.2)
nodes = [n for n in ray.nodes() if n["Alive"]]
second = [n["NodeID"] for n in nodes if n["Resources"].get("node2")]
head = [n["NodeID"] for n in nodes if not n["Resources"].get("node2")]
assert len(nodes) == 2 and len(second) == 1 and len(head) == 1, nodes

class Rank:
    def __init__(self, packer, rank):
        self.rx = sray.RayReceiver(packer, rank, timeout=60)
    def node(self):
        return ray.get_runtime_context().get_node_id()
    def train(self):
        b = self.rx.receive()
        keys = []
        for mb in b.micro_batches:
            if not mb.dummy:
                assert isinstance(mb.input_ids, np.ndarray) and not mb.input_ids.flags.writeable
                keys += [(int(b.sample_runs[s]), int(b.sample_steps[s]), int(b.sample_indices[s])) for s in mb.samples.tolist()]
        return b.step, keys

class Packer(sray.PackerActor):
    def node(self):
        return ray.get_runtime_context().get_node_id()

on_head = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(head[0], soft=False)
packer = ray.remote(num_cpus=0, scheduling_strategy=on_head)(Packer).remote(capacity=64, dp=2, num_runs=1, threshold=1)
ray.get(packer.add_run.remote(0, batch_size=6), timeout=60)
ranks = [ray.remote(num_cpus=0, resources={"node2": 0.5})(Rank).remote(packer, r) for r in range(2)]
out = {"head": head[0], "second": second[0], "rank_nodes": ray.get([r.node.remote() for r in ranks], timeout=60),
       "packer_node": ray.get(packer.node.remote(), timeout=60),
       "steps": [], "keys": []}
for step in range(3):
    batch = stowplan.TrainingBatch(run=0, step=step, samples=[
        {"prompt_ids": [1, 2, 3], "completion_ids": list(range(4, 5 + i % 5)), "advantage": float(i)} for i in range(6)])
    assert ray.get(packer.send.remote(ray.put(batch.encode())), timeout=30).accepted == 6
    got = ray.get([r.train.remote() for r in ranks], timeout=60)
    out["steps"].append([s for s, _ in got])
    out["keys"] += [k for _, ks in got for k in ks]
ray.shutdown()
print(json.dumps(out))
"""


def test_ranks_on_the_second_node_receive_their_batches(two_nodes):
    address, deadline = two_nodes
    run = subprocess.run(
        [sys.executable, "-c", DRIVER, address, str(time.time() + max(deadline - time.monotonic(), 1))],
        env=ENV, capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["second"] != out["head"]
    assert out["packer_node"] == out["head"]
    assert out["rank_nodes"] == [out["second"]] * 2  # the ranks run on the second node
    assert out["steps"] == [[0, 0], [1, 1], [2, 2]]
    assert sorted(map(tuple, out["keys"])) == [(0, s, i) for s in range(3) for i in range(6)]  # every sample once
