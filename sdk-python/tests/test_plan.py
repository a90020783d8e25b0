"""Static pack plans (the static pack plan contract) from Python: one test per scenario of the contract, the length
cache (multiprocessing workers byte-identical to serial, crash resume, waiting ranks,
fingerprints), PackedDataset with a sampler and DataLoader, and checksums that match the
Rust API, the CLI and an independent hashlib encoding."""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import pathlib
import random
import struct
import threading
import time
from typing import Any, Dict, List

import numpy as np
import pytest

import stowplan
from conftest import WORKLOADS

# The checksums the Rust tests (tests/tests/static_plans.rs) and .ci/run's CLI check record
# for the same inputs.
SFT_RAW = "52ea8f554eb03b175bf28bc49e3079ae18e0e0b6fde969093e46db4ddaac99c0"
SFT_ALIGNED = "73dac707ed40382aa2c9b79e277155a214f1aaa4d3dc7ebd90964c2cd624dc31"
DOCS_RAW = "91be2b30eb63eb8ea8dfa3502beb5c34c1e552987e449f43f3529e14d2f00621"
DOCS_ALIGNED = "99091bdfbffa874e2671f2a1cccfb8ecadad68451a4fea34ca6d77e7adaddacc"


def workload(name: str) -> np.ndarray:
    return np.loadtxt(WORKLOADS / name, dtype=np.int64)


def config(**training: Any) -> Dict[str, Any]:
    return {"training": training, "template": {"max_length": 4096}}


def reference_checksum(packs: List[List[int]]) -> str:
    """The documented canonical encoding, hashed with hashlib."""
    h = hashlib.sha256(struct.pack("<Q", len(packs)))
    for p in packs:
        h.update(struct.pack("<I", len(p)) + np.asarray(p, dtype="<u4").tobytes())
    return h.hexdigest()


def remainder_lengths() -> List[int]:
    return [50 + (i * 7919) % 900 for i in range(70)]


def vl_length(record: Dict[str, Any]) -> int:
    """A stand-in for a vision-language template: text tokens plus image patches."""
    h, w = record["image"]
    return record["text"] + record["images"] * (h // 28) * (w // 28)


def vl_dataset(n: int) -> List[Dict[str, Any]]:
    return [
        {"text": 20 + (i * 2654435761) % 1500, "images": i % 3, "image": (224 + 28 * (i % 5), 224 + 28 * (i % 7))}
        for i in range(n)
    ]


# --- Requirement: Stage-1 dataset-level packing is static-only ----------------------------


def test_stage1_dynamic_packing_mode_fails_fast() -> None:
    with pytest.raises(stowplan.ConfigError, match="set training.packing_mode=static"):
        stowplan.PackingConfig.from_dict(config(packing=True, packing_mode="dynamic"), world_size=1)
    c = stowplan.PackingConfig.from_dict(config(packing=True), world_size=1)
    assert (c.packing_mode, c.wait_timeout_s, c.precompute_workers, c.persist_every) == ("static", 7200, 8, None)
    assert isinstance(stowplan.ConfigError("x"), ValueError)


def test_packing_config_is_one_frozen_native_class() -> None:
    """PackingConfig is the native class: frozen, compared by value, picklable
    (validated again on load), and its batch report is logged when it is built."""
    import logging
    import pickle

    c = stowplan.PackingConfig.from_dict(config(packing=True, gradient_accumulation_steps=2), world_size=4)
    assert type(c) is stowplan._stowplan.PackingConfig
    with pytest.raises(AttributeError):
        c.capacity = 1  # type: ignore[misc]
    back = pickle.loads(pickle.dumps(c))
    assert back == c and back.batch_report == c.batch_report and back.world_size == 4
    assert c != stowplan.PackingConfig.from_dict(config(packing=True, gradient_accumulation_steps=3), world_size=4)
    assert c != "not a config" and hash(back) == hash(c) and len({c, back}) == 1
    getters = {n for n, v in vars(type(c)).items() if type(v).__name__ == "getset_descriptor"}
    former = {"packing_length", "packing_length_key"}  # deprecated names of capacity, capacity_key
    assert set(c.to_dict()) == getters - former and c.to_dict()["world_size"] == 4
    assert repr(c).startswith("PackingConfig(packing=True, packing_mode='static', capacity=") and "Some(" not in repr(c)
    # The pickle holds the resolved values, not the trainer configuration it came from.
    secret = stowplan.PackingConfig.from_dict({**config(packing=True), "custom": {"token": "s3cr3t"}}, world_size=1)
    assert b"s3cr3t" not in pickle.dumps(secret) and pickle.loads(pickle.dumps(secret)) == secret
    records = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("stowplan.plan")
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.INFO)
    try:
        stowplan.PackingConfig.from_dict(config(packing=True), world_size=2)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old)
    assert any("effective batch" in r.getMessage() for r in records)
    with pytest.raises(stowplan.InvalidArgumentError, match="config must be JSON-serializable"):
        stowplan.PackingConfig.from_dict({"training": {"packing": object()}}, world_size=1)


