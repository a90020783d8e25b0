"""The Python package's map (ARCHITECTURE.md, "Code map", ``sdk-python/``): no module of
``stowplan`` imports another module's private name. What several modules share lives under a
public name in a package-internal module (``stowplan._rows``: the packed rows that ``arrow``,
``hf``, ``ray`` and ``compat.trl`` share; ``stowplan.compat._inputs``: the peers' inputs that
``compat.verl`` and ``compat.roll`` share). Read from the sources, so it needs no extra."""

import ast
import pathlib
import sys

import pytest

import stowplan

PACKAGE = pathlib.Path(stowplan.__file__).parent
# The native module's helpers for the Python layer (``_integer``, ``_integers``,
# ``_prime_rl_*``) are underscored so that ``stowplan.*`` never re-exports them.
NATIVE = "_stowplan"
# prime-rl's own private names, which ``compat.prime_rl`` offers under prime-rl's spelling.
PEER_NAMES = {("compat/prime_rl.py", "_karmarkar_karp"), ("compat/prime_rl.py", "_packing_cost_coeffs"), ("compat/prime_rl.py", "_text_config")}


def private_imports(path: pathlib.Path) -> list:
    rel = path.relative_to(PACKAGE).as_posix()
    here = path.parent
    tree = ast.parse(path.read_text(), rel)
    modules = {}  # local name -> the package module it is bound to
    found = []
    for node in ast.walk(tree):
        absolute = isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "stowplan"
        if isinstance(node, ast.ImportFrom) and (node.level or absolute):
            base = here
            for _ in range(node.level - 1):
                base = base.parent
            if absolute:  # `from stowplan.x import _y`: the same, from the package's root
                base, node.module = PACKAGE, ".".join(node.module.split(".")[1:]) or None
            source = (node.module or "").split(".")[-1]
            for alias in node.names:
                target = base / (node.module or "").replace(".", "/") / alias.name if node.module else base / alias.name
                is_module = target.with_suffix(".py").exists() or (target / "__init__.py").exists() or alias.name == NATIVE
                if is_module:
                    modules[alias.asname or alias.name] = alias.name
                elif alias.name.startswith("_") and not alias.name.startswith("__") and source != NATIVE:
                    if (rel, alias.name) not in PEER_NAMES:
                        found.append(f"{rel}:{node.lineno} imports {alias.name} from {'.' * node.level}{node.module or ''}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            name = node.attr
            if name.startswith("_") and not name.startswith("__") and modules[node.value.id] != NATIVE:
                found.append(f"{rel}:{node.lineno} reads {node.value.id}.{name}")
    return found


def test_no_module_imports_another_modules_private_name():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) >= 25, files
    found = [f for path in files for f in private_imports(path)]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from .arrow import _pack, pack_table\n", ["imports _pack from .arrow"]),
        ("from . import arrow as sa\nsa._check_columns(1)\n", ["reads sa._check_columns"]),
        ("from . import _rows, _stowplan\n_rows.pack(1)\n_stowplan._integer(1)\n", []),
        ("from ._stowplan import _integers\n", []),
        ("from stowplan.arrow import _pack\n", ["imports _pack from arrow"]),
    ],
)
def test_the_check_sees_private_imports_and_reads(tmp_path, source, expected, monkeypatch):
    """The check finds what it should (and only that) in a module of the package's shape."""
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    for name in ("arrow", "_rows"):
        (tmp_path / f"{name}.py").write_text("")
    module = tmp_path / "m.py"
    module.write_text(source)
    found = private_imports(module)
    assert [f.split(" ", 1)[1] for f in found] == expected
