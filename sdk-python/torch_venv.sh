# Sourced by run_verl_tests.sh and run_train_tests.sh: `torch_venv VENV PYTHON` makes a fresh
# virtual environment at VENV from the interpreter PYTHON, with pip and uv, and sets `uv` to
# its uv. A torch environment is some 10^5 files: deleting it takes a minute, so an old one is
# moved aside and deleted while the new one is built. Packages compile to bytecode as they
# install (importing torch from .pyc files: see run_tests.sh).
torch_venv() {
    local venv="$1" python="$2"
    if [ -e "$venv" ]; then
        local stale="$venv.stale.$$"
        mv "$venv" "$stale"
        rm -rf "$stale" &
    fi
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip uv
    uv="$venv/bin/uv"
    export UV_COMPILE_BYTECODE=1
}
