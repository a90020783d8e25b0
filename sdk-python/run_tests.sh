#!/usr/bin/env bash
# Builds and installs the SDK into a fresh virtual environment exactly as a user would
# (`pip install ./sdk-python`), then runs its tests. Called by `cargo xtask test`.
#
# Three phases, all of them without an argument; `cargo xtask test` runs them one at a time so
# that the first two overlap its Rust tests (BENCHMARKS.md, "Build time"):
#   --env     a fresh virtual environment with the test dependencies (network, no compile);
#   --wheel   `pip install ./sdk-python` into it (maturin compiles the extension), then the
#             manylinux wheel (build_wheel.sh: the same library, linked and audited);
#   --tests   the wheel in a clean environment without Rust (test_wheel.sh), TRL at the
#             version stowplan.compat.trl reproduces, then pytest.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${STOWPLAN_SDK_VENV:-$root/target/sdk-venv}"
python="${PYTHON:-python3}"
phase="${1:-all}"
case "$phase" in
    all | --env | --wheel | --tests) ;;
    *) echo "usage: run_tests.sh [--env | --wheel | --tests] (got '$phase'; no argument runs all three)" >&2; exit 2 ;;
esac
# Each step's time, for the log (BENCHMARKS.md, "Build time").
step_start=$SECONDS
took() { echo "sdk: $1: $((SECONDS - step_start)) s"; step_start=$SECONDS; }
uv="$venv/bin/uv"

if [ "$phase" = all ] || [ "$phase" = --env ]; then
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip uv
    took "virtual environment"
    # The test dependencies (the 'test' extra; transformers, and Ray, the 'ray' extra, for
    # tests/test_ray.py, which STOWPLAN_REQUIRE_RAY=1 makes fail instead of skip) through uv,
    # which resolves and installs them in parallel. Bounded in time. Compiled to bytecode as
    # pip does: without .pyc files (and with PYTHONDONTWRITEBYTECODE set, as on CI machines)
    # every import of transformers or Ray parses its sources again, which made the tests 1.5x
    # slower.
    UV_COMPILE_BYTECODE=1 timeout 600 "$uv" pip install --quiet --python "$venv/bin/python" \
        -r "$here/pyproject.toml" --extra test "transformers>=4.56.2" "ray[data]>=2.9"
    took "uv: the test extra, transformers, Ray"
fi

if [ "$phase" = all ] || [ "$phase" = --wheel ]; then
    [ -x "$venv/bin/python" ] || { echo "run_tests.sh --wheel: no virtual environment at $venv: run --env first" >&2; exit 2; }
    # The SDK exactly as a user installs it (pip builds the wheel with maturin), in the same
    # cargo target directory as the rest of the workspace: no second wasmtime build.
    CARGO_TARGET_DIR="$root/target" "$venv/bin/python" -m pip install --quiet "$here"
    took "pip install ./sdk-python (the wheel)"
    # The wheel users install without Rust (manylinux, abi3): the same compiled library, so
    # maturin only links and audits it; test_wheel.sh installs it below.
    bash "$here/build_wheel.sh" "$venv/bin/python" > /dev/null
    took "the manylinux wheel"
fi

if [ "$phase" = all ] || [ "$phase" = --tests ]; then
    [ -x "$uv" ] || { echo "run_tests.sh --tests: no virtual environment at $venv: run --env and --wheel first" >&2; exit 2; }
    cd "$venv"   # import the installed package, not the source tree
    # TRL for tests/test_hf.py's comparisons, at the version stowplan.compat.trl reproduces:
    # without its dependencies (accelerate, torch …); trl.data_utils imports transformers
    # beyond the hf extra, installed above (it installs without torch).
    trl_version="$("$venv/bin/python" -c 'from stowplan.compat.trl import TRL_VERSION; print(TRL_VERSION)')"
    UV_COMPILE_BYTECODE=1 timeout 600 "$uv" pip install --quiet --python "$venv/bin/python" --no-deps "trl==$trl_version"
    took "TRL $trl_version"
    # The manylinux wheel in a clean environment without Rust, with each extra.
    wheels=("$root"/target/wheels/stowplan-*.whl)   # the one build_wheel.sh left there
    bash "$here/test_wheel.sh" "${wheels[0]}" "$uv" "$python"
    took "the wheel in a clean environment, with each extra"
    "$venv/bin/python" -c "import stowplan; p = stowplan.partition([100, 900, 50, 950, 400, 600], 2); assert p.groups == [[0, 2, 3, 4], [1, 5]], p.groups; print('sdk: import ok,', stowplan.kernel_info()['sha256'][:12])"
    # The end-to-end packer tests run a `stowplan` binary: STOWPLAN_BIN (`cargo xtask test`
    # passes the one its Rust tests built, with the ZeroMQ transport), else the workspace's,
    # built when missing.
    bin="${STOWPLAN_BIN:-$root/target/release/stowplan}"
    if [ ! -x "$bin" ]; then
        (cd "$root" && cargo build --release --locked -p stowplan-cli --features zmq --bin stowplan)
    fi
    # Two pytest-xdist workers: the suite waits on subprocesses, Ray and sockets much of its
    # time (in `cargo xtask test`, with the JavaScript SDK's tests beside it: 137 s on one,
    # 125-127 s on two; BENCHMARKS.md, "Build time"). The tests that start Ray share one
    # worker (`xdist_group("ray")`, --dist loadgroup), so that two local Ray clusters never
    # compete for the same ports, and so do the README's (`xdist_group("readme")`), which run
    # its blocks in the repository's root.
    STOWPLAN_BIN="$bin" STOWPLAN_REQUIRE_SERVE=1 \
    STOWPLAN_REQUIRE_COMPONENTIZE_PY=1 STOWPLAN_REQUIRE_TRL=1 STOWPLAN_REQUIRE_RAY=1 "$venv/bin/python" -m pytest -q -W error -p no:cacheprovider --durations=12 \
        --numprocesses 2 --dist loadgroup -c "$here/pyproject.toml" "$here/tests"
fi
