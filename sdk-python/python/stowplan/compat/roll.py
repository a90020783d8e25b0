"""ROLL (alibaba/ROLL) sequence-packing balancing, reproduced exactly by stowplan's kernel.

- :func:`load_balance` — ``LoadBalancePacker``: micro-batches of a mini-batch (ROLL does not
  enforce the token cap per micro-batch; use :func:`stowplan.micro_batches` for a hard cap).
- :func:`batch_balance` — the global batch over DP ranks (``roll/utils/functionals.py``).
- :func:`pack_sequences`, :func:`unpack_sequences` — the Megatron strategy's
  ``_pack_sequences``/``_unpack_sequences``: sequences padded to the pad factor, packed, and
  split over CP ranks (zigzag), built by stowplan's Rust host.
- :func:`get_pad_factor`, :func:`restore_results_order`.

In place, for an installed ROLL, in one line: :func:`patch` replaces ROLL's module-level
``roll.utils.functionals.batch_balance`` and
``roll.utils.sequence_packing.make_micro_batch_iter_for_sequence_packing`` (the
:data:`PATCHED_FUNCTIONS`) with functions of the same signatures that do to ROLL's ``DataProto``
exactly what ROLL does (reorder, ``select_idxs``, ``meta_info``) and return what ROLL returns,
the indices decided by stowplan's kernel — in their modules and in every module that imported
them by name (ROLL's pipelines and Megatron strategy, your own modules); :func:`unpatch` (or the
:func:`patched` context manager) restores ROLL's::

    import stowplan.compat.roll; stowplan.compat.roll.patch()

The behaviour (and the exception types and messages) is ROLL's at commit ``8eb27cc``,
zero-length sequences included. Lengths, sizes and token ids are exact integers; floats
(even whole ones), bools and strings raise :class:`stowplan.InvalidArgumentError` naming the
argument instead of being truncated.
"""

from __future__ import annotations

import copy
import inspect
import math
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _stowplan
from ..errors import InvalidArgumentError
from . import _patching
from ._inputs import I64, exact_ints, mask_or_lengths
from .verl import log_seqlen_unbalance

__all__ = [
    "get_pad_factor",
    "load_balance",
    "restore_results_order",
    "batch_balance",
    "pack_sequences",
    "unpack_sequences",
    "PackedLayoutError",
    "ROLL_COMMIT",
    "PATCHED_FUNCTIONS",
    "patch",
    "unpatch",
    "patched",
    "is_patched",
]

#: The ROLL commit whose behaviour this module reproduces (ROLL publishes no release version:
#: :func:`patch` checks the signatures of the functions it replaces against this commit's).
ROLL_COMMIT = "8eb27cc2dc34c4d1310b169d9b86d339004d811a"


def get_pad_factor(cp: int, tp: int) -> int:
    """ROLL's sequence-packing pad factor: ``lcm(16, 2·cp·tp)`` when ``cp > 1``, else
    ``lcm(16, tp)``.

    Example:
        >>> get_pad_factor(2, 2), get_pad_factor(3, 1), get_pad_factor(1, 1)
        (16, 48, 16)
    """
    if cp >= 1 and tp >= 1:
        from .._stowplan import pad_factor

        return pad_factor(cp=cp, tp=tp, align="roll")
    # ROLL's edge cases (not valid parallel sizes): cp = 0 counts as no CP, tp = 0 gives 0.
    return math.lcm(16, 2 * cp * tp) if cp > 1 else math.lcm(16, tp)


