"""prime-rl (PrimeIntellect-ai/prime-rl) trainer micro-batches, reproduced by stowplan.

- :func:`pack_samples` — the classic packer (``packed_samples_into_micro_bs``): first-fit
  decreasing with key (LoRA, −length), LoRAs may share a bin, training modes may not, and
  every multimodal sample (one with ``mm_kwargs``) gets a bin of its own.
- :func:`round_robin_plan` and :func:`prepare_batch` — the classic ``prepare_batch``:
  micro-batches of each modality group completed to a multiple of the workers with dummy
  copies of the group's first (loss off), multimodal first, micro-batch ``i`` to rank
  ``i % W`` (the packer runtime's ``distribution="round-robin"``).
- :func:`micro_batch_fields` — a micro-batch received from ``stowplan serve`` (or
  :class:`stowplan.Packer`) in prime-rl's trainer field layout.
- :func:`prepare_micro_batches` — packing plus ``pad_micro_batch``: one dict per micro-batch
  in prime-rl's field layout (``variant="classic"``: the classic ``MicroBatch``;
  ``"multilora"``: with ``sequence_lengths``/``seq_lens``), fields as numpy arrays built by
  stowplan's Rust host.

prime-rl at HEAD (``559b447``, packing in the orchestrator), by prime-rl's own names:

- :func:`balanced_partition` and :func:`_karmarkar_karp` (also :func:`karmarkar_karp`) —
  equal-size Karmarkar–Karp over bin costs, then pairwise-swap refinement, in the kernel.
- :func:`build_bin_cost` and :func:`_packing_cost_coeffs` (also
  :func:`packing_cost_coeffs`) — the FLOPs cost ``linear·Σlen + quadratic·Σlen²`` of a bin,
  its coefficients read from an HF-style model config (object or dict, ``text_config``
  first).
- :func:`prepare_batch_plan` — the plan of ``prepare_batch``: first fit by descending
  length, the heaviest bins split until the count is a multiple of the workers, padding,
  dummies per modality group, KK per group; with ``idxs``/``num_loras``, the last
  trainer-side multi-LoRA packer (``de80b48``).
- :func:`patch` — installs stowplan's ``balanced_partition``/``_karmarkar_karp`` in
  ``prime_rl.trainer.batch``.

Behaviour, padding values and errors are prime-rl's (classic: ``b5daec1``; multilora:
``de80b48``): samples are truncated to ``seq_len`` (prompt first), padding is token 1, loss
mask False, advantage 0, logprob 0, temperature 1, env name ``""``, reward NaN, positions
restarting at 0, counted in the last sequence's length and the last LoRA's token count.
Zero-length samples take no token: they join a bin like any sample (a multilora bin lists
them in ``sequence_lengths`` as 0), and one that finds no bin of its training mode opens one,
which stays an empty micro-batch when no later sample joins it (:func:`pack_samples` names
them in its second result).

Not reproduced: multimodal samples with ``variant="multilora"`` (its packer lets them share
bins by LoRA and image-tensor shapes) and negative LoRA indices (which prime-rl's lists wrap
around) raise :class:`stowplan.InvalidArgumentError`. LoRA indices, ``seq_len``,
``num_loras`` and ``pad_to_multiple_of`` are exact integers (floats and bools are refused).

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

import copy
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _stowplan
from ..errors import InvalidArgumentError
from ._prime_rl_head import (
    BinCost,
    _karmarkar_karp,
    _packing_cost_coeffs,  # noqa: F401 - part of this module's interface (prime-rl's name)
    _text_config,  # noqa: F401 - part of this module's interface (prime-rl's name)
    balanced_partition,
    build_bin_cost,
    karmarkar_karp,
    packing_cost_coeffs,
    prepare_batch_plan,
)

__all__ = [
    "pack_samples",
    "prepare_micro_batches",
    "round_robin_plan",
    "prepare_batch",
    "micro_batch_fields",
    "balanced_partition",
    "karmarkar_karp",
    "build_bin_cost",
    "packing_cost_coeffs",
    "BinCost",
    "prepare_batch_plan",
    "patch",
    "PATCH_TARGET",
]


_I64 = (-(2**63), 2**63 - 1)
#: The largest LoRA index the kernel's packer takes.
_MAX_LORA = 2**32 - 1


def _get(sample: Any, name: str, default: Any = None) -> Any:
    if isinstance(sample, dict):
        value = sample.get(name, default)
    else:
        value = getattr(sample, name, default)
    return default if value is None else value


def _is_multimodal(sample: Any) -> bool:
    """prime-rl's test: the sample carries image tensors (``mm_kwargs``)."""
    return _get(sample, "mm_kwargs") is not None


