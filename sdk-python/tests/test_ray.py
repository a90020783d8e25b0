"""stowplan.ray: the packer as a Ray actor, ranks fed through the object store, lengths on Ray
Data. A local Ray (2 CPUs) is started once for the module and shut down at its end."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import tempfile
import threading
import time

import numpy as np
import pytest

import stowplan

if os.environ.get("STOWPLAN_REQUIRE_RAY") == "1":
    import ray  # noqa: F401  (an ImportError fails the run: run_tests.sh installs ray)
else:
    ray = pytest.importorskip("ray", reason="SKIPPED LOUDLY: ray is not installed (pip install 'stowplan[ray]'); stowplan.ray is untested")
import ray.data  # noqa: E402

import stowplan.ray as sray  # noqa: E402

# Ray's own DataContext() constructor sets its deprecated fields (Ray 2.60: use_push_based_shuffle,
# use_polars …), warning from ray.data.context itself; nothing of ours.
# One xdist worker runs every test that starts Ray (run_tests.sh: --dist loadgroup).
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:ray.data.context"), pytest.mark.xdist_group("ray")]

GUIDE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "packer-runtime.md"


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield
    ray.shutdown()


Actor = None


def _actor(**options):
    global Actor
    if Actor is None:
        Actor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(sray.PackerActor)
    return Actor.remote(**options)


@contextlib.contextmanager
def _checkpoint_dir():
    """A temporary directory whose removal does not fail on a file that an actor which
    ray.kill is still stopping (it does not wait) writes meanwhile."""
    path = tempfile.mkdtemp()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _batch(run, step, n=4, offset=0):
    rng = np.random.default_rng(step * 100 + run)
    return stowplan.TrainingBatch(
        run=run,
        step=step,
        samples=[
            {
                "prompt_ids": rng.integers(1, 100, size=int(rng.integers(1, 6))),
                "completion_ids": rng.integers(1, 100, size=int(rng.integers(1, 6))),
                "advantage": float(i),
            }
            for i in range(n)
        ],
    )


def _keys(batch):
    """The (run, step, index) of every sample this rank trains on."""
    out = []
    for mb in batch.micro_batches:
        if mb.dummy:
            continue
        for s in mb.samples.tolist():
            out.append((int(batch.sample_runs[s]), int(batch.sample_steps[s]), int(batch.sample_indices[s])))
    return out


OPTIONS = dict(capacity=64, dp=2, num_runs=1, threshold=1)


def test_every_sample_is_delivered_once_across_ranks():
    actor = _actor(**OPTIONS)
    ray.get(actor.add_run.remote(0, batch_size=4))
    receivers = [sray.RayReceiver(actor, r, timeout=20) for r in range(2)]
    seen = []
    for step in range(4):
        # put_batch's numpy array (read in place by the actor) and a plain bytes object
        ref = sray.put_batch(_batch(0, step)) if step % 2 == 0 else ray.put(_batch(0, step).encode())
        report = ray.get(actor.send.remote(ref))
        assert report.accepted == 4 and not report.duplicate
        for rx in receivers:
            b = rx.receive()
            assert (b.step, b.rank, b.dp) == (step, rx.rank, 2)
            mb = b.micro_batches[0]
            assert isinstance(mb.input_ids, np.ndarray) and not mb.input_ids.flags.writeable  # the object store's
            seen += _keys(b)
    assert sorted(seen) == [(0, s, i) for s in range(4) for i in range(4)]
    assert ray.get(actor.next_step.remote()) == 4
    ray.kill(actor)


def test_duplicates_are_detected():
    actor = _actor(**OPTIONS)
    ray.get(actor.add_run.remote(0, batch_size=4))
    assert not ray.get(actor.send.remote(_batch(0, 0))).duplicate
    again = ray.get(actor.send.remote(_batch(0, 0).encode()))
    assert again.duplicate and again.accepted == 0
    assert ray.get(actor.progress.remote(0))["duplicate_batches"] == 1
    ray.kill(actor)


def test_a_killed_actor_resumes_from_its_checkpoint():
    with _checkpoint_dir() as ckpt:
        actor = _actor(**OPTIONS, checkpoint_dir=ckpt)
        ray.get(actor.add_run.remote(0, batch_size=4))
        rx = [sray.RayReceiver(actor, r, timeout=25) for r in range(2)]
        seen = []
        ray.get(actor.send.remote(_batch(0, 0)))
        seen += _keys(rx[0].receive()) + _keys(rx[1].receive())  # packer step 0, delivered
        ray.get(actor.send.remote(_batch(0, 1)))
        seen += _keys(rx[0].receive())  # packer step 1: rank 0 has it, rank 1 not yet
        ray.get(actor.send.remote(_batch(0, 2)))  # accepted, pending: in the checkpoint
        assert not ray.get(actor.was_restored.remote())
        ray.kill(actor, no_restart=False)
        seen += _keys(rx[1].receive())  # step 1, once: from the restarted actor, or the old one
        # ray.kill returns before the actor is gone: under load the old actor may still answer
        # the call above, so wait for its successor, which must come from the checkpoint.
        deadline = time.monotonic() + 30
        while not ray.get(actor.was_restored.remote(), timeout=max(0.1, deadline - time.monotonic())):
            assert time.monotonic() < deadline, "the killed actor was not restarted from its checkpoint"
            time.sleep(0.05)
        # The orchestrator resends what it is unsure of: step 2 was checkpointed, so a duplicate.
        assert ray.get(actor.send.remote(_batch(0, 2))).duplicate
        assert not ray.get(actor.send.remote(_batch(0, 3))).duplicate
        seen += _keys(rx[0].receive()) + _keys(rx[1].receive())  # packer step 2: batches 2 and 3
        assert sorted(seen) == [(0, s, i) for s in range(4) for i in range(4)]
        for r in rx:
            r.flush()  # the last acknowledgements written before the directory goes
        ray.kill(actor)


def test_a_batch_file_that_cannot_be_written_is_not_taken(monkeypatch):
    """The batch file is written while the step is packed; if it fails, the actor goes back to
    its checkpoint (no receipt, no step published) and the batch sent again is taken."""
    with tempfile.TemporaryDirectory() as ckpt:
        packer = sray.PackerActor(**OPTIONS, checkpoint_dir=ckpt)  # the plain class, in this process
        packer.add_run(0, batch_size=4)
        real = sray._stowplan.write_atomic

        def failing(path, data):
            if os.path.basename(os.path.dirname(path)) == "batches":
                raise stowplan.StowplanIOError(f"{path}: no space left on device")
            real(path, data)

        monkeypatch.setattr(sray._stowplan, "write_atomic", failing)
        with pytest.raises(stowplan.StowplanIOError, match="no space left"):
            packer.send(_batch(0, 0))
        assert packer.pending() == (0, 0) and packer.take(0, 0) is None  # nothing taken, nothing packed
        assert os.listdir(os.path.join(ckpt, "batches")) == []
        monkeypatch.setattr(sray._stowplan, "write_atomic", real)
        report = packer.send(_batch(0, 0))
        assert report.accepted == 4 and not report.duplicate
        keys = _keys(ray.get(packer.take(0, 0))) + _keys(ray.get(packer.take(1, 0)))
        assert sorted(keys) == [(0, 0, i) for i in range(4)]
        packer.close()  # a directory has one owner at a time
        assert sray.PackerActor(**OPTIONS, checkpoint_dir=ckpt).was_restored()  # and on disk


def test_a_failed_publication_or_state_write_loses_nothing(monkeypatch):
    with tempfile.TemporaryDirectory() as ckpt:
        packer = sray.PackerActor(**OPTIONS, checkpoint_dir=ckpt)
        real_save = sray.PackerActor._save

        def failing_save(self):
            raise stowplan.StowplanIOError("disk full")

        # A run added in memory whose state cannot be written is undone: added again, not a no-op.
        monkeypatch.setattr(sray.PackerActor, "_save", failing_save)
        with pytest.raises(stowplan.StowplanIOError, match="disk full"):
            packer.add_run(0, batch_size=4)
        assert packer._packer.runs() == []
        monkeypatch.setattr(sray.PackerActor, "_save", real_save)
        packer.add_run(0, batch_size=4)

        # A publication that fails inside send (once the batch file is written) goes back to the
        # checkpoint, which finds the batch in the spool and takes it again (as stowplan serve
        # does with a batch spooled after its checkpoint): the batch sent again is a duplicate,
        # and its samples are delivered once.
        real_of = sray.RayRankBatch.of
        full = classmethod(lambda cls, b: (_ for _ in ()).throw(MemoryError("object store full")))
        monkeypatch.setattr(sray.RayRankBatch, "of", full)
        with pytest.raises(MemoryError, match="object store full"):
            packer.send(_batch(0, 0))
        monkeypatch.setattr(sray.RayRankBatch, "of", real_of)
        assert packer.pending()[0] == 4  # back to the checkpoint, the spooled batch taken from the spool
        assert packer.send(_batch(0, 0)).duplicate
        keys = _keys(ray.get(packer.take(0, 0))) + _keys(ray.get(packer.take(1, 0)))
        assert sorted(keys) == [(0, 0, i) for i in range(4)]
        # One that fails after the state is saved (pack, or take packing after wait_timeout)
        # leaves the step durable: the first rank that asks gets it published again.
        assert packer.send(_batch(0, 1)).accepted == 4  # pending: step 0 is in flight
        assert not packer.ack(0, 0) and packer.ack(1, 0)  # step 0 delivered; ack() does not pack
        monkeypatch.setattr(sray.RayRankBatch, "of", full)
        with pytest.raises(MemoryError, match="object store full"):
            packer.pack()
        with pytest.warns(RuntimeWarning, match="publishing a packer step failed .*object store full"):
            assert packer.take(0, 1) is None  # still full: the rank asks again
        monkeypatch.setattr(sray.RayRankBatch, "of", real_of)
        # A batch sent meanwhile is taken and waits: the unpublished step is published first.
        report = packer.send(_batch(0, 2))
        assert report.accepted == 4 and not report.duplicate and packer.pending()[0] == 4
        keys = _keys(ray.get(packer.take(0, 1))) + _keys(ray.get(packer.take(1, 1)))
        assert sorted(keys) == [(0, 1, i) for i in range(4)]

        # Going back to the checkpoint fails too: the actor refuses every call until restarted.
        monkeypatch.setattr(sray._stowplan, "write_atomic", lambda path, data: (_ for _ in ()).throw(stowplan.StowplanIOError("disk gone")))
        monkeypatch.setattr(sray.PackerActor, "_load", lambda self: (_ for _ in ()).throw(stowplan.StowplanIOError("unreadable")))
        with pytest.raises(stowplan.StowplanIOError, match="disk gone"):
            packer.send(_batch(0, 3))
        for call in (lambda: packer.send(_batch(0, 3)), lambda: packer.take(0, 1), lambda: packer.ack(0, 1), packer.pending):
            with pytest.raises(stowplan.StowplanIOError, match="could not go back to its checkpoint .*unreadable.*restart it"):
                call()
        monkeypatch.undo()
        packer.close()  # what the old actor's death does: it lets go of the directory
        again = sray.PackerActor(**OPTIONS, checkpoint_dir=ckpt)  # what Ray's restart does
        assert again.was_restored() and again.next_step() == 1 and again.pending()[0] == 4  # batch 2
        assert again.send(_batch(0, 2)).duplicate and not again.send(_batch(0, 3)).duplicate


def _pending_actor(ckpt, steps=3):
    """A plain actor (in this process) on ``ckpt`` holding ``steps`` batches of 4 samples
    pending (nothing packed: the threshold is out of reach)."""
    packer = sray.PackerActor(capacity=64, dp=2, num_runs=1, threshold=10**6, checkpoint_dir=ckpt)
    packer.add_run(0, batch_size=4)
    for step in range(steps):
        assert packer.send(_batch(0, step)).accepted == 4
    return packer


def _drain(packer):
    """Every sample key the actor delivers from now on (both ranks take and acknowledge each
    step; pending samples are packed by force)."""
    keys = []
    while True:
        step = packer.next_step()
        first = packer.take(0, step)
        if first is None:
            if packer.pack(force=True) is None:
                return keys
            continue
        keys += _keys(ray.get(first)) + _keys(ray.get(packer.take(1, step)))
        packer.ack(0, step)
        packer.ack(1, step)


def _spool(ckpt):
    return sorted(os.listdir(os.path.join(ckpt, "batches")))


def test_a_lost_state_file_is_refused_and_the_spool_kept():
    """The state is deleted beside 3 spooled batches (12 samples pending): a new actor refuses
    to start, naming the file, and deletes nothing; with the file back, every sample is
    delivered once."""
    with tempfile.TemporaryDirectory() as ckpt:
        packer = _pending_actor(ckpt)
        packer.close()
        state = os.path.join(ckpt, "packer_state.bin")
        saved = pathlib.Path(state).read_bytes()
        os.unlink(state)
        spool = _spool(ckpt)
        assert spool == [f"run_0_step_{s}.bin" for s in range(3)]
        for _ in range(2):
            with pytest.raises(stowplan.CacheMismatchError, match=r"packer_state\.bin is missing but .*batches holds 3 spooled batch"):
                sray.PackerActor(capacity=64, dp=2, num_runs=1, threshold=10**6, checkpoint_dir=ckpt)
            assert _spool(ckpt) == spool  # nothing deleted
        with open(state, "wb") as f:
            f.write(saved)
        again = sray.PackerActor(capacity=64, dp=2, num_runs=1, threshold=10**6, checkpoint_dir=ckpt)
        assert again.was_restored() and again.pending()[0] == 12
        assert sorted(_drain(again)) == [(0, s, i) for s in range(3) for i in range(4)]
        assert _spool(ckpt) == []  # delivered: their files go


def test_a_lost_state_file_is_refused_by_a_restarted_ray_actor():
    with _checkpoint_dir() as ckpt:
        actor = _actor(capacity=64, dp=2, num_runs=1, threshold=10**6, checkpoint_dir=ckpt)
        ray.get(actor.add_run.remote(0, batch_size=4))
        for step in range(3):
            ray.get(actor.send.remote(_batch(0, step)))
        ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + 30
        while True:  # ray.kill does not wait: the old actor lets go of the directory when it is gone
            os.unlink(os.path.join(ckpt, "packer_state.bin")) if os.path.exists(os.path.join(ckpt, "packer_state.bin")) else None
            fresh = _actor(capacity=64, dp=2, num_runs=1, threshold=10**6, checkpoint_dir=ckpt)
            try:
                ray.get(fresh.pending.remote())
            except ray.exceptions.RayActorError as e:
                if "another stowplan packer" in str(e) and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                assert "CacheMismatchError" in str(e) and "packer_state.bin is missing" in str(e), str(e)[-2000:]
                break
            raise AssertionError("a new actor started fresh beside 3 spooled batches")
        assert _spool(ckpt) == [f"run_0_step_{s}.bin" for s in range(3)]


def test_two_actors_on_one_checkpoint_dir_the_second_is_refused():
    with tempfile.TemporaryDirectory() as ckpt:
        first = _pending_actor(ckpt, steps=2)
        for wait in (0, 0.3):
            with pytest.raises(stowplan.StowplanIOError, match=r"another stowplan packer uses this checkpoint directory, held by stowplan\.ray\.PackerActor, pid %d on " % os.getpid()):
                sray.PackerActor(capacity=64, dp=2, num_runs=1, threshold=10**6, checkpoint_dir=ckpt, lock_wait=wait)
        with pytest.raises(stowplan.InvalidArgumentError, match="lock_wait must be a number of seconds"):
            sray.PackerActor(capacity=64, dp=2, num_runs=1, checkpoint_dir=ckpt, lock_wait=-1)
        assert first.send(_batch(0, 2)).accepted == 4  # the first keeps working, its files intact
        assert _spool(ckpt) == [f"run_0_step_{s}.bin" for s in range(3)]
        # A second owner waits up to lock_wait for the first to let go (a restart whose
        # predecessor is still dying), then takes the directory as it was left.
        closer = threading.Timer(0.3, first.close)
        closer.start()
        second = sray.PackerActor(capacity=64, dp=2, num_runs=1, threshold=10**6, checkpoint_dir=ckpt, lock_wait=30)
        closer.join()
        assert second.was_restored()
        assert sorted(_drain(second)) == [(0, s, i) for s in range(3) for i in range(4)]
        with pytest.raises(stowplan.StowplanIOError, match="was closed"):
            first.pending()


def _forge(ckpt, change):
    """Rewrites the actor's checkpoint through ``change(acked, state) -> (acked, state)``,
    framed and checksummed as the actor writes it (so only the field is wrong)."""
    import struct
    import zlib

    path = os.path.join(ckpt, "packer_state.bin")
    data = pathlib.Path(path).read_bytes()
    assert data[:4] == b"SPAC" and struct.unpack("<H", data[4:6])[0] == 1
    body = data[6:-4]

    def varint(b, i):
        n = shift = 0
        while True:
            n |= (b[i] & 0x7F) << shift
            i += 1
            if b[i - 1] < 0x80:
                return n, i
            shift += 7

    def enc(n):
        out = bytearray()
        while True:
            out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
            n >>= 7
            if not n:
                return bytes(out)

    n, i = varint(body, 0)
    state, rest = body[i : i + n], body[i + n :]
    count, j = varint(rest, 0)
    acked = []
    for _ in range(count):
        r, j = varint(rest, j)
        acked.append(r)
    acked, state = change(acked, state)
    new = data[:6] + enc(len(state)) + state + enc(len(acked)) + b"".join(enc(r) for r in acked)
    with open(path, "wb") as f:
        f.write(new + struct.pack("<I", zlib.crc32(new)))


def test_damaged_or_forged_checkpoint_fields_are_refused_naming_the_file():
    with tempfile.TemporaryDirectory() as ckpt:
        packer = sray.PackerActor(**OPTIONS, checkpoint_dir=ckpt)
        packer.add_run(0, batch_size=4)
        packer.send(_batch(0, 0))  # packed: step 0 in flight
        packer.send(_batch(0, 1))  # pending
        rank0 = _keys(ray.get(packer.take(0, 0)))
        assert not packer.ack(0, 0)  # rank 0 acknowledged step 0, rank 1 not yet
        for bad in (-1, True, 1.5, "0"):
            with pytest.raises(stowplan.InvalidArgumentError, match=r"step must be an integer >= 0"):
                packer.ack(1, bad)
        packer.close()
        path = os.path.join(ckpt, "packer_state.bin")
        good = pathlib.Path(path).read_bytes()
        spool = _spool(ckpt)
        open_ = lambda: sray.PackerActor(**OPTIONS, checkpoint_dir=ckpt)  # noqa: E731
        cases = {
            "acked: rank 7 out of range 0..2": lambda a, s: ([0, 7], s),
            r"acked: ranks \[1, 0\] must be ascending and distinct": lambda a, s: ([1, 0], s),
            r"acked: ranks \[0, 0\] must be ascending and distinct": lambda a, s: ([0, 0], s),
            "acked: all 2 ranks acknowledged the step in flight": lambda a, s: ([0, 1], s),
            "state: .*damaged packer state": lambda a, s: (a, s[:-1] + bytes([s[-1] ^ 1])),
            "state: .*packer state format version 99": lambda a, s: (a, s[:4] + b"\x63\x00" + s[6:]),
        }
        for message, change in cases.items():
            with open(path, "wb") as f:
                f.write(good)
            _forge(ckpt, change)
            with pytest.raises(stowplan.CacheMismatchError, match=re.escape(path) + ": " + message):
                open_()
        # The frame itself: another version, a flipped bit, a truncation, the old format.
        for data, message in (
            (good[:4] + b"\x63\x00" + good[6:], "packer checkpoint format version 99"),
            (good[:20] + bytes([good[20] ^ 4]) + good[21:], "damaged packer checkpoint"),
            (good[: len(good) // 2], "damaged packer checkpoint|corrupt"),
            (b"SPRAYCK1" + good, "an earlier stowplan .format SPRAYCK1"),
            (b"", "truncated packer checkpoint|not an encoded stowplan packer checkpoint"),
        ):
            with open(path, "wb") as f:
                f.write(data)
            with pytest.raises(stowplan.CacheMismatchError, match=message):
                open_()
        # A batch file the state needs: deleted, renamed, damaged, another batch's.
        with open(path, "wb") as f:
            f.write(good)
        batch0 = os.path.join(ckpt, "batches", "run_0_step_0.bin")
        saved = pathlib.Path(batch0).read_bytes()
        os.rename(batch0, batch0 + ".moved")
        with pytest.raises(stowplan.CacheMismatchError, match=re.escape(batch0) + r": a spooled batch the checkpoint needs \(run 0 step 0\) is missing"):
            open_()
        os.rename(batch0 + ".moved", batch0)
        with open(batch0, "wb") as f:
            f.write(saved[:-1] + bytes([saved[-1] ^ 1]))
        with pytest.raises(stowplan.CacheMismatchError, match=re.escape(batch0) + ": .*damaged training batch"):
            open_()
        with open(batch0, "wb") as f:
            f.write(pathlib.Path(os.path.join(ckpt, "batches", "run_0_step_1.bin")).read_bytes())
        with pytest.raises(stowplan.CacheMismatchError, match=re.escape(batch0) + ": holds batch run 0 step 1"):
            open_()
        # Not a regular file (a FIFO blocked the read for ever; a symlink to /dev/zero filled
        # memory): refused naming it, for the batch and for the state.
        os.unlink(batch0)
        os.symlink("/dev/zero", batch0)
        with pytest.raises(stowplan.CacheMismatchError, match=re.escape(batch0) + ": not a regular file"):
            open_()
        os.unlink(batch0)
        os.mkfifo(batch0)
        with pytest.raises(stowplan.CacheMismatchError, match=re.escape(batch0) + ": not a regular file"):
            open_()
        os.unlink(batch0)
        with open(batch0, "wb") as f:
            f.write(saved)
        os.rename(path, path + ".saved")
        os.mkfifo(path)
        with pytest.raises(stowplan.CacheMismatchError, match=re.escape(path) + ": not a regular file"):
            open_()
        os.unlink(path)
        os.rename(path + ".saved", path)
        assert _spool(ckpt) == spool  # every refusal deleted nothing
        again = open_()  # all mended: nothing lost, nothing twice
        assert again.was_restored() and again.pending()[0] == 4
        assert again.take(0, 0) is not None  # step 0 rebuilt; rank 0's acknowledgement kept
        rank1 = _keys(ray.get(again.take(1, 0)))
        assert again.ack(1, 0)  # completes step 0: rank 0 is not asked again
        assert sorted(rank0 + rank1 + _drain(again)) == [(0, s, i) for s in range(2) for i in range(4)]


def test_asking_for_the_next_step_acknowledges_the_one_in_flight():
    actor = _actor(**OPTIONS)
    ray.get(actor.add_run.remote(0, batch_size=4))
    ray.get(actor.send.remote(_batch(0, 0)))
    assert ray.get(actor.take.remote(0, 0)) is not None and ray.get(actor.take.remote(1, 0)) is not None
    assert ray.get(actor.take.remote(0, 1)) is None  # rank 0 holds step 0: acknowledged by asking
    assert ray.get(actor.next_step.remote()) == 0  # rank 1 has not
    with pytest.raises(stowplan.InvalidArgumentError, match="rank 1 asks for step 2 while step 0 is in flight"):
        try:
            ray.get(actor.take.remote(1, 2))  # more than one step ahead: refused, not skipped
        except ray.exceptions.RayTaskError as e:
            raise e.cause
    assert ray.get(actor.take.remote(1, 1)) is None  # a rank started one past the step holds it
    assert ray.get(actor.next_step.remote()) == 1 and not ray.get(actor.ack.remote(1, 0))  # delivered
    rx = sray.RayReceiver(actor, 0, start_step=1, timeout=20)
    ray.get(actor.send.remote(_batch(0, 1)))
    assert rx.receive().step == 1
    rx.flush()  # rank 0's acknowledgement arrived: rank 1's completes the step
    assert ray.get(actor.take.remote(1, 1)) is not None and ray.get(actor.ack.remote(1, 1))
    assert ray.get(actor.next_step.remote()) == 2
    ray.kill(actor)


def _rank_worker_class():
    """A trainer rank as a Ray actor that Ray restarts once (nested: pickled by value, tests/
    is not importable on the workers). It trains on each step it receives and then appends the
    step's sample keys to its log, its own checkpoint: a restarted rank resumes at the step
    after the last one logged. With ``hold``, it writes ``hold + ".got"`` once it holds the
    step (fetched and acknowledged) and waits for ``hold`` before logging: it dies there."""

    class Rank:
        def __init__(self, packer, rank, log):
            self.log = log
            steps = [json.loads(line)["step"] for line in pathlib.Path(log).read_text().splitlines()] if os.path.exists(log) else []
            self.rx = sray.RayReceiver(packer, rank, start_step=steps[-1] + 1 if steps else 0, timeout=30)

        def pid(self):
            return os.getpid(), self.rx.next_step

        def train(self, hold=None, waiting=None):
            if waiting is not None:
                open(waiting, "w").close()
            batch = self.rx.receive()
            if hold is not None:
                open(hold + ".got", "w").close()
                while not os.path.exists(hold):
                    time.sleep(0.01)
            keys = []
            for mb in batch.micro_batches:
                if not mb.dummy:
                    keys += [[int(batch.sample_runs[s]), int(batch.sample_steps[s]), int(batch.sample_indices[s])] for s in mb.samples.tolist()]
            with open(self.log, "a") as f:
                f.write(json.dumps({"step": batch.step, "keys": keys}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            return batch.step

    return ray.remote(num_cpus=0, max_restarts=1, max_task_retries=0)(Rank)


def _wait_for(path, timeout=20):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.01)


def _kill_worker(rank_actor, pid, in_flight):
    """SIGKILLs the actor's worker process ``pid`` while ``in_flight`` runs; returns the step
    the restarted actor resumes at."""
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(in_flight, timeout=20)
    deadline = time.monotonic() + 30
    while True:
        try:
            new_pid, next_step = ray.get(rank_actor.pid.remote(), timeout=30)
            break
        except ray.exceptions.ActorUnavailableError:  # a call made while Ray restarts it
            assert time.monotonic() < deadline, "the rank's actor was not restarted within 30 s"
            time.sleep(0.1)
    assert new_pid != pid
    return next_step


def test_a_rank_worker_killed_mid_step_loses_and_repeats_nothing():
    actor = _actor(**OPTIONS)
    ray.get(actor.add_run.remote(0, batch_size=4))
    Rank = _rank_worker_class()
    with tempfile.TemporaryDirectory() as tmp:
        logs = [os.path.join(tmp, f"rank{r}.jsonl") for r in range(2)]
        ranks = [Rank.remote(actor, r, logs[r]) for r in range(2)]
        assert ray.get(actor.send.remote(_batch(0, 0))).accepted == 4
        assert ray.get([rk.train.remote() for rk in ranks], timeout=30) == [0, 0]

        # Step 1: rank 1 holds it (fetched, acknowledged) and dies before training on it; rank 0
        # has not taken it, so the step is still in flight and the restarted rank 1 gets it again.
        ray.get(actor.send.remote(_batch(0, 1)))
        hold = os.path.join(tmp, "hold1")
        pid, _ = ray.get(ranks[1].pid.remote(), timeout=20)  # an actor runs one call at a time: ask first
        dying = ranks[1].train.remote(hold=hold)
        _wait_for(hold + ".got")
        assert _kill_worker(ranks[1], pid, dying) == 1  # resumes at the step after its log's last
        assert ray.get(ranks[1].train.remote(), timeout=30) == 1
        assert ray.get(ranks[0].train.remote(), timeout=30) == 1

        # Step 2: rank 0 dies while it waits for a step not packed yet.
        waiting = os.path.join(tmp, "waiting2")
        pid, _ = ray.get(ranks[0].pid.remote(), timeout=20)
        dying = ranks[0].train.remote(waiting=waiting)
        _wait_for(waiting)
        time.sleep(0.2)  # inside receive(), polling the actor
        assert _kill_worker(ranks[0], pid, dying) == 2
        ray.get(actor.send.remote(_batch(0, 2)))
        assert ray.get([rk.train.remote() for rk in ranks], timeout=30) == [2, 2]
        # The ranks acknowledge without waiting for the actor's answer, and the driver's call
        # is not ordered after theirs: the step moves on once both acknowledgements arrive.
        deadline = time.monotonic() + 20
        while ray.get(actor.next_step.remote()) != 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ray.get(actor.next_step.remote()) == 3

        trained = []
        for log in logs:
            entries = [json.loads(line) for line in pathlib.Path(log).read_text().splitlines()]
            assert [e["step"] for e in entries] == [0, 1, 2]  # every step once per rank
            trained += [tuple(k) for e in entries for k in e["keys"]]
    assert sorted(trained) == [(0, s, i) for s in range(3) for i in range(4)]  # no sample lost or repeated
    for rk in ranks:
        ray.kill(rk)
    ray.kill(actor)


def test_a_rank_cannot_take_a_delivered_step_and_bad_arguments_are_named():
    actor = _actor(**OPTIONS)
    ray.get(actor.add_run.remote(0, batch_size=4))
    ray.get(actor.send.remote(_batch(0, 0)))
    for r in range(2):
        sray.RayReceiver(actor, r, timeout=20).receive()
    with pytest.raises(stowplan.InvalidArgumentError, match="step 0 was delivered"):
        sray.RayReceiver(actor, 0, timeout=5).receive()
    with pytest.raises(stowplan.InvalidArgumentError, match="rank must be an integer in 0..1"):
        sray.RayReceiver(actor, 2, start_step=1, timeout=5).receive()
    with pytest.raises(stowplan.InvalidArgumentError, match="rank must be"):
        sray.RayReceiver(actor, -1)
    with pytest.raises(stowplan.InvalidArgumentError, match="timeout must be"):
        sray.RayReceiver(actor, 0, timeout=-1)
    with pytest.raises(stowplan.InvalidArgumentError, match="actor must be"):
        sray.RayReceiver(object(), 0)
    with pytest.raises(stowplan.InvalidArgumentError, match="PackerActor handle, as ray.remote.*got the class PackerActor"):
        sray.RayReceiver(sray.PackerActor, 0)
    with pytest.raises(stowplan.InvalidArgumentError, match="run 0 exists with batch_size 4 .got 7.: remove_run.0. first"):
        try:
            ray.get(actor.add_run.remote(0, batch_size=7))
        except ray.exceptions.RayTaskError as e:
            raise e.cause
    ray.get(actor.add_run.remote(0, batch_size=4))  # the same again: harmless
    with pytest.raises(stowplan.InvalidArgumentError, match="batch must be"):
        try:
            ray.get(actor.send.remote({"samples": []}))
        except ray.exceptions.RayTaskError as e:
            raise e.cause
    with pytest.raises(stowplan.InvalidArgumentError, match="batch must be a stowplan.TrainingBatch or its encoded bytes"):
        sray.put_batch({"samples": []})
    with pytest.raises(stowplan.StowplanTimeoutError, match="rank 0: step 1"):
        sray.RayReceiver(actor, 0, start_step=1, timeout=0.2).receive()
    ray.kill(actor)  # for good: a receiver's timeout names the dead actor
    with pytest.raises(stowplan.StowplanTimeoutError, match=r"within 1 s; the packer actor did not answer .*dead for good"):
        sray.RayReceiver(actor, 0, start_step=1, timeout=1).receive()


ITEMS = [{"ids": list(range(i % 37 + (i * 7919) % 23))} for i in range(200)]


@pytest.mark.parametrize("blocks", [1, 3, 7])
def test_compute_lengths_equals_the_local_lengths(blocks):
    def _length(row):  # nested: pickled by value for the workers (tests/ is not importable there)
        return len(row["ids"]) + 1

    ds = ray.data.from_items(ITEMS).repartition(blocks)
    with tempfile.TemporaryDirectory() as cache:
        local = stowplan.compute_lengths(ITEMS, _length, cache_dir=cache, source="items", workers=1)
    got = sray.compute_lengths(ds, length_fn=_length, batch_size=16)
    assert got.dtype == np.uint64 and got.tolist() == local.tolist()
    by_column = sray.compute_lengths(ds, column="ids")
    assert by_column.tolist() == [len(r["ids"]) for r in ITEMS]
    a = stowplan.StaticPackPlan.from_lengths(got, capacity=64, world_size=2)
    b = stowplan.StaticPackPlan.from_lengths(local, capacity=64, world_size=2)
    assert (a.raw_checksum, a.aligned_checksum) == (b.raw_checksum, b.aligned_checksum)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(), "exactly one of column= and length_fn="),
        (dict(column="ids", length_fn=len), "exactly one of column= and length_fn="),
        (dict(column="nope"), "column 'nope' is not in the dataset"),
        (dict(length_fn=3), "length_fn must be callable"),
        (dict(column="ids", batch_size=0), "batch_size must be"),
    ],
)
def test_compute_lengths_names_bad_arguments(kwargs, fragment):
    ds = ray.data.from_items(ITEMS[:10])
    with pytest.raises(stowplan.InvalidArgumentError, match=re.escape(fragment)):
        sray.compute_lengths(ds, **kwargs)
    with pytest.raises(stowplan.InvalidArgumentError, match="dataset must be a ray.data.Dataset"):
        sray.compute_lengths(ITEMS, column="ids")


def test_compute_lengths_raises_the_length_functions_error_itself():
    ds = ray.data.from_items(ITEMS[:10])
    with pytest.raises(stowplan.InvalidArgumentError, match="the length function returned 'x' for sample 0"):
        sray.compute_lengths(ds, length_fn=lambda row: "x")


def _sft_table(n=120, seed=7):
    """A tokenized SFT table: list columns with the same per-row lengths (some empty, some long)."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 40, size=n)
    lens[::17] = 70  # longer than seq_length below
    ids = [rng.integers(1, 1000, size=int(k)).tolist() for k in lens]
    return pa.table({"input_ids": ids, "labels": [[-100] + x[1:] if x else [] for x in ids], "source": [f"doc{i}" for i in range(n)]})


