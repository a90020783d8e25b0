"""slime's rollout data source (``slime/ray/rollout_data_source.py``) with slime's names,
run by stowplan's host.

``RolloutDataSource(args)`` / ``RolloutDataSourceWithBuffer(args)`` read slime's ``args``
fields: ``prompt_data``, ``input_key``, ``label_key``, ``metadata_key``,
``n_samples_per_prompt``, ``rollout_shuffle``, ``rollout_seed``, ``rollout_global_dataset``,
``save``, ``load``. Differences from slime, on purpose:

- ``save(rollout_id)`` also saves the **buffer** (slime loses it), in stowplan's versioned
  format at ``{args.save}/rollout/stowplan_data_source_{rollout_id}.spds``, atomically.
- ``load(rollout_id)`` of a state that does not exist, is damaged or belongs to another
  dataset raises instead of printing and starting over.
- The shuffle is stowplan's seeded permutation (identical in every host), not
  ``datasets.shuffle``, so orders differ from slime's.
- ``args.buffer_filter_path`` (arbitrary Python imported by path) is refused: stowplan runs
  buffer filters as sandboxed WebAssembly components; pass one as
  ``RolloutDataSourceWithBuffer(args, filter=stowplan.Filter.load(path, sha256=...))``.
- Buffered samples are saved as their fields (``stowplan.RolloutSample``) or as JSON (plain dicts,
  lists, strings, numbers, bools, ``None``); any other object — slime's own ``Sample`` class
  included — only pickled, which ``save`` and ``load`` refuse unless the data source is made
  with ``allow_pickle=True`` (loading a pickle runs code chosen by whoever wrote it; see
  :class:`stowplan.DataSource`).

>>> from types import SimpleNamespace
>>> from stowplan.compat.slime import RolloutDataSourceWithBuffer
>>> args = SimpleNamespace(prompt_data=None, n_samples_per_prompt=2, rollout_global_dataset=False)
>>> ds = RolloutDataSourceWithBuffer(args)
>>> [[s.index for s in g] for g in ds.get_samples(2)]
[[0, 1], [2, 3]]

**Micro-batch scheduling** (``slime/utils/seqlen_balancing.py``, ``slime/utils/dp_schedule.py``,
``slime/utils/flops_utils.py`` at slime commit ``624b824a``), exactly — same lists in the same
order, same floats bit for bit, same ``AssertionError`` messages — computed by stowplan's
kernel: :func:`first_fit_pack`, :func:`expand_bins_by_splitting`,
:func:`get_seqlen_balanced_partitions`, :func:`calculate_fwd_flops` and
:func:`build_dp_schedule`, under slime's names and signatures (``args`` a namespace or a dict
with slime's attribute names). :func:`patch` puts them into an installed slime.

Where slime fails with an incidental Python error (``ZeroDivisionError`` for
``global_batch_size=0`` or ``dp_size=0``, ``ValueError`` for ``micro_batch_size=0``,
``IndexError`` for too few lengths) or accepts meaningless input (negative lengths), these
raise :class:`stowplan.InvalidArgumentError` naming the
argument and its range. A model attribute slime would read and ``args`` lacks raises the
``AttributeError`` reading it raises, at the point where slime reads it.

>>> from stowplan.compat.slime import first_fit_pack, build_dp_schedule
>>> first_fit_pack([5, 3, 7, 2, 6], 10)
[[0, 1, 3], [2], [4]]
>>> args = {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 10, "balance_data": False,
...         "balance_by_flops": False}
>>> tp = {"dp_size": 2, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
>>> build_dp_schedule(args, tp, [5, 3, 7, 2, 6], global_batch_size=5, rollout_indices=[0, 1, 2, 3, 4])
([[0, 4], [2, 1, 3]], [[[0], [1]], [[0], [1, 2]]], [2], [5])
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import _stowplan
from .._filter import Filter
from .._source import BufferedDataSource
# slime's name for a rollout sample (``stowplan.RolloutSample``).
from .._source import RolloutSample as Sample
from ..errors import InvalidArgumentError

__all__ = [
    "RolloutDataSource",
    "RolloutDataSourceWithBuffer",
    "pop_first",
    "Sample",
    "first_fit_pack",
    "expand_bins_by_splitting",
    "get_seqlen_balanced_partitions",
    "calculate_fwd_flops",
    "build_dp_schedule",
    "patch",
    "unpatch",
]


def _state_path(root: str, rollout_id: Any) -> str:
    return os.path.join(root, "rollout", f"stowplan_data_source_{rollout_id}.spds")


class RolloutDataSource:
    """slime's ``RolloutDataSource``: read-only, groups of ``n_samples_per_prompt``.
    ``allow_pickle`` as for :class:`stowplan.DataSource` (default False)."""

    _buffered = False

    def __init__(self, args: Any, filter: Optional[Filter] = None, *, allow_pickle: bool = False) -> None:
        self.args = args
        if getattr(args, "buffer_filter_path", None) is not None:
            raise InvalidArgumentError(
                "args.buffer_filter_path imports arbitrary Python; stowplan runs buffer filters as sandboxed "
                "WebAssembly components instead: pass filter=stowplan.Filter.load(path, sha256=...)"
            )
        if filter is not None and not self._buffered:
            raise InvalidArgumentError("RolloutDataSource is read-only: a filter needs RolloutDataSourceWithBuffer")
        k = _stowplan._integer(getattr(args, "n_samples_per_prompt", None), "args.n_samples_per_prompt", 1, 2**32 - 1)
        if getattr(args, "rollout_global_dataset", True) and getattr(args, "prompt_data", None) is not None:
            self._source = BufferedDataSource(
                args.prompt_data,
                n_samples_per_prompt=k,
                shuffle=bool(getattr(args, "rollout_shuffle", False)),
                seed=_stowplan._integer(getattr(args, "rollout_seed", None) or 0, "args.rollout_seed", 0, 2**64 - 1),
                input_key=getattr(args, "input_key", None) or "prompt",
                label_key=getattr(args, "label_key", None),
                metadata_key=getattr(args, "metadata_key", None),
                filter=filter,
                allow_pickle=allow_pickle,
            )
            self._global = True
        else:
            # slime without a global dataset hands out empty samples with fresh indices; so
            # does this (one empty prompt, drawn again and again).
            self._source = BufferedDataSource.from_records(
                [{"prompt": ""}], n_samples_per_prompt=k, identity="empty", filter=filter, allow_pickle=allow_pickle
            )
            self._global = False

    def get_samples(self, num_samples: int) -> List[List[Any]]:
        """``num_samples`` groups (buffer first for the buffered class)."""
        return self._source.get_samples(num_samples)

    def add_samples(self, samples: List[List[Any]]) -> None:
        """Read-only: raises like slime."""
        raise RuntimeError(f"Cannot add samples to {self.__class__.__name__}. This is a read-only data source.")

    def save(self, rollout_id: Any) -> None:
        """Saves the state (and the buffer) under ``args.save``; no-op without a global dataset."""
        if not self._global:
            return
        self._source.save(_state_path(self.args.save, rollout_id))

    def load(self, rollout_id: Optional[Any] = None) -> None:
        """Loads the state saved for ``rollout_id`` under ``args.load`` (raises when missing)."""
        if not self._global or getattr(self.args, "load", None) is None:
            return
        self._source.load(_state_path(self.args.load, rollout_id))

    def update_metadata(self, metadata: Dict[str, Any]) -> None:
        self._source.update_metadata(metadata)

    def get_metadata(self) -> Dict[str, Any]:
        return self._source.get_metadata()

    def get_buffer_length(self) -> int:
        return self._source.get_buffer_length()

    @property
    def epoch_id(self) -> int:
        return self._source.epoch

    @property
    def sample_offset(self) -> int:
        return self._source.offset

    @property
    def sample_index(self) -> int:
        return self._source.next_index


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """slime's ``RolloutDataSourceWithBuffer``: ``add_samples`` fills a buffer that
    ``get_samples`` serves first — FIFO, or through a sandboxed ``filter``."""

    _buffered = True

    def add_samples(self, samples: List[List[Any]]) -> None:
        if not samples:
            return
        assert isinstance(samples, list), f"samples must be a list, got {type(samples)}"
        assert isinstance(samples[0], list), f"the elements of samples must be list, got {type(samples[0])}"
        for group in samples:
            assert len(group) == self.args.n_samples_per_prompt, (
                f"the length of the elements of samples must be equal to n_samples_per_prompt, got {len(group)} != "
                f"{self.args.n_samples_per_prompt}"
            )
        self._source.add_samples(samples)


def pop_first(args: Any, rollout_id: Any, buffer: List[List[Any]], num_samples: int) -> List[List[Any]]:
    """slime's default buffer filter, on a Python list (stowplan's data sources use the
    native one)."""
    num_to_pop = min(len(buffer), num_samples)
    samples = buffer[:num_to_pop]
    del buffer[:num_to_pop]
    return samples


# ---------------------------------------------------------------------------------------------
# Micro-batch scheduling: slime/utils/{seqlen_balancing,dp_schedule,flops_utils}.py

#: The attributes of ``args`` that ``calculate_fwd_flops`` may read (Megatron's names).
_MODEL_ATTRS = (
    "hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "vocab_size",
    "ffn_hidden_size",
    "num_experts",
    "num_layers",
    "kv_channels",
    "moe_ffn_hidden_size",
    "moe_router_topk",
    "moe_shared_expert_intermediate_size",
    "moe_layer_freq",
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
)

_MISSING = object()


def _namespace(args: Any) -> Any:
    """``args`` as slime reads it: a mapping becomes a namespace of its items."""
    return SimpleNamespace(**args) if isinstance(args, Mapping) else args


def _model(args: Any) -> Dict[str, Any]:
    """The model attributes ``args`` has (the kernel reads only those slime would)."""
    model = {}
    for name in _MODEL_ATTRS:
        value = getattr(args, name, _MISSING)
        if value is not _MISSING:
            model[name] = value
    return model


def _reraise_missing(args: Any, e: AttributeError) -> None:
    """The kernel needed attribute ``e.args[0]`` of ``args``: read it, so the caller sees the
    genuine ``AttributeError`` (with its own message)."""
    name = e.args[0] if e.args else ""
    getattr(args, name)
    raise e


def _python_sum() -> str:
    """How this interpreter's builtin ``sum`` adds floats: Neumaier-compensated from 3.12."""
    return "neumaier" if sys.version_info >= (3, 12) else "naive"


