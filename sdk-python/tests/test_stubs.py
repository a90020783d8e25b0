"""The stubs (``stowplan/_stowplan.pyi`` and the topic stubs it re-exports from ``_stubs/``,
written by hand but for the kernel's result records, ``_stubs/_records.pyi``, which ``cargo
xtask stubs`` writes from the WIT) say what the compiled module is:
the same public names, and for every function, method and constructor the same parameters
— names, order, kind (positional or keyword-only) and defaults — as the signatures PyO3
gives the compiled module (``__text_signature__``, read by :func:`inspect.signature`). And
no native function takes more than six positional parameters: options are keyword-only."""

from __future__ import annotations

import ast
import inspect
import pathlib
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

import stowplan
from stowplan import _stowplan

STUB = pathlib.Path(stowplan.__file__).with_name("_stowplan.pyi")
MAX_POSITIONAL = 6
# Natives allowed more positional parameters (none: the test says when an entry is stale).
POSITIONAL_EXEMPT: set = set()

Param = Tuple[str, str, Any]  # (name, kind, default or NO_DEFAULT)
NO_DEFAULT = "<no default>"
POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")


def _public(name: str) -> bool:
    return not name.startswith("_")


def _stub_members(body: List[ast.stmt]) -> Dict[str, ast.AST]:
    """Functions, classes and annotated names of a module or class body."""
    out: Dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _stub_body(path: pathlib.Path) -> List[ast.stmt]:
    """The statements of a stub file with its relative imports resolved as a type checker
    resolves them: ``from .x.y import *`` brings the public names of the stub it names,
    ``from .x.y import name as name`` that one name (``_stowplan.pyi`` re-exports the topic
    stubs of ``_stubs/``)."""
    body: List[ast.stmt] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            members = _stub_members(_stub_body(path.parent.joinpath(*str(node.module).split(".")).with_suffix(".pyi")))
            wanted = [a.name for a in node.names]
            body += [m for n, m in members.items() if (n in wanted or (wanted == ["*"] and _public(n)))]  # type: ignore[misc]
        else:
            body.append(node)
    return body


STUBS = _stub_members(_stub_body(STUB))
# The kernel's result records (generated from the WIT), the base classes of result stubs.
RECORDS = _stub_members(ast.parse(STUB.with_name("_stubs").joinpath("_records.pyi").read_text()).body)


def _class_members(node: ast.ClassDef) -> Dict[str, ast.AST]:
    """A stub class's members, its bases' (records of ``_records.pyi``) included."""
    out: Dict[str, ast.AST] = {}
    for base in node.bases:
        out.update(_class_members(RECORDS[ast.unparse(base)]))  # type: ignore[arg-type]
    out.update(_stub_members(node.body))
    return out


def _default(node: Optional[ast.expr]) -> Any:
    if node is None:
        return NO_DEFAULT
    if isinstance(node, ast.Constant):
        return node.value
    return ast.unparse(node)


