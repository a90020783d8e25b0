#!/usr/bin/env bash
# Runs sdk-python/tests/test_train.py: stowplan inside the real trainers — TRL's SFTTrainer,
# transformers' Trainer and a torch loop on stowplan-packed datasets, the packing check against
# real transformers models — and the "Train with Hugging Face" guide's code blocks. A virtual
# environment of its own with torch (the CPU is enough; the wheels from PyPI), transformers and
# TRL at the versions the tests were written against, and the SDK exactly as a user installs it
# (`pip install ./sdk-python`). STOWPLAN_REQUIRE_TRAIN=1 turns the tests' loud skip into a
# failure. Tiny models built from configs, tokenizers built locally: no hub access.
#
#   STOWPLAN_TRAIN_VENV  the environment (default target/train-venv; rebuilt every run)
#   extra arguments      passed to pytest (e.g. -k recipe)
#   PYTHON               the interpreter to build it from (default python3)
#   CARGO_TARGET_DIR     cargo's target directory for the SDK's build (default target/)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
venv="${STOWPLAN_TRAIN_VENV:-$root/target/train-venv}"
python="${PYTHON:-python3}"

. "$here/torch_venv.sh"
torch_venv "$venv" "$python"
timeout 900 "$uv" pip install --quiet --python "$venv/bin/python" \
    "torch==2.15.0" "transformers==5.24.0" "trl==1.16.0" "datasets==5.2.0" "pyarrow==26.0.1" "numpy==2.4.6" \
    "pytest==9.2.0" "hypothesis==6.170.17"
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" "$venv/bin/python" -m pip install --quiet "$here"

cd "$venv"   # import the installed package, not the source tree
"$venv/bin/python" -c "import torch, transformers, trl, stowplan.hf; print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__)"
STOWPLAN_REQUIRE_TRAIN=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider -W error -c "$here/pyproject.toml" \
    "$here/tests/test_train.py" "$@"
