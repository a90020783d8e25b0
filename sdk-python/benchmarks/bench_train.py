"""Training throughput of a tiny Llama on the CPU with SDPA, per batching layout: random padded
batches, TRL's packing, transformers' BatchRebalanceSampler and stowplan's flat, rows and
padded layouts, under the same token budget per micro-batch.

Usage (in sdk-python/run_train_tests.sh's environment, or any with torch, transformers, TRL):
    python sdk-python/benchmarks/bench_train.py [--samples 384] [--budget 8192] [--steps 0]
        [--rounds 3] [--workload ../shared/workloads/sft-chat-200k.txt]
    python sdk-python/benchmarks/bench_train.py --samplers    # the padded samplers' plans only

The samples: ``--samples`` lengths drawn (seeded) from the workload, cut to 2,048 tokens, of
random token ids; one "epoch" is all of them. Every contender plans the epoch into
micro-batches of at most ``--budget`` computed tokens (BatchRebalanceSampler has no token cap:
it gets steps of 64 samples and as many accumulation steps as stowplan's padded sampler needs
for them, so both make about as many micro-batches):

- ``random`` — the samples in random order, as many per micro-batch as fit the budget padded
  to their longest; ``PaddingFreeCollator(layout="padded")``;
- ``trl`` — ``trl.pack_dataset(bfd)`` into rows of 2,048, four rows a micro-batch, TRL's
  padding-free ``DataCollatorForLanguageModeling`` (one (1, T) row);
- ``batch_rebalance`` — ``BatchRebalanceSampler``, padded collator;
- ``stowplan-flat`` / ``stowplan-rows`` — ``stowplan.hf.pack_dataset`` into rows of 2,048,
  ``TokenBudgetBatchSampler`` (budget), collated flat (1, T) or as (B, 2,048) rows;
- ``stowplan-padded`` — ``PaddedBatchSampler`` (budget, steps of 64 samples), padded collator.

Each measurement is a fresh process (one per contender per round, rounds interleaved, the order
rotating) that trains its micro-batches (forward, backward, AdamW step) after one
warm-up and reports real (non-padding) tokens per second; ``--steps 0`` (the default) times
the whole epoch, since a plan's first micro-batches are not its average. The parent prints the medians, the
computed tokens per real token and micro-batches per epoch (from the plans), and the loss
match: the largest logit difference of each contender's first micro-batch against its samples
run alone (:func:`stowplan.hf.check_packing`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

CONTENDERS = ["random", "trl", "batch_rebalance", "stowplan-flat", "stowplan-rows", "stowplan-padded"]
CUT = 2048
VOCAB = 512
STEP_SAMPLES = 64


def model():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, attn_implementation="sdpa", use_cache=False,
    )
    return transformers.LlamaForCausalLM(config)


def samples(args):
    lengths = np.minimum(np.loadtxt(args.workload, dtype=np.int64), CUT)
    rng = np.random.default_rng(0)
    picked = lengths[rng.choice(lengths.size, args.samples, replace=False)]
    return [rng.integers(1, VOCAB, size=int(n)).tolist() for n in picked]


def plan(name, ids, budget):
    """The contender's micro-batches of the epoch: (features of each, collator)."""
    import datasets

    import stowplan.hf

    lengths = np.array([len(x) for x in ids])
    ds = datasets.Dataset.from_dict({"input_ids": ids})
    padded = stowplan.hf.PaddingFreeCollator(layout="padded")
    if name == "random":
        order = np.random.default_rng(1).permutation(len(ids))
        mbs, cur = [], []
        for i in order.tolist():
            if cur and (len(cur) + 1) * max(lengths[cur + [i]]) > budget:
                mbs.append(cur)
                cur = []
            cur.append(i)
        mbs.append(cur)
        return [[{"input_ids": ids[i]} for i in mb] for mb in mbs], padded
    if name == "trl":
        import trl
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        packed = trl.pack_dataset(ds, CUT, strategy="bfd")
        rows = [packed[i] for i in range(len(packed))]
        per = budget // CUT
        return [rows[k : k + per] for k in range(0, len(rows), per)], DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    if name in ("batch_rebalance", "stowplan-padded"):
        ours = stowplan.hf.PaddedBatchSampler(lengths, budget, batch_size=STEP_SAMPLES, drop_last=True, seed=1)
        if name == "stowplan-padded":
            return [[{"input_ids": ids[i]} for i in mb] for mb in ours], padded
        from transformers.trainer_pt_utils import BatchRebalanceSampler

        accum = max(1, round(len(ours) / (len(ids) // STEP_SAMPLES)))
        theirs = BatchRebalanceSampler(lengths.tolist(), STEP_SAMPLES, 1, accum, seed=1)
        return [[{"input_ids": ids[i]} for i in mb] for mb in theirs], padded
    packed = stowplan.hf.pack_dataset(ds, CUT)
    rows = [packed[i] for i in range(len(packed))]
    sampler = stowplan.hf.TokenBudgetBatchSampler(packed, budget, seed=1)
    layout = "flat" if name == "stowplan-flat" else "rows"
    return [[rows[i] for i in mb] for mb in sampler], stowplan.hf.PaddingFreeCollator(layout=layout)


def child(args):
    import torch

    torch.set_num_threads(args.threads)
    mbs, collate = plan(args.child, samples(args), args.budget)
    net = model()
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)
    order = list(range(len(mbs))) if args.steps == 0 else list(range(min(args.steps, len(mbs))))
    real = 0
    for k, j in enumerate([order[0]] + order):  # the first micro-batch once more, untimed: warm-up
        if k == 1:
            start, real = time.perf_counter(), 0
        batch = collate(mbs[j])
        inputs = {key: batch[key] for key in ("input_ids", "labels", "position_ids", "attention_mask") if key in batch}
        loss = net(**inputs, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        real += sum(len(f["input_ids"]) for f in mbs[j])  # the samples' tokens, no padding
    print(json.dumps({"tokens_per_s": real / (time.perf_counter() - start)}))


def describe(args):
    """Per contender: computed tokens per real token and micro-batches of the epoch, and the
    loss match of its first micro-batch."""
    import stowplan.hf

    ids = samples(args)
    real = sum(map(len, ids))
    net = model()
    out = {}
    for name in CONTENDERS:
        mbs, collate = plan(name, ids, args.budget)
        computed = 0
        for mb in mbs:
            batch = collate(mb)
            computed += int(np.prod(batch["input_ids"].shape))
        first = collate(mbs[0])
        first = {k: v for k, v in first.items() if k in ("input_ids", "labels", "position_ids", "attention_mask")}
        out[name] = {
            "computed_per_real": computed / real,
            "micro_batches": len(mbs),
            "loss_match": stowplan.hf.check_packing(net, first, use_cache=False, max_samples=16),
        }
    return out


def compare_samplers(args, dp=4, accum=4, step=256, rows=20000):
    """PaddedBatchSampler against BatchRebalanceSampler on the same lengths (the workload's
    first ``rows``, cut to 2,048), the same steps of ``step`` samples over ``dp`` ranks ×
    ``accum`` accumulation slots, no token cap, each judged by BatchRebalanceSampler's cost
    model (``bs·max_len + 0.001·bs·max_len²``): padding fraction and the costliest slot over
    the mean slot, and the planning time."""
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    import stowplan.hf

    lengths = np.minimum(np.loadtxt(args.workload, dtype=np.int64), CUT)[:rows]

    def judge(per_rank):
        padded = real = 0
        costs = []
        for mbs in per_rank:
            for mb in mbs:
                m = int(lengths[mb].max())
                padded, real = padded + len(mb) * m, real + int(lengths[mb].sum())
                costs.append(len(mb) * m + 0.001 * len(mb) * m * m)
        return 1 - real / padded, max(costs) / float(np.mean(costs)), len(costs)

    plans = {
        "BatchRebalanceSampler": lambda r: BatchRebalanceSampler(lengths.tolist(), step, dp, accum, seed=1, rank=r),
        "PaddedBatchSampler": lambda r: stowplan.hf.PaddedBatchSampler(
            lengths, 2**40, dp_size=dp, rank=r, batch_size=step, accumulation_steps=accum, seed=1, drop_last=True, cost=(1, 0.001)
        ),
    }
    print(f"{'sampler':22} {'padding':>8} {'costliest slot / mean':>22} {'micro-batches':>13} {'plan time':>9}")
    for name, make in plans.items():
        start = time.perf_counter()
        per_rank = [list(make(r)) for r in range(dp)]
        took = time.perf_counter() - start
        pad, slot, count = judge(per_rank)
        print(f"{name:22} {pad:8.2%} {slot:22.3f} {count:13d} {took:8.2f}s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=384)
    parser.add_argument("--budget", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=0, help="micro-batches timed (0: the whole epoch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--workload", default=os.path.join(os.path.dirname(__file__), "../../../shared/workloads/sft-chat-200k.txt"))
    parser.add_argument("--samplers", action="store_true", help="only compare the padded samplers' plans (no training)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.samplers:
        return compare_samplers(args)
    names = args.contenders.split(",")
    facts = describe(args)
    speeds = {n: [] for n in names}
    for r in range(args.rounds):
        for n in names[r % len(names) :] + names[: r % len(names)]:
            cmd = [sys.executable, __file__, "--child", n] + [f"--{k}={getattr(args, k)}" for k in ("samples", "budget", "steps", "threads", "workload")]
            result = subprocess.run(cmd, capture_output=True, text=True, check=True)
            speeds[n].append(json.loads(result.stdout.strip().splitlines()[-1])["tokens_per_s"])
    base = statistics.median(speeds["random"]) if "random" in speeds else None
    print(f"{'contender':18} {'real tok/s':>10} {'vs random':>9} {'computed/real':>13} {'micro-batches':>13} {'loss match':>10}")
    for n in names:
        med = statistics.median(speeds[n])
        f = facts[n]
        ratio = f"{med / base:.2f}x" if base else "-"
        print(f"{n:18} {med:10.0f} {ratio:>9} {f['computed_per_real']:13.3f} {f['micro_batches']:13d} {f['loss_match']:10.1e}")
    print(json.dumps({"speeds": speeds, "facts": facts}))


if __name__ == "__main__":
    main()
