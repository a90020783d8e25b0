"""prime-rl at HEAD (``559b447``, packing in the orchestrator), by prime-rl's own names: the
FLOPs bin cost read from a model config, equal-size Karmarkar–Karp with swap refinement, and
the plan of ``prepare_batch``. Re-exported by :mod:`stowplan.compat.prime_rl`, which documents
them and whose :func:`~stowplan.compat.prime_rl.patch` installs the partition functions.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _stowplan
from ..errors import InvalidArgumentError

_I64 = (-(2**63), 2**63 - 1)

_U64 = (0, 2**64 - 1)
_MISSING = object()


def _attr(config: Any, name: str, default: Any = _MISSING) -> Any:
    """``getattr(config, name[, default])`` for config objects and plain dicts alike (a dict's
    keys are its attributes; a missing one raises ``AttributeError`` as an object would)."""
    if isinstance(config, dict):
        if name in config:
            return config[name]
        if default is _MISSING:
            raise AttributeError(f"'dict' object has no attribute '{name}'")
        return default
    if default is _MISSING:
        return getattr(config, name)
    return getattr(config, name, default)


def _has(config: Any, name: str) -> bool:
    return name in config if isinstance(config, dict) else hasattr(config, name)


def _text_config(model_config: Any) -> Any:
    """prime-rl's ``_text_config``: a multimodal model's ``text_config``, else the config."""
    return _attr(model_config, "text_config", model_config)


def _packing_cost_coeffs(config: Any) -> Tuple[Any, Any]:
    """prime-rl's ``_packing_cost_coeffs(config)``: the (linear, quadratic) coefficients of a
    sequence's forward FLOPs, from an HF-style config (an object or a plain dict; pass a
    multimodal model's ``text_config``, as :func:`build_bin_cost` does).

    The same attribute look-ups, defaults and arithmetic as prime-rl, in its order (Python
    ints stay exact; a float attribute gives prime-rl's float). Layers: dense FFN width from
    ``ffn_hidden_size`` / ``intermediate_size`` / ``moe_intermediate_size``; MoE layers (when
    ``num_experts`` or ``n_routed_experts`` is set) counted from ``moe_layer_freq`` (list or
    int) or ``first_k_dense_replace``, their width ``moe_ffn_hidden_size`` (or
    ``moe_intermediate_size``) × top-k plus ``moe_shared_expert_intermediate_size``;
    attention by ``kv_channels`` / ``head_dim`` / ``hidden_size // num_attention_heads``,
    with multi-latent attention when ``multi_latent_attention`` or ``q_lora_rank`` is set.
    Missing required attributes raise ``AttributeError``, ``moe_layer_freq == 0``
    ``ZeroDivisionError``, as in prime-rl.

    >>> _packing_cost_coeffs({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
    ...     "head_dim": 128, "intermediate_size": 12288, "num_hidden_layers": 36, "vocab_size": 151936})
    (15136194560, 294912)
    """
    c = config
    hidden = _attr(c, "hidden_size")
    dense_layers, moe_layers = _layer_counts(c)
    heads = _attr(c, "num_attention_heads")
    kv_channels = _kv_channels(c)
    mla = _is_mla(c)
    qk = _attr(c, "qk_head_dim", 0)
    qk_pos = _attr(c, "qk_pos_emb_head_dim", 0)
    # Q/K/V projections, per token.
    if mla and _attr(c, "q_lora_rank", None) is not None:
        q_flops = 2 * _attr(c, "q_lora_rank") * (hidden + heads * (qk + qk_pos))
    else:
        q_head_dim = (qk + qk_pos) if mla else kv_channels
        q_flops = 2 * hidden * heads * q_head_dim
    if mla and _attr(c, "kv_lora_rank", None) is not None:
        v_head = _attr(c, "v_head_dim", 0)
        kv_flops = 2 * (_attr(c, "kv_lora_rank") * (hidden + heads * (qk + v_head)) + hidden * qk_pos)
    else:
        groups = _attr(c, "num_query_groups", _attr(c, "num_key_value_heads", heads))
        kv_flops = 4 * hidden * groups * kv_channels
    qkv = q_flops + kv_flops
    # Attention scores and values, per token².
    heads2 = _attr(c, "num_attention_heads")
    kv2 = _kv_channels(c)
    if _is_mla(c):
        qk2 = _attr(c, "qk_head_dim", 0)
        pos2 = _attr(c, "qk_pos_emb_head_dim", 0)
        v2 = _attr(c, "v_head_dim", kv2)
        attention = heads2 * (qk2 + pos2) + heads2 * v2
    else:
        attention = 2 * heads2 * kv2

    def layer(ffn: Any) -> Any:
        return qkv + 2 * hidden * hidden + 6 * hidden * ffn

    linear = (
        dense_layers * layer(_dense_ffn(c)) + moe_layers * layer(_moe_ffn(c)) + 2 * hidden * _attr(c, "vocab_size")
    )
    quadratic = (dense_layers + moe_layers) * attention
    return linear, quadratic


#: :func:`_packing_cost_coeffs` under a public name.
packing_cost_coeffs = _packing_cost_coeffs


def _is_mla(c: Any) -> bool:
    return bool(_attr(c, "multi_latent_attention", False) or _has(c, "q_lora_rank"))


def _kv_channels(c: Any) -> Any:
    # prime-rl's nested getattr defaults are evaluated eagerly: hidden // heads always is.
    return _attr(c, "kv_channels", _attr(c, "head_dim", _attr(c, "hidden_size") // _attr(c, "num_attention_heads")))


def _dense_ffn(c: Any) -> Any:
    return _attr(c, "ffn_hidden_size", _attr(c, "intermediate_size", _attr(c, "moe_intermediate_size", 0)))


def _moe_ffn(c: Any) -> Any:
    dense = _dense_ffn(c)
    topk = _attr(c, "moe_router_topk", _attr(c, "num_experts_per_tok", 1))
    width = _attr(c, "moe_ffn_hidden_size", _attr(c, "moe_intermediate_size", dense))
    return width * topk + (_attr(c, "moe_shared_expert_intermediate_size", None) or 0)


def _layer_counts(c: Any) -> Tuple[Any, Any]:
    """(dense, MoE) layer counts, as prime-rl's ``_count_dense_and_moe_layers``."""
    if _attr(c, "num_experts", _attr(c, "n_routed_experts", None)) is None:
        return _attr(c, "num_hidden_layers"), 0
    freq = _attr(c, "moe_layer_freq", None)
    if isinstance(freq, list):
        return sum(1 for f in freq if f == 0), sum(1 for f in freq if f > 0)
    if isinstance(freq, int):
        layers = _attr(c, "num_hidden_layers")
        dense = sum(1 for i in range(layers) if i % freq != 0)
        return dense, layers - dense
    if _attr(c, "first_k_dense_replace", None) is not None:
        dense = _attr(c, "first_k_dense_replace")
        return dense, _attr(c, "num_hidden_layers") - dense
    return 0, _attr(c, "num_hidden_layers")


class BinCost:
    """The cost of a packed bin, as prime-rl's ``build_bin_cost`` closure scores it:
    ``linear · Σ lengths + quadratic · Σ lengths²`` (Python ints, exact). ``linear`` and
    ``quadratic`` are readable, so :func:`prepare_batch_plan` hands them to the kernel.

    >>> BinCost(1, 0)([3, 4]), BinCost(10, 2)([3, 4])
    (7, 120)
    """

    __slots__ = ("linear", "quadratic")

    def __init__(self, linear: Any, quadratic: Any) -> None:
        self.linear = linear
        self.quadratic = quadratic

    def __call__(self, seqlens: Sequence[int]) -> Any:
        """The cost of a bin whose sequences have these lengths."""
        return self.linear * sum(seqlens) + self.quadratic * sum(n * n for n in seqlens)

    def __repr__(self) -> str:
        return f"BinCost(linear={self.linear!r}, quadratic={self.quadratic!r})"


def build_bin_cost(model_config: Any) -> BinCost:
    """prime-rl's ``build_bin_cost(model_config)``: with ``None`` the coefficients are
    (1, 0) (the cost is the token count), else :func:`_packing_cost_coeffs` of the
    config's ``text_config`` (or the config itself).

    >>> build_bin_cost(None)([5, 7])
    12
    """
    if model_config is None:
        return BinCost(1, 0)
    return BinCost(*_packing_cost_coeffs(_text_config(model_config)))


def _partition_args(weights: Any, num_partitions: Any) -> Tuple[List[int], int]:
    """prime-rl's preconditions, with its exceptions: ``ZeroDivisionError`` for 0 partitions,
    ``AssertionError`` unless the weights are a positive multiple of them (for a negative
    count that divides them, its ``IndexError`` on no states); weights must be integers in
    0..=2**64-1 (``InvalidArgumentError`` otherwise)."""
    k = _stowplan._integer(num_partitions, "num_partitions", -(2**63), 2**32 - 1)
    w = _stowplan._integers(weights, "weights", *_U64)
    n = len(w)
    if k == 0:
        raise ZeroDivisionError("integer modulo by zero")
    if n < k or n % k != 0:
        raise AssertionError()
    if k < 0:
        raise IndexError("list index out of range")
    return w, k


def _karmarkar_karp(weights: Sequence[int], num_partitions: int, *, backend: Optional[str] = None) -> List[List[int]]:
    """prime-rl's ``_karmarkar_karp(weights, num_partitions)`` (equal-size Karmarkar–Karp),
    computed by the kernel: ``num_partitions`` groups of ``len(weights) / num_partitions``
    indices, groups in descending (total, members) order, members ascending.

    >>> _karmarkar_karp([2, 9, 17, 16, 13, 30, 26, 27, 10], 3)
    [[1, 3, 7], [4, 6, 8], [0, 2, 5]]
    """
    w, k = _partition_args(weights, num_partitions)
    return _stowplan._prime_rl_karmarkar_karp(w, k, backend=backend)


#: :func:`_karmarkar_karp` under a public name.
karmarkar_karp = _karmarkar_karp


def balanced_partition(weights: Sequence[int], num_partitions: int, *, backend: Optional[str] = None) -> List[List[int]]:
    """prime-rl's ``balanced_partition(weights, num_partitions)``, computed by the kernel:
    :func:`_karmarkar_karp`, then prime-rl's pairwise-swap refinement (the swap lowering
    (max load, spread) the most, first found in rank/position order, until none does;
    swapped items take each other's positions). Errors as :func:`_karmarkar_karp`.

    >>> balanced_partition([2, 9, 17, 16, 13, 30, 26, 27, 10], 3)
    [[1, 3, 6], [4, 7, 8], [0, 2, 5]]
    """
    w, k = _partition_args(weights, num_partitions)
    return _stowplan._prime_rl_balanced_partition(w, k, backend=backend)


def _raw(sample: Any, name: str) -> Any:
    """A field of a sample (mapping or object), ``None`` when absent."""
    return sample.get(name) if isinstance(sample, dict) else getattr(sample, name, None)


def _sample_length(i: int, s: Any, seq_len: int) -> Tuple[int, Any]:
    """prime-rl's ``prepare_sample`` checks (its exceptions, in its order) and what it keeps of
    a ``TrainingSample``-like rollout: the length and the ``mm_kwargs`` (``None`` when a cut
    drops every image), as ``{name: (dtype, shape)}``."""
    ids = _raw(s, "token_ids")
    if ids is None:
        raise InvalidArgumentError(f"rollouts[{i}] needs token_ids (a TrainingSample or a mapping with its fields)")
    n = len(ids)
    type_ids = _raw(s, "mm_token_type_ids")
    mm_kwargs = _raw(s, "mm_kwargs")
    if type_ids is not None and len(type_ids) != n:
        raise ValueError(f"mm_token_type_ids length must match token_ids length ({len(type_ids)} != {n})")
    if mm_kwargs is not None and "image_grid_thw" in mm_kwargs and type_ids is None:
        raise ValueError("image_grid_thw multimodal samples require mm_token_type_ids")
    env = _raw(s, "env_name")
    if _raw(s, "advantages") is None:
        mask = list(_raw(s, "mask") or [])
        rl = _raw(s, "rl_weights")
        live = any(mask) if rl is None else any(m and w != 0 for m, w in zip(mask, rl))
        if live:
            raise ValueError(
                f"sample from env '{env}' has rl member tokens but no advantages — "
                "the producer must stamp the advantage stream (the orchestrator broadcasts the rollout scalar)"
            )
    if env == "all":
        raise AssertionError("env_name='all' is reserved for aggregate metric keys")
    shapes = None if mm_kwargs is None else {k: (str(mm_kwargs[k].dtype), list(mm_kwargs[k].shape)) for k in mm_kwargs}
    if n <= seq_len:
        return n, shapes
    if type_ids is None or mm_kwargs is None:
        return seq_len, shapes
    return _cut_multimodal(list(type_ids), mm_kwargs, seq_len, shapes)


def _values(tensor: Any) -> Any:
    """A tensor's values: an encoded tensor's bytes (``dtype``, ``shape``, ``data``), or any
    array numpy reads."""
    data = getattr(tensor, "data", None)
    if isinstance(data, (bytes, bytearray)):
        return np.frombuffer(bytearray(data), dtype=tensor.dtype).reshape(tensor.shape)
    return np.asarray(tensor)


def _cut_multimodal(type_ids: List[int], mm_kwargs: Any, seq_len: int, shapes: Dict[str, Any]) -> Tuple[int, Any]:
    """prime-rl's ``_truncate_mm``: a cut never splits an image's placeholder block. Images
    are ``image_grid_thw`` rows (patches = the product of a row), ``pixel_values`` rows are
    patches, patches per token = patches // image tokens. The cut is ``seq_len`` when the
    image tokens before it are whole images, else the first token of the image it ends in;
    the images that survive whole keep their rows (none left: ``mm_kwargs`` is dropped)."""
    grid = _values(mm_kwargs["image_grid_thw"])
    patches = [int(g.prod()) for g in grid]
    total_patches = mm_kwargs["pixel_values"].shape[0]
    image_tokens = sum(1 for t in type_ids if t)
    per_token = total_patches // image_tokens if image_tokens else 1
    tokens = [p // per_token for p in patches]
    surviving = sum(1 for t in type_ids[:seq_len] if t)
    kept = acc = 0
    for count in tokens:
        if acc + count > surviving:
            break
        acc += count
        kept += 1
    cut = seq_len
    if acc != surviving:
        seen = 0
        for j, t in enumerate(type_ids):
            if t:
                seen += 1
                if seen == acc + 1:
                    cut = j
                    break
    if not kept:
        return cut, None
    rows = {k: kept if k == "image_grid_thw" else sum(patches[:kept]) for k in shapes}
    return cut, {k: (dtype, [rows[k], *shape[1:]]) for k, (dtype, shape) in shapes.items()}


def _mm_classes(kept: Sequence[Any]) -> List[int]:
    """Multimodal compatibility classes (0: text) of the samples' kept ``mm_kwargs``
    (``{name: (dtype, shape)}`` or ``None``): prime-rl lets two multimodal samples share a bin
    when their tensors have the same keys and, per key, the same dtype, rank and shape past
    the first dimension; a 0-dim tensor makes a sample compatible with nothing."""
    seen: Dict[Any, int] = {}
    classes: List[int] = []
    alone = 2**32 - 1
    for mm in kept:
        if mm is None:
            classes.append(0)
            continue
        if any(len(shape) == 0 for _, shape in mm.values()):
            classes.append(alone)
            alone -= 1
            continue
        sig = tuple(sorted((str(k), dtype, len(shape), tuple(shape[1:])) for k, (dtype, shape) in mm.items()))
        classes.append(seen.setdefault(sig, len(seen) + 1))
    return classes


def _coefficients(bin_cost: Any) -> Tuple[int, int]:
    if isinstance(bin_cost, tuple) and len(bin_cost) == 2:
        linear, quadratic = bin_cost
    elif hasattr(bin_cost, "linear") and hasattr(bin_cost, "quadratic"):
        linear, quadratic = bin_cost.linear, bin_cost.quadratic
    else:
        raise InvalidArgumentError(
            f"bin_cost must come from build_bin_cost (or be a (linear, quadratic) pair of integers in 0..=2**64-1) "
            f"(got {bin_cost!r})"
        )
    return (
        _stowplan._integer(linear, "bin_cost.linear", *_U64),
        _stowplan._integer(quadratic, "bin_cost.quadratic", *_U64),
    )


def prepare_batch_plan(
    rollouts: Sequence[Any],
    seq_len: int,
    num_train_workers: int,
    bin_cost: Any,
    pad_to_multiple_of: int = 1,
    *,
    idxs: Optional[Sequence[int]] = None,
    num_loras: Optional[int] = None,
    backend: Optional[str] = None,
) -> Dict[str, Any]:
    """The plan of prime-rl's ``prepare_batch(rollouts, seq_len, num_train_workers,
    bin_cost, pad_to_multiple_of)`` (HEAD, 559b447): which samples each micro-batch holds
    and which rank trains it, computed by the kernel; the token arrays are not built.

    ``rollouts`` are prime-rl ``TrainingSample``s or mappings with their fields (read:
    ``token_ids``, ``mask``, ``advantages``, ``rl_weights``, ``env_name``, ``mm_kwargs``,
    ``mm_token_type_ids``, ``routed_experts``). ``bin_cost`` comes from
    :func:`build_bin_cost` (or is a ``(linear, quadratic)`` pair). With ``idxs`` (one LoRA
    index per rollout) and ``num_loras``, de80b48's multi-LoRA packer: packing order
    (LoRA, −length), multimodal bins keep to one LoRA, and entries carry
    ``lora_num_tokens``.

    Returns ``{"cost_coefficients": [linear, quadratic], "bins": [...], "per_rank": [...],
    "rank_costs": [...]}``: ``bins`` after prime-rl's splitting (sample indices in joining
    order); per rank, its micro-batches in order, each ``{"bin", "samples", "dummy",
    "multimodal", "sequence_lengths", "cost"}`` (a dummy is a loss-free copy of its
    modality group's first bin; the padding is counted in the last sequence and the cost).

    Raises prime-rl's exceptions in its order: ``ValueError``/``AssertionError`` from
    ``prepare_sample``, ``IndexError`` for a LoRA index ≥ ``num_loras``,
    ``ZeroDivisionError`` for ``pad_to_multiple_of == 0`` (with rollouts) and for
    ``num_train_workers == 0``. ``InvalidArgumentError`` for what stowplan does not model:
    negative ``num_train_workers`` or LoRA indices, ``seq_len < 1``, costs above 2**64 - 1.
    A multimodal sample with ``mm_token_type_ids`` longer than ``seq_len`` is cut as prime-rl's
    ``_truncate_mm`` cuts it (at an image boundary; no whole image left: it packs as text),
    with its exceptions (``KeyError`` for a missing ``image_grid_thw``/``pixel_values``).

    >>> rollouts = [{"token_ids": [1] * n, "mask": [True] * n, "advantages": [1.0] * n, "env_name": "e"}
    ...             for n in (60, 30, 30, 20)]
    >>> plan = prepare_batch_plan(rollouts, seq_len=64, num_train_workers=2, bin_cost=build_bin_cost(None))
    >>> # Three bins for two workers: the bin [1, 2] is split, then KK balances 60+20 / 30+30.
    >>> plan["bins"], [[e["samples"] for e in rank] for rank in plan["per_rank"]]
    ([[0], [1], [3], [2]], [[[0], [3]], [[1], [2]]])
    """
    seq_len = _stowplan._integer(seq_len, "seq_len", 1, _U64[1])
    workers = _stowplan._integer(num_train_workers, "num_train_workers", 0, 2**32 - 1)
    multiple = _stowplan._integer(pad_to_multiple_of, "pad_to_multiple_of", *_I64)
    linear, quadratic = _coefficients(bin_cost)
    prepared = [_sample_length(i, s, seq_len) for i, s in enumerate(rollouts)]
    lengths = [n for n, _ in prepared]
    multilora = idxs is not None
    if multilora:
        if num_loras is None:
            raise InvalidArgumentError("num_loras is required with idxs (de80b48's prepare_batch takes both)")
        runs = _stowplan._integers(idxs, "idxs", 0, 2**32 - 1)
        if len(runs) != len(lengths):
            raise InvalidArgumentError(f"idxs needs one entry per rollout ({len(lengths)}), got {len(runs)}")
        num_loras = _stowplan._integer(num_loras, "num_loras", *_I64)
        if any(r >= num_loras for r in runs):
            raise IndexError("list index out of range")
    else:
        runs = [0] * len(lengths)
    if multiple == 0 and lengths:
        raise ZeroDivisionError("integer modulo by zero")
    if workers == 0:
        raise ZeroDivisionError("integer modulo by zero")
    labels = [int(_raw(s, "routed_experts") is not None) for s in rollouts]
    p = _stowplan._prime_rl_prepare_batch(
        lengths,
        runs,
        _mm_classes([mm for _, mm in prepared]),
        labels,
        seq_len=seq_len,
        num_train_workers=workers,
        linear=linear,
        quadratic=quadratic,
        pad_to_multiple_of=max(multiple, 1),
        multimodal_same_run=multilora,
        backend=backend,
    )
    per_rank: List[List[Dict[str, Any]]] = []
    rank_costs: List[int] = []
    for rank, flags in zip(p.ranks, p.dummies):
        entries = []
        for b, dummy in zip(rank, flags):
            members = p.bins[b]
            seqs = [lengths[i] for i in members]
            if seqs:
                seqs[-1] += p.padding[b]
            e: Dict[str, Any] = {
                "bin": b,
                "samples": list(members),
                "dummy": dummy,
                "multimodal": p.multimodal[b],
                "sequence_lengths": seqs,
                "cost": p.costs[b],
            }
            if multilora:
                tokens = [0] * num_loras
                for i in members:
                    tokens[runs[i]] += lengths[i]
                tokens[-1] += p.padding[b]
                e["lora_num_tokens"] = tokens
            entries.append(e)
        per_rank.append(entries)
        rank_costs.append(sum(e["cost"] for e in entries))
    return {"cost_coefficients": [linear, quadratic], "bins": p.bins, "per_rank": per_rank, "rank_costs": rank_costs}