def test_stage1_eval_packing_defaults_to_static_pack_plan_behavior() -> None:
    c = stowplan.PackingConfig.from_dict(config(packing=True, dataloader_drop_last=True), world_size=4)
    assert c.eval_packing
    data = [{"id": i} for i in range(70)]
    lengths = remainder_lengths()
    train = stowplan.plan_dataset(data, lambda s: lengths[s["id"]], config=c, log=False)
    evaluation = stowplan.plan_dataset(data, lambda s: lengths[s["id"]], config=c, eval=True, log=False)
    # Same static pipeline and raw plan; eval never drops.
    assert train.raw_checksum == evaluation.raw_checksum
    assert train.drop_last and not evaluation.drop_last
    covered = {i for p in range(len(evaluation)) for i in evaluation[p]}
    assert covered == set(range(70))
    off = stowplan.PackingConfig.from_dict(config(packing=True, eval_packing=False), world_size=4)
    assert not off.eval_packing


# --- Requirement: static pack-plan mode yields a countable packed dataset ----------------


@pytest.mark.parametrize("allow", [False, True])
def test_static_packing_produces_a_fixed_length_pack_dataset_for_an_epoch(allow: bool) -> None:
    lengths = workload("rl-math-8k.txt")
    samples = [{"input_ids": np.zeros(int(n), dtype=np.int32), "index": i} for i, n in enumerate(lengths)]
    plan = stowplan.StaticPackPlan.from_lengths(lengths, capacity=8192, world_size=8, allow_single_long=allow)
    ds = stowplan.PackedDataset(samples, plan)
    assert len(ds) == plan.n_aligned_packs == len(plan.aligned_packs)
    assert len(ds) % 8 == 0
    for i in range(len(ds)):
        pack = ds[i]
        total = sum(len(s["input_ids"]) for s in pack)
        single_long = len(pack) == 1 and total >= 8192
        assert total <= 8192 or (allow and single_long)
        assert [s["index"] for s in pack] == sorted(s["index"] for s in pack)
    with pytest.raises(IndexError):
        ds[len(ds)]


# --- Requirement: deterministic and epoch-invariant ---------------------------------------


def test_identical_inputs_produce_identical_pack_plans() -> None:
    lengths = workload("sft-chat-200k.txt")
    plans = [
        stowplan.StaticPackPlan.from_lengths(lengths, capacity=16384, world_size=8, backend=b)
        for b in ("wasm", "native", "wasm")
    ]
    assert plans[0] == plans[1] == plans[2]
    assert (plans[0].raw_checksum, plans[0].aligned_checksum) == (SFT_RAW, SFT_ALIGNED)
    # The checksum is the documented encoding.
    raw = plans[0].raw_packs()
    assert reference_checksum(raw) == SFT_RAW
    aligned = [raw[p] for p in plans[0].aligned_packs.tolist()]
    assert reference_checksum(aligned) == SFT_ALIGNED


def test_pretrain_docs_checksums_match_the_cli_and_rust() -> None:
    lengths = workload("pretrain-docs-1m.txt")
    plan = stowplan.StaticPackPlan.from_lengths(lengths, capacity=32768, world_size=8, allow_single_long=True)
    assert (plan.raw_checksum, plan.aligned_checksum) == (DOCS_RAW, DOCS_ALIGNED)
    assert len(plan.single_long) == 1048


# --- Requirement: deterministic DDP remainder semantics ----------------------------------


