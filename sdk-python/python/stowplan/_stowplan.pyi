"""Type stubs of the native extension ``stowplan._stowplan`` (PyO3).

Most names are re-exported by :mod:`stowplan` as they are. Options are keyword-only and
``None`` (or omitting them) means the host's default; parameters shown as ``= ...`` take a
``None`` of their own meaning (no key, no bound), so only omitting them gives the default.
``tests/test_stubs.py`` checks these stubs against the compiled module.
"""

from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str
#: The kernel's cost presets, name -> (linear, quadratic).
COST_PRESETS: Dict[str, Tuple[int, int]]
#: The host's default number of length-precompute workers.
DEFAULT_PRECOMPUTE_WORKERS: int
#: The host's default wait for rank 0's length cache, in seconds.
DEFAULT_WAIT_TIMEOUT_S: int

_Lengths = Union[Sequence[int], npt.NDArray[np.integer[Any]], Any]
_Cost = Union[str, Tuple[int, int], Sequence[int]]
_Align = Union[None, str, int]

class Partition:
    """``k`` groups of input indices (the result of :func:`partition`)."""

    offsets: npt.NDArray[np.uint32]
    indices: npt.NDArray[np.uint32]
    sums: npt.NDArray[np.uint64]
    total: int
    spread: int
    lower_bound: int
    k: int
    max: int
    @property
    def groups(self) -> List[List[int]]: ...
    def __len__(self) -> int: ...

def partition(
    weights: _Lengths,
    k: int,
    *,
    method: Optional[str] = None,
    equal_size: Optional[bool] = None,
    refine: Optional[bool] = None,
    backend: Optional[str] = None,
) -> Partition:
    """``method``: ``"kk"`` (default), ``"greedy"`` or ``"verl"``."""

class Packing:
    """Bins of input indices (the result of :func:`pack`)."""

    offsets: npt.NDArray[np.uint32]
    indices: npt.NDArray[np.uint32]
    loads: npt.NDArray[np.uint64]
    dropped: npt.NDArray[np.uint32]
    single: npt.NDArray[np.uint32]
    real_tokens: int
    aligned_tokens: int
    padding_tokens: int
    lower_bound: int
    efficiency: float
    capacity: int
    num_bins: int
    @property
    def bins(self) -> List[List[int]]: ...
    def __len__(self) -> int: ...

def gather_runs(
    chunks: List[np.ndarray], run_chunks: np.ndarray, run_starts: np.ndarray, run_lengths: np.ndarray
) -> Optional[np.ndarray]:
    """The runs (``run_lengths[i]`` values from ``run_starts[i]`` of ``chunks[run_chunks[i]]``)
    one after the other as one new array; ``None`` for a dtype other than the integer,
    float32 and float64 ones (stowplan.arrow's gather)."""
    ...

ROW_STRATEGIES: List[str]
OVERFLOWS: List[str]
DEFAULT_OVERFLOW: str
MAX_ROW_LENGTH: int
MAX_SEQ_LENGTH: int
PACKED_BATCH_TOKENS: int
SEQ_LENGTHS: str
POSITION_IDS: str