def first_fit_pack(total_lengths: Sequence[int], max_tokens_per_bin: int) -> List[List[int]]:
    """slime's ``first_fit_pack(total_lengths, max_tokens_per_bin)``: each length in input
    order (slime does not sort) goes to the first bin whose sum plus the length is at most
    ``max_tokens_per_bin``, else it opens a new bin; a sample over the cap gets a bin of its
    own, which stays a candidate (a zero length still fits in it). Returns the bins' index
    lists in creation order. Lengths and the cap are integers (any sign, within 64 bits).

    >>> first_fit_pack([1, 2, 3, 4, 5, 6, 7, 8, 9], 10)
    [[0, 1, 2, 3], [4], [5], [6], [7], [8]]
    """
    return _stowplan.slime_first_fit_pack(total_lengths, max_tokens_per_bin)


def expand_bins_by_splitting(bins: List[List[int]], target_count: int, lengths: Sequence[int]) -> None:
    """slime's ``expand_bins_by_splitting(bins, target_count, lengths)``, in place: while
    there are fewer than ``target_count`` bins, the bin with the largest (token sum, position)
    among those with two or more members is split in two halves balanced by tokens (members
    by length descending, ties in bin order; each to the left half while its sum is at most
    the right's). The left half replaces the bin, the right half is appended. Stops early
    when only single-sample bins are left. Raises :class:`~stowplan.InvalidArgumentError`
    when a bin to split names an index outside ``lengths``.

    >>> bins = [[0, 1, 2, 3, 4, 5]]
    >>> expand_bins_by_splitting(bins, 2, [9, 8, 7, 6, 5, 4])
    >>> bins
    [[0, 3, 4], [1, 2, 5]]
    """
    out = _stowplan.slime_expand_bins(bins, target_count, lengths)
    n = len(bins)
    for i in range(n):
        if out[i] != bins[i]:
            bins[i] = out[i]
    bins.extend(out[n:])