def load_balance(
    lengths: Any,
    max_packed_sequence_length: Optional[int],
    *,
    mask_width: Optional[int] = None,
    min_num_micro_batches: int = 1,
    tp: int = 1,
    cp: int = 1,
    vp: int = 1,
    dp_num_micro_batches: Optional[int] = None,
    algorithm: str = "load_balance",
    micro_batch_size: Optional[int] = None,
    dp_group: Any = ...,
) -> Dict[str, Any]:
    """ROLL's ``load_balance`` micro-batching of one mini-batch (and, with
    ``algorithm="none"``, ROLL's plain ``SequencePackingPacker``).

    Args:
        lengths: real tokens per sample (1-D) or the 2-D attention mask (its width is the
            ``mask_width``).
        max_packed_sequence_length: the cap (checked against ``mask_width`` only); ``None``
            (an unset config field) raises ROLL's ``AssertionError``.
        mask_width: the padded mask width; defaults to the mask's width or the longest length.
        min_num_micro_batches, tp, cp, vp: as in ROLL's config.
        dp_num_micro_batches: the MAX over DP ranks of their counts (ROLL's all-reduce).
        algorithm: ROLL's ``SequencePackingConfig.algorithm``: ``"load_balance"`` or
            ``"none"`` (the mini-batch cut into ``len // micro_batch_size`` contiguous chunks,
            as ROLL's ``DataProto.chunk``; no reordering); another name raises ROLL's
            ``ValueError``.
        micro_batch_size: ``algorithm="none"``'s size (``None`` raises ROLL's
            ``AssertionError``; 0 its ``ZeroDivisionError``).
        dp_group: ROLL's data-parallel group, only checked against ``None`` as ROLL checks it
            (``None`` raises ROLL's ``AssertionError``); omitted, a group is taken as given.

    Returns:
        ``{"micro_batches", "num_micro_batches", "kk_partitions", "restored_positions",
        "pad_factor", "padded_lengths"}`` — the micro-batches in ROLL's yield order, and
        for every sample its position in that order.

    Example:
        >>> load_balance([2, 4, 6, 1], 32)["micro_batches"]
        [[1, 2], [0, 3]]
    """
    if algorithm not in ("none", "load_balance"):
        raise ValueError(
            f"Illegal sequence packing algorithm {algorithm}, algorithm must be in ['none', 'load_balance']"
        )
    seqlens, width = mask_or_lengths(lengths, "lengths")
    if algorithm == "none":
        return _chunks(seqlens, micro_batch_size, _stowplan._integer(cp, "cp", 0, 2**32 - 1), tp)
    if dp_group is None:
        raise AssertionError("LoadBalancePacker: dp_group is None")
    if max_packed_sequence_length is None:
        raise AssertionError("LoadBalancePacker: max_packed_sequence_length is None")
    if mask_width is None:
        mask_width = width if width is not None else max(seqlens, default=0)
    r = _stowplan.roll_load_balance(
        seqlens,
        mask_width,
        max_packed_sequence_length,
        min_num_micro_batches=min_num_micro_batches,
        tp=tp,
        cp=cp,
        vp=vp,
        dp_num_micro_batches=dp_num_micro_batches,
    )
    batches = r.micro_batches
    order = [i for b in batches for i in b]
    restored = [0] * len(order)
    for pos, i in enumerate(order):
        restored[i] = pos
    return {
        "micro_batches": batches,
        "num_micro_batches": len(batches),
        "kk_partitions": r.kk_partitions,
        "restored_positions": restored,
        "pad_factor": r.pad_factor,
        "padded_lengths": r.padded_lengths,
    }