def row_packing(strategy: str, overflow: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """The strategy's name (``next_fit`` read as ``next-fit``) and its overflow policy
    (``None`` for ``wrapped``), checked together (stowplan.arrow's rules)."""
    ...

def pack_rows(
    lengths: _Lengths,
    seq_length: int,
    strategy: str,
    overflow: Optional[str] = None,
    column: str = "",
    backend: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``lengths`` tokens packed into rows of at most ``seq_length`` tokens: the
    items' flat starts and lengths in output order and each packed row's item offsets
    (``int64``); errors name ``column`` and the row."""
    ...

def row_items(
    lengths: _Lengths, seq_length: int, overflow: str, column: str = "", row0: int = 0
) -> Tuple[np.ndarray, np.ndarray]:
    """The items (flat start, length) of rows of ``lengths`` tokens under ``overflow``, in
    row order (``int64``); errors number rows from ``row0``."""
    ...

def packed_batches(row_tokens: _Lengths, max_tokens: int) -> np.ndarray:
    """Where the record batches of packed rows end (``row_tokens``: the tokens before each
    row, and the total): ``[0, r1, ..., rows]``, at most ``max_tokens`` tokens each or one
    longer row (``int64``)."""
    ...

def check_row_lengths(lengths: _Lengths, column: str = "", row0: int = 0) -> None:
    """Refuses a row longer than 2**32-1 (the longest a plan takes), naming ``column`` and the
    row numbered from ``row0``."""
    ...

def wrapped_rows(lengths: _Lengths, seq_length: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every token cut into rows of ``seq_length``: :func:`pack_rows`'s arrays for ``wrapped``."""
    ...

def trl_bfd(
    lengths: _Lengths, batch_ends: _Lengths, seq_length: int, backend: Optional[str] = None
) -> Tuple[np.ndarray, np.ndarray]:
    """TRL's best fit decreasing map batch by map batch (batch ``j``: the sequences from
    ``batch_ends[j-1]`` (0 for the first) to before ``batch_ends[j]``): the bins' ``offsets`` and their members' ``indices`` in the order they
    went in (``int64``)."""
    ...

def pack(
    lengths: _Lengths,
    capacity: int,
    *,
    align: Optional[int] = None,
    method: Optional[str] = None,
    oversize: Optional[str] = None,
    backend: Optional[str] = None,
) -> Packing:
    """``method``: ``"bfd"`` (default), ``"ffd"`` or ``"next-fit"``; ``oversize``:
    ``"error"`` (default), ``"single"`` or ``"drop"``."""

class MultiPacking:
    """Bins under several limits (the result of :func:`pack_multi`)."""

    packing: Packing
    names: List[str]
    resource_loads: npt.NDArray[np.uint64]
    lower_bounds: Dict[str, int]
    @property
    def bins(self) -> List[List[int]]: ...
    @property
    def lower_bound(self) -> int: ...
    def __len__(self) -> int: ...

def pack_multi(
    columns: Mapping[str, _Lengths],
    capacities: Mapping[str, int],
    *,
    max_segments: Optional[int] = None,
    align: Optional[int] = None,
    method: Optional[str] = None,
    oversize: Optional[str] = None,
    backend: Optional[str] = None,
) -> MultiPacking:
    """``columns``: each resource's sizes, tokens first; ``capacities``: each one's capacity
    per bin (the same names); ``max_segments``: items per bin at most; ``method``:
    ``"balanced"`` (default), ``"bfd"``, ``"ffd"`` or ``"next_fit"``."""

STREAM_DEFAULTS: Dict[str, int]

class StreamPacker:
    """A streaming bin packer (bins close as lengths arrive; bounded memory)."""

    def __init__(
        self,
        capacity: int,
        *,
        max_open_bins: Optional[int] = None,
        max_buffered: Optional[int] = None,
        align: Optional[int] = None,
        oversize: Optional[str] = None,
        limits: Optional[Dict[str, int]] = None,
        max_segments: Optional[int] = None,
        backend: Optional[str] = None,
    ) -> None:
        """``max_open_bins`` 1..=65536 (default 64), ``max_buffered`` 0..=1048576 (default
        4096), ``oversize`` — what a length above ``capacity`` does: ``"error"`` (default;
        :class:`InfeasibleError`, nothing of the call applied), ``"single"`` (a bin of its
        own) or ``"drop"`` (left out, listed in :attr:`last_dropped`). Real SFT and
        pretraining streams have such lengths: pass ``"drop"`` or ``"single"``. ``limits``
        (name → cap per bin) and ``max_segments``: further limits per bin."""
    @staticmethod
    def from_state(state: bytes, *, backend: Optional[str] = None) -> StreamPacker: ...
    def add(self, lengths: _Lengths, *, resources: Optional[Dict[str, _Lengths]] = None) -> List[List[int]]: ...
    def finish(self) -> List[List[int]]: ...
    def state(self) -> bytes: ...
    @property
    def limits(self) -> Dict[str, int]: ...
    @property
    def max_segments(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def max_open_bins(self) -> int: ...
    @property
    def max_buffered(self) -> int: ...
    @property
    def align(self) -> int: ...
    @property
    def oversize(self) -> str: ...
    @property
    def next_index(self) -> int: ...
    @property
    def buffered(self) -> int: ...
    @property
    def open_bins(self) -> int: ...
    @property
    def in_open_bins(self) -> int: ...
    @property
    def oldest_held(self) -> Optional[int]: ...
    @property
    def last_dropped(self) -> List[int]: ...

class MicroBatches:
    """Micro-batches of one batch (the result of :func:`micro_batches`, or one rank's part
    of a :class:`Balance`).

    Index spaces: ``indices`` and ``batches`` hold positions in the ``lengths`` the call was
    given — from :func:`micro_batches`, indices into its ``lengths``; in
    ``Balance.micro_batches[r]``, **global** sample indices of the balanced batch (not
    positions in rank ``r``'s own batch: ``stowplan.rank_micro_batches(plan, r)`` gives
    those). ``restore`` is local in both: positions in the concatenated micro-batches, one
    per input of the call (of ``Balance.ranks[r]``, in that order, in a :class:`Balance`)."""

    offsets: npt.NDArray[np.uint32]
    indices: npt.NDArray[np.uint32]
    tokens: npt.NDArray[np.uint64]
    costs: npt.NDArray[np.uint64]
    restore: npt.NDArray[np.uint32]
    lower_bound: int
    required: int
    count: int
    @property
    def batches(self) -> List[npt.NDArray[np.uint32]]: ...
    @property
    def token_balance(self) -> Dict[str, Union[int, float]]: ...
    @property
    def cost_balance(self) -> Dict[str, Union[int, float]]: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[npt.NDArray[np.uint32]]: ...

def micro_batches(
    lengths: _Lengths,
    max_token_len: int,
    *,
    cost: Optional[_Cost] = None,
    min_count: Optional[int] = None,
    divisible_by: Optional[int] = None,
    count: Optional[int] = None,
    order: Optional[str] = None,
    extra_costs: Optional[_Lengths] = None,
    resources: Optional[Dict[str, _Lengths]] = None,
    limits: Optional[Dict[str, int]] = None,
    backend: Optional[str] = None,
) -> MicroBatches:
    """``cost``: ``"tokens"`` (default), ``"attention"`` or ``(linear, quadratic)``;
    ``order``: ``"none"`` (default), ``"cost_desc"``, ``"verl"`` or ``"roll"``;
    ``resources``/``limits``: further caps per micro-batch (name → sizes, name → cap). The
    result's indices are positions in ``lengths`` (one rank's batch gives local indices)."""

class Balance:
    """A global batch over DP ranks (the result of :func:`balance`).

    Index spaces: ``order``, ``ranks[r]`` and ``micro_batches[r].batches`` hold **global**
    sample indices (positions in the ``lengths`` given to :func:`balance`). A rank that
    holds only its own samples, ``batch[ranks[r]]``, slices them with
    ``stowplan.rank_micro_batches(plan, r)`` (rank-local positions); ``micro_batches[r].restore``
    is rank-local already."""

    offsets: npt.NDArray[np.uint32]
    order: npt.NDArray[np.uint32]
    tokens: npt.NDArray[np.uint64]
    costs: npt.NDArray[np.uint64]
    cost_lower_bound: int
    micro_batches: Optional[List[MicroBatches]]
    count: Optional[int]
    dp: int
    lengths: npt.NDArray[Any]
    @property
    def ranks(self) -> List[npt.NDArray[np.uint32]]: ...
    @property
    def token_balance(self) -> Dict[str, Union[int, float]]: ...
    @property
    def cost_balance(self) -> Dict[str, Union[int, float]]: ...
    def log_seqlen_unbalance(self, prefix: str = "global_seqlen") -> Dict[str, Union[int, float]]: ...
    def __len__(self) -> int: ...

def balance(
    lengths: _Lengths,
    dp: int,
    *,
    cost: Optional[_Cost] = None,
    max_token_len: Optional[int] = None,
    groups: Optional[Iterable[Any]] = None,
    group_size: Optional[int] = None,
    minibatch_size: Optional[int] = None,
    equal_count: Optional[bool] = None,
    min_count: Optional[int] = None,
    divisible_by: Optional[int] = None,
    count: Optional[int] = None,
    order: Optional[str] = None,
    extra_costs: Optional[_Lengths] = None,
    resources: Optional[Dict[str, _Lengths]] = None,
    limits: Optional[Dict[str, int]] = None,
    backend: Optional[str] = None,
) -> Balance:
    """DP balancing, and with ``max_token_len`` the micro-batches of every rank (global
    sample indices; see :class:`Balance`). ``groups``: one label per sample (any hashable,
    e.g. uids; numpy arrays too); samples with the same label stay on one rank (equal counts
    need groups of one size and a group count divisible by ``dp``). ``group_size=G``: the
    CLI's ``--group-size``, runs of ``G`` consecutive samples (``groups=[i // G ...]``)."""

def rank_micro_batches(plan: Balance, rank: int, *, local: bool = True) -> List[npt.NDArray[np.uint32]]:
    """Rank ``rank``'s micro-batches of ``plan`` (made with ``max_token_len``): rank-local
    positions (into ``batch[plan.ranks[rank]]``), or with ``local=False`` global indices."""

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

def kernel_info() -> Dict[str, Any]:
    """``{"sha256": component sha256, "imports": component imports}``."""

def _integer(value: Any, name: str, low: int, high: int) -> int:
    """``value`` checked like every integer argument of the native layer: an exact integer
    (a Python int or anything with ``__index__``; never a bool, a float or a string) in
    ``low..=high``, else ``InvalidArgumentError`` naming ``name`` and the range."""

def _integers(values: Any, name: str, low: int, high: int) -> List[int]:
    """A one-dimensional sequence (list, tuple, numpy array, ``__array__``, DLPack) checked
    like every integer sequence of the native layer (see ``stowplan._convert``), as Python
    ints; errors name ``name[i]``."""

def pad_factor(
    *,
    cp: Optional[int] = None,
    tp: Optional[int] = None,
    align: _Align = None,
    power_of_two: Optional[bool] = None,
    backend: Optional[str] = None,
) -> int:
    """The alignment factor (align: None/'cp_tp', 'roll' or a multiple)."""

class CpLayout:
    """One packed row split over CP ranks (the result of :func:`cp_layout`)."""

    factor: int
    cp: int
    cu_seqlens: npt.NDArray[np.uint64]
    cu_seqlens_padded: npt.NDArray[np.uint64]
    max_seqlen: int
    max_seqlen_padded: int
    gather: List[npt.NDArray[np.uint64]]
    local_bounds: npt.NDArray[np.uint64]
    rank_real_tokens: npt.NDArray[np.uint64]
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

class MicroBatch:
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
    def from_bytes(data: bytes) -> "MicroBatch": ...

class Materialized:
    """Every rank's micro-batches (the result of :func:`materialize`)."""

    ranks: List[List[MicroBatch]]
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
    plan: Optional[Sequence[Sequence[Sequence[int]]]] = None,
    backend: Optional[str] = None,
) -> Materialized: ...

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

class StaticPackPlan:
    """A static pack plan of an SFT dataset: the world-size independent raw plan of a dataset and
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
    #: Real tokens of every packed sample, the single-long ones included.
    real_tokens: int
    #: Fill of the multi-sample packs only, in 0..=1: their real tokens (``real_tokens``
    #: minus the single-long packs') / (multi-sample packs × ``packing_length``).
    efficiency: float
    raw_checksum: str
    aligned_checksum: str
    #: The limits beside ``packing_length`` (name → cap per pack); ``None`` for tokens only.
    limits: Optional[Dict[str, int]]
    #: At most this many samples per multi-sample pack (0: no limit).
    max_segments: int
    #: The method under limits (``None``: best-fit decreasing on tokens).
    method: Optional[str]
    #: Every raw pack's load in each limit, ``(n_raw_packs, len(limits))`` uint64.
    resource_loads: Optional[npt.NDArray[np.uint64]]
    #: Lower bound per resource: ``tokens``, each limit, ``segments``.
    lower_bounds: Optional[Dict[str, int]]
    @staticmethod
    def from_lengths(
        lengths: _Lengths,
        *,
        packing_length: int,
        world_size: Optional[int] = None,
        drop_last: Optional[bool] = None,
        allow_single_long: Optional[bool] = None,
        align: Optional[int] = None,
        resources: Optional[Dict[str, _Lengths]] = None,
        limits: Optional[Dict[str, int]] = None,
        max_segments: Optional[int] = None,
        method: Optional[str] = None,
        backend: Optional[str] = None,
    ) -> "StaticPackPlan":
        """Best-fit decreasing packs of at most ``packing_length`` aligned tokens; samples
        with length >= packing_length alone (``allow_single_long``) or dropped; aligned for
        ``world_size`` ranks by dropping the remainder (``drop_last``) or repeating the first
        packs. ``resources``/``limits``/``max_segments``: further limits per pack (a sample
        over one is long), packed by ``method`` (``balanced`` default)."""
    @staticmethod
    def load(path: Any) -> "StaticPackPlan":
        """Reads a plan saved by :meth:`save` (or ``stowplan plan --out``), verifying both
        checksums."""
    def save(self, path: Any) -> None:
        """Writes the plan (JSON, format ``stowplan.static-pack-plan/2``, ``/3`` with limits) atomically."""
    def to_json(self) -> str: ...
    def realign(self, world_size: int, *, drop_last: Optional[bool] = None, backend: Optional[str] = None) -> "StaticPackPlan":
        """The same raw plan aligned for other ranks."""
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> List[int]: ...
    def pack(self, index: int) -> List[int]:
        """Sample indices of aligned pack ``index`` (negative counts from the end)."""
    def raw_packs(self) -> List[List[int]]:
        """The raw packs as index lists."""
    def log_lines(self) -> List[str]:
        """The plan's log lines: raw and aligned pack counts, world size, drop_last, repeated or
        dropped packs, long samples, and both checksums."""
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
        cache_dir: Any, source: str, samples: int, *, config_json: Optional[str] = None, timeout_s: Optional[float] = None
    ) -> npt.NDArray[np.uint64]:
        """Waits for rank 0's complete cache (timeout 0 = forever)."""

def resolve_packing_config(config_json: str, world_size: int) -> Dict[str, Any]:
    """The validated packing configuration (with ``batch_report``)."""

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
        path: Any,
        n_samples_per_prompt: int,
        *,
        shuffle: Optional[bool] = None,
        seed: Optional[int] = None,
        input_key: Optional[str] = None,
        label_key: Optional[str] = ...,
        metadata_key: Optional[str] = ...,
        backend: Optional[str] = None,
    ) -> None: ...
    @staticmethod
    def from_records(
        records_json: List[str],
        n_samples_per_prompt: int,
        *,
        identity: Optional[str] = None,
        shuffle: Optional[bool] = None,
        seed: Optional[int] = None,
        input_key: Optional[str] = None,
        label_key: Optional[str] = ...,
        metadata_key: Optional[str] = ...,
        backend: Optional[str] = None,
    ) -> "DataSource": ...
    def get_samples(
        self, n: int, *, rollout_id: Optional[int] = None, filter: Optional["Filter"] = None
    ) -> List[List[Dict[str, Any]]]:
        """Groups of sample dicts (index, group, prompt_index, prompt, label, metadata,
        prompt_length, response_length, rewards, status, payload); the buffer first, through
        ``filter`` (FIFO without one)."""
    def add_samples(self, groups: List[List[Dict[str, Any]]]) -> None: ...
    def save(self, path: Any) -> None: ...
    def load(self, path: Any, *, check: Optional[Callable[[List[List[bytes]]], None]] = None) -> None:
        """Restores a saved state; ``check`` gets the saved buffer's payload heads (as
        ``buffer_payload_heads(1)``) before anything is applied, and what it raises is raised."""
    def buffer_payload_heads(self, n: int) -> List[List[bytes]]:
        """The first ``n`` bytes of every buffered sample's payload, group by group (how
        ``stowplan._source`` tells its encodings apart — fields, JSON, pickle — without
        decoding anything)."""
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
        path: Any,
        *,
        sha256: str,
        config: Optional[str] = None,
        timeout: Optional[float] = None,
        fuel: Optional[int] = ...,
        memory_limit: Optional[int] = None,
        output_limit: Optional[int] = None,
        on_failure: Optional[str] = None,
        max_plugin_bytes: Optional[int] = None,
    ) -> None: ...

