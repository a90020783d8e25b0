"""Every fenced code block of README.md, CONTRIBUTING.md and the guides in docs/, from a fresh
clone: none is silently ignored.

Each block is handled by its language, and a block of any other language fails the test:

- ``sh``: run with bash (``-euo pipefail``, cwd = the repository root, standard input
  ``/dev/null``, bounded time). A block whose lines start with ``$ `` is a transcript: each
  command runs on its own and its standard output must match the lines shown after it (a line
  ``...``/``…`` stands for any number of lines, a ``…`` inside a line for any text, and the
  ``time`` lines only need to be there). A block that cannot run here (root, a network, a
  server that runs until stopped, the test suite itself) says so on its first line,
  ``# not run: <reason>``, visibly in the README.
  ``cargo run [-q] --release -p stowplan-cli --`` runs as written, except where
  ``STOWPLAN_BIN`` is set (as ``sdk-python/run_tests.sh`` sets it, to the
  ``target/release/stowplan`` that ``cargo run`` would run): then that binary is called instead,
  which saves cargo's freshness check per command and never triggers a build from the test
  (``.ci/run`` runs the quick start's ``cargo run`` as written).
- ``text``: a synopsis (its first line starts with ``stowplan ``), whose every flag must appear
  in that subcommand's ``--help``, or else the output of the closest ``sh`` block before it,
  compared as a transcript's output is.
- ``python`` with ``>>>``: doctested by ``tests/test_docs.py`` (``doctest.testfile`` of the
  README); checked here to be a doctest from its first line, not run twice. A block after a
  ``<!-- tested: PATH -->`` comment is run by that test file (the Ray recipe: test_ray.py, which
  needs a running Ray). Others run in a subprocess with this interpreter; one importing an
  optional extra (ray) is skipped, loudly, only when the extra is missing and its
  ``STOWPLAN_REQUIRE_*`` variable is not ``1``. A ``# not run:`` block (an API sketch over the
  user's own data) is compiled, and every ``stowplan`` name it uses must exist, with the
  keyword arguments it passes accepted by the callable's signature.
- ``rust``: snippets (``kernel``, ``samples``, ``ds`` are the reader's), so they are checked as
  text against the host crate's sources rather than compiled: compiling them as a doc-test
  would need visible setup lines in the README (GitHub does not hide rustdoc's ``#`` lines) and a
  release build of the host crate's doc-tests in every run. Every ``stowplan::`` path must be
  public in ``host/src`` (lib.rs's ``pub use``/``pub mod``, or the module's own items), every
  ``Type::item``, ``.method(`` and ``Type { field: .. }`` must name a ``fn``, ``const`` or
  ``pub`` field of the host or kernel crate.
- ``js``: run with node against the built SDK (``sdk-js``, built here with ``npm ci`` and
  ``node scripts/build.mjs`` when ``sdk-js/generated`` is missing, as in a fresh clone run
  without ``cargo xtask test``, which builds it first and runs ``sdk-js/run_tests.sh`` beside
  this suite without building again), imported by its package name. Without node
  and npm it is skipped loudly, unless ``STOWPLAN_REQUIRE_NODE=1``.

Files a block writes at the top of the repository (``plan.json``) are removed afterwards.
Runtime: a few seconds, plus about 40 s in a fresh clone, where the JavaScript SDK is built.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import functools
import importlib
import importlib.util
import inspect
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest

import stowplan

ROOT = pathlib.Path(__file__).resolve().parents[2]

# One xdist worker runs every test of this file (run_tests.sh: --dist loadgroup): the sh
# blocks run in the repository's root and delete the files they left there, which would
# delete another worker's files, and each block runs once per process (`_run_sh`).
pytestmark = pytest.mark.xdist_group("readme")
# The README and the guides: every fenced block of each (the same rules in all of them).
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# Guides whose `>>>` examples need torch and the trainers: test_train.py doctests them.
DOCTESTED_ELSEWHERE = {"docs/train-with-hf.md": "sdk-python/tests/test_train.py"}
NOT_RUN = "# not run:"
KINDS = ("sh", "text", "python", "rust", "js")
# Optional extras a runnable Python block may import, with the variable that makes them required.
EXTRAS = {"ray": "STOWPLAN_REQUIRE_RAY"}
CARGO_RUN = re.compile(r"cargo run (?:-q )?--release -p stowplan-cli --(?= |$)")


@dataclasses.dataclass(frozen=True)
class Block:
    doc: str  # the file, relative to the repository root
    lang: str
    text: str
    line: int  # the line of the opening fence, 1-based
    before: str  # the file's text between the previous block and this one

    @property
    def id(self):
        return f"{self.doc}:{self.lang}@{self.line}"

    @property
    def where(self):
        return f"{self.doc}:{self.line}"

    @property
    def not_run_reason(self):
        first = self.text.lstrip("\n").split("\n", 1)[0]
        return first[len(NOT_RUN):].strip() if first.startswith(NOT_RUN) else None


def _blocks(path):
    doc = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").split("\n")
    out, i, last_end = [], 0, 0
    fence = re.compile(r"^(\s*)```(\S*)\s*$")
    while i < len(lines):
        m = fence.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != "```":
            assert lines[i].startswith(indent) or not lines[i].strip(), f"{doc}:{i + 1}: line less indented than its fence"
            body.append(lines[i][len(indent):])
            i += 1
        assert i < len(lines), f"{doc}:{start + 1}: unclosed code fence"
        out.append(Block(doc, lang, "\n".join(body) + "\n", start + 1, "\n".join(lines[last_end:start])))
        i += 1
        last_end = i
    return out


BLOCKS = [b for path in DOCS for b in _blocks(path)]


def _of(lang):
    return [b for b in BLOCKS if b.lang == lang]


def test_every_block_has_a_kind_this_test_handles():
    unknown = [b.id for b in BLOCKS if b.lang not in KINDS]
    assert not unknown, f"README blocks of a language this test does not handle (give the fence one of {KINDS}): {unknown}"
    counts = {k: len(_of(k)) for k in KINDS}
    # The README as it is; fewer blocks than this means the parser lost some.
    assert counts["sh"] >= 8 and counts["text"] >= 4 and counts["python"] >= 6 and counts["rust"] >= 4, counts
    assert counts["js"] >= 1, counts


# ----------------------------------------------------------------------------------------------
# sh and text


def _command(cmd):
    bin_ = os.environ.get("STOWPLAN_BIN")
    return CARGO_RUN.sub(shlex.quote(bin_), cmd) if bin_ else cmd


def _bash(script, what, timeout):
    before = {p.name for p in ROOT.iterdir()}
    try:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", _command(script)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        for p in ROOT.iterdir():
            if p.name not in before and p.is_file():
                p.unlink()
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n$ {script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _timeout():
    return 60 if os.environ.get("STOWPLAN_BIN") else 900  # cargo run may have to build


def _transcript(block):
    """[(command, shown output lines)] of a block whose commands start with `$ `."""
    steps = []
    lines = block.text.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        assert line.startswith("$ "), f"{block.where}: a transcript line outside a command's output: {line!r}"
        cmd = line[2:]
        while cmd.rstrip().endswith("\\"):
            i += 1
            cmd = cmd.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        shown = []
        while i < len(lines) and not lines[i].startswith("$ "):
            shown.append(lines[i])
            i += 1
        steps.append((cmd, shown))
    return steps


ELIDED = ("...", "…")


def _norm(line):
    return " ".join(line.split())


def _line_matches(shown, actual):
    s, a = _norm(shown), _norm(actual)
    if s.startswith("time ") and a.startswith("time "):
        return True  # timings differ from run to run
    if "…" in s or "..." in s:
        parts = re.split(r"\s*(?:…|\.\.\.)\s*", s)
        return re.fullmatch(r"\s*.*?".join(re.escape(p) for p in parts), a) is not None
    return s == a


def _output_matches(shown, actual):
    """Whether the shown lines are the actual ones, with `...`/`…` lines standing for any number."""
    shown = [l for l in shown if l.strip()]
    actual = [l for l in actual if l.strip()]

    @functools.lru_cache(maxsize=None)
    def match(i, j):
        if i == len(shown):
            return j == len(actual)
        if shown[i].strip() in ELIDED:
            return any(match(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and _line_matches(shown[i], actual[j]) and match(i + 1, j + 1)

    return match(0, 0)


@functools.lru_cache(maxsize=None)
def _run_sh(block):
    """The block's standard output (run once, whoever asks: its test or the text block after it)."""
    if any(l.startswith("$ ") for l in block.text.split("\n")):
        out = []
        for cmd, shown in _transcript(block):
            actual = _bash(cmd, f"{block.where}: `{cmd}`", _timeout())
            if shown:
                assert _output_matches(shown, actual.split("\n")), (
                    f"{block.where}: `{cmd}` printed\n{actual}\nwhere the README shows\n" + "\n".join(shown)
                )
            out.append(actual)
        return "".join(out)
    return _bash(block.text, f"{block.where}: the sh block", _timeout())


