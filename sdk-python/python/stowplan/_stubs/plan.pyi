"""Stubs of ``stowplan._stowplan``: static pack plans, length caches and the packing
configuration (``src/plan.rs``, ``src/config.rs``)."""

from typing import Any, Dict, List, Optional

import numpy as np
import numpy.typing as npt
from typing_extensions import Unpack

from ._options import _FromLengthsOptions
from ._types import _Lengths

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
    capacity: int
    #: The former name of :attr:`capacity` (deprecated).
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
    #: minus the single-long packs') / (multi-sample packs × ``capacity``).
    efficiency: float
    raw_checksum: str
    aligned_checksum: str
    #: The limits beside ``capacity`` (name → cap per pack); ``None`` for tokens only.
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
        capacity: Optional[int] = None,
        world_size: Optional[int] = None,
        drop_last: Optional[bool] = None,
        resources: Optional[Dict[str, _Lengths]] = None,
        limits: Optional[Dict[str, int]] = None,
        max_segments: Optional[int] = None,
        method: Optional[str] = None,
        backend: Optional[str] = None,
        packing_length: Optional[int] = None,
        **options: Unpack[_FromLengthsOptions],
    ) -> "StaticPackPlan":
        """Best-fit decreasing packs of at most ``capacity`` aligned tokens (required;
        ``packing_length``: its former name, deprecated); samples with length >= capacity alone (``allow_single_long``) or dropped; aligned for
        ``world_size`` ranks by dropping the remainder (``drop_last``) or repeating the first
        packs. ``resources``/``limits``/``max_segments``: further limits per pack (a sample
        over one is long), packed by ``method`` (``balanced`` default). ``options``: the fields
        of :class:`_FromLengthsOptions` (``align``, ``allow_single_long``: the kernel's)."""
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

class PackingConfig:
    """The packing keys of a training configuration, validated (defaults applied); frozen,
    hashable, compared by value, picklable (its resolved values). The keys read:
    :meth:`from_dict`."""

    packing: bool
    packing_mode: str
    capacity: Optional[int]
    capacity_key: Optional[str]
    #: The former names of :attr:`capacity` and :attr:`capacity_key` (deprecated).
    packing_length: Optional[int]
    packing_length_key: Optional[str]
    allow_single_long: bool
    align: int
    dataloader_drop_last: bool
    eval_packing: bool
    wait_timeout_s: int
    persist_every: Optional[int]
    precompute_workers: int
    dataset_source: Optional[str]
    world_size: int
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    requested_packs_per_step: Optional[int]
    configured_packs_per_step: int
    realized_packs_per_step: int
    batch_report: str
    @staticmethod
    def from_dict(config: Dict[str, Any], *, world_size: int) -> PackingConfig:
        """Validates ``config`` for ``world_size`` ranks (a :class:`stowplan.ConfigError`
        names an invalid key) and logs the requested vs realized packs per step."""
    def accumulation_warning(self, plan: StaticPackPlan) -> Optional[str]:
        """The partial-accumulation-window warning for an epoch of ``plan`` (logged at
        WARNING), or ``None`` when windows are exact."""
    def to_dict(self) -> Dict[str, Any]:
        """Every attribute, by name."""
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...