def _truncated(i: int, sample: Any, seq_len: int) -> Dict[str, Any]:
    """prime-rl's ``prepare_sample`` view of a sample: prompt + completion cut to ``seq_len``."""
    prompt = list(_get(sample, "prompt_ids", []))
    completion = list(_get(sample, "completion_ids", []))
    p = min(len(prompt), seq_len)
    c = min(len(completion), seq_len - p)
    lora = _get(sample, "lora", _get(sample, "run", 0))
    out: Dict[str, Any] = {
        "prompt_ids": prompt[:p],
        "completion_ids": completion[:c],
        "prompt_mask": list(_get(sample, "prompt_mask", [False] * len(prompt)))[:p],
        "completion_mask": list(_get(sample, "completion_mask", [True] * len(completion)))[:c],
        "completion_logprobs": list(_get(sample, "completion_logprobs", [0.0] * len(completion)))[:c],
        "completion_temperatures": list(_get(sample, "completion_temperatures", [1.0] * len(completion)))[:c],
        "advantage": _get(sample, "advantage", 0.0),
        "run": _stowplan._integer(lora, f"samples[{i}].lora", 0, _I64[1]),
    }
    teacher = _get(sample, "teacher_logprobs")
    if teacher is not None:
        out["teacher_logprobs"] = list(teacher)[: p + c]
    return out


def _check_envs(samples: Sequence[Any]) -> None:
    for s in samples:
        if _get(s, "env_name", "env") == "all":
            raise AssertionError("env_name='all' is reserved for aggregate metric keys")


def _turns(prepared: List[Dict[str, Any]]) -> List[int]:
    """Every sample's turn in prime-rl's packing order: (LoRA, −length), stable."""
    key = lambda i: (prepared[i]["run"], -(len(prepared[i]["prompt_ids"]) + len(prepared[i]["completion_ids"])))  # noqa: E731
    turn = [0] * len(prepared)
    for t, i in enumerate(sorted(range(len(prepared)), key=key)):
        turn[i] = t
    return turn


def _bins(
    prepared: List[Dict[str, Any]], samples: Sequence[Any], seq_len: int, by_mode: bool, backend: Optional[str]
) -> List[List[int]]:
    """prime-rl's bins, every sample included, members in the order they joined: the
    kernel's first-fit decreasing on the samples with tokens (text samples share bins — of
    their training mode when ``by_mode``, as in classic; a multimodal sample's label is its
    own, so its bin stays its own), then each zero-length sample placed as prime-rl places
    it at its turn."""
    n = len(prepared)
    lengths = [len(s["prompt_ids"]) + len(s["completion_ids"]) for s in prepared]
    runs = [s["run"] for s in prepared]
    for i, run in enumerate(runs):
        if run > _MAX_LORA:
            raise InvalidArgumentError(f"samples[{i}].lora must be in 0..={_MAX_LORA} (got {run})")
    modes: Dict[str, int] = {}
    mode = lambda s: str(_get(s, "training_mode", "rl")) if by_mode else ""  # noqa: E731
    text = [None if _is_multimodal(s) else modes.setdefault(mode(s), len(modes)) for s in samples]
    fresh = iter(range(len(modes), len(modes) + n))
    labels = [next(fresh) if label is None else label for label in text]
    packed = _stowplan.prime_rl_ffd(lengths, runs, labels, seq_len, backend=backend)
    turn = _turns(prepared)
    # (turn the bin opened at, label, members in turn order), in the order bins were opened.
    bins: List[Tuple[int, int, List[int]]] = [(turn[b[0]], labels[b[0]], list(b)) for b in packed.bins]
    for z in sorted(packed.dropped, key=turn.__getitem__):
        t, label = turn[z], labels[z]
        before = [b for b in bins if b[0] < t]
        joined = next((b for b in before if b[1] == label), None)
        if joined is not None:  # the first open bin of its label: no token, no trace
            joined[2].append(z)
            joined[2].sort(key=turn.__getitem__)
            continue
        # No bin of its label yet: it opens one, which the next sample of its label joins
        # (the kernel opened that bin later, without it).
        later = next((b for b in bins[len(before):] if b[1] == label), None)
        if later is not None:
            bins.remove(later)
        bins.insert(len(before), (t, label, [z] + (later[2] if later else [])))
    return [members for _, _, members in bins]


