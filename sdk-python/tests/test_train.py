"""stowplan inside real trainers: TRL's SFTTrainer, transformers' Trainer and a torch loop on
stowplan-packed datasets, the packing check against real transformers models, and the padded
sampler beside transformers' BatchRebalanceSampler.

Needs torch, transformers and TRL: sdk-python/run_train_tests.sh installs them (CPU is
enough; tiny models built from configs, tokenizers built locally, no hub). Elsewhere the
module skips loudly; STOWPLAN_REQUIRE_TRAIN=1 makes that a failure.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

try:
    import torch
    import transformers
    import trl
except ImportError as exc:
    if os.environ.get("STOWPLAN_REQUIRE_TRAIN") == "1":
        raise
    pytest.skip(f"torch, transformers and TRL are not importable ({exc}): the training recipes did NOT run", allow_module_level=True)

import datasets

import stowplan.hf
from stowplan._check import _first_batch, _first_features, _segments
from stowplan.errors import InvalidArgumentError, PackingContaminationError

VOCAB = 64
TINY = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8)
STEPS = 20


def tiny_llama(seed: int = 0, attn: str = "sdpa", **config):
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, attn_implementation=attn, **config))


def tokenizer():
    """A word-level tokenizer built locally: tokens t0..t{VOCAB-2} and a pad."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(VOCAB - 1)} | {"<pad>": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<pad>")


def corpus(n: int = 96, seed: int = 0) -> datasets.Dataset:
    """Samples a tiny model learns in a few steps: runs counting up from a random start,
    tokenized by :func:`tokenizer`, of 3..40 tokens."""
    rng = np.random.default_rng(seed)
    tok = tokenizer()
    texts = []
    for _ in range(n):
        start, length = int(rng.integers(0, VOCAB - 1)), int(rng.integers(3, 41))
        texts.append(" ".join(f"t{(start + k) % (VOCAB - 1)}" for k in range(length)))
    return datasets.Dataset.from_dict({"input_ids": [tok(t)["input_ids"] for t in texts]})


def token_losses(model, input_ids, **forward):
    """Per-token losses of one sample alone: position t predicting token t + 1."""
    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor(input_ids)[None, :], use_cache=False, **forward).logits[0]
    return torch.nn.functional.cross_entropy(logits[:-1], torch.as_tensor(input_ids)[1:], reduction="none")


def packed_token_losses(model, batch):
    """Per-token losses of a collated batch, by the collator's shift_labels (no index arithmetic)."""
    inputs = {k: v for k, v in batch.items() if k not in ("labels", "shift_labels", "loss_weights")}
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["shift_labels"].flatten(), reduction="none", ignore_index=-100).view(
        batch["shift_labels"].shape
    )


def assert_first_batch_matches_unpacked(model, batch):
    """Every loss token of the batch has the loss its sample gives alone (to 1e-5), and the
    weighted sum is the samples' unpacked token-mean."""
    losses = packed_token_losses(model, batch)
    shift, weights = batch["shift_labels"], batch["loss_weights"]
    ids = batch["input_ids"]
    unpacked = []
    for row, a, b in _segments(batch):
        alone = token_losses(model, ids[row, a:b].tolist())
        learnt = shift[row, a : b - 1] != -100
        assert torch.allclose(losses[row, a : b - 1][learnt], alone[learnt], atol=1e-5), (row, a, b)
        unpacked.append(alone[learnt])
    unpacked = torch.cat(unpacked)
    assert abs(float((weights * losses).sum()) - float(unpacked.mean())) < 1e-5


def losses_of(history):
    return [h["loss"] for h in history if "loss" in h]


# --- the collator -----------------------------------------------------------------------------


def test_collator_returns_torch_tensors_by_default():
    out = stowplan.hf.PaddingFreeCollator()([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}])
    assert all(isinstance(v, torch.Tensor) for v in out.values()) and out["input_ids"].dtype == torch.int64
    assert isinstance(stowplan.hf.PaddingFreeCollator(return_tensors="np")([{"input_ids": [1]}])["input_ids"], np.ndarray)


