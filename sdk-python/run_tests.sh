#!/usr/bin/env bash
# Builds and installs the SDK into a fresh virtual environment exactly as a user would
# (`pip install ./sdk-python`), then runs its tests. Called by `cargo xtask test`.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${STOWPLAN_SDK_VENV:-$root/target/sdk-venv}"
python="${PYTHON:-python3}"

rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# The same cargo target directory as the rest of the workspace: no second wasmtime build.
CARGO_TARGET_DIR="$root/target" "$venv/bin/python" -m pip install --quiet "$here[test]"
cd "$venv"   # import the installed package, not the source tree
# TRL for tests/test_hf.py's comparisons, at the version stowplan.compat.trl reproduces: without
# its dependencies (accelerate, torch …), plus the one package trl.data_utils imports beyond
# the hf extra (transformers, which installs without torch). Bounded in time.
trl_version="$("$venv/bin/python" -c 'from stowplan.compat.trl import TRL_VERSION; print(TRL_VERSION)')"
timeout 600 "$venv/bin/python" -m pip install --quiet --no-deps "trl==$trl_version"
timeout 600 "$venv/bin/python" -m pip install --quiet "transformers>=4.56.2"
# Ray (the 'ray' extra) for tests/test_ray.py, which STOWPLAN_REQUIRE_RAY=1 makes fail instead of skip.
timeout 600 "$venv/bin/python" -m pip install --quiet "ray[data]>=2.9"
"$venv/bin/python" -c "import stowplan; p = stowplan.partition([100, 900, 50, 950, 400, 600], 2); assert p.groups == [[0, 2, 3, 4], [1, 5]], p.groups; print('sdk: import ok,', stowplan.kernel_info()['sha256'][:12])"
# The end-to-end packer test runs the `stowplan serve` binary of the same target directory,
# which `cargo test --release` (the step before this one in `cargo xtask test`) has just built.
# Built here only when missing: `cargo build -p stowplan` alone unifies features differently
# and would compile wasmtime a second time.
if [ ! -x "$root/target/release/stowplan" ]; then
    (cd "$root" && cargo build --release --locked -p stowplan-cli --bin stowplan)
fi
STOWPLAN_BIN="$root/target/release/stowplan" STOWPLAN_REQUIRE_SERVE=1 \
STOWPLAN_REQUIRE_COMPONENTIZE_PY=1 STOWPLAN_REQUIRE_TRL=1 STOWPLAN_REQUIRE_RAY=1 "$venv/bin/python" -m pytest -q -W error -p no:cacheprovider -c "$here/pyproject.toml" "$here/tests"