def _check_loras(prepared: List[Dict[str, Any]], bins: List[List[int]], num_loras: int, classic: bool) -> None:
    """prime-rl's IndexError for a LoRA index ≥ ``num_loras``, raised by its
    ``lora_num_tokens`` list at the first such sample's turn: classic assigns it when the
    sample opens a bin and adds to it when the sample joins one; the multi-LoRA packer adds."""
    turn = _turns(prepared)
    bad = [i for i, s in enumerate(prepared) if s["run"] >= num_loras]
    if not bad:
        return
    first = min(bad, key=turn.__getitem__)
    if classic and any(b[0] == first for b in bins):
        raise IndexError("list assignment index out of range")
    raise IndexError("list index out of range")


def micro_batch_fields(mb: Any) -> Dict[str, Any]:
    """A :class:`stowplan.MaterializedBatch` as prime-rl's trainer reads a micro-batch (its
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


def pack_samples(
    samples: Sequence[Any], seq_len: int, *, num_loras: Optional[int] = None, backend: Optional[str] = None
) -> Tuple[List[List[int]], List[int]]:
    """prime-rl's classic micro-batch packing of ``samples`` (mappings or objects with
    ``prompt_ids``, ``completion_ids``, optional ``lora``, ``training_mode`` and
    ``mm_kwargs``).

    Returns the bins (sample indices in prime-rl's bin order and in-bin order; the
    zero-length samples, which take no token, are left out, so a bin only they opened is
    ``[]``) and the zero-length samples. With ``num_loras``, a LoRA index ≥ it raises
    prime-rl's ``IndexError``.
    """
    _check_envs(samples)
    seq_len = _stowplan._integer(seq_len, "seq_len", *_I64)
    prepared = [_truncated(i, s, seq_len) for i, s in enumerate(samples)]
    bins = _bins(prepared, samples, seq_len, True, backend)
    if num_loras is not None:
        _check_loras(prepared, bins, _stowplan._integer(num_loras, "num_loras", *_I64), classic=True)
    empty = {i for i, s in enumerate(prepared) if not (s["prompt_ids"] or s["completion_ids"])}
    return [[i for i in b if i not in empty] for b in bins], sorted(empty)


def _empty_micro_batch(num_loras: int, teacher: bool) -> Dict[str, Any]:
    """The fields of a micro-batch without tokens (a bin only zero-length samples opened),
    in the dtypes of :class:`stowplan.MaterializedBatch`."""
    f32 = lambda: np.zeros(0, dtype=np.float32)  # noqa: E731
    return {
        "input_ids": np.zeros(0, dtype=np.int64),
        "position_ids": np.zeros(0, dtype=np.int64),
        "loss_mask": np.zeros(0, dtype=np.bool_),
        "advantages": f32(),
        "inference_logprobs": f32(),
        "temperatures": f32(),
        "teacher_logprobs": f32() if teacher else None,
        "lora_num_tokens": np.zeros(num_loras, dtype=np.int32),
    }


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
    ``rewards``, ``teacher_logprobs``, ``training_mode`` and, for a multimodal sample's
    micro-batch only, ``mm_kwargs`` (prime-rl at b5daec1 produces no such key for text); for ``"multilora"``, ``sequence_lengths``, ``seq_lens`` (one entry
    per sample, zero-length ones included) and ``ref_logprobs``. Array fields are numpy
    arrays.

    Raises prime-rl's errors, in its order: ``AssertionError`` for ``env_name == "all"``,
    ``IndexError`` for a LoRA index ≥ ``num_loras``, ``ZeroDivisionError`` for
    ``pad_to_multiple_of == 0`` (when there is a micro-batch to pad).
    """
    return _micro_batches(samples, seq_len, num_loras, pad_to_multiple_of, variant, backend)[1]


