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
- Buffered samples are saved as their fields (``stowplan.Sample``) or as JSON (plain dicts,
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
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from .. import _stowplan
from .._filter import Filter
from .._source import BufferedDataSource, Sample
from ..errors import InvalidArgumentError

__all__ = ["RolloutDataSource", "RolloutDataSourceWithBuffer", "pop_first", "Sample"]


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
