"""Drop-in replacements for peers' functions, with their signatures and exact outputs.

- :mod:`stowplan.compat.verl` — verl 0.9.1 ``verl.utils.seqlen_balancing``.
"""
