"""Stubs of ``stowplan._stowplan``: the peers' exact functions: verl, ROLL, slime, prime-rl
(``src/peers.rs``, ``src/slime.rs``, ``src/prime_rl.rs``)."""

from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

def verl(function: str, seqlens: List[int], k: int, equal_size: bool, *, backend: Optional[str] = None) -> List[List[int]]:
    """verl 0.9.1's ``function``; raises the builtin exception verl raises."""

def slime_first_fit_pack(
    total_lengths: List[int], max_tokens_per_bin: int, *, backend: Optional[str] = None
) -> List[List[int]]:
    """slime's ``first_fit_pack``: bins in creation order (input order, no sorting)."""

def slime_expand_bins(
    bins: List[List[int]], target_count: int, lengths: List[int], *, backend: Optional[str] = None
) -> List[List[int]]:
    """The bins after slime's ``expand_bins_by_splitting`` (which works in place)."""

def slime_balanced_partitions(
    weights: List[float], k_partitions: int, equal_size: bool, *, backend: Optional[str] = None
) -> List[List[int]]:
    """slime's ``get_seqlen_balanced_partitions`` on float (FLOPs) weights; slime's
    ``AssertionError`` messages."""

def slime_fwd_flops(seqlens: List[int], model: Dict[str, Any], *, backend: Optional[str] = None) -> Union[float, int]:
    """slime's ``calculate_fwd_flops`` bit for bit; ``model`` holds the attributes ``args``
    has. ``AttributeError(name)`` for one slime would read and ``model`` lacks."""

def slime_build_dp_schedule(
    total_lengths: List[int],
    rollout_ids: List[int],
    model: Dict[str, Any],
    *,
    micro_batch_size: Optional[int],
    use_dynamic_batch_size: bool,
    max_tokens_per_gpu: Optional[int],
    balance_data: bool,
    balance_by_flops: bool,
    dp_size: int,
    cp_size: int,
    vpp_size: int,
    microbatch_group_size_per_vp_stage: int,
    global_batch_size: int,
    python_sum: str,
    backend: Optional[str] = None,
) -> Tuple[List[List[int]], List[List[int]], List[int], int]:
    """slime's ``build_dp_schedule``: ``(partitions, micro-batch sizes per rank,
    num_microbatches, number of steps)``; ``python_sum`` ``"naive"`` (CPython <= 3.11) or
    ``"neumaier"`` (>= 3.12)."""

def log_seqlen_unbalance(seqlens: List[int], partitions: List[List[int]], prefix: str) -> Dict[str, Union[int, float]]:
    """verl's ``log_seqlen_unbalance`` dict; raises like verl."""

def verl_rearrange_micro_batches(
    seqlens: List[int],
    max_token_len: int,
    *,
    min_num_micro_batch: Optional[int] = None,
    num_batches_divided_by: Optional[int] = None,
    use_dynamic_bsz_balance: Optional[bool] = None,
    force_group_size: Optional[int] = None,
    padded_width: Optional[int] = None,
    dp_num_micro_batches: Optional[int] = None,
    backend: Optional[str] = None,
) -> List[List[int]]:
    """verl's index lists; raises verl's builtin exception."""

class DpReorder:
    """verl's ``_balance_batch`` / ROLL's ``batch_balance`` reordering."""

    @property
    def partitions(self) -> List[List[int]]: ...
    @property
    def kk_partitions(self) -> List[List[List[int]]]: ...
    @property
    def dropped(self) -> List[int]: ...

def balance_batch(
    seqlens: List[int], dp: int, *, minibatch_size: Optional[int] = None, backend: Optional[str] = None
) -> DpReorder:
    """Raises verl's/ROLL's builtin exception."""

class RollMicroBatches:
    """ROLL's ``load_balance`` micro-batches."""

    @property
    def micro_batches(self) -> List[List[int]]: ...
    @property
    def kk_partitions(self) -> List[List[int]]: ...
    @property
    def pad_factor(self) -> int: ...
    @property
    def padded_lengths(self) -> List[int]: ...

def roll_load_balance(
    lengths: List[int],
    mask_width: int,
    max_packed_sequence_length: int,
    *,
    min_num_micro_batches: Optional[int] = None,
    tp: Optional[int] = None,
    cp: Optional[int] = None,
    vp: Optional[int] = None,
    dp_num_micro_batches: Optional[int] = None,
    backend: Optional[str] = None,
) -> RollMicroBatches:
    """Raises ROLL's builtin exception."""

class PrimeRlBins:
    """prime-rl's classic packer's bins and the zero-length samples it drops."""

    bins: List[List[int]]
    dropped: List[int]

def prime_rl_ffd(
    lengths: List[int], runs: List[int], labels: List[int], seq_len: int, *, backend: Optional[str] = None
) -> PrimeRlBins: ...

class PrimeRlBatchPlan:
    """The plan of prime-rl's ``prepare_batch`` (HEAD 559b447): bins after splitting, and per rank
    the bins it trains (a dummy names the bin it copies). Read by
    :func:`stowplan.compat.prime_rl.prepare_batch_plan`."""

    bins: List[List[int]]
    multimodal: List[bool]
    padding: List[int]
    costs: List[int]
    ranks: List[List[int]]
    dummies: List[List[bool]]

def _prime_rl_karmarkar_karp(
    weights: Sequence[int], num_partitions: int, *, backend: Optional[str] = None
) -> List[List[int]]:
    """prime-rl's ``_karmarkar_karp``: equal-size KK, groups by descending (total, members)."""

def _prime_rl_balanced_partition(
    weights: Sequence[int], num_partitions: int, *, backend: Optional[str] = None
) -> List[List[int]]:
    """prime-rl's ``balanced_partition``: KK, then its pairwise-swap refinement."""

def _prime_rl_prepare_batch(
    lengths: Sequence[int],
    runs: Sequence[int],
    multimodal: Sequence[int],
    labels: Sequence[int],
    *,
    seq_len: int,
    num_train_workers: int,
    linear: int,
    quadratic: int,
    pad_to_multiple_of: Optional[int] = None,
    multimodal_same_run: bool = False,
    backend: Optional[str] = None,
) -> PrimeRlBatchPlan:
    """The plan of prime-rl's ``prepare_batch`` from per-sample lengths, runs (LoRA), multimodal
    classes (0: text) and labels (routed experts)."""