MAX_PLUGIN_BYTES: int

def hash_plugin(path: Any, max_plugin_bytes: Optional[int] = None) -> str: ...

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
    """The SPTB wire format: header, format version, postcard body, CRC-32."""

def encode_control(kind: str, run: int, batch_size: int) -> bytes:
    """An add_run/remove_run message (SPCT header)."""

def batch_file_name(run: int, step: int) -> str:
    """run_{run}_step_{step}.bin"""

def write_atomic(path: Any, data: Any) -> None:
    """Replaces the file at path by data atomically (temporary file, fsync, rename)."""

class AtomicFile:
    """A binary file written piece by piece that replaces ``path`` atomically on
    :meth:`commit`; closed without one, its temporary file is removed."""

    def __init__(self, path: Any) -> None: ...
    def write(self, data: bytes) -> int:
        """Appends data; returns its length."""
        ...
    def tell(self) -> int: ...
    def flush(self) -> None: ...
    def commit(self) -> None:
        """Flushes, fsyncs and renames the file over ``path`` (the directory fsynced)."""
        ...
    def close(self) -> None:
        """Abandons the file unless committed."""
        ...
    @property
    def closed(self) -> bool: ...
    def writable(self) -> bool: ...
    def __enter__(self) -> "AtomicFile": ...
    def __exit__(self, *exc: Any) -> bool: ...

