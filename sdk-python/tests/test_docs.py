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


def test_the_guides_examples_run():
    """The `>>>` examples of the guides in docs/ and of ARCHITECTURE.md (the packed-equals-unpacked
    loss example among them). docs/train-with-hf.md needs torch and the trainers: test_train.py
    runs it."""
    root = pathlib.Path(__file__).resolve().parents[2]
    least = {"ARCHITECTURE.md": 8, "docs/rl-balancing.md": 8, "docs/sft-hf.md": 3, "docs/vlm.md": 6}
    for name, examples in least.items():
        result = doctest.testfile(str(root / name), module_relative=False, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.failed == 0 and result.attempted >= examples, (name, result)
    # Every other guide with `>>>` examples must be listed above (test_readme.py checks the blocks).
    for path in (root / "docs").glob("*.md"):
        name = f"docs/{path.name}"
        if ">>> " in path.read_text() and name != "docs/train-with-hf.md":
            assert name in least, f"{name} has doctests that no test runs"
