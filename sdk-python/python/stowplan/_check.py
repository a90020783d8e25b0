"""Proof that packed samples do not see each other: :func:`check_packing` and :class:`PackingCheckCallback`.

Re-exported by :mod:`stowplan.hf`. Needs torch; the callback subclasses transformers'
``TrainerCallback``.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from . import _stowplan
from ._collate import boundaries_of_position_ids
from .errors import InvalidArgumentError, PackingContaminationError

try:
    from transformers import TrainerCallback as _CallbackBase
except ImportError:  # pragma: no cover - exercised where transformers is missing
    _CallbackBase = object  # type: ignore[assignment,misc]

__all__ = ["check_packing", "PackingCheckCallback"]

_log = logging.getLogger("stowplan")

# Batch entries that are targets or weights, not forward arguments.
_NOT_INPUTS = ("labels", "shift_labels", "loss_weights", "seq_idx", "seq_lengths")
# Attention implementations that read the boundaries of packed samples from position_ids.
_READ_POSITIONS = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
# The largest logit difference of a correct check, by logits' dtype: float32 differs from
# the unpacked run by rounding (1e-6 here), half precision by its 8- or 11-bit mantissa.
_ATOL = {"float64": 1e-6, "float32": 1e-3}
_ATOL_HALF = 5e-2


def _segments(batch: Dict[str, Any]) -> List[Tuple[int, int, int]]:
    """``(row, start, end)`` of every sample of a collated batch: its ``position_ids`` segments
    (by transformers' rule) within each row's unmasked tokens (the whole row without an
    ``attention_mask``), else a ``(1, T)`` row's ``cu_seq_lens_q``, else each unmasked run."""
    ids = batch["input_ids"]
    rows, width = int(ids.shape[0]), int(ids.shape[1])
    runs = []
    if batch.get("attention_mask") is not None:
        mask = np.asarray(batch["attention_mask"].detach().cpu())
        for r in range(rows):
            kept = np.flatnonzero(mask[r])
            if kept.size and kept[-1] - kept[0] + 1 != kept.size:
                raise InvalidArgumentError(f"batch['attention_mask'] row {r} is not one run of ones: a padded row holds one sample")
            if kept.size:
                runs.append((r, int(kept[0]), int(kept[-1]) + 1))
    else:
        runs = [(r, 0, width) for r in range(rows)]
    if batch.get("position_ids") is not None:
        positions = np.asarray(batch["position_ids"].detach().cpu()).reshape(-1, width)
        if positions.shape[0] == 1 and rows > 1:
            positions = np.repeat(positions, rows, axis=0)
        out = []
        for r, a, b in runs:
            start = a
            for n in boundaries_of_position_ids(positions[r, a:b]).tolist():
                out.append((r, start, start + n))
                start += n
        return out
    if batch.get("cu_seq_lens_q") is not None and rows == 1 and batch.get("attention_mask") is None:
        cu = np.asarray(batch["cu_seq_lens_q"].detach().cpu()).tolist()
        return [(0, a, b) for a, b in zip(cu[:-1], cu[1:]) if b > a]
    return runs


def _cause(model: Any, batch: Dict[str, Any], forward_kwargs: Dict[str, Any]) -> str:
    """The likely reason the samples of ``batch`` mixed in ``model``."""
    config = getattr(model, "config", None)
    impl = str(getattr(config, "_attn_implementation", "") or "")
    use_cache = forward_kwargs.get("use_cache", getattr(config, "use_cache", False))
    if batch.get("attention_mask") is not None:
        rows = _segments(batch)
        if len(rows) > len({r for r, _, _ in rows}):
            return (
                "the batch has an attention_mask beside packed position_ids: transformers reads the samples' boundaries "
                "from position_ids only without an attention_mask; drop it (layout 'flat' or 'rows' returns none)"
            )
        return "the padded rows mixed under their attention_mask: the model ignores it"
    if batch.get("position_ids") is None and batch.get("cu_seq_lens_q") is None:
        return (
            "the batch carries no position_ids (nor cu_seq_lens): the samples' boundaries were lost before the model "
            "(a column removed, or a collator that drops them)"
        )
    if use_cache:
        return (
            "use_cache=True: transformers builds a cache and, with a cache, does not read the samples' boundaries from "
            "position_ids. Pass use_cache=False to the forward (transformers.Trainer sets model.config.use_cache from "
            "TrainingArguments.use_cache, False by default; TRL's SFTTrainer passes use_cache=False)"
        )
    if "flash" in impl and int(batch["input_ids"].shape[0]) > 1:
        return (
            f"attn_implementation {impl!r} reads the boundaries from position_ids only in one (1, T) row; this batch has "
            f"{int(batch['input_ids'].shape[0])} rows: use layout='flat'"
        )
    if impl and impl not in _READ_POSITIONS:
        return f"attn_implementation {impl!r} ignores position_ids: use layout='padded', or an implementation that reads them"
    return f"the model (attn_implementation {impl!r}) does not separate the samples its position_ids mark"


def check_packing(model: Any, batch: Dict[str, Any], *, atol: Optional[float] = None, max_samples: Optional[int] = None, **forward_kwargs: Any) -> float:
    """Runs ``model`` on the collated ``batch`` the way the caller does (``model(**inputs,
    **forward_kwargs)``, the inputs being the batch without its targets and weights) and on
    every sample of it alone, and compares the logits token by token; returns the largest
    absolute difference. Raises :class:`stowplan.errors.PackingContaminationError` when it
    exceeds ``atol`` (default by the precision the model computes in: 1e-3 for float32, 5e-2
    for half precision — half-precision weights or logits, or accelerate's mixed precision), naming the sample, the token and the likely cause (``use_cache``, an attention
    implementation that ignores ``position_ids``, boundaries lost on the way).

    The samples are read from the batch: the ``position_ids`` segments of each row's
    unmasked tokens (the whole row without an ``attention_mask``), else ``cu_seq_lens_q``;
    ``max_samples`` checks only the first ones. The check sees the boundaries the batch
    carries: a packed row that lost them before the collator (no ``seq_lengths`` or
    ``position_ids``) is one sample to it as to the model — ``PaddingFreeCollator(packed=True)``
    refuses such a row. Each runs alone as ``(1, n)`` ``input_ids``
    with ``position_ids`` from 0 and the same ``forward_kwargs``. The model runs in eval mode
    (no dropout) without gradients, and is put back in its mode. ``batch`` holds torch
    tensors or numpy arrays (moved to the model's device).

    >>> import torch, stowplan.hf
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> _ = torch.manual_seed(0)
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                                      num_attention_heads=4, num_key_value_heads=2))
    >>> batch = stowplan.hf.PaddingFreeCollator()([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    >>> check_packing(model, batch, use_cache=False) < 1e-3
    True
    >>> check_packing(model, batch, use_cache=True)
    Traceback (most recent call last):
    ...
    stowplan.errors.PackingContaminationError: packed samples see each other: ...
    """
    import torch

    if not isinstance(batch, dict) or "input_ids" not in batch:
        raise InvalidArgumentError(f"batch must be a collated dict with input_ids (got {type(batch).__name__})")
    if atol is not None and (not isinstance(atol, (int, float)) or isinstance(atol, bool) or not 0 <= atol < float("inf")):
        raise InvalidArgumentError(f"atol must be a number >= 0 (got {atol!r})")
    if max_samples is not None:
        max_samples = _stowplan._integer(max_samples, "max_samples", 1, 2**31)
    try:
        device = next(iter(model.parameters())).device
    except (AttributeError, StopIteration, TypeError):
        raise InvalidArgumentError(f"model must be a torch model with parameters (got {type(model).__name__})") from None
    tensors = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in batch.items()}
    tensors = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in tensors.items()}
    ids = tensors["input_ids"]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise InvalidArgumentError(f"batch['input_ids'] must be a (B, L) tensor or array (got {getattr(ids, 'shape', type(ids).__name__)})")
    segments = _segments(tensors)[:max_samples]
    inputs = {k: v for k, v in tensors.items() if k not in _NOT_INPUTS}
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(**inputs, **forward_kwargs).logits
            dtype = str(logits.dtype).removeprefix("torch.")
            packed = logits.float()
            worst, where = 0.0, (-1, -1)
            for i, (row, a, b) in enumerate(segments):
                alone_ids = ids[row : row + 1, a:b]
                positions = torch.arange(b - a, device=device)[None, :]
                alone = model(input_ids=alone_ids, position_ids=positions, **forward_kwargs).logits.float()
                diff = (packed[row, a:b] - alone[0]).abs().amax(dim=-1)
                j = int(diff.argmax())
                if float(diff[j]) > worst:
                    worst, where = float(diff[j]), (i, j)
    finally:
        model.train(training)
    # Mixed precision computes in half precision whatever the logits' dtype: accelerate (under
    # Trainer's bf16/fp16) keeps the model's own forward as _original_forward.
    if hasattr(model, "_original_forward") or str(next(iter(model.parameters())).dtype).removeprefix("torch.") in ("bfloat16", "float16"):
        dtype = "half"
    limit = atol if atol is not None else _ATOL.get(dtype, _ATOL_HALF)
    if not worst <= limit:
        cause = _cause(model, tensors, forward_kwargs)
        raise PackingContaminationError(
            f"packed samples see each other: the logits of sample {where[0]} (of {len(segments)} in the batch) at its "
            f"token {where[1]} differ by {worst:.3g} from the sample run alone (tolerance {limit:g}). Likely cause: {cause}",
            max_difference=worst,
            sample=where[0],
            token=where[1],
            cause=cause,
        )
    return worst


