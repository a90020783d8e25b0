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

class StaticPackPlan:
    """A static pack plan (seed 002): the world-size independent raw plan of a dataset and
    its alignment for ``world_size`` ranks. ``len(plan)`` is the number of aligned packs and
    ``plan[i]`` the sample indices (ascending) of aligned pack ``i``."""

    raw_offsets: npt.NDArray[np.uint32]
    raw_indices: npt.NDArray[np.uint32]
    raw_tokens: npt.NDArray[np.uint64]
    aligned_packs: npt.NDArray[np.uint32]
    n_raw_packs: int
    n_aligned_packs: int
    per_rank: int
    samples: int
    packing_length: int
    align: int
    allow_single_long: bool
    world_size: int
    drop_last: bool
    pad_needed: int
    repeated: List[int]
    dropped_packs: int
    dropped_pack_samples: int
    single_long: List[int]
    dropped_long: List[int]
    lower_bound: int
    real_tokens: int
    efficiency: float
    raw_checksum: str
    aligned_checksum: str
    @staticmethod
    def from_lengths(
        lengths: Any,
        *,
        packing_length: int,
        world_size: int = 1,
        drop_last: bool = False,
        allow_single_long: bool = False,
        align: int = 1,
        backend: str = "wasm",
    ) -> "StaticPackPlan":
        """Best-fit decreasing packs of at most ``packing_length`` aligned tokens; samples
        with length >= packing_length alone (``allow_single_long``) or dropped; aligned for
        ``world_size`` ranks by dropping the remainder (``drop_last``) or repeating the first
        packs."""
    @staticmethod
    def load(path: Any) -> "StaticPackPlan":
        """Reads a plan saved by :meth:`save` (or ``stowplan plan --out``), verifying both
        checksums."""
    def save(self, path: Any) -> None:
        """Writes the plan (JSON, format ``stowplan.static-pack-plan/1``) atomically."""
    def to_json(self) -> str: ...
    def realign(self, world_size: int, drop_last: bool = False, backend: str = "wasm") -> "StaticPackPlan":
        """The same raw plan aligned for other ranks."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> List[int]: ...
    def pack(self, index: int) -> List[int]:
        """Sample indices of aligned pack ``index`` (negative counts from the end)."""
    def raw_packs(self) -> List[List[int]]:
        """The raw packs as index lists."""
    def log_lines(self) -> List[str]:
        """The lines seed 002 requires in the log."""
    def log(self, logger: Any = None) -> None:
        """Writes :meth:`log_lines` to ``logger`` (default ``stowplan.plan``)."""

class LengthCache:
    """The fingerprinted per-sample length cache (run-scoped directory, atomic flushes)."""

    known: int
    complete: bool
    flushes: int
    persist_every: int
    path: Any
    fingerprint: str
    def __init__(
        self, cache_dir: Any, source: str, samples: int, config_json: Optional[str] = None, persist_every: Optional[int] = None
    ) -> None: ...
    def missing(self) -> npt.NDArray[np.uint32]:
        """Sample indices whose length is not known yet."""
    def set_many(self, indices: List[int], lengths: List[int]) -> None:
        """Records lengths by sample index (flushing on cadence)."""
    def flush(self) -> None: ...
    def finish(self) -> npt.NDArray[np.uint64]:
        """Flushes pending lengths and returns all of them."""
    @staticmethod
    def wait(
        cache_dir: Any, source: str, samples: int, config_json: Optional[str] = None, timeout_s: float = 7200.0
    ) -> npt.NDArray[np.uint64]:
        """Waits for rank 0's complete cache (timeout 0 = forever)."""

def resolve_packing_config(config_json: str, world_size: int) -> str:
    """The validated packing configuration as JSON (with ``batch_report``)."""

def accumulation_warning(
    world_size: int, per_device_train_batch_size: int, gradient_accumulation_steps: int, per_rank_batches: int
) -> Optional[str]:
    """Seed 002's partial accumulation window warning, or None."""

class DataSource:
    """The host's rollout data source (use :class:`stowplan.DataSource` /
    :class:`stowplan.BufferedDataSource`); samples cross as dicts of the host fields."""

    buffer_len: int
    epoch: int
    offset: int
    next_index: int
    identity: str
    def __init__(
        self,
        path: str,
        n_samples_per_prompt: int,
        shuffle: bool,
        seed: int,
        input_key: str,
        label_key: Optional[str],
        metadata_key: Optional[str],
        backend: str,
    ) -> None: ...
    @staticmethod
    def from_records(
        records_json: List[str],
        identity: str,
        n_samples_per_prompt: int,
        shuffle: bool,
        seed: int,
        input_key: str,
        label_key: Optional[str],
        metadata_key: Optional[str],
        backend: str,
    ) -> "DataSource": ...
    def get_samples(
        self, n: int, rollout_id: Optional[int] = None, filter: Optional["Filter"] = None
    ) -> List[List[Dict[str, Any]]]:
        """Groups of sample dicts (index, group, prompt_index, prompt, label, metadata,
        prompt_length, response_length, rewards, status, payload); the buffer first, through
        ``filter`` (FIFO without one)."""
    def add_samples(self, groups: List[List[Dict[str, Any]]]) -> None: ...
    def save(self, path: str) -> None: ...
    def load(self, path: str) -> None: ...
    def metadata_json(self) -> str: ...
    def update_metadata_json(self, text: str) -> None: ...
    def __len__(self) -> int: ...