def test_ddp_drop_last_pads_repeats_deterministically_when_disabled(caplog: pytest.LogCaptureFixture) -> None:
    plan = stowplan.StaticPackPlan.from_lengths(remainder_lengths(), capacity=1000, world_size=4)
    n = plan.n_raw_packs
    assert n % 4 != 0
    assert len(plan) == -(-n // 4) * 4
    assert plan.repeated == list(range(plan.pad_needed))
    assert plan.aligned_packs.tolist() == list(range(n)) + list(range(plan.pad_needed))
    with caplog.at_level(logging.INFO, logger="stowplan.plan"):
        plan.log()
    text = caplog.text
    assert f"N_raw_packs={n} N_aligned_packs={len(plan)} world_size=4 dataloader_drop_last=false" in text
    assert f"pad_needed={plan.pad_needed} repeated raw packs {plan.repeated}" in text
    assert plan.raw_checksum in text and plan.aligned_checksum in text


def test_ddp_drop_last_drops_a_deterministic_remainder_subset_when_enabled() -> None:
    plan = stowplan.StaticPackPlan.from_lengths(remainder_lengths(), capacity=1000, world_size=4, drop_last=True)
    n = plan.n_raw_packs
    assert len(plan) == n // 4 * 4
    assert plan.aligned_packs.tolist() == list(range(len(plan)))
    assert plan.dropped_packs == n % 4
    again = stowplan.StaticPackPlan.from_lengths(remainder_lengths(), capacity=1000, world_size=4, drop_last=True)
    assert again == plan
    assert plan.realign(4, drop_last=False).raw_checksum == plan.raw_checksum


# --- Requirement: planning lengths (multimodal) and the length cache ---------------------


def test_multimodal_samples_have_deterministic_planning_lengths(tmp_path: pathlib.Path) -> None:
    data = vl_dataset(200_000)
    cfg = {"template": "qwen2-vl", "max_length": 16384}
    serial = stowplan.compute_lengths(data, vl_length, cache_dir=tmp_path / "a", source="vl.jsonl", config=cfg, workers=1)
    parallel = stowplan.compute_lengths(
        data, vl_length, cache_dir=tmp_path / "b", source="vl.jsonl", config=cfg, workers=8
    )
    assert np.array_equal(serial, parallel)
    assert (tmp_path / "a" / "lengths.splc").read_bytes() == (tmp_path / "b" / "lengths.splc").read_bytes()
    plan = stowplan.StaticPackPlan.from_lengths(serial, capacity=16384)
    assert int(plan.raw_tokens.max()) <= 16384


class FlakyLength:
    """A length function that fails on one sample (a crashed tokenizer), then recovers."""

    def __init__(self, fail_at: int) -> None:
        self.fail_at = fail_at
        self.calls = 0

    def __call__(self, record: Dict[str, Any]) -> int:
        self.calls += 1
        if record["text"] == self.fail_at:
            raise RuntimeError("tokenizer crashed")
        return vl_length(record)


def test_length_cache_resumes_after_a_crash(tmp_path: pathlib.Path) -> None:
    data = vl_dataset(5000)
    fail_at = data[3210]["text"]
    first = [i for i, r in enumerate(data) if r["text"] == fail_at][0]
    flaky = FlakyLength(fail_at)
    with pytest.raises(RuntimeError, match="tokenizer crashed"):
        stowplan.compute_lengths(data, flaky, cache_dir=tmp_path, source="d", workers=1, persist_every=500)
    cache = stowplan.LengthCache(tmp_path, "d", 5000, None, 500)
    assert cache.known == first
    counting = FlakyLength(-1)
    lengths = stowplan.compute_lengths(data, counting, cache_dir=tmp_path, source="d", workers=1)
    # Only the missing lengths are computed, plus the 8 cached ones measured again (verify=8).
    assert counting.calls == 5000 - first + 8
    assert lengths.tolist() == [vl_length(r) for r in data]


def test_length_cache_mismatch_and_bad_lengths_fail_fast(tmp_path: pathlib.Path) -> None:
    data = vl_dataset(100)
    stowplan.compute_lengths(data, vl_length, cache_dir=tmp_path, source="a.jsonl", config={"m": 1}, workers=1)
    with pytest.raises(stowplan.CacheMismatchError, match='source: cached "a.jsonl", now "b.jsonl"'):
        stowplan.compute_lengths(data, vl_length, cache_dir=tmp_path, source="b.jsonl", config={"m": 1})
    with pytest.raises(stowplan.CacheMismatchError, match="config.m: cached 1, now 2"):
        stowplan.compute_lengths(data, vl_length, cache_dir=tmp_path, source="a.jsonl", config={"m": 2}, rank=1)
    # Lengths that changed behind the fingerprint's back are caught on reuse.
    with pytest.raises(stowplan.CacheMismatchError, match="not deterministic"):
        stowplan.compute_lengths(data, lambda r: vl_length(r) + 1, cache_dir=tmp_path, source="a.jsonl", config={"m": 1})
    with pytest.raises(stowplan.InvalidArgumentError, match="must return an int"):
        stowplan.compute_lengths(data, lambda r: "7", cache_dir=tmp_path / "x", source="a", workers=1)
    with pytest.raises(stowplan.InvalidArgumentError, match="length of sample 0 must be in 1"):
        stowplan.compute_lengths(data, lambda r: 0, cache_dir=tmp_path / "y", source="a", workers=1)
    with pytest.raises(stowplan.InvalidArgumentError, match="workers must be a positive integer"):
        stowplan.compute_lengths(data, vl_length, cache_dir=tmp_path, source="a.jsonl", workers=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="persist_every must be a positive integer"):
        stowplan.LengthCache(tmp_path / "z", "a", 3, None, 0)


def test_non_rank0_waits_for_rank0_with_the_configured_timeout(tmp_path: pathlib.Path) -> None:
    data = vl_dataset(2000)
    with pytest.raises(stowplan.StowplanTimeoutError, match="packing_wait_timeout_s"):
        stowplan.compute_lengths(data, vl_length, cache_dir=tmp_path, source="d", rank=3, wait_timeout_s=0.3)
    result: Dict[str, Any] = {}

    def waiter() -> None:
        result["lengths"] = stowplan.compute_lengths(data, vl_length, cache_dir=tmp_path, source="d", rank=1)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    rank0 = stowplan.compute_lengths(data, vl_length, cache_dir=tmp_path, source="d", workers=2, persist_every=100)
    t.join(timeout=30)
    assert np.array_equal(result["lengths"], rank0)


# --- Requirement: effective batch ---------------------------------------------------------


def test_effective_batch_size_is_honored_after_packing_forces_batch_size_1() -> None:
    c = stowplan.PackingConfig.from_dict(
        config(packing=True, effective_batch_size=64, per_device_train_batch_size=4, gradient_accumulation_steps=2),
        world_size=8,
    )
    assert (c.per_device_train_batch_size, c.gradient_accumulation_steps, c.realized_packs_per_step) == (1, 8, 64)
    assert "requested 64 packs/step" in c.batch_report


def test_global_effective_batch_is_preserved_when_effective_batch_size_is_unset() -> None:
    c = stowplan.PackingConfig.from_dict(
        config(packing=True, per_device_train_batch_size=4, gradient_accumulation_steps=2), world_size=8
    )
    assert (c.per_device_train_batch_size, c.gradient_accumulation_steps) == (1, 8)
    assert c.configured_packs_per_step == c.realized_packs_per_step == 64


def test_fail_fast_when_effective_batch_size_is_not_world_size_divisible() -> None:
    with pytest.raises(stowplan.ConfigError, match="not divisible by world_size = 8.*e.g. 56 or 64"):
        stowplan.PackingConfig.from_dict(config(packing=True, effective_batch_size=60), world_size=8)


def test_static_mode_warns_on_partial_epoch_accumulation_windows(caplog: pytest.LogCaptureFixture) -> None:
    c = stowplan.PackingConfig.from_dict(config(packing=True, gradient_accumulation_steps=8), world_size=4)
    data = [{"id": i} for i in range(70)]
    lengths = remainder_lengths()
    with caplog.at_level(logging.WARNING, logger="stowplan.plan"):
        plan = stowplan.plan_dataset(data, lambda s: lengths[s["id"]], config=c, log=False)
    assert plan.per_rank % 8 != 0
    assert "partial accumulation window" in caplog.text
    exact = stowplan.PackingConfig.from_dict(config(packing=True, gradient_accumulation_steps=1), world_size=4)
    assert exact.accumulation_warning(plan) is None


# --- PackedDataset with a sampler and DataLoader, config errors, saved plans --------------


class EpochDataset(list):  # type: ignore[type-arg]
    def set_epoch(self, epoch: int) -> None:
        pass


def test_packed_dataset_with_a_shuffling_sampler() -> None:
    lengths = remainder_lengths()
    data = [{"id": i, "n": n} for i, n in enumerate(lengths)]
    plan = stowplan.StaticPackPlan.from_lengths(lengths, capacity=1000, world_size=2)
    ds = stowplan.PackedDataset(data, plan)
    # A sampler shuffles pack indices per epoch (as torch's DistributedSampler does); the
    # packs themselves never change and every rank sees the same number.
    for epoch in range(3):
        order = list(range(len(ds)))
        random.Random(epoch).shuffle(order)
        ranks = [order[r::2] for r in range(2)]
        assert len(ranks[0]) == len(ranks[1])
        seen = sorted(s["id"] for r in ranks for i in r for s in ds[i])
        assert set(seen) == set(range(70))
    with pytest.raises(stowplan.InvalidArgumentError, match="dataset has 3 samples"):
        stowplan.PackedDataset(data[:3], plan)
    with pytest.raises(stowplan.InvalidArgumentError, match="set_epoch"):
        stowplan.PackedDataset(EpochDataset(data), plan)
    assert len(stowplan.PackedDataset(EpochDataset(data), plan, epoch_invariant=True)) == len(plan)


def test_packed_dataset_with_torch_dataloader() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, RandomSampler

    lengths = remainder_lengths()
    data = [{"input_ids": np.arange(n)} for n in lengths]
    ds = stowplan.PackedDataset(data, stowplan.StaticPackPlan.from_lengths(lengths, capacity=1000))
    loader = DataLoader(ds, batch_size=None, sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(0)))
    packs = list(loader)
    assert len(packs) == len(ds)
    assert sum(len(s["input_ids"]) for p in packs for s in p) == sum(lengths)


