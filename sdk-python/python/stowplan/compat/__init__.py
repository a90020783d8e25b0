"""Drop-in replacements for peers' functions, with their signatures and exact outputs.

- :mod:`stowplan.compat.verl` — verl 0.9.1 ``verl.utils.seqlen_balancing`` and the trainer's
  ``_balance_batch``.
- :mod:`stowplan.compat.roll` — ROLL's ``load_balance`` micro-batching, ``batch_balance`` and
  the CP/TP sequence packing (``pack_sequences``/``unpack_sequences``); ``patch()`` puts them
  into an installed ROLL.
- :mod:`stowplan.compat.prime_rl` — prime-rl's classic packer and micro-batch padding in its
  ``MicroBatch`` field layout.
- :mod:`stowplan.compat.trl` — TRL 1.16.0's ``pack_dataset`` (per map batch, identical rows).
- :mod:`stowplan.compat.slime` — slime's rollout data source with a buffer (saved with the
  state), and its micro-batch schedule exactly (``first_fit_pack``,
  ``expand_bins_by_splitting``, ``get_seqlen_balanced_partitions``, ``calculate_fwd_flops``,
  ``build_dp_schedule``; ``patch()`` installs them into slime).

A peer's ``patch()`` changes the calling process only; its Ray workers are patched through
:func:`patch_runtime_env` (a runtime environment whose worker setup hook calls it there).
"""

from ._workers import patch_runtime_env

__all__ = ["patch_runtime_env"]
