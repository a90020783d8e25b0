"""The examples in the package's docstrings are true."""

from __future__ import annotations

import doctest
import pathlib

import stowplan
import stowplan._stowplan
import stowplan._fields
import stowplan._plan
import stowplan._source
import stowplan._filter
import stowplan._packer
import stowplan._stream
import stowplan._sampler
import stowplan.arrow
import stowplan.hf
import stowplan.compat.trl
import stowplan.compat.slime
import stowplan.compat.prime_rl
import stowplan.compat._prime_rl_head
import stowplan.compat.roll
import stowplan.compat.verl


def test_docstring_examples():
    for module in (stowplan, stowplan._stowplan, stowplan._fields, stowplan._plan, stowplan._source, stowplan._filter, stowplan._packer, stowplan._stream, stowplan._sampler, stowplan.arrow, stowplan.hf, stowplan.compat.trl, stowplan.compat.slime, stowplan.compat.verl, stowplan.compat.roll, stowplan.compat.prime_rl, stowplan.compat._prime_rl_head):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0, module.__name__
    assert doctest.testmod(stowplan).attempted >= 4
    # The native functions' docstrings (written in Rust) carry examples too.
    assert doctest.testmod(stowplan._stowplan).attempted >= 10


def test_the_worked_loss_example_of_the_readme_and_architecture_runs():
    """The packed-equals-unpacked loss example (issue 21) in README.md and ARCHITECTURE.md."""
    root = pathlib.Path(__file__).resolve().parents[2]
    for name in ("README.md", "ARCHITECTURE.md"):
        result = doctest.testfile(str(root / name), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0 and result.attempted >= 8, (name, result)
