"""The packer runtime from Python: the in-process Packer, the filesystem and ZeroMQ
senders/receivers, the prime-rl layouts, and the end-to-end test over both transports: an
orchestrator process, ``stowplan serve`` and 4 rank processes, with the packer killed
(SIGKILL) mid-run and restarted."""

from __future__ import annotations

import glob
import json
import os
import pickle
import pathlib
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional, Set, Tuple

import numpy as np
import pytest

import stowplan
from stowplan.compat import prime_rl

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import packer_procs  # noqa: E402


def sample(n: int, adv: float = 1.0, **extra):
    return {"prompt_ids": list(range(1, 3)), "completion_ids": list(range(3, 3 + n)), "advantage": adv, **extra}


def test_round_robin_progress_and_run_separation():
    p = stowplan.Packer(capacity=64, dp=2, num_runs=3, step_tokens=64)
    for r in range(3):
        p.add_run(r, batch_size=2)
    p.ingest(stowplan.TrainingBatch(run=0, step=0, samples=[sample(6) for _ in range(6)]))
    p.ingest(stowplan.TrainingBatch(run=2, step=0, samples=[sample(6) for _ in range(2)]))
    ranks, m = p.pack(force=True)
    # 64 tokens of 8-token samples: run 0, run 2, run 0, run 2, then run 0 four times.
    assert m["run_samples"] == {0: 6, 2: 2}
    assert [len(r) for r in ranks] == [len(ranks[0])] * 2
    for r in ranks:
        for mb in r.micro_batches:
            assert len({int(r.sample_runs[i]) for i in mb.samples}) == 1
            assert int(mb.lora_num_tokens.sum()) == len(mb.input_ids)
    assert sorted(p.delivered(0)) == [(0, 0), (2, 0)]
    assert p.progress(0)["step"] == 3 and p.progress(2)["ready_to_update"]
    assert p.progress(0)["total_tokens"] == 48
    p.clear_ready(2)
    assert not p.progress(2)["ready_to_update"]


def test_round_robin_distribution_deals_prime_rls_way():
    """``distribution="round-robin"``: prime-rl's classic deal, dummies copying a real row."""
    p = stowplan.Packer(capacity=16, dp=3, distribution="round-robin")
    p.add_run(0, batch_size=4)
    # Samples of 14, 10, 6 and 4 tokens; first fit by descending length under 16 tokens
    # makes [14], [10, 6], [4]: three rows, one per rank.
    p.ingest(stowplan.TrainingBatch(run=0, step=0, samples=[sample(n - 2) for n in (14, 10, 6, 4)]))
    ranks, m = p.pack(force=True)
    rows = [r.micro_batches[0] for r in ranks]
    assert [len(mb.input_ids) for mb in rows] == [14, 16, 4] and not any(mb.dummy for mb in rows)
    p.delivered(0)
    # Two rows of 12 and 9 tokens on three ranks: a dummy copy of the first, dealt last.
    p.ingest(stowplan.TrainingBatch(run=0, step=1, samples=[sample(n - 2) for n in (12, 9)]))
    ranks, m = p.pack(force=True)
    rows = [r.micro_batches[0] for r in ranks]
    assert [mb.dummy for mb in rows] == [False, False, True]
    assert rows[2].input_ids.tolist() == rows[0].input_ids.tolist() and not rows[2].loss_weights.any()
    assert m["micro_batches_per_rank"] == 1


def test_rejections_duplicates_and_errors():
    p = stowplan.Packer(capacity=16, dp=1)
    p.add_run(0, batch_size=4)
    r = p.ingest(
        stowplan.TrainingBatch(
            run=0,
            step=3,
            samples=[sample(4), sample(40), sample(4, completion_mask=[True]), sample(4, adv=float("nan"))],
        )
    )
    assert r.accepted == 1 and [(i, k) for i, k, _ in r.rejected] == [(1, "too_long"), (2, "length_mismatch"), (3, "not_finite")]
    assert repr(r).startswith("IngestReport(accepted=1, rejected=[(1, 'too_long', ") and r == pickle.loads(pickle.dumps(r))
    assert p.progress(0)["rejected"] == {"length_mismatch": 1, "not_finite": 1, "too_long": 1}
    assert p.ingest(stowplan.TrainingBatch(run=0, step=3, samples=[sample(4)])).duplicate
    assert p.ingest(stowplan.TrainingBatch(run=5, step=0, samples=[sample(4)])).rejected[0][1] == "unknown_run"
    with pytest.raises(stowplan.InvalidArgumentError, match=r"capacity must be in 1\.\."):
        stowplan.Packer(capacity=0, dp=1)
    with pytest.raises(stowplan.InvalidArgumentError, match="dp must be in 1"):
        stowplan.Packer(capacity=8, dp=-1)
    with pytest.raises(stowplan.InvalidArgumentError, match="step_tokens must be at least capacity"):
        stowplan.Packer(capacity=8, dp=1, step_tokens=4)
    with pytest.raises(stowplan.InvalidArgumentError, match="wait_timeout must be"):
        stowplan.Packer(capacity=8, dp=1, wait_timeout=-1)
    with pytest.raises(stowplan.InvalidArgumentError, match="cost must be"):
        stowplan.Packer(capacity=8, dp=1, cost="flops")
    # The token cap's former name keeps working for one release, warning and naming capacity=.
    with pytest.warns(DeprecationWarning, match=r"Packer: seq_len= is deprecated .* use capacity=") as caught:
        old = stowplan.Packer(seq_len=8, dp=1)
    assert caught[0].filename == __file__  # the warning points at the caller
    assert old.state() == stowplan.Packer(capacity=8, dp=1).state()
    with pytest.raises(stowplan.InvalidArgumentError, match=r"give capacity= only"):
        stowplan.Packer(capacity=8, seq_len=8, dp=1)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"capacity= is required"):
        stowplan.Packer(dp=1)
    with pytest.raises(stowplan.InvalidArgumentError, match="batch_size must be in 1"):
        p.add_run(0, batch_size=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="already exists"):
        p.add_run(0, batch_size=1)
    with pytest.raises(stowplan.InvalidArgumentError, match="temperature must be > 0"):
        stowplan.TrainingBatch(run=0, step=0, samples=[sample(2)], temperature=0).encode()
    with pytest.raises(stowplan.InvalidArgumentError, match="missing the SPTB header"):
        p.ingest(b"junk")
    with pytest.raises(stowplan.InvalidArgumentError, match="not in flight"):
        p.delivered(9)


