"""Writes the ``dist_*.json`` vectors: prime-rl's classic ``prepare_batch`` (trainer
``batch.py`` at ``b5daec1``: FFD packing, per-micro-batch padding, dummy micro-batches per
modality group, round robin ``i % W``) run on chosen inputs.

prime-rl's own files are loaded unmodified from a git checkout of
``PrimeIntellect-ai/prime-rl`` (``trainer/batch.py`` and ``transport/types.py`` at the
commit below); ``msgspec`` is the real package. The harness only builds ``TrainingSample``s
from the compact descriptions (see README.md), reads sample indices back from the token ids,
recognises dummies (every token with a false loss mask and a zero advantage) and names the
bin each micro-batch is (or copies).

Run: ``python make_distribute.py /path/to/prime-rl.git`` (a bare repository is enough).
"""

from __future__ import annotations

import json
import pathlib
import random
import subprocess
import sys
import types

COMMIT = "b5daec1cbb1254d60cc17ae3bce148d9e1248a9c"
HERE = pathlib.Path(__file__).resolve().parent


def load(git_dir: str) -> types.ModuleType:
    def source(path: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", git_dir, "show", f"{COMMIT}:src/prime_rl/{path}"], check=True, capture_output=True, text=True
        ).stdout

    for name in ("prime_rl", "prime_rl.transport", "prime_rl.trainer"):
        sys.modules[name] = types.ModuleType(name)
    modules = {}
    for name, path in (("prime_rl.transport.types", "transport/types.py"), ("prime_rl.trainer.batch", "trainer/batch.py")):
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(source(path), f"prime_rl/{path}", "exec"), module.__dict__)
        modules[name] = module
    return modules


def training_samples(types_mod, samples):
    out, idxs = [], []
    for i, s in enumerate(samples):
        if isinstance(s, list):
            s = {"lora": s[0], "prompt_len": s[1], "completion_len": s[2]}
        p, c = s["prompt_len"], s["completion_len"]
        ids = [(i + 1) * 100000 + j for j in range(p + c)]
        mm = None
        if s.get("multimodal"):
            mm = {"pixel_values": types_mod.EncodedTensor(dtype="float32", shape=[1], data=b"\0" * 4)}
        out.append(
            types_mod.TrainingSample(
                prompt_ids=ids[:p],
                prompt_mask=[False] * p,
                completion_ids=ids[p:],
                completion_mask=[True] * c,
                completion_logprobs=[-0.25] * c,
                completion_temperatures=[1.0] * c,
                env_name="env",
                advantage=s.get("advantage", 1.0),
                reward=1.0,
                mm_kwargs=mm,
                training_mode=s.get("training_mode", "rl"),
            )
        )
        idxs.append(s.get("lora", 0))
    return out, idxs