@pytest.mark.parametrize("block", _of("sh"), ids=lambda b: b.id)
def test_sh_block(block):
    reason = block.not_run_reason
    if reason is not None:
        # Not a skip: the README says why, where readers see it.
        assert len(reason) >= 10, f"{block.where}: `# not run:` needs a reason"
        return
    _run_sh(block)


def _help_flags(words):
    bin_ = os.environ.get("STOWPLAN_BIN") or str(ROOT / "target/release/stowplan")
    if not os.access(bin_, os.X_OK):
        pytest.fail(f"no stowplan binary at {bin_} (set STOWPLAN_BIN or build target/release/stowplan)")
    out = subprocess.run([bin_, *words, "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    return set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*|-[a-zA-Z])\b", out))


SUBCOMMANDS = re.compile(r"^stowplan ((?:filter )?[a-z]+)")


def _check_synopsis(block):
    commands = {}
    current = None
    for line in block.text.split("\n"):
        line = line.split("#", 1)[0].rstrip()
        if not line:
            continue
        m = SUBCOMMANDS.match(line)
        if m:
            current = m.group(1)
            commands.setdefault(current, set())
            line = line[m.end():]
        assert current is not None and (m or line.startswith(" ")), f"{block.where}: {line!r} is not part of a synopsis"
        commands[current] |= set(re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*|-[a-zA-Z])\b", line))
    missing = {}
    for name, flags in commands.items():
        absent = flags - _help_flags(name.split())
        if absent:
            missing[name] = sorted(absent)
    assert not missing, f"{block.where}: flags the synopsis lists that `--help` does not: {missing}"
    return commands


