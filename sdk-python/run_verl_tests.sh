#!/usr/bin/env bash
# Runs sdk-python/tests/test_verl_patch.py against the REAL verl: a separate virtual
# environment with torch (the CPU is enough), tensordict, verl at the version
# stowplan.compat.verl reproduces (without its dependencies: vLLM, FSDP/Megatron stacks …), the
# few packages `import verl.protocol` and verl's engine utilities need, and the SDK exactly as a
# user installs it (`pip install ./sdk-python`, as run_tests.sh does). STOWPLAN_REQUIRE_VERL=1
# turns the tests' loud skips into failures. sdk-python/tests/test_roll_patch.py (ROLL's
# module-level functions patched in stand-in ROLL modules: it needs torch, not ROLL) runs here too.
#
#   STOWPLAN_VERL_VENV  the environment (default target/verl-venv; rebuilt every run)
#   extra arguments     passed to pytest (e.g. -k gloo)
#   PYTHON              the interpreter to build it from (default python3)
#   CARGO_TARGET_DIR    cargo's target directory for the SDK's build (default target/)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${STOWPLAN_VERL_VENV:-$root/target/verl-venv}"
python="${PYTHON:-python3}"

. "$here/torch_venv.sh"
torch_venv "$venv" "$python"
verl_version="$(sed -n 's/^VERL_VERSION = "\(.*\)"$/\1/p' "$here/python/stowplan/compat/verl.py")"

# torch (verl 0.9.1 names no version; the CUDA wheels from PyPI, used on the CPU) and the
# tensordict verl declares (<=0.10.0); verl itself without its dependencies.
timeout 900 "$uv" pip install --quiet --python "$venv/bin/python" "torch==2.15.0" "tensordict==0.10.0" "numpy==2.4.6"
timeout 600 "$uv" pip install --quiet --python "$venv/bin/python" --no-deps "verl==$verl_version"
# What `import verl.utils.seqlen_balancing, verl.protocol` imports beyond torch and tensordict
# (verl/__init__.py and verl/protocol.py: ray, omegaconf through verl.utils.config, transformers
# through verl.utils.tokenizer — in the range verl declares, <5.11), and what
# verl/workers/engine/utils.py (verl's caller of rearrange_micro_batches, loaded by the patch
# test) adds: datasets and pillow (verl.utils.dataset). Plus the test dependencies.
timeout 900 "$uv" pip install --quiet --python "$venv/bin/python" \
    "ray==2.60.0" "omegaconf==2.4.0" "transformers==5.10.4" "datasets==5.2.0" "pillow==13.0.0" \
    "pytest==9.2.0" "hypothesis==6.170.15"
# The SDK as a user installs it (maturin builds the wheel, in the workspace's cargo target).
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" "$venv/bin/python" -m pip install --quiet "$here"

cd "$venv"   # import the installed package, not the source tree
"$venv/bin/python" -c "import verl, stowplan.compat.verl as v; assert verl.__version__ == v.VERL_VERSION, verl.__version__; print('verl', verl.__version__, '+ stowplan', v.__name__)"
STOWPLAN_REQUIRE_VERL=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider -c "$here/pyproject.toml" "$here/tests/test_verl_patch.py" "$here/tests/test_roll_patch.py" "$@"