def _stub_params(fn: ast.FunctionDef, drop_first: bool) -> List[Param]:
    a = fn.args
    positional = [(p.arg, "POSITIONAL_ONLY") for p in a.posonlyargs] + [(p.arg, "POSITIONAL_OR_KEYWORD") for p in a.args]
    defaults = [NO_DEFAULT] * (len(positional) - len(a.defaults)) + [_default(d) for d in a.defaults]
    params: List[Param] = [(n, k, d) for (n, k), d in zip(positional, defaults)]
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", NO_DEFAULT))
    params += [(p.arg, "KEYWORD_ONLY", _default(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", NO_DEFAULT))
    return params[1:] if drop_first else params


def _native_params(obj: Any, drop_first: bool) -> List[Param]:
    params = [
        (p.name, p.kind.name, NO_DEFAULT if p.default is inspect.Parameter.empty else p.default)
        for p in inspect.signature(obj).parameters.values()
    ]
    return params[1:] if drop_first else params


def _decorators(fn: ast.FunctionDef) -> List[str]:
    return [ast.unparse(d) for d in fn.decorator_list]


def _callables() -> List[Tuple[str, Any, ast.FunctionDef, bool]]:
    """(qualified name, native object, stub node, is an instance method) of every function,
    method and constructor the stubs declare."""
    out = []
    for name, node in STUBS.items():
        if isinstance(node, ast.FunctionDef):
            out.append((name, getattr(_stowplan, name, None), node, False))
        elif isinstance(node, ast.ClassDef):
            cls = getattr(_stowplan, name, None)
            for member, sub in _class_members(node).items():
                if not isinstance(sub, ast.FunctionDef) or "property" in _decorators(sub):
                    continue
                if member == "__init__":
                    out.append((f"{name}.__init__", cls, sub, False))
                elif _public(member):
                    static = "staticmethod" in _decorators(sub)
                    out.append((f"{name}.{member}", getattr(cls, member, None), sub, not static))
    return out


CALLABLES = _callables()


def test_the_stubs_and_the_module_have_the_same_names() -> None:
    stubbed = {n for n in STUBS if _public(n) or n == "__version__"}
    native = {n for n in dir(_stowplan) if _public(n) or n == "__version__"}
    assert stubbed == native, f"only native: {sorted(native - stubbed)}; only stubbed: {sorted(stubbed - native)}"


@pytest.mark.parametrize("name", sorted(n for n, s in STUBS.items() if isinstance(s, ast.ClassDef)))
def test_every_class_member_is_stubbed(name: str) -> None:
    cls = getattr(_stowplan, name)
    stubbed = _class_members(STUBS[name])  # type: ignore[arg-type]
    native = {n for n in cls.__dict__ if _public(n)}
    public = {n for n in stubbed if _public(n)}
    assert public == native, f"{name}: only native {sorted(native - public)}; only stubbed {sorted(public - native)}"
    for dunder in (n for n in stubbed if n.startswith("__") and n != "__init__"):
        assert hasattr(cls, dunder), f"{name}.{dunder} is stubbed but the class has none"
    has_init = "__init__" in stubbed
    if sys.version_info >= (3, 10):  # abi3 classes carry a text signature from 3.10 on
        try:
            inspect.signature(cls)
            constructible = True
        except ValueError:
            constructible = False
        assert has_init == constructible, f"{name}: the stub {'has' if has_init else 'lacks'} __init__"


@pytest.mark.parametrize("name, obj, stub, method", CALLABLES, ids=[c[0] for c in CALLABLES])
def test_signatures_match(name: str, obj: Any, stub: ast.FunctionDef, method: bool) -> None:
    if name.endswith(".__init__") and sys.version_info < (3, 10):
        pytest.skip("abi3 classes carry a text signature from Python 3.10 on")
    assert obj is not None, f"{name} is stubbed but missing from the module"
    is_init = name.endswith(".__init__")
    assert _stub_params(stub, drop_first=method or is_init) == _native_params(obj, drop_first=method)


@pytest.mark.parametrize("name, obj, stub, method", CALLABLES, ids=[c[0] for c in CALLABLES])
def test_at_most_six_positional_parameters(name: str, obj: Any, stub: ast.FunctionDef, method: bool) -> None:
    if name.endswith(".__init__") and sys.version_info < (3, 10):
        pytest.skip("abi3 classes carry a text signature from Python 3.10 on")
    positional = [p for p in _native_params(obj, drop_first=method) if p[1] in POSITIONAL]
    if name in POSITIONAL_EXEMPT:
        assert len(positional) > MAX_POSITIONAL, f"{name} is fixed: remove it from POSITIONAL_EXEMPT"
        return
    assert len(positional) <= MAX_POSITIONAL, f"{name} takes {len(positional)} positional parameters: {positional}"


def _record_results() -> Dict[str, Any]:
    return {
        "_Partitioning": stowplan.partition([5, 3, 7, 2], 2),
        "_Packing": stowplan.pack([5, 3, 7, 2], 10),
        "_MicroPlan": stowplan.micro_batches([5, 3, 7, 2], 10),
        "_DpPlan": stowplan.balance([5, 3, 7, 2], 2),
        "_CpSplit": stowplan.cp_layout([5, 3, 7], cp=2),
    }


def test_every_generated_record_is_a_result_base_and_its_types_are_the_values() -> None:
    """Each record of ``_records.pyi`` is the base of a result's stub, and every field it
    declares holds a value of the declared type (numpy dtype, int, float, bool, str)."""
    bases = {ast.unparse(b) for node in STUBS.values() if isinstance(node, ast.ClassDef) for b in node.bases}
    assert bases == set(RECORDS), "a generated record no result stub takes, or a base not generated"
    results = _record_results()
    assert set(results) == set(RECORDS), "test every generated record"
    scalar = {"int": int, "float": float, "bool": bool, "str": str}
    for record, value in results.items():
        for field, node in _stub_members(RECORDS[record].body).items():  # type: ignore[attr-defined]
            annotation = ast.unparse(node.annotation)  # type: ignore[attr-defined]
            got = getattr(value, field)
            if annotation.startswith("npt.NDArray[np."):
                dtype = annotation[len("npt.NDArray[np.") : -1]
                assert got.dtype == getattr(np, dtype), f"{record}.{field}: {got.dtype}, stubbed {annotation}"
            elif annotation in scalar:
                assert type(got) is scalar[annotation], f"{record}.{field}: {type(got).__name__}, stubbed {annotation}"
            else:
                pytest.fail(f"{record}.{field}: this test cannot check a {annotation} yet: teach it")