def get_seqlen_balanced_partitions(seqlen_list: Sequence[Any], k_partitions: int, equal_size: bool) -> List[List[int]]:
    """slime's ``get_seqlen_balanced_partitions`` (its copy of verl's Karmarkar–Karp):
    ``k_partitions`` lists of indices, each sorted, in KK's final set order. Integer lengths
    run verl's function (:func:`stowplan.compat.verl.get_seqlen_balanced_partitions`; slime's
    copy is the same code); float weights — the FLOPs :func:`build_dp_schedule` balances —
    run the same KK with float set sums, added in Python's order (a list mixing ints and floats
    is exact while integer partial sums stay below 2**53). Raises ``AssertionError``
    with slime's message where slime asserts (fewer items than partitions, ``equal_size``
    with a count not divisible by ``k_partitions``); :class:`~stowplan.InvalidArgumentError`
    for negative, NaN or infinite float weights.

    >>> get_seqlen_balanced_partitions([5, 1, 9, 3, 7, 2, 8, 4], 2, False)
    [[1, 2, 3, 4], [0, 5, 6, 7]]
    """
    values = list(seqlen_list)
    if all(hasattr(v, "__index__") and not isinstance(v, float) for v in values):
        return _stowplan.verl("get_seqlen_balanced_partitions", values, k_partitions, bool(equal_size))
    floats = []
    for i, v in enumerate(values):
        if isinstance(v, float) or (hasattr(v, "__index__") and not isinstance(v, bool)):
            floats.append(float(v))
        else:
            # numpy float32/float16 would add in their own precision in slime's KK.
            raise InvalidArgumentError(
                f"seqlen_list[{i}] must be an int or a float64 (Python float), got {type(v).__name__}"
            )
    return _stowplan.slime_balanced_partitions(floats, k_partitions, bool(equal_size))


