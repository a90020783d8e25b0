"""Stubs of ``stowplan._stowplan``: data sources and buffer filters (``src/source.rs``,
``src/filter.rs``)."""

from typing import Any, Callable, Dict, List, Optional, Tuple

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
        origin: Any,
        n_samples_per_prompt: int,
        *,
        identity: Optional[str] = None,
        shuffle: Optional[bool] = None,
        seed: Optional[int] = None,
        input_key: Optional[str] = None,
        label_key: Optional[str] = ...,
        metadata_key: Optional[str] = ...,
        backend: Optional[str] = None,
    ) -> None:
        """``origin``: a JSONL file's path, or a list of records as JSON texts."""
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