class Filter:
    """A buffer-filter plugin in the host's sandbox (use :class:`stowplan.Filter`)."""

    name: str
    sha256: str
    imports: List[str]
    origin: str
    stats: Dict[str, int]
    last_output: List[Tuple[str, str]]
    def __init__(
        self,
        path: str,
        sha256: str,
        config_json: str,
        timeout_s: float,
        fuel: Optional[int],
        memory_limit: int,
        output_limit: int,
        on_failure: str,
    ) -> None: ...

class RankBatch:
    """What one rank receives for one packer step: its micro-batches (numpy arrays) and the
    key (run, orchestrator step, index in the batch) of every sample of the step; a
    micro-batch's ``samples`` index ``sample_runs``/``sample_steps``/``sample_indices``."""

    step: int
    rank: int
    dp: int
    micro_batches: List[MicroBatch]
    sample_runs: npt.NDArray[np.uint32]
    sample_steps: npt.NDArray[np.uint64]
    sample_indices: npt.NDArray[np.uint32]
    ready_to_update: List[int]
    def __len__(self) -> int: ...

def encode_training_batch(run: int, step: int, temperature: float, samples: Iterable[Any]) -> bytes:
    """SPTB header, format version, postcard body."""

def encode_control(kind: str, run: int, batch_size: int) -> bytes:
    """An add_run/remove_run message (SPCT header)."""

def batch_file_name(run: int, step: int) -> str:
    """run_{run}_step_{step}.bin"""

def fs_send(root: Any, name: str, data: bytes) -> str:
    """Writes data to ROOT/inbox/NAME atomically; returns the path."""

def fs_receive(root: Any, step: int, rank: int, timeout: float, poll: float) -> RankBatch:
    """Waits for ROOT/rollouts/step_{step}/rank_{rank}.bin and decodes it."""

def decode_rank_batch(data: bytes) -> RankBatch:
    """Decodes a rank batch (SPRB); a packer's refusal (SPRX) raises InvalidArgumentError."""

def encode_rank_hello(rank: int, dp: int, next_step: int) -> bytes:
    """A rank's hello to the ZeroMQ packer (SPRM header); rank must be below dp."""

def encode_rank_ack(rank: int, step: int) -> bytes:
    """A rank's acknowledgement of a step (SPRM header)."""

def decode_receipts(data: bytes) -> Tuple[int, List[Dict[str, Any]]]:
    """The packer's (incarnation, receipts) (SPRC header)."""

class Packer:
    """The packer runtime (stowplan::Packer) behind a lock."""

    def __init__(
        self,
        seq_len: int,
        dp: int,
        pad_to_multiple_of: int,
        pad_token_id: int,
        linear: int,
        quadratic: int,
        num_runs: int,
        threshold: Optional[int],
        step_tokens: Optional[int],
        wait_timeout: float,
        teacher_logprobs: bool,
        allow_empty_completion: bool,
        backend: str,
        state: Optional[bytes] = None,
        batches: Optional[List[bytes]] = None,
    ) -> None: ...
    def add_run(self, run: int, batch_size: int) -> None: ...
    def remove_run(self, run: int) -> int: ...
    def clear_ready(self, run: int) -> None: ...
    def ingest(self, run: int, step: int, temperature: float, samples: Iterable[Any]) -> Tuple[int, List[Tuple[int, str, str]], bool]: ...
    def ingest_bytes(self, data: bytes) -> Tuple[int, List[Tuple[int, str, str]], bool]: ...
    def should_pack(self) -> bool: ...
    def pack(self, force: bool) -> Optional[Tuple[List[RankBatch], Dict[str, Any]]]: ...
    def delivered(self, step: int) -> List[Tuple[int, int]]: ...
    def pending(self) -> Tuple[int, int]: ...
    def next_step(self) -> int: ...
    def runs(self) -> List[Dict[str, Any]]: ...
    def state(self) -> bytes: ...
    def needed_batches(self) -> List[Tuple[int, int]]: ...
    def rebuild_inflight(self) -> Optional[List[RankBatch]]: ...
