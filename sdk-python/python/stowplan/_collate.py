"""Collating samples and packed rows for a model's forward, in the layout its attention backend runs fastest: :class:`PaddingFreeCollator`, :func:`recommend_layout`.

Re-exported by :mod:`stowplan.hf` (where users find them); needs numpy only (torch for
``return_tensors="pt"``, the default where torch is installed).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from . import _stowplan
from ._convert import array_of, as_int64
from ._stowplan import materialize
from .errors import InvalidArgumentError

__all__ = ["PaddingFreeCollator", "recommend_layout", "LAYOUTS", "DEFAULT_LAYOUT", "boundaries_of_position_ids"]

#: The collator's layouts (see :class:`PaddingFreeCollator`): ``"flat"`` — one (1, T) row, for
#: varlen kernels (FlashAttention 2/3, flex attention on a GPU); ``"rows"`` — the features as a
#: (B, L) batch of packed rows, samples separated by ``position_ids``; ``"padded"`` — whole
#: samples padded to the longest of the batch with an ``attention_mask``, for dense-mask
#: backends (SDPA, eager) and models that cannot pack (Mamba/SSM).
LAYOUTS = ("flat", "rows", "padded")
DEFAULT_LAYOUT = "flat"

# The attention implementations with a varlen kernel that reads the boundaries of a flat row
# from its position_ids (transformers' flash paths), and those that build a dense (B, 1, L, L)
# mask (every token pair computed, masked or not).
_VARLEN = ("flash_attention_2", "flash_attention_3", "flash_attention_4")
_DENSE = ("sdpa", "eager")
# Model types without attention over a sequence of packed samples: state-space and recurrent
# layers carry their state across a row, so samples cannot share one.
_UNPACKABLE = ("mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm", "jamba", "zamba", "zamba2", "bamba", "falcon_h1", "nemotron_h", "granitemoehybrid", "lfm2")


def _torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def recommend_layout(model: Any, device: Any = None) -> str:
    """The :data:`LAYOUTS` entry that runs ``model`` (a transformers model, or its config)
    fastest on ``device`` (a ``torch.device`` or its name; default: the device of the model's
    first parameter, else ``"cpu"``), from ``config._attn_implementation`` and the model type:

    - ``"flat"`` for a varlen kernel (``flash_attention_2``/``3``/``4``, a hub kernel whose
      name holds ``flash``, and ``flex_attention`` on a GPU): attention costs Σ len² of the
      samples however long the row;
    - ``"padded"`` for dense-mask backends (``sdpa``, ``eager``, ``flex_attention`` off a GPU)
      and for models whose layers carry state along a row (Mamba/SSM hybrids): a packed row of
      T tokens costs T² there, length-grouped padded micro-batches (:class:`PaddedBatchSampler`)
      only Σ bs·max_len²;
    - ``"padded"`` too for an implementation it does not know (the layout that assumes nothing
      of it).

    ``"rows"`` (static (B, L) shapes) is never the fastest here; choose it where shapes must
    not change (compiled graphs).

    >>> from transformers import LlamaConfig
    >>> recommend_layout(LlamaConfig(attn_implementation="sdpa")), recommend_layout(LlamaConfig(attn_implementation="flash_attention_2"))
    ('padded', 'flat')
    """
    config = getattr(model, "config", model)
    impl = getattr(config, "_attn_implementation", None)
    if impl is None and not hasattr(config, "model_type"):
        raise InvalidArgumentError(f"model must be a transformers model or config (got {type(model).__name__}: no config._attn_implementation)")
    if getattr(config, "model_type", None) in _UNPACKABLE:
        return "padded"
    if device is None:
        params = getattr(model, "parameters", None)
        first = next(iter(params()), None) if callable(params) else None
        device = first.device if first is not None else "cpu"
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    impl = str(impl or "")
    if impl in _VARLEN or "flash" in impl:
        return "flat"
    if impl == "flex_attention" and kind in ("cuda", "xpu"):
        return "flat"
    return "padded"


def boundaries_of_position_ids(position_ids: np.ndarray) -> np.ndarray:
    """The lengths of the sequences of one row of ``position_ids`` by transformers' rule: a
    sequence starts wherever a position is not its predecessor's plus one."""
    if position_ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.diff(position_ids) != 1) + 1
    return np.diff(np.concatenate(([0], starts, [position_ids.size]))).astype(np.int64)


