"""Type stubs of the native extension ``stowplan._stowplan`` (PyO3).

Use the public functions of :mod:`stowplan` instead; these take already-converted arrays.
"""

from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

def partition(
    weights: npt.NDArray[np.uint64] | npt.NDArray[np.int64],
    k: int,
    method: str,
    equal_size: bool,
    refine: bool,
    backend: str,
) -> Tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.uint64], int, int, int]:
    """-> (offsets, indices, sums, total, spread, lower_bound)"""

def pack(
    lengths: npt.NDArray[np.uint64] | npt.NDArray[np.int64],
    capacity: int,
    align: int,
    method: str,
    oversize: str,
    backend: str,
) -> Tuple[
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint32],
    int,
    int,
    int,
    float,
]:
    """-> (offsets, indices, loads, dropped, single, real_tokens, aligned_tokens, lower_bound, efficiency)"""

def verl(function: str, seqlens: List[int], k: int, equal_size: bool, backend: str) -> List[List[int]]:
    """verl 0.9.1's ``function``; raises the builtin exception verl raises."""

def log_seqlen_unbalance(seqlens: List[int], partitions: List[List[int]]) -> Tuple[int, int, int, int, int, int]:
    """-> (min, max, balanced_min, balanced_max, total, k); raises like verl."""

def kernel_info() -> Tuple[str, List[str]]:
    """-> (component sha256, component imports)"""

_MicroTuple = Tuple[
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint32],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint32],
    int,
    int,
]
_DpTuple = Tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.uint64], npt.NDArray[np.uint64], int]

def micro_batches(
    lengths: npt.NDArray[np.uint64] | npt.NDArray[np.int64],
    max_token_len: int,
    linear: int,
    quadratic: int,
    min_count: int,
    divisible_by: int,
    count: Optional[int],
    order: str,
    backend: str,
) -> _MicroTuple:
    """-> (offsets, indices, tokens, costs, restore, lower_bound, required)"""

def balance(
    lengths: npt.NDArray[np.uint64] | npt.NDArray[np.int64],
    dp: int,
    linear: int,
    quadratic: int,
    groups: Optional[npt.NDArray[np.uint32]],
    minibatch_size: Optional[int],
    equal_count: bool,
    max_token_len: Optional[int],
    min_count: int,
    divisible_by: int,
    count: Optional[int],
    order: str,
    backend: str,
) -> Tuple[_DpTuple, Optional[List[_MicroTuple]]]:
    """-> ((offsets, order, tokens, costs, cost_lower_bound), per-rank micro tuples or None)"""

def verl_rearrange_micro_batches(
    seqlens: List[int],
    max_token_len: int,
    min_num_micro_batch: Optional[int],
    num_batches_divided_by: Optional[int],
    use_dynamic_bsz_balance: bool,
    force_group_size: int,
    padded_width: Optional[int],
    dp_num_micro_batches: Optional[int],
    backend: str,
) -> List[List[int]]:
    """verl's index lists; raises verl's builtin exception."""

def balance_batch(seqlens: List[int], dp: int, minibatch_size: Optional[int], backend: str) -> Tuple[List[List[int]], List[List[List[int]]], List[int]]:
    """-> (partitions, kk_partitions, dropped); raises verl's/ROLL's builtin exception."""

def roll_load_balance(
    lengths: List[int],
    mask_width: int,
    max_packed_sequence_length: int,
    min_num_micro_batches: int,
    tp: int,
    cp: int,
    vp: int,
    dp_num_micro_batches: Optional[int],
    backend: str,
) -> Tuple[List[List[int]], List[List[int]], int, List[int]]:
    """-> (micro_batches, kk_partitions, pad_factor, padded_lengths); raises ROLL's exception."""

def pad_factor(cp: int, tp: int, align: Union[None, str, int], power_of_two: bool, backend: str) -> int:
    """The alignment factor (align: None/'cp_tp', 'roll' or a multiple)."""

def cp_layout(
    lengths: npt.NDArray[Any], cp: int, tp: int, align: Union[None, str, int], power_of_two: bool, backend: str
) -> Tuple[
    int,
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
    int,
    int,
    List[npt.NDArray[np.uint64]],
    npt.NDArray[np.uint64],
    npt.NDArray[np.uint64],
]:
    """-> (factor, cu_seqlens, cu_seqlens_padded, max_seqlen, max_seqlen_padded, gather maps, local_bounds, rank_real_tokens)"""

def scatter(positions: List[npt.NDArray[np.uint64]], rows: List[npt.NDArray[Any]], total: int) -> npt.NDArray[Any]:
    """out[positions[r]] = rows[r] for every rank (float32/float64/int64/int32/bool)."""

class MicroBatch:
    """One materialized micro-batch; per-token fields are numpy arrays of the row's length."""

    samples: npt.NDArray[np.uint32]
    input_ids: npt.NDArray[np.int64]
    position_ids: npt.NDArray[np.int64]
    loss_mask: npt.NDArray[np.bool_]
    advantages: npt.NDArray[np.float32]
    inference_logprobs: npt.NDArray[np.float32]
    temperatures: npt.NDArray[np.float32]
    teacher_logprobs: Optional[npt.NDArray[np.float32]]
    cu_seqlens: npt.NDArray[np.int32]
    cu_seqlens_padded: npt.NDArray[np.int32]
    max_seqlen: int
    lora_num_tokens: npt.NDArray[np.int32]
    real_tokens: int
    padding_tokens: int
    dummy: bool
    @property
    def sequence_lengths(self) -> npt.NDArray[np.int32]: ...
    @property
    def cp(self) -> int: ...
    def __len__(self) -> int: ...
    def cp_view(self, rank: int) -> Dict[str, Any]:
        """CP rank `rank`'s arrays: positions, input_ids, position_ids, loss_mask, advantages,
        inference_logprobs, temperatures, teacher_logprobs (or None), local_bounds."""
    def cp_unpack(self, rows: List[npt.NDArray[Any]]) -> npt.NDArray[Any]:
        """Every CP rank's row back in the padded row's order."""
    def to_bytes(self) -> bytes:
        """SPMB header, format version, postcard body."""
    @staticmethod
    def from_bytes(data: bytes) -> "MicroBatch": ...

def materialize(
    samples: Iterable[Any],
    capacity: int,
    dp: int,
    cp: int,
    padding: str,
    multiple: int,
    linear: int,
    quadratic: int,
    pad_token_id: int,
    num_runs: Optional[int],
    mix_runs: bool,
    allow_empty_completion: bool,
    plan: Optional[List[List[List[int]]]],
    backend: str,
) -> Tuple[List[List[MicroBatch]], Optional[Dict[str, Any]]]:
    """-> (micro-batches per rank, figures: real_tokens, padding_tokens, per_rank, packed, splits, dummies, lower_bound, rank_costs; None for a plan)"""

def prime_rl_ffd(lengths: List[int], runs: List[int], labels: List[int], seq_len: int, backend: str) -> Tuple[List[List[int]], List[int]]:
    """prime-rl's classic packer: (bins, dropped zero-length samples)."""
