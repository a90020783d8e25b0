"""Stubs of ``stowplan._stowplan``: trainer layouts and materialized micro-batches
(``src/layout.rs``, ``src/materialize.rs``)."""

from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import numpy.typing as npt

from ._records import _CpSplit
from ._types import _Align, _Cost, _Lengths

def pad_factor(
    *,
    cp: Optional[int] = None,
    tp: Optional[int] = None,
    align: _Align = None,
    power_of_two: Optional[bool] = None,
    backend: Optional[str] = None,
) -> int:
    """The alignment factor (align: None/'cp_tp', 'roll' or a multiple)."""

class CpLayout(_CpSplit):
    """One packed row split over CP ranks (the result of :func:`cp_layout`)."""

    cp: int
    gather: List[npt.NDArray[np.uint64]]
    padded_tokens: int
    def split(self, row: Any) -> List[npt.NDArray[Any]]: ...
    def unpack(self, rows: List[Any]) -> npt.NDArray[Any]: ...

def cp_layout(
    lengths: _Lengths,
    *,
    cp: int,
    tp: Optional[int] = None,
    align: _Align = None,
    power_of_two: Optional[bool] = None,
    backend: Optional[str] = None,
) -> CpLayout: ...

class MaterializedBatch:
    """One materialized micro-batch; per-token fields are numpy arrays of the row's length."""

    samples: npt.NDArray[np.uint32]
    input_ids: npt.NDArray[np.int64]
    position_ids: npt.NDArray[np.int64]
    loss_mask: npt.NDArray[np.bool_]
    loss_weights: npt.NDArray[np.float32]
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
        """CP rank `rank`'s arrays: positions, input_ids, position_ids, loss_mask, loss_weights,
        advantages, inference_logprobs, temperatures, teacher_logprobs (or None), local_bounds."""
    def cp_unpack(self, rows: List[npt.NDArray[Any]]) -> npt.NDArray[Any]:
        """Every CP rank's row back in the padded row's order."""
    def to_bytes(self) -> bytes:
        """The SPMB wire format: header, format version, postcard body, CRC-32."""
    @staticmethod
    def from_bytes(data: bytes) -> "MaterializedBatch": ...

class Materialized:
    """Every rank's micro-batches (the result of :func:`materialize`)."""

    ranks: List[List[MaterializedBatch]]
    per_rank: int
    real_tokens: int
    padding_tokens: int
    packed: Optional[int]
    splits: Optional[int]
    dummies: int
    lower_bound: Optional[int]
    rank_costs: Optional[npt.NDArray[np.uint64]]
    @property
    def padding_overhead(self) -> float: ...

def materialize(
    samples: Iterable[Any],
    *,
    capacity: int,
    dp: Optional[int] = None,
    cp: Optional[int] = None,
    tp: Optional[int] = None,
    padding: Optional[str] = None,
    align: _Align = None,
    cost: Optional[_Cost] = None,
    pad_token_id: Optional[int] = None,
    num_runs: Optional[int] = None,
    mix_runs: Optional[bool] = None,
    allow_empty_completion: Optional[bool] = None,
    loss_agg_mode: Optional[str] = None,
    loss_scale_factor: Optional[float] = None,
    multimodal_alone: Optional[bool] = None,
    limits: Optional[Dict[str, int]] = None,
    max_segments: Optional[int] = None,
    distribution: Optional[str] = None,
    plan: Optional[Sequence[Sequence[Sequence[int]]]] = None,
    backend: Optional[str] = None,
) -> Materialized: ...

def round_robin(multimodal: Sequence[bool], dp: int) -> List[List[Tuple[int, bool]]]:
    """prime-rl's classic deal: each rank's ``(micro_batch, dummy)`` entries."""