def test_state_restore_rebuilds_the_step_in_flight():
    opts = dict(capacity=32, dp=2, num_runs=2)
    p = stowplan.Packer(**opts)
    p.add_run(0, batch_size=3)
    p.add_run(1, batch_size=3)
    batches = [stowplan.TrainingBatch(run=r, step=0, samples=[sample(3 + i) for i in range(5)]) for r in (0, 1)]
    for b in batches:
        p.ingest(b)
    ranks, _ = p.pack(force=True)
    state = p.state()
    assert sorted(p.needed_batches()) == [(0, 0), (1, 0)]
    q = stowplan.Packer.restore(state, batches, **opts)
    again = q.rebuild_inflight()
    for a, b in zip(ranks, again):
        for x, y in zip(a.micro_batches, b.micro_batches):
            assert x.to_bytes() == y.to_bytes()
    with pytest.raises(stowplan.CacheMismatchError, match="capacity: 64"):
        stowplan.Packer.restore(state, batches, **{**opts, "capacity": 64})
    with pytest.raises(stowplan.CacheMismatchError, match="which batches lacks"):
        stowplan.Packer.restore(state, batches[:1], **opts)


def test_extra_costs_travel_and_balance_ranks():
    # Four 16-token samples on 2 ranks; one carries 48 of vision cost, so it gets a rank alone.
    p = stowplan.Packer(capacity=64, dp=2)
    p.add_run(0, batch_size=4)
    samples = [sample(14, extra_cost=48)] + [sample(14) for _ in range(3)]
    batch = stowplan.TrainingBatch(run=0, step=0, samples=samples)
    assert p.ingest(batch.encode()).accepted == 4
    ranks, m = p.pack(force=True)
    alone = [r for r in ranks if any(int(r.sample_indices[i]) == 0 for mb in r.micro_batches for i in mb.samples)][0]
    assert sum(len(mb.samples) for mb in alone.micro_batches) == 1
    assert abs(m["imbalance"] - 64 / 56) < 1e-9
    r = p.ingest(stowplan.TrainingBatch(run=0, step=1, samples=[sample(14, extra_cost=2**64 - 1)]))
    assert r.accepted == 0 and r.rejected[0][1] == "cost_overflow"
    with pytest.raises(stowplan.InvalidArgumentError, match=r"samples\[0\]\.extra_cost"):
        stowplan.TrainingBatch(run=0, step=2, samples=[sample(4, extra_cost=-1)]).encode()


def test_encoded_batches_are_read_from_any_contiguous_buffer(tmp_path):
    # bytes, bytearray, memoryview and a numpy uint8 array (what ray.get of put_batch's object
    # gives, read only) are the same batch; a duplicate by (run, step) whatever the buffer.
    data = stowplan.TrainingBatch(run=0, step=0, samples=[sample(6) for _ in range(3)]).encode()
    array = np.frombuffer(data, dtype=np.uint8)
    assert not array.flags.writeable
    for i, buf in enumerate([data, bytearray(data), memoryview(data), array]):
        p = stowplan.Packer(capacity=64, dp=1)
        p.add_run(0, batch_size=3)
        assert p.ingest(buf).accepted == 3, type(buf)
        assert p.ingest(array).duplicate
        stowplan._stowplan.write_atomic(tmp_path / f"b{i}", buf)
        assert (tmp_path / f"b{i}").read_bytes() == data
    p = stowplan.Packer(capacity=64, dp=1)
    with pytest.raises(stowplan.InvalidArgumentError, match="damaged"):
        p.ingest(np.frombuffer(data[:-1] + b"x", dtype=np.uint8))
    with pytest.raises(stowplan.InvalidArgumentError, match="batch must be bytes or a contiguous buffer"):
        p.ingest(np.zeros((4, 4), dtype=np.uint8)[:, 1])  # not contiguous


def test_limits_keep_every_micro_batch_within_each_and_reject_what_cannot_fit():
    # Six 16-token image samples of 2 images each: one micro-batch by tokens, three under
    # images=4; a sample over a cap or naming another resource is rejected, by name.
    limits = {"images": 4, "image_tokens": 1024}
    p = stowplan.Packer(capacity=128, dp=1, limits=limits)
    p.add_run(0, batch_size=6)
    samples = [sample(14, resources={"images": 2, "image_tokens": 300}, extra_cost=300) for _ in range(6)]
    samples += [sample(4), sample(4, resources={"images": 5}), sample(4, resources={"frames": 1})]
    r = p.ingest(stowplan.TrainingBatch(run=0, step=0, samples=samples).encode())
    assert r.accepted == 7
    assert [x[:2] for x in r.rejected] == [(7, "over_limit"), (8, "unknown_resource")]
    assert "5 images, over its limit 4" in r.rejected[0][2]
    assert p.progress(0)["rejected"] == {"over_limit": 1, "unknown_resource": 1}
    ranks, _ = p.pack(force=True)
    per_mb = [[int(ranks[0].sample_indices[i]) for i in mb.samples] for mb in ranks[0].micro_batches]
    assert len(per_mb) == 3
    for mb in per_mb:
        assert sum(samples[i].get("resources", {}).get("images", 0) for i in mb) <= 4
    assert sorted(i for mb in per_mb for i in mb) == list(range(7))
    # The checkpoint records the limits: restoring under others is refused, naming them.
    state, batches = p.state(), [stowplan.TrainingBatch(run=0, step=0, samples=samples).encode()]
    with pytest.raises(stowplan.CacheMismatchError, match=r'limits: \[\("image_tokens", 1024\), \("images", 4\)\]'):
        stowplan.Packer.restore(state, batches, capacity=128, dp=1, limits={"images": 8, "image_tokens": 1024})
    # Without limits, resources are rejected rather than ignored; bad limits are refused.
    q = stowplan.Packer(capacity=128, dp=1)
    q.add_run(0, batch_size=1)
    r = q.ingest(stowplan.TrainingBatch(run=0, step=0, samples=[sample(4, resources={"images": 1})]))
    assert r.rejected[0][1] == "unknown_resource" and "no limits" in r.rejected[0][2]
    for bad, match in [({"tokens": 9}, "tokens"), ({"images": 0}, r"limits\['images'\]"), ([("images", 2)], "limits must be a dict")]:
        with pytest.raises(stowplan.InvalidArgumentError, match=match):
            stowplan.Packer(capacity=128, dp=1, limits=bad)


