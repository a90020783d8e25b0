#!/usr/bin/env bash
# Builds and installs the SDK into a fresh virtual environment exactly as a user would
# (`pip install ./sdk-python`), then runs its tests. Called by `cargo xtask test`.
#
# `run_tests.sh --deps-only` makes the virtual environment with the test dependencies and
# nothing else (no cargo, no SDK), and marks it ready: `cargo xtask test` runs it in the
# background while Rust compiles (the downloads and the bytecode wait on the network and the
# disk, not the compiler), then runs this script with STOWPLAN_SDK_DEPS_READY=1, which takes
# that environment instead of making it again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${STOWPLAN_SDK_VENV:-$root/target/sdk-venv}"
python="${PYTHON:-python3}"
ready="$venv/.stowplan-test-deps"

# The test dependencies (the 'test' extra, TRL, transformers, Ray) through uv, which resolves
# and installs them in parallel. Bounded in time. Compiled to bytecode as pip does: without
# .pyc files (and with PYTHONDONTWRITEBYTECODE set, as on CI machines) every import of
# transformers or Ray parses its sources again, which made the tests 1.5x slower.
install_test_deps() {
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet uv
    local uv="$venv/bin/uv"
    export UV_COMPILE_BYTECODE=1
    timeout 600 "$uv" pip install --quiet --python "$venv/bin/python" -r "$here/pyproject.toml" --extra test
    # TRL for tests/test_hf.py's comparisons, at the version stowplan.compat.trl reproduces
    # (read from its source: the SDK is not installed yet): without its dependencies
    # (accelerate, torch …), plus the one package trl.data_utils imports beyond the hf extra
    # (transformers, which installs without torch).
    local trl_version
    trl_version="$("$venv/bin/python" - "$here/python/stowplan/compat/trl.py" <<'PY'
import ast, sys
tree = ast.parse(open(sys.argv[1]).read())
print(next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "TRL_VERSION"))
PY
)"
    timeout 600 "$uv" pip install --quiet --python "$venv/bin/python" --no-deps "trl==$trl_version"
    # transformers, and Ray (the 'ray' extra) for tests/test_ray.py, which STOWPLAN_REQUIRE_RAY=1
    # makes fail instead of skip.
    timeout 600 "$uv" pip install --quiet --python "$venv/bin/python" "transformers>=4.56.2" "ray[data]>=2.9"
    touch "$ready"
}

if [ "${1:-}" = "--deps-only" ]; then
    install_test_deps
    echo "sdk: test dependencies ready in $venv"
    exit 0
fi
if [ "${STOWPLAN_SDK_DEPS_READY:-0}" = "1" ] && [ -f "$ready" ]; then
    echo "sdk: test dependencies taken from $venv (run_tests.sh --deps-only)"
else
    install_test_deps
fi
# The SDK exactly as a user installs it (pip builds the wheel with maturin), in the same cargo
# target directory as the rest of the workspace: no second wasmtime build.
CARGO_TARGET_DIR="$root/target" "$venv/bin/python" -m pip install --quiet "$here"
cd "$venv"   # import the installed package, not the source tree
"$venv/bin/python" -c "import stowplan; p = stowplan.partition([100, 900, 50, 950, 400, 600], 2); assert p.groups == [[0, 2, 3, 4], [1, 5]], p.groups; print('sdk: import ok,', stowplan.kernel_info()['sha256'][:12])"
# The end-to-end packer tests run a `stowplan` binary: STOWPLAN_BIN (`cargo xtask test` passes
# the one its ZeroMQ tests built, with the transport), else the workspace's, built when missing.
bin="${STOWPLAN_BIN:-$root/target/release/stowplan}"
if [ ! -x "$bin" ]; then
    (cd "$root" && cargo build --release --locked -p stowplan-cli --features zmq --bin stowplan)
fi
STOWPLAN_BIN="$bin" STOWPLAN_REQUIRE_SERVE=1 \
STOWPLAN_REQUIRE_COMPONENTIZE_PY=1 STOWPLAN_REQUIRE_TRL=1 STOWPLAN_REQUIRE_RAY=1 "$venv/bin/python" -m pytest -q -W error -p no:cacheprovider --durations=12 -c "$here/pyproject.toml" "$here/tests"