@pytest.mark.parametrize("layout", stowplan.hf.LAYOUTS)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_loss_weights_give_the_unpacked_loss_of_a_real_model(layout, mode):
    model = tiny_llama()
    ds = corpus(12)
    if layout == "padded":
        features = [ds[i] for i in range(len(ds))]
    else:
        packed = stowplan.hf.pack_dataset(ds, 64)
        features = [packed[i] for i in range(len(packed))]
    batch = stowplan.hf.PaddingFreeCollator(layout=layout, return_loss_weights=True, loss_agg_mode=mode)(features)
    losses = packed_token_losses(model, batch)
    per_sample = [token_losses(model, ds[i]["input_ids"]) for i in range(len(ds))]
    if mode == "token-mean":
        expected = float(torch.cat(per_sample).mean())
    elif mode == "seq-mean-token-mean":
        expected = float(torch.stack([s.mean() for s in per_sample]).mean())
    else:
        expected = float(torch.stack([s.sum() for s in per_sample]).mean())
    assert abs(float((batch["loss_weights"] * losses).sum()) - expected) < 1e-4 * max(1.0, abs(expected))
    # transformers' own loss reads shift_labels as it reads labels: the same token-mean.
    if mode == "token-mean":
        inputs = {k: v for k, v in batch.items() if k != "loss_weights"}
        with torch.no_grad():
            assert abs(float(model(**inputs, use_cache=False).loss) - expected) < 1e-5


# --- the packing check against real models ----------------------------------------------------

MODELS = [
    ("LlamaConfig", "LlamaForCausalLM"),
    ("Qwen2Config", "Qwen2ForCausalLM"),
    ("Qwen3Config", "Qwen3ForCausalLM"),
    ("MistralConfig", "MistralForCausalLM"),
    ("GemmaConfig", "GemmaForCausalLM"),
]