def fs_send(root: Any, name: str, data: bytes) -> str:
    """Writes data to ROOT/inbox/NAME atomically; returns the path."""

def control_file_name(kind: str, run: int, nanos: int, pid: int) -> str:
    """control_{nanos:020}_{pid}_{kind}_{run}.bin: a run change's inbox file name (the caller
    passes the time and its process id)."""

def decode_rank_batch(data: bytes) -> RankBatch:
    """Decodes a rank batch (SPRB); a packer's refusal (SPRX) raises InvalidArgumentError."""

def curve_timeout_hint(client_public: str, server_public: str) -> str:
    """What a client that hears nothing from a CURVE packer should check (both keys in Z85),
    appended to its timeout error."""

def secret_certificate_mode_error(path: str, mode: int) -> Optional[str]:
    """Why a secret certificate with these permission bits must not be used (None: only its
    owner may read it)."""

def encode_rank_hello(rank: int, dp: int, next_step: int) -> bytes:
    """A rank's hello to the ZeroMQ packer (SPRM header); rank must be below dp, and
    ``next_step`` is the first step the rank has neither taken nor holds (a step before the
    one the packer delivers gets the rank refused: those steps are gone)."""

def encode_rank_ack(rank: int, step: int) -> bytes:
    """A rank's acknowledgement of a step (SPRM header)."""

