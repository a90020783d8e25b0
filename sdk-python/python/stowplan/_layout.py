"""Trainer layout: alignment factors, context-parallel layouts and materialized micro-batches.

Every name here is the native module's (``stowplan._stowplan``): the arrays are numpy arrays
that own the Rust vectors without a copy.

>>> import stowplan
>>> lay = stowplan.cp_layout([2, 4, 6, 1], cp=2)          # padded to multiples of 2·cp = 4
>>> row = list(range(lay.padded_tokens))
>>> [part.tolist() for part in lay.split(row)]            # what every CP rank receives
[[0, 3, 4, 7, 8, 9, 14, 15, 16, 19], [1, 2, 5, 6, 10, 11, 12, 13, 17, 18]]
>>> lay.unpack(lay.split(row)).tolist() == row
True
>>> samples = [{"prompt_ids": [1, 2], "completion_ids": [3], "advantage": 1.0}] * 3
>>> m = stowplan.materialize(samples, capacity=8, dp=2)
>>> m.per_rank, m.real_tokens, m.packed, m.splits, m.dummies
(1, 9, 2, 0, 0)
"""

from __future__ import annotations

from . import _stowplan

__all__ = ["pad_factor", "cp_layout", "CpLayout", "materialize", "Materialized", "MicroBatch"]

pad_factor = _stowplan.pad_factor
cp_layout = _stowplan.cp_layout
CpLayout = _stowplan.CpLayout
materialize = _stowplan.materialize
Materialized = _stowplan.Materialized

#: One materialized micro-batch (a native class): numpy arrays ``input_ids`` (int64),
#: ``position_ids`` (int64), ``loss_mask`` (bool), ``advantages``, ``inference_logprobs``,
#: ``temperatures`` (float32), ``teacher_logprobs`` (float32 or None), ``cu_seqlens`` and
#: ``cu_seqlens_padded`` (int32, flash-attention's format), ``lora_num_tokens`` (int32),
#: ``samples`` (uint32, the sample indices in row order); ``max_seqlen``, ``real_tokens``,
#: ``padding_tokens``, ``dummy``, ``cp``; the ``sequence_lengths`` property; methods
#: ``cp_view(rank)``, ``cp_unpack(rows)``, ``to_bytes()`` and ``MicroBatch.from_bytes(data)``.
MicroBatch = _stowplan.MicroBatch