def _int64s(values: Any, name: str) -> np.ndarray:
    """A feature's token ids, labels or sequence lengths as one ``int64`` row, by the integer
    rule of every entry point (``stowplan._convert``: floats, bools and strings refused, values
    exact): ``InvalidArgumentError`` naming ``name``. Lists go through numpy at once (their
    elements one by one when numpy cannot type them, or would read a bool among integers as
    one: ``[True, 2]`` is refused); arrays of any shape are flattened."""
    if isinstance(values, (list, tuple)):
        if len(values) == 0:
            return np.zeros(0, dtype=np.int64)
        # A bool among other values goes element by element by the native rule, which refuses
        # it: numpy would read [True, 2] as [1, 2]. Other lists go through numpy at once (all
        # bools, all floats: refused there by dtype).
        rows = values if all(isinstance(v, (list, tuple)) for v in values) else [values]  # (1, T) from a tokenizer
        if len(rows) > 1:
            raise InvalidArgumentError(f"{name} holds {len(rows)} rows: a feature is one sample or packed row, (T,) or (1, T)")
        types = set().union(*map(lambda row: set(map(type, row)), rows))
        if len(types) > 1 and (bool in types or np.bool_ in types):
            return as_int64([v for r in rows for v in r], name, -(2**63))
        try:
            values = np.asarray(values)
        except (ValueError, OverflowError):
            values = list(values)  # ragged or mixed: checked element by element below
    elif not isinstance(values, (str, bytes, bytearray)):
        arr = array_of(values, name)  # numpy, __array__ (torch), DLPack; None for anything else
        values = values if arr is None else arr
    if isinstance(values, np.ndarray):
        if values.size == 0:
            return np.zeros(0, dtype=np.int64)  # (an empty array is float by default)
        if values.ndim > 1 and values.size != values.shape[-1]:
            raise InvalidArgumentError(f"{name} has shape {values.shape}: a feature is one sample or packed row, (T,) or (1, T)")
        if values.ndim != 1:
            values = values.reshape(-1)  # (1, T) from a tokenizer, or a 0-d scalar
    return as_int64(values, name, -(2**63))


# Why a packed row may arrive without its boundaries: said in the refusal.
_REMOVED = (
    "a packed row lost its sequence boundaries (no seq_lengths or position_ids): something removed those columns. "
    "transformers.Trainer (remove_unused_columns=True, its default) keeps only the arguments of the model's forward: "
    "position_ids survives it, seq_lengths does not; TRL's SFTTrainer keeps input_ids, labels and seq_lengths. "
    "Pack with stowplan.hf.pack_dataset(..., position_ids=True) (the default), or pass remove_unused_columns=False"
)