@pytest.mark.parametrize("block", _of("text"), ids=lambda b: b.id)
def test_text_block(block):
    if block.text.startswith("stowplan "):
        commands = _check_synopsis(block)
        assert commands, block.id
        return
    earlier = [b for b in _of("sh") if b.doc == block.doc and b.line < block.line]
    assert earlier, f"{block.where}: an output block with no sh block before it"
    source = earlier[-1]
    assert source.not_run_reason is None, f"{block.where}: shows the output of a block that does not run ({source.id})"
    assert not source.text.startswith("$ "), f"{block.where}: a transcript ({source.id}) shows its own output"
    actual = _run_sh(source)
    shown = block.text.rstrip("\n").split("\n")
    assert _output_matches(shown, actual.split("\n")), (
        f"{block.where}: the output of {source.where} is\n{actual}\nwhere the README shows\n{block.text}"
    )


def test_the_synopses_cover_every_subcommand():
    synopses = {}
    for b in _of("text"):
        if b.text.startswith("stowplan "):
            synopses.update(_check_synopsis(b))
    bin_ = os.environ.get("STOWPLAN_BIN") or str(ROOT / "target/release/stowplan")
    out = subprocess.run([bin_, "--help"], capture_output=True, text=True, timeout=30, check=True).stdout
    listed = re.findall(r"^  ([a-z]+)  ", out.split("Commands:", 1)[1].split("Options:", 1)[0], re.M)
    top = {name.split()[0] for name in synopses}
    assert set(listed) - {"help"} <= top, (listed, sorted(synopses))


# ----------------------------------------------------------------------------------------------
# python


def _is_doctest(block):
    return any(l.startswith(">>> ") for l in block.text.split("\n"))


def _tested_by(block):
    m = re.search(r"<!-- tested: (\S+) -->\s*$", block.before)
    return m.group(1) if m else None


def _python_kind(block):
    if _is_doctest(block):
        return "doctest"
    if _tested_by(block):
        return "tested"
    if block.not_run_reason is not None:
        return "sketch"
    return "run"