def calculate_fwd_flops(seqlens: Sequence[int], args: Any) -> Any:
    """slime's ``calculate_fwd_flops(seqlens, args)``: the forward FLOPs of the model ``args``
    describes (Megatron's ``hidden_size``, ``num_attention_heads``, ``num_query_groups``,
    ``vocab_size``, ``ffn_hidden_size``, ``num_experts``, ``num_layers``, ``kv_channels``; for
    MoE ``moe_ffn_hidden_size``, ``moe_router_topk``, ``moe_shared_expert_intermediate_size``,
    ``moe_layer_freq``; for MLA ``multi_latent_attention``, ``q_lora_rank``, ``kv_lora_rank``,
    ``qk_head_dim``, ``qk_pos_emb_head_dim``, ``v_head_dim``) summed over ``seqlens``. The same
    float as slime's, bit for bit (an ``int`` when no layer term is added). Raises
    ``AttributeError`` for an attribute slime reads and ``args`` lacks;
    :class:`~stowplan.InvalidArgumentError` for a negative length or dimension, a ``None``
    dimension, ``moe_layer_freq`` 0 or products beyond 2**128.

    >>> calculate_fwd_flops([100], {"hidden_size": 16, "num_attention_heads": 2, "num_query_groups": 2,
    ...     "vocab_size": 32, "ffn_hidden_size": 64, "num_experts": None, "num_layers": 2, "kv_channels": 8})
    2380800.0
    """
    args = _namespace(args)
    try:
        return _stowplan.slime_fwd_flops(seqlens, _model(args))
    except AttributeError as e:
        _reraise_missing(args, e)
        raise