def decode_receipts(data: bytes) -> Tuple[int, List[Dict[str, Any]]]:
    """The packer's (incarnation, receipts) (SPRC header)."""

#: Seconds between the packer's heartbeats and between a waiting rank's hellos.
HEARTBEAT: float

class Received:
    """What a :class:`RankReceiver` made of one rank batch: its step, where it went
    (``"in_order"``, ``"held_back"`` or ``"duplicate"``) and the acknowledgement to send."""

    step: int
    arrival: str
    ack: bytes

class RankReceiver:
    """A trainer rank's side of the ZeroMQ protocol (stowplan::serve::RankReceiver), without
    I/O: send ``poll_hello()`` when it returns bytes, read while ``wants_message()``, pass
    each message to ``on_message`` and send back its ``ack``; take steps with
    ``next_batch()``."""

    rank: int
    dp: int
    prefetch: int
    next_step: int
    held_steps: List[int]
    error: Optional[BaseException]
    def __init__(self, rank: int, dp: int, *, next_step: Optional[int] = None, prefetch: Optional[int] = None) -> None: ...
    def poll_hello(self) -> Optional[bytes]:
        """The hello due now (on the first call, then every HEARTBEAT), or None."""
    def hello_due_in(self) -> float:
        """Seconds until the next hello is due (inf after a failure)."""
    def wants_message(self) -> bool:
        """Whether to read the next message (fewer than prefetch steps held, no failure)."""
    def on_message(self, data: bytes) -> Received:
        """Takes one message; raises InvalidArgumentError for a refusal, another rank's batch
        or undecodable bytes (the receiver stays failed)."""
    def has_next(self) -> bool:
        """Whether the step expected next arrived."""
    def next_batch(self) -> Optional[RankBatch]:
        """The step expected next, if it arrived."""
    def timeout_error(self, endpoint: str, waited: float) -> BaseException:
        """The StowplanTimeoutError of a vain wait for the next step."""

