"""Drop-in replacements for peers' functions, with their signatures and exact outputs.

- :mod:`stowplan.compat.verl` — verl 0.9.1 ``verl.utils.seqlen_balancing`` and the trainer's
  ``_balance_batch``.
- :mod:`stowplan.compat.roll` — ROLL's ``load_balance`` micro-batching and ``batch_balance``.
"""
