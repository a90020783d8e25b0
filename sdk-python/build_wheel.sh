#!/usr/bin/env bash
# Builds the wheel users install without Rust: abi3 (CPython >= 3.9), tagged manylinux by
# maturin's own audit of the glibc symbols it links (the tag is [tool.maturin]'s
# `compatibility` in pyproject.toml), into target/wheels/. Prints the wheel's path.
#
# Usage: build_wheel.sh [PYTHON]   PYTHON runs maturin (default python3; maturin is installed
# into its environment when missing, as pyproject.toml's [build-system] requires it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${1:-python3}"
out="$root/target/wheels"
if ! "$python" -m maturin --version > /dev/null 2>&1; then
    maturin="$(sed -n 's/^requires = \["\(maturin[^"]*\)"\]$/\1/p' "$here/pyproject.toml")"
    [ -n "$maturin" ] || { echo "build_wheel.sh: no maturin requirement in $here/pyproject.toml" >&2; exit 1; }
    "$python" -m pip install --quiet "$maturin" >&2
fi
rm -f "$out"/stowplan-*.whl
# The same target directory as the workspace: the host library is not compiled a second time.
CARGO_TARGET_DIR="$root/target" "$python" -m maturin build --quiet --release --locked \
    -m "$here/Cargo.toml" --out "$out" >&2
# Its tag is test_wheel.sh's to check.
wheels=("$out"/stowplan-*.whl)
[ -f "${wheels[0]}" ] && [ "${#wheels[@]}" -eq 1 ] || { echo "build_wheel.sh: expected one wheel in $out, found: ${wheels[*]}" >&2; exit 1; }
echo "${wheels[0]}"