class MessageKey:
    """A message not acknowledged yet: ``kind`` ("batch", "add_run", "remove_run"), ``run``,
    a batch's ``step``, a new run's ``batch_size``."""

    kind: str
    run: int
    step: Optional[int]
    batch_size: Optional[int]

class BatchSender:
    """An orchestrator's side of the ZeroMQ protocol (stowplan::serve::BatchSender), without
    I/O: messages go through ``track_batch``/``track_control`` (which return the bytes to
    push), receipts through ``on_receipts``; push what ``due_resends()`` returns."""

    unacked: List[MessageKey]
    flushed: bool
    incarnation: Optional[int]
    resent: int
    resend_after: float
    max_message_bytes: int
    def __init__(self, *, resend_after: Optional[float] = None, max_message_bytes: Optional[int] = None) -> None: ...
    def track_batch(self, data: bytes, *, run: int, step: int) -> bytes:
        """Keeps an encoded training batch until its receipt; returns it."""
    def track_control(self, kind: str, run: int, *, batch_size: Optional[int] = None) -> bytes:
        """Encodes and keeps an add_run/remove_run message until its receipt; returns it."""
    def on_receipts(self, data: bytes) -> List[Dict[str, Any]]:
        """The receipts (dicts, as decode_receipts) of messages kept until now."""
    def due_resends(self) -> List[bytes]:
        """The messages to push again now, oldest first."""
    def flush_timeout_error(self, endpoint: str, waited: float) -> BaseException:
        """The StowplanTimeoutError of a vain flush, naming what is unacknowledged."""

