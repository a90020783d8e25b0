"""Writes trl_pack_dataset.json: TRL's own ``trl.data_utils.pack_dataset`` run on generated
datasets (the version in ``stowplan.compat.trl.TRL_VERSION``), for the compat tests when TRL
is not importable. Run: ``python make_trl_vectors.py`` in an environment with that TRL."""

from __future__ import annotations

import json
import pathlib

import datasets
import numpy as np
import pyarrow as pa
import trl
from trl.data_utils import pack_dataset

from stowplan.compat.trl import TRL_VERSION

HERE = pathlib.Path(__file__).resolve().parent


def dataset_of(lengths):
    """input_ids numbered 0.. across rows (every token distinct); labels = -input_ids."""
    starts = np.concatenate(([0], np.cumsum(lengths)))
    ids = [list(range(int(starts[i]), int(starts[i + 1]))) for i in range(len(lengths))]
    return datasets.Dataset.from_dict({"input_ids": ids, "labels": [[-v for v in r] for r in ids]})


def main() -> None:
    assert trl.__version__ == TRL_VERSION, (trl.__version__, TRL_VERSION)
    datasets.disable_progress_bars()
    rng = np.random.default_rng(28)
    cases = []
    for case in range(30):
        n = int(rng.integers(1, 90))
        seq_length = int(rng.choice([1, 3, 8, 16, 33]))
        lengths = rng.integers(0, 2 * seq_length + 3, size=n).tolist()  # empty and too long ones
        for strategy in ("bfd", "bfd_split", "wrapped"):
            batch_size = [None, 1, 7, 25][case % 4]
            map_kwargs = None if batch_size is None else {"batch_size": batch_size}
            try:
                out = pack_dataset(dataset_of(lengths), seq_length, strategy, map_kwargs)[:]
            except pa.ArrowNotImplementedError:
                continue  # TRL 1.16.0 fails on a map batch whose sequences are all empty
            assert out["labels"] == [[-v for v in r] for r in out["input_ids"]]
            cases.append(
                {
                    "lengths": lengths,
                    "seq_length": seq_length,
                    "strategy": strategy,
                    "map_kwargs": map_kwargs,
                    "input_ids": out["input_ids"],
                    "seq_lengths": out.get("seq_lengths"),
                }
            )
    doc = {"trl": TRL_VERSION, "datasets": datasets.__version__, "cases": cases}
    (HERE / "trl_pack_dataset.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