@pytest.mark.parametrize("block", _of("python"), ids=lambda b: f"{b.id}-{_python_kind(b)}")
def test_python_block(block):
    kind = _python_kind(block)
    if kind == "doctest":
        # test_docs.py (or the test DOCTESTED_ELSEWHERE names) runs doctest.testfile on the file,
        # which sees only the `>>>` examples:
        # the block must be one from its first line (no code before that would go unrun).
        assert block.text.lstrip().startswith(">>> "), f"{block.where}: code before the first `>>>` is never run"
        assert doctest.DocTestParser().get_examples(block.text), block.id
        runner = DOCTESTED_ELSEWHERE.get(block.doc, "sdk-python/tests/test_docs.py")
        text = (ROOT / runner).read_text()
        assert "doctest.testfile(" in text and f'"{block.doc}"' in text, f"{runner} does not doctest {block.doc}"
    elif kind == "tested":
        path = ROOT / _tested_by(block)
        assert path.is_file(), f"{block.where}: {path} does not exist"
        assert f"<!-- tested: {_tested_by(block)} -->" in path.read_text(), f"{path} does not run {block.where}"
    elif kind == "sketch":
        assert len(block.not_run_reason) >= 10, f"{block.where}: `# not run:` needs a reason"
        _check_python_names(block)
    else:
        _check_python_names(block)
        imported = set(re.findall(r"^\s*(?:import|from) ([a-zA-Z_]\w*)", block.text, re.M))
        for extra, variable in EXTRAS.items():
            if extra in imported and importlib.util.find_spec(extra) is None and os.environ.get(variable) != "1":
                pytest.skip(f"SKIPPED LOUDLY: {block.where} needs {extra}, which is not installed (pip install 'stowplan[{extra}]')")
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [sys.executable, "-c", block.text],
                cwd=tmp,  # a scratch directory: what the block saves stays out of the repository
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
            )
        assert proc.returncode == 0, f"{block.where} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _resolve(dotted):
    """The object `stowplan.a.b` names, importing submodules as Python would; AttributeError if none."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if not hasattr(obj, part) and inspect.ismodule(obj):
            try:
                importlib.import_module(".".join(parts[: i + 1]))
            except ModuleNotFoundError:
                pass
        obj = getattr(obj, part)
    return obj


def _check_python_names(block):
    """Every `stowplan` name the block uses exists; the keywords it passes are accepted."""
    tree = ast.parse(block.text, f"{block.where}")
    problems = []
    checked = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "stowplan":
            for alias in node.names:
                try:
                    _resolve(f"{node.module}.{alias.name}")
                    checked += 1
                except (AttributeError, ImportError) as e:
                    problems.append(f"from {node.module} import {alias.name}: {e}")
        elif isinstance(node, ast.Attribute) and (_dotted(node) or "").startswith("stowplan."):
            name = _dotted(node)
            try:
                _resolve(name)
                checked += 1
            except (AttributeError, ImportError) as e:
                problems.append(f"{name}: {e}")
        elif isinstance(node, ast.Call) and (_dotted(node.func) or "").startswith("stowplan."):
            try:
                target = _resolve(_dotted(node.func))
                signature = inspect.signature(target)
            except (AttributeError, ImportError, ValueError, TypeError):
                continue  # a missing name is reported above; some native callables have no signature
            names = [k.arg for k in node.keywords if k.arg]
            takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
            unknown = [k for k in names if k not in signature.parameters and not takes_any]
            if unknown:
                problems.append(f"{_dotted(node.func)}() takes no keyword {unknown} (signature {signature})")
    assert not problems, f"{block.where}: " + "; ".join(problems)
    assert checked, f"{block.where}: no stowplan name found to check"


# ----------------------------------------------------------------------------------------------
# rust


# The crates a README snippet may name, by the name it uses, and their sources.
RUST_CRATES = {"stowplan": ROOT / "host/src", "stowplan_zmq": ROOT / "host/zmq/src"}


def _rust_sources():
    roots = [*RUST_CRATES.values(), ROOT / "kernel/src"]
    files = [p for root in roots for p in sorted(root.rglob("*.rs"))]
    assert files, "host/src, host/zmq/src and kernel/src hold the crates' sources"
    return {p: p.read_text() for p in files}


def _strip_rust_strings(code):
    code = re.sub(r'r#".*?"#', '""', code, flags=re.S)
    code = re.sub(r'"(?:\\.|[^"\\])*"', '""', code)
    return re.sub(r"//[^\n]*", "", code)


def _public_in(text, name):
    item = rf"\bpub(?:\([a-z]+\))? (?:struct|enum|fn|trait|type|const|static|mod) {re.escape(name)}\b"
    reexport = rf"\bpub use [^;]*\b{re.escape(name)}\b[^;]*;"
    return re.search(item, text) is not None or re.search(reexport, text, re.S) is not None


def _module_file(crate, module):
    base = RUST_CRATES[crate] / pathlib.Path(*module)
    for p in (base.with_suffix(".rs"), base / "mod.rs"):
        if p.is_file():
            return p
    return None


# Standard-library items the snippets use on stowplan's values.
RUST_STD = {"into", "from_secs", "default", "Default", "new", "Path", "Some", "None", "Ok", "Err"}


@pytest.mark.parametrize("block", _of("rust"), ids=lambda b: b.id)
def test_rust_block(block):
    code = _strip_rust_strings(block.text)
    sources = _rust_sources()
    everything = "\n".join(sources.values())
    problems, checked = [], 0

    # Paths of the crates, incl. `use stowplan::a::{B, C}`.
    paths = []
    for m in re.finditer(rf"\b({'|'.join(RUST_CRATES)})::((?:\w+::)*)(?:\{{([^}}]*)\}}|(\w+))", code):
        prefix = [p for p in m.group(2).split("::") if p]
        for leaf in (m.group(3).split(",") if m.group(3) else [m.group(4)]):
            if leaf.strip():
                paths.append((m.group(1), prefix + [leaf.strip()]))
    for crate, path in paths:
        module = _module_file(crate, path[:-1]) if len(path) > 1 else RUST_CRATES[crate] / "lib.rs"
        if _public_in(module.read_text() if module else "", path[-1]):
            checked += 1
        else:
            problems.append(f"{crate}::{'::'.join(path)} is not public")

    # Type::item (fn or const), .method( and Type { field: ... }.
    for typ, item in re.findall(r"\b([A-Z]\w*)::([a-zA-Z_]\w*)", code):
        if item in RUST_STD or typ in RUST_STD:
            continue
        if re.search(rf"\b(?:fn|const) {item}\b", everything) or re.search(rf"\b{typ}::{item}\b|^\s*{item}\b", everything, re.M):
            checked += 1
        else:
            problems.append(f"{typ}::{item} is defined nowhere in the crates' sources")
    for method in re.findall(r"\.([a-z_]\w*)\(", code):
        if method in RUST_STD:
            continue
        if re.search(rf"\bfn {method}\b", everything):
            checked += 1
        else:
            problems.append(f".{method}() is defined nowhere in the crates' sources")
    for m in re.finditer(r"\b([A-Z]\w*)\s*\{", code):
        depth, j = 1, m.end()
        while depth and j < len(code):
            depth += {"{": 1, "}": -1}.get(code[j], 0)
            j += 1
        inner = re.sub(r"\{[^{}]*\}", "", code[m.end(): j - 1])  # nested literals' fields are theirs
        fields = re.findall(r"(?<![:\w])([a-z_]\w*)\s*:(?!:)", inner)
        fields += re.findall(r"(?:^|,)\s*([a-z_]\w*)\s*(?=,|$)", inner)  # shorthand `Type { a, b }`
        struct = re.search(rf"\bpub struct {m.group(1)}\b[^{{;]*\{{(.*?)\n\}}", everything, re.S)
        if struct is None:
            if fields:
                problems.append(f"struct {m.group(1)} is defined nowhere in the crates' sources")
            continue
        for field in fields:
            if re.search(rf"\bpub {field}\s*:", struct.group(1)):
                checked += 1
            else:
                problems.append(f"{m.group(1)} has no public field {field}")
    assert not problems, f"{block.where}: " + "; ".join(problems)
    assert checked >= 3, f"{block.where}: only {checked} names checked"


# ----------------------------------------------------------------------------------------------
# js


def _built_sdk_js():
    sdk = ROOT / "sdk-js"
    if not (shutil.which("node") and shutil.which("npm")):
        if os.environ.get("STOWPLAN_REQUIRE_NODE") == "1":
            pytest.fail("node and npm are required (STOWPLAN_REQUIRE_NODE=1) for the README's JavaScript blocks")
        pytest.skip("SKIPPED LOUDLY: node or npm not found: the README's JavaScript blocks DID NOT RUN")
    if not (sdk / "generated").is_dir():
        # A fresh clone (not under `cargo xtask test`, which builds it first): build the package
        # as sdk-js/run_tests.sh does.
        for cmd in (["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], ["node", "scripts/build.mjs"]):
            proc = subprocess.run(cmd, cwd=sdk, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, f"sdk-js: {' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return sdk


@pytest.mark.parametrize("block", _of("js"), ids=lambda b: b.id)
def test_js_block(block):
    sdk = _built_sdk_js()
    with tempfile.TemporaryDirectory() as tmp:
        # The package by its name, as in a project that installed it.
        (pathlib.Path(tmp) / "node_modules").mkdir()
        (pathlib.Path(tmp) / "node_modules/stowplan").symlink_to(sdk, target_is_directory=True)
        script = pathlib.Path(tmp) / "readme.mjs"
        script.write_text(block.text)
        proc = subprocess.run(["node", str(script)], cwd=tmp, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{block.where} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{block.where} printed nothing"