@pytest.mark.parametrize(
    "blocks, options",
    [
        (1, dict()),
        (3, dict(num_blocks=4, position_ids=True)),
        (7, dict(num_blocks=3, strategy="bfd_split")),
        (5, dict(num_blocks=2, strategy="ffd", overflow="drop")),
        (4, dict(num_blocks=3, strategy="wrapped", position_ids=True)),
        (6, dict(num_blocks=50, strategy="next-fit", overflow="split")),
    ],
)
def test_pack_dataset_equals_pack_table(blocks, options):
    from stowplan.arrow import pack_table

    table = _sft_table()
    num_blocks = options.pop("num_blocks", None)
    cols = ["input_ids", "labels"]
    want = pack_table(table, 64, columns=cols, **options)
    ds = ray.data.from_arrow(table).repartition(blocks)
    got = sray.pack_dataset(ds, 64, columns=cols, num_blocks=num_blocks, **options)
    import pyarrow as pa

    result = pa.concat_tables(ray.get(got.to_arrow_refs()))  # its blocks, in order
    assert result.schema == want.schema
    assert result.to_pydict() == want.to_pydict()


def test_pack_dataset_names_bad_input():
    import pyarrow as pa

    ds = ray.data.from_arrow(_sft_table(20))
    with pytest.raises(stowplan.InvalidArgumentError, match="column 'source' is not a list column"):
        sray.pack_dataset(ds, 64)
    with pytest.raises(stowplan.InvalidArgumentError, match="capacity must be"):
        sray.pack_dataset(ds, 0, columns=["input_ids"])
    with pytest.raises(stowplan.InvalidArgumentError, match="num_blocks must be"):
        sray.pack_dataset(ds, 64, columns=["input_ids"], num_blocks=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="dataset must be a ray.data.Dataset"):
        sray.pack_dataset(_sft_table(20), 64)
    for empty in (ray.data.from_items([]), ray.data.from_arrow(_sft_table(20)).limit(0)):
        with pytest.raises(stowplan.InvalidArgumentError, match="the dataset is empty"):
            sray.pack_dataset(empty, 64, columns=["input_ids"])
    bad = ray.data.from_arrow(pa.table({"a": [[1, 2], [3]], "b": [[1, 2], [3, 4]]}))
    with pytest.raises(stowplan.InvalidArgumentError, match="column 'b' does not have the offsets of column 'a'"):
        sray.pack_dataset(bad, 8)


RECIPES = ["verl", "slime"]


@pytest.mark.parametrize("index", range(len(RECIPES)), ids=RECIPES)
def test_the_guides_recipes_run(index):
    """docs/packer-runtime.md's Ray recipes (the python block after each marker), run as written."""
    marker = "<!-- tested: sdk-python/tests/test_ray.py -->"
    parts = GUIDE.read_text().split(marker)[1:]
    assert len(parts) == len(RECIPES)
    block = parts[index].split("```python\n", 1)[1].split("```", 1)[0]
    assert f"{RECIPES[index]}'s" in GUIDE.read_text().split(marker)[index]  # the prose above names it
    exec(compile(block, f"docs/packer-runtime.md (Ray recipe, {RECIPES[index]}-style)", "exec"), {})