def _micro_batches(
    samples: Sequence[Any], seq_len: int, num_loras: int, pad_to_multiple_of: int, variant: str, backend: Optional[str]
) -> Tuple[List[List[int]], List[Dict[str, Any]]]:
    """:func:`prepare_micro_batches`' micro-batches and the bins they are (zero-length samples
    left out of the bins)."""
    if variant not in ("classic", "multilora"):
        raise ValueError(f"variant must be 'classic' or 'multilora' (got {variant!r})")
    _check_envs(samples)
    seq_len = _stowplan._integer(seq_len, "seq_len", *_I64)
    num_loras = _stowplan._integer(num_loras, "num_loras", *_I64)
    multiple = _stowplan._integer(pad_to_multiple_of, "pad_to_multiple_of", *_I64)
    prepared = [_truncated(i, s, seq_len) for i, s in enumerate(samples)]
    if variant == "multilora" and any(_is_multimodal(s) for s in samples):
        raise InvalidArgumentError(
            "multimodal samples (mm_kwargs) are reproduced for variant='classic' only; the multilora packer "
            "shares their bins by LoRA and image-tensor shapes, which stowplan does not model"
        )
    bins = _bins(prepared, samples, seq_len, variant == "classic", backend)
    _check_loras(prepared, bins, num_loras, classic=variant == "classic")
    if bins and multiple == 0:
        raise ZeroDivisionError("integer modulo by zero")
    lengths = [len(s["prompt_ids"]) + len(s["completion_ids"]) for s in prepared]
    # The samples with tokens, renumbered, in bins without the zero-length ones.
    kept = [i for i, n in enumerate(lengths) if n]
    renumber = {i: j for j, i in enumerate(kept)}
    plan = [[renumber[i] for i in b if lengths[i]] for b in bins]
    rows = iter([])
    if kept:
        # prime-rl's values: no cap (the bins are given), its padding multiple (none below
        # 2) and pad token 1, one lora_num_tokens entry per LoRA, LoRAs sharing rows, empty
        # completions kept.
        m = _stowplan.materialize(
            [prepared[i] for i in kept],
            capacity=2**63,
            padding="micro_batch",
            align=multiple if multiple > 1 else 1,
            pad_token_id=1,
            num_runs=num_loras,
            mix_runs=True,
            allow_empty_completion=True,
            plan=[[p for p in plan if p]],
            backend=backend,
        )
        rows = iter(m.ranks[0])
    teacher = any("teacher_logprobs" in s for s in prepared)
    out: List[Dict[str, Any]] = []
    for members in bins:
        mb = next(rows) if any(lengths[i] for i in members) else None
        d = micro_batch_fields(mb) if mb is not None else _empty_micro_batch(num_loras, teacher)
        pad = int(mb.padding_tokens) if mb is not None else 0
        env_names: List[str] = []
        rewards: List[float] = []
        for i in members:
            env_names += [str(_get(samples[i], "env_name", "env"))] * lengths[i]
            rewards += [float(_get(samples[i], "reward", 1.0))] * lengths[i]
        env_names += [""] * pad
        rewards += [float("nan")] * pad
        d["env_names"] = env_names
        first = samples[members[0]]
        if variant == "classic":
            d.pop("sequence_lengths", None)
            d.pop("seq_lens", None)
            d["rewards"] = np.array(rewards, dtype=np.float32)
            d["training_mode"] = str(_get(first, "training_mode", "rl"))
            # prime-rl's MicroBatch leaves mm_kwargs at its default (omitted) for text.
            mm_kwargs = _get(first, "mm_kwargs")
            if mm_kwargs is not None:
                d["mm_kwargs"] = mm_kwargs
        else:
            # One entry per sample in bin order (zero-length ones too); the padding is the last one's.
            sequence = np.array([lengths[i] for i in members], dtype=np.int32)
            sequence[-1] += pad
            d["sequence_lengths"], d["seq_lens"] = sequence, sequence.copy()
            del d["teacher_logprobs"]
            d["ref_logprobs"] = None
        out.append(d)
    return [[i for i in b if lengths[i]] for b in bins], out