def test_max_segments_caps_the_samples_of_every_micro_batch():
    p = stowplan.Packer(capacity=128, dp=2, max_segments=3)
    p.add_run(0, batch_size=10)
    p.ingest(stowplan.TrainingBatch(run=0, step=0, samples=[sample(6) for _ in range(10)]))
    ranks, _ = p.pack(force=True)
    sizes = [len(mb.samples) for r in ranks for mb in r.micro_batches]
    assert sum(sizes) == 10 and max(sizes) <= 3, sizes
    # Recorded in the checkpoint; "segments" is not a limit name.
    state, batches = p.state(), [stowplan.TrainingBatch(run=0, step=0, samples=[sample(6) for _ in range(10)]).encode()]
    with pytest.raises(stowplan.CacheMismatchError, match=r'\("segments", 3\)'):
        stowplan.Packer.restore(state, batches, capacity=128, dp=2, max_segments=4)
    with pytest.raises(stowplan.InvalidArgumentError, match='may not be named "segments"'):
        stowplan.Packer(capacity=128, dp=1, limits={"segments": 2})
    with pytest.raises(stowplan.InvalidArgumentError, match="max_segments"):
        stowplan.Packer(capacity=128, dp=1, max_segments=-2)


def _weight_sum(ranks) -> float:
    return sum(float(mb.loss_weights.sum()) for r in ranks for mb in r.micro_batches)


def test_loss_normalization_per_update_spans_packer_steps():
    # An update of 4 samples arrives in two batches and is packed over two packer steps of
    # 32 tokens; every per-token loss is 1, so under token-mean the weights of the update's
    # steps add up to 1 (one loss), where per-step normalization gives 1 per packer step.
    opts = dict(capacity=32, dp=1, step_tokens=32, wait_timeout=0, loss_normalization="update")
    p = stowplan.Packer(**opts)
    p.add_run(0, batch_size=4)
    first = stowplan.TrainingBatch(run=0, step=0, samples=[sample(14), sample(6)])
    p.ingest(first)
    # Half the update: nothing may be packed yet (its weights need the whole update).
    assert not p.should_pack() and p.pack(force=True) is None
    second = stowplan.TrainingBatch(run=0, step=1, samples=[sample(14), sample(6)])
    p.ingest(second)
    total, steps = 0.0, 0
    while (packed := p.pack(force=True)) is not None:
        ranks, m = packed
        total += _weight_sum(ranks)
        # The update's counts survive a checkpoint: the restored packer rebuilds the step.
        again = stowplan.Packer.restore(p.state(), [first, second], **opts).rebuild_inflight()
        assert [mb.to_bytes() for r in again for mb in r.micro_batches] == [
            mb.to_bytes() for r in ranks for mb in r.micro_batches
        ]
        p.delivered(m["step"])
        steps += 1
    assert steps == 2 and abs(total - 1.0) < 1e-6
    assert p.progress(0)["step"] == 1
    # The default normalizes per packer step: each step's weights add up to 1.
    q = stowplan.Packer(**{**opts, "loss_normalization": "step"})
    q.add_run(0, batch_size=4)
    q.ingest(first)
    ranks, m = q.pack(force=True)
    assert abs(_weight_sum(ranks) - 1.0) < 1e-6
    for bad, match in [("epoch", "loss_normalization must be 'step' or 'update'"), (3, "loss_normalization")]:
        with pytest.raises(stowplan.InvalidArgumentError, match=match):
            stowplan.Packer(capacity=8, dp=1, loss_normalization=bad)
    with pytest.raises(stowplan.CacheMismatchError, match="loss_normalization"):
        stowplan.Packer.restore(p.state(), [], **{**opts, "loss_normalization": "step"})


def test_file_sender_and_receiver_round_trip(tmp_path):
    sender = stowplan.FileSender(tmp_path)
    path = sender.send(stowplan.TrainingBatch(run=0, step=7, samples=[sample(3)]))
    assert path.endswith("inbox/run_0_step_7.bin")
    receiver = stowplan.FileRankClient(tmp_path, 1, start_step=4, timeout=0.05)
    with pytest.raises(stowplan.StowplanTimeoutError, match="rank_1.bin did not appear"):
        receiver.receive()
    with pytest.raises(stowplan.InvalidArgumentError, match="rank must be"):
        stowplan.FileRankClient(tmp_path, -1)
    with pytest.raises(stowplan.InvalidArgumentError, match="timeout must be"):
        stowplan.FileRankClient(tmp_path, 0, timeout=-1)


