"""prime-rl (PrimeIntellect-ai/prime-rl) trainer micro-batches, reproduced by stowplan.

- :func:`pack_samples` — the classic packer (``packed_samples_into_micro_bs``): first-fit
  decreasing with key (LoRA, −length), LoRAs may share a bin, training modes may not.
- :func:`micro_batch_fields` — a micro-batch received from ``stowplan serve`` (or
  :class:`stowplan.Packer`) in prime-rl's trainer field layout.
- :func:`prepare_micro_batches` — packing plus ``pad_micro_batch``: one dict per micro-batch
  in prime-rl's field layout (``variant="classic"``: the classic ``MicroBatch``;
  ``"multilora"``: with ``sequence_lengths``/``seq_lens``), fields as numpy arrays built by
  stowplan's Rust host.

Behaviour, padding values and errors are prime-rl's (classic: ``b5daec1``; multilora:
``de80b48``): samples are truncated to ``seq_len`` (prompt first), padding is token 1, loss
mask False, advantage 0, logprob 0, temperature 1, env name ``""``, reward NaN, positions
restarting at 0, counted in the last sequence's length and the last LoRA's token count;
zero-length samples vanish (reported by :func:`pack_samples`' second result).

>>> from stowplan.compat import prime_rl
>>> samples = [
...     {"prompt_ids": [11, 12, 13], "completion_ids": [14, 15], "lora": 0, "advantage": 0.5},
...     {"prompt_ids": [21, 22], "completion_ids": [23, 24, 25], "lora": 1, "advantage": -1.5},
...     {"prompt_ids": [31], "completion_ids": [], "lora": 1, "advantage": 2.0},
... ]
>>> prime_rl.pack_samples(samples, seq_len=6)
([[0, 2], [1]], [])
>>> mb = prime_rl.prepare_micro_batches(samples, seq_len=16, num_loras=2, pad_to_multiple_of=4)[0]
>>> mb["input_ids"].tolist(), mb["lora_num_tokens"].tolist()
([11, 12, 13, 14, 15, 21, 22, 23, 24, 25, 31, 1], [5, 7])
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _stowplan

__all__ = ["pack_samples", "prepare_micro_batches", "micro_batch_fields"]


def _get(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, dict):
        value = sample.get(name, default)
    else:
        value = getattr(sample, name, default)
    return default if value is None else value


def _truncated(i: int, sample: Any, seq_len: int) -> Dict[str, Any]:
    """prime-rl's ``prepare_sample`` view of a sample: prompt + completion cut to ``seq_len``."""
    prompt = list(_get(sample, "prompt_ids", []))
    completion = list(_get(sample, "completion_ids", []))
    p = min(len(prompt), seq_len)
    c = min(len(completion), seq_len - p)
    out: Dict[str, Any] = {
        "prompt_ids": prompt[:p],
        "completion_ids": completion[:c],
        "prompt_mask": list(_get(sample, "prompt_mask", [False] * len(prompt)))[:p],
        "completion_mask": list(_get(sample, "completion_mask", [True] * len(completion)))[:c],
        "completion_logprobs": list(_get(sample, "completion_logprobs", [0.0] * len(completion)))[:c],
        "completion_temperatures": list(_get(sample, "completion_temperatures", [1.0] * len(completion)))[:c],
        "advantage": _get(sample, "advantage", 0.0),
        "run": _stowplan._integer(_get(sample, "lora", _get(sample, "run", 0)), f"samples[{i}].lora", 0, 2**32 - 1),
    }
    teacher = _get(sample, "teacher_logprobs")
    if teacher is not None:
        out["teacher_logprobs"] = list(teacher)[: p + c]
    return out


def _check_envs(samples: Sequence[Any]) -> None:
    for s in samples:
        if _get(s, "env_name", "env") == "all":
            raise AssertionError("env_name='all' is reserved for aggregate metric keys")


def _pack(prepared: List[Dict[str, Any]], samples: Sequence[Any], seq_len: int, backend: Optional[str]) -> Tuple[List[List[int]], List[int]]:
    lengths = [len(s["prompt_ids"]) + len(s["completion_ids"]) for s in prepared]
    runs = [s["run"] for s in prepared]
    modes: Dict[str, int] = {}
    labels = [modes.setdefault(str(_get(s, "training_mode", "rl")), len(modes)) for s in samples]
    packed = _stowplan.prime_rl_ffd(lengths, runs, labels, seq_len, backend=backend)
    return packed.bins, packed.dropped