class PackingCheckCallback(_CallbackBase):  # type: ignore[misc,valid-type]
    """A ``transformers.TrainerCallback`` that runs :func:`check_packing` once, before the
    first step, on the first batch the trainer's data loader gives (its collator applied to
    the first samples of its dataset, as the trainer's own columns left them), so that
    training never starts on mixed samples: :class:`stowplan.errors.PackingContaminationError`
    stops it. ``forward_kwargs`` are the keyword arguments the trainer adds to the forward
    (none for ``transformers.Trainer``, which sets ``model.config.use_cache``;
    ``use_cache=False`` for TRL's ``SFTTrainer``). ``atol`` and ``max_samples`` are
    :func:`check_packing`'s. The result is logged on the ``stowplan`` logger and kept in
    ``max_difference``. Under FSDP or DeepSpeed, whose forwards are collective, ranks checking
    batches of different sizes would wait on each other: the check is skipped there with a
    warning (run :func:`check_packing` on one process before sharding).
    """

    def __init__(self, *, atol: Optional[float] = None, max_samples: Optional[int] = None, **forward_kwargs: Any) -> None:
        if _CallbackBase is object:
            raise ImportError("PackingCheckCallback is a transformers TrainerCallback: pip install transformers")
        self.atol = atol
        self.max_samples = max_samples
        self.forward_kwargs = forward_kwargs
        #: The largest difference the check found (None until it ran).
        self.max_difference: Optional[float] = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, train_dataloader: Any = None, **kwargs: Any) -> Any:
        """Checks the first batch (see the class)."""
        if self.max_difference is not None or model is None or train_dataloader is None:
            return control
        if getattr(args, "fsdp", None) or getattr(args, "deepspeed", None):
            _log.warning("stowplan: the packing check is skipped under FSDP/DeepSpeed (collective forwards); run check_packing before sharding")
            return control
        batch = _first_batch(train_dataloader)
        self.max_difference = check_packing(model, batch, atol=self.atol, max_samples=self.max_samples, **self.forward_kwargs)
        _log.info("stowplan: packed samples stay apart (largest logit difference %.3g)", self.max_difference)
        return control


def _first_batch(loader: Any) -> Dict[str, Any]:
    """The collator of ``loader`` applied to :func:`_first_features`."""
    return loader.collate_fn(_first_features(loader))


def _first_features(loader: Any) -> List[Any]:
    """The samples of ``loader``'s first batch, drawn without advancing the loader or any
    random generator: a stowplan batch sampler's first micro-batch (its own seeded plan), else
    the dataset's first ``batch_size`` items."""
    dataset = loader.dataset
    sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(sampler, "batch_sampler", sampler)  # accelerate wraps it in BatchSamplerShard
    size = getattr(loader, "batch_size", None) or 1
    if hasattr(inner, "steps"):
        return [dataset[i] for i in next(mb for step in inner.steps() for mb in step)]
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return [dataset[i] for i in range(min(size, len(dataset)))]
    items = []
    for item in dataset:
        items.append(item)
        if len(items) == size:
            break
    return items