def test_config_errors_name_the_key() -> None:
    cases = [
        (config(packing=True, packing_length=4096), "training.packing_length is deprecated"),
        (config(packing=True, packing_length_precompute_workers=0), "packing_length_precompute_workers must be a positive"),
        (config(packing=True, packing_length_cache_persist_every=-1), "packing_length_cache_persist_every must be"),
        (config(packing=True, packing_mod="static"), "unknown key training.packing_mod"),
        ({"training": {"packing": True}}, "set template.max_length"),
    ]
    for cfg, message in cases:
        with pytest.raises(stowplan.ConfigError, match=message):
            stowplan.PackingConfig.from_dict(cfg, world_size=2)
    with pytest.raises(stowplan.InvalidArgumentError, match="world_size must be"):
        stowplan.PackingConfig.from_dict(config(), world_size=-1)


def test_plan_errors_name_the_argument(tmp_path: pathlib.Path) -> None:
    with pytest.raises(stowplan.InvalidArgumentError, match="capacity must be"):
        stowplan.StaticPackPlan.from_lengths([1, 2], capacity=0)
    with pytest.raises(stowplan.InvalidArgumentError, match="world_size must be"):
        stowplan.StaticPackPlan.from_lengths([1, 2], capacity=8, world_size=0)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"lengths\[1\] = 0"):
        stowplan.StaticPackPlan.from_lengths([1, 0], capacity=8)
    with pytest.raises(stowplan.InvalidArgumentError, match=r"lengths\[0\] must be in 0..=2\*\*64-1 \(got -1\)"):
        stowplan.StaticPackPlan.from_lengths([-1], capacity=8)
    with pytest.raises(stowplan.InfeasibleError, match="produced no packs"):
        stowplan.StaticPackPlan.from_lengths([9, 8], capacity=8)
    with pytest.raises(stowplan.InfeasibleError, match="drops all 1 packs"):
        stowplan.StaticPackPlan.from_lengths([3], capacity=8, world_size=2, drop_last=True)
    with pytest.raises(stowplan.StowplanIOError):
        stowplan.StaticPackPlan.load(tmp_path / "missing.json")