def micro_batch_fields(mb: Any) -> Dict[str, Any]:
    """A :class:`stowplan.MicroBatch` as prime-rl's trainer reads a micro-batch (its
    multi-LoRA ``MicroBatch`` fields): ``input_ids``, ``position_ids``, ``loss_mask``,
    ``advantages``, ``inference_logprobs``, ``temperatures``, ``teacher_logprobs`` (or None),
    ``lora_num_tokens``, ``sequence_lengths`` and ``seq_lens`` (the padded lengths, the end
    padding counted in the last sequence). Arrays are the micro-batch's own, not copies."""
    lengths = mb.sequence_lengths
    return {
        "input_ids": mb.input_ids,
        "position_ids": mb.position_ids,
        "loss_mask": mb.loss_mask,
        "advantages": mb.advantages,
        "inference_logprobs": mb.inference_logprobs,
        "temperatures": mb.temperatures,
        "teacher_logprobs": mb.teacher_logprobs,
        "lora_num_tokens": mb.lora_num_tokens,
        "sequence_lengths": lengths,
        "seq_lens": lengths,
    }


def pack_samples(samples: Sequence[Any], seq_len: int, *, backend: Optional[str] = None) -> Tuple[List[List[int]], List[int]]:
    """prime-rl's classic micro-batch packing of ``samples`` (mappings or objects with
    ``prompt_ids``, ``completion_ids``, optional ``lora`` and ``training_mode``).

    Returns the bins (sample indices in prime-rl's bin order and in-bin order) and the
    zero-length samples prime-rl drops without a word.
    """
    _check_envs(samples)
    seq_len = _stowplan._integer(seq_len, "seq_len", -(2**63), 2**63 - 1)
    return _pack([_truncated(i, s, seq_len) for i, s in enumerate(samples)], samples, seq_len, backend)


def prepare_micro_batches(
    samples: Sequence[Any],
    *,
    seq_len: int,
    num_loras: int = 1,
    pad_to_multiple_of: int = 1,
    variant: str = "classic",
    backend: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """Packs ``samples`` like prime-rl and pads every micro-batch like its ``pad_micro_batch``.

    Each result is a dict of prime-rl's ``MicroBatch`` fields: ``input_ids``,
    ``position_ids``, ``loss_mask``, ``advantages``, ``inference_logprobs``,
    ``temperatures``, ``lora_num_tokens``, ``env_names`` and, for ``variant="classic"``,
    ``rewards``, ``teacher_logprobs``, ``training_mode``; for ``"multilora"``,
    ``sequence_lengths``, ``seq_lens`` and ``ref_logprobs``. Array fields are numpy arrays.

    Raises prime-rl's errors: ``ZeroDivisionError`` for ``pad_to_multiple_of == 0``,
    ``IndexError`` for a LoRA index ≥ ``num_loras``, ``AssertionError`` for ``env_name ==
    "all"``.
    """
    if variant not in ("classic", "multilora"):
        raise ValueError(f"variant must be 'classic' or 'multilora' (got {variant!r})")
    _check_envs(samples)
    seq_len = _stowplan._integer(seq_len, "seq_len", -(2**63), 2**63 - 1)
    pad_to_multiple_of = _stowplan._integer(pad_to_multiple_of, "pad_to_multiple_of", -(2**63), 2**63 - 1)
    if pad_to_multiple_of == 0:
        raise ZeroDivisionError("integer modulo by zero")
    prepared = [_truncated(i, s, seq_len) for i, s in enumerate(samples)]
    for s in prepared:
        if not 0 <= s["run"] < num_loras:
            raise IndexError("list index out of range")
    bins, _dropped = _pack(prepared, samples, seq_len, backend)
    # prime-rl's values: no cap (the bins are given), its padding multiple and pad token 1,
    # one lora_num_tokens entry per LoRA, LoRAs sharing rows, empty completions kept.
    m = _stowplan.materialize(
        prepared,
        capacity=2**63,
        padding="micro_batch",
        align=pad_to_multiple_of,
        pad_token_id=1,
        num_runs=num_loras,
        mix_runs=True,
        allow_empty_completion=True,
        plan=[bins],
        backend=backend,
    )
    out: List[Dict[str, Any]] = []
    for members, mb in zip(bins, m.ranks[0]):
        env_names: List[str] = []
        rewards: List[float] = []
        for i, n in zip(members, (np.diff(mb.cu_seqlens)).tolist()):
            env_names += [str(_get(samples[i], "env_name", "env"))] * n
            rewards += [float(_get(samples[i], "reward", 1.0))] * n
        pad = int(mb.padding_tokens)
        env_names += [""] * pad
        rewards += [float("nan")] * pad
        d = micro_batch_fields(mb)
        d["env_names"] = env_names
        if variant == "classic":
            del d["sequence_lengths"], d["seq_lens"]
            d["rewards"] = np.array(rewards, dtype=np.float32)
            d["training_mode"] = str(_get(samples[members[0]], "training_mode", "rl"))
        else:
            del d["teacher_logprobs"]
            d["ref_logprobs"] = None
        out.append(d)
    return out