def _chunks(seqlens: List[int], micro_batch_size: Any, cp: int, tp: int) -> Dict[str, Any]:
    """ROLL's ``SequencePackingPacker`` (``algorithm="none"``): ``len // micro_batch_size``
    contiguous chunks, the first ``len % chunks`` of them one longer (``np.array_split``)."""
    assert micro_batch_size is not None, "SequencePackingPacker: micro_batch_size is None"
    size = _stowplan._integer(micro_batch_size, "micro_batch_size", *I64)
    count = len(seqlens) // size  # ROLL's ZeroDivisionError for 0
    if not seqlens:
        raise InvalidArgumentError("lengths must not be empty with algorithm 'none' (ROLL chunks an empty mini-batch)")
    if count <= 0:
        raise ValueError("number sections must be larger than 0.")  # numpy's, in ROLL's DataProto.chunk
    batches = [part.tolist() for part in np.array_split(np.arange(len(seqlens)), count)]
    factor = get_pad_factor(cp, tp)
    return {
        "micro_batches": batches,
        "num_micro_batches": count,
        "kk_partitions": [],
        "restored_positions": list(range(len(seqlens))),
        "pad_factor": factor,
        "padded_lengths": [-(n // -factor) * factor if factor else n for n in seqlens],
    }


def restore_results_order(results: Sequence[Any], restored_positions: Sequence[int]) -> List[Any]:
    """Outputs produced in micro-batch order back in sample order: element ``i`` is
    ``results[restored_positions[i]]`` (ROLL's ``restore_results_order``)."""
    return [results[p] for p in restored_positions]


def batch_balance(lengths: Any, dp_size: int, *, minibatch_size: Optional[int] = None, keep_minibatch: bool = False) -> Dict[str, Any]:
    """ROLL's ``batch_balance``: the global batch over ``dp_size`` ranks.

    Returns ``{"global_idx", "rank_partitions", "kk_partitions", "metrics", "dropped"}``:
    the permutation ROLL reorders by, its ``dp_size`` equal contiguous slices, the raw
    equal-size KK result(s), ROLL's ``global_seqlen/*`` metrics, and the samples ROLL leaves
    out (the tail past the last full mini-batch with ``keep_minibatch``; a ``UserWarning``
    names them). ``keep_minibatch`` without ``minibatch_size`` raises ROLL's ``TypeError``.

    Example:
        >>> batch_balance([100, 900, 50, 950, 400, 600], 2)["rank_partitions"]
        [[2, 1, 5], [0, 3, 4]]
    """
    seqlens, _ = mask_or_lengths(lengths, "lengths")
    partitions, kk, dropped = _balance(seqlens, dp_size, minibatch_size, keep_minibatch)
    if dropped:
        warnings.warn(
            f"batch_balance (like ROLL) leaves out {len(dropped)} samples past the last full mini-batch: {dropped[:16]}",
            stacklevel=2,
        )
    return {
        "global_idx": [j for p in partitions for j in p],
        "rank_partitions": partitions,
        "kk_partitions": kk,
        "metrics": log_seqlen_unbalance(seqlens, partitions, "global_seqlen"),
        "dropped": dropped,
    }


def _balance(seqlens: List[int], dp_size: Any, minibatch_size: Any, keep_minibatch: Any) -> Tuple[List[List[int]], Any, List[int]]:
    """The kernel's ``batch_balance`` decision: (each rank's samples in ROLL's order, the raw KK
    partitions, the samples left out); ROLL's exceptions where ROLL fails."""
    if keep_minibatch and minibatch_size is None:
        # ROLL divides the batch size by the mini-batch size.
        raise TypeError("unsupported operand type(s) for //: 'int' and 'NoneType'")
    if _stowplan._integer(dp_size, "dp_size", -(2**63), 2**63 - 1) < 0:
        raise ValueError(f"dp_size = {dp_size} is negative")
    reorder = _stowplan.balance_batch(seqlens, dp_size, minibatch_size=minibatch_size if keep_minibatch else None)
    return reorder.partitions, reorder.kk_partitions, reorder.dropped


class PackedLayoutError(InvalidArgumentError, RuntimeError):
    """A packed layout ROLL's Megatron strategy cannot build, where ROLL (or torch inside it)
    raises ``RuntimeError``: a sequence whose padded length does not split into ``2·cp``
    zigzag chunks, or a ``pad_packed_seq_to`` below the tokens it must hold. Both an
    :class:`stowplan.InvalidArgumentError` and a ``RuntimeError``; the message is stowplan's
    (ROLL's is torch's shape error)."""


def pack_sequences(
    sequences: Sequence[Any],
    *,
    cp: int = 1,
    tp: int = 1,
    cp_rank: Optional[int] = None,
    pad_val: int = 0,
    pad_factor: Optional[int] = None,
    pad_packed_seq_to: Optional[int] = None,
    backend: Optional[str] = None,
) -> Dict[str, Any]:
    """ROLL's sequence packing of ``sequences`` (each the valid tokens of one sample): every
    sequence padded with ``pad_val`` to a multiple of ``pad_factor`` (default ROLL's
    :func:`get_pad_factor`; stowplan's own default is ``2·cp·tp``), concatenated, and split over ``cp``
    ranks — rank ``r`` gets chunks ``r`` and ``2·cp−1−r`` of every sequence. With
    ``pad_packed_seq_to`` (ROLL's argument of ``_pack_sequences``), the last sequence is
    padded to whatever brings the packed total to it instead.

    Returns ``{"input_ids": the row of CP rank cp_rank (or a list with every rank's row when
    cp_rank is None), "cu_seqlens", "cu_seqlens_padded", "max_seqlen" (padded),
    "pad_factor", "qkv_format": "thd"}``.

    Raises :class:`PackedLayoutError` (a ``RuntimeError``, as ROLL's) when a padded length
    does not split into ``2·cp`` chunks (a ``pad_factor`` that is not a multiple of ``2·cp``,
    or a ``pad_packed_seq_to`` that leaves the last sequence such a length) or when
    ``pad_packed_seq_to`` is below the padded sequences before the last plus the last's tokens
    (ROLL then returns boundaries that run backwards and a row longer than they say).

    Example (factor 2·cp·tp = 4; -1 marks padding):
        >>> r = pack_sequences([[0, 0], [1, 1, 1, 1], [2] * 6, [3]], cp=2, pad_val=-1, pad_factor=4)
        >>> [row.tolist() for row in r["input_ids"]]
        [[0, -1, 1, 1, 2, 2, -1, -1, 3, -1], [0, -1, 1, 1, 2, 2, 2, 2, -1, -1]]
        >>> r["cu_seqlens_padded"].tolist()
        [0, 4, 8, 16, 20]
        >>> pack_sequences([[5, 5, 5], [7]], pad_val=0, pad_factor=4, pad_packed_seq_to=12)["input_ids"][0].tolist()
        [5, 5, 5, 0, 7, 0, 0, 0, 0, 0, 0, 0]
    """
    factor = get_pad_factor(cp, tp) if pad_factor is None else pad_factor
    sequences = [list(seq) for seq in sequences]
    if not sequences:
        # ROLL takes the max of the (empty) padded lengths: torch refuses.
        raise RuntimeError(
            "max(): Expected reduction dim to be specified for input.numel() == 0. "
            "Specify the reduction dim with the 'dim' argument."
        )
    cps = _stowplan._integer(cp, "cp", 1, 2**32 - 1)
    if pad_packed_seq_to is None:
        rows, real, padded = _packed_rows(sequences, cps, factor, pad_val, backend)
    else:
        target = _stowplan._integer(pad_packed_seq_to, "pad_packed_seq_to", 0, 2**31 - 1)
        rows, real, padded = _packed_rows(sequences[:-1], cps, factor, pad_val, backend)
        last = len(sequences[-1])
        room = target - int(padded.sum())
        if room < last:
            raise PackedLayoutError(
                f"pad_packed_seq_to = {target} is below the {int(padded.sum())} padded tokens before the last "
                f"sequence plus its {last}: give at least {int(padded.sum()) + last}"
            )
        if room % (2 * cps) if cps > 1 else False:
            raise PackedLayoutError(
                f"pad_packed_seq_to = {target} leaves the last sequence {room} tokens, which do not split into "
                f"2·cp = {2 * cps} chunks"
            )
        if last:
            tail, _, _ = _packed_rows(sequences[-1:], cps, room, pad_val, backend)
        else:  # all padding: every rank takes its share
            tail = [np.full(room // cps, pad_val, dtype=np.int64) for _ in range(cps)]
        rows = [np.concatenate([a, b]) for a, b in zip(rows, tail)]
        real, padded = np.append(real, last), np.append(padded, room)
    cu_real = np.zeros(len(sequences) + 1, dtype=np.int32)
    cu_padded = np.zeros(len(sequences) + 1, dtype=np.int32)
    cu_real[1:], cu_padded[1:] = np.cumsum(real), np.cumsum(padded)
    return {
        "input_ids": rows if cp_rank is None else rows[cp_rank],
        "cu_seqlens": cu_real,
        "cu_seqlens_padded": cu_padded,
        "max_seqlen": int(padded.max()),
        "pad_factor": factor,
        "qkv_format": "thd",
    }


def _packed_rows(sequences: List[List[Any]], cp: int, factor: Any, pad_val: int, backend: Optional[str]) -> Tuple[List[Any], Any, Any]:
    """Every CP rank's row of ``sequences`` each padded to a multiple of ``factor`` (built by
    the host), with the real and padded length of each sequence; a zero-length sequence takes
    no token on any rank."""
    from .._stowplan import materialize

    present = [i for i, seq in enumerate(sequences) if seq]
    real = np.zeros(len(sequences), dtype=np.int64)
    padded = np.zeros(len(sequences), dtype=np.int64)
    if not present:
        return [np.zeros(0, dtype=np.int64) for _ in range(cp)], real, padded
    samples = [{"prompt_ids": sequences[i], "completion_ids": [], "advantage": 0.0} for i in present]
    if cp > 1 and isinstance(factor, int) and not isinstance(factor, bool) and factor % (2 * cp):
        # ROLL's CP split views each padded sequence as 2·cp chunks: torch refuses.
        raise PackedLayoutError(
            f"pad_factor = {factor} is not a multiple of 2·cp = {2 * cp}: a padded sequence does not split into "
            f"2·cp equal chunks"
        )
    m = materialize(
        samples,
        capacity=2**63,
        cp=cp,
        padding="sequence",
        align=factor,
        pad_token_id=pad_val,
        allow_empty_completion=True,
        plan=[[list(range(len(samples)))]],
        backend=backend,
    )
    mb = m.ranks[0][0]
    rows = [mb.cp_view(r)["input_ids"] for r in range(cp)] if cp > 1 else [mb.input_ids]
    real[present] = np.diff(mb.cu_seqlens)
    padded[present] = mb.sequence_lengths
    return rows, real, padded


def unpack_sequences(row: Any, cu_seqlens_padded: Any, cp: int = 1) -> List[Any]:
    """ROLL's ``_unpack_sequences``: the slices of one CP rank's ``row`` (e.g. its logits)
    per sequence, from ``cu_seqlens_padded[:-1] // cp`` to ``cu_seqlens_padded[1:] // cp``.

    Example:
        >>> unpack_sequences(list(range(10)), [0, 4, 8, 16, 20], cp=2)
        [[0, 1], [2, 3], [4, 5, 6, 7], [8, 9]]
    """
    bounds = [b // cp for b in exact_ints(cu_seqlens_padded, "cu_seqlens_padded")]
    return [row[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]



# ----------------------------------------------------------------------------------------------
# patch(): stowplan's functions in an installed ROLL, in place.

#: The module-level functions of ROLL (``module.function``) that :func:`patch` replaces: the ones
#: whose result stowplan's kernel decides and this module reproduces. (ROLL's
#: ``SequencePackingPacker.get_pad_factor``, ``LoadBalancePacker``'s methods and the Megatron
#: strategy's ``_pack_sequences``/``_unpack_sequences`` are methods, which stay ROLL's; so does
#: the reindexing ``restore_results_order``.)
PATCHED_FUNCTIONS = (
    "roll.utils.functionals.batch_balance",
    "roll.utils.sequence_packing.make_micro_batch_iter_for_sequence_packing",
)

# ROLL's parameters at ROLL_COMMIT: (name, kind, default) per parameter, annotations aside.
_P = inspect.Parameter
_SIGNATURES = {
    "roll.utils.functionals.batch_balance": (
        ("batch", _P.POSITIONAL_OR_KEYWORD, _P.empty),
        ("dp_size", _P.POSITIONAL_OR_KEYWORD, _P.empty),
        ("minibatch_size", _P.POSITIONAL_OR_KEYWORD, _P.empty),
        ("logging_prefix", _P.POSITIONAL_OR_KEYWORD, "global_seqlen"),
        ("keep_minibatch", _P.POSITIONAL_OR_KEYWORD, False),
    ),
    "roll.utils.sequence_packing.make_micro_batch_iter_for_sequence_packing": (
        ("mini_batch", _P.POSITIONAL_OR_KEYWORD, _P.empty),
        ("tp_size", _P.POSITIONAL_OR_KEYWORD, _P.empty),
        ("cp_size", _P.POSITIONAL_OR_KEYWORD, _P.empty),
        ("vp_size", _P.POSITIONAL_OR_KEYWORD, _P.empty),
        ("is_train", _P.POSITIONAL_OR_KEYWORD, False),
        ("dp_group", _P.POSITIONAL_OR_KEYWORD, None),
        ("micro_batch_size", _P.POSITIONAL_OR_KEYWORD, None),
        ("config", _P.POSITIONAL_OR_KEYWORD, None),
    ),
}
# name -> (ROLL's original, the replacement installed by patch()); empty when not patched.
_PATCH: Dict[str, Tuple[Callable[..., Any], Callable[..., Any]]] = {}


def _parameters(function: Callable[..., Any]) -> Optional[Tuple[Tuple[str, Any, Any], ...]]:
    """(name, kind, default) of every parameter of ``function``; None when it has no signature."""
    try:
        return tuple((p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        return None


def _roll_functions() -> Dict[str, Callable[..., Any]]:
    """ROLL's :data:`PATCHED_FUNCTIONS` (qualified name -> function) from an installed ROLL
    whose functions have the signatures of :data:`ROLL_COMMIT`, else ImportError saying what is
    missing or which signature differs."""
    import importlib

    functions = {}
    for qualified in PATCHED_FUNCTIONS:
        module_name, name = qualified.rsplit(".", 1)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImportError(
                f"stowplan.compat.roll.patch() needs ROLL (alibaba/ROLL, commit {ROLL_COMMIT[:7]}) installed, and "
                f"`import {module_name}` failed: {type(exc).__name__}: {exc}"
            ) from exc
        function = getattr(module, name, None)
        found = _parameters(function) if callable(function) else None
        if found != _SIGNATURES[qualified]:
            shown = inspect.signature(function) if found is not None else repr(function)
            raise ImportError(
                f"stowplan.compat.roll reproduces ROLL at commit {ROLL_COMMIT[:7]}, but the installed "
                f"{qualified} ({getattr(module, '__file__', '?')}) is {shown}: it may behave "
                f"differently, so ROLL is not patched"
            )
        functions[qualified] = function
    return functions


def _attention_lengths(batch: Any) -> List[int]:
    """ROLL's per-sample token counts of a ``DataProto``: ``attention_mask`` viewed as
    ``(batch_size, -1)`` and summed over the last dimension; InvalidArgumentError when they are
    not exact integers (a float mask)."""
    attention_mask = batch.batch["attention_mask"]
    batch_size = attention_mask.shape[0]
    lengths = attention_mask.view(batch_size, -1).sum(-1)
    if hasattr(lengths, "detach"):
        lengths = lengths.detach().cpu()
    return exact_ints(lengths, "batch.batch['attention_mask']")


def _batch_balance_replacement(original: Callable[..., Any]) -> Callable[..., Any]:
    """ROLL's ``batch_balance`` with stowplan's kernel deciding the permutation."""

    def batch_balance(batch, dp_size, minibatch_size, logging_prefix="global_seqlen", keep_minibatch=False):  # type: ignore[no-untyped-def]
        try:
            lengths = _attention_lengths(batch)
            partitions, _, _ = _balance(lengths, dp_size, minibatch_size, keep_minibatch)
        except InvalidArgumentError:
            # Outside the kernel's domain (a float mask, a float dp_size …): ROLL computes it.
            return original(batch, dp_size, minibatch_size, logging_prefix, keep_minibatch)
        import torch  # ROLL's DataProto holds torch tensors: ROLL (and so torch) is installed

        # ROLL's side effect: the batch reordered by an index tensor of the ranks' samples.
        batch.reorder(torch.tensor([j for partition in partitions for j in partition]))
        metrics: Dict[str, Any] = {}
        metrics.update(log_seqlen_unbalance(lengths, partitions, f"{logging_prefix}"))
        return metrics

    batch_balance.__module__ = __name__
    batch_balance.__wrapped__ = original  # type: ignore[attr-defined]  # inspect.signature shows ROLL's
    batch_balance.__doc__ = (
        "stowplan's ``batch_balance`` installed in ROLL by stowplan.compat.roll.patch(): "
        "ROLL's signature, reordering and metrics, the permutation decided by stowplan's kernel "
        "(stowplan.compat.roll.batch_balance); inputs outside the kernel's domain go to ROLL's own.\n\n"
        + (original.__doc__ or "")
    )
    batch_balance.__stowplan_original__ = original  # type: ignore[attr-defined]
    return batch_balance


def _micro_batch_iter_replacement(original: Callable[..., Any]) -> Callable[..., Any]:
    """ROLL's ``make_micro_batch_iter_for_sequence_packing`` with stowplan's kernel deciding
    the ``load_balance`` micro-batches; ROLL's other packers (``"none"``) are ROLL's own."""
    roll_globals = original.__globals__  # ROLL's module, looked up at call time like ROLL's

    def make_micro_batch_iter_for_sequence_packing(  # type: ignore[no-untyped-def]
        mini_batch, tp_size, cp_size, vp_size, is_train=False, dp_group=None, micro_batch_size=None, config=None
    ):
        packer = roll_globals["get_sequence_packing_packer"](config)  # ROLL's ValueError, eagerly
        load_balance_packer = roll_globals.get("LoadBalancePacker")
        if load_balance_packer is None or type(packer) is not load_balance_packer:
            return packer.make_micro_batch_iter_for_sequence_packing(
                mini_batch, tp_size, cp_size, vp_size, is_train, dp_group, micro_batch_size
            )
        return _load_balance_iter(packer, mini_batch, tp_size, cp_size, vp_size, is_train, dp_group, micro_batch_size)

    make_micro_batch_iter_for_sequence_packing.__module__ = __name__
    make_micro_batch_iter_for_sequence_packing.__wrapped__ = original  # type: ignore[attr-defined]
    make_micro_batch_iter_for_sequence_packing.__doc__ = (
        "stowplan's ``make_micro_batch_iter_for_sequence_packing`` installed in ROLL by "
        "stowplan.compat.roll.patch(): ROLL's signature and micro-batches (``select_idxs``, "
        "``meta_info``), the ``load_balance`` partition decided by stowplan's kernel "
        "(stowplan.compat.roll.load_balance); ROLL's other packers and inputs outside the kernel's "
        "domain are ROLL's own."
    )
    make_micro_batch_iter_for_sequence_packing.__stowplan_original__ = original  # type: ignore[attr-defined]
    return make_micro_batch_iter_for_sequence_packing


def _load_balance_iter(packer, mini_batch, tp_size, cp_size, vp_size, is_train, dp_group, micro_batch_size):  # type: ignore[no-untyped-def]
    """``LoadBalancePacker.make_micro_batch_iter_for_sequence_packing`` as ROLL runs it (a
    generator: nothing happens before the first ``next``): ROLL's checks in ROLL's order, the
    MAX all-reduce of the count over ``dp_group`` when ``torch.distributed`` is initialized, the
    kernel's micro-batches, and ROLL's ``meta_info`` on the mini-batch and on every micro-batch."""
    import torch
    import torch.distributed as dist

    assert dp_group is not None, "LoadBalancePacker: dp_group is None"
    attention_mask = mini_batch.batch["attention_mask"]
    mask_width = attention_mask.shape[-1]
    config = packer.config
    cap = config.max_packed_sequence_length_train if is_train else config.max_packed_sequence_length_forward
    min_count = config.min_num_micro_batches_train if is_train else config.min_num_micro_batches_forward
    try:
        lengths = exact_ints(attention_mask.sum(dim=1).detach().cpu(), "mini_batch.batch['attention_mask']")
        sizes = {"tp_size": tp_size, "cp_size": cp_size, "vp_size": vp_size, "mask width": mask_width, "min_num_micro_batches": min_count}
        for name, value in sizes.items():
            _stowplan._integer(value, name, *I64)
        if cap is not None:
            _stowplan._integer(cap, "max_packed_sequence_length", *I64)
    except InvalidArgumentError:
        # Outside the kernel's domain (a float mask …): ROLL's own packer computes it.
        yield from type(packer).make_micro_batch_iter_for_sequence_packing(
            packer, mini_batch, tp_size, cp_size, vp_size, is_train, dp_group, micro_batch_size
        )
        return
    assert cap is not None, "LoadBalancePacker: max_packed_sequence_length is None"
    assert cap >= mask_width, (
        f"max_packed_sequence_length ({cap}) must be >= max sequence length in batch ({mask_width})"
    )
    dp_count = None
    if dist.is_initialized() and dp_group is not None:
        # This rank's count (ROLL's arithmetic on the padded lengths), MAX-reduced like ROLL's.
        factor = get_pad_factor(cp_size, tp_size)
        total = sum(-(n // -factor) * factor for n in lengths)
        own = max(min(max(1, -(total // -cap)), len(lengths)), min_count)
        reduced = torch.tensor([own], device=packer.get_device_name())
        dist.all_reduce(reduced, op=dist.ReduceOp.MAX, group=dp_group)
        dp_count = reduced.cpu().item()
    r = load_balance(
        lengths,
        cap,
        mask_width=mask_width,
        min_num_micro_batches=min_count,
        tp=tp_size,
        cp=cp_size,
        vp=vp_size if vp_size > 1 else 1,  # ROLL rounds only for vp_size > 1
        dp_num_micro_batches=dp_count,
    )
    num_micro_batches = r["num_micro_batches"]
    partitions = r["micro_batches"]
    mini_batch.meta_info["partition_indices_list"] = partitions.copy()
    for index, partition in enumerate(partitions):
        micro_batch = mini_batch.select_idxs(partition)
        micro_batch.meta_info = copy.deepcopy(mini_batch.meta_info)
        micro_batch.meta_info["micro_batch_idx"] = index
        micro_batch.meta_info["is_padding_batch"] = False
        micro_batch.meta_info["partition_indices"] = partition
        micro_batch.meta_info["num_micro_batchs"] = num_micro_batches
        micro_batch.meta_info["mini_batch_size"] = mini_batch.batch.batch_size[0]
        yield micro_batch


_REPLACEMENTS = {
    "roll.utils.functionals.batch_balance": _batch_balance_replacement,
    "roll.utils.sequence_packing.make_micro_batch_iter_for_sequence_packing": _micro_batch_iter_replacement,
}


def patch() -> List[str]:
    """Replaces ROLL's :data:`PATCHED_FUNCTIONS` with stowplan's, in place: in their modules and
    in every loaded module that holds them under any name (``from roll.utils.functionals import
    batch_balance`` in ROLL's RLVR, agentic, distill and SFT pipelines, ``from
    roll.utils.sequence_packing import make_micro_batch_iter_for_sequence_packing`` in its
    Megatron strategy, your own modules); modules imported afterwards import stowplan's.
    Idempotent: a second call changes nothing.

    The replacement has ROLL's signature ``batch_balance(batch, dp_size, minibatch_size,
    logging_prefix="global_seqlen", keep_minibatch=False)``: it calls ``batch.reorder`` once with
    ROLL's index tensor and returns ROLL's ``{logging_prefix}/…`` metrics, the permutation
    decided by stowplan's kernel (the one :func:`batch_balance` returns); an input outside the
    kernel's domain (a float attention mask) is computed by ROLL's original function.

    ``make_micro_batch_iter_for_sequence_packing(mini_batch, tp_size, cp_size, vp_size,
    is_train=False, dp_group=None, micro_batch_size=None, config=None)`` with the
    ``load_balance`` algorithm yields ROLL's micro-batches (``mini_batch.select_idxs`` of each
    partition, with ROLL's ``meta_info`` keys; ``partition_indices_list`` on the mini-batch),
    the partition decided by the kernel (:func:`load_balance`), the count MAX-reduced over
    ``dp_group`` as ROLL does; the ``"none"`` packer is ROLL's own.

    Returns:
        The ``module.attribute`` names now bound to stowplan's functions.

    Raises:
        ImportError: ROLL is not importable, or its functions' signatures are not those of
            :data:`ROLL_COMMIT`.

    Example::

        import stowplan.compat.roll; stowplan.compat.roll.patch()
    """
    functions = _roll_functions()
    if _PATCH:
        return _patching.bound_names(_PATCH)
    for name, original in functions.items():
        _PATCH[name] = (original, _REPLACEMENTS[name](original))
    return _patching.install(_PATCH)


is_patched, unpatch, patched = _patching.controls(_PATCH, "ROLL", patch, __name__)