class PaddingFreeCollator:
    """Collates features — samples, or rows of :func:`stowplan.hf.pack_dataset` holding several
    — into a batch for a causal LM's forward, in one of the :data:`LAYOUTS` (``layout``;
    :func:`recommend_layout` picks one for a model):

    - ``"flat"`` (default): one padding-free (1, T) row, as ``transformers.DataCollatorWithFlattening``
      gives (features without ``seq_lengths`` give exactly what it gives with the same
      options): ``input_ids``, ``labels`` = ``separator_id`` at each sequence's first token (no
      token learns across a boundary), ``position_ids`` restarting at ``position_ids_start`` at
      every sequence (transformers separates the samples by them: no ``attention_mask`` is
      returned, which would hide them), with ``return_flash_attn_kwargs``
      ``cu_seq_lens_q``/``cu_seq_lens_k`` (int32) and ``max_length_q``/``max_length_k``;
    - ``"rows"``: each feature one row of a (B, L) batch, L the longest row rounded up to
      ``pad_to_multiple_of``, samples separated by ``position_ids`` as above; a row's padding is
      a segment of its own (``pad_token_id``, label -100, positions from ``position_ids_start``)
      that attends only to itself. For dense-mask and flex attention: transformers' flash paths
      read the boundaries from ``position_ids`` only in a (1, T) batch, so with flash attention
      the samples of B > 1 rows would mix (use ``"flat"``; :func:`check_packing` names it);
    - ``"padded"``: each feature one sample, right-padded to the longest of the batch (rounded
      up to ``pad_to_multiple_of``) with ``pad_token_id``, ``labels`` -100 on the padding and an
      ``attention_mask`` (int64); a feature holding several sequences is refused.

    Boundaries: a feature's sequences are its ``seq_lengths`` or, without them, its
    ``position_ids`` (a sequence starts where a position is not its predecessor's plus one, as
    transformers reads them; both given must agree). ``packed``: ``True`` — every feature is a
    packed row and one arriving without ``seq_lengths`` and ``position_ids`` is refused, naming
    what removes them (``Trainer``'s ``remove_unused_columns``); ``False`` — every feature is one
    sample (any boundaries it carries must say one sequence); ``None`` (default) — as the
    features say.

    ``return_seq_idx``: ``seq_idx`` (int32, each token's sequence number in the batch, -1 on
    padding). ``return_loss_weights``: ``loss_weights`` (float32) and ``shift_labels`` (int64),
    both aligned with the logits: ``shift_labels[..., t]`` is the token position ``t``
    predicts (-100 where nothing is learnt: a sequence's last token, padding, ignored labels),
    and Σ ``loss_weights × token_loss``, with ``token_loss`` the elementwise cross-entropy of
    ``logits`` against ``shift_labels``, is the loss the sequences give unpacked under
    ``loss_agg_mode`` — ``"token-mean"`` (default), ``"seq-mean-token-mean"``,
    ``"seq-mean-token-sum"`` or ``"seq-mean-token-sum-norm"`` (horizon ``loss_scale_factor``;
    default the batch's longest sequence) — with the counts taken over the collated batch,
    however its sequences were packed (the kernel's :func:`stowplan.materialize` weights, the
    same definition, moved one position back: ``materialize``'s sit on the label, these on the
    logit that predicts it). transformers' own loss takes ``shift_labels`` too.

    Values are integers, exactly (floats, bools and strings are refused naming the feature and
    key, as by every entry point). ``return_tensors``: ``"pt"`` (torch tensors, without a copy)
    or ``"np"``; default ``"pt"`` where torch is importable, else ``"np"``.

    >>> c = PaddingFreeCollator(return_flash_attn_kwargs=True, return_tensors="np")
    >>> out = c([{"input_ids": [5, 6, 7, 8, 9], "seq_lengths": [3, 2]}, {"input_ids": [1, 2]}])
    >>> out["labels"].tolist(), out["position_ids"].tolist(), out["cu_seq_lens_q"].tolist()
    ([[-100, 6, 7, -100, 9, -100, 2]], [[0, 1, 2, 0, 1, 0, 1]], [0, 3, 5, 7])
    >>> rows = PaddingFreeCollator(layout="rows", return_tensors="np")([{"input_ids": [5, 6, 7], "position_ids": [0, 1, 0]}, {"input_ids": [1]}])
    >>> rows["input_ids"].tolist(), rows["position_ids"].tolist()
    ([[5, 6, 7], [1, 0, 0]], [[0, 1, 0], [0, 0, 1]])
    """

    def __init__(
        self,
        *,
        layout: str = DEFAULT_LAYOUT,
        packed: Optional[bool] = None,
        return_position_ids: bool = True,
        position_ids_start: int = 0,
        separator_id: int = -100,
        pad_token_id: int = 0,
        pad_to_multiple_of: Optional[int] = None,
        return_flash_attn_kwargs: bool = False,
        return_seq_idx: bool = False,
        return_loss_weights: bool = False,
        loss_agg_mode: Optional[str] = None,
        loss_scale_factor: Optional[float] = None,
        return_tensors: Optional[str] = None,
    ) -> None:
        if not isinstance(layout, str) or layout not in LAYOUTS:
            raise InvalidArgumentError(f"layout must be one of {', '.join(map(repr, LAYOUTS))} (got {layout!r})")
        if packed is not None and not isinstance(packed, bool):
            raise InvalidArgumentError(f"packed must be True, False or None (got {packed!r})")
        for name, flag in (
            ("return_position_ids", return_position_ids),
            ("return_flash_attn_kwargs", return_flash_attn_kwargs),
            ("return_seq_idx", return_seq_idx),
            ("return_loss_weights", return_loss_weights),
        ):
            if not isinstance(flag, bool):
                raise InvalidArgumentError(f"{name} must be True or False (got {flag!r})")
        if return_flash_attn_kwargs and layout != "flat":
            raise InvalidArgumentError(f"return_flash_attn_kwargs describes one flat row: it needs layout='flat' (got layout={layout!r})")
        if layout == "rows" and not return_position_ids:
            raise InvalidArgumentError("layout='rows' separates the samples of a row by their position_ids: return_position_ids must be True")
        if layout == "flat" and pad_to_multiple_of is not None:
            raise InvalidArgumentError("pad_to_multiple_of pads the rows of layout 'rows' or 'padded'; a flat row has no padding")
        if layout == "padded" and packed:
            raise InvalidArgumentError("layout='padded' takes whole samples: packed=True needs layout 'flat' or 'rows'")
        if return_tensors is None:
            return_tensors = "pt" if _torch_importable() else "np"
        elif return_tensors not in ("np", "pt"):
            raise InvalidArgumentError(f"return_tensors must be 'pt', 'np' or None (got {return_tensors!r})")
        elif return_tensors == "pt" and not _torch_importable():
            raise InvalidArgumentError("return_tensors='pt' needs torch, which is not importable; use 'np'")
        self.layout = layout
        self.packed = packed
        self.return_position_ids = return_position_ids
        self.position_ids_start = _stowplan._integer(position_ids_start, "position_ids_start", -(2**62), 2**62)
        self.separator_id = _stowplan._integer(separator_id, "separator_id", -(2**63), 2**63 - 1)
        self.pad_token_id = _stowplan._integer(pad_token_id, "pad_token_id", -(2**63), 2**63 - 1)
        self.pad_to_multiple_of = None if pad_to_multiple_of is None else _stowplan._integer(pad_to_multiple_of, "pad_to_multiple_of", 1, 2**32)
        self.return_flash_attn_kwargs = return_flash_attn_kwargs
        self.return_seq_idx = return_seq_idx
        self.return_loss_weights = return_loss_weights
        if not return_loss_weights and (loss_agg_mode is not None or loss_scale_factor is not None):
            raise InvalidArgumentError("loss_agg_mode and loss_scale_factor shape loss_weights: pass return_loss_weights=True")
        self.loss_agg_mode = loss_agg_mode
        self.loss_scale_factor = loss_scale_factor
        if return_loss_weights:  # the kernel checks the mode and the horizon (its messages name them)
            self._loss_weights(np.zeros(1, np.int64), np.zeros(1, bool), np.array([0, 1]))
        self.return_tensors = return_tensors

    def _feature(self, i: int, f: Any) -> Any:
        """``(input_ids, labels, sequence lengths)`` of ``features[i]``, checked."""
        if not isinstance(f, Mapping):
            raise InvalidArgumentError(f"features[{i}] must be a dict with input_ids (got {type(f).__name__})")
        if "input_ids" not in f:
            raise InvalidArgumentError(f"features[{i}] has no input_ids (its keys: {sorted(f)})")
        x = _int64s(f["input_ids"], f"features[{i}]['input_ids']")
        y = _int64s(f["labels"], f"features[{i}]['labels']") if "labels" in f else x
        if y.size != x.size:
            raise InvalidArgumentError(f"features[{i}]: labels has {y.size} values, input_ids {x.size}")
        seqs = None
        if "seq_lengths" in f:
            seqs = _int64s(f["seq_lengths"], f"features[{i}]['seq_lengths']")
            if int(seqs.sum()) != x.size:
                raise InvalidArgumentError(f"features[{i}]: seq_lengths sum to {int(seqs.sum())}, not the {x.size} input_ids")
            if (seqs <= 0).any():
                raise InvalidArgumentError(f"features[{i}] holds an empty sequence; every sequence needs a token")
        if "position_ids" in f:
            pos = _int64s(f["position_ids"], f"features[{i}]['position_ids']")
            if pos.size != x.size:
                raise InvalidArgumentError(f"features[{i}]: position_ids has {pos.size} values, input_ids {x.size}")
            by_position = boundaries_of_position_ids(pos)
            if seqs is not None and not np.array_equal(seqs, by_position):
                raise InvalidArgumentError(
                    f"features[{i}]: seq_lengths {seqs.tolist()[:8]} and the sequences of its position_ids "
                    f"{by_position.tolist()[:8]} disagree (a sequence starts where a position is not the previous plus one)"
                )
            seqs = by_position
        if seqs is None:
            if self.packed:
                raise InvalidArgumentError(f"features[{i}]: {_REMOVED}")
            seqs = np.array([x.size]) if x.size else np.zeros(0, np.int64)
        if x.size == 0 and (self.layout != "flat" or "seq_lengths" not in f):
            raise InvalidArgumentError(f"features[{i}] holds an empty sequence; every sequence needs a token")
        if seqs.size > 1 and (self.packed is False or self.layout == "padded"):
            why = "layout='padded' takes whole samples" if self.layout == "padded" else "packed=False"
            raise InvalidArgumentError(
                f"features[{i}] is a packed row of {seqs.size} sequences, and {why}: use layout 'flat' or 'rows' for packed rows"
            )
        return x, y, seqs

    def __call__(self, features: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
        """The collated batch of ``features`` (see the class)."""
        if isinstance(features, (Mapping, str, bytes)) or not hasattr(features, "__iter__"):
            raise InvalidArgumentError(f"features must be a list of dicts, one per sample or packed row (got {type(features).__name__})")
        features = list(features)
        if len(features) == 0:
            raise InvalidArgumentError("features must not be empty")
        parsed = [self._feature(i, f) for i, f in enumerate(features)]
        ids = np.concatenate([p[0] for p in parsed])
        lab = np.concatenate([p[1] for p in parsed])  # a new array: the features are not modified
        n = np.concatenate([p[2] for p in parsed])
        cu = np.concatenate(([0], np.cumsum(n))).astype(np.int64)
        total, starts = int(cu[-1]), cu[:-1]
        position = np.arange(total, dtype=np.int64) - np.repeat(starts, n) + self.position_ids_start
        seq = np.repeat(np.arange(n.size, dtype=np.int32), n)
        if self.return_loss_weights:
            # Aligned with the logits: position t weighs (and shift_labels holds) the label of
            # t + 1 in its sequence; a sequence's first token is predicted by nothing in it,
            # and its last position predicts nothing. Read before the separator goes in: a
            # real label equal to separator_id is learnt.
            learnt = lab.copy()
            learnt[starts] = -100
            loss = learnt != -100
            weights = np.zeros(total, dtype=np.float32)
            weights[:-1] = self._loss_weights(ids, loss, cu)[1:]
            shift = np.full(total, -100, dtype=np.int64)
            shift[:-1] = np.where(loss[1:], learnt[1:], -100)
        if self.layout != "padded":
            lab[starts] = self.separator_id
        batch: Dict[str, Any] = {}
        if self.layout == "flat":
            batch["input_ids"] = ids[None, :]
            batch["labels"] = lab[None, :]
            if self.return_position_ids:
                batch["position_ids"] = position[None, :]
            if self.return_seq_idx:
                batch["seq_idx"] = seq[None, :]
            if self.return_loss_weights:
                batch["loss_weights"] = weights[None, :]
                batch["shift_labels"] = shift[None, :]
            if self.return_flash_attn_kwargs:
                batch["cu_seq_lens_q"] = cu.astype(np.int32)
                batch["cu_seq_lens_k"] = cu.astype(np.int32)  # two arrays, as transformers gives
                batch["max_length_q"] = batch["max_length_k"] = int(n.max()) if n.size else 0
        else:
            widths = np.array([p[0].size for p in parsed], dtype=np.int64)
            width = int(widths.max())
            if self.pad_to_multiple_of:
                width += -width % self.pad_to_multiple_of
            rows = len(parsed)
            # Every real token's place in the (B, L) grid: row r's tokens at r·L + 0..width_r.
            row_cu = np.concatenate(([0], np.cumsum(widths)))
            at = np.repeat(np.arange(rows, dtype=np.int64) * width - row_cu[:-1], widths) + np.arange(total, dtype=np.int64)

            def grid(values: np.ndarray, fill: Any, dtype: Any) -> np.ndarray:
                out = np.full(rows * width, fill, dtype=dtype)
                out[at] = values
                return out.reshape(rows, width)

            batch["input_ids"] = grid(ids, self.pad_token_id, np.int64)
            if self.layout == "padded":
                batch["attention_mask"] = grid(np.ones(total, np.int64), 0, np.int64)
            batch["labels"] = grid(lab, -100, np.int64)
            if self.return_position_ids:
                counted = np.arange(width, dtype=np.int64)[None, :] + self.position_ids_start
                if self.layout == "padded":  # positions run on over the (masked) padding
                    batch["position_ids"] = np.repeat(counted, rows, axis=0)
                else:  # the padding of a row is a segment of its own, counting from the start
                    positions = np.repeat(counted, rows, axis=0) - widths[:, None]
                    positions.reshape(-1)[at] = position
                    batch["position_ids"] = positions
            if self.return_seq_idx:
                batch["seq_idx"] = grid(seq, -1, np.int32)
            if self.return_loss_weights:
                batch["loss_weights"] = grid(weights, 0.0, np.float32)
                batch["shift_labels"] = grid(shift, -100, np.int64)
        if self.return_tensors == "pt":
            import torch

            batch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}
        return batch

    def _loss_weights(self, ids: np.ndarray, mask: np.ndarray, cu: np.ndarray) -> np.ndarray:
        """The kernel's loss weights of the concatenated sequences, each token's the weight of
        its own label (the caller shifts them): every sequence a sample (no prompt, its tokens
        the completion, learnt where ``mask``), all in one micro-batch in order."""
        empty = np.zeros(0, dtype=np.int64)
        bounds = cu.tolist()
        samples = [
            {"prompt_ids": empty, "completion_ids": ids[a:b], "completion_mask": mask[a:b], "advantage": 0.0}
            for a, b in zip(bounds[:-1], bounds[1:])
        ]
        if not samples:
            return np.zeros(0, dtype=np.float32)
        row = materialize(
            samples,
            capacity=int(bounds[-1]),
            plan=[[list(range(len(samples)))]],
            loss_agg_mode=self.loss_agg_mode,
            loss_scale_factor=self.loss_scale_factor,
            allow_empty_completion=True,
        ).ranks[0][0]
        return row.loss_weights