def test_file_receiver_consume_removes_the_step(tmp_path):
    stowplan.FileSender(tmp_path).send(stowplan.TrainingBatch(run=0, step=0, samples=[sample(3), sample(5)]))
    serve = [serve_binary(), "serve", "--root", str(tmp_path), "--capacity", "64", "--dp", "2", "--batch-size", "2",
             "--wait-timeout", "0.01", "--max-steps", "1"]
    subprocess.run(serve, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    step_dir = tmp_path / "rollouts" / "step_0"
    assert sorted(os.listdir(step_dir)) == ["rank_0.bin", "rank_1.bin"]
    assert stowplan.FileRankClient(tmp_path, 0, consume=True, timeout=5).receive().rank == 0
    assert os.listdir(step_dir) == ["rank_1.bin"]
    # The last rank to take the step removes its directory.
    assert stowplan.FileRankClient(tmp_path, 1, consume=True, timeout=5).receive().rank == 1
    assert not step_dir.exists()


def test_file_sender_names_run_changes_in_time_order(tmp_path):
    sender = stowplan.FileSender(tmp_path)
    first = os.path.basename(sender.add_run(3, batch_size=4))
    second = os.path.basename(sender.remove_run(3))
    assert first.startswith("control_") and first.endswith(f"_{os.getpid()}_add_run_3.bin")
    assert second.endswith(f"_{os.getpid()}_remove_run_3.bin") and first < second
    assert stowplan._stowplan.control_file_name("remove_run", 1, 42, 7) == "control_00000000000000000042_7_remove_run_1.bin"
    with pytest.raises(stowplan.InvalidArgumentError, match="kind must be 'add_run' or 'remove_run'"):
        stowplan._stowplan.control_file_name("rename", 1, 0, 0)


def rank_files(tmp_path: pathlib.Path, steps: int, dp: int = 2) -> Dict[Tuple[int, int], bytes]:
    """(rank, step) -> the bytes `stowplan serve` delivered (filesystem transport)."""
    sender = stowplan.FileSender(tmp_path)
    for step in range(steps + 1):
        sender.send(stowplan.TrainingBatch(run=0, step=step, samples=[sample(38), sample(38)]))
    serve = [serve_binary(), "serve", "--root", str(tmp_path), "--capacity", "64", "--dp", str(dp), "--batch-size", "2",
             "--step-tokens", "128", "--wait-timeout", "0.01", "--max-steps", str(steps)]
    subprocess.run(serve, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return {(r, s): (tmp_path / "rollouts" / f"step_{s}" / f"rank_{r}.bin").read_bytes() for r in range(dp) for s in range(steps)}


def test_native_rank_receiver_core(tmp_path):
    """The protocol core ZmqRankClient drives: hello cadence, order, hold-back, copies, limit, failure."""
    raw = rank_files(tmp_path, 3)
    core = stowplan._stowplan.RankReceiver(0, 2, prefetch=2)
    assert (core.rank, core.dp, core.next_step, core.held_steps, core.error) == (0, 2, 0, [], None)
    assert core.poll_hello() == stowplan._stowplan.encode_rank_hello(0, 2, 0)
    assert core.poll_hello() is None, "the next hello is a heartbeat away"
    assert 0 < core.hello_due_in() <= stowplan._zmq.HEARTBEAT == 1.0
    early = core.on_message(raw[(0, 1)])
    assert (early.step, early.arrival, early.ack) == (1, "held_back", stowplan._stowplan.encode_rank_ack(0, 1))
    assert not core.has_next() and core.next_batch() is None
    assert core.on_message(raw[(0, 0)]).arrival == "in_order"
    assert core.held_steps == [0, 1] and not core.wants_message(), "prefetch 2: full"
    assert core.next_batch().step == 0 and core.wants_message()
    copy = core.on_message(raw[(0, 0)])
    assert (copy.arrival, copy.ack) == ("duplicate", stowplan._stowplan.encode_rank_ack(0, 0))
    assert core.next_batch().step == 1 and core.next_batch() is None and core.next_step == 2
    err = core.timeout_error("tcp://127.0.0.1:5557", 0.25)
    assert isinstance(err, stowplan.StowplanTimeoutError)
    assert "rank 0: step 2 did not arrive from tcp://127.0.0.1:5557 within 0.25 s (held back: steps [])" in str(err)
    with pytest.raises(stowplan.InvalidArgumentError, match="the packer sent rank 1's batch to rank 0"):
        core.on_message(raw[(1, 2)])
    assert isinstance(core.error, stowplan.InvalidArgumentError)
    assert core.poll_hello() is None and not core.wants_message() and core.hello_due_in() == float("inf")
    junk = stowplan._stowplan.RankReceiver(1, 2)
    with pytest.raises(stowplan.InvalidArgumentError, match="not an encoded stowplan rank batch"):
        junk.on_message(b"junk")
    with pytest.raises(stowplan.InvalidArgumentError, match="rank must be below dp 2"):
        stowplan._stowplan.RankReceiver(2, 2)
    with pytest.raises(stowplan.InvalidArgumentError, match="prefetch must be in 1"):
        stowplan._stowplan.RankReceiver(0, 1, prefetch=0)


def test_native_batch_sender_core():
    """The protocol core ZmqSender drives: kept until acknowledged, resent after the timeout."""
    s = stowplan._stowplan.BatchSender(resend_after=0.05)
    assert (s.resend_after, s.incarnation, s.resent, s.flushed) == (0.05, None, 0, True)
    data = stowplan.TrainingBatch(run=0, step=1, samples=[sample(3)]).encode()
    assert s.track_batch(data, run=0, step=1) is data
    add = s.track_control("add_run", 2, batch_size=4)
    remove = s.track_control("remove_run", 2)
    ref = stowplan._stowplan.encode_control("add_run", 2, 4)
    assert add[:4] == ref[:4] == b"SPCT" and add != ref, "the same change; every message has its own id"
    assert [(k.kind, k.run, k.step, k.batch_size) for k in s.unacked] == [
        ("batch", 0, 1, None), ("add_run", 2, None, 4), ("remove_run", 2, None, None)]
    assert not s.flushed and s.due_resends() == []
    time.sleep(0.06)
    assert s.due_resends() == [data, add, remove] and s.resent == 3
    # The same key again replaces the kept message, now the newest.
    again = stowplan.TrainingBatch(run=0, step=1, samples=[sample(4)]).encode()
    s.track_batch(again, run=0, step=1)
    assert [k.kind for k in s.unacked] == ["add_run", "remove_run", "batch"]
    err = s.flush_timeout_error("tcp://127.0.0.1:5556", 2)
    assert isinstance(err, stowplan.StowplanTimeoutError)
    assert "3 messages not acknowledged by the packer at tcp://127.0.0.1:5556 within 2 s (first: add_run 2 (batch_size 4)" in str(err)
    with pytest.raises(stowplan.InvalidArgumentError, match="missing the SPRC header"):
        s.on_receipts(b"junk")
    with pytest.raises(stowplan.InvalidArgumentError, match="resend_after must be a number of seconds > 0"):
        stowplan._stowplan.BatchSender(resend_after=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="add_run needs batch_size"):
        s.track_control("add_run", 1)
    with pytest.raises(stowplan.InvalidArgumentError, match="kind must be"):
        s.track_control("rename", 1)


def test_prime_rl_layout_of_a_received_micro_batch():
    p = stowplan.Packer(capacity=16, dp=1, num_runs=2, pad_to_multiple_of=4)
    p.add_run(1, batch_size=1)
    p.ingest(stowplan.TrainingBatch(run=1, step=0, samples=[sample(3)], temperature=0.5))
    ranks, _ = p.pack(force=True)
    d = prime_rl.micro_batch_fields(ranks[0].micro_batches[0])
    assert d["input_ids"].tolist() == [1, 2, 3, 4, 5, 1, 1, 1]
    assert d["lora_num_tokens"].tolist() == [0, 8]
    assert d["temperatures"].tolist() == [0.5] * 5 + [1.0] * 3
    assert d["sequence_lengths"].tolist() == [8]
    assert d["loss_mask"].tolist() == [False, False, True, True, True, False, False, False]


# --- end to end: orchestrator + stowplan serve + 4 ranks, SIGKILL and restart -------------

def serve_binary() -> str:
    path = os.environ.get("STOWPLAN_BIN") or str(ROOT / "target" / "release" / "stowplan")
    if not os.path.isfile(path):
        if os.environ.get("STOWPLAN_REQUIRE_SERVE"):
            raise AssertionError(f"the stowplan binary is required but missing at {path}")
        pytest.skip(f"no stowplan binary at {path} (cargo build --release, or set STOWPLAN_BIN)")
    return path


def received(out: pathlib.Path) -> Dict[Tuple[int, int], Tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    got = {}
    for f in glob.glob(str(out / "rank*_step*.npz")):
        name = os.path.basename(f)[4:-4]
        r, s = name.split("_step")
        with np.load(f) as z:
            got[(int(r), int(s))] = (z["keys"], z["tokens"], z["offsets"], int(z["micro_batches"]))
    return got


def steps_received(out: pathlib.Path, dp: int) -> int:
    n = 0
    while all((out / f"rank{r}_step{n}.npz").exists() for r in range(dp)):
        n += 1
    return n


@pytest.mark.parametrize("transport", ["fs", "zmq"])
def test_end_to_end_with_sigkill_and_restart(tmp_path, transport):
    binary = serve_binary()
    root, out = tmp_path / "root", tmp_path / "out"
    out.mkdir()
    steps, runs, dp = 8, 2, 4
    proc = [sys.executable, str(HERE / "packer_procs.py")]
    serve = [binary, "serve", "--transport", transport, "--capacity", str(packer_procs.SEQ_LEN),
             "--dp", str(dp), "--batch-size", "16", "--num-runs", str(runs), "--wait-timeout", "0.3",
             "--pad-to-multiple-of", "8", "--log-format", "json", "--poll-ms", "2",
             # Several steps even when every batch is pending at once (ranks slow to connect on
             # a loaded machine): the default step takes everything pending.
             "--step-tokens", str(2 * dp * packer_procs.SEQ_LEN)]
    if transport == "fs":
        serve += ["--root", str(root)]
        ranks = [proc + ["rank", str(root), str(r), str(out)] for r in range(dp)]
        orchestrator = proc + ["orchestrator", str(root), str(steps), str(runs), "0.15"]
    else:
        batches, receipts, rank_ep = (f"tcp://127.0.0.1:{p}" for p in packer_procs.free_ports(3))
        serve += ["--state-dir", str(tmp_path / "state"), "--zmq-batches", batches, "--zmq-receipts", receipts,
                  "--zmq-ranks", rank_ep]
        ranks = [proc + ["rank-zmq", rank_ep, str(r), str(dp), str(out)] for r in range(dp)]
        orchestrator = proc + ["orchestrator-zmq", batches, receipts, str(steps), str(runs), "0.15"]
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    logs = open(tmp_path / "serve.log", "wb")
    # Every process's stderr goes to a file, and a failed check shows their tails.
    errs = [open(tmp_path / f"{name}.err", "wb") for name in [f"rank{r}" for r in range(dp)] + ["orchestrator"]]

    def tails() -> str:
        parts = []
        for f in [logs] + errs:
            f.flush()
            text = pathlib.Path(f.name).read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {os.path.basename(f.name)}:\n" + "\n".join(text))
        return "\n".join(parts)

    procs: List[subprocess.Popen] = []
    packer: Optional[subprocess.Popen] = None
    try:
        packer = subprocess.Popen(serve, stderr=logs, stdout=subprocess.DEVNULL)
        procs += [subprocess.Popen(r, env=env, stderr=e) for r, e in zip(ranks, errs)]
        orch = subprocess.Popen(orchestrator, env=env, stdout=subprocess.PIPE, stderr=errs[-1])
        procs.append(orch)
        deadline = time.time() + 60
        while steps_received(out, dp) < 2:
            assert time.time() < deadline, f"no steps delivered\n{tails()}"
            assert packer.poll() is None, f"serve exited\n{tails()}"
            time.sleep(0.01)
        packer.send_signal(signal.SIGKILL)
        packer.wait()
        time.sleep(0.3)  # batches pile up (fs: in the inbox; zmq: queued, or lost and resent later)
        if transport == "fs":
            # The orchestrator resends a batch it is unsure about: a duplicate, ignored.
            subprocess.run(proc + ["resend", str(root), "0", "0"], env=env, check=True)
        packer = subprocess.Popen(serve, stderr=logs, stdout=subprocess.PIPE)
        # zmq: the orchestrator exits once the packer acknowledged every batch.
        orch_out, _ = orch.communicate(timeout=120)
        assert orch.returncode == 0, tails()
        expected: Dict[Tuple[int, int, int], np.ndarray] = {}
        for s in range(steps):
            for r in range(runs):
                for i, t in packer_procs.expected_tokens(r, s).items():
                    expected[(r, s, i)] = t
        deadline = time.time() + 90
        while True:
            got = received(out)
            keys = [tuple(k) for (_, _), (ks, _, _, _) in got.items() for k in ks.tolist()]
            if len(set(keys)) >= len(expected):
                break
            assert time.time() < deadline, f"{len(set(keys))} of {len(expected)} samples received\n{tails()}"
            assert packer.poll() is None, f"serve exited\n{tails()}"
            time.sleep(0.05)
        # Clean shutdown on SIGTERM: exit 0, summary printed, pending state kept.
        packer.send_signal(signal.SIGTERM)
        stdout, _ = packer.communicate(timeout=30)
        assert packer.returncode == 0
        assert b"stowplan serve:" in stdout
    finally:
        for p in procs + ([packer] if packer else []):
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
        for f in [logs] + errs:
            f.close()
    time.sleep(0.1)
    got = received(out)
    # Exactly once, byte-identical tokens, equal micro-batch counts on every rank.
    seen: Set[Tuple[int, int, int]] = set()
    n_steps = max(s for (_, s) in got) + 1
    for step in range(n_steps):
        counts = {got[(r, step)][3] for r in range(dp)}
        assert len(counts) == 1, f"step {step}: ranks got {counts} micro-batches"
        for r in range(dp):
            ks, tokens, offsets, _ = got[(r, step)]
            for j, k in enumerate(map(tuple, ks.tolist())):
                assert k not in seen, f"{k} delivered twice"
                seen.add(k)
                assert np.array_equal(tokens[offsets[j]:offsets[j + 1]], expected[k]), f"tokens of {k} differ"
    assert seen == set(expected), f"lost {sorted(set(expected) - seen)[:5]}"
    events = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines() if line.startswith("{")]
    messages = [e["fields"].get("message") for e in events]
    assert "step delivered" in messages and "sample rejected" in messages
    if transport == "fs":
        assert "duplicate batch ignored" in messages
    else:
        assert "rank connected" in messages and b"resent" in orch_out
    step_events = [e["fields"] for e in events if e["fields"].get("message") == "step delivered"]
    assert all({"real_tokens", "padding_tokens", "imbalance", "wait_s", "pack_s", "deliver_s"} <= set(f) for f in step_events)


# --- ZeroMQ: a batch lost with a killed packer is resent; the receiver's ordering ----------

def test_zmq_lost_batch_resent_and_receiver_order(tmp_path):
    import threading

    import zmq

    binary = serve_binary()
    batches, receipts, rank_ep = (f"tcp://127.0.0.1:{p}" for p in packer_procs.free_ports(3))
    serve = [binary, "serve", "--transport", "zmq", "--state-dir", str(tmp_path / "state"),
             "--capacity", str(packer_procs.SEQ_LEN), "--dp", "2", "--batch-size", "12", "--wait-timeout", "0.2",
             "--zmq-batches", batches, "--zmq-receipts", receipts, "--zmq-ranks", rank_ep]
    ctx = zmq.Context()
    raw: Dict[Tuple[int, int], bytes] = {}  # (rank, step) -> the bytes the packer sent
    stop = threading.Event()

    def ranks() -> None:
        # Two ranks speaking the wire protocol with bare pyzmq sockets.
        socks = []
        for r in range(2):
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.connect(rank_ep)
            socks.append(s)
        last = 0.0
        lacking = [0, 0]  # what each hello names: the first step the rank does not have
        while not stop.is_set():
            if time.monotonic() - last > 0.5:
                for r, s in enumerate(socks):
                    s.send(stowplan._stowplan.encode_rank_hello(r, 2, lacking[r]))
                last = time.monotonic()
            for r, s in enumerate(socks):
                if s.poll(10):
                    data = s.recv()
                    b = stowplan._stowplan.decode_rank_batch(data)
                    raw[(r, b.step)] = data
                    lacking[r] = max(lacking[r], b.step + 1)
                    s.send(stowplan._stowplan.encode_rank_ack(r, b.step))
        for s in socks:
            s.close()

    logs = open(tmp_path / "serve.log", "wb")
    thread = threading.Thread(target=ranks, daemon=True)
    packer = subprocess.Popen(serve, stderr=logs, stdout=subprocess.DEVNULL)
    sender = stowplan.ZmqSender(batches, receipts, resend_after=600, context=ctx)
    try:
        thread.start()
        packer_procs.await_contact(sender)
        sender.send(packer_procs.make_batch(0, 0))
        first = sender.flush(timeout=30)
        assert [(r["run"], r["step"], r["accepted"], r["rejected"], r["duplicate"]) for r in first] == [(0, 0, 12, 1, False)]
        # Frozen, the packer cannot take the next batch; killed, it loses it.
        packer.send_signal(signal.SIGSTOP)
        sender.send(packer_procs.make_batch(0, 1))
        time.sleep(0.3)
        assert sender.unacked == [("batch", 0, 1)]
        packer.send_signal(signal.SIGKILL)
        packer.wait()
        packer = subprocess.Popen(serve, stderr=logs, stdout=subprocess.DEVNULL)
        # The new incarnation makes the sender resend at once (resend_after is 10 minutes).
        again = sender.flush(timeout=30)
        assert sender.resent >= 1
        assert [(r["step"], r["duplicate"]) for r in again] == [(1, False)]
        sender.send(packer_procs.make_batch(0, 2))
        sender.flush(timeout=30)
        deadline = time.time() + 30
        while not all((r, s) in raw for r in range(2) for s in range(3)):
            assert time.time() < deadline, f"steps received: {sorted(raw)}"
            time.sleep(0.05)
        # A rank started with another dp is refused with the reason.
        with stowplan.ZmqRankClient(rank_ep, 0, 3, context=ctx) as wrong:
            with pytest.raises(stowplan.InvalidArgumentError, match="dp 3"):
                wrong.receive(timeout=10)
    finally:
        stop.set()
        thread.join()
        sender.close()
        packer.kill()
        packer.wait()
        logs.close()
    keys = []
    for step in range(3):
        for r in range(2):
            b = stowplan._stowplan.decode_rank_batch(raw[(r, step)])
            keys += [(int(b.sample_steps[i]), int(b.sample_indices[i])) for mb in b.micro_batches for i in mb.samples.tolist()]
    assert sorted(keys) == [(s, i) for s in range(3) for i in range(12)], "every sample exactly once"

    # The receiver against a stand-in packer: steps out of order and a copy.
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    with stowplan.ZmqRankClient(f"tcp://127.0.0.1:{port}", 0, 2, timeout=10, prefetch=4, context=ctx) as rx:
        assert router.poll(5000)
        peer, hello = router.recv_multipart()
        assert hello == stowplan._stowplan.encode_rank_hello(0, 2, 0)
        for step in (2, 0, 0, 1):
            router.send_multipart([peer, raw[(0, step)]])
        assert [rx.receive().step for _ in range(3)] == [0, 1, 2]
        acks: List[bytes] = []
        ack_bytes = {stowplan._stowplan.encode_rank_ack(0, s) for s in range(3)}
        deadline = time.time() + 10
        while len(acks) < 4:  # hellos aside
            assert time.time() < deadline, acks
            if router.poll(100):
                m = router.recv_multipart()[1]
                acks += [m] if m in ack_bytes else []
        assert sorted(acks) == sorted(stowplan._stowplan.encode_rank_ack(0, s) for s in (2, 0, 0, 1))
        with pytest.raises(stowplan.StowplanTimeoutError, match="step 3"):
            rx.receive(timeout=0.2)
    router.close()
    ctx.term()


def test_zmq_rank_client_raises_what_the_packer_sent_from_receive_however_soon_it_came(monkeypatch):
    """What the packer sends that the rank refuses (here bytes that are no batch) is raised by
    receive(), also when it came before the constructor returned: the constructor raises only
    its own connect's failure. (The constructor took either once, by timing, and the refused
    rank of test_zmq_lost_batch_resent_and_receiver_order failed in its constructor.)"""
    import threading
    import types

    import zmq

    import stowplan._zmq as szmq

    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    port = router.bind_to_random_port("tcp://127.0.0.1")
    answered = threading.Event()

    def stand_in() -> None:
        if router.poll(10_000):
            peer, _hello = router.recv_multipart()
            router.send_multipart([peer, b"not a rank batch"])
            answered.set()

    class LateConnected(threading.Event):
        """The client's connect signal, seen only once the reply is in and read."""

        def wait(self, timeout: Optional[float] = None) -> bool:
            done = super().wait(timeout)
            answered.wait(10)
            time.sleep(0.5)
            return done

    thread = threading.Thread(target=stand_in, daemon=True)
    thread.start()
    monkeypatch.setattr(szmq, "threading", types.SimpleNamespace(
        Event=LateConnected, Thread=threading.Thread, Condition=threading.Condition))
    try:
        with stowplan.ZmqRankClient(f"tcp://127.0.0.1:{port}", 0, 1, context=ctx) as rx:
            assert answered.is_set() and rx._error is not None  # it came before the constructor returned
            with pytest.raises(stowplan.StowplanError):
                rx.receive(timeout=5)
    finally:
        thread.join(10)
        router.close()
        ctx.term()


def test_zmq_arguments_are_checked():
    with pytest.raises(stowplan.InvalidArgumentError, match="rank must be below dp 2"):
        stowplan.ZmqRankClient("tcp://127.0.0.1:1", 2, 2)
    with pytest.raises(stowplan.InvalidArgumentError, match="prefetch must be in 1"):
        stowplan.ZmqRankClient("tcp://127.0.0.1:1", 0, 1, prefetch=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="timeout"):
        stowplan.ZmqRankClient("tcp://127.0.0.1:1", 0, 1, timeout=-1)
    with pytest.raises(stowplan.InvalidArgumentError, match="endpoint"):
        stowplan.ZmqRankClient("nonsense", 0, 1)
    with pytest.raises(stowplan.InvalidArgumentError, match="resend_after"):
        stowplan.ZmqSender(resend_after=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="endpoint"):
        stowplan.ZmqSender("nonsense")
    with pytest.warns(UserWarning, match="1 messages the packer never acknowledged"):
        with stowplan.ZmqSender("tcp://127.0.0.1:1", "tcp://127.0.0.1:2") as s:
            s.add_run(3, batch_size=4)
            assert s.unacked == [("add_run", 3)]
            with pytest.raises(stowplan.StowplanTimeoutError, match="1 messages not acknowledged"):
                s.flush(timeout=0.2)


# Many short timeouts beside the background threads, in a child process bounded in time:
# building the timeout error under the protocol core's lock, which waited for the GIL while
# the receiver's (or sender's) background thread held the GIL and waited for that lock,
# hung the whole process in 2 of 6 runs of 300 receives.
_TIMEOUT_STRESS = r"""
import sys, threading, stowplan, zmq
port, calls = int(sys.argv[1]), int(sys.argv[2])
ctx = zmq.Context()
errors = []

def guarded(fn):
    def run(*args):
        try:
            fn(*args)
        except BaseException as e:  # a failure in a thread must fail the run
            errors.append(repr(e))
    return run

@guarded
def rank(r):
    with stowplan.ZmqRankClient(f"tcp://127.0.0.1:{port}", r, 4, context=ctx) as rx:
        for _ in range(calls):
            try:
                rx.receive(timeout=0.01)
            except stowplan.StowplanTimeoutError as e:
                assert "step 0" in str(e), e
            else:
                errors.append("a step arrived from a dead port")

@guarded
def sender():
    with stowplan.ZmqSender(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}", context=ctx) as s:
        s.add_run(0, batch_size=1)
        for _ in range(calls // 3):
            try:
                s.flush(timeout=0.01)
            except stowplan.StowplanTimeoutError as e:
                assert "not acknowledged" in str(e), e

threads = [threading.Thread(target=rank, args=(r,)) for r in range(4)] + [threading.Thread(target=sender)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("ok", len(errors), *errors[:3])
"""


def test_zmq_short_timeouts_beside_the_background_threads_never_deadlock():
    port = packer_procs.free_ports(2)[0]
    for trial in range(3):
        try:
            run = subprocess.run(
                [sys.executable, "-W", "ignore", "-c", _TIMEOUT_STRESS, str(port), "300"],
                capture_output=True, text=True, timeout=120,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"trial {trial}: 4 ZmqRankClients and a ZmqSender timing out every 10 ms deadlocked the process")
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.split() == ["ok", "0"], run.stdout


# --- CURVE: encrypted, authenticated ZeroMQ ---------------------------------------------------

def _certificates(tmp_path: pathlib.Path) -> pathlib.Path:
    """Certificates made with pyzmq (the same format `stowplan keys` writes)."""
    import zmq.auth

    keys = tmp_path / "keys"
    keys.mkdir()
    for name in ("packer", "rank0", "stranger"):
        zmq.auth.create_certificates(str(keys), name)
        os.chmod(keys / f"{name}.key_secret", 0o600)
    return keys


def test_zmq_curve_arguments_are_checked(tmp_path):
    keys = _certificates(tmp_path)
    with pytest.raises(stowplan.InvalidArgumentError, match="give both"):
        stowplan.ZmqRankClient("tcp://127.0.0.1:1", 0, 1, curve_server_key=keys / "packer.key")
    with pytest.raises(stowplan.InvalidArgumentError, match="give both"):
        stowplan.ZmqSender("tcp://127.0.0.1:1", curve_secret_key=keys / "rank0.key_secret")
    with pytest.raises(stowplan.InvalidArgumentError, match="no secret-key line"):
        stowplan.ZmqSender(curve_server_key=keys / "packer.key", curve_secret_key=keys / "rank0.key")
    with pytest.raises(stowplan.InvalidArgumentError, match="missing"):
        stowplan.ZmqSender(curve_server_key=keys / "missing.key", curve_secret_key=keys / "rank0.key_secret")
    os.chmod(keys / "rank0.key_secret", 0o644)
    with pytest.raises(stowplan.InvalidArgumentError, match="chmod 600"):
        stowplan.ZmqRankClient(curve_server_key=keys / "packer.key", curve_secret_key=keys / "rank0.key_secret")


def curve_binary() -> str:
    """A `stowplan` built with CURVE (`--config .cargo/system-libzmq.toml`; `cargo xtask
    test` builds one when the system libzmq is installed and passes it as STOWPLAN_CURVE_BIN)."""
    path = os.environ.get("STOWPLAN_CURVE_BIN")
    if not path or not os.path.isfile(path):
        if os.environ.get("STOWPLAN_REQUIRE_CURVE") == "1":
            raise AssertionError(f"a CURVE build of stowplan is required (STOWPLAN_CURVE_BIN={path!r})")
        pytest.skip("no CURVE build of stowplan (STOWPLAN_CURVE_BIN; needs the system libzmq)")
    return path


def test_zmq_curve_admits_only_listed_keys(tmp_path):
    binary = curve_binary()
    # The packer's pair and the orchestrator's from `stowplan keys`; the rank's and the
    # stranger's from pyzmq: one format.
    keys = _certificates(tmp_path)
    subprocess.run([binary, "keys", str(tmp_path / "own"), "packer"], check=True, stdout=subprocess.DEVNULL)
    out = subprocess.run([binary, "keys", str(tmp_path / "own"), "orchestrator", "--json"], check=True,
                         stdout=subprocess.PIPE).stdout
    assert json.loads(out)["public_key"] in (tmp_path / "own" / "orchestrator.key").read_text()
    clients = tmp_path / "clients"
    clients.mkdir()
    for cert in (keys / "rank0.key", tmp_path / "own" / "orchestrator.key"):
        (clients / cert.name).write_bytes(cert.read_bytes())
    server_pub = tmp_path / "own" / "packer.key"
    batches, receipts, rank_ep = (f"tcp://127.0.0.1:{p}" for p in packer_procs.free_ports(3))
    serve = [binary, "serve", "--transport", "zmq", "--state-dir", str(tmp_path / "state"),
             "--capacity", str(packer_procs.SEQ_LEN), "--dp", "1", "--batch-size", "12", "--wait-timeout", "0.2",
             "--zmq-batches", batches, "--zmq-receipts", receipts, "--zmq-ranks", rank_ep,
             "--zmq-curve-secret", str(tmp_path / "own" / "packer.key_secret"), "--zmq-curve-clients", str(clients)]
    logs = open(tmp_path / "serve.log", "wb")
    packer = subprocess.Popen(serve, stderr=logs, stdout=subprocess.DEVNULL)
    try:
        # Without keys, or with a key the packer does not list: nothing gets through.
        with pytest.warns(UserWarning, match="never acknowledged"):
            with stowplan.ZmqSender(batches, receipts, resend_after=600) as plain:
                plain.send(packer_procs.make_batch(0, 5))
                with pytest.raises(stowplan.StowplanTimeoutError):
                    plain.flush(timeout=2)
        with stowplan.ZmqRankClient(rank_ep, 0, 1, timeout=1, curve_server_key=server_pub,
                                  curve_secret_key=keys / "stranger.key_secret") as stranger:
            with pytest.raises(stowplan.StowplanTimeoutError, match="clients directory holds this client's public key"):
                stranger.receive()
        # The listed orchestrator and rank: every accepted sample once, encrypted. (A packer
        # started without a checkpoint takes messages once a rank has said hello.)
        with stowplan.ZmqRankClient(rank_ep, 0, 1, timeout=30, curve_server_key=server_pub,
                                  curve_secret_key=keys / "rank0.key_secret") as rank:
            with stowplan.ZmqSender(batches, receipts, curve_server_key=server_pub,
                                    curve_secret_key=tmp_path / "own" / "orchestrator.key_secret") as sender:
                packer_procs.await_contact(sender)
                sender.send(packer_procs.make_batch(0, 0))
                [receipt] = sender.flush(timeout=30)
                assert (receipt["step"], receipt["accepted"], receipt["duplicate"]) == (0, 12, False)
            batch = rank.receive()
        keys_seen = sorted((int(batch.sample_steps[i]), int(batch.sample_indices[i]))
                           for mb in batch.micro_batches for i in mb.samples.tolist())
        assert keys_seen == [(0, i) for i in range(12)], "the plain sender's batch (step 5) never arrived"
    finally:
        packer.kill()
        packer.wait()
        logs.close()
    assert b"refused a CURVE client" in (tmp_path / "serve.log").read_bytes()