def _build_dp_schedule(
    args: Any,
    train_parallel_config: Mapping[str, Any],
    total_lengths: Sequence[int],
    global_batch_size: int,
    rollout_indices: Sequence[Any],
    python_sum: str,
) -> Tuple[List[List[int]], List[List[List[int]]], List[int], List[int]]:
    """:func:`build_dp_schedule` with the float ``sum`` to reproduce given (``"naive"``:
    CPython 3.11 and older, ``"neumaier"``: 3.12 and newer)."""
    args = _namespace(args)
    dp_size = train_parallel_config["dp_size"]
    cp_size = train_parallel_config["cp_size"]
    vpp_size = train_parallel_config["vpp_size"]
    mb_group = train_parallel_config["microbatch_group_size_per_vp_stage"]
    dynamic = bool(args.use_dynamic_batch_size)
    max_tokens = args.max_tokens_per_gpu if dynamic else None
    micro_batch_size = None if dynamic else getattr(args, "micro_batch_size", None)
    balance_by_flops = bool(args.balance_by_flops)
    balance_data = bool(args.balance_data)
    # Rollout ids keyed as slime's dict keys them, numbered by first occurrence.
    ids: Dict[Any, int] = {}
    dense = [ids.setdefault(r, len(ids)) for r in rollout_indices]
    try:
        partitions, sizes, num_microbatches, num_steps = _stowplan.slime_build_dp_schedule(
            total_lengths,
            dense,
            _model(args),
            micro_batch_size=micro_batch_size,
            use_dynamic_batch_size=dynamic,
            max_tokens_per_gpu=max_tokens,
            balance_data=balance_data,
            balance_by_flops=balance_by_flops,
            dp_size=dp_size,
            cp_size=cp_size,
            vpp_size=vpp_size,
            microbatch_group_size_per_vp_stage=mb_group,
            global_batch_size=global_batch_size,
            python_sum=python_sum,
        )
    except AttributeError as e:
        _reraise_missing(args, e)
        raise
    micro_batch_indices = []
    for rank_sizes in sizes:
        start, rank = 0, []
        for n in rank_sizes:
            rank.append(list(range(start, start + n)))
            start += n
        micro_batch_indices.append(rank)
    return partitions, micro_batch_indices, num_microbatches, [global_batch_size] * num_steps


def build_dp_schedule(
    args: Any,
    train_parallel_config: Mapping[str, Any],
    total_lengths: Sequence[int],
    *,
    global_batch_size: int,
    rollout_indices: Sequence[Any],
) -> Tuple[List[List[int]], List[List[List[int]]], List[int], List[int]]:
    """slime's ``build_dp_schedule(args, train_parallel_config, total_lengths,
    global_batch_size=…, rollout_indices=…)``: ``(partitions, micro_batch_indices,
    num_microbatches, global_batch_sizes)`` exactly as slime computes them.

    Samples are grouped by rollout id (``rollout_indices[i]``, any hashable) in
    first-occurrence order; each training step takes ``global_batch_size`` rollouts
    (trailing rollouts that do not fill a step are dropped). A step's samples are packed —
    first-fit under ``args.max_tokens_per_gpu * cp_size`` with
    ``args.use_dynamic_batch_size`` (Karmarkar–Karp on FLOPs into ``ceil(tokens / cap)``
    micro-batches with ``args.balance_by_flops``, which does not enforce the cap), else chunks
    of ``args.micro_batch_size`` — then split to a multiple of ``dp_size`` (times
    ``microbatch_group_size_per_vp_stage`` when ``vpp_size > 1``) and dealt to the ranks:
    KK on summed FLOPs with ``args.balance_data``, else round-robin. ``partitions[r]`` are
    global sample indices; ``micro_batch_indices[r]`` index into ``partitions[r]``.

    FLOPs come from :func:`calculate_fwd_flops` (the model attributes of ``args``); the
    per-micro-batch FLOPs are summed as this interpreter's builtin ``sum`` does (a left fold
    up to CPython 3.11, Neumaier-compensated from 3.12), so results match slime run by the
    same Python. ``train_parallel_config`` needs ``dp_size``, ``cp_size``, ``vpp_size`` and
    ``microbatch_group_size_per_vp_stage`` (``KeyError`` as in slime).

    Raises ``AssertionError`` with slime's message where slime asserts (no
    ``max_tokens_per_gpu`` with dynamic batching, fewer rollouts than ``global_batch_size``, a
    step with fewer samples than ``dp_size``, no ``micro_batch_size`` with static batching, a
    static count not a multiple of the alignment, a dynamic step that cannot be split far
    enough); :class:`~stowplan.InvalidArgumentError` for a negative length, fewer lengths than
    samples, ``global_batch_size`` 0, ``dp_size`` below 1, ``microbatch_group_size_per_vp_stage``
    below 1 with ``vpp_size > 1``, ``micro_batch_size`` 0, and a cap
    (``max_tokens_per_gpu * cp_size``) of 0 with ``balance_by_flops`` (slime divides by it).
    """
    return _build_dp_schedule(
        args, train_parallel_config, total_lengths, global_batch_size, rollout_indices, _python_sum()
    )