def round_robin_plan(
    samples: Sequence[Any],
    *,
    seq_len: int,
    num_train_workers: int,
    num_loras: int = 1,
    pad_to_multiple_of: int = 1,
    backend: Optional[str] = None,
) -> Dict[str, Any]:
    """The plan of prime-rl's classic ``prepare_batch`` (trainer ``batch.py`` at ``b5daec1``):
    :func:`prepare_micro_batches`' packing and padding, then the micro-batches of each
    modality group (multimodal first, then text) completed to a multiple of
    ``num_train_workers`` with dummies — copies of the group's first micro-batch with the loss
    switched off — and micro-batch ``i`` dealt to rank ``i % num_train_workers``. The deal is
    the host's :func:`stowplan._stowplan.round_robin`, the one the packer runtime runs with
    ``distribution="round-robin"``.

    Returns ``{"bins", "per_rank", "rank_tokens"}``: ``bins`` as :func:`pack_samples` gives
    them; ``per_rank[r]`` one entry per micro-batch of rank ``r``, ``{"bin", "samples",
    "dummy", "multimodal", "num_tokens"}`` (a dummy names the bin it copies; ``num_tokens``
    after padding); ``rank_tokens[r]`` the tokens rank ``r`` runs, dummies included (prime-rl's
    dummies are full-size work).

    Raises prime-rl's errors in its order (those of :func:`prepare_micro_batches`, then
    ``ZeroDivisionError`` for ``num_train_workers == 0``); a negative ``num_train_workers``
    (prime-rl indexes an empty list) raises :class:`stowplan.InvalidArgumentError`.

    >>> plan = round_robin_plan(
    ...     [{"prompt_ids": [1] * 60, "completion_ids": [2] * 30}, {"prompt_ids": [3] * 50, "completion_ids": [4]}],
    ...     seq_len=100, num_train_workers=3)
    >>> [[(e["bin"], e["dummy"]) for e in rank] for rank in plan["per_rank"]], plan["rank_tokens"]
    ([[(0, False)], [(1, False)], [(0, True)]], [90, 51, 90])
    """
    bins, micro_batches = _micro_batches(samples, seq_len, num_loras, pad_to_multiple_of, "classic", backend)
    deal = _deal(micro_batches, num_train_workers)
    per_rank = [
        [
            {
                "bin": b,
                "samples": bins[b],
                "dummy": dummy,
                "multimodal": "mm_kwargs" in micro_batches[b],
                "num_tokens": len(micro_batches[b]["input_ids"]),
            }
            for b, dummy in rank
        ]
        for rank in deal
    ]
    return {"bins": bins, "per_rank": per_rank, "rank_tokens": [sum(e["num_tokens"] for e in rank) for rank in per_rank]}


def _deal(micro_batches: List[Dict[str, Any]], num_train_workers: Any) -> List[List[Tuple[int, bool]]]:
    workers = _stowplan._integer(num_train_workers, "num_train_workers", *_I64)
    if workers == 0:
        raise ZeroDivisionError("integer modulo by zero")  # prime-rl's ``-len(group) % 0``
    if workers < 0:
        raise InvalidArgumentError(f"num_train_workers must be at least 1 (got {workers})")
    return _stowplan.round_robin(["mm_kwargs" in d for d in micro_batches], workers)


