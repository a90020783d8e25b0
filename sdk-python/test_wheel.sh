#!/usr/bin/env bash
# The wheel as a user without Rust installs it: a fresh virtual environment, no cargo or rustc
# on PATH, the wheel alone and then with each extra (hf, zmq, ray), each time a plan and the
# extra's own entry points. Called by run_tests.sh --tests with the wheel build_wheel.sh made.
#
# Usage: test_wheel.sh WHEEL UV PYTHON   (UV: the uv binary installing from the registry)
set -euo pipefail
wheel="$(realpath "$1")" uv="$(realpath "$2")" python="$(command -v "$3")"
case "$(basename "$wheel")" in
    stowplan-*-cp39-abi3-manylinux_*_x86_64.whl) ;;
    *) echo "test_wheel.sh: $wheel is not a manylinux abi3 wheel" >&2; exit 1 ;;
esac
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$python" -m venv "$scratch/venv"
# PATH as on a machine without Rust (cargo and rustc live in ~/.cargo/bin, not here).
export PATH="$scratch/venv/bin:/usr/local/bin:/usr/bin:/bin"
if command -v cargo > /dev/null || command -v rustc > /dev/null; then
    echo "test_wheel.sh: cargo or rustc is on PATH ($PATH): the install would not show it needs neither" >&2
    exit 1
fi
cd "$scratch"   # never the source tree
install() { UV_COMPILE_BYTECODE=0 timeout 600 "$uv" pip install --quiet --python "$scratch/venv/bin/python" "$1"; }
run() { "$scratch/venv/bin/python" -c "$1"; }

install "$wheel"
run '
import stowplan
plan = stowplan.StaticPackPlan.from_lengths([5, 3, 7, 2, 6, 4], capacity=8, world_size=2)
assert len(plan) % 2 == 0 and plan.raw_checksum, plan
assert stowplan.__file__.startswith("'"$scratch"'"), stowplan.__file__
print("wheel: plan of", len(plan), "packs from", stowplan.__file__)'

install "$wheel[hf]"
run '
import datasets, stowplan.hf
packed = stowplan.hf.pack_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6]]}), 4)
assert list(packed["input_ids"]) == [[1, 2, 3, 4], [5, 6]], packed["input_ids"]
print("wheel[hf]: pack_dataset ok")'

install "$wheel[zmq]"
run '
import zmq, stowplan
assert stowplan.ZmqSender and stowplan.ZmqRankClient
print("wheel[zmq]: pyzmq", zmq.__version__)'

install "$wheel[ray]"
run '
import ray, stowplan.ray
assert stowplan.ray.PackerActor and stowplan.ray.RayReceiver
print("wheel[ray]: ray", ray.__version__)'