def test_saved_plans_round_trip(tmp_path: pathlib.Path) -> None:
    plan = stowplan.StaticPackPlan.from_lengths(remainder_lengths(), capacity=1000, world_size=4)
    path = tmp_path / "plan.json"
    plan.save(path)
    assert stowplan.StaticPackPlan.load(path) == plan
    doc = json.loads(path.read_text())
    assert doc["raw_checksum"] == plan.raw_checksum and doc["format"] == "stowplan.static-pack-plan/2"
    doc["aligned_plan"][0] = 1
    path.write_text(json.dumps(doc))
    with pytest.raises(stowplan.CacheMismatchError):
        stowplan.StaticPackPlan.load(path)


def test_plan_dataset_end_to_end(tmp_path: pathlib.Path) -> None:
    data = vl_dataset(3000)
    cfg = stowplan.PackingConfig.from_dict(
        {"training": {"packing": True, "packing_allow_single_long": True}, "template": {"max_length": 2048},
         "custom": {"train_jsonl": "/data/vl.jsonl"}},
        world_size=4,
    )
    plan = stowplan.plan_dataset(data, vl_length, config=cfg, cache_dir=tmp_path, log=False)
    again = stowplan.plan_dataset(data, vl_length, config=cfg, cache_dir=tmp_path, rank=2, log=False)
    assert plan == again
    direct = stowplan.StaticPackPlan.from_lengths(
        [vl_length(r) for r in data], capacity=2048, world_size=4, allow_single_long=True
    )
    assert plan.aligned_checksum == direct.aligned_checksum
    assert multiprocessing.current_process().name == "MainProcess"