def members(mb):
    seen = []
    for t in mb.input_ids:
        if t >= 100000 and (t // 100000 - 1) not in seen:
            seen.append(t // 100000 - 1)
    return seen


def run(modules, inp):
    batch = modules["prime_rl.trainer.batch"]
    rollouts, idxs = training_samples(modules["prime_rl.transport.types"], inp["samples"])
    multiple = inp.get("pad_to_multiple_of", 1)
    # The bins before distribution: the same packing functions, called separately.
    prepared = [(idx, batch.prepare_sample(r, inp["seq_len"])) for idx, r in zip(idxs, rollouts)]
    bins = [members(mb) for mb in batch.packed_samples_into_micro_bs(prepared, inp["seq_len"], inp["num_loras"])]
    rollouts, idxs = training_samples(modules["prime_rl.transport.types"], inp["samples"])
    try:
        per_gpu = batch.prepare_batch(rollouts, inp["seq_len"], inp["num_workers"], idxs, inp["num_loras"], multiple)
    except Exception as e:  # prime-rl's own exception
        return {"error": {"type": type(e).__name__, "message": str(e)}}
    per_rank = []
    for gpu in per_gpu:
        entries = []
        for mb in gpu:
            s = members(mb)
            entries.append(
                {
                    "bin": bins.index(s),
                    "samples": s,
                    "dummy": not any(mb.loss_mask) and all(a == 0.0 for a in mb.advantages),
                    "multimodal": mb.mm_kwargs is not None,
                    "num_tokens": len(mb.input_ids),
                }
            )
        per_rank.append(entries)
    return {"output": {"bins": bins, "per_rank": per_rank}}


def single(lengths):
    return [[0, 10, n - 10] for n in lengths]


def cases():
    rng = random.Random(60)
    yield "dist_b4_w4", "4 single-sample micro-batches (lengths 99..81) to 4 ranks; 0 dummies (copies of bin 0), round robin i % W", {
        "seq_len": 100, "num_workers": 4, "num_loras": 1, "samples": single([99, 93, 87, 81])}
    yield "dist_b5_w2", "5 single-sample micro-batches (lengths 99..75) to 2 ranks; 1 dummies (copies of bin 0), round robin i % W", {
        "seq_len": 100, "num_workers": 2, "num_loras": 1, "samples": single([99, 93, 87, 81, 75])}
    yield "dist_b6_w1", "6 single-sample micro-batches (lengths 99..69) to 1 ranks; 0 dummies (copies of bin 0), round robin i % W", {
        "seq_len": 100, "num_workers": 1, "num_loras": 1, "samples": single([99, 93, 87, 81, 75, 69])}
    yield "dist_err_w0", "num_workers 0 -> ZeroDivisionError", {
        "seq_len": 100, "num_workers": 0, "num_loras": 1, "samples": [[0, 10, 80], [0, 10, 70]]}
    yield "dist_b3_w8", "3 micro-batches to 8 ranks: 5 dummies, all copies of bin 0, in the last places", {
        "seq_len": 100, "num_workers": 8, "num_loras": 1, "samples": single([90, 80, 70])}
    yield "dist_pack_w3", "shared bins (first fit by descending length) dealt to 3 ranks, 2 dummies", {
        "seq_len": 100, "num_workers": 3, "num_loras": 1, "samples": single([60, 50, 40, 30, 20, 45, 35, 25])}
    yield "dist_mm_text_w2", "3 multimodal samples (a bin each) and 5 text ones to 2 ranks: each group completed apart", {
        "seq_len": 100, "num_workers": 2, "num_loras": 1,
        "samples": [{"lora": 0, "prompt_len": 5, "completion_len": 20, "multimodal": True}] * 3 + single([70, 60, 50, 40, 30])}
    yield "dist_mm_only_w3", "2 multimodal samples to 3 ranks: the dummy copies the first multimodal bin", {
        "seq_len": 64, "num_workers": 3, "num_loras": 1,
        "samples": [{"lora": 0, "prompt_len": 4, "completion_len": 10, "multimodal": True},
                    {"lora": 0, "prompt_len": 4, "completion_len": 30, "multimodal": True}]}
    yield "dist_two_loras_w2", "two LoRAs sharing bins, to 2 ranks", {
        "seq_len": 64, "num_workers": 2, "num_loras": 2,
        "samples": [[1, 4, 20], [0, 4, 30], [1, 4, 10], [0, 4, 12], [1, 4, 40], [0, 4, 3]]}
    yield "dist_pad8_w3", "pad_to_multiple_of 8: num_tokens after padding, dummies padded alike", {
        "seq_len": 100, "num_workers": 3, "num_loras": 1, "pad_to_multiple_of": 8, "samples": single([97, 61, 55, 33, 21])}
    yield "dist_training_modes_w2", "rl and sft samples never share a bin; one group of text for the deal", {
        "seq_len": 100, "num_workers": 2, "num_loras": 1,
        "samples": [{"lora": 0, "prompt_len": 10, "completion_len": 30, "training_mode": m} for m in ("rl", "sft", "rl", "sft", "rl")]}
    yield "dist_empty_w2", "no samples: every rank gets nothing", {
        "seq_len": 100, "num_workers": 2, "num_loras": 1, "samples": []}
    samples = [[rng.randrange(2), rng.randrange(8, 200), rng.randrange(1, 3000)] for _ in range(96)]
    samples[7] = {"lora": 0, "prompt_len": 64, "completion_len": 300, "multimodal": True}
    samples[40] = {"lora": 1, "prompt_len": 64, "completion_len": 900, "multimodal": True}
    yield "dist_rl_n96_w4", "96 RL samples (2 LoRAs, 2 multimodal) cut to 4096, padded to 16, to 4 ranks", {
        "seq_len": 4096, "num_workers": 4, "num_loras": 2, "pad_to_multiple_of": 16, "samples": samples}


def main() -> None:
    modules = load(sys.argv[1])
    for name, description, inp in cases():
        v = {"schema": "stowplan-peer-oracle/1", "name": name, "kind": "distribute", "description": description,
             "peer": "PrimeIntellect-ai/prime-rl", "peer_commit": COMMIT, "input": inp, **run(modules, inp)}
        (HERE / f"{name}.json").write_text(json.dumps(v, separators=(",", ":")) + "\n")
        print(name, "error" if "error" in v else sum(len(r) for r in v["output"]["per_rank"]))


if __name__ == "__main__":
    main()