class FileRankClient:
    """A trainer rank over the filesystem transport (stowplan::serve::FileRankClient)."""

    next_step: int
    def __init__(
        self, root: Any, rank: int, *, start_step: Optional[int] = None, consume: bool = False, poll: Optional[float] = None
    ) -> None: ...
    def path(self, step: int) -> str:
        """This rank's file of ``step``."""
    def receive(self, *, step: Optional[int] = None, timeout: Optional[float] = None) -> RankBatch:
        """Waits for step ``step`` (default: the next) up to ``timeout`` seconds (None: forever)."""

class Packer:
    """The packer runtime (stowplan::Packer) behind a lock."""

    def __init__(
        self,
        seq_len: int,
        dp: int,
        *,
        pad_to_multiple_of: Optional[int] = None,
        pad_token_id: Optional[int] = None,
        cost: Any = None,
        num_runs: Optional[int] = None,
        threshold: Optional[int] = None,
        step_tokens: Optional[int] = None,
        wait_timeout: Optional[float] = None,
        teacher_logprobs: Optional[bool] = None,
        allow_empty_completion: Optional[bool] = None,
        loss_agg_mode: Optional[str] = None,
        loss_scale_factor: Optional[float] = None,
        loss_normalization: Optional[str] = None,
        limits: Optional[Dict[str, int]] = None,
        max_segments: Optional[int] = None,
        backend: Optional[str] = None,
        state: Optional[bytes] = None,
        batches: Optional[List[bytes]] = None,
    ) -> None: ...
    def add_run(self, run: int, batch_size: int) -> None: ...
    def remove_run(self, run: int) -> int: ...
    def clear_ready(self, run: int) -> None: ...
    def ingest(self, run: int, step: int, temperature: float, samples: Iterable[Any]) -> Tuple[int, List[Tuple[int, str, str]], bool]: ...
    def ingest_bytes(self, data: Any, name: str) -> Tuple[int, List[Tuple[int, str, str]], bool]: ...
    def should_pack(self) -> bool: ...
    def pack(self, force: bool) -> Optional[Tuple[List[RankBatch], Dict[str, Any]]]: ...
    def delivered(self, step: int) -> List[Tuple[int, int]]: ...
    def pending(self) -> Tuple[int, int]: ...
    def next_step(self) -> int: ...
    def runs(self) -> List[Dict[str, Any]]: ...
    def state(self) -> bytes: ...
    def needed_batches(self) -> List[Tuple[int, int]]: ...
    def rebuild_inflight(self) -> Optional[List[RankBatch]]: ...