# --- Plans under further limits (vision-language data) ----------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(1, 120), st.integers(0, 60), st.integers(0, 4)), min_size=1, max_size=80),
    caps=st.tuples(st.integers(20, 150), st.integers(1, 5)),
    max_segments=st.sampled_from([0, 1, 3]),
    method=st.sampled_from(["balanced", "bfd", "ffd", "next-fit"]),
    single=st.booleans(),
)
def test_limited_plans_keep_every_limit(rows: List[Any], caps: Any, max_segments: int, method: str, single: bool) -> None:
    tokens = [r[0] for r in rows]
    resources = {"image_tokens": [r[1] for r in rows], "images": [r[2] for r in rows]}
    limits = {"image_tokens": caps[0], "images": caps[1]}
    try:
        plan = stowplan.StaticPackPlan.from_lengths(
            tokens, capacity=100, resources=resources, limits=limits, max_segments=max_segments,
            method=method, allow_single_long=single, world_size=2,
        )
    except stowplan.InfeasibleError:
        # Only when every sample is long and none may stay.
        assert not single
        return
    over = [t >= 100 or r[1] > caps[0] or r[2] > caps[1] for t, r in zip(tokens, rows)]
    seen = sorted(i for p in plan.raw_packs() for i in p)
    assert seen == [i for i in range(len(rows)) if single or not over[i]]
    loads = plan.resource_loads
    assert loads.shape == (plan.n_raw_packs, 2)
    for p, members in enumerate(plan.raw_packs()):
        got = [sum(resources[n][i] for i in members) for n in ("image_tokens", "images")]
        assert loads[p].tolist() == got
        if len(members) > 1 or not over[members[0]]:
            assert sum(tokens[i] for i in members) <= 100
            assert got[0] <= caps[0] and got[1] <= caps[1]
            assert max_segments == 0 or len(members) <= max_segments
    assert plan.lower_bound == max(plan.lower_bounds.values()) + len(plan.single_long)
    assert plan.limits == limits and plan.method == method and plan.max_segments == max_segments
    # Saved (format 3), loaded and verified: the same plan; WASM and native agree.
    again = stowplan.StaticPackPlan._from_state(plan.to_json())
    assert again.raw_packs() == plan.raw_packs() and again.limits == limits
    assert json.loads(plan.to_json())["format"] == "stowplan.static-pack-plan/3"
    native = stowplan.StaticPackPlan.from_lengths(
        tokens, capacity=100, resources=resources, limits=limits, max_segments=max_segments,
        method=method, allow_single_long=single, world_size=2, backend="native",
    )
    assert native.raw_checksum == plan.raw_checksum


def test_limited_plan_errors_name_the_argument() -> None:
    plan = stowplan.StaticPackPlan.from_lengths
    with pytest.raises(stowplan.InvalidArgumentError, match="method applies with limits or max_segments"):
        plan([1, 2], capacity=10, method="bfd")
    with pytest.raises(stowplan.InvalidArgumentError, match="resources needs limits"):
        plan([1, 2], capacity=10, resources={"images": [1, 1]})
    with pytest.raises(stowplan.InvalidArgumentError, match="limits has no cap for resources\\['images'\\]"):
        plan([1, 2], capacity=10, resources={"images": [1, 1]}, limits={"frames": 2})
    with pytest.raises(stowplan.InvalidArgumentError, match="limits\\['images'\\]"):
        plan([1, 2], capacity=10, resources={"images": [1, 1]}, limits={"images": 0})
    with pytest.raises(stowplan.InvalidArgumentError, match="method"):
        plan([1, 2], capacity=10, max_segments=2, method="worst-fit")
    with pytest.raises(stowplan.InfeasibleError, match="over a limit"):
        plan([1, 2], capacity=10, resources={"images": [3, 3]}, limits={"images": 2})
    # Without limits: a plan of tokens only, format 2, no limit attributes.
    p = plan([1, 2], capacity=10)
    assert (p.limits, p.method, p.resource_loads, p.lower_bounds, p.max_segments) == (None, None, None, None, 0)
    assert json.loads(p.to_json())["format"] == "stowplan.static-pack-plan/2"