def prepare_batch(
    samples: Sequence[Any],
    *,
    seq_len: int,
    num_train_workers: int,
    num_loras: int = 1,
    pad_to_multiple_of: int = 1,
    backend: Optional[str] = None,
) -> List[List[Dict[str, Any]]]:
    """prime-rl's classic ``prepare_batch``: every rank's micro-batches (dicts of
    :func:`prepare_micro_batches`' classic fields) in :func:`round_robin_plan`'s deal. A dummy
    is a deep copy of the micro-batch it names with ``advantages`` 0 and ``loss_mask`` False,
    as prime-rl's ``_make_dummy_batch``; every dummy of a group is the same object, as in
    prime-rl. Errors: those of :func:`round_robin_plan`.

    >>> ranks = prepare_batch([{"prompt_ids": [1, 2], "completion_ids": [3]}], seq_len=8, num_train_workers=2)
    >>> [(r[0]["input_ids"].tolist(), r[0]["loss_mask"].tolist()) for r in ranks]
    [([1, 2, 3], [False, False, True]), ([1, 2, 3], [False, False, False])]
    """
    _, micro_batches = _micro_batches(samples, seq_len, num_loras, pad_to_multiple_of, "classic", backend)
    deal = _deal(micro_batches, num_train_workers)
    dummies: Dict[int, Dict[str, Any]] = {}
    for rank in deal:
        for b, dummy in rank:
            if dummy and b not in dummies:
                d = copy.deepcopy(micro_batches[b])
                d["advantages"] = np.zeros_like(d["advantages"])
                d["loss_mask"] = np.zeros_like(d["loss_mask"])
                dummies[b] = d
    return [[dummies[b] if dummy else micro_batches[b] for b, dummy in rank] for rank in deal]


# ---------------------------------------------------------------------------------------------
# prime-rl at HEAD (559b447): packing in the orchestrator, KK over FLOPs costs (its functions
# live in _prime_rl_head.py; patch installs them).
# ---------------------------------------------------------------------------------------------

#: The module whose functions :func:`patch` replaces (prime-rl at HEAD; at de80b48 the
#: partition functions lived in ``prime_rl.trainer.utils``).
PATCH_TARGET = "prime_rl.trainer.batch"




def patch(module: str = PATCH_TARGET) -> Callable[[], None]:
    """Replaces ``balanced_partition`` and ``_karmarkar_karp`` in prime-rl's module
    ``module`` (default ``prime_rl.trainer.batch``, whose ``_distribute_group`` looks
    ``balanced_partition`` up at call time; use ``prime_rl.trainer.utils`` at de80b48) with
    stowplan's, which give the same groups. Weights outside 0..=2**64-1 (prime-rl's costs
    are unbounded Python ints) go to prime-rl's own functions. The module must be imported
    already. Returns a function that puts prime-rl's functions back.
    """
    import sys

    mod = sys.modules.get(module)
    if mod is None:
        raise InvalidArgumentError(f"module must be an imported prime-rl module (got {module!r}, not in sys.modules)")
    originals = {name: getattr(mod, name) for name in ("balanced_partition", "_karmarkar_karp") if hasattr(mod, name)}
    if not originals:
        raise InvalidArgumentError(f"{module} has neither balanced_partition nor _karmarkar_karp")

    def wrap(name: str, ours: Callable[..., List[List[int]]]) -> Callable[..., List[List[int]]]:
        theirs = originals[name]

        def replacement(weights: Sequence[int], num_partitions: int) -> List[List[int]]:
            if not all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w < 2**64 for w in weights):
                return theirs(weights, num_partitions)
            return ours(list(weights), num_partitions)

        replacement.__name__ = name
        replacement.__doc__ = f"stowplan's {name} (prime-rl's groups), installed by stowplan.compat.prime_rl.patch."
        replacement.__wrapped__ = theirs  # type: ignore[attr-defined]
        return replacement

    ours = {"balanced_partition": balanced_partition, "_karmarkar_karp": _karmarkar_karp}
    for name in originals:
        setattr(mod, name, wrap(name, ours[name]))

    def unpatch() -> None:
        for name, fn in originals.items():
            setattr(mod, name, fn)

    return unpatch