# ---------------------------------------------------------------------------------------------
# patch(): stowplan's functions in an installed slime.

#: slime module -> the functions it defines that :func:`patch` replaces.
_DEFINED_IN = {
    "slime.utils.seqlen_balancing": ("first_fit_pack", "expand_bins_by_splitting", "get_seqlen_balanced_partitions"),
    "slime.utils.flops_utils": ("calculate_fwd_flops",),
    "slime.utils.dp_schedule": ("build_dp_schedule",),
}

_REPLACEMENTS: Dict[str, Callable[..., Any]] = {
    "first_fit_pack": first_fit_pack,
    "expand_bins_by_splitting": expand_bins_by_splitting,
    "get_seqlen_balanced_partitions": get_seqlen_balanced_partitions,
    "calculate_fwd_flops": calculate_fwd_flops,
    "build_dp_schedule": build_dp_schedule,
}

#: What :func:`patch` replaced: (module, name, slime's function), for :func:`unpatch`.
_PATCHED: List[Tuple[Any, str, Any]] = []


def patch() -> List[str]:
    """Replaces slime's scheduling functions with these, in an installed slime: imports
    ``slime.utils.seqlen_balancing``, ``slime.utils.flops_utils`` and
    ``slime.utils.dp_schedule`` (``ImportError`` if slime is not installed), then, in every
    loaded ``slime`` module, replaces each attribute that *is* one of slime's
    ``first_fit_pack``, ``expand_bins_by_splitting``, ``get_seqlen_balanced_partitions``,
    ``calculate_fwd_flops`` or ``build_dp_schedule`` — the defining modules and every module
    that imported them by name (``from slime.utils.flops_utils import calculate_fwd_flops``).
    Modules imported later keep slime's functions unless they import them from a patched
    module. Returns the ``module.name`` entries replaced; :func:`unpatch` undoes it. Calling
    it again replaces nothing new.
    """
    import importlib

    originals: Dict[str, Any] = {}
    for module_name, names in _DEFINED_IN.items():
        module = importlib.import_module(module_name)
        for name in names:
            fn = getattr(module, name)
            if fn is not _REPLACEMENTS[name]:
                originals[name] = fn
    replaced = []
    for module_name, module in sorted(sys.modules.items(), key=lambda kv: kv[0]):
        if module is None or not (module_name == "slime" or module_name.startswith("slime.")):
            continue
        for name, original in originals.items():
            if getattr(module, name, None) is original:
                setattr(module, name, _REPLACEMENTS[name])
                _PATCHED.append((module, name, original))
                replaced.append(f"{module_name}.{name}")
    return replaced


def unpatch() -> List[str]:
    """Puts back the slime functions :func:`patch` replaced (where they are still the
    replacements); returns the ``module.name`` entries restored."""
    restored = []
    while _PATCHED:
        module, name, original = _PATCHED.pop()
        if getattr(module, name, None) is _REPLACEMENTS[name]:
            setattr(module, name, original)
            restored.append(f"{module.__name__}.{name}")
    return restored