@pytest.mark.parametrize("layout", ["flat", "rows"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("names", MODELS, ids=[m for _, m in MODELS])
def test_check_packing_passes_every_correct_combination_and_catches_use_cache(names, attn, layout):
    config_cls, model_cls = (getattr(transformers, n) for n in names)
    torch.manual_seed(0)
    model = model_cls(config_cls(**TINY, attn_implementation=attn))
    packed = stowplan.hf.pack_dataset(corpus(10), 48)
    batch = stowplan.hf.PaddingFreeCollator(layout=layout)([packed[i] for i in range(len(packed))])
    assert stowplan.hf.check_packing(model, batch, use_cache=False) < 1e-4
    with pytest.raises(PackingContaminationError) as info:
        stowplan.hf.check_packing(model, batch, use_cache=True)
    assert "use_cache=True" in info.value.cause and info.value.max_difference > 1e-3
    # The padded layout holds one sample a row: nothing can mix, cache or not.
    padded = stowplan.hf.PaddingFreeCollator(layout="padded")([corpus(6)[i] for i in range(6)])
    assert stowplan.hf.check_packing(model, padded, use_cache=True) < 1e-4


# transformers 5.24 builds flex attention's block mask with an argument torch 2.15 deprecates.
@pytest.mark.filterwarnings("ignore:_compile flag on create_block_mask:DeprecationWarning")
def test_check_packing_with_flex_attention_forward():
    model = tiny_llama(attn="flex_attention")
    packed = stowplan.hf.pack_dataset(corpus(6), 48)
    batch = stowplan.hf.PaddingFreeCollator()([packed[i] for i in range(len(packed))])
    assert stowplan.hf.check_packing(model, batch, use_cache=False) < 1e-4
    with pytest.raises(PackingContaminationError, match="use_cache=True"):
        stowplan.hf.check_packing(model, batch, use_cache=True)


def test_check_packing_catches_a_mask_beside_packed_positions_and_bad_arguments():
    model = tiny_llama()
    packed = stowplan.hf.pack_dataset(corpus(6), 48)
    batch = stowplan.hf.PaddingFreeCollator()([packed[i] for i in range(len(packed))])
    # An all-ones attention_mask on a packed row: transformers then ignores the position_ids'
    # boundaries, and the check, reading them within the mask, names it.
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    with pytest.raises(PackingContaminationError) as info:
        stowplan.hf.check_packing(model, batch, use_cache=False)
    assert "attention_mask beside packed position_ids" in info.value.cause and info.value.max_difference > 1e-2
    with pytest.raises(InvalidArgumentError, match="batch must be a collated dict with input_ids"):
        stowplan.hf.check_packing(model, {"labels": torch.zeros(1, 2)})
    with pytest.raises(InvalidArgumentError, match="atol must be a number >= 0"):
        stowplan.hf.check_packing(model, {"input_ids": torch.zeros(1, 2, dtype=torch.long)}, atol=-1)
    with pytest.raises(InvalidArgumentError, match="is not one run of ones"):
        stowplan.hf.check_packing(model, {"input_ids": torch.ones(1, 3, dtype=torch.long), "attention_mask": torch.tensor([[1, 0, 1]])})
    with pytest.raises(InvalidArgumentError, match="model must be a torch model"):
        stowplan.hf.check_packing(object(), {"input_ids": torch.ones(1, 3, dtype=torch.long)})


def test_recommend_layout():
    assert stowplan.hf.recommend_layout(tiny_llama(attn="sdpa")) == "padded"
    assert stowplan.hf.recommend_layout(tiny_llama(attn="eager")) == "padded"
    assert stowplan.hf.recommend_layout(transformers.LlamaConfig(attn_implementation="flash_attention_2")) == "flat"
    assert stowplan.hf.recommend_layout(transformers.LlamaConfig(attn_implementation="flex_attention"), "cuda") == "flat"
    assert stowplan.hf.recommend_layout(transformers.LlamaConfig(attn_implementation="flex_attention"), "cpu") == "padded"
    assert stowplan.hf.recommend_layout(transformers.MambaConfig()) == "padded"
    with pytest.raises(InvalidArgumentError, match="model must be a transformers model or config"):
        stowplan.hf.recommend_layout(object())


# --- the recipes: 20 steps each, the first batch checked against the unpacked losses -----------


def run_trainer(trainer_cls, args, dataset, collator, **extra):
    model = tiny_llama()
    check = stowplan.hf.PackingCheckCallback(**extra.pop("forward_kwargs", {}))
    trainer = trainer_cls(model=model, args=args, train_dataset=dataset, data_collator=collator, callbacks=[check], **extra)
    loader = trainer.get_train_dataloader()
    first = _first_batch(loader)
    weighted = stowplan.hf.PaddingFreeCollator(layout=collator.layout, return_loss_weights=True)
    assert_first_batch_matches_unpacked(model, weighted(_first_features(loader)))
    trainer.train()
    assert check.max_difference is not None  # it ran, and passed (it raises otherwise)
    losses = losses_of(trainer.state.log_history)
    assert len(losses) == STEPS and losses[-1] < losses[0] * 0.8, losses
    return first


def train_args(cls, tmp_path, **options):
    return cls(
        output_dir=str(tmp_path),
        max_steps=STEPS,
        per_device_train_batch_size=2,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        **options,
    )


def test_recipe_transformers_trainer_with_default_arguments(tmp_path, caplog):
    packed = stowplan.hf.pack_dataset(corpus(), 64)
    args = train_args(transformers.TrainingArguments, tmp_path)  # remove_unused_columns=True
    with caplog.at_level(logging.INFO, logger="stowplan"):
        run_trainer(transformers.Trainer, args, packed, stowplan.hf.PaddingFreeCollator())
    assert "packed samples stay apart" in caplog.text


def test_trainer_that_removed_every_boundary_is_refused_loudly(tmp_path):
    packed = stowplan.hf.pack_dataset(corpus(), 64, position_ids=False)  # Trainer drops seq_lengths
    trainer = transformers.Trainer(
        model=tiny_llama(), args=train_args(transformers.TrainingArguments, tmp_path), train_dataset=packed,
        data_collator=stowplan.hf.PaddingFreeCollator(packed=True),
    )
    with pytest.raises(InvalidArgumentError, match="remove_unused_columns"):
        trainer.train()


# TRL 1.16's SFTConfig sets transformers' deprecated gradient_checkpointing itself.
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_recipe_trl_sft_trainer(tmp_path):
    packed = stowplan.hf.pack_dataset(corpus(), 64)
    # TRL refuses a custom collator in its padding-free mode; packing=False with the dataset's
    # preparation skipped hands stowplan's rows to stowplan's collator as they are.
    args = train_args(trl.SFTConfig, tmp_path, packing=False, dataset_kwargs={"skip_prepare_dataset": True})
    run_trainer(trl.SFTTrainer, args, packed, stowplan.hf.PaddingFreeCollator(), processing_class=tokenizer(), forward_kwargs={"use_cache": False})


def test_recipe_trainer_padded_layout_with_the_padded_sampler(tmp_path):
    ds = corpus()
    args = train_args(transformers.TrainingArguments, tmp_path, gradient_accumulation_steps=2)
    sampler = stowplan.hf.PaddedBatchSampler(ds, 160, batch_size=8, accumulation_steps=2, seed=0)

    class PaddedTrainer(transformers.Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return sampler

    run_trainer(PaddedTrainer, args, ds, stowplan.hf.PaddingFreeCollator(layout="padded"))


def test_recipe_plain_torch_loop():
    packed = stowplan.hf.pack_dataset(corpus(), 64)
    model = tiny_llama()
    loader = torch.utils.data.DataLoader(packed, batch_size=2, shuffle=True, collate_fn=stowplan.hf.PaddingFreeCollator(return_loss_weights=True))
    first = next(iter(loader))
    assert_first_batch_matches_unpacked(model, first)
    # The config's use_cache=True is the trap: the check names it before any step.
    with pytest.raises(PackingContaminationError, match="use_cache=True"):
        stowplan.hf.check_packing(model, first)
    stowplan.hf.check_packing(model, first, use_cache=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    batches = iter(loader)
    for _ in range(STEPS):
        batch = next(batches, None) or next(batches := iter(loader))
        weights = batch.pop("loss_weights")
        logits = model(**{k: v for k, v in batch.items() if k not in ("labels", "shift_labels")}, use_cache=False).logits
        token_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["shift_labels"].flatten(), reduction="none", ignore_index=-100)
        loss = (weights.flatten() * token_loss).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] * 0.8, losses


# --- the padded sampler beside transformers' BatchRebalanceSampler ---------------------------


def test_padded_sampler_balances_slots_at_least_as_well_as_batch_rebalance():
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(6.0, 1.0, size=4096).astype(np.int64) + 1, 2048)
    dp, accum, step = 4, 4, 256

    def measure(per_rank, cost):
        padded = real = 0
        costs = []
        for mbs in per_rank:
            for mb in mbs:
                m = int(lengths[mb].max())
                padded += len(mb) * m
                real += int(lengths[mb].sum())
                costs.append(len(mb) * (m + cost * m * m))
        return 1 - real / padded, max(costs) / np.mean(costs)

    theirs = [list(BatchRebalanceSampler(lengths.tolist(), step, dp, accum, seed=1, rank=r)) for r in range(dp)]
    # BatchRebalanceSampler's own cost model: bs·max_len + 0.001·bs·max_len².
    ours = [
        list(stowplan.hf.PaddedBatchSampler(lengths, 2**40, dp_size=dp, rank=r, batch_size=step, accumulation_steps=accum, seed=1, drop_last=True, cost=(1, 0.001)))
        for r in range(dp)
    ]
    every = sorted(i for mbs in ours for mb in mbs for i in mb)
    assert len(every) == len(set(every)) == (len(lengths) // step) * step  # each sample once
    pad_theirs, slot_theirs = measure(theirs, 0.001)
    pad_ours, slot_ours = measure(ours, 0.001)
    assert slot_ours <= slot_theirs and slot_ours < 1.2, (slot_ours, slot_theirs)
    assert pad_ours <= pad_theirs + 0.02, (pad_ours, pad_theirs)


# --- the guide and the docstrings that need torch --------------------------------------------


# transformers 5.24 and TRL 1.16 warn of their own deprecations in the guide's trainers.
@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
def test_the_train_with_hf_guide_runs():
    import doctest
    import pathlib

    guide = pathlib.Path(__file__).resolve().parents[2] / "docs/train-with-hf.md"
    result = doctest.testfile(str(guide), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 20, result


def test_docstring_examples_that_need_torch():
    import doctest

    import stowplan._check
    import stowplan._collate
    import stowplan.compat._workers

    for module in (stowplan._check, stowplan._collate, stowplan.compat._workers):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted >= 1, module.__name__
